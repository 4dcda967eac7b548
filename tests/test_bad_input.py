"""Bad input: one ``podsrl: error:`` line and exit 2, and nothing left behind."""

import json
import os
import subprocess
import sys

import pytest

from podsrl import models
from podsrl.cli import main
from podsrl.errors import PodsError
from podsrl.rewards import score


def cli(capsys, *args) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().err


def assert_one_error(code: int, err: str, message: str) -> None:
    """Exit 2, and the last stderr line is the only ``podsrl:`` line and holds ``message``."""
    assert code == 2, err
    lines = err.strip().splitlines()
    assert [l for l in lines if l.startswith("podsrl:")] == [lines[-1]], err
    assert lines[-1].startswith("podsrl: error: ") and message in lines[-1], err
    assert "Traceback" not in err


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize("text,message", [
    ("n: 4\nm: [1,\n", "bad.yaml:3: not valid YAML (did not find expected node content)"),
    ("n: 4\n\tm: 2\n", "bad.yaml:2: not valid YAML"),
    ("- n: 4\n- m: 2\n", "bad.yaml: the top level must be a mapping of config keys, not a list"),
])
def test_malformed_yaml(capsys, tmp_path, text, message):
    (tmp_path / "bad.yaml").write_text(text)
    code, err = cli(capsys, "train", str(tmp_path / "bad.yaml"), f"output_dir={tmp_path / 'out'}")
    assert_one_error(code, err, message)
    assert not (tmp_path / "out").exists()


def test_steps_zero_is_rejected(capsys, tmp_path):
    code, err = cli(capsys, "train", "steps=0", f"output_dir={tmp_path / 'out'}")
    assert_one_error(code, err, "steps must be >= 1, got 0; podsrl eval evaluates a model without training")
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- models


@pytest.fixture
def gguf_files(tmp_path, monkeypatch):
    monkeypatch.setenv("PODSRL_CACHE", str(tmp_path / "cache"))
    (tmp_path / "truncated.gguf").write_bytes(models.embedded_gguf().open("rb").read(1_000_000))
    (tmp_path / "text.gguf").write_text("not a model\n")
    return tmp_path


@pytest.mark.parametrize("command", ["train", "eval"])
@pytest.mark.parametrize("name,message", [
    ("missing.gguf", "GGUF file not found: "),
    ("truncated.gguf", "cannot read GGUF file "),
    ("text.gguf", "cannot read GGUF file "),
])
def test_bad_gguf(capsys, gguf_files, command, name, message):
    path = gguf_files / name
    code, err = cli(capsys, command, f"model.name_or_path={path}", f"output_dir={gguf_files / 'out' / 'run'}",
                    "task.test_size=2")
    assert_one_error(code, err, message + str(path))
    assert not (gguf_files / "out").exists()  # nor the parent folder the run made
    assert not list((gguf_files / "cache").rglob("*"))  # no half-written conversion


def test_unreachable_hub_fails_at_once(tmp_path):
    """With the hub unreachable (a closed local port), a hub name not in the cache is one quick
    error instead of a minute of retries; the same for a data set's hub name."""
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_HUB_OFFLINE", None)
    for args, message in [
        (["model.name_or_path=no-such-org/no-such-model"],
         "podsrl: error: cannot load model 'no-such-org/no-such-model': not in the local cache and the Hugging Face hub cannot be reached"),
        (["task.name=gsm8k", "task.path=no-such-org/no-such-data"],
         "podsrl: error: cannot load data set 'no-such-org/no-such-data': not a local file or folder, and the Hugging Face hub cannot be reached"),
    ]:
        result = subprocess.run([sys.executable, "-m", "podsrl", "train", *args, f"output_dir={tmp_path / 'out'}"],
                                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith(message), result.stderr
        assert "Retrying" not in result.stderr
        assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- data


@pytest.mark.parametrize("empty", ["train", "test"])
def test_empty_jsonl_is_an_error_not_an_endless_loop(capsys, tmp_path, tiny_overrides, empty):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "test"):
        row = {"question": "1 + 1 =", "answer": "#### 2"}
        (data / f"{split}.jsonl").write_text("" if split == empty else json.dumps(row) + "\n")
    code, err = cli(capsys, "train", *tiny_overrides, "task.name=gsm8k", f"task.path={data}")
    assert_one_error(code, err, f"{data / (empty + '.jsonl')} holds no problems")
    assert not (tmp_path / "run").exists()


def test_malformed_jsonl_line_is_reported_by_line(capsys, tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text('{"problem": "1 + 1", "answer": "2"}\n\n{"problem": "2 + 2", "answer": 4\n')
    code, err = cli(capsys, "eval", "task.name=math500", f"task.path={path}")
    assert_one_error(code, err, f"{path}:3: not valid JSON (Expecting ',' delimiter)")


@pytest.mark.parametrize("task", [["task.test_size=0"], ["task.name=math500", "task.path={empty}"]])
def test_eval_on_an_empty_test_set_is_an_error(capsys, tmp_path, tiny_model_dir, task):
    (tmp_path / "empty.jsonl").write_text("\n")
    task = [t.format(empty=tmp_path / "empty.jsonl") for t in task]
    code, err = cli(capsys, "eval", f"model.name_or_path={tiny_model_dir}", *task)
    assert_one_error(code, err, "empty.jsonl holds no problems" if len(task) == 2 else "has an empty test set")


# --------------------------------------------------------------------------- rewards


@pytest.mark.parametrize("fn,message", [
    ("raises", "reward 'rewards_for_tests:raises' raised ValueError: no answer column"),
    ("strings", "reward 'rewards_for_tests:strings' returned a non-numeric value 'abc'"),
    ("scalar", "reward 'rewards_for_tests:scalar' must return a list, got float"),
])
def test_bad_user_reward_mid_run_leaves_no_folder(capsys, tmp_path, tiny_overrides, fn, message):
    code, err = cli(capsys, "train", *tiny_overrides, f"rewards=[rewards_for_tests:{fn}]")
    assert_one_error(code, err, message)
    assert not (tmp_path / "run").exists()


def test_score_accepts_numbers_none_and_arrays_only():
    import numpy as np

    completions = ["a", "b"]
    total, means = score({"r": lambda completions, **_: np.array([1.0, 0.0]), "s": lambda completions, **_: [None, True]},
                         [1.0, 2.0], completions)
    assert total == [1.0, 2.0] and means == {"r": 0.5, "s": 1.0}
    for returned, message in [("0.5", "must return a list, got str"), ([1.0, "1.0"], "non-numeric value '1.0'"),
                              ([[1.0], 0.0], "non-numeric value [1.0]"), ([1.0], "returned 1 values for 2")]:
        with pytest.raises(PodsError, match=message.replace("[", r"\[").replace("]", r"\]")):
            score({"r": lambda completions, _r=returned, **_: _r}, [1.0], completions)


