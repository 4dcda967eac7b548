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
them a hedge or a word that changes the value, :data:`HEDGES`), with exact rational arithmetic and
math-verify's own rules where it is lenient: a decimal side is compared rounded to 6 places
(``0.333333`` equals ``1/3``). A percentage is read once, as its number over 100 (:func:`in_units`).
A gold that is a list never takes the fast path.
Everything else (LaTeX, expressions, units in LaTeX, lists, intervals) goes to math-verify
(:func:`verify_answer`), which the reward pool runs in a worker process under a hard time bound.

**Stricter than math-verify** (:func:`refused`), where it would pay what the math does not:
a restated computation (``409 + 83``, ``0 + 5 =``, ``x = 5 + 6``) is not a result; a hedge
(``4 or more``, ``about 5``, ``5 thousand``, ``3 pi``) is not an answer; nor is an answer with a
number math-verify's reading leaves out (``3 \\lor 5``, :func:`unread_number`), a false equation
(``3 = 5``) or numbers written apart (``1 8``); a gold that is a code of letters
and digits (``0xc84``, ``12cd``) is compared whole (:func:`is_literal`). A gold that cannot be an
answer (:func:`unusable_gold`) is matched by nothing, and an answer that cannot be a sensible one
(:func:`implausible`) is wrong at once, before math-verify could stall on it.
"""

from __future__ import annotations

import logging
import math
import re
import unicodedata
from collections import Counter
from fractions import Fraction
from functools import lru_cache
from typing import NamedTuple

_NUMBER = re.compile(r"[-\u2212]?(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?(?:/[0-9]+)?|[-\u2212]?\.[0-9]+")  # ASCII digits only
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_HASHES = re.compile(r"####[ \t]*([^\n]*)(\n)?")  # GSM8K's "#### 42"
ANSWER_MARKER = r"\b(?:final answer|answer)\b(?:\s+is\b)?\s*[:=]?"  # "The answer is", "Answer:", "Final answer ="
_ANSWER_LINE = re.compile(ANSWER_MARKER + r"[ \t]*", re.IGNORECASE)
# Where an answer line's answer ends: "42. Let me check", "22, since 47 - 25 = 22", "5 because ...".
_SENTENCE_END = re.compile(r"\.\s+(?=[A-Z])|,?\s+(?:since|because|as|which|given|from|so|where|when)\s", re.IGNORECASE)
_DISPLAY = re.compile(r"\s*(\\\[|\$\$)(.*?)(\\\]|\$\$)", re.DOTALL)
# A hedge, a quantifier, a range, a scale or number word, or a constant beside a number: the number is
# not the answer as stated (``3 pi`` is 3π, ``5 point five`` 5.5, ``12ish`` about 12).
HEDGES = frozenset(
    "or and not no nor either neither more less fewer than least most about approximately approx around roughly "
    "nearly almost over under maybe perhaps possibly probably between except but plus minus times divided squared "
    "cubed hundred hundreds thousand thousands million millions billion billions trillion trillions dozen dozens "
    "grand gross score scores percent pct wrong incorrect false impossible none never undefined unknown "
    "to through till until ish max maximum min minimum tops odd below above negative positive "
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety point half halves third "
    "thirds quarter quarters fourth fourths fifth fifths sixth sixths seventh sevenths eighth eighths ninth ninths "
    "tenth tenths hundredth hundredths thousandth thousandths millionth millionths pi tau repeating recurring "
    "power powers root roots factorial".split()
)
# Beside an unmarked number in prose these are as often the sentence's as the number's ("comes to
# 18", "each one costs 5"): there they are not read as a hedge.
_PROSE_WORDS = frozenset(
    "to through till until zero one two three four five six seven eight nine ten eleven twelve".split()
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
    re.VERBOSE | re.ASCII,  # ASCII digits only: other scripts' digits are look-alikes (see lookalike)
)
_WORDS = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")  # a word that is not a LaTeX command
_PER_CENT = re.compile(r"\bper\s*cent", re.IGNORECASE)  # "45 per cent": a percentage, in words
MAX_PLAIN_LENGTH = 64  # longer strings are never plain numbers: math-verify decides
_SIGNIFICANT_FLOAT_DIGITS = 15  # math-verify reads decimals as floats of this precision


class Number(NamedTuple):
    """A plain number as written: its exact value and how it was written."""

    value: Fraction
    decimal: bool  # written with a decimal point (math-verify compares these rounded)
    percent: bool


# --------------------------------------------------------------------------- extraction


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """Every closed ``\\boxed{...}`` (nested braces allowed): (start, end, content)."""
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


def _box_lists(text: str) -> list[tuple[int, int, str]]:
    """The boxes of ``text``, those of one sentence (nothing but commas, ``and`` or spacing between
    them) joined as the list they form: (start, end, ``3, 5, 7``)."""
    lists: list[list[tuple[int, int, str]]] = []
    for box in _boxes(text):
        if lists and _BETWEEN_BOXES.fullmatch(text[lists[-1][-1][1] : box[0]]):
            lists[-1].append(box)
        else:
            lists.append([box])
    return [(items[0][0], items[-1][1], ", ".join(c.strip() for _, _, c in items)) for items in lists]


def _between_boxes(text: str) -> list[tuple[int, int]]:
    """The spans of ``text`` outside its boxes: (start, end) pairs."""
    edges = [0] + [i for s, e, _ in _boxes(text) for i in (s, e)] + [len(text)]
    return list(zip(edges[::2], edges[1::2]))


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{}`` (with the boxes of its sentence: their list)."""
    lists = _box_lists(text)
    return lists[-1][2] if lists else None


