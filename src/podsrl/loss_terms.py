"""The parts of the policy loss, each a small pure function in a registry, under TRL 1.16's names.

A loss type (:data:`LOSS_TYPES`) is a per-token *surrogate* (:data:`SURROGATES`) and an
*aggregation* (:data:`AGGREGATIONS`) of the masked terms into a scalar:

| loss_type | surrogate | aggregation | paper |
|---|---|---|---|
| grpo | clip | sequence_mean | DeepSeekMath, arXiv 2402.03300 |
| bnpo | clip | micro_batch_token_mean | TRL's batch-normalised variant |
| dr_grpo | clip | max_length | Dr. GRPO, arXiv 2503.20783 |
| dapo | clip | token_mean | DAPO, arXiv 2503.14476 |
| cispo | cispo | token_mean | MiniMax-M1, arXiv 2506.13585 |
| sapo | sapo | sequence_mean | SAPO, arXiv 2511.20347 |
| luspo | clip | sequence_sum | LUSPO, arXiv 2602.05261 |
| vespo | vespo | token_mean | VESPO, arXiv 2602.10693 |

Symbols: ℓ_θ, ℓ_old the log-probs of a completion's tokens under the policy and the policy that
generated them; w the importance weight (:func:`importance_weight`): per token
``exp(ℓ_θ − ℓ_old)``, or per sequence (GSPO, arXiv 2507.18071) the exponential of the masked mean
of ``ℓ_θ − ℓ_old``; A the completion's advantage; ``sg`` stop-gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, NamedTuple, get_args

import torch
from torch import Tensor

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
ImportanceSamplingLevel = Literal["token", "sequence"]
ImportanceSamplingMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
IMPORTANCE_SAMPLING_LEVELS: tuple[str, ...] = get_args(ImportanceSamplingLevel)
IMPORTANCE_SAMPLING_MODES: tuple[str, ...] = get_args(ImportanceSamplingMode)


@dataclass(frozen=True)
class LossParams:
    """Hyperparameters of the surrogates (TRL's names and defaults, except the clip range)."""

    epsilon_low: float = 0.2  # clip: lower bound 1 − ε_low
    epsilon_high: float = 0.2  # clip: upper bound 1 + ε_high; cispo: the cap ε_max on w
    sapo_temperature_pos: float = 1.0  # sapo: τ for A > 0
    sapo_temperature_neg: float = 1.05  # sapo: τ for A <= 0
    vespo_k_pos: float = 2.0  # vespo: k, λ for A >= 0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0  # vespo: k, λ for A < 0
    vespo_lambda_neg: float = 2.0


class Tokens(NamedTuple):
    """What a surrogate reads of a (micro-)batch."""

    logp: Tensor  # [N, L] ℓ_θ (with grad), 0 at padding
    log_ratio: Tensor  # [N, L] ℓ_θ − ℓ_old, 0 at padding
    weight: Tensor  # [N, L] or [N, 1] w, by importance_sampling_level
    adv: Tensor  # [N, 1] A
    mask: Tensor  # [N, L] 1 for completion tokens
    sampling: Tensor | None  # [N, L] vLLM's token-level correction (vespo reads it), or None


class Normalisers(NamedTuple):
    """The counts an aggregation divides by (of the whole optimizer batch unless said)."""

    sequences: float  # sequences of the optimizer batch (on this process)
    tokens: float  # unmasked tokens of the optimizer batch (mean over processes)
    micro_batch_tokens: float  # unmasked tokens of this micro-batch
    accumulation_steps: int  # micro-batches per optimizer step
    max_completion_length: int  # dr_grpo's constant


Surrogate = Callable[[Tokens, LossParams], "tuple[Tensor, Tensor, Tensor]"]
"""``surrogate(tokens, params) -> (terms [N, L] or [N, 1], low-clipped, high-clipped)``; the
flags (bool, broadcastable to ``[N, L]``) say where a clip is active, for the statistics."""
Aggregation = Callable[[Tensor, Tensor, Normalisers], Tensor]
"""``aggregation(terms [N, L], mask [N, L], normalisers) -> scalar``; micro-batch losses of one
optimizer step add up to its loss."""


def importance_weight(log_ratio: Tensor, mask: Tensor, level: str) -> Tensor:
    """w: ``exp(ℓ_θ − ℓ_old)`` per token ``[N, L]`` (``token``), or ``exp(Σ_t m_t (ℓ_θ − ℓ_old)
    / Σ_t m_t)`` per sequence ``[N, 1]`` (``sequence``, GSPO, arXiv 2507.18071)."""
    if level == "token":
        return torch.exp(log_ratio)
    if level == "sequence":
        return torch.exp((log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1))
    raise ValueError(f"unknown importance_sampling_level {level!r}; known: {', '.join(IMPORTANCE_SAMPLING_LEVELS)}")


def importance_sampling_ratio(old: Tensor, sampling: Tensor, mask: Tensor, mode: str, clip_min: float | None,
                              clip_max: float | None) -> Tensor:
    """vLLM's importance-sampling correction (TRL's ``vllm_importance_sampling_mode``; Yao et al.,
    2025, "Your efficient RL framework secretly brings you off-policy RL training"): the ratio
    ``exp(ℓ_old − ℓ_μ)`` of the policy that generated to the sampler μ, per token (``token_*``,
    ``[B, T]``) or of the sum over the sequence (``sequence_*``, ``[B, 1]``); a token the sampler
    could not score (NaN) counts as ratio 1. ``*_truncate`` clamps the ratio to ``[clip_min,
    clip_max]``; ``*_mask`` sets a ratio outside it to 0 (a missing bound is no bound)."""
    if mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"vllm_importance_sampling_mode must be one of {', '.join(IMPORTANCE_SAMPLING_MODES)}, "
                         f"got {mode!r}")
    log_ratio = torch.nan_to_num((old - sampling) * mask, nan=0.0)  # [B, T]
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(-1, keepdim=True)  # [B, 1]
    ratio = log_ratio.exp()
    if mode.endswith("truncate"):
        return ratio.clamp(min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


# --------------------------------------------------------------------------- surrogates


def clip(t: Tokens, p: LossParams):
    """PPO's clipped surrogate (Schulman et al., 2017; the asymmetric range is DAPO's):
    ``−min(w A, clip(w, 1 − ε_low, 1 + ε_high) A)``."""
    clipped = torch.clamp(t.weight, 1 - p.epsilon_low, 1 + p.epsilon_high)
    terms = -torch.min(t.weight * t.adv, clipped * t.adv)
    return terms, (t.weight < 1 - p.epsilon_low) & (t.adv < 0), (t.weight > 1 + p.epsilon_high) & (t.adv > 0)


def cispo(t: Tokens, p: LossParams):
    """CISPO (MiniMax-M1, arXiv 2506.13585): the weight clipped and detached, the gradient through ℓ_θ:
    ``−sg(min(w, ε_high)) A ℓ_θ``."""
    capped = torch.clamp(t.weight, max=p.epsilon_high).detach()
    no_clip = torch.zeros_like(t.weight, dtype=torch.bool)
    return -capped * t.adv * t.logp, no_clip, (t.weight > p.epsilon_high) & (t.adv > 0)


def sapo(t: Tokens, p: LossParams):
    """SAPO (arXiv 2511.20347): a soft gate in place of the clip,
    ``−(4 / τ) σ(τ (w − 1)) A``, with τ = τ_pos for A > 0 and τ_neg otherwise."""
    tau = torch.where(t.adv > 0, p.sapo_temperature_pos, p.sapo_temperature_neg)
    no_clip = torch.zeros_like(t.weight, dtype=torch.bool)
    return -torch.sigmoid(tau * (t.weight - 1)) * 4 / tau * t.adv, no_clip, no_clip


@torch.no_grad()
def gamma_weight(t: Tokens, p: LossParams) -> Tensor:
    """VESPO's ``φ(W) = exp(λ + k log W − λ W)`` ``[N, 1]`` of the sequence's weight ``W = exp(Σ_t
    m_t (ℓ_θ − ℓ_old) + Σ_t log ρ_t)`` (ρ vLLM's token correction, when there is one), logs
    clamped to ``[log 1e-8, 20]``; (k, λ) by the sign of A. φ(1) = 1."""
    low = math.log(1e-8)
    log_w = (t.log_ratio.clamp(-20.0, 20.0) * t.mask).sum(-1, keepdim=True)  # [N, 1]
    if t.sampling is not None:
        log_w = log_w + torch.log(t.sampling).clamp(low, 20.0).sum(-1, keepdim=True)
    log_w = log_w.clamp(low, 20.0)
    positive = t.adv >= 0
    k = torch.where(positive, p.vespo_k_pos, p.vespo_k_neg)
    lam = torch.where(positive, p.vespo_lambda_pos, p.vespo_lambda_neg).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo(t: Tokens, p: LossParams):
    """VESPO (arXiv 2602.10693): a smooth, asymmetric Gamma weight of the sequence-level ratio
    in place of the clip: ``−φ(W) A ℓ_θ`` (:func:`gamma_weight`, no gradient through φ)."""
    no_clip = torch.zeros_like(t.adv, dtype=torch.bool)
    return -gamma_weight(t, p) * t.adv * t.logp, no_clip, no_clip


SURROGATES: dict[str, Surrogate] = {"clip": clip, "cispo": cispo, "sapo": sapo, "vespo": vespo}


# --------------------------------------------------------------------------- aggregations


def sequence_mean(terms: Tensor, mask: Tensor, n: Normalisers) -> Tensor:
    """Mean over each sequence's tokens, then over the batch's sequences:
    ``Σ_i (Σ_t m ℓ / Σ_t m) / N``."""
    return ((terms * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / max(n.sequences, 1)


def micro_batch_token_mean(terms: Tensor, mask: Tensor, n: Normalisers) -> Tensor:
    """Mean over the micro-batch's tokens, divided by the accumulation steps (TRL's ``bnpo``:
    it depends on how the optimizer batch is split): ``Σ m ℓ / (T_micro · G)``."""
    return (terms * mask).sum() / max(n.micro_batch_tokens, 1.0) / n.accumulation_steps


def max_length(terms: Tensor, mask: Tensor, n: Normalisers) -> Tensor:
    """Sum over tokens divided by sequences × the maximum completion length (Dr. GRPO):
    ``Σ m ℓ / (N · L_max)``."""
    return (terms * mask).sum() / (max(n.sequences, 1) * n.max_completion_length)


def token_mean(terms: Tensor, mask: Tensor, n: Normalisers) -> Tensor:
    """Mean over every token of the optimizer batch (DAPO's token-level loss): ``Σ m ℓ / T``."""
    return (terms * mask).sum() / max(n.tokens, 1.0)


def sequence_sum(terms: Tensor, mask: Tensor, n: Normalisers) -> Tensor:
    """Sum over each sequence's tokens, mean over sequences (LUSPO: a sequence weighs its
    length): ``Σ_i Σ_t m ℓ / N``."""
    return (terms * mask).sum() / max(n.sequences, 1)


AGGREGATIONS: dict[str, Aggregation] = {
    "sequence_mean": sequence_mean, "micro_batch_token_mean": micro_batch_token_mean, "max_length": max_length,
    "token_mean": token_mean, "sequence_sum": sequence_sum,
}

LOSS_TYPES: dict[str, tuple[str, str]] = {  # loss_type -> (surrogate, aggregation)
    "grpo": ("clip", "sequence_mean"),
    "bnpo": ("clip", "micro_batch_token_mean"),
    "dr_grpo": ("clip", "max_length"),
    "dapo": ("clip", "token_mean"),
    "cispo": ("cispo", "token_mean"),
    "sapo": ("sapo", "sequence_mean"),
    "luspo": ("clip", "sequence_sum"),
    "vespo": ("vespo", "token_mean"),
}
