"""A run that does not finish: the signals that stop it, and the "incomplete" entry its outputs carry.

SIGTERM and SIGINT stop a run like an exception does (:func:`stop_on_signals`); a ``max_steps`` cut before
every request finished is told from a run that ended by itself by :class:`ProgressTracker`. Either way
summary.json and run.json say ``"incomplete"`` (:func:`stop_marker`, :func:`cut_marker`), and nothing of such
a run is ever shown as clean.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Optional

from engine_path.errors import EngineError
from simulator.designs.types import DesignError
from simulator.scenario import ScenarioError

from .rundir import OutputError, UsageError, output_error

#: the errors that refuse a run (exit 2): raised before it begins, they leave its directory as it was
REFUSALS: tuple[type[BaseException], ...] = (ScenarioError, DesignError, UsageError, EngineError)


class RunStopped(BaseException):
    """Raised inside a run by the SIGTERM handler of :func:`stop_on_signals` (SIGINT raises
    KeyboardInterrupt); like it, it stops the run, whose partial outputs are then written."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


class _Gate:
    """Where :func:`stop_on_signals`'s handler defers to :func:`signals_held`: a signal that arrives while a
    section is held waits in ``pending`` and acts when the outermost section ends. A flag in Python, not a
    signal mask: a process-directed signal is delivered to any thread that does not block it (OpenTelemetry's
    exporter, Ray's threads), and Python runs its handler in the main thread whatever that thread's mask."""

    held = 0
    pending: Optional[int] = None
    fire: Optional[Callable[[int], None]] = None    # the installed handler's action (None: no handler of ours)
    fired: Optional[int] = None                     # the signal that stopped this command, once it acted


@contextmanager
def stop_on_signals():
    """While inside: SIGTERM raises :class:`RunStopped` and SIGINT KeyboardInterrupt, once; a second
    signal is ignored (with a line on stderr) so the partial outputs are written whole. A no-op outside
    the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    def fire(signum: int) -> None:
        _Gate.fired = signum
        _stop(signum)

    def handler(signum, frame):
        if _Gate.fired is not None:
            print(f"slotscope: {signal.Signals(signum).name} again: still writing the partial outputs "
                  "(SIGKILL abandons them)", file=sys.stderr)
            return
        if _Gate.held:
            if _Gate.pending is None:
                _Gate.pending = signum
            return
        fire(signum)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    # a mask inherited from the parent (a thread of it that blocked them) would hold both signals forever
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM))
    old_fire, _Gate.fire = _Gate.fire, fire
    old_fired, _Gate.fired = _Gate.fired, None
    try:
        yield
    finally:
        _Gate.fire, _Gate.fired = old_fire, old_fired
        for sig, h in old.items():
            signal.signal(sig, h)


@contextmanager
def signals_held():
    """SIGINT and SIGTERM wait (deferred, not lost) while inside: a few writes that must not be cut in two, such
    as a step's line and its count, or the files that say a run is incomplete. The signal acts when the outermost
    section ends normally; a section that ends by an exception is already stopping the run, and the signal that
    waited is dropped. A no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _Gate.held += 1
    try:
        yield
    except BaseException:
        _Gate.held -= 1
        if _Gate.held == 0 and _Gate.pending is not None:
            _Gate.pending = None
        raise
    _Gate.held -= 1
    if _Gate.held == 0 and _Gate.pending is not None:
        signum, _Gate.pending = _Gate.pending, None
        if _Gate.fire is not None:
            _Gate.fire(signum)


def stop_if_signalled() -> None:
    """Raise again the stop of a signal that already acted, when the run is still going: its exception was
    swallowed on the way up (library code that ignores errors, such as a finalizer or a callback, was what
    ran when it arrived). Called at each step's end, so no signal is lost to such code for longer than a step."""
    if _Gate.fired is not None and _Gate.held == 0:
        _stop(_Gate.fired)


