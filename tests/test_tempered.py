"""The update's gradient is the gradient of the expected reward under the distribution that
sampled the rollouts (logits / T): exact expectations on a tabular policy, every sequence counted."""

import itertools
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from podsrl.logprobs import completion_logprobs, lean_head
from podsrl.loss import policy_loss

V, BOS = 3, 3  # three tokens; the prompt is one BOS token
T = 0.6


class Tabular(nn.Module):
    """A policy over two-token completions whose logits are a table: next-token logits
    ``W[:, previous token]`` (hidden state: the previous token, one-hot; the output layer: W)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self.lm_head = nn.Linear(V + 1, V, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(1.5 * torch.randn(V, V + 1, generator=torch.Generator().manual_seed(seed),
                                                        dtype=torch.float64))
        self.double()

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids, attention_mask, position_ids, logits_to_keep, use_cache):
        hidden = nn.functional.one_hot(input_ids, V + 1).double()  # [N, S, V + 1]
        return SimpleNamespace(logits=self.lm_head(hidden[:, -logits_to_keep:]))


def every_completion():
    completions = torch.tensor(list(itertools.product(range(V), repeat=2)))  # [9, 2]
    N = len(completions)
    return torch.full((N, 1), BOS), torch.ones(N, 1, dtype=torch.long), completions, torch.ones(N, 2, dtype=torch.long)


def cosine_with_the_true_gradient(logprob_temperature: float, lean: bool) -> float:
    """cos(E_{y ~ π_T}[−∇ loss(y)], ∇ E_{y ~ π_T}[R(y)]), both exact sums over the 9 completions;
    the loss's log-probs taken at ``logprob_temperature``."""
    model = Tabular()
    W = model.lm_head.weight
    args = every_completion()
    reward = torch.tensor([1.0, 0.0, 0.3, 0.0, 2.0, 0.5, 1.0, 0.0, 0.7], dtype=torch.float64)  # R(y) [9]

    # the true gradient: J = Σ_y π_T(y) R(y), π_T the sampling distribution (logits / T)
    prob = completion_logprobs(model, *args, temperature=T).sum(-1).exp()  # [9]
    assert float(prob.detach().sum()) == pytest.approx(1.0)
    (true,) = torch.autograd.grad((prob * reward).sum(), W)

    # the estimator's expectation: Σ_y π_T(y) · (−∇ loss(y)), one completion at a time with A = R(y)
    head = lean_head(model) if lean else None
    logp = completion_logprobs(model, *args, head=head, temperature=logprob_temperature)  # [9, 2]
    expected = torch.zeros_like(W)
    for i in range(len(reward)):
        loss, _ = policy_loss(logp[i : i + 1], reward[i : i + 1], args[3][i : i + 1].double(), loss_type="dapo")
        (g,) = torch.autograd.grad(-loss, W, retain_graph=True)
        expected += prob[i].detach() * g
    return float(torch.nn.functional.cosine_similarity(expected.flatten(), true.flatten(), dim=0))


@pytest.mark.parametrize("lean", [False, True])
def test_tempered_logprobs_give_the_true_gradient(lean):
    assert cosine_with_the_true_gradient(T, lean) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("lean", [False, True])
def test_untempered_logprobs_give_a_biased_gradient(lean):
    """The log-probs of the untempered logits (what the update read before): not the gradient."""
    assert cosine_with_the_true_gradient(1.0, lean) < 1 - 1e-3
