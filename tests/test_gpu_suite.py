"""benchmarks/gpu_suite.py: its dry run on this machine runs every step's code on the tiny model (so
the GPU suite cannot rot between GPU runs), replaces the committed comparison, and a second
invocation retrains nothing; its time limit, estimates and settings check."""

import importlib.util
import json
import shutil
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO, subprocess_env

SUITE = REPO / "benchmarks" / "gpu_suite.py"


def suite_module(path=SUITE):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run_suite(results, *args):
    return subprocess.run([sys.executable, str(SUITE), "--results", str(results), *args], capture_output=True, text=True,
                          env=subprocess_env(), timeout=1200)


def units(results) -> dict:
    return json.loads((results / "gpu_suite" / "state.json").read_text())["units"]


@pytest.mark.slow
def test_gpu_suite_dry_run_runs_every_step_and_resumes(tiny_model_dir, tmp_path, capsys):
    suite = suite_module()  # invocations that start no unit run in this process
    results = tmp_path / "results"
    model = f"model.name_or_path={tiny_model_dir}"
    # the committed comparison (void) is there: the suite must not take its runs as finished
    void = results / "compare_gpu" / "grpo" / "seed-0"
    shutil.copytree(REPO / "benchmarks" / "results" / "compare_gpu" / "grpo" / "seed-0", void)
    void_metrics = (void / "metrics.jsonl").read_text()
    (results / "compare_gpu" / "grpo-ga" / "seed-3").mkdir(parents=True)

    limited = suite.main(["--results", str(results), "--dry-run", "--max-minutes", "0.01", model])  # too short for any unit
    assert limited == 3 and "run again to continue" in capsys.readouterr().out and units(results) == {}

    first = run_suite(results, "--dry-run", model)
    assert first.returncode == 0, first.stdout[-5000:] + first.stderr[-3000:]
    state = units(results)
    done = {"a/grpo/seed-0", "a/pods/seed-0", "a/into-place", "a/grpo-ga/seed-0", "b/tests/test_advantages.py",
            "c/rollout", "c/crossover", "c/memory", "c/peer"}
    if torch.cuda.is_available():  # step d runs too (QLoRA where bitsandbytes is installed)
        done |= {"d/fsdp"} | ({"d/qlora"} if importlib.util.find_spec("bitsandbytes") else set())
    else:
        assert {k: u["note"] for k, u in state.items() if u["status"] == "skipped"} == {
            "d/qlora": "needs a CUDA GPU", "d/fsdp": "needs a CUDA GPU"}
    assert {k for k, u in state.items() if u["status"] == "done"} == done, state
    assert all(u["seconds"] > 0 and u["device"] for k, u in state.items() if u["status"] == "done" and k != "a/into-place")

    # step a: trained afresh, moved into place, nothing of the committed folder left, no checkpoints
    compare = results / "compare_gpu"
    assert not (results / "compare_gpu.new").exists() and not (compare / "grpo-ga" / "seed-3").exists()
    assert (void / "metrics.jsonl").read_text() != void_metrics
    for method in ("grpo", "pods", "grpo-ga"):
        run = compare / method / "seed-0"
        rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
        assert rows[0]["step"] == 0 and rows[-1]["train_seconds"] >= 0.02 * 60  # ran to its budget
        assert f"output_dir: {compare / method / 'seed-0'}\n" in (run / "config.yaml").read_text()
        assert str(tiny_model_dir) in (run / "config.yaml").read_text()
        assert not (run / "checkpoints").exists()
    summary = json.loads((compare / "summary.json").read_text())
    assert set(summary["methods"]) == {"grpo", "pods", "grpo-ga"}
    assert "torch: " in (compare / "environment.txt").read_text()
    # step b: a tiny selection of tests, not the suite itself
    assert "tests/test_advantages.py: done: " in (results / "gpu_suite" / "tests.txt").read_text()
    assert " passed" in state["b/tests/test_advantages.py"]["note"]
    # step c: each output with the command and versions on its first line
    for name, script, body in [("rollout_gpu.txt", "rollout.py", "auto (default)"),
                               ("rollout_crossover_gpu.txt", "rollout.py --crossover 4,8", "static/loop"),
                               ("memory_gpu.txt", "memory.py", "pods (m of n)"),
                               ("peer_trl_gpu.txt", "peer_trl.py", "podsrl, its defaults")]:
        text = (results / name).read_text()
        assert text.startswith(f"# python benchmarks/{script}") and "torch " in text.splitlines()[0], text
        assert body in text
    crossover = json.loads((results / "rollout_crossover_gpu.json").read_text())
    assert set(crossover["rates_tokens_per_s"]) == {"4", "8"} and crossover["auto_static_max_rows"] == 512
    assert set(json.loads((results / "peer_trl_gpu.json").read_text())) == {"TRL, its defaults", "podsrl, its defaults"}
    assert not list(results.rglob("*.tmp"))
    env = (results / "gpu_suite" / "environment.txt").read_text()
    assert "device: " in env and "torch: " in env and "transformers: " in env

    # a second invocation: nothing runs again, nothing is rewritten
    outputs = sorted(p for p in results.rglob("*") if p.is_file() and "gpu_suite" not in p.parts)
    before = {p: p.stat().st_mtime_ns for p in outputs}
    assert suite.main(["--results", str(results), "--dry-run", model]) == 0
    assert "ran 0 unit(s)" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in outputs} == before
    assert {k: u.get("seconds") for k, u in units(results).items()} == {k: u.get("seconds") for k, u in state.items()}

    # other settings on the same state: refused in one line
    assert suite.main(["--results", str(results), "--dry-run", "--seeds", "2", model]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu_suite: error:") and "seeds" in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no GPU")
