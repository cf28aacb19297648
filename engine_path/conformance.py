"""Per-step traces of one scenario for the conformance check (``slotscope conform``).

:func:`trace` runs a scenario's scheduler over one allocator and records, for every forward, what the
write path was given and what the allocator did since the previous forward:

* ``out_cache_loc`` (DP and graph padding included) and the forward's mode / graph;
* per backend: where its SWA ids come from (``plan`` / ``translate``), ``swa_loc``: the SWA ids its
  metadata hands the forward's first layer's write (a graph replay's static buffer included, with its dtype;
  read after ``KVWriteLoc`` on both sides) and the ``loc`` / ``swa_loc`` of the
  write of a full and of an SWA layer;
* the mapping entries ``full_to_swa`` at the full slots that changed, the SWA slots freed by
  out-of-window eviction, and the full / SWA slots freed.

The same function makes both sides of the comparison:

* model (``engine=False``, any process): the design's ``HybridAllocator`` (free order from the design's
  release), the design's translation and ``make_write_loc``;
* engine (``engine=True``, the release's own process: ``engine_path.isolate.call(spec,
  "engine_path.conformance:trace", ...)``): :class:`~engine_path.runtime.EngineRuntime`'s allocator (the
  release's ``SWATokenToKVPoolAllocator`` and its eviction rule), and each backend as the release's own
  (engine_path.forward: its metadata init, graph buffers, narrowing and layer forward up to the pool write).

Both sides run the scenario's own scheduler (``simulator.run.make_scheduler``, the run's choice: the radix
cache's ``SharingScheduler`` over the release's free paths on the engine side; a PD decode node's
``PDDecodeScheduler``, its pre-allocation through the release's ``alloc_extend_swa_tail`` and its finish
through the release's row free (the transfer's slots recorded as ``transfer``); on ``pool.unified`` (any page
size) the unified allocator of each side, each forward bound to physical ids as the run binds it; what the engine
side cannot run is listed by :func:`not_compared`) with the model design's release behaviour (when to evict,
DP padding modes, the draft's columns, eager narrowing: the scheduler's decisions, ours on both sides)
and the same seed, so every difference in the records is the allocator's, the eviction rule's, the
translation's or ``KVWriteLoc``'s. Where the engine is asked (how far an eviction frees, which slots an
allocation returns) the engine decides on its side.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import torch

from simulator.designs.checks import HookFailure

#: the fields of one step's record that are compared, in the order the summary lists them
FIELDS = ("out_cache_loc", "swa_ids", "swa_loc", "write_loc", "write_loc_full", "mapping", "evicted_swa", "freed_full",
          "freed_swa")


def with_page_size(sc, page_size: Optional[int]):
    """The scenario at another page size: pool sizes rounded up to whole pages."""
    if page_size is None or page_size == sc.pool.page_size:
        return sc
    full = -(-sc.pool.full_size // page_size) * page_size
    return dataclasses.replace(sc, pool=dataclasses.replace(sc.pool, full_size=full, page_size=page_size))


def _ints(a) -> list:
    return np.asarray(a, dtype=np.int64).tolist()


#: what the trace cannot run on the engine side, per scheduler kind / pool: (what, reason, what the trace runs);
#: ``own_path`` False: the scenario's own path is not compared at all (conform cannot say it conforms).
#: (engine.pd_decode is compared: the decode node's pre-allocation and finish run through the release.)
_OVERLAP_REASON = ("engine.overlap", True,
                   "where the host's writes land inside forward k (the overlap timeline, simulator/scheduling/timeline.py) is "
                   "the simulator's model on both sides and has no release code to compare with",
                   "the overlap scheduler's decisions (the token past the end, the extra room) and every allocator "
                   "call; each forward's ids are recorded under the mapping at its scheduling")


def not_compared(sc) -> list[dict]:
    """What of ``sc``'s own path the trace does not compare (the ``_*_REASON`` entries above)."""
    items = []
    if sc.engine.overlap:
        items.append(_OVERLAP_REASON)
    return [{"what": w, "own_path": own, "reason": r, "trace_runs": t} for w, own, r, t in items]


