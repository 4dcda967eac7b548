"""``podsrl compare``: train several methods under the same budget, a training clock (wall time,
evaluation excluded) or a number of optimizer steps (``--steps``: every method evaluated at the
same steps), and compare their held-out accuracy against time and against steps over several seeds.

A method is a name plus config overrides. Built in: ``grpo`` (mode=grpo, n = the config's m),
``pods`` (mode=pods) and ``grpo-ga`` (mode=grpo-ga); ``name:key=value,key=value`` defines more
(``pods-random:rule=random``). The others are timed to the reference method's seed-mean peak
(``grpo``, or ``--reference``). Runs live in ``<out>/<method>/seed-<s>``; a finished run is kept,
an unfinished one resumes, and a larger budget extends every run from its last checkpoint.
``--jobs N`` trains N runs at a time, each in its own process.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import shutil
import statistics
from pathlib import Path
from typing import NamedTuple

from podsrl.checkpoint import read_metrics, write_atomic
from podsrl.config import load_config
from podsrl.errors import PodsError, first_line
from podsrl.sampling import COUNTS

log = logging.getLogger(__name__)
BUILTIN = {"grpo": lambda c: ["mode=grpo", f"n={c.m}"], "pods": lambda c: ["mode=pods"], "grpo-ga": lambda c: ["mode=grpo-ga"]}
METHOD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
RECORD = "compare.yaml"
"""What a comparison folder records of the invocations that made it: methods, seeds, budget."""
SET_BY_COMPARE = {"seed": "--seeds", "output_dir": "--out", "steps": "--budget-minutes or --steps",
                  "time_budget_s": "--budget-minutes", "eval_every_s": "--eval-every-s", "eval_every": "--eval-every",
                  "save_every": "--save-every", "clock": "--clock",
                  "resume": "a rerun", "allow_config_change": "--allow-config-change"}
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


def speedup(grpo_time: float | None, time: float | None) -> float | None:
    """GRPO's time to its peak over a method's (None where the method never reaches it); a
    method that starts at GRPO's peak (time 0) is infinitely faster, unless GRPO's peak is its
    start too (1.0)."""
    if time is None or grpo_time is None:
        return None
    if time == 0:
        return 1.0 if grpo_time == 0 else math.inf
    return grpo_time / time


def run_all(config_path: str | None, overrides: list[str], method_specs: list[str], seeds: int,
            budget_minutes: float | None, out: Path, eval_every_s: float | None, keep: str = "metrics",
            allow_config_change: bool = False, steps: int | None = None, eval_every: int | None = None,
            reference: str = "grpo", clock: str = "wall", save_every: int = 0, jobs: int = 1) -> dict:
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
        raise PodsError(f"cannot use --out {out}: {e.strerror or e}") from None
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
    plan = [(m, s) for s in range(seeds) for m in methods]  # seed-major: early results cover every method
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
                reference, clock)
        _train_plan(out, plan, configs, done, budget, keep, jobs)
        summary = summarise(out, list(_recorded_methods(out) or methods), seeds, reference, clock)
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
    from podsrl.rundir import check_same_config

    done = {}
    for method, seed in plan:
        run_dir = out / method / f"seed-{seed}"
        ckpt = latest_checkpoint(run_dir) if run_dir.is_dir() else None
        done[method, seed] = read_state(ckpt).get(budget.key, 0.0) if ckpt is not None else finished_at(run_dir, budget.key)
        finished = done[method, seed] is not None and done[method, seed] >= budget.total
        if ckpt is not None or finished:  # to be resumed or reused as it is
            check_same_config(run_dir, configs[method, seed], f"podsrl compare would reuse {method} seed {seed} in",
                              shorter=False)
    return done


def _train_plan(out: Path, plan: list, configs: dict, done: dict, budget: Budget, keep: str, jobs: int = 1) -> None:
    """Train each run of ``plan`` that is not done: resumed from its checkpoint, or from step 0;
    ``jobs`` at a time, each in a spawned process of its own where ``jobs`` > 1."""
    from podsrl.checkpoint import latest_checkpoint
    from podsrl.rundir import discard_unfinished, finished_steps

    total, unit = budget.total, budget.unit
    todo = []
    for i, (method, seed) in enumerate(plan, 1):
        c, run_dir = configs[method, seed], out / method / f"seed-{seed}"
        if done[method, seed] is not None and done[method, seed] >= total:
            print(f"[{i}/{len(plan)}] {method} seed {seed}: done ({done[method, seed]:.0f}{unit} of {total:.0f}{unit})", flush=True)
            continue
        if run_dir.is_dir() and latest_checkpoint(run_dir) is not None:
            c.resume = True
        elif run_dir.exists():  # a run without a checkpoint (interrupted, pruned, or results alone) starts again
            if kept := finished_steps(run_dir):
                print(f"[{i}/{len(plan)}] {method} seed {seed}: its earlier run stopped after step {kept} without a "
                      "checkpoint: training it again from step 0 (its metrics replaced)", flush=True)
            discard_unfinished(run_dir)
        todo.append((f"[{i}/{len(plan)}] {method} seed {seed}: training for {total:.0f}{unit}", c, run_dir))
    if jobs == 1:
        for line, c, run_dir in todo:
            _train_and_prune(line, c, run_dir, keep)
        return
    _train_in_processes(todo, keep, jobs)


def _train_and_prune(line: str, c, run_dir: Path, keep: str) -> None:
    """One run of a comparison (``line`` says that it starts)."""
    from podsrl.trainer import train

    print(line, flush=True)
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

    from podsrl.cli import _quiet_logging, _terminate

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent takes Ctrl-C and ends this run with SIGTERM
    signal.signal(signal.SIGTERM, _terminate)
    _quiet_logging()
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
    with ``model``, its model folder stays as ``final_model/``."""
    from podsrl.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    if keep == "checkpoint" or ckpt is None:
        return
    if keep == "model":
        shutil.rmtree(run_dir / "final_model", ignore_errors=True)
        os.replace(ckpt / "model", run_dir / "final_model")
    shutil.rmtree(run_dir / "checkpoints")


