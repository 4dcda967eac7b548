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
import random
import statistics
from pathlib import Path

from podsrl.config import load_config
from podsrl.errors import PodsError

BUILTIN = {"grpo": lambda c: ["mode=grpo", f"n={c.m}"], "pods": lambda c: ["mode=pods"], "grpo-ga": lambda c: ["mode=grpo-ga"]}


def parse_methods(specs: list[str], base) -> dict[str, list[str]]:
    """``["grpo,pods", "pods-random:rule=random,n=32"]`` -> {name: config overrides}."""
    methods = {}
    for spec in specs:
        items = [spec] if ":" in spec else [x for x in spec.split(",") if x.strip()]
        for item in items:
            name, _, extra = item.strip().partition(":")
            overrides = BUILTIN[name](base) if name in BUILTIN else ["mode=pods"]
            methods[name] = overrides + [kv for kv in extra.split(",") if kv]
    if "grpo" not in methods:
        raise PodsError("compare needs the grpo method: times are measured to GRPO's peak")
    return methods


def run_all(config_path: str | None, overrides: list[str], method_specs: list[str], seeds: int,
            budget_minutes: float, out: Path, eval_every_s: float) -> dict:
    from podsrl.checkpoint import latest_checkpoint, read_state
    from podsrl.rundir import discard_unfinished
    from podsrl.trainer import train

    base = load_config(config_path, overrides)
    methods = parse_methods(method_specs, base)
    budget_s = budget_minutes * 60
    plan = [(m, s) for s in range(seeds) for m in methods]  # seed-major: early results cover every method
    configs = {}
    for method, seed in plan:  # validate every run's config before training any
        run_dir = out / method / f"seed-{seed}"
        configs[method, seed] = load_config(config_path, [
            *overrides, *methods[method], f"seed={seed}", f"output_dir={run_dir}", "steps=1000000",
            f"time_budget_s={budget_s}", f"eval_every_s={eval_every_s}", f"save_every={10**9}",
        ])
    for i, (method, seed) in enumerate(plan, 1):
        c = configs[method, seed]
        run_dir = Path(c.output_dir)
        ckpt = latest_checkpoint(run_dir) if run_dir.exists() else None
        done = read_state(ckpt)["train_seconds"] if ckpt is not None else finished_seconds(run_dir)
        if done is not None and done >= budget_s:
            print(f"[{i}/{len(plan)}] {method} seed {seed}: done ({done:.0f}s of {budget_s:.0f}s)", flush=True)
            continue
        if ckpt is not None:
            c.resume = True
        elif run_dir.exists():  # a run without a checkpoint (interrupted, or results alone) starts again
            discard_unfinished(run_dir)
        print(f"[{i}/{len(plan)}] {method} seed {seed}: training for {budget_s:.0f}s", flush=True)
        train(c)
    summary = summarise(out, list(methods), seeds)
    write_reports(out, summary)
    return summary


def finished_seconds(run_dir: Path) -> float | None:
    """The training clock of a run folder's last evaluation, for a run that kept its metrics but
    not its checkpoints (committed results): a run stops once its clock passes the budget, so one
    whose metrics reach the budget has finished. None without metrics."""
    try:
        evals, _ = read_evals(run_dir)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return evals[-1]["train_seconds"] if evals else None


def read_evals(run_dir: Path) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
    return [r for r in rows if r.get("eval_accuracy") is not None], [r for r in rows if "update_s" in r]


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


def mean_peak(curves: list[list[dict]]) -> tuple[float | None, float | None]:
    """The peak of the seed-mean curve and the first time it is reached; (None, None) without curves."""
    if not curves:
        return None, None
    curve = mean_curve(curves)
    peak = max(a for _, a in curve)
    return peak, first_time_reaching(curve, peak)


