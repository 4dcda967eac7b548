"""policy_loss against hand-computed values, the policy-gradient identity and micro-batching."""

import math

import pytest
import torch

from podsrl.loss import LOSS_TYPES, policy_loss

# Two completions of lengths 2 and 1 (L = 3), advantages +2 and -1, ratio 1 everywhere.
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
ADV = torch.tensor([2.0, -1.0])


@pytest.mark.parametrize(
    "loss_type,expected",
    [
        ("grpo", (-2.0 + 1.0) / 2),  # per-sequence means -2 and +1, averaged
        ("bnpo", (-2 - 2 + 1) / 3),  # all three tokens
        ("dr_grpo", (-2 - 2 + 1) / (2 * 3)),  # sum / (N * L)
    ],
)
def test_hand_computed_at_ratio_one(loss_type, expected):
    logp = torch.full((2, 3), -1.0)
    loss, stats = policy_loss(logp, ADV, MASK, loss_type=loss_type)
    assert loss.item() == pytest.approx(expected)
    assert stats.clip_fraction.item() == 0.0 and stats.ratio.item() == pytest.approx(1.0)


def test_dr_grpo_uses_max_completion_length():
    loss, _ = policy_loss(torch.zeros(2, 3), ADV, MASK, loss_type="dr_grpo", max_completion_length=4)
    assert loss.item() == pytest.approx(-3 / 8)


def test_clipping_hand_computed():
    old = torch.zeros(2, 1)
    logp = torch.full((2, 1), math.log(1.5))  # ratio 1.5
    mask = torch.ones(2, 1)
    # A=+1: min(1.5, 1.2) = 1.2 (clipped); A=-1: min(-1.5, -1.2) = -1.5 (not clipped)
    loss, stats = policy_loss(logp, torch.tensor([1.0, -1.0]), mask, old_logp=old, loss_type="bnpo")
    assert loss.item() == pytest.approx((-1.2 + 1.5) / 2)
    assert stats.clip_fraction.item() == pytest.approx(0.5)
    # asymmetric clip: epsilon_high 0.6 leaves ratio 1.5 unclipped for A=+1
    loss, stats = policy_loss(logp[:1], torch.tensor([1.0]), mask[:1], old_logp=old[:1], epsilon_high=0.6)
    assert loss.item() == pytest.approx(-1.5) and stats.clip_fraction.item() == 0.0


def test_k3_kl_hand_computed():
    logp = torch.zeros(1, 2)
    ref = torch.tensor([[0.5, 0.0]])
    loss, stats = policy_loss(logp, torch.zeros(1), torch.ones(1, 2), ref_logp=ref, beta=0.1)
    k3 = math.exp(0.5) - 0.5 - 1  # 0.1487...
    assert stats.kl.item() == pytest.approx(k3 / 2)
    assert loss.item() == pytest.approx(0.1 * k3 / 2)
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(logp, torch.zeros(1), torch.ones(1, 2), beta=0.1)


