"""Which prompts get rollouts, and how many: each step's groups, generated and scored.

The trainer asks :meth:`Sampler.step_groups` for a step's groups. With the options below off, that
is the step the paper runs: the next ``prompts_per_step`` prompts of the training stream (this
process's share of them), ``n`` rollouts each, scored while they are generated. Three options, off
by default, spend generation where it teaches; they compose with one another and with several
processes, and all but ``adaptive_n`` with every down-sampling rule (its stopping rule is
max-variance selection's; the config refuses it with another rule):

1. ``adaptive_n`` (rounds, as in Reinforce-Ada, arXiv 2510.04996): a prompt's rollouts come in
   rounds of ``adaptive_round`` (default m), later rounds batching only the prompts still running.
   A prompt stops once more rollouts cannot change the rewards it trains on (:func:`settled`): the
   rewards' declared range (each reward function's ``bounds``, weighted and summed) is [lo, hi],
   and the prompt holds at least ⌊m/2⌋ rewards at each end and m at the two ends together, so
   max-variance selection already takes the largest variance that any m rewards in [lo, hi] can
   have (Theorem 1: the k highest and the m − k lowest), and no later rollout, whatever its
   reward, could change the selected rewards or their advantages (with odd m, only swap ⌈m/2⌉ of
   one end for ⌈m/2⌉ of the other, at the same variance). For 0/1 rewards that is m/2 of each
   value (Theorem 2). A prompt that never reaches both ends takes all n, as PODS would draw. The
   rule is the declared range's, not the range seen so far (with accuracy + 0.2·format, a group
   holding only 0.2 and 1.2 may still draw a 0), so rewards without declared bounds are refused.
2. ``prompt_filter="history"`` (GRESO, Zheng et al., 2025, arXiv 2506.02177): each prompt, known by
   its text, carries z, the number of its latest groups in a row whose rewards were all equal.
   Before any rollout it is skipped with probability 1 − max(p^z, 0.01), never surely, and replaced
   by the next prompt of the stream. p starts at 0.5 and moves by 0.01 a step, within
   [0.05, 0.95], toward the level at which ``prompt_filter_target`` of a step's groups are all
   equal: down while more are, up while fewer. (GRESO keeps two such p, for all-correct and
   all-wrong prompts; one serves any reward.)
3. ``dynamic_sampling`` (DAPO, Yu et al., 2025, as verl's ``filter_groups``): groups whose rewards
   are all equal are dropped after scoring, and further batches of ``prompts_per_step`` prompts are
   drawn until every process holds its share of groups with signal, at most
   ``dynamic_sampling_rounds`` batches. Groups beyond the share are discarded, as verl does; a step
   that runs out of batches fills its share with dropped groups, in the order drawn.

Every random choice is seeded by (seed, step, ...), and the sampler's state (the prompts taken from
the stream, the per-prompt history, p) is saved with each checkpoint, so a resumed run draws what
it would have drawn. Under several processes every process draws the same prompts and keeps the
same history (each step's outcomes are gathered), generates its own share, and takes part in every
batch of dynamic sampling: a process that already holds its share draws the batch too but
generates nothing for it.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from podsrl.evaluate import chat_prompt
from podsrl.rewards import reward_bounds
from podsrl.rollout import Rollouts, concat_rollouts, take_rows
from podsrl.tasks import Problem

KEEP_START, KEEP_STEP, KEEP_LOW, KEEP_HIGH, KEEP_FLOOR = 0.5, 0.01, 0.05, 0.95, 0.01
"""GRESO's exploration probability p: its start, its step, its range, and the floor of p^z."""
COUNTS = ("rollouts_generated", "prompts_skipped", "groups_filtered", "dynamic_rounds", "adaptive_rounds")


def settled(rewards: list[float], m: int, bounds: tuple[float, float]) -> bool:
    """Whether more rollouts, of any rewards within ``bounds`` (the lowest and highest reward
    possible), cannot change the rewards that max-variance selection takes of a group holding
    ``rewards``: at least ⌊m/2⌋ of them at each bound, and m at the two together (for 0/1
    rewards: m/2 of each value). Rewards are float32: a bound matches to float32's precision."""
    lo, hi = bounds
    at_lo = sum(math.isclose(r, lo, rel_tol=1e-6, abs_tol=1e-7) for r in rewards)
    at_hi = sum(math.isclose(r, hi, rel_tol=1e-6, abs_tol=1e-7) for r in rewards)
    return lo < hi and min(at_lo, at_hi) >= m // 2 and at_lo + at_hi >= m


