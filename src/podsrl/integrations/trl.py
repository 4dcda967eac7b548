"""PODS for TRL users: ``PODSTrainer`` is TRL's ``GRPOTrainer`` generating n completions per prompt
and training on m of them (Xu et al., 2025, arXiv 2504.13818).

    from podsrl.integrations.trl import PODSConfig, PODSTrainer
    args = PODSConfig(output_dir="out", num_generations=32, pods_m=8)   # n = 32 generated, m = 8 trained
    trainer = PODSTrainer(model=..., reward_funcs=..., args=args, train_dataset=...)

One generation batch, after TRL has generated and scored it (``_generate_and_score_completions``):
  1. the weighted sum of the reward functions, per completion, over every process: ``[G, n]``;
  2. ``podsrl.downsample.select`` keeps m per group (max-variance: the k highest plus m − k lowest);
  3. advantages over the m selected of each group, with TRL's ``scale_rewards`` and
     ``multi_objective_aggregation`` semantics;
  4. every per-completion tensor shrinks to this process's selected rows, so TRL's shuffle, its
     split into ``steps_per_generation`` micro-batches and the loss see only those; the token count
     that normalises ``dapo``/``cispo``/``vespo`` is recounted over them;
  5. logs: TRL's ``reward`` (all n) plus ``pods/selected_reward`` (the m trained on).

Every process holds whole groups (checked at construction), so selection needs no communication
beyond the reward gather TRL already does. Evaluation is TRL's, over all generations.

Two TRL methods are overridden: ``_calculate_rewards``, only to keep the reward matrix it gathers
(``_generate_and_score_completions`` does not return it), and ``_generate_and_score_completions``,
which runs TRL's and then steps 1 to 5. Everything downstream (buffering, shuffling, splitting,
the loss and its variants, logging) is TRL's, fed the smaller batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import trl
from packaging.version import InvalidVersion, Version
from torch import Tensor

from podsrl.advantages import group_advantages
from podsrl.downsample import RULES, select

SUPPORTED_TRL = (Version("1.16"), Version("1.17"))  # tested: [low, high)
SUPPORTED_TRL_RANGE = f"trl>={SUPPORTED_TRL[0]},<{SUPPORTED_TRL[1]}"


def check_trl_version(version: str) -> None:
    """Refuse a TRL version this integration was not tested with: it overrides TRL internals."""
    low, high = SUPPORTED_TRL
    try:
        supported = low <= Version(version) < high
    except InvalidVersion:
        supported = False
    if not supported:
        raise ImportError(
            f"podsrl.integrations.trl supports {SUPPORTED_TRL_RANGE} (the versions it is tested with); "
            f"found trl {version}. Install a supported one: pip install 'podsrl[trl]'"
        )


check_trl_version(trl.__version__)

from trl import GRPOConfig, GRPOTrainer  # noqa: E402  (after the version check)

# Per-completion fields whose second dimension is the completion length (trimmed with it).
_COMPLETION_WIDTH = ("completion_ids", "completion_mask", "tool_mask", "old_per_token_logps",
                     "ref_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio")


@dataclass
class PODSConfig(GRPOConfig):
    """``GRPOConfig`` plus down-sampling; ``num_generations`` is n, the completions generated per prompt."""

    pods_m: int | None = field(
        default=None,
        metadata={"help": "Completions per prompt that the update trains on (m, 2 <= m <= num_generations)."},
    )
    pods_rule: str = field(
        default="max_variance",
        metadata={"help": f"Down-sampling rule of podsrl.downsample: one of {', '.join(sorted(RULES))}."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_pods_config(self)


def check_pods_config(args: PODSConfig) -> None:
    """Raise ``ValueError`` naming the first setting that down-sampling cannot work with."""
    n, m = args.num_generations, args.pods_m
    if isinstance(m, bool) or not isinstance(m, int) or not 2 <= m <= n:
        raise ValueError(
            f"pods_m must be an integer in 2..num_generations = 2..{n}, got {m!r}: advantages need at least two "
            "completions per prompt, and m cannot exceed the n generated"
        )
    if args.pods_rule not in RULES:
        raise ValueError(f"unknown pods_rule {args.pods_rule!r}; known: {', '.join(sorted(RULES))}")
    per_process = args.per_device_train_batch_size * args.steps_per_generation
    if per_process % n:
        raise ValueError(
            f"per_device_train_batch_size x steps_per_generation = {args.per_device_train_batch_size} x "
            f"{args.steps_per_generation} = {per_process} completions per process must be a multiple of "
            f"num_generations ({n}): each process must hold whole groups of n to down-sample them"
        )
    kept = per_process // n * m
    if kept % args.steps_per_generation:
        raise ValueError(
            f"after down-sampling each process keeps {per_process // n} groups x pods_m {m} = {kept} completions, "
            f"which do not split into steps_per_generation = {args.steps_per_generation} equal micro-batches; "
            f"choose per_device_train_batch_size so that per_device_train_batch_size x pods_m is a multiple of "
            f"num_generations"
        )


def subset_advantages(rewards: Tensor, scale: str, eps: float = 1e-4) -> Tensor:
    """TRL's advantages (``sum_then_normalize``) over the selected rewards ``[G, m]``.

    ``group``: ``(r - mean) / (std + eps)`` per group; ``none``: ``r - mean``; ``batch``: centred
    per group, divided by the std of every selected reward (the whole generation batch). Std is
    the sample std. A NaN reward (every reward function returned ``None``) is left out of its
    group's statistics and gets advantage 0, as in TRL.
    """
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale!r}")
    per_group = "none" if scale == "batch" else scale
    scorable = ~rewards.isnan()  # [G, m]
    if scorable.all():
        adv = group_advantages(rewards, per_group, eps)
    else:  # rare: groups with unscorable completions, one at a time
        adv = torch.zeros_like(rewards)
        for g in range(rewards.shape[0]):
            if scorable[g].any():
                adv[g, scorable[g]] = group_advantages(rewards[g, scorable[g]], per_group, eps)
    if scale == "batch":
        adv = adv / (rewards[scorable].std() + eps)  # one scorable reward: NaN, zeroed below as in TRL
    return torch.nan_to_num(adv, nan=0.0)


class PODSTrainer(GRPOTrainer):
    """``GRPOTrainer`` that trains on ``args.pods_m`` of every ``args.num_generations`` completions."""

    def __init__(self, model, reward_funcs=None, args: PODSConfig | None = None, *rest, **kwargs):
        if not isinstance(args, PODSConfig):
            raise ValueError("PODSTrainer needs args=PODSConfig(..., num_generations=n, pods_m=m)")
        check_pods_config(args)
        super().__init__(model, reward_funcs, args, *rest, **kwargs)
        if self._is_vlm:
            raise ValueError("PODSTrainer does not support vision-language models: their image tensors are not "
                             "indexed by completion, so they cannot be down-sampled")

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # TRL returns the reward matrix [completions of all processes, functions]; keep it for selection.
        self._pods_rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        return self._pods_rewards_per_func

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if not self.model.training:  # evaluation: TRL's loss over every generation
            return output
        n, m = self.num_generations, self.args.pods_m
        per_func = self._pods_rewards_per_func  # [N, F], N = completions of all processes
        rewards = (per_func * self.reward_weights.to(per_func.device)).nansum(1)  # [N] as TRL sums them
        rewards[per_func.isnan().all(1)] = math.nan  # unscorable, as in TRL
        groups = rewards.view(-1, n).float().cpu()  # [G, n]

        keep = select(_unscorable_to_group_mean(groups), m, self.args.pods_rule, self._selection_generator())  # [G, m]
        chosen = groups.gather(1, keep)  # [G, m]
        advantages = self._advantages(per_func.float().cpu(), keep, chosen)  # [G, m]

        # This process holds groups [rank * local, (rank + 1) * local) of the gathered batch.
        local = output["prompt_ids"].shape[0] // n
        mine = slice(self.accelerator.process_index * local, (self.accelerator.process_index + 1) * local)
        rows = (keep[mine] + n * torch.arange(local).unsqueeze(1)).flatten()  # [local * m]
        output = _take_rows(output, rows.to(output["prompt_ids"].device), local * n, self.pad_to_multiple_of)
        output["advantages"] = advantages[mine].flatten().to(output["prompt_ids"].device)
        loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
        output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        self._log_selection(chosen, keep, advantages)
        return output

    def _advantages(self, per_func: Tensor, keep: Tensor, chosen: Tensor) -> Tensor:
        """TRL's advantages of the selected completions ``[G, m]``. ``sum_then_normalize``: the
        weighted sum, normalised per group as ``scale_rewards`` says. ``normalize_then_sum`` (GDPO):
        each reward function normalised per group, the weighted sum of those, normalised over the
        generation batch (TRL ignores ``scale_rewards`` there)."""
        if self.multi_objective_aggregation == "sum_then_normalize":
            return subset_advantages(chosen, self.scale_rewards)
        (G, m), F = keep.shape, per_func.shape[1]
        selected = per_func.view(G, -1, F).gather(1, keep.unsqueeze(-1).expand(G, m, F))  # [G, m, F]
        normalised = torch.stack([subset_advantages(selected[..., f], "group") for f in range(F)], -1)
        summed = (normalised * self.reward_weights.cpu()).sum(-1)  # [G, m]
        summed[chosen.isnan()] = math.nan  # unscorable: left out of the batch statistics
        return subset_advantages(summed.view(1, -1), "group").view(G, m)

    def _selection_generator(self) -> torch.Generator:
        """Same seed on every process, new for every generation batch (used by the ``random`` rule)."""
        return torch.Generator().manual_seed(self.args.seed * 1_000_003 + self._step)

    def _log_selection(self, chosen: Tensor, keep: Tensor, advantages: Tensor) -> None:
        """Reward of the trained completions next to TRL's ``reward`` over all n; the completions
        table shows each trained completion's advantage and NaN for the ones left out."""
        scorable = chosen[~chosen.isnan()]
        metrics = self._metrics["train"]
        metrics["pods/selected_reward"].append(scorable.mean().item() if scorable.numel() else math.nan)
        metrics["pods/selected_reward_std"].append(scorable.std().item() if scorable.numel() > 1 else math.nan)
        spread = _nan_max(chosen) - _nan_min(chosen)  # [G]
        # groups whose selected rewards are all equal (or none is scorable): no learning signal
        metrics["pods/selected_frac_zero_std"].append((spread <= 0).float().mean().item())
        table = torch.full((chosen.shape[0], self.num_generations), math.nan).scatter(1, keep, advantages)
        logged = self._logs["advantages"]
        for _ in range(min(table.numel(), len(logged))):
            logged.pop()
        logged.extend(table.flatten().tolist())


