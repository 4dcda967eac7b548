"""PODS for verl users: samplers for verl's v1 trainer that keep m of each prompt's n rollouts
(Xu et al., 2025, arXiv 2504.13818).

verl's v1 trainer (``trainer.use_v1=True``, verl's default) builds its replay buffer from
``trainer.v1.sampler.custom_sampler.{path,name}`` and passes ``trainer.v1.sampler.sampler_kwargs``
to it. :class:`PODSReplayBuffer` (``trainer.v1.trainer_mode=sync``) and
:class:`PODSReplayBufferAsync` (``colocate_async``, ``separate_async``) are verl's own
``ReplayBuffer`` and ``ReplayBufferAsync`` with one step added to ``sample()``:

  1. verl's ``sample()`` runs unchanged: it waits for finished prompt groups, evicts stale groups
     (``max_off_policy_threshold``), DAPO-filtered groups (``algorithm.filter_groups``) and failed
     ones, asks for refills, and picks ``batch_size`` prompts; it returns their trajectory keys;
  2. the rewards of those trajectories are read from TransferQueue (``rm_scores``, summed over the
     response, of each session's final output: the reward verl's GRPO advantage uses);
  3. ``podsrl.downsample.select`` keeps ``pods_m`` sessions of each prompt (max-variance by
     default); a session's outputs are kept or dropped together;
  4. the dropped trajectories are cleared from TransferQueue, and the batch returned holds the kept
     keys only, so verl's advantages (``_compute_advantage``, grouped by uid) are normalised over
     the kept m, and every later stage (log-probs, balancing, the update) sees the kept rows;
  5. metrics under verl's names: ``training/pods/kept_share`` (kept trajectories over sampled),
     ``training/pods/reward_variance_before`` and ``_after`` (the mean over prompts of the
     rewards' variance over all n sessions, then over the kept m).

Validation batches (partition ``val``) are returned whole. Settings, in ``sampler_kwargs``:
``pods_m`` (required, 2..``actor_rollout_ref.rollout.n``), ``pods_rule`` (a name in
``podsrl.downsample.RULES``, ``max_variance`` by default) and ``pods_seed`` (for the random rules).

Batch sizes. verl counts ``data.train_batch_size`` and ``ppo_mini_batch_size`` in prompts and
multiplies the mini-batch by ``rollout.n`` to get trajectories; a step samples
``train_batch_size / parameter_sync_step`` prompts per update, which PODS turns into that many
times ``pods_m`` trajectories, not times n. verl pads a batch that is not a multiple of the
mini-batch with no-op rows, so a setting where ``ppo_mini_batch_size * n`` does not divide the kept
trajectories is refused at construction with the value to set (``ppo_mini_batch_size`` scaled by
m / n keeps GRPO's number of optimizer steps per step). Micro-batching (per-GPU sizes, or tokens
with ``use_dynamic_bsz``) and verl's sequence-length balancing act inside those mini-batches and
need no change.

verl passes custom samplers neither the DAPO settings nor the batch sizes; they are read from the
trainer's config, of which ``sampler_kwargs`` is a node (``OmegaConf.select`` with a relative key).
"""

from __future__ import annotations

import math
import numbers
from collections import defaultdict
from dataclasses import dataclass

import torch
from packaging.version import Version

from podsrl.downsample import RULES, select
from podsrl.integrations import import_required, refuse_unsupported

SUPPORTED_VERL = (Version("0.9.1"), Version("0.10"))  # tested: [low, high)
METRICS_PREFIX = "training/pods/"
_ROOT = "....."  # from trainer.v1.sampler.sampler_kwargs up to the trainer's whole config


def check_verl_version(version: str) -> None:
    """Refuse a verl version this integration was not tested with: it builds on verl's replay buffer."""
    refuse_unsupported("podsrl.integrations.verl", "verl", version, SUPPORTED_VERL)


check_verl_version(import_required("podsrl.integrations.verl", "verl", SUPPORTED_VERL, "verl").__version__)

import transfer_queue as tq  # noqa: E402  (after the version check)
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from omegaconf.errors import ConfigKeyError  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync  # noqa: E402


