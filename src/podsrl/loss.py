"""The GRPO policy loss: a per-token clipped surrogate with an optional KL penalty.

For token t of completion i with ratio ρ = exp(log π_θ − log π_old) and advantage A_i
(Shao et al., 2024, eq. 3; asymmetric clipping from DAPO, Yu et al., 2025):

    ℓ_{i,t} = −min(ρ A_i, clip(ρ, 1 − ε_low, 1 + ε_high) A_i) + β · KL_{i,t},
    KL_{i,t} = exp(log π_ref − log π_θ) − (log π_ref − log π_θ) − 1        (k3 estimator)

Rollouts sampled by another engine (vLLM: other kernels, often another precision) come with the
log-probs the sampler gave its tokens, log μ. Each token's term is then weighted by the truncated
importance ratio of the policy that generated against the sampler (TRL's
``vllm_importance_sampling_correction``, mode ``token_truncate``; Yao et al., 2025, "Your
efficient RL framework secretly brings you off-policy RL training"):

    ℓ_{i,t} ← min(exp(log π_old − log μ), C) · ℓ_{i,t}     (before the KL term is added)

``loss_type`` says how the masked per-token terms are averaged:

    grpo     mean over each sequence's tokens, then over sequences
    bnpo     mean over all tokens of the batch
    dr_grpo  sum over tokens / (sequences × max completion length)   (Liu et al., 2025)

For gradient accumulation the normalisers (``num_sequences``, ``num_tokens``) can be given for
the whole optimizer batch, so that summing micro-batch losses gives the full-batch loss exactly.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

LossType = Literal["grpo", "bnpo", "dr_grpo"]
LOSS_TYPES: tuple[str, ...] = ("grpo", "bnpo", "dr_grpo")


class LossStats(NamedTuple):
    """Detached statistics of one loss evaluation, each averaged over unmasked tokens."""

    clip_fraction: Tensor  # fraction of tokens where the clip is active
    kl: Tensor  # mean k3 KL to the reference policy (0 when none)
    ratio: Tensor  # mean importance ratio
    num_tokens: Tensor  # unmasked tokens in this call
    sampling_ratio: Tensor  # mean truncated sampler correction min(π_old / μ, C) (1 without one)
    sampling_clipped: Tensor  # fraction of tokens whose π_old / μ exceeds C (0 without a correction)


def policy_loss(
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    old_logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    loss_type: LossType = "grpo",
    max_completion_length: int | None = None,
    num_sequences: int | None = None,
    num_tokens: int | float | None = None,
    sampler_logp: Tensor | None = None,
    sampling_cap: float = 3.0,
) -> tuple[Tensor, LossStats]:
    """Clipped-surrogate GRPO loss of a (micro-)batch of completions.

    Args:
        logp: ``[N, L]`` log-probabilities of the completion tokens under the policy (with grad).
        advantages: ``[N]`` advantage of each completion.
        mask: ``[N, L]`` 1 for completion tokens, 0 for padding (never contributes).
        old_logp: ``[N, L]`` log-probs under the policy that generated; ``None`` = ``logp``
            detached (one update per batch, ratio 1).
        ref_logp: ``[N, L]`` log-probs under the reference policy; needed when ``beta > 0``.
        beta: weight of the KL penalty.
        epsilon_low, epsilon_high: clip range ``[1 − ε_low, 1 + ε_high]``.
        loss_type: ``grpo``, ``bnpo`` or ``dr_grpo`` (see the module docstring).
        max_completion_length: the ``dr_grpo`` length constant; defaults to ``L``.
        num_sequences: sequences in the whole optimizer batch (``grpo``, ``dr_grpo``); default N.
        num_tokens: unmasked tokens in the whole optimizer batch (``bnpo``); default this call's.
        sampler_logp: ``[N, L]`` log-probs the sampler gave its tokens; ``None``: the policy
            sampled them itself (no correction).
        sampling_cap: C, the truncation of the sampler correction.

    Returns:
        the scalar loss and :class:`LossStats`.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; known: {', '.join(LOSS_TYPES)}")
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp")
    mask = mask.to(logp.dtype)  # [N, L]
    old_logp = logp.detach() if old_logp is None else old_logp
    adv = advantages.to(logp.dtype).unsqueeze(-1)  # [N, 1]

    ratio = torch.exp(logp - old_logp)  # [N, L]
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)  # [N, L]
    per_token = -torch.min(ratio * adv, clipped * adv)  # [N, L]
    sampling = torch.ones_like(logp)
    if sampler_logp is not None:
        drift = torch.nan_to_num((old_logp - sampler_logp.to(old_logp.dtype)) * mask, nan=0.0)  # [N, L]
        sampling = torch.exp(drift).detach()  # π_old / μ, no gradient
        per_token = per_token * sampling.clamp(max=sampling_cap)
    kl = torch.zeros_like(logp)
    if beta > 0:
        delta = ref_logp - logp  # [N, L]
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + beta * kl

    N, L = logp.shape
    masked = per_token * mask  # [N, L]
    if loss_type == "grpo":
        seq_mean = masked.sum(-1) / mask.sum(-1).clamp(min=1)  # [N]
        loss = seq_mean.sum() / (num_sequences or N)
    elif loss_type == "bnpo":
        loss = masked.sum() / max(float(num_tokens or mask.sum()), 1.0)
    else:  # dr_grpo
        loss = masked.sum() / ((num_sequences or N) * (max_completion_length or L))

    with torch.no_grad():
        tokens = mask.sum().clamp(min=1)
        is_clipped = ((ratio < 1 - epsilon_low) & (adv < 0)) | ((ratio > 1 + epsilon_high) & (adv > 0))
        stats = LossStats(
            clip_fraction=(is_clipped * mask).sum() / tokens,
            kl=(kl * mask).sum() / tokens,
            ratio=(ratio * mask).sum() / tokens,
            num_tokens=mask.sum(),
            sampling_ratio=(sampling.clamp(max=sampling_cap) * mask).sum() / tokens,
            sampling_clipped=((sampling > sampling_cap) * mask).sum() / tokens,
        )
    return loss, stats
