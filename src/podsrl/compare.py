"""``podsrl compare``: train several methods under the same wall-clock budget and compare their
held-out accuracy against training time (evaluation excluded), over several seeds.

A method is a name plus config overrides. Built in: ``grpo`` (mode=grpo, n = the config's m),
``pods`` (mode=pods) and ``grpo-ga`` (mode=grpo-ga); ``name:key=value,key=value`` defines more
(``pods-random:rule=random``). Runs live in ``<out>/<method>/seed-<s>``; a finished run is kept,
an unfinished one resumes, and a larger budget extends every run from its last checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import statistics
from pathlib import Path

from podsrl.checkpoint import read_metrics, write_atomic
from podsrl.config import load_config
from podsrl.errors import PodsError, first_line
from podsrl.sampling import COUNTS

BUILTIN = {"grpo": lambda c: ["mode=grpo", f"n={c.m}"], "pods": lambda c: ["mode=pods"], "grpo-ga": lambda c: ["mode=grpo-ga"]}
METHOD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
RECORD = "compare.yaml"
"""What a comparison folder records of the invocations that made it: methods, seeds, budget."""
SET_BY_COMPARE = {"seed": "--seeds", "output_dir": "--out", "steps": "--budget-minutes",
                  "time_budget_s": "--budget-minutes", "eval_every_s": "--eval-every-s", "save_every": "--keep",
                  "resume": "a rerun", "allow_config_change": "--allow-config-change"}
"""Settings each compare run gets from compare itself, and the option (or act) that sets them."""
KEEP = ("metrics", "model", "checkpoint")
"""What each finished run keeps besides its config and logs: nothing more, its final model, or its
last checkpoint (model and optimizer state, which a larger budget resumes from)."""


def parse_methods(specs: list[str], base) -> dict[str, list[str]]:
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
    if "grpo" not in methods:
        raise PodsError("compare needs the grpo method: times are measured to GRPO's peak")
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
            budget_minutes: float, out: Path, eval_every_s: float, keep: str = "metrics",
            allow_config_change: bool = False) -> dict:
    from podsrl.rundir import comparison_lock

    try:
        if out.exists() and not out.is_dir():
            raise PodsError(f"--out {out} is a file, not a folder")
    except OSError as e:  # a name too long, ...
        raise PodsError(f"cannot use --out {out}: {e.strerror or e}") from None
    if keep not in KEEP:
        raise PodsError(f"keep must be one of {', '.join(KEEP)}, got {keep!r}")
    base = load_config(config_path, overrides)
    methods = parse_methods(method_specs, base)
    _refuse_settings_of_compare(config_path, overrides, methods)
    budget_s = budget_minutes * 60
    plan = [(m, s) for s in range(seeds) for m in methods]  # seed-major: early results cover every method
    configs = {}
    for method, seed in plan:  # every run's config validated before any trains
        configs[method, seed] = load_config(config_path, [
            *overrides, *methods[method], f"seed={seed}", f"output_dir={out / method / f'seed-{seed}'}",
            "steps=1000000", f"time_budget_s={budget_s}", f"eval_every_s={eval_every_s}", f"save_every={10**9}",
            f"allow_config_change={allow_config_change}",
        ], baseline=base)  # a setting of the shared config is checked there, for the methods that use it
    with comparison_lock(out):  # one comparison at a time writes into out
        done = _check_folders(out, plan, configs, budget_s)
        _record(out, config_path, overrides, methods, seeds, budget_minutes, eval_every_s)
        _train_plan(out, plan, configs, done, budget_s, keep)
        summary = summarise(out, list(_recorded_methods(out) or methods), seeds)
        write_reports(out, summary)
    return summary


def _check_folders(out: Path, plan: list, configs: dict, budget_s: float) -> dict:
    """The training clock each run of ``plan`` has done (None: none); a run to be resumed or
    reused is checked against the config its folder records, before any trains."""
    from podsrl.checkpoint import latest_checkpoint, read_state
    from podsrl.rundir import check_same_config

    done = {}
    for method, seed in plan:
        run_dir = out / method / f"seed-{seed}"
        ckpt = latest_checkpoint(run_dir) if run_dir.is_dir() else None
        done[method, seed] = read_state(ckpt)["train_seconds"] if ckpt is not None else finished_seconds(run_dir)
        finished = done[method, seed] is not None and done[method, seed] >= budget_s
        if ckpt is not None or finished:  # to be resumed or reused as it is
            check_same_config(run_dir, configs[method, seed], f"podsrl compare would reuse {method} seed {seed} in",
                              shorter=False)
    return done


def _train_plan(out: Path, plan: list, configs: dict, done: dict, budget_s: float, keep: str) -> None:
    """Train each run of ``plan`` that is not done: resumed from its checkpoint, or from step 0."""
    from podsrl.checkpoint import latest_checkpoint
    from podsrl.rundir import discard_unfinished, finished_steps
    from podsrl.trainer import train

    for i, (method, seed) in enumerate(plan, 1):
        c, run_dir = configs[method, seed], out / method / f"seed-{seed}"
        if done[method, seed] is not None and done[method, seed] >= budget_s:
            print(f"[{i}/{len(plan)}] {method} seed {seed}: done ({done[method, seed]:.0f}s of {budget_s:.0f}s)", flush=True)
            continue
        if run_dir.is_dir() and latest_checkpoint(run_dir) is not None:
            c.resume = True
        elif run_dir.exists():  # a run without a checkpoint (interrupted, pruned, or results alone) starts again
            if kept := finished_steps(run_dir):
                print(f"[{i}/{len(plan)}] {method} seed {seed}: its earlier run stopped after step {kept} without a "
                      "checkpoint: training it again from step 0 (its metrics replaced)", flush=True)
            discard_unfinished(run_dir)
        print(f"[{i}/{len(plan)}] {method} seed {seed}: training for {budget_s:.0f}s", flush=True)
        train(c)
        prune(run_dir, keep)


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


def _record(out: Path, config_path, overrides, methods: dict, seeds: int, budget_minutes: float,
            eval_every_s: float) -> None:
    """Write (or extend) the comparison's record: methods keep their first definition's order."""
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    recorded = _read_record(out)
    record = {"config": config_path, "overrides": list(overrides),
              "methods": {**recorded.get("methods", {}), **methods},
              "seeds": max(seeds, recorded.get("seeds", 0)), "budget_minutes": budget_minutes, "eval_every_s": eval_every_s}
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


def compared_methods(out: Path) -> tuple[list[str], int]:
    """The methods a comparison folder holds runs of (grpo first, then in the recorded order, or
    by name where there is no record) and the number of seeds (highest seed index + 1). A folder
    without ``seed-N/metrics.jsonl`` inside is not a method."""
    if not out.is_dir():
        return [], 0
    seeds = {p.name: [int(s.name[5:]) for s in p.glob("seed-*") if s.name[5:].isdigit() and (s / "metrics.jsonl").is_file()]
             for p in out.iterdir() if p.is_dir()}
    seeds = {m: s for m, s in seeds.items() if s}
    order = [m for m in _recorded_methods(out) if m in seeds] + sorted(m for m in seeds if m not in _recorded_methods(out))
    order.sort(key=lambda m: m != "grpo")  # stable: grpo first, the rest as they were
    return order, max((max(s) + 1 for s in seeds.values()), default=0)


def finished_seconds(run_dir: Path) -> float | None:
    """The training clock of a run folder's last evaluation, for a run that kept its metrics but
    not its checkpoints (committed results): a run stops once its clock passes the budget, so one
    whose metrics reach the budget has finished. None without metrics."""
    if not (run_dir / "metrics.jsonl").is_file():
        return None
    evals, _ = read_evals(run_dir)
    return evals[-1]["train_seconds"] if evals else None


def read_evals(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """A run's evaluations and its step records, from its ``metrics.jsonl``."""
    path = run_dir / "metrics.jsonl"
    rows = read_metrics(path)
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


