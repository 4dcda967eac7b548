"""Reward functions used by the tests through the ``module:function`` import path."""


def varied(completions, completion_ids, **_):
    """A deterministic reward that differs between completions (even of a random model)."""
    return [float(sum(ids) % 5) / 4 for ids in completion_ids]


def scored_by(completions, **_):
    """The id of the process that scored each completion: which reward worker it was."""
    import os

    return [float(os.getpid())] * len(completions)


def holds_a_model(completions, **_):
    """1.0 where the scoring process holds a transformers model (a reward worker forked after a
    model loaded keeps a copy of it), 0.0 otherwise."""
    import gc

    from transformers import PreTrainedModel

    held = any(isinstance(o, PreTrainedModel) for o in gc.get_objects())
    return [float(held)] * len(completions)


def nan_reward(completions, **_):
    return [float("nan")] * len(completions)


def sometimes_none(completions, **_):
    """Not applicable (None) to questions, 1.0 otherwise."""
    return [None if c.endswith("?") else 1.0 for c in completions]


def sleepy(completions, **_):
    """Hangs on completions that contain "hang"; 1.0 otherwise."""
    import time

    if any("hang" in c for c in completions):
        time.sleep(60)
    return [1.0] * len(completions)


def stubborn(completions, **_):
    """Ignores SIGTERM and SIGINT, then hangs on "hang" (as C-level work would)."""
    import signal
    import time

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if any("hang" in c for c in completions):
        while True:
            time.sleep(0.01)
    return [1.0] * len(completions)


def crashes(completions, **_):
    """Kills its own process on "crash" (as a segfault would)."""
    import os

    if any("crash" in c for c in completions):
        os._exit(1)
    return [0.5] * len(completions)





async def async_length(completions, **_):
    """An ``async def`` reward (TRL supports them): the length of the completion, slowly on "hang"."""
    import asyncio

    if any("hang" in c for c in completions):
        await asyncio.sleep(60)
    await asyncio.sleep(0.01)
    return [float(len(c)) for c in completions]


def raises(completions, **_):
    raise ValueError("no answer column")


def strings(completions, **_):
    return ["abc"] * len(completions)


def scalar(completions, **_):
    return 0.5


def gated(completions, completion_ids, **_):
    """``varied``, once the file named by $PODSRL_TEST_GATE exists: holds a run at its first scoring."""
    import os
    import time
    from pathlib import Path

    while not Path(os.environ["PODSRL_TEST_GATE"]).exists():
        time.sleep(0.05)
    return varied(completions, completion_ids)


def text_length(completions, **_):
    """A deterministic reward of the text alone (so a logged completion can be re-scored)."""
    return [float(len(c) % 5) / 4 for c in completions]


def varied_on_rank_zero(completions, completion_ids, **_):
    """``varied`` on the process of rank 0, 1.0 on the others (groups without signal, whose
    rollouts skip the update): the ranks then train different numbers of rollouts."""
    import os

    if os.environ.get("RANK", "0") == "0":
        return varied(completions, completion_ids)
    return [1.0] * len(completions)


def exits(completions, **_):
    """Calls sys.exit(0), as a script's main() might."""
    import sys

    sys.exit(0)


def hungry(completions, **_):
    """Allocates about 2 GB on "eat" (as a runaway sympy expansion would); 1.0 otherwise."""
    if any("eat" in c for c in completions):
        block = bytearray(2 * 2**30)
        return [float(len(block) > 0)] * len(completions)
    return [1.0] * len(completions)


def constant_on_even(completions, completion_ids, question, **_):
    """1.0 for every completion of a question whose first operand is even (a group without signal),
    ``varied`` otherwise."""
    return [1.0 if int(q.split()[0]) % 2 == 0 else v for q, v in zip(question, varied(completions, completion_ids))]


def busy(completions, **_):
    """Computes (uses CPU) for about a second on "busy"; 1.0 otherwise."""
    import time

    if any("busy" in c for c in completions):
        end = time.process_time() + 1.0
        while time.process_time() < end:
            pass
    return [1.0] * len(completions)


def waits(completions, **_):
    """Waits 0.3 s of wall time using no CPU, as a starved worker or a slow service would; 1.0."""
    import time

    time.sleep(0.3)
    return [1.0] * len(completions)


def crashes_once(completions, flag, **_):
    """Kills its own process the first time it is called for a completion (a file ``flag[0]`` +
    the completion marks the call), then scores 1.0: a failure that a second try recovers."""
    import os

    path = f"{flag[0]}-{completions[0]}"
    if not os.path.exists(path):
        open(path, "w").close()
        os._exit(1)
    return [1.0]


def threads(completions, **_):
    """The OpenMP threads a reward worker runs: the environment's and torch's."""
    import os

    import torch

    return [float(os.environ.get("OMP_NUM_THREADS", "0")) * 100 + torch.get_num_threads()] * len(completions)


def always_crashes(completions, **_):
    import os

    os._exit(1)


def spawns(completions, pid_file, **_):
    """Starts a child that would live 300 s (``sleep``, or a fork on "fork"), appends its pid to
    the file ``pid_file[0]``; then on "hang" waits for it, on "spin" computes; 1.0 otherwise."""
    import os
    import subprocess
    import time

    if "fork" in completions[0]:
        pid = os.fork()
        if pid == 0:
            time.sleep(300)
            os._exit(0)
    else:
        pid = subprocess.Popen(["sleep", "300"]).pid
    with open(pid_file[0], "a") as f:
        f.write(f"{pid}\n")
    if "hang" in completions[0]:
        time.sleep(300)
    while "spin" in completions[0]:
        pass
    return [1.0] * len(completions)


# the ranges declared for adaptive_n (podsrl.rewards.bounded)
for _fn in (varied, gated, text_length, varied_on_rank_zero, constant_on_even):
    _fn.bounds = (0.0, 1.0)


def fails_in_worker(completions, completion_ids, **_):
    """``varied``, except in the generation worker of ``async_lag``, where it raises."""
    import multiprocessing

    if multiprocessing.current_process().name == "podsrl-generation":
        raise RuntimeError("this reward fails in the generation worker")
    return varied(completions, completion_ids)
