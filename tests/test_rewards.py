"""Answer extraction and checking, reward functions, scoring."""

import pytest

from podsrl.errors import PodsError
from podsrl.rewards import REWARDS, answer_matches, extract_answer, load_reward, score


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
    ],
)
def test_answer_matches(completion, gold, expected):
    assert answer_matches(completion, gold) is expected


def test_extract_answer_priority():
    assert extract_answer("Answer: 3 but \\boxed{5}") == "5"
    assert extract_answer("<answer> 7 </answer> then 9") == "7"
    assert extract_answer("nothing") is None


def test_builtin_rewards_follow_trl_convention():
    comps = ["<think>a</think><answer>4</answer>", "4", "5"]
    assert REWARDS["accuracy"](completions=comps, answer=["4"] * 3) == [1.0, 1.0, 0.0]
    assert REWARDS["format"](completions=comps) == [1.0, 0.0, 0.0]
    assert REWARDS["number_only"](completions=comps) == [0.0, 1.0, 1.0]


def test_score_weights_none_and_nan():
    fns = {"accuracy": REWARDS["accuracy"], "format": REWARDS["format"]}
    total, means = score(fns, [1.0, 0.5], ["<think>a</think><answer>4</answer>", "5"], answer=["4", "4"])
    assert total == [1.5, 0.0] and means == {"accuracy": 0.5, "format": 0.5}
    none = load_reward("rewards_for_tests:sometimes_none")
    total, means = score({"n": none}, [2.0], ["a", "b", "c"])
    assert total == [2.0, 0.0, 2.0] and means == {"n": 1.0}  # None: not applicable, counts 0
    with pytest.raises(PodsError, match="NaN"):
        score({"bad": load_reward("rewards_for_tests:nan_reward")}, [1.0], ["a"])


def test_load_reward_errors():
    with pytest.raises(PodsError, match="unknown reward"):
        load_reward("nope")
    with pytest.raises(PodsError, match="cannot import"):
        load_reward("nope_module:fn")
