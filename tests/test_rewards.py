"""Answer extraction and checking, the fast numeric path against math-verify, reward functions."""

import json
import random
from fractions import Fraction

import pytest
import torch

from conftest import REPO, SHARED_DATA
from podsrl.errors import PodsError
from podsrl.rewards import REWARDS, accuracy_reward, answer_matches, extract_answer, load_reward
from podsrl.rewards.answers import as_number, fast_match, gold_answer, implausible, verify_answer


pytestmark = pytest.mark.usefixtures("unhurried_pool")  # grades, not the pool's bound (conftest)


@pytest.mark.parametrize(
    "completion,gold,expected",
    [
        ("The answer is 42.", "42", True),
        ("so x = \\boxed{\\frac{1}{2}}", "0.5", True),
        ("<think>2+2</think> <answer>4</answer>", "4", True),
        ("<think>...</think><answer>\\boxed{3\\sqrt{2}}</answer>", "3\\sqrt{2}", True),
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72", True),
        ("Answer: 1,000 apples", "1000", True),
        ("12 then 15", "15", True),
        ("12 then 15", "12", False),
        ("The answer is 41.", "42", False),
        ("no number here", "3", False),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
        ("7 * 8 = -56, so the answer is -56", "-56", True),
        ("The answer is 56", "#### 56", True),
        ("It costs $18.", "18", True),
        ("so -3/4 of it", "-0.75", True),  # a fraction is one number, not "-3" and "4"
        ("The answer is -$3.", "-3", True),  # math-verify cannot read "-$3"; the fast path can
        ("The answer is 45%.", "0.45", True),
        ("The answer is 45%.", "45", False),  # 0.45: a percentage is read once (a question asking for one: 45)
        ("The answer is 0.333333.", "1/3", True),  # math-verify's 6-decimal rule for decimals
        ("The answer is 3.0000001.", "3", False),
        ("\\boxed{-\\frac{6942736}{8}}", "8", False),  # not the last number of a LaTeX answer
    ],
)
def test_answer_matches(completion, gold, expected):
    assert answer_matches(completion, gold) is expected


# completions the embedded model wrote while GRPO trained it on three-digit "a + b =" problems
# with math-verify's verdict alone: each restates the question and was paid 1.0
_RESTATEMENTS = [
    ("To find the final answer, 409 + 83 = ", "492"),
    ("To calculate the final answer, subtract 409 + 83 from", "492"),
    ("Let's correct the previous answer: 904 + 210", "1114"),
    ("The answer is 47 - 25", "22"),
    ("\\boxed{3 \\times 4}", "12"),
    ("The answer is 1.5 + 2", "3.5"),
    ("\\boxed{-2 \\cdot 3}", "-6"),
]


@pytest.mark.parametrize("completion,gold", _RESTATEMENTS)
def test_a_restated_computation_is_not_an_answer(completion, gold):
    from math_verify import parse, verify

    from podsrl.rewards.answers import extract_answer

    # math-verify evaluates the restatement and counts it equal to the gold ...
    assert verify(parse(f"${gold}$"), parse(f"${extract_answer(completion)}$"))
    # ... the accuracy reward does not: the result has to be stated
    assert accuracy_reward([completion], [gold]) == [0.0]
    assert verify_answer(completion, gold) is False


@pytest.mark.parametrize(
    "completion,gold",
    [
        ("The answer is 409 + 83 = 492", "492"),  # the computation and its result
        ("The answer is 22, since 47 - 25 = 22", "22"),
        ("\\boxed{2\\sqrt{5}}", "\\sqrt{20}"),  # a number times a root is a simplified answer
        ("\\boxed{-\\sqrt{2}}", "-\\sqrt{2}"),  # -x is a number, not arithmetic
        ("\\boxed{-\\frac{6}{8}}", "-0.75"),
        ("\\boxed{10^3}", "1000"),
        ("\\boxed{50\\%}", "0.5"),
        ("\\boxed{1+\\sqrt{2}}", "\\sqrt{2}+1"),
        ("\\boxed{\\frac{3\\pi}{2}}", "\\frac{3}{2}\\pi"),
        ("\\boxed{5 + 1}", "2 + 4"),  # a gold that is itself unevaluated keeps math-verify's rule
    ],
)
def test_stated_results_and_simplified_forms_still_count(completion, gold):
    assert accuracy_reward([completion], [gold]) == [1.0]


