"""benchmarks/grader_exposure.py: the earlier grader, loaded from git, against the current one."""

import importlib.util
import subprocess
import sys

import pytest

from conftest import REPO
from podsrl.rewards import answer_matches
from podsrl.tasks import load_task


@pytest.fixture(scope="module")
def exposure():
    spec = importlib.util.spec_from_file_location("grader_exposure", REPO / "benchmarks" / "grader_exposure.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def old(exposure):
    if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{exposure.OLD_COMMIT}^{{commit}}"]).returncode:
        pytest.skip("the repository's history does not hold the earlier grader's commit")
    return exposure.OldGrader()


def test_the_old_module_is_the_earlier_grader(old):
    # the restated question: the earlier grader read its last number, the current one refuses it
    assert old.reward("0 + 5 =", "5", None) == 1.0 and not answer_matches("0 + 5 =", "5")
    assert old.reward("0 + 5 =", "6", None) == 0.0
    assert old.reward("The answer is 5.", "5", None) == 1.0 and answer_matches("The answer is 5.", "5")


def test_default_task_counts_the_restated_questions_by_brute_force(exposure, old):
    problems = load_task("arithmetic", digits=1, operations="+", test_size=200, seed=0).test
    counted = exposure.exposure(problems, old)["classes"]["restated"]
    # by hand: "a + b =" ends in b, which is the sum exactly when a is 0
    zero_first = sum(p.question.startswith("0 + ") for p in problems)
    assert zero_first > 0
    assert counted["old_paid"] == counted["old_solved"] == zero_first
    assert counted["new_paid"] == 0
    assert counted["wrong_answers"] == 2 * len(problems)


def test_wrong_numbers_holding_the_gold(exposure):
    module = exposure
    assert module.holding_gold("7") == ["-7", "71", "17"]
    assert module.holding_gold("-206") == ["206", "-2061", "-1206"]
    assert module.holding_gold("0") == ["01", "10"]  # "-0" is the gold
    assert module.holding_gold("seven") == []


def test_gsm8k_wrong_answers_are_wrong_by_math_verify_and_were_paid(exposure, old):
    from math_verify import parse, verify

    for gold in ("18", "7", "-21", "1"):
        for cls, wrongs in exposure.gsm8k_wrong(gold).items():
            for wrong in wrongs:
                assert not verify(parse(f"${gold}$"), parse(wrong)), (gold, cls, wrong)
                assert not answer_matches(wrong, gold), (gold, cls, wrong)
    wrong = exposure.gsm8k_wrong("18")
    assert all(old.reward(w, "18", None) == 1.0 for w in wrong["hedge"] + wrong["list"])


def test_gym_partial_credit_of_wrong_numbers(exposure, old):
    pytest.importorskip("reasoning_gym")
    problems = load_task("gym", dataset="chain_sum", config={}, test_size=20, seed=0).test
    counted = exposure.exposure(problems, old)["classes"]
    assert counted["holds_gold"]["old_paid"] == len(problems)  # partial credit on every number gold
    assert counted["holds_gold"]["old_solved"] == 0
    assert counted["holds_gold"]["new_paid"] == counted["restated"]["new_paid"] == 0
    # by hand: the question ends in its last operand, paid in full where it equals the sum
    last_is_sum = sum(p.entry["entry"]["metadata"]["expression"].split()[-1] == p.answer for p in problems)
    assert counted["restated"]["old_solved"] == last_is_sum


def test_bad_arguments_are_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "grader_exposure.py"), "--pages", "nope"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "grader_exposure: error: --pages" in done.stderr
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "grader_exposure.py"), "--pages", "scoring",
                           "--gsm8k", str(tmp_path / "missing.jsonl")], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("grader_exposure: error: --gsm8k")
