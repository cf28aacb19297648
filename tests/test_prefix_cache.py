"""The radix prefix cache (simulator/scheduling/prefix_cache.py): hand-computed cases for matching, recovery
(locked and unlocked), grouped frees, release and each bug switch, and a state machine over random
inserts, matches, evictions and releases that checks the tree + allocator invariants after every step."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from simulator.memory.allocator import HybridAllocator, OverFree, RequestSlots
from simulator.memory.events import ADOPT, AVAILABLE, FREE, MAP
from simulator.engine_model.sharing import BUG_SWITCHES, FIXED, SGLANG_0_5_23, bugs_of, with_bug
from simulator.scheduling.ownership_ledger import OwnershipLedger
from simulator.scheduling.prefix_cache import CachedRequest, PrefixCache

W = 4          # the sliding window of the hand-computed cases


def setup(page=1, full=32, swa=32, order="fifo", behaviour=SGLANG_0_5_23, window=W):
    alloc = HybridAllocator(full * page, swa * page, page, order)
    cache = PrefixCache(alloc, window, behaviour)
    cache.ledger = OwnershipLedger(page, full, swa)     # the events' view, fed by events() and run()
    return alloc, cache


def events(cache):
    """Drain the cache's events into its ledger and return them."""
    ev = cache.drain_events()
    cache.ledger.apply(ev)
    return ev


def req(rid, tokens, capacity=None):
    tokens = np.asarray(tokens, np.int64)
    return CachedRequest(rid, RequestSlots(capacity or tokens.size), tokens)


def run(cache, r, upto=None, limit=None):
    """Admit (matching up to len - 1), then allocate the rest of positions [0, upto)."""
    cache.admit(r, limit if limit is not None else r.tokens.size - 1)
    n = (upto if upto is not None else r.tokens.size) - r.slots.length
    events(cache)
    old = r.slots.length
    cache.alloc.extend(r.slots, n)
    cache.ledger.allocated("full", r.slots.full[old:old + n], r.owner)
    cache.ledger.allocated("swa", r.slots.swa[old:old + n], r.owner)
    return r


def free_lists(alloc):
    f, s = alloc.free_pages()
    return f.tolist(), s.tolist()


def chain(cache, rid, tokens, cut):
    """A finished request whose KV sits in the tree as two nodes, [0, cut) and [cut, len)."""
    r = run(cache, req(rid, tokens))
    cache.cache_unfinished(r, cut)
    cache.cache_finished(r)
    return r


T = list(range(1, 13))          # a shared 12-token prefix


# --------------------------------------------------------------------------- switches

def test_switches_name_one_field_each_and_defaults_are_0523():
    assert bugs_of(SGLANG_0_5_23) == ("R8",)          # R8's unfiltered SWA free is live in 0.5.23
    assert bugs_of(FIXED) == ()
    for bug in BUG_SWITCHES:
        assert bugs_of(with_bug(bug)) == (bug,)
    assert with_bug("R8").linker_frees_tombstones
    with pytest.raises(KeyError, match="U1"):
        with_bug("U1")


# --------------------------------------------------------------------------- matching

def test_match_shares_a_prefix_and_frees_duplicates():
    alloc, c = setup()
    a = run(c, req(1, T + [100]))
    c.cache_finished(a)
    assert free_lists(alloc) == (list(range(14, 33)), list(range(14, 33)))
    # the 13-token leaf was capped at one window when inserted: [0, 9) -> [9, 13) (the SWA lock's split)
    assert c.describe() == ["node 2: 9 tokens, full 1..9, swa 1..9, locks full 0 swa 0",
                            "  node 1: 4 tokens, full 10..13, swa 10..13, locks full 0 swa 0"]
    b = req(2, T + [200, 201])
    m = c.admit(b, 13)                       # T + [100] vs T + [200]: the tail node is split after T
    assert m.length == 12 and m.full.tolist() == list(range(1, 13)) and m.swa.tolist() == list(range(1, 13))
    assert b.protected == 12 and b.slots.length == 12 and len(c.nodes) == 4
    c.check_invariants([b])
    alloc.extend(b.slots, 2)
    assert b.slots.full[:14].tolist() == list(range(1, 13)) + [14, 15]
    c.check_invariants([b])


