"""A run, assembled and driven: scenario -> sources -> run state and plug-ins -> the step pipeline per step.

:func:`make_run` picks a source for each concern a scenario needs (the allocator: the model's static or
unified pool, or an engine's through ``allocator_factory``; the scheduler with or without the tree cache
or the PD decode node; the backends: the model's specs), builds the model sides, and installs the
plug-ins the scenario asks for (the overlap timeline, the unified pool's plan, fault injection, a forward
observer). :func:`run_simulation` drives the steps. Which source served which concern is recorded in
``Run.sources`` (run.json's ``sources``). The loop owns no I/O: it takes a pool factory (cuda_path provides
one; the simulator never imports it), an observer and a progress callback, and returns a ``RunResult``.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch

from simulator.core.boundary import BackendSource, ModelBackends
from simulator.core.eager import EagerExecutor
from simulator.core.observe import ForwardObserver, NullObserver, RunObserver
from simulator.core.run import PoolFactory, Progress, Run, RunPadding, RunResult, run_padding
from simulator.core.sides import DraftPoolFactory, build_draft_side, build_target_side
from simulator.designs.base import Design, declared
from simulator.designs.loading import design_padding
from simulator.engine_model.release import Release
from simulator.memory.allocator import HybridAllocator
from simulator.plugins.faults import FaultInjector
from simulator.plugins.forward_view import ForwardView as ForwardViewPlugin
from simulator.plugins.overlap import overlap_driver
from simulator.plugins.unified import UnifiedPlan, model_unified_pool
from simulator.scenario import PoolConfig, Scenario, ScenarioError
from simulator.scheduling.pd_decode import PDDecodeScheduler
from simulator.scheduling.scheduler import Scheduler
from simulator.scheduling.sharing import SharingScheduler
from simulator.scheduling.workload import make_requests

#: the scenario's pool config -> an allocator with HybridAllocator's interface (engine_path's EngineAllocator)
AllocatorFactory = Callable[[PoolConfig], HybridAllocator]
#: (scenario, allocator, release, rng, pad_value, pad_to_capture) -> the run's scheduler: :func:`make_scheduler`'s
#: arguments (engine_path's ReleaseStepSource: a release's own scheduler); it has ``steps()`` and ``owner_of``
SchedulerFactory = Callable[..., Scheduler]

__all__ = ["AllocatorFactory", "SchedulerFactory", "PoolFactory", "Progress", "Run", "RunPadding", "RunResult", "make_run",
           "make_scheduler", "run_simulation", "scheduler_kind"]


def scheduler_kind(scenario: Scenario) -> str:
    """Which scheduler a scenario runs: ``radix`` (engine.radix_cache), ``pd_decode`` (engine.pd_decode) or
    ``base`` (the plain scheduler; the overlap timeline and the unified pool sit around it, not in it)."""
    if scenario.engine.radix_cache:
        return "radix"
    if scenario.engine.pd_decode:
        return "pd_decode"
    return "base"


def make_scheduler(scenario: Scenario, alloc, release: Release, rng: np.random.Generator, pad_value: int,
                   pad_to_capture: bool, kind: Optional[str] = None) -> Scheduler:
    """The scenario's own scheduler over ``alloc`` (the run's choice; engine_path's conformance trace makes the
    same one), with the release's behaviour and free paths. ``kind``: force one (:func:`scheduler_kind`'s
    names), e.g. the base scheduler where a side cannot run the scenario's."""
    if scenario.engine.kv_offload:
        raise ScenarioError(f"{scenario.source}: engine.kv_offload: slotscope has no model of an offload tier; it "
                            f"is driven as vLLM's KV connector (run with --engine vllm)")
    spec = scenario.engine.speculative
    if spec.enabled and spec.algorithm != "eagle":
        raise ScenarioError(f"{scenario.source}: engine.speculative.algorithm: {spec.algorithm} is vLLM's "
                            f"speculator; slotscope has no model of it (run with --engine vllm)")
    kind = kind or scheduler_kind(scenario)
    requests = make_requests(scenario.workload, rng)
    kw = dict(pad_value=pad_value, pad_to_capture=pad_to_capture, release=release.behaviour)
    if kind == "radix":
        # the radix cache between the scheduler and the allocator (opt-in)
        return SharingScheduler(scenario, alloc, requests, rng, sharing=release.sharing, **kw)
    if kind == "base" and release.behaviour.disabled_tree and _tree_runs(scenario, alloc):
        # 0.5.23: the radix cache off is its tree disabled under the same scheduler (PrefillAdder, retraction)
        return SharingScheduler(scenario, alloc, requests, rng, sharing=release.sharing, tree_disabled=True, **kw)
    if kind == "pd_decode":
        # a PD decode node: SWA-tail pre-allocation, the transferred KV, the chunk cache's frees
        return PDDecodeScheduler(scenario, alloc, requests, rng, sharing=release.sharing, **kw)
    return Scheduler(scenario, alloc, requests, rng, **kw)