class Mark(NamedTuple):
    """An answer a completion marks: where it stands, what it says, and how."""

    start: int
    end: int
    answer: str
    strong: bool
    """A box, an answer tag or ``####``: a commitment. An answer line can be corrected by a later one."""
    ends: bool
    """Something follows it that a cut at the length limit could not have changed: a closed box or
    tag, a line break, or a sentence after it."""


_MATH_DELIMITERS = re.compile(r"\s*(?:\$\$?|\\\(|\\\[)\s*(.*?)\s*(?:\$\$?|\\\)|\\\])\s*\.?", re.DOTALL)


def _unwrapped(answer: str) -> str:
    """``answer`` without the maths delimiters around it (``$…$``, ``\\(…\\)``, ``\\[…\\]``)."""
    return m.group(1) if (m := _MATH_DELIMITERS.fullmatch(answer)) else answer.strip("$").strip()


def _line_marks(text: str) -> list[Mark]:
    """Each answer line followed by something (``The answer is 42.``, ``Answer: 42``): the first
    sentence of what follows its marker on its line (up to the next marker: ``the answer is 8.
    Wait, no, the answer is 9.`` marks 8, then 9), or the display maths (``\\[ ... \\]``,
    ``$$ ... $$``) that starts there, on its own lines."""
    found = list(_ANSWER_LINE.finditer(text))
    marks = []
    for i, match in enumerate(found):
        line_end = text.find("\n", match.end())
        end = min(line_end if line_end >= 0 else len(text), found[i + 1].start() if i + 1 < len(found) else len(text))
        raw = text[match.end() : end]
        rest = raw.strip()
        if rest in ("", "\\[", "$$") and (display := _DISPLAY.match(text, match.end())):
            shown = display.group(2).strip()
            marks.append(Mark(match.start(), display.end(), _last_boxed(shown) or shown, False, True))
            continue
        cut = _SENTENCE_END.search(rest)
        answer = _last_boxed(rest) or _unwrapped(rest[: cut.start() if cut else None].rstrip(".").strip())
        first_sentence_end = match.end() + len(raw) - len(raw.lstrip()) + (cut.start() if cut else len(rest))
        if answer:
            marks.append(Mark(match.start(), first_sentence_end, answer, False, cut is not None or end < len(text)))
    return marks


def marks(text: str) -> list[Mark]:
    """Every answer ``text`` marks, in the order they end: each box (the boxes of one sentence as
    one list), answer tag (its box where it holds one), ``#### N`` and answer line."""
    found = [Mark(s, e, content.strip(), True, True) for s, e, content in _box_lists(text)]
    for m in ANSWER_TAG.finditer(text):
        inner = m.group(1).strip()
        boxed = _last_boxed(inner)  # the tag's box, unless the tag writes a number or a choice beside it: then the whole tag
        beside = "".join(inner[a:b] for a, b in _between_boxes(inner))
        boxed = boxed if boxed and not (re.search(r"[0-9]", beside) or _CHOICE.search(beside)) else None
        found.append(Mark(m.start(), m.end(), boxed or inner, True, True))
    for m in _HASHES.finditer(text):
        found.append(Mark(m.start(), m.end(1), m.group(1).strip(), True, m.group(2) is not None))
    found += _line_marks(text)
    return sorted((m for m in found if m.answer), key=lambda m: (m.end, -m.start))


_FENCE = re.compile(r"(```|~~~).*?(?:\1|\Z)", re.DOTALL)


def without_code(text: str) -> str:
    """``text`` with each fenced code block (a cut one runs to the end) blanked, line breaks kept,
    so that nothing in it is read as an answer and every other position stays."""
    return _FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


_LAYOUT = re.compile(r"\\left|\\right|\\[!,;: ]|\s|\$")