def _side(o: dict, sc, model_design, info: dict):
    """(allocator, design) of one side; the engine side's in the release's process. ``pool.unified``: the
    model's unified pool / the release's ``UnifiedSWATokenToKVPoolAllocator``, under the model design on
    both sides (as ``slotscope run --engine`` runs it: the allocator is the release's, the write locations ours)."""
    from simulator.memory.allocator import HybridAllocator
    from simulator.plugins.unified import model_unified_pool

    pc = sc.pool
    unified = pc.unified
    info["unified"] = unified
    if o.get("engine"):
        from .api import load
        from .runtime import EngineRuntime

        api = load()
        info["engine"] = api.info.to_json()
        info["side"] = "engine"
        if unified:
            from .unified import UnifiedEngineAllocator

            return (UnifiedEngineAllocator(sc.model, pc, model_unified_pool(sc, model_design.release.unified_pool)
                                           .budget_bytes), model_design, None)
        # the release's own backends where engine_path/forward drives them (the rest: the model design's
        # boundaries on this side too, each named in info["backends"])
        rt = EngineRuntime(api, model=model_design)
        alloc = rt.allocator_factory(pc)
        return alloc, rt.design, rt.backends(sc)
    info["side"] = "model"
    if unified:
        return model_unified_pool(sc, model_design.release.unified_pool), model_design, None
    return HybridAllocator(pc.full_size, pc.swa_size, pc.page_size), model_design, None


def _pd_summary(sched) -> dict:
    """A PD decode node's counters of one side (compared as ``radix``: transfers, tail / non-tail tokens,
    over-allocated ids kept, stale mappings on free full pages at the end, free events, where it stopped)."""
    out = sched.summary()
    out.pop("ownership", None)
    if "stopped" in out:
        out["stopped"] = {k: v for k, v in out["stopped"].items() if k != "message"}
    return out


def _radix_summary(sched) -> Optional[dict]:
    """The radix cache's counters of one side (compared: prefix hits, tombstones, recoveries, evictions)."""
    if hasattr(sched, "stale_mappings"):
        return _pd_summary(sched)
    if not hasattr(sched, "hit_tokens"):
        return None
    c = sched.counts
    return {"hit_tokens": int(sched.hit_tokens),
            "tombstones": c["free:swa:tombstone"] + c["free:swa:tombstone@flush"],
            "recoveries": c["adopt:swa:recover"] + c["adopt:swa:recover_locked"],
            "evicted_leaves": c["free:full:evict_leaf"], "events": dict(sorted(c.items())),
            # where the side stopped (an over-free's step, class and assert; the message is each side's own words)
            "stopped": None if sched.stopped is None else {k: v for k, v in sched.stopped.items() if k != "message"}}


def trace(path: str, options: Optional[dict] = None) -> dict:
    """The per-step records of ``path`` (see the module docstring). ``options``: ``design`` (model design
    name; its release drives the scheduler on both sides), ``page_size``, ``max_steps``, ``engine`` (bool),
    ``backends`` (list)."""
    from simulator.designs.loading import design_padding, load_design
    from simulator.engine_model.release_model import release_of
    from simulator.run import make_scheduler, run_padding, scheduler_kind
    from simulator.scenario import load_scenario

    o = dict(options or {})
    sc = with_page_size(load_scenario(path), o.get("page_size"))
    if o.get("backends"):
        sc = dataclasses.replace(sc, backends=tuple(o["backends"]))
    model_design = load_design(o["design"])
    release = release_of(model_design)
    pc = sc.pool
    info: dict = {"scenario": sc.name, "page_size": pc.page_size, "full_size": pc.full_size,
                  "swa_size": pc.swa_size, "release": release.name, "not_compared": not_compared(sc)}
    alloc, design, backends = _side(o, sc, model_design, info)
    info["design"] = design.name
    rng = np.random.default_rng(sc.seed)
    pad = run_padding(design_padding(design), alloc)
    # the scenario's own scheduler (the run's choice, simulator.run.make_scheduler) where both sides can run it;
    # the scheduler's decisions are the model design's on both sides
    kind = scheduler_kind(sc)
    sched = make_scheduler(sc, alloc, model_design.release, rng, pad.pad_value, pad.convention.dummy_request,
                           kind=kind)
    info["scheduler"] = type(sched).__name__
    steps, info["stopped"], info["swa_ids"] = _records(sc, design, alloc, sched, pad, o.get("max_steps"), backends)
    if backends is not None:
        info["backends"] = backends.describe()         # whose code made each backend's write locations
    info["radix"] = _radix_summary(sched)
    if o.get("engine"):
        info["engine_calls"] = dict(alloc.calls)
    return {"info": info, "steps": steps}


