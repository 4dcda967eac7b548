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
    # a folder of earlier runs is there: the suite must not take its runs as finished
    void = results / "compare_gpu" / "grpo" / "seed-0"
    shutil.copytree(REPO / "benchmarks" / "results" / "compare_gpu_earlier_grader" / "grpo" / "seed-0", void)
    void_metrics = (void / "metrics.jsonl").read_text()
    (results / "compare_gpu" / "grpo-ga" / "seed-3").mkdir(parents=True)

    limited = suite.main(["--results", str(results), "--dry-run", "--max-minutes", "0.01", model])  # too short for any unit
    assert limited == 3 and "run again to continue" in capsys.readouterr().out and units(results) == {}

    first = run_suite(results, "--dry-run", model)
    assert first.returncode == 0, first.stdout[-5000:] + first.stderr[-3000:]
    state = units(results)
    done = {"a/grpo/seed-0", "a/pods/seed-0", "a/into-place", "a/grpo-ga/seed-0", "b/tests/test_advantages.py",
            "c/rollout", "c/crossover", "c/memory", "c/peer", "c/async", "c/plan"}
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
    validation = json.loads((results / "plan_gpu" / "validation.json").read_text())
    assert [r["method"] for r in validation["methods"]] == ["grpo", "pods", "grpo-ga"]
    assert state["c/plan"]["note"].startswith("plan / measured step: grpo ")
    assert "| grpo-ga (n = 4, m = 2) |" in (results / "plan_gpu.txt").read_text()
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


@pytest.mark.parametrize("args,state,message", [
    (["--steps", "a", "--seeds", "many"], None, "gpu_suite: error: argument --seeds: invalid int value: 'many'"),
    (["--dry-run", "--frobnicate"], None, "gpu_suite: error: unrecognized arguments: --frobnicate"),
    (["--dry-run", "--bundle", "x.tgz", "--bundle-max-mib", "0"], None, "gpu_suite: error: --seeds must be >= 1, "),
    (["--dry-run"], '{"settings": {"dry_run": tr', "gpu_suite: error: cannot read "),
    (["--dry-run"], '[1, 2]', "gpu_suite: error: "),
])
def test_bad_arguments_and_a_damaged_state_are_one_line(tmp_path, capsys, args, state, message):
    suite = suite_module()
    if state is not None:
        (tmp_path / "gpu_suite").mkdir()
        (tmp_path / "gpu_suite" / "state.json").write_text(state)
    code = suite.main(["--results", str(tmp_path), "--steps", "b", "--tests", "tests/test_advantages.py", *args])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(message), lines


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


def test_plan_unit_runs_the_validation_on_the_gpu_config_and_notes_its_ratios(tmp_path):
    """Step c's plan unit: plan_validation.py on configs/compare_gpu.yaml against runs it trains,
    on the wall clock (the config's); its note gives the ratios of the validation.json it wrote."""
    import argparse

    suite = suite_module()
    results = tmp_path / "results"
    args = argparse.Namespace(dry_run=False, overrides=[], run_overrides=["model.name_or_path=x"])
    unit = next(u for u in suite.step_c(args, results, results / "gpu_suite", None) if u.key == "c/plan")
    command = unit.commands[0]
    assert command[1].endswith("benchmarks/plan_validation.py") and command[2] == "configs/compare_gpu.yaml"
    assert "model.name_or_path=x" in command and command[command.index("--train-steps") + 1] == "6"
    assert not any(o.startswith("clock=") for o in command) and unit.output == results / "plan_gpu.txt"  # wall
    with pytest.raises(RuntimeError, match="was not written"):
        unit.finish("")
    (results / "plan_gpu").mkdir(parents=True)
    rows = [{"method": m, "ratio": r, "ratio_given_trained": g} for m, r, g in
            (("grpo", 1.031, 0.99), ("pods", 0.9, 1.0), ("grpo-ga", 1.2, 1.104))]
    (results / "plan_gpu" / "validation.json").write_text(json.dumps({"methods": rows}))
    assert unit.finish("") == ("plan / measured step: grpo 1.03, pods 0.90, grpo-ga 1.20 "
                               "(given the runs' trained rollouts: grpo 0.99, pods 1.00, grpo-ga 1.10)")


