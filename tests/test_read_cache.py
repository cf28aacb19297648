"""cuda_path/read_cache.py's vectorised pieces against the step-by-step formulas they replaced (exact integers)."""
from types import SimpleNamespace

import numpy as np

from cuda_path.read_cache import _EMPTY, _gather, _joined, _Kind


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


def test_gather_per_entry_arrays_equal_the_old_formulas():
    rng = np.random.default_rng(3)
    n = 9
    seq = rng.integers(0, 30, n)
    first = np.minimum(rng.integers(0, 35, n), seq + 3)
    slots = [SimpleNamespace(full=rng.integers(0, 500, int(s))) for s in seq]
    tag_bases, rids = rng.integers(0, 10_000, n), rng.integers(0, 100, n)
    lens, indptr, fidx, row_of, pos, want, rid_of = _gather(slots, seq, first, {}, tag_bases, rids)
    old_row = np.repeat(np.arange(n), lens)
    old_pos = np.arange(fidx.shape[0], dtype=np.int64) - indptr[:-1][old_row] + first[old_row]
    assert row_of.tolist() == old_row.tolist() and pos.tolist() == old_pos.tolist()
    assert want.tolist() == (tag_bases[old_row] + old_pos).tolist()
    assert rid_of.tolist() == rids[old_row].tolist()
    assert fidx.tolist() == np.concatenate([s.full[a:b] for s, a, b in zip(slots, first, seq) if b > a]).tolist()
    assert int(lens.sum()) == fidx.shape[0] > 0
