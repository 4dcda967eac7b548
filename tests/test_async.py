"""async_lag: rollouts generated in a worker process from the policy k updates back, corrected by
the importance ratio; each step's rollouts are those of its policy version, a resumed run equals
an uninterrupted one, and a worker that fails, dies or is interrupted ends the run in one line."""

import json
import math
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch

from conftest import running
from podsrl import models
from podsrl.config import load_config
from podsrl.errors import PodsError
from podsrl.logprobs import completion_logprobs
from podsrl.loss import policy_loss
from podsrl.pipeline import _Solo, version_for
from podsrl.rewards.scorer import Scorer
from podsrl.rollout import make_engine
from podsrl.rollout.hf import HFEngine
from podsrl.sampling import Sampler
from podsrl.tasks import task_from_config
from podsrl.trainer import train
from test_bad_input import start, wait_for_step
from test_tempered import BOS, T, V, Tabular, every_completion
from test_trainer import final_weights, read_metrics

ASYNC = ["async_lag=1", "threads=1", "async_worker_threads=1", "reward_workers=0"]


def logged(run: Path) -> dict[int, list[str]]:
    """Each step's logged completions (log_completions covers every rollout of the step)."""
    steps: dict[int, list[str]] = {}
    for line in (run / "completions.jsonl").read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(row["step"], []).append(row["completion"])
    return steps


# --------------------------------------------------------------------------- the lag


def test_each_step_is_sampled_k_updates_before_the_one_that_trains_on_it():
    """Hand-worked: step t's rollouts come from the policy after update max(0, t - 1 - k); k = 0 is
    the synchronous trainer (after update t - 1)."""
    assert [version_for(t, 0) for t in (1, 2, 3, 4)] == [0, 1, 2, 3]
    assert [version_for(t, 1) for t in (1, 2, 3, 4)] == [0, 0, 1, 2]
    assert [version_for(t, 3) for t in (1, 2, 3, 4, 5, 6)] == [0, 0, 0, 0, 1, 2]


def test_async_lag_zero_runs_the_synchronous_trainer(tiny_config):
    out = train(tiny_config("async_lag=0", "steps=1"))
    rows = [r for r in read_metrics(out) if r["step"] == 1]
    assert "async/lag" not in rows[0] and rows[0]["sampling_ratio"] is None  # no worker, nothing to correct


@pytest.mark.parametrize("overrides,message", [
    (["rollout.engine=vllm", "rollout.top_p=0.9"], "async_lag=1 with rollout.engine=vllm and rollout.top_p=0.9: the "
                                                   "importance ratio of a truncated sampler needs the nucleus"),
    (["clock=cpu"], "async_lag=1 with clock=cpu: the CPU clock counts the training process's CPU seconds, and the "
                    "generation worker's would not count"),
    (["save_rollouts=true"], "save_rollouts with async_lag=1: the generation worker samples, and its completions are "
                             "not recorded"),
    (["async_lag=-1"], "async_lag must be >= 0"),
    (["async_worker_threads=0"], "async_worker_threads must be >= 1"),
])
def test_settings_async_lag_cannot_run_are_refused_saying_why(tiny_overrides, overrides, message):
    with pytest.raises(PodsError, match=message.replace("(", r"\(")):
        load_config(None, tiny_overrides + ["async_lag=1", *overrides])


def test_a_lag_under_several_processes_is_refused_before_anything_is_written(tiny_config, tmp_path):
    from types import SimpleNamespace

    from podsrl.trainer import setup

    launched = SimpleNamespace(num_processes=2)  # what accelerate launch with two processes gives
    with pytest.raises(PodsError, match="async_lag=1 runs on one process \\(2 were launched\\)"):
        setup(tiny_config(*ASYNC, f"output_dir={tmp_path / 'run'}"), launched)
    assert not (tmp_path / "run").exists()


def test_the_correction_settings_apply_under_a_lag_and_the_worker_threads_only_there(tiny_overrides):
    c = load_config(None, tiny_overrides + ["async_lag=1", "vllm_importance_sampling_mode=token_truncate",
                                            "vllm_importance_sampling_cap=2.0", "async_worker_threads=1"])
    assert c.vllm_importance_sampling_cap == 2.0 and c.async_worker_threads == 1
    with pytest.raises(PodsError, match="async_worker_threads=1 applies only with async_lag >= 1"):
        load_config(None, tiny_overrides + ["async_worker_threads=1"])
    with pytest.raises(PodsError, match="vllm_importance_sampling_cap=2.0 applies only with rollout.engine=vllm or async_lag >= 1"):
        load_config(None, tiny_overrides + ["vllm_importance_sampling_cap=2.0"])


