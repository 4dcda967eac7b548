"""The reward workers' memory in a resumed run: forked before the model loads (as a run forks
them) against forked at the first scoring (the earlier order, emulated here by not starting them
in setup), side by side from one checkpoint.

    python benchmarks/worker_memory.py [--out benchmarks/results/worker_memory] [-- OVERRIDES...]

A resumed run holds its weights and its optimizer state before it scores anything. A worker forked
then shares those pages with the trainer until the trainer's first update rewrites them in place:
from then on the workers keep the old copy (shared among themselves, so it counts in their
proportional share, PSS, rather than as any one worker's private memory). A worker forked before
the model loads never had them. What it reports, after each of the resumed run's updates: each
worker's PSS and its private memory (resident or swapped), read from ``/proc/<pid>/smaps_rollup``
(Linux), and the workers' PSS in all. These are page counts: they do not bend with the machine's
load.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from podsrl.checkpoint import write_atomic

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ["configs/smoke.yaml", "threads=1", "reward_workers=2", "progress=false",
            "rewards=[benchmarks.worker_memory:by_length]"]
"""The embedded model on the smoke task; two reward workers, scoring a user's reward (the built-in
ones grade most answers inline, and reach the pool only for what needs math-verify)."""
FIRST, RESUMED = 1, 3
"""The checkpoint's step, and the step the resumed runs train to."""
ARMS = {"before the model loads": "as-run", "at the first scoring": "lazy"}

RESUME = """
import json, sys
from podsrl import trainer
from podsrl.config import load_config
from podsrl.rewards.scorer import Scorer

arm, folder, steps, *settings = sys.argv[1:]
if arm == "lazy":  # the pool then starts when the first step scores, after the model and optimizer load
    Scorer.start_workers = lambda self: None

def memory(pid):  # None: the child has ended (a zombie has no memory map)
    lines = open(f"/proc/{pid}/smaps_rollup").read().splitlines()[1:]
    if not lines:
        return None
    fields = dict(line.split(":") for line in lines)
    kib = {k: int(v.split()[0]) for k, v in fields.items()}
    return {"private_mib": (kib["Private_Clean"] + kib["Private_Dirty"] + kib["Swap"]) / 1024, "pss_mib": kib["Pss"] / 1024}

def children():  # this process's children, whichever thread started them: the reward workers
    import glob
    return {int(p) for f in glob.glob("/proc/self/task/*/children") for p in open(f).read().split()}

seen, update = [], trainer.update
def measured(s, c, rollouts, chosen, step):
    out = update(s, c, rollouts, chosen, step)
    workers = sorted(children())
    seen.append({"step": step, "workers": [m for m in map(memory, workers) if m]})
    return out

trainer.update = measured
config_file, *overrides = settings
trainer.train(load_config(config_file, [*overrides, f"output_dir={folder}", f"steps={steps}", "resume=true"]))
print(json.dumps(seen))
"""


def by_length(completions, **_):
    """A user's reward, which the pool scores: it differs between completions."""
    return [len(c) % 3 / 2 for c in completions]


def run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])} failed (exit code {done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "worker_memory")
    parser.add_argument("overrides", nargs="*", help="config overrides after --, for every run")
    args = parser.parse_args(argv)
    settings = [*SETTINGS, *args.overrides]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        start = Path(tmp) / "start"
        run([sys.executable, "-m", "podsrl", "train", *settings, f"steps={FIRST}", "save_optimizer=true",
             f"output_dir={start}"])
        for label, arm in ARMS.items():
            folder = Path(tmp) / arm
            shutil.copytree(start, folder)
            out = run([sys.executable, "-c", RESUME, arm, str(folder), str(RESUMED), *settings])
            results[label] = json.loads(out.strip().splitlines()[-1])
    lines = [f"# Reward workers' memory in a resumed run (from its step-{FIRST} checkpoint)", "",
             f"Settings: `{' '.join(settings)}`; the run resumed to step {RESUMED}. Per worker, MiB: private "
             "(resident or swapped) and proportional share (PSS), after each update.", "",
             "| workers forked | step | private MiB (each) | PSS MiB (each) |", "|---|---|---|---|"]
    for label, seen in results.items():
        for row in seen:
            private = ", ".join(f"{w['private_mib']:.0f}" for w in row["workers"])
            pss = ", ".join(f"{w['pss_mib']:.0f}" for w in row["workers"])
            lines.append(f"| {label} | {row['step']} | {private} | {pss} |")
    last = {label: sum(w["pss_mib"] for w in seen[-1]["workers"]) for label, seen in results.items()}
    early, late = last["before the model loads"], last["at the first scoring"]
    lines += ["", f"After the last update the workers' PSS in all is {early:.0f} MiB when they are forked before the "
              f"model loads, {late:.0f} MiB when forked at the first scoring ({late / max(early, 1e-9):.1f}x)."]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "worker_memory.md", text)
    write_atomic(args.out / "worker_memory.json", json.dumps({"settings": settings, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