def _logp(theta, tokens):
    return torch.log_softmax(theta, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [N, L]


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_gradient_at_ratio_one_is_advantage_weighted_log_likelihood(loss_type):
    g = torch.Generator().manual_seed(0)
    N, L, V = 4, 5, 7
    theta = torch.randn(N, L, V, generator=g, requires_grad=True)
    tokens = torch.randint(0, V, (N, L), generator=g)
    lengths = torch.tensor([5, 3, 1, 4])
    mask = (torch.arange(L) < lengths[:, None]).float()
    adv = torch.randn(N, generator=g)

    loss, _ = policy_loss(_logp(theta, tokens), adv, mask, loss_type=loss_type, max_completion_length=6)
    (grad,) = torch.autograd.grad(loss, theta)

    # Independent reference: -sum_i w_i A_i sum_t logp_it, with each loss type's weights.
    weighted = adv[:, None] * _logp(theta, tokens) * mask
    if loss_type == "grpo":
        reference = -(weighted.sum(-1) / lengths).mean()
    elif loss_type == "bnpo":
        reference = -weighted.sum() / mask.sum()
    else:
        reference = -weighted.sum() / (N * 6)
    (expected,) = torch.autograd.grad(reference, theta)
    assert torch.allclose(grad, expected, atol=1e-6)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_micro_batches_sum_to_the_full_batch_loss(loss_type):
    g = torch.Generator().manual_seed(1)
    N, L = 6, 4
    logp = -torch.rand(N, L, generator=g)
    old = logp + 0.3 * torch.randn(N, L, generator=g)
    mask = (torch.arange(L) < torch.tensor([4, 2, 1, 3, 4, 2])[:, None]).float()
    adv = torch.randn(N, generator=g)
    full, _ = policy_loss(logp, adv, mask, old_logp=old, loss_type=loss_type)
    parts = [
        policy_loss(logp[s], adv[s], mask[s], old_logp=old[s], loss_type=loss_type,
                    max_completion_length=L, num_sequences=N, num_tokens=mask.sum())[0]
        for s in (slice(0, 2), slice(2, 5), slice(5, 6))
    ]
    assert sum(parts).item() == pytest.approx(full.item(), abs=1e-6)


def test_padding_never_contributes():
    g = torch.Generator().manual_seed(2)
    logp = (-torch.rand(3, 4, generator=g)).requires_grad_()
    mask = torch.tensor([[1.0, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]])
    adv = torch.tensor([1.0, -0.5, 2.0])
    ref = -torch.rand(3, 4, generator=g)
    for loss_type in LOSS_TYPES:
        base, _ = policy_loss(logp, adv, mask, ref_logp=ref, beta=0.05, loss_type=loss_type)
        garbage = torch.where(mask.bool(), logp.detach(), torch.full_like(mask, -50.0))
        other, _ = policy_loss(garbage, adv, mask, ref_logp=ref, beta=0.05, loss_type=loss_type)
        assert other.item() == pytest.approx(base.item())
        (grad,) = torch.autograd.grad(base, logp)
        assert torch.all(grad[mask == 0] == 0)


def test_unknown_loss_type_rejected():
    with pytest.raises(ValueError, match="loss_type"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), loss_type="dapo")


def test_sampler_correction_hand_computed():
    """Each token's term weighted by min(π_old / μ, C), from the sampler's log-probs; no gradient
    through the weight; the mean weight and the share capped in the statistics."""
    logp = torch.full((2, 3), -1.0, requires_grad=True)
    # token ratios π/μ: e^0.5 (kept), e^2 (capped at 3), padding; e^-1 (kept)
    sampler = torch.tensor([[-1.5, -3.0, -9.0], [0.0, -9.0, -9.0]])
    loss, stats = policy_loss(logp, ADV, MASK, loss_type="bnpo", sampler_logp=sampler, sampling_cap=3.0)
    weights = [math.exp(0.5), 3.0, math.exp(-1.0)]
    assert loss.item() == pytest.approx((-2 * weights[0] - 2 * weights[1] + 1 * weights[2]) / 3)
    assert stats.sampling_ratio.item() == pytest.approx(sum(weights) / 3)
    assert stats.sampling_clipped.item() == pytest.approx(1 / 3)
    loss.backward()  # d loss / d logp = -A * weight / 3 at ratio 1: the weight is a constant
    expected = torch.tensor([[-2 * weights[0], -2 * weights[1], 0.0], [weights[2], 0.0, 0.0]]) / 3
    assert torch.allclose(logp.grad, expected)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_sampler_correction_is_one_for_the_policy_itself(loss_type):
    """The sampler's log-probs equal to the policy's: weight 1, the loss as without a correction."""
    logp = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    plain, _ = policy_loss(logp, ADV, MASK, loss_type=loss_type, beta=0.1, ref_logp=logp - 0.1)
    corrected, stats = policy_loss(logp, ADV, MASK, loss_type=loss_type, beta=0.1, ref_logp=logp - 0.1,
                                   sampler_logp=logp.clone())
    assert abs(corrected.item() - plain.item()) < 1e-6
    assert abs(stats.sampling_ratio.item() - 1.0) < 1e-6 and stats.sampling_clipped.item() == 0.0
