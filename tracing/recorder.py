"""The boundary recorder: the only tracing code on the simulator's hot path.

OpenTelemetry's SDK costs tens of microseconds per span and would dominate a run that crosses
hundreds of backend boundaries per step. So ``on_boundary`` only appends integers to typed
``array`` columns (strings are interned to small ids); spans are built later, from these
buffers, by :mod:`tracing.spans`. One crossing costs about 40 bytes and well under a
microsecond of bookkeeping (see ``bench/trace_overhead.py`` and the tests).

Agreement of ``loc`` and ``swa_loc`` is not stored: it is a pure function of the lengths and the
layer kind (:func:`agrees`), so it is derived when spans are made, once, off the hot path.
"""
from __future__ import annotations

import time
from array import array
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

from simulator.records import FINDING_CLASSES, Finding, RunInfo, StepRecord

#: Index of each finding class in the per-boundary count vectors.
CLASS_INDEX: dict[str, int] = {c: i for i, c in enumerate(FINDING_CLASSES)}

#: Timestamps below this (1973 as Unix nanoseconds) come from a monotonic clock, not the epoch.
_EPOCH_FLOOR_NS = 10**17


def agrees(kind: str, loc_len: int, swa_loc_len: int) -> bool:
    """Whether a boundary's ``loc`` and ``swa_loc`` agree.

    Full layers write at ``loc`` only, so they always agree; a layer without ``swa_loc``
    (length -1) agrees too. For SWA layers a length difference is the signal we trace.
    """
    return kind == "full" or swa_loc_len < 0 or swa_loc_len == loc_len


def direction(loc_len: int, swa_loc_len: int) -> str:
    """``"longer"`` when swa_loc is longer than loc (bug B1), else ``"shorter"``."""
    return "longer" if swa_loc_len > loc_len else "shorter"


@dataclass(frozen=True, slots=True)
class Boundary:
    """One recorded crossing, materialised off the hot path for span emission and tests."""

    row: int
    step: int
    backend: str
    layer: int
    kind: str
    loc_len: int
    swa_loc_len: int
    loc_dtype: str
    swa_loc_dtype: str
    t_start_ns: int
    t_end_ns: int
    error: Optional[str]

    @property
    def agrees(self) -> bool:
        return agrees(self.kind, self.loc_len, self.swa_loc_len)


