"""Verifiable rewards.

Reward functions follow TRL's convention: ``fn(completions: list[str], **columns) -> list[float |
None]``, where ``columns`` are the example's fields repeated per completion (``answer=``,
``prompts=``, ...) and ``None`` means "not applicable to this sample". Built-ins are registered in
:data:`REWARDS`; a user's own function is named by import path ``module:function``.

The built-ins are fast and bounded when called directly (for example by ``trl.GRPOTrainer``):
each declares how to score one completion (:class:`PerCompletion`), in-process where that is cheap
and in the reward pool (:mod:`podsrl.rewards.pool`) where it is not. The trainer scores through
:class:`podsrl.rewards.scorer.Scorer`, which does the same group by group while generation runs.
"""

from __future__ import annotations

import importlib
import re
from typing import Callable, NamedTuple

from podsrl.errors import PodsError, first_line
from podsrl.rewards.answers import _NUMBER, extract_answer, fast_match, verify_answer  # noqa: F401 (extract_answer: API)
from podsrl.rewards.pool import TIMED_OUT, bounded_map

RewardFn = Callable[..., list]
REWARDS: dict[str, RewardFn] = {}


class PerCompletion(NamedTuple):
    """How a built-in reward scores one completion: ``fast(completion, *columns)`` in-process,
    returning None where it cannot decide cheaply; then ``slow(completion, *columns)`` (a module-
    level function) in a worker of the reward pool, under its time bound (0 past it)."""

    fast: Callable[..., float | None]
    slow: Callable[..., float] | None = None
    columns: tuple[str, ...] = ()


def per_completion(spec: PerCompletion) -> Callable[[RewardFn], RewardFn]:
    """Attach ``spec`` to a reward function (the scorer reads it as ``fn.per_completion``)."""

    def attach(fn: RewardFn) -> RewardFn:
        fn.per_completion = spec
        return fn

    return attach


def completion_text(completion) -> str:
    """A completion's text: as given, or the contents of a conversational completion's messages
    (TRL passes ``[{"role": "assistant", "content": ...}]`` for chat data sets)."""
    if isinstance(completion, str):
        return completion
    return "".join(m["content"] if isinstance(m.get("content"), str) else "" for m in completion)


def score_per_completion(spec: PerCompletion, completions: list, **columns) -> list[float]:
    """``spec`` over a batch: the fast part here, the undecided rest on the pool."""
    completions = [completion_text(c) for c in completions]
    given = {k: columns.get(k) or [None] * len(completions) for k in spec.columns}  # a column not given: None
    rows = [tuple(given[k][i] for k in spec.columns) for i in range(len(completions))]
    values = [spec.fast(c, *row) for c, row in zip(completions, rows)]
    pending = [i for i, v in enumerate(values) if v is None]
    slow = bounded_map(spec.slow, [(completions[i], *rows[i]) for i in pending])
    for i, v in zip(pending, slow):
        values[i] = 0.0 if v is TIMED_OUT else v
    return values


def bounded(lowest: float, highest: float) -> Callable[[RewardFn], RewardFn]:
    """Declare the range a reward function's values lie in (as ``fn.bounds``). adaptive_n needs
    it to know when more rollouts cannot change a group's selection; a user's function declares
    it the same way (``my_reward.bounds = (0.0, 1.0)``). A value None (not applicable) counts as 0."""

    def declare(fn: RewardFn) -> RewardFn:
        fn.bounds = (float(lowest), float(highest))
        return fn

    return declare


def reward_bounds(fns: dict[str, RewardFn], weights: list[float]) -> tuple[float, float] | None:
    """The range of the weighted sum of ``fns``' rewards, from each one's declared bounds; None
    if one declares none."""
    if any(getattr(fn, "bounds", None) is None for fn in fns.values()):
        return None
    lowest = sum(min(w * fn.bounds[0], w * fn.bounds[1]) for fn, w in zip(fns.values(), weights))
    highest = sum(max(w * fn.bounds[0], w * fn.bounds[1]) for fn, w in zip(fns.values(), weights))
    return lowest, highest


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    def add(fn: RewardFn) -> RewardFn:
        REWARDS[name] = fn
        return fn

    return add


def _context(question, prompt) -> str | None:
    """What the completion answers, for the copy check: the question, else the prompt's text."""
    return question if question else (completion_text(prompt) if prompt else None)


