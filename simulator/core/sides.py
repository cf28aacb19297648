"""The speculative draft model as the run loop sees it: its layers, its pools, its oracle.

An EAGLE draft is a small model (one layer by default) run beside the target. In SGLang it shares
the target's allocator, so it writes at the target's indices: ``out_cache_loc`` in its full pool,
``full_to_swa[out_cache_loc]`` in its SWA pool. It has its own K/V pools (sized by the scenario and
the design: B3, #17630), its own attention-backend instances and graph runners (B4, #29858), so the
run loop keeps one :class:`ModelSide` per model: boundaries (each with its own design instance),
pools under test, reference, checker.
A draft forward (DRAFT_DECODE, DRAFT_EXTEND) crosses the draft side only; every step's frees reach
both references, since a freed index is free for both models.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

import numpy as np
import torch

from simulator.core.boundary import BackendSource, Boundary, ModelBackends
from simulator.designs.base import Design
from simulator.designs.loading import design_instance
from simulator.designs.types import DesignError
from simulator.memory.allocator import HybridAllocator
from simulator.memory.pool import PoolWriter, backend_pools, own_pools
from simulator.oracle.checker import Checker
from simulator.oracle.reference import ReferencePool
from simulator.records import LayerInfo
from simulator.scenario import Scenario, ScenarioError
from simulator.scenario.models import Model

#: A pool under test for a given model: (model, full_rows, swa_rows, skip_index) -> PoolWriter.
DraftPoolFactory = Callable[[Model, int, int, Optional[int]], PoolWriter]


@dataclass(slots=True)
class ModelSide:
    """One model's half of a run: per backend its boundary and pool under test; one oracle and checker."""

    layers: tuple[LayerInfo, ...]
    boundaries: dict[str, Boundary]
    pools: dict[str, PoolWriter]
    reference: ReferencePool
    checker: Checker
    #: a fresh pool under test like the side's (for :meth:`own_pools`)
    new_pool: Optional[Callable[[], PoolWriter]] = None

    def own_pools(self) -> None:
        """Before the first step: each backend a pool of its own, for a run whose steps go backend by backend
        (the pools start shared where they can be copied on divergence: simulator/memory/pool.py)."""
        if self.new_pool is not None:
            own_pools(self.pools, self.new_pool)


def draft_model(target: Model, scenario: Scenario) -> Model:
    """The draft model: the scenario's draft layer pattern, the target's window and K/V geometry."""
    spec = scenario.engine.speculative
    return Model(name=f"{target.name}-draft", layer_kinds=spec.draft_layers, window=target.window,
                 full=target.full, swa=target.swa, kv_dtype=target.kv_dtype, unverified=target.unverified)


def draft_layers(target: Model, draft: Model) -> tuple[LayerInfo, ...]:
    """Draft layers numbered after the target's (global ids stay unique), each kind indexed from 0."""
    n = target.num_layers
    return tuple(LayerInfo(layer=n + li.layer, kind=li.kind, index=li.index, draft=True) for li in draft.layers())


def side_boundaries(scenario: Scenario, design: Design, side: str, device: torch.device, page_size: int,
                    swa_pad: int, backends: Optional[BackendSource] = None) -> dict[str, Boundary]:
    """One boundary per backend for a model side (from ``backends``: the model's by default), each with its own
    instance of the design."""
    source = backends if backends is not None else ModelBackends()
    return {b: source.boundary(b, design_instance(design), scenario.engine, device, side=side, page_size=page_size,
                               swa_pad=swa_pad)
            for b in scenario.backends}


def build_target_side(scenario: Scenario, design: Design, alloc: HybridAllocator,
                      make_pool: Callable[[int, int, Optional[int]], PoolWriter], skip_index: Optional[int],
                      owner_of, reserved: np.ndarray, device: torch.device, swa_pad: int,
                      backends: Optional[BackendSource] = None) -> ModelSide:
    reference = ReferencePool(alloc.full_rows, alloc.swa_rows, device)
    new_pool = partial(make_pool, alloc.full_rows, alloc.swa_rows, skip_index)
    return ModelSide(
        layers=scenario.model.layers(),
        boundaries=side_boundaries(scenario, design, "target", device, alloc.page_size, swa_pad, backends),
        pools=backend_pools(scenario.backends, new_pool),
        reference=reference, checker=Checker(reference, owner_of, reserved,
                                             reserved_words=design.padding.reserved_words,
                                             null_block=null_block(design, alloc.page_size)), new_pool=new_pool)


def null_block(design: Design, page: int) -> Optional[np.ndarray]:
    """The slots of the design's null block (its padding convention's page 0 where that is one), else None."""
    return np.arange(page, dtype=np.int64) if design.padding.null_block else None


def draft_pool_sizes(design: Design, alloc: HybridAllocator, scenario: Scenario) -> tuple[int, int]:
    cfg = scenario.engine.speculative.draft_pool(scenario.pool)
    try:
        full_size, swa_size = design.size_draft_pools(alloc.full_size, alloc.swa_size, cfg.full_size, cfg.swa_size)
        full_size, swa_size = int(full_size), int(swa_size)
    except Exception as e:
        raise DesignError(f"design {design.name}: size_draft_pools raised or returned no (int, int): "
                          f"{type(e).__name__}: {e}") from e
    if full_size < 0 or swa_size < 0:
        raise DesignError(f"design {design.name}: size_draft_pools returned a negative pool size ({full_size}, "
                          f"{swa_size}) for target pools ({alloc.full_size}, {alloc.swa_size})")
    return full_size, swa_size


def build_draft_side(scenario: Scenario, design: Design, alloc: HybridAllocator,
                     make_pool: Callable[[int, int, Optional[int]], PoolWriter],
                     make_draft_pool: Optional[DraftPoolFactory], skip_index: Optional[int],
                     owner_of, reserved: np.ndarray, device: torch.device, swa_pad: int,
                     backends: Optional[BackendSource] = None) -> ModelSide:
    target = scenario.model
    draft = draft_model(target, scenario)
    full_size, swa_size = draft_pool_sizes(design, alloc, scenario)
    page = alloc.page_size
    full_rows, swa_rows = full_size + page, swa_size + page
    if make_draft_pool is not None:
        new_pool = partial(make_draft_pool, draft, full_rows, swa_rows, skip_index)
        pool_layers = {k: draft.count(k) for k in ("full", "swa")}
    else:
        # without a model-aware factory the draft's pool is laid out like the target's (lazily mapped
        # zero pages on the CPU); the draft's layers are the first of each kind
        for kind in ("full", "swa"):
            if draft.count(kind) > target.count(kind):
                raise ScenarioError(
                    f"{scenario.source}: engine.speculative.draft_layers: the draft has {draft.count(kind)} {kind} "
                    f"layer(s), more than the target's {target.count(kind)} (the draft's pools reuse the "
                    f"target's layout)")
        new_pool = partial(make_pool, full_rows, swa_rows, skip_index)
        pool_layers = {k: target.count(k) for k in ("full", "swa")}
    # the oracle covers every index the target's allocator hands out, even past a too-small draft pool
    reference = ReferencePool(max(full_rows, alloc.full_rows), max(swa_rows, alloc.swa_rows), device)
    checker = Checker(reference, owner_of, reserved, pool_layers=pool_layers,
                      reserved_words=design.padding.reserved_words, null_block=null_block(design, page))
    return ModelSide(layers=draft_layers(target, draft),
                     boundaries=side_boundaries(scenario, design, "draft", device, page, swa_pad, backends),
                     pools=backend_pools(scenario.backends, new_pool),
                     reference=reference, checker=checker, new_pool=new_pool)
