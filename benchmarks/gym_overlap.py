"""Overlap by question text between each built-in candidate config's held-out set and what its
training draws: the configs under ``configs/`` that name a candidate task (``gym_*.yaml`` and the
arithmetic candidate), at their own ``task.test_size`` and seed.

    python benchmarks/gym_overlap.py [--draws 10000] [configs/gym_chain_sum.yaml ...]

Columns: the seconds building the task takes (held-out draws and the 1,000 to 5,000 more that
measure its overlap); the held-out set's share of the generator's draws (what a gym task measures
when it is built, refused above 1%); the share of held-out questions among the first
``--draws`` problems of the generator (what training would see without podsrl skipping them); the
same share in the training stream podsrl trains on (0 for a gym task: held-out questions are
skipped). The arithmetic task skips nothing: its two figures are the same.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import time

from podsrl.config import load_config
from podsrl.tasks import task_from_config
from podsrl.tasks import gym


def gym_figures(c, draws: int) -> tuple[float, int, float]:
    """(the held-out set's share of the generator's draws, the draws it was measured on, the
    held-out questions among the first ``draws`` of the generator's training seeds)."""
    t = c.task
    specs = gym._specs(t.dataset, t.config, t.datasets)
    make = gym._generator(specs)
    settings = {name: json.dumps(s, sort_keys=True) for name, _, s in specs}
    test, probe, probed = gym.held_out(make, settings, t.test_size, c.seed)
    held = {p.question for p in test}
    raw = {p.question for p in itertools.islice(gym.generated(make, settings, gym.held_out_seed(c.seed) + gym.HELD_OUT_SPAN), draws)}
    return probe, probed, len(held & raw) / len(held)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=10_000)
    parser.add_argument("configs", nargs="*")
    args = parser.parse_args()
    paths = args.configs or sorted(glob.glob("configs/gym_*.yaml")) + ["configs/arithmetic_2digit.yaml"]
    gym.require()  # imported before the clock starts
    print(f"| config | task | held-out | built in | share of the generator's draws | held-out among the generator's first "
          f"{args.draws:,} | held-out among the training stream's first {args.draws:,} |")
    print("|---|---|---|---|---|---|---|")
    for path in paths:
        c = load_config(path)
        start = time.perf_counter()
        task = task_from_config(c.task, c.seed)
        built = f"{time.perf_counter() - start:.2f} s"
        stream = gym.overlap(task, args.draws, c.seed)
        if c.task.name == "gym":
            probe, probed, raw = gym_figures(c, args.draws)
            label = c.task.dataset or "+".join(d["name"] for d in c.task.datasets)
            print(f"| {path} | gym {label} | {len(task.test)} | {built} | {probe:.1%} of {probed:,} | {raw:.1%} | {stream:.1%} |", flush=True)
        else:
            print(f"| {path} | {c.task.name} | {len(task.test)} | {built} | — | {stream:.1%} | {stream:.1%} |", flush=True)


if __name__ == "__main__":
    main()
