"""Shared fixtures: a tiny randomly initialised Llama with SmolLM2's tokenizer, and paths."""

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from podsrl import models
from podsrl.config import load_config

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def install_command(extra: str) -> str:
    """What a missing extra's message tells the user to run: pip on this checkout, the extra named."""
    return f"pip install -e '{REPO}[{extra}]'"


# A suite started in the background (``make test &``) inherits Ctrl-C ignored; the tests of Ctrl-C
# send it and expect Python's handler, here and in the processes they start (which get the
# default disposition back at exec, and Python's handler with it).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Under pytest -n (pytest-xdist: `make test` runs one worker per core), each worker computes on one
# thread, and so do the processes it starts: workers of several threads each wait at each other's
# OpenMP barriers on a machine with no core to spare (the default run's test, five times as long).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def free_port() -> int:
    """A TCP port free right now, so that launched process groups of concurrent tests (pytest -n)
    do not meet at accelerate's default rendezvous port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(config: str, *args: str, launcher_args: tuple[str, ...] = (), env: dict | None = None, timeout: int = 600):
    """``accelerate launch`` with ``configs/accelerate/<config>`` of ``args`` (a script and its
    arguments, or ``-m podsrl ...``), the processes on the CPU with one thread each, meeting at a
    free port unless ``launcher_args`` name one."""
    port = () if "--main_process_port" in launcher_args else ("--main_process_port", str(free_port()))
    return subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", *port, *launcher_args,
         "--config_file", str(REPO / "configs" / "accelerate" / config), *args],
        env=env or cpu_env(), capture_output=True, text=True, timeout=timeout)


def record_then_replay(worker: str, config: str, one: list[str], two: list[str], rollouts, timeout: int = 600) -> None:
    """``worker one...`` in one process, recording its rollouts in the folder ``rollouts``; then
    ``worker two...`` under :func:`launch` with ``config``, training on the recording
    (tests/replay.py): an equivalence test then compares updates on the same rollouts."""
    first = subprocess.run([sys.executable, worker, *one], env={**cpu_env(), "PODSRL_RECORD_ROLLOUTS": str(rollouts)},
                           capture_output=True, text=True, timeout=timeout)
    assert first.returncode == 0, first.stderr[-3000:]
    second = launch(config, worker, *two, env={**cpu_env(), "PODSRL_REPLAY_ROLLOUTS": str(rollouts)}, timeout=timeout)
    assert second.returncode == 0, second.stderr[-3000:]


def run_showing_stacks(cmd: list[str], timeout: float, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)``, except that a command still running
    after ``timeout`` seconds fails the test with the stack of every thread of every Python process
    it started (faulthandler's, on SIGABRT; no core file), not with a bare ``TimeoutExpired``: a
    test that hangs says where."""
    import psutil  # accelerate's dependency

    no_core = lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    proc = subprocess.Popen(cmd, env={**(env or os.environ), "PYTHONFAULTHANDLER": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=no_core, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        tree = [proc.pid, *(child.pid for child in psutil.Process(proc.pid).children(recursive=True))]

        def signal_tree(signum):
            for pid in tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)

        signal_tree(signal.SIGABRT)  # each process writes its stacks and ends
        time.sleep(5)
        signal_tree(signal.SIGKILL)  # whatever outlived that
        out, err = proc.communicate()
        stacks = err[err.find("Fatal Python error"):] if "Fatal Python error" in err else err
        pytest.fail(f"{' '.join(map(str, cmd))} ran past {timeout} s; its processes' stacks then:\n{stacks[-12000:]}")
    except BaseException:  # Ctrl-C, say: the command ends with the test
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def cpu_env() -> dict:
    """Subprocesses on the CPU (even on a machine with a GPU), one thread per process: then a
    one-process run's kernels round as each rank's do."""
    return {**subprocess_env(), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


def subprocess_env() -> dict:
    """The environment for ``python -m podsrl`` subprocesses: the tests' reward module and the
    package's sources importable, installed or not."""
    path = [str(REPO / "tests"), str(REPO / "src"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def last_wins(args) -> list[str]:
    """Command-line arguments with each ``key=value`` override given once, the last one kept:
    tests add to the fixtures' overrides, and podsrl refuses a key given twice."""
    args = list(args)
    key = lambda a: a.partition("=")[0] if "=" in a and not a.startswith("-") else None
    return [a for i, a in enumerate(args) if key(a) is None or key(a) not in map(key, args[i + 1:])]


def save_tiny_llama(folder, hidden_size: int = 32, num_attention_heads: int = 4, num_key_value_heads: int = 2) -> str:
    """A 2-layer Llama (random weights, seed 0) of the given widths, saved in ``folder`` with the
    embedded model's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = models.load_tokenizer("smollm2")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads, max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def graded_cases(classes: dict[str, list[tuple[str, str, bool]]]) -> list:
    """(completion, gold, should_pay) cases by class, as pytest params named ``class-index``."""
    return [pytest.param(c, g, pay, id=f"{name}-{i}") for name, cases in classes.items() for i, (c, g, pay) in enumerate(cases)]


@pytest.fixture
def unhurried_pool():
    """The reward pool with a bound far above any grade's cost, for tests that check grades: a
    loaded machine may take several times the default bound on a hard MATH-500 answer (the bound
    itself is tested in test_scoring.py)."""
    from podsrl.rewards import pool

    pool.configure(timeout=60.0)
    yield
    pool.configure()


@pytest.fixture
def children_at_model_load(monkeypatch) -> list[set[int]]:
    """The ids of this process's live child processes (the reward workers among them), recorded
    each time :func:`podsrl.models.load_model` is called."""
    import multiprocessing

    from podsrl import models

    load, alive = models.load_model, []

    def recording(*args, **kwargs):
        alive.append({p.pid for p in multiprocessing.active_children()})
        return load(*args, **kwargs)

    monkeypatch.setattr(models, "load_model", recording)
    return alive


@pytest.fixture(scope="session", autouse=True)
def own_torch_extensions(tmp_path_factory):
    """Ops compiled at run time (DeepSpeed's CPU shared-memory allreduce) built in a folder of this
    session's: torch's build lock is a file, and one left in ~/.cache/torch_extensions by a run
    killed mid-build makes every later build wait on it for ever."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path_factory.mktemp("torch_extensions")))
        yield


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A 2-layer Llama (random weights) saved with the embedded model's tokenizer."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def tiny_overrides(tiny_model_dir, tmp_path) -> list[str]:
    """``key=value`` overrides of a fast run on the tiny model, writing to tmp_path/run."""
    return [
        f"model.name_or_path={tiny_model_dir}", f"output_dir={tmp_path / 'run'}", "steps=2",
        "prompts_per_step=2", "n=4", "m=2", "task.test_size=4", "rollout.max_new_tokens=6",
        "progress=false", "rewards=[rewards_for_tests:varied]", "lr=1e-3",
    ]


@pytest.fixture
def tiny_config(tiny_overrides):
    """Factory: a fast config on the tiny model, writing under tmp_path."""

    def make(*overrides: str):
        return load_config(None, tiny_overrides + list(overrides))

    return make


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def ended_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(map(running, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(map(running, pids))
