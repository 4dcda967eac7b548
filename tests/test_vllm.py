"""vLLM rollouts: a clear error without a GPU; on a GPU with vLLM, the smoke config end to end."""

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from conftest import REPO, subprocess_env

HAS_GPU_AND_VLLM = torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown where there is no GPU")
def test_vllm_without_gpu_is_a_clear_error(tmp_path):
    result = subprocess.run([sys.executable, "-m", "podsrl", "train", "configs/smoke.yaml", "rollout.engine=vllm",
                             f"output_dir={tmp_path / 'out'}"], cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "podsrl: error: rollout.engine=vllm needs a CUDA GPU; use rollout.engine=hf on this machine"
    assert not (tmp_path / "out").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU_AND_VLLM, reason="needs a CUDA GPU and vLLM")
def test_vllm_smoke_run_on_gpu(tmp_path):
    result = subprocess.run([sys.executable, "-m", "podsrl", "train", "configs/smoke.yaml", "rollout.engine=vllm",
                             "rollout.sleep=true", "model.lora_r=8", f"output_dir={tmp_path / 'run'}"],
                            cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 2 and "eval_accuracy" in rows[-1]
