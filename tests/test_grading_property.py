"""A property of the accuracy reward that can fail: podsrl pays a completion only where math-verify,
given the same answer, also pays.

The answers are generated (integers, decimals, fractions, roots, powers, units, hedges, lists and
tuples, codes of letters and digits, merged digits, chained and restated computations) from the
gold's own numbers, so that near misses are common, and written in the ways a model marks an answer
(``\\boxed{}``, ``$...$``, ``\\(...\\)``, an answer line, answer tags, ``####``, or bare). math-verify
is then given the answer itself, wrapped as ``$...$`` and as ``\\boxed{...}`` (paying where either
pays), so that the deliberate differences do not count against podsrl: it reads answer tags and
``####``, which math-verify does not, and it is stricter on a restated computation (``409 + 83`` is
not an answer to 492), which the property allows, since it only bounds podsrl from above.
"""

from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from math_verify import parse, verify

from podsrl.rewards import accuracy_reward, answer_matches

PROFILE = settings(max_examples=300, derandomize=True, deadline=None, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


pytestmark = pytest.mark.usefixtures("unhurried_pool")  # grades, not the pool's bound (conftest)


def math_verify_pays(gold: str, answer: str) -> bool:
    """math-verify's verdict on the answer alone: as inline maths or boxed, either paying."""
    golds = parse(f"${gold}$")
    return any(verify(golds, parse(wrapped)) for wrapped in (f"${answer}$", f"\\boxed{{{answer}}}"))


# --------------------------------------------------------------------------- golds and answers

small = st.integers(min_value=0, max_value=30)
numbers = st.one_of(small, st.integers(min_value=-99, max_value=1_500_000))


@st.composite
def golds(draw) -> tuple[str, list[int]]:
    """A gold answer and the integers it is made of (which the answers reuse)."""
    kind = draw(st.sampled_from(["int", "int", "decimal", "frac", "sqrt", "list", "tuple", "power"]))
    a, b = draw(numbers), draw(st.integers(min_value=1, max_value=12))
    if kind == "int":
        return str(a), [a]
    if kind == "decimal":
        return f"{a}.{b}", [a, b]
    if kind == "frac":
        return rf"\frac{{{a}}}{{{b + 1}}}", [a, b + 1]
    if kind == "sqrt":
        return rf"{b}\sqrt{{{draw(st.sampled_from([2, 3, 5, 7]))}}}", [b]
    if kind == "power":
        return str(b**2), [b, 2]
    items = draw(st.lists(small, min_size=2, max_size=3))
    text = ", ".join(map(str, items))
    return (text if kind == "list" else f"({text})"), items


UNITS = [r" \text{ units}", r"\text{ cm}", " apples", r" \mbox{ m}"]
LETTERS = ["AB", "X", "AZYUK", "Q"]


@st.composite
def answers(draw, parts: list[int]) -> str:
    """An answer built from the gold's integers and a few others: right, near, or tempting."""
    pick = lambda: draw(st.one_of(st.sampled_from(parts), small, st.sampled_from([p + 1 for p in parts] + [-p for p in parts])))
    x, y, z = pick(), pick(), pick()
    kind = draw(st.sampled_from([
        "int", "decimal", "frac", "slash", "sqrt", "power", "unit", "hedge", "text_hedge", "list", "tuple",
        "code", "merged", "thousands", "chain", "restated", "negated", "not"]))
    if kind == "int":
        return str(x)
    if kind == "decimal":
        return f"{x}.{abs(y)}"
    if kind == "frac":
        return rf"\frac{{{x}}}{{{abs(y) or 1}}}"
    if kind == "slash":
        return f"{x}/{abs(y) or 1}"
    if kind == "sqrt":
        return rf"{abs(x) or ''}\sqrt{{{abs(y)}}}"
    if kind == "power":
        return f"{x}^{{{abs(y) % 4}}}"
    if kind == "unit":
        inner = draw(st.sampled_from([str(x), rf"\sqrt{{{abs(x)}}}", rf"\frac{{1}}{{{abs(x) or 1}}}", f"{x}^{{2}}"]))
        return inner + draw(st.sampled_from(UNITS))
    if kind == "hedge":
        return f"{x} or {y}"
    if kind == "text_hedge":
        return rf"{x} \text{{ or }} {y}"
    if kind == "list":
        return ", ".join(map(str, [x, y, z][: draw(st.integers(2, 3))]))
    if kind == "tuple":
        return f"({x}, {y})"
    if kind == "code":
        return draw(st.sampled_from(LETTERS)) + str(abs(x)) + draw(st.sampled_from(["", "A", "cd"]))
    if kind == "merged":
        return f"{abs(x)},{abs(y)}"
    if kind == "thousands":
        return f"{abs(x)},{abs(y):03d}"
    if kind == "chain":
        return f"x = {x}+{y} = {x + y}"
    if kind == "restated":
        return f"{x} + {y}"
    if kind == "negated":
        return f"-{x}"
    return rf"\text{{not }} {x}"


PLAIN = r"-?\d+(\.\d+)?"

WRAPPERS = {
    "boxed": lambda a: f"So the result is $\\boxed{{{a}}}$.",
    "inline": lambda a: f"The final answer is ${a}$.",
    "paren": lambda a: f"Therefore the answer is \\({a}\\).",
    "answer_is": lambda a: f"The answer is {a}.",
    "answer_line": lambda a: f"Some work first.\nAnswer: {a}",
    "tags": lambda a: f"<think>Some work first.</think> <answer>{a}</answer>",
    "hashes": lambda a: f"Some work first.\n#### {a}",
    "bare": lambda a: a,
}


@st.composite
def cases(draw) -> tuple[str, str, str]:
    gold, parts = draw(golds())
    answer = draw(answers(parts))
    wrapper = draw(st.sampled_from(sorted(WRAPPERS)))
    if wrapper == "bare":  # unmarked: the last number read off the text is the answer, for a plain number only
        answer = str(draw(st.sampled_from(parts)) + draw(st.sampled_from([0, 1, -1])))
    return gold, answer, WRAPPERS[wrapper](answer)


@PROFILE
@given(cases())
def test_podsrl_pays_only_where_math_verify_pays(case):
    gold, answer, completion = case
    if answer_matches(completion, gold):
        assert math_verify_pays(gold, answer), f"paid {completion!r} for {gold!r}; math-verify rejects {answer!r}"


# --------------------------------------------------------------------------- right answers


@st.composite
def right_answers(draw) -> tuple[str, str]:
    """A gold and an equal answer written another way (a fraction as a decimal, sqrt forms, ...)."""
    kind = draw(st.sampled_from(["int", "thousands", "frac", "decimal", "sqrt", "list", "chain", "unit"]))
    a, b = draw(numbers), draw(st.integers(min_value=1, max_value=9))
    if kind == "int":
        return str(a), str(a)
    if kind == "thousands":
        n = draw(st.integers(min_value=1000, max_value=9_999_999))
        return str(n), f"{n:,}"
    if kind == "frac":
        value = Fraction(a, 2**b)  # a finite decimal: written exactly both ways
        return rf"\frac{{{value.numerator}}}{{{value.denominator}}}", str(float(value))
    if kind == "decimal":
        return f"{a}.5", rf"\frac{{{2 * a + (1 if a >= 0 else -1)}}}{{2}}" if a >= 0 else f"{a}.50"
    if kind == "sqrt":
        return rf"\sqrt{{{b * b * 5}}}", rf"{b}\sqrt{{5}}"
    if kind == "list":
        items = ", ".join(map(str, draw(st.lists(small, min_size=2, max_size=3))))
        return items, items
    if kind == "chain":
        return str(a + b), f"{a} + {b} = {a + b}"
    return str(a), rf"{a} \text{{ units}}"


@PROFILE
@given(right_answers(), st.sampled_from(sorted(set(WRAPPERS) - {"bare"})))
def test_a_right_answer_is_paid_in_every_marked_style(pair, wrapper):
    gold, answer = pair
    assert math_verify_pays(gold, answer), f"the generator's pair is not equal: {answer!r} for {gold!r}"
    completion = WRAPPERS[wrapper](answer)
    assert answer_matches(completion, gold), f"not paid: {completion!r} for {gold!r}"


# --------------------------------------------------------------------------- one final answer

FAST = settings(max_examples=150, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
values = st.integers(min_value=-999, max_value=9999)
BETWEEN = ["", " ", ". Hmm, or ", ". Wait, maybe ", "\n\nFinal answer: ", " or "]


@FAST
@given(values, values, st.sampled_from(BETWEEN), st.booleans())
def test_two_boxes_with_distinct_values_pay_nothing_whichever_holds_the_gold(a, b, between, gold_first):
    if a == b:
        return
    completion = rf"\boxed{{{a}}}{between}\boxed{{{b}}}"
    gold = str(a if gold_first else b)
    assert accuracy_reward([completion], [gold]) == [0.0], completion


# What may join two values inside one answer: logic, relations, arrows, line breaks, text, markup
# that hides one of them. Each writes two candidates, whatever one math-verify would read out.
JOINERS = [r"{a} \lor {b}", r"{a} \vee {b}", r"{a} | {b}", r"{a} \mid {b}", r"{a} \\ {b}", r"{a} = {b}",
           r"{a} \equiv {b}", r"{a} \text{{, }} {b}", r"\cancel{{{a}}} {b}", r"\color{{white}}{{{a}}} {b}",
           r"\hbox{{{a}}} {b}", r"{a}\ \&\ {b}", r"{a} \to {b}", r"{a} \Rightarrow {b}", r"{a} \iff {b}",
           r"{a} \text{{ ({b})}}", r"{a} \text{{ [{b}]}}", r"{a} \text{{ / {b}}}", r"{a}\\{b}", r"{a} {b}",
           r"{a} \text{{ or }} {b}", r"{a} \text{{ maybe }} {b}", r"{a} \approx {b}", r"{a} \lesssim {b}",
           r"{a}, {b}", r"{a}; {b}", r"\{{{a}, {b}\}}", r"{a} \text{{ to }} {b}", r"\phantom{{{a}}} {b}"]


@FAST
@given(st.integers(min_value=0, max_value=999), st.integers(min_value=0, max_value=999), st.sampled_from(JOINERS),
       st.sampled_from([lambda a: rf"\boxed{{{a}}}", lambda a: f"The final answer is ${a}$.", lambda a: f"<answer>{a}</answer>"]))
def test_two_values_joined_in_one_answer_are_paid_under_neither(a, b, joiner, wrapper):
    """An answer writing two different values, joined in any of these ways, is paid for neither:
    whichever one math-verify reads out of it, the answer did not commit to it."""
    if a == b:
        return
    completion = wrapper(joiner.format(a=a, b=b))
    assert accuracy_reward([completion, completion], [str(a), str(b)]) == [0.0, 0.0], completion


# A value of some form, and a second number that repeats one of its digits or is one sympy writes
# itself (an integer's denominator 1, the 1 of pi/2): such a number can stand in the reading of the
# first without being read from where the answer writes it.
FORMS = st.one_of(
    st.integers(min_value=0, max_value=99).map(str),
    st.tuples(st.integers(1, 9), st.integers(2, 9)).filter(lambda f: f[0] % f[1]).map(lambda f: rf"\frac{{{f[0]}}}{{{f[1]}}}"),
    st.tuples(st.integers(0, 9), st.integers(10, 19)).map(lambda f: f"({f[0]},{f[1]}]"),
    st.tuples(st.integers(0, 9), st.integers(2, 9)).map(lambda f: rf"\left( {f[0]}, \frac{{\pi}}{{{f[1]}}} \right)"),
    st.tuples(st.integers(2, 9), st.integers(2, 9)).map(lambda f: f"{f[0]}r^{f[1]}"),
)
ASIDES = [r"{a} \lor {b}", r"\cancel{{{b}}} {a}", r"{a} \text{{ ({b})}}", r"{a} \text{{ [{b}]}}", r"\phantom{{{b}}} {a}"]


@FAST
@given(FORMS, st.data(), st.sampled_from(ASIDES))
def test_a_second_number_beside_a_value_is_not_paid_as_the_value(a, data, aside):
    """An answer writing a value and, beside it, a number math-verify reads no part of (a digit the
    value writes too, or 1) is not paid for the value: the number is a second candidate."""
    b = data.draw(st.sampled_from(sorted({"0", "1", *(c for c in a if c.isdigit())})))
    if a == b:
        return
    completion = rf"\boxed{{{aside.format(a=a, b=b)}}}"
    assert accuracy_reward([completion], [a]) == [0.0], completion


LOOKALIKES = {  # an ASCII digit's look-alikes: other scripts' digits and the fullwidth form
    d: [chr(0xFF10 + d), chr(0x0660 + d), chr(0x0966 + d), chr(0x1D7CE + d)] for d in range(10)}
INSERTED = ["\u200b", "\u200c", "\u2060", "\u00b2", "\u00b3", "\u00bd", "\u00b9"]


@FAST
@given(st.integers(min_value=10, max_value=99_999), st.data())
def test_lookalike_characters_never_make_a_wrong_answer_right(value, data):
    """A number written with other scripts' digits, a superscript, a vulgar fraction or a
    zero-width character inside or beside it is never paid as the ASCII number it resembles, nor as
    the number left when the look-alike is dropped."""
    digits = [int(c) for c in str(value)]
    i = data.draw(st.integers(min_value=0, max_value=len(digits) - 1))
    if data.draw(st.booleans()):
        written = "".join(data.draw(st.sampled_from(LOOKALIKES[d])) if j == i else str(d) for j, d in enumerate(digits))
        golds = [str(value)]
    else:
        mark = data.draw(st.sampled_from(INSERTED))
        written = str(value)[:i + 1] + mark + str(value)[i + 1:]
        golds = [str(value), str(value)[:i + 1], str(value)[i + 1:] or "0"]
    wrapper = data.draw(st.sampled_from([lambda a: rf"\boxed{{{a}}}", lambda a: f"The answer is {a}.", lambda a: a,
                                         lambda a: f"<answer>{a}</answer>", lambda a: f"So the total is {a}"]))
    completion = wrapper(written)
    for gold in golds:
        assert accuracy_reward([completion], [gold]) == [0.0], (completion, gold)


@FAST
@given(st.integers(min_value=0, max_value=99_999), st.sampled_from(["$", "\\$", "\u20ac", "\u00a3"]),
       st.sampled_from(INSERTED[:3]), st.booleans())
def test_a_format_character_behind_a_currency_sign_is_beside_the_number(value, sign, mark, outside):
    """An unmarked number with a zero-width character on the far side of its currency sign is
    refused as one touching it is; the same completion without the character is paid."""
    clean = f"So the total is {sign}{value}"
    marked = f"So the total is {mark}{sign}{value}" if outside else f"So the total is {sign}{mark}{value}"
    assert accuracy_reward([clean], [str(value)]) == [1.0], clean
    assert accuracy_reward([marked], [str(value)]) == [0.0], marked


TAILS = [" Or maybe {y}.", " It is not {y}.", "\n```\nprint({y})\n```", r" (Not \boxed{{{y}}}.)", " Some would say {y}.",
         " {y}", " {y} or more", r" Or \boxed{{{y}}}", " Others get {y}, but not me.", "\nAnswer: {y} or so"]


@FAST
@given(values, values, st.sampled_from(TAILS), st.sampled_from(["box", "tag", "hashes"]))
def test_text_after_a_committed_answer_never_pays_another(x, y, tail, mark):
    """A completion committed to x (a box, a tag, ####), with text appended that mentions y, is
    never paid for a gold y != x: appended text cannot turn a committed answer into another."""
    if x == y:
        return
    committed = {"box": rf"The answer is $\boxed{{{x}}}$.", "tag": f"<answer>{x}</answer>", "hashes": f"#### {x}\n"}[mark]
    completion = committed + tail.format(y=y)
    assert accuracy_reward([completion], [str(y)]) == [0.0], completion


WORDS = ["so", "then", "we", "add", "get", "the", "total", "of", "is", "=", "+", "-", "apples", "and", "left", "step"]


@FAST
@given(st.lists(st.one_of(st.sampled_from(WORDS), values.map(str)), min_size=1, max_size=12), values)
def test_a_truncated_completion_is_never_paid_through_an_unmarked_number(tokens, last):
    """Cut at the length limit, an unmarked completion is no answer, whatever its last number;
    the same text not cut is paid where its last number states the gold."""
    completion = " ".join(tokens + [str(last)])
    assert accuracy_reward([completion], [str(last)], truncated=[True]) == [0.0], completion
    cut = f"The answer is {last}"  # an answer line at the cut: it might have gone on (1 -> 12)
    assert accuracy_reward([cut], [str(last)], truncated=[True]) == [0.0]
    assert accuracy_reward([cut + ".\n"], [str(last)], truncated=[True]) == [1.0]
