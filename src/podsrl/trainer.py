"""GRPO-PODS training, top to bottom.

Each step (:func:`train`):
  1. take this rank's share of ``prompts_per_step`` prompts from the seeded training stream;
  2. generate ``n`` rollouts per prompt;
  3. score them with the verifiable rewards: a reward matrix ``[P, n]``
     (steps 1-3 are :class:`podsrl.sampling.Sampler`'s, which can also skip prompts by their
     history, generate in rounds until a group is settled, or drop all-equal groups and draw more);
  4. down-sample: ``select`` the ``m`` rollouts per prompt the update trains on (all n for
     ``grpo`` and ``grpo-ga``);
  5. advantages, normalised over each prompt's selected rollouts;
  6. update: ``num_iterations`` optimizer steps over the selected rollouts (one by default), in
     micro-batches, the log-probs at the rollouts' temperature;
  7. log the step; evaluate every ``eval_every`` steps (or ``eval_every_s`` seconds of training
     clock); checkpoint every ``save_every`` steps.

Every random choice of a step (sampling, random selection, dropout) is seeded from
``(seed, step, prompt)``, so a run resumed from a checkpoint continues exactly as it would have,
and a prompt's rollouts do not depend on how prompts are spread over processes.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import NamedTuple, TextIO

import torch
from accelerate import Accelerator
from accelerate.state import is_initialized as accelerate_state_exists
from tqdm.auto import tqdm

from podsrl import models, rundir, sharding
from podsrl.advantages import group_advantages
from podsrl.checkpoint import (load_optimizer, load_weights, read_metrics, read_state, save_checkpoint, truncate_metrics,
                               write_atomic)
from podsrl.config import Config, flat_keys, to_dict, to_yaml, trained_per_prompt
from podsrl.downsample import select
from podsrl.errors import PodsError, os_error_text, os_reason
from podsrl.evaluate import evaluate
from podsrl.logprobs import completion_logprobs, lean_head
from podsrl.loss import importance_sampling_ratio, policy_loss
from podsrl.memory import PeakMemory
from podsrl.pipeline import AsyncSampler, trainer_threads
from podsrl.replay import EVAL_KEYS, ReplayMismatch, check_replayed, replay_records
from podsrl.rewards import load_reward
from podsrl.rewards.scorer import Scorer
from podsrl.rollout import Rollouts, check_engine, make_engine
from podsrl.rollout.recorded import FILE as ROLLOUTS_FILE
from podsrl.rollout.recorded import RolloutLog
from podsrl.sampling import Groups, Sampler, step_seed
from podsrl.tasks import Task, task_from_config

log = logging.getLogger(__name__)


class Selected(NamedTuple):
    """The rollouts of one step that reach the loss."""

    rows: torch.Tensor  # [P * m] rows of the step's rollouts, prompt-major
    rewards: torch.Tensor  # [P, m]
    advantages: torch.Tensor  # [P, m]


@dataclass
class Setup:
    """Everything a run holds besides its config."""

    accelerator: Accelerator
    model: torch.nn.Module
    tokenizer: object
    engine: object
    optimizer: torch.optim.Optimizer
    task: Task
    system_prompt: str | None
    scorer: Scorer
    run: rundir.RunFolder | None
    sampler: Sampler | None = None
    ref_model: torch.nn.Module | None = None
    head: torch.nn.Linear | None = None  # the output layer, where log-probs take the lean path
    start_step: int = 0
    train_seconds: float = 0.0
    train_cpu_seconds: float = 0.0  # this process's CPU time over the same phases
    completions_log: TextIO | None = None  # completions.jsonl and eval_completions.jsonl, open
    eval_log: TextIO | None = None  # in the main process while a run logs completions
    rollout_log: RolloutLog | None = None  # save_rollouts: the sampler's engine, recording

    @property
    def output_dir(self) -> Path:
        return self.run.path


# --------------------------------------------------------------------------- set-up


def default_output_dir(c: Config) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{c.task.name}-{c.mode}-{stamp}"


def mixed_precision(setting: str | None, launcher: str | None, device_type: str, bf16_supported: bool,
                    dtype: str = "float32") -> str:
    """The run's autocast: the config's ``mixed_precision``, else the launcher's (``accelerate
    launch`` exports ``ACCELERATE_MIXED_PRECISION`` from its config), else bf16 on a CUDA GPU that
    supports it (TRL's default) unless the weights are float16, and none on any other device."""
    if setting is not None:
        return setting
    if launcher:
        return launcher
    return "bf16" if device_type == "cuda" and bf16_supported and dtype != "float16" else "no"


def setup(c: Config, accelerator: Accelerator | None = None) -> Setup:
    """Validate what the user gave (data, rewards) before touching output_dir; then hold the run
    folder (locked for this run) while the model loads."""
    output_dir = Path(c.output_dir) if c.output_dir else default_output_dir(c)
    if c.threads or c.async_lag:
        torch.set_num_threads(trainer_threads(c))
    if accelerator is None:
        accelerator = make_accelerator(c, output_dir)
    if c.async_lag and accelerator.num_processes > 1:
        raise PodsError(f"async_lag={c.async_lag} runs on one process ({accelerator.num_processes} were launched): its "
                        "generation worker does not yet serve several; launch one process, or set async_lag=0")
    for name in ("replay", "save_rollouts"):
        if getattr(c, name) and accelerator.num_processes > 1:
            raise PodsError(f"{name}=true runs on one process ({accelerator.num_processes} were launched): launch one, "
                            f"or set {name}=false")
    if accelerator.num_processes > 1:  # every rank writes to the folder the main process named
        from accelerate.utils import broadcast_object_list

        output_dir = Path(broadcast_object_list([str(output_dir)])[0])
    if c.prompts_per_step % accelerator.num_processes:
        raise PodsError(f"prompts_per_step={c.prompts_per_step} must divide evenly over {accelerator.num_processes} processes")
    check_engine(c.rollout.engine, c.rollout, autocast=accelerator.mixed_precision != "no")
    task = task_from_config(c.task, c.seed)
    if task.trains_on_test and accelerator.is_main_process:
        log.warning("task %s trains on its held-out problems (%s): held-out accuracy measures them after training "
                    "on them", c.task.name, "task.path is one file" if c.task.name == "gsm8k" else "no task.train_path")
    reward_fns = {name: load_reward(name) for name in c.rewards}
    run = rundir.claim(output_dir, c.resume, accelerator, replay=c.replay)
    if c.replay and accelerator.is_main_process:  # logged steps that a failure before training must keep
        run.logged_step = rundir.finished_steps(output_dir)
    with run.cleanup_on_failure():
        if run.resume_from is not None or run.logged_step:
            rundir.check_same_config(output_dir, c, "resume=true would continue" if run.resume_from is not None
                                     else "replay=true would train again")
        if run.resume_from is not None:
            done = read_state(run.resume_from)["step"]
            if c.steps < done:
                raise PodsError(f"resume=true with steps={c.steps}, but {output_dir} has trained {done} steps: steps "
                                f"counts from the run's start; give steps > {done} to train more")
        if run.logged_step > c.steps:
            raise PodsError(f"replay=true with steps={c.steps}, but {output_dir} logs {run.logged_step} steps: steps "
                            f"counts from the run's start; give steps >= {run.logged_step}")
        return load_scoring(c, accelerator, task, run, reward_fns)


def make_accelerator(c: Config, output_dir: Path | None) -> Accelerator:
    """The run's accelerator, at the precision :func:`mixed_precision` picks."""
    if c.mixed_precision == "fp16" and not torch.cuda.is_available():
        raise PodsError("mixed_precision=fp16 needs a CUDA GPU; use bf16 or no on this machine")
    cuda = torch.cuda.is_available() and not sharding.cpu_processes()
    precision = mixed_precision(c.mixed_precision, os.environ.get("ACCELERATE_MIXED_PRECISION"),
                                "cuda" if cuda else "cpu", cuda and torch.cuda.is_bf16_supported(), c.model.dtype)
    if c.mixed_precision is None and accelerate_state_exists():
        precision = None  # accelerate keeps one precision per process: the one already set
    # processes without a GPU each run on the CPU over gloo, sharded if the launcher asks
    return sharding.make_accelerator(log_with=c.report_to or None, project_dir=output_dir, mixed_precision=precision)


def load_scoring(c: Config, accelerator: Accelerator, task: Task, run: rundir.RunFolder | None,
                 reward_fns: dict | None = None) -> Setup:
    """:func:`load` with the scorer of the configured rewards, its workers forked first: forked
    later, each would keep a stale copy of the weights (and, resumed, the optimizer state) once
    the updates rewrite them. The workers end if loading fails."""
    scorer = Scorer.from_config(c, reward_fns)
    scorer.start_workers()
    try:
        return load(c, accelerator, task, scorer, run)
    except BaseException:
        scorer.close()
        raise


def load(c: Config, accelerator: Accelerator, task: Task, scorer: Scorer, run: rundir.RunFolder | None) -> Setup:
    """The model (with LoRA, from a checkpoint when resuming), its optimizer and rollout engine
    (``run`` None: no run folder, as ``podsrl plan`` measures without one)."""
    resume_from = run.resume_from if run is not None else None
    tokenizer = models.load_tokenizer(c.model.name_or_path)
    model = models.load_model(c.model.name_or_path, c.model.dtype, c.model.trust_remote_code, c.model.load_in_4bit)
    ref_model = None
    if c.beta > 0 and c.model.lora_r == 0:  # with LoRA the reference is the adapter disabled
        ref_model = models.load_model(c.model.name_or_path, c.model.dtype, c.model.trust_remote_code).eval()
        ref_model.requires_grad_(False)
    if c.model.lora_r > 0:
        model = models.add_lora(model, c.model.lora_r, c.model.lora_alpha, c.model.lora_dropout,
                                c.model.lora_target_modules, c.model.gradient_checkpointing)
    if resume_from is not None:
        load_weights(model, resume_from / "model", lora=c.model.lora_r > 0)
    if c.model.gradient_checkpointing:
        models.enable_checkpointing(model)
        model.config.use_cache = True  # generation still uses the cache

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=c.lr, weight_decay=c.weight_decay)
    prompts = c.prompts_per_step // accelerator.num_processes
    model, optimizer = sharding.prepare(accelerator, model, optimizer, micro_batch_size(c, prompts), c.max_grad_norm)
    if ref_model is not None:
        ref_model = ref_model.to(accelerator.device)

    # an FSDP-sharded output layer is whole only inside the forward: full logits there
    head = lean_head(accelerator.unwrap_model(model)) if c.lean_logprobs and sharding.params_whole(accelerator) else None
    s = Setup(accelerator, model, tokenizer, None, optimizer, task,
              task.system_prompt if c.task.system_prompt is None else c.task.system_prompt,
              scorer, run, ref_model=ref_model, head=head)
    s.engine = make_engine(c.rollout.engine, accelerator.unwrap_model(model), tokenizer, c.rollout,
                           c.model.trust_remote_code, autocast=accelerator.mixed_precision != "no")
    state = {}
    if resume_from is not None:
        state = read_state(resume_from)
        if state.get("optimizer", True):
            load_optimizer(accelerator, model, optimizer, resume_from, lr=c.lr, weight_decay=c.weight_decay)
        elif accelerator.is_main_process:
            log.warning("%s holds no optimizer state (save_optimizer): the optimizer starts afresh", resume_from)
        s.start_step, s.train_seconds = state["step"], state["train_seconds"]
        s.train_cpu_seconds = state.get("train_cpu_seconds", 0.0)  # older checkpoints: from here
    if c.async_lag:  # generation in a worker process, async_lag steps ahead
        s.sampler = AsyncSampler(c, accelerator.unwrap_model(model), state.get("sampling"), s.start_step, resume_from)
    else:
        if c.save_rollouts and run is not None:  # the training rollouts (not the evaluations') recorded
            s.rollout_log = RolloutLog(s.engine, tokenizer, run.path / ROLLOUTS_FILE, accelerator.device)
        s.sampler = Sampler(c, task, s.rollout_log or s.engine, scorer, tokenizer, s.system_prompt, accelerator,
                            state.get("sampling"), s.start_step)
    return s


