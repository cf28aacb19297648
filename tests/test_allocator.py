"""Allocator invariants under random alloc / free / evict sequences (hypothesis)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simulator.memory.allocator import HybridAllocator, OutOfSlots, RequestSlots

ops = st.lists(
    st.one_of(
        st.tuples(st.just("new"), st.integers(1, 40)),
        st.tuples(st.just("grow"), st.integers(0, 7), st.integers(1, 12)),
        st.tuples(st.just("evict"), st.integers(0, 7), st.integers(0, 60)),
        st.tuples(st.just("free"), st.integers(0, 7)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, page_size=st.sampled_from([1, 2, 4]))
def test_random_sequences_keep_invariants(ops, page_size):
    alloc = HybridAllocator(full_size=64 * page_size, swa_size=48 * page_size, page_size=page_size)
    live: list[RequestSlots] = []
    for op in ops:
        try:
            if op[0] == "new":
                r = RequestSlots(200)
                alloc.extend(r, op[1])
                live.append(r)
            elif op[0] == "grow" and live:
                r = live[op[1] % len(live)]
                if r.length + op[2] <= r.capacity:
                    alloc.extend(r, op[2])
            elif op[0] == "evict" and live:
                r = live[op[1] % len(live)]
                alloc.evict_swa(r, op[2])
            elif op[0] == "free" and live:
                r = live.pop(op[1] % len(live))
                alloc.free(r)
        except OutOfSlots:
            pass
        alloc.check_invariants(live)
        # slot 0 (the reserved page) is never handed out, in either pool
        for r in live:
            assert (r.full[: r.length] >= page_size).all()
            assert (r.swa[r.swa_evicted: r.length] >= page_size).all()
            if page_size > 1:
                # a full slot and its SWA slot share their offset inside the page
                sl = slice(r.swa_evicted, r.length)
                assert ((r.full[sl] % page_size) == (r.swa[sl] % page_size)).all()
                assert r.swa_evicted % page_size == 0


def test_mapping_shape_and_sentinel():
    alloc = HybridAllocator(16, 8, 1)
    assert alloc.full_to_swa.dtype == np.int64
    assert alloc.full_to_swa.shape == (16 + 1 + 1,)
    assert alloc.full_to_swa[-1] == -1 and alloc.full_to_swa[0] == 0
    r = RequestSlots(4)
    full = alloc.extend(r, 4)
    assert full.tolist() == [1, 2, 3, 4]
    assert alloc.full_to_swa[full].tolist() == r.swa[:4].tolist()
    assert alloc.evict_swa(r, 2) == 2
    assert alloc.full_to_swa[full].tolist()[:2] == [0, 0]
    alloc.free(r)
    assert np.count_nonzero(alloc.full_to_swa[:-1]) == 0
    assert alloc.full_free == 16 and alloc.swa_free == 8


def test_eviction_is_page_aligned_and_frees_whole_pages():
    alloc = HybridAllocator(64, 32, 4)
    r = RequestSlots(40)
    alloc.extend(r, 13)                  # pages: 4 in each pool
    assert alloc.swa_used == 16
    assert alloc.evict_swa(r, 7) == 4    # rounded down to the page boundary 4
    assert r.swa_evicted == 4 and alloc.swa_used == 12
    assert alloc.evict_swa(r, 7) == 0    # idempotent
    alloc.extend(r, 3)                   # fills the last page without a new one
    assert alloc.swa_used == 12 and alloc.full_used == 16


def test_out_of_slots_is_an_error_not_a_corruption():
    alloc = HybridAllocator(8, 4, 1)
    r = RequestSlots(10)
    alloc.extend(r, 4)
    with pytest.raises(OutOfSlots):
        alloc.extend(r, 1)               # the SWA pool is full
    alloc.check_invariants([r])


@pytest.mark.parametrize("order", ["lifo", "fifo"])
def test_checked_push_refuses_repeats_and_free_pages_and_changes_nothing(order):
    alloc = HybridAllocator(8, 8, 1, free_order=order)
    s = RequestSlots(3)
    got = alloc.extend(s, 3)                           # pages 1, 2, 3 live
    assert got.tolist() == [1, 2, 3] and alloc._full.free == 5
    with pytest.raises(RuntimeError, match=r"double free of pages \[\]"):
        alloc._full.push(np.array([2, 3, 2]))          # all live, page 2 twice
    with pytest.raises(RuntimeError, match=r"double free of pages \[5\]"):
        alloc._full.push(np.array([1, 5]))             # page 5 is free
    with pytest.raises(RuntimeError, match=r"double free of pages \[0\]"):
        alloc._full.push(np.array([0]))                # the reserved page
    assert alloc._full.free == 5                       # nothing went in
    alloc._full.push(np.array([3, 1, 2]))              # the refused pages are still live: this free passes
    assert alloc._full.free == 8
    with pytest.raises(RuntimeError, match=r"double free of pages \[3\]"):
        alloc._full.push(np.array([3]))
