"""Rollout engines: turn prompts into n sampled completions each, behind one small interface."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Callable, NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor


class Rollouts(NamedTuple):
    """``N = len(prompts) * n`` completions, grouped by prompt (rows ``i*n .. i*n+n-1``)."""

    prompt_ids: Tensor  # [N, P] left-padded
    prompt_mask: Tensor  # [N, P]
    completion_ids: Tensor  # [N, C] right-padded, nothing kept after the first EOS
    completion_mask: Tensor  # [N, C] 1 up to and including the first EOS
    texts: list[str]  # [N] decoded completions, special tokens removed
    sampler_logp: Tensor | None = None  # [N, C] log-probs the sampler gave its tokens (0 at padding);
    # None where the policy itself sampled them (the HF engine)
    sampler_support: Tensor | None = None  # [N, C, K] int32: the token ids of the nucleus each token was
    # drawn from (top-p < 1), -1 past its size; None: the whole vocabulary. sampler_logp is then over the nucleus


def _index(t: Tensor | None, index: Tensor) -> Tensor | None:
    return None if t is None else t[index.to(t.device)]


def take_rows(r: Rollouts, rows: list[int]) -> Rollouts:
    """The rollouts at ``rows``, in that order."""
    index = torch.tensor(rows, dtype=torch.long)
    return Rollouts(*(t[index.to(t.device)] for t in r[:4]), [r.texts[i] for i in rows], _index(r.sampler_logp, index),
                    _index(r.sampler_support, index))


def concat_rollouts(parts: list[Rollouts], pad_id: int) -> Rollouts:
    """Rollouts of several generate calls as one: prompts left-padded, completions right-padded
    to the widest."""
    prompt_w = max(p.prompt_ids.shape[1] for p in parts)
    completion_w = max(p.completion_ids.shape[1] for p in parts)
    left = lambda t, value: F.pad(t, (prompt_w - t.shape[1], 0), value=value)
    right = lambda t, value: F.pad(t, (0, completion_w - t.shape[1]), value=value)
    return Rollouts(
        torch.cat([left(p.prompt_ids, pad_id) for p in parts]), torch.cat([left(p.prompt_mask, 0) for p in parts]),
        torch.cat([right(p.completion_ids, pad_id) for p in parts]), torch.cat([right(p.completion_mask, 0) for p in parts]),
        [t for p in parts for t in p.texts],
        None if any(p.sampler_logp is None for p in parts) else torch.cat([right(p.sampler_logp, 0.0) for p in parts]),
        None if any(p.sampler_support is None for p in parts) else pad_support([p.sampler_support for p in parts], completion_w),
    )


def pad_support(parts: list[Tensor], width: int) -> Tensor:
    """Nucleus tensors ``[N_i, C_i, K_i]`` as one ``[sum N_i, width, max K_i]``, padded with -1."""
    k = max(p.shape[2] for p in parts)
    return torch.cat([F.pad(p, (0, k - p.shape[2], 0, width - p.shape[1]), value=-1) for p in parts])


def cut_short(ids: list[int], max_new_tokens: int, eos_ids) -> bool:
    """Whether a completion's token ids (its end of sequence included, as engines hand them) were
    cut at the length limit: ``max_new_tokens`` of them, the last no end of sequence. An engine
    that names no ``eos_ids``: every completion of the full length counts as cut."""
    return len(ids) >= max_new_tokens and not (ids and ids[-1] in set(eos_ids or ()))


def cut_rows(r: Rollouts, max_new_tokens: int, eos_ids) -> list[bool]:
    """:func:`cut_short` of each of ``r``'s completions."""
    rows = zip(r.completion_ids.cpu(), r.completion_mask.cpu())
    return [cut_short(ids[mask.bool()].tolist(), max_new_tokens, eos_ids) for ids, mask in rows]


OnChunk = Callable[[int, list[str], list[list[int]]], None]
"""Called with each batch of finished groups as soon as it exists: the index of its first prompt,
its completions' texts and token ids (``n`` per prompt, in order), so scoring can start while the
rest is generated."""


class RolloutEngine(Protocol):
    def generate(self, prompts: list[str], n: int, temperature: float, max_new_tokens: int,
                 seeds: list[int] | None = None, on_chunk: OnChunk | None = None, first_row: int = 0) -> Rollouts:
        """Sample ``n`` completions of each (already templated) prompt; ``temperature`` 0 is greedy.
        ``seeds`` (one per prompt) make each prompt's rollouts repeatable; ``first_row`` numbers
        them from there, so that rollouts drawn in rounds (``first_row`` 0, then 8, ...) are the
        ones a single call would have drawn."""
        ...

    def sync_weights(self) -> None:
        """Make the engine sample from the policy's current weights (after an update)."""
        ...

    def phase(self) -> AbstractContextManager:
        """Hold the engine ready for one phase of generate calls (a step's rollouts, an
        evaluation). Whatever the engine must gather or push for them (FSDP2's whole weights, the
        policy's weights into vLLM) happens on entry and exit, never in ``generate``: under several
        processes every process enters and leaves each phase at the same points, so they run the
        same collectives whatever, and however often, each then generates (nothing, on a process
        without evaluation problems)."""
        ...


def check_engine(name: str, config, autocast: bool = False) -> None:
    """Refuse, before any model loads, an engine setting this machine cannot run (``PodsError``);
    ``autocast``: the model will run under mixed precision."""
    if name == "hf":
        from podsrl.rollout.hf import static_allowed

        static_allowed(config.decoder, autocast)
    if name == "vllm":
        from podsrl.rollout.vllm import check_vllm

        check_vllm(config)


def make_engine(name: str, model, tokenizer, config, trust_remote_code: bool = False, autocast: bool = False) -> RolloutEngine:
    """``autocast``: the model's forward runs under mixed precision (see :class:`HFEngine`)."""
    if name == "hf":
        from podsrl.rollout.hf import HFEngine

        return HFEngine(model, tokenizer, top_p=config.top_p, batch_size=config.batch_size,
                        share_prompt_cache=config.share_prompt_cache, decoder=config.decoder, autocast=autocast)
    if name == "vllm":
        from podsrl.rollout.vllm import VLLMEngine

        return VLLMEngine(model, tokenizer, config, trust_remote_code)
    from podsrl.errors import PodsError

    raise PodsError(f"unknown rollout engine {name!r}; known: hf, vllm")
