"""One run's engine pieces, wired together: the allocator, the translator, the design and the pools.

:class:`EngineRuntime` hands the simulator the three seams an engine run needs, each a plain callable
or object the simulator already knows the shape of:

* ``allocator_factory(full_size, swa_size, page_size)`` -> :class:`EngineAllocator` (instead of
  ``HybridAllocator``); making it also builds the run's :class:`Translator` over its hybrid pool;
* ``design`` -> :class:`EngineDesign`, bound to that translator;
* ``pool_factory(model)`` -> the simulator's ``PoolFactory`` ``(full_rows, swa_rows, skip_index)``
  making an :class:`EnginePool` per backend, with the allocator's mapping registered.

The allocator must be made before the first pool (``run_simulation`` makes it first).
"""
from __future__ import annotations

from typing import Callable, Optional

from simulator.core.sides import draft_layers, draft_model, draft_pool_sizes

from .allocator import EngineAllocator
from .api import ReleaseAPI
from .design import EngineDesign
from .errors import EngineError
from .forward.boundary import ReleaseBackends
from .forward.runner import Runner, RunnerContext, build_runner, context_len, publish_config, request_rows
from .pool import EnginePool, build_swa_pool
from .scheduler import scheduler_context_len, server_fields
from .writeloc import Translator


