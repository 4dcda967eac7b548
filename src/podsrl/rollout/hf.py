"""Rollouts from a transformers model: batched, left-padded, per-row seeded sampling or greedy."""

from __future__ import annotations

import functools
import inspect
from typing import NamedTuple

import torch
import torch.nn.functional as F
from transformers import LogitsProcessor, LogitsProcessorList

from podsrl.errors import PodsError
from podsrl.logprobs import nucleus_logprobs, position_ids
from podsrl.rollout import OnChunk, Rollouts, pad_support


def mask_after_eos(completion_ids: torch.Tensor, eos_ids: list[int], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask ``[N, C]`` that keeps tokens up to and including the first EOS; later tokens padded."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))
    after = (is_eos.cumsum(-1) - is_eos.long()) > 0  # strictly after the first EOS
    return completion_ids.masked_fill(after, pad_id), (~after).long()


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every token that ends a completion: the model's generation config and the tokenizer's."""
    eos = model.generation_config.eos_token_id
    ids = [e for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
    return ids + [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids else ids


@functools.cache
def cache_kwarg() -> str:
    """The name transformers gives a model's KV-cache argument and output: ``cache`` from the
    release that renamed it (older names then warn on every call), ``past_key_values`` before."""
    from transformers import LlamaForCausalLM

    return "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"


@functools.cache
def static_cache_keeps_value_dtype() -> bool:
    """Whether transformers' static KV cache stores the values in their own dtype. Under bf16
    autocast the keys leave the rotary embedding in float32 and the values leave their projection
    in bf16; a static cache that allocates both in the keys' dtype (transformers before 5.24)
    fails at its first update. Asked of the cache itself, on two tiny tensors."""
    try:
        from transformers.cache_utils import StaticLayer

        layer = StaticLayer(max_cache_len=1)
        layer.lazy_initialization(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2, dtype=torch.bfloat16))
        return layer.values.dtype == torch.bfloat16
    except (ImportError, TypeError, AttributeError, RuntimeError):  # no such layer, or another interface
        return False


M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (two multiply-xorshift rounds) of int64 tensors holding values < 2^32;
    every product stays below 2^63, so it is exact on any device."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & M32
    x = ((x >> 16) ^ x) * 0x45D9F3B & M32
    return (x >> 16) ^ x


def row_uniforms(seeds: torch.Tensor, position: int) -> torch.Tensor:
    """One uniform draw in (0, 1) per row, a function of the row's seed (int64 ``[B]``) and the
    token's position alone: a counter-based hash computed on the rows' device, so a row's draws do
    not depend on the other rows of the batch, on the global RNG, or on the device."""
    lo, hi = seeds & M32, (seeds >> 32) & M32
    h = _mix32(_mix32(_mix32(lo) ^ hi) ^ _mix32(torch.full_like(seeds, position & M32)))
    return (h.double() + 0.5) / 2.0**32


def sample_rows(logits: torch.Tensor, seeds: torch.Tensor, position: int, temperature: float, top_p: float = 1.0,
                with_logp: bool = False):
    """Tokens ``[B]`` drawn from ``softmax(logits / temperature)`` (top-p truncated) by inverse CDF
    at each row's :func:`row_uniforms`; ``temperature <= 0`` is greedy.

    ``with_logp``: ``(tokens, logp, support)``, where ``logp`` is each token's log-probability
    under the distribution it was drawn from: ``softmax(logits / temperature)`` as a trainer's
    forward computes it, or with ``top_p < 1`` that distribution renormalised over the nucleus;
    ``support`` ``[B, K]`` (int32) is then the nucleus's token ids, -1 past each row's size (the
    trainer renormalises its own log-probs over it, sampling replay), else None."""
    if temperature <= 0:
        token = logits.argmax(-1)
        return (token, torch.zeros(len(token), device=logits.device), None) if with_logp else token
    probs = torch.softmax(logits.float() / temperature, -1)  # [B, V]
    kept = None
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p > top_p  # mass before a token already > top_p
        probs = probs.scatter(-1, order, sorted_p.masked_fill(outside, 0.0))
        probs = probs / probs.sum(-1, keepdim=True)
        kept = (~outside).sum(-1)  # [B] the nucleus's size; its tokens are order[:, :kept]
    u = row_uniforms(seeds.to(probs.device), position).to(probs.dtype)  # [B]
    token = torch.searchsorted(probs.cumsum(-1), u.unsqueeze(-1)).squeeze(-1)  # first token whose CDF >= u
    token = token.clamp(max=probs.shape[-1] - 1)
    if not with_logp:
        return token
    logq = torch.log_softmax(logits.float() / temperature, -1)
    full = logq.gather(-1, token.unsqueeze(-1)).squeeze(-1)
    if kept is None:
        return token, full, None
    width = int(kept.max())
    support = order[:, :width].masked_fill(torch.arange(width, device=kept.device) >= kept[:, None], -1)  # [B, K]
    return token, nucleus_logprobs(logq, token, support, full), support.to(torch.int32)


def call_width(mask: torch.Tensor, multiple: int, padding_side: str) -> int:
    """The columns a generate call needs of its prompts (``mask``: theirs, padded with the other
    calls' to the longest prompt of all): its own longest prompt, rounded up to ``multiple`` (the
    static cache's padding), within the whole width. Left padding only; right-padded prompts keep
    the whole width."""
    if padding_side != "left" or mask.numel() == 0:
        return mask.shape[1]
    longest = int(mask.sum(1).max())
    return min(mask.shape[1], -(-longest // multiple) * multiple)


def row_seed_tensor(seeds: list[int]) -> torch.Tensor:
    """Python seeds (any size) as int64 ``[B]``, reduced to 63 bits."""
    return torch.tensor([s % 2**63 for s in seeds], dtype=torch.int64)


def shared_prefix_length(ids: torch.Tensor, mask: torch.Tensor) -> int:
    """Tokens that every left-padded prompt of ``ids`` ``[B, P]`` starts with, leaving each prompt
    at least its last token (the first decoding step's input). Since the rows are right-aligned,
    a row's k-th token is at column ``P - length + k``."""
    lengths = mask.sum(1)
    shortest = int(lengths.min()) - 1
    if shortest < 1:
        return 0
    columns = (ids.shape[1] - lengths)[:, None] + torch.arange(shortest, device=ids.device)  # [B, shortest]
    starts = ids.gather(1, columns)
    same = (starts == starts[:1]).all(0)
    return int(same.long().cumprod(0).sum())


class Decoded(NamedTuple):
    """One generate call's completions: ids and mask ``[B, C]``; with ``record_logp``, the
    sampler's log-probs ``[B, C]`` and, under top-p, its nuclei ``[B, C, K]``
    (:func:`sample_rows`)."""

    ids: torch.Tensor
    mask: torch.Tensor
    logp: torch.Tensor | None = None
    support: torch.Tensor | None = None


class RowSampler(LogitsProcessor):
    """:func:`sample_rows` as a logits processor for ``generate``: returns a one-hot score, so it
    runs under greedy decoding. ``prompt_width`` is the (padded) prompt length of the call, so that
    the t-th new token of a row is drawn at position t whatever its batch."""

    def __init__(self, seeds: list[int], temperature: float, top_p: float, prompt_width: int = 0, record_logp: bool = False):
        self.seeds = row_seed_tensor(seeds)
        self.temperature, self.top_p, self.prompt_width = temperature, top_p, prompt_width
        self.logps: list[torch.Tensor] | None = [] if record_logp else None  # [B] per new token
        self.supports: list[torch.Tensor] = []  # [B, K] per new token, top-p < 1 only

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        position = input_ids.shape[1] - self.prompt_width
        token = sample_rows(scores, self.seeds, position, self.temperature, self.top_p, with_logp=self.logps is not None)
        if self.logps is not None:
            token, logp, support = token
            self.logps.append(logp)
            if support is not None:
                self.supports.append(support)
        return torch.full_like(scores, float("-inf")).scatter(-1, token.unsqueeze(-1), 0.0)


DECODERS = ("auto", "loop", "generate", "static")

STATIC_MAX_ROWS = 512
"""``auto``'s crossover: the most rows per generate call for which it takes the static decoder on
a CUDA GPU. Provisional: on one H100 (SmolLM2-135M, 16 new tokens) the static decoder gave
8,967 tokens/s against the loop's 4,639 at 256 rows per call, and 18,355 against 24,703 at 1,024;
512 lies between the two measured sizes (``benchmarks/rollout.py --crossover`` measures more)."""


def static_allowed(decoder: str, autocast: bool) -> bool:
    """Whether the static decoder can run under this precision; a ``decoder`` of ``static`` that
    cannot is refused (PodsError), before any run folder or model is touched."""
    ok = not autocast or static_cache_keeps_value_dtype()
    if decoder == "static" and not ok:
        import transformers

        raise PodsError(f"rollout.decoder=static under mixed precision needs transformers >= 5.24 (installed: "
                        f"{transformers.__version__}, whose static cache stores the values in the keys' dtype); "
                        "use rollout.decoder=loop or mixed_precision=no, or upgrade transformers")
    return ok


def choose_decoder(device_type: str, rows: int, static_max_rows: int = STATIC_MAX_ROWS, static_ok: bool = True) -> str:
    """The decoder ``auto`` runs for a generate call of ``rows`` sequences on a ``device_type``
    device: ``static`` on a CUDA GPU up to ``static_max_rows`` rows (a step of few rows is bound by
    kernel launches, which CUDA graphs cut to one per step), else ``loop`` (large steps, and any
    CPU, are bound by arithmetic, which dropping finished rows saves). ``static_ok=False`` (a
    static cache that would fail here): ``loop`` always."""
    if rows < 1:
        raise ValueError(f"rows per call must be >= 1, got {rows}")
    return "static" if static_ok and device_type == "cuda" and rows <= static_max_rows else "loop"


class HFEngine:
    """Samples from the training model itself, so its weights are always current.

    Decoding (``decoder="loop"``): each prompt is prefilled once and its KV cache repeated for its
    n rollouts; then one token per step, rows that have ended leaving the batch (and its cache),
    so a step costs about what its running rows cost. ``"generate"``
    uses transformers' ``generate`` instead (every row runs until the last ends); it is also the
    fallback for models whose cache cannot drop rows. ``"static"``: ``generate`` with a static KV
    cache, which transformers compiles on a GPU (CUDA graphs: one launch per decoding step, where a
    small model is bound by kernel launches); prompts are padded to a multiple of 16 tokens, so
    that few shapes are compiled, and each row is prefilled on its own. ``"auto"`` (the default)
    picks one of ``static`` and ``loop`` per call of :meth:`generate` by :func:`choose_decoder`.
    ``autocast``: the model's forward runs under mixed precision (the trainer's accelerator); then
    ``auto`` takes ``loop`` and ``static`` is refused where transformers' static cache cannot hold
    keys and values of two dtypes (:func:`static_cache_keeps_value_dtype`).
    """

    def __init__(self, model, tokenizer, top_p: float = 1.0, batch_size: int | None = None,
                 share_prompt_cache: bool = True, decoder: str = "auto", autocast: bool = False,
                 record_logp: bool = False):
        if decoder not in DECODERS:
            raise ValueError(f"unknown decoder {decoder!r}; known: {', '.join(DECODERS)}")
        self.static_ok = static_allowed(decoder, autocast)
        self.model, self.tokenizer = model, tokenizer
        self.top_p = top_p
        device = next(model.parameters()).device
        # a small model on a GPU is bound by kernel launches: many rows per step; a CPU, by compute
        self.batch_size = batch_size or (1024 if device.type == "cuda" else 128)
        self.share_prompt_cache = share_prompt_cache
        self.decoder = decoder
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.record_logp = record_logp
        """Return each sampled token's log-probability at the sampling temperature
        (``Rollouts.sampler_logp``), for a trainer whose policy is not this model (``async_lag``)."""

    def sync_weights(self) -> None:  # the same module: nothing to copy
        pass

    def phase(self):
        """Under FSDP2, the weights gathered once for the phase (ranks then decode independently)."""
        from podsrl.sharding import whole_for_generation

        return whole_for_generation(self.model)

    @torch.no_grad()
    def generate(
        self, prompts: list[str], n: int, temperature: float, max_new_tokens: int, seeds: list[int] | None = None,
        on_chunk: OnChunk | None = None, first_row: int = 0,
    ) -> Rollouts:
        """``seeds`` (one per prompt) makes each prompt's n rollouts depend on its seed alone (up
        to floating-point noise), not on which other prompts share the batch or the process, nor
        on the global RNG. A call generates for ``batch_size // n`` prompts (at least one), then
        hands them to ``on_chunk``."""
        pad = self.tokenizer.pad_token_id
        device = next(self.model.parameters()).device
        per_call = max(1, self.batch_size // n)  # prompts per generate call
        decoder = self.decoder if self.decoder != "auto" else choose_decoder(device.type, min(per_call, len(prompts)) * n,
                                                                                static_ok=self.static_ok)
        static = decoder == "static"
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False,
                             pad_to_multiple_of=16 if static else None)
        prompt_ids = enc["input_ids"].repeat_interleave(n, 0).to(device)  # [N, P]
        prompt_mask = enc["attention_mask"].repeat_interleave(n, 0).to(device)
        was_training = self.model.training
        self.model.eval()
        if seeds is None:  # unseeded: fresh draws from the global RNG
            seeds = torch.randint(0, 2**62, (len(prompts),)).tolist()
        row_seeds = row_seed_tensor([seed * 1_000_003 + j for seed in seeds for j in range(first_row, first_row + n)])
        chunks, texts = [], []  # (completion ids, mask) of each generate call; decoded completions
        for first in range(0, len(prompts), per_call):
            rows = slice(first * n, (first + per_call) * n)
            # the call's prompts padded only to its own longest (the returned prompt_ids to the longest of all)
            width = call_width(enc["attention_mask"][first : first + per_call], 16 if static else 1,
                               self.tokenizer.padding_side)
            call_ids, call_mask = prompt_ids[rows, -width:], prompt_mask[rows, -width:]
            if static:
                out = self._generate(call_ids, call_mask, temperature, max_new_tokens,
                                     row_seeds[rows], cache_implementation="static")
            else:
                chunk = (enc["input_ids"][first : first + per_call, -width:].to(device),
                         enc["attention_mask"][first : first + per_call, -width:].to(device))
                cache, cache_mask = self._prompt_cache(*chunk, n, share_prefix=decoder == "loop")
                if decoder == "loop" and hasattr(cache, "batch_select_indices"):
                    out = self._decode(call_ids, cache_mask, temperature, max_new_tokens, row_seeds[rows], cache)
                else:
                    if decoder == "loop" and cache is not None:  # a cache that cannot drop rows: generate
                        cache, _ = self._prompt_cache(*chunk, n)  # from one without a shared prefix
                    out = self._generate(call_ids, call_mask, temperature, max_new_tokens, row_seeds[rows], cache)
            ids, mask = out.ids, out.mask
            chunks.append(out)
            texts += self.tokenizer.batch_decode(ids, skip_special_tokens=True)
            if on_chunk is not None:
                on_chunk(first, texts[rows], [row[m.bool()].tolist() for row, m in zip(ids.cpu(), mask.cpu())])
        self.model.train(was_training)
        width = max(out.ids.shape[1] for out in chunks)
        completion_ids = torch.cat([F.pad(out.ids, (0, width - out.ids.shape[1]), value=pad) for out in chunks])  # [N, C]
        completion_mask = torch.cat([F.pad(out.mask, (0, width - out.mask.shape[1]), value=0) for out in chunks])
        logp = torch.cat([F.pad(out.logp, (0, width - out.logp.shape[1])) for out in chunks]) if self.record_logp else None
        support = None
        if any(out.support is not None for out in chunks):  # a chunk that recorded none keeps the whole vocabulary
            support = pad_support([out.support if out.support is not None else
                                   torch.full((*out.ids.shape, 1), -1, dtype=torch.int32, device=out.ids.device)
                                   for out in chunks], width)
        return Rollouts(prompt_ids, prompt_mask, completion_ids, completion_mask, texts, logp, support)

    def _prompt_cache(self, ids: torch.Tensor, mask: torch.Tensor, n: int, share_prefix: bool = False):
        """The KV cache of all but the last token of each (left-padded) prompt, repeated for its n
        rollouts, and the attention mask ``[B * n, L]`` of the cache's positions plus the last
        token. Each prompt is prefilled once, not n times (``share_prompt_cache=False``: n times).
        ``share_prefix``: the tokens every prompt of the batch starts with (a chat template and a
        system prompt, say) are prefilled once, as one row; a row's mask is then that prefix, its
        padding, then the rest of its prompt, and its positions skip the padding, so attention and
        positions are those of the prompt alone. The cache is None for one-token prompts, or a
        cache type that cannot be repeated."""
        if ids.shape[1] < 2:
            return None, mask.repeat_interleave(n, 0)
        if not self.share_prompt_cache:
            ids, mask, n = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0), 1
        common = shared_prefix_length(ids, mask) if share_prefix and self.share_prompt_cache and len(ids) > 1 else 0
        cache = None
        if common:
            start = ids.shape[1] - int(mask[0].sum())  # the first row's padding
            out = self.model(input_ids=ids[:1, start : start + common], use_cache=True, logits_to_keep=1)
            cache = getattr(out, cache_kwarg())
            if not hasattr(cache, "batch_repeat_interleave"):
                return self._prompt_cache(ids, mask, n)
            cache.batch_repeat_interleave(len(ids))
            ids, rest = ids[:, common:].masked_fill(mask[:, :-common] == 0, self.tokenizer.pad_token_id), mask[:, :-common]
            mask = torch.cat([torch.ones_like(mask[:, :common]), rest], 1)
        if ids.shape[1] > 1:  # the rest of the prompts but their last token
            out = self.model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1],
                             position_ids=position_ids(mask)[:, common:-1], use_cache=True, logits_to_keep=1,
                             **{cache_kwarg(): cache})
            cache = getattr(out, cache_kwarg())
        if n > 1:
            if not hasattr(cache, "batch_repeat_interleave"):
                return None, mask.repeat_interleave(n, 0)
            cache.batch_repeat_interleave(n)
        return cache, mask.repeat_interleave(n, 0)

    def _decode(self, ids, mask, temperature, max_new_tokens, seeds, cache) -> Decoded:
        """Token by token from the last prompt token on. Rows that have ended leave the batch (and
        the cache) once they are a quarter of it: dropping rows copies the whole cache, so it is
        done a few times per call rather than at every step where one row ends."""
        N, device = len(ids), ids.device
        seeds = seeds.to(device)
        tokens = torch.full((N, max_new_tokens), self.tokenizer.pad_token_id, dtype=torch.long, device=device)
        logps = torch.zeros(N, max_new_tokens, device=device) if self.record_logp else None
        supports = []  # (step, rows, nucleus [b, K]) while the sampler records its nuclei
        eos = torch.tensor(self.eos_ids, device=device)
        running = torch.arange(N, device=device)  # rows in the batch
        ended = torch.zeros(N, dtype=torch.bool, device=device)  # of the rows in the batch
        current, attention = ids[:, -1], mask
        positions = position_ids(mask)[:, -1]
        steps = 0
        for t in range(max_new_tokens):
            logits = self.model(input_ids=current[:, None], attention_mask=attention, position_ids=positions[:, None],
                                use_cache=True, **{cache_kwarg(): cache}).logits[:, -1]  # [B, V]
            current = sample_rows(logits, seeds[running], t, temperature, self.top_p, with_logp=self.record_logp)
            if self.record_logp:
                current, logp, support = current
                logps[running[~ended], t] = logp[~ended]
                if support is not None:
                    supports.append((t, running[~ended], support[~ended]))
            tokens[running[~ended], t] = current[~ended]
            steps = t + 1
            ended |= torch.isin(current, eos)
            if ended.all():
                break
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], 1)
            positions = positions + 1
            if 4 * int(ended.sum()) >= len(running):
                keep = (~ended).nonzero().flatten()
                cache.batch_select_indices(keep)
                running, current, attention, positions, ended = (
                    running[keep], current[keep], attention[keep], positions[keep], ended[keep])
        ids, mask = mask_after_eos(tokens[:, :steps], self.eos_ids, self.tokenizer.pad_token_id)
        nuclei = None
        if supports:
            nuclei = torch.full((N, steps, max(s.shape[1] for _, _, s in supports)), -1, dtype=torch.int32, device=device)
            for t, rows, support in supports:
                nuclei[rows, t, : support.shape[1]] = support
            nuclei = nuclei.masked_fill(~mask.bool()[..., None], -1)
        return Decoded(ids, mask, None if logps is None else logps[:, :steps] * mask, nuclei)

    def _generate(self, ids, mask, temperature, max_new_tokens, seeds, cache=None,
                  cache_implementation: str | None = None) -> Decoded:
        sampler = None
        if temperature <= 0:
            sampling = dict(do_sample=False)
        else:
            sampler = RowSampler(seeds.tolist(), temperature, self.top_p, prompt_width=ids.shape[1],
                                 record_logp=self.record_logp)
            sampling = dict(do_sample=False, logits_processor=LogitsProcessorList([sampler]))
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, **{cache_kwarg(): cache},
            pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.eos_ids, **sampling,
            **({"cache_implementation": cache_implementation} if cache_implementation else {}),
        )
        # masked per call, before any padding: the pad token may be the EOS token
        new, new_mask = mask_after_eos(out[:, ids.shape[1] :], self.eos_ids, self.tokenizer.pad_token_id)
        if not self.record_logp:
            return Decoded(new, new_mask)
        if sampler is None:  # greedy: each token had probability 1 under the sampler
            return Decoded(new, new_mask, torch.zeros(new.shape, device=new.device))
        width = new.shape[1]
        logp = torch.stack(sampler.logps, 1)[:, :width] if sampler.logps else torch.zeros(new.shape, device=new.device)
        nuclei = None
        if sampler.supports:
            k = max(s.shape[1] for s in sampler.supports)
            nuclei = torch.stack([F.pad(s, (0, k - s.shape[1]), value=-1) for s in sampler.supports], 1)[:, :width]
            nuclei = F.pad(nuclei, (0, 0, 0, width - nuclei.shape[1]), value=-1).masked_fill(~new_mask.bool()[..., None], -1)
        return Decoded(new, new_mask, F.pad(logp, (0, width - logp.shape[1])) * new_mask, nuclei)