def _same(a: str, b: str) -> bool:
    """Whether two marked answers say the same: the same text (spacing, ``$`` and LaTeX sizing
    aside, ``\\dfrac`` as ``\\frac``), or the same plain number."""
    norm = lambda s: _LAYOUT.sub("", s).rstrip(".").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    if norm(a) == norm(b):
        return True
    x, y = as_number(a), as_number(b)
    return x is not None and y is not None and x.value == y.value and x.percent == y.percent


def _states_value(answer: str) -> bool:
    """Whether an answer line states a value (digits or LaTeX, no words, ``=`` or relation; or a
    plain number with its unit, ``6 apples``, or after an ``=``, ``x = 6``): one that must agree
    with the boxes, tags and ``####`` of the completion. A line of words (``the answer we need is
    the sum of 5 and 3``) or a check (``17 \\cdot 44 = 748 \\equiv 1``) does not."""
    if as_number(answer) is not None or as_number(stated_result(answer)) is not None:
        return True
    return (bool(re.search(r"[0-9\\]", answer)) and not _WORDS.search(answer)
            and not re.search(r"=|\\equiv|\\approx", answer) and not _RELATION.search(answer))


def _agree(line: str, final: str) -> bool:
    """Whether an answer line says what the final answer says (:func:`_same`), whole or after its
    last ``=`` (``x = 6`` and ``6``)."""
    return _same(line, final) or _same(stated_result(line), stated_result(final))


# "the answer is not \boxed{18}", "it cannot be $\boxed{18}$"
_NEGATED_BEFORE = re.compile(r"(?:\bnot|\bcannot|n't|\bnever|\bno)\s+(?:(?:be|equal|equals|to|the|exactly|just|simply)\s+)*[\s$(\[\\]*\Z",
                             re.IGNORECASE)
# "\boxed{18} is wrong", "\boxed{18}. Wait, no", "<answer>18</answer> That is incorrect."
_RETRACTED_AFTER = re.compile(
    r"[\s$.,;:!)\]}]*(?:(?:wait|hmm+|oops|actually)\b[\s,.!:;-]*)*"
    r"(?:no\b|(?:that|this|it)(?:'s|\s+is|\s+was)\s+(?:wrong|incorrect|not\s+(?:right|correct|it))"
    r"|(?:is|was)\s+(?:wrong|incorrect|not\s+(?:right|correct|the\s+(?:final\s+)?answer)))",
    re.IGNORECASE,
)
_RETRACTION_WINDOW = 60  # characters before and after a final answer read for its negation or retraction


def retracted(text: str, mark: Mark) -> bool:
    """Whether ``text`` negates the marked answer just before it (``not \\boxed{18}``) or retracts
    it just after (``\\boxed{18} is wrong``, ``\\boxed{18}. Wait, no``)."""
    before = text[max(mark.start - _RETRACTION_WINDOW, 0) : mark.start]
    return bool(_NEGATED_BEFORE.search(before) or _RETRACTED_AFTER.match(text, mark.end, mark.end + _RETRACTION_WINDOW))


# Characters that look like part of a number but are not ASCII digits or signs: other scripts'
# digits (Nd), superscripts and vulgar fractions (No), numeral letters (Nl), format characters
# such as zero-width spaces (Cf), and dashes other than the minus sign before a digit.
_DASH_BEFORE_DIGIT = re.compile(r"[\u2010-\u2015\u2e3a\u2e3b\ufe58\ufe63\uff0d](?=\s*[0-9])")


_OTHER_PERCENT = "\u066a\u2030\u2031\ufe6a"  # ٪ ‰ ‱ ﹪: a percent sign, or a scale, that is not %


def lookalike(text: str) -> str | None:
    """The first character of ``text`` that looks like part of a number and is not one podsrl
    reads (``٤``, ``４``, ``²``, ``½``, a zero-width space, ``－``, a fullwidth ``％``, ``‰``), or
    None. U+2212 (−) is read as a minus sign."""
    for ch in text:
        category = unicodedata.category(ch)
        if ((category in ("Nd", "No", "Nl") and not "0" <= ch <= "9") or category == "Cf"
                or "\uff01" <= ch <= "\uff5e" or ch in _OTHER_PERCENT):  # fullwidth forms of ASCII
            return ch
    return m.group() if (m := _DASH_BEFORE_DIGIT.search(text)) else None


# "\boxed{5}. Or maybe 6.", "\boxed{3}, or possibly 5", "The answer is 5. Could also be 6."
_ALTERNATIVE_AFTER = re.compile(
    r"[\s$.,;:!)\]}]*(?:or|maybe|perhaps|possibly|probably|alternatively|otherwise|unless|could|might)\b"
    r"[^\n0-9]{0,40}?(-?[0-9]+(?:[.,/][0-9]+)*)", re.IGNORECASE)