# --------------------------------------------------------------------------- one step


def down_sample(c: Config, rewards: torch.Tensor, step: int, sizes: list[int] | None = None) -> Selected:
    """Step 4 and 5: which rollouts train, and their advantages over the selected subset.
    ``rewards`` ``[P, n]`` holds group p's rewards in its first ``sizes[p]`` columns (default: all
    n); its rollouts are rows ``sum(sizes[:p])`` on."""
    P, n = rewards.shape
    sizes = sizes or [n] * P
    starts = torch.tensor([0, *itertools.accumulate(sizes)][:-1]).unsqueeze(1)  # [P, 1]
    if c.mode == "pods":
        generator = torch.Generator().manual_seed(step_seed(c.seed, step))
        idx = torch.empty(P, c.m, dtype=torch.long)  # [P, m]
        for size in sorted(set(sizes)):  # groups of one size at a time (all at once without adaptive_n)
            same = torch.tensor([p for p in range(P) if sizes[p] == size])
            idx[same] = select(rewards[same, :size], c.m, c.rule, generator)
    else:  # grpo and grpo-ga train on every rollout
        idx = torch.arange(n).expand(P, n)
    chosen = rewards.gather(1, idx)  # [P, m]
    rows = (idx + starts).flatten()  # [P * m]
    return Selected(rows, chosen, group_advantages(chosen, c.scale_rewards))


