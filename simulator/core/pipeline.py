"""One step of a run, as one sequence of phases: this file is the step.

::

    begin     the step's context: plug-ins bind the batch (the unified pool's physical ids), the model side
    truth     the oracle learns the step (frees on every side, a KV transfer, the side's writes), the mapping
              the backends read is brought up to date, the read inputs are made (plug-ins may change them)
    plan      per backend: metadata init (write locations, static buffers) and the read table
    write     the executor writes the layers' K/V into the pools under test
    verdict   the checker's findings of each backend's writes
    deliver   per backend in order: its boundary observations, then its findings (writes, then reads)
    record    the step's record

Two grains run these phases. A stepwise executor (the CPU's shared pools, simulator/core/shared.py; the
GPU step runner, cuda_path/step.py) takes the whole step: plan, write and verdict for every backend at
once (each pool class written once), then delivery. Otherwise each backend runs plan, write, verdict and
delivery before the next begins (:meth:`StepPipeline.forward`), with the layer executor (eager, or CUDA
graphs) writing its layers: plug-ins that act between backends or layers (the overlap timeline, fault
injection, the unified pool, a forward observer) need that grain. Either way the findings, counts and
observations are the same, in the same order (docs/ARCHITECTURE.md, "Exactness").
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, Protocol

import torch

from simulator.core.context import Forward, StepContext
from simulator.core.delivery import count_writes, deliver
from simulator.core.reads import ReadCheck
from simulator.core.writes import BackendStep
from simulator.designs.checks import HookFailure
from simulator.records import DRAFT_MODES, LayerInfo, StepRecord
from simulator.scheduling.batch import BatchTruth, ForwardBatch

if TYPE_CHECKING:
    from simulator.core.run import Run


class StepExecutor(Protocol):
    """Runs a whole step's plan, write and verdict phases (every backend at once); the pipeline delivers.

    ``takes`` is asked at every step, before its truth phase: False leaves the step to the per-forward
    grain (the executor learns nothing of it but that it was declined: its own state may need a refresh).
    ``truth`` may replace the pipeline's truth phase (:func:`apply_truth` is its common part).
    ``shares`` says, once before the first step, whether it can take this run's steps at all: only then do
    the backends of a side start on one pool (simulator/memory/pool.py's ``PoolClasses``); otherwise each
    backend gets its own before any write."""

    def shares(self, run: "Run") -> bool: ...

    def takes(self, ctx: StepContext) -> bool: ...

    def truth(self, ctx: StepContext) -> None: ...

    def plan(self, ctx: StepContext) -> None: ...

    def write(self, ctx: StepContext) -> None: ...

    def verdict(self, ctx: StepContext) -> None: ...


def apply_truth(ctx: StepContext) -> None:
    """The oracle first: every step's frees reach both references, a KV transfer's rows every pool (and every
    reference, but for one the target's reference alone takes), the step's writes the side that runs it."""
    run, truth = ctx.run, ctx.truth
    target_ref_only = truth.transferred is not None and truth.transferred.target_reference_only
    for m in run.sides:
        m.reference.apply_frees(truth, transfer=not target_ref_only or m is run.target)
    if truth.transferred is not None:
        run.write_transfer(truth.transferred)
    ctx.side.reference.apply_writes(truth)


def truth_phase(ctx: StepContext) -> None:
    """The truth phase: the oracle learns the step, the device mapping follows the allocator's (unless a
    plug-in keeps it), out_cache_loc, the tags and the read inputs on the run's device."""
    run = ctx.run
    for p in run.plugins:
        p.before_truth(ctx)
    apply_truth(ctx)
    if not run.plugins.owns_mapping:
        run.sync_mapping(ctx.truth.mapping_changed)
    batch = ctx.batch
    ctx.loc = torch.from_numpy(batch.out_cache_loc).to(run.device)
    ctx.tags = torch.from_numpy(ctx.truth.tags).to(run.device)
    ctx.read_in = run.read_inputs(batch.requests) if run.read_check and batch.requests is not None else None
    for p in run.plugins:
        p.read_inputs(ctx)


def plan_forward(ctx: StepContext, f: Forward, tables: Optional[dict] = None) -> bool:
    """The plan phase of one backend: metadata init and the read table (``tables``: a step's tables shared by
    backends whose ``read_ids`` is pure); False where a per-forward hook failed (the forward is skipped and
    reported once)."""
    run = ctx.run
    try:
        f.meta = f.boundary.init_metadata(ctx.batch, ctx.loc, run.mapping)
        if ctx.read_in is not None:
            f.table = f.boundary.read_table(f.meta, *ctx.read_in, run.mapping, tables)
    except HookFailure as e:
        f.failure = e
        return False
    if f.table is not None:
        f.reads = ReadCheck(ctx.side, f.name, ctx.batch, ctx.truth, f.table, f.pool)
    return True


class StepPipeline:
    """A run's step: the phases above over a :class:`~simulator.core.context.StepContext`."""

    def __init__(self, run: "Run", layers, stepwise: Optional[StepExecutor]):
        self.run = run
        #: the per-forward grain's layer executor (core.eager.LayerExecutor: eager, or cuda_path's graphs)
        self.layers = layers
        #: the whole-step executor, or None
        self.stepwise = stepwise

    def settle_pools(self) -> None:
        """Once the run's plug-ins are installed, before its first step: the backends keep their shared pools
        only where the whole-step executor can take the run's steps; else each gets its own."""
        ex = self.stepwise
        if ex is None or not ex.shares(self.run):
            for side in self.run.sides:
                side.own_pools()

    def step(self, batch: ForwardBatch, truth: BatchTruth) -> StepRecord:
        ctx = self.begin(batch, truth)
        ex = self.stepwise
        if ex is not None and not ex.takes(ctx):
            ex = None
        try:
            if ex is not None:
                ex.truth(ctx)
                ex.plan(ctx)
                ex.write(ctx)
                ex.verdict(ctx)
                for f in ctx.forwards:
                    deliver(ctx, f)
            else:
                self.truth(ctx)
                for name in ctx.side.boundaries:
                    self.forward(ctx, name)
        finally:
            for p in self.run.plugins:
                p.end_step(ctx)
        return self.run.record_step(ctx.batch, ctx.t_start, **ctx.record)

    # ------------------------------------------------------------------ phases

    def begin(self, batch: ForwardBatch, truth: BatchTruth) -> StepContext:
        run = self.run
        ctx = StepContext(run, batch, truth, run.target, 0)
        for p in run.plugins:
            p.bind(ctx)
        ctx.side = run.side = run.draft if run.draft is not None and ctx.batch.mode in DRAFT_MODES else run.target
        ctx.t_start = run.now()
        return ctx

    def truth(self, ctx: StepContext) -> None:
        truth_phase(ctx)

    def forward(self, ctx: StepContext, name: str) -> None:
        """One backend's forward in the per-forward grain: plan, write, verdict, delivery."""
        run, side = self.run, ctx.side
        f = Forward(name, side.boundaries[name], side.pools[name])
        ctx.forwards.append(f)
        for p in run.plugins:
            p.before_forward(ctx, f)
        if not plan_forward(ctx, f):
            deliver(ctx, f)          # (the failed hook's design_error)
            return
        f.writes = self.layers.run(self._backend_step(ctx, f))
        run.crossings += len(side.layers)
        run.stats[name].writes += count_writes(f.writes)
        f.raw = side.checker.collect(ctx.batch.step, name, f.pool, ctx.truth, f.writes, run.pad_slots)
        for p in run.plugins:
            p.after_writes(ctx, f)
        deliver(ctx, f)

    def _backend_step(self, ctx: StepContext, f: Forward) -> BackendStep:
        run = self.run
        interleaved = any(p.interleaves(ctx, f) for p in run.plugins)
        store = None
        for p in run.plugins:
            store = p.store(ctx, f) or store
        return BackendStep(ctx.batch, f.name, f.boundary, f.pool, f.meta, ctx.side.layers, ctx.tags, run.obs,
                           run.now, ctx.rows_cache, self._layer_hook(ctx, f, interleaved),
                           interleaved=interleaved, write_fault=store)

    def _layer_hook(self, ctx: StepContext, f: Forward, interleaved: bool) -> Optional[Callable[[LayerInfo], None]]:
        """What runs before each layer: the plug-ins' ``before_layer`` (where one interleaves), then the layer's
        read check."""
        reads = f.reads
        if not interleaved:
            return None if reads is None else reads.at_layer
        plugins = self.run.plugins.items

        def before(layer: LayerInfo) -> None:
            for p in plugins:
                p.before_layer(ctx, f, layer)
            if reads is not None:
                reads.at_layer(layer)
        return before


__all__ = ["StepExecutor", "StepPipeline", "apply_truth", "plan_forward", "truth_phase"]
