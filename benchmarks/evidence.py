"""The paper's two comparisons on the benchmark task chosen by GRPO's curve alone
(docs/experiments/task-selection.md), with settings fixed before the first PODS run on it, and
their confirmation on fresh seeds, with statistics fixed before its first run.

    python benchmarks/evidence.py a          # GRPO vs PODS (max-variance) vs PODS (random), seeds 0-7, step-matched
    python benchmarks/evidence.py b          # GRPO-GA vs PODS at the same n, seeds 0-4, times on the CPU clock
    python benchmarks/evidence.py confirm-a  # (a)'s methods on seeds 8-15
    python benchmarks/evidence.py confirm-b  # (b)'s methods on seeds 8-12
    python benchmarks/evidence.py confirm-b8 # (b) on seeds 8-15: GRPO-GA 13-15 trained, the rest taken
    python benchmarks/evidence.py confirm-c  # on the wall clock: GRPO vs PODS and GRPO at async_lag=1, seeds 16-23, one run at a time
    python benchmarks/evidence.py confirm-gym --task NAME   # (a)'s GRPO and PODS on a data set the gym round chose, seeds 8-15
    python benchmarks/evidence.py confirm-gym --task NAME --jobs 1   # any CPU-clock comparison, one run at a time
    python benchmarks/evidence.py report a   # figures, targets, per-seed tables: report.md (also b, confirm-a, confirm-b)

All read the chosen task and its learning rate from benchmarks/results/task_selection/summary.json
and refuse to run before a task has been chosen. The settings are the selection's, for every
comparison (n = 8 for GRPO, 4 prompts a step, 60 optimizer steps, 500 held-out problems every 5
steps, one thread a run, times on the training process's CPU clock):

(a) ``grpo`` (n = m = 8), ``pods`` (n = 32, max-variance m = 8), ``pods-random`` (n = 32, random
    m = 8); seeds 0-7. Statistic fixed before the runs, the paper's: the optimizer steps at which
    each seed-mean curve first reaches GRPO's seed-mean peak (linear between evaluations), as a
    ratio to GRPO's, 95% paired bootstrap over seeds; and max-variance's steps to that peak over
    random's. Targets: PODS at most 0.6x GRPO's steps, the interval's upper end below 1.0;
    max-variance fewer steps than random, the interval excluding 1.0.
(b) ``grpo-ga`` (n = 32, all trained, micro-batches of 8) and ``pods`` (n = 32, m = 8); seeds 0-4
    (PODS's runs are (a)'s); the reference is grpo-ga. Statistic: training CPU seconds to GRPO-GA's
    seed-mean peak, as a speed-up with its paired interval. Target: at least 1.7x, the interval's
    lower end above 1.0.

Their reports also give the robust measures of podsrl.stats, defined after their runs were seen
(post hoc). The confirmation runs (a)'s methods on seeds 8-15 (``confirm-a``) and (b)'s on seeds
8-12 (``confirm-b``, its PODS runs confirm-a's), and is judged on statistics fixed here before
any of its runs: q = 0.9 of the reference's gain, from the step-0 accuracy to the reference's
final level, the mean of its seed-mean curve's last three evaluations (:data:`TARGETS`):

- confirm-a: PODS's optimizer steps to 90% of GRPO's gain, as a ratio to GRPO's: at most 0.7, the
  interval's upper end below 1.0; max-variance's steps to it over random's: below 1.0, the
  interval's upper end below 1.0.
- confirm-b: PODS's speed-up on the training CPU clock to 90% of GRPO-GA's gain: at least 1.7, the
  interval's lower end above 1.0.
- confirm-b8: confirm-b on eight seeds, 8-15, with the same measure and target (fixed before its
  GRPO-GA runs of seeds 13-15): its PODS runs are confirm-a's, its GRPO-GA runs of seeds 8-12
  confirm-b's; the summary that podsrl compare writes in its folder gives q = 0.95 (its sensitivity
  table) and the per-seed geometric mean beside it.
- confirm-c (the paper's headline on this CPU's wall clock, issue 59; fixed before its runs): GRPO
  (n = 8, synchronous, threads = 2: the faster in the pilot of benchmarks/async_step.py --pilot),
  PODS (n = 32, m = 8) and GRPO at ``async_lag=1`` with one thread for the trainer and one for the
  worker, and synchronous PODS at threads = 2; seeds 16-23, one run at a time with the machine to
  itself, times on the training wall clock (evaluation excluded). Targets: PODS at the lag reaches
  90% of GRPO's gain at least 1.3x sooner on the wall clock, the interval's lower end above 1.0;
  its mean step wall time over all its runs at most 0.8x synchronous PODS's. Reported without a
  target: PODS at the lag against GRPO at the lag on the clock, and its steps to the gain against
  synchronous PODS's (the cost of staleness).
- confirm-gym (issue 62; fixed before any PODS run on these tasks): on each of the data sets the
  gym round of benchmarks/task_selection.py chose by GRPO's curve alone
  (``task_selection/gym/summary.json``), with the screening's config (configs/screening_gym.yaml,
  its completion length, its rows a generate call where the screening set them) and otherwise the
  two-digit confirmation's settings, its learning rate included (the first round's, as confirm-a):
  GRPO (n = 8) against PODS (n = 32, m = 8), seeds 8-15. Target per task: PODS's optimizer steps to
  90% of GRPO's gain at most 0.7x GRPO's, the interval's upper end below 1.0. Reported beside it:
  the CPU-clock speed-up, the same ratio at 80% and 95% of the gain, and (in the summary that podsrl
  compare writes) the per-seed geometric mean. Its folder: ``evidence_confirm_gym_<data set>``.
- Secondary: the differences in mean accuracy over the budget, against steps and against time.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import yaml

from podsrl import stats
from podsrl.errors import ArgumentParser, PodsError, one_line_errors

ROOT = Path(__file__).resolve().parent.parent
SELECTION = ROOT / "benchmarks" / "results" / "task_selection" / "summary.json"
GYM_SELECTION = ROOT / "benchmarks" / "results" / "task_selection" / "gym" / "summary.json"
STEP0_CANDIDATES = ROOT / "benchmarks" / "results" / "gym_step0" / "candidates.json"
CONFIGS = {"arithmetic_2digit": "configs/arithmetic_2digit.yaml", "letter_counting": "configs/gym_letter_counting.yaml",
           "chain_sum": "configs/gym_chain_sum.yaml"}
STEPS = 60
EVAL_EVERY = 5
"""Steps between held-out evaluations; each run saves a checkpoint at each one, to resume from."""
Q = 0.9
"""The fraction of the reference's gain the robust measures time a method to (fixed before the confirmation)."""
WINDOW = 3
"""The reference's final level: the mean of its seed-mean curve's last WINDOW evaluations."""
A = dict(methods="grpo,pods,pods-random:rule=random", reference="grpo", overrides=["n=32", "m=8"])
B = dict(methods="grpo-ga,pods", reference="grpo-ga", overrides=["n=32", "m=8"])
LAG = "async_lag=1,threads=1,async_worker_threads=1"
"""confirm-c's asynchronous methods: one thread for the trainer, one for the generation worker."""
COMPARISONS = {
    "a": dict(A, seeds=range(0, 8), pods_from=None, primary="peak"),
    "b": dict(B, seeds=range(0, 5), pods_from="a", primary="peak"),
    "confirm-a": dict(A, seeds=range(8, 16), pods_from=None, primary="gain", issue=50),
    "confirm-b": dict(B, seeds=range(8, 13), pods_from="confirm-a", primary="gain", issue=50),
    "confirm-b8": dict(B, seeds=range(8, 16), pods_from="confirm-a", ga_from="confirm-b", primary="gain", issue=62),
    "confirm-c": dict(methods=f"grpo,pods-async:{LAG},grpo-async:mode=grpo,n=8,{LAG},pods", reference="grpo",
                      overrides=["n=32", "m=8"], seeds=range(16, 24), pods_from=None, primary="gain", threads=2,
                      clock="wall", jobs=1, issue=59),
    "confirm-gym": dict(methods="grpo,pods", reference="grpo", overrides=["n=32", "m=8"], seeds=range(8, 16),
                        pods_from=None, primary="gain", gym=True, save_every=1, issue=62),
}
"""Each comparison: its methods, seeds, reference and overrides; the comparison whose finished
PODS runs of the same seeds it takes (they have its settings); and the target its pre-registered
statistics time methods to (``peak``: the paper's, the reference's seed-mean peak; ``gain``: Q of
the reference's gain). Runs save a checkpoint at every evaluation, or every ``save_every`` steps
where a comparison sets it: confirm-gym's runs take hours per evaluation interval, so they keep
every step (a checkpoint changes no result: a resumed run continues exactly). A run whose
checkpoint is gone (a fresh copy of the results folder) is replayed: compare trains its logged
steps again without their evaluations, each checked against its record, and goes on from there."""


