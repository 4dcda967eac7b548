"""PODS samplers for verl's v1 trainer (``podsrl.integrations.verl``) against verl's real
``ReplayBuffer``/``ReplayBufferAsync``, built as verl's trainer builds them
(``PPOTrainer._build_replay_buffer`` on verl's own composed config), with a real TransferQueue on a
local Ray. ``make test`` runs this file in .venv-verl (verl 0.9.1); elsewhere it is skipped.

Groups are put in TransferQueue as verl's agent loop writes them: a prompt key ``{uid}`` tagged
``is_prompt``/``status``/``global_steps``, and one trajectory ``{uid}_{session}_0`` per session
whose ``rm_scores`` hold the reward on the last response token."""

import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

verl = pytest.importorskip("verl", reason="needs verl (make test runs this file in .venv-verl, with verl 0.9.1)")

import ray  # noqa: E402
import torch  # noqa: E402
import transfer_queue as tq  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import PPOTrainer  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402

from conftest import REPO, install_command  # noqa: E402
from podsrl.downsample import RULES, select  # noqa: E402
from podsrl.integrations.verl import PODSReplayBuffer, PODSReplayBufferAsync, check_verl_version  # noqa: E402

VERL_CONFIG = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
MODES = ["sync", "colocate_async"]
N, M = 8, 4
# rewards per group, in session order: binary, ties, all equal, distinct
GROUPS = {
    "g0": [1, 0, 0, 1, 0, 1, 1, 0],
    "g1": [0.5, 0.5, 1, 1, 0, 0, 0.5, 0.5],
    "g2": [1, 1, 1, 1, 1, 1, 1, 1],
    "g3": [0.1, 0.9, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6],
}


@pytest.fixture(scope="module", autouse=True)
def transfer_queue():
    """A local Ray with 8 logical CPUs: TransferQueue's controller and storage units are actors that
    each ask for one, and on a 2-core machine a default ray.init() leaves them waiting."""
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    tq.init()
    yield
    tq.close()
    ray.shutdown()


@pytest.fixture(autouse=True)
def empty_queue():
    yield
    for partition, items in (tq.kv_list() or {}).items():
        if items:
            tq.kv_clear(keys=list(items), partition_id=partition)


def config(*overrides: str, mode: str = "sync", pods_m=M, sampler: str | None = "pods"):
    """verl's own trainer config (ppo_trainer.yaml) with GRPO, n = N, and PODS's sampler."""
    pods = []
    if sampler == "pods":
        name = "PODSReplayBuffer" if mode == "sync" else "PODSReplayBufferAsync"
        pods = ["trainer.v1.sampler.custom_sampler.path=pkg://podsrl.integrations.verl",
                f"trainer.v1.sampler.custom_sampler.name={name}"]
        if pods_m is not None:
            pods.append(f"+trainer.v1.sampler.sampler_kwargs.pods_m={pods_m}")
    with initialize_config_dir(config_dir=VERL_CONFIG, version_base=None):
        return compose("ppo_trainer", overrides=[
            "algorithm.adv_estimator=grpo", f"actor_rollout_ref.rollout.n={N}", f"trainer.v1.trainer_mode={mode}",
            "data.train_batch_size=4", f"actor_rollout_ref.actor.ppo_mini_batch_size={M * 4 // N}", *pods, *overrides])


def build(cfg, refill=None):
    """The replay buffer as verl's trainer builds it (``PPOTrainer._build_replay_buffer``)."""
    trainer = SimpleNamespace(config=cfg, trainer_mode=cfg.trainer.v1.trainer_mode,
                              _add_prompts_to_generate=refill or (lambda k: pytest.fail(f"unexpected refill of {k}")))
    trainer._resolve_filter_groups_metric = lambda: PPOTrainer._resolve_filter_groups_metric(trainer)
    buffer = PPOTrainer._build_replay_buffer(trainer)
    buffer.poll_interval = 0.05
    return buffer


def put_group(uid: str, rewards, global_steps: int = 1, status: str | None = "finished", order=None):
    """A prompt and its sessions' trajectories (written in ``order`` of sessions), then its status;
    responses of 3 or 4 tokens, the reward on the last, as verl's agent loop stores them."""
    tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": "running", "global_steps": global_steps})
    sessions = list(order if order is not None else range(len(rewards)))
    fields = [{"uid": uid, "response_mask": torch.ones(3 + s % 2, dtype=torch.int64),
               "rm_scores": torch.tensor([0.0] * (2 + s % 2) + [float(rewards[s])])} for s in sessions]
    tags = [{"status": "success", "global_steps": global_steps, "seq_len": 5 + s % 2} for s in sessions]
    if sessions:
        tq.kv_batch_put(keys=[f"{uid}_{s}_0" for s in sessions], partition_id="train",
                        fields=list_of_dict_to_tensordict(fields), tags=tags)
    if status:
        finish(uid, status)