def _accuracy_fast(completion: str, gold: str, entry: dict | None = None, require_marker: bool | None = None,
                   question: str | None = None, prompt=None, truncated: bool | None = None) -> float | None:
    if entry is not None:  # a reasoning-gym problem: its verifier decides, in the pool
        from podsrl.tasks import gym

        return None if gym.answer_of(completion, gold) is not None else 0.0
    decided = fast_match(completion, gold, bool(require_marker), _context(question, prompt), bool(truncated))
    return None if decided is None else float(decided)


def _accuracy_slow(completion: str, gold: str, entry: dict | None = None, require_marker: bool | None = None,
                   question: str | None = None, prompt=None, truncated: bool | None = None):
    if entry is not None:
        from podsrl.tasks import gym

        return gym.score(completion, gold, entry)
    return float(verify_answer(completion, gold, bool(require_marker), _context(question, prompt), bool(truncated)))


@register_reward("accuracy")
@bounded(0.0, 1.0)
@per_completion(PerCompletion(_accuracy_fast, _accuracy_slow,
                              ("answer", "entry", "require_marker", "question", "prompts", "truncated")))
def accuracy_reward(completions: list[str], answer: list[str], entry: list[dict | None] | None = None,
                    require_marker: list[bool] | None = None, question: list[str] | None = None,
                    prompts: list | None = None, truncated: list[bool] | None = None, **_) -> list[float]:
    """1.0 when the completion's final answer equals the gold ``answer``, else 0.0
    (:mod:`podsrl.rewards.answers`: the whole marked answer is compared, never a number cut out of
    it). Plain numbers are compared here; anything else goes to math-verify in the reward pool,
    where a completion whose grade passes the pool's bounds twice (``reward_timeout_s`` of CPU
    time, ``reward_wall_timeout_s`` of wall time) scores 0. A true ``require_marker`` (a column, as
    ``task.require_marker`` sets it) pays only a marked answer, never an unmarked last number;
    an unmarked last number copied, with the words before it, from the ``question`` (a column, as
    the trainer passes it; else the prompt, as TRL passes ``prompts``) is no answer. A true
    ``truncated`` (a column the trainer and ``PODSTrainer`` pass: the completion was cut at the
    length limit) pays only a marked answer that ends before the cut. The question also says
    whether answers are in percent (:func:`podsrl.rewards.answers.in_units`). What counts as
    the final answer is :func:`podsrl.rewards.answers.read`.

    A problem of a reasoning-gym task carries its ``entry`` (:mod:`podsrl.tasks.gym`): its data
    set's own verifier scores the whole answer, in the pool, partial credit kept (a value in [0,
    1]) except where the gold is a number and the answer another, or the answer holds the gold
    inside longer text (:func:`podsrl.tasks.gym.score`)."""
    return score_per_completion(accuracy_reward.per_completion, completions, answer=answer, entry=entry,
                                require_marker=require_marker, question=question, prompts=prompts, truncated=truncated)


def answer_matches(completion: str, gold: str, require_marker: bool = False) -> bool:
    """Whether the final answer of ``completion`` equals ``gold`` mathematically (bounded)."""
    return accuracy_reward([completion], [gold], require_marker=[require_marker])[0] == 1.0


_THINK_ANSWER = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)


@register_reward("format")
@bounded(0.0, 1.0)
@per_completion(PerCompletion(lambda c: float(bool(_THINK_ANSWER.match(c)))))
def format_reward(completions: list[str], **_) -> list[float]:
    """1.0 for ``<think>...</think><answer>...</answer>`` (the paper's format), else 0.0."""
    return score_per_completion(format_reward.per_completion, completions)


@register_reward("number_only")
@bounded(0.0, 1.0)
@per_completion(PerCompletion(lambda c: float(bool(_NUMBER.fullmatch(c.strip().rstrip("."))))))
def number_only_reward(completions: list[str], **_) -> list[float]:
    """1.0 when the completion is a single number and nothing else, else 0.0."""
    return score_per_completion(number_only_reward.per_completion, completions)


def load_reward(name: str) -> RewardFn:
    """A registered reward by name, or a user's function by import path ``module:function``."""
    if name in REWARDS:
        return REWARDS[name]
    if ":" not in name:
        raise PodsError(f"unknown reward {name!r}; known: {', '.join(sorted(REWARDS))}, or module:function")
    module_name, _, attr = name.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise PodsError(f"cannot import reward function {name!r}: {e}") from None
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 (a module that raises or calls sys.exit while imported; an empty name)
        raise PodsError(f"cannot import reward function {name!r}: {type(e).__name__}: {first_line(e)}") from None
    if not callable(fn):
        raise PodsError(f"reward {name!r} is not callable")
    return fn
