"""Runs with the radix cache on (``engine.radix_cache``, issue 12 point 1): simulator/sharing_run.py's
SharingScheduler over scenarios/sharing-system-prompt.toml, exact counts.

The scenario (seed 8): 24 conversations, 55 requests in all, 2 system prompts, page size 1, a small pool.
Scheduler-only runs (no backends) pin what the cache does; full runs (one backend, read checking on) pin
what the oracle finds under the fixed design and under R2 / R3 / R8.
"""
from __future__ import annotations

import numpy as np
import pytest

from simulator.allocator import HybridAllocator, OverFree
from simulator.designs import load_design
from simulator.prefix_cache import FIXED, SGLANG_0_5_23, with_bug
from simulator.release_model import release_of
from simulator.scheduler import Scheduler
from simulator.sharing_run import SharingScheduler
from simulator.workload import make_requests

from helpers import scenario, simulate

NAME = "sharing-system-prompt"
DESIGNS = "simulator/radix_designs.py:"


def schedule_only(sharing=FIXED):
    """The scheduler and the cache alone: every step's batch and truth, no backends."""
    sc = scenario(NAME)
    rng = np.random.default_rng(sc.seed)
    p = sc.pool
    alloc = HybridAllocator(p.full_size, p.swa_size, p.page_size)
    s = SharingScheduler(sc, alloc, make_requests(sc.workload, rng), rng,
                         release=release_of(load_design(sc.design)), sharing=sharing)
    pairs = list(s.steps())
    return s, pairs


def test_the_knob_is_off_by_default_and_on_in_the_sharing_scenario():
    assert not scenario("smoke").engine.radix_cache
    assert scenario(NAME).engine.radix_cache


def test_prefix_hits_tombstones_and_recoveries_happen():
    s, pairs = schedule_only()
    assert len(pairs) == 454
    assert s.total_requests == 55 and s.finished_count == 55
    r = s.summary()
    assert (r["hit_tokens"], r["tombstones"], r["recoveries"], r["evicted_leaves"]) == (7562, 81, 57, 92)
    assert s.counts["adopt:swa:recover_locked"] == 9          # recoveries over a tombstone a running request locks
    # the cache is consistent with the allocator at the end, and nothing is locked any more
    s.cache.check_invariants([])
    assert all(n.full_lock == 0 and n.swa_lock == 0 for n in s.cache.nodes.values())
    # matched prefixes are not written again: the tokens written are the requests' lengths minus the hits
    written = sum(t.tags.size for _, t in pairs)
    assert written == sum(r.prompt_len + r.output_len for r in make_requests(
        scenario(NAME).workload, np.random.default_rng(8))) - 7562


def test_content_tags_are_shared_between_requests():
    s, pairs = schedule_only()
    # a system prompt's token has one tag, whoever computes it: tags repeat across requests' writes
    tags = np.concatenate([t.tags for _, t in pairs])
    assert np.unique(tags).size < tags.size
    # the read check's keys: a later turn's prefix positions expect the tags of turn 1's writes
    rq = next(b.requests for b, _ in pairs if b.requests is not None and int(b.requests.rids[0]) > 0
              and s.owner_of(int(s._tag_rows[int(b.requests.rids[0])][0])).request != int(b.requests.rids[0]))
    keys = s._keys(rq, np.zeros(3, dtype=np.int64), np.arange(3, dtype=np.int64))
    assert (keys == s._tag_rows[int(rq.rids[0])][:3]).all()


def test_the_write_and_read_paths_are_clean_under_the_fixed_design():
    r = simulate(NAME, DESIGNS + "RadixFixed", backends=["triton"])
    assert len(r.steps) == 454
    assert r.total_findings == 0
    assert r.radix["hit_tokens"] == 7562 and r.radix["tombstones"] == 81 and r.radix["recoveries"] == 57


def test_r8_the_sink_page_is_handed_out_and_read_then_the_capacity_assert():
    # 0.5.23's unfiltered SWA free plus R8's trigger: evicted tombstone leaves free mapping[rep] // 1 = 0,
    # once per token; the sink is allocated to requests, which read one another's K/V there, until an
    # over-free trips the allocator's capacity assert
    with pytest.raises(OverFree) as e:
        simulate(NAME, DESIGNS + "RadixR8", backends=["triton"])
    part = e.value.partial_result
    assert e.value.partial_at_step == 224
    assert {k: v for k, v in part.backends["triton"].findings.items() if v} == {"stale_read": 3577}
    assert {f.slot for f in part.findings} == {0}
    first = part.backends["triton"].first_finding
    assert (first.step, first.kind) == (192, "swa")


def test_r3_frees_live_slots_then_the_capacity_assert():
    # SWA eviction leaves the tombstone's mapping stale; an unlocked recovery's free() then frees live
    # SWA slots through it (a request's own window here), and later the over-free trips the assert
    with pytest.raises(OverFree) as e:
        simulate(NAME, DESIGNS + "RadixR3", backends=["triton"])
    part = e.value.partial_result
    assert e.value.partial_at_step == 151
    assert {k: v for k, v in part.backends["triton"].findings.items() if v} == {"stale_read": 14321}
    f = part.findings[0]
    assert (f.step, f.kind, f.slot) == (61, "swa", 5) and "the slot was freed" in f.message


def test_r2_frees_the_locked_full_that_a_matching_request_reads():
    # a recovery over a tombstone whose Full a running request locks frees that Full: the running
    # request, which matched it, reads freed full slots (shared ones: written by another request)
    r = simulate(NAME, DESIGNS + "RadixR2", backends=["triton"])
    assert len(r.steps) == 454
    assert {k: v for k, v in r.backends["triton"].findings.items() if v} == {"stale_read": 6500}
    f = r.findings[0]
    assert (f.step, f.kind, f.slot) == (43, "full", 644)
    assert f.expected.request == 1 and f.message.startswith("req 5 pos 0 ") and "freed" in f.message


def test_0523_without_r8s_trigger_and_r7_schedule_as_the_fixed_design():
    # R7 needs an SWA free queued in a free group and then a locked recovery re-pointing the same full
    # ids in that group: the scheduler's tree eviction runs at admission and allocation, outside the
    # finish group, so the switch changes nothing here (nothing is resolved at a flush)
    s, _ = schedule_only(SGLANG_0_5_23)
    assert s.summary() == schedule_only(FIXED)[0].summary()
    assert not any("@flush" in k for k in s.counts)
    for bug in ("R7",):
        t, _ = schedule_only(with_bug(bug))
        assert t.summary() == s.summary()
        t.cache.check_invariants([])


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