class Target(NamedTuple):
    """A pre-registered target: what it says, the figure it reads (:func:`figures`), when it is met."""
    text: str
    figure: str
    met: Callable[[stats.Estimate], bool]


def at_most(most: float, upper_below: float) -> Callable[[stats.Estimate], bool]:
    """Met where the figure is <= ``most`` and its interval's upper end < ``upper_below``."""
    return lambda e: not math.isnan(e.value) and e.value <= most and e.high is not None and e.high < upper_below


def at_least(least: float, lower_above: float) -> Callable[[stats.Estimate], bool]:
    """Met where the figure is >= ``least`` and its interval's lower end > ``lower_above``."""
    return lambda e: not math.isnan(e.value) and e.value >= least and e.low is not None and e.low > lower_above


def below(bound: float) -> Callable[[stats.Estimate], bool]:
    """Met where the figure and its interval's upper end are < ``bound``."""
    return lambda e: e.value < bound and e.high is not None and e.high < bound


TARGETS = {
    "a": [Target("PODS reaches GRPO's peak in at most 0.6x GRPO's steps, the interval's upper end below 1.0",
                 "pods step_ratio_to_peak", at_most(0.6, 1.0)),
          Target("max-variance needs fewer steps than random, the interval excluding 1.0",
                 "max-variance/random steps_to_peak", below(1.0))],
    "b": [Target("PODS reaches GRPO-GA's peak at least 1.7x sooner (CPU clock), the interval's lower end above 1.0",
                 "pods speedup_to_peak", at_least(1.7, 1.0))],
    "confirm-a": [
        Target("PODS reaches 90% of GRPO's gain in at most 0.7x GRPO's optimizer steps, the interval's upper end below 1.0",
               "pods step_ratio_to_gain", at_most(0.7, 1.0)),
        Target("max-variance reaches 90% of GRPO's gain in fewer optimizer steps than random, the interval's upper end "
               "below 1.0", "max-variance/random steps_to_gain", below(1.0))],
    "confirm-b": [Target("PODS reaches 90% of GRPO-GA's gain at least 1.7x sooner on the training CPU clock, the "
                         "interval's lower end above 1.0", "pods speedup_to_gain", at_least(1.7, 1.0))],
}
TARGETS["confirm-b8"] = TARGETS["confirm-b"]
TARGETS["confirm-c"] = [
    Target("PODS at async_lag=1 reaches 90% of synchronous GRPO's gain at least 1.3x sooner on the training wall clock, "
           "the interval's lower end above 1.0", "pods-async speedup_to_gain (wall)", at_least(1.3, 1.0)),
    Target("PODS at async_lag=1: mean step wall time over all its runs at most 0.8x synchronous PODS's (threads = 2)",
           "pods-async/pods step_s (wall)", lambda e: not math.isnan(e.value) and e.value <= 0.8)]
