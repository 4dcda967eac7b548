"""Bad input as one line: the exception type for it, and the one way every command-line entry
point (``podsrl`` and the benchmark drivers) turns it into ``NAME: error: ...`` and exit code 2."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Callable

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it


def install_hint(extra: str) -> str:
    """The command that installs podsrl's optional dependencies ``extra`` (pyproject's
    ``[project.optional-dependencies]``). podsrl is installed from its repository, not from PyPI, so
    the command names the checkout this podsrl runs from; installed otherwise, the checkout's folder."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file():
        return f"pip install -e {shlex.quote(f'{root}[{extra}]')}"
    return f"pip install -e '.[{extra}]' in podsrl's repository"


class PodsError(Exception):
    """A configuration, data, model or reward problem the user can fix."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is (the CLI raises it in the main thread)."""


def raise_terminated(signum, frame):
    """A SIGTERM handler: raise :class:`Terminated` in the main thread."""
    raise Terminated()


@contextlib.contextmanager
def interrupts_deferred():
    """Hold Ctrl-C and SIGTERM back until the block ends, then act on them as their handlers would
    have (KeyboardInterrupt, Terminated): for writes that must not be cut short, such as a
    checkpoint (an interrupt inside torch.save surfaces as a writer error, not as Ctrl-C). Outside
    the main thread, where handlers cannot be set, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, object]] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append((signum, frame)))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if caught:
            signum, frame = caught[0]
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), signum)


def first_line(e: BaseException) -> str:
    """An exception's message on one line (its type's name where it has none)."""
    return (str(e).strip() or type(e).__name__).splitlines()[0]


def os_reason(e: OSError) -> str:
    """The system's reason for an OSError (``No space left on device``), without Python's
    ``[Errno 28]`` or the file name."""
    return e.strerror or first_line(e)


def os_error_text(e: OSError) -> str:
    """An OSError in words: the file it concerns and the system's reason (``/x/y: No space left
    on device``)."""
    return f"{e.filename}: {os_reason(e)}" if e.filename is not None else os_reason(e)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with a usage error as one ``PROG: error: ...`` line and exit code 2 (PROG: the
    program's name, also in a subcommand's error)."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"{self.prog.split()[0]}: error: {message} (see {self.prog} --help)\n")


def _say(line: str, code: int) -> int:
    print(line, file=sys.stderr)
    return code


def one_line_errors(prog: str, say: Callable[[str, int], int] = _say):
    """Decorator of a command-line ``main``: a :class:`PodsError` or an ``OSError`` it raises (a
    missing or damaged file, a full disk, a folder that cannot be written) becomes the one line
    ``PROG: error: ...`` and exit code 2; argparse's exits (``--help``, a usage error as one
    line with :class:`ArgumentParser`) and Ctrl-C (``PROG: interrupted``, 130) end it too, without
    a traceback. ``main`` returns its exit code (None: 0). ``say(line, code)`` prints the line and
    returns the code (the CLI's waits under a launcher)."""

    def decorate(main: Callable[..., int | None]) -> Callable[..., int]:
        @functools.wraps(main)
        def run(*args, **kwargs) -> int:
            try:
                code = main(*args, **kwargs)
            except PodsError as e:
                return say(f"{prog}: error: {e}", EXIT_BAD_INPUT)
            except OSError as e:
                return say(f"{prog}: error: {os_error_text(e)}", EXIT_BAD_INPUT)
            except SystemExit as e:  # argparse: --help, or a usage error already printed
                return e.code if isinstance(e.code, int) else (0 if e.code is None else say(str(e.code), 1))
            except KeyboardInterrupt as e:
                return say("; ".join(filter(None, [f"{prog}: interrupted", str(e)])), EXIT_INTERRUPTED)
            return 0 if code is None else code

        return run

    return decorate