def test_match_split_and_duplicates_of_a_request_computed_alongside():
    alloc, c = setup()
    a = run(c, req(1, T + [100]))
    b = run(c, req(2, T + [200]))            # admitted on an empty tree: computes everything
    assert b.slots.full[:13].tolist() == list(range(14, 27))
    c.cache_finished(a)
    events(c)
    c.cache_finished(b)
    ev = events(c)
    dup = [e for e in ev if e.kind == FREE and e.cause == "dedup"]
    # one pair of frees per node b's duplicates lie in: [0, 9) and [9, 12)
    assert [(e.pool, e.slots.tolist()) for e in dup] == [("swa", list(range(14, 23))), ("full", list(range(14, 23))),
                                                         ("swa", [23, 24, 25]), ("full", [23, 24, 25])]
    assert free_lists(alloc) == (list(range(27, 33)) + list(range(14, 26)), list(range(27, 33)) + list(range(14, 26)))
    c.check_invariants([])
    # tree: T[:9] -> T[9:] -> {100, 200}
    root_child = next(iter(c.root.children.values()))
    tail = next(iter(root_child.children.values()))
    assert root_child.key.tolist() == T[:9] and tail.key.tolist() == T[9:] and len(tail.children) == 2


def test_match_stops_where_the_swa_window_rules_do():
    alloc, c = setup()
    a = run(c, req(1, T))
    c.free_out_of_window(a, 6)               # positions [0, 6) lose their SWA slots
    c.cache_finished(a)                      # tree: tombstone [0, 6) -> live [6, 8) -> live [8, 12)
    x = next(iter(c.root.children.values()))
    y = next(iter(x.children.values()))      # the live leaf capped at one window: [6, 8) and [8, 12)
    assert x.tombstone and len(x.key) == 6 and not y.tombstone and len(y.key) == 2
    assert [len(n.key) for n in y.children.values()] == [4]
    c.check_invariants([])
    # 6 live tokens after the tombstone cover the window: the whole prefix matches
    m = c.match_prefix(np.array(T + [99]), 12)
    assert m.length == 12 and m.swa_live_from == 6
    assert m.swa.tolist() == [0] * 6 + list(range(7, 13)) and m.full.tolist() == list(range(1, 13))
    # only 2 live tokens after the tombstone: not a usable match, although Full KV holds 8
    m = c.match_prefix(np.array(T[:8] + [99, 98]), 9)
    assert m.length == 0 and m.full_hit == 8
    assert c.describe() == ["node 1: 6 tokens, full 1..6, swa tombstone, locks full 0 swa 0",
                            "  node 3: 2 tokens, full 7..8, swa 7..8, locks full 0 swa 0",
                            "    node 2: 4 tokens, full 9..12, swa 9..12, locks full 0 swa 0"]
    # no tombstone on the path: any prefix matches
    alloc2, c2 = setup()
    c2.cache_finished(run(c2, req(1, T)))
    assert c2.match_prefix(np.array(T[:3] + [50]), 4).length == 3


def test_match_at_page_16_is_page_granular():
    alloc, c = setup(page=16, full=8, swa=8)
    toks = list(range(1, 41))
    a = run(c, req(1, toks))
    c.cache_finished(a)
    # 40 tokens: the tree keeps two pages (32 tokens); the tail page goes back. A window of 4 rounds up to one
    # page: the live leaf is capped at it, [0, 16) -> [16, 32)
    node = next(iter(c.root.children.values()))
    assert len(node.key) == 16 and [len(n.key) for n in node.children.values()] == [16]
    m = c.match_prefix(np.array(toks[:20] + [0] * 20), 39)
    assert m.length == 16 and m.full.tolist() == list(range(16, 32))
    c.check_invariants([])



