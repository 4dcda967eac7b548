"""Choosing the benchmark task by GRPO's curve alone, before any PODS run on it.

    python benchmarks/task_selection.py run [--jobs 2] [--stage lr|seeds|both] [--round first|gym] [--only NAMES]
    python benchmarks/task_selection.py report [--round first|gym]  # writes benchmarks/results/task_selection/

The protocol, fixed before the first run (docs/experiments/task-selection.md gives it in prose):

- Candidates (:data:`CANDIDATES`): tasks whose step-0 greedy pass@1 on the embedded model lies in
  0.03-0.4 (docs/gym.md): two-digit ``+ -`` arithmetic, reasoning-gym's letter_counting at 3-5
  words and chain_sum at its default difficulty, each from its committed config.
- GRPO only: n = m = 8, 4 prompts a step, 60 optimizer steps, greedy evaluation on 500 held-out
  problems at step 0 and every 5 steps; one OpenMP thread per run (``threads=1``), so that a run's
  numbers depend on the CPU's kind, not on its load or on another run beside it.
- Learning rate from the grid :data:`LRS`, on seed 0 (stage ``lr``): per candidate, the rate whose
  curve meets more of the three conditions below, ties to the larger total gain. Then seeds 1 and 2
  at that rate (stage ``seeds``).
- The choice, on each candidate's seed-mean curve at its rate (3 seeds): the peak comes at step 30
  or later; no single evaluation interval carries more than half of the gain from step 0 to the
  peak; the peak is at most 0.9. Among the candidates meeting all three, the one whose curve keeps
  rising longest (the latest peak; ties to the larger gain). If none meets all three, none is
  chosen and the report says so.

The second round (``--round gym``), two more tasks for the confirmation, fixed before its first run:

- Candidates: the reasoning-gym data sets at their default settings that the step-0 screening
  chose (``benchmarks/gym_step0.py --all``; its ``candidates.json``: pass@1 0.05-0.50 on 500
  held-out problems, at most the 6 closest to 0.25), each from ``configs/screening_gym.yaml`` with
  its data set and the screening's completion length, and fewer rows a generate call where its
  prompts are long (:func:`gym_candidates`, :data:`LONG_PROMPT_ROWS`).
- The runs, the learning rate and the three conditions as above (GRPO only, seeds 0-2).
- The choice: among the candidates meeting all three, the two with the largest seed-mean gain
  (from step 0 to the peak), ties broken by name; if fewer than two meet them, those that do, and
  the report says so. Its results go to ``benchmarks/results/task_selection/gym/``. A candidate is
  chosen before the other candidates' runs finish once nothing they give can change that: fewer
  than two candidates could rank above it even if every unfinished one met all three conditions
  with a larger gain (the summary's ``settled``). The confirmation may start on it then.
- Beside each curve, for reading it only (no condition uses it), the gym round's report gives the
  one-answer level (:func:`one_answer_level`): what giving one answer to every held-out problem
  would score. A curve that rises to it and stays has learned that answer, not the task.

Each run's folder records the podsrl commit of every start of it (``podsrl_commit.txt``, which the
trainer writes).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from podsrl.checkpoint import read_metrics
from podsrl.errors import ArgumentParser, PodsError, one_line_errors
from podsrl.rundir import COMMIT_FILE, how_to_start

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "task_selection"
CANDIDATES = {  # name: config file, or [config file, *overrides]
    "arithmetic_2digit": "configs/arithmetic_2digit.yaml",
    "letter_counting": "configs/gym_letter_counting.yaml",
    "chain_sum": "configs/gym_chain_sum.yaml",
}
CHOOSE = 1
"""How many candidates a round chooses: the first one, by the latest peak; the gym round two, by the largest gain."""
STEP0 = ROOT / "benchmarks" / "results" / "gym_step0" / "candidates.json"
LRS = ["1e-5", "3e-5"]
STEPS, EVAL_EVERY, SEEDS = 60, 5, (0, 1, 2)
SETTINGS = ["mode=grpo", "n=8", "m=8", "prompts_per_step=4", f"steps={STEPS}", f"eval_every={EVAL_EVERY}",
            "task.test_size=500", "threads=1", "progress=false"]


COST: dict[str, float] = {}
"""A candidate's step-0 generation seconds (its 500 greedy completions, which each of its runs'
13 evaluations repeats), where the screening measured it: a stage starts its costliest runs first,
so that its last runs are short and the jobs end close together. The gym round's only."""