def finish(uid: str, status: str = "finished"):
    tq.kv_put(key=uid, partition_id="train", tag={"status": status})


def stored() -> set[str]:
    return set((tq.kv_list("train") or {}).get("train", {}))


def expected(groups: dict, m: int = M, rule: str = "max_variance", seed: int = 0) -> set[str]:
    """podsrl's selection on the same rewards, groups in uid order, sessions in session order."""
    uids = sorted(groups)
    idx = select(torch.tensor([groups[u] for u in uids], dtype=torch.float64), m, rule,
                 torch.Generator().manual_seed(seed))
    return {f"{u}_{i}_0" for u, row in zip(uids, idx.tolist()) for i in row}


def variance(groups: dict, keys: set[str] | None = None) -> float:
    values = [torch.tensor([r for i, r in enumerate(rs) if keys is None or f"{u}_{i}_0" in keys], dtype=torch.float64)
              for u, rs in groups.items()]
    return float(torch.stack([v.var(unbiased=False) for v in values]).mean())


# --------------------------------------------------------------------------- the kept keys


@pytest.mark.parametrize("mode", MODES)
def test_keys_are_podsrls_selection_groups_finishing_out_of_order(mode):
    buffer = build(config(mode=mode))
    assert isinstance(buffer, PODSReplayBuffer if mode == "sync" else PODSReplayBufferAsync)
    for uid, order in zip(GROUPS, ([3, 1, 7, 0, 2, 6, 4, 5], None, [7, 6, 5, 4, 3, 2, 1, 0], None)):
        put_group(uid, GROUPS[uid], status=None, order=order)
    put_group("g4", [0, 1, 1, 0, 0, 0, 0, 1], status=None)  # still running when the batch is sampled
    for uid in ("g3", "g1", "g0", "g2"):
        finish(uid)

    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=4)
    want = expected(GROUPS)
    assert set(batch.keys) == want and len(batch.keys) == len(want) == 4 * M
    assert all(tag["status"] == "success" for tag in batch.tags)
    assert metrics["training/pods/kept_share"] == M / N
    assert metrics["training/pods/reward_variance_before"] == pytest.approx(variance(GROUPS))
    assert metrics["training/pods/reward_variance_after"] == pytest.approx(variance(GROUPS, want))
    # the dropped trajectories are gone; the kept ones stay for the trainer, which clears them after the update
    assert stored() == want | {"g4", *(f"g4_{i}_0" for i in range(N))}

    finish("g4")
    batch, _ = buffer.sample(global_steps=2, partition_id="train", batch_size=1)
    assert set(batch.keys) == expected({"g4": [0, 1, 1, 0, 0, 0, 0, 1]})


@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_rule_keeps_podsrls_selection(rule):
    buffer = build(config(f"+trainer.v1.sampler.sampler_kwargs.pods_rule={rule}",
                          "+trainer.v1.sampler.sampler_kwargs.pods_seed=7"))
    for uid, rewards in GROUPS.items():
        put_group(uid, rewards)
    batch, _ = buffer.sample(global_steps=1, partition_id="train", batch_size=4)
    assert set(batch.keys) == expected(GROUPS, rule=rule, seed=7)


def test_verls_advantages_on_the_batch_are_normalised_over_the_kept_m():
    """verl's own ``_compute_advantage`` (GRPO: (r - mean) / (std + 1e-6), torch's unbiased std,
    over each uid's rows in the batch) on the batch the sampler returns."""
    cfg = config()
    buffer = build(cfg)
    for uid, rewards in GROUPS.items():
        put_group(uid, rewards)
    batch, _ = buffer.sample(global_steps=1, partition_id="train", batch_size=4)
    PPOTrainer._compute_advantage(SimpleNamespace(config=cfg), batch, {})
    advantages = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["advantages"])["advantages"]
    for key, advantage in zip(batch.keys, advantages, strict=True):
        uid, session = key.split("_")[0], int(key.split("_")[1])
        kept = torch.tensor([GROUPS[uid][int(k.split("_")[1])] for k in batch.keys if k.startswith(f"{uid}_")],
                            dtype=torch.float32)
        assert len(kept) == M
        want = (GROUPS[uid][session] - kept.mean()) / (kept.std() + 1e-6)
        assert torch.allclose(advantage, torch.full_like(advantage, float(want)), atol=1e-5)


