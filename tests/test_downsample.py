"""select(): exactness against brute force, Theorem 2, batching, the other rules, bad input."""

import itertools
import math

import numpy as np
import pytest
import torch

from podsrl.downsample import RULES, register_rule, select


def brute_force_best_variance(rewards: np.ndarray, m: int) -> np.ndarray:
    """Largest population variance over every m-subset of each row: [B, n] -> [B]."""
    n = rewards.shape[-1]
    combos = np.array(list(itertools.combinations(range(n), m)))  # [C, m]
    return rewards[:, combos].var(axis=-1).max(axis=-1)  # [B, C, m] -> [B]


def subset_variance(rewards: torch.Tensor, idx: torch.Tensor) -> np.ndarray:
    return torch.gather(rewards, 1, idx).numpy().var(axis=-1)


def random_groups(rng: np.random.Generator, kind: str, B: int, n: int) -> np.ndarray:
    if kind == "continuous":
        return rng.normal(size=(B, n))
    if kind == "binary":
        return rng.integers(0, 2, size=(B, n)).astype(np.float64)
    if kind == "ties":  # few distinct values, many ties
        return rng.choice([0.0, 0.25, 0.5, 1.0], size=(B, n))
    if kind == "negative":
        return -rng.exponential(3.0, size=(B, n)) - 100.0
    if kind == "constant":
        return np.full((B, n), rng.normal())
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["continuous", "binary", "ties", "negative", "constant"])
def test_max_variance_matches_brute_force(kind):
    rng = np.random.default_rng(0)
    cases = 0
    for n in range(1, 13):
        for m in range(1, n + 1):
            B = 40 if kind != "constant" else 3
            r = random_groups(rng, kind, B, n)
            idx = select(torch.from_numpy(r), m)
            assert idx.shape == (B, m)
            # distinct, in-range indices
            assert all(len(set(row.tolist())) == m for row in idx)
            assert int(idx.min()) >= 0 and int(idx.max()) < n
            got = subset_variance(torch.from_numpy(r), idx)
            best = brute_force_best_variance(r, m)
            np.testing.assert_allclose(got, best, rtol=1e-9, atol=1e-9)
            cases += B
    assert cases >= 200


def test_thousands_of_cases_float32():
    """float32 input, as the trainer passes it: still optimal up to float32 rounding."""
    rng = np.random.default_rng(1)
    total = 0
    for _ in range(30):
        n = int(rng.integers(2, 13))
        m = int(rng.integers(1, n + 1))
        r = rng.choice([rng.normal(size=(64, n)), rng.integers(0, 3, size=(64, n)) / 2.0])
        r32 = torch.from_numpy(r).float()
        got = subset_variance(r32.double(), select(r32, m))
        best = brute_force_best_variance(r32.double().numpy(), m)
        np.testing.assert_allclose(got, best, rtol=1e-5, atol=1e-6)
        total += 64
    assert total >= 1000


@pytest.mark.parametrize("n,m,ones", [(8, 4, 2), (8, 4, 6), (16, 8, 4), (64, 16, 8), (64, 16, 50), (10, 6, 3)])
def test_theorem2_binary_takes_half_ones(n, m, ones):
    """Binary rewards with at least m/2 of each value: exactly m/2 ones are selected."""
    g = torch.Generator().manual_seed(n * 100 + ones)
    r = torch.zeros(n)
    r[torch.randperm(n, generator=g)[:ones]] = 1.0
    chosen = r[select(r, m)]
    assert int(chosen.sum()) == m // 2


def test_binary_with_few_successes_takes_them_all():
    r = torch.tensor([0, 0, 1, 0, 0, 0, 0, 0, 0, 0.0])
    assert int(r[select(r, 4)].sum()) == 1


def test_batched_equals_row_by_row():
    g = torch.Generator().manual_seed(3)
    r = torch.randint(0, 4, (50, 20), generator=g).float() / 3
    for rule in ("max_variance", "max_reward", "percentile"):
        batched = select(r, 7, rule)
        rows = torch.stack([select(row, 7, rule) for row in r])
        assert torch.equal(batched, rows), rule


def test_ties_are_broken_deterministically():
    r = torch.ones(2, 6)
    assert select(r, 3).tolist() == [[0, 1, 2], [0, 1, 2]]  # k = 0: the low end, lower index first
    r = torch.tensor([[0.0, 1, 0, 1, 0, 1]])
    assert sorted(select(r, 2)[0].tolist()) == [0, 5]  # first 0 from the low end, last 1 from the high
    assert torch.equal(select(r, 4), select(r.clone(), 4))


def test_m_equals_n_returns_every_index():
    r = torch.randn(3, 5)
    for rule in RULES:
        assert select(r, 5, rule).tolist() == [list(range(5))] * 3