def _records(sc, design, alloc, sched, pad, max_steps: Optional[int], backends=None) -> tuple[list, Optional[str], dict]:
    """Every forward's record, what stopped the side (if anything did), and each backend's SWA id source.
    ``backends``: the source of the backend boundaries (the release's, engine_path.forward; None: the model's)."""
    from simulator.core.sides import side_boundaries

    pc = sc.pool
    device = torch.device("cpu")
    bounds = side_boundaries(sc, design, "target", device, pc.page_size, pad.swa_pad, backends)
    for b in bounds.values():
        b.window = sc.model.window
    swa_layer = next((li for li in sc.model.layers() if li.kind == "swa"), None)
    full_layer = next((li for li in sc.model.layers() if li.kind == "full"), None)
    first_kind = next(iter(sc.model.layers())).kind
    mapping = None if getattr(alloc, "translate_kv_loc", None) is not None else torch.from_numpy(alloc.full_to_swa)
    swa_ids = {name: b.spec.swa_ids for name, b in bounds.items()}
    steps: list = []
    stopped = None
    unified = _UnifiedBind(alloc) if getattr(alloc, "translate_kv_loc", None) is not None else None
    try:
        for n, (batch, truth) in enumerate(sched.steps()):
            if max_steps is not None and n >= max_steps:
                break
            changed = np.unique(truth.mapping_changed)
            rec = {"step": int(batch.step), "mode": batch.mode, "graph": batch.graph,
                   "out_cache_loc": _ints(batch.out_cache_loc),
                   "mapping": None if unified else [_ints(changed), _ints(alloc.full_to_swa[changed])],
                   "evicted_swa": _ints(truth.evicted_swa), "freed_full": _ints(truth.freed_full),
                   "freed_swa": _ints(truth.freed_swa), "swa_loc": {}, "write_loc": {}, "write_loc_full": {}}
            if truth.transferred is not None:    # a PD decode node's KV transfer: the slots that received it
                tr = truth.transferred
                rec["transfer"] = [_ints(tr.full_slots), _ints(tr.swa_slots)]
            if unified is not None:
                batch, mapping = unified.bind(batch, rec)
            loc = torch.from_numpy(batch.out_cache_loc)
            for name, b in bounds.items():
                try:
                    meta = b.init_metadata(batch, loc, mapping)
                    writes = {field: b.write_loc(meta, li.layer, li.kind)
                              for field, li in (("write_loc_full", full_layer), ("write_loc", swa_layer))
                              if li is not None}
                except HookFailure as e:     # this backend's forward failed (a finding in a run): its value here
                    for field in ("swa_loc", "write_loc", "write_loc_full"):
                        rec[field][name] = ["raised", str(e)]
                    continue
                for field, wl in writes.items():
                    rec[field][name] = [_ints(wl.loc), None if wl.swa_loc is None else _ints(wl.swa_loc)]
                # swa_loc: the SWA ids the first layer's write carries (its loc where it carries none), read after
                # KVWriteLoc on both sides, as the release's metadata holds them (a longer plan cut by
                # __post_init__ is a difference no write shows); the first layer is the first of its kind
                first = writes["write_loc_full" if first_kind == "full" else "write_loc"]
                ids = first.swa_loc if first.swa_loc is not None else first.loc
                rec["swa_loc"][name] = [str(ids.dtype).replace("torch.", ""), _ints(ids)]
            steps.append(rec)
    except Exception as e:  # what stopped a side is part of its record (compared like a value)
        stopped = f"{type(e).__name__}: {e}"
    return steps, stopped, swa_ids


class _UnifiedBind:
    """``pool.unified``: each forward bound as the run's :class:`~simulator.plugins.unified.UnifiedPlan` binds it (the
    boundary flush, the in-flight window pinned, ``out_cache_loc`` to physical full ids, the physical mapping),
    recording what the allocator did since the previous forward in physical ids, sorted per step (the model
    emits events per call, the release's adapter per page-table diff: their order within a step is not its)."""

    def __init__(self, alloc):
        self.alloc = alloc

    def bind(self, batch, rec: dict):
        a = self.alloc
        a.flush_opportunistic()
        got: dict = {"freed_full": [], "freed_swa": [], "evicted_swa": [], "moves": []}
        for e in a.drain_events():
            if e.kind == "move":
                got["moves"] += [[e.pool, int(x), int(y)] for x, y in zip(e.slots.tolist(), e.peers.tolist())]
            elif e.kind in ("unbind", "tombstone"):
                got[f"freed_{e.pool}"] += e.slots.tolist()
                if e.kind == "tombstone":
                    got["evicted_swa"] += e.slots.tolist()
        virtual = batch.out_cache_loc
        a.set_inflight_forward(virtual[: batch.num_token_non_padded])
        loc = a.translate_kv_loc(virtual, "full")
        phys = a.physical_full_to_swa()
        at = np.unique(loc)
        rec.update({k: sorted(v) for k, v in got.items()})
        rec["physical_loc"] = [_ints(loc), _ints(a.translate_kv_loc(virtual, "swa"))]
        rec["mapping"] = [_ints(at), _ints(phys[at])]
        return dataclasses.replace(batch, out_cache_loc=loc), torch.from_numpy(phys)


def trace_many(jobs: list) -> list:
    """:func:`trace` of several ``[path, options]`` jobs in one process (one import of the release)."""
    return [trace(path, opts) for path, opts in jobs]