def skip_probability(all_equal_in_a_row: int, keep: float) -> float:
    """GRESO's chance of skipping a prompt whose latest z groups had all-equal rewards."""
    return 1.0 - max(keep**all_equal_in_a_row, KEEP_FLOOR) if all_equal_in_a_row else 0.0


class Groups(NamedTuple):
    """The groups of one step that reach selection, on this process."""

    problems: list[Problem]  # [P]
    rollouts: Rollouts  # group p's rollouts are rows sum(sizes[:p]) .. + sizes[p]
    rewards: torch.Tensor  # [P, max(sizes)], NaN past a group's size
    sizes: list[int]  # [P] rollouts of each group
    reward_means: dict[str, float]  # each reward function's mean over every rollout scored this step
    timeouts: int  # scorings past the time or memory bound twice, scored 0
    retries: int  # scorings run a second time after the first passed a bound
    generation_s: float
    scoring_s: float  # scoring time not hidden behind generation
    counts: dict[str, int]  # :data:`COUNTS` of this process


@dataclass
class _Group:
    problem: Problem
    parts: list[Rollouts] = field(default_factory=list)  # one per round
    rewards: list[float] = field(default_factory=list)

    @property
    def all_equal(self) -> bool:
        return max(self.rewards) == min(self.rewards)


