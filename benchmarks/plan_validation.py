"""``podsrl plan``'s predicted step times against step times measured in training runs.

    python benchmarks/plan_validation.py                 # the two-digit comparisons' settings against their committed runs
    python benchmarks/plan_validation.py --runs confirm  # ... against the confirmation's runs (seeds 8-15, 8-12)
    python benchmarks/plan_validation.py --runs confirm-c       # GRPO and PODS at async_lag=1 (seeds 16-23)
    python benchmarks/plan_validation.py --runs confirm-c-sync  # ... and synchronous, on two threads
    python benchmarks/plan_validation.py configs/compare_gpu.yaml --train-steps 6 --out DIR   # short runs trained here

It runs ``podsrl plan`` at a configuration (default: the two-digit comparisons', ``threads=1`` as
their runs were) and compares the predicted step of GRPO (n = m), PODS (n, m) and GRPO-GA (n) with
the mean step of the finished runs of each method: the comparisons' (``--runs committed``:
``benchmarks/results/evidence_{a,b}_arithmetic_2digit``), their confirmations' (``--runs confirm``),
or runs of ``--train-steps`` steps trained here. A run's step time is the difference of its
cumulative training clock between consecutive logged steps, on the plan's clock (the config's
``clock``: ``train_seconds``, or ``train_cpu_seconds`` with ``clock=cpu``, as the comparisons were
timed), after its first step (which pays first-call costs a run amortises).

How many rollouts an update trains depends on the rewards (zero-advantage rollouts are skipped),
which change as the policy learns, so three predictions are compared:

- the plan's own: its cost model with the rollouts it expects each update to train over the reward
  signal of the set's GRPO runs (``--signal-from`` those runs: what a user who has GRPO runs on the
  task knows before trying PODS; ``--signal-from start``: the start of training's only);
- the same cost model at the start of training's signal (the groups the plan generated);
- the cost model given the rollouts each run actually trained (its mean
  ``trained_sequences - skipped_zero_advantage``), which checks the cost model apart from the
  rewards.

Outputs in ``--out`` (default ``benchmarks/results/plan_validation``; with ``--runs SET``,
``plan_validation_SET``): ``plan.json`` (the plan's report), ``plan.txt`` (its table),
``validation.json`` and ``validation.txt`` (the ratios).
Target: every ratio of the plan's own prediction to the measured step within 1 +- 0.15.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))  # podsrl from this checkout, as the podsrl commands it runs take it
from podsrl.checkpoint import write_atomic  # noqa: E402
from podsrl.errors import ArgumentParser, PodsError, one_line_errors  # noqa: E402
RESULTS = REPO / "benchmarks" / "results"
EVIDENCE_A, EVIDENCE_B = RESULTS / "evidence_a_arithmetic_2digit", RESULTS / "evidence_b_arithmetic_2digit"
DEFAULT_CONFIG = EVIDENCE_A / "task.yaml"
DEFAULT_OVERRIDES = ["lr=1e-5", "threads=1", "task.test_size=500", "prompts_per_step=4", "mode=pods", "n=32", "m=8",
                     "clock=cpu"]
"""The two comparisons' shared settings (their compare.yaml, and its --clock cpu), each method then
changing mode and n; with their config (the default), the overrides given go on top of them."""
NOT_COMPARED = ("seed", "eval_every", "eval_every_s", "task.test_size")
"""Settings in which a run may differ from the plan it is compared with: they do not change a
training step (the seed's problems aside)."""
CONFIRM_A, CONFIRM_B = RESULTS / "evidence_confirm_a_arithmetic_2digit", RESULTS / "evidence_confirm_b_arithmetic_2digit"
CONFIRM_C = RESULTS / "evidence_confirm_c_arithmetic_2digit"
RUN_SETS = {
    "committed": {"grpo": EVIDENCE_A / "grpo", "pods": EVIDENCE_A / "pods", "grpo-ga": EVIDENCE_B / "grpo-ga"},
    "confirm": {"grpo": CONFIRM_A / "grpo", "pods": CONFIRM_A / "pods", "grpo-ga": CONFIRM_B / "grpo-ga"},
    "confirm-c": {"grpo": CONFIRM_C / "grpo-async", "pods": CONFIRM_C / "pods-async"},
    "confirm-c-sync": {"grpo": CONFIRM_C / "grpo", "pods": CONFIRM_C / "pods"},
}
"""The runs compared with: the two comparisons' (a: seeds 0-7, b: 0-4), their confirmations'
(seeds 8-15 and 8-12), or the clock confirmation's (seeds 16-23: GRPO and PODS at ``async_lag=1``,
or synchronous on two threads), each method's finished runs (every seed-* folder that reached its
last step)."""
SET_OVERRIDES = {
    "confirm-c": ["async_lag=1", "threads=1", "async_worker_threads=1", "clock=wall"],
    "confirm-c-sync": ["threads=2", "clock=wall"],
}
"""Where a set's runs differ from the comparisons' shared settings: the clock confirmation's, timed
on the wall clock (its compare.yaml); the overrides given go on top."""
TOLERANCE = 0.15


def finished_runs(method_folder: Path) -> list[Path]:
    """A method's seed folders whose runs reached their configured last step (compare's test)."""
    import yaml

    from podsrl.compare import finished_at

    done = []
    for folder in sorted(method_folder.glob("seed-*")):
        try:
            steps = yaml.safe_load((folder / "config.yaml").read_text())["steps"]
        except (OSError, KeyError, TypeError):
            continue
        if (finished_at(folder, "step") or 0) >= steps:
            done.append(folder)
    return done


def run_steps(folder: Path) -> list[dict]:
    """A run's logged training steps (evaluation-only lines left out), read as the trainer reads them."""
    from podsrl.checkpoint import read_metrics

    return [r for r in read_metrics(folder / "metrics.jsonl") if "update_s" in r]


def measured(folders: list[Path]) -> dict:
    """Mean step seconds (wall and CPU) after each run's first step, its split, the rollouts the
    update trained and its peak memory, over every step of the runs."""
    wall, cpu, parts, trained, peak = [], [], {"generation_s": [], "scoring_s": [], "update_s": []}, [], []
    for folder in folders:
        steps = run_steps(folder)
        for before, step in zip(steps, steps[1:]):
            wall.append(step["train_seconds"] - before["train_seconds"])
            cpu.append(step["train_cpu_seconds"] - before["train_cpu_seconds"])
            for key in parts:
                parts[key].append(step[key])
            trained.append(step["trained_sequences"] - step["skipped_zero_advantage"])
            peak.append(step.get("update_peak_memory_mb") or float("nan"))
    if not wall:
        raise SystemExit(f"plan_validation: no run with two or more steps in {', '.join(map(str, folders))}")
    mean = lambda xs: sum(xs) / len(xs)
    return {"runs": len(folders), "steps": len(wall), "wall_s": mean(wall), "cpu_s": mean(cpu),
            **{k: mean(v) for k, v in parts.items()}, "trained": mean(trained), "update_peak_mb": mean(peak)}


def method_overrides(mode: str, n: int, m: int) -> list[str]:
    return {"grpo": ["mode=grpo", f"n={m}", f"m={m}"], "pods": ["mode=pods", f"n={n}", f"m={m}"],
            "grpo-ga": ["mode=grpo-ga", f"n={n}", f"m={m}"]}[mode]


def merged(*groups: list[str]) -> list[str]:
    """``key=value`` overrides with each key once, the last one given kept (podsrl refuses a key twice)."""
    last = {}
    for override in (o for group in groups for o in group):
        last.pop(override.partition("=")[0], None)
        last[override.partition("=")[0]] = override
    return list(last.values())


def check_same_settings(config: str, overrides: list[str], folders: dict) -> None:
    """Refuse runs whose settings differ from the plan's in what a training step does (beyond
    :data:`NOT_COMPARED`): the plan would be measured against another run than the one it predicts."""
    from podsrl.config import config_changes, load_config
    from podsrl.plan import base_m
    from podsrl.rundir import recorded_config

    c = load_config(config, overrides)
    for mode, runs in folders.items():
        method = load_config(config, merged(overrides, method_overrides(mode, c.n, base_m(c))))
        for run in runs:
            changes = [line for line in config_changes(recorded_config(run) or {}, method)
                       if line.partition(":")[0] not in NOT_COMPARED]
            if changes:
                raise PodsError(f"the plan's {mode} settings differ from its run in {run} ({'; '.join(changes[:3])}): "
                                "give the runs' settings, or --train-steps to train runs at these")


def podsrl(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [str(REPO / "src"), os.environ.get("PYTHONPATH", "")] if p)}
    done = subprocess.run([sys.executable, "-m", "podsrl", *args], cwd=REPO, env=env)
    if done.returncode:
        raise SystemExit(f"plan_validation: podsrl {args[0]} failed (exit {done.returncode})")