LONG_PROMPT_TOKENS, LONG_PROMPT_ROWS = 1024, 32
"""A gym candidate whose longest step-0 prompt runs past ``LONG_PROMPT_TOKENS`` tokens generates
``LONG_PROMPT_ROWS`` rows a call (``rollout.batch_size``) instead of the CPU's default 128. An
evaluation's resident memory grows by about 100 MB a row at 1,610 tokens (rectangle_count's longest
prompts, one thread: 0.45 GB with the model loaded, 2.06 GB at 8 rows, 2.88 GB at 16), so at 128
rows one run's evaluation outgrew a 24 GB machine beside another run. It changes how the held-out
prompts are batched, not the settings of a step (whose 4 prompts x 8 rollouts fit one call either
way). Set before any of rectangle_count's runs had an evaluation; the other candidates' prompts end
by 452 tokens."""


def gym_candidates() -> dict[str, list[str]]:
    """The gym round's candidates from the step-0 screening: name -> the screening config with the
    data set, its completion length and, for long prompts, its rows a call (:data:`LONG_PROMPT_ROWS`);
    and :data:`COST` from the screening's rows."""
    if not STEP0.is_file():
        raise PodsError(f"{STEP0} does not exist: the step-0 screening (benchmarks/gym_step0.py --all, then --candidates) "
                        "has not finished")
    screening = json.loads(STEP0.read_text())
    rows = {r["dataset"]: r for r in screening["rows"] if "max_new_tokens" in r}
    COST.update({r["dataset"]: r["generation_s"] for r in screening["rows"] if "generation_s" in r})
    return {name: ["configs/screening_gym.yaml", f"task.dataset={name}", f"rollout.max_new_tokens={rows[name]['max_new_tokens']}",
                   *([f"rollout.batch_size={LONG_PROMPT_ROWS}"]
                     if rows[name].get("longest_prompt_tokens", 0) > LONG_PROMPT_TOKENS else [])]
            for name in screening["screened"]}


def use_round(name: str) -> None:
    """Point the candidates, the folders and the choice at a round (the first is the default; a
    second call for the same round leaves them)."""
    global CANDIDATES, RESULTS, CHOOSE
    if name == "gym" and CHOOSE == 1:
        CANDIDATES, RESULTS, CHOOSE = gym_candidates(), RESULTS / "gym", 2


def result_dir(candidate: str, lr: str, seed: int) -> Path:
    return RESULTS / candidate / f"lr{lr}" / f"seed-{seed}"


def curve(candidate: str, lr: str, seed: int) -> dict[int, float] | None:
    """Held-out accuracy by step of a finished run, or None."""
    path = result_dir(candidate, lr, seed) / "metrics.jsonl"
    if not path.exists():
        return None
    points = {r["eval_step"]: r["eval_accuracy"] for r in read_metrics(path) if "eval_accuracy" in r}
    return points if STEPS in points else None