def _stop(signum: int) -> None:
    """The stop a signal is: KeyboardInterrupt for SIGINT, :class:`RunStopped` for SIGTERM."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise RunStopped(signum)


def _os_error_in(exc: BaseException) -> Optional[OSError]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def as_output_error(write: Callable[[], Any], path: Path, also: tuple[type[BaseException], ...] = ()) -> Any:
    """``write()``; an exception caused by an OSError (a report writer's), or one of ``also`` (the trace's span
    loss, which counts its exporter's OSErrors instead of raising them), becomes :class:`OutputError` naming
    ``path``, so a full disk ends in one line, not in another component's traceback."""
    try:
        return write()
    except Exception as e:
        if also and isinstance(e, also):
            raise OutputError(None, str(e), str(path)) from e
        ose = _os_error_in(e)
        if ose is None:
            raise
        raise output_error(ose, ose.filename or path) from e


def whole_lines(path: Path) -> None:
    """Cut a JSON-lines file back to its last whole line (a write that a full disk stopped part-way)."""
    try:
        with open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            keep = size
            while keep > 0:
                start = max(0, keep - 65536)
                f.seek(start)
                chunk = f.read(keep - start)
                nl = chunk.rfind(b"\n")
                if nl >= 0:
                    keep = start + nl + 1
                    break
                keep = start
            if keep != size:
                f.truncate(keep)
    except OSError:
        pass


class ProgressTracker:
    """Passes progress on and remembers the last (finished, total) requests, to tell a run that ended
    by itself from one cut by max_steps."""

    def __init__(self, inner: Optional[Callable[[int, int, int], None]]):
        self.inner = inner
        self.done: Optional[int] = None
        self.total: Optional[int] = None

    def __call__(self, step: int, done: int, total: int) -> None:
        self.done, self.total = done, total
        if self.inner is not None:
            self.inner(step, done, total)

    @property
    def all_finished(self) -> bool:
        return self.total is not None and self.done is not None and self.done >= self.total


def cut_marker(max_steps: Optional[int], steps_done: int, progress: ProgressTracker) -> Optional[dict[str, Any]]:
    """The "incomplete" entry of a run that ``max_steps`` stopped before its requests finished."""
    n = max_steps
    if n is None or steps_done < n or progress.all_finished:
        return None
    return {"reason": "max_steps", "message": f"stopped by max_steps = {n} before every request finished",
            "steps_done": steps_done, "max_steps": n}


def stop_marker(exc: BaseException, steps_done: int) -> dict[str, Any]:
    """The "incomplete" entry of a run that an exception or a signal stopped."""
    if isinstance(exc, RunStopped):
        name = signal.Signals(exc.signum).name
        return {"reason": name, "message": f"stopped by {name}", "steps_done": steps_done}
    if isinstance(exc, KeyboardInterrupt):
        return {"reason": "SIGINT", "message": "interrupted (^C / SIGINT)", "steps_done": steps_done}
    if isinstance(exc, OutputError):
        error = str(exc)
        return {"reason": "error", "message": f"writing the outputs failed: {error}"[:2000], "error": error[:2000],
                "steps_done": steps_done}
    error = f"{type(exc).__name__}: {exc}" if str(exc) else f"{type(exc).__name__} {raised_at(exc)}"
    return {"reason": "error", "message": f"the run failed: {error}"[:2000], "error": error[:2000],
            "steps_done": steps_done}


def raised_at(exc: BaseException) -> str:
    """Where an exception without a message was raised (a bare ``assert`` in an engine's code): "(raised at
    PATH:LINE in FUNCTION)", the path cut to its last three parts."""
    tb = exc.__traceback__
    if tb is None:
        return "(raised at an unknown place)"
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    path = "/".join(code.co_filename.replace("\\", "/").split("/")[-3:])
    return f"(raised at {path}:{tb.tb_lineno} in {code.co_name})"

