"""cuda_path/read_cache.py's vectorised pieces against the step-by-step formulas they replaced, and its decode
shortcuts against its general path (exact integers)."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cuda_path.read_cache import _EMPTY, IncrementalReads, _gather, _joined, _Kind
from helpers import scenario


def _kind_with_owners(rng, rows=200, reqs=12):
    k = _Kind(rows)
    k.grow(reqs)
    k.rid[:] = np.where(rng.random(rows) < 0.7, rng.integers(0, reqs, rows), -1)
    k.pos[:] = rng.integers(0, 50, rows)
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
        assert np.array_equal(a.rid, b.rid) and np.array_equal(a.dhi, b.dhi)
    assert _joined([_EMPTY, _EMPTY]) is _EMPTY
    assert _joined([np.array([3, 4]), _EMPTY]).tolist() == [3, 4]


@pytest.mark.parametrize("low, high", [(0, 200), (-3, 230)])    # every slot in range (no mask), some out
def test_cut_equals_the_masked_formula(low, high):
    rng = np.random.default_rng(11)
    cut_some = 0
    for _ in range(50):
        slots = rng.integers(low, high, int(rng.integers(1, 60)))
        k = _kind_with_owners(np.random.default_rng(2))
        rid, dhi = k.rid.copy(), k.dhi.copy()
        s = slots[(slots >= 0) & (slots < rid.shape[0])]
        hit = s[rid[s] >= 0]
        np.minimum.at(dhi, rid[hit], k.pos[hit])
        rid[hit] = -1
        k.cut(slots)
        assert k.rid.tolist() == rid.tolist() and k.dhi.tolist() == dhi.tolist()
        cut_some += int(hit.size > 0)
    assert cut_some > 40


def test_cut_ends_a_range_only_at_its_own_positions():
    k = _Kind(10)
    k.grow(2)
    k.dlo[:2], k.dhi[:2] = (5, 0), (9, 4)           # request 0: [5, 9) (a sliding window), request 1: [0, 4)
    k.rid[:] = [0, 0, 0, 1, 1, -1, -1, -1, -1, -1]
    k.pos[:] = [3, 6, 8, 2, 0, 0, 0, 0, 0, 0]
    k.cut(np.array([0]))                            # request 0's position 3: below its range, ends nothing
    assert k.dhi[:2].tolist() == [9, 4] and k.rid[0] == -1
    k.cut(np.array([2, 4]))                         # request 0's position 8, request 1's position 0
    assert k.dhi[:2].tolist() == [8, 0] and k.rid[:5].tolist() == [-1, 0, -1, 1, -1]
    k.cut(np.array([1, 3]))                         # position 6 (in [5, 8)), position 2 (past request 1's [0, 0))
    assert k.dhi[:2].tolist() == [6, 0] and (k.rid == -1).all()
    rng = np.random.default_rng(5)                  # and in general: the masked formula, positions below lo left out
    for _ in range(30):
        k = _kind_with_owners(np.random.default_rng(3))
        k.dlo[:12] = rng.integers(0, 30, 12)
        slots = rng.integers(-3, 230, 40)
        rid, dhi = k.rid.copy(), k.dhi.copy()
        s = slots[(slots >= 0) & (slots < rid.shape[0])]
        hit = s[rid[s] >= 0]
        inside = k.pos[hit] >= k.dlo[rid[hit]]
        np.minimum.at(dhi, rid[hit][inside], k.pos[hit][inside])
        rid[hit] = -1
        k.cut(slots)
        assert k.rid.tolist() == rid.tolist() and k.dhi.tolist() == dhi.tolist()


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
    from simulator.execute import EagerExecutor
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