def micro_batch_size(c: Config, prompts: int) -> int:
    """Sequences per forward/backward: as configured, else every trained rollout at once (grpo,
    pods), or m rollouts per prompt (grpo-ga, accumulating over n / m micro-batches)."""
    if c.micro_batch_size:
        return c.micro_batch_size
    return (c.m if c.mode == "grpo-ga" else trained_per_prompt(c)) * prompts


class MicroBatches(NamedTuple):
    """How the update splits the chosen rollouts (step 6a)."""

    parts: list[torch.Tensor]  # indices into the chosen rows, one tensor per forward/backward
    tokens: list[float]  # each part's token count as TRL's split counts it (bnpo's normaliser)
    accumulation_steps: int  # micro-batches of TRL's split of the optimizer batch


def skips_zero_advantage(c: Config) -> bool:
    """Whether the update skips rollouts whose advantage is exactly 0: with
    ``skip_zero_advantage`` and no KL term (with one, every rollout's KL gradient counts)."""
    return c.skip_zero_advantage and c.beta == 0


def micro_batches(c: Config, adv: torch.Tensor, mask: torch.Tensor, size: int) -> MicroBatches:
    """Step 6a: the chosen rollouts in micro-batches of ``size``, as TRL splits the optimizer
    batch. Without a KL term, a rollout whose advantage is exactly 0 adds nothing to the gradient,
    so it skips the forward and backward (``skip_zero_advantage``); the normalisers still count it:
    bnpo's per micro-batch (the rows left in each), the others' over the optimizer batch (the rows
    left, packed)."""
    split = list(torch.split(torch.arange(len(adv)), size))
    tokens = [float(mask[p].sum()) for p in split]
    if not skips_zero_advantage(c):
        return MicroBatches(split, tokens, len(split))
    if c.loss_type == "bnpo":
        kept = [(p[adv[p] != 0], t) for p, t in zip(split, tokens)]
    else:
        kept = [(p, 0.0) for p in torch.split((adv != 0).nonzero().flatten(), size)]
    kept = [(p, t) for p, t in kept if len(p)]
    if not kept:  # keep one row (its loss is 0): every rank then joins the gradient sync
        kept = [(torch.arange(1), tokens[0])]
    return MicroBatches([p for p, _ in kept], [t for _, t in kept], len(split))


