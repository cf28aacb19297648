"""What the GPU step runner plans per backend before any write: its metadata (or a twin's), read table, per-kind write locations, and the facts of its boundary it asks every step."""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import torch

from simulator.core.writes import prepare_write_at
from simulator.designs.base import declared
from simulator.designs.types import ReadIds, ReadTable
from simulator.engine_model.release_model import release_of
from simulator.memory.pool import KVLengthMismatch, check_lengths
from simulator.oracle.checker import LayerWrite
from simulator.records import STATIC_GRAPHS
from simulator.scheduling.batch import BatchTruth


@dataclasses.dataclass(slots=True, eq=False)
class BackendPlan:
    """One backend's forward of a step between its metadata init (phase 1) and its findings (phase 3)."""

    name: str
    boundary: object
    meta: object = None
    failure: Optional[tuple] = None             # (HookFailure, boundary): a per-forward hook failed
    reads: object = None                        # run.ReadCheck, or None
    per_kind: Optional[dict] = None             # kind -> (KVWriteLoc, target, length-check error)
    lead: Optional["BackendPlan"] = None              # the first backend of its group (itself when it writes)
    writes: Optional[list] = None               # the executor's LayerWrite log (the group's first backend)
    calls: list = dataclasses.field(default_factory=list)   # its boundary observations (the executor's)
    in_graph: bool = False                      # its verdict was added by a decode graph's replay
    n_writes: int = -1                          # its writes that count (-1: not counted yet)
    call_kinds: object = False                  # _call_kinds of its observations (False: not made yet)
    same_kinds: Optional[dict] = None           # id(per_kind) -> whether a follower's observations are its own
    tails: Optional[list] = None                # its observations but their step and backend (made when asked)
    twin: Optional["BackendPlan"] = None              # meta not made yet: it is this earlier backend's but the context
    table: object = None                        # its read table (None: no read check this step)
    base_reads: bool = False                    # its design keeps the base read_ids


@dataclasses.dataclass(slots=True, eq=False, frozen=True)
class BoundaryFacts:
    """A backend boundary's host copy (its own static buffers) and what the runner asks of it at every step."""

    boundary: object                            # the run's boundary (the key's owner)
    host: object                                # its host copy
    twin_key: Optional[tuple]                   # :func:`twin_key`
    base_reads: bool                            # :func:`base_read_ids` of its design
    slices: bool                                # its spec's slices_swa_loc
    layer_free: bool                            # its design's make_write_loc is layer-free
    window_graphs: frozenset                    # its spec's (a twin's step key holds whether the step's is in it)


class _Rows:
    """Stand-in for K/V rows in the store's length check (only their count matters there)."""

    __slots__ = ("shape",)

    def __init__(self, n: int):
        self.shape = (n,)


def plan_by_kind(boundary, meta, layers) -> Optional[dict]:
    """A layer-free ``make_write_loc`` asked at the first layer of each kind: per kind (write location,
    target, the store's length-check error). None where it failed (the executor then builds every layer's
    failure itself: this backend's writes are its own)."""
    rows = _Rows(meta.rows)
    per_kind: dict[str, tuple] = {}
    for layer in layers:
        if layer.kind in per_kind:
            continue
        w = prepare_write_at(boundary, meta, layer)
        if isinstance(w, LayerWrite):
            return None
        wl, target = w
        try:
            check_lengths(target, rows, rows)
            err = None
        except KVLengthMismatch as e:
            err = str(e)
        per_kind[layer.kind] = (wl, target, err)
    return per_kind


def base_read_table(rq, seq_lens: torch.Tensor, window: int, full_to_swa: np.ndarray) -> ReadTable:
    """What the base ``Design.read_ids`` returns (the same values and dtypes), from the requests' slots:
    row i of ``req_to_token`` is request i's full slots up to its seq_len, so full layers read
    ``slots.full[:seq_len]`` and SWA layers ``full_to_swa[slots.full[start:seq_len]]`` with
    ``start = max(0, seq_len - extend_len + 1 - window)``."""
    seq = rq.seq_lens.astype(np.int64, copy=False)
    start = np.maximum(seq - rq.extend_lens + 1 - window, 0).astype(np.int64, copy=False)
    slots = [s.full for s in rq.slots]
    spans = list(zip(slots, start.tolist(), seq.tolist()))

    def ids(lo: bool) -> tuple[torch.Tensor, np.ndarray]:
        lens = np.maximum(seq - start, 0) if lo else seq
        indptr = np.zeros(seq.shape[0] + 1, dtype=np.int64)
        np.cumsum(lens, out=indptr[1:])
        parts = [f[a:b] if lo else f[:b] for f, a, b in spans]
        flat = np.concatenate(parts).astype(np.int64, copy=False) if parts else np.zeros(0, dtype=np.int64)
        return torch.from_numpy(indptr), flat

    full_ptr, full_ids = ids(False)
    swa_ptr, swa_ids = ids(True)
    return ReadTable(full=ReadIds(full_ptr, torch.from_numpy(full_ids), torch.zeros_like(seq_lens)),
                     swa=ReadIds(swa_ptr, torch.from_numpy(full_to_swa[swa_ids]), torch.from_numpy(start)))


