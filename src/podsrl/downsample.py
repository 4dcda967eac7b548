"""Down-sampling rules: which m of a group's n rollouts reach the policy update.

PODS (Xu et al., 2025, arXiv 2504.13818) generates n rollouts per prompt and trains on m < n.
The preferred rule is *max-variance* down-sampling,

    S* = argmax_{S ⊆ [n], |S| = m}  Var({r_i : i ∈ S}),

solved exactly by Theorem 1: some optimal S is the k highest plus the m − k lowest rewards for a
k in 0..m. With the group sorted, the m + 1 candidates are scored at once from prefix sums of r
and r², so the rule costs one sort per group and O(m) arithmetic, vectorised over groups and k.

All rules map a reward matrix ``[B, n]`` to indices ``[B, m]`` into its last dimension and are
registered by name in :data:`RULES`; :func:`register_rule` adds one. :func:`select` also takes an
eligibility mask (rollouts that cannot train are kept only when a group is short of others) and
applies any registered rule to the eligible rollouts.
"""

from __future__ import annotations

import operator
from typing import Callable

import torch
from torch import Tensor

Rule = Callable[[Tensor, int, "torch.Generator | None"], Tensor]
"""``rule(rewards[B, n], m, generator) -> indices[B, m]``; inputs are already validated."""

RULES: dict[str, Rule] = {}


def register_rule(name: str) -> Callable[[Rule], Rule]:
    """Decorator that makes a rule available to :func:`select` (and the config) under ``name``."""

    def add(fn: Rule) -> Rule:
        RULES[name] = fn
        return fn

    return add


def select(
    rewards: Tensor,
    m: int,
    rule: str = "max_variance",
    generator: torch.Generator | None = None,
    eligible: Tensor | None = None,
) -> Tensor:
    """Indices of the ``m`` rollouts of each group that the update trains on.

    Args:
        rewards: float tensor ``[B, n]`` (B groups of n rollouts) or ``[n]`` (one group).
        m: rollouts kept per group, an integer ``1 <= m <= n`` (Python's, numpy's, or a 0-d integer
            tensor). ``m == n`` returns every index in order.
        rule: a name in :data:`RULES` (``max_variance``, ``max_reward``, ``random``, ``percentile``).
        generator: random source for stochastic rules.
        eligible: optional bool tensor shaped like ``rewards``, False for rollouts that cannot
            train (say, a truncated completion whose tokens are masked out). The rule runs on each
            group's eligible rollouts; an ineligible one is chosen only when its group has fewer
            than ``m`` eligible, and then the remaining slots are filled from the ineligible
            (max_variance: so that the whole kept set has the largest variance).

    Returns:
        long tensor ``[B, m]`` (or ``[m]``) of indices into the last dimension of ``rewards``.

    Raises:
        ValueError: on a wrong shape, non-finite rewards, ``m`` outside ``1..n`` or an unknown rule.
    """
    rewards, shown = torch.as_tensor(rewards), m
    if rewards.dim() not in (1, 2):
        raise ValueError(f"rewards must be [n] or [B, n], got {rewards.dim()} dimensions")
    if not rewards.is_floating_point():
        rewards = rewards.float()
    n = rewards.shape[-1]
    try:  # any integer: numpy's, a 0-d integer tensor (never a bool or a float)
        whole = not isinstance(m, bool) and getattr(m, "dtype", None) != torch.bool and getattr(m, "ndim", 0) == 0
        m = operator.index(m) if whole else None
    except TypeError:
        m = None
    if m is None or not 1 <= m <= n:
        raise ValueError(f"m must be an integer in 1..n = 1..{n}, got {shown!r}")
    if rule not in RULES:
        raise ValueError(f"unknown down-sampling rule {rule!r}; known: {', '.join(sorted(RULES))}")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf")
    if eligible is not None:
        eligible = torch.as_tensor(eligible, device=rewards.device)
        if eligible.dtype != torch.bool or eligible.shape != rewards.shape:
            raise ValueError(f"eligible must be a bool tensor shaped like rewards {tuple(rewards.shape)}, "
                             f"got {eligible.dtype} {tuple(eligible.shape)}")

    batched = rewards.unsqueeze(0) if rewards.dim() == 1 else rewards  # [B, n]
    if eligible is None or bool(eligible.all()):
        idx = _apply(batched, m, rule, generator)
    else:
        idx = _eligible_first(batched, m, rule, generator, eligible.view(batched.shape))
    return idx.squeeze(0) if rewards.dim() == 1 else idx


