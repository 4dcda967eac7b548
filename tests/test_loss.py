"""policy_loss against hand-computed values, the policy-gradient identity and micro-batching
(tests/test_loss_trl.py compares it with TRL's own loss)."""

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
        ("bnpo", (-2 - 2 + 1) / 3),  # all three tokens (one micro-batch)
        ("dapo", (-2 - 2 + 1) / 3),  # all three tokens
        ("dr_grpo", (-2 - 2 + 1) / (2 * 3)),  # sum / (N * L)
        ("luspo", (-2 - 2 + 1) / 2),  # per-sequence sums, averaged
        ("sapo", (-2 * 2 + 2 / 1.05) / 2),  # the soft gate at ratio 1 is 2 A / tau, per sequence then mean
        ("cispo", (-2 * -2 - 2 * -2 + 1 * -1) / 3 * 0.2),  # -min(w, eps_high) A logp: 0.2 A, token mean
        ("vespo", (-2 * -2 - 2 * -2 + 1 * -1) / 3),  # -phi(1) A logp with phi(1) = 1, token mean
    ],
)
def test_hand_computed_at_ratio_one(loss_type, expected):
    logp = torch.full((2, 3), -1.0)
    logp[0, 0] = -2.0  # cispo and vespo read the log-probs themselves
    loss, stats = policy_loss(logp, ADV, MASK, loss_type=loss_type)
    if loss_type in ("cispo", "vespo"):
        scale = 0.2 if loss_type == "cispo" else 1.0
        expected = -(2 * -2 + 2 * -1 - 1 * -1) / 3 * scale
    assert loss.item() == pytest.approx(expected)
    # cispo counts w > eps_high (1 > 0.2 here) as clipped, as TRL's cispo_clip_ratio does
    assert stats.clip_region.item() == pytest.approx(2 / 3 if loss_type == "cispo" else 0.0)
    assert stats.ratio.item() == pytest.approx(1.0)


def test_dr_grpo_uses_max_completion_length():
    loss, _ = policy_loss(torch.zeros(2, 3), ADV, MASK, loss_type="dr_grpo", max_completion_length=4)
    assert loss.item() == pytest.approx(-3 / 8)


def test_clipping_hand_computed():
    old = torch.zeros(2, 1)
    logp = torch.full((2, 1), math.log(1.5))  # ratio 1.5
    mask = torch.ones(2, 1)
    # A=+1: min(1.5, 1.2) = 1.2 (clipped); A=-1: min(-1.5, -1.2) = -1.5 (not clipped)
    loss, stats = policy_loss(logp, torch.tensor([1.0, -1.0]), mask, old_logp=old, loss_type="dapo")
    assert loss.item() == pytest.approx((-1.2 + 1.5) / 2)
    assert stats.clip_high.item() == pytest.approx(0.5) and stats.clip_low.item() == 0.0
    assert stats.clip_region.item() == pytest.approx(0.5)
    # asymmetric clip: epsilon_high 0.6 leaves ratio 1.5 unclipped for A=+1
    loss, stats = policy_loss(logp[:1], torch.tensor([1.0]), mask[:1], old_logp=old[:1], epsilon_high=0.6)
    assert loss.item() == pytest.approx(-1.5) and stats.clip_region.item() == 0.0
    # ratio 0.5 with A=-1 is clipped low: -min(-0.5, -0.8) = 0.8
    loss, stats = policy_loss(torch.full((1, 1), math.log(0.5)), torch.tensor([-1.0]), mask[:1], old_logp=old[:1])
    assert loss.item() == pytest.approx(0.8) and stats.clip_low.item() == 1.0 and stats.clip_high.item() == 0.0


