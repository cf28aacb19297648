"""One backend forward's writes, layer by layer: what a layer executor is given, and the steps every executor shares (a layer's write location and target, its K/V rows, its observed and length-checked store)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

import torch

from simulator.core.boundary import BackendBoundary, ForwardMetadata
from simulator.core.observe import RunObserver
from simulator.designs.checks import HookFailure
from simulator.designs.types import KVWriteLoc
from simulator.memory.pool import KVLengthMismatch, PoolWriter
from simulator.oracle.checker import LayerWrite
from simulator.oracle.kvrows import pad_tags
from simulator.records import LayerInfo
from simulator.scheduling.batch import ForwardBatch

DTYPE_NAMES = {torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.uint8: "uint8"}


def dtype_name(dt: torch.dtype) -> str:
    return DTYPE_NAMES.get(dt, str(dt).replace("torch.", ""))


@dataclass(slots=True)
class BackendStep:
    """Everything one backend needs to run one step's layers."""

    batch: ForwardBatch
    backend: str
    boundary: BackendBoundary
    pool: PoolWriter
    meta: ForwardMetadata
    layers: tuple[LayerInfo, ...]
    tags: torch.Tensor                 # real tokens' tags, on the device
    observer: RunObserver
    now: Callable[[], int]
    rows_cache: dict = field(default_factory=dict)   # per kind: (k, v) rows shared by backends in a step
    #: called with each layer before its write location is built (the read check, an overlap timeline's
    #: scheduler writes); None: nothing to do. An executor that cannot call it per layer (a graph replay)
    #: may skip it: the run then checks reads after the layers.
    before_layer: Optional[Callable[[LayerInfo], None]] = None
    #: scheduler writes land between this forward's layers (an overlap timeline): an executor must run
    #: the layers one by one, calling ``before_layer``; a graph replay cannot interleave them
    interleaved: bool = False
    #: --inject: a layer's store through the fault injector, ``(s, layer, wl, target, k, v) -> LayerWrite``
    write_fault: Optional[Callable] = None


class LayerExecutor(Protocol):
    def run(self, s: BackendStep) -> list[LayerWrite]: ...


def write_target(wl: KVWriteLoc, layer: LayerInfo) -> torch.Tensor:
    """The hybrid pool's routing: full layers write at loc, SWA layers at swa_loc (checked present)."""
    return wl.loc if layer.kind == "full" else wl.swa_loc


def prepare_write(s: BackendStep, layer: LayerInfo) -> tuple[KVWriteLoc, torch.Tensor] | LayerWrite:
    """A layer's write location and store target, or the failed write when the design's hook failed."""
    return prepare_write_at(s.boundary, s.meta, layer)


def prepare_write_at(boundary: BackendBoundary, meta: ForwardMetadata,
                     layer: LayerInfo) -> tuple[KVWriteLoc, torch.Tensor] | LayerWrite:
    try:
        wl = boundary.write_loc(meta, layer.layer, layer.kind)
    except HookFailure as f:
        text = f.describe(boundary.design.name, meta.ctx, layer.layer)
        return LayerWrite(layer.layer, layer.kind, layer.index, None, text, "design_error")
    return wl, write_target(wl, layer)


def rows_for(s: BackendStep, layer: LayerInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """K/V rows for a layer: made once per step and kind, re-stamped per layer."""
    kv = s.rows_cache.get(layer.kind)
    if kv is None or kv[0].shape[0] != s.meta.rows:
        kv = s.pool.make_rows(pad_tags(s.tags, s.meta.rows), layer.layer, layer.kind)
        s.rows_cache[layer.kind] = kv
    else:
        s.pool.restamp(kv[0], kv[1], layer.layer)
    return kv


def loc_shapes(wl: KVWriteLoc) -> tuple[int, int, str, str]:
    """What a boundary observation records of a write location: (loc_len, swa_len, loc_dtype, swa_dtype)."""
    swa = wl.swa_loc
    return (int(wl.loc.shape[0]), -1 if swa is None else int(swa.shape[0]), dtype_name(wl.loc.dtype),
            "" if swa is None else dtype_name(swa.dtype))


def observe(s: BackendStep, layer: LayerInfo, wl: KVWriteLoc, t0: int, t1: int, err) -> None:
    s.observer.on_boundary(s.batch.step, s.backend, layer.layer, *loc_shapes(wl), t0, t1, err)


def store_layer(s: BackendStep, layer: LayerInfo, wl: KVWriteLoc, target: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> LayerWrite:
    """One layer's store, timed and observed; a length mismatch is recorded, not raised."""
    t0 = s.now()
    try:
        s.pool.store(layer.kind, layer.index, target, k, v)
        err = None
    except KVLengthMismatch as e:
        err = str(e)
    observe(s, layer, wl, t0, s.now(), err)
    return LayerWrite(layer.layer, layer.kind, layer.index, None if err else target, err)