class Sampler:
    """A run's prompt stream and rollout allocation (see the module docstring)."""

    def __init__(self, c, task, engine, scorer, tokenizer, system_prompt: str | None, accelerator,
                 state: dict | None = None, start_step: int = 0):
        self.c, self.engine, self.scorer, self.tokenizer = c, engine, scorer, tokenizer
        self.system_prompt, self.acc = system_prompt, accelerator
        state = state or {}
        self.consumed = state.get("consumed", start_step * c.prompts_per_step)  # prompts taken from the stream
        self.history: dict[str, int] = dict(state.get("history", {}))  # prompt -> all-equal groups in a row
        self.keep = state.get("keep", KEEP_START)
        self.stream = itertools.islice(task.train(c.seed), self.consumed, None)

    def state_dict(self) -> dict:
        return {"consumed": self.consumed, "history": self.history, "keep": self.keep}

    def policy_updated(self, model, version: int) -> None:
        """The policy has had ``version`` updates: the engine samples from it already (see
        :class:`podsrl.pipeline.AsyncSampler` for a sampler that lags)."""

    def step_metrics(self) -> dict:
        return {}

    def close(self) -> None:
        pass

    def step_groups(self, step: int) -> Groups:
        """This process's groups of ``step``: prompts drawn, rollouts generated and scored."""
        c, rank = self.c, self.acc.process_index
        share = c.prompts_per_step // self.acc.num_processes
        counts = dict.fromkeys(COUNTS, 0)
        totals = {"generation_s": 0.0, "scoring_s": 0.0, "timeouts": 0, "retries": 0, "scores": {}}
        kept, dropped, generated = [], [], []
        while True:
            batch = self._draw(step, counts)  # the same prompts on every process
            mine = batch[rank * share : (rank + 1) * share]
            first = counts["dynamic_rounds"] * c.prompts_per_step + rank * share  # seeds' index
            new = self._generate(step, first, mine, counts, totals) if len(kept) < share or not c.dynamic_sampling else []
            counts["dynamic_rounds"] += 1
            generated += new
            if not c.dynamic_sampling:
                kept = new
                break
            for g in new:
                (dropped if g.all_equal else kept).append(g)
            if self._everywhere(len(kept) >= share) or counts["dynamic_rounds"] >= c.dynamic_sampling_rounds:
                break
        counts["groups_filtered"] = len(dropped)
        kept = (kept + dropped)[:share]
        if c.prompt_filter == "history":
            self._remember(generated)
        return self._assemble(kept, counts, totals)

    # ------------------------------------------------------------------ prompts

    def _draw(self, step: int, counts: dict) -> list[Problem]:
        """The next ``prompts_per_step`` prompts of the stream, those skipped by the filter replaced."""
        rng = random.Random(f"{self.c.seed}-{step}-{counts['dynamic_rounds']}")
        batch = []
        while len(batch) < self.c.prompts_per_step:
            problem = next(self.stream)
            self.consumed += 1
            if self.c.prompt_filter == "history" and rng.random() < skip_probability(self.history.get(problem.question, 0), self.keep):
                counts["prompts_skipped"] += 1
                continue
            batch.append(problem)
        return batch

    def _remember(self, generated: list[_Group]) -> None:
        """Each prompt's run of all-equal groups, and GRESO's p, from this step's groups on every process."""
        outcomes = [(g.problem.question, g.all_equal) for g in generated]
        if self.acc.num_processes > 1:
            from accelerate.utils import gather_object

            outcomes = gather_object(outcomes)
        for question, all_equal in outcomes:
            self.history[question] = self.history.get(question, 0) + 1 if all_equal else 0
        if outcomes:
            share_equal = sum(e for _, e in outcomes) / len(outcomes)
            step = -KEEP_STEP if share_equal >= self.c.prompt_filter_target else KEEP_STEP
            self.keep = min(KEEP_HIGH, max(KEEP_LOW, self.keep + step))

    def _everywhere(self, holds: bool) -> bool:
        """Whether ``holds`` is true on every process (every process must ask)."""
        if self.acc.num_processes == 1:
            return holds
        missing = torch.tensor([0.0 if holds else 1.0], device=self.acc.device)
        return float(self.acc.reduce(missing, reduction="sum")) == 0.0

    # ------------------------------------------------------------------ rollouts

    def _generate(self, step: int, first: int, problems: list[Problem], counts: dict, totals: dict) -> list[_Group]:
        """Rollouts of ``problems``, in rounds with ``adaptive_n``, else n at once."""
        c = self.c
        prompts = [chat_prompt(self.tokenizer, self.system_prompt, p.question) for p in problems]
        seeds = [step_seed(c.seed, step, first + i) for i in range(len(problems))]
        groups = [_Group(p) for p in problems]
        per_round = (c.adaptive_round or c.m) if c.adaptive_n else c.n
        bounds = reward_bounds(self.scorer.fns, c.reward_weights) if c.adaptive_n else None
        running, size, rounds = list(range(len(problems))), 0, 0
        while running:
            take = min(per_round, c.n - size)
            self._round([prompts[i] for i in running], [seeds[i] for i in running], [groups[i] for i in running],
                        take, size, counts, totals)
            size, rounds = size + take, rounds + 1
            running = [i for i in running if c.adaptive_n and size < c.n and not settled(groups[i].rewards, c.m, bounds)]
        counts["adaptive_rounds"] = max(counts["adaptive_rounds"], rounds)
        return groups

    def _round(self, prompts: list[str], seeds: list[int], groups: list[_Group], n: int, first_row: int,
               counts: dict, totals: dict) -> None:
        """n more rollouts of each prompt (numbered from ``first_row``), scored while generated."""
        scores = self.scorer.start({"prompts": prompts, "answer": [g.problem.answer for g in groups],
                                    "question": [g.problem.question for g in groups],
                                    "entry": [g.problem.entry for g in groups],
                                    "require_marker": [g.problem.require_marker for g in groups]}, n,
                                   self.c.rollout.max_new_tokens, getattr(self.engine, "eos_ids", ()))
        start = time.perf_counter()
        out = self.engine.generate(prompts, n, self.c.rollout.temperature, self.c.rollout.max_new_tokens, seeds=seeds,
                                   on_chunk=scores.add, first_row=first_row)
        totals["generation_s"] += time.perf_counter() - start - scores.inline_s
        result = scores.result()
        totals["scoring_s"] += result.seconds
        totals["timeouts"] += result.timeouts
        totals["retries"] += result.retried
        for name, mean in result.means.items():
            total, count = totals["scores"].get(name, (0.0, 0))
            totals["scores"][name] = (total + mean * result.applicable[name], count + result.applicable[name])
        for i, g in enumerate(groups):
            g.parts.append(take_rows(out, list(range(i * n, (i + 1) * n))))
            g.rewards += result.rewards[i].tolist()
        counts["rollouts_generated"] += len(out.texts)

    def _assemble(self, groups: list[_Group], counts: dict, totals: dict) -> Groups:
        sizes = [len(g.rewards) for g in groups]
        rewards = torch.full((len(groups), max(sizes)), float("nan"))
        for p, g in enumerate(groups):
            rewards[p, : sizes[p]] = torch.tensor(g.rewards)
        rollouts = concat_rollouts([part for g in groups for part in g.parts], self.tokenizer.pad_token_id)
        means = {name: total / max(count, 1) for name, (total, count) in totals["scores"].items()}
        return Groups([g.problem for g in groups], rollouts, rewards, sizes, means, totals["timeouts"], totals["retries"],
                      totals["generation_s"], totals["scoring_s"], counts)


def step_seed(seed: int, step: int, index: int = -1) -> int:
    """A seed for one step (and one prompt of it), stable across runs and processes; any ``seed``
    gives one torch takes (64 bits: the values torch would take as they are, unchanged)."""
    return ((seed * 1_000_003 + step) * 1_000_033 + index + 1) % 2**64