def test_sequence_level_weight_is_the_geometric_mean_ratio():
    """GSPO: one weight per sequence, exp of the mean log-ratio over its tokens: here
    exp((log 2 + log 0.5 + log 1.5) / 3) = 1.5^(1/3), inside the clip range, A = 1."""
    old = torch.zeros(1, 4)
    logp = torch.tensor([[math.log(2.0), math.log(0.5), math.log(1.5), -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, stats = policy_loss(logp, torch.tensor([1.0]), mask, old_logp=old, importance_sampling_level="sequence",
                              epsilon_high=0.5)
    assert loss.item() == pytest.approx(-(1.5 ** (1 / 3)))
    assert stats.ratio.item() == pytest.approx(1.5 ** (1 / 3))


def test_k3_kl_hand_computed():
    logp = torch.zeros(1, 2)
    ref = torch.tensor([[0.5, 0.0]])
    loss, stats = policy_loss(logp, torch.zeros(1), torch.ones(1, 2), ref_logp=ref, beta=0.1)
    k3 = math.exp(0.5) - 0.5 - 1  # 0.1487...
    assert stats.kl.item() == pytest.approx(k3 / 2)
    assert loss.item() == pytest.approx(0.1 * k3 / 2)
    # bias-corrected (the default) or not, the value on-policy is the same; the gradient is not:
    # d/dlogp [w k3] at w = 1 is k3 + (1 - exp(ref - logp)) against (1 - exp(ref - logp)) alone
    for corrected in (True, False):
        x = logp.clone().requires_grad_()
        loss, _ = policy_loss(x, torch.zeros(1), torch.ones(1, 2), ref_logp=ref, beta=0.1,
                              use_bias_correction_kl=corrected)
        loss.backward()
        slope = torch.tensor([1 - math.exp(0.5) + (k3 if corrected else 0.0), 0.0])
        assert torch.allclose(x.grad[0], 0.1 * slope / 2)
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

    loss, _ = policy_loss(_logp(theta, tokens), adv, mask, loss_type=loss_type, max_completion_length=6,
                          epsilon_high=5.0)
    (grad,) = torch.autograd.grad(loss, theta)

    # Independent reference: -sum_i w_i A_i sum_t logp_it, with each loss type's weights.
    weighted = adv[:, None] * _logp(theta, tokens) * mask
    if loss_type in ("grpo", "sapo"):
        reference = -(weighted.sum(-1) / lengths).mean()
    elif loss_type in ("bnpo", "dapo", "cispo", "vespo"):
        reference = -weighted.sum() / mask.sum()
    elif loss_type == "luspo":
        reference = -weighted.sum() / N
    else:
        reference = -weighted.sum() / (N * 6)
    (expected,) = torch.autograd.grad(reference, theta)
    assert torch.allclose(grad, expected, atol=1e-6)


@pytest.mark.parametrize("loss_type", [t for t in LOSS_TYPES if t != "bnpo"])
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


def test_bnpo_is_each_micro_batchs_token_mean_over_the_accumulation_steps():
    """TRL's bnpo: two micro-batches of 3 and 1 tokens, each's token mean halved; the whole
    optimizer batch's token mean is dapo's."""
    logp = torch.full((2, 3), -1.0)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, 3.0])
    parts = [policy_loss(logp[i : i + 1], adv[i : i + 1], mask[i : i + 1], loss_type="bnpo", accumulation_steps=2,
                         num_tokens=4, num_sequences=2)[0].item() for i in range(2)]
    assert sum(parts) == pytest.approx((-1.0 + -3.0) / 2)
    dapo = [policy_loss(logp[i : i + 1], adv[i : i + 1], mask[i : i + 1], loss_type="dapo", accumulation_steps=2,
                        num_tokens=4, num_sequences=2)[0].item() for i in range(2)]
    assert sum(dapo) == pytest.approx((-3 * 1.0 - 3.0) / 4)


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


def test_unknown_names_rejected():
    with pytest.raises(ValueError, match="loss_type"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), loss_type="ppo")
    with pytest.raises(ValueError, match="importance_sampling_level"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), importance_sampling_level="batch")
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), vllm_importance_sampling_mode="token")


@pytest.mark.parametrize("shape", [(2, 1), (1, 2), (3,), ()])
def test_advantages_of_another_shape_are_refused_not_broadcast(shape):
    """[N, 1] advantages would broadcast against [N, L] into a different loss; refused."""
    with pytest.raises(ValueError, match="advantages must be"):
        policy_loss(torch.zeros(2, 3), torch.ones(shape), MASK)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_minus_infinity_in_padding_gives_no_nan(loss_type):
    """Padding holding -inf (a masked logit) in the policy's, the old policy's, the reference's
    or the sampler's log-probs: the loss and the gradient are those of finite padding."""
    logp = -torch.rand(2, 3, generator=torch.Generator().manual_seed(3))
    pad = ~MASK.bool()
    inf = lambda t: torch.where(pad, torch.full_like(t, -math.inf), t)
    results = []
    for fill in (lambda t: t, inf):
        x = fill(logp.clone()).requires_grad_()
        loss, stats = policy_loss(x, ADV, MASK, old_logp=fill(logp - 0.1), ref_logp=fill(logp + 0.2), beta=0.04,
                                  sampler_logp=fill(logp - 0.05), loss_type=loss_type, epsilon_high=0.28,
                                  vllm_importance_sampling_mode="token_mask" if loss_type == "vespo" else "sequence_mask")
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
        assert all(torch.isfinite(v).all() for v in stats)
        results.append((loss.item(), x.grad))
    assert results[0][0] == pytest.approx(results[1][0]) and torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("empty", ["no rows", "all masked"])