def headline_speedup(grpo_curves: list[list[dict]], curves: list[list[dict]]) -> float:
    """GRPO's time to its seed-mean peak over the method's time to reach it on its seed-mean curve;
    0 where the method's mean curve never reaches it."""
    target, grpo_t = mean_peak(grpo_curves)
    t = first_time_reaching(mean_curve(curves), target)
    return grpo_t / t if t else 0.0


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
    grpo_peak = {s: max(e["eval_accuracy"] for e in runs["grpo", s][0]) for s in range(seeds) if ("grpo", s) in runs}
    grpo_time = {s: first_time_reaching(points(runs["grpo", s][0]), grpo_peak[s]) for s in grpo_peak}
    target, grpo_t = mean_peak([runs["grpo", s][0] for s in grpo_peak])
    summary = {"methods": {}, "seeds": seeds, "grpo_peak_accuracy": target, "grpo_time_to_peak_s": grpo_t,
               "grpo_peak_accuracy_per_seed": grpo_peak}
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
                "speedup_vs_grpo": (grpo_time[s] / t) if t else None, "steps": steps[-1]["step"] if steps else 0,
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
        speedups = [p["speedup_vs_grpo"] for p in per_seed if p["speedup_vs_grpo"] is not None]
        ci = bootstrap_speedup([runs["grpo", p["seed"]][0] for p in per_seed], [runs[m, p["seed"]][0] for p in per_seed])
        summary["methods"][m] = {
            "peak_accuracy": _mean([p["peak_accuracy"] for p in per_seed]),
            "final_accuracy": _mean([p["final_accuracy"] for p in per_seed]),
            "grpo_peak_accuracy_same_seeds": target_m,
            "time_to_grpo_peak_s": t_mean,
            "speedup_vs_grpo": (grpo_t_m / t_mean) if t_mean and grpo_t_m else None,
            "speedup_vs_grpo_ci95": list(ci) if ci else None,
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


def write_reports(out: Path, summary: dict) -> None:
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.md").write_text(markdown_table(summary))
    plot(out, summary)


def markdown_table(summary: dict) -> str:
    fmt = lambda v, spec: "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)
    lines = [
        f"GRPO's peak on its seed-mean curve: {fmt(summary.get('grpo_peak_accuracy'), '.3f')}, "
        f"reached at {fmt(summary.get('grpo_time_to_peak_s'), '.0f')} s of training.\n",
        "| method | peak acc (mean ± std) | final acc | time to GRPO peak (s) | speed-up vs GRPO [95% CI] | per-seed speed-ups | seeds reaching their GRPO peak | step s | gen s/step | score s/step | update s/step | update peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, r in summary["methods"].items():
        sp, ci = r["spread"], r.get("speedup_vs_grpo_ci95")
        speed = fmt(r["speedup_vs_grpo"], ".2f") + (f" [{fmt(ci[0], '.2f')}–{fmt(ci[1], '.2f')}]" if ci else "")
        per_seed = ", ".join(fmt(p["speedup_vs_grpo"], ".2f") for p in r["per_seed"])
        lines.append(
            f"| {m} | {fmt(r['peak_accuracy'], '.3f')} ± {fmt(sp['peak_accuracy_std'], '.3f')} | {fmt(r['final_accuracy'], '.3f')} | "
            f"{fmt(r['time_to_grpo_peak_s'], '.0f')} | {speed} | {per_seed} | {r['seeds_reaching_grpo_peak']}/{len(r['per_seed'])} | "
            f"{fmt(r.get('step_s'), '.1f')} | {fmt(r['generation_s_per_step'], '.1f')} | {fmt(r['scoring_s_per_step'], '.2f')} | "
            f"{fmt(r['update_s_per_step'], '.1f')} | {fmt(r['update_peak_memory_mb'], '.0f')} |"
        )
    grpo_seeds = len(summary["methods"].get("grpo", {}).get("per_seed", []))
    fewer = [f"{m} (seeds {', '.join(str(p['seed']) for p in r['per_seed'])}: GRPO's peak {fmt(r.get('grpo_peak_accuracy_same_seeds'), '.3f')})"
             for m, r in summary["methods"].items() if 0 < len(r["per_seed"]) < grpo_seeds]
    if fewer:
        lines.append(f"\nRun on fewer seeds than GRPO, so timed against GRPO's seed-mean curve over the same seeds: {'; '.join(fewer)}.")
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
        fig.savefig(out / name, dpi=120)
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
