"""Final answers: extraction from a completion, and equivalence with the gold answer.

Equivalence has two paths. The fast path decides in microseconds when both sides are plain
numbers (``42``, ``-3.5``, ``1,234``, ``3/4``, ``\\frac{3}{4}``, ``$12``, ``45%``, ``12 apples``),
with exact rational arithmetic and math-verify's own rules for the cases where it is lenient:
a side written as a decimal is compared rounded to 6 decimal places (so ``0.333333`` equals
``1/3``), and a percentage equals both its number and its number over 100. Everything else
(LaTeX, expressions, intervals, ...) goes to math-verify (:func:`verify_answer`), which the reward
pool runs in a worker process under a hard time bound. There, unlike math-verify on its own, a
restated computation (``409 + 83`` for ``492``) is not an answer: the result has to be stated.
A gold that is a code of letters and digits (``0xc84``, ``12cd``) is compared whole on both paths
(:func:`is_literal`), never by a number read off its front.
A gold that cannot be an answer (:func:`unusable_gold`: empty, or a number that is not finite,
``nan``, ``inf``, ``1e400``) is matched by nothing; the tasks refuse one when they load.
Before either path, an answer that cannot be a sensible one (:func:`implausible`: a huge factorial
or power, deep brackets, a long run of digits, pages of symbols) is wrong at once: math-verify
would stall on it, costing a worker of the pool its whole time bound and a restart.
"""

from __future__ import annotations

import logging
import math
import re
from fractions import Fraction
from functools import lru_cache
from typing import NamedTuple

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_LINE = re.compile(r"(?:final answer|answer)\s*(?:is)?\s*[:=]?\s*(.+)", re.IGNORECASE)
_PLAIN = re.compile(
    r"""\s*(?P<sign>[-+\u2212])?\s*(?:\\?\$\s*)?(?P<sign2>[-+\u2212])?\s*
    (?:
        (?P<int>\d{1,3}(?:,\d{3})+|\d+)(?:\.(?P<dec>\d*))?      # 1,234.5  1234  5.
      | \.(?P<dec_only>\d+)                                    # .5
      | (?P<num>\d+)\s*/\s*(?P<den>\d+)                        # 3/4
      | \\[dt]?frac\{\s*(?P<lnum>\d+)\s*\}\{\s*(?P<lden>\d+)\s*\}   # \frac{3}{4}
    )
    \s*(?P<pct>\\?%)?
    (?:\s*[A-Za-z]{2,}(?:\s+[A-Za-z]{2,})*)?                   # unit words (not a variable)
    \s*\.?\s*""",
    re.VERBOSE,
)
_WORDS = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")  # a word that is not a LaTeX command
MAX_PLAIN_LENGTH = 64  # longer strings are never plain numbers: math-verify decides
_SIGNIFICANT_FLOAT_DIGITS = 15  # math-verify reads decimals as floats of this precision


class Number(NamedTuple):
    """A plain number as written: its exact value and how it was written."""

    value: Fraction
    decimal: bool  # written with a decimal point (math-verify compares these rounded)
    percent: bool


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


def last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def extract_answer(text: str) -> str | None:
    """The final answer of a completion, by the first marker found in this order:
    ``\\boxed{}``, ``<answer>...</answer>``, GSM8K's ``#### N``, an ``Answer:`` line, else the last
    number. Returns ``None`` when the completion holds no answer at all."""
    marked = marked_answer(text)
    return marked if marked is not None else last_number(text)


def marked_answer(text: str) -> str | None:
    """The answer a completion marks as final (:func:`extract_answer` without its last-number
    fallback); ``None`` when no marker is found."""
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
    return None