def test_gpu_suite_without_a_gpu_needs_the_dry_run(tmp_path):
    result = run_suite(tmp_path / "results", "--steps", "a")
    assert result.returncode == 2 and "no CUDA GPU" in result.stderr and "--dry-run" in result.stderr
    assert not (tmp_path / "results").exists()
    bad = run_suite(tmp_path / "results", "--dry-run", "--steps", "a,e")
    assert bad.returncode == 2 and "--steps" in bad.stderr


def test_estimates_come_from_finished_units_and_a_stopped_one(tmp_path):
    suite = suite_module()
    state = suite.State(tmp_path / "state.json", {"x": 1})
    run = suite.Unit("a/pods/seed-1", "a/run", prior_s=300.0)
    assert state.estimate(run) == 300.0  # nothing of its kind has run: the prior
    state.record("a/grpo/seed-0", kind="a/run", status="done", seconds=200.0)
    state.record("a/pods/seed-0", kind="a/run", status="done", seconds=150.0)
    state.record("b/tests/test_x.py", kind="b/tests", status="done", seconds=900.0)
    assert state.estimate(run) == 200.0  # the longest finished unit of its kind
    state.record("a/pods/seed-1", kind="a/run", status="stopped", seconds=250.0)
    assert state.estimate(run) == 250.0  # at least as long as it ran before it was stopped
    again = suite.State(tmp_path / "state.json", {"x": 1})  # read back from the file
    assert again.estimate(run) == 250.0
    with pytest.raises(suite.SuiteError, match="other settings"):
        suite.State(tmp_path / "state.json", {"x": 2})


def test_a_command_past_its_time_is_stopped(tmp_path):
    suite = suite_module()
    start = time.monotonic()
    with open(tmp_path / "log", "w") as log:
        code, stopped = suite.run_command([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
                                          log, None, timeout=2)
    assert stopped and code != 0 and time.monotonic() - start < 30
    assert "started" in (tmp_path / "log").read_text()
    with open(tmp_path / "log", "w") as log:
        assert suite.run_command([sys.executable, "-c", "print('out')"], log, None, timeout=30) == (0, False)


def test_crossover_is_the_last_size_up_to_which_static_keeps_up():
    rollout = suite_module(REPO / "benchmarks" / "rollout.py")
    rates = {128: {"loop": 1.0, "static": 2.0}, 256: {"loop": 1.0, "static": 1.0}, 512: {"loop": 2.0, "static": 1.0},
             1024: {"loop": 1.0, "static": 3.0}}  # a win past the first loss does not move the crossover
    assert rollout.crossover([1024, 128, 512, 256], rates) == (256, 512)
    assert rollout.crossover([128], {128: {"loop": 2.0, "static": 1.0}}) == (None, 128)
    assert rollout.crossover([128, 256], {r: {"loop": 1.0, "static": 2.0} for r in (128, 256)}) == (256, None)
