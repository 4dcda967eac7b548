"""``podsrl plan``: what one step of each method costs on this model and machine, and where PODS
can pay.

It loads the run's model, engine, task and rewards as ``podsrl train`` does (the trainer's own
set-up functions), then measures, with the trainer's sampler (generation and scoring) and its
update function:

- generation over a few calls at several rollouts per prompt, fitted by least squares as
  ``a`` seconds per call of the engine plus ``b`` per rollout, on the task's own prompts, so at
  the completion lengths the task produces;
- the scoring time per rollout (the part not hidden behind generation, as the trainer logs it);
- the update's time and peak memory at several rollouts per prompt, every rollout trained, and
  at a step whose advantages are all 0 (one row trains), each right after a generate call as in
  a run's steps, fitted as ``u0 + u1`` per trained rollout and ``k0 + k1`` per rollout of a
  micro-batch.

Times are on the config's ``clock``: wall seconds, each phase as the trainer logs it; or
(``clock=cpu``) this process's CPU seconds, as a run's ``train_cpu_seconds`` counts a step, which
other jobs on a shared CPU bend far less (with ``threads=1``).

A step of P prompts, n rollouts each, of which r reach the update's forward and backward, in
micro-batches of w rollouts, is then predicted to take::

    generation = a * calls(P, n) + b * P * n      calls: the engine's generate passes (HF: P / (batch_size // n))
    scoring    = s * P * n
    update     = u0 + u1 * r                      memory: k0 + k1 * w

With ``skip_zero_advantage`` (and no KL term) the update skips rollouts whose advantage is 0, so r
depends on the rewards: it is estimated by drawing groups of n from the measured groups' rewards
(with replacement) and selecting m of them with the trainer's ``down_sample``. That is the share
at the start of training; as the policy learns it changes. ``--signal-from`` earlier runs on the
task (0/1 rewards) takes their signal step by step instead: each prompt's success rate drawn from
a Beta distribution of the step's mean reward, its concentration fitted to how many groups were
mixed (:func:`read_signal`, :func:`trained_over_runs`). ``--signal all`` counts every selected
rollout, the most an update costs.

With ``async_lag`` >= 1 (:mod:`podsrl.pipeline`) generation runs in a worker beside the update,
so the step is the longer of the two sides: generation is measured at the worker's threads, the
update at the trainer's (one after the other, in this process), and the weight sync as the copy of
the trained parameters into the shared buffers (the trainer publishing) and out of them (the
worker loading)::

    step t = max(load + generation + scoring, update_t + publish)

averaged over drawn steps, each update at its own trained rollouts: the worker generates step t + 1
beside update t only, so a short update cannot bank time for a long one.

Run at once, the two sides share the machine's memory bandwidth and caches, which this does not
measure (on a 2-core CPU each part ran about 10% longer beside the other: docs/async.md); nor the
rollouts' trip through the pipe.

The break-even of PODS (n, m) against GRPO (n = m) is ``T_GRPO / T_PODS``: PODS wins on time when
it needs fewer than that fraction of GRPO's optimizer steps to reach the same accuracy. Against
GRPO-GA at the same n it is ``T_GRPO-GA / T_PODS``.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from podsrl.config import MAX_ROLLOUTS, Config, flat_keys, to_dict
from podsrl.errors import PodsError, os_reason

MEASURED_STEP_FRACTION = {
    "grpo": (0.40, "[0.33-0.78]", "PODS (n = 32, m = 8) reached 90% of GRPO's (n = 8) gain in 0.40x its optimizer "
                                  "steps [95% CI 0.33-0.78], 8 fresh seeds (8-15), pre-registered"),
    "grpo-ga": (0.84, "[0.45-1.44]", "PODS (n = 32, m = 8) reached 90% of GRPO-GA's (n = 32) gain in 0.84x its "
                                     "optimizer steps [95% CI 0.45-1.44], 8 fresh seeds (8-15), measure fixed before them"),
}
"""The fraction of the baseline's optimizer steps PODS needed, as measured: the seed mean, its
interval, and what was measured. The measure is the steps to 90% of the baseline's gain (from
the step-0 accuracy to its final level), not the paper's steps to the baseline's peak, which is
biased and unstable on these runs (docs/experiments/compare-2digit.md). Both are the
confirmation's figures, on fresh seeds with the measure fixed before them: against GRPO its
primary statistic; against GRPO-GA a secondary one (its primary was the CPU-clock speed-up), on
the eight seeds of its repetition (benchmarks/evidence.py confirm-b8), which hold the first
five's runs (0.99x [0.43-1.71] on those five)."""
MEASURED_SOURCE = ("two-digit arithmetic, SmolLM2-135M-Instruct, docs/experiments/compare-2digit.md; "
                   "measured on one task and model, not a law")
SIGNAL_DRAWS = 64
"""Groups drawn from each measured group to estimate how many rollouts an update trains."""


