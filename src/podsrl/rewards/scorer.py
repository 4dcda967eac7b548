"""Scoring a step's rollouts while they are generated: the ``[P, n]`` reward matrix.

A :class:`Scorer` holds the reward functions of a run. Each step, :meth:`Scorer.start` opens a
:class:`StepScores`; the rollout engine hands it each batch of finished groups (``add``), which
decides what it can in-process at once (the built-ins' fast paths) and sends the rest to the
reward pool, so that math-verify and users' functions run in worker processes while later
batches are still being generated. ``result`` then waits for what is left.

Every completion's evaluation by a reward function is bounded by ``timeout`` seconds of its
worker's CPU time and ``wall_timeout`` seconds of wall time (see :mod:`podsrl.rewards.pool`);
past either (or if its worker dies) it is scored once more, and past them again it scores 0 and
counts in ``timeouts``. A users' function is called once per completion there (its lists hold one
element); an ``async def`` function is called once per completion too, all of a group's calls
awaited concurrently, each bounded by the wall time. With ``workers=0`` everything runs in the
training process instead, unbounded, each function called once per batch.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from typing import NamedTuple

import torch

from podsrl.errors import PodsError, first_line
from podsrl.rewards import RewardFn
from podsrl.rewards import pool as reward_pool
from podsrl.rollout import cut_short


class StepResult(NamedTuple):
    rewards: torch.Tensor  # [P, n] weighted sum of every reward function
    means: dict[str, float]  # each function's mean over the completions it applies to
    applicable: dict[str, int]  # how many completions each function applies to (not None)
    timeouts: int  # evaluations past a bound (or whose worker died) twice: scored 0
    retried: int  # evaluations scored a second time after the first ran past a bound
    seconds: float  # scoring time not hidden behind generation


class Scorer:
    def __init__(self, fns: dict[str, RewardFn], weights: list[float], workers: int | None = None,
                 timeout: float = reward_pool.DEFAULT_TIMEOUT_S, memory_mb: int = 0,
                 wall_timeout: float = reward_pool.DEFAULT_WALL_TIMEOUT_S):
        self.fns, self.weights = fns, weights
        self.in_process = workers == 0
        if not self.in_process:
            reward_pool.configure(workers, timeout, memory_mb, wall_timeout)

    @classmethod
    def from_config(cls, c, fns: dict[str, RewardFn] | None = None) -> Scorer:
        """The scorer of a run config's rewards (``fns``: already loaded by name), its workers not
        yet forked: call :meth:`start_workers` before loading a model."""
        from podsrl.rewards import load_reward

        fns = fns or {name: load_reward(name) for name in c.rewards}
        return cls(fns, c.reward_weights, c.reward_workers, c.reward_timeout_s, c.reward_memory_mb,
                   c.reward_wall_timeout_s)

    def start(self, columns: dict[str, list], n: int, max_new_tokens: int | None = None, eos_ids=()) -> StepScores:
        """``columns``: one value per prompt (``prompts``, ``answer``, ...), repeated n times.
        With ``max_new_tokens``, each completion also gets the column ``truncated``: whether it was
        cut at that length (:func:`podsrl.rollout.cut_short`, with the engine's ``eos_ids``)."""
        return StepScores(self, columns, n, max_new_tokens, eos_ids)

    def start_workers(self) -> None:
        """Fork the reward workers now, before the caller loads its model (:meth:`RewardPool.start`)."""
        if not self.in_process:
            reward_pool.get_pool().start()

    def close(self) -> None:
        if not self.in_process:
            reward_pool.shutdown()


class StepScores:
    """The scores of one step's ``P * n`` completions, filled in as groups are generated."""

    def __init__(self, scorer: Scorer, columns: dict[str, list], n: int, max_new_tokens: int | None = None, eos_ids=()):
        self.scorer, self.columns, self.n = scorer, columns, n
        self.max_new_tokens, self.eos_ids = max_new_tokens, eos_ids
        rows = len(next(iter(columns.values()))) * n
        self.values = {name: [None] * rows for name in scorer.fns}  # final values
        self.pending: list[tuple[str, list[int], str, object]] = []  # (function, rows, kind, future)
        self.timeouts = self.retried = 0
        self.inline_s = 0.0

    def row_columns(self, row: int, completion_ids: list[int]) -> dict:
        columns = {**{k: v[row // self.n] for k, v in self.columns.items()}, "completion_ids": completion_ids}
        if self.max_new_tokens is not None:
            columns["truncated"] = cut_short(completion_ids, self.max_new_tokens, self.eos_ids)
        return columns

    def add(self, first_prompt: int, texts: list[str], completion_ids: list[list[int]]) -> None:
        """Score the completions of prompts ``first_prompt ...`` (``n`` each, in order)."""
        if not texts:
            return
        start = time.perf_counter()
        first = first_prompt * self.n
        rows = list(range(first, first + len(texts)))
        columns = [self.row_columns(r, ids) for r, ids in zip(rows, completion_ids)]
        for name, fn in self.scorer.fns.items():
            if self.scorer.in_process:
                self._in_process(name, fn, rows, texts, columns)
            elif (spec := getattr(fn, "per_completion", None)) is not None:
                for r, text, cols in zip(rows, texts, columns):
                    args = [cols.get(k) for k in spec.columns]  # a column the step lacks: None
                    value = spec.fast(text, *args)
                    if value is None:
                        self._submit(name, [r], "value", spec.slow, text, *args)
                    else:
                        self.values[name][r] = value
            elif inspect.iscoroutinefunction(fn):
                pool = reward_pool.get_pool()
                for g in range(0, len(texts), self.n):  # one task per group, its calls concurrent
                    group = slice(g, g + self.n)
                    self._submit(name, rows[group], "group", _call_async, fn, texts[group], columns[group],
                                 pool.wall_timeout, timeout=self.n * pool.timeout, wall_timeout=pool.wall_timeout + 1)
            else:
                for r, text, cols in zip(rows, texts, columns):
                    self._submit(name, [r], "call", _call_one, fn, text, cols)
        self.inline_s += time.perf_counter() - start

    def _submit(self, name: str, rows: list[int], kind: str, fn, *args, timeout: float | None = None,
                wall_timeout: float | None = None) -> None:
        """Schedule ``fn(*args)`` for ``rows``. It returns, by ``kind``: ``value``, the one row's
        value; ``call``, what the user's function returned for the one row (a list of one, to be
        checked); ``group``, a list of those, one per row."""
        future = reward_pool.get_pool().submit(fn, *args, timeout=timeout, wall_timeout=wall_timeout)
        self.pending.append((name, rows, kind, future))

    def _in_process(self, name: str, fn: RewardFn, rows: list[int], texts: list[str], columns: list[dict]) -> None:
        batch = {k: [c[k] for c in columns] for k in columns[0]}
        values = _checked(name, _call(name, fn, texts, batch), len(texts))
        for r, v in zip(rows, values):
            self.values[name][r] = v

    def result(self) -> StepResult:
        """Wait for what is still being scored (a task past a bound runs once more); the
        weighted ``[P, n]`` rewards."""
        start = time.perf_counter()
        pool = reward_pool.get_pool() if self.pending else None
        again = []
        for name, rows, kind, future in self.pending:
            outcome = self._outcome(pool, name, future)
            if outcome is reward_pool.TIMED_OUT:
                again.append((name, rows, kind, pool.again(future)))
                self.retried += len(rows)
            else:
                self._store(name, rows, kind, outcome)
        for name, rows, kind, future in again:
            self._store(name, rows, kind, self._outcome(pool, name, future))
        self.pending = []
        total = [0.0] * len(next(iter(self.values.values())))
        means, counts = {}, {}
        for (name, values), w in zip(self.values.items(), self.scorer.weights):
            values = _checked(name, values, len(total))
            applicable = [v for v in values if v is not None]
            means[name], counts[name] = sum(applicable) / max(len(applicable), 1), len(applicable)
            total = [t + w * (v or 0.0) for t, v in zip(total, values)]
        if not all(abs(t) <= FLOAT32_MAX for t in total):
            raise PodsError(f"a weighted sum of rewards is {max(total, key=abs):g}, beyond what rewards hold "
                            f"(float32, |r| <= {FLOAT32_MAX:.3g}); scale the rewards or their weights down")
        rewards = torch.tensor(total, dtype=torch.float32).view(-1, self.n)
        return StepResult(rewards, means, counts, self.timeouts, self.retried, self.inline_s + time.perf_counter() - start)

    def _outcome(self, pool, name: str, future):
        """A pending task's outcome (TIMED_OUT included); what the reward raised, as one line."""
        try:
            return pool.outcome(future, wait_s=reward_pool.safety_wait(pool, len(self.pending)))
        except reward_pool.RewardFailure as e:  # the user's function raised: name it
            self._cancel()
            raise PodsError(f"reward {name!r} raised {e.kind}: {e.message}") from None
        except Exception as e:  # noqa: BLE001 (its value could not come back: unpicklable, say)
            self._cancel()
            raise PodsError(f"reward {name!r} failed: {type(e).__name__}: {first_line(e)}") from None

    def _store(self, name: str, rows: list[int], kind: str, outcome) -> None:
        """The values of ``rows`` from their task's outcome; a timed-out evaluation scores 0."""
        if outcome is reward_pool.TIMED_OUT:
            outcome = [_TIMED_OUT_MARK] * len(rows)
        elif kind != "group":
            outcome = [outcome]
        for r, v in zip(rows, outcome):
            if isinstance(v, str) and v == _TIMED_OUT_MARK:
                self.timeouts += 1
                v = 0.0
            elif kind != "value":
                v = _checked(name, v, 1)[0]
            self.values[name][r] = v

    def _cancel(self) -> None:
        for *_, future in self.pending:
            future.cancel()
        self.pending = []


FLOAT32_MAX = float(torch.finfo(torch.float32).max)
"""The largest reward: the reward matrix is float32."""
_TIMED_OUT_MARK = "timed out"  # a timed-out evaluation inside a group's result (it travels pickled)


def _call(name: str, fn: RewardFn, completions: list[str], columns: dict):
    try:
        values = fn(completions=completions, **columns)
        return asyncio.run(values) if inspect.isawaitable(values) else values
    except (PodsError, KeyboardInterrupt):
        raise
    except BaseException as e:  # noqa: BLE001 (SystemExit too: a reward does not end the run)
        raise PodsError(f"reward {name!r} raised {type(e).__name__}: {first_line(e)}") from None


def _call_one(fn: RewardFn, completion: str, columns: dict):
    """In a worker: ``fn`` on one completion (TRL's convention, lists of one); its return value."""
    return fn(completions=[completion], **{k: [v] for k, v in columns.items()})


def _call_async(fn: RewardFn, completions: list[str], columns: list[dict], timeout: float) -> list:
    """In a worker: an ``async def`` reward on each completion of a group, concurrently, each
    call bounded by ``timeout`` (a call that overruns gives the timed-out mark)."""

    async def one(completion: str, cols: dict):
        try:
            return await asyncio.wait_for(fn(completions=[completion], **{k: [v] for k, v in cols.items()}), timeout)
        except asyncio.TimeoutError:
            return _TIMED_OUT_MARK

    async def group():
        return await asyncio.gather(*(one(c, cols) for c, cols in zip(completions, columns)))

    return list(asyncio.run(group()))


def _checked(name: str, values, expected: int) -> list[float | None]:
    """The values of one reward function, checked: a list of ``expected`` numbers or None."""
    if hasattr(values, "tolist"):  # a numpy array or a torch tensor
        values = values.tolist()
    if not isinstance(values, (list, tuple)):
        raise PodsError(f"reward {name!r} must return a list, got {type(values).__name__}")
    if len(values) != expected:
        raise PodsError(f"reward {name!r} returned {len(values)} values for {expected} completions")
    out = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        if isinstance(v, (str, bytes)) or not hasattr(v, "__float__"):
            raise PodsError(f"reward {name!r} returned a non-numeric value {v!r:.60}")
        v = float(v)
        if not math.isfinite(v):
            raise PodsError(f"reward {name!r} returned NaN or inf")
        if abs(v) > FLOAT32_MAX:
            raise PodsError(f"reward {name!r} returned {v:g}, beyond what rewards hold (float32, |r| <= {FLOAT32_MAX:.3g})")
        out.append(v)
    return out