def points(evals: list[dict]) -> list[tuple[float, float]]:
    return [(e["train_seconds"], e["eval_accuracy"]) for e in evals]


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


def headline_speedup(grpo_curves: list[list[dict]], curves: list[list[dict]]) -> float:
    """GRPO's time to its seed-mean peak over the method's time to reach it on its seed-mean curve;
    0 where the method's mean curve never reaches it."""
    target, grpo_t = mean_peak(grpo_curves)
    return speedup(grpo_t, first_time_reaching(mean_curve(curves), target)) or 0.0


def bootstrap_speedup(grpo_curves: list[list[dict]], curves: list[list[dict]], resamples: int = 2000,
                      level: float = 0.95) -> tuple[float, float] | None:
    """Percentile interval of :func:`headline_speedup` over resampled seeds: each resample draws
    seeds with replacement and takes the same seeds of GRPO and the method (paired: a seed is one
    prompt order and one set of first evaluations). A resample where the method never reaches
    GRPO's peak counts as speed-up 0. None with fewer than two seeds."""
    if len(curves) < 2:
        return None
    rng = random.Random(0)
    draws = sorted(
        headline_speedup([grpo_curves[i] for i in idx], [curves[i] for i in idx])
        for idx in ([rng.randrange(len(curves)) for _ in curves] for _ in range(resamples))
    )
    tail = (1 - level) / 2
    return draws[int(tail * resamples)], draws[min(resamples - 1, int((1 - tail) * resamples))]


