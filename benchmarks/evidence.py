"""The paper's two comparisons on the benchmark task chosen by GRPO's curve alone
(docs/experiments/task-selection.md), with settings fixed before the first PODS run on it.

    python benchmarks/evidence.py a     # GRPO vs PODS (max-variance) vs PODS (random), 8 seeds, step-matched
    python benchmarks/evidence.py b     # GRPO-GA vs PODS at the same n, 5 seeds, times on the CPU clock
    python benchmarks/evidence.py report  # (a)'s max-variance against random, with its interval

Both read the chosen task and its learning rate from benchmarks/results/task_selection/summary.json
and refuse to run before a task has been chosen. The settings are the selection's (n = 8 for GRPO,
4 prompts a step, 60 optimizer steps, 500 held-out problems every 5 steps, one thread a run):

(a) ``grpo`` (n = m = 8), ``pods`` (n = 32, max-variance m = 8), ``pods-random`` (n = 32, random
    m = 8); 8 seeds. Statistic: optimizer steps at which each seed-mean curve first reaches GRPO's
    seed-mean peak (linear between evaluations), as a ratio to GRPO's, 95% paired bootstrap over
    seeds; beside it the training-time ratio on the CPU clock, with the step-time split; and the
    ratio of max-variance's steps to GRPO's peak over random's, with its paired interval (``report``). Targets: PODS at most 0.6x GRPO's steps, the interval's upper
    end below 1.0; max-variance fewer steps than random, the interval excluding 1.0.
(b) ``grpo-ga`` (n = 32, all trained, micro-batches of 8) and ``pods`` (n = 32, m = 8); 5 seeds;
    the reference is grpo-ga. Statistic: training CPU seconds to GRPO-GA's seed-mean peak, its
    speed-up with the paired interval. Target: at least 1.7x, the interval's lower end above 1.0.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SELECTION = ROOT / "benchmarks" / "results" / "task_selection" / "summary.json"
CONFIGS = {"arithmetic_2digit": "configs/arithmetic_2digit.yaml", "letter_counting": "configs/gym_letter_counting.yaml",
           "chain_sum": "configs/gym_chain_sum.yaml"}
STEPS = 60
COMMON = ["--steps", str(STEPS), "--eval-every", "5", "--clock", "cpu", "--keep", "metrics", "--save-every", "10", "--jobs", "2"]
COMPARISONS = {
    "a": dict(methods="grpo,pods,pods-random:rule=random", seeds=8, reference="grpo", overrides=["n=32", "m=8"]),
    "b": dict(methods="grpo-ga,pods", seeds=5, reference="grpo-ga", overrides=["n=32", "m=8"]),
}


def chosen() -> tuple[str, str]:
    summary = json.loads(SELECTION.read_text()) if SELECTION.is_file() else {}
    task = summary.get("chosen")
    if not task:
        sys.exit("evidence.py: no benchmark task has been chosen yet (benchmarks/task_selection.py report)")
    return task, summary["candidates"][task]["lr"]


def run(comparison: str) -> int:
    task, lr = chosen()
    spec = COMPARISONS[comparison]
    out = ROOT / "benchmarks" / "results" / f"evidence_{comparison}_{task}"
    out.mkdir(parents=True, exist_ok=True)
    # the candidate's config without the keys compare sets itself (steps, the evaluation schedule)
    settings = {k: v for k, v in yaml.safe_load((ROOT / CONFIGS[task]).read_text()).items() if k not in ("steps", "eval_every")}
    (out / "task.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
    if comparison == "b":  # (a)'s PODS runs of seeds 0-4 have (b)'s settings: taken, not trained again
        reuse_pods_runs(ROOT / "benchmarks" / "results" / f"evidence_a_{task}", out, spec["seeds"])
    cmd = [sys.executable, "-m", "podsrl", "compare", str(out / "task.yaml"), "mode=pods", f"lr={lr}", "threads=1",
           "task.test_size=500", "prompts_per_step=4", *spec["overrides"], "--methods", spec["methods"],
           "--seeds", str(spec["seeds"]), "--reference", spec["reference"], *COMMON, "--out", str(out)]
    print(" ".join(cmd[2:]), flush=True)
    return subprocess.run(cmd, cwd=ROOT).returncode


def reuse_pods_runs(source: Path, out: Path, seeds: int) -> None:
    """Copy (a)'s finished PODS runs into (b)'s folder; compare checks each copy's recorded config
    against (b)'s before it counts the run as done (and refuses a mismatch)."""
    import shutil

    from podsrl.compare import finished_at

    for seed in range(seeds):
        run, there = source / "pods" / f"seed-{seed}", out / "pods" / f"seed-{seed}"
        if not there.exists() and run.is_dir() and (finished_at(run, "step") or 0) >= STEPS:
            shutil.copytree(run, there)
            print(f"pods seed {seed}: taken from {run.relative_to(ROOT)}", flush=True)


def report() -> None:
    """(a)'s extra figures, written to its folder's report.md: max-variance's optimizer steps to
    GRPO's seed-mean peak over random's, with compare's 95% paired bootstrap over seeds (a resample
    where random never reaches it: ratio 0; where max-variance never does: infinite); and the
    speed-ups on wall time from the same runs beside those on the CPU clock."""
    from podsrl.compare import bootstrap, crossing, mean_curve, mean_peak, read_evals, summarise

    task, _ = chosen()
    out = ROOT / "benchmarks" / "results" / f"evidence_a_{task}"
    seeds = COMPARISONS["a"]["seeds"]
    grpo, pods, rand = ([read_evals(out / m / f"seed-{s}", "cpu")[0] for s in range(seeds)]
                        for m in ("grpo", "pods", "pods-random"))

    def ratio(grpo_curves, pairs) -> float:  # pairs: (pods, random) of the same seed, resampled together
        target, _ = mean_peak(grpo_curves, "step")
        steps = [crossing(mean_curve(list(curves), "step"), target) for curves in zip(*pairs)]
        if steps[0] is None:
            return float("inf")
        return 0.0 if steps[1] is None else steps[0] / steps[1]

    pairs = list(zip(pods, rand))
    low, high = bootstrap(ratio, grpo, pairs)
    lines = [f"max-variance / random, optimizer steps to GRPO's seed-mean peak: {ratio(grpo, pairs):.2f} "
             f"[{low:.2f}-{high:.2f}] (95%, paired bootstrap over {len(pairs)} seeds)", "",
             "| method | speed-up vs GRPO, CPU clock [95% CI] | speed-up vs GRPO, wall clock [95% CI] |", "|---|---|---|"]
    by_clock = {clock: summarise(out, ["grpo", "pods", "pods-random"], seeds, "grpo", clock) for clock in ("cpu", "wall")}
    for method in ("grpo", "pods", "pods-random"):
        cells = []
        for clock in ("cpu", "wall"):
            r = by_clock[clock]["methods"][method]
            ci = r["speedup_vs_reference_ci95"]
            cells.append("n/a" if r["speedup_vs_reference"] is None else
                         f"{r['speedup_vs_reference']:.2f}" + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else ""))
        lines.append(f"| {method} | {' | '.join(cells)} |")
    lines += ["", "Wall time: two runs at a time on the machine's two cores (compare --jobs 2, threads=1 each)."]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=[*sorted(COMPARISONS), "report"])
    args = parser.parse_args()
    if args.what == "report":
        report()
    else:
        sys.exit(run(args.what))


if __name__ == "__main__":
    main()