@dataclass(frozen=True)
class PODSSettings:
    """The down-sampling settings of ``trainer.v1.sampler.sampler_kwargs``."""

    m: int
    """``pods_m``: sessions (rollouts) kept per prompt, 2 <= m <= ``actor_rollout_ref.rollout.n``."""
    rule: str = "max_variance"
    """``pods_rule``: a rule of ``podsrl.downsample.RULES``."""
    seed: int = 0
    """``pods_seed``: seeds the random source of stochastic rules (``random``)."""


def pods_settings(sampler_kwargs, n: int | None) -> PODSSettings:
    """The settings in ``sampler_kwargs``; ``ValueError`` names the first bad one."""
    kwargs = dict(sampler_kwargs or {})
    unknown = sorted(set(kwargs) - {"pods_m", "pods_rule", "pods_seed"})
    if unknown:
        raise ValueError(f"unknown trainer.v1.sampler.sampler_kwargs {unknown}; known: pods_m, pods_rule, pods_seed")
    if "pods_m" not in kwargs:
        raise ValueError("set the rollouts PODS keeps per prompt: +trainer.v1.sampler.sampler_kwargs.pods_m=M")
    m, top = kwargs["pods_m"], n if n is not None else "rollout.n"
    if isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 2 or (n is not None and m > n):
        raise ValueError(
            f"trainer.v1.sampler.sampler_kwargs.pods_m must be an integer in 2..actor_rollout_ref.rollout.n = "
            f"2..{top}, got {m!r}: advantages need two rollouts per prompt, and m cannot exceed the n generated"
        )
    rule = kwargs.get("pods_rule", "max_variance")
    if rule not in RULES:
        raise ValueError(f"unknown trainer.v1.sampler.sampler_kwargs.pods_rule {rule!r}; "
                         f"known: {', '.join(sorted(RULES))}")
    seed = kwargs.get("pods_seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"trainer.v1.sampler.sampler_kwargs.pods_seed must be an integer, got {seed!r}")
    return PODSSettings(m=int(m), rule=str(rule), seed=int(seed))


def check_batch_sizes(config, m: int, parameter_sync_step: int) -> None:
    """Refuse batch sizes that verl would pad once m of n trajectories are kept (``ValueError``).

    A sample holds ``train_batch_size / parameter_sync_step`` prompts, ``* m`` trajectories after
    PODS; verl's update splits it into mini-batches of ``ppo_mini_batch_size * n`` trajectories
    (the critic's likewise, where there is one) and pads the batch to a multiple of them."""
    n = config.actor_rollout_ref.rollout.n
    kept = config.data.train_batch_size // parameter_sync_step * m
    roles = [("actor_rollout_ref.actor", config.actor_rollout_ref.actor.ppo_mini_batch_size)]
    if config.algorithm.adv_estimator == "gae" or config.critic.get("enable", False):
        roles.append(("critic", config.critic.ppo_mini_batch_size))
    for role, mini in roles:
        if kept % (mini * n) == 0:
            continue
        fits = [p for p in range(min(mini, kept // n), 0, -1) if kept % (p * n) == 0]
        hint = (f"set {role}.ppo_mini_batch_size={fits[0]} (mini-batches of {fits[0] * n} trajectories, "
                f"{kept // (fits[0] * n)} per update)" if fits else
                f"set data.train_batch_size to a multiple of {n // math.gcd(n, m) * parameter_sync_step}")
        raise ValueError(
            f"PODS keeps data.train_batch_size / parameter_sync_step x pods_m = {config.data.train_batch_size} / "
            f"{parameter_sync_step} x {m} = {kept} trajectories per update, not a multiple of "
            f"{role}.ppo_mini_batch_size x rollout.n = {mini} x {n} = {mini * n} "
            f"(verl would pad them with no-op rows): {hint}"
        )


@dataclass(frozen=True)
class Kept:
    """One batch's selection: the kept and dropped keys (in the batch's order) and its statistics."""

    keys: list[str]
    dropped: list[str]
    metrics: dict[str, float]


def keep(keys: list[str], rewards: dict[str, float], settings: PODSSettings, generator: torch.Generator | None) -> Kept:
    """Keep ``settings.m`` sessions of each prompt in ``keys`` (verl's ``{uid}_{session}_{index}``).

    ``rewards`` maps each session (``{uid}_{session}``) to its reward. A prompt's sessions are put in
    session-id order, the rule picks m of them (all where a prompt has m or fewer, as after a failed
    session), and every output of a kept session is kept."""
    sessions: dict[str, list[str]] = defaultdict(list)  # uid -> its sessions, in session-id order
    for session in sorted(rewards, key=lambda s: (s.split("_")[0], int(s.rsplit("_", 1)[1]))):
        sessions[session.split("_")[0]].append(session)
    by_size: dict[int, list[str]] = defaultdict(list)  # groups of one size are selected together
    for uid, group in sessions.items():
        by_size[len(group)].append(uid)
    kept_sessions: set[str] = set()
    before, after = [], []
    for size, uids in by_size.items():
        r = torch.tensor([[rewards[s] for s in sessions[uid]] for uid in uids], dtype=torch.float64)  # [B, size]
        idx = select(r, min(settings.m, size), settings.rule, generator)  # [B, min(m, size)]
        for row, uid in enumerate(uids):
            kept_sessions.update(sessions[uid][i] for i in idx[row].tolist())
        before.append(r.var(dim=1, unbiased=False))  # [B]
        after.append(r.gather(1, idx).var(dim=1, unbiased=False))  # [B]
    kept = [key for key in keys if key.rsplit("_", 1)[0] in kept_sessions]
    dropped = [key for key in keys if key.rsplit("_", 1)[0] not in kept_sessions]
    metrics = {
        f"{METRICS_PREFIX}kept_share": len(kept) / len(keys) if keys else 1.0,
        f"{METRICS_PREFIX}reward_variance_before": float(torch.cat(before).mean()) if before else 0.0,
        f"{METRICS_PREFIX}reward_variance_after": float(torch.cat(after).mean()) if after else 0.0,
    }
    return Kept(keys=kept, dropped=dropped, metrics=metrics)


def session_rewards(keys: list[str], partition_id: str) -> dict[str, float]:
    """Each session's reward, read from TransferQueue: the summed ``rm_scores`` of its final output
    (the one with the highest index), as verl's multi-trajectory GRPO advantage reads it."""
    final: dict[str, tuple[int, str]] = {}
    for key in keys:
        session, index = key.rsplit("_", 1)
        if session not in final or final[session][0] < int(index):
            final[session] = (int(index), key)
    if not final:
        return {}
    sessions = list(final)
    data = tq.kv_batch_get(keys=[final[s][1] for s in sessions], partition_id=partition_id, select_fields=["rm_scores"])
    return {s: float(v.sum()) for s, v in zip(sessions, data["rm_scores"], strict=True)}


def trainer_config_of(sampler_kwargs) -> DictConfig | None:
    """The trainer's whole config, of which verl passes ``sampler_kwargs`` as a node; None for
    settings made apart from it (a dict, say), against which no batch size can be checked."""
    if not isinstance(sampler_kwargs, DictConfig):
        return None
    try:
        config = OmegaConf.select(sampler_kwargs, _ROOT)
    except ConfigKeyError:  # fewer levels above it than the trainer's config has
        return None
    return config if isinstance(config, DictConfig) and "actor_rollout_ref" in config else None


class _PODSSampling:
    """The down-sampling step shared by both samplers (a mixin before verl's class)."""

    modes: tuple[str, ...] = ()
    other: str = ""

    def __init__(self, trainer_mode: str, trainer_config: DictConfig, max_off_policy_threshold: int | None,
                 max_off_policy_strategy: str, sampler_kwargs: DictConfig, **verl_kwargs):
        if trainer_mode not in self.modes:
            raise ValueError(f"{type(self).__name__} serves trainer.v1.trainer_mode in {list(self.modes)}, not "
                             f"{trainer_mode!r}: set trainer.v1.sampler.custom_sampler.name={self.other}")
        config = trainer_config_of(sampler_kwargs)
        n = config.actor_rollout_ref.rollout.n if config is not None else None
        self.pods = pods_settings(sampler_kwargs, n)
        parameter_sync_step = int((trainer_config or {}).get("parameter_sync_step", 1))
        if config is not None:
            self._check_trainer_config(config, parameter_sync_step)
            verl_kwargs = {**self._verl_kwargs(config, trainer_mode), **verl_kwargs}
        self.generator = torch.Generator().manual_seed(self.pods.seed)
        super().__init__(trainer_mode=trainer_mode, trainer_config=trainer_config,
                         max_off_policy_threshold=max_off_policy_threshold,
                         max_off_policy_strategy=max_off_policy_strategy, sampler_kwargs=sampler_kwargs, **verl_kwargs)

    def _check_trainer_config(self, config, parameter_sync_step: int) -> None:
        reward_model = config.reward.reward_model
        if reward_model.enable and not reward_model.enable_resource_pool:
            raise ValueError("PODS reads the rewards when it samples, before verl runs a colocated reward model: "
                             "set reward.reward_model.enable_resource_pool=True or use a rule-based reward")
        if config.algorithm.adv_estimator == "gae":
            raise ValueError("PODS selects rollouts within prompt groups: set algorithm.adv_estimator to a group "
                             "estimator (grpo, rloo, ...), not gae")
        if self.pods.m < config.actor_rollout_ref.rollout.n:
            check_batch_sizes(config, self.pods.m, parameter_sync_step)

    @staticmethod
    def _verl_kwargs(config, trainer_mode: str) -> dict:
        """What verl's trainer gives its own samplers and not a custom one: DAPO's group filter and
        the failed-group refill, with the batch sizes that sync sampling needs for them."""
        filter_groups = config.algorithm.get("filter_groups", None) or {}
        metric = str(filter_groups.get("metric")) if filter_groups.get("enable", False) else None
        if filter_groups.get("enable", False) and not filter_groups.get("metric"):
            raise ValueError("algorithm.filter_groups.metric must be set when group filtering is enabled")
        refill_failed = bool(config.trainer.v1.sampler.get("sync_refill_failed_groups", False))
        kwargs = dict(filter_groups_metric=metric, sync_refill_failed_groups=refill_failed)
        if trainer_mode == "sync":
            train_batch_size = config.data.train_batch_size
            kwargs.update(
                train_batch_size=train_batch_size,
                gen_batch_size=1 if metric is not None or refill_failed
                else (config.data.get("gen_batch_size", None) or train_batch_size),
                max_inflight_gen_batches=filter_groups.get("max_inflight_gen_batches", 1) if metric is not None else 1,
            )
        return kwargs

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        """verl's ``sample()``, then the kept m of each prompt's sessions (steps 1 to 5 above)."""
        batch, metrics = super().sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)
        if partition_id == "val" or not batch.keys:
            return batch, metrics
        kept = keep(batch.keys, session_rewards(batch.keys, partition_id), self.pods, self.generator)
        if kept.dropped:
            tq.kv_clear(keys=kept.dropped, partition_id=partition_id)
        tags = dict(zip(batch.keys, batch.tags, strict=True))
        metrics.update(kept.metrics)
        return KVBatchMeta(keys=kept.keys, tags=[tags[k] for k in kept.keys], partition_id=partition_id,
                           fields=batch.fields, extra_info=batch.extra_info), metrics


class PODSReplayBuffer(_PODSSampling, ReplayBuffer):
    """verl's synchronous ``ReplayBuffer`` training on ``pods_m`` of each prompt's n rollouts
    (``trainer.v1.trainer_mode=sync``)."""

    modes = ("sync",)
    other = "PODSReplayBufferAsync"


class PODSReplayBufferAsync(_PODSSampling, ReplayBufferAsync):
    """verl's ``ReplayBufferAsync`` training on ``pods_m`` of each prompt's n rollouts
    (``trainer.v1.trainer_mode=colocate_async`` or ``separate_async``)."""

    modes = ("colocate_async", "separate_async")
    other = "PODSReplayBuffer"
