"""Sharded training on CPU processes: FSDP2 over two processes (gloo) against DDP of the same run,
its checkpoint in a one-process eval and on resume, LoRA under FSDP, two machine ranks over
loopback, and DeepSpeed ZeRO where it is installed. A sharded run is compared with DDP's on the
same rollouts: DDP's run records what it sampled, the sharded runs sample too and train on the
recording (tests/replay.py), so the comparison is about the update, not about whether sampling
survives the rounding of another kernel or CPU."""

import importlib.util
import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO, cpu_env, free_port, launch
from podsrl import models
from podsrl.checkpoint import read_metrics

# every test here reads runs of two processes made once per module (a minute or more); -m 'not slow' skips them all
pytestmark = pytest.mark.slow

WORKER = str(REPO / "tests" / "sharded_worker.py")

# Tolerances of a sharded run against DDP of the same run. They differ in how gradients are
# summed (FSDP reduce-scatters each layer's flat shard, ZeRO-2 reduces into partitions, DDP
# all-reduces buckets) and in the log-prob path (DDP's lean chunked path, the sharded runs' full
# logits), so they agree to rounding, not to the bit. Measured on two CPU processes (gloo, one
# thread each), steps 1 and 2, the losses about 1e-4:
#   FSDP2:  max |Δloss| 0, |Δgrad_norm|/grad_norm 1.9e-7 and 0, max |Δw| 0
#   ZeRO-2: max |Δloss| 0, |Δgrad_norm|/grad_norm 2.7e-6 and 2.6e-6, max |Δw| 0
# The weights agree to the bit because Adam's first steps move each weight by about ±lr whatever
# the gradient's rounding; a later step can turn a rounding difference in a near-zero gradient
# into up to lr (1e-2) in a weight, hence the weights' bound, which still catches a shard lost or
# gathered out of place (those move weights by far more, in the tensors' shapes too).
LOSS_TOL = 1e-6  # absolute
GRAD_NORM_RTOL = 1e-5  # relative
WEIGHT_TOL = 1e-4  # max |Δw| after two steps


def _common(model_dir: str) -> list[str]:
    return [f"model.name_or_path={model_dir}", "prompts_per_step=4", "n=4", "m=2", "task.test_size=4",
            "rollout.max_new_tokens=5", "progress=false", "lr=1e-2", "rewards=[rewards_for_tests:varied]",
            "loss_type=dapo", "beta=0.04",  # a KL term: a loss that is not 0 by construction on-policy
            "rollout.temperature=0.5", "save_optimizer=true"]  # checkpoints resumed exactly


