"""PODS for TRL users: ``PODSTrainer`` is TRL's ``GRPOTrainer`` generating n completions per prompt
and training on m of them (Xu et al., 2025, arXiv 2504.13818).

    from podsrl.integrations.trl import PODSConfig, PODSTrainer
    args = PODSConfig(output_dir="out", num_generations=32, pods_m=8)   # n = 32 generated, m = 8 trained
    trainer = PODSTrainer(model=..., reward_funcs=..., args=args, train_dataset=...)

One generation batch, while training:
  1. TRL generates and scores it (``_generate_and_score_completions``), without its no-grad
     forwards: the old policy's and the reference model's log-probabilities and vLLM's
     importance-sampling ratio wait for step 4;
  2. the weighted sum of the reward functions, per completion, over every process: ``[G, n]``;
     ``podsrl.downsample.select`` keeps m per group (max-variance: the k highest plus m − k lowest)
     among the eligible completions: scorable (some reward function returned a value) and with a
     token the loss can train on (after ``mask_truncated_completions`` and ``tool_mask``); an
     ineligible one is kept only when its group has fewer than m eligible;
  3. advantages over the m selected of each group, with TRL's ``scale_rewards`` and
     ``multi_objective_aggregation`` semantics;
  4. every per-completion tensor shrinks to this process's selected rows, and TRL's no-grad
     forwards run for those rows only, when TRL would run them (``beta`` > 0; ``num_iterations`` > 1
     or ``steps_per_generation`` > ``gradient_accumulation_steps``; vLLM's importance sampling); so
     TRL's shuffle, its split into ``steps_per_generation`` micro-batches and the loss see only the
     kept rows; the token count that normalises ``dapo``/``cispo``/``vespo`` is recounted over them;
  5. logs: TRL's ``reward`` (all n) plus ``pods/selected_reward`` (the m trained on).

Every process holds whole groups (checked at construction), so selection needs no communication
beyond the reward gather TRL already does. Evaluation is TRL's, over all generations. A reward
function that returns ``inf`` is an error (TRL would go on with zeroed or overflowing advantages),
and vision-language models are refused before anything is loaded.

Overridden TRL methods: ``_calculate_rewards`` (keeps the reward matrix it gathers, refuses
``inf``), ``_get_per_token_logps_and_entropies`` (returns nothing while step 1 runs; otherwise
TRL's) and ``_generate_and_score_completions`` (runs TRL's, then steps 2 to 5); during step 1 the
trainer's ``vllm_importance_sampling_correction`` is off, so that TRL leaves the ratio and its
``sampling/*`` logs to step 4. Everything downstream (buffering, shuffling, splitting, the loss and
its variants, logging) is TRL's, fed the smaller batch.
"""

from __future__ import annotations

import inspect
import math
import numbers
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from packaging.version import Version
from torch import Tensor

from podsrl.advantages import group_advantages
from podsrl.downsample import RULES, select
from podsrl.integrations import import_required, refuse_unsupported
from podsrl.loss_terms import importance_sampling_ratio
from podsrl.quiet import quiet_known_warnings

SUPPORTED_TRL = (Version("1.16"), Version("1.17"))  # tested: [low, high)


def check_trl_version(version: str) -> None:
    """Refuse a TRL version this integration was not tested with: it overrides TRL internals."""
    refuse_unsupported("podsrl.integrations.trl", "trl", version, SUPPORTED_TRL)


quiet_known_warnings()  # before TRL imports deepspeed (where installed)
check_trl_version(import_required("podsrl.integrations.trl", "trl", SUPPORTED_TRL, "TRL").__version__)

from transformers import AutoConfig, ProcessorMixin  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402  (after the version check)
from trl.models.utils import disable_gradient_checkpointing  # noqa: E402
from trl.trainer.utils import nanmax, nanmin, use_adapter  # noqa: E402

# Per-completion fields whose second dimension is the completion length (trimmed with it).
_COMPLETION_WIDTH = ("completion_ids", "completion_mask", "tool_mask", "sampling_per_token_logps")
_GRPO_TRAINER_ARGUMENTS = inspect.signature(GRPOTrainer.__init__)
_VISION_LANGUAGE = ("PODSTrainer does not support vision-language models: their image tensors are not indexed by "
                    "completion, so they cannot be down-sampled")