def test_a_fresh_live_leaf_is_capped_at_one_window_so_a_lock_pins_one_window():
    # SWAComponent._maybe_split_leaf_for_swa_lock: a running request's checkpoint of 13 tokens (window 4, page 1)
    # inserts [0, 9) and [9, 13); its SWA lock pins the window's leaf only, so the older part can be tombstoned
    # (its Full still locked) while the request runs
    alloc, c = setup()
    a = run(c, req(1, T + [100]))
    c.cache_unfinished(a)
    x = next(iter(c.root.children.values()))
    y = next(iter(x.children.values()))
    assert (len(x.key), len(y.key)) == (9, 4)
    assert (x.full_lock, x.swa_lock, y.full_lock, y.swa_lock) == (1, 0, 1, 1)
    assert c.evict(swa_tokens=1) == (0, 9)
    assert x.tombstone and not y.tombstone and x.full.tolist() == list(range(1, 10))
    c.check_invariants([a])
    # paged: a window of 5 on pages of 2 rounds up to 6 tokens; a leaf of 6 stays whole, one of 14 is split at 8
    alloc, c = setup(page=2, window=5)
    c.cache_finished(run(c, req(1, list(range(1, 7)))))
    c.cache_finished(run(c, req(2, list(range(20, 34)))))
    assert sorted(len(n.key) for n in c.nodes.values() if n is not c.root) == [6, 6, 8]
    long = next(n for n in c.root.children.values() if len(n.key) == 8)
    assert [len(n.key) for n in long.children.values()] == [6]
    c.check_invariants([])
    events(c)
    assert not c.ledger.problems

# --------------------------------------------------------------------------- recovery

def _tombstone_then(c, a_tokens, cut=6):
    """Request 1 finishes with [0, cut) out of the window: the tree has a tombstone [0, cut)."""
    a = run(c, req(1, a_tokens))
    c.free_out_of_window(a, cut)
    c.cache_finished(a)
    return next(iter(c.root.children.values()))


def test_recovery_with_the_full_unlocked_adopts_the_incoming_ids():
    alloc, c = setup()
    x = _tombstone_then(c, T[:8] + [100, 101])
    assert x.tombstone and x.full.tolist() == [1, 2, 3, 4, 5, 6]
    assert free_lists(alloc)[1] == list(range(11, 33)) + [1, 2, 3, 4, 5, 6]
    b = run(c, req(2, T[:8] + [200, 201, 202]))
    assert b.protected == 0                     # the tombstone is no usable prefix
    assert b.slots.full[:11].tolist() == list(range(11, 22)) and b.slots.swa[:11].tolist() == list(range(11, 22))
    events(c)
    c.cache_finished(b)
    ev = events(c)
    assert x.full.tolist() == list(range(11, 17)) and x.swa.tolist() == list(range(11, 17))
    assert [(e.kind, e.pool, e.slots.tolist(), e.cause) for e in ev if e.cause == "recover" and e.kind != AVAILABLE] == [
        (ADOPT, "full", list(range(11, 17)), "recover"),
        (FREE, "full", [1, 2, 3, 4, 5, 6], "recover"),
        (ADOPT, "swa", list(range(11, 17)), "recover")]
    # [6, 8) duplicates the live node [7, 8]: freed both sides; the insert stops at b's SWA branching point (its
    # Full hit, 8: the tombstone made its match 0), so the tail [200, 201, 202] is released, not a new leaf
    assert b.branching is None and {tuple(n.key.tolist()) for n in c.root.children.values()} == {tuple(T[:6])}
    assert free_lists(alloc) == (list(range(22, 33)) + [1, 2, 3, 4, 5, 6, 17, 18, 19, 20, 21],
                                 list(range(22, 33)) + [1, 2, 3, 4, 5, 6, 17, 18, 19, 20, 21])
    c.check_invariants([])
    events(c)
    assert not c.ledger.problems


def _locked_tombstone(behaviour):
    """A running request (3) holds [0, 12) through nodes X = [0, 6) and Y = [6, 12), its SWA lock only on
    Y; X is then SWA-evicted (tombstoned, its Full still locked). Request 2 (admitted before X existed)
    computed [0, 6) itself. (A window of 6: no fresh leaf is longer than one window, so none is capped.)"""
    alloc, c = setup(behaviour=behaviour, window=6)
    b = run(c, req(2, T[:6] + [400, 401]))                    # full/swa 1..8
    chain(c, 1, T, 6)                                          # A: full/swa 9..20 -> X, Y
    x = next(iter(c.root.children.values()))
    run_c = run(c, req(3, T + [300]), limit=12)                # matches 12, locks
    assert run_c.protected == 12 and x.full_lock == 1 and x.swa_lock == 0
    return alloc, c, b, run_c, x