def test_a_group_short_of_m_after_failures_is_kept_whole():
    buffer = build(config())
    put_group("g0", GROUPS["g0"])
    put_group("g5", [0, 1, 1], status="failure")  # 3 of 8 sessions came back: verl samples what there is
    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=2)
    assert set(batch.keys) == expected({"g0": GROUPS["g0"]}) | {"g5_0_0", "g5_1_0", "g5_2_0"}
    assert metrics["training/pods/kept_share"] == (M + 3) / (N + 3)


@pytest.mark.parametrize("mode", MODES)
def test_at_m_equal_n_the_batch_is_verls_own(mode):
    batches = []
    for cfg in (config(mode=mode, sampler=None), config(mode=mode, pods_m=N)):
        buffer = build(cfg)
        for uid, rewards in GROUPS.items():
            put_group(uid, rewards, order=[1, 0, 2, 3, 4, 5, 7, 6])
        batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=4)
        batches.append((batch.keys, batch.tags, {k: v for k, v in metrics.items() if "/pods/" not in k}))
        tq.kv_clear(keys=batch.keys, partition_id="train")
    assert batches[0] == batches[1]
    assert len(batches[0][0]) == 4 * N


def test_settings_made_apart_from_verls_config_work_without_its_sizes():
    buffer = PODSReplayBuffer(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=8,
                              max_off_policy_strategy="drop", sampler_kwargs={"pods_m": M}, poll_interval=0.05)
    for uid, rewards in GROUPS.items():
        put_group(uid, rewards)
    batch, _ = buffer.sample(global_steps=1, partition_id="train", batch_size=4)
    assert set(batch.keys) == expected(GROUPS)
    with pytest.raises(ValueError, match=r"pods_m must be an integer in 2\.\.actor_rollout_ref\.rollout\.n = "
                                         r"2\.\.rollout\.n, got 1"):
        PODSReplayBufferAsync(trainer_mode="separate_async", trainer_config={}, max_off_policy_threshold=8,
                              max_off_policy_strategy="drop", sampler_kwargs={"pods_m": 1})


def test_validation_batches_are_returned_whole():
    buffer = build(config())
    tq.kv_put(key="v0", partition_id="val", tag={"is_prompt": True, "status": "finished", "global_steps": 1})
    keys = [f"v0_{i}_0" for i in range(N)]
    tq.kv_batch_put(keys=keys, partition_id="val", tags=[{"status": "success", "seq_len": 5} for _ in keys])
    batch, metrics = buffer.sample(global_steps=1, partition_id="val", batch_size=1)
    assert sorted(batch.keys) == keys and not any("pods" in k for k in metrics)


# --------------------------------------------------------------------------- verl's own sampling kept


REFILLED = [0, 1, 0, 1, 1, 0, 0, 0]


class Refills:
    """A refill function like the trainer's: records each request and submits that many fresh
    groups, finished, each one global step later than the last (so that verl's choice among
    sampleable groups, oldest first, is deterministic)."""

    def __init__(self):
        self.calls: list[int] = []

    def __call__(self, k: int) -> None:
        self.calls.append(k)
        for i in range(k):
            put_group(f"r{len(self.calls)}x{i}", REFILLED, global_steps=2 + i)


@pytest.mark.parametrize("mode", MODES)
def test_dapo_filtered_groups_are_gone_and_refilled_as_verl_refills(mode):
    dapo = ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=reward"]
    groups = {"a": [1] * N, "b": GROUPS["g0"], "c": [0] * N, "d": GROUPS["g3"]}
    runs = []
    for cfg in (config(*dapo, mode=mode, sampler=None), config(*dapo, mode=mode)):
        refills = Refills()
        buffer = build(cfg, refill=refills)
        for uid, rewards in groups.items():
            put_group(uid, rewards)
        batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=3)  # 2 left after filtering
        uids = {key.split("_")[0] for key in batch.keys}
        runs.append((refills.calls, uids, {k: v for k, v in metrics.items() if "/pods/" not in k}, set(batch.keys)))
        assert not {key for key in stored() if key.split("_")[0] in ("a", "c")}  # the filtered groups are gone
        tq.kv_clear(keys=sorted(stored()), partition_id="train")
    (verl_calls, verl_uids, verl_metrics, _), (calls, uids, metrics, keys) = runs
    assert calls == verl_calls and uids == verl_uids == {"b", "d", "r1x0"} and metrics == verl_metrics
    assert calls == ([2 * 2] if mode == "sync" else [2])  # verl's matrix: sync refills 2k, async k, for k filtered
    assert metrics["training/filter_groups/evicted_samples"] == 2
    assert keys == expected({"b": groups["b"], "d": groups["d"], "r1x0": REFILLED})


