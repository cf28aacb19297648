"""What one step carries through the pipeline's phases: the :class:`StepContext`, and per backend a
:class:`Forward` (its metadata, read table, writes and findings as each phase fills them in).

Fields set by a later phase are declared with ``field(init=False)`` or a default, with a comment naming the
phase (or the executor) that sets them: a reader of the pipeline sees where each value comes from.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch

from simulator.oracle.checker import LayerWrite
from simulator.records import Finding
from simulator.scheduling.batch import BatchTruth, ForwardBatch

if TYPE_CHECKING:
    from simulator.core.reads import ReadCheck
    from simulator.core.run import Run
    from simulator.core.sides import ModelSide
    from simulator.designs.checks import HookFailure


@dataclass(slots=True, eq=False)
class Forward:
    """One backend's forward of one step, as the phases fill it in."""

    name: str
    boundary: Any                        # core.boundary.BackendBoundary (or a release's boundary)
    pool: Any                            # the backend's pool under test (memory.pool.PoolWriter)
    # plan (metadata init): the forward's metadata, read table and read check, or the hook that failed
    meta: Any = None
    table: Any = None
    reads: Optional["ReadCheck"] = None
    failure: Optional["HookFailure"] = None
    # write (the executor): the layers' writes; the boundary observations still to be delivered (a stepwise
    # executor holds them until delivery; the per-forward executors hand them to the observer as they go)
    writes: Optional[list[LayerWrite]] = None
    observations: Sequence[tuple] = ()
    # verdict (the executor): the checker's findings of the writes, not yet emitted (None: nothing to deliver)
    raw: Optional[list[Finding]] = None


@dataclass(slots=True, eq=False)
class StepContext:
    """One step: the batch, its truth, the model side it runs on and every backend's :class:`Forward`."""

    run: "Run"
    batch: ForwardBatch
    truth: BatchTruth
    side: "ModelSide"
    t_start: int
    # truth phase: out_cache_loc and the real tokens' tags on the run's device; what metadata init reads for
    # the read ids (req_to_token rows, seq_lens, extend_lens: the executor's form), or None (no read check)
    loc: Optional[torch.Tensor] = None
    tags: Optional[torch.Tensor] = None
    read_in: Any = None
    # plan phase: every backend's forward, in the side's order
    forwards: list[Forward] = field(default_factory=list)
    # the executor's per-step K/V rows (shared by the step's backends)
    rows_cache: dict = field(default_factory=dict)
    # extras of the step's record (a plug-in's: the overlap timeline's landing, the pool use it saw)
    record: dict = field(default_factory=dict)