def alternative_after(text: str, mark: Mark) -> bool:
    """Whether the words right after the marked answer offer another number (``\\boxed{5}. Or maybe
    6``, ``\\boxed{3}, or possibly 5``): a second candidate."""
    found = _ALTERNATIVE_AFTER.match(text, mark.end, mark.end + _RETRACTION_WINDOW)
    return found is not None and not _same(found.group(1), mark.answer)


class Reading(NamedTuple):
    """What a completion answers: its final ``answer`` (None: none), and ``why`` it has none where
    it marks or states something that is refused."""

    answer: str | None
    why: str | None = None


def read(text: str, require_marker: bool = False, question: str | None = None, truncated: bool = False) -> Reading:
    """The final answer of a completion (fenced code blocks aside, :func:`without_code`):

    - where it holds a box, an answer tag or ``####``, the last of them; every box, tag and
      ``####``, and every answer line after them that states a value, must say the same, else it
      is a hedge, no answer (an answer line before them is corrected by them);
    - else the last answer line (a later one corrects an earlier one);
    - else, unless ``require_marker`` or ``truncated``, its :func:`stated_number`.

    A final answer negated or retracted (:func:`retracted`) is no answer. ``truncated`` (cut at the
    length limit): only marks that end before the cut count, and never an unmarked number."""
    text = without_code(text)
    found = [m for m in marks(text) if m.ends or not truncated]
    strong = [m for m in found if m.strong]
    if strong:
        final = strong[-1]
        if any(not (_same if m.strong else _agree)(m.answer, final.answer) for m in found
               if m.strong or (m.end > final.end and _states_value(m.answer))):
            return Reading(None, "several different answers")
    elif found:
        final = found[-1]
    elif require_marker or truncated:
        return Reading(None, "no marked answer" if not truncated else "truncated before a marked answer")
    else:
        return stated_number(text, question)
    if retracted(text, final):
        return Reading(None, "retracted")
    if alternative_after(text, final):
        return Reading(None, "several different answers")
    return Reading(final.answer.replace("\u2212", "-"))


def marked_answer(text: str) -> str | None:
    """The final answer a completion marks (:func:`read` without the unmarked reading); None where
    it marks none, or its marks are refused."""
    return read(text, require_marker=True).answer


_ARITHMETIC = r"[-+*×÷]|\\times|\\cdot|\\div"  # an operator of arithmetic, but for the fraction bar
_BINARY_BEFORE = re.compile(rf"(?:[0-9]|\))\s*(?:/|{_ARITHMETIC})\s*$")  # "0 + " before a number
_OPERATOR_AFTER = re.compile(rf"\s*(?:[/=^]|{_ARITHMETIC})")  # " =", " + 3" after a number
_COPY_CONTEXT = 12  # characters (white space aside) before a number that, in the question with it, make it a copy
_CLAUSE_END = re.compile(r"[.!?;:\n](?:\s|$)|\n")
_RESULT_CUE = re.compile(r"(?:=|\b(?:is|are|was|equals?|gives?|get|gets|makes?|be|total|so|therefore|thus|hence)\b)\W*$",
                         re.IGNORECASE)
_NEAR_WORDS = 2  # words (or numbers) on each side of an unmarked number read for a hedge
_ATTACHED = r"[\\$€£¥%]"  # written against a number: what lies past them is beside the number too


def _near(before: str, after: str) -> str:
    """The words around an unmarked number inside its sentence: ``_NEAR_WORDS`` on each side."""
    before = _CLAUSE_END.split(before)[-1]
    after = _CLAUSE_END.split(after)[0]
    return " ".join(before.split()[-_NEAR_WORDS:] + ["#"] + after.split()[:_NEAR_WORDS])


def stated_number(text: str, question: str | None = None) -> Reading:
    """The last number of an unmarked completion, where it states a result: not the operand of an
    arithmetic operator (``0 + 5``), not followed by an operator or ``=`` (``0 + 5 =``), not an
    item of a list (``(3, 5)``, ``3; 5``, ``3 | 5``), not hedged by the words around it (``12 or 11``,
    ``11 or more``, ``about 11``, ``< 11``), not touching a look-alike character (``4²``), nor
    with one behind its currency or percent sign (a zero-width space before ``$18.90``), not
    copied from the ``question`` (the number with the characters before it, as the question has
    them: "... of the remaining 284?"), and not an echo of one of the question's numbers (a number
    the question holds, written without a result before it: ``=``, ``is``, ``gives``, ...)."""
    matches = list(_NUMBER.finditer(text))
    if not matches:
        return Reading(None)
    last = matches[-1]
    before, after = text[: last.start()], text[last.end() :]
    number = last.group().replace(",", "").replace("\u2212", "-")
    if _BINARY_BEFORE.search(before) or _OPERATOR_AFTER.match(after):
        return Reading(None, "a computation, not its result")
    if re.search(r"[0-9]\s*[,;|&]\s*$", before) or re.match(r"\s*[,;|&]\s*-?[0-9]", after):
        return Reading(None, "an item of a list")
    # the characters on each side, past a currency sign, TeX's \$ or a percent sign written against it
    beside_before = re.search(rf".?{_ATTACHED}*$", before, re.DOTALL).group()
    beside_after = re.match(rf"{_ATTACHED}*.?", after, re.DOTALL).group()
    if lookalike(beside_before + last.group() + beside_after):
        return Reading(None, "a look-alike character beside it")
    near = _near(before, after)
    if {w.lower() for w in _WORDS.findall(near)} & (HEDGES - _PROSE_WORDS) or _RELATION.search(near) or _HEDGE_MARK.search(near):
        return Reading(None, "hedge")
    if question and copied(before, last.group(), question):
        return Reading(None, "copied from the question")
    if question and before.strip() and echoed(before, number, question):
        return Reading(None, "a number of the question")
    if re.match(r"\s*\\?%", after):  # a percentage, read once as marked answers are (in_units)
        number += "%"
    return Reading(number)