def test_crossover_is_the_last_size_up_to_which_static_keeps_up():
    rollout = suite_module(REPO / "benchmarks" / "rollout.py")
    rates = {128: {"loop": 1.0, "static": 2.0}, 256: {"loop": 1.0, "static": 1.0}, 512: {"loop": 2.0, "static": 1.0},
             1024: {"loop": 1.0, "static": 3.0}}  # a win past the first loss does not move the crossover
    assert rollout.crossover([1024, 128, 512, 256], rates) == (256, 512)
    assert rollout.crossover([128], {128: {"loop": 2.0, "static": 1.0}}) == (None, 128)
    assert rollout.crossover([128, 256], {r: {"loop": 1.0, "static": 2.0} for r in (128, 256)}) == (256, None)


def make_wheel(folder, name, version, payload: bytes):
    """A real (tiny) wheel of package ``name`` holding ``payload`` as a data file."""
    import base64
    import hashlib
    import zipfile

    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n".encode(), f"{name}/data.bin": payload,
             f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},{len(b)}\n"
                     for p, b in files.items()) + f"{name}-{version}.dist-info/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for p, b in {**files, f"{name}-{version}.dist-info/RECORD": record.encode()}.items():
            z.writestr(p, b)
    return path


def test_wheels_cut_into_folders_install_once_every_part_has_arrived(tmp_path, monkeypatch):
    wheels_module = suite_module(REPO / "benchmarks" / "gpu_wheels.py")
    mib = wheels_module.MIB
    wheels, out, stash, target = (tmp_path / d for d in ("wheels", "out", "stash", "site"))
    wheels.mkdir()
    big = make_wheel(wheels, "alpha_pkg", "1.0", bytes(range(256)) * (6 * mib // 1024))  # 1.5 MiB, stored
    small = make_wheel(wheels, "beta", "2.0", b"b" * 1000)
    make_wheel(wheels, "beta", "1.0", b"old")  # another version beside it: not taken
    monkeypatch.setattr(wheels_module, "GROUPS", {"core": [("alpha-pkg==1.0", "alpha_pkg")],
                                                  "extra": [("beta==2.0", "beta")]})
    manifest = wheels_module.pack(["core", "extra"], wheels, out, mib)
    folders = sorted(out.glob("folder-*"))
    assert [f.name for f in folders] == ["folder-1", "folder-2"]
    for f in folders:  # each folder within its size; the parts join into the wheel
        assert sum(p.stat().st_size for p in f.iterdir() if p.suffix != ".json") <= mib
    parts = manifest["wheels"][0]["parts"]
    assert [p["folder"] for p in parts] == ["folder-1", "folder-2"]
    assert b"".join((out / p["folder"] / p["file"]).read_bytes() for p in parts) == big.read_bytes()
    assert (out / "folder-2" / small.name).read_bytes() == small.read_bytes()

    importable = lambda module: subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                                               env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}).returncode == 0
    assert wheels_module.install([folders[0]], stash, target) == wheels_module.EXIT_WAITING  # half of alpha only
    assert not importable("alpha_pkg")
    assert wheels_module.install([folders[1]], stash, target) == 0  # in a later invocation: joined, checked, installed
    assert importable("alpha_pkg") and importable("beta")
    assert not list(stash.glob("*.part*"))
    assert wheels_module.install([folders[1]], stash, target) == 0  # nothing left to do

    (out / "folder-2" / parts[1]["file"]).write_bytes(b"damaged")  # a damaged part is caught by the checksum
    assert wheels_module.install(folders, tmp_path / "stash2", tmp_path / "site2") == 1
    with pytest.raises(ValueError, match="2 wheel"):
        monkeypatch.setattr(wheels_module, "GROUPS", {"core": [("beta==2.0", "beta")]})
        make_wheel(wheels, "Beta", "2.0", b"x").rename(wheels / "beta-2.0-py2-none-any.whl")
        wheels_module.pack(["core"], wheels, out, mib)