def summarise(out: Path, methods: list[str], seeds: int) -> dict:
    """Per method: peak and final accuracy, time to reach GRPO's peak accuracy and the speed-up
    over GRPO, step costs, memory, and the spread over seeds.

    The headline times use the seed-mean curves: GRPO's peak is the maximum of its mean curve,
    and a method's time is the first time its mean curve reaches that value. Per seed, the same is
    computed against that seed's GRPO run (noisier: one held-out set, one peak)."""
    runs = {(m, s): read_evals(out / m / f"seed-{s}") for m in methods for s in range(seeds)
            if (out / m / f"seed-{s}" / "metrics.jsonl").exists()}
    runs = {k: v for k, v in runs.items() if v[0]}  # a run killed before its first evaluation has no curve
    missing = [f"{m} seed {s}" for m in methods for s in range(seeds) if (m, s) not in runs]
    grpo_peak = {s: max(e["eval_accuracy"] for e in runs["grpo", s][0]) for s in range(seeds) if ("grpo", s) in runs}
    grpo_time = {s: first_time_reaching(points(runs["grpo", s][0]), grpo_peak[s]) for s in grpo_peak}
    target, grpo_t = mean_peak([runs["grpo", s][0] for s in grpo_peak])
    summary = {"methods": {}, "seeds": seeds, "grpo_peak_accuracy": target, "grpo_time_to_peak_s": grpo_t,
               "grpo_peak_accuracy_per_seed": grpo_peak, "missing_runs": missing}
    for m in methods:
        per_seed = []
        for s in range(seeds):
            if (m, s) not in runs or s not in grpo_peak:
                continue
            evals, steps = runs[m, s]
            t = first_time_reaching(points(evals), grpo_peak[s])
            per_seed.append({
                "seed": s, "peak_accuracy": max(e["eval_accuracy"] for e in evals), "final_accuracy": evals[-1]["eval_accuracy"],
                "base_accuracy": evals[0]["eval_accuracy"], "time_to_grpo_peak_s": t,
                "speedup_vs_grpo": speedup(grpo_time[s], t), "steps": steps[-1]["step"] if steps else 0,
                "steps_to_grpo_peak": first_time_reaching([(e["step"], e["eval_accuracy"]) for e in evals], grpo_peak[s]),
                "rollouts_per_step": _mean([r.get("rollouts_generated") for r in steps]),
                **sampler_statistics(steps),
                "train_seconds": steps[-1]["train_seconds"] if steps else 0.0,
                "generation_s_per_step": _mean([r["generation_s"] for r in steps]),
                "scoring_s_per_step": _mean([r.get("scoring_s") for r in steps]),
                "step_s": _mean([r["train_seconds"] - p["train_seconds"] for p, r in zip(steps, steps[1:])]),
                "update_s_per_step": _mean([r["update_s"] for r in steps]),
                "update_peak_memory_mb": _max([r.get("update_peak_memory_mb") for r in steps]),
            })
        # against GRPO's mean over the method's own seeds (all of them, unless the method ran fewer)
        target_m, grpo_t_m = mean_peak([runs["grpo", p["seed"]][0] for p in per_seed])
        t_mean = (first_time_reaching(mean_curve([runs[m, p["seed"]][0] for p in per_seed]), target_m)
                  if per_seed else None)
        # the same on the steps axis: the hardware-free part of a speed-up
        target_steps, grpo_steps = mean_peak([runs["grpo", p["seed"]][0] for p in per_seed], "step")
        steps_mean = (first_time_reaching(mean_curve([runs[m, p["seed"]][0] for p in per_seed], "step"), target_steps)
                      if per_seed else None)
        speedups = [p["speedup_vs_grpo"] for p in per_seed if p["speedup_vs_grpo"] is not None]
        ci = bootstrap_speedup([runs["grpo", p["seed"]][0] for p in per_seed], [runs[m, p["seed"]][0] for p in per_seed])
        summary["methods"][m] = {
            "peak_accuracy": _mean([p["peak_accuracy"] for p in per_seed]),
            "final_accuracy": _mean([p["final_accuracy"] for p in per_seed]),
            "grpo_peak_accuracy_same_seeds": target_m,
            "time_to_grpo_peak_s": t_mean,
            "speedup_vs_grpo": speedup(grpo_t_m, t_mean),
            "speedup_vs_grpo_ci95": list(ci) if ci else None,
            "steps_to_grpo_peak": steps_mean,
            "step_speedup_vs_grpo": speedup(grpo_steps, steps_mean),
            "rollouts_per_step": _mean([p["rollouts_per_step"] for p in per_seed]),
            **{k: _mean([p[k] for p in per_seed]) for k in SAMPLER_STATISTICS},
            "seeds_reaching_grpo_peak": len(speedups),
            "fraction_of_seeds_reaching_grpo_peak": len(speedups) / len(per_seed) if per_seed else None,
            "generation_s_per_step": _mean([p["generation_s_per_step"] for p in per_seed]),
            "scoring_s_per_step": _mean([p["scoring_s_per_step"] for p in per_seed]),
            "step_s": _mean([p["step_s"] for p in per_seed]),
            "update_s_per_step": _mean([p["update_s_per_step"] for p in per_seed]),
            "update_peak_memory_mb": _mean([p["update_peak_memory_mb"] for p in per_seed]),
            "spread": {
                "peak_accuracy_std": _std([p["peak_accuracy"] for p in per_seed]),
                "speedup_vs_grpo_per_seed_mean": _mean(speedups) if len(speedups) == len(per_seed) else None,
                "speedup_vs_grpo_min": min(speedups) if speedups else None,
                "speedup_vs_grpo_max": max(speedups) if speedups else None,
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


def markdown_table(summary: dict) -> str:
    fmt = lambda v, spec: "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)
    lines = [
        f"GRPO's peak on its seed-mean curve: {fmt(summary.get('grpo_peak_accuracy'), '.3f')}, "
        f"reached at {fmt(summary.get('grpo_time_to_peak_s'), '.0f')} s of training.\n",
        "| method | peak acc (mean ± std) | final acc | time to GRPO peak (s) | speed-up vs GRPO [95% CI] | per-seed speed-ups | seeds reaching their GRPO peak | steps to GRPO peak (vs GRPO) | rollouts/step | step s | gen s/step | score s/step | update s/step | update peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, r in summary["methods"].items():
        sp, ci = r["spread"], r.get("speedup_vs_grpo_ci95")
        speed = fmt(r["speedup_vs_grpo"], ".2f") + (f" [{fmt(ci[0], '.2f')}–{fmt(ci[1], '.2f')}]" if ci else "")
        per_seed = ", ".join(fmt(p["speedup_vs_grpo"], ".2f") for p in r["per_seed"])
        steps = (f"{fmt(r['steps_to_grpo_peak'], '.0f')} ({fmt(r.get('step_speedup_vs_grpo'), '.2f')}x)"
                 if r.get("steps_to_grpo_peak") is not None else "n/a")
        lines.append(
            f"| {m} | {fmt(r['peak_accuracy'], '.3f')} ± {fmt(sp['peak_accuracy_std'], '.3f')} | {fmt(r['final_accuracy'], '.3f')} | "
            f"{fmt(r['time_to_grpo_peak_s'], '.0f')} | {speed} | {per_seed} | {r['seeds_reaching_grpo_peak']}/{len(r['per_seed'])} | "
            f"{steps} | {fmt(r.get('rollouts_per_step'), '.0f')} | "
            f"{fmt(r.get('step_s'), '.1f')} | {fmt(r['generation_s_per_step'], '.1f')} | {fmt(r['scoring_s_per_step'], '.2f')} | "
            f"{fmt(r['update_s_per_step'], '.1f')} | {fmt(r['update_peak_memory_mb'], '.0f')} |"
        )
    grpo_seeds = len(summary["methods"].get("grpo", {}).get("per_seed", []))
    fewer = [f"{m} (seeds {', '.join(str(p['seed']) for p in r['per_seed'])}: GRPO's peak {fmt(r.get('grpo_peak_accuracy_same_seeds'), '.3f')})"
             for m, r in summary["methods"].items() if 0 < len(r["per_seed"]) < grpo_seeds]
    if fewer:
        lines.append(f"\nRun on fewer seeds than GRPO, so timed against GRPO's seed-mean curve over the same seeds: {'; '.join(fewer)}.")
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

    for axis, key, name in [("training wall-clock seconds (evaluation excluded)", "train_seconds", "accuracy_vs_time.png"),
                            ("optimizer steps", "step", "accuracy_vs_steps.png")]:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for m in summary["methods"]:
            curves = [read_evals(out / m / f"seed-{p['seed']}")[0] for p in summary["methods"][m]["per_seed"]]
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
        fig.savefig(out / f".{name}.tmp", dpi=120, format="png")
        os.replace(out / f".{name}.tmp", out / name)
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