@lru_cache(maxsize=4096)
def as_number(text: str) -> Number | None:
    """``text`` as a plain number, or None when it is anything else (or too long to be one)."""
    if len(text) > MAX_PLAIN_LENGTH or not (m := _PLAIN.fullmatch(text)):
        return None
    g = m.groupdict()
    if g["num"] or g["lnum"]:
        num, den = int(g["num"] or g["lnum"]), int(g["den"] or g["lden"])
        if den == 0:
            return None
        value, decimal = Fraction(num, den), False
    else:
        digits = (g["int"] or "0").replace(",", "")
        fraction = g["dec"] if g["int"] else g["dec_only"]
        decimal = bool(fraction)
        if decimal and len((digits + fraction).lstrip("0")) > _SIGNIFICANT_FLOAT_DIGITS:
            return None  # math-verify's float would round it: leave the verdict to math-verify
        value = Fraction(int(digits + (fraction or "")), 10 ** len(fraction or ""))
    negative = (g["sign"] in ("-", "\u2212")) != (g["sign2"] in ("-", "\u2212"))
    if g["pct"] and (negative or not g["int"] or "," in g["int"]):
        return None  # -5%, 3/4%, 1,234%: math-verify reads these its own way; let it decide
    return Number(-value if negative else value, decimal, bool(g["pct"]))


def numbers_equal(gold: Number, pred: Number) -> bool:
    """Equality of two plain numbers as math-verify decides it, computed exactly: the values
    (a percentage divided by 100) are equal; or both are integers, a percentage sign aside
    (``9% = 9``); or a side is a decimal, neither is a bare integer, and they agree to 6 places."""
    a = gold.value / 100 if gold.percent else gold.value
    b = pred.value / 100 if pred.percent else pred.value
    if a == b:
        return True
    integer = lambda x: not x.decimal and x.value.denominator == 1
    if integer(gold) and integer(pred):
        return gold.value == pred.value
    bare_integer = lambda x: integer(x) and not x.percent
    if (gold.decimal or pred.decimal) and not (bare_integer(gold) or bare_integer(pred)):
        return round(a, 6) == round(b, 6)
    return False


def gold_answer(gold: str) -> str | None:
    """The gold answer as compared: a GSM8K ``#### N`` or ``\\boxed{}`` gold is extracted first."""
    return extract_answer(gold) if "####" in gold or "\\boxed" in gold else gold


def unusable_gold(gold: str) -> str | None:
    """Why ``gold`` cannot be a gold answer, or None where it can: it is empty (GSM8K's ``#### ``
    with nothing after it), or it reads as a number that is not finite (``nan``, ``inf``, ``1e400``),
    which a policy could be paid for writing."""
    gold = gold_answer(gold)
    if gold is None or not gold.strip():
        return "it is empty"
    try:
        value = float(gold.strip().replace(",", ""))
    except ValueError:
        return None
    return None if math.isfinite(value) else "it is not a finite number"


_TOKEN = re.compile(r"[+-]?[A-Za-z0-9]+")
_NUMBER_TIMES_VARIABLE = re.compile(r"[+-]?\d*[A-Za-z]")  # 3x, 2k, x: algebra
_WRAPPER = re.compile(r"\\(?:text|mathrm|texttt)\{(.*)\}")


def is_literal(gold: str) -> bool:
    """Whether ``gold`` is one token of letters and digits that is neither a number nor a number
    times a variable (``0xc84``, ``0b111``, ``12cd``, ``A3F``): a code, which is compared whole
    (:func:`literal_equal`). math-verify would read it as a product (``0xc84`` as 0) or drop its
    letters as a unit (``12ab`` as 12), and the fast path would read the number off its front."""
    gold = gold.strip()
    return (bool(_TOKEN.fullmatch(gold)) and any(ch.isdigit() for ch in gold) and any(ch.isalpha() for ch in gold)
            and not _NUMBER_TIMES_VARIABLE.fullmatch(gold))


def literal_equal(gold: str, answer: str) -> bool:
    """A code answer equals the gold as written (white space, ``$``, a final period and a ``\\text{}``
    aside); integers written with a base prefix (``0x``, ``0b``, ``0o``) are compared by value."""
    answer = re.sub(r"\s+", "", answer).strip("$").rstrip(".")
    answer = m.group(1) if (m := _WRAPPER.fullmatch(answer)) else answer
    gold = gold.strip()
    if answer == gold:
        return True
    try:
        return int(answer, 0) == int(gold, 0)
    except ValueError:
        return False


