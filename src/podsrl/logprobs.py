"""Per-token log-probabilities of completions, without the ``[N, T, V]`` logits of a micro-batch.

For a completion token y_t with final hidden state h_t, output matrix W (``[V, H]``) and the
temperature T the rollouts were sampled at (logits divided by T, as TRL does: the log-probs are
those of the distribution that sampled):

    log π(y_t) = z[y_t] − logsumexp(z),    z = W h_t / T

The lean path (:class:`LinearLogProbs`) takes the hidden states from the model's own forward
(the input of its output layer), keeps only the completion tokens, and computes the formula a
chunk of tokens at a time, in fp32; its backward recomputes each chunk's logits, using

    ∂ log π(y_t) / ∂ (W h_t) = (onehot(y_t) − softmax(z)) / T.

Peak memory: one chunk of logits (``chunk_mb``), not every position's. It needs an output layer
that is a plain ``nn.Linear`` without bias, whose weight is whole on this process (as under DDP
and DeepSpeed ZeRO-2; not under FSDP); elsewhere :func:`completion_logprobs` computes full logits, as TRL does.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

CHUNK_MB = 256


class LinearLogProbs(torch.autograd.Function):
    """``log_softmax(hidden @ weight.T / temperature)[targets]`` for ``hidden [T, H]``, ``weight
    [V, H]``, ``targets [T]``, computed ``chunk`` rows at a time; returns ``[T]`` in fp32 (fp64 for
    fp64 inputs). With nuclei ``support [T, K]`` it returns a pair: beside the log-probs, from the
    same chunk's logits and without a gradient, the log-probs renormalised over each nucleus
    (:func:`nucleus_logprobs`)."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, chunk: int, temperature: float = 1.0,
                support: Tensor | None = None):
        w = weight.to(hidden.dtype)
        exact = torch.promote_types(hidden.dtype, torch.float32)  # softmax precision
        out = torch.empty(len(hidden), dtype=exact, device=hidden.device)
        lse = torch.empty_like(out)
        replayed = None if support is None else torch.empty_like(out)
        for i in range(0, len(hidden), chunk):
            rows = slice(i, i + chunk)
            logits = (_tempered(hidden[rows], temperature) @ w.T).to(exact)  # [c, V] = (h / T) W^T
            lse[rows] = torch.logsumexp(logits, -1)
            out[rows] = logits.gather(1, targets[rows, None]).squeeze(1) - lse[rows]
            if replayed is not None:
                replayed[rows] = nucleus_logprobs(logits, targets[rows], support[rows], out[rows])
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk, ctx.temperature = chunk, temperature
        if replayed is None:
            return out
        ctx.mark_non_differentiable(replayed)
        return out, replayed

    @staticmethod
    def backward(ctx, grad_out: Tensor, *_):  # no gradient flows through the renormalised log-probs
        hidden, weight, targets, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        w = weight.to(hidden.dtype)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device) if need_w else None
        for i in range(0, len(hidden), ctx.chunk):
            h = hidden[i : i + ctx.chunk]
            g_out = grad_out[i : i + ctx.chunk].to(lse.dtype) / ctx.temperature  # the 1 / T of dz / d(W h)
            probs = torch.exp((_tempered(h, ctx.temperature) @ w.T).to(lse.dtype) - lse[i : i + ctx.chunk, None])
            g = probs.mul_(-g_out[:, None])
            g.scatter_add_(1, targets[i : i + ctx.chunk, None], g_out[:, None])  # (onehot − softmax) · grad
            if need_h:
                grad_h[i : i + ctx.chunk] = (g.to(hidden.dtype) @ w).to(hidden.dtype)
            if need_w:
                grad_w += g.T @ h.to(lse.dtype)
        return grad_h, grad_w.to(weight.dtype) if need_w else None, None, None, None, None


def _tempered(x: Tensor, temperature: float) -> Tensor:
    """``x / T``; at T = 1, ``x`` itself. The lean path divides the hidden states (``[c, H]``), not
    the logits (``[c, V]``, V >> H): the same product, at a fraction of the cost."""
    return x if temperature == 1.0 else x / temperature


def linear_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, chunk_mb: int = CHUNK_MB,
                    temperature: float = 1.0, support: Tensor | None = None):
    """Log-probabilities ``[T]`` of ``targets`` under ``hidden [T, H] @ weight.T / temperature``,
    chunked; with nuclei ``support [T, K]``, the pair of :class:`LinearLogProbs`."""
    return LinearLogProbs.apply(hidden, weight, targets, chunk_rows(weight, chunk_mb), temperature, support)