# --------------------------------------------------------------------------- the sampler's log-probs


@pytest.mark.parametrize("decoder", ["loop", "generate"])
def test_the_hf_engine_returns_the_log_probs_its_tokens_were_sampled_with(tiny_model_dir, decoder):
    """What the worker hands the trainer: each token's log-probability at the sampling temperature,
    as the trainer's own forward computes it; recording them does not change what is sampled."""
    torch.set_num_threads(1)
    tokenizer = models.load_tokenizer(tiny_model_dir)
    model = models.load_model(tiny_model_dir)
    prompts = ["1 + 2 =", "a longer prompt, 17 - 9 ="]
    plain = HFEngine(model, tokenizer, decoder=decoder).generate(prompts, 3, 0.7, 8, seeds=[1, 2])
    out = HFEngine(model, tokenizer, decoder=decoder, record_logp=True).generate(prompts, 3, 0.7, 8, seeds=[1, 2])
    assert plain.sampler_logp is None and out.texts == plain.texts
    assert torch.equal(out.completion_ids, plain.completion_ids)
    forward = completion_logprobs(model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask,
                                  temperature=0.7).detach()
    mask = out.completion_mask.bool()
    assert out.sampler_logp.shape == forward.shape and bool((out.sampler_logp[~mask] == 0).all())
    assert torch.allclose(out.sampler_logp[mask], forward[mask], atol=1e-4)
    assert float(out.sampler_logp[mask].min()) < -0.5  # sampled, not greedy: some tokens were unlikely


def is_nucleus(probs: torch.Tensor, kept: set[int], top_p: float, tol: float = 1e-5) -> bool:
    """Whether ``kept`` is the top-p nucleus of ``probs`` (to within ``tol``, as a batched decode
    and a full forward round differently): no token outside it is more likely than one inside; its
    mass reaches ``top_p``; without its least likely token it would not."""
    inside = probs[sorted(kept)]
    outside = probs[[v for v in range(len(probs)) if v not in kept]]
    mass = float(inside.sum())
    return (not len(outside) or float(outside.max()) <= float(inside.min()) + tol) and mass >= top_p - tol \
        and mass - float(inside.min()) < top_p + tol


@pytest.mark.parametrize("decoder", ["loop", "generate"])
def test_under_top_p_the_hf_engine_records_each_tokens_nucleus_and_its_log_prob_there(tiny_model_dir, decoder):
    """Each sampled token's nucleus, checked against the model's own next-token distribution of
    its prefix, and its log-probability renormalised over that nucleus."""
    torch.set_num_threads(1)
    tokenizer = models.load_tokenizer(tiny_model_dir)
    model = models.load_model(tiny_model_dir)
    plain = HFEngine(model, tokenizer, decoder=decoder, top_p=0.8).generate(["12 + 7 ="], 4, 1.0, 6, seeds=[3])
    out = HFEngine(model, tokenizer, decoder=decoder, top_p=0.8, record_logp=True).generate(["12 + 7 ="], 4, 1.0, 6, seeds=[3])
    assert plain.sampler_support is None and torch.equal(out.completion_ids, plain.completion_ids)
    prompt = out.prompt_ids[0][out.prompt_mask[0].bool()]
    sizes = []
    for row in range(4):
        completion = out.completion_ids[row][out.completion_mask[row].bool()]
        with torch.no_grad():
            logits = model(input_ids=torch.cat([prompt, completion])[None]).logits[0, len(prompt) - 1 : -1].float()
        for t, token in enumerate(completion.tolist()):
            probs = torch.softmax(logits[t], -1)
            nucleus = {v for v in out.sampler_support[row, t].tolist() if v >= 0}
            assert is_nucleus(probs, nucleus, 0.8) and token in nucleus
            expected = math.log(float(probs[token]) / float(sum(probs[v] for v in nucleus)))
            assert out.sampler_logp[row, t].item() == pytest.approx(expected, abs=1e-4)
            sizes.append(len(nucleus))
        assert bool((out.sampler_support[row, len(completion):] == -1).all())  # nothing at padding
    assert min(sizes) < max(sizes)  # nuclei of different sizes, padded to the widest


