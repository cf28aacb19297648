"""The run loop: scenario -> scheduler -> every backend boundary -> writers -> checker -> records.

Set-up (allocator, padding, scheduler, one model side per model), then per step: schedule; the
references learn the step's frees and writes; per backend: metadata init (write locations and read
ids), the layers (each read-checked when its kind's table was not checked against the current
ownership, then written), the write check; the step's record.

The seam for an overlap timeline (scheduler writes landing between the layers of a forward):
:attr:`Run.before_layer`, called as ``before_layer(batch, backend, layer)`` before each layer's
write location is built (the eager executor calls it per layer). A callback there applies the
scheduler's writes: the allocator's ``full_to_swa`` (live on the CPU; on a GPU push the entries with
:meth:`Run.sync_mapping`) and the oracle (``side.reference.apply_frees`` / ``apply_writes``, which
move the reference's epoch, so the next layer of each kind re-checks its reads against the new
ownership). Per-layer design hooks see the live mapping as ``ctx.full_to_swa``. The loop owns no I/O. It takes a pool factory (cuda_path provides one;
the simulator never imports it), an observer (tracing's recorder, the app's timeline) and a
progress callback, and returns a :class:`RunResult` with counts per backend and the findings.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from simulator.memory.allocator import HybridAllocator, RequestSlots
from simulator.scheduling.batch import BatchRequests, BatchTruth, ForwardBatch
from simulator.designs.base import Design
from simulator.designs.checks import HookFailure
from simulator.designs.loading import design_padding
from simulator.core.eager import BackendStep, EagerExecutor, LayerExecutor
from simulator.core.observe import ForwardObserver, ForwardView, NullObserver, RunObserver
from simulator.plugins.overlap import overlap_driver
from simulator.engine_model.padding_convention import PaddingConvention
from simulator.memory.pool import PoolWriter
from simulator.engine_model.release_model import release_of
from simulator.records import DRAFT_MODES, FINDING_CLASSES, Finding, LayerInfo, RunInfo, StepRecord
from simulator.scenario import PoolConfig, Scenario, ScenarioError
from simulator.scheduling.scheduler import Scheduler
from simulator.core.sides import DraftPoolFactory, ModelSide, build_draft_side, build_target_side
from simulator.scheduling.workload import make_requests
from simulator.core.reads import _ReadCheck

PoolFactory = Callable[[int, int, Optional[int]], PoolWriter]   # (full_rows, swa_rows, skip_index)
Progress = Callable[[int, int, int], None]                      # (step, finished requests, total requests)
BeforeLayer = Callable[[ForwardBatch, str, LayerInfo], None]    # (batch, backend, layer): the timeline seam
#: the scenario's pool config -> an allocator with HybridAllocator's interface (engine_path's EngineAllocator)
AllocatorFactory = Callable[[PoolConfig], HybridAllocator]


@dataclass(slots=True)
class BackendStats:
    writes: int = 0
    findings: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINDING_CLASSES, 0))
    first_finding: Optional[Finding] = None

    def to_json(self) -> dict:
        f = self.first_finding
        return {
            "writes": self.writes,
            "findings": dict(self.findings),
            "first_finding": None if f is None else {"step": f.step, "layer": f.layer, "class": f.cls},
        }

    @property
    def total(self) -> int:
        return sum(self.findings.values())


@dataclass(slots=True)
class RunResult:
    info: RunInfo
    backends: dict[str, BackendStats]
    findings: list[Finding]
    steps: list[StepRecord]
    findings_truncated: bool
    crossings: int
    wall_s: float
    #: engine.radix_cache: the cache's counters (SharingScheduler.summary); None when the cache is off
    radix: Optional[dict] = None

    @property
    def total_findings(self) -> int:
        return sum(s.total for s in self.backends.values())


@dataclass(frozen=True, slots=True)
class RunPadding:
    """A padding convention made concrete for one run (a dummy request's slots are known only then)."""

    convention: PaddingConvention
    pad_value: int                  # what padded rows of out_cache_loc hold
    swa_pad: int                    # what a static SWA buffer's tail gets
    skip_index: Optional[int]       # the index the store skips
    reserved: np.ndarray            # slots never compared: the reserved page, and the dummy request's
    pad_slots: tuple[int, ...]      # slots a real token's row is "sent to padding" at


def run_padding(conv: PaddingConvention, alloc: HybridAllocator) -> RunPadding:
    page = alloc.page_size
    reserved = np.arange(page, dtype=np.int64)
    if not conv.dummy_request:
        pad, swa_pad = conv.resolve(None, None)
        return RunPadding(conv, pad, swa_pad, conv.skip_index, reserved, (pad,))
    # mini-sglang: a dummy request's page, allocated before any real request, absorbs padded rows
    dummy = RequestSlots(page)
    alloc.extend(dummy, page)
    pad, swa_pad = conv.resolve(int(dummy.full[0]), int(dummy.swa[0]))
    return RunPadding(conv, pad, swa_pad, conv.skip_index, np.concatenate([reserved, dummy.full, dummy.swa]),
                      (pad, int(dummy.swa[0])))


def scheduler_kind(scenario: Scenario) -> str:
    """Which scheduler a scenario runs: ``radix`` (engine.radix_cache), ``pd_decode`` (engine.pd_decode) or
    ``base`` (the plain scheduler; the overlap timeline and the unified pool sit around it, not in it)."""
    if getattr(scenario.engine, "radix_cache", False):
        return "radix"
    if getattr(scenario.engine, "pd_decode", False):
        return "pd_decode"
    return "base"


def make_scheduler(scenario: Scenario, alloc, design: Design, rng: np.random.Generator, pad_value: int,
                   pad_to_capture: bool, kind: Optional[str] = None) -> Scheduler:
    """The scenario's own scheduler over ``alloc`` (the run's choice; engine_path's conformance trace makes the
    same one), its release behaviour and sharing behaviour from ``design``. ``kind``: force one
    (:func:`scheduler_kind`'s names), e.g. the base scheduler where a side cannot run the scenario's."""
    kind = kind or scheduler_kind(scenario)
    requests = make_requests(scenario.workload, rng)
    kw = dict(pad_value=pad_value, pad_to_capture=pad_to_capture, release=release_of(design))
    if kind == "radix":
        # issue 12 point 1: the radix cache between the scheduler and the allocator (opt-in)
        from simulator.scheduling.sharing import SharingScheduler
        return SharingScheduler(scenario, alloc, requests, rng, sharing=getattr(design, "sharing", None), **kw)
    if kind == "pd_decode":
        # a PD decode node: SWA-tail pre-allocation, the transferred KV, the chunk cache's frees
        from simulator.scheduling.pd_decode import PDDecodeScheduler
        return PDDecodeScheduler(scenario, alloc, requests, rng, sharing=getattr(design, "sharing", None), **kw)
    return Scheduler(scenario, alloc, requests, rng, **kw)


class Run:
    """One run's state: set up in ``__init__``, advanced by :meth:`step`, read by :meth:`result`."""

    def __init__(self, scenario: Scenario, design: Design, make_pool: PoolFactory, *, device: torch.device,
                 observer: RunObserver, executor: LayerExecutor, make_draft_pool: Optional[DraftPoolFactory],
                 info_extra: dict, version: str, allocator_factory: Optional[AllocatorFactory] = None):
        self.device, self.obs, self.executor = device, observer, executor
        rng = np.random.default_rng(scenario.seed)
        pool_cfg = scenario.pool
        # allocator_factory: the seam for an engine's allocator (engine_path.runtime.EngineRuntime)
        self.alloc = alloc = (allocator_factory(pool_cfg) if allocator_factory is not None else
                              _model_allocator(scenario, design))
        pad = run_padding(design_padding(design), alloc)
        if pool_cfg.unified and pad.convention.dummy_request:
            raise ScenarioError(f"pool.unified: design {design.name}'s padding convention uses a dummy request, "
                                f"whose slots would be virtual ids; the unified pool pads with the sink (slot 0)")
        self.pad_slots = pad.pad_slots
        self.scheduler = make_scheduler(scenario, alloc, design, rng, pad.pad_value, pad.convention.dummy_request)
        owner_of = self.scheduler.owner_of
        self.target = build_target_side(scenario, design, alloc, make_pool, pad.skip_index, owner_of, pad.reserved,
                                        device, pad.swa_pad)
        self.draft: Optional[ModelSide] = None
        if scenario.engine.speculative.enabled:
            self.draft = build_draft_side(scenario, design, alloc, make_pool, make_draft_pool, pad.skip_index,
                                          owner_of, pad.reserved, device, pad.swa_pad)
        self.sides = (self.target,) if self.draft is None else (self.target, self.draft)
        for m in self.sides:
            for b in m.boundaries.values():
                b.window = scenario.model.window      # the draft's SWA layers read the target's window
        #: check every forward's reads (engine.read_check)
        self.read_check = bool(getattr(scenario.engine, "read_check", True))
        #: the overlap timeline's seam: called before each layer of each backend (see the module docstring)
        self.before_layer: Optional[BeforeLayer] = None
        # on the CPU the tensor shares the allocator's memory (always current); elsewhere updated per step
        self.mapping = torch.from_numpy(alloc.physical_full_to_swa() if pool_cfg.unified else alloc.full_to_swa)
        if device.type != "cpu":
            self.mapping = self.mapping.to(device)
        #: pool.unified: the per-forward plan between virtual and physical ids (simulator/plugins/unified.py)
        self.unified = None
        if pool_cfg.unified:
            from simulator.plugins.unified import UnifiedPlan
            self.unified = UnifiedPlan(self)
        #: engine.overlap: the timeline driver (simulator/plugins/overlap.py; it gives the run a mapping of its own)
        self.overlap = overlap_driver(self, scenario, release_of(design))
        #: --inject: the fault injector (simulator/plugins/faults.py); None: no faults, no content check
        self.faults = None
        #: called around each backend forward (observe.ForwardObserver: bench/vs_kv_canary.py's canary)
        self.forward_observer: Optional[ForwardObserver] = None
        self.info = RunInfo(
            scenario=scenario.name, scenario_path=scenario.source, scenario_hash=scenario.hash, design=design.name,
            seed=scenario.seed, backends=tuple(scenario.backends),
            layers=tuple(li for m in self.sides for li in m.layers), device=str(device), version=version,
            extra=dict(info_extra))
        self.stats = {b: BackendStats() for b in scenario.backends}
        self.findings: list[Finding] = []
        self.steps: list[StepRecord] = []
        self.crossings = 0
        self._epoch0, self._perf0 = time.time_ns(), time.perf_counter_ns()
        self._wall0 = time.perf_counter()

    def now(self) -> int:
        return self._epoch0 + (time.perf_counter_ns() - self._perf0)

    def result(self) -> RunResult:
        if self.unified is not None:
            self.info.extra["unified"] = self.unified.summary()
        return RunResult(info=self.info, backends=self.stats, findings=self.findings, steps=self.steps,
                         findings_truncated=any(m.checker.truncated for m in self.sides), crossings=self.crossings,
                         wall_s=time.perf_counter() - self._wall0,
                         radix=self.scheduler.summary(self.findings) if hasattr(self.scheduler, "cache") else None)

    # ------------------------------------------------------------------ one step

    def step(self, batch: ForwardBatch, truth: BatchTruth) -> StepRecord:
        if self.overlap is not None:
            return self.overlap.step(batch, truth)
        if self.unified is not None:
            batch, truth = self.unified.bind(batch, truth)     # virtual ids -> physical (the plan's bind)
        whole = getattr(self.executor, "run_step", None)    # an executor that runs whole steps (cuda_path)
        rec = None if whole is None else whole(self, batch, truth)
        if rec is not None:
            return rec
        t_start = self.now()
        side = self.draft if self.draft is not None and batch.mode in DRAFT_MODES else self.target
        if self.faults is not None:
            # the content check's freed slots, with their last owner's tag (before the oracle forgets it)
            self._freed = {k: (f, side.reference.expected[k][f].copy())
                           for k, f in (("full", truth.freed_full), ("swa", truth.freed_swa))}
        self._apply_truth(side, truth)
        loc = torch.from_numpy(batch.out_cache_loc).to(self.device)
        tags = torch.from_numpy(truth.tags).to(self.device)
        rows_cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        read_in = self._read_inputs(batch.requests) if self.read_check and batch.requests is not None else None
        if self.unified is not None:
            read_in = None if read_in is None else self.unified.read_inputs(read_in)
            self.unified.read_door(side, batch)
        if self.faults is not None:
            return self._faulty_step(side, batch, truth, loc, tags, rows_cache, read_in, t_start)
        for name in side.boundaries:
            self._backend_forward(side, name, batch, truth, loc, tags, rows_cache, read_in)
        return self._record_step(batch, t_start)

    def _faulty_step(self, side, batch, truth, loc, tags, rows_cache, read_in, t_start) -> StepRecord:
        """A step under --inject: the forward seam's faults change this step's read inputs and mapping."""
        self._fault_side = side
        mapping = self.mapping
        read_in, self.mapping = self.faults.begin_step(self, batch, truth, read_in)
        try:
            for name in side.boundaries:
                self._backend_forward(side, name, batch, truth, loc, tags, rows_cache, read_in)
        finally:
            self.mapping = mapping
        return self._record_step(batch, t_start)

    def sync_mapping(self, full_slots: np.ndarray) -> None:
        """Push the allocator's mapping entries of ``full_slots`` to the device copy (a no-op on the CPU,
        where the tensor is the allocator's array)."""
        if self.device.type != "cpu" and full_slots.size:
            ch = torch.from_numpy(full_slots).to(self.device)
            self.mapping[ch] = torch.from_numpy(self.alloc.full_to_swa[full_slots]).to(self.device)

    def _read_inputs(self, rq: BatchRequests) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What metadata init reads for the read ids: ``req_to_token`` rows, ``seq_lens``, ``extend_lens``."""
        dev = self.device
        return (torch.from_numpy(rq.req_to_token()).to(dev), torch.from_numpy(rq.seq_lens).to(dev),
                torch.from_numpy(rq.extend_lens).to(dev))

    def _apply_truth(self, side: ModelSide, truth: BatchTruth) -> None:
        """The oracle first: every step's frees reach both references, its writes the side that runs it."""
        for m in self.sides:
            m.reference.apply_frees(truth)
        if truth.transferred is not None:
            self.write_transfer(truth.transferred)
        side.reference.apply_writes(truth)
        self.sync_mapping(truth.mapping_changed)

    def write_transfer(self, tr) -> None:
        """A KV transfer's rows (``BatchTruth.transferred``: a PD decode node's, simulator/scheduling/pd_decode.py), written
        into every pool of every side outside the backends, as the transfer engine writes them: each distinct
        pool once (backends of one pool class share it), every layer of a kind; no write is counted or checked.
        A pool smaller than the slots (a draft pool sized below the target's, B3's mistake) takes the rows it
        holds: the transfer is not a backend's write, so what lies past a pool is left to the forwards' own
        writes, which are checked (and it must not reach the store's out-of-range count the checker reads)."""
        seen: set[int] = set()
        parts = [(kind, torch.from_numpy(slots).to(self.device), torch.from_numpy(tags).to(self.device))
                 for kind, slots, tags in (("full", tr.full_slots, tr.full_tags), ("swa", tr.swa_slots, tr.swa_tags))
                 if slots.size]
        for m in self.sides:
            for pool in m.pools.values():
                if id(pool) in seen:
                    continue
                seen.add(id(pool))
                for kind, loc, tags in parts:
                    held = loc < pool.rows(kind)
                    if not bool(held.all()):
                        loc, tags = loc[held], tags[held]
                    for li in m.layers:
                        if li.kind == kind:
                            k, v = pool.make_rows(tags, li.layer, kind)
                            pool.store(kind, li.index, loc, k, v)

    def _backend_forward(self, side: ModelSide, name: str, batch: ForwardBatch, truth: BatchTruth,
                         loc: torch.Tensor, tags: torch.Tensor, rows_cache: dict,
                         read_in: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None) -> None:
        """One backend's forward: metadata init, the layers (reads checked, then writes), the checks."""
        boundary, pool = side.boundaries[name], side.pools[name]
        if self.faults is not None:
            self.faults.before_forward(self, batch, truth, name, pool)
            freed = [f for kind, (slots, ftags) in getattr(self, "_freed", {}).items()
                     for f in side.checker.check_contents(batch.step, name, kind, pool, slots, side.layers,
                                                          self._content_seen.setdefault(name, set()), tags=ftags)]
            if freed:
                self._count(side, name, *side.checker.emit_all(freed))
        view = None
        if self.forward_observer is not None:
            view = ForwardView(batch.step, name, "draft" if side is self.draft else "target", batch, truth, pool,
                               side.layers, boundary.window, read_in, self.mapping)
            self.forward_observer.before_forward(view)
        try:
            meta = boundary.init_metadata(batch, loc, self.mapping)
            table = None if read_in is None else boundary.read_table(meta, *read_in, self.mapping)
        except HookFailure as f:
            # a per-forward hook failed: the backend's forward is skipped and reported once
            text = f.describe(boundary.design.name, boundary.context(batch), -1)
            kind = f.kind or ("full" if f.hook in ("fill_graph_loc_buffer", "read_ids") else "swa")
            self._count(side, name, *side.checker.design_error(batch.step, name, kind, text))
            return
        reads = None if table is None else _ReadCheck(side, name, batch, truth, table, pool)
        writes = self.executor.run(BackendStep(batch, name, boundary, pool, meta, side.layers, tags, self.obs,
                                               self.now, rows_cache, self._layer_hook(batch, name, reads),
                                               interleaved=self.before_layer is not None,
                                               write_fault=None if self.faults is None else
                                               self.faults.write_hook(self, name, side.layers)))
        self.crossings += len(side.layers)
        self.stats[name].writes += sum(1 for w in writes if w.error_class != "design_error" or w.error is None)
        found, counts = side.checker.check(batch.step, name, pool, truth, writes, self.pad_slots)
        if view is not None:
            self.forward_observer.after_forward(view)
        if reads is not None:
            reads.finish()
            if reads.found:
                # after the writes' findings: a layer writes before its attention reads
                more, more_counts = side.checker.emit_all(reads.found)
                found = found + more
                counts = {c: n + more_counts[c] for c, n in counts.items()}
        if self.faults is not None:
            self.faults.after_forward(self, batch, truth, name, pool)
            found, counts = self._content_check(side, name, batch.step, pool, table, found, counts)
        self._count(side, name, found, counts)

    def _content_check(self, side, name, step, pool, table, found, counts, sweep: bool = False):
        """Under --inject: the pool under test's rows at the read set (every live slot at the final sweep)
        against the reference, after the forward; a difference is a stale_read (checker.check_contents)."""
        for kind in ("full", "swa"):
            if sweep:
                slots = np.flatnonzero(side.reference.live[kind])
            else:
                ids = None if table is None else table.of(kind)
                if ids is None:
                    continue
                slots = np.unique(ids.indices.cpu().numpy().astype(np.int64))
            more = side.checker.check_contents(step, name, kind, pool, slots, side.layers,
                                               self._content_seen.setdefault(name, set()), sweep)
            if more:
                m, mc = side.checker.emit_all(more)
                found = found + m
                counts = {c: n + mc[c] for c, n in counts.items()}
        return found, counts

    def content_sweep(self) -> None:
        """Under --inject, at the end of the run: every live slot of every pool checked once."""
        step = self.steps[-1].step if self.steps else 0
        for side in self.sides:
            for name in side.boundaries:
                self._count(side, name, *self._content_check(side, name, step, side.pools[name], None, [],
                                                             dict.fromkeys(FINDING_CLASSES, 0), sweep=True))

    def _layer_hook(self, batch: ForwardBatch, name: str,
                    reads: Optional["_ReadCheck"]) -> Optional[Callable[[LayerInfo], None]]:
        """What runs before each layer: the timeline's callback, then the layer's read check."""
        timeline = self.before_layer
        if timeline is None:
            return None if reads is None else reads.at_layer

        def before(layer: LayerInfo) -> None:
            timeline(batch, name, layer)
            if reads is not None:
                reads.at_layer(layer)
        return before

    def _count(self, side: ModelSide, name: str, found: list[Finding], counts: dict[str, int]) -> None:
        if not any(counts.values()):
            return
        st = self.stats[name]
        for c, n in counts.items():
            st.findings[c] += n
        if st.first_finding is None:
            st.first_finding = side.checker.first.get(name)
        self.findings.extend(found)
        self.obs.on_findings(found)

    def _record_step(self, batch: ForwardBatch, t_start: int, timeline: Optional[dict] = None,
                     used: Optional[tuple[int, int]] = None) -> StepRecord:
        a = self.alloc
        full_used, swa_used = used if used is not None else (a.full_used, a.swa_used)
        rec = StepRecord(
            step=batch.step, mode=batch.mode, graph=batch.graph, num_requests=batch.num_requests,
            real_tokens=batch.num_token_non_padded, dp_padded_tokens=batch.dp_padded_len,
            padded_tokens=batch.padded_len, full_used=full_used, swa_used=swa_used,
            full_size=a.full_size, swa_size=a.swa_size, t_start_ns=t_start, t_end_ns=self.now(),
            timeline=timeline)
        self.steps.append(rec)
        self.obs.on_step(rec)
        return rec


def _model_allocator(scenario: Scenario, design: Design):
    """The modelled allocator of a scenario: the static hybrid pool, or the unified pool (pool.unified)."""
    cfg = scenario.pool
    if cfg.unified:
        from simulator.plugins.unified import model_unified_pool
        return model_unified_pool(scenario, design)
    return HybridAllocator(cfg.full_size, cfg.swa_size, cfg.page_size)


def run_simulation(
    scenario: Scenario,
    design: Design,
    make_pool: PoolFactory,
    *,
    device: torch.device | str = "cpu",
    observer: RunObserver | None = None,
    progress: Optional[Progress] = None,
    run_info_extra: Optional[dict] = None,
    version: str = "0",
    max_steps: Optional[int] = None,
    executor: Optional[LayerExecutor] = None,
    make_draft_pool: Optional[DraftPoolFactory] = None,
    allocator_factory: Optional[AllocatorFactory] = None,
    faults=None,
    forward_observer: Optional[ForwardObserver] = None,
) -> RunResult:
    """Run a scenario under a design; on any exception (^C included) the partial result rides on it.

    Its steps run in ``torch.inference_mode`` (no autograd bookkeeping: a third less host time per small
    op). The run's pools and allocator are made before, as ordinary tensors; what its steps make (a graph
    runner's static buffers, an allocator's new free lists) are inference tensors: read anywhere, changed in
    place only in that mode."""
    run = Run(scenario, design, make_pool, device=torch.device(device), observer=observer or NullObserver(),
              executor=executor or EagerExecutor(), make_draft_pool=make_draft_pool,
              info_extra=run_info_extra or {}, version=version, allocator_factory=allocator_factory)
    run.forward_observer = forward_observer
    run.obs.on_run_start(run.info)
    if faults is not None:
        # --inject (simulator/plugins/faults.py): not on an overlap timeline, whose step is the driver's
        if run.overlap is not None:
            raise ValueError("--inject is not modelled on an overlap timeline (engine.overlap)")
        run.faults, run._content_seen, run._fault_side = faults, {}, run.target
    try:
        with torch.inference_mode():
            source = run.scheduler.steps() if run.overlap is None else run.overlap.pairs(run.scheduler.steps())
            if run.unified is not None:
                source = run.unified.guard(source)      # a device-side index assert (U1) ends the run
            for n_step, (batch, truth) in enumerate(source):
                if max_steps is not None and n_step >= max_steps:
                    break
                rec = run.step(batch, truth)
                if progress is not None:
                    progress(rec.step, run.scheduler.finished_count, run.scheduler.total_requests)
            if run.faults is not None:
                run.content_sweep()
                run.faults.detect(run.findings)
    except BaseException as exc:
        # nothing is lost on a crash or ^C: the caller can still write what the run had found
        exc.partial_result = run.result()  # type: ignore[attr-defined]
        exc.partial_at_step = len(run.steps)  # type: ignore[attr-defined]
        raise
    run.obs.on_run_end()
    return run.result()