def test_pack_folds_the_downloaded_wheels_again_without_the_network(tmp_path, monkeypatch, capsys):
    wheels_module = suite_module(REPO / "benchmarks" / "gpu_wheels.py")
    (tmp_path / "wheels").mkdir()
    big = make_wheel(tmp_path / "wheels", "alpha_pkg", "1.0", bytes(range(256)) * (10 * wheels_module.MIB // 1024))
    monkeypatch.setattr(wheels_module, "GROUPS", {"core": [("alpha-pkg==1.0", "alpha_pkg")]})
    monkeypatch.setattr(wheels_module, "download", lambda *a: pytest.fail("pack downloads nothing"))
    assert wheels_module.main(["pack", "--groups", "core", "--dir", str(tmp_path), "--folder-mib", "2"]) == 0
    assert sorted(f.name for f in tmp_path.glob("folder-*")) == ["folder-1", "folder-2"]  # 2.5 MiB in 2 MiB folders
    assert wheels_module.main(["pack", "--groups", "core", "--dir", str(tmp_path), "--folder-mib", "1"]) == 0
    folders = sorted(tmp_path.glob("folder-*"))
    assert [f.name for f in folders] == ["folder-1", "folder-2", "folder-3"]  # the larger folders replaced
    assert b"".join(p.read_bytes() for f in folders for p in sorted(f.glob("*.part*"))) == big.read_bytes()
    assert "1 wheels, 2.5 MiB, in 3 folder(s)" in capsys.readouterr().out


def test_runs_of_the_headline_start_only_on_the_device_of_its_finished_runs(tmp_path):
    """Runs on a training-clock budget compare on one device alone: a later invocation on another
    device skips step a's runs, and runs them again on the first device."""
    suite = suite_module()
    state = suite.State(tmp_path / "state.json", {"x": 1})
    run = suite.Unit("a/pods/seed-1", "a/run", prior_s=300.0)
    tests = suite.Unit("b/tests/test_x.py", "b/tests", prior_s=60.0)
    assert suite.other_device(run, state, "NVIDIA H100 80GB HBM3", "g1") is None  # nothing has run yet
    state.record("a/grpo/seed-0", kind="a/run", status="done", seconds=160.0, device="NVIDIA H200", grader="g1")
    state.record("a/pods/seed-0", kind="a/run", status="failed", seconds=10.0, device="NVIDIA H100 80GB HBM3", grader="g1")
    why = suite.other_device(run, state, "NVIDIA H100 80GB HBM3", "g1")
    assert why and "NVIDIA H200" in why and "this is NVIDIA H100 80GB HBM3" in why
    assert suite.other_device(run, state, "NVIDIA H200", "g1") is None
    assert suite.other_device(tests, state, "NVIDIA H100 80GB HBM3", "g1") is None  # other steps run anywhere


def test_runs_of_the_headline_start_only_under_the_grader_of_its_finished_runs(tmp_path):
    """A change to the grading code between sessions would mix runs paid by two graders in one
    table: step a's runs wait for the grader its finished runs had (a record without one, from
    before graders were recorded, is another grader); other steps run."""
    suite = suite_module()
    state = suite.State(tmp_path / "state.json", {"x": 1})
    run = suite.Unit("a/grpo/seed-2", "a/run", prior_s=300.0)
    state.record("a/grpo/seed-0", kind="a/run", status="done", seconds=160.0, device="NVIDIA H200", grader="g1")
    assert suite.other_device(run, state, "NVIDIA H200", "g1") is None
    why = suite.other_device(run, state, "NVIDIA H200", "g2")
    assert why and "grader g1" in why and "is g2" in why and "start over" in why
    state.record("a/pods/seed-0", kind="a/run", status="done", seconds=160.0, device="NVIDIA H200")  # unrecorded
    assert "unrecorded" in suite.other_device(run, state, "NVIDIA H200", "g1")
    assert suite.other_device(suite.Unit("c/memory", "c/memory", prior_s=60.0), state, "NVIDIA H200", "g2") is None


def test_the_grader_fingerprint_follows_the_grading_code(tmp_path, monkeypatch):
    """The fingerprint is of the files under rewards/ and tasks/: it changes when one of them does,
    and not when another part of the package does."""
    suite = suite_module()
    for name in ("rewards", "tasks", "rollout"):
        (tmp_path / "src" / "podsrl" / name).mkdir(parents=True)
        (tmp_path / "src" / "podsrl" / name / "x.py").write_text("A = 1\n")
    monkeypatch.setattr(suite, "REPO", tmp_path)
    first = suite.grader_fingerprint()
    (tmp_path / "src" / "podsrl" / "rollout" / "x.py").write_text("A = 2\n")
    assert suite.grader_fingerprint() == first
    (tmp_path / "src" / "podsrl" / "tasks" / "x.py").write_text("A = 2\n")
    assert suite.grader_fingerprint() != first


def test_units_picks_some_units_of_the_steps_in_their_order(tiny_model_dir, tmp_path, capsys):
    suite = suite_module()
    model = f"model.name_or_path={tiny_model_dir}"
    # too short for any unit: the first one it would start is named, and it is the first chosen one
    code = suite.main(["--results", str(tmp_path), "--dry-run", "--steps", "c,d", "--units", "d/*,c/async",
                       "--max-minutes", "0.01", "--bundle", str(tmp_path / "out.tgz"), model])
    out = capsys.readouterr().out
    import tarfile
    with tarfile.open(tmp_path / "out.tgz") as tar:  # written on a stop at the limit too
        assert {f"{tmp_path.name}/gpu_suite/{f}" for f in ("state.json", "environment.txt")} <= set(tar.getnames())
    assert code == 3 and "c/async is expected to take" in out, out
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and "/" in line.split()[0]]
    assert listed[-3:] == ["c/async", "d/qlora", "d/fsdp"] and "c/rollout" not in listed, out
    assert suite.main(["--results", str(tmp_path), "--dry-run", "--steps", "c", "--units", "d/*", model]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "matches no unit of steps c" in err[0], err


def test_the_bundle_holds_what_this_invocation_wrote_without_weights(tmp_path, capsys):
    import os
    import tarfile

    suite = suite_module()
    results = tmp_path / "results"
    old, new = results / "compare_gpu" / "old.txt", results / "async_step_gpu" / "lag-1" / "metrics.jsonl"
    weights = results / "async_step_gpu" / "lag-1" / "checkpoints" / "step-11" / "model.safetensors"
    big = results / "gpu_suite" / "fsdp" / "big.bin"
    for path, size in [(old, 10), (new, 100), (weights, 10), (big, 3 * 2**20)]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
    os.utime(old, (1000.0, 1000.0))  # written before the invocation
    since = time.time() - 60
    out = tmp_path / "out" / "results.tgz"
    suite.bundle(results, since, out, max_mib=2)
    with tarfile.open(out) as tar:
        names = sorted(tar.getnames())
        skipped = tar.extractfile("BUNDLE_SKIPPED.txt").read().decode()
        assert tar.extractfile("results/async_step_gpu/lag-1/metrics.jsonl").read() == b"x" * 100
    assert names == ["BUNDLE_SKIPPED.txt", "results/async_step_gpu/lag-1/metrics.jsonl"], names
    assert "model.safetensors (0.0 MiB)" in skipped and "big.bin (3.0 MiB)" in skipped and "old.txt" not in skipped
    assert not list(out.parent.glob("*.tmp")) and "1 result file(s)" in capsys.readouterr().out