def test_max_reward_takes_the_highest():
    r = torch.tensor([[0.1, 0.9, 0.5, 0.7, 0.2]])
    assert sorted(select(r, 2, "max_reward")[0].tolist()) == [1, 3]


def test_percentile_hand_example():
    r = torch.tensor([5.0, 1.0, 4.0, 2.0, 3.0])  # sorted: 1 2 3 4 5 at indices 1 3 4 2 0
    assert select(r, 3, "percentile").tolist() == [1, 4, 0]  # min, median, max
    assert select(r, 2, "percentile").tolist() == [1, 0]  # min, max


def test_random_honours_generator_and_is_uniform():
    r = torch.zeros(4000, 8)
    a = select(r, 2, "random", torch.Generator().manual_seed(0))
    b = select(r, 2, "random", torch.Generator().manual_seed(0))
    c = select(r, 2, "random", torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert all(row[0] != row[1] for row in a.tolist())
    freq = torch.bincount(a.flatten(), minlength=8).float() / a.numel()
    assert torch.allclose(freq, torch.full((8,), 1 / 8), atol=0.02)


def test_registry_every_rule_resolves_and_custom_rules_plug_in():
    r = torch.randn(4, 10)
    for name in ("max_variance", "max_reward", "random", "percentile"):
        idx = select(r, 3, name)
        assert idx.shape == (4, 3) and idx.dtype == torch.long

    @register_rule("lowest")
    def lowest(rewards, m, generator=None):
        return rewards.argsort(-1)[:, :m]

    try:
        assert torch.equal(select(r, 2, "lowest"), r.argsort(-1)[:, :2])
    finally:
        del RULES["lowest"]


@pytest.mark.parametrize(
    "rewards,m,rule,message",
    [
        (torch.zeros(2, 4), 0, "max_variance", "m must be"),
        (torch.zeros(2, 4), 5, "max_variance", "m must be"),
        (torch.zeros(2, 4), 2.0, "max_variance", "m must be"),
        (torch.zeros(2, 4), True, "max_variance", "m must be"),
        (torch.zeros(2, 4), torch.tensor(2.0), "max_variance", "m must be"),
        (torch.zeros(2, 4), torch.tensor([2]), "max_variance", "m must be"),
        (torch.zeros(2, 4), np.int64(5), "max_variance", "m must be"),
        (torch.tensor([[0.0, math.nan, 1.0]]), 2, "max_variance", "NaN"),
        (torch.tensor([[0.0, math.inf, 1.0]]), 2, "max_variance", "NaN or inf"),
        (torch.zeros(2, 3, 4), 2, "max_variance", "dimensions"),
        (torch.zeros(2, 4), 2, "nope", "unknown down-sampling rule"),
    ],
)
def test_bad_input_raises_value_error(rewards, m, rule, message):
    with pytest.raises(ValueError, match=message):
        select(rewards, m, rule)


@pytest.mark.parametrize("m", [np.int64(2), np.int32(2), torch.tensor(2), torch.tensor(2, dtype=torch.int32)])
def test_m_may_be_any_integer_type(m):
    # numpy's integers and a 0-d integer tensor are integers (operator.index), as Python's int is
    r = torch.tensor([[0.0, 1.0, 0.5, 1.0]])
    assert select(r, m).tolist() == [[0, 3]]  # max-variance of 2: the lowest and the highest (later index)


# --------------------------------------------------------------------------- eligibility


def _best_subset_value(values: list[float], size: int, objective) -> float:
    return max(objective(list(s)) for s in itertools.combinations(values, size))


def _percentile_values(values: list[float], size: int) -> list[float]:
    """The order statistics ``percentile`` keeps: positions j (len - 1) // (size - 1) of the sorted values."""
    ordered = sorted(values)
    return sorted(ordered[j * (len(ordered) - 1) // max(size - 1, 1)] for j in range(size))


@pytest.mark.parametrize("rule", ["max_variance", "max_reward", "percentile", "random"])
def test_eligible_rollouts_first_against_brute_force(rule):
    """Every group of up to 7 rollouts, every m, random eligibility (none, some, all): the rollouts
    kept are min(e, m) eligible ones, and the part the rule chose (among the eligible when e >= m,
    among the ineligible for the m - e slots left otherwise) is the rule's own choice over that
    pool, checked by brute force over its subsets (max-variance: the variance of the whole kept
    set, short groups included; max-reward) or by sorting (percentile)."""
    rng = np.random.default_rng(7)
    objective = {"max_variance": lambda v: float(np.var(v)), "max_reward": sum}.get(rule)
    checked = short = 0
    for n in range(1, 8):
        for m in range(1, n + 1):
            r = torch.from_numpy(rng.choice([0.0, 0.25, 0.5, 1.0, rng.normal()], size=(30, n)))
            eligible = torch.from_numpy(rng.random((30, n)) < rng.choice([0.3, 0.7], size=(30, 1)))
            eligible[0], eligible[1] = False, True  # a group with no eligible rollout, one with all
            idx = select(r, m, rule, torch.Generator().manual_seed(n * 10 + m), eligible=eligible)
            assert idx.shape == (30, m)
            for row, chosen, ok in zip(r.tolist(), idx.tolist(), eligible.tolist()):
                assert len(set(chosen)) == m
                pool_e = [i for i in range(n) if ok[i]]
                pool_i = [i for i in range(n) if not ok[i]]
                picked_e = [i for i in chosen if ok[i]]
                assert len(picked_e) == min(len(pool_e), m)
                pool, picked, size = (pool_e, picked_e, m) if len(pool_e) >= m else \
                    (pool_i, [i for i in chosen if not ok[i]], m - len(pool_e))
                short += len(pool_e) < m
                values, got = [row[i] for i in pool], [row[i] for i in picked]
                if rule == "max_variance" and len(pool_e) < m:  # the whole kept set's variance
                    kept = [row[i] for i in pool_e]
                    best = max(float(np.var(kept + list(c))) for c in itertools.combinations(values, size))
                    assert float(np.var([row[i] for i in chosen])) == pytest.approx(best, abs=1e-12)
                elif objective is not None:
                    assert objective(got) == pytest.approx(_best_subset_value(values, size, objective), abs=1e-12)
                elif rule == "percentile":
                    assert sorted(got) == _percentile_values(values, size)
                checked += 1
    assert checked == 28 * 30 and short > 150


def test_a_short_group_is_filled_for_the_variance_of_the_whole_kept_set():
    """Eligible rewards [0, 0, 0], ineligible [1, 0], m = 4: the three eligible are kept and the
    fourth slot takes the 1 (variance 3/16), not a 0 (variance 0, every advantage 0)."""
    rewards = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0])
    eligible = torch.tensor([True, True, True, False, False])
    assert sorted(select(rewards, 4, eligible=eligible).tolist()) == [0, 1, 2, 3]


@pytest.mark.parametrize("eligible,m,expected_subsets", [
    ([True, False, True, True, True], 2, [(0, 2), (0, 3), (0, 4), (2, 3), (2, 4), (3, 4)]),  # ineligible 1 never
    ([False, True, False, False, False], 3, [(0, 1, 2), (0, 1, 3), (0, 1, 4), (1, 2, 3), (1, 2, 4), (1, 3, 4)]),
])
def test_random_rule_is_uniform_over_the_eligible(eligible, m, expected_subsets):
    """``random`` with an eligibility mask: uniform over the m-subsets of the eligible rollouts;
    short of them, every eligible one plus a uniform choice among the rest."""
    groups = 6000
    idx = select(torch.zeros(groups, 5), m, "random", torch.Generator().manual_seed(0),
                 eligible=torch.tensor([eligible] * groups))
    counts = {}
    for row in idx.tolist():
        key = tuple(sorted(row))
        counts[key] = counts.get(key, 0) + 1
    assert sorted(counts) == expected_subsets
    assert all(abs(c / groups - 1 / len(expected_subsets)) < 0.02 for c in counts.values())


def test_an_unscorable_rollout_does_not_take_a_scorable_ones_place():
    """Rewards [0, 1, None, 0.5], the None keyed at its group's mean: without eligibility the tie
    with 0.5 goes to the lower index, the unscorable one; with it, the three scorable are kept."""
    keys = torch.tensor([0.0, 1.0, 0.5, 0.5])
    assert sorted(select(keys, 3).tolist()) == [0, 1, 2]
    assert sorted(select(keys, 3, eligible=torch.tensor([True, True, False, True])).tolist()) == [0, 1, 3]


def test_every_rollout_eligible_is_select_without_a_mask():
    r = torch.randint(0, 4, (40, 9)).float()
    for rule in ("max_variance", "max_reward", "percentile", "random"):
        a = select(r, 4, rule, torch.Generator().manual_seed(3))
        b = select(r, 4, rule, torch.Generator().manual_seed(3), eligible=torch.ones(40, 9, dtype=torch.bool))
        assert torch.equal(a, b), rule


@pytest.mark.parametrize("eligible", [torch.ones(2, 3, dtype=torch.bool), torch.ones(2, 4)])
def test_a_malformed_eligibility_mask_is_refused(eligible):
    with pytest.raises(ValueError, match="eligible must be a bool tensor shaped like rewards"):
        select(torch.zeros(2, 4), 2, eligible=eligible)
