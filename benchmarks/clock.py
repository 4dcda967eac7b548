"""Does a shared machine bend the training process's CPU time less than its wall time?

    python benchmarks/clock.py [--steps 8] [--hogs 2] [--out benchmarks/results/clock.json] [key=value ...]

Trains the same run twice (GRPO on two-digit arithmetic, one OpenMP thread, no evaluation but at
the start and the end): first on the machine as it is (idle, or busy with other work), then with
``--hogs`` more busy-looping processes beside it. Both runs train on the same rollouts (seeded; one thread), so they do the same work.
For each clock (``train_seconds``: wall; ``train_cpu_seconds``: the training process's CPU time)
it prints the total of each run and their relative difference, and the median and largest
relative difference of a step between the two runs. Generation and the update are timed on wall
only (their split is in each step's record); the reward workers' CPU time is in neither clock.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def hog() -> None:
    while True:
        pass


def train(steps: int, overrides: list[str], out: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "podsrl", "train", "configs/arithmetic_2digit.yaml", "mode=grpo", f"steps={steps}",
           "eval_every=0", "task.test_size=20", "threads=1", "progress=false", f"output_dir={out}", *overrides]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "update_s" in r]


def per_step(rows: list[dict], key: str) -> list[float]:
    return [b[key] - a[key] for a, b in zip([{key: 0.0}, *rows], rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plain = train(args.steps, args.overrides, Path(tmp) / "plain")
        hogs = [multiprocessing.Process(target=hog, daemon=True) for _ in range(args.hogs)]
        for h in hogs:
            h.start()
        try:
            loaded = train(args.steps, args.overrides, Path(tmp) / "loaded")
        finally:
            for h in hogs:
                h.terminate()
    assert [r["generated_completion_length"] for r in plain] == [r["generated_completion_length"] for r in loaded], "the runs differ"
    result = {"steps": args.steps, "hogs": args.hogs, "load_average_at_end": os.getloadavg(), "clocks": {}}
    print(f"{args.steps} GRPO steps, threads=1; second run with {args.hogs} more busy-looping processes beside it")
    print("| clock | machine as it was (s) | with the hogs (s) | total differs by | a step differs by (median / largest) |")
    print("|---|---|---|---|---|")
    for key, label in (("train_seconds", "wall"), ("train_cpu_seconds", "CPU")):
        a, b = plain[-1][key], loaded[-1][key]
        steps = [abs(y - x) / x for x, y in zip(per_step(plain, key), per_step(loaded, key))]
        result["clocks"][label] = {"as_it_was": a, "with_hogs": b, "total_relative_difference": abs(b - a) / a,
                                   "step_relative_difference_median": statistics.median(steps),
                                   "step_relative_difference_max": max(steps),
                                   "per_step_as_it_was": per_step(plain, key), "per_step_with_hogs": per_step(loaded, key)}
        print(f"| {label} | {a:.1f} | {b:.1f} | {abs(b - a) / a:.1%} | {statistics.median(steps):.1%} / {max(steps):.1%} |")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