TARGETS["confirm-gym"] = [TARGETS["confirm-a"][0]]
"""The targets each comparison is judged on, fixed before its runs."""


def chosen() -> tuple[str, str]:
    try:
        summary = json.loads(SELECTION.read_text()) if SELECTION.is_file() else {}
        task = summary.get("chosen")
        if not task:
            raise PodsError("no benchmark task has been chosen yet (benchmarks/task_selection.py report)")
        if task not in CONFIGS:
            raise PodsError(f"{SELECTION}: its chosen task {task!r} is none of evidence.py's ({', '.join(CONFIGS)})")
        return task, summary["candidates"][task]["lr"]
    except (ValueError, AttributeError, KeyError, TypeError) as e:  # JSON that is not the selection's summary
        raise PodsError(f"{SELECTION}: not task_selection.py's summary ({type(e).__name__}: {e})") from None


def chosen_gym(task: str | None) -> tuple[str, dict]:
    """A data set the gym round chose: its name and its settings (the screening config with the data
    set, the screening's completion length, and its rows a generate call where its screening runs
    set them)."""
    if not task:
        raise PodsError("confirm-gym takes --task NAME: a data set the gym round chose")
    try:
        summary = json.loads(GYM_SELECTION.read_text()) if GYM_SELECTION.is_file() else {}
        picked = summary.get("chosen") or summary.get("settled") or []  # settled: chosen before the last runs end
        if task not in picked:
            raise PodsError(f"--task {task}: the gym round chose " + (", ".join(picked) if picked else "no data set yet")
                            + f" ({GYM_SELECTION.relative_to(ROOT)}; benchmarks/task_selection.py report --round gym)")
        rows = json.loads(STEP0_CANDIDATES.read_text())["rows"]
        tokens = next(r["max_new_tokens"] for r in rows if r["dataset"] == task)
        screened = GYM_SELECTION.parent / task / f"lr{summary['candidates'][task]['lr']}" / "seed-0" / "config.yaml"
        batch_size = yaml.safe_load(screened.read_text())["rollout"]["batch_size"]
    except (OSError, ValueError, AttributeError, KeyError, TypeError, StopIteration, yaml.YAMLError) as e:
        raise PodsError(f"the gym round's summary, its screening runs or the step-0 candidates do not hold {task!r}'s "
                        f"settings ({type(e).__name__}: {e})") from None
    settings = yaml.safe_load((ROOT / "configs" / "screening_gym.yaml").read_text())
    settings["task"]["dataset"] = task
    settings.setdefault("rollout", {})["max_new_tokens"] = tokens
    if batch_size is not None:  # the rows a generate call the screening set for long prompts
        settings["rollout"]["batch_size"] = batch_size
    return task, settings


