"""Data parallelism on the CPU: two processes (gloo) under accelerate launch against one process,
trained on the same rollouts (tests/replay.py): the one-process run records what it sampled, the
two-process run samples too and trains on the recording."""

import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO, launch, record_then_replay

WORKER = str(REPO / "tests" / "distributed_worker.py")

pytestmark = pytest.mark.slow  # both tests start processes under accelerate launch


def test_two_processes_match_one(tiny_model_dir, tmp_path):
    common = [f"model.name_or_path={tiny_model_dir}", "steps=3", "prompts_per_step=4", "n=4", "m=2",
              "task.test_size=6", "rollout.max_new_tokens=5", "progress=false", "lr=1e-2",
              "rewards=[rewards_for_tests:varied]", "loss_type=dapo"]
    # both runs on the CPU (two processes on a one-GPU machine fall back to CPU ranks; the
    # one-process run must not train on the GPU, whose rounding differs from the CPU's); one thread
    # per process, so that the one-process run's kernels round as each rank's do (accelerate gives
    # each CPU rank one thread; Adam turns a rounding difference in a near-zero gradient into a
    # difference of up to lr in a weight)
    record_then_replay(WORKER, "cpu_2proc.yaml", [str(tmp_path / "one.json"), *common, f"output_dir={tmp_path / 'one'}"],
                       [str(tmp_path / "two.json"), *common, f"output_dir={tmp_path / 'two'}"], tmp_path / "rollouts")
    a = json.loads((tmp_path / "one.json").read_text())
    b = json.loads((tmp_path / "two.json").read_text())
    assert [r["world"] for r in a] == [1, 1, 1] and [r["world"] for r in b] == [2, 2, 2]
    # rank 0 trained (3 steps x 2 prompts x 4) and evaluated on recorded rollouts only
    assert b[0]["replayed"] >= 3 * 2 * 4 and b[0]["own"] == 0
    for x, y in zip(a, b):
        assert y["rank_max_abs_diff"] == 0.0  # identical parameters on both ranks after every step
        assert abs(x["loss"] - y["loss"]) < 1e-5 and abs(x["grad_norm"] - y["grad_norm"]) < 1e-4 * max(1.0, x["grad_norm"])
    assert any(r["grad_norm"] > 0 for r in a)  # the steps did train
    # the same final weights, and one checkpoint written once
    wa = load_file(tmp_path / "one" / "checkpoints" / "step-000003" / "model" / "model.safetensors")
    wb = load_file(tmp_path / "two" / "checkpoints" / "step-000003" / "model" / "model.safetensors")
    assert all(torch.allclose(wa[k], wb[k], atol=1e-5) for k in wa)
    rows = [json.loads(l) for l in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[1]["trained_sequences"] == 4 * 2  # the global batch: 4 prompts x m = 2


def test_a_bad_input_under_the_launcher_is_said_once():
    """Each process printed it, one line per rank. The launcher's own report of the failure (its
    ChildFailedError and exit code 1) is torch's elastic launcher's, which nothing in the
    processes it started can change: it names the main process's exit code, 2."""
    result = launch("cpu_2proc.yaml", "-m", "podsrl", "train", "n=1", timeout=300)
    said = [line for line in result.stderr.splitlines() if line.startswith("podsrl:")]
    assert said == ["podsrl: error: n must be >= 2, got 1: advantages compare a prompt's rollouts, and a group of one "
                    "has none"], result.stderr[-3000:]
    assert result.returncode != 0 and "exitcode  : 2 " in result.stderr