def update(s: Setup, c: Config, rollouts: Rollouts, chosen: Selected, step: int) -> dict:
    """Step 6: ``num_iterations`` optimizer steps over the chosen rollouts (μ in GRPO), each over
    all of them in micro-batches:

      a. the micro-batches (:func:`micro_batches`) and the optimizer batch's normalisers;
      b. with μ > 1, the log-probs of the policy that generated (``old``), once, before the first
         step; with μ = 1 the loss takes the policy's own, detached (no extra forward, as in TRL);
      c. each optimizer step: forward, loss and backward per micro-batch, gradient clipping, step;
      d. the statistics, averaged over the steps (loss) and over their tokens (clip, KL, sampling).
    """
    acc, model = s.accelerator, s.model
    rows = chosen.rows
    adv = chosen.advantages.flatten()  # [P * m]
    mask = rollouts.completion_mask[rows]
    C = int(mask.sum(0).nonzero().max()) + 1 if mask.any() else 1  # drop all-padding columns
    # a. micro-batches; the normalisers of the whole optimizer batch, so that micro-batch losses add
    # up to its loss; the token count is averaged over ranks, as the gradients are
    batches = micro_batches(c, adv, mask.cpu(), micro_batch_size(c, prompts=len(chosen.rewards)))
    num_tokens = acc.reduce(mask.sum().float().to(acc.device), reduction="mean") if acc.num_processes > 1 else mask.sum()
    # sharded: as many passes as the busiest rank; the extra ones (one row, weight 0) only take part
    extra = sharding.micro_batches_everywhere(acc, len(batches.parts)) - len(batches.parts)
    passes = [(p, t, 1.0) for p, t in zip(batches.parts, batches.tokens)] + [(batches.parts[0][:1], 1.0, 0.0)] * extra
    sampler_logp = rollouts.sampler_logp if c.vllm_importance_sampling_correction else None
    # a sampler that drew from a nucleus (top-p): the ratio is taken over that nucleus (sampling replay)
    support = rollouts.sampler_support if sampler_logp is not None else None
    # per token, log π_old(y) − log π_old^S(y), π_old renormalised over the nucleus S: added to the
    # sampler's log-probs, it makes exp(ℓ_old − ℓ_μ) the ratio of the two distributions on S
    replay = torch.zeros(len(rows), C, device=acc.device) if support is not None else None

    def forward(r, m, over_nucleus: bool = False):
        """The rows' log-probs, and with ``over_nucleus`` beside them those renormalised over the
        sampler's nuclei (else None)."""
        nucleus = {"support": support[r, :C].to(acc.device)} if over_nucleus else {}
        out = completion_logprobs(m, rollouts.prompt_ids[r], rollouts.prompt_mask[r], rollouts.completion_ids[r, :C],
                                  rollouts.completion_mask[r, :C], s.head, c.rollout.temperature, **nucleus)
        return out if over_nucleus else (out, None)
    model.train()
    # b. the old policy's log-probs, before the first optimizer step changes it
    old = None
    if c.num_iterations > 1:
        torch.manual_seed(step_seed(c.seed, step, -2))  # dropout
        with torch.no_grad():
            old = torch.zeros(len(rows), C, device=acc.device)
            for part, _, _ in passes:
                logp, replayed = forward(rows[part], model, replay is not None)
                old[part] = logp.to(old.dtype)
                if replayed is not None:
                    replay[part] = old[part] - replayed.to(old.dtype)
    totals = dict.fromkeys(("loss", "clip_low", "clip_high", "clip_region", "kl", "sampling_ratio", "sampling_clipped",
                            "weighed", "grad_norm"), 0.0)
    extremes = [math.inf, -math.inf]  # the least and greatest per-token sampler ratio, before any cap
    # c. num_iterations optimizer steps over the same rollouts
    for iteration in range(c.num_iterations):
        torch.manual_seed(step_seed(c.seed, step, -2 - iteration))  # dropout
        s.optimizer.zero_grad(set_to_none=True)
        for i, (part, micro_tokens, weight) in enumerate(passes):
            r = rows[part]
            cmask = rollouts.completion_mask[r, :C]
            sync = i == len(passes) - 1
            with nullcontext() if sync else acc.no_sync(model):
                logp, replayed = forward(r, model, replay is not None and old is None and iteration == 0)
                if replayed is not None:
                    replay[part] = (logp.detach() - replayed).to(replay.dtype)
                sampled = None if sampler_logp is None else sampler_logp[r, :C].to(logp.device)
                if replay is not None:
                    sampled = sampled + replay[part].to(sampled.dtype)
                ref = reference_logprobs(s, rollouts, r, C, c.rollout.temperature) if c.beta > 0 else None
                loss, stats = policy_loss(
                    logp, adv[part].to(logp.device), cmask, old_logp=None if old is None else old[part],
                    ref_logp=ref, beta=c.beta, epsilon_low=c.epsilon_low, epsilon_high=c.epsilon_high,
                    loss_type=c.loss_type, max_completion_length=c.rollout.max_new_tokens, num_sequences=len(rows),
                    num_tokens=float(num_tokens), sampler_logp=sampled,
                    sampling_cap=c.vllm_importance_sampling_cap, importance_sampling_level=c.importance_sampling_level,
                    vllm_importance_sampling_mode=c.vllm_importance_sampling_mode,
                    use_bias_correction_kl=c.use_bias_correction_kl, accumulation_steps=batches.accumulation_steps,
                    micro_batch_tokens=micro_tokens, **loss_params(c),
                )
                sharding.backward(acc, model, loss * weight, last=sync)
            if weight:
                _add_stats(totals, loss, stats)
                if sampler_logp is not None and iteration == 0:
                    _add_extremes(extremes, (old[part] if old is not None else logp.detach()), sampled, cmask,
                                  c.vllm_importance_sampling_mode)
        grad_norm = acc.clip_grad_norm_(model.parameters(), c.max_grad_norm) if c.max_grad_norm > 0 else None
        s.optimizer.step()
        totals["grad_norm"] += float(grad_norm) if grad_norm is not None else math.nan
    s.engine.sync_weights()
    # d. over ranks: each rank's loss is normalised by its share, so their mean is the global loss;
    # rows skipped had no tokens in the loss: they count as not clipped, KL 0
    skipped = len(rows) - sum(len(p) for p in batches.parts) if skips_zero_advantage(c) else 0
    keys = ["loss", "clip_low", "clip_high", "clip_region", "kl", "sampling_ratio", "sampling_clipped", "weighed"]
    summed = dict(zip(keys + ["tokens", "skipped"], _sum_over_ranks(
        acc, [totals[k] for k in keys] + [float(mask.sum()) * c.num_iterations, float(max(skipped, 0))])))
    tokens, mu = max(summed["tokens"], 1.0), c.num_iterations
    corrected = sampler_logp is not None
    if corrected and acc.num_processes > 1:
        extremes = [float(acc.gather(torch.tensor([-extremes[0], extremes[1]], device=acc.device)).view(-1, 2).max(0)
                          .values[i]) * sign for i, sign in ((0, -1.0), (1, 1.0))]
    return {
        "loss": summed["loss"] / acc.num_processes / mu,
        "clip_ratio/low_mean": summed["clip_low"] / tokens, "clip_ratio/high_mean": summed["clip_high"] / tokens,
        "clip_ratio/region_mean": summed["clip_region"] / tokens, "kl": summed["kl"] / tokens,
        "sampling_ratio": summed["sampling_ratio"] / max(summed["weighed"], 1.0) if corrected else None,
        "sampling_clipped": summed["sampling_clipped"] / max(summed["weighed"], 1.0) if corrected else None,
        "sampling_ratio_min": extremes[0] if corrected and math.isfinite(extremes[0]) else None,
        "sampling_ratio_max": extremes[1] if corrected and math.isfinite(extremes[1]) else None,
        "grad_norm": totals["grad_norm"] / mu if c.max_grad_norm > 0 else None,
        "trained_sequences": len(rows) * acc.num_processes, "trained_tokens": int(summed["tokens"] / mu),
        "micro_batches": len(batches.parts), "skipped_zero_advantage": int(summed["skipped"]),
    }