def copied(before: str, number: str, question: str) -> bool:
    """Whether ``number``, with the characters written before it, stands so in ``question`` (white
    space and case aside)."""
    squeeze = lambda text: re.sub(r"\s+", "", text.lower())
    context = squeeze(before)[-_COPY_CONTEXT:]
    if not context:
        return False  # a bare number is an answer, whatever the question holds
    return context + squeeze(number) in squeeze(question)


def echoed(before: str, number: str, question: str) -> bool:
    """Whether ``number`` is one of the ``question``'s numbers (or a run of digits in it: the 3 of
    its 2/3), written with no result before it (``=``, ``is``, ``gives``, ... ending the text
    before it): ``17 25`` echoes "17 + 25"."""
    values = {n.group().replace(",", "") for n in _NUMBER.finditer(question)} | set(re.findall(r"[0-9]+", question))
    return number in values and not _RESULT_CUE.search(_CLAUSE_END.split(before)[-1])


def extract_answer(text: str, require_marker: bool = False, question: str | None = None,
                   truncated: bool = False) -> str | None:
    """The final answer of a completion (:func:`read`); None when it holds no answer."""
    return read(text, require_marker, question, truncated).answer


# --------------------------------------------------------------------------- plain numbers


@lru_cache(maxsize=4096)
def as_number(text: str) -> Number | None:
    """``text`` as a plain number, or None when it is anything else (or too long to be one). One
    trailing unit of words is allowed (``12 apples``), none of them a hedge (:data:`HEDGES`)."""
    if len(text) > MAX_PLAIN_LENGTH or not (m := _PLAIN.fullmatch(text)):
        return None
    g = m.groupdict()
    if g["unit"] and (HEDGES & {w.rstrip(".").lower() for w in g["unit"].split()} or _PER_CENT.search(g["unit"])):
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
    """Equality of two plain numbers as math-verify decides it, computed exactly, a percentage
    read as its number over 100 and only so: the values are equal; or a side is a decimal, neither
    is a bare integer, and they agree to 6 places."""
    a = gold.value / 100 if gold.percent else gold.value
    b = pred.value / 100 if pred.percent else pred.value
    if a == b:
        return True
    integer = lambda x: not x.decimal and x.value.denominator == 1
    bare_integer = lambda x: integer(x) and not x.percent
    if (gold.decimal or pred.decimal) and not (bare_integer(gold) or bare_integer(pred)):
        return round(a, 6) == round(b, 6)
    return False


_PERCENT = re.compile(r"\\?%")
_PERCENT_QUESTION = re.compile(r"\bper\s?cent(?:age)?s?\b|%", re.IGNORECASE)


def asks_percent(question: str | None) -> bool:
    """Whether the ``question`` asks for a percentage (``What percent ...``, ``%``): its bare
    numbers, the gold's too (GSM8K writes ``45`` for 45%), are then in percent."""
    return bool(question and _PERCENT_QUESTION.search(question))


def in_units(answer: str, gold: str, question: str | None) -> tuple[str, str]:
    """The answer and gold as math-verify compares them, each with one reading: a number with a
    percent sign is its number over 100, and a bare number is in the question's units (percent
    where it :func:`asks_percent`). ``45%`` equals a gold ``0.45``, and a gold ``45`` only where
    the question asks for a percentage; never both."""
    if asks_percent(question):
        return _PERCENT.sub("", answer).strip(), _PERCENT.sub("", gold).strip()
    over = lambda text: f"\\frac{{{_PERCENT.sub('', text).strip()}}}{{100}}" if _PERCENT.search(text) else text
    return over(answer), over(gold)