def _apply(rewards: Tensor, m: int, rule: str, generator: torch.Generator | None) -> Tensor:
    """The rule on every group ``[B, n] -> [B, m]``; ``m == n`` keeps every index in order."""
    B, n = rewards.shape
    if m == n:
        return torch.arange(n, device=rewards.device).expand(B, n).clone()
    return RULES[rule](rewards, m, generator)


def _eligible_first(rewards: Tensor, m: int, rule: str, generator: torch.Generator | None, eligible: Tensor) -> Tensor:
    """:func:`select` with an eligibility mask: groups with the same number e of eligible rollouts
    are handled together. The rule runs on the eligible rewards (kept in index order, so the
    rules' tie-breaks still follow the original indices) when e >= m; when e < m every eligible
    one is kept and the m - e other slots are filled from the ineligible ones: by the rule's
    :data:`FILLS` entry over the whole kept set (max_variance: the kept set's variance), else by
    the rule run on the ineligible ones."""
    B, n = rewards.shape
    counts = eligible.sum(-1)  # [B]
    idx = torch.empty(B, m, dtype=torch.long, device=rewards.device)
    for e in counts.unique().tolist():
        rows = (counts == e).nonzero().squeeze(1)  # groups with e eligible rollouts
        order = torch.sort((~eligible[rows]).to(torch.uint8), dim=-1, stable=True).indices  # [b, n] eligible first
        first, rest = order[:, :e], order[:, e:]  # [b, e], [b, n - e]
        if e >= m:
            idx[rows] = first.gather(1, _apply(rewards[rows].gather(1, first), m, rule, generator))
        else:
            others, kept = rewards[rows].gather(1, rest), rewards[rows].gather(1, first)  # [b, n - e], [b, e]
            chosen = FILLS[rule](others, m - e, kept, generator) if rule in FILLS else _apply(others, m - e, rule, generator)
            idx[rows] = torch.cat([first, rest.gather(1, chosen)], 1)  # [b, m]
    return idx


@register_rule("max_variance")
def max_variance(rewards: Tensor, m: int, generator: torch.Generator | None = None) -> Tensor:
    """Exact max-variance subset (Theorem 1): the k highest plus the m − k lowest, best k.

    Ties are broken deterministically by one stable sort: among equal rewards the low end takes
    lower indices first and the high end higher indices first (so the ends never overlap), and
    among equally good k the smallest k wins.
    """
    return _best_extremes(rewards, m, rewards.new_zeros(rewards.shape[0], 0))