def _add_stats(totals: dict, loss: torch.Tensor, stats) -> None:
    """One micro-batch's loss, and its statistics weighted by its tokens."""
    w = float(stats.num_tokens)
    totals["loss"] += loss.item()
    for key in ("clip_low", "clip_high", "clip_region", "kl", "sampling_ratio", "sampling_clipped"):
        totals[key] += float(getattr(stats, key)) * w
    totals["weighed"] += w


def _add_extremes(extremes: list[float], old: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor, mode: str) -> None:
    """Widen ``[least, greatest]`` by one micro-batch's sampler ratios π_old / μ before any cap, as
    ``mode`` forms them: each token's, or each sequence's (the product of its tokens')."""
    ratio = importance_sampling_ratio(old.detach().float(), sampler.to(old.device).float(), mask,
                                      mode.replace("mask", "truncate"), None, math.inf)
    ratio = ratio[:, 0][mask.any(-1)] if mode.startswith("sequence") else ratio[mask.bool()]
    if len(ratio):
        extremes[0], extremes[1] = min(extremes[0], float(ratio.min())), max(extremes[1], float(ratio.max()))


def loss_params(c: Config) -> dict:
    """The surrogates' own hyperparameters (sapo's, vespo's), as policy_loss takes them."""
    return {k: getattr(c, k) for k in ("sapo_temperature_pos", "sapo_temperature_neg", "vespo_k_pos",
                                       "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")}


def _sum_over_ranks(acc: Accelerator, values: list[float]) -> list[float]:
    if acc.num_processes == 1:
        return values
    return acc.reduce(torch.tensor(values, dtype=torch.float64, device=acc.device), reduction="sum").tolist()


@torch.no_grad()
def reference_logprobs(s: Setup, rollouts: Rollouts, rows: torch.Tensor, C: int, temperature: float = 1.0) -> torch.Tensor:
    """The reference policy's log-probs of the completions ``rows`` (first ``C`` columns), at the
    rollouts' temperature."""
    args = (rollouts.prompt_ids[rows], rollouts.prompt_mask[rows], rollouts.completion_ids[rows, :C], rollouts.completion_mask[rows, :C])
    if s.ref_model is not None:
        return completion_logprobs(s.ref_model, *args, lean_head(s.ref_model) if s.head is not None else None, temperature)
    with s.accelerator.unwrap_model(s.model).disable_adapter():  # LoRA: the base model
        return completion_logprobs(s.model, *args, s.head, temperature)


