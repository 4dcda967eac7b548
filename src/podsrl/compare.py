"""``podsrl compare``: train several methods under the same budget, a training clock (wall time,
evaluation excluded) or a number of optimizer steps (``--steps``: every method evaluated at the
same steps), and compare their held-out accuracy against time and against steps over several seeds.

A method is a name plus config overrides. Built in: ``grpo`` (mode=grpo, n = the config's m),
``pods`` (mode=pods) and ``grpo-ga`` (mode=grpo-ga); ``name:key=value,key=value`` defines more
(``pods-random:rule=random``). The others are measured against the reference method (``grpo``,
or ``--reference``) by :mod:`podsrl.stats`: steps and time to 90% of its gain, mean accuracy over
the budget, and the paper's statistic, steps and time to its seed-mean peak. Runs live in ``<out>/<method>/seed-<s>``; a finished run is kept,
an unfinished one resumes, and a larger budget extends every run from its last checkpoint.
``--jobs N`` trains N runs at a time, each in its own process.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
from pathlib import Path
from typing import NamedTuple

from podsrl import stats
from podsrl.checkpoint import read_metrics, write_atomic
from podsrl.config import load_config
from podsrl.errors import PodsError, first_line, os_reason
from podsrl.sampling import COUNTS

log = logging.getLogger(__name__)
BUILTIN = {"grpo": lambda c: ["mode=grpo", f"n={c.m}"], "pods": lambda c: ["mode=pods"], "grpo-ga": lambda c: ["mode=grpo-ga"]}
METHOD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
RECORD = "compare.yaml"
"""What a comparison folder records of the invocations that made it: methods, seeds, budget."""
SET_BY_COMPARE = {"seed": "--seeds", "output_dir": "--out", "steps": "--budget-minutes or --steps",
                  "time_budget_s": "--budget-minutes", "eval_every_s": "--eval-every-s", "eval_every": "--eval-every",
                  "save_every": "--save-every", "clock": "--clock",
                  "resume": "a rerun", "replay": "a rerun", "allow_config_change": "--allow-config-change"}
"""Settings each compare run gets from compare itself, and the option (or act) that sets them."""
CLOCKS = {"wall": "train_seconds", "cpu": "train_cpu_seconds"}
"""The clocks a comparison's time budget and times can count, and the metric that holds each."""
KEEP = ("metrics", "model", "checkpoint")
"""What each finished run keeps besides its config and logs: nothing more, its final model, or its
last checkpoint (model and optimizer state, which a larger budget resumes from)."""


def parse_methods(specs: list[str], base, reference: str = "grpo") -> dict[str, list[str]]:
    """``["grpo,pods", "pods-random:rule=random,n=32"]`` -> {name: config overrides}.

    Comma-separated items are built-in names (grpo, pods, grpo-ga) or ``name:key=value`` (a new
    method on top of ``mode=pods``); a ``key=value`` item after such a definition belongs to it."""
    methods, current = {}, None
    for spec in specs:
        for item in (x.strip() for x in spec.split(",")):
            if not item:
                continue
            if ":" in item:
                name, _, first = item.partition(":")
                current = _new_method(methods, name.strip(), ["mode=pods"])
                methods[current] += [first] if first.strip() else []
            elif "=" in item:
                if current is None:
                    raise PodsError(f"method override {item!r} must follow a definition name:key=value")
                methods[current].append(item)
            elif item in BUILTIN:
                _new_method(methods, item, BUILTIN[item](base))
                current = None
            else:
                raise PodsError(f"unknown method {item!r}; built in: {', '.join(BUILTIN)}; define others as "
                                "name:key=value,...")
    if reference not in methods:
        raise PodsError(f"compare needs the {reference} method among --methods: times are measured to its peak"
                        + (" (--reference names another)" if reference == "grpo" else ""))
    return methods


def _new_method(methods: dict, name: str, overrides: list[str]) -> str:
    if not METHOD_NAME.fullmatch(name):
        raise PodsError(f"method name {name!r} must be letters, digits and . _ + - (it names a folder)")
    if name in methods:
        raise PodsError(f"method {name!r} is given twice")
    methods[name] = list(overrides)
    return name