def position_ids(mask: Tensor) -> Tensor:
    """Positions of left-padded rows as ``generate()`` numbers them (padding gets 1, masked)."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)


def chunk_rows(weight: Tensor, chunk_mb: int = CHUNK_MB) -> int:
    """Tokens per chunk whose fp32 logits under the output matrix ``weight [V, H]`` fit ``chunk_mb``."""
    return max(1, chunk_mb * 2**20 // (4 * weight.shape[0]))


def lean_head(model: nn.Module) -> nn.Linear | None:
    """The (unwrapped) model's output layer if the lean path can use it: a plain ``nn.Linear``
    without bias (a LoRA-wrapped or quantised head is not); else None."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return head if type(head) is nn.Linear and head.bias is None else None


def completion_logprobs(model, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                        completion_mask: Tensor, head: nn.Linear | None = None, temperature: float = 1.0,
                        support: Tensor | None = None):
    """Log-probabilities ``[N, C]`` of the completion tokens under ``model`` at ``temperature``
    (its logits divided by it; 0 at padding).

    ``model`` is called as it is (wrapped by DDP, say); ``head``, its output layer (from
    :func:`lean_head` on the unwrapped model), selects the lean path.

    ``support`` ``[N, C, K]``: the nucleus each token was sampled from (``Rollouts.sampler_support``,
    -1 past its size). Then the result is a pair: the log-probs, and beside them, detached, the
    same log-probs renormalised over each token's nucleus (sampling replay):
    ``z[y_t] − logsumexp(z[S_t])``; a position whose nucleus is empty keeps the full distribution's."""
    keep_prompt = prompt_mask.any(0).nonzero()[0].item()  # drop all-padding columns on the left
    prompt_ids, prompt_mask = prompt_ids[:, keep_prompt:], prompt_mask[:, keep_prompt:]
    C = completion_ids.shape[1]
    input_ids = torch.cat([prompt_ids, completion_ids], 1)  # [N, P + C]
    attention = torch.cat([prompt_mask, completion_mask], 1)
    inputs = dict(input_ids=input_ids, attention_mask=attention, position_ids=position_ids(attention),
                  logits_to_keep=C + 1, use_cache=False)
    if head is None:  # full logits of the completion positions; logsumexp keeps no second copy
        logits = _tempered(model(**inputs).logits[:, :-1], temperature)  # [N, C, V]
        picked = logits.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1).float()
        logp = (picked - torch.logsumexp(logits.float(), -1)) * completion_mask
        if support is None:
            return logp
        with torch.no_grad():
            exact = logits.detach().to(torch.promote_types(logits.dtype, torch.float32))
            return logp, nucleus_logprobs(exact, completion_ids, support, logp.detach()) * completion_mask

    captured = []

    def take_hidden(module, args):  # the output layer's input: hidden states [N, C + 1, H]
        captured.append(args[0])
        return (args[0][:, -1:],)  # and let it compute logits for one position only

    handle = head.register_forward_pre_hook(take_hidden)
    try:
        model(**inputs)
    finally:
        handle.remove()
    hidden = captured[0][:, :-1]  # [N, C, H]: position t predicts completion token t
    keep = completion_mask.bool()
    whole = lambda t: torch.zeros(keep.shape, dtype=t.dtype, device=t.device).masked_scatter(keep, t)
    out = linear_logprobs(hidden[keep], head.weight, completion_ids[keep], temperature=temperature,
                          support=None if support is None else support[keep])  # [T], or ([T], [T])
    return whole(out) if support is None else (whole(out[0]), whole(out[1]))


def nucleus_logprobs(logits: Tensor, targets: Tensor, support: Tensor, full: Tensor) -> Tensor:
    """``logits[..., y] − logsumexp(logits[..., S])``: the targets' log-probabilities renormalised
    over their nuclei, for ``logits [..., V]``, ``targets [...]`` and nuclei ``support [..., K]``
    (-1 past their size); ``full`` where a nucleus is empty. Logits or log-probs alike (a constant
    per row cancels)."""
    support = support.long()
    nucleus = logits.gather(-1, support.clamp(min=0)).masked_fill(support < 0, -torch.inf)
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    empty = (support < 0).all(-1)
    return torch.where(empty, full, picked - torch.logsumexp(nucleus.masked_fill(empty[..., None], 0.0), -1))