@pytest.mark.parametrize("lean", [False, True])
def test_the_trainers_log_probs_renormalised_over_a_nucleus_match_brute_force(lean):
    """completion_logprobs with a support: log(π(y) / Σ_{v ∈ S} π(v)) per token, from the tabular
    policy's probabilities; an empty nucleus keeps the full log-prob."""
    model = Tabular(seed=2)
    args = every_completion()
    support = torch.tensor([[0, 2], [1, -1]], dtype=torch.int32).expand(9, 2, 2).clone()  # S_1 = {0, 2}, S_2 = {1}
    support[:, 1] = torch.where(args[2][:, 1:2] == 1, support[:, 1], -1)  # second token outside {1}: empty
    support[:, 0] = torch.where((args[2][:, :1] == 1), torch.tensor([1, -1], dtype=torch.int32), support[:, 0])
    head = model.lm_head if lean else None
    logp, replayed = completion_logprobs(model, *args, head=head, temperature=T, support=support)
    assert not replayed.requires_grad
    for i, (a, b) in enumerate(args[2].tolist()):
        for t, (previous, token) in enumerate(((BOS, a), (a, b))):
            probs = torch.softmax(model.lm_head.weight[:, previous].detach() / T, -1)
            nucleus = [v for v in support[i, t].tolist() if v >= 0] or list(range(V))
            assert replayed[i, t].item() == pytest.approx(math.log(probs[token] / probs[nucleus].sum()), abs=1e-6)
            assert logp[i, t].item() == pytest.approx(math.log(probs[token]), abs=1e-6)  # fp32 on the full path


# --------------------------------------------------------------------------- the correction


def expected_gradient(sampler: Tabular, policy: Tabular, mode: str | None) -> torch.Tensor:
    """E_{y ~ sampler}[−∇ loss(y)] of the policy's loss, an exact sum over the 9 completions, with
    A = R(y), each sequence weighted by the sampler correction of ``mode`` (None: uncorrected)."""
    args = every_completion()
    reward = torch.tensor([1.0, 0.0, 0.3, 0.0, 2.0, 0.5, 1.0, 0.0, 0.7], dtype=torch.float64)
    sampled = completion_logprobs(sampler, *args, temperature=T).detach()  # [9, 2] the lagged policy's
    prob = sampled.sum(-1).exp()
    logp = completion_logprobs(policy, *args, temperature=T)
    W = policy.lm_head.weight
    total = torch.zeros_like(W)
    for i in range(len(reward)):
        loss, _ = policy_loss(logp[i : i + 1], reward[i : i + 1], args[3][i : i + 1].double(), loss_type="dapo",
                              sampler_logp=None if mode is None else sampled[i : i + 1], sampling_cap=3.0,
                              vllm_importance_sampling_mode=mode or "sequence_mask")
        (g,) = torch.autograd.grad(-loss, W, retain_graph=True)
        total += prob[i] * g
    return total


@pytest.mark.parametrize("mode", ["sequence_mask", "sequence_truncate"])
def test_at_a_lag_the_corrected_gradient_is_the_on_policy_gradient(mode):
    """A tabular policy one update away from the policy that sampled: weighting each sequence by
    π_θ / π_old (every ratio within the cap here) gives the gradient an on-policy sample has in
    expectation, exactly; without the correction it is another."""
    policy = Tabular(seed=0)
    lagged = Tabular(seed=0)
    with torch.no_grad():
        lagged.lm_head.weight.add_(0.15 * torch.randn(lagged.lm_head.weight.shape, generator=torch.Generator().manual_seed(1),
                                                      dtype=torch.float64))
    on_policy = expected_gradient(policy, policy, None)
    corrected = expected_gradient(lagged, policy, mode)
    uncorrected = expected_gradient(lagged, policy, None)
    assert torch.allclose(corrected, on_policy, atol=1e-12)
    assert float((uncorrected - on_policy).norm()) > 0.01 * float(on_policy.norm())


