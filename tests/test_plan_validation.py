"""benchmarks/plan_validation.py: bad input is one line before anything is measured; the plan is
compared only with runs of its settings, and overrides go on top of the comparisons' settings."""

import importlib.util

import pytest

from conftest import REPO


@pytest.fixture
def validation(monkeypatch):
    """The script, with its podsrl commands recorded instead of run (the first ends it)."""
    spec = importlib.util.spec_from_file_location("plan_validation", REPO / "benchmarks" / "plan_validation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.commands = []

    def recorded(*args):
        module.commands.append(list(args))
        raise SystemExit(0)

    monkeypatch.setattr(module, "podsrl", recorded)
    return module


@pytest.mark.parametrize("args,message", [
    (["missing.yaml"], "config file not found: missing.yaml"),
    (["--train-steps", "1"], "--train-steps must be >= 2 (the first step is left out), got 1"),
    (["--train-steps", "0"], "--train-steps must be >= 2 (the first step is left out), got 0"),
    (["--out", "{file}"], "--out {file} is a file; give a folder"),
    (["n=64"], "the plan's pods settings differ from its run in "),
    (["--runs", "confirm", "rollout.max_new_tokens=8"], "(rollout.max_new_tokens: 12 -> 8)"),
])
def test_bad_input_is_one_line_before_anything_is_measured(validation, capsys, tmp_path, args, message):
    file = tmp_path / "taken"
    file.write_text("")
    code = validation.main([a.replace("{file}", str(file)) for a in args])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("plan_validation.py: error: "), lines
    assert message.replace("{file}", str(file)) in lines[0]
    assert validation.commands == []


def test_overrides_go_on_top_of_the_comparisons_settings(validation, tmp_path):
    validation.main(["task.test_size=200", "--out", str(tmp_path / "out")])
    (plan,) = validation.commands
    assert plan[:2] == ["plan", str(validation.DEFAULT_CONFIG)]
    assert "clock=cpu" in plan and "n=32" in plan and "task.test_size=200" in plan and "task.test_size=500" not in plan


@pytest.mark.parametrize("runs,settings,reference", [
    ("confirm-c", ["async_lag=1", "threads=1", "async_worker_threads=1", "clock=wall"], "grpo-async"),
    ("confirm-c-sync", ["threads=2", "clock=wall"], "grpo"),
])
def test_the_clock_confirmations_runs_are_compared_at_their_own_settings(validation, tmp_path, runs, settings, reference):
    # the committed runs pass the settings check (a run of other settings would be refused first)
    validation.main(["--runs", runs, "--out", str(tmp_path / "out")])
    (plan,) = validation.commands
    assert plan[:2] == ["plan", str(validation.DEFAULT_CONFIG)]
    assert all(s in plan for s in settings)
    assert [o for o in plan if o.startswith("threads=")] == [s for s in settings if s.startswith("threads=")]
    assert "clock=cpu" not in plan and "n=32" in plan and "m=8" in plan
    signal = plan[plan.index("--signal-from") + 1:plan.index("--json")]
    assert len(signal) == 8 and all(f"evidence_confirm_c_arithmetic_2digit/{reference}/seed-" in s for s in signal)