def train(candidate: str, lr: str, seed: int) -> tuple[bool, str]:
    """One run, trained in its results folder, which keeps its metrics, config and commit record
    alone once the run has finished. The run saves a checkpoint at each evaluation (every 5 steps)
    and records the completions it samples, and a rerun of the driver goes on from its checkpoint
    (past a last metrics line cut short by a kill, as the trainer does); where the checkpoint is
    gone (checkpoints are not committed: a fresh copy of the results folder), its logged steps are
    trained again on their recorded completions, each checked against its record (podsrl's
    ``replay``), and the run goes on from there. A run that another process is training (an
    earlier driver's) is waited for, then taken as it ended. Returns whether it finished, and a
    line saying how it went."""
    out = result_dir(candidate, lr, seed)
    while training_elsewhere(out):
        time.sleep(30)
    if curve(candidate, lr, seed) is not None:  # finished before, or by the driver waited for
        prune(out)
        return True, f"{candidate} lr={lr} seed={seed}: done before"
    done = _train(candidate, lr, seed, out, replay=True)
    if done.returncode != 0 and REPLAY_MISMATCH in done.stderr:  # not reproducible here: trained again, its logs replaced
        done = _train(candidate, lr, seed, out, replay=False)
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        return False, f"{candidate} lr={lr} seed={seed}: the run failed (exit code {done.returncode}): {said}"
    prune(out)
    points = curve(candidate, lr, seed)
    return True, f"{candidate} lr={lr} seed={seed}: " + " ".join(f"{s}:{a:.3f}" for s, a in sorted(points.items()))


REPLAY_MISMATCH = "trained again differs from its record"
"""What podsrl's error says of a replayed step that its record does not match (:mod:`podsrl.replay`)."""
KEPT = ("metrics.jsonl", "config.yaml", COMMIT_FILE)
"""What a finished run's folder keeps: no checkpoints, no recorded completions."""


def _train(candidate: str, lr: str, seed: int, out: Path, replay: bool) -> subprocess.CompletedProcess:
    """``podsrl train`` into ``out``: from its checkpoint where it has one; else, with ``replay``,
    over the steps it logged; else from step 0."""
    resume = how_to_start(out, replay) == "resume"
    spec = CANDIDATES[candidate]
    cmd = [sys.executable, "-m", "podsrl", "train", *([spec] if isinstance(spec, str) else spec), *SETTINGS, f"lr={lr}",
           f"seed={seed}", f"output_dir={out}", f"save_every={EVAL_EVERY}", f"resume={str(resume).lower()}",
           f"replay={str(replay).lower()}", "save_rollouts=true"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)


def prune(out: Path) -> None:
    """Delete what a finished run's folder holds beyond :data:`KEPT`."""
    for path in out.iterdir() if out.is_dir() else ():
        if path.is_dir():
            shutil.rmtree(path)
        elif path.name not in KEPT:
            path.unlink()


def training_elsewhere(out: Path) -> bool:
    """Whether a process on this machine is training into ``out``."""
    needle = f"output_dir={out}".encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes()
        except OSError:  # the process ended
            continue
        if needle in args and b"train" in args:
            return True
    return False


def conditions(points: dict[int, float]) -> dict:
    """The three conditions on one curve (step -> accuracy)."""
    steps = sorted(points)
    peak_step = max(steps, key=lambda s: (points[s], -s))  # the first step at the highest accuracy
    gain = points[peak_step] - points[0]
    rises = [points[b] - points[a] for a, b in zip(steps, steps[1:]) if b <= peak_step]
    largest = max(rises, default=0.0)
    return {
        "peak": points[peak_step], "peak_step": peak_step, "start": points[0], "gain": gain,
        "largest_interval_share": largest / gain if gain > 0 else None,
        "peak_late": peak_step >= 30,
        "gradual": gain > 0 and largest <= gain / 2,
        "below_ceiling": points[peak_step] <= 0.9,
    }


def one_answer_level(config: Path) -> float:
    """The share of a run's held-out set (rebuilt from its ``config.yaml``: task and seed) taken by
    its most common gold answer: the greedy pass@1 of a policy that gives that answer every time."""
    from podsrl.config import load_config
    from podsrl.tasks import task_from_config

    c = load_config(str(config))
    test = task_from_config(c.task, c.seed).test
    return max(Counter(p.answer for p in test).values()) / len(test)


def met(c: dict) -> int:
    return c["peak_late"] + c["gradual"] + c["below_ceiling"]


def chosen_lr(candidate: str) -> str | None:
    """The grid's rate for a candidate from its seed-0 runs (None until they have all finished)."""
    curves = {lr: curve(candidate, lr, 0) for lr in LRS}
    if any(points is None for points in curves.values()):
        return None
    scored = {lr: conditions(points) for lr, points in curves.items()}
    return max(LRS, key=lambda lr: (met(scored[lr]), scored[lr]["gain"]))


