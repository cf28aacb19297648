"""The protocols by which the simulator's run loop talks to the packages that observe it.

The simulator depends on nothing else in slotscope; tracing (the boundary recorder) and the
application layer implement :class:`RunObserver`. ``on_boundary`` is called once per backend
boundary crossing, tens of thousands of times a second: implementations must only append to
buffers there (no OpenTelemetry, no I/O, no allocation of rich objects).
"""
from __future__ import annotations

from typing import Optional, Protocol, Sequence

from .records import Finding, RunInfo, StepRecord


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

    def on_findings(self, findings: Sequence[Finding]) -> None:
        """Called with the findings of one (step, backend) once the checker has classified them."""

    def on_run_end(self) -> None: ...


class NullObserver:
    """Observes nothing; the run loop's default."""

    def on_run_start(self, run: RunInfo) -> None:
        pass

    def on_step(self, step: StepRecord) -> None:
        pass

    def on_boundary(self, step, backend, layer, loc_len, swa_loc_len, loc_dtype, swa_loc_dtype,
                    t_start_ns, t_end_ns, error) -> None:
        pass

    def on_findings(self, findings: Sequence[Finding]) -> None:
        pass

    def on_run_end(self) -> None:
        pass


class ObserverFanout:
    """Forwards every call to several observers, in order."""

    def __init__(self, observers: Sequence[RunObserver]):
        self._observers = tuple(observers)

    def on_run_start(self, run: RunInfo) -> None:
        for o in self._observers:
            o.on_run_start(run)

    def on_step(self, step: StepRecord) -> None:
        for o in self._observers:
            o.on_step(step)

    def on_boundary(self, *args) -> None:
        for o in self._observers:
            o.on_boundary(*args)

    def on_findings(self, findings: Sequence[Finding]) -> None:
        for o in self._observers:
            o.on_findings(findings)

    def on_run_end(self) -> None:
        for o in self._observers:
            o.on_run_end()