def gold_answer(gold: str) -> str | None:
    """The gold answer as compared: a GSM8K gold's number after its last ``####``, a MATH
    solution's last ``\\boxed{}``, else the gold as given."""
    if "####" in gold:
        return gold.rsplit("####", 1)[1].strip().split("\n")[0].strip()
    if "\\boxed" in gold:
        return _last_boxed(gold)
    return gold


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


def is_list(gold: str, spaced_separators: bool = False) -> bool:
    """Whether ``gold`` is a list or tuple of answers (``3, 5, 7``, ``(1, 2)``, ``1,-2``): a comma
    at the top level or inside one pair of brackets, other than a thousands separator (``1,234``,
    ``10,\\!080``; with ``spaced_separators`` also one with a space after it, ``11,\\! 111``, as
    MATH-500 writes some, which math-verify reads as one number)."""
    space = r"\s*" if spaced_separators else ""
    # The digit before the comma ends a number, not an exponent or subscript (inches^3, 864).
    text = re.sub(rf"(?<=\d)(?<![\^_]\d),{space}(?:\\!)?{space}(?=\d{{3}}(?!\d))", "", gold.strip().strip("$"))
    text = re.sub(r"\\(?:left|right)(?![A-Za-z])\s*", "", text).strip()  # \left( 3, 5 \right): brackets
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


def _symbols(*names: str) -> str:
    """The mathematical symbols (Unicode category Sm) whose names hold one of ``names``, as a
    character class: every ``≲``, ``⩽``, ``≅`` there is, not the few a list would hold."""
    chars = [chr(c) for c in range(0xa0, 0x2c00) if unicodedata.category(chr(c)) == "Sm"
             and any(n in unicodedata.name(chr(c), "") for n in names)]
    return "[" + re.escape("".join(chars)) + "]"


# An approximation or a choice of sign: ≈, ±, \sim, \cong, a question mark (``12\text{?}``).
_HEDGE_MARK = re.compile(
    r"\\(?:approx\w*|sim\w*|thick(?:approx|sim)|cong|backsim\w*|pm|mp|propto|asymp|doteq\w*)(?![A-Za-z])|\?|"
    + _symbols("APPROX", "ALMOST EQUAL", "ASYMPTOTIC", "TILDE", "PLUS-MINUS", "MINUS-OR-PLUS", "PROPORTIONAL"))
# A relation other than equality, or a negation: <, \le, \leqslant, \lesssim, \ll, \prec, \not, ≠, ⩽.
_RELATION = re.compile(
    r"\\(?:[lg]eq?(?:q|slant)?|[lg]t|ne|neq|not|neg|lnot|n[lg](?:eq\w*|tr|ess)|less\w*|gtr\w*|lll?|ggg?|"
    r"prec\w*|succ\w*|n?mid)(?![A-Za-z])|[<>]|!=|"
    + _symbols("LESS-THAN", "GREATER-THAN", "NOT EQUAL", "PRECEDES", "SUCCEEDS", "DIVIDES"))
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
    per_cent = bool(_PER_CENT.search(answer)) and not _PER_CENT.search(gold)
    return bool(words or marks or relation or per_cent)


_BASE = re.compile(r"(?<![A-Za-z0-9_\\])[0-9][0-9A-Za-z]*\}?_\{?\s*([0-9]+)\s*\}?")
"""A number written in a base, its digits from a digit on: ``52_8``, ``2516_{10}``, ``1011}_2``; the group is the base."""


def bases(text: str) -> set[int]:
    """The bases ``text`` writes its numbers in as subscripts (:data:`_BASE`); empty: none."""
    return {int(b) for b in _BASE.findall(text)}


def another_base(answer: str, gold: str) -> bool:
    """Whether ``answer`` writes a number in a base the gold does not (base 10 where the gold gives
    none): ``52_9`` for ``52_8``, ``2516_{10}`` for ``2516_8``. math-verify drops the subscript and
    reads both as 52; the digits of two bases are two numbers."""
    written = bases(answer)
    return bool(written) and written != (bases(gold) or {10})


_DIGITS_APART = re.compile(r"[0-9]\s+[0-9]")
_CHOICE = re.compile(r"(?<![A-Za-z\\])\(\s*[A-E]\s*\)")  # a choice's letter, (C); not f(A) or \det(A)
_HIDDEN = re.compile(r"\\[hv]?phantom\s*\{[^{}]*[0-9]")  # a number kept invisible: \phantom{0} 5


def names_choice(gold: str) -> bool:
    """Whether ``gold`` names a choice of a multiple-choice question: ``C``, ``(C)``,
    ``\\text{(C)}``, or a choice's letter among other text."""
    return bool(_CHOICE.search(gold)) or re.fullmatch(r"[A-E]", re.sub(r"\\(?:text|mathrm)|[{}()$\s]", "", gold)) is not None


