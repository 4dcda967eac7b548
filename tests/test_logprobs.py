"""Lean per-token log-probs: values and gradients against the full log-softmax."""

import pytest
import torch

from podsrl import models
from podsrl.logprobs import LinearLogProbs, completion_logprobs, lean_head, linear_logprobs


def test_linear_logprobs_gradcheck():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (7,), generator=g)
    # chunks of 3 rows: three chunks, the last one short
    assert torch.autograd.gradcheck(lambda h, w: LinearLogProbs.apply(h, w, targets, 3), (hidden, weight))
    reference = torch.log_softmax(hidden @ weight.T, -1).gather(1, targets[:, None]).squeeze(1)
    assert torch.allclose(LinearLogProbs.apply(hidden, weight, targets, 3).double(), reference, atol=1e-6)


def test_linear_logprobs_at_a_temperature_gradcheck():
    """The logits divided by T, forward and backward (the 1 / T of the chain rule)."""
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(7, 5, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (7,), generator=g)
    assert torch.autograd.gradcheck(lambda h, w: LinearLogProbs.apply(h, w, targets, 3, 0.6), (hidden, weight))
    reference = torch.log_softmax(hidden @ weight.T / 0.6, -1).gather(1, targets[:, None]).squeeze(1)
    assert torch.allclose(linear_logprobs(hidden, weight, targets, temperature=0.6).double(), reference, atol=1e-6)


def test_with_nuclei_the_same_pass_gives_the_log_probs_renormalised_over_each_one():
    """Given the tokens' nuclei, the pass returns beside the log-probs (same values, same gradient)
    each target's probability over its nucleus, computed here from the softmax's probabilities
    by a loop: p(y) / sum of p over the nucleus; an empty nucleus keeps the full log-prob."""
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(7, 5, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (7,), generator=g)
    support = torch.full((7, 4), -1, dtype=torch.int32)
    for t in range(6):  # row 6's nucleus stays empty
        others = [v for v in torch.randperm(11, generator=g).tolist() if v != targets[t]][: t % 4]
        support[t, : 1 + len(others)] = torch.tensor([int(targets[t]), *others], dtype=torch.int32)
    logp, replayed = LinearLogProbs.apply(hidden, weight, targets, 3, 0.6, support)
    assert not replayed.requires_grad
    assert torch.equal(logp, LinearLogProbs.apply(hidden, weight, targets, 3, 0.6))
    assert torch.autograd.gradcheck(lambda h, w: LinearLogProbs.apply(h, w, targets, 3, 0.6, support)[0], (hidden, weight))
    probs = torch.softmax(hidden.detach() @ weight.detach().T / 0.6, -1)
    for t in range(7):
        nucleus = [int(v) for v in support[t] if v >= 0]
        expected = (probs[t, targets[t]] / sum(probs[t, v] for v in nucleus)).log() if nucleus else probs[t, targets[t]].log()
        assert abs(float(replayed[t]) - float(expected)) < 1e-10, t


def test_linear_logprobs_matches_log_softmax_in_float32():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(40, 16, generator=g, requires_grad=True)
    weight = torch.randn(300, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 300, (40,), generator=g)
    upstream = torch.randn(40, generator=g)
    ours = linear_logprobs(hidden, weight, targets, chunk_mb=0)  # one row per chunk
    grads = torch.autograd.grad((ours * upstream).sum(), (hidden, weight))
    reference = torch.log_softmax(hidden @ weight.T, -1).gather(1, targets[:, None]).squeeze(1)
    expected = torch.autograd.grad((reference * upstream).sum(), (hidden, weight))
    assert torch.allclose(ours, reference, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(grads, expected))


@pytest.mark.parametrize("lora", [False, True])
def test_lean_path_equals_full_logits_on_a_model(tiny_model_dir, lora):
    """Same log-probs and the same parameter gradients (tied embeddings, LoRA) as full logits."""
    torch.manual_seed(0)
    model = models.load_model(tiny_model_dir)
    if lora:
        model = models.add_lora(model, 4, 8, 0.0, ["all-linear"])
        for name, p in model.named_parameters():  # LoRA B starts at 0: move it so it matters
            if "lora_B" in name:
                p.data.normal_(0, 0.1)
    head = lean_head(model)
    assert head is not None
    prompt_ids = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    prompt_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    completion_ids = torch.tensor([[12, 13, 2, 0], [14, 15, 16, 17]])
    completion_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    args = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    params = [p for p in model.parameters() if p.requires_grad]
    full = completion_logprobs(model, *args)
    full_grads = torch.autograd.grad(full.sum(), params)
    lean = completion_logprobs(model, *args, head=head)
    lean_grads = torch.autograd.grad(lean.sum(), params)
    assert torch.allclose(full, lean, atol=1e-5) and (lean[0, 3] == 0)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(full_grads, lean_grads))
    assert any(g.abs().sum() > 0 for g in lean_grads)