class BoundaryRecorder:
    """A :class:`simulator.core.observe.RunObserver` that buffers everything for later span emission.

    Columns are parallel ``array`` objects indexed by row (one row per ``on_boundary`` call);
    error texts are rare, so they live in a dict keyed by row. Findings are counted per
    (step, backend id, layer) as small per-class lists.
    """

    def __init__(self) -> None:
        self.run: Optional[RunInfo] = None
        self.steps: dict[int, StepRecord] = {}
        self.names: list[str] = []                 # interned strings, by id
        self._ids: dict[str, int] = {}
        self.col_step = array("i")
        self.col_backend = array("H")
        self.col_layer = array("i")
        self.col_loc_len = array("i")
        self.col_swa_len = array("i")
        self.col_loc_dtype = array("H")
        self.col_swa_dtype = array("H")
        self.col_t_start = array("q")
        self.col_t_end = array("q")
        self.errors: dict[int, str] = {}
        #: (step, backend id, layer) -> counts per class, in FINDING_CLASSES order.
        self.findings: dict[tuple[int, int, int], list[int]] = {}
        self.findings_total = 0
        self.ended = False
        # Bound appenders: saves an attribute lookup and a method binding per column per call.
        self._ap = (self.col_step.append, self.col_backend.append, self.col_layer.append,
                    self.col_loc_len.append, self.col_swa_len.append, self.col_loc_dtype.append,
                    self.col_swa_dtype.append, self.col_t_start.append, self.col_t_end.append)
        # Offset from the monotonic clock to the epoch, for runs that stamp with perf_counter_ns.
        self.clock_offset_ns = time.time_ns() - time.perf_counter_ns()
        self.wall_start_ns = time.time_ns()
        self._kind_of: dict[int, str] = {}

    # -- RunObserver -------------------------------------------------------------------------
    def on_run_start(self, run: RunInfo) -> None:
        self.run = run
        self._kind_of = {li.layer: li.kind for li in run.layers}
        for b in run.backends:
            self.intern(b)
        self.clock_offset_ns = time.time_ns() - time.perf_counter_ns()
        self.wall_start_ns = time.time_ns()

    def on_step(self, step: StepRecord) -> None:
        self.steps[step.step] = step

    def on_boundary(self, step: int, backend: str, layer: int, loc_len: int, swa_loc_len: int,
                    loc_dtype: str, swa_loc_dtype: str, t_start_ns: int, t_end_ns: int,
                    error: Optional[str]) -> None:
        ids = self._ids
        b = ids.get(backend)
        if b is None:
            b = self.intern(backend)
        d = ids.get(loc_dtype)
        if d is None:
            d = self.intern(loc_dtype)
        e = ids.get(swa_loc_dtype)
        if e is None:
            e = self.intern(swa_loc_dtype)
        a0, a1, a2, a3, a4, a5, a6, a7, a8 = self._ap
        a0(step); a1(b); a2(layer); a3(loc_len); a4(swa_loc_len)
        a5(d); a6(e); a7(t_start_ns); a8(t_end_ns)
        if error is not None:
            self.errors[len(self.col_step) - 1] = error

    def on_findings(self, findings: Sequence[Finding]) -> None:
        counts = self.findings
        n_cls = len(FINDING_CLASSES)
        for f in findings:
            key = (f.step, self.intern(f.backend), f.layer)
            vec = counts.get(key)
            if vec is None:
                vec = counts[key] = [0] * n_cls
            idx = CLASS_INDEX.get(f.cls)
            if idx is None:
                raise ValueError(f"finding class {f.cls!r} (step {f.step}, backend {f.backend}, "
                                 f"layer {f.layer}) is not one of {FINDING_CLASSES}")
            vec[idx] += 1
            self.findings_total += 1

    def on_run_end(self) -> None:
        self.ended = True

    # -- reading back (off the hot path) ------------------------------------------------------
    def intern(self, name: str) -> int:
        i = self._ids.get(name)
        if i is None:
            i = self._ids[name] = len(self.names)
            self.names.append(name)
        return i

    def __len__(self) -> int:
        return len(self.col_step)

    def kind_of(self, layer: int) -> str:
        """The layer's kind from RunInfo; an unknown layer is treated as SWA (strict checks)."""
        return self._kind_of.get(layer, "swa")

    def wall_ns(self, t: int) -> int:
        """A recorded timestamp as Unix nanoseconds (monotonic stamps are shifted to the epoch)."""
        if t <= 0:
            return self.wall_start_ns
        if t < _EPOCH_FLOOR_NS:
            return t + self.clock_offset_ns
        return t

    def boundary(self, row: int) -> Boundary:
        names = self.names
        layer = self.col_layer[row]
        return Boundary(
            row=row, step=self.col_step[row], backend=names[self.col_backend[row]], layer=layer,
            kind=self.kind_of(layer), loc_len=self.col_loc_len[row],
            swa_loc_len=self.col_swa_len[row], loc_dtype=names[self.col_loc_dtype[row]],
            swa_loc_dtype=names[self.col_swa_dtype[row]], t_start_ns=self.col_t_start[row],
            t_end_ns=self.col_t_end[row], error=self.errors.get(row))

    def groups(self) -> list[tuple[int, int, list[range]]]:
        """Rows grouped by (step, backend id), ordered by step then first appearance.

        The run loop normally crosses all layers of one backend in a row, so a group is one
        contiguous range; interleaved recording still groups correctly (several ranges).
        """
        steps, backends = self.col_step, self.col_backend
        order: dict[tuple[int, int], list[range]] = {}
        n = len(steps)
        start = 0
        while start < n:
            s, b = steps[start], backends[start]
            end = start + 1
            while end < n and steps[end] == s and backends[end] == b:
                end += 1
            order.setdefault((s, b), []).append(range(start, end))
            start = end
        keys = sorted(order, key=lambda k: k[0])   # stable: keeps backend order within a step
        return [(s, b, order[(s, b)]) for s, b in keys]

    def findings_of(self, step: int, backend_id: int, layer: int) -> Optional[list[int]]:
        return self.findings.get((step, backend_id, layer))

    def iter_boundaries(self) -> Iterator[Boundary]:
        for row in range(len(self)):
            yield self.boundary(row)