def _tree_runs(scenario: Scenario, alloc) -> bool:
    """Whether the scheduler over a disabled tree models this scenario: not with speculative decoding, the overlap
    scheduler or the unified pool yet (those keep the plain scheduler)."""
    eng = scenario.engine
    return (not eng.speculative.enabled and not eng.overlap and not scenario.pool.unified
            and (isinstance(alloc, HybridAllocator) or bool(getattr(alloc, "release_frees", False))))


def model_allocator(scenario: Scenario, release: Release):
    """The modelled allocator of a scenario: the static hybrid pool, or the unified pool (pool.unified)."""
    cfg = scenario.pool
    if cfg.unified:
        return model_unified_pool(scenario, release.unified_pool)
    return HybridAllocator(cfg.full_size, cfg.swa_size, cfg.page_size)


def _sources(scenario: Scenario, design: Design, alloc, backends: BackendSource, executor, target,
             scheduler, pad: RunPadding) -> dict:
    """run.json's ``sources``: per concern, whose code serves it in this run; the design's declared fast paths."""
    probe = next(iter(target.boundaries.values()), None)
    own = getattr(scheduler, "source", None)        # a release's scheduler says whose it is; the model's does not
    tree = getattr(scheduler, "tree_cache_source", None) if own else ("model" if scheduler_kind(scenario) == "radix"
                                                                      else None)
    return {"allocator": alloc.source, "scheduler": own or "model", "backends": backends.name, "tree_cache": tree,
            "release": design.release.to_json(), "design": design.name, "executor": type(executor).__name__,
            "padding": {"convention": pad.convention.name, "pad_value": int(pad.pad_value),
                        "skip_index": pad.skip_index, "null_block": pad.convention.null_block},
            "declared": {"layer_free_write_loc": bool(probe and probe.layer_free_write_loc()),
                         "pure_read_ids": declared(design.read_ids, "pure"),
                         "base_read_ids": declared(design.read_ids, "base_reads")}}


def make_run(scenario: Scenario, design: Design, make_pool: PoolFactory, *, device: torch.device | str = "cpu",
             observer: Optional[RunObserver] = None, executor=None, make_draft_pool: Optional[DraftPoolFactory] = None,
             info_extra: Optional[dict] = None, version: str = "0", allocator_factory: Optional[AllocatorFactory] = None,
             faults: Optional[FaultInjector] = None, forward_observer: Optional[ForwardObserver] = None,
             backends: Optional[BackendSource] = None, scheduler_factory: Optional[SchedulerFactory] = None) -> Run:
    """A run's state with its sources and plug-ins, ready for its first step. ``backends``: the source of the
    backends' behaviour (the model's specs by default); ``scheduler_factory``: the source of the batches (the
    scenario's model scheduler by default, :func:`make_scheduler`)."""
    device = torch.device(device)
    backends = backends if backends is not None else ModelBackends()
    rng = np.random.default_rng(scenario.seed)
    release = design.release
    # allocator_factory: the seam for an engine's allocator (engine_path.runtime.EngineRuntime)
    alloc = allocator_factory(scenario.pool) if allocator_factory is not None else model_allocator(scenario, release)
    pad = run_padding(design_padding(design), alloc)
    if scenario.pool.unified and pad.convention.dummy_request:
        raise ScenarioError(f"pool.unified: design {design.name}'s padding convention uses a dummy request, "
                            f"whose slots would be virtual ids; the unified pool pads with the sink (slot 0)")
    scheduler = (scheduler_factory or make_scheduler)(scenario, alloc, release, rng, pad.pad_value,
                                                      pad.convention.dummy_request)
    owner_of = scheduler.owner_of
    target = build_target_side(scenario, design, alloc, make_pool, pad.skip_index, owner_of, pad.reserved, device,
                               pad.swa_pad, backends)
    draft = None
    if scenario.engine.speculative.enabled:
        draft = build_draft_side(scenario, design, alloc, make_pool, make_draft_pool, pad.skip_index, owner_of,
                                 pad.reserved, device, pad.swa_pad, backends)
    run_executor = executor or EagerExecutor()
    run = Run(scenario, design, alloc=alloc, scheduler=scheduler, padding=pad, target=target, draft=draft,
              device=device, observer=observer or NullObserver(), executor=run_executor,
              info_extra=info_extra or {}, version=version,
              sources=_sources(scenario, design, alloc, backends, run_executor, target, scheduler, pad))
    _install_plugins(run, scenario, release, faults, forward_observer)
    run.pipeline.settle_pools()
    return run