def folder(comparison: str, task: str) -> Path:
    """Where a comparison's runs and report live: ``benchmarks/results/evidence_<comparison>_<task>``."""
    return ROOT / "benchmarks" / "results" / f"evidence_{comparison.replace('-', '_')}_{task}"


def command(comparison: str, task: str, lr, jobs: int | None = None) -> list[str]:
    """The ``podsrl compare`` invocation (after ``python -m``) that trains a comparison's runs,
    ``jobs`` at a time (default: the comparison's own)."""
    spec, out = COMPARISONS[comparison], folder(comparison, task)
    seeds = list(spec["seeds"])
    # every comparison's options; its clock and jobs its own (default: the CPU clock, two runs at a time)
    common = ["--steps", str(STEPS), "--eval-every", str(EVAL_EVERY), "--clock", spec.get("clock", "cpu"),
              "--keep", "metrics", "--save-every", str(spec.get("save_every", EVAL_EVERY)), "--jobs", str(jobs or spec.get("jobs", 2))]
    return ["podsrl", "compare", str(out / "task.yaml"), "mode=pods", f"lr={lr}", f"threads={spec.get('threads', 1)}",
            "task.test_size=500", "prompts_per_step=4", *spec["overrides"], "--methods", spec["methods"], "--seeds",
            str(len(seeds)), "--first-seed", str(seeds[0]), "--reference", spec["reference"], *common, "--out", str(out)]


