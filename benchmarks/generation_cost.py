"""What a step's generation costs, fitted over a comparison's runs: a least-squares fit of each
step's ``generation_s`` to a constant, the engine calls it made (rounds of ``adaptive_n`` times
batches of dynamic sampling) and the rollouts it generated.

    python benchmarks/generation_cost.py benchmarks/results/adaptive_allocation
"""

import argparse
import json
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a podsrl compare output folder")
    folder = parser.parse_args().folder
    rows = []
    for path in sorted(folder.glob("*/seed-*/metrics.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if "generation_s" in r and r["step"] > 1:  # step 1 also pays the first call's warm-up
                calls = r.get("adaptive_rounds", 1) * r.get("dynamic_rounds", 1)
                rows.append((calls, r["rollouts_generated"], r["generation_s"]))
    if len(rows) < 3:
        raise SystemExit(f"{folder}: fewer than 3 training steps with generation times")
    x = np.array([[1.0, c, n] for c, n, _ in rows])
    y = np.array([g for _, _, g in rows])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    r2 = 1 - ((y - x @ coef) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    print(f"{len(rows)} steps of {folder}: generation_s = {coef[0]:.3f} + {coef[1]:.3f} per engine call "
          f"+ {coef[2] * 1000:.1f} ms per rollout (R^2 {r2:.3f}); one call costs as much as "
          f"{coef[1] / coef[2]:.0f} rollouts")


if __name__ == "__main__":
    main()