def refused(answer: str, gold: str) -> str | None:
    """Why ``answer`` is wrong whatever math-verify would say, or None: it is implausible
    (:func:`implausible`), restates a computation (:func:`restated`) where the gold does not,
    hedges (:func:`hedged`), writes a number in another base (:func:`another_base`), gives a
    list (``\\boxed{5.4}, \\boxed{5.5}``) where the gold is one value (:func:`is_list`), writes
    numbers apart with only a space between them (``1 8``, which math-verify reads as 9), hides a
    number (``\\phantom{0} 5``, read as 0 + 5), or names a choice's letter where the gold names none
    (``(3,4] \\text{ (C)}``: math-verify drops it). These
    are podsrl's deliberate differences from math-verify: each only ever withholds a reward."""
    if why := implausible(answer, gold):
        return why
    if restated(answer) and not restated(gold):
        return "restated computation"
    if hedged(answer, gold):
        return "hedge"
    if another_base(answer, gold):
        return "another base"
    if is_list(answer, spaced_separators=True) and not is_list(gold):
        return "a list for one value"
    if _DIGITS_APART.search(answer) and not _DIGITS_APART.search(gold):
        return "numbers written apart"  # "1 8" (math-verify reads 9), "20 16"
    if _HIDDEN.search(answer) and not _HIDDEN.search(gold):
        return "a hidden number"  # math-verify reads \phantom{0} 5 as 0 + 5
    if _CHOICE.search(answer) and not names_choice(gold):
        return "a choice's letter beside the answer"  # a second candidate: the choice (C)
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


def fast_match(completion: str, gold: str, require_marker: bool = False, question: str | None = None,
               truncated: bool = False) -> bool | None:
    """True/False when decided without math-verify; None when math-verify must decide."""
    return compare_fast(extract_answer(completion, require_marker, question, truncated), gold, question)


def compare_fast(answer: str | None, gold: str, question: str | None = None) -> bool | None:
    """Whether the extracted ``answer`` equals ``gold`` (a percentage read once, as
    :func:`in_units` says, from the ``question``), where decided in-process; None where
    math-verify must decide (:func:`compare`)."""
    if unusable_gold(gold):
        return False
    gold = gold_answer(gold)
    if answer is None or not answer.strip():
        return False
    if (ch := lookalike(answer)) is not None and ch not in gold:
        return False  # read as what it is, a number it looks like, never
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
    if asks_percent(question):  # a bare number in percent, as the gold
        g, p = g._replace(percent=True), p._replace(percent=True)
    return numbers_equal(g, p)


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


_DIGIT_RUN = re.compile(r"[0-9]+")
# What math-verify leaves out by design: a unit's power (``\text{ cm}^2``) and a base (``52_8``,
# judged by :func:`another_base`).
_UNREAD_BY_DESIGN = re.compile(r"(?<=\})\s*\^\s*\{?\s*[0-9]\s*\}?|_\s*\{?\s*[0-9]+\s*\}?")


@lru_cache(maxsize=1024)
def unread_number(expression: str) -> str | None:
    """The first run of digits in ``expression`` that math-verify's reading of it leaves out, or
    None where every number counts: changed twice (its last digit plus 1, plus 2), it leaves the
    reading the same. math-verify reads one value out of some expressions that write two
    (``3 \\lor 5`` and ``\\cancel{3} 5`` read 5, ``3 \\text{ (}5\\text{)}`` reads 3): an answer that
    says more than the value it is paid for is a hedge. A unit's power and a base are left aside.
    Where every run stands in the reading as written (:func:`_numbers_in`), none is changed."""
    expression = _UNREAD_BY_DESIGN.sub("", expression)
    reading = _parse(expression)
    if not reading:
        return None
    written = _numbers_in(reading[0])
    runs = Counter(run.lstrip("0") or "0" for run in _DIGIT_RUN.findall(expression))
    if written is not None and not runs - written:
        return None  # each number stands in the reading as written, once for each time it is written
    for m in _DIGIT_RUN.finditer(expression):
        run = m.group()
        variants = [run[:-1] + str((int(run[-1]) + k) % 10) for k in (1, 2)]
        readings = [_parse(expression[: m.start()] + v + expression[m.end() :]) for v in variants]
        if all(r and str(r[0]) == str(reading[0]) for r in readings):
            return run
    return None


