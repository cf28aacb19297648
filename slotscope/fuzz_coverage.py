"""What a fuzzed run reached: the features that make a scenario interesting to ``slotscope fuzz``.

A feature is a combination (forward mode x graph runner x backend group, DP / graph padding, SWA eviction,
pools taken to their last page with the draft's geometry, prefix hits, the id range reached, the knobs that
shape the write path; under the overlap scheduler where each kind of scheduler write landed in which kind of
forward; DP-padded eager extends narrowed per layer under attn-TP alignment; the paths of issue 29 point 7
reached together, :data:`COMBOS`); a scenario that reaches one not seen before joins the pool the search
mutates.
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
                 "tombstones" if radix.get("tombstones") else "-", "evicted" if radix.get("evicted_leaves") else "-",
                 knobs[0]))
    out |= _landings(steps)
    out |= {("dp-eager", s.mode, "attn_tp>1" if e.attn_tp_size > 1 else "attn_tp=1") for s in steps
            if s.graph == "eager" and s.mode in ("extend", "mixed") and s.dp_padded_tokens > s.real_tokens}
    out |= {("combo", name) for name in combos(sc, steps, radix)}
    return out


#: the paths of issue 29 point 7 (the coverage scenarios scenarios/cover-*.toml), each as a feature when a run
#: reaches it: its knobs together and the steps that make it
COMBOS = ("overlap-mixed-dp-pcg-paged", "overlap-retract-landing", "dp-attn-tp-eager", "radix-paged",
          "unified-dp-pcg-mixed")


def combos(sc: Scenario, steps, radix: Optional[dict]) -> set[str]:
    """Which of :data:`COMBOS` a run reached: the overlap scheduler landing a write in a DP-padded piecewise MIXED
    forward on a paged pool; a retraction's mapping clear landing inside a forward; a DP-padded eager extend or
    MIXED batch under attn_tp_size > 1; the radix cache's prefix hits on a paged pool; a DP-padded piecewise
    MIXED forward on the unified pool."""
    e, out = sc.engine, set()
    padded = [s for s in steps if s.dp_padded_tokens > s.real_tokens]
    if e.overlap and sc.pool.page_size > 1 and any(
            s.mode == "mixed" and s.graph == "piecewise" and s.timeline and s.timeline.get("writes")
            for s in padded):
        out.add(COMBOS[0])
    if any(w[0] == "retract" and w[2] != "forward_end" for s in steps if s.timeline
           for w in s.timeline.get("writes", ())):
        out.add(COMBOS[1])
    if e.attn_tp_size > 1 and any(s.graph == "eager" and s.mode in ("extend", "mixed") for s in padded):
        out.add(COMBOS[2])
    if radix and radix.get("hit_tokens") and sc.pool.page_size > 1:
        out.add(COMBOS[3])
    if sc.pool.unified and any(s.mode == "mixed" and s.graph == "piecewise" for s in padded):
        out.add(COMBOS[4])
    return out


def _landings(steps) -> set[tuple]:
    """Under the overlap scheduler: each kind of scheduler write x the kind of forward it raced x where it landed
    (before metadata init, after it and before the layers, between layers, at the end)."""
    out = set()
    for s in steps:
        for w in (s.timeline or {}).get("writes", ()):
            point = w[2]
            where = ("before-metadata" if point == "metadata_init" else "after-metadata" if point in
                     ("in_graph_metadata", "read_done") else "end" if point == "forward_end" else "between-layers")
            out.add(("landing", w[0], s.mode, s.graph, where))
    return out


def _draft_geometry(sc: Scenario) -> str:
    """The draft model's layer kinds and whether its pools are configured smaller than the target's."""
    spec = sc.engine.speculative
    if not spec.enabled:
        return "-"
    own = spec.draft_pool(sc.pool)
    smaller = own.full_size < sc.pool.full_size or own.swa_size < sc.pool.swa_size
    return "draft:" + "+".join(sorted(set(spec.draft_layers))) + (":smaller" if smaller else "")
