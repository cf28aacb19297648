"""What a fuzzed run reached: the features that make a scenario interesting to ``slotscope fuzz``.

A feature is a combination (forward mode x graph runner x backend group, DP / graph padding, SWA eviction,
pools taken to their last page with the draft's geometry, prefix hits, the id range reached, the knobs that
shape the write path); a scenario that reaches one not seen before joins the pool the search mutates.
"""
from __future__ import annotations

from typing import Optional

from simulator.scenario import Scenario

#: backend groups: how each backend builds swa_loc (simulator/engine_model/backends.py's specs)
BACKEND_GROUP = {"flashinfer": "plan", "triton": "plan-noDE", "flashattention": "plan", "trtllm_mha": "plan-slices",
                 "aiter": "translate", "xpu": "translate", "torch_native": "translate", "musa": "plan"}


def features(sc: Scenario, steps, radix: Optional[dict]) -> set[tuple]:
    """What a run reached: combinations of the steps' modes and graph runners with the backend groups, the
    padding, eviction, sharing and the id range, and the knobs that shape the write path."""
    e = sc.engine
    groups = sorted({BACKEND_GROUP.get(b, b) for b in sc.backends})
    knobs = ("unified" if sc.pool.unified else "page>1" if sc.pool.page_size > 1 else "page1", "spec" if e.speculative.enabled else "-",
             f"overlap:{e.war_barrier}:{e.platform}" if e.overlap else "-", "noshrink" if not e.piecewise_shrink else "-",
             "retract" if e.reserve == "none" else "-", "radix" if e.radix_cache else "pd" if e.pd_decode else "-")
    out: set[tuple] = {("knobs",) + knobs}
    top, full_last, swa_last = 0, False, False
    for s in steps:
        pad = ("dp" if s.dp_padded_tokens > s.real_tokens else "") + ("graph" if s.padded_tokens > s.dp_padded_tokens else "")
        evict = "evicted" if s.swa_used < s.full_used else "-"
        for g in groups:
            out.add(("path", s.mode, s.graph, g, pad or "-"))
        out.add(("mode-knobs", s.mode, s.graph) + knobs)
        out.add(("pad-knobs", s.mode, s.graph, pad or "-", knobs[0]))
        out.add(("evict", s.mode, evict, knobs[0]))
        top = max(top, s.full_used)
        full_last, swa_last = full_last or s.full_used >= s.full_size, swa_last or s.swa_used >= s.swa_size
    out.add(("fill", "full-last-page" if full_last else "-", "swa-last-page" if swa_last else "-", knobs[0],
             _draft_geometry(sc)))
    out.add(("ids", "past-65535" if top > 65535 else "past-32767" if top > 32767 else f"2^{max(top, 1).bit_length()}"))
    if radix:
        out.add(("sharing", "hits" if radix.get("hit_tokens") else "no-hits",
                 "tombstones" if radix.get("tombstones") else "-", "evicted" if radix.get("evicted_leaves") else "-"))
    return out


def _draft_geometry(sc: Scenario) -> str:
    """The draft model's layer kinds and whether its pools are configured smaller than the target's."""
    spec = sc.engine.speculative
    if not spec.enabled:
        return "-"
    own = spec.draft_pool(sc.pool)
    smaller = own.full_size < sc.pool.full_size or own.swa_size < sc.pool.swa_size
    return "draft:" + "+".join(sorted(set(spec.draft_layers))) + (":smaller" if smaller else "")