def _record(out: Path, config_path, overrides, methods: dict, seeds: int, budget_minutes: float | None,
            eval_every_s: float | None, steps: int | None = None, eval_every: int | None = None,
            reference: str = "grpo", clock: str = "wall") -> None:
    """Write (or extend) the comparison's record: methods keep their first definition's order."""
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    recorded = _read_record(out)
    record = {"config": config_path, "overrides": list(overrides),
              "methods": {**recorded.get("methods", {}), **methods},
              "seeds": max(seeds, recorded.get("seeds", 0)), "reference": reference, "clock": clock,
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


def compared_methods(out: Path) -> tuple[list[str], int]:
    """The methods a comparison folder holds runs of (the reference first, then in the recorded order, or
    by name where there is no record) and the number of seeds (highest seed index + 1). A folder
    without ``seed-N/metrics.jsonl`` inside is not a method."""
    if not out.is_dir():
        return [], 0
    seeds = {p.name: [int(s.name[5:]) for s in p.glob("seed-*") if s.name[5:].isdigit() and (s / "metrics.jsonl").is_file()]
             for p in out.iterdir() if p.is_dir()}
    seeds = {m: s for m, s in seeds.items() if s}
    order = [m for m in _recorded_methods(out) if m in seeds] + sorted(m for m in seeds if m not in _recorded_methods(out))
    order.sort(key=lambda m: m != recorded_reference(out))  # stable: the reference first, the rest as they were
    return order, max((max(s) + 1 for s in seeds.values()), default=0)


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


def first_time_reaching(curve: list[tuple[float, float]], target: float) -> float | None:
    """The first time of a (time, accuracy) curve at which it reaches ``target``; None if never."""
    return next((t for t, a in curve if a >= target - 1e-12), None)


def points(evals: list[dict], key: str = "train_seconds") -> list[tuple[float, float]]:
    return [(e[key], e["eval_accuracy"]) for e in evals]


def crossing(curve: list[tuple[float, float]], target: float) -> float | None:
    """Where a curve, drawn as straight lines between its (x, accuracy) points, first reaches
    ``target``; None if it never does."""
    for i, (x1, a1) in enumerate(curve):
        if a1 >= target - 1e-12:
            if i == 0:
                return x1
            x0, a0 = curve[i - 1]  # below the target
            return x0 + (x1 - x0) * (target - a0) / (a1 - a0)
    return None


def step_ratio(reference_steps: float | None, steps: float | None) -> float | None:
    """A method's steps to the reference's peak over the reference's own (None where the method
    never reaches it); both at step 0 is 1.0, the reference at 0 and the method later infinite."""
    if steps is None or reference_steps is None:
        return None
    if reference_steps == 0:
        return 1.0 if steps == 0 else math.inf
    return steps / reference_steps


def held_curves(curves: list[list[dict]], key: str = "train_seconds") -> tuple[list[float], list[list[float]]]:
    """Every seed's accuracy at every evaluation time of any seed, up to the earliest end;
    between its evaluations a seed holds its last value. Returns (grid, [seed][grid])."""
    end = min(c[-1][key] for c in curves)
    grid = sorted({e[key] for c in curves for e in c if e[key] <= end})
    held = lambda c, x: next(e["eval_accuracy"] for e in reversed(c) if e[key] <= x)
    return grid, [[held(c, x) for x in grid] for c in curves]


def mean_curve(curves: list[list[dict]], key: str = "train_seconds") -> list[tuple[float, float]]:
    grid, values = held_curves(curves, key)
    return [(x, statistics.fmean(column)) for x, column in zip(grid, zip(*values))]


def mean_peak(curves: list[list[dict]], key: str = "train_seconds") -> tuple[float | None, float | None]:
    """The peak of the seed-mean curve and the first time (or step, ``key="step"``) it is reached;
    (None, None) without curves."""
    if not curves:
        return None, None
    curve = mean_curve(curves, key)
    peak = max(a for _, a in curve)
    return peak, first_time_reaching(curve, peak)


def headline_speedup(reference_curves: list[list[dict]], curves: list[list[dict]]) -> float:
    """The reference's time to its seed-mean peak over the method's time to reach it on its
    seed-mean curve; 0 where the method's mean curve never reaches it."""
    target, ref_t = mean_peak(reference_curves)
    return speedup(ref_t, first_time_reaching(mean_curve(curves), target)) or 0.0


def headline_step_ratio(reference_curves: list[list[dict]], curves: list[list[dict]]) -> tuple[float, float | None]:
    """The method's steps to the reference's seed-mean peak over the reference's (both read off
    the seed-mean curves against steps, linear between evaluations; infinite where the method's
    curve never reaches it), and the method's steps."""
    target, _ = mean_peak(reference_curves, "step")
    ref_steps = crossing(mean_curve(reference_curves, "step"), target)
    steps = crossing(mean_curve(curves, "step"), target)
    ratio = step_ratio(ref_steps, steps)
    return (math.inf if ratio is None else ratio), steps


def bootstrap(statistic, reference_curves: list[list[dict]], curves: list[list[dict]], resamples: int = 2000,
              level: float = 0.95) -> tuple[float, float] | None:
    """Percentile interval of ``statistic(reference_curves, curves)`` over resampled seeds: each
    resample draws seeds with replacement and takes the same seeds of the reference and the method
    (paired: a seed is one prompt order and one set of first evaluations). None with fewer than
    two seeds."""
    if len(curves) < 2:
        return None
    rng = random.Random(0)
    draws = sorted(
        statistic([reference_curves[i] for i in idx], [curves[i] for i in idx])
        for idx in ([rng.randrange(len(curves)) for _ in curves] for _ in range(resamples))
    )
    tail = (1 - level) / 2
    return draws[int(tail * resamples)], draws[min(resamples - 1, int((1 - tail) * resamples))]


def bootstrap_speedup(reference_curves: list[list[dict]], curves: list[list[dict]], resamples: int = 2000,
                      level: float = 0.95) -> tuple[float, float] | None:
    """:func:`bootstrap` of :func:`headline_speedup`: a resample where the method never reaches
    the reference's peak counts as speed-up 0."""
    return bootstrap(headline_speedup, reference_curves, curves, resamples, level)


def summarise(out: Path, methods: list[str], seeds: int, reference: str = "grpo", clock: str = "wall") -> dict:
    """Per method: peak and final accuracy, the training time and the optimizer steps to reach the
    reference method's peak accuracy (GRPO's unless ``reference`` names another), the speed-up over
    the reference on time and its step ratio, step costs, memory, and the spread over seeds.

    The headline figures use the seed-mean curves: the reference's peak is the maximum of its mean
    curve; a method's time is the first evaluation time at which its mean curve reaches that value,
    and its steps the first step at which the mean curve, drawn linearly between evaluations,
    reaches it. Per seed, the same is computed against that seed's reference run (noisier: one
    held-out set, one peak). Times are on ``clock``: wall seconds, or the training process's CPU
    seconds (``cpu``)."""
    runs = {(m, s): read_evals(out / m / f"seed-{s}", clock) for m in methods for s in range(seeds)
            if (out / m / f"seed-{s}" / "metrics.jsonl").exists()}
    runs = {k: v for k, v in runs.items() if v[0]}  # a run killed before its first evaluation has no curve
    missing = [f"{m} seed {s}" for m in methods for s in range(seeds) if (m, s) not in runs]
    ref_peak = {s: max(e["eval_accuracy"] for e in runs[reference, s][0]) for s in range(seeds) if (reference, s) in runs}
    ref_time = {s: first_time_reaching(points(runs[reference, s][0]), ref_peak[s]) for s in ref_peak}
    ref_steps = {s: crossing(points(runs[reference, s][0], "step"), ref_peak[s]) for s in ref_peak}
    target, ref_t = mean_peak([runs[reference, s][0] for s in ref_peak])
    # the step figures read the reference's seed-mean curve against steps, whose peak may differ
    step_target, ref_step = mean_peak([runs[reference, s][0] for s in ref_peak], "step")
    summary = {"reference": reference, "clock": clock, "methods": {}, "seeds": seeds, "reference_peak_accuracy": target,
               "reference_time_to_peak_s": ref_t, "reference_peak_accuracy_steps": step_target,
               "reference_steps_to_peak": ref_step, "reference_peak_accuracy_per_seed": ref_peak, "missing_runs": missing}
    for m in methods:
        per_seed = []
        for s in range(seeds):
            if (m, s) not in runs or s not in ref_peak:
                continue
            evals, steps = runs[m, s]
            t = first_time_reaching(points(evals), ref_peak[s])
            n = crossing(points(evals, "step"), ref_peak[s])
            per_seed.append({
                "seed": s, "peak_accuracy": max(e["eval_accuracy"] for e in evals), "final_accuracy": evals[-1]["eval_accuracy"],
                "base_accuracy": evals[0]["eval_accuracy"], "time_to_reference_peak_s": t,
                "speedup_vs_reference": speedup(ref_time[s], t), "steps": steps[-1]["step"] if steps else 0,
                "steps_to_reference_peak": n, "step_ratio_vs_reference": step_ratio(ref_steps[s], n),
                "rollouts_per_step": _mean([r.get("rollouts_generated") for r in steps]),
                **sampler_statistics(steps),
                "train_seconds": steps[-1]["train_seconds"] if steps else 0.0,
                "generation_s_per_step": _mean([r["generation_s"] for r in steps]),
                "scoring_s_per_step": _mean([r.get("scoring_s") for r in steps]),
                "step_s": _mean([r["train_seconds"] - p["train_seconds"] for p, r in zip(steps, steps[1:])]),
                "update_s_per_step": _mean([r["update_s"] for r in steps]),
                "update_peak_memory_mb": _max([r.get("update_peak_memory_mb") for r in steps]),
            })
        # against the reference's mean over the method's own seeds (all, unless the method ran fewer)
        ref_curves = [runs[reference, p["seed"]][0] for p in per_seed]
        own = [runs[m, p["seed"]][0] for p in per_seed]
        target_m, ref_t_m = mean_peak(ref_curves)
        t_mean = first_time_reaching(mean_curve(own), target_m) if per_seed else None
        ratio, steps_mean = headline_step_ratio(ref_curves, own) if per_seed else (None, None)
        speedups = [p["speedup_vs_reference"] for p in per_seed if p["speedup_vs_reference"] is not None]
        ci = bootstrap(headline_speedup, ref_curves, own)
        step_ci = bootstrap(lambda r, c: headline_step_ratio(r, c)[0], ref_curves, own)
        summary["methods"][m] = {
            "peak_accuracy": _mean([p["peak_accuracy"] for p in per_seed]),
            "final_accuracy": _mean([p["final_accuracy"] for p in per_seed]),
            "reference_peak_accuracy_same_seeds": target_m,
            "time_to_reference_peak_s": t_mean,
            "speedup_vs_reference": speedup(ref_t_m, t_mean),
            "speedup_vs_reference_ci95": list(ci) if ci else None,
            "steps_to_reference_peak": steps_mean,
            "step_ratio_vs_reference": ratio,
            "step_ratio_vs_reference_ci95": list(step_ci) if step_ci else None,
            "rollouts_per_step": _mean([p["rollouts_per_step"] for p in per_seed]),
            **{k: _mean([p[k] for p in per_seed]) for k in SAMPLER_STATISTICS},
            "seeds_reaching_reference_peak": len(speedups),
            "fraction_of_seeds_reaching_reference_peak": len(speedups) / len(per_seed) if per_seed else None,
            "generation_s_per_step": _mean([p["generation_s_per_step"] for p in per_seed]),
            "scoring_s_per_step": _mean([p["scoring_s_per_step"] for p in per_seed]),
            "step_s": _mean([p["step_s"] for p in per_seed]),
            "update_s_per_step": _mean([p["update_s_per_step"] for p in per_seed]),
            "update_peak_memory_mb": _mean([p["update_peak_memory_mb"] for p in per_seed]),
            "spread": {
                "peak_accuracy_std": _std([p["peak_accuracy"] for p in per_seed]),
                "speedup_vs_reference_per_seed_mean": _mean(speedups) if len(speedups) == len(per_seed) else None,
                "speedup_vs_reference_min": min(speedups) if speedups else None,
                "speedup_vs_reference_max": max(speedups) if speedups else None,
            },
            "per_seed": per_seed,
        }
    return summary


SAMPLER_COUNTS = tuple(key for key in COUNTS if key != "rollouts_generated")  # that one is rollouts_per_step
SAMPLER_STATISTICS = (*(f"{key}_per_step" for key in SAMPLER_COUNTS), "zero_advantage_fraction")


def sampler_statistics(steps: list[dict]) -> dict:
    """What the sampler did per step (means; None where the run's metrics predate the key), and
    the share of the trained rollouts whose advantage was zero."""
    stats = {f"{key}_per_step": _mean([r.get(key) for r in steps]) for key in SAMPLER_COUNTS}
    zero = [(r["skipped_zero_advantage"], r["trained_sequences"]) for r in steps
            if r.get("trained_sequences") and r.get("skipped_zero_advantage") is not None]
    stats["zero_advantage_fraction"] = sum(z for z, _ in zero) / sum(n for _, n in zero) if zero else None
    return stats


def write_reports(out: Path, summary: dict) -> None:
    """summary.json, summary.md and the plots, each replaced whole (a write cut short leaves the
    previous one)."""
    write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_atomic(out / "summary.md", markdown_table(summary))
    plot(out, summary)


def fmt(v, spec: str = ".2f") -> str:
    """A table cell: ``v`` in ``spec``, "n/a" where there is none."""
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def with_ci(v, ci) -> str:
    """A figure with its interval, where it has one: ``1.15 [0.00–1.54]``."""
    return fmt(v) + (f" [{fmt(ci[0])}–{fmt(ci[1])}]" if ci else "")


def markdown_table(summary: dict) -> str:
    ref = summary.get("reference", "grpo")
    name = "GRPO" if ref == "grpo" else ref
    lines = [
        f"{name}'s peak on its seed-mean curve: {fmt(summary.get('reference_peak_accuracy'), '.3f')}, "
        f"reached at {fmt(summary.get('reference_time_to_peak_s'), '.0f')} s of training"
        f"{' (CPU seconds of the training process)' if summary.get('clock') == 'cpu' else ''}; on its curve against "
        f"optimizer steps (the step columns): {fmt(summary.get('reference_peak_accuracy_steps'), '.3f')}, at step "
        f"{fmt(summary.get('reference_steps_to_peak'), '.0f')}.\n",
        f"| method | peak acc (mean ± std) | final acc | time to {name} peak (s) | speed-up vs {name} [95% CI] | per-seed speed-ups "
        f"| seeds reaching their {name} peak | steps to {name} peak | step ratio vs {name} [95% CI] | rollouts/step | step s "
        "| gen s/step | score s/step | update s/step | update peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, r in summary["methods"].items():
        sp = r["spread"]
        per_seed = ", ".join(fmt(p["speedup_vs_reference"], ".2f") for p in r["per_seed"])
        lines.append(
            f"| {m} | {fmt(r['peak_accuracy'], '.3f')} ± {fmt(sp['peak_accuracy_std'], '.3f')} | {fmt(r['final_accuracy'], '.3f')} | "
            f"{fmt(r['time_to_reference_peak_s'], '.0f')} | {with_ci(r['speedup_vs_reference'], r.get('speedup_vs_reference_ci95'))} | "
            f"{per_seed} | {r['seeds_reaching_reference_peak']}/{len(r['per_seed'])} | "
            f"{fmt(r.get('steps_to_reference_peak'), '.1f')} | {with_ci(r.get('step_ratio_vs_reference'), r.get('step_ratio_vs_reference_ci95'))} | "
            f"{fmt(r.get('rollouts_per_step'), '.0f')} | "
            f"{fmt(r.get('step_s'), '.1f')} | {fmt(r['generation_s_per_step'], '.1f')} | {fmt(r['scoring_s_per_step'], '.2f')} | "
            f"{fmt(r['update_s_per_step'], '.1f')} | {fmt(r['update_peak_memory_mb'], '.0f')} |"
        )
    ref_seeds = len(summary["methods"].get(ref, {}).get("per_seed", []))
    fewer = [f"{m} (seeds {', '.join(str(p['seed']) for p in r['per_seed'])}: {name}'s peak {fmt(r.get('reference_peak_accuracy_same_seeds'), '.3f')})"
             for m, r in summary["methods"].items() if 0 < len(r["per_seed"]) < ref_seeds]
    if fewer:
        lines.append(f"\nRun on fewer seeds than {name}, so timed against {name}'s seed-mean curve over the same seeds: {'; '.join(fewer)}.")
    if summary.get("missing_runs"):
        lines.append(f"\nNot in the table (no run, or no evaluation yet): {', '.join(summary['missing_runs'])}.")
    return "\n".join(lines) + "\n"


def plot(out: Path, summary: dict) -> None:
    """Held-out accuracy against training seconds and against steps: the seed-mean curve (each
    seed holding its last evaluation) with the min–max band over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    clock = summary.get("clock", "wall")
    seconds = "training CPU seconds" if clock == "cpu" else "training wall-clock seconds"
    for axis, key, name in [(f"{seconds} (evaluation excluded)", "train_seconds", "accuracy_vs_time.png"),
                            ("optimizer steps", "step", "accuracy_vs_steps.png")]:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for m in summary["methods"]:
            curves = [read_evals(out / m / f"seed-{p['seed']}", clock)[0] for p in summary["methods"][m]["per_seed"]]
            if not curves:
                continue
            grid, values = held_curves(curves, key)
            ys = np.array(values)
            line, = ax.step(grid, ys.mean(0), where="post", label=f"{m} ({len(curves)} seeds)")
            ax.fill_between(grid, ys.min(0), ys.max(0), step="post", alpha=0.15, color=line.get_color())
        ax.set_xlabel(axis)
        ax.set_ylabel("held-out accuracy (pass@1)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        try:
            fig.savefig(out / f".{name}.tmp", dpi=120, format="png")
            os.replace(out / f".{name}.tmp", out / name)
        except OSError as e:  # a folder that cannot be written, a full disk
            raise PodsError(f"cannot write {out / name}: {e.strerror or e}") from None
        finally:
            plt.close(fig)


def _mean(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.fmean(xs) if xs else None


def _std(xs):
    xs = [x for x in xs if x is not None]
    return statistics.pstdev(xs) if len(xs) > 1 else 0.0


def _max(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return max(xs) if xs else None