def seed_mean(candidate: str, lr: str) -> dict[int, float] | None:
    curves = [curve(candidate, lr, seed) for seed in SEEDS]
    if any(points is None for points in curves):
        return None
    return {step: sum(points[step] for points in curves) / len(curves) for step in sorted(curves[0])}


def run(args) -> int:
    """Train the stage's runs, ``args.jobs`` at a time; a run that fails is said on stderr, in one
    line, and the exit code is 1."""
    if args.jobs < 1:
        raise PodsError(f"--jobs must be >= 1, got {args.jobs}")
    if args.stage == "both":  # the lr stage, then the seeds at each candidate's rate
        first = run(argparse.Namespace(**{**vars(args), "stage": "lr"}))
        return max(first, run(argparse.Namespace(**{**vars(args), "stage": "seeds"})))
    only = [name for name in (args.only or "").split(",") if name]
    if unknown := [name for name in only if name not in CANDIDATES]:
        raise PodsError(f"--only {','.join(unknown)}: not a candidate of this round ({', '.join(CANDIDATES)})")
    names = [cand for cand in CANDIDATES if not only or cand in only]
    if args.stage == "lr":
        jobs = [(cand, lr, 0) for lr in LRS for cand in names]
    else:
        jobs = []
        for cand in names:
            lr = chosen_lr(cand)
            if lr is None:
                print(f"{cand}: the lr stage has not finished", flush=True)
                continue
            jobs += [(cand, lr, seed) for seed in SEEDS if seed != 0]
    jobs.sort(key=lambda job: -COST.get(job[0], 0.0))  # stable: in the order above where costs tie
    failed = 0
    with ThreadPoolExecutor(args.jobs) as pool:
        for ok, line in pool.map(lambda job: train(*job), jobs):
            if ok:
                print(line, flush=True)
            else:
                failed += 1
                print(f"task_selection.py: error: {line}", file=sys.stderr, flush=True)
    return 1 if failed else 0