def test_extract_answer_priority():
    assert extract_answer("Answer: 3 but \\boxed{5}") == "5"
    assert extract_answer("<answer> 7 </answer> then 9") == "7"
    assert extract_answer("nothing") is None


@pytest.mark.parametrize("text,value,decimal,percent", [
    ("42", 42, False, False), ("-1,234.50", Fraction(-246900, 200), True, False), ("$12", 12, False, False),
    ("3/4", Fraction(3, 4), False, False), ("-\\frac{3}{4}", Fraction(-3, 4), False, False), ("45%", 45, False, True),
    ("12 apples", 12, False, False), (".5", Fraction(1, 2), True, False), ("5.", 5, False, False), ("+7", 7, False, False),
])
def test_plain_numbers(text, value, decimal, percent):
    n = as_number(text)
    assert n is not None and (n.value, n.decimal, n.percent) == (value, decimal, percent)


@pytest.mark.parametrize("text", ["3x", "1,2", "2^{10}", "\\sqrt{2}", "10!", "1e3", "3/0", "-5%", "1" * 80, "1.2345678901234567"])
def test_not_plain_numbers(text):
    assert as_number(text) is None  # math-verify decides these


def _write(value: Fraction, rng: random.Random) -> str:
    """One of the ways a model or a data set writes ``value``."""
    kind = rng.choice(["plain", "decimal", "fraction", "latex", "comma", "dollar", "unit", "plus"])
    sign, a = ("-" if value < 0 else ""), abs(value)
    if value.denominator == 1:
        i = int(a)
        k = rng.randint(1, 9)
        return sign + {
            "plain": str(i), "decimal": f"{i}.{'0' * rng.randint(1, 3)}", "fraction": f"{i * k}/{k}",
            "latex": f"\\frac{{{i * k}}}{{{k}}}", "comma": f"{i:,}", "dollar": f"${i}" if not sign else str(i),
            "unit": f"{i} {rng.choice(['apples', 'dollars', 'cm', 'meters per second'])}", "plus": f"+{i}" if not sign else str(i),
        }[kind]
    if kind in ("decimal", "dollar"):
        places = rng.randint(1, 8)
        digits = str(round(a * 10**places)).rjust(places + 1, "0")
        return sign + ("$" if kind == "dollar" and not sign else "") + f"{digits[:-places]}.{digits[-places:]}"
    return sign + (f"\\frac{{{a.numerator}}}{{{a.denominator}}}" if kind == "latex" else f"{a.numerator}/{a.denominator}")


def _value(rng: random.Random) -> Fraction:
    kind = rng.random()
    if kind < 0.5:
        return Fraction(rng.randint(-10 ** rng.randint(1, 7), 10 ** rng.randint(1, 7)))
    if kind < 0.8:
        return Fraction(rng.randint(-999, 999), rng.randint(1, 64))
    return Fraction(rng.randint(-10**6, 10**6), 10 ** rng.randint(1, 4))