def test_recovery_with_the_full_locked_repoints_the_kept_ids():
    alloc, c, b, cr, x = _locked_tombstone(SGLANG_0_5_23)
    assert c.evict(swa_tokens=6) == (0, 6)
    assert x.tombstone and x.full.tolist() == list(range(9, 15))
    assert (alloc.full_to_swa[9:15] == 0).all()
    events(c)
    c.cache_finished(b)
    ev = events(c)
    # kept: X's locked full ids 9..14; B's SWA slots 1..6 move onto them; B's full 1..6 go back full-only
    assert x.full.tolist() == list(range(9, 15)) and x.swa.tolist() == [1, 2, 3, 4, 5, 6]
    assert alloc.full_to_swa[9:15].tolist() == [1, 2, 3, 4, 5, 6] and (alloc.full_to_swa[1:7] == 0).all()
    assert [(e.kind, e.pool, e.slots.tolist()) for e in ev if e.cause == "recover_locked" and e.kind != AVAILABLE] == [
        (MAP, "full", [1, 2, 3, 4, 5, 6]), (MAP, "full", list(range(9, 15))),
        (FREE, "full", [1, 2, 3, 4, 5, 6]), (ADOPT, "swa", [1, 2, 3, 4, 5, 6])]
    assert cr.slots.full[:6].tolist() == list(range(9, 15))     # the running reader's slots untouched
    c.check_invariants([cr])
    events(c)
    assert not c.ledger.problems


def test_r2_frees_the_locked_full_under_the_running_request():
    alloc, c, b, cr, x = _locked_tombstone(with_bug("R2"))
    c.evict(swa_tokens=6)
    c.cache_finished(b)
    # the node took B's ids and freed its own: the slots request 3 still reads are in the free list
    assert x.full.tolist() == [1, 2, 3, 4, 5, 6]
    reader = cr.slots.full[:6].tolist()
    assert reader == list(range(9, 15)) and set(reader) <= set(free_lists(alloc)[0])
    events(c)
    assert {(p[0], p[1], p[2]) for p in c.ledger.problems} == {("freed_while_read", "full", x) for x in reader}
    with pytest.raises(AssertionError, match="prefix is not its node's path"):
        c.check_invariants([cr])


# --------------------------------------------------------------------------- grouped frees

def test_grouped_frees_resolve_swa_at_enqueue():
    alloc, c, b, cr, x = _locked_tombstone(SGLANG_0_5_23)
    p_old = x.swa.tolist()                                     # 9..14
    with c.free_group():
        c.evict(swa_tokens=6)                                  # tombstone X: its SWA resolved now
        assert free_lists(alloc)[1] == list(range(22, 33))     # held until the group ends
        c.cache_finished(b)                                    # locked recovery re-points X's full ids
        assert alloc.full_to_swa[9:15].tolist() == [1, 2, 3, 4, 5, 6]
    assert x.swa.tolist() == [1, 2, 3, 4, 5, 6]
    assert set(p_old) <= set(free_lists(alloc)[1]) and not {1, 2, 3, 4, 5, 6} & set(free_lists(alloc)[1])
    c.check_invariants([cr])
    avail = [e for e in c.events if e.kind == AVAILABLE]
    assert all(e.cause == "flush" for e in avail)
    events(c)
    assert not c.ledger.problems


def test_r7_flush_frees_the_repointed_page_and_the_old_one_leaks():
    alloc, c, b, cr, x = _locked_tombstone(with_bug("R7"))
    p_old = x.swa.tolist()
    with c.free_group():
        c.evict(swa_tokens=6)
        c.cache_finished(b)
    swa_free = free_lists(alloc)[1]
    # the flush translated X's full ids after the recovery: it freed B's pages 1..6, which X now holds
    assert x.swa.tolist() == [1, 2, 3, 4, 5, 6] and {1, 2, 3, 4, 5, 6} <= set(swa_free)
    assert not set(p_old) & set(swa_free)                       # 9..14: owned by nobody, never freed
    assert (alloc.full_to_swa[9:15] == 0).all()
    flush = [e for e in c.events if e.kind == FREE and e.cause.endswith("@flush")]
    assert [e.slots.tolist() for e in flush] == [[1, 2, 3, 4, 5, 6]]
    with pytest.raises(AssertionError):
        c.check_invariants([cr])
    events(c)
    assert not c.ledger.problems                                # every free was X's own ...
    assert all(c.ledger.owner["swa"].get(v) is None for v in x.swa.tolist())   # ... yet X still uses them
    assert all(c.ledger.owner["swa"].get(v) == x.owner for v in p_old)         # and the leak is X's


# --------------------------------------------------------------------------- release