def tabular_nuclei(model: Tabular, top_p: float) -> dict[int, list[int]]:
    """Each previous token's top-p nucleus of the tabular policy at T: most likely tokens first,
    until their mass reaches top_p."""
    nuclei = {}
    for previous in (BOS, *range(V)):
        probs = torch.softmax(model.lm_head.weight[:, previous].detach() / T, -1)
        order, mass, kept = probs.argsort(descending=True).tolist(), 0.0, []
        for v in order:
            if mass >= top_p:
                break
            kept.append(v)
            mass += float(probs[v])
        nuclei[previous] = kept
    return nuclei


def truncated_gradient(sampler: Tabular, policy: Tabular, top_p: float, replay: bool | None) -> torch.Tensor:
    """E_{y ~ sampler's top-p distribution}[−∇ loss(y)], an exact sum over the completions inside
    its nuclei, with A = R(y). ``replay``: weighted by the sequence ratio over the nuclei (the
    sampler's log-probs shifted by the policy's log π − log π^S); False: by π_θ(y) / q^S(y);
    None: unweighted (a synchronous run of ``policy``, which samples from its own nuclei)."""
    args = every_completion()
    reward = torch.tensor([1.0, 0.0, 0.3, 0.0, 2.0, 0.5, 1.0, 0.0, 0.7], dtype=torch.float64)
    nuclei = tabular_nuclei(sampler, top_p)
    support = torch.tensor([[nuclei[BOS] + [-1] * (V - len(nuclei[BOS])), nuclei[a] + [-1] * (V - len(nuclei[a]))]
                            for a, _ in args[2].tolist()], dtype=torch.int32)  # [9, 2, V]
    inside = [a in nuclei[BOS] and b in nuclei[a] for a, b in args[2].tolist()]
    _, sampled = completion_logprobs(sampler, *args, temperature=T, support=support)  # log q^S
    logp, replayed = completion_logprobs(policy, *args, temperature=T, support=support)
    behaviour = sampled + (logp.detach() - replayed) if replay else sampled
    W = policy.lm_head.weight
    total = torch.zeros_like(W)
    for i in range(len(reward)):
        if not inside[i]:
            continue
        loss, _ = policy_loss(logp[i : i + 1], reward[i : i + 1], args[3][i : i + 1].double(), loss_type="dapo",
                              sampler_logp=None if replay is None else behaviour[i : i + 1], sampling_cap=3.0,
                              vllm_importance_sampling_mode="sequence_truncate")
        (g,) = torch.autograd.grad(-loss, W, retain_graph=True)
        total += sampled[i].sum().exp() * g
    return total


def test_under_top_p_the_ratio_over_the_nucleus_gives_the_synchronous_gradient():
    """Sampling replay, exactly: a lagged sampler drawing from its top-p nuclei, each sequence
    weighted by the ratio of the two policies renormalised over those nuclei, gives in expectation
    the gradient of the synchronous run (which samples from the policy's own nuclei: the same sets
    here). The ratio of the full policy to the truncated sampler gives another gradient."""
    policy = Tabular(seed=0)
    lagged = Tabular(seed=0)
    with torch.no_grad():
        lagged.lm_head.weight.add_(0.15 * torch.randn(lagged.lm_head.weight.shape, generator=torch.Generator().manual_seed(1),
                                                      dtype=torch.float64))
    top_p = 0.7
    assert tabular_nuclei(lagged, top_p) == tabular_nuclei(policy, top_p)
    assert any(len(kept) < V for kept in tabular_nuclei(policy, top_p).values())  # truncation happens
    synchronous = truncated_gradient(policy, policy, top_p, None)
    replayed = truncated_gradient(lagged, policy, top_p, True)
    full_ratio = truncated_gradient(lagged, policy, top_p, False)
    assert torch.allclose(replayed, synchronous, atol=1e-12)
    assert float((full_ratio - synchronous).norm()) > 0.01 * float(synchronous.norm())


# --------------------------------------------------------------------------- the pipeline, end to end


def sampled_by(c, weights_dir: str, step: int, adapter: Path | None = None) -> list[str]:
    """Step ``step``'s rollouts as the synchronous sampler draws them from the weights in
    ``weights_dir`` (with LoRA: the base, under the ``adapter`` folder's weights), the prompts of
    the steps before it taken from the stream."""
    from podsrl.checkpoint import load_weights

    torch.set_num_threads(1)
    tokenizer = models.load_tokenizer(weights_dir)
    model = models.load_model(weights_dir, load_in_4bit=c.model.load_in_4bit)
    if c.model.lora_r:
        model = models.add_lora(model, c.model.lora_r, c.model.lora_alpha, c.model.lora_dropout, c.model.lora_target_modules)
        if adapter is not None:
            load_weights(model, adapter, lora=True)
    task = task_from_config(c.task, c.seed)
    scorer = Scorer.from_config(c)
    try:
        sampler = Sampler(c, task, make_engine("hf", model, tokenizer, c.rollout), scorer, tokenizer, task.system_prompt,
                          _Solo(), None, step - 1)
        return sampler.step_groups(step).rollouts.texts
    finally:
        scorer.close()