def test_fast_path_agrees_with_math_verify_on_random_numbers():
    """Random numbers, written in random ways; half the pairs equal in value, a quarter a hair
    apart (1e-1 .. 1e-8: math-verify's 6-place rounding decides), a quarter unrelated. Wherever
    the fast path decides, its verdict is math-verify's."""
    rng = random.Random(0)
    decided = agreed = 0
    for _ in range(2500):
        gold_value = _value(rng)
        pick = rng.random()
        pred_value = gold_value if pick < 0.5 else gold_value + Fraction(rng.choice([1, -1]), 10 ** rng.randint(1, 8)) \
            if pick < 0.75 else _value(rng)
        gold, pred = _write(gold_value, rng), _write(pred_value, rng)
        if gold[-1].isalpha():
            gold = gold.split()[0]  # units only on the model's side
        if rng.random() < 0.1 and not pred.startswith("-") and not pred[-1].isalpha():
            pred += "%"
        completion = f"The answer is {pred}."
        fast = fast_match(completion, gold)
        if fast is None:
            continue
        decided += 1
        agreed += fast == verify_answer(completion, gold)
    assert decided > 2200  # the fast path decides nearly all of them
    assert agreed == decided


_TRAILING = ["I hope it is correct.", "The problem has a complex formula with a", "since 12 + 34 = 46",
             "(rounded) apples", "We've already answered 7 of them", "so the total is {v}", "%"]


def test_fast_path_agrees_with_math_verify_on_answers_followed_by_text():
    """An answer line with a sentence after the answer ("The answer is 46. I hope it is correct.")
    is graded on its first sentence, so the fast path decides it both ways; where it decides, the
    verdicts agree with math-verify's on the same completion."""
    rng = random.Random(1)
    decided = agreed = true_pairs = 0
    for _ in range(300):
        gold_value = _value(rng)
        pred_value = gold_value if rng.random() < 0.5 else _value(rng)
        gold, pred = _write(gold_value, rng).split()[0], _write(pred_value, rng)
        tail = rng.choice(_TRAILING).format(v=_write(pred_value, rng).split()[0])
        completion = f"The answer is {pred}. {tail}" if tail != "%" else f"The answer is {pred}% of it"
        fast = fast_match(completion, gold)
        truth = verify_answer(completion, gold)
        true_pairs += truth
        if fast is None:
            continue
        decided += 1
        agreed += fast == truth
    assert agreed == decided
    assert decided > true_pairs / 2  # most correct answers no longer need math-verify
    assert fast_match("The answer is 46. I hope it is correct.", "46") is True
    assert fast_match("The answer is 45. I hope it is correct.", "46") is False


def _gsm8k_golds():
    rows = [json.loads(l) for l in (SHARED_DATA / "gsm8k" / "test.jsonl").read_text().splitlines()]
    return [r["answer"].rsplit("####", 1)[1].strip().replace(",", "") for r in rows]


@pytest.mark.skipif(not (SHARED_DATA / "gsm8k").exists(), reason="needs ../shared/data")
def test_gsm8k_gold_answers_match_themselves_in_every_format():
    golds = _gsm8k_golds()
    variants = [
        lambda g: f"So the total is {g}.", lambda g: f"#### {g}", lambda g: f"\\boxed{{{g}}}",
        lambda g: f"Answer: {int(g):,} dollars" if g.lstrip("-").isdigit() else f"Answer: {g} dollars",
        lambda g: f"The answer is ${g}." if not g.startswith("-") else f"The answer is {g}.",
        lambda g: f"<answer>{g}.00</answer>" if "." not in g else f"<answer>{g}</answer>",
    ]
    for make in variants:
        completions = [make(g) for g in golds]
        assert accuracy_reward(completions, golds) == [1.0] * len(golds)
        wrong = [str(Fraction(g) + 1) for g in golds]
        assert accuracy_reward(completions, wrong) == [0.0] * len(golds)


@pytest.mark.skipif(not (SHARED_DATA / "math500").exists(), reason="needs ../shared/data")
def test_math500_gold_answers_match_themselves_reformatted():
    golds = [json.loads(l)["answer"] for l in (SHARED_DATA / "math500" / "test.jsonl").read_text().splitlines()]
    respaced = lambda g: g.replace(",", ", ").replace("\\dfrac", "\\frac").replace("\\left", "").replace("\\right", "")
    for make in (lambda g: f"so \\boxed{{{g}}}", lambda g: f"The final answer is $\\boxed{{{respaced(g)}}}$."):
        assert accuracy_reward([make(g) for g in golds], golds) == [1.0] * len(golds)


