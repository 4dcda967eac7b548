"""The policy loss of GRPO and its variants, every TRL 1.16 ``loss_type``, under TRL's meanings.

For token t of completion i (log-probs from the tempered logits, ``logits / T``, T the rollout
temperature, as the rollouts were sampled):

    ℓ_{i,t} = surrogate(w, A_i, ℓ_θ) · ρ_{i,t} + β · KL_{i,t}
    KL_{i,t} = (exp(ℓ_ref − ℓ_θ) − (ℓ_ref − ℓ_θ) − 1) · w          (k3; · w with use_bias_correction_kl)

- w, the importance weight of the policy against the one that generated (``old_logp``; without
  one, ``logp`` detached: w = 1, one update per generation), per token or per sequence
  (``importance_sampling_level``; GSPO);
- the surrogate and the aggregation of the masked terms by ``loss_type`` (the table in
  :mod:`podsrl.loss_terms`: grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo);
- ρ, vLLM's importance-sampling correction of a sampler μ that is not the policy (its log-probs
  ``sampler_logp``): ``exp(ℓ_old − ℓ_μ)`` per token or per sequence, truncated at the cap or
  masked beyond it (``vllm_importance_sampling_mode``, :func:`importance_sampling_ratio`); vespo
  folds it into its own weight instead;
- the KL term multiplied by w (``use_bias_correction_kl``, DeepSeek-V3.2, arXiv 2512.02556): its
  gradient is then the unbiased reverse-KL gradient; on-policy its value is unchanged.

For gradient accumulation the normalisers of the whole optimizer batch are given
(``num_sequences``, ``num_tokens``, ``accumulation_steps``), so that the micro-batch losses add up to
the optimizer batch's loss as TRL defines it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from podsrl.loss_terms import (
    AGGREGATIONS, IMPORTANCE_SAMPLING_MODES, LOSS_TYPES, SURROGATES, ImportanceSamplingLevel,
    ImportanceSamplingMode, LossParams, LossType, Normalisers, Tokens, importance_sampling_ratio, importance_weight,
)

__all__ = ["LOSS_TYPES", "IMPORTANCE_SAMPLING_MODES", "LossStats", "importance_sampling_ratio", "policy_loss"]


class LossStats(NamedTuple):
    """Detached statistics of one loss evaluation, each averaged over unmasked tokens."""

    clip_low: Tensor  # fraction of tokens clipped at 1 − ε_low (A < 0); TRL's clip_ratio/low_mean
    clip_high: Tensor  # clipped at 1 + ε_high (A > 0; cispo: w > ε_high); clip_ratio/high_mean
    clip_region: Tensor  # either; clip_ratio/region_mean
    kl: Tensor  # mean k3 KL to the reference policy, as added to the loss (0 when none)
    ratio: Tensor  # mean importance weight w
    num_tokens: Tensor  # unmasked tokens in this call
    sampling_ratio: Tensor  # mean sampler correction ρ (1 without one)
    sampling_clipped: Tensor  # fraction of tokens whose ρ is outside the cap (0 without a correction)


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
    sampling_cap: float | None = 3.0,
    importance_sampling_level: ImportanceSamplingLevel = "token",
    vllm_importance_sampling_mode: ImportanceSamplingMode = "sequence_mask",
    use_bias_correction_kl: bool = True,
    accumulation_steps: int = 1,
    micro_batch_tokens: int | float | None = None,
    **params: float,
) -> tuple[Tensor, LossStats]:
    """The policy loss of a (micro-)batch of completions (module docstring).

    Args:
        logp: ``[N, L]`` log-probabilities of the completion tokens under the policy (with grad).
        advantages: ``[N]`` advantage of each completion (any other shape is refused).
        mask: ``[N, L]`` 1 for completion tokens, 0 for padding (never contributes, whatever
            ``logp``, ``old_logp``, ``ref_logp`` hold there, -inf included).
        old_logp: ``[N, L]`` log-probs under the policy that generated; ``None`` = ``logp``
            detached (the first pass over a generation: w = 1).
        ref_logp: ``[N, L]`` log-probs under the reference policy; needed when ``beta > 0``.
        beta: weight of the KL penalty.
        epsilon_low, epsilon_high: clip range ``[1 − ε_low, 1 + ε_high]`` (cispo: ε_high caps w).
        loss_type: a name in :data:`LOSS_TYPES` (:mod:`podsrl.loss_terms`).
        max_completion_length: the ``dr_grpo`` length constant; defaults to ``L``.
        num_sequences: sequences in the whole optimizer batch (grpo, sapo, dr_grpo, luspo); default N.
        num_tokens: unmasked tokens in the whole optimizer batch (dapo, cispo, vespo); default this call's.
        sampler_logp: ``[N, L]`` log-probs the sampler gave its tokens; ``None``: the policy
            sampled them itself (no correction).
        sampling_cap: the sampler correction's bound C_max (TRL's
            ``vllm_importance_sampling_clip_max``); ``None``: no bound.
        importance_sampling_level: ``token`` or ``sequence`` (GSPO).
        vllm_importance_sampling_mode: ``token_truncate``, ``token_mask``, ``sequence_truncate``
            or ``sequence_mask`` (TRL's default).
        use_bias_correction_kl: multiply the KL term by w (TRL's default).
        accumulation_steps: micro-batches in the optimizer step (bnpo divides by it).
        micro_batch_tokens: unmasked tokens of this micro-batch (bnpo); default this call's.
        **params: the other fields of :class:`~podsrl.loss_terms.LossParams` (sapo's and vespo's).

    Returns:
        the scalar loss and :class:`LossStats`. An empty batch (N = 0, or every token masked)
        gives a loss of 0 that still has a gradient (of zeros).

    Raises:
        ValueError: an unknown name, a missing reference, or tensors of the wrong shapes.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; known: {', '.join(LOSS_TYPES)}")
    if vllm_importance_sampling_mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"unknown vllm_importance_sampling_mode {vllm_importance_sampling_mode!r}; known: "
                         f"{', '.join(IMPORTANCE_SAMPLING_MODES)}")
    if loss_type == "vespo" and sampler_logp is not None and vllm_importance_sampling_mode.startswith("sequence"):
        raise ValueError("loss_type=vespo folds vLLM's correction into its sequence weight token by token: it needs "
                         "vllm_importance_sampling_mode token_truncate or token_mask")
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp")
    N, L = logp.shape
    if advantages.shape != (N,):
        raise ValueError(f"advantages must be [N] = [{N}], one per completion, got {list(advantages.shape)}")
    for name, t in (("mask", mask), ("old_logp", old_logp), ("ref_logp", ref_logp), ("sampler_logp", sampler_logp)):
        if t is not None and t.shape != logp.shape:
            raise ValueError(f"{name} must be shaped like logp {list(logp.shape)}, got {list(t.shape)}")
    keep = mask.bool()  # [N, L]
    mask = mask.to(logp.dtype)
    # padding may hold anything (-inf from a masked logit): zeros there, before any exp
    zero = lambda t: None if t is None else torch.where(keep, t.to(logp.dtype), torch.zeros((), dtype=logp.dtype))
    logp, old_logp, ref_logp, sampler_logp = zero(logp), zero(old_logp), zero(ref_logp), zero(sampler_logp)
    old_logp = logp.detach() if old_logp is None else old_logp
    log_ratio = logp - old_logp  # [N, L]
    weight = importance_weight(log_ratio, mask, importance_sampling_level)  # [N, L] or [N, 1]
    sampling = None
    if sampler_logp is not None:  # ρ: [N, L] (token_*) or [N, 1] (sequence_*), no gradient
        sampling = importance_sampling_ratio(old_logp.detach(), sampler_logp, mask, vllm_importance_sampling_mode,
                                             None, sampling_cap)
    surrogate, aggregation = LOSS_TYPES[loss_type]
    tokens = Tokens(logp, log_ratio, weight, advantages.to(logp.dtype).unsqueeze(-1), mask,
                    sampling if loss_type == "vespo" else None)
    terms, low, high = SURROGATES[surrogate](tokens, LossParams(epsilon_low, epsilon_high, **params))
    if sampling is not None and loss_type != "vespo":
        terms = terms * sampling
    kl = torch.zeros_like(logp)
    if beta > 0:
        delta = ref_logp - logp  # [N, L]
        kl = torch.exp(delta) - delta - 1
        if use_bias_correction_kl:
            kl = kl * weight
        terms = terms + beta * kl

    counts = Normalisers(float(num_sequences if num_sequences is not None else N),
                         float(num_tokens if num_tokens is not None else mask.sum()),
                         float(micro_batch_tokens if micro_batch_tokens is not None else mask.sum()),
                         accumulation_steps, max_completion_length or L)
    loss = AGGREGATIONS[aggregation](terms, mask, counts)

    with torch.no_grad():
        total = mask.sum().clamp(min=1)
        mean = lambda x: (x.to(mask.dtype).expand_as(mask) * mask).sum() / total
        bound = float("inf") if sampling_cap is None else sampling_cap
        stats = LossStats(
            clip_low=mean(low), clip_high=mean(high), clip_region=mean(low | high), kl=mean(kl), ratio=mean(weight),
            num_tokens=mask.sum(),
            sampling_ratio=mean(sampling) if sampling is not None else torch.ones(()),
            sampling_clipped=mean(_outside(old_logp, sampler_logp, mask, vllm_importance_sampling_mode, bound))
            if sampling is not None else torch.zeros(()),
        )
    return loss, stats


def _outside(old: Tensor, sampler: Tensor, mask: Tensor, mode: str, cap: float) -> Tensor:
    """Where the sampler correction's ratio passes the cap (truncated or masked there)."""
    unbounded = importance_sampling_ratio(old, sampler, mask, mode.replace("mask", "truncate"), None, float("inf"))
    return unbounded > cap
