"""Verifiable rewards.

Reward functions follow TRL's convention: ``fn(completions: list[str], **columns) -> list[float |
None]``, where ``columns`` are the example's fields repeated per completion (``answer=``,
``prompts=``, ...) and ``None`` means "not applicable to this sample". Built-ins are registered in
:data:`REWARDS`; a user's own function is named by import path ``module:function``.
"""

from __future__ import annotations

import importlib
import math
import re
from typing import Callable

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from podsrl.errors import PodsError

RewardFn = Callable[..., list]
REWARDS: dict[str, RewardFn] = {}

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_LINE = re.compile(r"(?:final answer|answer)\s*(?:is)?\s*[:=]?\s*(.+)", re.IGNORECASE)
_EXTRACTION = [LatexExtractionConfig(), ExprExtractionConfig()]


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces allowed)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def _last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def extract_answer(text: str) -> str | None:
    """The final answer of a completion, by the first marker found in this order:
    ``\\boxed{}``, ``<answer>...</answer>``, GSM8K's ``#### N``, an ``Answer:`` line, else the last
    number. Returns ``None`` when the completion holds no answer at all."""
    if (boxed := _last_boxed(text)) is not None:
        return boxed.strip()
    if tags := _ANSWER_TAG.findall(text):
        inner = tags[-1].strip()
        return _last_boxed(inner) or inner
    if "####" in text:
        return text.rsplit("####", 1)[1].strip().split("\n")[0].replace(",", "").strip()
    if lines := _ANSWER_LINE.findall(text):
        line = lines[-1].strip().rstrip(".")
        return _last_boxed(line) or (line.strip("$ ") if not _NUMBER.fullmatch(line) else line.replace(",", ""))
    return _last_number(text)


def _plain(s: str) -> str:
    return s.replace(" ", "").replace(",", "").strip("$.")


def _same(a: str, b: str) -> bool:
    """Mathematical equivalence by math-verify, with a cheap exact check first."""
    if _plain(a) == _plain(b):
        return True
    gold, pred = parse(f"${a}$", _EXTRACTION), parse(f"${b}$", _EXTRACTION)
    if not pred:  # an answer line such as "Answer: 42 apples": fall back to its last number
        number = _last_number(b)
        pred = parse(f"${number}$", _EXTRACTION) if number else []
    return bool(gold and pred and verify(gold, pred))


def answer_matches(completion: str, gold: str) -> bool:
    """Whether the final answer of ``completion`` equals ``gold`` mathematically."""
    answer = extract_answer(completion)
    if answer is None:
        return False
    gold = extract_answer(gold) if "####" in gold or "\\boxed" in gold else gold
    if gold is None:
        return False
    if _same(gold, answer):
        return True
    number = _last_number(answer)  # "Answer: 42 apples"
    return number is not None and number != answer and _same(gold, number)


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    def add(fn: RewardFn) -> RewardFn:
        REWARDS[name] = fn
        return fn

    return add


@register_reward("accuracy")
def accuracy_reward(completions: list[str], answer: list[str], **_) -> list[float]:
    """1.0 when the completion's final answer equals the gold ``answer``, else 0.0."""
    return [float(answer_matches(c, a)) for c, a in zip(completions, answer)]


_THINK_ANSWER = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)


@register_reward("format")
def format_reward(completions: list[str], **_) -> list[float]:
    """1.0 for ``<think>...</think><answer>...</answer>`` (the paper's format), else 0.0."""
    return [float(bool(_THINK_ANSWER.match(c))) for c in completions]


@register_reward("number_only")
def number_only_reward(completions: list[str], **_) -> list[float]:
    """1.0 when the completion is a single number and nothing else, else 0.0."""
    return [float(bool(_NUMBER.fullmatch(c.strip().rstrip(".")))) for c in completions]


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
    if not callable(fn):
        raise PodsError(f"reward {name!r} is not callable")
    return fn


def score(
    fns: dict[str, RewardFn], weights: list[float], completions: list[str], **columns
) -> tuple[list[float], dict[str, float]]:
    """Weighted sum of every reward function per completion, and each function's mean.

    ``None`` (not applicable) counts as 0 in the sum, as in TRL; a function that raises, or
    returns anything but a list of numbers (or ``None``) with one per completion, or a NaN or inf,
    is an error naming the function.
    """
    total = [0.0] * len(completions)
    means: dict[str, float] = {}
    for (name, fn), w in zip(fns.items(), weights):
        values = _call_reward(name, fn, completions, columns)
        applicable = [v for v in values if v is not None]
        means[name] = sum(applicable) / max(len(applicable), 1)
        total = [t + w * (0.0 if v is None else v) for t, v in zip(total, values)]
    return total, means


def _call_reward(name: str, fn: RewardFn, completions: list[str], columns: dict) -> list[float | None]:
    """``fn``'s values as floats (``None`` kept), or a PodsError saying what it did wrong."""
    try:
        values = fn(completions=completions, **columns)
    except Exception as e:  # noqa: BLE001 (the user's code may raise anything)
        detail = (str(e).strip().splitlines() or [""])[0]
        raise PodsError(f"reward {name!r} raised {type(e).__name__}" + (f": {detail}" if detail else "")) from None
    if hasattr(values, "tolist"):  # a numpy array or a torch tensor
        values = values.tolist()
    if not isinstance(values, (list, tuple)):
        raise PodsError(f"reward {name!r} must return a list, got {type(values).__name__}")
    if len(values) != len(completions):
        raise PodsError(f"reward {name!r} returned {len(values)} values for {len(completions)} completions")
    floats = [_as_float(name, v) for v in values]
    if any(v is not None and not math.isfinite(v) for v in floats):
        raise PodsError(f"reward {name!r} returned NaN or inf")
    return floats


def _as_float(name: str, v) -> float | None:
    if v is None:
        return None
    if not isinstance(v, (str, bytes)):  # "0.5" is not a reward
        try:
            return float(v)
        except (TypeError, ValueError):
            pass
    raise PodsError(f"reward {name!r} returned a non-numeric value {v!r:.60}")