class EngineRuntime:
    def __init__(self, api: ReleaseAPI, *, device: str = "cpu", need_sort: bool = False, model=None):
        """``model``: our design of this release (its modelled backend parts and release behaviour; see
        :class:`EngineDesign`), None for the base spec and mid-2026 behaviour."""
        self.api = api
        self.device = device
        self.need_sort = need_sort
        self.allocator: Optional[EngineAllocator] = None
        self.translator: Optional[Translator] = None
        self.design = EngineDesign(api, model=model)
        #: the release's store the pools run (engine_path.pool.release_store), once a pool is made
        self.store_info: Optional[dict] = None
        #: the release's backends as the run's backend source (engine_path.forward), once asked for
        self.backend_source: Optional[ReleaseBackends] = None
        self._config: Optional[RunnerContext] = None
        #: the run's scheduler source, once made (engine_path.schedule_source.ReleaseStepSource)
        self.schedule_source = None
        #: who makes the batches and why (slotscope's ``--scheduler`` choice; run.json's engine_pieces): set before
        #: :meth:`backends`
        self.scheduler_choice: Optional[dict] = None

    @property
    def release_scheduler(self) -> bool:
        """Whether the release's own scheduler makes the run's batches (``scheduler_choice``)."""
        return self.scheduler_choice is not None and self.scheduler_choice["scheduler"] == "release"

    def allocator_factory(self, full_size, swa_size: Optional[int] = None, page_size: int = 1,
                          **_ignored) -> EngineAllocator:
        """``(full_size, swa_size, page_size)``, or one ``PoolConfig`` (``run_simulation``'s
        ``allocator_factory`` seam passes the scenario's pool config)."""
        if swa_size is None:
            cfg = full_size
            full_size, swa_size, page_size = cfg.full_size, cfg.swa_size, cfg.page_size
        # the allocator is host bookkeeping (its int64 mapping on the CPU, as the run loop reads it); on a GPU its
        # paged kernels run there over copies (engine_path.host_kernels)
        alloc = EngineAllocator(self.api, full_size, swa_size, page_size, need_sort=self.need_sort, device="cpu",
                                kernel_device=self.device)
        self.allocator = alloc
        pool = alloc.kvcache
        if self.device != "cpu":
            # a host pool of the translator's own: it registers host copies of the run's device mapping
            pool = build_swa_pool(self.api, size=full_size, size_swa=swa_size, page_size=page_size,
                                  full_layers=[1], swa_layers=[0], device="cpu")
        self.translator = Translator(self.api, pool, alloc.engine, page_size, "cpu")
        self.design.bind(self.translator)
        return alloc

    def pool_factory(self, model, *, kv_dtype: Optional[str] = None) -> Callable:
        layers = [(li.layer, li.kind, li.index) for li in model.layers()]
        dtype = kv_dtype or getattr(model, "kv_dtype", "bf16")
        built: set = set()      # the sizes a pool of this factory was built with

        # A pool of sizes already built is built when first used: on the CPU the run keeps one pool per class
        # of backends (simulator.memory.pool.PoolClasses), so the other backends' pools are never used, and a release
        # constructor for each of them was most of a short run's time (the first pool still fails at set-up).

        def make_pool(full_rows: int, swa_rows: int, skip_index: Optional[int] = None) -> EnginePool:
            if self.allocator is None:
                raise EngineError("the engine allocator must be made before the engine pools")
            page = self.allocator.page_size
            size = (full_rows, swa_rows, page)
            pool = EnginePool(self.api, full_size=full_rows - page, swa_size=swa_rows - page, page_size=page,
                              layers=layers, mapping=self.allocator.mapping, kv_dtype=dtype, device=self.device,
                              build=size not in built)
            built.add(size)
            self.store_info = pool.store_info
            return pool

        return make_pool

    def backends(self, scenario) -> "ReleaseBackends":
        """The run's backend source: the release's own backends (engine_path/forward), over a model-runner
        stand-in per model side built on the run's allocator (made first: ``allocator_factory``). The release's
        runtime config is published until :meth:`close`. A release whose config or backends the adapters cannot
        drive yet gets the model's boundaries, every one named with the reason."""
        if self.backend_source is None:
            try:
                spec = scenario.engine.speculative
                self._config = publish_config(self.api, backend="triton", page_size=scenario.pool.page_size,
                                              device=self.device,
                                              spec=(spec.num_draft_tokens, spec.num_steps) if spec.enabled else None,
                                              extra=server_fields(scenario) if self.release_scheduler else None)
            except EngineError as e:
                self.backend_source = ReleaseBackends(self.api, None, unavailable=str(e))
                return self.backend_source
            runners: dict = {}

            def runner_for(side: str) -> Runner:
                if side not in runners:
                    if self.allocator is None:
                        raise EngineError("the engine allocator must be made before the engine backends")
                    layers = sizes = planner = None
                    spec = scenario.engine.speculative
                    if side == "draft":        # its own layers and pools, over the target's allocator
                        layers = draft_layers(scenario.model, draft_model(scenario.model, scenario))
                        sizes = draft_pool_sizes(self.design, self.allocator, scenario)
                        planner = runner_for("target").translator     # a round is planned by the target's
                    runners[side] = build_runner(self.api, model=scenario.model, allocator=self.allocator,
                                                 max_requests=request_rows(scenario), context_len=context_len(scenario),
                                                 device=self.device, server_args=self._config.server_args,
                                                 layers=layers, pool_sizes=sizes, draft=side == "draft",
                                                 spec_algorithm=spec.algorithm if spec.enabled else None,
                                                 planner=planner)
                return runners[side]
            self.backend_source = ReleaseBackends(self.api, runner_for)
        return self.backend_source

    def scheduler_factory(self, scenario, alloc, release, rng, pad_value: int = 0, pad_to_capture: bool = False):
        """The run's scheduler: the release's own (``simulator.run.make_run``'s ``scheduler_factory`` seam), over
        a model-runner stand-in of its own (its ``req_to_token`` rows are the scheduler's, not rewritten per
        forward) on the run's allocator, with the server args :meth:`backends` published."""
        from .schedule_source import ReleaseStepSource

        if self._config is None:
            raise EngineError("the release's scheduler needs the run's published config: make the backends first")
        runner = build_runner(self.api, model=scenario.model, allocator=alloc, max_requests=request_rows(scenario),
                              context_len=scheduler_context_len(scenario), device="cpu",
                              server_args=self._config.server_args)
        self.schedule_source = ReleaseStepSource(self.api, scenario, alloc, runner, release.behaviour, rng,
                                                 pad_value, pad_to_capture, server_args=self._config.server_args)
        return self.schedule_source

    def close(self) -> None:
        """Restore the release's runtime config published for the run (the scheduler's overrides first)."""
        if self.schedule_source is not None:
            self.schedule_source.close()
        if self._config is not None:
            self._config.close()
            self._config = None

    def describe(self) -> dict:
        d = self.design.describe()
        if self.backend_source is not None:
            d["backends"] = self.backend_source.describe()
        d["device"] = self.device
        if self.store_info is not None:
            d["store"] = self.store_info
            d["engine_pieces"] = [f"{p} ({self.store_info['store']} on {self.device})"
                                  if p == "SWAKVPool.set_kv_buffer" else p for p in d["engine_pieces"]]
        if self.allocator is not None:
            d["allocator"] = self.allocator.describe()["allocator"]
            d["engine_pieces"] = d["engine_pieces"] + list(getattr(self.allocator, "pieces_ran", list)())
        if self.schedule_source is not None:
            # the batches are the release's: its scheduler and tree cache leave the model's pieces
            sched = self.schedule_source.describe()
            d["scheduler"] = sched
            d["engine_pieces"] = d["engine_pieces"] + [sched["scheduler"], f"tree cache: {sched['tree_cache']}"]
            d["model_pieces"] = [p for p in d["model_pieces"] if p != "scheduler"]
        return d