def three_steps_keeping_update_1(config, run: Path, keep: Path) -> None:
    """Train steps 1-3 of ``config`` (a factory of configs writing into ``run``), stopped after
    step 1 and resumed, and copy the weights after update 1 (with LoRA: the adapter) to ``keep``."""
    train(config("steps=1"))
    shutil.copytree(run / "checkpoints" / "step-000001" / "model", keep)
    train(config("steps=3", "resume=true"))


@pytest.mark.slow
def test_each_steps_rollouts_are_those_its_policy_version_samples(tiny_config, tiny_model_dir, tmp_path):
    """At k = 1 (threads = 1 on both sides), the worker's rollouts of steps 1 and 2 are the
    synchronous sampler's from the base weights, and those of step 3 its sampling from the weights
    after update 1: the lag is exactly one update, and the weights reach the worker whole."""
    run = tmp_path / "run"
    config = lambda *extra: tiny_config(*ASYNC, f"output_dir={run}", "log_completions=8", *extra)
    three_steps_keeping_update_1(config, run, tmp_path / "after-update-1")
    steps = logged(run)
    c = config("steps=3")
    assert steps[1] == sampled_by(c, tiny_model_dir, 1) and steps[2] == sampled_by(c, tiny_model_dir, 2)
    after = sampled_by(c, str(tmp_path / "after-update-1"), 3)
    assert steps[3] == after and after != sampled_by(c, tiny_model_dir, 3)  # the update changed what is sampled
    rows = {r["step"]: r for r in read_metrics(run) if "async/lag" in r}
    assert [rows[t]["async/lag"] for t in (1, 2, 3)] == [0, 1, 1]
    assert rows[3]["sampling_ratio"] != 1.0 and rows[3]["sampling_ratio_min"] <= rows[3]["sampling_ratio_max"]


@pytest.mark.slow
def test_a_resumed_run_equals_the_uninterrupted_one(tiny_config, tmp_path):
    """At k = 2 the checkpoint of step 2 holds the rollouts of steps 3 and 4, generated from the
    versions before it; resumed from it, the run's rollouts, metrics and weights are the
    uninterrupted run's."""
    common = [*ASYNC, "async_lag=2", "mode=pods", "log_completions=8", "save_every=2"]
    straight = train(tiny_config(*common, "steps=5", f"output_dir={tmp_path / 'straight'}"))
    part = train(tiny_config(*common, "steps=2", f"output_dir={tmp_path / 'resumed'}"))
    assert (part / "checkpoints" / "step-000002" / "pending_rollouts.pt").exists()
    resumed = train(tiny_config(*common, "steps=5", "resume=true", f"output_dir={part}"))
    keys = ("loss", "selected_reward_mean", "sampling_ratio", "sampling_ratio_min", "grad_norm", "async/lag")
    pick = lambda run: [{k: r.get(k) for k in keys} for r in read_metrics(run) if "loss" in r]
    assert pick(straight) == pick(resumed) and len(pick(straight)) == 5
    assert logged(straight) == logged(resumed)
    wa, wb = final_weights(straight), final_weights(resumed)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_the_lora_adapter_alone_reaches_the_worker(tiny_config, tiny_model_dir, tmp_path):
    """With LoRA the worker receives the adapter's weights: step 3's rollouts are those the base
    under the adapter after update 1 samples, not the base alone's."""
    run = tmp_path / "run"
    config = lambda *extra: tiny_config(*ASYNC, "model.lora_r=4", "model.lora_alpha=8", "lr=5e-2", "log_completions=8",
                                        f"output_dir={run}", *extra)
    three_steps_keeping_update_1(config, run, tmp_path / "adapter-1")
    c = config("steps=3")
    after = sampled_by(c, tiny_model_dir, 3, adapter=tmp_path / "adapter-1")
    assert logged(run)[3] == after and after != sampled_by(c, tiny_model_dir, 3)
    rows = {r["step"]: r for r in read_metrics(run) if "async/lag" in r}
    assert rows[1]["sampling_ratio"] == pytest.approx(1.0, abs=1e-4)  # sampled from the policy it trains


