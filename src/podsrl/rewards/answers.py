"""Final answers: extraction from a completion, and equivalence with the gold answer.

**What is compared.** A completion that marks its answer (``\\boxed{}``, ``<answer>...</answer>``,
GSM8K's ``#### N``, an answer line) is graded on that whole marked answer (:func:`marked_answer`),
never on a number read out of it: ``\\boxed{\\sqrt{4}\\text{ units}}`` compares √4, ``2 or 3`` is a
hedge, ``1, 2`` is a list. Several boxes in the final sentence (``\\boxed{3}, \\boxed{5}``) form a
list. Only a completion with no marker at all falls back to its last number, and only where that
number is a stated result: not the operand of an arithmetic operator and not followed by ``=``
(``0 + 5 =`` states nothing). A task can require a marker (``task.require_marker``).

**How it is compared.** The fast path decides in microseconds when the whole answer and the gold
are plain numbers (``42``, ``-3.5``, ``1,234`` with thousands separators only in that pattern,
``3/4``, ``\\frac{3}{4}``, ``$12``, ``45%``, ``12 apples``: one trailing unit of words, none of
them a hedge), with exact rational arithmetic and math-verify's own rules where it is lenient: a
decimal side is compared rounded to 6 places (``0.333333`` equals ``1/3``), and a percentage
equals both its number and its number over 100. A gold that is a list never takes the fast path.
Everything else (LaTeX, expressions, units in LaTeX, lists, intervals) goes to math-verify
(:func:`verify_answer`), which the reward pool runs in a worker process under a hard time bound.

**Stricter than math-verify** (:func:`refused`), where it would pay what the math does not:
a restated computation (``409 + 83``, ``0 + 5 =``, ``x = 5 + 6``) is not a result; a hedge
(``4 or more``, ``about 5``, ``5 thousand``) is not an answer; a gold that is a code of letters
and digits (``0xc84``, ``12cd``) is compared whole (:func:`is_literal`). A gold that cannot be an
answer (:func:`unusable_gold`) is matched by nothing, and an answer that cannot be a sensible one
(:func:`implausible`) is wrong at once, before math-verify could stall on it.
"""

from __future__ import annotations

import logging
import math
import re
from fractions import Fraction
from functools import lru_cache
from typing import NamedTuple

