"""Precision and memory knobs: bf16 autocast, 4-bit base weights (QLoRA), their errors on a CPU."""

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from conftest import last_wins, subprocess_env


def test_default_mixed_precision():
    """TRL's default on a CUDA GPU (bf16 autocast), none on a CPU; a setting or the launcher's wins."""
    from podsrl.trainer import mixed_precision

    assert mixed_precision(None, None, "cuda", True) == "bf16"
    assert mixed_precision(None, None, "cuda", False) == "no"  # a GPU without bf16
    assert mixed_precision(None, None, "cuda", True, dtype="float16") == "no"  # fp16 weights: no bf16 autocast
    assert mixed_precision(None, None, "cuda", True, dtype="bfloat16") == "bf16"
    assert mixed_precision(None, None, "cpu", True) == "no"
    assert mixed_precision("no", None, "cuda", True) == "no"
    assert mixed_precision("fp16", "bf16", "cuda", True) == "fp16"
    assert mixed_precision(None, "no", "cuda", True) == "no"  # accelerate launch's config
    assert mixed_precision(None, "bf16", "cpu", False) == "bf16"


def test_mixed_precision_no_on_the_command_line_is_the_setting_no():
    from podsrl.config import load_config

    assert load_config(None, ["mixed_precision=no"]).mixed_precision == "no"
    assert load_config(None, ["mixed_precision=bf16"]).mixed_precision == "bf16"
    assert load_config(None, []).mixed_precision is None


def test_run_says_its_precision_and_a_cpu_run_is_fp32(tiny_config, caplog):
    import logging
    import re

    from podsrl.trainer import train

    with caplog.at_level(logging.INFO, logger="podsrl.trainer"):
        train(tiny_config("steps=1"))
    assert re.search(r"on 1 process\(es\), (cpu|cuda\S*), mixed precision (no|bf16|fp16);", caplog.text), caplog.text
    if not torch.cuda.is_available():
        assert "mixed precision no;" in caplog.text


