"""Per-step traces of one scenario for the conformance check (``slotscope conform``).

:func:`trace` runs a scenario's scheduler over one allocator and records, for every forward, what the
write path was given and what the allocator did since the previous forward:

* ``out_cache_loc`` (DP and graph padding included) and the forward's mode / graph;
* per backend: where its SWA ids come from (``plan`` / ``translate``), ``swa_loc`` as its metadata
  holds it (a graph replay's static buffer included, with its dtype) and the ``loc`` / ``swa_loc`` of
  the ``KVWriteLoc`` an SWA layer gets;
* the mapping entries ``full_to_swa`` at the full slots that changed, the SWA slots freed by
  out-of-window eviction, and the full / SWA slots freed.

The same function makes both sides of the comparison:

* model (``engine=False``, any process): the design's ``HybridAllocator`` (free order from the design's
  release), the design's translation and ``make_write_loc``;
* engine (``engine=True``, the release's own process: ``engine_path.isolate.call(spec,
  "engine_path.conformance:trace", ...)``): :class:`~engine_path.runtime.EngineRuntime`'s allocator (the
  release's ``SWATokenToKVPoolAllocator`` and its eviction rule), the release's translation per backend
  (plan write ids or ``translate_loc_from_full_to_swa``) and its ``KVWriteLoc``.

Both sides run the simulator's scheduler with the model design's release behaviour (when to evict,
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

#: the fields of one step's record that are compared, in the order the summary lists them
FIELDS = ("out_cache_loc", "swa_ids", "swa_loc", "write_loc", "mapping", "evicted_swa", "freed_full", "freed_swa")


def with_page_size(sc, page_size: Optional[int]):
    """The scenario at another page size: pool sizes rounded up to whole pages."""
    if page_size is None or page_size == sc.pool.page_size:
        return sc
    full = -(-sc.pool.full_size // page_size) * page_size
    return dataclasses.replace(sc, pool=dataclasses.replace(sc.pool, full_size=full, page_size=page_size))


def _ints(a) -> list:
    return np.asarray(a, dtype=np.int64).tolist()


def trace(path: str, options: Optional[dict] = None) -> dict:
    """The per-step records of ``path`` (see the module docstring). ``options``: ``design`` (model design
    name; its release drives the scheduler on both sides), ``page_size``, ``max_steps``, ``engine`` (bool),
    ``backends`` (list)."""
    from simulator.allocator import HybridAllocator
    from simulator.designs import design_padding, load_design
    from simulator.release_model import release_of
    from simulator.run import run_padding
    from simulator.scenario import load_scenario
    from simulator.scheduler import Scheduler
    from simulator.speculative import side_boundaries
    from simulator.workload import make_requests

    o = dict(options or {})
    sc = with_page_size(load_scenario(path), o.get("page_size"))
    if o.get("backends"):
        sc = dataclasses.replace(sc, backends=tuple(o["backends"]))
    model_design = load_design(o["design"])
    release = release_of(model_design)
    pc = sc.pool
    info: dict = {"scenario": sc.name, "page_size": pc.page_size, "full_size": pc.full_size,
                  "swa_size": pc.swa_size, "release": release.name}
    if o.get("engine"):
        from .api import load
        from .runtime import EngineRuntime

        api = load()
        # the parts that stay ours (backend metadata beyond the SWA ids, the boundary's eager narrowing)
        # come from the model design on this side too
        rt = EngineRuntime(api, model=model_design)
        alloc = rt.allocator_factory(pc)
        design = rt.design
        info["engine"] = api.info.to_json()
        info["side"] = "engine"
    else:
        alloc = HybridAllocator(pc.full_size, pc.swa_size, pc.page_size)
        design = model_design
        info["side"] = "model"
    info["design"] = design.name
    rng = np.random.default_rng(sc.seed)
    pad = run_padding(design_padding(design), alloc)
    sched = Scheduler(sc, alloc, make_requests(sc.workload, rng), rng, pad_value=pad.pad_value,
                      pad_to_capture=pad.convention.dummy_request, release=release)
    device = torch.device("cpu")
    bounds = side_boundaries(sc, design, "target", device, pc.page_size, pad.swa_pad)
    for b in bounds.values():
        b.window = sc.model.window
    swa_layer = next((li for li in sc.model.layers() if li.kind == "swa"), None)
    mapping = torch.from_numpy(alloc.full_to_swa)
    info["swa_ids"] = {name: b.spec.swa_ids for name, b in bounds.items()}
    steps = []
    max_steps = o.get("max_steps")
    stopped = None
    try:
        for n, (batch, truth) in enumerate(sched.steps()):
            if max_steps is not None and n >= max_steps:
                break
            loc = torch.from_numpy(batch.out_cache_loc)
            changed = np.unique(truth.mapping_changed)
            rec = {"step": int(batch.step), "mode": batch.mode, "graph": batch.graph,
                   "out_cache_loc": _ints(batch.out_cache_loc),
                   "mapping": [_ints(changed), _ints(alloc.full_to_swa[changed])],
                   "evicted_swa": _ints(truth.evicted_swa), "freed_full": _ints(truth.freed_full),
                   "freed_swa": _ints(truth.freed_swa), "swa_loc": {}, "write_loc": {}}
            for name, b in bounds.items():
                meta = b.init_metadata(batch, loc, mapping)
                rec["swa_loc"][name] = [str(meta.swa_loc.dtype).replace("torch.", ""), _ints(meta.swa_loc)]
                if swa_layer is not None:
                    wl = b.write_loc(meta, swa_layer.layer, "swa")
                    rec["write_loc"][name] = [_ints(wl.loc), None if wl.swa_loc is None else _ints(wl.swa_loc)]
            steps.append(rec)
    except Exception as e:  # what stopped a side is part of its record (compared like a value)
        stopped = f"{type(e).__name__}: {e}"
    info["stopped"] = stopped
    if o.get("engine"):
        info["engine_calls"] = dict(alloc.calls)
    return {"info": info, "steps": steps}


def trace_many(jobs: list) -> list:
    """:func:`trace` of several ``[path, options]`` jobs in one process (one import of the release)."""
    return [trace(path, opts) for path, opts in jobs]