def fast_match(completion: str, gold: str) -> bool | None:
    """True/False when decided without math-verify; None when math-verify must decide."""
    if unusable_gold(gold):
        return False
    answer = extract_answer(completion)
    gold = gold_answer(gold)
    if answer is None:
        return False
    if answer.strip() == gold.strip():
        return True
    if is_literal(gold):
        return literal_equal(gold, answer)
    if implausible(answer, gold):
        return False
    g, p = as_number(gold), as_number(answer)
    if g is None:
        return None
    if p is None:  # "46. I hope it is correct": math-verify's verdict is True if its last number is the gold
        last = as_number(number) if (number := _compared_last_number(answer)) is not None else None
        return True if last is not None and numbers_equal(g, last) else None
    # math-verify also compares the answer's last number, which drops a percentage sign
    return numbers_equal(g, p) or (p.percent and numbers_equal(g, p._replace(percent=False)))


# --------------------------------------------------------------------------- implausible answers

_LATEX_LAYOUT = re.compile(r"\\left|\\right|\\!|[{}\s]")  # sizing, thin spaces, grouping, white space
_DIGITS = re.compile(r"\d+")
_BRACKETS = re.compile(r"[()\[\]{}]")
_TEXT = re.compile(r"[^\W\d_]+|\s+")  # letters (any script) and white space
_FACTORIAL = re.compile(r"(\d+)!(?!=)")  # n! (not n != ...)
_FACTORIAL_OF_FACTORIAL = re.compile(r"[\d)]!\)*!(?!=)")  # (10!)!, 20!! (not "Yes!!")
_POWER_OF_POWER = re.compile(r"[\d)]\^\(?\d+(?:\.\d+)?\)?\^")  # a^b^c of numbers, b a number: 10^{10^{10}}
_HUGE_EXPONENT = re.compile(r"\^\(?\d{7,}")  # 10^{10000000}


def _flat(text: str) -> str:
    """``text`` without LaTeX layout (braces, ``\\left``, thin spaces) or white space, ``**`` as ``^``:
    ``10^{10^{10}}`` reads ``10^10^10``."""
    return _LATEX_LAYOUT.sub("", text).replace("**", "^")


def _longest_digit_run(text: str) -> int:
    return max(map(len, _DIGITS.findall(text)), default=0)


def _bracket_depth(text: str) -> int:
    depth = deepest = 0
    for bracket in _BRACKETS.findall(text):
        depth = depth + 1 if bracket in "([{" else max(depth - 1, 0)
        deepest = max(deepest, depth)
    return deepest


def _symbol_count(text: str) -> int:
    """Characters that are neither letters nor white space: the size of the mathematics in it."""
    return len(_TEXT.sub("", text))


def _factorial_digits(text: str) -> float:
    """Digits of the largest number a factorial is taken of; a factorial of a factorial: inf."""
    flat = _flat(text)
    if _FACTORIAL_OF_FACTORIAL.search(flat):
        return math.inf
    return max(map(len, _FACTORIAL.findall(flat)), default=0)


def _huge_powers(text: str) -> int:
    """Powers of numbers too large to compute: a power tower, or an exponent of 7 digits or more."""
    flat = _flat(text)
    return len(_POWER_OF_POWER.findall(flat)) + len(_HUGE_EXPONENT.findall(flat))


# (name, measure, the most a sensible final answer has). The 9,292 gold answers of GSM8K (train and
# test) and MATH-500 reach 25 symbols, a run of 9 digits and bracket depth 2, with no factorial or
# huge power: the limits leave a wide margin.
_SENSIBLE = (
    ("symbols", _symbol_count, 500),
    ("digit run", _longest_digit_run, 30),
    ("bracket depth", _bracket_depth, 8),
    ("factorial", _factorial_digits, 5),
    ("huge power", _huge_powers, 0),
)


