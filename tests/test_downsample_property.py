"""select() with an eligibility mask, max_variance: the kept set's variance against brute force
over every admissible subset, on groups that hypothesis draws (ties, short groups, extremes)."""

import itertools

import numpy as np
import pytest
import torch

from podsrl.downsample import select

pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402


def _check_whole_set_fill(rewards: list[float], eligible: list[bool], m: int) -> None:
    idx = select(torch.tensor(rewards, dtype=torch.float64), m, eligible=torch.tensor(eligible)).tolist()
    pool_e = [i for i, ok in enumerate(eligible) if ok]
    pool_i = [i for i, ok in enumerate(eligible) if not ok]
    assert len(set(idx)) == m
    if len(pool_e) >= m:
        candidates = itertools.combinations(pool_e, m)
    else:
        assert set(pool_e) <= set(idx)
        candidates = (tuple(pool_e) + c for c in itertools.combinations(pool_i, m - len(pool_e)))
    best = max(float(np.var([rewards[i] for i in c])) for c in candidates)
    assert float(np.var([rewards[i] for i in idx])) == pytest.approx(best, abs=1e-9)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_max_variance_with_eligibility_against_brute_force_property(data):
    """Any group of up to 9 rollouts (rewards from a few values, ties included, or any floats),
    any eligibility, any m: the kept set's variance is the best of every admissible subset's."""
    n = data.draw(st.integers(1, 9))
    values = st.sampled_from([0.0, 0.5, 1.0, -1.0]) | st.floats(-100, 100, allow_nan=False)
    rewards = data.draw(st.lists(values, min_size=n, max_size=n))
    eligible = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    _check_whole_set_fill(rewards, eligible, data.draw(st.integers(1, n)))
