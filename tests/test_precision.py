"""Precision and memory knobs: bf16 autocast, 4-bit base weights (QLoRA), their errors on a CPU."""

import json
import subprocess
import sys

import pytest
import torch

from conftest import subprocess_env


def test_bf16_autocast_trains(tmp_path, tiny_overrides):
    # its own process: accelerate keeps one precision per process
    result = subprocess.run([sys.executable, "-m", "podsrl", "train", *tiny_overrides, "mixed_precision=bf16", "steps=1"],
                            capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 1 and rows[-1]["grad_norm"] is not None and rows[-1]["grad_norm"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the messages shown where there is no GPU")
@pytest.mark.parametrize("args,message", [
    (["model.load_in_4bit=true", "model.lora_r=8"], "model.load_in_4bit needs a CUDA GPU"),
    (["model.load_in_4bit=true"], "model.load_in_4bit needs LoRA (model.lora_r > 0)"),
    (["model.load_in_4bit=true", "model.lora_r=8", "rollout.engine=vllm"], "model.load_in_4bit works with rollout.engine=hf"),
    (["mixed_precision=fp16"], "mixed_precision=fp16 needs a CUDA GPU"),
    (["mixed_precision=fp32"], "mixed_precision"),
])
def test_precision_errors_are_one_line(tmp_path, tiny_model_dir, args, message):
    result = subprocess.run([sys.executable, "-m", "podsrl", "train", f"model.name_or_path={tiny_model_dir}", *args,
                             f"output_dir={tmp_path / 'out'}"], capture_output=True, text=True, env=subprocess_env(), timeout=600)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("podsrl: error:") and message in lines[0], result.stderr
    assert not (tmp_path / "out").exists()
