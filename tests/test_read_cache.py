"""cuda_path/read_cache.py's vectorised pieces against the step-by-step formulas they replaced, and its decode
shortcuts against its general path (exact integers)."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cuda_path.read_cache import _EMPTY, IncrementalReads, _gather, _joined, _Kind
from helpers import scenario


def _set_owners(k, rid, pos):
    """A kind's owners from request ids (-1: none) and positions, as two arrays (the formulas' terms)."""
    k.own[:] = np.where(np.asarray(rid) >= 0, (np.asarray(rid) << 32) | np.asarray(pos), -1)


def _rid(k):
    return np.where(k.own >= 0, k.own >> 32, -1)


def _pos(k):
    return k.own & 0xFFFFFFFF


def _kind_with_owners(rng, rows=200, reqs=12):
    k = _Kind(rows)
    k.grow(reqs)
    _set_owners(k, np.where(rng.random(rows) < 0.7, rng.integers(0, reqs, rows), -1), rng.integers(0, 50, rows))
    k.dlo[:reqs], k.dhi[:reqs] = 0, rng.integers(10, 60, reqs)
    return k


def test_joined_cut_equals_the_cuts_one_by_one():
    rng = np.random.default_rng(7)
    for _ in range(50):
        parts = [rng.integers(-3, 230, int(rng.integers(0, 40))) for _ in range(int(rng.integers(1, 4)))]
        a = _kind_with_owners(np.random.default_rng(1))
        b = _kind_with_owners(np.random.default_rng(1))
        for p in parts:
            a.cut(p)
        b.cut(_joined(parts))
        assert np.array_equal(a.own, b.own) and np.array_equal(a.dhi, b.dhi)
    assert _joined([_EMPTY, _EMPTY]) is _EMPTY
    assert _joined([np.array([3, 4]), _EMPTY]).tolist() == [3, 4]


@pytest.mark.parametrize("low, high", [(0, 200), (-3, 230)])    # every slot in range (no mask), some out
def test_cut_equals_the_masked_formula(low, high):
    rng = np.random.default_rng(11)
    cut_some = 0
    for _ in range(50):
        slots = rng.integers(low, high, int(rng.integers(1, 60)))
        k = _kind_with_owners(np.random.default_rng(2))
        rid, pos, dhi = _rid(k), _pos(k), k.dhi.copy()
        s = slots[(slots >= 0) & (slots < rid.shape[0])]
        hit = s[rid[s] >= 0]
        np.minimum.at(dhi, rid[hit], pos[hit])
        rid[hit] = -1
        k.cut(slots)
        assert _rid(k).tolist() == rid.tolist() and k.dhi.tolist() == dhi.tolist()
        cut_some += int(hit.size > 0)
    assert cut_some > 40


def test_cut_ends_a_range_only_at_its_own_positions():
    k = _Kind(10)
    k.grow(2)
    k.dlo[:2], k.dhi[:2] = (5, 0), (9, 4)           # request 0: [5, 9) (a sliding window), request 1: [0, 4)
    _set_owners(k, [0, 0, 0, 1, 1, -1, -1, -1, -1, -1], [3, 6, 8, 2, 0, 0, 0, 0, 0, 0])
    k.cut(np.array([0]))                            # request 0's position 3: below its range, ends nothing
    assert k.dhi[:2].tolist() == [9, 4] and _rid(k)[0] == -1
    k.cut(np.array([2, 4]))                         # request 0's position 8, request 1's position 0
    assert k.dhi[:2].tolist() == [8, 0] and _rid(k)[:5].tolist() == [-1, 0, -1, 1, -1]
    k.cut(np.array([1, 3]))                         # position 6 (in [5, 8)), position 2 (past request 1's [0, 0))
    assert k.dhi[:2].tolist() == [6, 0] and (k.own == -1).all()
    rng = np.random.default_rng(5)                  # and in general: the masked formula, positions below lo left out
    for _ in range(30):
        k = _kind_with_owners(np.random.default_rng(3))
        k.dlo[:12] = rng.integers(0, 30, 12)
        slots = rng.integers(-3, 230, 40)
        rid, pos, dhi = _rid(k), _pos(k), k.dhi.copy()
        s = slots[(slots >= 0) & (slots < rid.shape[0])]
        hit = s[rid[s] >= 0]
        inside = pos[hit] >= k.dlo[rid[hit]]
        np.minimum.at(dhi, rid[hit][inside], pos[hit][inside])
        rid[hit] = -1
        k.cut(slots)
        assert _rid(k).tolist() == rid.tolist() and k.dhi.tolist() == dhi.tolist()


def test_gather_per_entry_arrays_equal_the_old_formulas():
    rng = np.random.default_rng(3)
    n = 9
    seq = rng.integers(0, 30, n)
    first = np.minimum(rng.integers(0, 35, n), seq + 3)
    slots = [SimpleNamespace(full=rng.integers(0, 500, int(s))) for s in seq]
    tag_bases, rids = rng.integers(0, 10_000, n), rng.integers(0, 100, n)
    lens, indptr, fidx, row_of, pos, want, rid_of = IncrementalReads()._gather(slots, seq, first, {}, tag_bases, rids)
    assert lens.tolist() == np.maximum(seq - first, 0).tolist()
    general = _gather(slots, seq, first, lens)
    assert [a.tolist() for a in general] == [a.tolist() for a in (lens, indptr, fidx, row_of, pos)]
    old_row = np.repeat(np.arange(n), lens)
    old_pos = np.arange(fidx.shape[0], dtype=np.int64) - indptr[:-1][old_row] + first[old_row]
    assert row_of.tolist() == old_row.tolist() and pos.tolist() == old_pos.tolist()
    assert want.tolist() == (tag_bases[old_row] + old_pos).tolist()
    assert rid_of.tolist() == rids[old_row].tolist()
    assert fidx.tolist() == np.concatenate([s.full[a:b] for s, a, b in zip(slots, first, seq) if b > a]).tolist()
    assert int(lens.sum()) == fidx.shape[0] > 0


def test_one_entry_gather_equals_the_general_one():
    rng = np.random.default_rng(5)
    n = 7
    seq = rng.integers(1, 40, n).astype(np.int64)
    slots = [SimpleNamespace(full=rng.integers(0, 500, 40)) for _ in range(n)]
    tag_bases, rids = rng.integers(0, 10_000, n), rng.integers(0, 100, n)
    fast, slow = IncrementalReads(), IncrementalReads(fast=False)
    a = fast._gather(slots, seq, seq - 1, {}, tag_bases, rids)
    b = slow._gather(slots, seq, seq - 1, {}, tag_bases, rids)
    assert (fast.one_entry_gathers, slow.one_entry_gathers) == (1, 0)
    assert [x.dtype for x in a[:3]] == [x.dtype for x in b[:3]] == [np.dtype(np.int64)] * 3
    assert [x.tolist() for x in a] == [x.tolist() for x in b]


class _Twins:
    """The runner's read tables made twice, with the decode shortcuts and without: every table compared."""

    def __init__(self):
        self.fast, self.slow = IncrementalReads(), IncrementalReads(fast=False)
        self.tables = 0

    def reset(self):
        self.fast.reset()
        self.slow.reset()

    def note_step(self, ref, truth):
        self.fast.note_step(ref, truth)
        self.slow.note_step(ref, truth)

    def known_clean(self, table):
        return self.fast.known_clean(table)

    def table(self, *args):
        t, u = self.fast.table(*args), self.slow.table(*args)
        for kind in ("full", "swa"):
            for f in ("indptr", "indices", "start"):
                x, y = getattr(t.of(kind), f), getattr(u.of(kind), f)
                assert x.dtype == y.dtype and torch.equal(x, y), (self.tables, kind, f)
        assert self.fast.known_clean(t) == self.slow.known_clean(u)
        self.tables += 1
        return t