@pytest.mark.slow
def test_a_4_bit_base_under_lora_trains_at_a_lag(tiny_config, tmp_path):
    """QLoRA (bitsandbytes' CPU kernels, on the embedded model: the tiny one is too narrow for them):
    the worker loads the same 4-bit base; step 1 is sampled from the policy it trains, and step 3's
    rollouts are those the 4-bit base under the adapter after update 1 samples, not the base's."""
    run = tmp_path / "run"
    config = lambda *extra: tiny_config(*ASYNC, "model.name_or_path=smollm2", "model.load_in_4bit=true",
                                        "model.lora_r=4", "model.lora_alpha=8", "lr=5e-3", "log_completions=8",
                                        f"output_dir={run}", *extra)
    three_steps_keeping_update_1(config, run, tmp_path / "adapter-1")
    rows = {r["step"]: r for r in read_metrics(run) if "async/lag" in r}
    assert [rows[t]["async/lag"] for t in (1, 2, 3)] == [0, 1, 1]
    assert rows[1]["sampling_ratio_min"] == pytest.approx(1.0, abs=1e-3)
    assert rows[1]["sampling_ratio_max"] == pytest.approx(1.0, abs=1e-3)
    c = config("steps=3")
    after = sampled_by(c, "smollm2", 3, adapter=tmp_path / "adapter-1")
    assert logged(run)[3] == after and after != sampled_by(c, "smollm2", 3)


@pytest.mark.parametrize("iterations", ["num_iterations=1", "num_iterations=2"])
@pytest.mark.slow
def test_under_top_p_a_lagged_run_takes_the_ratio_over_the_nucleus(tiny_config, iterations):
    """End to end: step 1 is sampled from the weights the trainer holds at step 1 (version 0), so
    over the nucleus every ratio is 1 up to rounding, where the full policy's probability over the
    nucleus's would be its mass, well below 1 at top_p = 0.7; step 2's policy has moved."""
    out = train(tiny_config(*ASYNC, iterations, "rollout.top_p=0.7", "rollout.temperature=1.0", "lr=5e-2",
                            "vllm_importance_sampling_mode=token_truncate"))
    rows = {r["step"]: r for r in read_metrics(out) if "async/lag" in r}
    assert [rows[t]["async/lag"] for t in (1, 2)] == [0, 1]
    assert rows[1]["sampling_ratio_min"] == pytest.approx(1.0, abs=1e-3)
    assert rows[1]["sampling_ratio_max"] == pytest.approx(1.0, abs=1e-3)
    assert rows[2]["sampling_ratio_max"] - rows[2]["sampling_ratio_min"] > 1e-2


@pytest.mark.slow
def test_a_reward_that_fails_in_the_worker_ends_the_run_in_one_line(tiny_config):
    with pytest.raises(PodsError, match="the generation worker failed: reward 'rewards_for_tests:fails_in_worker' raised "
                                        "RuntimeError: this reward fails in the generation worker"):
        train(tiny_config(*ASYNC, "rewards=[rewards_for_tests:fails_in_worker]", "steps=3"))


@pytest.mark.slow
def test_the_generation_worker_forks_its_reward_workers_before_its_model_loads(tiny_config):
    """Forked later, a reward worker would hold a copy of the worker's model (and keep stale pages
    of it as the weights are synced): the process that scores holds no model."""
    settings = [s for s in ASYNC if not s.startswith("reward_workers=")]
    out = train(tiny_config(*settings, "reward_workers=1", "reward_timeout_s=30", "rewards=[rewards_for_tests:holds_a_model]",
                            "steps=2"))  # the reward walks every object of its process: no 1 s bound on a slow CPU
    rows = [r for r in read_metrics(out) if r["step"] > 0]
    assert [(r["generated_reward_mean"], r["reward_timeouts"]) for r in rows] == [(0.0, 0), (0.0, 0)]


