"""The unified pool (simulator/memory/unified_pool.py): a state machine over its virtual / physical invariants at
page sizes 1 and 4, the exact U1 and U2 cases, the write door, and P7's design pair; and ``pool.unified`` in the
run loop (simulator/plugins/unified.py): validation, a compacting run that is clean, U2 on the page-table backends,
a broken compaction copy caught by the oracle, U1's run ending at the device-side assert."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from simulator.memory.allocator import OutOfSlots, RequestSlots
from simulator.engine_model.backends import BACKEND_SPECS
from simulator.designs import BUILTIN_DESIGNS, BoundaryContext
from simulator.engine_model.padding_convention import SLOT0
from simulator.scenario import PoolConfig
from simulator.memory.unified_pool import (BIND, MOVE, TOMBSTONE, UNBIND, IndexOutOfRange, PhysicalLoc, UnifiedPool,
                                           UnmarkedWriteLoc, check_physical_write_loc)
from simulator.engine_model.unified import UNIFIED_0_5_23, unified_bugs_of, with_unified_bug


# --------------------------------------------------------------------------- the state machine

class UnifiedPoolMachine(RuleBasedStateMachine):
    page_size = 1

    @initialize(full_cost=st.sampled_from([1, 2]), swa_cost=st.sampled_from([1, 3, 8]),
                pages=st.integers(12, 40))
    def setup(self, full_cost, swa_cost, pages):
        p = self.page_size
        self.pool = UnifiedPool(pages * (full_cost + swa_cost) * 4 * p, full_cost * p * 4, swa_cost * p * 4, p)
        self.reqs: list[RequestSlots] = []
        self.window = 3 * p
        # a shadow of each side's physical contents, rebuilt from the events only
        self.content = {"full": {}, "swa": {}}

    def _replay(self):
        for e in self.pool.drain_events():
            c = self.content[e.pool]
            if e.kind == BIND:
                for s, v in zip(e.slots.tolist(), e.peers.tolist()):
                    assert s not in c, f"{e.pool} slot {s} bound while it holds {c[s]}"
                    c[s] = v
            elif e.kind == MOVE:
                moved = {d: c.pop(s) for s, d in zip(e.slots.tolist(), e.peers.tolist())}
                assert not set(moved) & set(c), "compaction moved a page onto a live one"
                c.update(moved)
            elif e.kind in (UNBIND, TOMBSTONE):
                for s, v in zip(e.slots.tolist(), e.peers.tolist()):
                    assert c.pop(s) == v, "a free gave up a slot its virtual id did not hold"

    @rule(n=st.integers(1, 9))
    def admit(self, n):
        r = RequestSlots(64)
        try:
            self.pool.extend(r, n)
        except OutOfSlots:
            return
        self.reqs.append(r)

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 99), n=st.integers(1, 5))
    def grow(self, i, n):
        r = self.reqs[i % len(self.reqs)]
        if r.length + n > r.capacity:
            return
        try:
            self.pool.extend(r, n)
        except OutOfSlots:
            pass
        self.pool.evict_swa(r, r.length - self.window)

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 99), back=st.integers(1, 6))
    def truncate(self, i, back):
        r = self.reqs[i % len(self.reqs)]
        self.pool.truncate(r, max(r.swa_evicted, r.length - back, 1))

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 99), grouped=st.booleans())
    def finish(self, i, grouped):
        r = self.reqs.pop(i % len(self.reqs))
        with self.pool.free_group(grouped):
            self.pool.free(r)

    @rule(pin=st.lists(st.integers(0, 99), max_size=3))
    def compact(self, pin):
        window = [self.reqs[i % len(self.reqs)].full[self.reqs[i % len(self.reqs)].length - 1]
                  for i in pin] if self.reqs else []
        self.pool.set_inflight_forward(np.asarray(window, dtype=np.int64))
        pinned = sorted(self.pool.pinned)
        before = (self.pool.full.v2p[pinned].copy(), self.pool.swa.v2p[pinned].copy())
        self.pool.compact()
        assert (self.pool.full.v2p[pinned] == before[0]).all(), "compaction moved a pinned full page"
        assert (self.pool.swa.v2p[pinned] == before[1]).all(), "compaction moved a pinned SWA page"
        self.pool.set_inflight_forward(None)

    @invariant()
    def holds(self):
        if not hasattr(self, "pool"):
            return
        self.pool.check_invariants(self.reqs)
        self._replay()
        p = self.pool.page_size
        for name, side in (("full", self.pool.full), ("swa", self.pool.swa)):
            bound = np.flatnonzero(side.v2p[1:] > 0) + 1
            # the events' picture of every physical slot equals the page tables'
            want = {int(side.v2p[v]) * p + o: int(v) * p + o for v in bound for o in range(p)}
            assert self.content[name] == want, f"{name}: the events disagree with the page tables"
        # tombstones own nothing: a virtual page unbound SWA-side holds no SWA slot
        assert (self.pool.translate_kv_loc(np.flatnonzero(self.pool.swa.v2p < 0) * p, "swa") == 0).all()


class UnifiedPoolPaged(UnifiedPoolMachine):
    page_size = 4


TestUnifiedPool = UnifiedPoolMachine.TestCase
TestUnifiedPool.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestUnifiedPoolPaged = UnifiedPoolPaged.TestCase
TestUnifiedPoolPaged.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


# --------------------------------------------------------------------------- basics

def test_layout_follows_page_costs_and_scenario_key():
    # SWA pages cost 10x full pages: each side indexes the whole buffer from byte 0 (2,200 full pages, 220 SWA);
    # the bottom 100 bytes are the sink floor of both, so the full side's first page is 10, the SWA side's 1
    pool = UnifiedPool(2200 * 10, 10, 100, 1)
    assert (pool.full.num_pages, pool.full.min_page, pool.full.wm) == (2200, 10, 2199)
    assert (pool.swa.num_pages, pool.swa.min_page, pool.swa.wm) == (220, 1, 1)
    assert pool.num_virtual_ids == pool.full.num_pages
    assert pool.swa.v2p.shape[0] == pool.num_virtual_ids + 1      # 0.5.23: the full side's id space (+ sentinel)
    r = RequestSlots(8)
    assert pool.extend(r, 3).tolist() == [10, 11, 12]              # the first virtual ids: past the floor
    assert pool.full.v2p[[10, 11, 12]].tolist() == [2197, 2198, 2199]   # full grows down, bound ascending
    assert pool.swa.v2p[[10, 11, 12]].tolist() == [1, 2, 3]            # SWA grows up
    cfg = PoolConfig(full_size=64, swa_ratio=0.5, page_size=4, unified=True)
    u = UnifiedPool.from_pool_config(cfg, 8, 8)
    assert u.budget_bytes == (64 + 4) * 8 + (32 + 4) * 8 and u.page_size == 4
    assert PoolConfig(full_size=64).unified is False


def test_lazy_compaction_moves_toward_each_end_and_stops_at_the_window():
    pool = UnifiedPool(40, 1, 1, 1)                 # 40 pages a side, page 0 the sink
    rs = [RequestSlots(8) for _ in range(4)]
    for r in rs:
        pool.extend(r, 4)
    assert pool.full.v2p[rs[3].full[:4]].tolist() == [24, 25, 26, 27]
    assert pool.swa.v2p[rs[3].full[:4]].tolist() == [13, 14, 15, 16]
    pool.free(rs[0])
    pool.free(rs[2])
    pool.set_inflight_forward(rs[1].full[:4])       # the in-flight window: the walk stops at rs[1]'s pages
    # rs[3] (farthest from each end) moves into rs[0]'s holes at the end; rs[1] stops the walk
    assert pool.compact() == 8
    assert pool.full.v2p[rs[3].full[:4]].tolist() == [39, 38, 37, 36]
    assert pool.swa.v2p[rs[3].full[:4]].tolist() == [4, 3, 2, 1]
    assert pool.full.v2p[rs[1].full[:4]].tolist() == [32, 33, 34, 35]
    pool.set_inflight_forward(None)
    # the vacated pages and rs[2]'s holes now touch the watermarks: absorbed, nothing left to move
    assert pool.compact() == 0
    assert (pool.full.wm, pool.swa.wm, pool.full.holes, pool.swa.holes) == (31, 9, [], [])
    pool.check_invariants([rs[1], rs[3]])
    assert {e.kind for e in pool.events} >= {BIND, MOVE, UNBIND}


def test_an_urgent_flush_before_refusing():
    pool = UnifiedPool(13, 1, 1, 1)                 # an empty gap of 12 bytes: 6 pages a side
    a = RequestSlots(8)
    pool.extend(a, 6)
    pool.evict_swa(a, 3)                            # SWA holes 1..3; the gap is 0
    b = RequestSlots(8)
    # does not fit the gap, fits compacted: the SWA side packs its 3 survivors into the holes, then binds
    pool.extend(b, 1)
    assert pool.moves == 3 and pool.swa.v2p[a.full[3:6]].tolist() == [3, 2, 1]
    assert (pool.full.v2p[b.full[0]], pool.swa.v2p[b.full[0]]) == (6, 4)
    pool.check_invariants([a, b])
    with pytest.raises(OutOfSlots):
        pool.extend(RequestSlots(8), 1)
    assert pool.bytes_in_use() <= pool.budget_bytes


def test_write_door():
    pool = UnifiedPool(400, 4, 4, 1)
    r = RequestSlots(8)
    virt = pool.extend(r, 3)
    wl = pool.write_loc(virt, "swa")
    assert isinstance(wl, PhysicalLoc) and (check_physical_write_loc(wl, "swa") == wl.ids).all()
    with pytest.raises(UnmarkedWriteLoc):
        check_physical_write_loc(virt, "swa")       # virtual ids written as physical
    with pytest.raises(UnmarkedWriteLoc):
        check_physical_write_loc(wl, "full")


def test_translation_clamps_to_the_sink():
    pool = UnifiedPool(400, 4, 4, 4)
    r = RequestSlots(16)
    virt = pool.extend(r, 8)
    ids = np.asarray([-3, -1, 0, 10 ** 6, int(virt[0]), int(virt[5])])
    out = pool.translate_kv_loc(ids, "full")
    assert out[:4].tolist() == [0, 0, 0, 0] and (out[4:] > 0).all()


# --------------------------------------------------------------------------- U1 and U2

def _churn(behaviour, *, page_size=1):
    """Short requests, one after the other: the FIFO of virtual ids walks the full side's id space."""
    pool = UnifiedPool(2200 * 10 * page_size, 10 * page_size, 100 * page_size, page_size, behaviour)
    minted = []
    for _ in range(pool.num_virtual_ids):
        r = RequestSlots(2 * page_size)
        minted.append(int(pool.extend(r, page_size)[0]) // page_size)
        pool.free(r)
    return pool, minted


@pytest.mark.parametrize("page_size", [1, 4])
def test_u1_exact(page_size):
    bug = with_unified_bug("U1")
    assert unified_bugs_of(bug) == ("U1",) and unified_bugs_of(UNIFIED_0_5_23) == ()
    pool = UnifiedPool(2200 * 10 * page_size, 10 * page_size, 100 * page_size, page_size, bug)
    table = pool.swa.v2p.shape[0]
    assert table == pool.swa.num_pages + 1 == 221
    done = 0
    with pytest.raises(IndexOutOfRange) as e:
        while True:
            r = RequestSlots(2 * page_size)
            pool.extend(r, page_size)
            pool.free(r)
            done += 1
    f = e.value.finding
    # nothing fires before the first virtual page past the SWA table (ids start at the floor, 10): then the
    # bind is out of range
    assert done == table - pool.full.min_page == 211
    assert (f.where, f.index, f.length, f.token) == ("swa.v2p.bind", table, table, table * page_size)
    assert pool.findings == [f]
    # fixed (0.5.23): the whole id space, nothing recorded
    fixed, minted = _churn(UNIFIED_0_5_23, page_size=page_size)
    assert max(minted) == fixed.num_virtual_ids - 1 > table and fixed.findings == []


@pytest.mark.parametrize("page_size", [1, 4])
def test_u2_exact(page_size):
    for behaviour, expect in ((with_unified_bug("U2"), list(range(-page_size, 0))), (UNIFIED_0_5_23, [0] * page_size)):
        pool = UnifiedPool(4000, 4 * page_size, 4 * page_size, page_size, behaviour)
        r = RequestSlots(8 * page_size)
        virt = pool.extend(r, 3 * page_size)
        pool.evict_swa(r, page_size)                # the first page leaves the window: tombstoned
        assert pool.swa.v2p[virt[0] // page_size] == -1
        assert pool.translate_kv_loc(virt[:page_size], "swa").tolist() == expect
        wl = pool.write_loc(virt[:page_size], "swa")
        if expect[0] < 0:
            f = pool.findings[-1]
            assert f.index == -page_size and f.where == "swa.write" and "negative" in str(f)
        else:
            assert pool.findings == [] and wl.ids.tolist() == [0] * page_size
        # live pages translate the same either way
        assert (pool.translate_kv_loc(virt[page_size:], "swa") > 0).all()


# --------------------------------------------------------------------------- P7

def _ctx(mode, real, padded):
    return BoundaryContext(step=0, backend="triton", side="target", mode=mode, graph="eager", runner="eager",
                           page_size=1, num_token_non_padded=real, dp_padded_len=padded, padded_len=padded,
                           spec=BACKEND_SPECS["triton"], padding=SLOT0, loc_pad=0, swa_pad=0)


@pytest.mark.parametrize("mode", ["target_verify", "draft_extend"])
def test_p7_preplan_leaves_swa_loc_short_and_the_rebuild_does_not(mode):
    full_to_swa = torch.arange(64, dtype=torch.int64) + 100
    loc = torch.tensor([5, 6, 7, 8, 0, 0, 0, 0], dtype=torch.int64)   # 4 real tokens, DP-padded to 8
    ctx = _ctx(mode, 4, 8)
    state, fix = BUILTIN_DESIGNS["dots-eagle-preplan"](), BUILTIN_DESIGNS["dots-eagle-preplan-rebuild"]()
    wl = state.make_write_loc(loc, state.translate(loc, full_to_swa, ctx), ctx)
    assert wl.swa_loc.shape[0] == 4 < wl.loc.shape[0] == 8            # #29460's slice lets it through
    wl = fix.make_write_loc(loc, fix.translate(loc, full_to_swa, ctx), ctx)
    assert wl.swa_loc.shape[0] == wl.loc.shape[0] == 8
    assert wl.swa_loc.tolist() == full_to_swa[loc].tolist()
    # no DP padding, or not a pre-planned forward: both states agree
    for c in (_ctx(mode, 8, 8), _ctx("decode", 4, 8)):
        assert state.translate(loc, full_to_swa, c).tolist() == fix.translate(loc, full_to_swa, c).tolist()


def test_p7_end_to_end_on_paths_spec():
    """scenarios/paths-spec.toml (EAGLE, DP 2 with padding), 40 steps: the state's short swa_loc is a
    length_mismatch at the store on every backend run; the rebuild is clean."""
    from tests.helpers import scenario, simulate

    sc = scenario("paths-spec").with_overrides(max_steps=40, backends=("triton", "flashinfer"))
    bad = simulate(sc, "dots-eagle-preplan")
    for b in ("triton", "flashinfer"):
        st = bad.backends[b]
        assert st.findings["length_mismatch"] > 0 and st.first_finding.cls == "length_mismatch", b
        assert sum(st.findings.values()) == st.findings["length_mismatch"]
    good = simulate(sc, "dots-eagle-preplan-rebuild")
    assert {b: s.total for b, s in good.backends.items()} == {"triton": 0, "flashinfer": 0}


# --------------------------------------------------------------------------- pool.unified in the run loop

def _run_unified(name, design, backends, max_steps=None):
    from cuda_path.pool import TaggedKVPool
    from simulator.designs import load_design
    from simulator.run import run_simulation
    from tests.helpers import scenario

    sc = scenario(name).with_overrides(design=design, backends=backends)

    def make(full_rows, swa_rows, skip):
        return TaggedKVPool(sc.model, full_rows, swa_rows, device="cpu", geometry="compact", store_impl="torch",
                            skip_index=skip)
    return run_simulation(sc, load_design(sc.design), make, max_steps=max_steps)


def _summary(r):
    return {b: (s.writes, {c: n for c, n in s.findings.items() if n},
                None if s.first_finding is None else (s.first_finding.step, s.first_finding.cls))
            for b, s in r.backends.items()}


def test_unified_scenario_fields_are_validated():
    from simulator.scenario import ScenarioError
    from tests.helpers import tiny

    base = ('name = "u"\n[model]\npreset = "gpt-oss-20b"\nnum_layers = 2\n[pool]\nfull_size = 512\nunified = {u}\n'
            '[workload]\nrequests = 2\n{engine}')
    assert tiny(base.format(u="true", engine="")).pool.unified is True
    with pytest.raises(ScenarioError, match=r"pool\.unified"):
        tiny(base.format(u='"yes"', engine=""))
    for engine, field in (("[engine]\noverlap = true\n", "engine.overlap"),
                          ("[engine]\nradix_cache = true\n", "engine.radix_cache"),
                          ("[engine.speculative]\nnum_draft_tokens = 3\n", "engine.speculative")):
        with pytest.raises(ScenarioError, match=rf"{field}: cannot be on with pool\.unified = true"):
            tiny(base.format(u="true", engine=engine))
        tiny(base.format(u="false", engine=engine))                 # the static pool takes them
    with pytest.raises(ScenarioError, match=r"pool\.unified: needs both full and SWA layers"):
        tiny(base.format(u="true", engine="").replace('preset = "gpt-oss-20b"\nnum_layers = 2', 'layers = "SS"\nwindow = 16'))


def test_unified_run_compacts_and_is_clean_and_u2_escapes_on_page_table_backends():
    """scenarios/u2-unified-tombstone-escape.toml, 70 steps: the pool compacts (377 page moves, none of the
    in-flight window); 0.5.23 is clean; with U2 the tombstoned -1 reaches flashattention's whole-row SWA page
    table (first at step 49), never triton's window indices."""
    fixed = _run_unified("u2-unified-tombstone-escape", "sglang-0.5.23-unified", ("triton", "flashattention"), 70)
    assert len(fixed.steps) == 70
    assert _summary(fixed) == {"triton": (280, {}, None), "flashattention": (280, {}, None)}
    u = fixed.info.extra["unified"]
    assert (u["moves"], u["pinned_moves"], u["read_door_findings"], u["died"]) == (377, 0, 0, None)
    assert (u["num_virtual_ids"], u["swa_table"]) == (1538, 1539)
    bug = _run_unified("u2-unified-tombstone-escape", "sglang-unified-pre-35933", ("triton", "flashattention"), 70)
    assert _summary(bug) == {"triton": (280, {}, None),
                             "flashattention": (280, {"out_of_range": 22}, (49, "out_of_range"))}
    f = next(f for f in bug.findings if f.backend == "flashattention")
    assert (f.kind, f.slot) == ("swa", -1) and "read_table of the whole row" in f.message


def test_a_broken_compaction_copy_is_caught(monkeypatch):
    """If the pools under test did not get the moved pages' rows, every moved live slot is a stale_read."""
    import simulator.plugins.unified as ur

    orig = ur.UnifiedPlan._move

    def move_oracle_only(self, kind, src, dst):
        stores = [(p, p.store) for side in self.run.sides for p in side.pools.values()]
        for p, _ in stores:
            p.store = lambda *a, **k: None
        try:
            orig(self, kind, src, dst)
        finally:
            for p, st in stores:
                p.store = st
    monkeypatch.setattr(ur.UnifiedPlan, "_move", move_oracle_only)
    r = _run_unified("u2-unified-tombstone-escape", "sglang-0.5.23-unified", ("triton",), 70)
    assert _summary(r) == {"triton": (280, {"stale_read": 377}, (24, "stale_read"))}


def test_u1_run_dies_at_the_first_virtual_page_past_the_swa_table():
    """scenarios/u1-unified-swa-table.toml: the SWA table has 615 entries (614 pages and the sentinel), the full
    side mints ids 5 .. 3,073; the run ends at step 28, at the bind of virtual page 615, one out_of_range per
    backend."""
    r = _run_unified("u1-unified-swa-table", "sglang-unified-pre-37560", ("triton", "musa"))
    assert len(r.steps) == 28
    assert _summary(r) == {"triton": (168, {"out_of_range": 1}, (28, "out_of_range")),
                           "musa": (168, {"out_of_range": 1}, (28, "out_of_range"))}
    assert r.info.extra["unified"]["died"] == {"step": 28, "where": "swa.v2p.bind", "index": 615, "length": 615,
                                               "token": 615}