def report(_args) -> int:
    rows, summary = [], {"protocol": __doc__, "candidates": {}}
    levels = CHOOSE > 1  # the gym round's report alone gives the one-answer level
    for cand in CANDIDATES:
        entry = summary["candidates"][cand] = {"runs": {}}
        for lr in LRS:
            for seed in SEEDS:
                points = curve(cand, lr, seed)
                if points is not None:
                    entry["runs"][f"lr={lr} seed={seed}"] = {"curve": points, **conditions(points)}
                    if levels:
                        level = one_answer_level(result_dir(cand, lr, seed) / "config.yaml")
                        entry["runs"][f"lr={lr} seed={seed}"]["one_answer_level"] = level
        lr = chosen_lr(cand)
        entry["lr"] = lr
        mean = seed_mean(cand, lr) if lr else None
        if mean is not None:
            entry["seed_mean"] = {"curve": mean, **conditions(mean)}
            if levels:
                entry["seed_mean"]["one_answer_level"] = sum(
                    entry["runs"][f"lr={lr} seed={seed}"]["one_answer_level"] for seed in SEEDS) / len(SEEDS)
            entry["meets_all"] = met(entry["seed_mean"]) == 3
    finished = [c for c, e in summary["candidates"].items() if "seed_mean" in e]
    eligible = [c for c in finished if summary["candidates"][c]["meets_all"]]
    if CHOOSE == 1:
        summary["chosen"] = (max(eligible, key=lambda c: (summary["candidates"][c]["seed_mean"]["peak_step"],
                                                          summary["candidates"][c]["seed_mean"]["gain"]))
                             if eligible and len(finished) == len(CANDIDATES) else None)
    else:  # the largest seed-mean gains, ties by name
        ranked = sorted(eligible, key=lambda c: (-summary["candidates"][c]["seed_mean"]["gain"], c))
        unfinished = len(CANDIDATES) - len(finished)
        summary["chosen"] = ranked[:CHOOSE] if not unfinished else None
        # chosen whatever the unfinished candidates' runs give: were each of them to meet all three
        # and rank above, fewer than CHOOSE would still rank above these
        summary["settled"] = ranked[:max(0, CHOOSE - unfinished)]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = ["| candidate | lr | curve | start | peak (step) | largest interval / gain | late | gradual | <= 0.9 |"
             + (" one answer |" if levels else ""),
             "|---|---|---|---|---|---|---|---|---|" + ("---|" if levels else "")]
    for cand, entry in summary["candidates"].items():
        for label, r in [*entry["runs"].items(), *([("seed mean", entry["seed_mean"])] if "seed_mean" in entry else [])]:
            share = "n/a" if r["largest_interval_share"] is None else f"{r['largest_interval_share']:.2f}"
            lines.append(f"| {cand} | {label} | {' '.join(f'{a:.2f}' for _, a in sorted(r['curve'].items()))} | "
                         f"{r['start']:.3f} | {r['peak']:.3f} ({r['peak_step']}) | {share} | "
                         f"{'yes' if r['peak_late'] else 'no'} | {'yes' if r['gradual'] else 'no'} | "
                         f"{'yes' if r['below_ceiling'] else 'no'} |"
                         + (f" {r['one_answer_level']:.3f} |" if levels else ""))
    if levels:
        lines.append("\none answer: what giving the run's most common held-out answer to every problem would score "
                     "(for reading the curve; no condition uses it)")
    if CHOOSE == 1:
        lines.append(f"\nchosen: {summary['chosen'] or 'none yet' if len(finished) < len(CANDIDATES) else summary['chosen'] or 'none meets all three'}")
    elif summary["chosen"] is None:
        settled = f"; settled, whatever the unfinished runs give: {', '.join(summary['settled'])}" if summary["settled"] else ""
        lines.append(f"\nchosen: none yet{settled}")
    else:
        short = f" (only {len(summary['chosen'])} of the {CHOOSE} wanted meet all three)" if len(summary["chosen"]) < CHOOSE else ""
        lines.append(f"\nchosen: {', '.join(summary['chosen']) or 'none meets all three'}{short}")
    (RESULTS / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(summary)
    return 0


def plot(summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CANDIDATES), figsize=(5 * len(CANDIDATES), 3.6), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, (cand, entry) in zip(axes, summary["candidates"].items()):
        for label, r in entry["runs"].items():
            steps = sorted(r["curve"])
            ax.plot(steps, [r["curve"][s] for s in steps], alpha=0.45, label=label)
        if "seed_mean" in entry:
            m = entry["seed_mean"]["curve"]
            ax.plot(sorted(m), [m[s] for s in sorted(m)], "k-", lw=2, label=f"seed mean, lr={entry['lr']}")
            if "one_answer_level" in entry["seed_mean"]:
                ax.axhline(entry["seed_mean"]["one_answer_level"], color="grey", ls=":", label="one answer, seed mean")
        ax.set_title(cand)
        ax.set_xlabel("optimizer step")
        if entry["runs"]:
            ax.legend(fontsize=7)
    axes[0].set_ylabel("greedy pass@1, 500 held-out")
    fig.tight_layout()
    fig.savefig(RESULTS / "curves.png", dpi=110)


@one_line_errors("task_selection.py")
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="task_selection.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--jobs", type=int, default=2)
    r.add_argument("--stage", choices=["lr", "seeds", "both"], default="lr", help="both: lr, then seeds")
    r.add_argument("--round", choices=["first", "gym"], default="first")
    r.add_argument("--only", metavar="NAMES", help="these candidates' runs alone (comma-separated): a sitting too short "
                                                   "for every run takes those that fit it")
    r.set_defaults(func=run)
    rep_ = sub.add_parser("report")
    rep_.add_argument("--round", choices=["first", "gym"], default="first")
    rep_.set_defaults(func=report)
    args = parser.parse_args(argv)
    use_round(args.round)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