def run(comparison: str, gym_task: str | None = None, jobs: int | None = None) -> int:
    spec = COMPARISONS[comparison]
    if jobs is not None:
        if jobs < 1:
            raise PodsError(f"--jobs must be >= 1, got {jobs}")
        if spec.get("clock", "cpu") != "cpu":  # a wall clock counts what runs beside a run
            raise PodsError(f"--jobs: {comparison} times on the wall clock, so it trains {spec.get('jobs', 2)} run(s) "
                            "at a time, always")
    if spec.get("gym"):  # the data set and its config from the gym round, the rest as confirm-a's
        (task, settings), lr = chosen_gym(gym_task), chosen()[1]
    else:
        task, lr = chosen()
        settings = yaml.safe_load((ROOT / CONFIGS[task]).read_text())
    out = folder(comparison, task)
    out.mkdir(parents=True, exist_ok=True)
    # the candidate's config without the keys compare sets itself (steps, the evaluation schedule)
    settings = {k: v for k, v in settings.items() if k not in ("steps", "eval_every")}
    (out / "task.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
    if spec["pods_from"]:  # the other comparison's PODS runs of these seeds have these settings: taken, not trained again
        reuse_runs(folder(spec["pods_from"], task), out, spec["seeds"])
    if spec.get("ga_from"):  # and the GRPO-GA runs of those seeds that another comparison trained
        reuse_runs(folder(spec["ga_from"], task), out, spec["seeds"], "grpo-ga")
    cmd = command(comparison, task, lr, jobs)
    print(" ".join(cmd), flush=True)
    return subprocess.run([sys.executable, "-m", *cmd], cwd=ROOT).returncode


def reuse_runs(source: Path, out: Path, seeds, method: str = "pods") -> None:
    """Copy another comparison's finished runs of ``method`` and ``seeds`` into ``out``; compare
    checks each copy's recorded config against this comparison's before it counts the run as done
    (and refuses a mismatch)."""
    import shutil

    from podsrl.compare import finished_at

    for seed in seeds:
        run, there = source / method / f"seed-{seed}", out / method / f"seed-{seed}"
        if not there.exists() and run.is_dir() and (finished_at(run, "step") or 0) >= STEPS:
            shutil.copytree(run, there)
            print(f"{method} seed {seed}: taken from {run.relative_to(ROOT)}", flush=True)


def report(comparison: str, out: Path | None = None) -> str:
    """A comparison's figures for its page, written to its folder's report.md (and printed), over
    the seeds whose runs of every method have finished (the others named): the pre-registered
    targets, met or missed; the robust measures (steps and CPU time to Q of the reference's gain as
    a ratio and speed-ups, on both clocks; the mean accuracy over the budget and the final level as
    differences), labelled post hoc for (a) and (b), whose runs came before them; the paper's
    statistic (first reaching the reference's seed-mean peak) with the step costs; for (a)'s
    methods, max-variance over random on both; the seed-mean curves; the per-seed figures. Figures
    to a target have a 95% paired bootstrap interval over seeds and the count of resamples that
    never reach it. ``out``: the comparison's folder (default: the chosen task's). Returns the text."""
    from podsrl.compare import finished_at

    spec = COMPARISONS[comparison]
    out = out or folder(comparison, chosen()[0])
    if not out.is_dir():
        raise PodsError(f"comparison ({comparison}) has no runs yet: no folder {out} (python benchmarks/evidence.py "
                        f"{comparison} trains them)")
    methods = [m.split(":")[0] for m in spec["methods"].split(",") if "=" not in m or ":" in m]
    reference, seeds = spec["reference"], list(spec["seeds"])
    unfinished = [(m, s) for s in seeds for m in methods if (finished_at(out / m / f"seed-{s}", "step") or 0) < STEPS]
    done = [s for s in seeds if not any((m, s) in unfinished for m in methods)]
    if done:
        lines = _figures(comparison, out, methods, reference, done)
    else:
        lines = [f"Comparison ({comparison}), {out.name}: no seed has finished the runs of every method yet, so there "
                 "are no figures."]
    if unfinished:
        waiting = [s for s in seeds if s not in done and any((m, s) not in unfinished for m in methods)]
        lines += ["", f"Not finished yet, and not in these figures: {', '.join(f'{m} seed {s}' for m, s in unfinished)}"
                  + (f"; the finished runs of seed{'s' if len(waiting) > 1 else ''} {seed_list(waiting)} wait for their "
                     "seed's other runs." if waiting else ".")]
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    return text


def seed_list(seeds: list[int]) -> str:
    """``0–7`` for a run of consecutive seeds, else ``1, 3, 4``."""
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}–{seeds[-1]}"
    return ", ".join(map(str, seeds))


