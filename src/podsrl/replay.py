"""``replay=true``: a run that lost its checkpoint trains its logged steps again instead of
discarding them.

Training is deterministic on one machine: rollouts are seeded per prompt and row, held-out
evaluation forks the random state, and a resumed run continues exactly. So the steps a run has
logged can be trained again, without their evaluations (most of a small model's step cost on a
CPU), to reach the state the run had, and each replayed step is checked against its record: the
rewards, lengths, loss, gradient norm and counts must be the logged ones, to the last digit. Times
and memory, which any two runs differ in, are not checked; the logged ones stand.

A run that kept its completions (``save_rollouts``) is replayed on them: no step generates, so a
replay costs each step's scoring and update alone, and it holds on another machine, where rounding
would have sampled other tokens; the update's arithmetic may still round otherwise there, so its
non-integer fields are checked to a relative :data:`REL_TOL`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from podsrl.checkpoint import read_metrics
from podsrl.errors import PodsError

EVAL_KEYS = ("eval_accuracy", "eval_seconds", "eval_step")
NOT_CHECKED = frozenset({*EVAL_KEYS, "train_seconds", "train_cpu_seconds", "reward_retries"})
"""Fields of a step's record that a replay need not reproduce: its evaluation (not run again),
its clock, and scoring retries (a reward's second try that succeeded). Fields ending in ``_s``
(seconds) or ``_mb`` (memory) are not checked either."""


class ReplayMismatch(PodsError):
    """A replayed step whose record differs from the logged one."""


def checked(key: str) -> bool:
    """Whether a replayed step must reproduce its record's field ``key``."""
    return key not in NOT_CHECKED and not key.endswith(("_s", "_mb"))


def replay_records(run_dir: Path, start_step: int) -> dict[int, dict]:
    """The logged training records of ``run_dir``'s steps after ``start_step``, by step (records
    of evaluations alone, such as step 0's, are not steps to train)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return {}
    return {r["step"]: r for r in read_metrics(path) if r["step"] > start_step and "generation_s" in r}


REL_TOL = 1e-4
"""How far a non-integer field of a step trained again on its recorded completions may differ
from its record: by the rounding of another machine's arithmetic, which shifts a loss or gradient
norm in its 6th or 7th digit, not by a different computation."""


def same(a, b, exact: bool) -> bool:
    """Whether two values of a record's field agree: as JSON writes them (NaN equals NaN), or, not
    ``exact``, floats to :data:`REL_TOL`."""
    if json.dumps(a) == json.dumps(b):
        return True
    if exact or not all(isinstance(v, float) for v in (a, b)):
        return False
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=REL_TOL * 1e-3)


def check_replayed(logged: dict, replayed: dict, run_dir: Path, exact: bool = True) -> None:
    """Raise :class:`ReplayMismatch` naming the first checked field in which the replayed record
    differs from the logged one: in any digit where the step sampled its completions again
    (``exact``), else beyond rounding (:func:`same`)."""
    for key in sorted(set(logged) | set(replayed)):
        if checked(key) and not same(logged.get(key), replayed.get(key), exact):
            raise ReplayMismatch(
                f"replay=true: step {logged['step']} of {run_dir} trained again differs from its record "
                f"({key}: logged {json.dumps(logged.get(key))}, replayed {json.dumps(replayed.get(key))}); the run "
                "is not reproducible here (another machine's arithmetic, or changed code): set replay=false to "
                "train it again from its checkpoint or step 0")