# --------------------------------------------------------------------------- the loop


def train(c: Config, accelerator: Accelerator | None = None) -> Path:
    """Run training as configured; returns the output folder. A run that fails or is interrupted
    (bad input found mid-run, Ctrl-C) before it finished a step leaves output_dir as it found it;
    after, the folder keeps its metrics and its last checkpoint, if any, and the error says so."""
    s = setup(c, accelerator)
    try:
        with s.run.cleanup_on_failure():
            out = _train(s, c)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (Terminated)
        raise type(e)(s.run.kept(c.save_every)) from None
    except ReplayMismatch:  # its message says what the folder holds and what to do
        raise
    except PodsError as e:
        raise PodsError("; ".join(filter(None, [str(e), s.run.kept(c.save_every)]))) from None
    except OSError as e:  # a full disk, a file-size limit: the run's files cannot be written
        raise PodsError("; ".join(filter(None, [f"cannot write to {s.output_dir}: {os_error_text(e)}",
                                                s.run.kept(c.save_every)]))) from None
    finally:
        s.scorer.close()  # the reward workers end with the run
        if s.sampler is not None:
            s.sampler.close()  # and the generation worker
    s.run.release()
    return out


def _train(s: Setup, c: Config) -> Path:
    acc = s.accelerator
    out = s.output_dir
    # replay=true: the logged training records of the steps after the start, to train again and check
    replayed = replay_records(out, s.start_step) if c.replay and acc.is_main_process else {}
    last_replayed = max(replayed, default=s.start_step)
    if acc.is_main_process:
        rundir.record_start(out, s.start_step, last_replayed, str(acc.device))  # which code trained each part, on what
        rundir.keep_earlier_config(out, c, s.start_step)
        write_atomic(out / "config.yaml", to_yaml(c))
        for log_file in ("metrics.jsonl", "completions.jsonl", "eval_completions.jsonl"):
            truncate_metrics(out / log_file, last_replayed)
    acc.wait_for_everyone()
    if c.report_to:
        acc.init_trackers(rundir.TRACKER_FOLDER, config=_tracker_config(c))
    metrics_file = open(out / "metrics.jsonl", "a") if acc.is_main_process else None
    logging_completions = acc.is_main_process and c.log_completions
    s.completions_log = open(out / "completions.jsonl", "a") if logging_completions else None
    s.eval_log = open(out / "eval_completions.jsonl", "a") if logging_completions else None

    if acc.is_main_process:
        parallel = "" if acc.distributed_type.value == "NO" else f" ({acc.distributed_type.value})"
        log.info("training %s (%s) on %d process(es)%s, %s, mixed precision %s; output in %s", c.model.name_or_path,
                 c.mode, acc.num_processes, parallel, acc.device, acc.mixed_precision, out)
    last_eval = None
    if replayed:  # the logged evaluations stand; the last one is the latest
        last_eval = next(({k: r[k] for k in EVAL_KEYS} for r in reversed(read_metrics(out / "metrics.jsonl"))
                          if "eval_step" in r), None)
    elif s.start_step == 0:
        last_eval = _evaluate(s, c, step=0, metrics_file=metrics_file)

    # under a time budget (compare's runs: steps unbounded) the bar counts the training clock
    by_clock = c.time_budget_s > 0
    bar = tqdm(total=c.time_budget_s if by_clock else c.steps, initial=min(_clock(s, c), c.time_budget_s) if by_clock
               else s.start_step, unit="s" if by_clock else "step", disable=not (c.progress and acc.is_main_process),
               desc="train", bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]" if by_clock else None)
    try:
        _loop(s, c, metrics_file, bar, last_eval, replayed)
    finally:  # a clean line for whatever is printed next, an error included
        bar.close()
        for file in (metrics_file, s.completions_log, s.eval_log):
            if file:
                _close(file)
    if c.report_to:
        acc.end_training()
    return out


