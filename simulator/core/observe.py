"""The protocols by which the simulator's run loop talks to the packages that observe it.

The simulator depends on nothing else in slotscope; tracing (the boundary recorder) and the
application layer implement :class:`RunObserver`. ``on_boundary`` is called once per backend
boundary crossing, tens of thousands of times a second: implementations must only append to
buffers there (no OpenTelemetry, no I/O, no allocation of rich objects). A caller holding several
crossings at once (cuda_path/step.py: a backend's whole step) hands them over through
:func:`boundary_sink`: an observer's optional ``on_boundaries(rows)`` takes the list of their argument
tuples, else each goes to ``on_boundary`` in turn. Such a list may be a :class:`BackendRows` (one backend's
crossings of one step, each tuple made when read): an observer that needs only some of its rows can read
``head`` and ``tails`` instead of every tuple (a graph replay's tails are an :class:`EvenlyTimed`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

from simulator.records import Finding, RunInfo, StepRecord


class RunObserver(Protocol):
    def on_run_start(self, run: RunInfo) -> None: ...

    def on_step(self, step: StepRecord) -> None:
        """Called once per step, after every backend crossed it (so t_end_ns is known)."""

    def on_boundary(
        self,
        step: int,
        backend: str,
        layer: int,
        loc_len: int,
        swa_loc_len: int,          # -1 when the layer's KVWriteLoc has no swa_loc
        loc_dtype: str,
        swa_loc_dtype: str,        # "" when there is no swa_loc
        t_start_ns: int,
        t_end_ns: int,
        error: Optional[str],      # the store's error text (length mismatch), else None
    ) -> None: ...

    # optional: on_boundaries(rows: Sequence[tuple]) -> None, the same as on_boundary(*row) for each row in
    # order (see boundary_sink: used only where the class defining on_boundary defines it too)

    def on_findings(self, findings: Sequence[Finding]) -> None:
        """Called with the findings of one (step, backend) once the checker has classified them."""

    def on_run_end(self) -> None: ...


class BackendRows(Sequence):
    """One backend's crossings of one step as ``on_boundary`` argument tuples: row i is ``head + tails[i]``
    (``head``: (step, backend); ``tails[i]``: the rest), made when it is read (a list of them by ``list()``)."""

    __slots__ = ("head", "tails")

    def __init__(self, head: tuple, tails: Sequence[tuple]):
        self.head, self.tails = head, tails

    def __len__(self) -> int:
        return len(self.tails)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.head + t for t in self.tails[i]]
        return self.head + self.tails[i]

    def __iter__(self):
        return map(self.head.__add__, self.tails)

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None


class EvenlyTimed(Sequence):
    """The tails of :class:`BackendRows` for crossings that ran as one launch (a graph replay): per layer its
    static part (``static[i]``: layer, loc_len, swa_loc_len, loc_dtype, swa_loc_dtype) and an equal share of the
    launch's time, ``[t0 + i * per, t0 + (i + 1) * per)``, with no error; each tuple made when read."""

    __slots__ = ("static", "t0", "per")

    def __init__(self, static: Sequence[tuple], t0: int, per: int):
        self.static, self.t0, self.per = static, t0, per

    def __len__(self) -> int:
        return len(self.static)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self.static)))]
        n = len(self.static)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        t = self.t0 + i * self.per
        return self.static[i] + (t, t + self.per, None)

    def __iter__(self):
        t0, per = self.t0, self.per
        for i, s in enumerate(self.static):
            t = t0 + i * per
            yield s + (t, t + per, None)

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None


def boundary_sink(obs) -> Callable[[Sequence[tuple]], None]:
    """What takes a list of ``on_boundary`` argument tuples for ``obs``: its ``on_boundaries`` where it is
    set on the instance, or defined by the class that defines its ``on_boundary`` (so a subclass that
    overrides ``on_boundary`` alone, or an instance given its own, keeps it); else a loop calling its
    ``on_boundary`` per row, in order."""
    own = getattr(obs, "__dict__", {})
    if "on_boundaries" in own:
        return own["on_boundaries"]
    owner = next((c for c in type(obs).__mro__ if "on_boundary" in c.__dict__), None)
    if "on_boundary" not in own and owner is not None and "on_boundaries" in owner.__dict__:
        return obs.on_boundaries

    def each(rows: Sequence[tuple]) -> None:
        on_boundary = obs.on_boundary
        for args in rows:
            on_boundary(*args)
    return each


class NullObserver:
    """Observes nothing; the run loop's default."""

    def on_run_start(self, run: RunInfo) -> None:
        pass

    def on_step(self, step: StepRecord) -> None:
        pass

    def on_boundary(self, step, backend, layer, loc_len, swa_loc_len, loc_dtype, swa_loc_dtype,
                    t_start_ns, t_end_ns, error) -> None:
        pass

    def on_boundaries(self, rows: Sequence[tuple]) -> None:
        pass

    def on_findings(self, findings: Sequence[Finding]) -> None:
        pass

    def on_run_end(self) -> None:
        pass


class ObserverFanout:
    """Forwards every call to several observers, in order (a list of crossings, ``on_boundaries``: the whole
    list to each observer in turn, through its :func:`boundary_sink`, resolved at the first such list; observers
    keep no state in common)."""

    def __init__(self, observers: Sequence[RunObserver]):
        self._observers = tuple(observers)
        self._sinks: Optional[tuple] = None

    def on_run_start(self, run: RunInfo) -> None:
        for o in self._observers:
            o.on_run_start(run)

    def on_step(self, step: StepRecord) -> None:
        for o in self._observers:
            o.on_step(step)

    def on_boundary(self, *args) -> None:
        for o in self._observers:
            o.on_boundary(*args)

    def on_boundaries(self, rows: Sequence[tuple]) -> None:
        sinks = self._sinks
        if sinks is None:       # (a GPU step hands over each backend's rows: once per backend and step)
            sinks = self._sinks = tuple(boundary_sink(o) for o in self._observers)
        for sink in sinks:
            sink(rows)

    def on_findings(self, findings: Sequence[Finding]) -> None:
        for o in self._observers:
            o.on_findings(findings)

    def on_run_end(self) -> None:
        for o in self._observers:
            o.on_run_end()


@dataclass(frozen=True, slots=True)
class ForwardView:
    """One backend forward as an in-engine checker would see it (issue 15 point 3: SGLang's kv_canary).

    ``read_in`` is what metadata init reads (``req_to_token`` rows, ``seq_lens``, ``extend_lens``; an
    injected fault's copy under ``--inject``), None when the run does not read-check; ``mapping`` the
    ``full_to_swa`` the backends see this step. Read-only for observers."""

    step: int
    backend: str
    side: str                     # "target" | "draft"
    batch: Any                    # ForwardBatch
    truth: Any                    # BatchTruth
    pool: Any                     # the backend's PoolWriter
    layers: tuple
    window: Optional[int]
    read_in: Optional[tuple]
    mapping: Any                  # torch int64 tensor


class ForwardObserver(Protocol):
    """Called around every backend forward (not in the per-layer hot path): ``before_forward`` after the
    faults at rest were applied and before metadata init; ``after_forward`` once the layers wrote and the
    write check ran, before the faults after the forward."""

    def before_forward(self, view: ForwardView) -> None: ...

    def after_forward(self, view: ForwardView) -> None: ...