def test_a_failed_group_is_refilled_as_verl_refills_it():
    """trainer.v1.sampler.sync_refill_failed_groups: a group whose sessions all failed is replaced."""
    runs = []
    for cfg in (config("trainer.v1.sampler.sync_refill_failed_groups=True", sampler=None),
                config("trainer.v1.sampler.sync_refill_failed_groups=True")):
        refills = Refills()
        buffer = build(cfg, refill=refills)
        put_group("a", GROUPS["g0"])
        put_group("b", [], status="failure")  # no session came back
        batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=2)
        runs.append((refills.calls, {key.split("_")[0] for key in batch.keys},
                     {k: v for k, v in metrics.items() if "/pods/" not in k}, set(batch.keys)))
        tq.kv_clear(keys=sorted(stored()), partition_id="train")
    (verl_calls, verl_uids, verl_metrics, _), (calls, uids, metrics, keys) = runs
    assert calls == verl_calls == [1] and uids == verl_uids == {"a", "r1x0"} and metrics == verl_metrics
    assert keys == expected({"a": GROUPS["g0"], "r1x0": REFILLED})


@pytest.mark.parametrize("mode", MODES)
def test_a_stale_group_is_evicted_as_verl_evicts_it(mode):
    """Asynchronously a group over max_off_policy_threshold is dropped and refilled; synchronous
    sampling is on-policy and leaves it (verl's matrix: a no-op there)."""
    stale = ["trainer.v1.sampler.max_off_policy_threshold=2", "trainer.v1.sampler.max_off_policy_strategy=drop"]
    groups = {"old": GROUPS["g0"], "new1": GROUPS["g1"], "new2": GROUPS["g3"]}
    runs = []
    for cfg in (config(*stale, mode=mode, sampler=None), config(*stale, mode=mode)):
        calls = []
        buffer = build(cfg, refill=calls.append)
        for uid, rewards in groups.items():  # old spans 3 model versions at step 3: over the threshold
            put_group(uid, rewards, global_steps=1 if uid == "old" else 3)
        batch, metrics = buffer.sample(global_steps=3, partition_id="train", batch_size=2 if mode != "sync" else 3)
        assert mode == "sync" or not {key for key in stored() if key.startswith("old")}  # evicted: gone
        runs.append((calls, {key.split("_")[0] for key in batch.keys},
                     {k: v for k, v in metrics.items() if "/pods/" not in k}, set(batch.keys)))
        tq.kv_clear(keys=sorted(stored()), partition_id="train")
    (verl_calls, verl_uids, verl_metrics, _), (calls, uids, metrics, keys) = runs
    assert calls == verl_calls and uids == verl_uids and metrics == verl_metrics
    if mode == "sync":
        assert calls == [] and uids == set(groups) and keys == expected(groups)
    else:
        assert calls == [1] and uids == {"new1", "new2"} and metrics["training/off_policy/evicted_samples"] == 1
        assert keys == expected({"new1": groups["new1"], "new2": groups["new2"]})


# --------------------------------------------------------------------------- settings refused


