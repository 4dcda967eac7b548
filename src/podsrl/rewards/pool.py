"""A pool of worker processes that bounds every reward computation.

Each task has two bounds, both counted from the moment its worker starts it: ``timeout`` seconds
of the worker's CPU time (a kernel timer, ``ITIMER_PROF``, whose signal ends the worker: it holds
inside C code too, such as sympy's big-integer arithmetic, and it measures the scoring, not the
time a starved worker waits for a core on a busy machine), and ``wall_timeout`` seconds of wall
time (pebble stops the worker: a reward that waits rather than computes, on a sleep, a lock or
the network). A worker that crashes (a segfault, ``os._exit``) or runs out of its memory cap
(``memory_mb`` of address space beyond what it holds at start) costs only its task. These come
back as :data:`TIMED_OUT`, as does a task
that returns :class:`Unscored` (a task's own verifier that raised on a completion); the caller runs such a task once more (:meth:`RewardPool.again`)
before it counts as failed. Whatever else a task raises, ``SystemExit`` included, comes back as a
:class:`RewardFailure`. Workers are forked from the process that made the pool, after it has
imported math-verify, warm it up before taking a task, so no task pays for an import, and run one
OpenMP thread each. (Forked, not spawned: a spawned worker would re-run the user's script, and a
TRL script rarely has a ``__main__`` guard.) On Linux each worker leads a process group of its
own, which whatever a reward starts (a subprocess, a fork) joins: the group is killed once its
worker has ended (stopped at a bound, or dead) and when the pool closes, so no child of a reward
outlives its bound or the pool (one that leaves the group, ``start_new_session``, does). The pool
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
import sys
import threading
from typing import Any, Callable, NamedTuple

import pebble
from pebble import ProcessExpired, ProcessPool

from podsrl.errors import first_line, interrupts_deferred
from podsrl.rewards.answers import verify_answer

log = logging.getLogger(__name__)

TIMED_OUT = object()
"""The outcome of a task that ran past the time bound, whose worker died, or that was
:class:`Unscored`."""

DEFAULT_TIMEOUT_S = 1.0  # CPU seconds
DEFAULT_WALL_TIMEOUT_S = 30.0
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


GROUPS = sys.platform.startswith("linux")
"""Whether workers lead process groups that end with them (it needs /proc to tell a worker's pid
from a later process's)."""


def _worker_init(memory_mb: int = 0, pids_fd: int | None = None) -> None:
    if GROUPS:  # a group of its own, which the processes a reward starts join; the pool learns its id
        os.setpgid(0, 0)
        os.write(pids_fd, f"{os.getpid()}\n".encode())
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # die at once when killed, even inside C code
    signal.signal(signal.SIGPROF, signal.SIG_DFL)  # the CPU-time bound: ends the worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle
    # the free heap blocks inherited from the training process, given back: where its heap keeps
    # what it frees (MALLOC_MMAP_MAX_=0, a high MALLOC_TRIM_THRESHOLD_), gigabytes after an
    # evaluation, of which this worker would keep a copy of every page the trainer reuses
    from podsrl.memory import trim_heap

    trim_heap()
    os.environ["OMP_NUM_THREADS"] = "1"  # a grade needs no thread pool, and a busy machine stalls one
    if "torch" in sys.modules:  # inherited from the training process with its thread count
        sys.modules["torch"].set_num_threads(1)
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


def _guarded(cpu_s: float, fn: Callable, *args):
    """In a worker: ``fn(*args)`` within ``cpu_s`` seconds of CPU time (past them the kernel's
    SIGPROF ends the worker). Running out of memory ends the worker too (either way it is replaced
    and the task comes back TIMED_OUT); anything else raised comes back as a :class:`RewardFailure`."""
    signal.setitimer(signal.ITIMER_PROF, cpu_s)
    try:
        return fn(*args)
    except MemoryError:
        os._exit(OUT_OF_MEMORY_EXIT)
    except BaseException as e:  # noqa: BLE001 (SystemExit, KeyboardInterrupt of the user's code too)
        raise RewardFailure(type(e).__name__, first_line(e)) from None
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)