@dataclass
class PODSConfig(GRPOConfig):
    """``GRPOConfig`` plus down-sampling; ``num_generations`` is n, the completions generated per prompt.

    Every ``GRPOConfig`` argument keeps TRL's meaning; ``per_device_train_batch_size`` counts
    generated completions, so a micro-batch trains ``per_device_train_batch_size × pods_m /
    num_generations`` of them.

    Attributes:
        pods_m (int): Required. Completions per prompt that the update trains on (m,
            2 ≤ m ≤ ``num_generations``); ``pods_m = num_generations`` trains as ``GRPOTrainer``.
        pods_rule (str): The down-sampling rule, a name in ``podsrl.downsample.RULES``:
            ``max_variance`` (the default), ``max_reward``, ``percentile`` or ``random``.

    Raises:
        ValueError: at construction, naming the setting: ``pods_m`` missing, not an integer or
            outside 2..n; an unknown ``pods_rule``; ``per_device_train_batch_size ×
            steps_per_generation`` not a multiple of n; a down-sampled batch that does not
            split into ``steps_per_generation`` equal micro-batches.
    """

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
        self.pods_m = int(self.pods_m)  # a numpy integer, say, as a Python int


def check_pods_config(args: PODSConfig) -> None:
    """Raise ``ValueError`` naming the first setting that down-sampling cannot work with."""
    n, m = args.num_generations, args.pods_m
    if isinstance(m, bool) or not isinstance(m, numbers.Integral) or not 2 <= m <= n:
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
    """``GRPOTrainer`` that trains on ``args.pods_m`` of every ``args.num_generations`` completions.

    Takes ``GRPOTrainer``'s arguments, with ``args`` a :class:`PODSConfig`. TRL generates and
    scores n completions per prompt; :func:`podsrl.downsample.select` keeps m of each group by
    their weighted reward sum; advantages are TRL's, over the m kept; the old policy's and the
    reference model's log-probabilities and the loss run on the kept rows only. Each reward
    function also receives ``truncated`` (a list of bools: the completion was cut at
    ``max_completion_length``).

    Logs, beside TRL's metrics over all n: ``pods/selected_reward``,
    ``pods/selected_reward_std``, ``pods/selected_frac_zero_std`` and
    ``pods/selected_frac_ineligible`` (defined in the TRL guide).

    Raises:
        ValueError: ``args`` is not a :class:`PODSConfig`, or the model is a vision-language
            model (its image tensors cannot be down-sampled).
    """

    _pods_deferring = False  # True while TRL builds a training generation batch: its no-grad forwards wait

    def __init__(self, model, reward_funcs=None, args: PODSConfig | None = None, *rest, **kwargs):
        if not isinstance(args, PODSConfig):
            raise ValueError("PODSTrainer needs args=PODSConfig(..., num_generations=n, pods_m=m)")
        check_pods_config(args)
        given = _GRPO_TRAINER_ARGUMENTS.bind(self, model, reward_funcs, args, *rest, **kwargs)
        if is_vision_language(model, given.arguments.get("processing_class"), args):
            raise ValueError(_VISION_LANGUAGE)
        super().__init__(model, reward_funcs, args, *rest, **kwargs)
        if self._is_vlm:  # TRL loaded a processor the configuration did not announce
            raise ValueError(_VISION_LANGUAGE)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # Each reward function also gets ``truncated``: cut at the length limit, as TRL's
        # mask_truncated_completions and clipped_ratio tell it (the last id no EOS or padding).
        stops = [*self.eos_token_ids, self._tokenizer.pad_token_id]
        inputs = [{**x, "truncated": bool(ids) and ids[-1] not in stops} for x, ids in zip(inputs, completion_ids_list)]
        # TRL returns the reward matrix [completions of all processes, functions]; keep it for selection.
        per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        refuse_infinite_rewards(per_func, self.reward_func_names)
        self._pods_rewards_per_func = per_func
        return per_func

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        if self._pods_deferring:  # TRL's no-grad forward over all n: done after selection, for the kept rows
            return None, None, None
        return super()._get_per_token_logps_and_entropies(*args, **kwargs)

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:  # evaluation: TRL's loss over every generation
            return super()._generate_and_score_completions(inputs)
        with self._no_grad_forwards_deferred():
            output = super()._generate_and_score_completions(inputs)
        n, m = self.num_generations, self.args.pods_m
        per_func = self._pods_rewards_per_func  # [N, F], N = completions of all processes
        rewards = (per_func * self.reward_weights.to(per_func.device)).nansum(1)  # [N] as TRL sums them
        rewards[per_func.isnan().all(1)] = math.nan  # unscorable, as in TRL
        groups = rewards.view(-1, n).float().cpu()  # [G, n]
        trainable = self.accelerator.gather((_loss_mask(output).sum(1) > 0).long()).view(-1, n).cpu().bool()  # [G, n]
        eligible = ~groups.isnan() & trainable

        keep = select(_unscorable_to_group_mean(groups), m, self.args.pods_rule, self._selection_generator(),
                      eligible=eligible)  # [G, m]
        chosen = groups.gather(1, keep)  # [G, m]
        advantages = self._advantages(per_func.float().cpu(), keep, chosen)  # [G, m]

        # This process holds groups [rank * local, (rank + 1) * local) of the gathered batch.
        local = output["prompt_ids"].shape[0] // n
        mine = slice(self.accelerator.process_index * local, (self.accelerator.process_index + 1) * local)
        rows = (keep[mine] + n * torch.arange(local).unsqueeze(1)).flatten()  # [local * m]
        output = _take_rows(output, rows.to(output["prompt_ids"].device), local * n, self.pad_to_multiple_of)
        output.update(self._no_grad_forwards(output))
        output["advantages"] = advantages[mine].flatten().to(output["prompt_ids"].device)
        output["num_items_in_batch"] = self.accelerator.gather(_loss_mask(output).sum()).sum()
        self._log_selection(chosen, keep, advantages, eligible.gather(1, keep))
        return output

    @contextmanager
    def _no_grad_forwards_deferred(self):
        """While TRL builds the generation batch, its no-grad forwards return nothing and vLLM's
        importance-sampling correction (which needs them) is off; both come back afterwards."""
        correction = self.vllm_importance_sampling_correction
        self._pods_deferring, self.vllm_importance_sampling_correction = True, False
        try:
            yield
        finally:
            self._pods_deferring, self.vllm_importance_sampling_correction = False, correction

    def _no_grad_forwards(self, batch: dict) -> dict:
        """What TRL computes for every completion before scoring, for the kept rows ``batch`` only,
        under TRL's conditions: the old policy's per-token log-probabilities (when generation and
        optimizer steps are misaligned, or for vLLM's correction), the reference model's (``beta``
        > 0), and vLLM's importance-sampling ratio with its ``sampling/*`` logs."""
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)  # [R, P + C]
        attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        width, size = batch["completion_ids"].shape[1], self.args.per_device_train_batch_size

        def logps(model) -> Tensor:  # [R, C]
            return self._get_per_token_logps_and_entropies(model, ids, attention, width, batch_size=size)[0]

        correction = self.use_vllm and self.vllm_importance_sampling_correction
        misaligned = self.args.gradient_accumulation_steps % (self.args.steps_per_generation * self.num_iterations)
        out = {}
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            if misaligned or correction:
                out["old_per_token_logps"] = logps(self.model)
            if self.beta != 0.0:
                out["ref_per_token_logps"] = self._reference_logps(logps)
        if correction:
            ratio = importance_sampling_ratio(
                out["old_per_token_logps"], batch["sampling_per_token_logps"], _loss_mask(batch),
                self.vllm_importance_sampling_mode, self.vllm_importance_sampling_clip_min,
                self.vllm_importance_sampling_clip_max)
            out["importance_sampling_ratio"] = ratio
            self._log_importance_sampling(out["old_per_token_logps"], batch, ratio)
        return out

    def _reference_logps(self, logps) -> Tensor:
        """The reference model's log-probabilities, as TRL finds it: its own copy, or with PEFT the
        base model (adapters off) or the adapter named ``ref``."""
        if self.ref_model is not None:
            return logps(self.ref_model)
        model = self.accelerator.unwrap_model(self.model)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return logps(self.model)

    def _log_importance_sampling(self, old: Tensor, batch: dict, ratio: Tensor) -> None:
        """TRL's ``sampling/*`` logs of vLLM's correction, over the kept rows of every process."""
        mask = _loss_mask(batch).bool()
        delta = (old - batch["sampling_per_token_logps"]).abs()[mask]
        delta = delta[~delta.isnan()]  # tokens vLLM could not score
        ratios = ratio.flatten() if self.vllm_importance_sampling_mode.startswith("sequence") else ratio[mask]
        zero = torch.zeros((), device=old.device)

        def gathered(stat, x: Tensor) -> Tensor:
            return self.accelerator.gather(stat(x) if x.numel() else zero)

        metrics = self._metrics["train"]
        metrics["sampling/sampling_logp_difference/mean"].append(gathered(torch.mean, delta).mean().item())
        metrics["sampling/sampling_logp_difference/max"].append(gathered(torch.max, delta).max().item())
        metrics["sampling/importance_sampling_ratio/min"].append(nanmin(gathered(torch.min, ratios)).item())
        metrics["sampling/importance_sampling_ratio/mean"].append(gathered(torch.mean, ratios).nanmean().item())
        metrics["sampling/importance_sampling_ratio/max"].append(nanmax(gathered(torch.max, ratios)).item())

    def _advantages(self, per_func: Tensor, keep: Tensor, chosen: Tensor) -> Tensor:
        """TRL's advantages of the selected completions ``[G, m]``. ``sum_then_normalize``: the
        weighted sum, normalised per group as ``scale_rewards`` says. ``normalize_then_sum`` (GDPO):
        each reward function normalised per group, the weighted sum of those, normalised over the
        generation batch (TRL ignores ``scale_rewards`` there). An ineligible completion selected
        to fill m is treated as TRL treats it among all n: a scored one with no token to train on
        counts in its group's statistics, an unscorable one is left out of them (advantage 0)."""
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

    def _log_selection(self, chosen: Tensor, keep: Tensor, advantages: Tensor, kept_eligible: Tensor) -> None:
        """Reward of the trained completions next to TRL's ``reward`` over all n, and the share of
        them that cannot train (kept only because their group had fewer than m that can); the
        completions table shows each trained completion's advantage and NaN for the ones left out."""
        scorable = chosen[~chosen.isnan()]
        metrics = self._metrics["train"]
        metrics["pods/selected_reward"].append(scorable.mean().item() if scorable.numel() else math.nan)
        metrics["pods/selected_reward_std"].append(scorable.std().item() if scorable.numel() > 1 else math.nan)
        spread = _nan_max(chosen) - _nan_min(chosen)  # [G]
        # groups whose selected rewards are all equal (or none is scorable): no learning signal
        metrics["pods/selected_frac_zero_std"].append((spread <= 0).float().mean().item())
        metrics["pods/selected_frac_ineligible"].append((~kept_eligible).float().mean().item())
        table = torch.full((chosen.shape[0], self.num_generations), math.nan).scatter(1, keep, advantages)
        logged = self._logs["advantages"]
        for _ in range(min(table.numel(), len(logged))):
            logged.pop()
        logged.extend(table.flatten().tolist())