def figures(curves: dict[str, stats.Runs], reference: str, q: float = Q) -> dict[str, stats.Estimate]:
    """Every figure of every method against ``reference`` on the seed-mean curves (``method name``,
    the names of :func:`podsrl.stats.measures`), at Q and WINDOW; with PODS and PODS-random,
    ``max-variance/random steps_to_gain`` (and ``_to_peak``): max-variance's steps over random's,
    and ``max-variance/random mean_accuracy_steps`` (``_time``, ``final_level``): the difference."""
    out = {}
    for m, runs in curves.items():
        out |= {f"{m} {name}": e for name, e in stats.compare_runs(curves[reference], runs, q, WINDOW).items()}
    if {"pods", "pods-random"} <= set(curves):
        ref, mv, rand = curves[reference], curves["pods"], curves["pods-random"]
        for key in ("steps_to_gain", "steps_to_peak"):
            out[f"max-variance/random {key}"] = stats.ratio_between(ref, mv, rand, key, q, WINDOW)
        for key in ("mean_accuracy_steps", "mean_accuracy_time", "final_level"):
            out[f"max-variance/random {key}"] = stats.difference_between(ref, mv, rand, key, q, WINDOW)
    return out


def _figures(comparison: str, out: Path, methods: list[str], reference: str, done: list[int]) -> list[str]:
    from podsrl.compare import fmt, read_evals, summarise, with_ci

    def cell(e: stats.Estimate, spec=".2f", never=True) -> str:
        value = None if math.isnan(e.value) else e.value
        return with_ci(value, (e.low, e.high) if e.low is not None else None, e.never if never else None, e.resamples,
                       spec, none="never")

    cpu, wall = (summarise(out, methods, done, reference, clock, Q, WINDOW) for clock in ("cpu", "wall"))
    curves = {m: stats.align([stats.curve(*read_evals(out / m / f"seed-{s}", "cpu")) for s in done]) for m in methods}
    wall_curves = {m: stats.align([stats.curve(*read_evals(out / m / f"seed-{s}", "wall")) for s in done]) for m in methods}
    est, est_wall = figures(curves, reference), figures(wall_curves, reference)
    est |= {f"{k} (wall)": e for k, e in est_wall.items()}
    spec = COMPARISONS[comparison]
    # a comparison on the wall clock (a worker process beside the trainer: its CPU seconds are not the
    # training process's) gives its times in wall seconds; the speed-ups are on both clocks either way
    on_wall = spec.get("clock", "cpu") == "wall"
    prime, est_time, clock = (wall, est_wall, "wall") if on_wall else (cpu, est, "CPU")
    secs, time_name = f"{clock} s", f"{clock} time"
    if {"pods", "pods-async"} <= set(methods):  # the step-time target: one ratio of means over every run
        ratio = wall["methods"]["pods-async"]["step_s"] / wall["methods"]["pods"]["step_s"]
        est["pods-async/pods step_s (wall)"] = stats.Estimate(ratio, None, None, None, stats.RESAMPLES)
    post_hoc = COMPARISONS[comparison]["primary"] == "peak"
    share = f"{Q:.0%}"
    lines = [
        f"Comparison ({comparison}), {out.name}, over seeds {seed_list(done)}. {reference}'s seed-mean curve, aligned by "
        f"optimizer step: step-0 accuracy {fmt(cpu['reference_base_accuracy'], '.3f')}, final level "
        f"{fmt(cpu['reference_final_level'], '.3f')} (the mean of its last {WINDOW} evaluations); {share} of its gain is "
        f"{fmt(cpu['reference_target_accuracy'], '.3f')}, reached at step {fmt(cpu['reference_steps_to_gain'], '.1f')} "
        f"({fmt(prime['reference_time_to_gain_s'], '.0f')} training {secs}); its peak (the paper's target) "
        f"{fmt(cpu['reference_peak_accuracy'], '.3f')}, first reached at step {fmt(cpu['reference_steps_to_peak'], '.1f')} "
        f"({fmt(prime['reference_time_to_peak_s'], '.0f')} {secs}). A curve reaches a target linearly between evaluations; "
        "a time is each seed's own clock at that step, averaged over seeds. Intervals: 95% paired bootstrap over seeds "
        f"({stats.RESAMPLES} resamples, percentiles by numpy's inverted_cdf), with the resamples whose seed-mean curve "
        "never reaches the target.", "",
        "Pre-registered targets, on " + ("the paper's statistic (first reaching the reference's seed-mean peak), fixed "
                                         "before these runs:" if post_hoc else
                                         f"{share} of the reference's gain, fixed (issue {spec['issue']}) before these runs:"), "",
        "| target | figure [95% CI] | result |", "|---|---|---|",
    ]
    complete = len(done) == len(COMPARISONS[comparison]["seeds"])
    for t in TARGETS[comparison]:
        met = t.met(est[t.figure])
        lines.append(f"| {t.text} | {cell(est[t.figure])} | {('met' if met else 'missed') if complete else ('so far met' if met else 'so far missed')} |")
    gains = [t.figure for t in TARGETS[comparison] if "_to_gain" in t.figure]
    if gains and not post_hoc:  # the same figures at other fractions of the gain: how much they rest on q
        other = {(g, q): figures(wall_curves if "(wall)" in g else curves, reference, q)[g.replace(" (wall)", "")]
                 for g in gains for q in (0.8, 0.95)}
        lines += ["", "Sensitivity, not a second chance (the targets are judged at 90% above): "
                  + "; ".join(f"{g} at {q:.0%} of the gain, {cell(e)}" for (g, q), e in other.items()) + "."]
    lines += ["", ("Robust measures, POST HOC (defined after these runs were seen: they can suggest, not settle)"
                   if post_hoc else "Robust measures (the primary and the secondary statistics in full)")
              + f": optimizer steps and training time to {share} of {reference}'s gain, and the mean accuracy over the "
              f"budget (against steps; against {time_name} up to the shorter method's budget) and the final level, as "
              f"differences from {reference}'s.", "",
              f"| method | steps to {share} of gain | step ratio [95% CI] | {secs} to {share} of gain | speed-up, CPU clock "
              f"[95% CI] | speed-up, wall clock [95% CI] | mean acc over steps, diff [95% CI] | mean acc over {time_name}, diff "
              "[95% CI] | final level, diff [95% CI] |", "|---|---|---|---|---|---|---|---|---|"]
    for m in methods:
        r = cpu["methods"][m]
        lines.append(f"| {m} | {fmt(r['steps_to_gain'], '.1f')} | {cell(est[f'{m} step_ratio_to_gain'])} | "
                     f"{fmt(prime['methods'][m]['time_to_gain_s'], '.0f')} | {cell(est[f'{m} speedup_to_gain'])} | "
                     f"{cell(est_wall[f'{m} speedup_to_gain'])} | "
                     f"{fmt(r['mean_accuracy_steps'], '.3f')}, {cell(est[f'{m} mean_accuracy_steps_diff'], '+.3f')} | "
                     f"{fmt(prime['methods'][m]['mean_accuracy_time'], '.3f')}, "
                     f"{cell(est_time[f'{m} mean_accuracy_time_diff'], '+.3f')} | "
                     f"{fmt(r['final_level'], '.3f')}, {cell(est[f'{m} final_level_diff'], '+.3f')} |")
    if "max-variance/random steps_to_gain" in est:
        lines += ["", f"max-variance / random, optimizer steps to {share} of {reference}'s gain: "
                  f"{cell(est['max-variance/random steps_to_gain'])}; mean accuracy over steps, max-variance minus random: "
                  f"{cell(est['max-variance/random mean_accuracy_steps'], '+.3f')}; over CPU time: "
                  f"{cell(est['max-variance/random mean_accuracy_time'], '+.3f')}; final level: "
                  f"{cell(est['max-variance/random final_level'], '+.3f')}."]
    lines += ["", f"The paper's statistic: first reaching {reference}'s seed-mean peak"
              + (" (the pre-registered one above)" if post_hoc else "") + ", with the step costs.", "",
              f"| method | seeds | peak acc (seed mean ± sd) | steps to {reference}'s peak | step ratio [95% CI] "
              f"| speed-up, CPU clock [95% CI] | speed-up, wall clock [95% CI] | step {secs} | gen s/step | update s/step |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for m in methods:
        r = cpu["methods"][m]
        lines.append(f"| {m} | {len(r['per_seed'])} | {fmt(r['peak_accuracy'], '.3f')} ± {fmt(r['spread']['peak_accuracy_std'], '.3f')} "
                     f"| {fmt(r['steps_to_reference_peak'], '.1f')} | {cell(est[f'{m} step_ratio_to_peak'])} "
                     f"| {cell(est[f'{m} speedup_to_peak'])} | {cell(est_wall[f'{m} speedup_to_peak'])} "
                     f"| {fmt(prime['methods'][m]['step_s'], '.1f')} | {fmt(r['generation_s_per_step'], '.1f')} "
                     f"| {fmt(r['update_s_per_step'], '.1f')} |")
    if "max-variance/random steps_to_peak" in est:
        lines += ["", f"max-variance / random, optimizer steps to {reference}'s seed-mean peak: "
                  f"{cell(est['max-variance/random steps_to_peak'])}."]
    lines += ["", ("Step wall s: the training wall seconds a step (evaluation excluded); the generation and update "
                   "split is in wall seconds too (generation on the worker, beside the update, at a lag), "
                   if on_wall else "Step CPU s: the training process's CPU seconds a step (evaluation excluded); the "
                   "generation and update split is in wall seconds, ")
              + ("two runs at a time on the machine's two cores (threads=1 each)." if spec.get("jobs", 2) > 1
                 else "one run at a time with the machine to itself."), "",
              "Seed-mean held-out accuracy at each evaluation (the curves against optimizer steps):", "",
              "| step | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    means = {m: dict(zip(curves[m].steps, curves[m].accuracy.mean(0))) for m in methods}
    lines += [f"| {step:.0f} | " + " | ".join(fmt(means[m].get(step), '.3f') for m in methods) + " |"
              for step in curves[reference].steps]
    for target, what, key, steps, seconds in [
        ("gain", f"{share} of its gain (from its step-0 accuracy to the mean of its last {WINDOW} evaluations)",
         "reference_target_accuracy", "steps_to_gain", "time_to_gain_s"),
        ("peak", "its peak (the paper's)", "reference_peak_accuracy", "steps_to_reference_peak", "time_to_reference_peak_s"),
    ]:
        lines += ["", f"Per seed, against the same seed's {reference} run and {what}: each method's optimizer steps to it "
                  f"(linear between evaluations) and training {clock} seconds (n/a: never reached).", "",
                  f"| seed | {reference}'s target | " + " | ".join(f"{m} steps | {m} {secs}" for m in methods) + " |",
                  "|---|---|" + "---|---|" * len(methods)]
        for i, s in enumerate(done):
            rows = [prime["methods"][m]["per_seed"][i] for m in methods]
            lines.append(f"| {s} | {fmt(rows[0][key], '.3f')} | "
                         + " | ".join(f"{fmt(r[steps], '.1f')} | {fmt(r[seconds], '.0f')}" for r in rows) + " |")
    return lines


@one_line_errors("evidence.py")
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="evidence.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=[*sorted(COMPARISONS), "report"])
    parser.add_argument("comparison", nargs="?", choices=sorted(COMPARISONS), default="a", help="which comparison report reads")
    parser.add_argument("--task", help="confirm-gym: the data set (one the gym round chose)")
    parser.add_argument("--jobs", type=int, help="runs at a time (default 2), where the comparison times on the CPU "
                        "clock: each run's CPU seconds, at one thread, do not depend on what runs beside it")
    args = parser.parse_args(argv)
    which = args.comparison if args.what == "report" else args.what
    if args.task and not COMPARISONS[which].get("gym"):
        raise PodsError(f"--task is confirm-gym's; {which} runs on the task the first round chose")
    if args.what == "report":
        out = folder(which, chosen_gym(args.task)[0]) if COMPARISONS[which].get("gym") else None
        print(report(which, out), end="")
        return 0
    return run(args.what, args.task, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