_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
ANSWER_MARKER = r"\b(?:final answer|answer)\b(?:\s+is\b)?\s*[:=]?"  # "The answer is", "Answer:", "Final answer ="
_ANSWER_LINE = re.compile(ANSWER_MARKER + r"[ \t]*(.*)", re.IGNORECASE)
# Where an answer line's answer ends: "42. Let me check", "22, since 47 - 25 = 22", "5 because ...".
_SENTENCE_END = re.compile(r"\.\s+(?=[A-Z])|,?\s+(?:since|because|as|which|given|from|so|where|when)\s", re.IGNORECASE)
_DISPLAY = re.compile(r"\s*(\\\[|\$\$)(.*?)(\\\]|\$\$)", re.DOTALL)
# A hedge, a quantifier or a scale word after a number: the number is not the answer as stated.
HEDGES = frozenset(
    "or and not no nor either neither more less fewer than least most about approximately approx around roughly "
    "nearly almost over under maybe perhaps possibly probably between except but plus minus times divided squared "
    "cubed hundred hundreds thousand thousands million millions billion billions dozen dozens percent wrong "
    "incorrect false impossible none never undefined unknown".split()
)
_UNIT_WORD = r"(?:[A-Za-z]{2,}\.?)"
_PLAIN = re.compile(
    r"""\s*(?P<sign>[-+\u2212])?\s*(?:\\?\$\s*)?(?P<sign2>[-+\u2212])?\s*
    (?:
        (?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.(?P<dec>\d*))?  # 1,234.5  1234  5.
      | \.(?P<dec_only>\d+)                                    # .5
      | (?P<num>\d+)\s*/\s*(?P<den>\d+)                        # 3/4
      | \\[dt]?frac\{\s*(?P<lnum>\d+)\s*\}\{\s*(?P<lden>\d+)\s*\}   # \frac{3}{4}
    )
    \s*(?P<pct>\\?%)?
    (?P<unit>\s*""" + _UNIT_WORD + r"""(?:\s+""" + _UNIT_WORD + r"""){0,2})?   # a unit: 1-3 words (not a variable)
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


# --------------------------------------------------------------------------- extraction


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """Every ``\\boxed{...}`` (nested braces allowed): (start, end, content)."""
    found, start = [], text.find("\\boxed{")
    while start >= 0:
        depth, i = 0, start + len("\\boxed")
        for j in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                found.append((start, j + 1, text[i + 1 : j]))
                break
        else:
            break  # an unclosed box: nothing after it is boxed
        start = text.find("\\boxed{", j + 1)
    return found


# What may stand between two boxes of one list: commas, "and", math delimiters, spacing.
_BETWEEN_BOXES = re.compile(r"(?:\s|,|;|\$|\\[(),;!: ]|\\quad|\\qquad|\\text\{\s*(?:and|,)?\s*\}|\band\b|&)*")


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{}``; with the boxes just before it in the same sentence
    (nothing but commas, ``and`` or spacing between them), the list they form: ``3, 5, 7``."""
    boxes = _boxes(text)
    if not boxes:
        return None
    items = [boxes[-1]]
    for box in reversed(boxes[:-1]):
        if not _BETWEEN_BOXES.fullmatch(text[box[1] : items[0][0]]):
            break
        items.insert(0, box)
    return ", ".join(content.strip() for _, _, content in items)


def _answer_line(text: str) -> str | None:
    """What follows the last ``answer``/``final answer`` that is followed by something
    (``The answer is 42.``, ``Answer: 42``): the rest of its line, or the display maths
    (``\\[ ... \\]``, ``$$ ... $$``) that starts there, on its own lines."""
    for match in reversed(list(_ANSWER_LINE.finditer(text))):
        rest = match.group(1).strip()
        if rest in ("", "\\[", "$$") and (display := _DISPLAY.match(text, match.start(1))):
            return display.group(2).strip()
        rest = _last_boxed(rest) or _unwrapped(_SENTENCE_END.split(rest)[0].rstrip(".").strip())
        if rest:
            return rest
    return None


_MATH_DELIMITERS = re.compile(r"\s*(?:\$\$?|\\\(|\\\[)\s*(.*?)\s*(?:\$\$?|\\\)|\\\])\s*\.?", re.DOTALL)


def _unwrapped(answer: str) -> str:
    """``answer`` without the maths delimiters around it (``$…$``, ``\\(…\\)``, ``\\[…\\]``)."""
    return m.group(1) if (m := _MATH_DELIMITERS.fullmatch(answer)) else answer.strip("$").strip()


def marked_answer(text: str) -> str | None:
    """The whole answer a completion marks as final, by the first marker found in this order:
    ``\\boxed{}`` (several in the last sentence: their list), ``<answer>...</answer>``, GSM8K's
    ``#### N``, an answer line. ``None`` when no marker is found."""
    if (boxed := _last_boxed(text)) is not None:
        return boxed.strip()
    if tags := _ANSWER_TAG.findall(text):
        inner = tags[-1].strip()
        return _last_boxed(inner) or inner
    if "####" in text:
        return text.rsplit("####", 1)[1].strip().split("\n")[0].strip()
    return _answer_line(text)


_ARITHMETIC = r"[-+*×÷]|\\times|\\cdot|\\div"  # an operator of arithmetic, but for the fraction bar
_BINARY_BEFORE = re.compile(rf"(?:\d|\))\s*(?:/|{_ARITHMETIC})\s*$")  # "0 + " before a number
_OPERATOR_AFTER = re.compile(rf"\s*(?:[/=^]|{_ARITHMETIC})")  # " =", " + 3" after a number
_COPY_CONTEXT = 12  # characters (white space aside) before a number that, in the question with it, make it a copy


def stated_number(text: str, question: str | None = None) -> str | None:
    """The last number of an unmarked completion, where it states a result: not the operand of an
    arithmetic operator (``0 + 5``), not followed by an operator or ``=`` (``0 + 5 =``), not an
    item of a comma-separated list (``(3, 5)``), not copied from the ``question`` (the number with
    the characters before it, as the question has them: "... of the remaining 284?"). None otherwise."""
    matches = list(_NUMBER.finditer(text))
    if not matches:
        return None
    last = matches[-1]
    before, after = text[: last.start()], text[last.end() :]
    if _BINARY_BEFORE.search(before) or _OPERATOR_AFTER.match(after):
        return None
    if re.search(r"\d\s*,\s*$", before) or re.match(r"\s*,\s*-?\d", after):
        return None
    if question and copied(before, last.group(), question):
        return None
    return last.group().replace(",", "")


def copied(before: str, number: str, question: str) -> bool:
    """Whether ``number``, with the characters written before it, stands so in ``question`` (white
    space and case aside)."""
    squeeze = lambda text: re.sub(r"\s+", "", text.lower())
    context = squeeze(before)[-_COPY_CONTEXT:]
    if not context:
        return False  # a bare number is an answer, whatever the question holds
    return context + squeeze(number) in squeeze(question)


def extract_answer(text: str, require_marker: bool = False, question: str | None = None) -> str | None:
    """The final answer of a completion: its :func:`marked_answer`, else (unless ``require_marker``)
    its :func:`stated_number` (not one copied from ``question``). None when it holds no answer."""
    marked = marked_answer(text)
    if marked is not None or require_marker:
        return marked
    return stated_number(text, question)


# --------------------------------------------------------------------------- plain numbers


@lru_cache(maxsize=4096)
def as_number(text: str) -> Number | None:
    """``text`` as a plain number, or None when it is anything else (or too long to be one). One
    trailing unit of words is allowed (``12 apples``), none of them a hedge (:data:`HEDGES`)."""
    if len(text) > MAX_PLAIN_LENGTH or not (m := _PLAIN.fullmatch(text)):
        return None
    g = m.groupdict()
    if g["unit"] and HEDGES & {w.rstrip(".").lower() for w in g["unit"].split()}:
        return None
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
    return marked_answer(gold) if "####" in gold or "\\boxed" in gold else gold


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


# --------------------------------------------------------------------------- what is refused


def _top_level(text: str, char: str) -> list[int]:
    """Positions of ``char`` in ``text`` outside any brackets."""
    depth, found = 0, []
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(depth - 1, 0)
        elif c == char and depth == 0:
            found.append(i)
    return found


def is_list(gold: str) -> bool:
    """Whether ``gold`` is a list or tuple of answers (``3, 5, 7``, ``(1, 2)``, ``1,-2``): a comma
    at the top level or inside one pair of brackets, other than a thousands separator (``1,234``,
    ``10,\\!080``)."""
    text = re.sub(r"(?<=\d),(?:\\!)?(?=\d{3}(?!\d))", "", gold.strip().strip("$"))
    inner = text[1:-1] if len(text) > 1 and text[0] in "([{" and text[-1] in ")]}" else text
    return bool(_top_level(inner, ","))


_NUMERAL = r"(?:\d+(?:\.\d+)?(?:\s*/\s*\d+)?|\.\d+|\\[dt]?frac\{\d+\}\{\d+\})"  # a fraction is one number
_OPERATOR = rf"(?:{_ARITHMETIC})"
_RESTATED = re.compile(
    rf"\s*[-+]?\s*\(?\s*{_NUMERAL}\s*\)?(?:\s*{_OPERATOR}\s*[-+]?\s*\(?\s*{_NUMERAL}\s*\)?)+\s*"
)


def stated_result(answer: str) -> str:
    """What an answer states as its result: the text after its last top-level ``=`` (the whole
    answer where it has none). ``x = 409 + 83 = 492`` states ``492``; ``0 + 5 =`` states nothing."""
    text = answer.strip().strip("$").strip()
    equals = _top_level(text, "=")
    return text[equals[-1] + 1 :].strip() if equals else text


def restated(answer: str) -> bool:
    """Whether ``answer`` restates a computation instead of its result: what it states
    (:func:`stated_result`) is empty (``0 + 5 =``) or arithmetic on plain numbers (``409 + 83``,
    ``3 \\times 4``, ``x = 5 + 6``)."""
    result = stated_result(answer).rstrip(".").strip()
    return not result or bool(_RESTATED.fullmatch(result))


_HEDGE_MARK = re.compile(r"\\(?:approx|sim|simeq|pm|mp)(?![A-Za-z])|[≈±∓]")
_RELATION = re.compile(r"\\(?:geq?|leq?|neq?|lt|gt)(?![A-Za-z])|[<>≤≥≠]|!=")
_LIST_WORDS = {"and"}  # 4, 7 and 12: a list, where the gold is one
_LIST_MARKS = {"\\pm", "\\mp", "±", "∓"}  # ±5: the list -5, 5


def hedged(answer: str, gold: str) -> bool:
    """Whether ``answer`` hedges or qualifies its value with a word or sign the gold does not use
    (``2 or 3``, ``4 or more``, ``about 5``, ``5 thousand``, ``\\text{not } 12``, ``\\approx 5``;
    a relation ``> 3`` where the gold is none; ``and`` or ``\\pm`` are a list's where the gold is one)."""
    listed = is_list(gold)
    words = {w.lower() for w in _WORDS.findall(answer)} & HEDGES
    words -= {w.lower() for w in _WORDS.findall(gold)} | (_LIST_WORDS if listed else set())
    marks = set(_HEDGE_MARK.findall(answer)) - set(_HEDGE_MARK.findall(gold)) - (_LIST_MARKS if listed else set())
    relation = bool(_RELATION.search(answer)) and not _RELATION.search(gold)
    return bool(words or marks or relation)


def refused(answer: str, gold: str) -> str | None:
    """Why ``answer`` is wrong whatever math-verify would say, or None: it is implausible
    (:func:`implausible`), restates a computation (:func:`restated`) where the gold does not, or
    hedges (:func:`hedged`). These are podsrl's deliberate differences from math-verify: each only
    ever withholds a reward."""
    if why := implausible(answer, gold):
        return why
    if restated(answer) and not restated(gold):
        return "restated computation"
    if hedged(answer, gold):
        return "hedge"
    return None


# --------------------------------------------------------------------------- codes


_TOKEN = re.compile(r"[+-]?[A-Za-z0-9]+")
_NUMBER_TIMES_VARIABLE = re.compile(r"[+-]?\d*[A-Za-z]")  # 3x, 2k, x: algebra
_WRAPPER = re.compile(r"\\(?:text|mathrm|texttt)\{(.*)\}")


def is_literal(gold: str) -> bool:
    """Whether ``gold`` is one token of letters and digits that is neither a number nor a number
    times a variable (``0xc84``, ``0b111``, ``12cd``, ``A3F``): a code, which is compared whole
    (:func:`literal_equal`). math-verify would read it as a product (``0xc84`` as 0) or drop its
    letters as a unit (``12ab`` as 12)."""
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


# --------------------------------------------------------------------------- grading


def fast_match(completion: str, gold: str, require_marker: bool = False, question: str | None = None) -> bool | None:
    """True/False when decided without math-verify; None when math-verify must decide."""
    return compare_fast(extract_answer(completion, require_marker, question), gold)


def compare_fast(answer: str | None, gold: str) -> bool | None:
    """Whether the extracted ``answer`` equals ``gold``, where decided in-process; None where
    math-verify must decide (:func:`compare`)."""
    if unusable_gold(gold):
        return False
    gold = gold_answer(gold)
    if answer is None or not answer.strip():
        return False
    if is_literal(gold):
        return literal_equal(gold, answer)
    if refused(answer, gold):
        return False
    if answer.strip() == gold.strip():
        return True
    if is_list(gold):
        return None
    g, p = as_number(gold), as_number(answer)
    if g is None or p is None:
        return None
    # math-verify also reads a percentage as its bare number: 10% equals a gold 10
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
    strings never are). Of an equation only the right-hand side is looked at; ``-x``
    (``Mul(-1, x)``) is a number."""
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
    """math-verify's verdict on the whole answer, where what it states is a result."""
    from math_verify import verify

    if answer.replace(" ", "").strip("$.") == gold.replace(" ", "").strip("$."):
        return True
    g, p = _parse(gold), _parse(answer)
    if not g or not p:
        return False
    if not any(map(unevaluated_arithmetic, g)) and any(map(unevaluated_arithmetic, _parse(stated_result(answer)))):
        return False  # the stated result is a computation (a gold "2 + 3" keeps math-verify's rule)
    return bool(verify(g, p, timeout_seconds=None))


def verify_answer(completion: str, gold: str, require_marker: bool = False, question: str | None = None) -> bool:
    """Whether the final answer of ``completion`` equals ``gold`` (slow; unbounded: call it
    through the reward pool)."""
    return compare(extract_answer(completion, require_marker, question), gold)


def compare(answer: str | None, gold: str) -> bool:
    """Whether the extracted ``answer`` equals ``gold``: :func:`compare_fast` where it decides,
    else math-verify on the whole answer."""
    decided = compare_fast(answer, gold)
    return decided if decided is not None else _verified(gold_answer(gold), answer)