def _install_plugins(run: Run, scenario: Scenario, release: Release, faults: Optional[FaultInjector],
                     forward_observer: Optional[ForwardObserver]) -> None:
    """The plug-ins a scenario and the caller ask for, in the order their hooks run."""
    if scenario.pool.unified:
        # the per-forward plan between virtual and physical ids (simulator/plugins/unified.py)
        run.install(UnifiedPlan(run))
    # engine.overlap is SGLang's overlap scheduler, on its timeline, unless the scheduler source drives its engine's
    # own (vLLM's async scheduling: engine_path/vllm/scheduler.py), which says so with ``owns_overlap``
    own = getattr(run.scheduler, "owns_overlap", False)
    overlap = None if own else overlap_driver(run, scenario, release.behaviour)
    if overlap is not None:
        # the timeline driver (simulator/plugins/overlap.py; it gives the run a mapping of its own)
        run.install(overlap)
    if faults is not None:
        # --inject (simulator/plugins/faults.py): not on an overlap timeline, whose landings are the driver's
        if overlap is not None:
            raise ValueError("--inject is not modelled on an overlap timeline (engine.overlap)")
        run.install(faults)
    if forward_observer is not None:
        # called around each backend forward (core.observe.ForwardObserver: bench/vs_kv_canary.py's canary)
        run.install(ForwardViewPlugin(forward_observer))
    run.sources["plugins"] = [p.name for p in run.plugins]


def run_simulation(scenario: Scenario, design: Design, make_pool: PoolFactory, *, device: torch.device | str = "cpu",
                   observer: Optional[RunObserver] = None, progress: Optional[Progress] = None,
                   run_info_extra: Optional[dict] = None, version: str = "0", max_steps: Optional[int] = None,
                   executor=None, make_draft_pool: Optional[DraftPoolFactory] = None,
                   allocator_factory: Optional[AllocatorFactory] = None, faults: Optional[FaultInjector] = None,
                   forward_observer: Optional[ForwardObserver] = None,
                   backends: Optional[BackendSource] = None,
                   scheduler_factory: Optional[SchedulerFactory] = None) -> RunResult:
    """Run a scenario under a design; on any exception (^C included) the partial result rides on it.

    Its steps run in ``torch.inference_mode`` (no autograd bookkeeping: a third less host time per small
    op). The run's pools and allocator are made before, as ordinary tensors; what its steps make (a graph
    runner's static buffers, an allocator's new free lists) are inference tensors: read anywhere, changed in
    place only in that mode."""
    run = make_run(scenario, design, make_pool, device=device, observer=observer, executor=executor,
                   make_draft_pool=make_draft_pool, info_extra=run_info_extra, version=version,
                   allocator_factory=allocator_factory, faults=faults, forward_observer=forward_observer,
                   backends=backends, scheduler_factory=scheduler_factory)
    run.obs.on_run_start(run.info)
    try:
        with torch.inference_mode():
            for n_step, (batch, truth) in enumerate(run.stream()):
                if max_steps is not None and n_step >= max_steps:
                    break
                rec = run.step(batch, truth)
                if progress is not None:
                    progress(rec.step, run.scheduler.finished_count, run.scheduler.total_requests)
            for p in run.plugins:
                p.end_run(run)
    except BaseException as exc:
        # nothing is lost on a crash or ^C: the caller can still write what the run had found
        exc.partial_result = run.result()  # type: ignore[attr-defined]
        exc.partial_at_step = len(run.steps)  # type: ignore[attr-defined]
        raise
    run.obs.on_run_end()
    return run.result()