def test_release_gives_the_evicted_range_back_full_side_only():
    alloc, c = setup()
    chain(c, 1, T[:4] + [7, 7, 7, 7], 4)                       # tree: [0, 4) -> [4, 8)
    r = req(2, T[:4] + [50 + i for i in range(12)])
    run(c, r, upto=16, limit=4)                                 # matches 4 (one window), computes 12
    assert r.protected == 4 and r.slots.full[:16].tolist() == [1, 2, 3, 4] + list(range(9, 21))
    c.free_out_of_window(r, 10)                                 # SWA of [4, 10) freed (never the tree's)
    assert r.slots.swa_evicted == 10
    full_before, swa_before = free_lists(alloc)
    events(c)
    c.release(r)                                                # no insert: abort / retract
    f, s = free_lists(alloc)
    assert f == full_before + list(range(9, 21))                # [4, 10) full-only, then [10, 16) both
    assert s == swa_before + list(range(15, 21))
    assert [(e.kind, e.pool, e.slots.tolist()) for e in events(c) if e.kind == FREE] == [
        (FREE, "full", list(range(9, 15))), (FREE, "swa", list(range(15, 21))), (FREE, "full", list(range(15, 21)))]
    c.check_invariants([])
    assert all(n.full_lock == 0 and n.swa_lock == 0 for n in c.nodes.values())
    events(c)
    assert not c.ledger.problems


def test_tree_eviction_frees_lru_unlocked_leaves():
    alloc, c = setup(window=5)                                  # each request one window: no leaf is capped
    c.cache_finished(run(c, req(1, [1, 2, 3, 4, 5])))
    c.cache_finished(run(c, req(2, [9, 9, 9, 9, 9])))
    held = run(c, req(3, [1, 2, 3, 4, 5, 6]), limit=5)         # locks request 1's node
    assert c.evict(full_tokens=1) == (5, 5)                     # the other leaf, not the locked one
    assert [n.key.tolist() for n in c.nodes.values() if n is not c.root] == [[1, 2, 3, 4, 5]]
    c.check_invariants([held])
    c.release(held)
    assert c.evict(full_tokens=100) == (5, 5) and len(c.nodes) == 1
    c.check_invariants([])
    events(c)
    assert not c.ledger.problems and not c.ledger.readers["full"] and not c.ledger.owner["full"]


# --------------------------------------------------------------------------- the other bug switches

def test_r3_stale_tombstone_mapping_frees_a_live_slot():
    for behaviour, leaks in ((SGLANG_0_5_23, False), (with_bug("R3"), True)):
        alloc, c = setup(full=48, order="lifo", behaviour=behaviour)
        chain(c, 1, T[:8] + [20, 21, 22, 23, 24, 25], 8)         # N = full/swa 1..8, leaf 9..14
        n = next(iter(c.root.children.values()))
        b = run(c, req(2, T[:8] + [500, 501]), limit=0)         # computes [0, 10) itself: 15..24
        e = run(c, req(5, T[:8] + [20, 21, 22, 23, 24, 25, 26]), limit=14)   # reader: SWA lock on the leaf
        c.evict(swa_tokens=8)                                   # N tombstoned (internal)
        assert n.tombstone
        c.release(e)
        cr = run(c, req(3, [900 + i for i in range(9)]))        # LIFO: takes the SWA slots N just gave back
        assert set(range(1, 9)) <= set(cr.slots.swa[:9].tolist())
        c.cache_finished(b)                                     # recovery over N, Full unlocked
        swa_free = set(free_lists(alloc)[1])
        live_freed = set(cr.slots.swa[:9].tolist()) & swa_free
        events(c)
        foreign = {p[2] for p in c.ledger.problems if p[0] == "freed_foreign" and p[1] == "swa"}
        assert foreign == (set(range(1, 9)) if leaks else set())
        if leaks:
            assert live_freed == set(range(1, 9))               # C's live SWA slots, freed by the stale mapping
            with pytest.raises(AssertionError):
                c.check_invariants([cr])
        else:
            assert not live_freed
            c.check_invariants([cr])