def compare(report: dict, runs: dict, clock: str) -> list[dict]:
    """For each method: the plan's row, the runs' means and the ratios predicted / measured: the
    plan's prediction, its prediction at the start of training's signal (where the plan took an
    earlier run's), and its cost model given the rollouts the runs trained."""
    from podsrl.plan import CostModel

    model = CostModel(**report["fit"])
    n, m = report["config"]["n"], report["m"]
    key = "cpu_s" if clock == "cpu" else "wall_s"
    rows = []
    for mode, run in runs.items():
        want_n = m if mode == "grpo" else n
        row = next(r for r in report["settings"] if r["method"] == mode and r["n"] == want_n)
        given = model.step(want_n, run["trained"], 0)["step_s"]
        at_start = model.step(want_n, row.get("trained_at_start", row["trained"]), 0)["step_s"]
        rows.append({"method": mode, "n": want_n, "m": m if mode != "grpo" else want_n, "predicted": row, "measured": run,
                     "predicted_at_start_s": at_start, "predicted_given_trained_s": given,
                     "ratio": row["step_s"] / run[key], "ratio_at_start": at_start / run[key],
                     "ratio_given_trained": given / run[key], "clock": clock})
    return rows


def render(rows: list[dict], report: dict, source: str) -> str:
    earlier = report.get("signal_from")
    lines = [f"# plan against measured steps ({source}; {report['device']}, {report['threads']} threads; "
             f"measured on the {rows[0]['clock']} clock)", ""]
    if earlier:
        lines += [f"plan's trained rollouts: over the reward signal of {len(earlier['runs'])} earlier run(s) "
                  f"(n = {earlier['n']}, {earlier['steps']} steps, reward mean {earlier['reward_mean']:.3f}, "
                  f"concentration {earlier['concentration']:.3g})", ""]
    lines += ["| method | measured step s | predicted | ratio | predicted at the start's signal | ratio "
              "| predicted given the run's trained rollouts | ratio | trained/step: predicted / at start / run "
              "| predicted gen / score / update s | measured gen / score / update s (wall, as logged) |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p, q = r["predicted"], r["measured"]
        key = "cpu_s" if r["clock"] == "cpu" else "wall_s"
        name = f"{r['method']} (n = {r['n']}" + (f", m = {r['m']})" if r["method"] != "grpo" else ")")
        lines.append(f"| {name} | {q[key]:.2f} | {p['step_s']:.2f} | {r['ratio']:.2f} | {r['predicted_at_start_s']:.2f} "
                     f"| {r['ratio_at_start']:.2f} | {r['predicted_given_trained_s']:.2f} | {r['ratio_given_trained']:.2f} "
                     f"| {p['trained']:.1f} / {p.get('trained_at_start', p['trained']):.1f} / {q['trained']:.1f} "
                     f"| {p['generation_s']:.2f} / {p['scoring_s']:.3f} / {p['update_s']:.2f} "
                     f"| {q['generation_s']:.2f} / {q['scoring_s']:.3f} / {q['update_s']:.2f} |")
    within = lambda key: "yes" if all(abs(r[key] - 1) <= TOLERANCE for r in rows) else "no"
    lines += ["", f"within {TOLERANCE:.0%} for every method: plan's prediction {within('ratio')}; at the start's signal "
              f"{within('ratio_at_start')}; given the runs' trained rollouts {within('ratio_given_trained')}",
              f"plan took {report['seconds']:.0f} s"]
    return "\n".join(lines) + "\n"


@one_line_errors("plan_validation.py")
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(DEFAULT_CONFIG), help="config file (default: the comparisons' task.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, over the comparisons' shared settings with "
                        "their config (the default); mode, n and m give the settings compared")
    parser.add_argument("--train-steps", type=int, help="train each method this many steps here and compare with those "
                        "runs (default: the committed two-digit runs)")
    parser.add_argument("--runs", choices=sorted(RUN_SETS), default="committed",
                        help="the runs compared with: the comparisons' (committed, default), their confirmations' "
                        "(confirm), or the clock confirmation's at async_lag=1 (confirm-c) or synchronous (confirm-c-sync)")
    parser.add_argument("--signal-from", choices=["reference", "start"], default="reference",
                        help="the plan's trained rollouts: over the reward signal of the set's GRPO runs (reference, "
                        "default), or the start of training's only (start; always with --train-steps)")
    parser.add_argument("--plan-args", default="--calls 3", help="arguments of podsrl plan (default: --calls 3)")
    parser.add_argument("--out", help="output folder (default: benchmarks/results/plan_validation; with --runs "
                                      "confirm, plan_validation_confirm)")
    args = parser.parse_args(argv)
    if args.config != str(DEFAULT_CONFIG) and "=" in args.config and not Path(args.config).exists():
        args.config, args.overrides = str(DEFAULT_CONFIG), [args.config, *args.overrides]
    if not Path(args.config).is_file():
        raise PodsError(f"config file not found: {args.config}")
    if args.train_steps is not None and args.train_steps < 2:
        raise PodsError(f"--train-steps must be >= 2 (the first step is left out), got {args.train_steps}")
    overrides = merged(DEFAULT_OVERRIDES if args.config == str(DEFAULT_CONFIG) else [], SET_OVERRIDES.get(args.runs, []),
                       args.overrides)
    if ("mode=grpo" in overrides or "mode: grpo\n" in Path(args.config).read_text()) and "mode=pods" not in overrides:
        raise SystemExit("plan_validation: give the PODS settings (mode=pods n=N m=M); GRPO is compared at n = m")
    out = Path(args.out or RESULTS / ("plan_validation" if args.runs == "committed" else f"plan_validation_{args.runs}"))
    if out.exists() and not out.is_dir():
        raise PodsError(f"--out {out} is a file; give a folder")

    folders = {} if args.train_steps else {mode: finished_runs(f) for mode, f in RUN_SETS[args.runs].items()}
    if folders and not all(folders.values()):
        raise SystemExit(f"plan_validation: no finished runs of {', '.join(m for m, f in folders.items() if not f)} in "
                         f"the {args.runs} set")
    if folders:
        check_same_settings(args.config, overrides, folders)
    out.mkdir(parents=True, exist_ok=True)
    signal = (["--signal-from", *map(str, folders["grpo"])] if folders and args.signal_from == "reference" else [])
    podsrl("plan", args.config, *overrides, *args.plan_args.split(), *signal, "--json", str(out / ".plan.json"))
    report = json.loads((out / ".plan.json").read_text())
    n, m = report["config"]["n"], report["m"]
    if args.train_steps:
        for mode in ("grpo", "pods", "grpo-ga"):
            run = out / "runs" / mode
            shutil.rmtree(run, ignore_errors=True)
            podsrl("train", args.config, *merged(overrides, method_overrides(mode, n, m), [
                f"steps={args.train_steps}", "eval_every=0", "save_every=0", "resume=false", f"output_dir={run}"]))
            folders[mode] = [run]
        source = f"{args.train_steps}-step runs trained here"
    else:
        source = f"the {args.runs} two-digit runs, " + ", ".join(f"{mode}: {len(f)} seeds" for mode, f in folders.items())
    runs = {mode: measured(f) for mode, f in folders.items()}
    rows = compare(report, runs, report["clock"])
    text = render(rows, report, source)
    os.replace(out / ".plan.json", out / "plan.json")
    from podsrl.plan import render as render_plan

    write_atomic(out / "plan.txt", render_plan(report))
    write_atomic(out / "validation.json", json.dumps({"source": source, "tolerance": TOLERANCE, "methods": rows},
                                                     indent=2) + "\n")
    write_atomic(out / "validation.txt", text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