@pytest.mark.parametrize("name", ["a1-spec-partial-page-free", "a2-pd-decode-swa-tail", "smoke"])
def test_decode_shortcuts_give_the_general_paths_tables(name):
    from cuda_path.pool import TaggedKVPool
    from cuda_path.step import StepwiseExecutor
    from simulator.designs import load_design
    from simulator.core.eager import EagerExecutor
    from simulator.run import run_simulation

    sc = scenario(name)
    make = lambda f, s, skip: TaggedKVPool(sc.model, f, s, geometry="compact", skip_index=skip)  # noqa: E731
    ex = StepwiseExecutor(EagerExecutor())
    ex.runner.host_metadata = True
    twins = ex.runner._reads = _Twins()
    run_simulation(sc, load_design(sc.design), make, executor=ex)
    assert twins.tables > 10 and twins.fast.one_entry_gathers > 0 and twins.slow.one_entry_gathers == 0
    assert twins.fast.entries_skipped == twins.slow.entries_skipped > 0
    assert twins.fast.clean_tables == twins.slow.clean_tables > 0


def test_cut_both_equals_the_two_cuts():
    """One range end for a kind's slots and full slots at once (note_step's SWA kind) against the cuts one by one,
    with slots out of range, negative, repeated, of another dtype, and empty on either side."""
    rng = np.random.default_rng(13)
    empty32 = np.zeros(0, dtype=np.int32)
    for i in range(80):
        def pick():
            n = int(rng.integers(0, 50)) if i % 5 else 0
            s = rng.integers(-3, 260, n) if i % 3 else rng.integers(0, 200, n)
            return s.astype(np.int32) if i % 7 == 0 else s
        a, b = pick(), pick() if i % 4 else empty32
        ks = []
        for _ in range(2):
            k = _kind_with_owners(np.random.default_rng(i), rows=200)
            k.fown = np.where(np.random.default_rng(i + 1).random(240) < 0.6,
                              (np.random.default_rng(i + 2).integers(0, 12, 240) << 32)
                              | np.random.default_rng(i + 3).integers(0, 50, 240), -1)
            k.dlo[:12] = np.random.default_rng(i + 4).integers(0, 30, 12)
            ks.append(k)
        ks[0].cut(a)
        ks[0].cut(b, by_full=True)
        ks[1].cut_both(a, b)
        assert [x.tolist() for x in (ks[0].own, ks[0].fown, ks[0].dhi)] == \
               [x.tolist() for x in (ks[1].own, ks[1].fown, ks[1].dhi)], i


