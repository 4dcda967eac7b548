"""Speed of exact max-variance down-sampling: batched `select` against a per-group reference.

The reference does what the paper's released code does for each group: sort the rewards, then
for every k in 0..m build the subset (k highest + m - k lowest), call torch.var and keep the best.
Both run side by side on the same rewards; the ratio is printed. Also timed: the sorting
primitive `select` uses (one stable sort) against two partial selections (top-k and bottom-k).

    python benchmarks/selection.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import torch

from podsrl.downsample import select


def reference_max_variance(rewards: torch.Tensor, m: int) -> torch.Tensor:
    """Per-group loop: sort, then try every k with torch.var."""
    out = []
    for row in rewards:
        order = torch.argsort(row, descending=True)
        best, best_var = None, -1.0
        for k in range(m + 1):
            subset = torch.cat([order[:k], order[len(order) - (m - k):]]) if k < m else order[:m]
            v = torch.var(row[subset]).item()
            if v > best_var:
                best, best_var = subset, v
        out.append(best)
    return torch.stack(out)


def best_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; best of {args.repeats}")
    print(f"{'shape (B, n, m)':<20} {'rewards':<10} {'select ms':>10} {'reference ms':>13} {'speed-up':>9}")
    for B, n, m in [(256, 256, 64), (4096, 64, 16)]:
        for kind in ("continuous", "binary"):
            r = torch.rand(B, n) if kind == "continuous" else torch.randint(0, 2, (B, n)).float()
            fast = best_time(lambda: select(r, m), args.repeats)
            slow = best_time(lambda: reference_max_variance(r, m), 1)
            # same optimum: compare the variances of the chosen subsets
            v_fast = torch.gather(r, 1, select(r, m)).var(-1)
            v_ref = torch.gather(r, 1, reference_max_variance(r, m)).var(-1)
            assert torch.allclose(v_fast, v_ref, atol=1e-5), "select disagrees with the reference"
            print(f"{str((B, n, m)):<20} {kind:<10} {fast * 1e3:>10.2f} {slow * 1e3:>13.1f} {slow / fast:>8.0f}x")

    B, n, m = 4096, 256, 64
    print(f"\n1M rewards {(B, n, m)}: target < 50 ms")
    for kind in ("continuous", "binary"):
        r = torch.rand(B, n) if kind == "continuous" else torch.randint(0, 2, (B, n)).float()
        t_select = best_time(lambda: select(r, m), args.repeats)
        t_sort = best_time(lambda: torch.sort(r, dim=-1, stable=True), args.repeats)
        t_topk = best_time(lambda: (torch.topk(r, m, -1), torch.topk(r, m, -1, largest=False)), args.repeats)
        print(f"  {kind:<10} select {t_select * 1e3:6.2f} ms | primitives: stable sort "
              f"{t_sort * 1e3:6.2f} ms, top-k + bottom-k {t_topk * 1e3:6.2f} ms")


if __name__ == "__main__":
    main()