@dataclass
class Sizes:
    """What ``plan`` measures and which settings its table predicts (rollouts per prompt)."""

    generate: list[int]
    """n of the measured generate calls (each of ``prompts_per_step`` prompts)."""
    calls: int
    """Measured calls at each n (after one warm-up call that is not counted)."""
    update: list[int]
    """Rollouts per prompt of the measured updates (after one warm-up update)."""
    candidates: list[int]
    """n of the table's PODS and GRPO-GA rows (each > m)."""


def default_sizes(c: Config) -> Sizes:
    """Sizes that span the configured step and the table, within about two minutes on the
    embedded default on a 2-core CPU."""
    m = base_m(c)
    candidates = sorted({2 * m, 4 * m, 8 * m} | ({c.n} if c.n > m else set()))
    return Sizes(generate=sorted({m, 2 * m, 4 * m}), calls=2, update=sorted({2, m, 2 * m}), candidates=candidates)


def base_m(c: Config) -> int:
    """The rollouts per prompt that every method of the table trains: m (n under ``mode=grpo``)."""
    return c.n if c.mode == "grpo" else c.m


def check_plan(c: Config, sizes: Sizes) -> None:
    """Refuse what ``plan`` cannot model or measure (``PodsError``, before any model loads)."""
    for key, on in (("adaptive_n", c.adaptive_n), ("dynamic_sampling", c.dynamic_sampling),
                    ("prompt_filter", c.prompt_filter != "none")):
        if on:
            raise PodsError(f"plan models one generate call of n rollouts per prompt a step; {key} changes how many "
                            "are generated, so leave it at its default for plan")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise PodsError("plan measures in one process; run it without a launcher")
    m = base_m(c)
    if m < 2:
        raise PodsError(f"plan's table trains m = {m} rollouts per prompt in every method, GRPO's n = m and PODS's m "
                        "included, and podsrl train needs them >= 2: give m >= 2")
    too_many = [n for n in (*sizes.generate, *sizes.update, *sizes.candidates) if n * c.prompts_per_step > MAX_ROLLOUTS]
    if too_many:
        raise PodsError(f"n = {too_many[0]} x prompts_per_step = {c.prompts_per_step} rollouts a step is more than "
                        f"podsrl train takes ({MAX_ROLLOUTS:,})")
    if sizes.calls < 1:
        raise PodsError(f"--calls must be >= 1, got {sizes.calls}")
    if len(set(sizes.generate)) < 2 or min(sizes.generate) < 2:
        raise PodsError(f"--generate needs two or more different sizes, each >= 2, got {sizes.generate}: "
                        "the fit has a per-call and a per-rollout cost")
    if len(set(sizes.update)) < 2 or min(sizes.update) < 2 or max(sizes.update) > max(sizes.generate):
        raise PodsError(f"--update needs two or more different sizes in 2..{max(sizes.generate)} (the largest "
                        f"generated n), got {sizes.update}")
    if not sizes.candidates or min(sizes.candidates) <= m:
        raise PodsError(f"--candidates must be n values > m = {m} (PODS trains m of n), got {sizes.candidates}")


# --------------------------------------------------------------------------- the model


def least_squares(features: list[list[float]], y: list[float]) -> list[float]:
    """The coefficients c minimising ``sum_i (features[i] . c - y[i])^2``."""
    coef, *_ = np.linalg.lstsq(np.asarray(features, dtype=float), np.asarray(y, dtype=float), rcond=None)
    return [float(v) for v in coef]


