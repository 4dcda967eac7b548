"""policy_loss equals TRL 1.16's own ``GRPOTrainer._compute_loss``, loss and gradient, for every
loss type x importance-sampling level x vLLM importance-sampling mode x beta x num_iterations,
with uneven completion lengths and two gradient-accumulation steps."""

import math
from types import SimpleNamespace

import pytest
import torch

from podsrl.loss import LOSS_TYPES, policy_loss

trl = pytest.importorskip("trl")
from trl import GRPOTrainer  # noqa: E402

N, L, MICRO, ACCUMULATION = 6, 5, 3, 2  # two micro-batches of three completions
LENGTHS = torch.tensor([5, 2, 4, 1, 3, 5])
CAP = 3.0
MODES = [None, "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]  # None: no vLLM correction


def tensors(mu: int, seed: int = 0) -> dict:
    """One optimizer batch in float64: the policy's log-probs, the old policy's (the same at the
    first pass over a generation, mu = 1; moved by an update at the second, mu = 2), the reference's
    and the sampler's, uneven lengths with -inf-free garbage in the padding."""
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(L) < LENGTHS[:, None]).double()  # [N, L]
    logp = -torch.rand(N, L, generator=g, dtype=torch.float64) * 2 - 0.05
    old = logp.clone() if mu == 1 else logp + 0.35 * torch.randn(N, L, generator=g, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(N, L, generator=g, dtype=torch.float64)
    sampler = old + 0.5 * torch.randn(N, L, generator=g, dtype=torch.float64)
    adv = torch.randn(N, generator=g, dtype=torch.float64)
    garbage = lambda t: torch.where(mask.bool(), t, torch.full_like(t, -7.0))
    return dict(mask=mask, logp=garbage(logp), old=garbage(old), ref=garbage(ref), sampler=garbage(sampler), adv=adv)


def trl_ratio(old, sampler, mask, mode):
    """vLLM's importance-sampling ratio as TRL's ``_generate_and_score_completions`` computes it
    (grpo_trainer.py, TRL 1.16), written out here from that source: the loss reads it as an input."""
    diff = torch.nan_to_num((old - sampler) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=None, max=CAP)
    return ratio.masked_fill((ratio < -math.inf) | (ratio > CAP), 0.0)


def trl_trainer(loss_type, level, mode, beta):
    """A ``GRPOTrainer`` holding just what ``_compute_loss`` reads, on one process, in training."""
    t = object.__new__(GRPOTrainer)
    t.args = SimpleNamespace(use_bias_correction_kl=True, delta=None, sapo_temperature_pos=1.0,
                             sapo_temperature_neg=1.05, vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0,
                             vespo_lambda_neg=2.0, steps_per_generation=ACCUMULATION)
    t.loss_type, t.importance_sampling_level, t.beta = loss_type, level, beta
    t.epsilon_low, t.epsilon_high = 0.2, 0.28 if loss_type != "cispo" else 4.0
    t.use_vllm, t.vllm_importance_sampling_correction = mode is not None, mode is not None
    t.aux_loss_enabled, t.top_entropy_quantile, t.off_policy_mask_threshold = False, 1.0, None
    t._entropy_bonus_enabled = False
    t.max_completion_length = L
    t.current_gradient_accumulation_steps = ACCUMULATION
    t.model = SimpleNamespace(training=True)
    t.accelerator = SimpleNamespace(num_processes=1, gather=lambda x: x, gather_for_metrics=lambda x: x,
                                    reduce=lambda x, reduction="sum": x)
    t._metrics = {"train": __import__("collections").defaultdict(list)}
    return t


def trl_loss(trainer, x, leaf, mu, mode):
    """TRL's loss of the optimizer batch, summed over its micro-batches, backward into ``leaf``."""
    total = 0.0
    ratio = None if mode is None else trl_ratio(x["old"], x["sampler"], x["mask"], mode)
    for s in range(0, N, MICRO):
        rows = slice(s, s + MICRO)
        logp = torch.where(x["mask"][rows].bool(), leaf[rows], leaf[rows].detach())  # TRL reads padding too
        trainer._get_per_token_logps_and_entropies = lambda *a, _l=logp, **k: (_l, torch.zeros_like(_l), None)
        inputs = dict(prompt_ids=torch.zeros(MICRO, 1, dtype=torch.long), prompt_mask=torch.ones(MICRO, 1),
                      completion_ids=torch.zeros(MICRO, L, dtype=torch.long), completion_mask=x["mask"][rows],
                      advantages=x["adv"][rows], num_items_in_batch=x["mask"].sum(),
                      ref_per_token_logps=x["ref"][rows])
        if mu > 1 or mode is not None:  # TRL computes the old log-probs for either
            inputs["old_per_token_logps"] = x["old"][rows]
        if ratio is not None:
            inputs["importance_sampling_ratio"] = ratio[rows]
        loss = trainer._compute_loss(None, inputs)
        loss.backward()
        total += loss.item()
    return total


def pods_loss(loss_type, level, mode, beta, x, leaf, mu):
    total = 0.0
    for s in range(0, N, MICRO):
        rows = slice(s, s + MICRO)
        loss, _ = policy_loss(
            leaf[rows], x["adv"][rows], x["mask"][rows], old_logp=x["old"][rows] if mu > 1 else None,
            ref_logp=x["ref"][rows], beta=beta, epsilon_low=0.2, epsilon_high=0.28 if loss_type != "cispo" else 4.0,
            loss_type=loss_type, max_completion_length=L, num_sequences=N, num_tokens=x["mask"].sum(),
            sampler_logp=None if mode is None else x["sampler"][rows], sampling_cap=CAP,
            importance_sampling_level=level, vllm_importance_sampling_mode=mode or "sequence_mask",
            use_bias_correction_kl=True, accumulation_steps=ACCUMULATION)
        loss.backward()
        total += loss.item()
    return total


RESULTS: dict = {}


@pytest.mark.parametrize("mu", [1, 2])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", list(LOSS_TYPES))
def test_policy_loss_equals_trls_compute_loss(loss_type, level, mode, beta, mu):
    x = tensors(mu)
    if loss_type == "vespo" and mode is not None and mode.startswith("sequence"):
        with pytest.raises(ValueError, match="vespo"):  # TRL refuses the pair too (in its __init__)
            pods_loss(loss_type, level, mode, beta, x, x["logp"].clone().requires_grad_(), mu)
        return
    theirs_leaf = x["logp"].clone().requires_grad_()
    ours_leaf = x["logp"].clone().requires_grad_()
    theirs = trl_loss(trl_trainer(loss_type, level, mode, beta), x, theirs_leaf, mu, mode)
    ours = pods_loss(loss_type, level, mode, beta, x, ours_leaf, mu)
    gap = max(abs(ours - theirs), float((ours_leaf.grad - theirs_leaf.grad).abs().max()))
    RESULTS[(loss_type, level, mode, beta, mu)] = gap
    assert theirs != 0.0 and theirs_leaf.grad.abs().sum() > 0  # a case that tests something
    assert abs(ours - theirs) < 1e-6
    assert torch.allclose(ours_leaf.grad, theirs_leaf.grad, atol=1e-6, rtol=0)


def test_mu_two_moves_the_ratio_so_the_clip_acts():
    """At the second pass over a generation (mu = 2) the weights are off 1 and the clip cuts."""
    x = tensors(2)
    _, stats = policy_loss(x["logp"], x["adv"], x["mask"], old_logp=x["old"], epsilon_high=0.28, loss_type="dapo")
    assert stats.clip_low > 0 and stats.clip_high > 0
    assert stats.clip_region == pytest.approx(float(stats.clip_low + stats.clip_high))