def implausible(answer: str, gold: str) -> str | None:
    """The first measure by which ``answer`` cannot be a sensible final answer, else None: over
    500 symbols (characters other than letters and spaces), a run of over 30 digits, brackets
    nested over 8 deep, a factorial of a number of 6 digits or more (or of a factorial), a power
    tower of numbers or an exponent of 7 digits or more. Never by a measure on which the gold
    itself goes as far, so that no answer is rejected for looking like its gold. A few regular
    expressions: microseconds, where math-verify can stall for the whole time bound."""
    for name, measure, most in _SENSIBLE:
        value = measure(answer)
        if value > most and value > measure(gold):
            return name
    return None


# --------------------------------------------------------------------------- math-verify


@lru_cache(maxsize=1)
def _extraction():
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled": the pool bounds it
    return [LatexExtractionConfig(), ExprExtractionConfig()]


@lru_cache(maxsize=1024)
def _parse(expression: str) -> list:
    """math-verify's parse of one expression (the gold is parsed once per process, not per
    completion). Its own SIGALRM timeout is off: the reward pool bounds the whole call."""
    from math_verify import parse

    return parse(f"${expression}$", _extraction(), parsing_timeout=None)


def unevaluated_arithmetic(expr) -> bool:
    """Whether an item of math-verify's parse still holds arithmetic on plain numbers (``409 + 83``,
    ``3 \\times 4``, ``1.5 + 2``): a restatement of a computation, not its result (the parse's
    strings never are). math-verify evaluates such an answer and would count ``409 + 83`` equal to
    ``492``, which pays a policy for copying an arithmetic question; :func:`verify_answer` does not
    count it as a final answer. Of an equation only the right-hand side (the stated result) is
    looked at; ``-x`` (``Mul(-1, x)``) is a number."""
    from sympy import Add, Basic, Mul, Number, preorder_traversal
    from sympy.core.relational import Relational

    if not isinstance(expr, Basic):
        return False
    if isinstance(expr, Relational):
        expr = expr.rhs
    for node in preorder_traversal(expr):
        if isinstance(node, (Add, Mul)) and all(isinstance(a, Number) for a in node.args):
            negation = isinstance(node, Mul) and len(node.args) == 2 and -1 in node.args
            if not negation:
                return True
    return False


def _verified(gold: str, answer: str) -> bool:
    from math_verify import verify

    plain = lambda s: s.replace(" ", "").replace(",", "").strip("$.")
    if plain(gold) == plain(answer):
        return True
    g, p = _parse(gold), _parse(answer)
    if not any(map(unevaluated_arithmetic, g)):  # a gold "2 + 3" keeps math-verify's rule
        p = [x for x in p if not unevaluated_arithmetic(x)]
    if not p and (number := last_number(answer)) is not None:  # "Answer: 42 apples"
        p = _parse(number)
    return bool(g and p and verify(g, p, timeout_seconds=None))


def verify_answer(completion: str, gold: str) -> bool:
    """Whether the final answer of ``completion`` equals ``gold``, by math-verify (slow; unbounded:
    call it through the reward pool). An answer with words or a percentage sign ("42 apples",
    "60.0%") is also compared by its last number."""
    if unusable_gold(gold):
        return False
    answer = extract_answer(completion)
    gold = gold_answer(gold)
    if answer is None or implausible(answer, gold):
        return False
    if is_literal(gold):
        return literal_equal(gold, answer)
    if _verified(gold, answer):
        return True
    number = _compared_last_number(answer)
    return number is not None and _verified(gold, number)


def _compared_last_number(answer: str) -> str | None:
    """The last number of an answer with words or a percentage sign ("42 apples", "60.0%"), which
    is also compared with the gold (by verify_answer, and by fast_match where it equals it)."""
    return last_number(answer) if _WORDS.search(answer) or "%" in answer else None