def test_builtin_rewards_follow_trl_convention():
    comps = ["<think>a</think><answer>4</answer>", "4", "5"]
    assert REWARDS["accuracy"](completions=comps, answer=["4"] * 3) == [1.0, 1.0, 0.0]
    assert REWARDS["format"](completions=comps) == [1.0, 0.0, 0.0]
    assert REWARDS["number_only"](completions=comps) == [0.0, 1.0, 1.0]
    # conversational data sets: TRL passes each completion as a list of messages
    chat = [[{"role": "assistant", "content": c}] for c in comps]
    assert REWARDS["accuracy"](prompts=[[{"role": "user", "content": "2+2"}]] * 3, completions=chat,
                               completion_ids=[[1]] * 3, answer=["4"] * 3, trainer_state=None) == [1.0, 1.0, 0.0]
    assert REWARDS["format"](completions=chat) == [1.0, 0.0, 0.0]


def test_accuracy_reward_is_bounded_when_called_directly():
    """A completion on which math-verify stalls (a factorial of 10^21) scores 0; the rest count."""
    completions = ["Answer: 999999999999999999999!", "\\boxed{\\frac{\\sqrt{8}}{2}}", "7"]
    assert accuracy_reward(completions, ["3", "\\sqrt{2}", "7"]) == [0.0, 1.0, 1.0]


def test_load_reward_errors():
    with pytest.raises(PodsError, match="unknown reward"):
        load_reward("nope")
    with pytest.raises(PodsError, match="cannot import"):
        load_reward("nope_module:fn")


def test_evaluate_counts_stated_results_and_keeps_the_first_completions():
    """Held-out evaluation with an engine that answers fixed texts: a stated result counts, a
    restated question and a wrong result do not (2 of 4 correct), and ``keep`` returns the first
    completions with their verdicts."""
    from types import SimpleNamespace

    from podsrl.evaluate import evaluate
    from podsrl.tasks import Problem

    problems = [Problem("409 + 83 =", "492"), Problem("7 * 8 =", "56"), Problem("9 - 4 =", "5"), Problem("2 + 2 =", "4")]
    answers = {"409 + 83 =": "The answer is 492.", "7 * 8 =": "The answer is indeed 7 * 8",
               "9 - 4 =": "9 - 4 = 5", "2 + 2 =": "The answer is 5."}

    class Engine:
        def generate(self, prompts, n, temperature, max_new_tokens, **_):
            texts = [answers[p.strip()] for p in prompts]
            ids = torch.ones(len(texts), 1, dtype=torch.long)  # one token each: none cut at the limit
            return SimpleNamespace(texts=texts, completion_ids=ids, completion_mask=ids)

    result = evaluate(Engine(), SimpleNamespace(chat_template=None), problems, None, 16, keep=3)
    assert result.accuracy == 0.5
    assert [(s["question"], s["completion"], s["correct"]) for s in result.samples] == [
        ("409 + 83 =", "The answer is 492.", True), ("7 * 8 =", "The answer is indeed 7 * 8", False),
        ("9 - 4 =", "9 - 4 = 5", True)]
    assert evaluate(Engine(), SimpleNamespace(chat_template=None), problems, None, 16).samples == []


