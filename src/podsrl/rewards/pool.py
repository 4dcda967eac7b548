"""A pool of worker processes that bounds the wall time of every reward computation.

A task that runs past ``timeout`` seconds has its worker killed (SIGTERM, which the workers do not
handle, so C-level work such as sympy's big-integer arithmetic stops too) and replaced; a worker
that crashes (a segfault, ``os._exit``) or runs out of its memory cap (``memory_mb`` of address
space beyond what it holds at start) costs only its task. These come back as :data:`TIMED_OUT`, as
does a task that returns :class:`Unscored` (a task's own verifier that raised on a completion).
Whatever else a task raises, ``SystemExit`` included, comes back as a :class:`RewardFailure`.
Workers are forked from the process that made the pool, after it has imported math-verify, and
warm it up before taking a task, so no task pays for an import. (Forked, not spawned: a spawned
worker would re-run the user's script, and a TRL script rarely has a ``__main__`` guard.) The pool
is started on first use and lives until :func:`shutdown` (or the interpreter's exit).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import multiprocessing
import os
import re
import resource
import signal
import threading
from typing import Any, Callable, NamedTuple

import pebble
from pebble import ProcessExpired, ProcessPool

from podsrl.errors import first_line
from podsrl.rewards.answers import verify_answer

log = logging.getLogger(__name__)

TIMED_OUT = object()
"""The outcome of a task that ran past the time bound, whose worker died, or that was
:class:`Unscored`."""

DEFAULT_TIMEOUT_S = 1.0
# pebble stops an overrunning worker with SIGTERM and waits this long before SIGKILL; a worker
# whose task ignores SIGTERM would otherwise hold its completion 3 s past the bound
pebble.CONSTS.term_timeout = 0.05


def available_cores() -> int:
    """CPU cores this process may use, shared among the processes of this machine's launch."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def _worker_init(memory_mb: int = 0) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # die at once when killed, even inside C code
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle
    verify_answer("1", "1")  # math-verify's first call builds its parsers: not on a task's clock
    if memory_mb:  # address space beyond what the warmed-up worker holds
        held = int(re.search(r"VmSize:\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (held + memory_mb * 2**20, resource.RLIM_INFINITY))


class RewardFailure(Exception):
    """What a reward raised in a worker, whatever it was (``SystemExit`` included): its type's
    name and its message, so the training process reports it like any failing reward."""

    def __init__(self, kind: str, message: str):
        super().__init__(kind, message)
        self.kind, self.message = kind, message


class Unscored(NamedTuple):
    """What a task returns when it could not score its completion, for a reason that is not the
    user's to fix (a data set's own verifier raised on a model's answer, say): the completion scores
    0 and counts like a timeout, and ``reason`` is logged the first time it is seen."""

    reason: str


MAX_LOGGED_REASONS = 5  # distinct Unscored reasons logged per process; later ones are only counted
_logged_reasons: set[str] = set()


def _log_unscored(reason: str) -> None:
    if reason not in _logged_reasons and len(_logged_reasons) < MAX_LOGGED_REASONS:
        _logged_reasons.add(reason)
        log.warning("reward: %s (scored 0, counted in reward_timeouts)", reason)


OUT_OF_MEMORY_EXIT = 86  # a worker that ran out of its memory cap ends itself with this code


def _guarded(fn: Callable, *args):
    """In a worker: ``fn(*args)``. Running out of memory ends the worker (it is replaced, and the
    task comes back TIMED_OUT); anything else raised comes back as a :class:`RewardFailure`."""
    try:
        return fn(*args)
    except MemoryError:
        os._exit(OUT_OF_MEMORY_EXIT)
    except BaseException as e:  # noqa: BLE001 (SystemExit, KeyboardInterrupt of the user's code too)
        raise RewardFailure(type(e).__name__, first_line(e)) from None


class RewardPool:
    """``submit(fn, *args)`` runs ``fn(*args)`` in a worker, bounded by ``timeout`` seconds of
    wall time from the moment a worker takes it; :meth:`outcome` gives its value or TIMED_OUT."""

    def __init__(self, workers: int | None = None, timeout: float = DEFAULT_TIMEOUT_S, memory_mb: int = 0):
        self.workers = workers or available_cores()
        self.timeout, self.memory_mb = timeout, memory_mb
        import math_verify  # noqa: F401 (imported once here, inherited by every forked worker)

        self._pool = ProcessPool(max_workers=self.workers, initializer=_worker_init, initargs=(memory_mb,),
                                 context=multiprocessing.get_context("fork"))

    def submit(self, fn: Callable, *args, timeout: float | None = None) -> concurrent.futures.Future:
        """Run ``fn(*args)`` in a worker, bounded by ``timeout`` (default: the pool's)."""
        return self._pool.schedule(_guarded, args=(fn, *args), timeout=timeout or self.timeout)

    def outcome(self, future: concurrent.futures.Future, wait_s: float | None = None) -> Any:
        """The task's value, or TIMED_OUT; an exception raised by the task itself propagates.
        ``wait_s`` caps the wait for a task that has not started (a safety net: the pool's own
        bound applies once it runs)."""
        try:
            value = future.result(timeout=wait_s)
        except (TimeoutError, concurrent.futures.TimeoutError, ProcessExpired):
            future.cancel()
            return TIMED_OUT
        if isinstance(value, Unscored):
            _log_unscored(value.reason)
            return TIMED_OUT
        return value

    def close(self) -> None:
        self._pool.stop()
        self._pool.join(timeout=5)


_lock = threading.Lock()
_pool: RewardPool | None = None
_settings: dict = {"workers": None, "timeout": DEFAULT_TIMEOUT_S, "memory_mb": 0}


def configure(workers: int | None = None, timeout: float = DEFAULT_TIMEOUT_S, memory_mb: int = 0) -> None:
    """Settings of the process-wide pool (``workers`` None: every available core; ``memory_mb``
    0: no cap); a running pool with other settings is replaced."""
    global _pool
    with _lock:
        _settings.update(workers=workers, timeout=timeout, memory_mb=memory_mb)
        if _pool is not None and (_pool.workers != (workers or available_cores()) or _pool.timeout != timeout
                                  or _pool.memory_mb != memory_mb):
            _pool.close()
            _pool = None


def get_pool() -> RewardPool:
    """The process-wide pool, started on first use."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = RewardPool(**_settings)
        return _pool


@atexit.register
def shutdown() -> None:
    """Stop the process-wide pool and its workers (a later :func:`get_pool` starts a new one)."""
    global _pool
    with _lock:
        if _pool is not None:
            _pool.close()
            _pool = None


def bounded_map(fn: Callable, argument_tuples: list[tuple]) -> list:
    """``[fn(*args) for args in argument_tuples]`` on the process-wide pool, each call bounded;
    a call past the bound gives TIMED_OUT."""
    if not argument_tuples:
        return []
    pool = get_pool()
    futures = [pool.submit(fn, *args) for args in argument_tuples]
    return [pool.outcome(f, wait_s=safety_wait(pool, len(futures))) for f in futures]


def safety_wait(pool: RewardPool, tasks: int) -> float:
    """How long to wait for a task at most: every queued task at the bound, and a margin."""
    return pool.timeout * (tasks / pool.workers + 2) + 30.0
