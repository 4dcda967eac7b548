"""The paper's two comparisons on the benchmark task chosen by GRPO's curve alone
(docs/experiments/task-selection.md), with settings fixed before the first PODS run on it.

    python benchmarks/evidence.py a     # GRPO vs PODS (max-variance) vs PODS (random), 8 seeds, step-matched
    python benchmarks/evidence.py b     # GRPO-GA vs PODS at the same n, 5 seeds, times on the CPU clock
    python benchmarks/evidence.py report a  # (a)'s figures, targets and per-seed table: report.md (also: report b)

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

import json
import subprocess
import sys
from pathlib import Path

import yaml

from podsrl.errors import ArgumentParser, PodsError, one_line_errors

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
    try:
        summary = json.loads(SELECTION.read_text()) if SELECTION.is_file() else {}
        task = summary.get("chosen")
        if not task:
            raise PodsError("no benchmark task has been chosen yet (benchmarks/task_selection.py report)")
        return task, summary["candidates"][task]["lr"]
    except (ValueError, AttributeError, KeyError, TypeError) as e:  # JSON that is not the selection's summary
        raise PodsError(f"{SELECTION}: not task_selection.py's summary ({type(e).__name__}: {e})") from None


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


def report(comparison: str, out: Path | None = None) -> str:
    """A comparison's figures for its page, written to its folder's report.md (and printed): per
    method the optimizer steps to the reference's seed-mean peak and their ratio, the speed-ups on
    the CPU clock and on wall time from the same runs, each with compare's 95% paired bootstrap
    over seeds, and the step-time split; for (a), max-variance's steps to GRPO's peak over
    random's, with its paired interval (a resample where random never reaches it: ratio 0; where
    max-variance never does: infinite); the per-seed figures; and each target, met or missed.
    While the runs go on, the figures are over the seeds whose runs have all finished (the runs
    train seed by seed), and the others are named. ``out``: the comparison's folder (default: the
    chosen task's). Returns the text."""
    from podsrl.compare import (bootstrap, finished_at, fmt, headline_step_ratio, mean_curve, read_evals, summarise,
                                 with_ci)

    spec = COMPARISONS[comparison]
    out = out or ROOT / "benchmarks" / "results" / f"evidence_{comparison}_{chosen()[0]}"
    if not out.is_dir():
        raise PodsError(f"comparison ({comparison}) has no runs yet: no folder {out} (python benchmarks/evidence.py "
                        f"{comparison} trains them)")
    methods = [m.split(":")[0] for m in spec["methods"].split(",")]
    seeds, reference = spec["seeds"], spec["reference"]
    unfinished = [(m, s) for s in range(seeds) for m in methods if (finished_at(out / m / f"seed-{s}", "step") or 0) < STEPS]
    done = min([s for _, s in unfinished], default=seeds)  # seeds 0 .. done-1 have finished every method
    cpu, wall = (summarise(out, methods, done, reference, clock) for clock in ("cpu", "wall"))
    curves = {m: [read_evals(out / m / f"seed-{s}", "cpu")[0] for s in range(done)] for m in methods}
    lines = [f"Comparison ({comparison}), {out.name}, over seeds 0-{done - 1}: {reference}'s seed-mean peak "
             f"{fmt(cpu['reference_peak_accuracy_steps'], '.3f')} at step {fmt(cpu['reference_steps_to_peak'], '.0f')} on its curve against optimizer steps (the step "
             f"figures), {fmt(cpu['reference_peak_accuracy'], '.3f')} at {fmt(cpu['reference_time_to_peak_s'], '.0f')} "
             "training CPU s on its curve against time (the speed-ups); 95% paired bootstrap intervals over seeds.", "",
             f"| method | seeds | peak acc (seed mean) | steps to {reference}'s peak | step ratio vs {reference} [95% CI] "
             f"| speed-up, CPU clock [95% CI] | speed-up, wall clock [95% CI] | step CPU s | gen s/step | update s/step |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for m in methods:
        r, w = cpu["methods"][m], wall["methods"][m]
        lines.append(f"| {m} | {len(r['per_seed'])} | {fmt(r['peak_accuracy'], '.3f')} | {fmt(r['steps_to_reference_peak'], '.1f')} "
                     f"| {with_ci(r['step_ratio_vs_reference'], r['step_ratio_vs_reference_ci95'])} "
                     f"| {with_ci(r['speedup_vs_reference'], r['speedup_vs_reference_ci95'])} "
                     f"| {with_ci(w['speedup_vs_reference'], w['speedup_vs_reference_ci95'])} "
                     f"| {fmt(r['step_s'], '.1f')} | {fmt(r['generation_s_per_step'], '.1f')} | {fmt(r['update_s_per_step'], '.1f')} |")
    lines += ["", "Step CPU s: the training process's CPU seconds a step (evaluation excluded); the generation and "
              "update split is in wall seconds, two runs at a time on the machine's two cores (compare --jobs 2, "
              "threads=1 each)."]
    if done:
        means = {m: dict(mean_curve(curves[m], "step")) for m in methods}
        lines += ["", "Seed-mean held-out accuracy at each evaluation (the curves against optimizer steps):", "",
                  "| step | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
        lines += [f"| {step:.0f} | " + " | ".join(fmt(means[m].get(step), '.3f') for m in methods) + " |"
                  for step in sorted(means[reference])]
    if comparison == "a":
        grpo, pods, rand = curves["grpo"], curves["pods"], curves["pods-random"]

        def ratio(grpo_curves, pairs) -> float:  # pairs: (pods, random) of the same seed, resampled together
            mv_steps, random_steps = (headline_step_ratio(grpo_curves, list(c))[1] for c in zip(*pairs))
            if mv_steps is None:
                return float("inf")
            return 0.0 if random_steps is None else mv_steps / random_steps

        pairs = list(zip(pods, rand))
        mv = ratio(grpo, pairs) if pairs else None
        mv_ci = bootstrap(ratio, grpo, pairs)
        lines += ["", f"max-variance / random, optimizer steps to GRPO's seed-mean peak: {with_ci(mv, mv_ci)} "
                  f"(seeds {', '.join(map(str, range(done))) or 'none yet'})"]
        pods = cpu["methods"]["pods"]
        ci = pods["step_ratio_vs_reference_ci95"]
        targets = [("PODS reaches GRPO's peak in at most 0.6x GRPO's steps, the interval's upper end below 1.0",
                    pods["step_ratio_vs_reference"] is not None and pods["step_ratio_vs_reference"] <= 0.6 and ci is not None and ci[1] < 1.0),
                   ("max-variance needs fewer steps than random, the interval excluding 1.0",
                    mv is not None and mv < 1.0 and mv_ci is not None and mv_ci[1] < 1.0)]
    else:
        pods = cpu["methods"]["pods"]
        ci = pods["speedup_vs_reference_ci95"]
        targets = [("PODS reaches GRPO-GA's peak at least 1.7x sooner (CPU clock), the interval's lower end above 1.0",
                    pods["speedup_vs_reference"] is not None and pods["speedup_vs_reference"] >= 1.7 and ci is not None and ci[0] > 1.0)]
    lines += ["", "| target | result |", "|---|---|"]
    complete = not unfinished
    lines += [f"| {t} | {('met' if ok else 'missed') if complete else ('so far met' if ok else 'so far missed')} |" for t, ok in targets]
    # per seed: each method against the same seed's reference run (that run's own peak)
    lines += ["", f"Per seed, against the same seed's {reference} run: its own peak, then each method's optimizer steps "
              f"to that peak (linear between evaluations) and training CPU seconds to it (n/a: never reached).", "",
              f"| seed | {reference}'s peak | " + " | ".join(f"{m} steps | {m} CPU s" for m in methods) + " |",
              "|---|---|" + "---|---|" * len(methods)]
    for s in sorted(cpu["reference_peak_accuracy_per_seed"]):
        row = {m: next((p for p in cpu["methods"][m]["per_seed"] if p["seed"] == s), None) for m in methods}
        cells = [f"{fmt(row[m] and row[m]['steps_to_reference_peak'], '.1f')} | {fmt(row[m] and row[m]['time_to_reference_peak_s'], '.0f')}"
                 for m in methods]
        lines.append(f"| {s} | {fmt(cpu['reference_peak_accuracy_per_seed'][s], '.3f')} | " + " | ".join(cells) + " |")
    if unfinished:
        lines += ["", f"Not finished yet, and not in these figures: {', '.join(f'{m} seed {s}' for m, s in unfinished)}"
                  + (f"; the finished runs of seeds {done}-{seeds - 1} wait for their seed's other runs." if done < seeds else ".")]
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    return text


@one_line_errors("evidence.py")
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="evidence.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=[*sorted(COMPARISONS), "report"])
    parser.add_argument("comparison", nargs="?", choices=sorted(COMPARISONS), default="a", help="which comparison report reads")
    args = parser.parse_args(argv)
    if args.what == "report":
        print(report(args.comparison), end="")
        return 0
    return run(args.what)


if __name__ == "__main__":
    sys.exit(main())
