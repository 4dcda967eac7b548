"""Advantages against hand-computed values and TRL's GRPO formula."""

import math

import pytest
import torch

from podsrl.advantages import group_advantages


def test_hand_computed_grpo():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    std = math.sqrt((4 * 0.25) / 3)  # sample std, as TRL: sqrt(1/3)
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5]]) / (std + 1e-4)
    assert torch.allclose(group_advantages(r), expected)


def test_hand_computed_dr_grpo_only_centres():
    r = torch.tensor([3.0, 1.0, 2.0])
    assert torch.allclose(group_advantages(r, scale="none"), torch.tensor([1.0, -1.0, 0.0]))


def test_matches_trl_formula_on_random_groups():
    g = torch.Generator().manual_seed(0)
    r = torch.rand(7, 16, generator=g)
    # TRL: mean/std over each group (torch.std, unbiased), advantages = (r - mean) / (std + 1e-4)
    trl = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)
    assert torch.allclose(group_advantages(r), trl, atol=1e-6)


@pytest.mark.parametrize("scale", ["group", "none"])
def test_constant_groups_give_exact_zeros(scale):
    r = torch.tensor([[0.1, 0.1, 0.1], [1.0, 0.0, 1.0], [7.0, 7.0, 7.0]])
    adv = group_advantages(r, scale=scale)
    assert torch.isfinite(adv).all()
    assert torch.equal(adv[0], torch.zeros(3)) and torch.equal(adv[2], torch.zeros(3))
    assert adv[1].abs().sum() > 0


def test_single_rollout_group_is_zero():
    assert torch.equal(group_advantages(torch.tensor([[0.7], [0.2]])), torch.zeros(2, 1))


def test_unknown_scale_rejected():
    with pytest.raises(ValueError, match="scale"):
        group_advantages(torch.zeros(1, 2), scale="batch")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_rewards_refused_as_select_refuses_them(bad):
    with pytest.raises(ValueError, match="NaN or inf"):
        group_advantages(torch.tensor([[1.0, 0.0, bad, 1.0]]))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_rewards_are_taken_as_floats(dtype):
    r = torch.tensor([[1, 0, 0, 1]], dtype=dtype)
    std = math.sqrt((4 * 0.25) / 3)
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5]]) / (std + 1e-4)
    assert torch.allclose(group_advantages(r), expected)


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4)])
@pytest.mark.parametrize("scale", ["group", "none"])
def test_empty_groups_give_empty_advantages(shape, scale):
    adv = group_advantages(torch.zeros(shape, dtype=torch.int64), scale)
    assert adv.shape == shape and adv.dtype == torch.float32