def run_all(config_path: str | None, overrides: list[str], method_specs: list[str], seeds: int,
            budget_minutes: float | None, out: Path, eval_every_s: float | None, keep: str = "metrics",
            allow_config_change: bool = False, steps: int | None = None, eval_every: int | None = None,
            reference: str = "grpo", clock: str = "wall", save_every: int = 0, jobs: int = 1,
            first_seed: int = 0) -> dict:
    """Train every method for every seed, then summarise. The budget is training time
    (``budget_minutes``, evaluating every ``eval_every_s`` seconds of it, on the ``clock``: wall
    or the training process's CPU seconds) or optimizer steps (``steps``, evaluating every
    ``eval_every`` steps: curves matched step for step). Time is reported on ``clock``. Each run
    saves a checkpoint at its end, and every ``save_every`` steps where that is > 0, so that an
    interrupted run resumes from its last one. ``jobs`` runs train at a time, each in a process of
    its own where it is > 1 (the runs are the same as one at a time: each seeds itself; give each
    ``threads`` so that jobs x threads fits the cores)."""
    from podsrl.rundir import comparison_lock

    try:
        if out.exists() and not out.is_dir():
            raise PodsError(f"--out {out} is a file, not a folder")
    except OSError as e:  # a name too long, ...
        raise PodsError(f"cannot use --out {out}: {os_reason(e)}") from None
    if keep not in KEEP:
        raise PodsError(f"keep must be one of {', '.join(KEEP)}, got {keep!r}")
    if jobs < 1:
        raise PodsError(f"--jobs must be >= 1, got {jobs}")
    base = load_config(config_path, overrides)
    methods = parse_methods(method_specs, base, reference)
    _refuse_settings_of_compare(config_path, overrides, methods)
    if steps is not None:  # a run's progress is its optimizer steps
        budget = Budget(steps, "step", " steps")
        schedule = [f"steps={steps}", f"eval_every={eval_every}", "time_budget_s=0", "eval_every_s=0", f"clock={clock}"]
    else:
        budget = Budget(budget_minutes * 60, CLOCKS[clock], "s")
        schedule = ["steps=1000000", f"time_budget_s={budget.total}", f"eval_every_s={eval_every_s}", f"clock={clock}"]
    seed_list = list(range(first_seed, first_seed + seeds))
    plan = [(m, s) for s in seed_list for m in methods]  # seed-major: early results cover every method
    configs = {}
    for method, seed in plan:  # every run's config validated before any trains
        configs[method, seed] = load_config(config_path, [
            *overrides, *methods[method], f"seed={seed}", f"output_dir={out / method / f'seed-{seed}'}", *schedule,
            f"save_every={save_every or 10**9}", f"allow_config_change={allow_config_change}",
        ], baseline=base)  # a setting of the shared config is checked there, for the methods that use it
    _check_tasks(configs)
    if jobs > 1 and any(c.threads is None for c in configs.values()):
        log.warning(f"--jobs {jobs}: each run uses torch's default threads (one per core); set threads=K so that "
                    f"{jobs} x K fits the cores")
    with comparison_lock(out):  # one comparison at a time writes into out
        done = _check_folders(out, plan, configs, budget)
        _record(out, config_path, overrides, methods, seeds, budget_minutes, eval_every_s, steps, eval_every,
                reference, clock, first_seed)
        _train_plan(out, plan, configs, done, budget, keep, jobs)
        # every seed the folder holds, as plot summarises it, not only this call's
        seeds_held = sorted(set(seed_list) | set(compared_methods(out)[1]))
        summary = summarise(out, list(_recorded_methods(out) or methods), seeds_held, reference, clock)
        write_reports(out, summary)
    return summary


def _check_tasks(configs: dict) -> None:
    """Build each distinct task of the plan once (its data read, reasoning-gym's settings checked,
    its held-out set drawn) before any run trains: a method whose task settings are refused is
    refused before the runs ahead of it have trained."""
    from podsrl.config import to_dict
    from podsrl.tasks import task_from_config

    built = set()
    for (method, seed), c in configs.items():
        key = json.dumps(to_dict(c)["task"], sort_keys=True)
        if key in built:
            continue
        built.add(key)
        try:
            task_from_config(c.task, c.seed)
        except PodsError as e:
            raise PodsError(f"method {method!r}: {e}") from None


class Budget(NamedTuple):
    """What each run of a comparison gets: ``total`` of the metric ``key`` (a clock's seconds, or
    steps), shown with ``unit``."""
    total: float
    key: str
    unit: str


def _check_folders(out: Path, plan: list, configs: dict, budget: Budget) -> dict:
    """How far each run of ``plan`` has got on the budget's measure (None: not started); a run to
    be resumed or reused is checked against the config its folder records, before any trains."""
    from podsrl.checkpoint import latest_checkpoint, read_state
    from podsrl.rundir import check_same_config, finished_steps

    done = {}
    for method, seed in plan:
        run_dir = out / method / f"seed-{seed}"
        ckpt = latest_checkpoint(run_dir) if run_dir.is_dir() else None
        done[method, seed] = read_state(ckpt).get(budget.key, 0.0) if ckpt is not None else finished_at(run_dir, budget.key)
        finished = done[method, seed] is not None and done[method, seed] >= budget.total
        if ckpt is not None or finished or finished_steps(run_dir):  # to be resumed, replayed or reused as it is
            check_same_config(run_dir, configs[method, seed], f"podsrl compare would reuse {method} seed {seed} in",
                              shorter=False)
    return done


def _train_plan(out: Path, plan: list, configs: dict, done: dict, budget: Budget, keep: str, jobs: int = 1) -> None:
    """Train each run of ``plan`` that is not done: resumed from its checkpoint, or from step 0;
    the steps a run logged beyond that are replayed (``replay``). ``jobs`` at a time, each in a
    spawned process of its own where ``jobs`` > 1."""
    from podsrl.rundir import finished_steps, how_to_start

    total, unit = budget.total, budget.unit
    todo = []
    for i, (method, seed) in enumerate(plan, 1):
        c, run_dir = configs[method, seed], out / method / f"seed-{seed}"
        if done[method, seed] is not None and done[method, seed] >= total:
            print(f"[{i}/{len(plan)}] {method} seed {seed}: done ({done[method, seed]:.0f}{unit} of {total:.0f}{unit})", flush=True)
            continue
        c.replay = True  # a run whose checkpoint is lost trains its logged steps again: on its recorded
        c.save_rollouts = not c.async_lag  # completions where it kept them, without generating
        start = how_to_start(run_dir)
        c.resume = start == "resume"
        if start == "replay":  # interrupted, and its checkpoint lost
            kept = finished_steps(run_dir)
            print(f"[{i}/{len(plan)}] {method} seed {seed}: its earlier run stopped after step {kept} without a "
                  f"checkpoint: replaying steps 1-{kept} (trained again without evaluation, each checked against its "
                  "record), then training on", flush=True)
        todo.append((f"[{i}/{len(plan)}] {method} seed {seed}: training for {total:.0f}{unit}", c, run_dir))
    if jobs == 1:
        for line, c, run_dir in todo:
            _train_and_prune(line, c, run_dir, keep)
        return
    _train_in_processes(todo, keep, jobs)


