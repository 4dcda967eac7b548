"""Signals held back over a write that must not be cut short."""

import os
import signal
import threading
import time

import pytest

from conftest import REPO, install_command
from podsrl.errors import Terminated, interrupts_deferred


def wait_for_delivery():
    time.sleep(0.05)  # Python runs a handler between bytecodes, soon after the signal arrives


def test_ctrl_c_inside_the_block_is_raised_after_it():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            wait_for_delivery()
            done.append("rest of the block")
    assert done == ["rest of the block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is back


def test_sigterm_goes_to_the_handler_that_was_set_once_and_only_the_first_signal_acts():
    calls = []

    def terminate(signum, frame):
        calls.append(signum)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        with pytest.raises(Terminated):
            with interrupts_deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                wait_for_delivery()
                os.kill(os.getpid(), signal.SIGINT)
                wait_for_delivery()
                assert calls == []
        assert calls == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is terminate
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_block_without_signals_and_one_off_the_main_thread_run_as_they_are():
    with interrupts_deferred():
        pass
    seen = []

    def in_a_thread():
        with interrupts_deferred():  # signal.signal would raise ValueError here
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]


# --------------------------------------------------------------------------- install commands

def test_every_install_command_names_an_extra_pyproject_declares():
    """Each message naming an extra names one that exists, so the command it gives installs
    something: install_hint("...") in the source, and the integrations' packages (their refusals
    name the package as the extra)."""
    import re
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    calls = r"install_hint\([\"'](\w+)[\"']\)|(?:import_required|refuse_unsupported)\(\"[\w.]+\", \"(\w+)\""
    named = {a or b for f in (REPO / "src").rglob("*.py") for a, b in re.findall(calls, f.read_text())}
    assert {"gym", "trl", "verl", "vllm", "qlora"} <= named
    assert named <= set(extras), named - set(extras)


def test_the_install_command_installs_this_checkout_not_a_package_of_that_name(monkeypatch, tmp_path):
    """podsrl is not on PyPI: the command is pip on the checkout this podsrl runs from, where it
    is one; installed elsewhere, it says where to run it."""
    import podsrl.errors as errors

    assert errors.install_hint("gym") == install_command("gym")
    monkeypatch.setattr(errors, "__file__", str(tmp_path / "lib" / "podsrl" / "errors.py"))
    assert errors.install_hint("gym") == "pip install -e '.[gym]' in podsrl's repository"