def _unscorable_to_group_mean(groups: Tensor) -> Tensor:
    """Selection keys: an unscorable completion (NaN) counts as its group's mean, which adds no variance."""
    mean = torch.nan_to_num(groups.nanmean(-1, keepdim=True), nan=0.0)  # [G, 1]
    return torch.where(groups.isnan(), mean, groups)


def _nan_max(x: Tensor) -> Tensor:
    return torch.nan_to_num(x, nan=-math.inf).amax(-1)


def _nan_min(x: Tensor) -> Tensor:
    return torch.nan_to_num(x, nan=math.inf).amin(-1)


def _take_rows(output: dict, rows: Tensor, count: int, pad_to: int | None) -> dict:
    """Keep ``rows`` of every per-completion field (``count`` rows each); completion-width fields
    are trimmed to the longest kept completion, rounded up to ``pad_to`` (TRL's ``pad_to_multiple_of``)."""
    taken = {}
    for key, value in output.items():
        if isinstance(value, Tensor) and value.dim() == 0:
            taken[key] = value
        elif isinstance(value, Tensor) and value.shape[0] == count:
            taken[key] = value[rows]
        elif isinstance(value, list) and len(value) == count:
            taken[key] = [value[i] for i in rows.tolist()]
        else:
            raise ValueError(f"PODSTrainer cannot down-sample the field {key!r} of TRL's generation batch")
    full = taken["completion_mask"].shape[1]
    used = taken["completion_mask"].any(0).nonzero()  # columns where some kept completion has a token
    width = int(used.max()) + 1 if used.numel() else 1
    width = min(full, -(-width // pad_to) * pad_to) if pad_to else width
    for key in _COMPLETION_WIDTH:
        if key in taken and taken[key].dim() == 2 and taken[key].shape[1] == full:
            taken[key] = taken[key][:, :width]
    return taken