def max_variance_fill(rest: Tensor, f: int, kept: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """The ``f`` of ``rest`` ``[B, r]`` that, with the ``kept`` rewards ``[B, e]`` (a short group's
    eligible ones, all kept), give the whole kept set the largest variance. Theorem 1's argument
    holds over the whole set: with the others fixed, the variance is a convex quadratic in each
    chosen value (coefficient (1 − 1/M)/M > 0, M = e + f), so each chosen value is the largest or
    the smallest still available: the k highest plus the f − k lowest of ``rest``, best k."""
    return _best_extremes(rest, f, kept)


def _best_extremes(rewards: Tensor, m: int, kept: Tensor) -> Tensor:
    """Indices ``[B, m]`` into ``rewards`` ``[B, n]`` of the k highest plus the m − k lowest, for
    the k in 0..m that maximises the population variance of them together with ``kept`` ``[B, e]``."""
    B, n = rewards.shape
    e = kept.shape[1]
    vals, order = torch.sort(rewards, dim=-1, stable=True)  # [B, n] ascending
    low_vals, low_idx = vals[:, :m], order[:, :m]  # [B, m] the m lowest, ascending
    high_vals, high_idx = vals[:, n - m :].flip(-1), order[:, n - m :].flip(-1)  # [B, m] descending

    # Centre each group before summing squares so large offsets do not cancel catastrophically.
    centre = torch.cat([rewards, kept], 1).mean(dim=-1, keepdim=True, dtype=torch.float64)  # [B, 1]
    lo = low_vals.double() - centre  # [B, m]
    hi = high_vals.double() - centre  # [B, m]
    fixed = kept.double() - centre  # [B, e]
    zero = lo.new_zeros(B, 1)
    lo1 = torch.cat([zero, lo.cumsum(-1)], -1)  # [B, m+1]  sum of the j lowest
    lo2 = torch.cat([zero, (lo * lo).cumsum(-1)], -1)
    hi1 = torch.cat([zero, hi.cumsum(-1)], -1)  # [B, m+1]  sum of the k highest
    hi2 = torch.cat([zero, (hi * hi).cumsum(-1)], -1)

    # Candidate k takes the k highest and the m - k lowest: flip the low sums to index by k.
    size = m + e  # the whole kept set
    s1 = hi1 + lo1.flip(-1) + fixed.sum(-1, keepdim=True)  # [B, m+1]
    s2 = hi2 + lo2.flip(-1) + (fixed * fixed).sum(-1, keepdim=True)
    var = s2 / size - (s1 / size) ** 2  # [B, m+1]  population variance of each candidate
    k = var.argmax(dim=-1, keepdim=True)  # [B, 1]  first (smallest) k on ties

    # Output slot j < m - k holds the j-th lowest, slot j >= m - k the (j - (m - k))-th highest.
    j = torch.arange(m, device=rewards.device).expand(B, m)  # [B, m]
    from_low = j < (m - k)
    return torch.where(
        from_low,
        torch.gather(low_idx, 1, j.clamp(max=m - 1)),
        torch.gather(high_idx, 1, (j - (m - k)).clamp(min=0)),
    )


Fill = Callable[[Tensor, int, Tensor, "torch.Generator | None"], Tensor]
"""``fill(rest[B, r], f, kept[B, e], generator) -> indices[B, f]`` into ``rest``: a short group's
other f slots, given the e rewards already kept."""

FILLS: dict[str, Fill] = {"max_variance": max_variance_fill}
"""Rules whose short groups are filled by their own criterion over the whole kept set; any other
rule fills the slots by itself, run on the ineligible rollouts alone."""


@register_rule("max_reward")
def max_reward(rewards: Tensor, m: int, generator: torch.Generator | None = None) -> Tensor:
    """The m highest rewards; lower index first among ties."""
    return torch.sort(-rewards, dim=-1, stable=True).indices[:, :m]


@register_rule("random")
def random(rewards: Tensor, m: int, generator: torch.Generator | None = None) -> Tensor:
    """m indices uniformly at random without replacement, independently per group."""
    keys = torch.rand(rewards.shape, generator=generator, device=rewards.device)
    return keys.argsort(dim=-1)[:, :m]


@register_rule("percentile")
def percentile(rewards: Tensor, m: int, generator: torch.Generator | None = None) -> Tensor:
    """m evenly spaced order statistics, the minimum and the maximum included (m = 1: minimum)."""
    n = rewards.shape[-1]
    order = torch.sort(rewards, dim=-1, stable=True).indices  # [B, n] ascending
    j = torch.arange(m, device=rewards.device)
    positions = j * (n - 1) // max(m - 1, 1)  # [m] distinct, since (n - 1) / (m - 1) >= 1
    return order[:, positions]
