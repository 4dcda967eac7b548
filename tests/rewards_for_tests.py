"""Reward functions used by the tests through the ``module:function`` import path."""


def varied(completions, completion_ids, **_):
    """A deterministic reward that differs between completions (even of a random model)."""
    return [float(sum(ids) % 5) / 4 for ids in completion_ids]


def nan_reward(completions, **_):
    return [float("nan")] * len(completions)


def sometimes_none(completions, **_):
    return [None if i % 2 else 1.0 for i in range(len(completions))]


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