def test_evaluation_generates_shortest_prompts_first_each_with_its_own_seed():
    """evaluate hands the engine its prompts shortest first (a batch then pads to similar lengths),
    each with the seed it has in the problems' order (manual_seed(0), one draw a problem, as the
    engines draw them), whichever process evaluates it; completions, cuts at the length limit, verdicts and samples stay the
    problems' own."""
    from types import SimpleNamespace

    from podsrl.evaluate import evaluate
    from podsrl.tasks import Problem

    problems = [Problem("1000 + 2000 =", "3000"), Problem("1 + 1 =", "2"), Problem("30 + 40 =", "70")]
    answers = {"1000 + 2000 =": "The answer is 3000.", "1 + 1 =": "The answer is 3.", "30 + 40 =": "The answer is 70"}
    seen = []

    class Engine:
        def generate(self, prompts, n, temperature, max_new_tokens, seeds=None, **_):
            seen.append((prompts, seeds))
            # one token each, but 30 + 40's completion runs to the limit: cut there, it is not paid
            ids = [torch.ones(max_new_tokens if p.startswith("30") else 1, dtype=torch.long) for p in prompts]
            mask = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True)
            return SimpleNamespace(texts=[answers[p.strip()] for p in prompts], completion_ids=mask, completion_mask=mask)

    result = evaluate(Engine(), SimpleNamespace(chat_template=None), problems, None, 4, temperature=1.0, keep=3)
    torch.manual_seed(0)
    drawn = torch.randint(0, 2**62, (3,)).tolist()
    prompts, seeds = seen[0]
    assert [p.strip() for p in prompts] == ["1 + 1 =", "30 + 40 =", "1000 + 2000 ="]
    assert seeds == [drawn[1], drawn[2], drawn[0]]
    assert result.accuracy == pytest.approx(1 / 3)
    assert [(s["question"], s["completion"], s["correct"]) for s in result.samples] == [
        ("1000 + 2000 =", "The answer is 3000.", True), ("1 + 1 =", "The answer is 3.", False),
        ("30 + 40 =", "The answer is 70", False)]
    # the second of two processes takes problems 1, 3, ... and their seeds of the one-process draw
    second = SimpleNamespace(process_index=1, num_processes=2, device="cpu", reduce=lambda t, reduction: t)
    evaluate(Engine(), SimpleNamespace(chat_template=None), problems, None, 4, temperature=1.0, accelerator=second)
    assert [p.strip() for p in seen[1][0]] == ["1 + 1 ="] and seen[1][1] == [drawn[1]]


# --------------------------------------------------------------------------- implausible answers

_PATHOLOGICAL = [
    ("Let me think. Answer: 999999999999999999999!", "factorial"),
    ("\\boxed{(10!)!}", "factorial"),
    ("The total is \\boxed{10^{10^{10^{10}}}}", "huge power"),
    ("The answer is 2**3**4", "huge power"),
    ("\\boxed{(10^{10})^{10^{10}}}", "huge power"),
    ("\\boxed{10^{12345678}}", "huge power"),
    ("\\boxed{" + "(" * 40 + "1" + ")" * 40 + "}", "bracket depth"),
    ("\\boxed{" + "9" * 40 + "}", "digit run"),
    ("\\boxed{" + "+".join(["x^2"] * 300) + "}", "symbols"),
]


@pytest.mark.parametrize("completion,measure", _PATHOLOGICAL)
def test_an_implausible_answer_is_wrong_without_math_verify(completion, measure, monkeypatch):
    """Answers on which math-verify stalls (seconds to forever: a factorial of 10^21, a power
    tower, 40 nested brackets) are wrong at once, in-process: the fast path decides them and
    verify_answer does not reach math-verify."""
    from podsrl.rewards import answers

    assert implausible(extract_answer(completion), "3") == measure
    assert fast_match(completion, "3") is False

    def no_math_verify(*_):
        raise AssertionError("math-verify was called")

    monkeypatch.setattr(answers, "_verified", no_math_verify)
    assert verify_answer(completion, "3") is False