def _train_and_prune(line: str, c, run_dir: Path, keep: str) -> None:
    """One run of a comparison (``line`` says that it starts)."""
    from podsrl.replay import ReplayMismatch
    from podsrl.rundir import how_to_start
    from podsrl.trainer import train

    print(line, flush=True)
    try:
        train(c)
    except ReplayMismatch as e:  # not reproducible here: its logged steps are trained again, and replaced
        c.replay = False
        c.resume = how_to_start(run_dir, replay=False) == "resume"
        print(f"{e}: training it again{' from its checkpoint' if c.resume else ' from step 0'} "
              "(its later metrics replaced)", flush=True)
        train(c)
    prune(run_dir, keep)


def _train_in_processes(todo: list, keep: str, jobs: int) -> None:
    """Train ``todo``'s runs ``jobs`` at a time, each in a spawned process. A run that fails stops
    the queue (the runs in flight finish) and its error is raised here. Only this process takes
    Ctrl-C or SIGTERM: it ends the runs in flight with SIGTERM, which each takes as Ctrl-C (its
    finished steps and last checkpoint kept), and raises the interruption with what they kept."""
    import multiprocessing
    from multiprocessing.connection import wait

    ctx = multiprocessing.get_context("spawn")
    _quiet_resource_tracker()
    queue, running, failure = list(todo), {}, None
    try:
        while queue or running:
            while queue and len(running) < jobs:
                line, c, run_dir = queue.pop(0)
                receive, send = ctx.Pipe(duplex=False)
                process = ctx.Process(target=_run_in_child, args=(send, line, c, run_dir, keep))
                process.start()
                send.close()
                running[process.sentinel] = process, receive, run_dir
            for sentinel in wait(list(running)):
                process, receive, run_dir = running.pop(sentinel)
                error = _outcome(process, receive, run_dir)
                if error is not None and failure is None:
                    failure, queue = error, []
    except KeyboardInterrupt as e:
        for process, _, _ in running.values():
            process.terminate()
        kept = [str(error) for error in (_outcome(*run) for run in running.values()) if error is not None and str(error)]
        raise type(e)("; ".join(kept)) from None
    if failure is not None:
        raise failure