def _run(config: str, out, *overrides: str, timeout: int = 600, record=None, replay=None) -> list[dict]:
    """The worker under ``config``; ``record``/``replay``: a folder of rollouts to write or train on."""
    env = {**cpu_env(), **({"PODSRL_RECORD_ROLLOUTS": str(record)} if record else {}),
           **({"PODSRL_REPLAY_ROLLOUTS": str(replay)} if replay else {})}
    result = launch(config, WORKER, str(out / "ranks"), *overrides, f"output_dir={out / 'run'}", timeout=timeout, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads((out / "ranks" / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def ddp_run(tiny_model_dir, tmp_path_factory):
    """Two steps under DDP: the unsharded reference."""
    out = tmp_path_factory.mktemp("ddp")
    return out, _run("cpu_2proc.yaml", out, *_common(tiny_model_dir), "steps=2", record=out / "rollouts")


def _sharded_runs(config: str, ddp_run, tiny_model_dir, root):
    """Two steps under ``config`` (DDP's run, sharded), then that run resumed to a third step,
    and a third step uninterrupted."""
    common = _common(tiny_model_dir)
    out = {name: root / name for name in ("sharded", "resumed", "straight")}
    out["ddp"] = ddp_run[0]
    recorded = out["ddp"] / "rollouts"  # steps 1-2; step 3 is sampled by each run (the same shapes in both)
    ranks = {"ddp": ddp_run[1], "sharded": _run(config, out["sharded"], *common, "steps=2", replay=recorded)}
    shutil.copytree(out["sharded"] / "run", out["resumed"] / "run")
    ranks["resumed"] = _run(config, out["resumed"], *common, "steps=3", "resume=true", replay=recorded)
    ranks["straight"] = _run(config, out["straight"], *common, "steps=3", replay=recorded)
    return out, ranks


@pytest.fixture(scope="module")
def runs(ddp_run, tiny_model_dir, tmp_path_factory):
    """FSDP2: two steps, resumed to a third, and three uninterrupted."""
    return _sharded_runs("fsdp_cpu_2proc.yaml", ddp_run, tiny_model_dir, tmp_path_factory.mktemp("fsdp"))


def _checkpoint(folder, step: int):
    return folder / "run" / "checkpoints" / f"step-{step:06d}"


def test_fsdp_shards_the_parameters_over_two_cpu_processes(runs):
    _, ranks = runs
    fsdp, ddp = ranks["sharded"], ranks["ddp"]
    assert [r["distributed_type"] for r in fsdp] == ["DistributedType.FSDP"] * 2
    assert [r["distributed_type"] for r in ddp] == ["DistributedType.MULTI_CPU"] * 2
    for rank in fsdp:  # every parameter a DTensor, each rank holding its half
        assert rank["world"] == 2 and rank["dtensor_params"] == rank["params"] > 0
        assert rank["local_numel"] < rank["full_numel"]
    assert sum(r["local_numel"] for r in fsdp) == fsdp[0]["full_numel"]
    assert all(r["dtensor_params"] == 0 and r["local_numel"] == r["full_numel"] for r in ddp)


def test_fsdp_takes_the_full_logits_path(runs):
    _, ranks = runs
    assert all(r["logprob_heads"] == ["full"] for r in ranks["sharded"])
    assert all(r["logprob_heads"] == ["lean"] for r in ranks["ddp"])  # the path FSDP cannot take


def _matches_ddp(runs) -> None:
    out, ranks = runs
    ddp, sharded = ranks["ddp"][0]["steps"], ranks["sharded"][0]["steps"]
    assert [s["step"] for s in sharded] == [s["step"] for s in ddp] == [1, 2]
    assert all(r["replayed"] > 0 and r["own"] == 0 for r in ranks["sharded"])  # DDP's rollouts only
    assert all(s["grad_norm"] > 0 for s in ddp)
    for a, b in zip(ddp, sharded):
        print(f"step {a['step']}: |dloss| {abs(a['loss'] - b['loss']):.3g}, "
              f"|dgrad_norm|/grad_norm {abs(a['grad_norm'] - b['grad_norm']) / a['grad_norm']:.3g}")
        assert abs(a["loss"] - b["loss"]) < LOSS_TOL
        assert abs(a["grad_norm"] - b["grad_norm"]) < GRAD_NORM_RTOL * a["grad_norm"]
    wa = load_file(_checkpoint(out["ddp"], 2) / "model" / "model.safetensors")
    wb = load_file(_checkpoint(out["sharded"], 2) / "model" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(wa[k].shape == wb[k].shape for k in wa)  # whole tensors
    diff = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    print(f"max |dw| after two steps: {diff:.3g}")
    assert diff < WEIGHT_TOL


def _loads_in_a_one_process_eval(runs, tiny_model_dir) -> None:
    out, _ = runs
    model = _checkpoint(out["sharded"], 2) / "model"
    trained = load_file(model / "model.safetensors")
    initial = load_file(f"{tiny_model_dir}/model.safetensors")
    assert any(not torch.equal(trained[k], initial[k]) for k in initial)
    result = subprocess.run([sys.executable, "-m", "podsrl", "eval", f"model.name_or_path={model}", "task.test_size=4",
                             "rollout.max_new_tokens=4"], env=cpu_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["problems"] == 4 and 0.0 <= report["accuracy"] <= 1.0


def _resume_takes_the_uninterrupted_next_step(runs) -> None:
    out, ranks = runs
    straight, resumed = ranks["straight"][0]["steps"], ranks["resumed"][0]["steps"]
    assert [s["step"] for s in resumed] == [3]
    assert straight[:2] == ranks["sharded"][0]["steps"]  # the same run up to the checkpoint
    assert resumed[0] == straight[2]  # loss and gradient norm to the bit: weights and Adam state restored
    wa = load_file(_checkpoint(out["straight"], 3) / "model" / "model.safetensors")
    wb = load_file(_checkpoint(out["resumed"], 3) / "model" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_fsdp_matches_ddp(runs):
    _matches_ddp(runs)


def test_fsdp_checkpoint_loads_in_a_one_process_eval(runs, tiny_model_dir):
    _loads_in_a_one_process_eval(runs, tiny_model_dir)


def test_fsdp_resume_takes_the_uninterrupted_next_step(runs):
    _resume_takes_the_uninterrupted_next_step(runs)
    out, _ = runs
    saved = torch.load(_checkpoint(out["resumed"], 3) / "optimizer.pt", weights_only=True)
    shape = load_file(_checkpoint(out["resumed"], 3) / "model" / "model.safetensors")["model.embed_tokens.weight"].shape
    name = "model.embed_tokens.weight"  # the optimizer state is whole and named, not one rank's shard
    assert saved["state"][name]["exp_avg"].shape == shape and int(saved["state"][name]["step"]) == 3


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, tmp_path_factory):
    """LoRA under FSDP, one rollout per micro-batch; rank 1's groups carry no signal, so it trains
    fewer micro-batches than rank 0; one held-out problem, which only rank 0 generates for."""
    out = tmp_path_factory.mktemp("lora")
    ranks = _run("fsdp_cpu_2proc.yaml", out, *_common(tiny_model_dir), "steps=2", "beta=0", "model.lora_r=4",
                 "micro_batch_size=1", "rewards=[rewards_for_tests:varied_on_rank_zero]", "task.test_size=1",
                 timeout=300)  # ~20 s on an idle machine; a rank out of step hangs
    return out, ranks


def test_fsdp_lora_trains_and_checkpoints_the_adapter(lora_run, tiny_model_dir):
    from peft import get_peft_model_state_dict

    out, ranks = lora_run
    for rank in ranks:  # the frozen base and the adapter, both sharded
        assert rank["distributed_type"] == "DistributedType.FSDP" and rank["dtensor_params"] == rank["params"]
        assert rank["local_numel"] < rank["full_numel"] and rank["logprob_heads"] == ["full"]
    assert all(s["grad_norm"] > 0 for s in ranks[0]["steps"])
    adapter = load_file(_checkpoint(out, 2) / "model" / "adapter_model.safetensors")
    unsharded = get_peft_model_state_dict(models.add_lora(models.load_model(tiny_model_dir), 4, 8, 0.0, ["all-linear"]))
    assert {k: v.shape for k, v in adapter.items()} == {k: v.shape for k, v in unsharded.items()}  # whole, not shards
    assert all(not torch.equal(adapter[k], unsharded[k]) for k in adapter if "lora_B" in k)  # B starts at 0: trained


def test_fsdp_ranks_with_uneven_work_stay_in_step(lora_run):
    """Each forward and backward under FSDP is a collective: the rank with fewer micro-batches runs
    extra ones of zero weight, and generation on a gathered model lets rank 1 skip the evaluation
    that only rank 0 has a problem for. Either, missing, would hang the run."""
    _, ranks = lora_run
    assert [s["micro_batches"] for s in ranks[0]["steps"]] == [4, 4]  # 2 prompts x m = 2, one per micro-batch
    assert [s["micro_batches"] for s in ranks[1]["steps"]] == [1, 1]  # no signal: one kept, of advantage 0


def test_two_machine_ranks_over_loopback(runs, tiny_model_dir, tmp_path):
    """``--num_machines 2`` with machine ranks 0 and 1 on one host: the same training as the two
    processes of one machine, written by the main machine only."""
    out, ranks = runs
    port = str(free_port())
    machines = []
    for rank in (0, 1):
        launcher_args = ("--num_machines", "2", "--num_processes", "2", "--machine_rank", str(rank),
                         "--main_process_ip", "127.0.0.1", "--main_process_port", port)
        command = [sys.executable, "-m", "accelerate.commands.launch", *launcher_args, "--config_file",
                   str(REPO / "configs" / "accelerate" / "fsdp_cpu_2proc.yaml"), WORKER, str(tmp_path / "ranks"),
                   *_common(tiny_model_dir), "steps=2", f"output_dir={tmp_path / f'machine{rank}'}"]
        env = {**cpu_env(), "PODSRL_REPLAY_ROLLOUTS": str(out["ddp"] / "rollouts")}
        machines.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for machine in machines:
        _, err = machine.communicate(timeout=600)
        assert machine.returncode == 0, err[-4000:]
    two = [json.loads((tmp_path / "ranks" / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in two] == [2, 2] and two[0]["local_numel"] < two[0]["full_numel"]
    assert two[0]["steps"] == ranks["sharded"][0]["steps"]
    assert (tmp_path / "machine0" / "checkpoints" / "step-000002" / "model").is_dir()
    assert not (tmp_path / "machine1").exists()  # the main machine's output_dir is the run's


# DeepSpeed: the launcher and the runs need the package (not a dependency of podsrl). It installs
# from PyPI without a GPU (0.19.8 with torch 2.13 CPU ran these tests) and trains on CPU processes.
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="deepspeed is not installed (pip install deepspeed)")


@pytest.fixture(scope="module")
def zero2_runs(ddp_run, tiny_model_dir, tmp_path_factory):
    """DeepSpeed ZeRO-2: two steps, resumed to a third, and three uninterrupted."""
    return _sharded_runs("deepspeed_zero2_cpu_2proc.yaml", ddp_run, tiny_model_dir, tmp_path_factory.mktemp("zero2"))


@needs_deepspeed
def test_deepspeed_zero2_partitions_the_optimizer_state(zero2_runs):
    _, ranks = zero2_runs
    for rank in ranks["sharded"]:  # each rank's Adam holds half the fp32 weights; the model is whole
        assert rank["distributed_type"] == "DistributedType.DEEPSPEED" and rank["world"] == 2
        assert rank["optimizer_numel"] * 2 == rank["full_numel"] == rank["local_numel"]
        assert rank["logprob_heads"] == ["lean"]  # the output layer is whole: no [N, C, V] logits


@needs_deepspeed
def test_deepspeed_zero2_matches_ddp(zero2_runs):
    _matches_ddp(zero2_runs)


@needs_deepspeed
def test_deepspeed_zero2_checkpoint_loads_in_a_one_process_eval(zero2_runs, tiny_model_dir):
    _loads_in_a_one_process_eval(zero2_runs, tiny_model_dir)


@needs_deepspeed
def test_deepspeed_zero2_resume_takes_the_uninterrupted_next_step(zero2_runs):
    _resume_takes_the_uninterrupted_next_step(zero2_runs)
    out, _ = zero2_runs
    state = _checkpoint(out["resumed"], 3) / "deepspeed" / "state"  # one optimizer partition per rank
    assert sorted(p.name for p in state.glob("zero_pp_rank_*_optim_states.pt")) == [
        "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]


@needs_deepspeed
def test_deepspeed_zero3_is_refused_in_one_line(tiny_model_dir, tmp_path):
    result = launch("deepspeed_zero3_cpu_2proc.yaml", "-m", "podsrl", "train", f"model.name_or_path={tiny_model_dir}",
                    "prompts_per_step=2", "n=2", "m=2", "steps=1", f"output_dir={tmp_path / 'run'}", timeout=300)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("podsrl: error:")]
    assert errors and all("ZeRO-3 is not supported" in line for line in errors)
    assert not (tmp_path / "run").exists()


@needs_deepspeed
def test_deepspeed_checkpoint_resumes_only_under_deepspeed(zero2_runs, tiny_model_dir, tmp_path):
    """Its optimizer state is DeepSpeed's partitions: a one-process run refuses it in one line
    and leaves the run folder as it was."""
    out, _ = zero2_runs
    shutil.copytree(out["sharded"] / "run", tmp_path / "run")
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "run").rglob("*"))
    result = subprocess.run([sys.executable, "-m", "podsrl", "train", *_common(tiny_model_dir), "steps=3", "resume=true",
                             f"output_dir={tmp_path / 'run'}"], env=cpu_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (f"podsrl: error: checkpoint {tmp_path / 'run' / 'checkpoints' / 'step-000002'}"
                                                      " holds DeepSpeed optimizer state: resume it under DeepSpeed")
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "run").rglob("*")) == before


def test_fsdp_with_adaptive_sampling_matches_ddp(tiny_model_dir, tmp_path):
    """Every sampling option on: generation in rounds (adaptive_n), whose count may differ between
    ranks, runs on the gathered model, and, trained on DDP's rollouts, the run is DDP's within
    the tolerances (measured: |Δloss| 0, |Δgrad_norm|/grad_norm 2.4e-7 and 1.5e-7; two rounds in
    each step, no prompt skipped or group dropped in these two steps). One held-out problem: rank
    1 has none to evaluate, and the evaluations (at step 0 and the end) still finish on both."""
    options = ["adaptive_n=true", "adaptive_round=2", "prompt_filter=history", "dynamic_sampling=true", "n=8",
               "m=2", "steps=2", "task.test_size=1"]
    recorded = tmp_path / "rollouts"
    runs = {"ddp": _run("cpu_2proc.yaml", tmp_path / "ddp", *_common(tiny_model_dir), *options, record=recorded),
            "fsdp": _run("fsdp_cpu_2proc.yaml", tmp_path / "fsdp", *_common(tiny_model_dir), *options, replay=recorded)}
    assert all(r["replayed"] > 0 and r["own"] == 0 for r in runs["fsdp"])
    assert runs["fsdp"][0]["dtensor_params"] == runs["fsdp"][0]["params"]
    metrics = {kind: [r for r in read_metrics(tmp_path / kind / "run" / "metrics.jsonl") if r["step"] > 0] for kind in runs}
    keys = ["rollouts_generated", "prompts_skipped", "groups_filtered", "dynamic_rounds", "adaptive_rounds",
            "trained_sequences", "generated_reward_mean"]
    assert [[r[k] for k in keys] for r in metrics["ddp"]] == [[r[k] for k in keys] for r in metrics["fsdp"]]
    assert any(r["adaptive_rounds"] > 1 for r in metrics["fsdp"])  # a prompt took more than one round
    for a, b in zip(runs["ddp"][0]["steps"], runs["fsdp"][0]["steps"]):
        assert abs(a["loss"] - b["loss"]) < LOSS_TOL
        assert abs(a["grad_norm"] - b["grad_norm"]) < GRAD_NORM_RTOL * a["grad_norm"]


def test_fsdp_with_vllm_pushes_once_per_phase_on_every_rank(tiny_model_dir, tmp_path):
    """The vLLM engine under FSDP2 (around tests/fake_vllm.py's stand-in, whose samples depend on
    their seeds alone): the ranks take different numbers of generate calls (adaptive_n rounds,
    dynamic sampling's batches, an evaluation with one problem, which rank 1 does not generate
    for), yet each push, a chain of collectives, happens at the same points on both; nothing is
    unsharded for generation; the run finishes (a rank out of step would hang until the timeout)
    and trains as one process does on the same rollouts."""
    options = [*_common(tiny_model_dir), "rollout.engine=vllm", "adaptive_n=true", "adaptive_round=2", "n=8", "m=4",
               "dynamic_sampling=true", "dynamic_sampling_rounds=2", "task.test_size=1", "steps=2"]
    env = {**cpu_env(), "PODSRL_FAKE_VLLM": "1"}
    one = subprocess.run([sys.executable, WORKER, str(tmp_path / "one" / "ranks"), *options,
                          f"output_dir={tmp_path / 'one' / 'run'}"], env=env, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-4000:]
    result = launch("fsdp_cpu_2proc.yaml", WORKER, str(tmp_path / "two" / "ranks"), *options,
                    f"output_dir={tmp_path / 'two' / 'run'}", env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    single = json.loads((tmp_path / "one" / "ranks" / "rank0.json").read_text())
    ranks = [json.loads((tmp_path / "two" / "ranks" / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["distributed_type"] == "DistributedType.FSDP" and r["dtensor_params"] == r["params"] for r in ranks)
    pushes = [[e for e in r["calls"] if e in ("push", "update")] for r in ranks]
    assert pushes[0] == pushes[1] == ["push", "update", "push", "update", "push"]  # before each step, and the eval
    assert ranks[0]["calls"].count("generate") != ranks[1]["calls"].count("generate")
    assert ranks[0]["pushed"] == ranks[1]["pushed"]  # the same whole weights on both ranks
    assert all(r["unshards"] == 0 for r in ranks)  # vLLM generates: no FSDP module gathered for it
    for a, b in zip(single["push_sums"], ranks[0]["push_sums"]):
        assert abs(a - b) < 1e-6 * a
    for a, b in zip(single["steps"], ranks[0]["steps"]):
        assert abs(a["loss"] - b["loss"]) < LOSS_TOL
        assert abs(a["grad_norm"] - b["grad_norm"]) < GRAD_NORM_RTOL * a["grad_norm"]


def test_fsdp1_is_refused_on_every_device(monkeypatch):
    """On GPUs accelerate applies an FSDP1 config itself; on CPU processes podsrl does: refused
    in one line either way."""
    from types import SimpleNamespace

    from accelerate import DistributedType

    from podsrl import sharding
    from podsrl.errors import PodsError

    class GPUAccelerator:  # what accelerate builds on GPU processes from an fsdp_version: 1 config
        def __init__(self, cpu=False, **kwargs):
            self.distributed_type = DistributedType.FSDP
            self.state = SimpleNamespace(fsdp_plugin=SimpleNamespace(fsdp_version=1))

    monkeypatch.setattr(sharding, "Accelerator", GPUAccelerator)
    monkeypatch.setattr(sharding, "cpu_processes", lambda: False)
    with pytest.raises(PodsError, match=r"^FSDP needs fsdp_version: 2 in the accelerate config \(got 1\); FSDP1 is not supported$"):
        sharding.make_accelerator()


def test_fsdp1_on_cpu_processes_is_refused_in_one_line(tiny_model_dir, tmp_path):
    config = tmp_path / "fsdp1.yaml"
    config.write_text((REPO / "configs" / "accelerate" / "fsdp_cpu_2proc.yaml").read_text().replace("fsdp_version: 2", "fsdp_version: 1"))
    assert "fsdp_version: 1" in config.read_text()
    result = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--main_process_port", str(free_port()),
                             "--config_file", str(config), "-m", "podsrl", "train", f"model.name_or_path={tiny_model_dir}",
                             "prompts_per_step=2", "n=2", "m=2", "steps=1", f"output_dir={tmp_path / 'run'}"],
                            env=cpu_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("podsrl: error:")]
    assert errors and all(line.endswith("FSDP1 is not supported") for line in errors)
    assert not (tmp_path / "run").exists()


def test_the_fsdp2_state_read_exists_in_this_torch():
    """sharding.py reads whether an FSDP2 module reshards after its forward from torch's private
    FSDP state (no public getter); the attribute it reads is there in the installed torch."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule, fully_shard

    from podsrl.sharding import _reshards_after_forward, whole_for_generation

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
        fully_shard(model[0])
        fully_shard(model[1], reshard_after_forward=False)
        fully_shard(model)
        assert isinstance(model[0], FSDPModule)
        assert _reshards_after_forward(model[0]) and not _reshards_after_forward(model[1])
        with whole_for_generation(model):
            assert not _reshards_after_forward(model[0])
        assert _reshards_after_forward(model[0]) and not _reshards_after_forward(model[1])  # restored
    finally:
        dist.destroy_process_group()