@pytest.mark.parametrize("completion,gold,expected", [
    ("\\boxed{5!}", "120", True),
    ("The answer is 12345!", "12345", False),
    ("\\boxed{\\frac{(n+1)!}{2}}", "\\frac{(n+1)!}{2}", True),
    ("\\boxed{e^{x^2}}", "e^{x^2}", True),
    ("\\boxed{x^{10^{10}}}", "x^{10000000000}", True),
    ("\\boxed{10^{100}}", "10^{100}", True),
    ("\\boxed{2^{10}}", "1024", True),
    ("\\boxed{10,\\!080}", "10080", True),
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("Great!! The answer is 42", "42", True),
    ("\\boxed{" + "9" * 30 + "}", "9" * 30, True),
    ("\\boxed{" + "(" * 8 + "1" + ")" * 8 + "}", "1", True),
    ("\\boxed{10^{10^{10}}}", "10^{10^{10}}", True),  # as far as its gold goes: never rejected
])
def test_sensible_answers_are_not_rejected(completion, gold, expected):
    """Near the limits but within them: math-verify decides (unbounded here, as some take a while)."""
    assert implausible(extract_answer(completion), gold) is None
    assert verify_answer(completion, gold) is expected


def _variants(gold: str) -> list[str]:
    """Completions stating ``gold`` as models and data sets write it."""
    forms = [gold, f"\\boxed{{{gold}}}", f"The answer is {gold}.", f"${gold}$", f"The final answer is $\\boxed{{{gold}}}$.",
             f"<answer>{gold}</answer>", f"#### {gold}"]
    if gold.lstrip("-").isdigit():
        forms += [f"The answer is {int(gold):,}.", f"\\boxed{{{int(gold):,}}}"]
    return forms


def _every_gold() -> list[str]:
    golds = []
    for name in ("gsm8k/train.jsonl", "gsm8k/test.jsonl"):
        golds += [gold_answer(json.loads(l)["answer"]) for l in (SHARED_DATA / name).read_text().splitlines()]
    return golds + [json.loads(l)["answer"] for l in (SHARED_DATA / "math500" / "test.jsonl").read_text().splitlines()]


@pytest.mark.skipif(not (SHARED_DATA / "gsm8k").exists() or not (SHARED_DATA / "math500").exists(),
                    reason="needs ../shared/data")
def test_the_rule_changes_no_grade_on_the_gold_answers(monkeypatch):
    """Every gold answer of GSM8K (train and test) and MATH-500, stated in each of the forms of
    ``_variants``, against itself and against another gold: verify_answer with the rule differs
    from verify_answer without it only where the rule fires, and it fires on none of them. The
    verdicts with and without the rule are also compared outright on every 16th pair."""
    from podsrl.rewards import answers

    golds = _every_gold()
    assert len(golds) == 9292
    pairs = [(form, gold, other) for gold, other in zip(golds, golds[1:] + golds[:1]) for form in _variants(gold)]
    assert not [(c, g) for c, g, _ in pairs if (a := extract_answer(c)) is not None and implausible(a, gold_answer(g))]
    sample = [p for i, p in enumerate(pairs) if i % 16 == 0]
    with_rule = [(verify_answer(c, g), verify_answer(c, o)) for c, g, o in sample]
    monkeypatch.setattr(answers, "implausible", lambda answer, gold: None)
    assert with_rule == [(verify_answer(c, g), verify_answer(c, o)) for c, g, o in sample]
    assert sum(same for same, _ in with_rule) > 0.95 * len(sample)  # the forms are read as their gold