def is_vision_language(model, processing_class, args: PODSConfig) -> bool:
    """Whether TRL would train ``model`` as a vision-language model, decided before anything is
    loaded: TRL does when its processing class is a processor (``ProcessorMixin``); given none, it
    loads the model's own, a processor when the model's configuration has a vision part. Reads
    only the configuration of a model given by name or path."""
    if processing_class is not None:
        return isinstance(processing_class, ProcessorMixin)
    if isinstance(model, str):
        revision = (args.model_init_kwargs or {}).get("revision")
        config = AutoConfig.from_pretrained(model, revision=revision, trust_remote_code=args.trust_remote_code)
    else:
        config = model.config
    return getattr(config, "vision_config", None) is not None


def refuse_infinite_rewards(per_func: Tensor, names: list[str]) -> None:
    """Raise ``ValueError`` naming the first reward function that returned ``inf`` or ``-inf``.

    TRL 1.16 goes on with such a reward, but its advantages then carry no signal or wreck the
    update: with ``scale_rewards="group"`` the group's advantages become 0, with ``"batch"`` the
    whole batch's, and with ``"none"`` the other completions of the group get −3.4e38 (NaN
    weights after the step)."""
    infinite = per_func.isinf().any(0)  # [F]
    if infinite.any():
        name = names[int(infinite.nonzero()[0])]
        raise ValueError(f"reward function {name!r} returned an infinite reward; rewards must be finite "
                         "(return None to leave a completion unscored)")


def _loss_mask(batch: dict) -> Tensor:
    """The tokens the loss trains on ``[B, C]``: TRL's completion mask times its tool mask."""
    return batch["completion_mask"] * batch.get("tool_mask", 1)


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
