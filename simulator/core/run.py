"""A run's state across its steps: the allocator, the scheduler, the model sides, the plug-ins, the counts.

:class:`Run` is made by :func:`simulator.run.make_run` (which picks the sources and plug-ins a scenario
needs), advanced by :meth:`Run.step` (the step pipeline, simulator/core/pipeline.py) and read by
:meth:`Run.result`. It owns no I/O: the pool factory, observers and progress come from the caller.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from simulator.core.observe import RunObserver, boundary_sink
from simulator.core.pipeline import StepPipeline
from simulator.core.plugins import Plugins, StepPlugin
from simulator.core.sides import ModelSide
from simulator.designs.base import Design
from simulator.engine_model.padding_convention import PaddingConvention
from simulator.memory.allocator import HybridAllocator, RequestSlots
from simulator.memory.pool import PoolWriter
from simulator.records import FINDING_CLASSES, Finding, RunInfo, StepRecord
from simulator.scenario import Scenario
from simulator.scheduling.batch import BatchRequests, BatchTruth, ForwardBatch

PoolFactory = Callable[[int, int, Optional[int]], PoolWriter]   # (full_rows, swa_rows, skip_index)
Progress = Callable[[int, int, int], None]                      # (step, finished requests, total requests)


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
    #: which source served each concern, the plug-ins, the design's declared fast paths (run.json's ``sources``)
    sources: dict = field(default_factory=dict)
    #: the physical pools under test each side held at the end ("target", "draft"): 1 while all its backends'
    #: writes agreed (shared pools, simulator/memory/pool.py), up to one per backend
    physical_pools: dict = field(default_factory=dict)

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
    # a null block is compared like any slot (a write there is a finding); a sink page never is
    reserved = np.arange(0 if conv.null_block else page, dtype=np.int64)
    if not conv.dummy_request:
        pad, swa_pad = conv.resolve(None, None)
        return RunPadding(conv, pad, swa_pad, conv.skip_index, reserved, (pad,))
    # mini-sglang: a dummy request's page, allocated before any real request, absorbs padded rows
    dummy = RequestSlots(page)
    alloc.extend(dummy, page)
    pad, swa_pad = conv.resolve(int(dummy.full[0]), int(dummy.swa[0]))
    return RunPadding(conv, pad, swa_pad, conv.skip_index, np.concatenate([reserved, dummy.full, dummy.swa]),
                      (pad, int(dummy.swa[0])))


class Run:
    """One run's state: made by :func:`simulator.run.make_run`, advanced by :meth:`step`, read by :meth:`result`."""

    def __init__(self, scenario: Scenario, design: Design, *, alloc, scheduler, padding: RunPadding,
                 target: ModelSide, draft: Optional[ModelSide], device: torch.device, observer: RunObserver,
                 executor, info_extra: dict, version: str, sources: Optional[dict] = None):
        self.scenario, self.design = scenario, design
        self.device, self.obs, self.executor = device, observer, executor
        #: the observer's batch sink (core.observe.boundary_sink), resolved once
        self.sink = boundary_sink(observer)
        self.alloc, self.scheduler = alloc, scheduler
        self.pad_slots = padding.pad_slots
        self.target, self.draft = target, draft
        self.sides = (target,) if draft is None else (target, draft)
        #: the model side of the step in progress (the target between steps)
        self.side = target
        for m in self.sides:
            for b in m.boundaries.values():
                b.window = scenario.model.window      # the draft's SWA layers read the target's window
                b.swa_layers = any(layer.kind == "swa" for layer in m.layers)
        #: check every forward's reads (engine.read_check)
        self.read_check = bool(scenario.engine.read_check)
        # the mapping the backends read: on the CPU the allocator's array itself (always current); elsewhere a
        # device copy updated per step; a plug-in may keep one of its own (the overlap timeline, the unified plan)
        self.mapping = torch.from_numpy(alloc.physical_full_to_swa() if scenario.pool.unified else alloc.full_to_swa)
        if device.type != "cpu":
            self.mapping = self.mapping.to(device)
        self.plugins = Plugins()
        self.pipeline = StepPipeline(self, executor, getattr(executor, "stepwise", None))
        self.info = RunInfo(
            scenario=scenario.name, scenario_path=scenario.source, scenario_hash=scenario.hash, design=design.name,
            seed=scenario.seed, backends=tuple(scenario.backends),
            layers=tuple(li for m in self.sides for li in m.layers), device=str(device), version=version,
            extra=dict(info_extra))
        #: which source serves each concern (allocator, backends, tree cache, scheduler, release): run.json's
        self.sources = dict(sources or {})
        self.stats = {b: BackendStats() for b in scenario.backends}
        self.findings: list[Finding] = []
        self.steps: list[StepRecord] = []
        self.crossings = 0
        self._epoch0, self._perf0 = time.time_ns(), time.perf_counter_ns()
        self._wall0 = time.perf_counter()

    def install(self, plugin: StepPlugin) -> StepPlugin:
        """Add a plug-in of the step pipeline (called in the order installed)."""
        self.plugins.add(plugin)
        return plugin

    def plugin(self, kind: type) -> Optional[StepPlugin]:
        """The installed plug-in of a class (e.g. the overlap timeline's driver), or None."""
        return self.plugins.of(kind)

    def now(self) -> int:
        return self._epoch0 + (time.perf_counter_ns() - self._perf0)

    def step(self, batch: ForwardBatch, truth: BatchTruth) -> StepRecord:
        """One step through the pipeline (simulator/core/pipeline.py)."""
        return self.pipeline.step(batch, truth)

    def stream(self):
        """The scheduler's (batch, truth) stream, as the plug-ins shape it."""
        source = self.scheduler.steps()
        for p in self.plugins:
            source = p.source(self, source)
        return source

    def result(self) -> RunResult:
        for p in self.plugins:
            got = p.run_extra(self)
            if got is not None:
                self.info.extra[p.name] = got
        return RunResult(info=self.info, backends=self.stats, findings=self.findings, steps=self.steps,
                         findings_truncated=any(m.checker.truncated for m in self.sides), crossings=self.crossings,
                         wall_s=time.perf_counter() - self._wall0,
                         radix=(self.scheduler.summary(self.findings) if hasattr(self.scheduler, "cache")
                                and not getattr(self.scheduler.cache, "disabled", False) else None),
                         sources=self.sources,
                         physical_pools={role: len({id(p) for p in side.pools.values()})
                                         for role, side in (("target", self.target), ("draft", self.draft))
                                         if side is not None})

    # ------------------------------------------------------------------ what the phases and plug-ins call

    def sync_mapping(self, full_slots: np.ndarray) -> None:
        """Push the allocator's mapping entries of ``full_slots`` to the device copy (a no-op on the CPU,
        where the tensor is the allocator's array)."""
        if self.device.type != "cpu" and full_slots.size:
            ch = torch.from_numpy(full_slots).to(self.device)
            self.mapping[ch] = torch.from_numpy(self.alloc.full_to_swa[full_slots]).to(self.device)

    def read_inputs(self, rq: BatchRequests) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What metadata init reads for the read ids: ``req_to_token`` rows, ``seq_lens``, ``extend_lens``."""
        dev = self.device
        return (torch.from_numpy(rq.req_to_token()).to(dev), torch.from_numpy(rq.seq_lens).to(dev),
                torch.from_numpy(rq.extend_lens).to(dev))

    def write_transfer(self, tr) -> None:
        """A KV transfer's rows (``BatchTruth.transferred``: a PD decode node's, simulator/scheduling/pd_decode.py;
        its ``written`` rows where it has them), written into every pool of every side outside the backends, as the transfer engine writes them: each
        distinct pool once (backends of one pool class share it), every layer of a kind; no write is counted or
        checked. A pool smaller than the slots (a draft pool sized below the target's, B3's mistake) takes the
        rows it holds: the transfer is not a backend's write, so what lies past a pool is left to the forwards'
        own writes, which are checked (and it must not reach the store's out-of-range count the checker reads)."""
        seen: set[int] = set()
        fs, ft, ss, st = tr.written or (tr.full_slots, tr.full_tags, tr.swa_slots, tr.swa_tags)
        parts = [(kind, torch.from_numpy(slots).to(self.device), torch.from_numpy(tags).to(self.device))
                 for kind, slots, tags in (("full", fs, ft), ("swa", ss, st)) if slots.size]
        for m in self.sides:
            if tr.target_only and m is not self.target:
                continue
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

    def count(self, side: ModelSide, name: str, found: list[Finding], counts: dict[str, int]) -> None:
        """A backend's findings of one delivery: its counts, its first finding, the run's list, the observer."""
        if not any(counts.values()):
            return
        st = self.stats[name]
        for c, n in counts.items():
            st.findings[c] += n
        if st.first_finding is None:
            st.first_finding = side.checker.first.get(name)
        self.findings.extend(found)
        self.obs.on_findings(found)

    def record_step(self, batch: ForwardBatch, t_start: int, timeline: Optional[dict] = None,
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
