"""Draws which of a group's n rollouts PODS trains on: docs/images/pods_selection.png, the TRL
guide's picture of the method.

    python benchmarks/selection_figure.py

Three groups of n = 16 rewards (a 0/1 reward with 5 right, with 1 right, and a graded reward in
[0, 1]), each down-sampled to m = 4 by podsrl.downsample.select with the max-variance rule (top
row) and the random rule (bottom row). Filled: kept for the update; hollow: generated, scored and
left out. Each panel's title gives the variance of the kept rewards, which max-variance makes as
large as any choice of 4 can be. Fixed seeds: the picture is the same on every run.
"""

import argparse
from pathlib import Path

import torch

from podsrl.downsample import select

N, M = 16, 4


def groups() -> dict[str, torch.Tensor]:
    graded = torch.rand(N, generator=torch.Generator().manual_seed(3)).pow(1.5).round(decimals=2)
    return {
        "0/1 reward, 5 of 16 right": torch.tensor([0.0] * 11 + [1.0] * 5)[torch.randperm(N, generator=torch.Generator().manual_seed(1))],
        "0/1 reward, 1 of 16 right": torch.tensor([0.0] * 15 + [1.0])[torch.randperm(N, generator=torch.Generator().manual_seed(2))],
        "graded reward in [0, 1]": graded,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "images" / "pods_selection.png")
    out = parser.parse_args().out

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rules = {"max_variance": "max-variance (PODS)", "random": "random"}
    fig, axes = plt.subplots(len(rules), 3, figsize=(10, 4.8), sharey=True)
    for col, (name, rewards) in enumerate(groups().items()):
        order = torch.argsort(rewards, stable=True)  # draw the rollouts from the lowest reward to the highest
        for row, (rule, label) in enumerate(rules.items()):
            kept = select(rewards, M, rule, generator=torch.Generator().manual_seed(0))
            chosen = torch.zeros(N, dtype=torch.bool)
            chosen[kept] = True
            ax = axes[row, col]
            x = torch.arange(N)
            y, c = rewards[order], chosen[order]
            ax.scatter(x[~c], y[~c], s=36, facecolors="none", edgecolors="grey", label="generated, left out")
            ax.scatter(x[c], y[c], s=60, color="tab:orange", label=f"kept (m = {M})")
            ax.set_title(f"{label}: kept variance {rewards[kept].var(unbiased=False).item():.3f}", fontsize=9)
            ax.set_xticks([])
            ax.set_ylim(-0.12, 1.12)
            if col == 0:
                ax.set_ylabel("reward")
            if row == len(rules) - 1:
                ax.set_xlabel(f"{name}\n(n = {N} rollouts, lowest reward to highest)", fontsize=9)
    axes[0, 0].legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
