"""Runs with the radix cache on (``engine.radix_cache``, issue 12 point 1): simulator/scheduling/sharing.py's
SharingScheduler over scenarios/sharing-system-prompt.toml, exact counts.

The scenario (seed 8): 24 conversations, 55 requests in all, 2 system prompts, page size 1, a small pool.
Scheduler-only runs (no backends) pin what the cache does; full runs (one backend, read checking on) pin
what the oracle finds under the fixed design; each bug's shipped scenario (scenarios/r2-..., r3-..., r7-...,
r8-...) pins what its buggy design gives and that the fix is clean. The designs are registered
(simulator/designs/radix.py: SGLang 0.5.23 with the cache's switches).
"""
from __future__ import annotations

import numpy as np
import pytest

from simulator.memory.allocator import HybridAllocator
from simulator.designs import load_design
from simulator.engine_model.sharing import FIXED, SGLANG_0_5_23, with_bug
from simulator.engine_model.release_model import release_of
from simulator.scheduling.scheduler import Scheduler
from simulator.scheduling.sharing import SharingScheduler
from simulator.scheduling.workload import make_requests

from helpers import scenario, simulate

NAME = "sharing-system-prompt"


def schedule_only(sharing=FIXED, name=NAME, design="radix-fixed"):
    """The scheduler and the cache alone: every step's batch and truth, no backends."""
    sc = scenario(name)
    rng = np.random.default_rng(sc.seed)
    p = sc.pool
    alloc = HybridAllocator(p.full_size, p.swa_size, p.page_size)
    s = SharingScheduler(sc, alloc, make_requests(sc.workload, rng), rng,
                         release=release_of(load_design(design)), sharing=sharing)
    pairs = list(s.steps())
    return s, pairs


def test_the_knob_is_off_by_default_and_on_in_the_sharing_scenario():
    assert not scenario("smoke").engine.radix_cache
    assert scenario(NAME).engine.radix_cache
    assert not scenario(NAME).engine.cache_linker and scenario("r8-sink-free-list").engine.cache_linker


def test_the_radix_designs_are_0523_with_one_switch():
    from simulator.designs import BUILTIN_DESIGNS
    from simulator.engine_model.sharing import bugs_of
    for bug in ("R2", "R3", "R7", "A1", "A2"):
        d = BUILTIN_DESIGNS[f"radix-{bug.lower()}"]()
        assert bugs_of(d.release.sharing) == (bug,) and d.release.name == load_design("sglang-0.5.23").release.name
    assert bugs_of(BUILTIN_DESIGNS["radix-fixed"]().release.sharing) == ()
    assert load_design("sglang-0.5.23").release.sharing == SGLANG_0_5_23 and bugs_of(SGLANG_0_5_23) == ("R8",)


def test_prefix_hits_tombstones_and_recoveries_happen():
    s, pairs = schedule_only()
    assert len(pairs) == 194                                  # as many forwards as the release's own scheduler
    assert s.total_requests == 55 and s.finished_count == 55
    r = s.summary()
    # fresh leaves capped at one window (the SWA lock's split): their older parts are tombstoned while requests run
    assert (r["hit_tokens"], r["tombstones"], r["recoveries"], r["evicted_leaves"]) == (10367, 138, 41, 163)
    assert s.counts["adopt:swa:recover_locked"] == 32         # recoveries over a tombstone a running request locks
    assert s.retractions == 4                                 # as the release's own scheduler retracts here
    # the cache is consistent with the allocator at the end, and nothing is locked any more
    s.cache.check_invariants([])
    assert all(n.full_lock == 0 and n.swa_lock == 0 for n in s.cache.nodes.values())
    # matched prefixes are not written again: the tokens written are the requests' lengths minus the hits, plus
    # what the 4 retracted requests write again (their K/V freed, not inserted: 1,459 positions)
    written = sum(t.tags.size for _, t in pairs)
    assert written == sum(r.prompt_len + r.output_len for r in make_requests(
        scenario(NAME).workload, np.random.default_rng(8))) - 10367 + 1459


def test_content_tags_are_shared_between_requests():
    s, pairs = schedule_only()
    # a system prompt's token has one tag, whoever computes it: tags repeat across requests' writes
    tags = np.concatenate([t.tags for _, t in pairs])
    assert np.unique(tags).size < tags.size
    # the read check's keys: a later turn's prefix positions expect the tags of turn 1's writes
    rq = next(b.requests for b, _ in pairs if b.requests is not None and int(b.requests.rids[0]) > 0
              and s.owner_of(int(s._tag_rows[int(b.requests.rids[0])][0])).request != int(b.requests.rids[0]))
    keys = s._content_keys(rq, np.zeros(3, dtype=np.int64), np.arange(3, dtype=np.int64))
    assert (keys == s._tag_rows[int(rq.rids[0])][:3]).all()


def test_the_write_and_read_paths_are_clean_under_the_fixed_design():
    r = simulate(NAME, "radix-fixed", backends=["triton"])
    assert len(r.steps) == 194
    assert r.total_findings == 0
    assert r.radix["hit_tokens"] == 10367 and r.radix["tombstones"] == 138 and r.radix["recoveries"] == 41
    assert "stopped" not in r.radix and "ownership" not in r.radix


def _found(r):
    return {k: v for k, v in r.backends["triton"].findings.items() if v}