def engine_calls(prompts: int, n: int, batch_size: int | None) -> int:
    """Generate passes of one step: the HF engine takes ``batch_size // n`` prompts (at least one)
    a pass; an engine without a batch size takes them all at once."""
    if not batch_size:
        return 1
    return math.ceil(prompts / max(1, batch_size // n))


@dataclass
class CostModel:
    """The fitted costs of one step's phases (seconds, MB)."""

    per_call_s: float  # a: generation, per generate pass of the engine
    per_rollout_s: float  # b: generation, per rollout
    scoring_per_rollout_s: float  # s: scoring not hidden behind generation, per rollout
    update_fixed_s: float  # u0: the update, whatever it trains (optimizer step, weight sync)
    update_per_rollout_s: float  # u1: the update, per rollout through its forward and backward
    memory_fixed_mb: float | None  # k0: the update's peak memory (None: not measurable here)
    memory_per_rollout_mb: float | None  # k1: per rollout of its largest micro-batch
    prompts: int  # P, prompts per step
    batch_size: int | None  # the engine's rows per generate pass (None: all at once)
    overlapped: bool = False  # async_lag >= 1: generation and scoring beside the update
    publish_s: float = 0.0  # the trainer's copy of the trained parameters into the shared buffers
    load_s: float = 0.0  # the worker's copy out of them

    def step(self, n: int, trained: float, micro_batch: int, per_step: Sequence[float] | None = None) -> dict:
        """One step's predicted times with ``n`` rollouts per prompt, ``trained`` rollouts through
        the update's forward and backward, ``micro_batch`` rollouts per micro-batch.

        Overlapped (``async_lag``): step t lasts max(worker's side, update t's side) — the worker
        generates step t + 1 beside update t and no further ahead — so the mean step is the mean
        of that maximum over the steps' trained rollouts ``per_step`` (their draws; default: every
        step trains ``trained``), not the maximum of the mean parts."""
        rows = self.prompts * n
        generation = self.per_call_s * engine_calls(self.prompts, n, self.batch_size) + self.per_rollout_s * rows
        scoring = self.scoring_per_rollout_s * rows
        update_at = lambda r: self.update_fixed_s + self.update_per_rollout_s * r  # an update of r trained rollouts
        update = update_at(trained)
        memory = None if self.memory_fixed_mb is None else self.memory_fixed_mb + self.memory_per_rollout_mb * micro_batch
        if self.overlapped:
            worker = self.load_s + generation + scoring
            each = [update_at(r) + self.publish_s for r in (per_step or [trained])]
            step = sum(max(worker, u) for u in each) / len(each)
        else:
            step = generation + scoring + update
        return {"step_s": step, "generation_s": generation, "scoring_s": scoring, "update_s": update,
                "update_peak_mb": memory}


def fit(generation: list[dict], updates: list[dict], scoring_s: float, scored: int, prompts: int,
        batch_size: int | None, sync: dict | None = None) -> CostModel:
    """The cost model from the measured points: generation ``{"calls", "rows", "seconds"}`` per
    call, updates ``{"rows", "seconds", "peak_mb"}``; ``sync`` (``async_lag``): the weight sync's
    ``{"publish_s", "load_s"}``."""
    a, b = least_squares([[p["calls"], p["rows"]] for p in generation], [p["seconds"] for p in generation])
    u0, u1 = least_squares([[1.0, p["rows"]] for p in updates], [p["seconds"] for p in updates])
    memory = [p for p in updates if p["peak_mb"] is not None and math.isfinite(p["peak_mb"])]
    k0, k1 = least_squares([[1.0, p["rows"]] for p in memory], [p["peak_mb"] for p in memory]) if len(memory) >= 2 else (None, None)
    return CostModel(a, b, scoring_s / max(scored, 1), u0, u1, k0, k1, prompts, batch_size, sync is not None,
                     **(sync or {}))


def method_config(c: Config, mode: str, n: int) -> Config:
    """The run's config as ``mode`` with ``n`` rollouts per prompt (m: the table's)."""
    m = base_m(c)
    return replace(c, mode=mode, n=m if mode == "grpo" else n, m=m)


def trained_rollouts(c: Config, groups: torch.Tensor, generator: torch.Generator, per_step: bool = False):
    """Rollouts the update of one step under ``c`` trains on average, with groups of ``c.n``
    rewards drawn with replacement from the measured ``groups`` ``[G, N]``: the selected ones
    whose advantage is not 0 where ``skip_zero_advantage`` applies (at least one a step, as the
    trainer keeps), else every selected one. ``per_step``: each drawn step's count instead (a list)."""
    from podsrl.config import trained_per_prompt
    from podsrl.trainer import skips_zero_advantage

    P = c.prompts_per_step
    if not skips_zero_advantage(c):
        return [float(P * trained_per_prompt(c))] if per_step else float(P * trained_per_prompt(c))
    G, N = groups.shape
    draws = max(SIGNAL_DRAWS, P)
    pick = torch.randint(N, (G * draws, c.n), generator=generator)  # [G * draws, n]
    rewards = groups.repeat_interleave(draws, 0).gather(1, pick)
    per_group = _trained_per_group(c, rewards)
    per_group = per_group[torch.randperm(len(per_group), generator=generator)]
    steps = per_group[: len(per_group) // P * P].view(-1, P).sum(1).clamp(min=1)
    return steps.tolist() if per_step else float(steps.mean())


def _trained_per_group(c: Config, rewards: torch.Tensor) -> torch.Tensor:
    """The selected rollouts with a non-zero advantage in each group of ``rewards`` ``[G, n]``
    under ``c``'s selection (the trainer's ``down_sample``)."""
    from podsrl.trainer import down_sample

    return (down_sample(c, rewards, step=0).advantages != 0).sum(1).double()


# --------------------------------------------------------------------------- a run's reward signal


@dataclass
class Signal:
    """The 0/1 reward signal of earlier runs on the task (``--signal-from``), step by step: each
    step's mean reward over its P x n rollouts and how many of its P groups held both values, and
    the spread of the prompts' success rates fitted to them (the concentration of a Beta
    distribution)."""

    runs: list[str]
    n: int
    prompts: int
    means: list[float]
    mixed: list[int]
    concentration: float


def mixed_share(mean: float, concentration: float, n: int) -> float:
    """The probability that a group of ``n`` 0/1 rewards holds both values when each prompt's
    success rate p is drawn from Beta(mean * k, (1 - mean) * k), k the concentration:
    ``1 - E[p^n] - E[(1 - p)^n]``, with ``E[p^n] = prod_{i<n} (a + i) / (k + i)``."""
    a, b = mean * concentration, (1 - mean) * concentration
    return 1.0 - math.prod((a + i) / (concentration + i) for i in range(n)) - math.prod(
        (b + i) / (concentration + i) for i in range(n))


CONCENTRATIONS = np.exp(np.linspace(math.log(0.01), math.log(1000.0), 241))
"""The concentrations the fit searches (log-spaced): small means prompts that are either nearly
always or nearly never solved; large, every prompt alike."""


def fit_concentration(means: list[float], mixed: list[int], prompts: int, n: int) -> float:
    """The concentration k under which the observed counts of mixed groups are most likely: at
    each step, ``mixed ~ Binomial(prompts, mixed_share(mean, k, n))``."""
    def log_likelihood(k: float) -> float:
        total = 0.0
        for mean, x in zip(means, mixed):
            q = min(max(mixed_share(mean, k, n), 1e-12), 1 - 1e-12)
            total += x * math.log(q) + (prompts - x) * math.log(1 - q)
        return total

    return float(max(CONCENTRATIONS, key=log_likelihood))


def read_signal(folders: list[Path], c: Config | None = None) -> Signal:
    """The reward signal of finished runs (``metrics.jsonl`` and ``config.yaml`` in each): runs
    of one n and one prompt count, on one process (their mixed count is over the step's groups of
    every process), whose every group's generated rollouts are the ones its mixed count sees (GRPO,
    GRPO-GA, or PODS max-variance), with 0/1 rewards (checked: each step's reward variance is the
    one 0/1 values of its mean have); given ``c``, runs of its task and rewards."""
    import yaml

    from podsrl.checkpoint import read_metrics

    means, mixed, shape = [], [], set()
    for folder in folders:
        folder = Path(folder)
        try:
            cfg = yaml.safe_load((folder / "config.yaml").read_text())
        except OSError as e:
            raise PodsError(f"--signal-from {folder}: not a run's folder (config.yaml and metrics.jsonl): "
                            f"{os_reason(e)}") from None
        except (ValueError, yaml.YAMLError) as e:
            raise PodsError(f"--signal-from {folder}: unreadable run files ({type(e).__name__})") from None
        rows = read_metrics(folder / "metrics.jsonl")  # a last line cut short dropped, as a run's resume does
        if not isinstance(cfg, dict):
            raise PodsError(f"--signal-from {folder}: its config.yaml holds no settings (a mapping of keys)")
        other = c is not None and other_task(cfg, c)
        if other:
            raise PodsError(f"--signal-from {folder}: a run of another task or reward ({other}); the signal is the "
                            "task's and the rewards'")
        if cfg.get("adaptive_n") or cfg.get("dynamic_sampling"):
            raise PodsError(f"--signal-from {folder}: a run of one generate call of n per prompt a step is needed "
                            "(not adaptive_n or dynamic_sampling)")
        if cfg.get("mode") == "pods" and cfg.get("rule") != "max_variance":
            raise PodsError(f"--signal-from {folder}: a PODS run's mixed groups count its whole groups only under "
                            f"rule max_variance, not {cfg.get('rule')}")
        try:
            n, P = int(cfg["n"]), int(cfg["prompts_per_step"])
            steps = [(r["step"], float(r["generated_reward_mean"]), float(r["generated_reward_std"]),
                      int(r["rollouts_generated"]), float(r["frac_zero_std_groups"]))
                     for r in rows if "frac_zero_std_groups" in r]
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise PodsError(f"--signal-from {folder}: not a podsrl run's config.yaml and metrics.jsonl "
                            f"({type(e).__name__}: {e})") from None
        shape.add((n, P))
        for step, mean, std, count, zero_std in steps:
            if not (all(map(math.isfinite, (mean, std))) and 0 <= zero_std <= 1):
                raise PodsError(f"--signal-from {folder}: step {step} logged generated_reward_mean {mean}, "
                                f"generated_reward_std {std} and frac_zero_std_groups {zero_std} (a share, 0 to 1)")
            binary = count * mean * (1 - mean) / max(count - 1, 1)
            if not (0 <= mean <= 1) or abs(std**2 - binary) > 1e-6 * max(1.0, binary):
                raise PodsError(f"--signal-from {folder}: step {step}'s rewards are not 0/1 (mean {mean:.4g}, "
                                f"std {std:.4g}); the signal model is for 0/1 rewards")
            means.append(mean)
            mixed.append(round((1 - zero_std) * P))
    if len(shape) > 1:
        raise PodsError(f"--signal-from: runs of one n and prompts_per_step are needed, got {sorted(shape)}")
    if not means:
        raise PodsError(f"--signal-from {', '.join(map(str, folders))}: no training step logged")
    (n, P), = shape
    return Signal([str(f) for f in folders], n, P, means, mixed, fit_concentration(means, mixed, P, n))


def other_task(recorded: dict, c: Config) -> str:
    """The first setting of the task (its held-out size aside) or of the rewards in which a run's
    recorded config differs from ``c``, as ``key: run's value, c's value``; "" where none does."""
    now, run = flat_keys(to_dict(c)), flat_keys(to_dict(Config()))
    run.update(flat_keys(recorded))
    for key, value in now.items():
        if (key.startswith("task.") and key != "task.test_size" or key in ("rewards", "reward_weights")) \
                and run.get(key) != value:
            return f"{key}: {run.get(key)!r}, here {value!r}"
    return ""


def trained_over_runs(c: Config, signal: Signal, rng: np.random.Generator, draws: int = 16, per_step: bool = False):
    """Rollouts the update of one step under ``c`` trains on average over the steps of ``signal``'s
    runs: at each step, prompts whose success rates are drawn from the fitted Beta at that step's
    mean reward, ``c.n`` 0/1 rewards each, then ``c``'s selection (at least one a step where the
    trainer skips zero advantages). ``per_step``: each drawn step's count instead (a list)."""
    from podsrl.config import trained_per_prompt
    from podsrl.trainer import skips_zero_advantage

    P = c.prompts_per_step
    if not skips_zero_advantage(c):
        return [float(P * trained_per_prompt(c))] if per_step else float(P * trained_per_prompt(c))
    k = signal.concentration
    mean = np.repeat(np.clip(signal.means, 1e-6, 1 - 1e-6), draws * P)
    rate = rng.beta(mean * k, (1 - mean) * k)  # [steps * draws * P]
    rewards = torch.from_numpy((rng.random((len(rate), c.n)) < rate[:, None]).astype(np.float32))
    per_group = _trained_per_group(c, rewards)
    steps = per_group.view(-1, P).sum(1).clamp(min=1)
    return steps.tolist() if per_step else float(steps.mean())


def predict(c: Config, model: CostModel, sizes: Sizes, groups: torch.Tensor | None, signal: str = "measured",
            earlier: Signal | None = None) -> list[dict]:
    """The table's rows: GRPO (n = m), then PODS (n, m) and GRPO-GA (n) for each candidate n, each
    with its predicted step and break-even (PODS rows). The rollouts each update trains: every
    selected one (``signal="all"``), those of non-zero advantage over ``earlier`` runs' reward
    signal where given, else in the ``groups`` measured at the start of training."""
    from podsrl.config import trained_per_prompt
    from podsrl.trainer import micro_batch_size

    generator = torch.Generator().manual_seed(c.seed)
    rng = np.random.default_rng(c.seed)
    rows = []
    for mode, n in [("grpo", base_m(c))] + [(mode, n) for n in sizes.candidates for mode in ("pods", "grpo-ga")]:
        cm = method_config(c, mode, n)
        all_rows = float(c.prompts_per_step * trained_per_prompt(cm))
        # each drawn step's trained rollouts: their mean sets a synchronous step, their spread an overlapped one
        starts = [all_rows] if signal == "all" or groups is None else trained_rollouts(cm, groups, generator, per_step=True)
        drawn = trained_over_runs(cm, earlier, rng, per_step=True) if earlier is not None and signal != "all" else starts
        at_start, trained = sum(starts) / len(starts), sum(drawn) / len(drawn)
        rows.append({"method": mode, "n": cm.n, "m": cm.m, "rollouts": c.prompts_per_step * cm.n, "trained": trained,
                     **model.step(cm.n, trained, micro_batch_size(cm, c.prompts_per_step), per_step=drawn)})
        if earlier is not None:  # the start of training's estimate beside it
            rows[-1]["trained_at_start"] = at_start
    grpo = rows[0]
    for row in rows:
        if row["method"] == "pods":
            ga = next(r for r in rows if r["method"] == "grpo-ga" and r["n"] == row["n"])
            row["break_even_vs_grpo"] = grpo["step_s"] / row["step_s"]
            row["break_even_vs_grpo_ga"] = ga["step_s"] / row["step_s"]
    return rows


def fit_warnings(model: CostModel) -> list[str]:
    """A negative fitted cost means the measured points are too few or too noisy to tell the
    per-call cost from the per-rollout one (or the fixed update cost from the per-rollout one)."""
    names = {"per_call_s": "generation's per-call cost", "per_rollout_s": "generation's per-rollout cost",
             "update_fixed_s": "the update's fixed cost", "update_per_rollout_s": "the update's per-rollout cost"}
    return [f"{label} came out negative ({getattr(model, key):.4f} s): the measured times are too noisy or too close "
            "together for this fit; give more --calls, sizes further apart, or a quieter machine"
            for key, label in names.items() if getattr(model, key) < 0]


def verdicts(rows: list[dict]) -> list[str]:
    """Where PODS can pay on this machine and where it cannot, against the measured step fractions."""
    grpo = rows[0]
    lines = []
    for row in (r for r in rows if r["method"] == "pods"):
        name = f"PODS (n = {row['n']}, m = {row['m']})"
        for base, key, label in (("grpo", "break_even_vs_grpo", f"GRPO (n = {grpo['n']})"),
                                 ("grpo-ga", "break_even_vs_grpo_ga", f"GRPO-GA (n = {row['n']})")):
            measured, interval, _ = MEASURED_STEP_FRACTION[base]
            be, short = row[key], label.split(" (")[0]
            if be < measured:
                lines.append(f"{name} cannot pay against {label} here: it wins on time only if it needs fewer than "
                             f"{be:.2f}x {short}'s optimizer steps; it needed {measured:.2f}x {interval} on the task measured")
            else:
                lines.append(f"{name} can pay against {label}: it wins on time if it needs fewer than {be:.2f}x "
                             f"{short}'s optimizer steps (it needed {measured:.2f}x {interval} on the task measured)")
    return lines


# --------------------------------------------------------------------------- measuring


def measure(c: Config, sizes: Sizes, progress: bool = True) -> dict:
    """Load the run's parts as the trainer does, measure generation, scoring and updates."""
    from podsrl import pipeline, trainer
    from podsrl.rollout import check_engine
    from podsrl.sampling import Sampler
    from podsrl.tasks import task_from_config

    started = time.perf_counter()
    c = replace(c, report_to=[])
    # under async_lag, generation at the worker's threads and the update at the trainer's
    threads = (pipeline.worker_threads(c), pipeline.trainer_threads(c)) if c.async_lag else (c.threads, c.threads)
    if threads[1]:
        torch.set_num_threads(threads[1])
    accelerator = trainer.make_accelerator(c, None)
    check_engine(c.rollout.engine, c.rollout, autocast=accelerator.mixed_precision != "no")
    task = task_from_config(c.task, c.seed)
    s = trainer.load_scoring(replace(c, async_lag=0), accelerator, task, run=None)  # no generation worker
    if c.async_lag and c.rollout.engine == "hf":
        s.engine.record_logp = True  # as the worker's engine
    P = c.prompts_per_step
    batch_size = getattr(s.engine, "batch_size", None)
    by_cpu = c.clock == "cpu"  # this process's CPU seconds, as the trainer's train_cpu_seconds counts a step
    N = max(sizes.generate)
    # the updates (rollouts per prompt; None: a step whose advantages are all 0, which trains one
    # row where zero-advantage rollouts are skipped), the first a warm-up (optimizer state)
    update_sizes = [min(sizes.update)] + sorted(sizes.update) + ([None] if trainer.skips_zero_advantage(c) else [])
    # the generate calls, the largest n first: its rollouts are the ones the updates train
    generate_sizes = [n for n in sorted(set(sizes.generate), reverse=True) for _ in range(sizes.calls)]
    bar = tqdm(total=1 + len(generate_sizes) + len(update_sizes), desc="plan", unit="call", disable=not progress)
    call = 0

    def generate(n: int):
        nonlocal call
        cn = replace(c, n=n, m=min(c.m, n))
        sampler = Sampler(cn, task, s.engine, s.scorer, s.tokenizer, s.system_prompt, accelerator, start_step=call)
        call += 1
        cpu = time.process_time()
        if threads[0]:
            torch.set_num_threads(threads[0])
        try:
            with s.engine.phase():
                groups = sampler.step_groups(call)
        finally:
            if threads[1]:
                torch.set_num_threads(threads[1])
        bar.update(1)
        return groups, time.process_time() - cpu

    points, largest, updates = [], [], []
    lengths = rewards = 0.0
    scoring_s = scored = 0

    def update(i: int, m: int | None, source) -> None:
        bar.set_postfix(update_m=m if m is not None else "zero-signal")
        cu = replace(c, mode="pods", n=N, m=m or min(sizes.update), skip_zero_advantage=m is None)
        chosen = trainer.down_sample(cu, source.rewards, step=i + 1, sizes=source.sizes)
        if m is None:
            chosen = chosen._replace(advantages=torch.zeros_like(chosen.advantages))
        t, cpu = time.perf_counter(), time.process_time()  # as the trainer times it: PeakMemory's set-up included
        with trainer.PeakMemory(accelerator.device) as mem:
            trainer.update(s, cu, source.rollouts, chosen, step=i + 1)
        wall_s, cpu_s = time.perf_counter() - t, time.process_time() - cpu
        if i:
            rows = 1 if m is None else P * m
            updates.append({"m": m, "rows": rows, "seconds": cpu_s if by_cpu else wall_s, "wall_s": wall_s,
                            "cpu_s": cpu_s, "peak_mb": mem.peak_mb if math.isfinite(mem.peak_mb) else None})
        bar.update(1)

    try:
        generate(min(sizes.generate))  # warm-up: first-call costs (allocations, kernels) are not a step's
        # generate and update alternate, as in a run's steps (each update follows a generate call)
        for i, n in enumerate(generate_sizes):
            bar.set_postfix(n=n)
            g, cpu_s = generate(n)
            rows = P * n
            points.append({"n": n, "rows": rows, "calls": engine_calls(P, n, batch_size),
                           "seconds": cpu_s if by_cpu else g.generation_s, "wall_s": g.generation_s, "cpu_s": cpu_s})
            scoring_s, scored = scoring_s + (0.0 if by_cpu else g.scoring_s), scored + rows
            lengths += float(g.rollouts.completion_mask.sum())
            rewards += float(g.rewards.sum())
            if n == N:
                largest.append(g)
            if i < len(update_sizes):
                update(i, update_sizes[i], largest[0])
        for i in range(len(generate_sizes), len(update_sizes)):  # more updates than generate calls
            update(i, update_sizes[i], largest[0])
    finally:
        bar.close()
        s.scorer.close()
    groups = torch.cat([g.rewards for g in largest])  # [calls * P, N]
    sync = weight_sync(s.model) if c.async_lag else None
    model = fit(points, updates, scoring_s, scored, P, batch_size, sync)
    return {
        "model": model, "groups": groups, "generation": points, "updates": updates,
        "mean_completion_length": lengths / scored, "reward_mean": rewards / scored,
        "device": str(accelerator.device), "mixed_precision": str(accelerator.mixed_precision),
        "threads": torch.get_num_threads(), "batch_size": batch_size, "measure_s": time.perf_counter() - started,
        "worker_threads": threads[0] if c.async_lag else None,
    }


def weight_sync(model, repeats: int = 5) -> dict:
    """The seconds of one weight sync under ``async_lag``, the median of ``repeats``: the trainer's
    copy of the trained parameters (with LoRA, the adapter's) into buffers of their shape, and a
    copy out of them into tensors of the same shape, as the worker loads them."""
    from podsrl.pipeline import trained_parameters

    params = {k: p.detach() for k, p in trained_parameters(model).items()}
    buffers = {k: torch.empty_like(p) for k, p in params.items()}
    loaded = {k: torch.empty_like(p) for k, p in params.items()}

    def timed(pairs) -> float:
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            for dst, src in pairs:
                dst.copy_(src)
            if params and next(iter(params.values())).is_cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        return float(np.median(times))

    return {"publish_s": timed([(buffers[k], params[k]) for k in params]),
            "load_s": timed([(loaded[k], buffers[k]) for k in params])}


def plan(c: Config, sizes: Sizes | None = None, signal: str = "measured", progress: bool | None = None,
         signal_from: list[Path] | None = None) -> dict:
    """Measure and predict; the report ``podsrl plan`` prints and writes as JSON. ``signal_from``:
    earlier runs on the task whose reward signal sets the rollouts each update trains."""
    sizes = sizes or default_sizes(c)
    check_plan(c, sizes)
    if signal_from and signal == "all":
        raise PodsError("--signal all trains every selected rollout; --signal-from has no part in it: give one of them")
    earlier = read_signal(signal_from, c) if signal_from else None
    if earlier is not None and earlier.prompts != c.prompts_per_step:
        raise PodsError(f"--signal-from: its runs took {earlier.prompts} prompts a step, this config "
                        f"{c.prompts_per_step}; the mixed groups a step are counted over the prompts of a step")
    started = time.perf_counter()
    m = measure(c, sizes, c.progress if progress is None else progress)
    signal = "runs" if earlier is not None else signal
    rows = predict(c, m["model"], sizes, m["groups"], signal, earlier)
    return {
        "model": c.model.name_or_path, "task": c.task.name, "device": m["device"], "mixed_precision": m["mixed_precision"],
        "clock": c.clock,
        "threads": m["threads"], "engine": c.rollout.engine, "prompts_per_step": c.prompts_per_step, "m": base_m(c),
        "async_lag": c.async_lag, "worker_threads": m["worker_threads"],
        "max_new_tokens": c.rollout.max_new_tokens, "sizes": asdict(sizes), "signal": signal,
        "measured": {
            "generation": m["generation"], "updates": m["updates"], "engine_batch_size": m["batch_size"],
            "mean_completion_length": m["mean_completion_length"], "reward_mean": m["reward_mean"],
        },
        "fit": asdict(m["model"]),
        "signal_from": None if earlier is None else {
            "runs": earlier.runs, "n": earlier.n, "prompts_per_step": earlier.prompts, "steps": len(earlier.means),
            "reward_mean": sum(earlier.means) / len(earlier.means), "concentration": earlier.concentration,
            "mixed_share": sum(earlier.mixed) / (earlier.prompts * len(earlier.mixed))},
        "settings": rows,
        "verdicts": verdicts(rows),
        "warnings": fit_warnings(m["model"]),
        "measured_step_fraction": {k: {"fraction": f, "interval": interval, "what": what, "source": MEASURED_SOURCE}
                                   for k, (f, interval, what) in MEASURED_STEP_FRACTION.items()},
        "seconds": time.perf_counter() - started,
        "config": to_dict(c),
    }


# --------------------------------------------------------------------------- the report


def _num(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def table(report: dict) -> str:
    """The settings as a Markdown table."""
    head = ("| method | n | m | rollouts/step | trained/step | step s | generation s | scoring s | update s "
            "| update peak MB | break-even vs GRPO | vs GRPO-GA |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = [f"| {r['method']} | {r['n']} | {r['m'] if r['method'] != 'grpo' else r['n']} | {r['rollouts']} | {r['trained']:.1f} "
             f"| {r['step_s']:.2f} | {r['generation_s']:.2f} | {r['scoring_s']:.3f} | {r['update_s']:.2f} "
             f"| {_num(r['update_peak_mb'], 0)} | {_num(r.get('break_even_vs_grpo'))} | {_num(r.get('break_even_vs_grpo_ga'))} |"
             for r in report["settings"]]
    return head + "\n".join(lines) + "\n"


def render(report: dict) -> str:
    """The report as ``podsrl plan`` prints it."""
    f, g = report["fit"], report["measured"]
    gen_rows = sorted({p["rows"] for p in g["generation"]})
    upd_rows = [p["rows"] for p in g["updates"]]
    memory = ("" if f["memory_fixed_mb"] is None else
              f"; peak memory {f['memory_fixed_mb']:,.0f} MB + {f['memory_per_rollout_mb']:.2f} MB per rollout of a micro-batch")
    signal = ("every selected rollout trained (--signal all)" if report["signal"] == "all" else
              "rollouts with a non-zero advantage, as drawn from the measured groups (reward mean "
              f"{g['reward_mean']:.2f} at the start of training; --signal all: every selected one)")
    if report["signal"] == "runs":
        e = report["signal_from"]
        signal = (f"rollouts with a non-zero advantage over the reward signal of {len(e['runs'])} earlier run(s) "
                  f"({e['steps']} steps of n = {e['n']}: reward mean {e['reward_mean']:.3f}, groups with both values "
                  f"{e['mixed_share']:.3f}; prompts' success rates fitted as Beta with concentration "
                  f"{e['concentration']:.3g})")
    out = [
        f"podsrl plan: {report['model']} on {report['device']} ({report['threads']} threads, mixed precision "
        f"{report['mixed_precision']}), engine {report['engine']}, task {report['task']}, "
        f"{report['prompts_per_step']} prompts a step, m = {report['m']}",
        f"generation: {f['per_call_s']:.3f} s per call + {1000 * f['per_rollout_s']:.2f} ms per rollout "
        f"(least squares over {len(g['generation'])} calls of {', '.join(map(str, gen_rows))} rollouts; completions "
        f"{g['mean_completion_length']:.1f} tokens on average, max_new_tokens {report['max_new_tokens']})",
        f"scoring: {1000 * f['scoring_per_rollout_s']:.2f} ms per rollout" if report["clock"] == "wall" else
        "clock=cpu: this process's CPU seconds, as a run's train_cpu_seconds counts them (scoring in this process "
        "counted within generation; in reward workers, not at all)",
        f"update: {f['update_fixed_s']:.3f} s + {f['update_per_rollout_s']:.4f} s per trained rollout (at "
        f"{', '.join(map(str, upd_rows))} rollouts){memory}",
        f"trained/step: {signal}",
        *([f"async_lag={report['async_lag']}: generation at the worker's {report['worker_threads']} thread(s), the update "
           f"at the trainer's {report['threads']}; weight sync {1000 * f['publish_s']:.1f} ms to publish + "
           f"{1000 * f['load_s']:.1f} ms to load; step s = the mean over drawn steps of max(load + generation + scoring, "
           "that step's update + publish), without what the two sides cost each other run at once"] if report.get("async_lag") else []),
        "",
        table(report),
        *report["verdicts"],
        *(f"warning: {w}" for w in report["warnings"]),
        f"Measured step fractions: {'; '.join(v['what'] for v in report['measured_step_fraction'].values())} "
        f"({MEASURED_SOURCE}).",
        f"plan took {report['seconds']:.0f} s",
    ]
    return "\n".join(out) + "\n"


def write_json(report: dict, path: Path) -> None:
    from podsrl.checkpoint import write_atomic

    write_atomic(path, json.dumps(report, indent=2) + "\n")