def _numbers_in(expr) -> Counter | None:
    """The numbers a reading holds as written, each as often as it stands there: an integer, a
    fraction's numerator and denominator. Not the numbers sympy writes itself, which no answer
    wrote: the -1 of a negation or a division, the 1 of a coefficient ``1/8`` (``\\frac{\\pi}{8}``),
    a root's exponent, a matrix's shape, an integer's denominator. None where the reading holds a
    decimal or is no expression: then only a change tells."""
    from sympy import Basic, Float, Mul, Pow, Rational
    from sympy.matrices import MatrixBase

    found: Counter = Counter()

    def count(e) -> bool:
        if isinstance(e, MatrixBase):
            return all(count(x) for x in e)
        if isinstance(e, Float) or not isinstance(e, Basic):
            return False
        if isinstance(e, Rational):
            found.update([str(abs(e.p))] + ([str(e.q)] if e.q != 1 else []))
            return True
        if isinstance(e, Mul):
            others = [a for a in e.args if a != -1]  # a negation's sign
            for a in others:
                if isinstance(a, Rational) and abs(a.p) == 1 and a.q != 1 and len(others) > 1:
                    found[str(a.q)] += 1  # pi/8 is (1/8)*pi: its 1 is sympy's
                elif not count(a):
                    return False
            return True
        if isinstance(e, Pow):
            root_or_division = e.exp == -1 or (isinstance(e.exp, Rational) and e.exp.q != 1)
            return count(e.base) and (root_or_division or count(e.exp))
        return all(count(a) for a in e.args)

    return found if count(expr) else None


def false_equation(answer: str) -> bool:
    """Whether ``answer`` equates two different things (``3 = 5``, ``x = 3 = 5``, ``3 \\equiv 5``,
    ``15x - 81 = 15x - 80``), which math-verify reads as its right-hand side: two plain numbers of
    different values, or, in math-verify's reading, an equation whose left side is not a lone
    variable (``x = 6`` defines) and whose sides differ (``409 + 83 = 492`` does not)."""
    sides = [as_number(side.strip().strip("$").strip()) for side in re.split(r"=|\\equiv(?![A-Za-z])", answer)]
    if len({n.value / 100 if n.percent else n.value for n in sides if n is not None}) > 1:
        return True
    if "=" not in answer and "\\equiv" not in answer:
        return False
    from sympy import Basic, preorder_traversal

    return any(_unequal_sides(node) for expr in _parse(answer) if isinstance(expr, Basic)
               for node in preorder_traversal(expr))  # an equation in a list too: {-2, Eq(sqrt(3)/3, 1)}


def _unequal_sides(expr) -> bool:
    """Whether ``expr`` is an equation, its left side no lone variable or function, whose sides
    are not identically equal (a matrix and a number never are)."""
    from sympy import Eq, MatrixBase, Symbol, expand
    from sympy.core.function import AppliedUndef

    if not isinstance(expr, Eq) or isinstance(expr.lhs, (Symbol, AppliedUndef)):
        return False
    if isinstance(expr.lhs, MatrixBase) != isinstance(expr.rhs, MatrixBase):
        return True  # a matrix and a number are not equal (15 = [-2, -14, -7])
    try:
        difference = expr.lhs - expr.rhs
        parts = list(difference) if isinstance(difference, MatrixBase) else [difference]
        return any(expand(part) != 0 for part in parts)
    except (TypeError, ValueError, AttributeError):
        return False


def _written(text: str) -> str:
    """``text`` as written, for an equality of texts: without ``$`` around it, a final period, or
    white space but between two digits (``1 8`` is not ``18``)."""
    return re.sub(r"(?<![0-9])\s+|\s+(?![0-9])", "", text.strip().strip("$")).removesuffix(".")


def _verified(gold: str, answer: str) -> bool:
    """math-verify's verdict on the whole answer, where what it states is a result, every number
    it writes counts (:func:`unread_number`, unless the gold's reading too leaves one of its
    numbers out) and it equates no two different numbers (:func:`false_equation`)."""
    from math_verify import verify

    if _written(answer) == _written(gold):
        return True
    g, p = _parse(gold), _parse(answer)
    if not g or not p:
        return False
    if not any(map(unevaluated_arithmetic, g)) and any(map(unevaluated_arithmetic, _parse(stated_result(answer)))):
        return False  # the stated result is a computation (a gold "2 + 3" keeps math-verify's rule)
    if false_equation(answer) and not false_equation(gold):
        return False
    if not verify(g, p, timeout_seconds=None):
        return False
    return unread_number(answer) is None or unread_number(gold) is not None


def verify_answer(completion: str, gold: str, require_marker: bool = False, question: str | None = None,
                  truncated: bool = False) -> bool:
    """Whether the final answer of ``completion`` equals ``gold`` (slow; unbounded: call it
    through the reward pool)."""
    return compare(extract_answer(completion, require_marker, question, truncated), gold, question)


def compare(answer: str | None, gold: str, question: str | None = None) -> bool:
    """Whether the extracted ``answer`` equals ``gold``: :func:`compare_fast` where it decides,
    else math-verify on the whole answer, percentages in the units :func:`in_units` gives."""
    decided = compare_fast(answer, gold, question)
    if decided is not None:
        return decided
    answer, gold = in_units(answer, gold_answer(gold), question)
    return _verified(gold, answer)