def test_r2_frees_the_locked_full_that_the_running_request_reads():
    # B's checkpoint recovers the tombstone over A's out-of-window prefix [53, 70), which A (running) locks: R2
    # frees A's full ids as if unlocked, and A reads its prefix's full slots, freed
    r = simulate("r2-locked-full-recovery", "radix-r2", backends=["triton"])
    assert len(r.steps) == 31 and _found(r) == {"stale_read": 510}
    f = r.findings[0]
    assert (f.step, f.kind, f.slot) == (1, "full", 54) and (f.expected.request, f.expected.position) == (0, 53)
    assert f.message.startswith("req 0 pos 53 ") and "freed" in f.message
    own = r.radix["ownership"]
    assert [e[:4] for e in own["events"] if e[1] in ("alloc", "free")] == [
        [0, "alloc", "alloc", "request:0"], [1, "free", "recover", "node:4"]]
    assert simulate("r2-locked-full-recovery", "radix-fixed", backends=["triton"]).total_findings == 0


def test_r3_frees_live_slots_through_the_stale_mapping():
    # SWA eviction leaves the tombstone's mapping stale; an unlocked recovery's free() then frees live
    # SWA slots through it, which are handed out again (this schedule frees too little twice over to reach the
    # capacity assert: the run goes to its end)
    r = simulate("r3-stale-tombstone-mapping", "radix-r3", backends=["triton"])
    assert len(r.steps) == 85 and _found(r) == {"stale_read": 5359} and "stopped" not in r.radix
    f = r.findings[0]
    assert (f.step, f.kind, f.slot) == (28, "swa", 114) and "reassigned to another token" in f.message
    # the ownership history: node 17's tombstone freed slot 114, request 4 was given it, node 17's recovery
    # freed it again (the stale mapping) while request 4 held it, and requests 9 and 10 were given it
    own = r.radix["ownership"]
    assert (own["pool"], own["slot"], own["step"]) == ("swa", 114, 28)
    key = [e[:4] for e in own["events"] if e[1] in ("alloc", "free")]
    assert key[1:9] == [[16, "free", "tombstone", "node:2"], [16, "alloc", "alloc", "request:5"],
                        [26, "free", "tombstone", "node:17"], [26, "alloc", "alloc", "request:4"],
                        [27, "free", "evict_leaf", "node:19"], [28, "free", "recover", "node:17"],
                        [28, "alloc", "alloc", "request:9"], [28, "alloc", "alloc", "request:10"]]


def test_r7_the_flush_frees_the_repointed_slots():
    # A's checkpoint queues its out-of-window SWA free; B's checkpoint (same group) recovers the tombstone over
    # A's full ids (locked): the flush then reads the re-pointed mapping and frees the node's new SWA slots
    s, _ = schedule_only(with_bug("R7"), "r7-grouped-free-flush", "radix-r7")
    assert s.counts["free:swa:out_of_window@flush"] == 3 and s.counts["adopt:swa:recover_locked"] == 1
    r = simulate("r7-grouped-free-flush", "radix-r7", backends=["triton"])
    assert len(r.steps) == 31 and _found(r) == {"stale_read": 75}
    f = r.findings[0]
    assert (f.step, f.kind, f.slot) == (1, "swa", 0) and f.message.startswith("req 1 pos 55 ")
    assert simulate("r7-grouped-free-flush", "radix-fixed", backends=["triton"]).total_findings == 0
    t, _ = schedule_only(FIXED, "r7-grouped-free-flush", "radix-fixed")
    t.cache.check_invariants([])


def test_r8_live_in_the_0523_default_the_sink_is_handed_out():
    # 0.5.23's unfiltered SWA free plus the linker (engine.cache_linker): evicted tombstone leaves free
    # mapping[rep] // 16 = page 0; request 12 is given the sink page and reads it, and others after it; a read
    # of the sink page is stale even where it holds the reader's own token (573 of them)
    r = simulate("r8-sink-free-list", "sglang-0.5.23", backends=["triton"])
    assert len(r.steps) == 94 and _found(r) == {"stale_read": 9042}
    assert sum(1 for f in r.findings if f.observed == f.expected) == 573
    assert {f.slot for f in r.findings if f.kind == "swa"} == set(range(16))      # the sink page, page 0
    own = r.radix["ownership"]
    assert [e[:4] for e in own["events"] if e[1] == "alloc"][:3] == [
        [45, "alloc", "alloc", "request:12"], [48, "alloc", "alloc", "request:11"], [55, "alloc", "alloc", "request:13"]]
    assert simulate("r8-sink-free-list", "radix-fixed", backends=["triton"]).total_findings == 0


def test_0523_without_r8s_trigger_schedules_as_the_fixed_design():
    s, _ = schedule_only(SGLANG_0_5_23)
    assert s.summary() == schedule_only(FIXED)[0].summary()
    assert not any("@flush" in k for k in s.counts)


def test_radix_refuses_what_it_does_not_model():
    from simulator.scenario import ScenarioError
    from helpers import tiny
    sc = tiny("""
seed = 1
[model]
layers = "SF"
window = 4
[pool]
full_size = 256
[workload]
requests = 1
[engine]
radix_cache = true
overlap = true
""")
    rng = np.random.default_rng(1)
    with pytest.raises(ScenarioError, match="radix_cache"):
        SharingScheduler(sc, HybridAllocator(256, 204, 1), make_requests(sc.workload, rng), rng)
    assert isinstance(Scheduler, type)
