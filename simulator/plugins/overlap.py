"""The run loop under the overlap scheduler (``engine.overlap = true``; docs/OVERLAP.md).

:class:`OverlapDriver` pulls the scheduler one decision ahead: before forward k runs, the scheduler
forms batch k+1, and every mapping write it makes on the way (the frees of requests whose finish the
previous result showed, out-of-window ``free_swa``, retraction, allocation) is a discrete
:class:`~simulator.scheduling.timeline.SchedWrite` of a :class:`~simulator.scheduling.timeline.Journal`. The writes go
through the allocator's interface only (``extend``, ``evict_swa``, ``free``, ``full_to_swa``), so an
engine's allocator (engine_path's ``EngineAllocator``) serves unchanged.

The backends read a device-visible mapping of the run's own (``Run.mapping``, no longer the
allocator's array): forward k starts with every write of the decisions before it landed, and each
write racing forward k lands at the point :func:`~simulator.scheduling.timeline.plan` chose. Every backend runs
forward k under the same landings: the device mapping's touched entries are put back to their value at
the forward's start before each backend. The reference pool learns the frees of batch k+1 when step
k+1 starts, as without overlap (a free moves no K/V).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np
import torch

from simulator.core.plugins import StepPlugin
from simulator.records import DRAFT_MODES
from simulator.scheduling.batch import BatchTruth, ForwardBatch
from simulator.scheduling.timeline import (Journal, Landing, SchedWrite, landing_rng, plan, random_chooser,
                                           resolve_barrier)


class OverlapDriver(StepPlugin):
    """The overlap scheduler's timeline as a plug-in of the step pipeline (see the module docstring)."""

    name = "overlap"
    #: the backends read the driver's device mapping, not the allocator's
    owns_mapping = True

    def __init__(self, run, seed: int, release, engine, chooser=None):
        self.run = run
        self.barrier = resolve_barrier(engine.war_barrier, dict(release.war_barriers), engine.platform)
        self.platform = engine.platform
        self.choose = chooser if chooser is not None else random_chooser(landing_rng(seed))
        self.journal = Journal(run.alloc)
        run.scheduler.journal = self.journal
        # the device-visible mapping: the allocator's values as the GPU has them
        run.mapping = torch.from_numpy(run.alloc.full_to_swa.copy()).to(run.device)
        for side in (run.target, run.draft):            # writes land between layers: the boundaries read it live
            for b in (side.boundaries.values() if side is not None else ()):
                b.mapping_moves = True
        self._pending: dict[int, tuple[Landing, tuple, tuple[int, int]]] = {}
        self.landings: list[Landing] = []     # every forward's, in order (tests, reports)
        self._step: Optional[_Step] = None

    # ------------------------------------------------------------------ the lookahead

    def source(self, run, steps: Iterator[tuple[ForwardBatch, BatchTruth]]) -> Iterator[tuple[ForwardBatch, BatchTruth]]:
        return self.pairs(steps)

    def pairs(self, steps: Iterator[tuple[ForwardBatch, BatchTruth]]) -> Iterator[tuple[ForwardBatch, BatchTruth]]:
        """The scheduler's forwards, each with the writes the host made while forward k was in flight."""
        cur = next(steps, None)
        self._land_all(self.journal.take())        # the first decision races no forward
        while cur is not None:
            batch, truth = cur
            run = self.run
            # what forward k's metadata init reads of req_to_token, taken before the scheduler runs on
            read_in = (run.read_inputs(batch.requests)
                       if run.read_check and batch.requests is not None else None)
            used = (run.alloc.full_used, run.alloc.swa_used)
            nxt = next(steps, None)
            writes = self.journal.take()
            side = run.draft if run.draft is not None and batch.mode in DRAFT_MODES else run.target
            landing = plan(writes, self.barrier, batch.mode, batch.graph, len(side.layers), self.choose,
                           self.platform)
            self._pending[batch.step] = (landing, (read_in,), used)
            yield batch, truth
            cur = nxt

    # ------------------------------------------------------------------ one forward

    def bind(self, ctx) -> None:
        landing, (read_in,), used = self._pending.pop(ctx.batch.step)
        self.landings.append(landing)
        self._step = _Step(landing, read_in, used)

    def read_inputs(self, ctx) -> None:
        """The read inputs taken when the forward was scheduled; the mapping's entries the landings touch, as the
        forward starts (every backend runs the forward under the same landings)."""
        st, run = self._step, self.run
        ctx.read_in = st.read_in
        landing = st.landing
        if landing.writes:
            st.touched = torch.from_numpy(np.unique(np.concatenate([w.full for w in landing.writes]))).to(run.device)
            st.start = run.mapping[st.touched].clone()
        st.position = {li.layer: i for i, li in enumerate(ctx.side.layers)}
        for w, a in zip(landing.writes, landing.at):
            st.by_point.setdefault(a, []).append(w)

    def before_forward(self, ctx, f) -> None:
        st = self._step
        if st.touched is not None:
            self.run.mapping[st.touched] = st.start
        self._land_range(st.by_point, 0, 0)                     # before metadata init

    def interleaves(self, ctx, f) -> bool:
        return bool(self._step.landing.writes)

    def before_layer(self, ctx, f, layer) -> None:
        st = self._step
        i = st.position[layer.layer]
        if i == 0:
            self._land_range(st.by_point, 1, 2)             # after metadata (in-graph, read-done)
        else:
            self._land_range(st.by_point, i + 2, i + 2)     # before layer i

    def end_step(self, ctx) -> None:
        st, self._step = self._step, None
        if st is None:
            return
        self._land_range(st.by_point, 0, len(st.landing.pts) - 1)     # whatever the last backend left: all of it
        ctx.record.update(timeline=st.landing.record(), used=st.used)

    def _land_range(self, by_point: dict[int, list[SchedWrite]], lo: int, hi: int) -> None:
        for p in range(lo, hi + 1):
            self._land_all(by_point.get(p, ()))

    def _land_all(self, writes) -> None:
        mapping, dev = self.run.mapping, self.run.device
        for w in writes:
            mapping[torch.from_numpy(w.full).to(dev)] = torch.from_numpy(w.values).to(dev)


@dataclass(slots=True)
class _Step:
    """The forward in flight: its landing (which write lands at which point), what it read when scheduled."""

    landing: Landing
    read_in: object
    used: tuple[int, int]
    touched: Optional[torch.Tensor] = None         # the mapping entries its landings write (device)
    start: Optional[torch.Tensor] = None           # their values as the forward started
    position: dict = field(default_factory=dict)   # global layer id -> its index in the side's layers
    by_point: dict = field(default_factory=dict)   # landing point -> the writes landing there


def overlap_driver(run, scenario, release, chooser=None) -> Optional[OverlapDriver]:
    """The driver when the scenario runs the overlap scheduler, else None (the sequential loop)."""
    if not scenario.engine.overlap:
        return None
    return OverlapDriver(run, scenario.seed, release, scenario.engine, chooser)
