"""The run loop: scenario -> scheduler -> every backend boundary -> writers -> checker -> records.

The loop owns no I/O. It takes a pool factory (cuda_path provides one; the simulator never imports
it), an observer (tracing's recorder, the app's timeline) and a progress callback, and returns a
:class:`RunResult` with counts per backend and the findings.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from .allocator import HybridAllocator, RequestSlots
from .backends import BACKEND_SPECS, BackendBoundary
from .checker import Checker
from .designs import Design
from .execute import BackendStep, EagerExecutor, LayerExecutor
from .observe import NullObserver, RunObserver
from .pool import PoolWriter
from .records import DRAFT_MODES, FINDING_CLASSES, Finding, RunInfo, StepRecord
from .reference import ReferencePool
from .scenario import Scenario
from .scheduler import Scheduler
from .speculative import DraftPoolFactory, ModelSide, build_draft_side
from .workload import make_requests

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

    @property
    def total_findings(self) -> int:
        return sum(s.total for s in self.backends.values())


def padding_of(design: Design) -> tuple[Optional[int], Optional[int]]:
    """(pad value of out_cache_loc, store skip index) for the design's convention; None = dummy slot."""
    return {
        "slot0": (0, 0),
        "slot0-absorb": (0, None),
        "skip-1": (-1, -1),
        "dummy": (None, None),
    }[design.padding]


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
) -> RunResult:
    device = torch.device(device)
    run_layers: LayerExecutor = executor or EagerExecutor()
    obs: RunObserver = observer or NullObserver()
    rng = np.random.default_rng(scenario.seed)
    pool_cfg = scenario.pool
    alloc = HybridAllocator(pool_cfg.full_size, pool_cfg.swa_size, pool_cfg.page_size)
    reserved = np.arange(pool_cfg.page_size, dtype=np.int64)
    pad_value, skip_index = padding_of(design)
    pad_slots: tuple[int, ...] = (0,) if pad_value == 0 else ((pad_value,) if pad_value is not None else ())
    if pad_value is None:
        # mini-sglang: a dummy request's page, allocated before any real request, absorbs padded rows
        dummy = RequestSlots(pool_cfg.page_size)
        alloc.extend(dummy, pool_cfg.page_size)
        pad_value = int(dummy.full[0])
        reserved = np.concatenate([reserved, dummy.full, dummy.swa])
        pad_slots = (pad_value, int(dummy.swa[0]))

    requests = make_requests(scenario.workload, rng)
    scheduler = Scheduler(scenario, alloc, requests, rng, pad_value=pad_value,
                          pad_to_capture=design.padding == "dummy")
    reference = ReferencePool(alloc.full_rows, alloc.swa_rows, device)
    checker = Checker(reference, scheduler.owner_of, reserved)
    layers = scenario.model.layers()
    backends = {b: BackendBoundary(BACKEND_SPECS[b], design, scenario.engine, device) for b in scenario.backends}
    pools = {b: make_pool(alloc.full_rows, alloc.swa_rows, skip_index) for b in scenario.backends}
    stats = {b: BackendStats() for b in scenario.backends}
    target = ModelSide(layers, backends, pools, reference, checker, alloc.full_size, alloc.swa_size)
    draft: Optional[ModelSide] = None
    if scenario.engine.speculative.enabled:
        draft = build_draft_side(scenario, design, alloc, make_pool, make_draft_pool, skip_index,
                                 scheduler.owner_of, reserved, device)
    sides = (target,) if draft is None else (target, draft)

    if device.type == "cpu":
        mapping = torch.from_numpy(alloc.full_to_swa)      # shares memory: always current
    else:
        mapping = torch.from_numpy(alloc.full_to_swa).to(device)

    info = RunInfo(
        scenario=scenario.name, scenario_path=scenario.source, scenario_hash=scenario.hash, design=design.name,
        seed=scenario.seed, backends=tuple(scenario.backends), layers=tuple(li for m in sides for li in m.layers),
        device=str(device), version=version,
        extra=dict(run_info_extra or {}),
    )
    obs.on_run_start(info)
    findings: list[Finding] = []
    steps: list[StepRecord] = []
    crossings = 0
    epoch0, perf0 = time.time_ns(), time.perf_counter_ns()
    wall0 = time.perf_counter()

    def now() -> int:
        return epoch0 + (time.perf_counter_ns() - perf0)

    def result() -> RunResult:
        return RunResult(info=info, backends=stats, findings=findings, steps=steps,
                         findings_truncated=any(m.checker.truncated for m in sides), crossings=crossings,
                         wall_s=time.perf_counter() - wall0)

    try:
        for n_step, (batch, truth) in enumerate(scheduler.steps()):
            if max_steps is not None and n_step >= max_steps:
                break
            t_step = now()
            side = draft if draft is not None and batch.mode in DRAFT_MODES else target
            for m in sides:
                m.reference.apply_frees(truth)
            side.reference.apply_writes(truth)
            if device.type != "cpu" and truth.mapping_changed.size:
                ch = torch.from_numpy(truth.mapping_changed).to(device)
                mapping[ch] = torch.from_numpy(alloc.full_to_swa[truth.mapping_changed]).to(device)
            loc = torch.from_numpy(batch.out_cache_loc).to(device)
            tags = torch.from_numpy(truth.tags).to(device)
            rows_cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
            step = batch.step
            for name, boundary in side.boundaries.items():
                pool = side.pools[name]
                meta = boundary.init_metadata(batch, loc, mapping)
                writes = run_layers.run(BackendStep(batch, name, boundary, pool, meta, side.layers, tags, obs, now,
                                                    rows_cache))
                crossings += len(side.layers)
                st = stats[name]
                st.writes += len(side.layers)
                fs, counts = side.checker.check(step, name, pool, truth, writes, pad_slots)
                if any(counts.values()):
                    for c, n in counts.items():
                        st.findings[c] += n
                    if st.first_finding is None:
                        st.first_finding = side.checker.first.get(name)
                    findings.extend(fs)
                    obs.on_findings(fs)
            rec = StepRecord(
                step=step, mode=batch.mode, graph=batch.graph, num_requests=batch.num_requests,
                real_tokens=batch.num_token_non_padded, dp_padded_tokens=batch.dp_padded_len,
                padded_tokens=batch.padded_len, full_used=alloc.full_used, swa_used=alloc.swa_used,
                full_size=alloc.full_size, swa_size=alloc.swa_size, t_start_ns=t_step, t_end_ns=now(),
            )
            steps.append(rec)
            obs.on_step(rec)
            if progress is not None:
                progress(step, scheduler.finished_count, scheduler.total_requests)
    except BaseException as exc:
        # nothing is lost on a crash or ^C: the caller can still write what the run had found
        exc.partial_result = result()  # type: ignore[attr-defined]
        exc.partial_at_step = len(steps)  # type: ignore[attr-defined]
        raise
    obs.on_run_end()
    return result()