@pytest.mark.slow
def test_bf16_autocast_trains(tmp_path, tiny_overrides):
    # its own process: accelerate keeps one precision per process
    result = subprocess.run([sys.executable, "-m", "podsrl", "train", *last_wins([*tiny_overrides, "mixed_precision=bf16", "steps=1"])],
                            capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 1 and rows[-1]["grad_norm"] is not None and rows[-1]["grad_norm"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the messages shown where there is no GPU")
@pytest.mark.parametrize("args,message", [
    (["model.load_in_4bit=true"], "model.load_in_4bit needs LoRA (model.lora_r > 0)"),
    (["model.load_in_4bit=true", "model.lora_r=8", "rollout.engine=vllm"], "model.load_in_4bit works with rollout.engine=hf"),
    (["mixed_precision=fp16"], "mixed_precision=fp16 needs a CUDA GPU"),
    (["mixed_precision=fp32"], "mixed_precision"),
])
@pytest.mark.slow
def test_precision_errors_are_one_line(tmp_path, tiny_model_dir, args, message):
    result = subprocess.run([sys.executable, "-m", "podsrl", "train", f"model.name_or_path={tiny_model_dir}", *args,
                             f"output_dir={tmp_path / 'out'}"], capture_output=True, text=True, env=subprocess_env(), timeout=600)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("podsrl: error:") and message in lines[0], result.stderr
    assert not (tmp_path / "out").exists()


needs_bitsandbytes = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None,
                                        reason="needs bitsandbytes (pip install -e '.[qlora]')")


@needs_bitsandbytes
@pytest.mark.slow
def test_4bit_base_with_lora_trains_on_the_cpu(tiny_config, monkeypatch):
    """QLoRA on the embedded model: NF4 base weights through bitsandbytes (on the CPU where there is
    no GPU); after each update the base weights are still 4-bit, only the LoRA parameters have
    gradients, and the loss and the adapter move."""
    import bitsandbytes as bnb

    import podsrl.trainer as trainer

    seen = []
    real_update = trainer.update

    def update(s, c, rollouts, chosen, step):
        stats = real_update(s, c, rollouts, chosen, step)
        quantised = [m for m in s.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
        with_grad = [n for n, p in s.model.named_parameters() if p.grad is not None]
        seen.append(dict(stats=stats, quantised=len(quantised), dtypes={m.weight.dtype for m in quantised},
                         with_grad=with_grad, lora_b=sum(float(p.abs().sum()) for n, p in s.model.named_parameters()
                                                          if "lora_B" in n)))
        return stats

    monkeypatch.setattr(trainer, "update", update)
    trainer.train(tiny_config("model.name_or_path=smollm2", "model.load_in_4bit=true", "model.lora_r=8",
                              "model.lora_alpha=16", "loss_type=bnpo", "lr=1e-3", "task.test_size=2",
                              "rewards=[rewards_for_tests:varied]"))
    assert len(seen) == 2
    for step in seen:
        assert step["quantised"] == 7 * 30  # every linear layer of the 30 blocks but the output layer
        assert step["dtypes"] == {torch.uint8}  # packed 4-bit, as loaded
        assert step["with_grad"] and all(".lora_" in n for n in step["with_grad"])
        assert step["stats"]["grad_norm"] > 0
    assert seen[0]["stats"]["loss"] != seen[1]["stats"]["loss"] and 0 < seen[0]["lora_b"] < seen[1]["lora_b"]


@needs_bitsandbytes
@pytest.mark.skipif(torch.cuda.is_available(), reason="bitsandbytes' CPU kernels")
def test_a_4bit_model_computes_alike_in_evaluation_and_training_on_any_cpu(tiny_model_dir):
    """On a CPU with AVX512-BF16, bitsandbytes repacks a 4-bit layer at its first forward in
    evaluation mode and multiplies in bf16 from then on, and refuses layers narrower than its packing
    (the tiny Llama's are 32 x 32; it packs 64 inputs a block). Loaded by podsrl, the tiny model
    generates, and its logits in training mode equal those of evaluation mode, after it as before
    (to 1e-5 of themselves: the autograd and no-grad paths may pick other attention kernels on
    another CPU; bf16's rounding is a few 1e-3)."""
    from podsrl.models import load_model

    model = load_model(tiny_model_dir, load_in_4bit=True)
    ids = torch.tensor([[1, 5, 9, 13]])
    model.train()
    before = model(ids).logits.detach()
    model.eval()
    with torch.no_grad():
        evaluated = model(ids).logits
        generated = model.generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    model.train()
    torch.testing.assert_close(evaluated, before, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model(ids).logits.detach(), before, rtol=1e-5, atol=1e-6)
    assert generated.shape == (1, 7)  # three tokens however the random weights round (no early EOS)


@pytest.mark.parametrize("lora", [[], ["model.lora_r=4", "model.lora_alpha=8"]], ids=["full", "lora"])
def test_gradient_checkpointing_recomputes_and_leaves_the_gradient(tiny_config, tmp_path, monkeypatch, lora):
    """Checkpointing (on by default) runs each layer again in the backward and gives the gradient
    of the plain computation; under LoRA the frozen base still passes gradients to the adapter."""
    import podsrl.trainer as trainer
    from podsrl.evaluate import chat_prompt

    grads, mlp_calls = {}, {}
    for on in (False, True):
        c = tiny_config("mode=grpo", "m=4", f"model.gradient_checkpointing={str(on).lower()}", *lora,
                        f"output_dir={tmp_path / str(on)}")
        s = trainer.setup(c)
        if not on:
            weights = {k: v.clone() for k, v in s.model.state_dict().items()}
        else:  # the same starting point (LoRA's A is random)
            s.model.load_state_dict(weights)
        problems = [p for _, p in zip(range(2), s.task.train(0))]
        prompts = [chat_prompt(s.tokenizer, s.system_prompt, p.question) for p in problems]
        rollouts = s.engine.generate(prompts, 4, 1.0, 6, seeds=[1, 2])
        chosen = trainer.down_sample(c, torch.tensor([[0.0, 1.0, 0.0, 0.5], [1.0, 0.0, 0.0, 0.0]]), step=1)
        names, params = zip(*[(n, p) for n, p in s.model.named_parameters() if p.requires_grad])
        monkeypatch.setattr(s.optimizer, "step", lambda: grads.__setitem__(on, [p.grad.clone() for p in params]))
        mlp = next(m for m in s.model.modules() if type(m).__name__ == "LlamaDecoderLayer").mlp
        calls, forward = [], mlp.forward  # (the recomputation does not run module hooks)
        monkeypatch.setattr(mlp, "forward", lambda *a, **k: calls.append(1) or forward(*a, **k))
        trainer.update(s, c, rollouts, chosen, step=1)
        mlp_calls[on] = len(calls)
    assert mlp_calls[True] == 2 * mlp_calls[False] > 0  # the forward, then the recomputation
    assert len(grads[True]) == len(grads[False])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads[False], grads[True]))
    # every trained tensor gets a gradient (but LoRA's A, whose gradient is 0 while B is 0)
    assert all(g.abs().sum() > 0 for n, g in zip(names, grads[True]) if "lora_A" not in n)