class RewardPool:
    """``submit(fn, *args)`` runs ``fn(*args)`` in a worker, bounded by ``timeout`` seconds of CPU
    time and ``wall_timeout`` seconds of wall time from the moment a worker takes it;
    :meth:`outcome` gives its value or TIMED_OUT, :meth:`again` runs a task once more."""

    def __init__(self, workers: int | None = None, timeout: float = DEFAULT_TIMEOUT_S, memory_mb: int = 0,
                 wall_timeout: float = DEFAULT_WALL_TIMEOUT_S):
        self.workers = workers or available_cores()
        self.timeout, self.memory_mb, self.wall_timeout = timeout, memory_mb, max(wall_timeout, timeout)
        import math_verify  # noqa: F401 (imported once here, inherited by every forked worker)

        self._pids, pids_w = os.pipe()  # each worker writes its pid (its group's id) here
        os.set_blocking(self._pids, False)
        self._groups: set[int] = set()
        self._pool = ProcessPool(max_workers=self.workers, initializer=_worker_init, initargs=(memory_mb, pids_w),
                                 context=multiprocessing.get_context("fork"))
        self._pids_w = pids_w

    def start(self) -> None:
        """Fork the workers now (else the first task does): a training process starts them before
        its model loads, so that they hold no copy of its weights or optimizer state, whose stale
        pages they would keep once its updates rewrite them."""
        self.outcome(self.submit(os.getpid), wait_s=safety_wait(self, 1))

    def submit(self, fn: Callable, *args, timeout: float | None = None,
               wall_timeout: float | None = None) -> concurrent.futures.Future:
        """Run ``fn(*args)`` in a worker, bounded by ``timeout`` CPU seconds and ``wall_timeout``
        seconds (default: the pool's)."""
        cpu, wall = timeout or self.timeout, wall_timeout or self.wall_timeout
        future = self._pool.schedule(_guarded, args=(cpu, fn, *args), timeout=max(wall, cpu))
        future.podsrl_task = (fn, args, timeout, wall_timeout)
        return future

    def again(self, future: concurrent.futures.Future) -> concurrent.futures.Future:
        """The task of ``future`` (one that came back TIMED_OUT), submitted once more."""
        fn, args, timeout, wall_timeout = future.podsrl_task
        return self.submit(fn, *args, timeout=timeout, wall_timeout=wall_timeout)

    def outcome(self, future: concurrent.futures.Future, wait_s: float | None = None) -> Any:
        """The task's value, or TIMED_OUT; an exception raised by the task itself propagates.
        ``wait_s`` caps the wait for a task that has not started (a safety net: the pool's own
        bound applies once it runs)."""
        try:
            value = future.result(timeout=wait_s)
        except (TimeoutError, concurrent.futures.TimeoutError, ProcessExpired):
            future.cancel()
            self._end_groups()  # what the stopped task started
            return TIMED_OUT
        if isinstance(value, Unscored):
            _log_unscored(value.reason)
            return TIMED_OUT
        return value

    def close(self) -> None:
        """Stop the workers and end their groups. Ctrl-C or SIGTERM waits until they are ended
        (a stop often brings two: a job scheduler signals a whole process group, whose driver passes
        it on): cut short, the workers would live on, and the training process, which joins its
        children as it exits, with them."""
        with interrupts_deferred():
            self._pool.stop()
            self._pool.join(timeout=5)
            self._end_groups(every=True)
            os.close(self._pids)
            os.close(self._pids_w)

    def _end_groups(self, every: bool = False) -> None:
        """Kill the process groups of the workers that have ended (``every``: of all workers), and
        so what their tasks started."""
        if not GROUPS:
            return
        written = b""
        while True:  # each worker's line was one write, whole in the pipe: read until it is empty
            try:
                chunk = os.read(self._pids, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            written += chunk
        self._groups.update(map(int, written.split()))
        for pid in list(self._groups):
            state = _worker_state(pid)
            if state == "running" and not every:
                continue
            if state != "other":  # "other": an unrelated process has the number now, and the group is not ours
                _kill_group(pid)
            self._groups.discard(pid)


def _worker_state(pid: int) -> str:
    """``running``: a worker of this process; ``ended``: it has ended (its group may live on, and
    keeps the number from reuse); ``other``: the number names an unrelated process now."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state, ppid = f.read().rpartition(")")[2].split()[:2]
    except FileNotFoundError:
        return "ended"
    if int(ppid) != os.getpid():
        return "other"
    return "ended" if state == "Z" else "running"


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # nothing left in it
        pass


_lock = threading.Lock()
_pool: RewardPool | None = None
_settings: dict = {"workers": None, "timeout": DEFAULT_TIMEOUT_S, "memory_mb": 0, "wall_timeout": DEFAULT_WALL_TIMEOUT_S}


def configure(workers: int | None = None, timeout: float = DEFAULT_TIMEOUT_S, memory_mb: int = 0,
              wall_timeout: float = DEFAULT_WALL_TIMEOUT_S) -> None:
    """Settings of the process-wide pool (``workers`` None: every available core; ``memory_mb``
    0: no cap); a running pool with other settings is replaced."""
    global _pool
    with _lock:
        _settings.update(workers=workers, timeout=timeout, memory_mb=memory_mb, wall_timeout=wall_timeout)
        if _pool is not None and (_pool.workers != (workers or available_cores()) or _pool.timeout != timeout
                                  or _pool.memory_mb != memory_mb or _pool.wall_timeout != max(wall_timeout, timeout)):
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
    a call past its bound twice gives TIMED_OUT."""
    if not argument_tuples:
        return []
    pool = get_pool()
    futures = [pool.submit(fn, *args) for args in argument_tuples]
    outcomes = [pool.outcome(f, wait_s=safety_wait(pool, len(futures))) for f in futures]
    again = {i: pool.again(futures[i]) for i, o in enumerate(outcomes) if o is TIMED_OUT}
    for i, future in again.items():
        outcomes[i] = pool.outcome(future, wait_s=safety_wait(pool, len(again)))
    return outcomes


def safety_wait(pool: RewardPool, tasks: int) -> float:
    """How long to wait for a task at most: every queued task at the bound, and a margin."""
    return pool.wall_timeout * (tasks / pool.workers + 2) + 30.0