def _loop(s: Setup, c: Config, metrics_file, bar, last_eval: dict | None, replayed: dict[int, dict]) -> None:
    """Train until the run's end; ``replayed``: the logged training records of the first steps, which
    are trained again and checked against them instead of evaluated and logged."""
    by_clock = c.time_budget_s > 0
    acc = s.accelerator
    step = s.start_step
    failed = 0  # rollouts whose scoring failed, this session
    while step < c.steps and not (c.time_budget_s and _clock(s, c) >= c.time_budget_s):
        step += 1
        t0, cpu0, clock0 = time.perf_counter(), time.process_time(), _clock(s, c)
        if s.rollout_log is not None:  # a replayed step's recorded completions, rather than sampled again
            s.rollout_log.serving, generated = step in replayed, s.rollout_log.generated
        # 1-3. this rank's prompts and their rollouts, scored while later ones are generated, in one
        # rollout phase of the engine (weights gathered or pushed once, the same on every rank)
        with s.engine.phase():
            groups = s.sampler.step_groups(step)
        t2 = time.perf_counter()
        # 4-5. select m per prompt; advantages over the selected subset
        chosen = down_sample(c, groups.rewards, step, groups.sizes)
        t3 = time.perf_counter()
        # 6. num_iterations optimizer steps over the selected rollouts
        with PeakMemory(acc.device) as mem:
            stats = update(s, c, groups.rollouts, chosen, step)
        s.sampler.policy_updated(acc.unwrap_model(s.model), step)  # an async sampler gets the new weights
        t4 = time.perf_counter()
        s.train_seconds += t4 - t0
        s.train_cpu_seconds += time.process_time() - cpu0
        elapsed = _clock(s, c) - clock0  # this step, on the clock that budgets and schedules count

        # 7. log, evaluate, checkpoint
        record = {
            "step": step, "train_seconds": s.train_seconds, "train_cpu_seconds": s.train_cpu_seconds,
            "generation_s": groups.generation_s, "scoring_s": groups.scoring_s, "selection_s": t3 - t2, "update_s": t4 - t3,
            **dict(zip(("reward_timeouts", "reward_retries"),
                       map(int, _sum_over_ranks(acc, [float(groups.timeouts), float(groups.retries)])))),
            **_reward_stats(acc, groups.rewards, chosen.rewards),
            **{f"scored_reward/{k}": v for k, v in _mean_over_ranks(acc, groups.reward_means).items()},
            **_lengths(acc, groups.rollouts.completion_mask, chosen.rows),
            **_sampling_counts(acc, c, groups.counts),
            **s.sampler.step_metrics(),
            **stats,
            "update_peak_memory_mb": mem.peak_mb, "update_memory_delta_mb": mem.delta_mb,
        }
        if step in replayed:  # the logged step trained again: its record (evaluation included) and clock stand
            # from its recorded completions, only the arithmetic may differ; sampled again, nothing may
            exact = s.rollout_log is None or s.rollout_log.generated > generated
            check_replayed(replayed[step], _jsonable(record), s.output_dir, exact)
            s.train_seconds, s.train_cpu_seconds = replayed[step]["train_seconds"], replayed[step]["train_cpu_seconds"]
            bar.update(min(_clock(s, c) - clock0, c.time_budget_s - bar.n) if by_clock else 1)
            if step == max(replayed):  # from here on, the run is at its logged state
                save_checkpoint(s, step, with_optimizer=keeps_optimizer(c))
            continue
        due_by_clock = c.eval_every_s and int(_clock(s, c) // c.eval_every_s) > int(clock0 // c.eval_every_s)
        if (c.eval_every and step % c.eval_every == 0) or due_by_clock or step == c.steps:
            last_eval = _evaluate(s, c, step, metrics_file=None)
            record.update(last_eval)
        if acc.is_main_process:
            write_lines(metrics_file, [_jsonable(record)])
        s.run.logged_step = step
        if s.completions_log:  # this process's prompts: the main process's, the first of the step
            _log_completions(s.completions_log, c, step, groups, chosen)
        if c.report_to:
            acc.log({k: v for k, v in record.items() if isinstance(v, (int, float)) and v is not None}, step=step)
        failed += record["reward_timeouts"]
        if record["reward_timeouts"] and acc.is_main_process:
            log.warning("step %d: %d rollout(s) scored 0: their scoring passed reward_timeout_s=%g CPU s or "
                        "reward_wall_timeout_s=%g s twice, or its worker died", step, record["reward_timeouts"],
                        c.reward_timeout_s, c.reward_wall_timeout_s)
        bar.update(min(elapsed, c.time_budget_s - bar.n) if by_clock else 1)
        bar.set_postfix(reward=f"{record['generated_reward_mean']:.2f}", acc=_last_accuracy(last_eval),
                        gen=f"{record['generation_s']:.1f}s", score=f"{record['scoring_s']:.2f}s", update=f"{record['update_s']:.1f}s",
                        **({"scored_0": failed} if failed else {}))
        if (c.save_every and step % c.save_every == 0) or step == c.steps:
            save_checkpoint(s, step, with_optimizer=keeps_optimizer(c))

    if step < c.steps:  # stopped by the time budget: evaluate and save where it stopped
        if last_eval is None or last_eval.get("eval_step") != step:
            record = {"step": step, "train_seconds": s.train_seconds, "train_cpu_seconds": s.train_cpu_seconds,
                      **_evaluate(s, c, step, None)}
            if acc.is_main_process:
                write_lines(metrics_file, [_jsonable(record)])
        save_checkpoint(s, step, with_optimizer=keeps_optimizer(c))


def _clock(s: Setup, c: Config) -> float:
    """The training clock that ``time_budget_s`` and ``eval_every_s`` count (``clock``): wall
    seconds, or this process's CPU seconds."""
    return s.train_cpu_seconds if c.clock == "cpu" else s.train_seconds


def _last_accuracy(last_eval: dict | None) -> str:
    """The last held-out accuracy and the step it was measured at, for the progress bar."""
    return f"{last_eval['eval_accuracy']:.2f}@{last_eval['eval_step']}" if last_eval else "-"


def keeps_optimizer(c: Config) -> bool:
    """Whether checkpoints hold the optimizer state: as set, else where the run saves periodically."""
    return c.save_optimizer if c.save_optimizer is not None else c.save_every > 0


def _log_completions(file, c: Config, step: int, groups: Groups, chosen: Selected) -> None:
    """The first ``c.log_completions`` rollouts of this step, one JSON line each."""
    advantage = dict(zip(chosen.rows.tolist(), chosen.advantages.flatten().tolist()))
    owner = [p for p, size in enumerate(groups.sizes) for _ in range(size)]  # row -> its group
    rewards = [r for p, size in enumerate(groups.sizes) for r in groups.rewards[p, :size].tolist()]
    lines = []
    for row in range(min(c.log_completions, len(owner))):
        problem = groups.problems[owner[row]]
        lines.append({
            "step": step, "question": problem.question, "answer": problem.answer, "completion": groups.rollouts.texts[row],
            "reward": rewards[row], "selected": row in advantage, "advantage": advantage.get(row),
        })
    write_lines(file, lines)


def write_lines(file: TextIO, records: list[dict]) -> None:
    """Append one JSON line per record to a run's log and flush it; a write that fails (a full
    disk, a file-size limit) raises PodsError naming the file."""
    try:
        file.writelines(json.dumps(r) + "\n" for r in records)
        file.flush()
    except OSError as e:
        raise PodsError(f"cannot write {file.name}: {os_reason(e)}") from None


def _close(file: TextIO) -> None:
    """Close a run's log; what a failed write left in its buffer is dropped (the write's error is
    the one to report)."""
    try:
        file.close()
    except OSError:
        pass


def _evaluate(s: Setup, c: Config, step: int, metrics_file) -> dict:
    t = time.perf_counter()
    with s.engine.phase():  # on every rank, also one with no problem to generate for
        accuracy, samples = evaluate(s.engine, s.tokenizer, s.task.test, s.system_prompt, c.rollout.max_new_tokens,
                                     c.eval_temperature, s.accelerator, keep=c.log_completions,
                                     progress=c.progress and s.accelerator.is_main_process)
    result = {"eval_accuracy": accuracy, "eval_seconds": time.perf_counter() - t, "eval_step": step}
    if s.eval_log:  # the main process's share of the held-out problems, the first of them
        write_lines(s.eval_log, [{"step": step, **sample} for sample in samples])
    if metrics_file is not None:
        write_lines(metrics_file, [{"step": step, "train_seconds": s.train_seconds,
                                    "train_cpu_seconds": s.train_cpu_seconds, **result}])
    if s.accelerator.is_main_process:
        log.info("step %d: held-out accuracy %.3f", step, accuracy)
    return result


def _reward_stats(acc: Accelerator, rewards: torch.Tensor, chosen: torch.Tensor) -> dict:
    """Mean and std of the rewards of every rollout generated for the trained groups (``rewards``
    [P, n], NaN past a group's size: how many depends on adaptive_n's stopping) and of the selected
    ones ([P, m], comparable between runs with and without adaptive_n), over all ranks; each
    metric's name says which."""
    every = rewards[~rewards.isnan()].double()
    count, total, squares = _sum_over_ranks(acc, [float(len(every)), float(every.sum()), float((every**2).sum())])
    if acc.num_processes > 1:
        chosen = acc.gather(chosen.to(acc.device)).cpu()
    group_std = chosen.std(1) if chosen.shape[1] > 1 else torch.zeros(len(chosen))
    variance = (squares - total**2 / count) / (count - 1) if count > 1 else 0.0
    return {
        "generated_reward_mean": total / max(count, 1.0), "generated_reward_std": max(variance, 0.0) ** 0.5,
        "selected_reward_mean": float(chosen.mean()), "selected_reward_std": float(chosen.std()) if chosen.numel() > 1 else 0.0,
        "frac_zero_std_groups": float((group_std == 0).float().mean()),
    }


def _lengths(acc: Accelerator, mask: torch.Tensor, rows: torch.Tensor) -> dict:
    """Mean completion length of every rollout generated for the trained groups and of the
    selected ones, over all ranks."""
    lengths = mask.sum(1).double().cpu()  # [N]
    generated, count, selected, chosen = _sum_over_ranks(
        acc, [float(lengths.sum()), float(len(lengths)), float(lengths[rows.cpu()].sum()), float(len(rows))])
    return {"generated_completion_length": generated / max(count, 1.0),
            "selected_completion_length": selected / max(chosen, 1.0)}


def _sampling_counts(acc: Accelerator, c: Config, counts: dict) -> dict:
    """The sampler's counts of the step, over all ranks: rollouts generated and groups dropped are
    summed; prompts skipped and batches drawn are the same on every rank; rounds, the most of any."""
    generated, filtered = _sum_over_ranks(acc, [float(counts["rollouts_generated"]), float(counts["groups_filtered"])])
    rounds = counts["adaptive_rounds"]
    if acc.num_processes > 1:
        rounds = acc.gather(torch.tensor([rounds], device=acc.device)).max()
    return {"rollouts_generated": int(generated), "prompts_skipped": counts["prompts_skipped"],
            "groups_filtered": int(filtered), "dynamic_rounds": counts["dynamic_rounds"], "adaptive_rounds": int(rounds)}


def _mean_over_ranks(acc: Accelerator, values: dict[str, float]) -> dict[str, float]:
    return dict(zip(values, (v / acc.num_processes for v in _sum_over_ranks(acc, list(values.values())))))


def _tracker_config(c: Config) -> dict:
    """The config as trackers take it: one level, values scalars (lists and None as text)."""
    return {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in flat_keys(to_dict(c)).items()}


def _jsonable(record: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
