"""Tasks: seeded arithmetic, GSM8K and MATH-500 from the shared jsonl files."""

import itertools

import pytest

from conftest import SHARED_DATA
from podsrl.errors import PodsError
from podsrl.rewards import answer_matches
from podsrl.tasks import load_task


def test_arithmetic_is_seeded_and_correct():
    task = load_task("arithmetic", digits=2, operations="+-*", test_size=50)
    a = list(itertools.islice(task.train(1), 20))
    assert a == list(itertools.islice(task.train(1), 20)) != list(itertools.islice(task.train(2), 20))
    assert task.test == load_task("arithmetic", digits=2, operations="+-*", test_size=50).test
    for p in a + task.test:
        x, op, y, _ = p.question.split()
        assert 0 <= int(x) <= 99 and op in "+-*" and int(p.answer) == eval(f"{x}{op}{y}")
    with pytest.raises(PodsError):
        load_task("arithmetic", operations="/")


@pytest.mark.skipif(not (SHARED_DATA / "gsm8k").exists(), reason="shared data not present")
def test_gsm8k_from_local_jsonl():
    task = load_task("gsm8k", path=str(SHARED_DATA / "gsm8k"), test_size=10)
    assert len(task.test) == 10
    first = next(task.train(0))
    assert first.answer.lstrip("-").replace(".", "").isdigit() and "####" not in first.answer
    # the gold solution text itself is judged correct against the extracted answer
    raw = (SHARED_DATA / "gsm8k" / "test.jsonl").read_text().splitlines()[0]
    import json

    row = json.loads(raw)
    assert answer_matches(row["answer"], task.test[0].answer)


@pytest.mark.skipif(not (SHARED_DATA / "math500").exists(), reason="shared data not present")
def test_math500_from_local_jsonl():
    task = load_task("math500", path=str(SHARED_DATA / "math500" / "test.jsonl"))
    assert len(task.test) == 500
    assert answer_matches(f"so \\boxed{{{task.test[0].answer}}}", task.test[0].answer)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(PodsError, match="data file not found"):
        load_task("gsm8k", path=str(tmp_path / "nope.jsonl"))
    (tmp_path / "bad.jsonl").write_text('{"q": 1}\n')
    with pytest.raises(PodsError, match="fields"):
        load_task("gsm8k", path=str(tmp_path / "bad.jsonl"))


def test_a_hub_data_set_without_datasets_installed_is_one_line_naming_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)  # as if it were not installed
    with pytest.raises(PodsError, match=r"^cannot load data set 'openai/gsm8k': it is not a local file or folder, "
                                        r"and hub data sets need datasets: pip install datasets$"):
        load_task("gsm8k", path="openai/gsm8k")