@pytest.mark.slow
def test_a_compared_method_may_set_a_lag(tiny_model_dir, tmp_path):
    """``podsrl compare``: a method with its own async_lag trains with the worker, beside a
    synchronous one, and is summarised with it; under the CPU clock, which would not count the
    worker's time, it is refused before any run."""
    from podsrl.compare import run_all

    args = [f"model.name_or_path={tiny_model_dir}", "prompts_per_step=2", "n=4", "m=2", "task.test_size=4",
            "rollout.max_new_tokens=4", "progress=false", "rewards=[rewards_for_tests:varied]", "threads=1",
            "reward_workers=0"]
    summary = run_all(None, args, ["grpo", "pods:async_lag=1"], 1, None, tmp_path / "cmp", None, steps=3, eval_every=1)
    assert set(summary["methods"]) == {"grpo", "pods"}
    rows = read_metrics(tmp_path / "cmp" / "pods" / "seed-0")
    assert [r["async/lag"] for r in rows if "async/lag" in r] == [0, 1, 1]
    assert not any("async/lag" in r for r in read_metrics(tmp_path / "cmp" / "grpo" / "seed-0"))
    with pytest.raises(PodsError, match="async_lag=1 with clock=cpu"):
        run_all(None, args, ["grpo", "pods:async_lag=1"], 1, None, tmp_path / "cpu", None, steps=3, eval_every=1,
                clock="cpu")
    assert not (tmp_path / "cpu" / "grpo").exists()


# --------------------------------------------------------------------------- killed, interrupted


def worker_of(pid: int) -> int:
    """The generation worker's pid: the child of ``pid`` that multiprocessing spawned (not its
    resource tracker)."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rpartition(")")[2].split()[1]) == pid:
                command = (entry / "cmdline").read_bytes().decode(errors="replace")
                if "spawn_main" in command:
                    return int(entry.name)
        except (OSError, ValueError):
            continue
    raise AssertionError(f"process {pid} has no generation worker")


def gone(pid: int, within_s: float = 20.0) -> bool:
    deadline = time.monotonic() + within_s
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not running(pid)


def long_run(tiny_overrides, run: Path, *extra: str) -> list[str]:
    return [*tiny_overrides, *ASYNC, f"output_dir={run}", "steps=100000", "save_every=1", *extra]


@pytest.mark.slow
def test_a_worker_that_dies_ends_the_run_in_one_line_keeping_the_last_checkpoint(tiny_overrides, tmp_path):
    run = tmp_path / "run"
    proc = start("train", *long_run(tiny_overrides, run), cwd=tmp_path)
    wait_for_step(proc, run, 2)
    os.kill(worker_of(proc.pid), signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("podsrl: error: the generation worker died (signal SIGKILL, out of memory?)"), last
    assert "resume=true continues from it" in last
    checkpoints = sorted((run / "checkpoints").glob("step-*"))
    assert checkpoints and (checkpoints[-1] / "pending_rollouts.pt").exists()
    assert not list((run / "checkpoints").glob(".tmp-*"))


@pytest.mark.parametrize("sent,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.slow
def test_ctrl_c_and_sigterm_stop_both_processes(tiny_overrides, tmp_path, sent, code):
    run = tmp_path / "run"
    proc = start("train", *long_run(tiny_overrides, run), cwd=tmp_path)
    wait_for_step(proc, run, 2)
    worker = worker_of(proc.pid)
    proc.send_signal(sent)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == code and "Traceback" not in err, err
    assert gone(worker)


@pytest.mark.slow
def test_killed_with_sigkill_and_resumed_equals_uninterrupted(tiny_overrides, tmp_path):
    """SIGKILL of the trainer: its worker notices and ends; resumed from the last checkpoint the run
    ends with the weights of a run never interrupted."""
    run, straight = tmp_path / "run", tmp_path / "straight"
    proc = start("train", *long_run(tiny_overrides, run, "save_every=2"), cwd=tmp_path)
    wait_for_step(proc, run, 3)
    worker = worker_of(proc.pid)
    proc.kill()
    proc.communicate(timeout=300)
    assert gone(worker)
    assert sorted((run / "checkpoints").glob("step-*"))
    for folder, extra in ((run, ["resume=true"]), (straight, [])):
        done = start("train", *long_run(tiny_overrides, folder, "save_every=2", "steps=6", *extra), cwd=tmp_path)
        _, err = done.communicate(timeout=600)
        assert done.returncode == 0, err
    wa, wb = final_weights(straight), final_weights(run)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
