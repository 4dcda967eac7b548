"""The tests' own helpers (conftest.py) where a mistake in them would hide a failure."""

import sys
import textwrap

import psutil
import pytest

from conftest import run_showing_stacks

# a process that starts a second and then both wait, each in a function named for it
HANGS = textwrap.dedent('''
    import subprocess, sys, time

    def parent_waits_here():
        child = subprocess.Popen([sys.executable, "-c", CHILD])
        print(child.pid, flush=True)
        time.sleep(600)

    CHILD = "import time\\ndef child_waits_here():\\n    time.sleep(600)\\nchild_waits_here()"
    parent_waits_here()
''')


@pytest.mark.slow
def test_a_command_past_its_timeout_fails_the_test_with_each_of_its_processes_stacks_and_ends():
    with pytest.raises(pytest.fail.Exception) as failed:
        run_showing_stacks([sys.executable, "-c", HANGS], timeout=3)
    said = str(failed.value)
    assert "ran past 3 s" in said
    assert "parent_waits_here" in said and "child_waits_here" in said  # both processes' stacks
    assert not [p for p in psutil.process_iter(["cmdline"]) if "child_waits_here" in " ".join(p.info["cmdline"] or [])]


def test_a_command_within_its_timeout_returns_as_subprocess_run_does():
    done = run_showing_stacks([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                              timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
