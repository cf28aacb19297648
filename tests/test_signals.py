"""The signal gate of slotscope/partial.py, in process: a signal always stops the command.

A stop that library code swallowed on the way up (a finalizer, a callback that ignores errors) is raised again
at the next step's end; SIGINT and SIGTERM blocked in the mask the command inherited are unblocked; a signal
held over a step's two writes acts when they are done; outside a command nothing is raised.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import ROOT
from slotscope.partial import RunStopped, signals_held, stop_if_signalled, stop_on_signals


def _deliver(sig: int) -> None:
    os.kill(os.getpid(), sig)
    for _ in range(100):         # the handler runs at the main thread's next bytecode boundary
        time.sleep(0.01)


@pytest.mark.parametrize("sig, exc", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, RunStopped)])
def test_a_swallowed_stop_is_raised_again_at_the_next_step(sig, exc):
    with stop_on_signals():
        stop_if_signalled()                      # no signal yet: nothing
        try:
            _deliver(sig)
        except BaseException as e:               # what a finalizer's caller would do with it
            assert isinstance(e, exc)
        else:
            pytest.fail("the signal did not stop the command")
        with pytest.raises(exc):
            stop_if_signalled()
    stop_if_signalled()                          # the command is over: the next one starts unsignalled
    with stop_on_signals():
        stop_if_signalled()


_CHILD = """
import os, signal, sys, time
from slotscope.partial import RunStopped, stop_on_signals
try:
    with stop_on_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
except RunStopped:
    sys.exit(7)
sys.exit(0)
"""


def test_signals_blocked_in_the_inherited_mask_still_stop_the_command():
    # a child whose every thread starts with both signals blocked, as one started by a thread that blocked them
    def blocked():
        signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM))

    proc = subprocess.run([sys.executable, "-c", _CHILD], preexec_fn=blocked, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 7, proc.stderr


def test_a_held_signal_acts_when_the_section_ends_and_not_inside_it():
    with stop_on_signals():
        with pytest.raises(KeyboardInterrupt):
            with signals_held():
                _deliver(signal.SIGINT)
                inside = True                    # reached: the signal waited
        assert inside


def test_outside_a_command_nothing_is_raised():
    stop_if_signalled()
    with signals_held():
        pass


def test_a_bare_assert_says_where_it_was_raised():
    """An engine's bare ``assert`` has no message: the run's "incomplete" entry names the file, line and function."""
    from slotscope.partial import stop_marker

    def checks_a_block():
        raise AssertionError        # what a bare assert raises outside pytest's rewriting

    try:
        checks_a_block()
    except AssertionError as e:
        marker = stop_marker(e, 16)
    assert marker["error"].startswith("AssertionError (raised at ") and "/tests/test_signals.py:" in marker["error"]
    assert marker["error"].endswith(" in checks_a_block)") and marker["steps_done"] == 16
    try:
        raise ValueError("pages freed twice")
    except ValueError as e:
        assert stop_marker(e, 0)["error"] == "ValueError: pages freed twice"
