"""The oracle's device mirror is written when asked for, not at every step (simulator/oracle/reference.py):
what it holds when asked equals the host array, whatever the writes, their repeats and their order."""
import numpy as np
import torch

from simulator.oracle import reference as ref_mod
from simulator.scheduling.batch import BatchTruth, Transfer
from simulator.oracle.reference import ReferencePool

E = np.zeros(0, dtype=np.int64)


def _truth(full, swa, tags, transferred=None):
    return BatchTruth(tags=np.asarray(tags, dtype=np.int64), full_slots=np.asarray(full, dtype=np.int64),
                      swa_slots=np.asarray(swa, dtype=np.int64), freed_full=E, freed_swa=E, evicted_swa=E,
                      mapping_changed=E, transferred=transferred)


def _same(ref):
    for kind in ("full", "swa"):
        assert torch.equal(ref.expected_on[kind], torch.from_numpy(ref.expected[kind])), kind


def test_mirror_is_deferred_and_exact_on_ask():
    ref = ReferencePool(16, 8, mirror=True)
    ref.apply(_truth([3, 4, 5], [1, 2, 3], [10, 11, 12]))
    assert ref._pending_n == 6                       # nothing written to the mirror yet
    assert int(ref._expected_on["full"][3]) == 0
    ref.apply(_truth([3, 9], [2, 7], [20, 21]))      # slot 3 (full) and 2 (swa) written again: the last wins
    _same(ref)
    assert ref._pending_n == 0
    assert ref.expected_on["full"].tolist()[3:6] == [20, 11, 12]
    assert ref.expected_on["swa"].tolist()[1:4] == [10, 20, 12]


def test_repeats_within_one_step_and_transfers_keep_order():
    ref = ReferencePool(32, 32, mirror=True)
    rng = np.random.default_rng(7)
    tag = 1
    for step in range(40):
        n = int(rng.integers(1, 12))
        full = rng.integers(0, 32, n)
        swa = rng.integers(0, 32, n)
        tags = np.arange(tag, tag + n)
        tag += n
        tr = None
        if step % 5 == 0:
            m = int(rng.integers(1, 6))
            tr = Transfer(rng.integers(0, 32, m), np.arange(tag, tag + m), rng.integers(0, 32, m),
                          np.arange(tag, tag + m))
            tag += m
        ref.apply(_truth(full, swa, tags, tr))
        if step % 7 == 3:
            _same(ref)
    _same(ref)


def test_pending_bound_flushes_without_an_ask(monkeypatch):
    monkeypatch.setattr(ref_mod, "MIRROR_PENDING_MAX", 5)
    ref = ReferencePool(16, 16, mirror=True)
    ref.apply(_truth([1, 2], [1, 2], [5, 6]))
    assert ref._pending_n == 4
    ref.apply(_truth([3], [3], [7]))                 # 6 pending > 5: written at once
    assert ref._pending_n == 0
    assert ref._expected_on["full"].tolist()[1:4] == [5, 6, 7]


def test_caller_arrays_changed_later_do_not_leak_into_the_mirror():
    ref = ReferencePool(8, 8, mirror=True)
    full, swa, tags = np.array([1, 2]), np.array([3, 4]), np.array([9, 8])
    ref.apply(_truth(full, swa, tags))
    full[:] = 7
    tags[:] = 0
    _same(ref)
    assert ref.expected_on["full"].tolist()[1:3] == [9, 8]


def test_cpu_reference_without_mirror_shares_the_host_array():
    ref = ReferencePool(8, 8)
    ref.apply(_truth([2], [3], [4]))
    assert ref._pending_n == 0
    assert ref.expected_on["full"].data_ptr() == torch.from_numpy(ref.expected["full"]).data_ptr()


def test_a_transfers_written_rows_change_what_a_live_slot_holds_not_who_owns_it():
    """An engine whose groups share memory (vLLM) writes a load's block in every group's view: owned rows are adopted
    (live, their tags), the other view's rows only change what the slot holds; a live slot so written reads as
    another token (its live tag), a free one stays free, and the device mirror follows."""
    ref = ReferencePool(16, 16, mirror=True)
    ref.apply(_truth([1, 2], [4, 5], [7, 8]))                 # swa 4 and 5 live, owned by tags 7 and 8
    owned = np.asarray([4, 5], dtype=np.int64)
    tr = Transfer(owned, np.asarray([30, 31]), E, E,
                  written=(owned, np.asarray([30, 31]), np.asarray([5, 6]), np.asarray([30, 31])))
    ref.apply(_truth(E, E, E, tr))
    assert ref.live["full"][[4, 5]].tolist() == [True, True] and ref.live_tag["full"][[4, 5]].tolist() == [30, 31]
    # swa 5 is live (tag 8) but now holds tag 30; swa 6 was free and stays free
    assert ref.live_tag["swa"][[4, 5, 6]].tolist() == [7, 30, 0] and not ref.live["swa"][6]
    assert ref.expected["swa"][[5, 6]].tolist() == [30, 31]
    _same(ref)