def refusal(cfg) -> str:
    with pytest.raises(ValueError) as e:
        build(cfg)
    message = str(e.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("pods_m", [0, 1, N + 1, 2.5, "'4'", "true"])
def test_a_bad_pods_m_is_one_clear_error(pods_m):
    message = refusal(config(pods_m=pods_m))
    assert message.startswith(f"trainer.v1.sampler.sampler_kwargs.pods_m must be an integer in "
                              f"2..actor_rollout_ref.rollout.n = 2..{N}, got ")


def test_a_missing_pods_m_or_unknown_setting_is_one_clear_error():
    assert refusal(config(pods_m=None)) == (
        "set the rollouts PODS keeps per prompt: +trainer.v1.sampler.sampler_kwargs.pods_m=M")
    unknown = refusal(config("+trainer.v1.sampler.sampler_kwargs.m=4"))
    assert "unknown trainer.v1.sampler.sampler_kwargs ['m']" in unknown
    assert "unknown trainer.v1.sampler.sampler_kwargs.pods_rule 'best'" in refusal(
        config("+trainer.v1.sampler.sampler_kwargs.pods_rule=best"))


def test_mini_batches_verl_would_pad_are_refused_with_the_size_to_set():
    # GSM8K's GRPO example (512 prompts, mini-batches of 256, n = 5) moved to n = 16 without a new mini-batch
    cfg = config("data.train_batch_size=512", "actor_rollout_ref.rollout.n=16",
                 "actor_rollout_ref.actor.ppo_mini_batch_size=256")
    assert f"ValueError: {refusal(cfg)}\n" in (REPO / "docs" / "verl.md").read_text()  # quoted there
    assert refusal(cfg) == (
        "PODS keeps data.train_batch_size / parameter_sync_step x pods_m = 512 / 1 x 4 = 2048 trajectories per "
        "update, not a multiple of actor_rollout_ref.actor.ppo_mini_batch_size x rollout.n = 256 x 16 = 4096 (verl "
        "would pad them with no-op rows): set actor_rollout_ref.actor.ppo_mini_batch_size=128 (mini-batches of "
        "2048 trajectories, 1 per update)")
    # separate_async samples train_batch_size / parameter_sync_step prompts per update
    cfg = config("data.train_batch_size=512", "actor_rollout_ref.rollout.n=16",
                 "actor_rollout_ref.actor.ppo_mini_batch_size=64", mode="separate_async")
    assert "512 / 4 x 4 = 512 trajectories" in refusal(cfg) and "ppo_mini_batch_size=32 " in refusal(cfg)
    # where no mini-batch fits, the prompts per step must change: 3 x 4 = 12 kept, not a multiple of n = 8
    cfg = config("data.train_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=1")
    assert refusal(cfg).endswith("(verl would pad them with no-op rows): set data.train_batch_size to a multiple of 2")


def test_other_trainer_settings_are_refused_in_one_line():
    sync_sampler = ["trainer.v1.sampler.custom_sampler.path=pkg://podsrl.integrations.verl",
                    "trainer.v1.sampler.custom_sampler.name=PODSReplayBuffer",
                    f"+trainer.v1.sampler.sampler_kwargs.pods_m={M}"]
    assert refusal(config(*sync_sampler, mode="colocate_async", sampler=None)) == (
        "PODSReplayBuffer serves trainer.v1.trainer_mode in ['sync'], not 'colocate_async': "
        "set trainer.v1.sampler.custom_sampler.name=PODSReplayBufferAsync")
    assert refusal(config("reward.reward_model.enable=True")).startswith(
        "PODS reads the rewards when it samples, before verl runs a colocated reward model")
    assert refusal(config("algorithm.adv_estimator=gae")).startswith("PODS selects rollouts within prompt groups")


def test_the_docs_override_list_builds_the_sampler():
    """The PODS lines of docs/verl.md on top of verl's GSM8K GRPO example's batch sizes."""
    page = (REPO / "docs" / "verl.md").read_text()
    block = re.search(r"```bash\n((?:(?!```).)*custom_sampler(?:(?!```).)*)```", page, re.S).group(1)
    overrides = [line.strip().rstrip("\\").strip() for line in block.splitlines()
                 if re.match(r"\s*\+?(trainer|actor_rollout_ref|data|algorithm)\.", line)]
    assert any("pods_m" in o for o in overrides)
    cfg = config("data.train_batch_size=512", "actor_rollout_ref.actor.ppo_mini_batch_size=256",
                 "actor_rollout_ref.rollout.n=5", *overrides, sampler=None)
    buffer = build(cfg)
    settings = dict(o.lstrip("+").split("=", 1) for o in overrides)
    assert isinstance(buffer, PODSReplayBuffer)
    assert buffer.pods.m == int(settings["trainer.v1.sampler.sampler_kwargs.pods_m"])
    assert cfg.actor_rollout_ref.rollout.n == int(settings["actor_rollout_ref.rollout.n"]) > buffer.pods.m


def test_import_without_verl_names_the_install_command():
    code = ("import sys\nsys.modules['verl'] = None  # as if verl were not installed\n"
            "try:\n    import podsrl.integrations.verl\nexcept ImportError as e:\n    print(type(e).__name__, e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.stdout.strip() == (
        f"ImportError podsrl.integrations.verl needs verl (verl>=0.9.1,<0.10): {install_command('verl')}")


@pytest.mark.parametrize("version", ["0.9.0", "0.10.0", "1.0", "unknown"])
def test_another_verl_version_is_refused(version):
    with pytest.raises(ImportError, match=rf"supports verl>=0\.9\.1,<0\.10 .*found verl {version}\. "
                                          "Install a supported one: " + re.escape(install_command("verl"))):
        check_verl_version(version)
    check_verl_version("0.9.1")
    check_verl_version("0.9.2")