@pytest.mark.skipif(not (SHARED_DATA / "gsm8k").exists(), reason="needs ../shared/data")
def test_the_scoring_benchmark_pathological_completions_never_reach_the_pool():
    """benchmarks/scoring.py's batches: the rule fires on no non-pathological completion, and the
    pathological ones are all decided in-process (the fast path), so none costs a worker its bound."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("scoring_benchmark", REPO / "benchmarks" / "scoring.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = [json.loads(l) for l in (SHARED_DATA / "gsm8k" / "test.jsonl").read_text().splitlines()[:16]]
    qa = [(r["question"], r["answer"].rsplit("####", 1)[1].strip().replace(",", "")) for r in rows]
    bad_seen = 0
    for seed, fraction, tails in ((0, 0.0, False), (1, 0.05, False), (2, 0.0, True)):
        texts, golds, bad = bench.completions_for(qa, 64, random.Random(seed), fraction, tails)
        for text, gold, is_bad in zip(texts, golds, bad):
            if is_bad:
                bad_seen += 1
                assert fast_match(text, gold) is False
            elif (answer := extract_answer(text)) is not None:
                assert implausible(answer, gold) is None
    assert bad_seen > 20


@pytest.mark.parametrize("completion,gold,expected", [
    ("The answer is -0x3.", "0xc84", False),  # math-verify reads both as 0 times symbols
    ("The answer is 0", "0xc84", False),
    ("The answer is 0b101", "0b111", False),
    ("The answer is 12ab", "12cd", False),  # the fast path read 12 off both
    ("The answer is 12cd", "12ab", False),
    ("The answer is 12", "12ab", False),  # math-verify reads "ab" as a unit
    ("The answer is 0XC84.", "0xc84", True),  # a hexadecimal number, compared by its value
    ("\\boxed{0b111}", "0b111", True),
    ("The answer is 12cd.", "12cd", True),
    ("<answer> A3F </answer>", "A3F", True),
    ("\\boxed{3x}", "3x", True),  # a number times a variable is algebra: math-verify decides
    ("\\boxed{3 \\cdot x}", "3x", True),
])
def test_a_gold_that_is_not_a_plain_number_is_never_compared_by_a_number_off_its_front(completion, gold, expected):
    assert answer_matches(completion, gold) is expected
    assert verify_answer(completion, gold) is expected


@pytest.mark.parametrize("completion,gold", [
    ("The answer is nan", "nan"),  # matched: a policy was paid for "nan"
    ("The answer is NaN", "NaN"),
    ("The answer is inf", "inf"),
    ("The answer is 1e400", "1e400"),  # past a float's range: inf
    ("The answer is -Infinity", "-Infinity"),
    ("#### ", ""),  # an empty answer against an empty gold
    ("#### ", "#### "),  # GSM8K's marker with nothing after it
    ("The answer is 5", "   "),
])
def test_a_gold_that_cannot_be_an_answer_is_never_matched(completion, gold):
    assert answer_matches(completion, gold) is False and fast_match(completion, gold) is False
    assert verify_answer(completion, gold) is False
    from podsrl.rewards.answers import unusable_gold

    assert unusable_gold(gold) is not None


def test_require_marker_pays_only_a_marked_answer():
    assert answer_matches("5", "5") and not answer_matches("5", "5", require_marker=True)
    assert answer_matches("so it is 5", "5") and not answer_matches("so it is 5", "5", require_marker=True)
    for marked in ("\\boxed{5}", "<answer>5</answer>", "The answer is 5.", "#### 5"):
        assert answer_matches(marked, "5", require_marker=True), marked


def test_task_require_marker_reaches_the_reward_through_the_task():
    from podsrl.config import load_config
    from podsrl.evaluate import evaluate
    from podsrl.tasks import task_from_config

    c = load_config(None, ["task.require_marker=true", "task.test_size=3"])
    t = task_from_config(c.task, seed=0)
    assert all(p.require_marker for p in t.test) and next(t.train(0)).require_marker

    class Echo:  # an engine that answers each problem's gold, unmarked and then marked
        def __init__(self, marked):
            self.marked = marked

        def generate(self, prompts, n, temperature, max_new_tokens, on_chunk=None, **_):
            from types import SimpleNamespace
            gold = {p.question: p.answer for p in t.test}
            texts = [f"\\boxed{{{gold[q.strip()]}}}" if self.marked else gold[q.strip()] for q in prompts]
            on_chunk(0, list(range(len(texts))), [[1]] * len(texts))
            ids = torch.ones(len(texts), 1, dtype=torch.long)  # one token each: none cut at the limit
            return SimpleNamespace(texts=texts, completion_ids=ids, completion_mask=ids)

    class Tok:
        chat_template = None

    assert evaluate(Echo(False), Tok(), t.test, None, 8).accuracy == 0.0
    assert evaluate(Echo(True), Tok(), t.test, None, 8).accuracy == 1.0


def test_the_arithmetic_task_never_pays_its_question_restated():
    """The default task's prompts are ``a op b =``; wherever the last number of the question is its
    answer (``0 + 5 =`` for 5, ``8 - 4 =`` for 4), the question restated was paid."""
    from podsrl.tasks import load_task

    t = load_task("arithmetic", digits=1, operations="+-", test_size=200, seed=0)
    exposed = [p for p in t.test if p.question.split()[-2] == p.answer]
    assert exposed  # the held-out set has such problems
    questions = [p.question for p in exposed]
    assert accuracy_reward(questions, [p.answer for p in exposed]) == [0.0] * len(exposed)
    assert accuracy_reward([q.rstrip(" =") for q in questions], [p.answer for p in exposed]) == [0.0] * len(exposed)
    stated = [f"{p.question} {p.answer}" for p in exposed]
    assert accuracy_reward(stated, [p.answer for p in exposed]) == [1.0] * len(exposed)


@pytest.mark.parametrize("completion,question,gold,paid,alone", [
    ("How many are left of the remaining 284?", "Tom had 300. How many are left of the remaining 284?", "284", False, True),
    ("Tom had 300. How many are left of the remaining 284", "Tom had 300. How many are left of the remaining 284?", "284",
     False, True),
    ("284", "How many are left of the remaining 284?", "284", True, True),  # a bare number is an answer
    ("So there are 284 left", "How many are left of the remaining 284?", "284", True, True),  # its own words
    ("The answer is 284.", "How many are left of the remaining 284?", "284", True, True),  # marked
    # a subscript; without the question, "and" beside the number is a hedge
    ("passes through $F_1$ and $F_2$ and lies", "through $F_1$ and $F_2$ and lies tangent", "2", False, False),
    # without the question, the relation before the number is a hedge
    ("in the interval $p \\leq x\\leq15.$", "Find f(x) in the interval $p \\leq x\\leq15.$", "15", False, False),
])
def test_an_unmarked_number_copied_from_the_question_is_no_answer(completion, question, gold, paid, alone):
    assert accuracy_reward([completion], [gold], question=[question]) == [float(paid)]
    assert accuracy_reward([completion], [gold]) == [float(alone)]  # without the question, no copy to find


def test_without_a_question_column_the_prompt_is_what_a_copy_is_checked_against():
    """TRL passes ``prompts`` (text, or conversational messages) and the data set's columns."""
    question = "Tom had 300. How many are left of the remaining 284?"
    chat = [{"role": "system", "content": "Answer."}, {"role": "user", "content": question}]
    for prompt in (f"<|user|>{question}<|assistant|>", chat):
        assert accuracy_reward(["left of the remaining 284"], ["284"], prompts=[prompt]) == [0.0]
        assert accuracy_reward(["284"], ["284"], prompts=[prompt]) == [1.0]


def test_unread_number_parses_again_only_where_a_number_may_be_left_out(monkeypatch):
    """Every number of an interval stands in math-verify's reading as written: one parse, no
    change tried. 3 \\lor 5 reads 5: the 3 is found by changing it (two more parses of it)."""
    from podsrl.rewards import answers

    calls = []
    parse = answers._parse.__wrapped__
    monkeypatch.setattr(answers, "_parse", lambda e: calls.append(e) or parse(e))
    answers.unread_number.cache_clear()
    assert answers.unread_number(r"\left[ \frac{\pi^2}{8}, \frac{5 \pi^2}{4} \right]") is None
    assert len(calls) == 1
    calls.clear()
    assert answers.unread_number(r"3 \lor 5") == "3"
    assert calls == [r"3 \lor 5", r"4 \lor 5", r"5 \lor 5"]
    answers.unread_number.cache_clear()