def test_r8_sink_page_enters_the_swa_free_list():
    for page in (1, 16):
        for behaviour, sink in ((with_bug("R8"), True), (replace_linker(FIXED), False)):
            alloc, c = setup(page=page, full=16, swa=16, order="lifo", behaviour=behaviour)
            toks = list(range(1, 4 * page + 1))
            keep = run(c, req(9, [7000 + i for i in range(4 * page)]))     # holds SWA pages
            a = run(c, req(1, toks))
            c.free_out_of_window(a, 2 * page)
            c.cache_finished(a)                                  # tombstone [0, 2 pages) -> live leaf
            c.evict(full_tokens=10**6)                           # the live leaf, then the tombstone leaf
            swa_free = free_lists(alloc)[1]
            assert (0 in swa_free) == sink, (page, behaviour.name)
            events(c)
            assert any(p[0] == "sink_freed" for p in c.ledger.problems) == sink
            if sink:
                assert swa_free.count(0) == (2 * page if page == 1 else 2)   # once per representative
                nxt = run(c, req(4, [8000 + i for i in range(page)]))       # LIFO: the sink comes back first
                assert nxt.slots.swa[0] == 0
            else:
                c.check_invariants([keep])


def replace_linker(b):
    from dataclasses import replace
    return replace(b, linker_frees_tombstones=True)


def test_r8_over_free_is_the_capacity_assert():
    alloc, c = setup(full=8, swa=8, behaviour=with_bug("R8"))
    a = run(c, req(1, list(range(1, 9))))
    c.free_out_of_window(a, 6)
    c.cache_finished(a)
    with pytest.raises(OverFree, match="free of 8"):
        c.evict(full_tokens=100)          # 6 sink frees on top of a full free list


def test_a1_paged_free_swa_clearing_only_the_tokens_double_frees_the_page():
    for behaviour, twice in ((SGLANG_0_5_23, False), (with_bug("A1"), True)):
        alloc, c = setup(page=16, full=4, swa=4, behaviour=behaviour)
        run(c, req(9, list(range(900, 932))), limit=0)            # holds two pages: room for a double free
        r = run(c, req(1, list(range(100, 116))), limit=0)
        sp = int(r.slots.swa[0]) // 16
        c.free_swa(r.slots.full[:1], r.owner, "test")
        c.free_swa(r.slots.full[1:2], r.owner, "test")
        assert free_lists(alloc)[1].count(sp) == (2 if twice else 1)
        events(c)
        assert [p[:3] for p in c.ledger.problems] == ([("double_free", "swa", sp)] if twice else [])
        assert (alloc.full_to_swa[r.slots.full[2:16]] != 0).all() == twice


def test_a2_swa_tail_allocation_keeps_stale_mappings_on_recycled_full_pages():
    for behaviour, bug in ((SGLANG_0_5_23, False), (with_bug("A2"), True)):
        alloc, c = setup(page=16, full=8, swa=4, order="lifo", behaviour=behaviour)
        run(c, req(1, list(range(100, 116))), limit=0)               # full page 1, SWA page 1
        # its previous owner gives the pages back leaving the full page's mapping (e.g. A1's partial clear)
        alloc.free_swa_pages(np.array([1]))
        other = run(c, req(3, list(range(300, 316))), limit=0)      # LIFO: SWA page 1 again, full page 2
        assert other.slots.swa[0] == 16 and other.slots.full[0] == 32
        alloc.free_full_pages(np.array([1]))
        tail = req(2, list(range(200, 232)))
        c.extend_swa_tail(tail, 32, 16)                             # recycled full page 1, then 3; SWA page 2
        assert tail.slots.full[0] == 16 and tail.slots.swa[16] == 32 and tail.slots.swa_evicted == 16
        stale = alloc.full_to_swa[tail.slots.full[:16]]
        assert (stale == np.arange(16, 32)).all() == bug and (stale == 0).all() != bug
        c.free_swa(tail.slots.full[:16], tail.owner, "evict")      # the non-tail range
        assert (1 in free_lists(alloc)[1]) == bug                   # request 3's live SWA page freed


# --------------------------------------------------------------------------- state machine

FAMILIES = [list(range(1000 * f + 1, 1000 * f + 65)) for f in range(3)]