#: the hooks metadata init calls; declared ``pure`` (simulator.designs.base.declare), they read only their tensors
#: and the forward's context (never the backend, its spec or any state): results equal for equal inputs
METADATA_HOOKS = ("translate", "fill_graph_loc_buffer", "fill_graph_swa_buffer")


def base_read_ids(boundary) -> bool:
    """Whether a boundary's read table is the base formula (``Boundary.base_reads``: its design's ``read_ids``
    declared ``base_reads``), which the runner builds from the requests' slots, incrementally:
    cuda_path/read_cache.py. The release's own tables (engine_path.forward) are not."""
    return boundary.base_reads()


def twin_key(boundary) -> Optional[tuple]:
    """What a host boundary's metadata init depends on where its design's metadata hooks are declared ``pure``
    (:data:`METADATA_HOOKS`) and its ``make_write_loc`` ``layer_free`` (so no instance state is read): the
    design's class, its static SWA buffers' dtype and release (each backend has its own instance), the
    run's engine, the boundary's settings and its spec but for its name (its ``draft_step_swa`` included: which
    ids a draft step translates; and ``slices_swa_loc``, which only the
    write location reads, and ``window_graphs``, which metadata init reads only as whether the step's graph is
    in it: :meth:`GpuStepRunner._plans` adds that). Equal keys: equal metadata for equal inputs, static buffers
    included (the base fills rewrite them whole up to the padded length, so no earlier replay shows through, nor
    a step a backend took a twin's metadata and left its own buffers as they were). None: its own."""
    d = boundary.design
    if not boundary.layer_free_write_loc() or not all(declared(getattr(d, h), "pure") for h in METADATA_HOOKS):
        return None
    sp = boundary.spec
    return (type(d), d.graph_swa_dtype, id(release_of(d)), id(boundary.engine), boundary.side, boundary.page_size,
            boundary.swa_pad, boundary.window, boundary.max_rows, boundary.padding, sp.static_buffers,
            sp.draft_step_swa)


def padded_expected(batch, truth: BatchTruth) -> Optional[np.ndarray]:
    """Under a graph runner (the step's tags fit its capture size n): the step's full slots then its SWA slots,
    each padded to n with -1 (which no check reads), int64 ``[2n]``; else None."""
    n = batch.padded_len
    if batch.graph not in STATIC_GRAPHS or truth.tags.size > n:
        return None
    out = np.full(2 * n, -1, dtype=np.int64)
    out[:truth.full_slots.shape[0]] = truth.full_slots
    out[n:n + truth.swa_slots.shape[0]] = truth.swa_slots
    return out


def target_key(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), t.shape[0], t.stride(0), t.dtype)


def write_signatures(plans: list["BackendPlan"]) -> tuple[list[tuple], int]:
    """Per backend what decides its writes' effect: per kind the target by value and the length check's
    error (targets of one dtype and length that are distinct tensors are compared on the host after
    one copy of all of them: the step's first synchronisation, none where no two can be equal), or a
    signature of its own (a failed hook, a design whose write location depends on the layer); and the host
    synchronisations that took (0 or 1)."""
    tensors: dict[tuple, torch.Tensor] = {}
    synced = 0
    kinds = {id(p.per_kind): p.per_kind for p in plans if p.per_kind is not None}   # (twins share one)
    entries: dict[int, list] = {}        # id(per_kind) -> per kind (kind, its target's key or None, error)
    for i, per_kind in kinds.items():
        mine = entries[i] = []
        for kind, (_, target, err) in per_kind.items():
            key = None
            if err is None:
                key = target_key(target)
                tensors.setdefault(key, target)
            mine.append((kind, key, err))
    buckets: dict[tuple, list] = {}
    for key, t in tensors.items():
        buckets.setdefault((t.dtype, t.shape[0]), []).append(key)
    ids = {key: ("tensor", key) for key in tensors}
    need = [key for keys in buckets.values() if len(keys) > 1 for key in keys]
    if need:
        seen: dict[tuple, int] = {}
        if all(tensors[k].device.type == "cpu" for k in need):     # (host metadata: compared in numpy)
            for k in need:       # (within a dtype equal values are equal bytes)
                t = tensors[k]
                ids[k] = ("value", seen.setdefault((t.dtype, t.numpy().tobytes()), len(seen)))
        else:
            both = torch.cat([tensors[k].reshape(-1).to(torch.int64) for k in need])
            synced = 1                                            # (a host synchronisation)
            host = both.cpu().numpy()
            off = 0
            for k in need:
                n = tensors[k].shape[0]
                ids[k] = ("value", seen.setdefault((tensors[k].dtype, host[off:off + n].tobytes()), len(seen)))
                off += n
    sig = {i: ("by_kind",) + tuple((kind, None if err else ids[key], err) for kind, key, err in mine)
           for i, mine in entries.items()}
    return [("own", p.name) if p.failure is not None or p.per_kind is None else sig[id(p.per_kind)]
            for p in plans], synced