def test_an_empty_batch_has_loss_zero_with_a_gradient(loss_type, empty):
    N = 0 if empty == "no rows" else 2
    x = torch.full((N, 3), -1.0, requires_grad=True)
    loss, stats = policy_loss(x, torch.ones(N), torch.zeros(N, 3), ref_logp=torch.zeros(N, 3), beta=0.04,
                              loss_type=loss_type, num_sequences=N, num_tokens=0)
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert torch.equal(x.grad, torch.zeros_like(x))
    assert all(torch.isfinite(v).all() for v in stats)


def test_sampler_correction_hand_computed():
    """Each token's term weighted by min(π_old / μ, C), from the sampler's log-probs; no gradient
    through the weight; the mean weight and the share capped in the statistics."""
    logp = torch.full((2, 3), -1.0, requires_grad=True)
    # token ratios π/μ: e^0.5 (kept), e^2 (capped at 3), padding; e^-1 (kept)
    sampler = torch.tensor([[-1.5, -3.0, -9.0], [0.0, -9.0, -9.0]])
    loss, stats = policy_loss(logp, ADV, MASK, loss_type="dapo", sampler_logp=sampler, sampling_cap=3.0,
                              vllm_importance_sampling_mode="token_truncate")
    weights = [math.exp(0.5), 3.0, math.exp(-1.0)]
    assert loss.item() == pytest.approx((-2 * weights[0] - 2 * weights[1] + 1 * weights[2]) / 3)
    assert stats.sampling_ratio.item() == pytest.approx(sum(weights) / 3)
    assert stats.sampling_clipped.item() == pytest.approx(1 / 3)
    loss.backward()  # d loss / d logp = -A * weight / 3 at ratio 1: the weight is a constant
    expected = torch.tensor([[-2 * weights[0], -2 * weights[1], 0.0], [weights[2], 0.0, 0.0]]) / 3
    assert torch.allclose(logp.grad, expected)


def test_sequence_mask_correction_hand_computed():
    """TRL's default mode: one ratio per sequence, exp of the summed log-ratio; a sequence whose
    ratio passes the cap is masked out (weight 0), the other keeps its weight."""
    logp = torch.full((2, 3), -1.0)
    sampler = torch.tensor([[-1.5, -2.0, -9.0], [-0.5, -9.0, -9.0]])  # ratios e^1.5 > 3 (masked), e^-0.5
    loss, stats = policy_loss(logp, ADV, MASK, loss_type="dapo", sampler_logp=sampler, sampling_cap=3.0)
    assert loss.item() == pytest.approx(1 * math.exp(-0.5) / 3)
    assert stats.sampling_ratio.item() == pytest.approx(math.exp(-0.5) / 3)  # token-weighted: 0, 0, e^-0.5
    assert stats.sampling_clipped.item() == pytest.approx(2 / 3)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_sampler_correction_is_one_for_the_policy_itself(loss_type):
    """The sampler's log-probs equal to the policy's: weight 1, the loss as without a correction."""
    logp = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    mode = "token_truncate" if loss_type == "vespo" else "sequence_mask"
    plain, _ = policy_loss(logp, ADV, MASK, loss_type=loss_type, beta=0.1, ref_logp=logp - 0.1)
    corrected, stats = policy_loss(logp, ADV, MASK, loss_type=loss_type, beta=0.1, ref_logp=logp - 0.1,
                                   sampler_logp=logp.clone(), vllm_importance_sampling_mode=mode)
    assert abs(corrected.item() - plain.item()) < 1e-6
    assert abs(stats.sampling_ratio.item() - 1.0) < 1e-6 and stats.sampling_clipped.item() == 0.0