def _quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (shared by the runs' processes) without its warning
    about leaked semaphores: a run's process that is killed leaves its semaphores to the tracker,
    which removes them, and its warning, printed as compare exits, would follow the line that
    reports the killed run. A tracker already running is left as it is."""
    import sys
    from multiprocessing import resource_tracker

    if getattr(resource_tracker._resource_tracker, "_fd", None) is not None:
        return
    option = "ignore:resource_tracker:UserWarning"  # passed to the tracker's interpreter as -W
    sys.warnoptions.append(option)
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions.remove(option)


def _outcome(process, receive, run_dir: Path) -> BaseException | None:
    """What a child run ended with: None where it finished. Its word is read before it is joined
    (a child blocked on a full pipe would never end)."""
    import signal

    try:
        word = receive.recv()
    except EOFError:  # it died without a word: killed (by a signal, the kernel's OOM killer), or its interpreter failed
        process.join()
        code = process.exitcode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else \
            f"ended with exit code {code}"
        return PodsError(f"the process training {run_dir.parent.name} seed {run_dir.name.removeprefix('seed-')} "
                         f"({run_dir}) {how}; a rerun resumes it from its last checkpoint, if any")
    process.join()
    return word


def _run_in_child(send, line: str, c, run_dir: Path, keep: str) -> None:
    import signal

    from podsrl.errors import raise_terminated
    from podsrl.quiet import quiet_logging

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent takes Ctrl-C and ends this run with SIGTERM
    signal.signal(signal.SIGTERM, raise_terminated)
    quiet_logging()
    try:
        _train_and_prune(line, c, run_dir, keep)
    except (PodsError, KeyboardInterrupt) as e:
        send.send(e)
        return
    except BaseException as e:
        send.send(PodsError(f"{run_dir}: {type(e).__name__}: {first_line(e)}"))
        raise  # its traceback on stderr: a bug, not bad input
    send.send(None)


def _refuse_settings_of_compare(config_path: str | None, overrides: list[str], methods: dict[str, list[str]]) -> None:
    """compare sets :data:`SET_BY_COMPARE` in every run; the same keys given in the config file, the
    overrides or a method would be replaced without a word, so they are refused."""
    from omegaconf import OmegaConf

    given = [(key, "the config file") for key in (OmegaConf.load(config_path) if config_path else {})]
    given += [(o.partition("=")[0].strip(), "the overrides") for o in overrides]
    given += [(o.partition("=")[0].strip(), f"method {name!r}") for name, spec in methods.items() for o in spec]
    for key, where in given:
        if key in SET_BY_COMPARE:
            raise PodsError(f"{key} is set by podsrl compare for each run ({SET_BY_COMPARE[key]}); remove it from {where}")


def prune(run_dir: Path, keep: str) -> None:
    """What a finished run keeps (:data:`KEEP`): its last checkpoint goes unless ``checkpoint``;
    with ``model``, its model folder stays as ``final_model/``. Its recorded completions, which
    only a replay of an unfinished run needs, go."""
    from podsrl.checkpoint import latest_checkpoint
    from podsrl.rollout.recorded import FILE as ROLLOUTS_FILE

    (run_dir / ROLLOUTS_FILE).unlink(missing_ok=True)
    ckpt = latest_checkpoint(run_dir)
    if keep == "checkpoint" or ckpt is None:
        return
    if keep == "model":
        shutil.rmtree(run_dir / "final_model", ignore_errors=True)
        os.replace(ckpt / "model", run_dir / "final_model")
    shutil.rmtree(run_dir / "checkpoints")


def _record(out: Path, config_path, overrides, methods: dict, seeds: int, budget_minutes: float | None,
            eval_every_s: float | None, steps: int | None = None, eval_every: int | None = None,
            reference: str = "grpo", clock: str = "wall", first_seed: int = 0) -> None:
    """Write (or extend) the comparison's record: methods keep their first definition's order; the
    seeds are those of every invocation, listed."""
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    recorded = _read_record(out)
    record = {"config": config_path, "overrides": list(overrides),
              "methods": {**recorded.get("methods", {}), **methods},
              "seeds": sorted(set(_recorded_seeds(recorded)) | set(range(first_seed, first_seed + seeds))),
              "reference": reference, "clock": clock,
              **({"steps": steps, "eval_every": eval_every} if steps is not None else
                 {"budget_minutes": budget_minutes, "eval_every_s": eval_every_s})}
    write_atomic(out / RECORD, yaml.safe_dump(record, sort_keys=False))


def _read_record(out: Path) -> dict:
    import yaml

    try:
        loaded = yaml.safe_load((out / RECORD).read_text()) if (out / RECORD).is_file() else {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise PodsError(f"cannot read {out / RECORD}: {first_line(e)}") from None
    return loaded if isinstance(loaded, dict) else {}


def _recorded_seeds(record: dict) -> list[int]:
    """The seeds a record lists; a record written before lists them as a count from ``first_seed``."""
    seeds, first = record.get("seeds", []), record.get("first_seed", 0)
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        first = first if isinstance(first, int) else 0
        return list(range(first, first + seeds))
    return [s for s in seeds if isinstance(s, int)] if isinstance(seeds, list) else []


def _recorded_methods(out: Path) -> list[str]:
    methods = _read_record(out).get("methods") or {}
    return list(methods) if isinstance(methods, dict) else []


def recorded_reference(out: Path) -> str:
    """The reference method a comparison folder was run against (grpo where it does not say)."""
    reference = _read_record(out).get("reference", "grpo")
    return reference if isinstance(reference, str) else "grpo"


def recorded_clock(out: Path) -> str:
    """The clock a comparison folder's times are on (wall where it does not say)."""
    clock = _read_record(out).get("clock", "wall")
    return clock if clock in CLOCKS else "wall"


def compared_methods(out: Path) -> tuple[list[str], list[int]]:
    """The methods a comparison folder holds runs of (the reference first, then in the recorded order, or
    by name where there is no record) and the seeds (from 0, or from the lowest seed run where that is
    above the recorded first seed, to the highest). A folder without ``seed-N/metrics.jsonl`` inside is
    not a method."""
    if not out.is_dir():
        return [], []
    seeds = {p.name: [int(s.name[5:]) for s in p.glob("seed-*") if s.name[5:].isdigit() and (s / "metrics.jsonl").is_file()]
             for p in out.iterdir() if p.is_dir()}
    seeds = {m: s for m, s in seeds.items() if s}
    order = [m for m in _recorded_methods(out) if m in seeds] + sorted(m for m in seeds if m not in _recorded_methods(out))
    order.sort(key=lambda m: m != recorded_reference(out))  # stable: the reference first, the rest as they were
    if not seeds:
        return order, []
    first = min(min(_recorded_seeds(_read_record(out)) or [0]), min(min(s) for s in seeds.values()))
    return order, list(range(first, max(max(s) for s in seeds.values()) + 1))


def finished_at(run_dir: Path, key: str = "train_seconds") -> float | None:
    """The training clock (or step, ``key="step"``) of a run folder's last evaluation, for a run
    that kept its metrics but not its checkpoints (committed results): a run stops once it passes
    its budget and is evaluated there, so one whose metrics reach the budget has finished. None
    without metrics."""
    if not (run_dir / "metrics.jsonl").is_file():
        return None
    evals, _ = read_evals(run_dir, "cpu" if key == CLOCKS["cpu"] else "wall")  # metrics without CPU time: one line
    return evals[-1][key] if evals else None


def read_evals(run_dir: Path, clock: str = "wall") -> tuple[list[dict], list[dict]]:
    """A run's evaluations and its step records, from its ``metrics.jsonl``. With ``clock="cpu"``
    each record's ``train_seconds`` is its training CPU time (its wall time kept as ``wall_seconds``)."""
    path = run_dir / "metrics.jsonl"
    rows = read_metrics(path)
    if clock == "cpu":
        if any(not _number(r.get("train_cpu_seconds")) for r in rows):
            raise PodsError(f"{path}: a record lacks train_cpu_seconds, so its times cannot be read on the CPU clock")
        rows = [{**r, "train_seconds": r["train_cpu_seconds"], "wall_seconds": r["train_seconds"]} for r in rows]
    for number, r in enumerate(rows, 1):
        accuracy = r.get("eval_accuracy")
        if not _number(r.get("train_seconds")) or not (accuracy is None or _number(accuracy)):
            raise PodsError(f"{path}: record {number} is not a podsrl metrics record (train_seconds, eval_accuracy)")
    return [r for r in rows if r.get("eval_accuracy") is not None], [r for r in rows if "update_s" in r]


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def seed_curves(runs: dict, method: str, seeds: list[int]) -> list[stats.Curve]:
    """The curve of each run of ``method`` over ``seeds`` (each read by :func:`read_evals`)."""
    return [stats.curve(*runs[method, s]) for s in seeds]


def run_curves(runs: dict, method: str, seeds: list[int]) -> stats.Runs:
    """The runs of ``method`` over ``seeds`` on common step grids."""
    return stats.align(seed_curves(runs, method, seeds))


def _value(x):
    """An array entry for the summary: NaN (never reached, or undefined) as None."""
    x = float(x)
    return None if math.isnan(x) else x


def _estimate(est: stats.Estimate, name: str) -> dict:
    """``name``, ``name_ci95`` and, for a figure to a target, ``name_never``: the resamples of
    ``name_resamples`` in which the method never reaches it."""
    return {name: _value(est.value), f"{name}_ci95": [est.low, est.high] if est.low is not None else None,
            **({f"{name}_never": est.never} if est.never is not None else {})}


def summarise(out: Path, methods: list[str], seeds, reference: str = "grpo", clock: str = "wall",
              q: float = stats.Q, window: int = stats.WINDOW) -> dict:
    """Per method against the reference (GRPO unless ``reference`` names another), over ``seeds``
    (a number: seeds 0 .. seeds-1; or the seeds themselves), with the definitions of
    :mod:`podsrl.stats` (seed-mean curves aligned by optimizer step, times from each seed's own
    clock, paired bootstrap over seeds):

    - the robust measures: optimizer steps and time to reach ``q`` of the reference's gain (from
      the step-0 accuracy to its final level, the mean of its last ``window`` evaluations) as a
      step ratio and a speed-up; the mean accuracy over the budget against steps and against
      time (up to the shorter method's time budget) and the final level, each as a difference
      from the reference's;
    - the paper's statistic: steps and time to first reach the reference's seed-mean peak, as a
      step ratio and a speed-up;
    - each figure per seed, against the same seed's reference run; step costs, memory, spreads.

    A method run on fewer seeds is measured against the reference's runs of the same seeds.
    Times are on ``clock``: wall seconds, or the training process's CPU seconds (``cpu``)."""
    seeds = list(range(seeds)) if isinstance(seeds, int) else sorted(seeds)
    runs = {(m, s): read_evals(out / m / f"seed-{s}", clock) for m in methods for s in seeds
            if (out / m / f"seed-{s}" / "metrics.jsonl").exists()}
    runs = {k: v for k, v in runs.items() if v[0]}  # a run killed before its first evaluation has no curve
    missing = [f"{m} seed {s}" for m in methods for s in seeds if (m, s) not in runs]
    ref_seeds = [s for s in seeds if (reference, s) in runs]
    summary = {"reference": reference, "clock": clock, "methods": {}, "seeds": seeds, "q": q, "final_window": window,
               "bootstrap": {"resamples": stats.RESAMPLES, "level": stats.LEVEL,
                             "intervals": "paired over seeds; percentiles by numpy's inverted_cdf"},
               "missing_runs": missing}
    if ref_seeds:
        ref, curves = run_curves(runs, reference, ref_seeds), seed_curves(runs, reference, ref_seeds)
        own = stats.compare_runs(ref, ref, q, window, resamples=0)
        per_seed = stats.each_seed(curves, curves, q, window)
        summary |= {"reference_base_accuracy": own["base_accuracy"].value, "reference_final_level": own["final_level"].value,
                    "reference_target_accuracy": own["target_gain"].value, "reference_steps_to_gain": own["steps_to_gain"].value,
                    "reference_time_to_gain_s": own["time_to_gain"].value,
                    "reference_peak_accuracy": own["target_peak"].value, "reference_steps_to_peak": own["steps_to_peak"].value,
                    "reference_time_to_peak_s": own["time_to_peak"].value,
                    "reference_peak_accuracy_per_seed": dict(zip(ref_seeds, map(float, per_seed["target_peak"])))}
    for m in methods:
        own_seeds = [s for s in ref_seeds if (m, s) in runs]
        summary["methods"][m] = _method_summary(runs, m, reference, own_seeds, q, window) if own_seeds else _empty()
    return summary


FIGURES = {**{name: name for name in ("step_ratio_to_gain", "speedup_to_gain", "mean_accuracy_steps_diff",
                                      "mean_accuracy_time_diff", "final_level_diff")},
           "step_ratio_to_peak": "step_ratio_vs_reference", "speedup_to_peak": "speedup_vs_reference"}
"""The figures with a paired interval: :func:`podsrl.stats.measures`' name -> the summary's (the
paper's statistic under its earlier names)."""


def _method_summary(runs: dict, m: str, reference: str, seeds: list[int], q: float, window: int) -> dict:
    ref_runs, method_runs = run_curves(runs, reference, seeds), run_curves(runs, m, seeds)
    est = stats.compare_runs(ref_runs, method_runs, q, window)
    per_seed_figures = stats.each_seed(seed_curves(runs, reference, seeds), seed_curves(runs, m, seeds), q, window)
    per_seed = []
    for i, s in enumerate(seeds):
        evals, steps = runs[m, s]
        figure = {name: _value(values[i]) for name, values in per_seed_figures.items()}
        per_seed.append({
            "seed": s, "peak_accuracy": max(e["eval_accuracy"] for e in evals), "final_accuracy": evals[-1]["eval_accuracy"],
            "base_accuracy": evals[0]["eval_accuracy"], "final_level": figure["final_level"],
            "reference_target_accuracy": figure["target_gain"], "steps_to_gain": figure["steps_to_gain"],
            "time_to_gain_s": figure["time_to_gain"],
            "step_ratio_to_gain": _reached(figure, "step_ratio_to_gain"), "speedup_to_gain": _reached(figure, "speedup_to_gain"),
            "mean_accuracy_steps": figure["mean_accuracy_steps"],
            "reference_peak_accuracy": figure["target_peak"], "time_to_reference_peak_s": figure["time_to_peak"],
            "speedup_vs_reference": _reached(figure, "speedup_to_peak"), "steps": steps[-1]["step"] if steps else 0,
            "steps_to_reference_peak": figure["steps_to_peak"], "step_ratio_vs_reference": _reached(figure, "step_ratio_to_peak"),
            "rollouts_per_step": stats.mean_of([r.get("rollouts_generated") for r in steps]),
            **sampler_statistics(steps),
            "train_seconds": steps[-1]["train_seconds"] if steps else 0.0,
            "generation_s_per_step": stats.mean_of([r["generation_s"] for r in steps]),
            "scoring_s_per_step": stats.mean_of([r.get("scoring_s") for r in steps]),
            "step_s": stats.mean_of([r["train_seconds"] - p["train_seconds"] for p, r in zip(steps, steps[1:])]),
            "update_s_per_step": stats.mean_of([r["update_s"] for r in steps]),
            "update_peak_memory_mb": _max([r.get("update_peak_memory_mb") for r in steps]),
        })
    speedups = [p["speedup_vs_reference"] for p in per_seed if p["speedup_vs_reference"] is not None]
    figures = {}
    for name, key in FIGURES.items():
        figures |= _estimate(est[name], key)
    for target, keys in {"gain": ("step_ratio_to_gain", "speedup_to_gain"),
                         "peak": ("step_ratio_vs_reference", "speedup_vs_reference")}.items():
        if math.isnan(est[f"steps_to_{target}"].value):  # its seed-mean curve never reaches it: no figure
            figures |= dict.fromkeys(keys)
    geomean = stats.geometric_mean_estimate(per_seed_figures["step_ratio_to_gain"])  # each seed on its whole curves
    figures |= _estimate(geomean, "step_ratio_to_gain_per_seed_geomean")
    if math.isinf(geomean.value):  # a seed never reaches its own reference's target
        figures["step_ratio_to_gain_per_seed_geomean"] = None
    sensitivity = [{"q": cell_q, "final_window": cell_window, **_estimate(cell, "step_ratio_to_gain")}
                   for (cell_q, cell_window), cell in stats.sensitivity(ref_runs, method_runs).items()]
    for cell in sensitivity:
        if cell["step_ratio_to_gain"] is not None and math.isinf(cell["step_ratio_to_gain"]):  # never reached
            cell["step_ratio_to_gain"] = None
    return {
        "peak_accuracy": stats.mean_of([p["peak_accuracy"] for p in per_seed]),
        "final_accuracy": stats.mean_of([p["final_accuracy"] for p in per_seed]),
        "reference_target_accuracy_same_seeds": est["target_gain"].value,
        "steps_to_gain": _value(est["steps_to_gain"].value), "time_to_gain_s": _value(est["time_to_gain"].value),
        "mean_accuracy_steps": est["mean_accuracy_steps"].value, "mean_accuracy_time": _value(est["mean_accuracy_time"].value),
        "final_level": est["final_level"].value,
        "reference_peak_accuracy_same_seeds": est["target_peak"].value,
        "time_to_reference_peak_s": _value(est["time_to_peak"].value),
        "steps_to_reference_peak": _value(est["steps_to_peak"].value),
        **figures,
        "sensitivity": sensitivity,
        "bootstrap_resamples": est["steps_to_gain"].resamples,
        "rollouts_per_step": stats.mean_of([p["rollouts_per_step"] for p in per_seed]),
        **{k: stats.mean_of([p[k] for p in per_seed]) for k in SAMPLER_STATISTICS},
        "seeds_reaching_gain": sum(p["steps_to_gain"] is not None for p in per_seed),
        "seeds_reaching_reference_peak": sum(p["steps_to_reference_peak"] is not None for p in per_seed),
        "fraction_of_seeds_reaching_reference_peak": sum(p["steps_to_reference_peak"] is not None
                                                         for p in per_seed) / len(per_seed),
        "generation_s_per_step": stats.mean_of([p["generation_s_per_step"] for p in per_seed]),
        "scoring_s_per_step": stats.mean_of([p["scoring_s_per_step"] for p in per_seed]),
        "step_s": stats.mean_of([p["step_s"] for p in per_seed]),
        "update_s_per_step": stats.mean_of([p["update_s_per_step"] for p in per_seed]),
        "update_peak_memory_mb": stats.mean_of([p["update_peak_memory_mb"] for p in per_seed]),
        "spread": {
            "peak_accuracy_std": stats.sample_sd([p["peak_accuracy"] for p in per_seed]),
            "final_level_std": stats.sample_sd([p["final_level"] for p in per_seed]),
            "speedup_vs_reference_per_seed_mean": stats.mean_of(speedups) if len(speedups) == len(per_seed) else None,
            "speedup_vs_reference_min": min(speedups) if speedups else None,
            "speedup_vs_reference_max": max(speedups) if speedups else None,
        },
        "per_seed": per_seed,
    }


def _reached(figure: dict, name: str):
    """A seed's step ratio or speed-up to a target, None where it never reaches it (not ∞ or 0)."""
    return figure[name] if figure["steps_to_" + name.rsplit("_to_", 1)[1]] is not None else None


def _empty() -> dict:
    return {"per_seed": [], "spread": {}}


SAMPLER_COUNTS = tuple(key for key in COUNTS if key != "rollouts_generated")  # that one is rollouts_per_step
SAMPLER_STATISTICS = (*(f"{key}_per_step" for key in SAMPLER_COUNTS), "zero_advantage_fraction")


def sampler_statistics(steps: list[dict]) -> dict:
    """What the sampler did per step (means; None where the run's metrics predate the key), and
    the share of the trained rollouts whose advantage was zero."""
    counts = {f"{key}_per_step": stats.mean_of([r.get(key) for r in steps]) for key in SAMPLER_COUNTS}
    zero = [(r["skipped_zero_advantage"], r["trained_sequences"]) for r in steps
            if r.get("trained_sequences") and r.get("skipped_zero_advantage") is not None]
    counts["zero_advantage_fraction"] = sum(z for z, _ in zero) / sum(n for _, n in zero) if zero else None
    return counts


def write_reports(out: Path, summary: dict, stem: str = "summary", plots: bool = True) -> Path:
    """``<stem>.json``, ``<stem>.md`` and (with ``plots``) the plots, each replaced whole (a write
    cut short leaves the previous one); returns the table's path."""
    write_atomic(out / f"{stem}.json", summary_json(summary))
    write_atomic(table := out / f"{stem}.md", markdown_table(summary))
    if plots:
        plot(out, summary)
    return table


def summary_json(summary: dict) -> str:
    """``summary`` as strict JSON: a value that is no finite number (a ratio's unbounded confidence
    limit, ``inf``) is ``null``, as in JSON's own writers; summaries written before hold the bare
    token ``Infinity``, which Python's ``json.loads`` still reads."""
    def strict(v):
        if isinstance(v, dict):
            return {k: strict(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [strict(x) for x in v]
        return None if isinstance(v, float) and not math.isfinite(v) else v

    return json.dumps(strict(summary), indent=2, allow_nan=False) + "\n"


def fmt(v, spec: str = ".2f") -> str:
    """A table cell: ``v`` in ``spec``, "n/a" where there is none."""
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def with_ci(v, ci, never: int | None = None, resamples: int | None = None, spec: str = ".2f", none: str = "n/a") -> str:
    """A figure with its interval, where it has one, and how many resamples never reach the
    target, where it is a figure to a target: ``0.51 [0.41–0.69] (never 3/2000)``; ``none`` where
    there is no figure."""
    text = none if v is None else fmt(v, spec)
    if ci:
        text += f" [{fmt(ci[0], spec)}–{fmt(ci[1], spec)}]"
    if ci and never is not None:
        text += f" (never {never}/{resamples})"
    return text


def _no_figure(steps) -> str:
    """What a missing ratio or speed-up means: the method never reached the target, or it did and
    the figure is undefined (a reference that gains nothing)."""
    return "never" if steps is None else "n/a"


def markdown_table(summary: dict) -> str:
    ref = summary.get("reference", "grpo")
    name = "GRPO" if ref == "grpo" else ref
    q, window = summary.get("q", stats.Q), summary.get("final_window", stats.WINDOW)
    cpu = " (CPU seconds of the training process)" if summary.get("clock") == "cpu" else ""
    lines = [
        f"{name}'s seed-mean curve (aligned by optimizer step): step-0 accuracy {fmt(summary.get('reference_base_accuracy'), '.3f')}, "
        f"final level {fmt(summary.get('reference_final_level'), '.3f')} (the mean of its last {window} evaluations); "
        f"{q:.0%} of its gain is {fmt(summary.get('reference_target_accuracy'), '.3f')}, reached at step "
        f"{fmt(summary.get('reference_steps_to_gain'), '.1f')}, {fmt(summary.get('reference_time_to_gain_s'), '.0f')} s of "
        f"training{cpu}. Its peak (the paper's target): {fmt(summary.get('reference_peak_accuracy'), '.3f')}, first reached at "
        f"step {fmt(summary.get('reference_steps_to_peak'), '.1f')}, {fmt(summary.get('reference_time_to_peak_s'), '.0f')} s.\n",
        f"Robust measures, against {name}: reach is linear between evaluations on the seed-mean curves, time is each seed's "
        f"own clock at that step averaged over seeds; 95% paired bootstrap over seeds, with the resamples whose seed-mean "
        f"curve never reaches the target.\n",
        f"| method | seeds | steps to {q:.0%} of {name}'s gain | step ratio vs {name} [95% CI] | time to {q:.0%} of gain (s) "
        f"| speed-up vs {name} [95% CI] | mean acc over steps | diff vs {name} [95% CI] | mean acc over time | diff vs {name} [95% CI] "
        f"| final level | diff vs {name} [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, r in summary["methods"].items():
        if not r["per_seed"]:
            continue
        n = r.get("bootstrap_resamples")
        lines.append(
            f"| {m} | {len(r['per_seed'])} | {fmt(r['steps_to_gain'], '.1f')} | "
            f"{with_ci(r['step_ratio_to_gain'], r['step_ratio_to_gain_ci95'], r.get('step_ratio_to_gain_never'), n, none=_no_figure(r['steps_to_gain']))} | "
            f"{fmt(r['time_to_gain_s'], '.0f')} | "
            f"{with_ci(r['speedup_to_gain'], r['speedup_to_gain_ci95'], r.get('speedup_to_gain_never'), n, none=_no_figure(r['steps_to_gain']))} | "
            f"{fmt(r['mean_accuracy_steps'], '.3f')} | {with_ci(r['mean_accuracy_steps_diff'], r['mean_accuracy_steps_diff_ci95'], spec='+.3f')} | "
            f"{fmt(r['mean_accuracy_time'], '.3f')} | {with_ci(r['mean_accuracy_time_diff'], r['mean_accuracy_time_diff_ci95'], spec='+.3f')} | "
            f"{fmt(r['final_level'], '.3f')} | {with_ci(r['final_level_diff'], r['final_level_diff_ci95'], spec='+.3f')} |")
    lines += sensitivity_lines(summary, name, q, window)
    lines += [
        "", f"The paper's statistic: first reaches {name}'s seed-mean peak (the maximum of a noisy curve, biased upward; "
        "kept for comparison with the paper), with the step costs.\n",
        f"| method | peak acc (mean ± sd) | final acc | time to {name} peak (s) | speed-up vs {name} [95% CI] | per-seed speed-ups "
        f"| seeds reaching their {name} peak | steps to {name} peak | step ratio vs {name} [95% CI] | rollouts/step | step s "
        "| gen s/step | score s/step | update s/step | update peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, r in summary["methods"].items():
        if not r["per_seed"]:
            continue
        sp, n = r["spread"], r.get("bootstrap_resamples")
        per_seed = ", ".join(fmt(p["speedup_vs_reference"], ".2f") for p in r["per_seed"])
        lines.append(
            f"| {m} | {fmt(r['peak_accuracy'], '.3f')} ± {fmt(sp['peak_accuracy_std'], '.3f')} | {fmt(r['final_accuracy'], '.3f')} | "
            f"{fmt(r['time_to_reference_peak_s'], '.0f')} | "
            f"{with_ci(r['speedup_vs_reference'], r.get('speedup_vs_reference_ci95'), r.get('speedup_vs_reference_never'), n, none=_no_figure(r.get('steps_to_reference_peak')))} | "
            f"{per_seed} | {r['seeds_reaching_reference_peak']}/{len(r['per_seed'])} | "
            f"{fmt(r.get('steps_to_reference_peak'), '.1f')} | "
            f"{with_ci(r.get('step_ratio_vs_reference'), r.get('step_ratio_vs_reference_ci95'), r.get('step_ratio_vs_reference_never'), n, none=_no_figure(r.get('steps_to_reference_peak')))} | "
            f"{fmt(r.get('rollouts_per_step'), '.0f')} | "
            f"{fmt(r.get('step_s'), '.1f')} | {fmt(r['generation_s_per_step'], '.1f')} | {fmt(r['scoring_s_per_step'], '.2f')} | "
            f"{fmt(r['update_s_per_step'], '.1f')} | {fmt(r['update_peak_memory_mb'], '.0f')} |"
        )
    ref_seeds = len(summary["methods"].get(ref, {}).get("per_seed", []))
    fewer = [f"{m} (seeds {', '.join(str(p['seed']) for p in r['per_seed'])}: {name}'s peak {fmt(r.get('reference_peak_accuracy_same_seeds'), '.3f')})"
             for m, r in summary["methods"].items() if 0 < len(r["per_seed"]) < ref_seeds]
    if fewer:
        lines.append(f"\nRun on fewer seeds than {name}, so measured against {name}'s runs of the same seeds: {'; '.join(fewer)}.")
    if summary.get("missing_runs"):
        lines.append(f"\nNot in the table (no run, or no evaluation yet): {', '.join(summary['missing_runs'])}.")
    return "\n".join(lines) + "\n"


def sensitivity_lines(summary: dict, name: str, q: float, window: int) -> list[str]:
    """The step ratio to gain at other q and final-level windows (sensitivity), and the per-seed
    measure (secondary): two tables of the summary."""
    shown = {m: r for m, r in summary["methods"].items() if r["per_seed"] and r.get("sensitivity")}
    if not shown:
        return []
    cells = [(c["q"], c["final_window"]) for c in next(iter(shown.values()))["sensitivity"]]
    lines = ["", f"Sensitivity, not a second chance: the step ratio above is the figure, at {q:.0%} of {name}'s gain "
             f"and a final level over the last {window} evaluations. Here the same ratio at other fractions of the "
             "gain and final-level windows, on the same resamples, shows how much it depends on those two choices.\n",
             "| method | " + " | ".join(f"{cq:.0%}, last {cw}" for cq, cw in cells) + " |",
             "|---|" + "---|" * len(cells)]
    for m, r in shown.items():
        n = r.get("bootstrap_resamples")
        lines.append(f"| {m} | " + " | ".join(with_ci(c["step_ratio_to_gain"], c["step_ratio_to_gain_ci95"],
                                                       c.get("step_ratio_to_gain_never"), n, none="never")
                                              for c in r["sensitivity"]) + " |")
    lines += ["", f"Per seed, a secondary figure: each seed's step ratio to {q:.0%} of its own {name} run's gain, and "
              "their geometric mean with a 95% bootstrap interval over seeds (never: the resamples that drew a seed "
              "that never reaches its target).\n",
              "| method | per-seed step ratios | geometric mean [95% CI] |", "|---|---|---|"]
    for m, r in shown.items():
        ratios = ", ".join("never" if p["step_ratio_to_gain"] is None else fmt(p["step_ratio_to_gain"]) for p in r["per_seed"])
        lines.append(f"| {m} | {ratios} | "
                     f"{with_ci(r.get('step_ratio_to_gain_per_seed_geomean'), r.get('step_ratio_to_gain_per_seed_geomean_ci95'), r.get('step_ratio_to_gain_per_seed_geomean_never'), r.get('bootstrap_resamples'), none='never')} |")
    return lines


def plot(out: Path, summary: dict) -> None:
    """Held-out accuracy against optimizer steps and against training seconds: each method's
    seed-mean curve, aligned by step, with the min–max band over seeds; against time each step
    sits at the seeds' mean training seconds there (each seed's own clock). Dashed: the
    reference's target (q of its gain), dotted: its peak (the paper's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clock = summary.get("clock", "wall")
    seconds = "training CPU seconds" if clock == "cpu" else "training wall-clock seconds"
    curves = {}
    for m, r in summary["methods"].items():
        if r["per_seed"]:
            curves[m] = stats.align([stats.curve(*read_evals(out / m / f"seed-{p['seed']}", clock)) for p in r["per_seed"]])
    for axis, name in [(f"{seconds} (evaluation excluded)", "accuracy_vs_time.png"), ("optimizer steps", "accuracy_vs_steps.png")]:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for m, runs in curves.items():
            x = runs.steps if name == "accuracy_vs_steps.png" else runs.eval_seconds.mean(0)
            line, = ax.plot(x, runs.accuracy.mean(0), marker=".", label=f"{m} ({len(runs.accuracy)} seeds)")
            ax.fill_between(x, runs.accuracy.min(0), runs.accuracy.max(0), alpha=0.15, color=line.get_color())
        ref = summary.get("reference", "grpo")
        if summary.get("reference_target_accuracy") is not None:
            ax.axhline(summary["reference_target_accuracy"], color="grey", ls="--", lw=0.8,
                       label=f"{summary.get('q', stats.Q):.0%} of {ref}'s gain")
            ax.axhline(summary["reference_peak_accuracy"], color="grey", ls=":", lw=0.8, label=f"{ref}'s peak (the paper's)")
        ax.set_xlabel(axis)
        ax.set_ylabel("held-out accuracy (pass@1)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        try:
            fig.savefig(out / f".{name}.tmp", dpi=120, format="png")
            os.replace(out / f".{name}.tmp", out / name)
        except OSError as e:  # a folder that cannot be written, a full disk
            raise PodsError(f"cannot write {out / name}: {os_reason(e)}") from None
        finally:
            plt.close(fig)


def _max(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return max(xs) if xs else None