class CacheMachine(RuleBasedStateMachine):
    page = 1
    order = "lifo"
    behaviour = SGLANG_0_5_23

    def __init__(self):
        super().__init__()
        p = self.page
        self.window = 3 * p if p > 1 else 5
        self.alloc = HybridAllocator(40 * p, 28 * p, p, self.order)
        self.cache = PrefixCache(self.alloc, self.window, self.behaviour)
        self.live: list[CachedRequest] = []
        self.done: list[np.ndarray] = []        # finished requests' tokens (for multi-turn)
        self.rid = 0
        self.ledger = OwnershipLedger(p, 40, 28)   # what the events say, checked against the structures

    def _extend(self, r, n):
        self.ledger.apply(self.cache.drain_events())
        old = r.slots.length
        self.alloc.extend(r.slots, n)
        self.ledger.allocated("full", r.slots.full[old:old + n], r.owner)
        self.ledger.allocated("swa", r.slots.swa[old:old + n], r.owner)

    def _make_room(self, r, n):
        need = self.alloc.pages_needed(r.slots, n)
        if need > self.alloc._full.free or need > self.alloc._swa.free:
            self.cache.evict(full_tokens=need * self.page, swa_tokens=need * self.page)
        return need <= self.alloc._full.free and need <= self.alloc._swa.free

    @rule(family=st.integers(0, 2), shared=st.integers(0, 64), own=st.integers(1, 40), out=st.integers(0, 24),
          turn=st.booleans(), fresh=st.booleans())
    def start(self, family, shared, own, out, turn, fresh):
        """A new request; ``fresh``: admitted without a match (in flight together with the requests that
        insert its prefix, as in a batch), so its insert meets duplicates and tombstones."""
        self.rid += 1
        if turn and self.done:
            head = self.done[self.rid % len(self.done)]
        else:
            head = np.asarray(FAMILIES[family][:shared], np.int64)
        body = np.arange(own + out, dtype=np.int64) + 10**6 * self.rid
        tokens = np.concatenate([head, body])
        r = req(self.rid, tokens)
        r.prompt = head.size + own
        self.cache.admit(r, 0 if fresh else r.prompt - 1)
        n = r.prompt - r.slots.length
        if not self._make_room(r, n):
            self.cache.release(r)
            return
        self._extend(r, n)
        self.live.append(r)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), n=st.integers(1, 8))
    def decode(self, i, n):
        r = self.live[i % len(self.live)]
        n = min(n, r.tokens.size - r.slots.length)
        if n and self._make_room(r, n):
            self._extend(r, n)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def out_of_window(self, i):
        r = self.live[i % len(self.live)]
        self.cache.free_out_of_window(r, r.slots.length - self.window)

    @precondition(lambda self: self.done)
    @rule(i=st.integers(0, 100), extra=st.integers(1, 20))
    def recompute(self, i, extra):
        """A request with a finished request's tokens (and more), admitted without a match and computed
        whole, then finished: its insert meets the tree's duplicates and, where the tree's SWA was
        evicted, tombstones (recovery, Full locked or not)."""
        head = self.done[i % len(self.done)]
        self.rid += 1
        r = req(self.rid, np.concatenate([head, np.arange(extra, dtype=np.int64) + 10**6 * self.rid]))
        r.prompt = r.tokens.size
        self.cache.admit(r, 0)
        if not self._make_room(r, r.prompt):
            self.cache.release(r)
            return
        self._extend(r, r.prompt)
        self.cache.evict(swa_tokens=head.size // 2)          # tombstone some of the tree's copy first
        self.cache.cache_finished(r)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def chunk(self, i):
        self.cache.cache_unfinished(self.live[i % len(self.live)])

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), grouped=st.booleans(), abort=st.booleans())
    def finish(self, i, grouped, abort):
        r = self.live.pop(i % len(self.live))
        with self.cache.free_group() if grouped else _null():
            if abort:
                self.cache.release(r)
            else:
                self.done.append(r.tokens[:r.slots.length].copy())
                self.cache.cache_finished(r)
            if grouped and self.live:
                # a second mutation in the same group: SWA eviction (tombstones)
                self.cache.evict(swa_tokens=self.page)

    @rule(full=st.integers(0, 40), swa=st.integers(0, 40))
    def evict(self, full, swa):
        self.cache.evict(full_tokens=full * self.page // 4, swa_tokens=swa * self.page // 2)

    @rule(family=st.integers(0, 2), k=st.integers(0, 64))
    def match_only(self, family, k):
        m = self.cache.match_prefix(np.asarray(FAMILIES[family][:k], np.int64))
        assert m.length % self.page == 0 and m.length <= k
        assert m.full.size == m.length == m.swa.size

    @invariant()
    def consistent(self):
        self.cache.check_invariants(self.live)
        led = self.ledger
        led.apply(self.cache.drain_events())
        assert not led.problems, led.problems[:3]
        for node in self.cache.nodes.values():
            if node is not self.cache.root:
                assert all(led.owner["full"].get(x) == node.owner for x in node.full.tolist()), node
                if node.swa is not None:
                    assert all(led.owner["swa"].get(x) == node.owner for x in node.swa.tolist()), node
        for r in self.live:
            s = r.slots
            assert all(led.owner["full"].get(x) == r.owner for x in s.full[r.protected:s.length].tolist())
            ev = max(r.protected, s.swa_evicted)
            assert all(led.owner["swa"].get(x) == r.owner for x in s.swa[ev:s.length].tolist())
        held = {o for pool in led.owner.values() for o in pool.values()}
        assert held <= {n.owner for n in self.cache.nodes.values()} | {r.owner for r in self.live}
        free_full, free_swa = self.alloc.free_pages()
        assert free_full.size <= self.alloc.full_size // self.page
        assert free_swa.size <= self.alloc.swa_size // self.page


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _machine(page, order, behaviour=SGLANG_0_5_23):
    cls = type(f"Machine_p{page}_{order}", (CacheMachine,), {"page": page, "order": order, "behaviour": behaviour})
    case = cls.TestCase
    case.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])
    return case