def test_unbanded_cut_equals_the_banded_one_where_ranges_start_at_0():
    """A full kind's cut (no comparison with dlo: 0 or -1 there) gives the banded formula's ends and owners."""
    rng = np.random.default_rng(17)
    for i in range(40):
        slots = rng.integers(-3, 230, int(rng.integers(0, 60)))
        a = _kind_with_owners(np.random.default_rng(i))
        b = _kind_with_owners(np.random.default_rng(i))
        b.banded = False
        a.dlo[:12] = b.dlo[:12] = np.random.default_rng(i).integers(-1, 1, 12)
        a.cut(slots)
        b.cut(slots)
        assert a.own.tolist() == b.own.tolist() and a.dhi.tolist() == b.dhi.tolist()


def test_owner_entries_round_trip():
    from cuda_path.read_cache import _owner, _POS
    rid = np.array([0, 1, 7, 2**31 - 1], dtype=np.int64)
    pos = np.array([0, 2**32 - 1, 5, 123456], dtype=np.int64)
    o = _owner(rid, pos)
    assert (o >= 0).all() and (o >> 32).tolist() == rid.tolist() and (o & _POS).tolist() == pos.tolist()


def test_extend_clean_finds_stale_entries_on_both_paths():
    """The in-range shortcut (count_nonzero before flatnonzero) against the masked path: stale entries, slots out
    of range and negative ones, one request with none."""
    ref = SimpleNamespace(live_tag={"full": np.arange(100, dtype=np.int64) + 1000})
    for idx in ([5, 6, 7, 9], [5, 6, 70, 9], [5, -1, 7, 150], []):
        idx = np.array(idx, dtype=np.int64)
        n = idx.shape[0]
        lens = np.array([n // 2, 0, n - n // 2], dtype=np.int64)
        indptr = np.concatenate([[0], np.cumsum(lens)])
        row_of = np.repeat(np.arange(3), lens)
        pos = np.arange(n, dtype=np.int64)
        want = np.where(np.arange(n) == 2, -5, idx + 1000)     # entry 2 stale (its tag not the live one)
        g = (lens, indptr, idx, row_of, pos, want, row_of + 3)
        first = np.zeros(3, dtype=np.int64)
        got = []
        for fast in (True, False):
            k = _Kind(100, banded=False)
            k.grow(8)
            ends, ok = IncrementalReads(fast=fast)._extend_clean(k, ref, "full", g, first, idx, None, 100)
            got.append((ends.tolist(), ok, k.own.tolist()))
        assert got[0] == got[1], idx


def test_a_transfers_rows_written_over_other_slots_end_clean_ranges():
    """A transfer whose rows land where it does not own (vLLM's groups share memory: a load or extract_hidden_states'
    store writes a block's rows in every group's view) ends the clean range of the token read there, as a free
    does: its next read is checked again."""
    from cuda_path.read_cache import _State
    from simulator.oracle.reference import ReferencePool
    from simulator.scheduling.batch import BatchTruth, Transfer

    E = np.zeros(0, dtype=np.int64)
    ref = ReferencePool(64, 64)
    reads = IncrementalReads()
    st = reads._states[(id(ref), 8)] = _State(ref, np.arange(64))
    st.grow(4)
    for k in (st.full, st.swa):
        _set_owners(k, np.full(64, -1), np.zeros(64, dtype=np.int64))
        k.own[5] = (3 << 32) | 10            # request 3's position 10 at slot 5, clean up to position 40
        k.dlo[3], k.dhi[3] = 0, 40
    rows = (np.array([5]), np.array([-1]), np.array([5]), np.array([-1]))
    reads.note_step(ReferencePool(64, 64), BatchTruth(E, E, E, E, E, E, E, transferred=Transfer(
        E, E, E, E, written=rows, target_only=True)))
    assert (st.full.dhi[3], st.full.own[5]) == (10, -1)
    assert (st.swa.dhi[3], st.swa.own[5]) == (10, -1)
