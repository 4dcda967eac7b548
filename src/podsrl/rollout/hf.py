"""Rollouts with transformers' ``generate``: batched, left-padded, sampling or greedy."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import LogitsProcessor, LogitsProcessorList

from podsrl.rollout import OnChunk, Rollouts


def mask_after_eos(completion_ids: torch.Tensor, eos_ids: list[int], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask ``[N, C]`` that keeps tokens up to and including the first EOS; later tokens padded."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))
    after = (is_eos.cumsum(-1) - is_eos.long()) > 0  # strictly after the first EOS
    return completion_ids.masked_fill(after, pad_id), (~after).long()


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Positions of left-padded rows as ``generate()`` numbers them (padding gets 1, masked)."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every token that ends a completion: the model's generation config and the tokenizer's."""
    eos = model.generation_config.eos_token_id
    ids = [e for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
    return ids + [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids else ids


class RowSampler(LogitsProcessor):
    """Temperature / top-p sampling where row i draws from its own seeded generator.

    A row's tokens then depend on its seed and its own logits only, not on the other rows of the
    batch or the global RNG. It returns a one-hot score, so it runs under greedy decoding.
    """

    def __init__(self, seeds: list[int], temperature: float, top_p: float):
        self.generators = [torch.Generator().manual_seed(s) for s in seeds]
        self.temperature, self.top_p = temperature, top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(scores.float() / self.temperature, -1)  # [B, V]
        if self.top_p < 1.0:
            sorted_p, order = probs.sort(-1, descending=True)
            outside = sorted_p.cumsum(-1) - sorted_p > self.top_p  # mass before a token already > top_p
            probs = probs.scatter(-1, order, sorted_p.masked_fill(outside, 0.0))
            probs = probs / probs.sum(-1, keepdim=True)
        u = torch.stack([torch.rand((), generator=g) for g in self.generators]).to(probs.device)  # [B]
        token = (probs.cumsum(-1) < u.unsqueeze(-1)).sum(-1).clamp(max=probs.shape[-1] - 1)  # inverse CDF
        return torch.full_like(scores, float("-inf")).scatter(-1, token.unsqueeze(-1), 0.0)


class HFEngine:
    """Samples from the training model itself, so its weights are always current."""

    def __init__(self, model, tokenizer, top_p: float = 1.0, batch_size: int = 64, share_prompt_cache: bool = True):
        self.model, self.tokenizer = model, tokenizer
        self.top_p, self.batch_size = top_p, batch_size
        self.share_prompt_cache = share_prompt_cache
        self.eos_ids = eos_token_ids(model, tokenizer)

    def sync_weights(self) -> None:  # the same module: nothing to copy
        pass

    @torch.no_grad()
    def generate(
        self, prompts: list[str], n: int, temperature: float, max_new_tokens: int, seeds: list[int] | None = None,
        on_chunk: OnChunk | None = None,
    ) -> Rollouts:
        """``seeds`` (one per prompt) makes each prompt's n rollouts depend on its seed alone (up
        to floating-point noise), not on which other prompts share the batch or the process, nor
        on the global RNG. A call generates for ``batch_size // n`` prompts (at least one), then
        hands them to ``on_chunk``."""
        pad = self.tokenizer.pad_token_id
        device = next(self.model.parameters()).device
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        prompt_ids = enc["input_ids"].repeat_interleave(n, 0).to(device)  # [N, P]
        prompt_mask = enc["attention_mask"].repeat_interleave(n, 0).to(device)
        was_training = self.model.training
        self.model.eval()
        row_seeds = [seed * 1_000_003 + j for seed in seeds for j in range(n)] if seeds is not None else None
        per_call = max(1, self.batch_size // n)  # prompts per generate call
        chunks, texts = [], []  # (completion ids, mask) of each generate call; decoded completions
        for first in range(0, len(prompts), per_call):
            rows = slice(first * n, (first + per_call) * n)
            chunk_seeds = row_seeds[rows] if row_seeds is not None else None
            cache = self._shared_prompt_cache(enc["input_ids"][first : first + per_call].to(device),
                                              enc["attention_mask"][first : first + per_call].to(device), n)
            ids, mask = self._generate(prompt_ids[rows], prompt_mask[rows], temperature, max_new_tokens, chunk_seeds, cache)
            chunks.append((ids, mask))
            texts += self.tokenizer.batch_decode(ids, skip_special_tokens=True)
            if on_chunk is not None:
                on_chunk(first, texts[rows], [row[m.bool()].tolist() for row, m in zip(ids.cpu(), mask.cpu())])
        self.model.train(was_training)
        width = max(ids.shape[1] for ids, _ in chunks)
        completion_ids = torch.cat([F.pad(ids, (0, width - ids.shape[1]), value=pad) for ids, _ in chunks])  # [N, C]
        completion_mask = torch.cat([F.pad(mask, (0, width - mask.shape[1]), value=0) for _, mask in chunks])
        return Rollouts(prompt_ids, prompt_mask, completion_ids, completion_mask, texts)

    def _shared_prompt_cache(self, ids: torch.Tensor, mask: torch.Tensor, n: int):
        """Prefill each prompt once (all but its last token) and repeat its KV cache for the n
        rollouts, instead of prefilling n identical copies; None where the cache cannot do it."""
        if n == 1 or not self.share_prompt_cache or ids.shape[1] < 2:
            return None
        out = self.model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=position_ids(mask)[:, :-1], use_cache=True)
        cache = out.past_key_values
        if not hasattr(cache, "batch_repeat_interleave"):
            self.share_prompt_cache = False
            return None
        cache.batch_repeat_interleave(n)
        return cache

    def _generate(self, ids, mask, temperature, max_new_tokens, seeds, cache=None) -> tuple[torch.Tensor, torch.Tensor]:
        if temperature <= 0:
            sampling = dict(do_sample=False)
        elif seeds is not None:
            sampling = dict(do_sample=False, logits_processor=LogitsProcessorList([RowSampler(seeds, temperature, self.top_p)]))
        else:
            sampling = dict(do_sample=True, temperature=temperature, top_p=self.top_p, top_k=0)
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, past_key_values=cache,
            pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.eos_ids, **sampling,
        )
        # masked per call, before any padding: the pad token may be the EOS token
        return mask_after_eos(out[:, ids.shape[1] :], self.eos_ids, self.tokenizer.pad_token_id)
