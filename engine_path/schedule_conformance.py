"""The scheduler's conformance: the model's decisions against the release's own, forward by forward.

``slotscope conform --scheduler`` runs one scenario's workload twice: through the model's scheduler (the model
design's release behaviour over the modelled allocator: :func:`model_schedule`, any process) and through the
release's own ``Scheduler`` (engine_path.scheduler: its policy, batches, allocation, tree cache and event loop, in a
process of the release's own). Each side's forwards are :class:`~engine_path.scheduler.Decision` records; the
comparison (:func:`compare_schedules`) names the first forward whose mode, requests, token counts, write slots
(the allocation) or free-slot counts (frees and evictions) differ.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Optional

import numpy as np

from .scheduler import Decision, unsupported
from .errors import EngineError

#: a Decision's compared fields (all but its index), in the order a difference is named
FIELDS = tuple(f.name for f in fields(Decision) if f.name not in ("step", "tree"))


def model_schedule(path: str, options: Optional[dict] = None) -> dict:
    """The model scheduler's decisions for a scenario file (``design``: the model design's name; its release
    decides the behaviour; ``max_steps``)."""
    from simulator.designs.loading import design_padding, load_design
    from simulator.run import make_scheduler, model_allocator, run_padding
    from simulator.scenario import load_scenario

    o = dict(options or {})
    sc = load_scenario(path)
    why = unsupported(sc)
    if why:
        raise EngineError(f"the release's scheduler: {why}")
    design = load_design(o["design"])
    alloc = model_allocator(sc, design.release)
    pad = run_padding(design_padding(design), alloc)
    sched = make_scheduler(sc, alloc, design.release, np.random.default_rng(sc.seed), pad.pad_value,
                           pad.convention.dummy_request)
    out: list[dict] = []
    limit = o.get("max_steps")
    uid: dict[int, int] = {}        # the model's request ids (admission order) to the workload's uids
    for batch, _truth in sched.steps():
        if limit is not None and len(out) >= limit:
            break
        rq = batch.requests
        uid.update((r.rid, r.spec.uid) for r in sched.running)
        real = batch.num_token_non_padded
        out.append(Decision(
            step=len(out), mode=batch.mode, rids=tuple(uid[int(r)] for r in rq.rids),
            extend_lens=tuple(int(x) for x in rq.extend_lens), seq_lens=tuple(int(x) for x in rq.seq_lens),
            out_cache_loc=tuple(int(x) for x in batch.out_cache_loc[:real]), full_free=int(alloc.full_free),
            swa_free=int(alloc.swa_free), tree=_tree_state(sched)).to_json())
    return {"info": {"scenario": sc.name, "scheduler": type(sched).__name__, "design": design.name,
                     "release": design.release.name}, "steps": out}


def _tree_state(sched) -> tuple:
    """The model's tree as a Decision counts it: Full tokens in unlocked / locked nodes, live SWA tokens in
    unlocked / locked nodes (0s without the radix cache)."""
    cache = getattr(sched, "cache", None)
    if cache is None:
        return (0, 0, 0, 0)
    (full_free, swa_free), (full, swa) = cache.evictable(), cache.held()
    return (full_free, full - full_free, swa_free, swa - swa_free)


def compare_schedules(model: list[dict], engine: list[dict]) -> dict:
    """The first forward where the two sides' decisions differ (None where every forward agrees), the field and
    both values, and each side's forward count; apart from it, the first forward where the trees differ
    (``first_tree_difference``: a Decision's ``tree``, Full and SWA tokens evictable and locked)."""
    first = tree = None
    for m, e in zip(model, engine):
        field = next((f for f in FIELDS if _norm(m[f]) != _norm(e[f])), None)
        if field is not None and first is None:
            first = {"step": m["step"], "field": field, "model": m[field], "engine": e[field],
                     "model_forward": {f: m[f] for f in FIELDS if f != "out_cache_loc"},
                     "engine_forward": {f: e[f] for f in FIELDS if f != "out_cache_loc"}}
        if tree is None and _norm(m.get("tree")) != _norm(e.get("tree")):
            tree = {"step": m["step"], "model": m.get("tree"), "engine": e.get("tree")}
        if first is not None and tree is not None:
            break
    if first is None and len(model) != len(engine):
        n = min(len(model), len(engine))
        first = {"step": n, "field": "forwards", "model": len(model), "engine": len(engine)}
    return {"conforms": first is None and tree is None, "first_difference": first, "first_tree_difference": tree,
            "forwards": {"model": len(model), "engine": len(engine)}}


def _norm(v):
    return list(v) if isinstance(v, (list, tuple)) else v