TestMachinePage1Lifo = _machine(1, "lifo")
TestMachinePage1Fifo = _machine(1, "fifo")
TestMachinePage16Lifo = _machine(16, "lifo")
TestMachinePage16Fifo = _machine(16, "fifo")
TestMachineFixedPage1 = _machine(1, "fifo", FIXED)


# --------------------------------------------------------------------------- workload through the cache

@pytest.mark.parametrize("page,order", [(1, "fifo"), (16, "lifo")])
def test_a_sharing_workload_through_the_cache(page, order):
    """A generated workload with system prompts and conversations, served by a minimal loop (admit,
    prefill, decode with out-of-window frees, finish; later turns after their previous turn): prefixes
    are hit, the ledger fed by the events agrees with the tree, invariants hold throughout."""
    from simulator.scenario import parse_scenario
    from simulator.scheduling.workload import make_requests

    sc = parse_scenario('[model]\npreset = "gpt-oss-20b"\n[pool]\nfull_size = 4096\n[workload]\nrequests = 6\n'
                        'prompt_len = { dist = "uniform", min = 20, max = 60 }\noutput_len = 20\n'
                        'system_prompts = 2\nsystem_prompt_len = 48\nshare = 0.8\nturns = 3\n')
    specs = make_requests(sc.workload, np.random.default_rng(1))
    window = 32
    alloc = HybridAllocator(2048 // page * page, 1536 // page * page, page, order)
    cache = PrefixCache(alloc, window, SGLANG_0_5_23)
    ledger = OwnershipLedger(page, alloc.full_size // page, alloc.swa_size // page)
    finished: set = set()
    hits = 0
    pending = list(specs)
    while pending:
        ready = [s for s in pending if s.turn <= 1 or (s.conversation, s.turn - 1) in finished]
        for spec in ready[:3]:
            pending.remove(spec)
            r = CachedRequest(spec.uid, RequestSlots(spec.total_len), spec.tokens())
            hits += cache.admit(r, spec.prompt_len - 1).length
            ledger.apply(cache.drain_events())
            for n in [spec.prompt_len - r.slots.length] + [1] * spec.output_len:
                ledger.apply(cache.drain_events())          # the frees before the allocation they allow
                old = r.slots.length
                alloc.extend(r.slots, n)
                ledger.allocated("full", r.slots.full[old:old + n], r.owner)
                ledger.allocated("swa", r.slots.swa[old:old + n], r.owner)
                cache.free_out_of_window(r, r.slots.length - window - page)
                cache.check_invariants([r])
            with cache.free_group():
                cache.cache_finished(r, spec.total_len - 1)
            ledger.apply(cache.drain_events())
            finished.add((spec.conversation, spec.turn))
            cache.check_invariants([])
        cache.evict(swa_tokens=64)          # pressure on the SWA side: tombstones
        ledger.apply(cache.drain_events())
        assert not ledger.problems, ledger.problems[:3]
    assert hits > 0
    assert any(n.tombstone for n in cache.nodes.values()) or page > 1
    cache.evict(full_tokens=10**9)
    ledger.apply(cache.drain_events())
    cache.check_invariants([])
    assert len(cache.nodes) == 1 and not ledger.owner["full"] and not ledger.owner["swa"] and not ledger.problems
