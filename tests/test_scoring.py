"""The scorer: the [P, n] reward matrix, weights, the time bound, crashes, errors, async rewards,
and the worker pool ending with the run."""

import multiprocessing
import sys

import pytest
import torch

from conftest import ended_within, running
from podsrl.errors import PodsError
from podsrl.rewards import REWARDS, load_reward
from podsrl.rewards.scorer import Scorer


def score(fns, weights, texts, n, workers=None, timeout=30.0, wall_timeout=None, **columns):
    """Score ``texts`` (prompt-major, n per prompt) in two chunks, as an engine would hand them.
    The default bound is generous: where a test is not about the bound, a grade must not time out
    because the machine is busy (sympy's first simplification in a fresh worker took over 2 s of
    wall time beside two training runs on two cores)."""
    scorer = Scorer(fns, weights, workers, timeout, wall_timeout=wall_timeout or 2 * timeout)
    P = len(texts) // n
    step = scorer.start({"prompts": [f"p{i}" for i in range(P)], **columns}, n)
    half = (P // 2) * n
    step.add(0, texts[:half], [[1, 2]] * half)
    step.add(P // 2, texts[half:], [[3]] * (len(texts) - half))
    try:
        return step.result()
    finally:
        scorer.close()


@pytest.mark.parametrize("workers", [None, 0])
def test_weights_none_and_means(workers):
    fns = {"accuracy": REWARDS["accuracy"], "format": REWARDS["format"]}
    texts = ["<think>a</think><answer>4</answer>", "5", "\\boxed{\\frac{\\sqrt{8}}{2}}", "x"]
    result = score(fns, [1.0, 0.5], texts, n=2, workers=workers, answer=["4", "\\sqrt{2}"])
    assert result.rewards.tolist() == [[1.5, 0.0], [1.0, 0.0]]
    assert result.means == {"accuracy": 0.5, "format": 0.25} and result.timeouts == 0
    none = {"n": load_reward("rewards_for_tests:sometimes_none")}
    result = score(none, [2.0], ["a", "b?", "c", "d?"], n=2, workers=workers)
    assert result.rewards.tolist() == [[2.0, 0.0], [2.0, 0.0]] and result.means == {"n": 1.0}  # None counts 0


def test_user_reward_sees_trl_columns_per_completion():
    fn = {"v": load_reward("rewards_for_tests:varied")}
    result = score(fn, [1.0], ["a", "b", "c", "d"], n=2, answer=["1", "2"])
    # varied = sum(completion_ids) % 5 / 4: ids [1, 2] for the first chunk, [3] for the second
    assert result.rewards.tolist() == [[0.75, 0.75], [0.75, 0.75]]


@pytest.mark.parametrize("name", ["sleepy", "stubborn", "crashes"])
def test_a_hanging_or_crashing_completion_costs_only_itself(name):
    """A completion that hangs (even ignoring SIGTERM) or kills its worker scores 0 and counts as
    timed out; the others are scored, and the pool goes on with a replacement worker."""
    fn = {name: load_reward(f"rewards_for_tests:{name}")}
    bad = "crash" if name == "crashes" else "hang"
    texts = ["ok", bad, "ok", "ok", "ok", bad, "ok", "ok"]
    result = score(fn, [1.0], texts, n=4, timeout=0.5)
    good = 0.5 if name == "crashes" else 1.0
    assert result.rewards.flatten().tolist() == [good, 0.0, good, good, good, 0.0, good, good]
    assert result.timeouts == 2 and result.retried == 2  # each scored twice before it counts


def test_the_bound_is_the_scorings_cpu_time_not_the_wait_for_a_core():
    """A reward that waits 0.3 s using no CPU (as a worker starved by a busy machine does) is not
    cut by a 0.1 s bound; one that computes for a second is, CPU time being what the bound counts."""
    waits = {"w": load_reward("rewards_for_tests:waits")}
    result = score(waits, [1.0], ["a", "b"], n=2, timeout=0.1, wall_timeout=10.0)
    assert result.rewards.tolist() == [[1.0, 1.0]] and result.timeouts == 0 and result.retried == 0
    busy = {"b": load_reward("rewards_for_tests:busy")}
    result = score(busy, [1.0], ["ok", "busy", "ok", "ok"], n=2, timeout=0.1, wall_timeout=10.0)
    assert result.rewards.tolist() == [[1.0, 0.0], [1.0, 1.0]] and result.timeouts == 1 and result.retried == 1


def test_a_failure_that_a_second_try_recovers_costs_nothing(tmp_path):
    fn = {"c": load_reward("rewards_for_tests:crashes_once")}
    result = score(fn, [1.0], ["a", "b", "c", "d"], n=2, flag=[str(tmp_path / "f"), str(tmp_path / "g")])
    assert result.rewards.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert result.timeouts == 0 and result.retried == 4


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("text", ["hang", "spin", "fork hang"])
def test_a_rewards_child_processes_end_with_its_timeout_and_with_the_pool(tmp_path, text):
    """What a reward starts (a subprocess, a fork) ends when the reward is stopped at its bound
    (wall time: "hang"; CPU time: "spin"), not 300 s later; what it leaves running when it returns
    ends with the pool."""
    from podsrl.rewards import pool as reward_pool
    from rewards_for_tests import spawns

    pids = tmp_path / "pids"
    started = lambda: [int(p) for p in pids.read_text().split()] if pids.exists() else []
    pool = reward_pool.RewardPool(workers=1, timeout=0.3, wall_timeout=0.6)
    try:
        assert pool.outcome(pool.submit(spawns, [text], [str(pids)])) is reward_pool.TIMED_OUT
        assert len(started()) == 1 and ended_within(started(), 5.0)
        assert pool.outcome(pool.submit(spawns, ["ok"], [str(pids)])) == [1.0]
        left = started()[-1]
        assert running(left)  # the reward returned: its child runs on, until the pool ends
    finally:
        pool.close()
    assert ended_within([left], 5.0)


def test_reward_workers_run_one_openmp_thread():
    result = score({"t": load_reward("rewards_for_tests:threads")}, [1.0], ["a", "b"], n=2)
    assert result.rewards.tolist() == [[101.0, 101.0]]


def test_failed_scoring_is_on_the_console_and_in_the_metrics(tiny_config, caplog):
    from podsrl.trainer import train
    import json
    import logging

    with caplog.at_level(logging.WARNING, logger="podsrl.trainer"):
        out = train(tiny_config("rewards=[rewards_for_tests:always_crashes]", "steps=1"))
    row = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()][-1]
    assert row["reward_timeouts"] == 2 * 4 and row["reward_retries"] == 2 * 4  # 2 prompts x n = 4, each tried twice
    assert any("step 1: 8 rollout(s) scored 0" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("name,message", [
    ("raises", "reward 'rewards_for_tests:raises' raised ValueError: no answer column"),
    ("strings", "returned a non-numeric value 'abc'"),
    ("scalar", "must return a list, got float"),
    ("nan_reward", "returned NaN or inf"),
])
@pytest.mark.parametrize("workers", [None, 0])
def test_a_broken_user_reward_is_one_clear_error(name, message, workers):
    fn = {f"rewards_for_tests:{name}": load_reward(f"rewards_for_tests:{name}")}
    with pytest.raises(PodsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        score(fn, [1.0], ["a", "b"], n=2, workers=workers)


@pytest.mark.parametrize("workers", [None, 0])
def test_async_rewards(workers):
    fn = {"len": load_reward("rewards_for_tests:async_length")}
    result = score(fn, [1.0], ["a", "bb", "ccc", "dddd"], n=2, workers=workers)
    assert result.rewards.tolist() == [[1.0, 2.0], [3.0, 4.0]] and result.timeouts == 0
    if workers is None:  # bounded in the pool: a call that overruns scores 0
        result = score(fn, [1.0], ["a", "hang", "ccc", "dddd"], n=2, timeout=0.3, wall_timeout=0.3)
        assert result.rewards.tolist() == [[1.0, 0.0], [3.0, 4.0]] and result.timeouts == 1


def test_groups_are_sent_to_the_pool_as_they_arrive():
    """``add`` schedules a chunk's work and returns; ``result`` collects it."""
    scorer = Scorer({"v": load_reward("rewards_for_tests:varied")}, [1.0])
    step = scorer.start({"prompts": ["p0", "p1"]}, 2)
    step.add(0, ["a", "b"], [[1], [2]])
    assert len(step.pending) == 2  # both completions of the first group are in the pool
    step.add(1, ["c", "d"], [[3], [4]])
    assert len(step.pending) == 4
    assert step.result().rewards.tolist() == [[0.25, 0.5], [0.75, 1.0]]
    scorer.close()
    assert multiprocessing.active_children() == []  # the workers end with the scorer


def test_training_scores_through_the_pool_and_ends_it(tiny_config):
    from podsrl.trainer import train
    import json

    out = train(tiny_config("rewards=[rewards_for_tests:varied,accuracy]", "reward_weights=[1.0,1.0]"))
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert all(r["reward_timeouts"] == 0 and r["scoring_s"] >= 0 for r in steps)
    assert all("scored_reward/rewards_for_tests:varied" in r and "scored_reward/accuracy" in r for r in steps)
    assert multiprocessing.active_children() == []
    assert torch.tensor([r["generated_reward_std"] for r in steps]).gt(0).any()


def test_each_completion_is_told_whether_it_was_cut_at_the_length_limit():
    """``truncated``: max_new_tokens ids with no end of sequence last; a completion that ends with
    its end of sequence at the limit, or before it, was not cut. The accuracy reward then pays a
    cut completion's unmarked number nothing."""
    seen = []

    def record(completions, truncated, **_):
        seen.extend(truncated)
        return [0.0] * len(completions)

    scorer = Scorer({"record": record, "accuracy": REWARDS["accuracy"]}, [1.0, 1.0], workers=0)
    scores = scorer.start({"answer": ["12"]}, 4, max_new_tokens=3, eos_ids=[0])
    scores.add(0, ["so 12", "so 12", "so 12", "so 12"], [[5, 6, 7], [5, 0], [5, 6, 0], [5]])
    assert seen == [True, False, False, False]
    assert scores.result().rewards.tolist() == [[0.0, 1.0, 1.0, 1.0]]


HELD_AFTER_FREE = """
import re
from podsrl.rewards.pool import RewardPool

def resident_mib():
    return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) // 1024

block = b"x" * (1 << 30)  # 1 GiB written, so resident, then freed (the heap keeps it: MALLOC_* below)
del block
pool = RewardPool(workers=1)
try:
    print(resident_mib(), pool.outcome(pool.submit(resident_mib)))
finally:
    pool.close()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap, read in /proc")
def test_a_forked_worker_gives_back_the_free_heap_it_inherits():
    """A trainer whose heap keeps what it frees forks its reward workers after an evaluation has
    freed gigabytes: each worker hands back its copy of those free blocks, so it does not hold them
    (the pages the trainer then reuses would otherwise be a second copy in every worker)."""
    import os
    import subprocess

    env = os.environ | {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(64 * 2**30)}
    done = subprocess.run([sys.executable, "-c", HELD_AFTER_FREE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    trainer, worker = map(int, done.stdout.split())
    assert trainer >= 1024  # the freed GiB is still the trainer's
    assert worker < trainer - 768  # and not the worker's


SIGNALLED_WHILE_CLOSING = """
import os, signal, time
from podsrl.errors import Terminated, raise_terminated
from podsrl.rewards.pool import RewardPool

def running(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False

signal.signal(signal.SIGTERM, raise_terminated)
pool = RewardPool(workers=1)
worker = pool.outcome(pool.submit(os.getpid))
stop = pool._pool.stop

def stop_then_signalled():  # the second SIGTERM of a stop arrives while the pool closes
    stop()
    os.kill(os.getpid(), signal.SIGTERM)

pool._pool.stop = stop_then_signalled
try:
    pool.close()
    said = "closed"
except Terminated:
    said = "terminated"
deadline = time.monotonic() + 5
while running(worker) and time.monotonic() < deadline:
    time.sleep(0.05)
print(said, worker, "running" if running(worker) else "ended", flush=True)
os._exit(0)  # not multiprocessing's exit, which joins the workers: a live one would hold it forever
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups, read in /proc")
def test_a_sigterm_while_the_pool_closes_waits_until_its_workers_have_ended():
    """A stop can bring two SIGTERMs (a scheduler signals the whole process group, and compare
    passes the signal on to each run): the second, arriving while the reward pool closes, must not
    cut the close short and leave a worker alive, which the exiting training process would wait
    for forever. It takes effect once the pool has closed."""
    import os
    import signal
    import subprocess

    done = subprocess.run([sys.executable, "-c", SIGNALLED_WHILE_CLOSING], capture_output=True, text=True, timeout=120)
    said, worker, state = done.stdout.split()
    if state == "running":
        os.killpg(int(worker), signal.SIGKILL)
    assert (said, state) == ("terminated", "ended"), done.stderr
