"""The checker classifies each kind of difference, naming step, backend, layer, sub-pool, slot and owners."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from cuda_path.pool import TaggedKVPool
from simulator.scheduling.batch import BatchTruth
from simulator.oracle.checker import Checker, LayerWrite
from simulator.oracle.kvrows import pad_tags
from simulator.scenario.models import KVGeometry, Model
from simulator.memory.pool import KVLengthMismatch
from simulator.records import Owner
from simulator.oracle.reference import ReferencePool

E = np.zeros(0, dtype=np.int64)
MODEL = Model("t", ("swa", "full"), window=4, full=KVGeometry(1, 16, 16), swa=KVGeometry(1, 16, 16))
LAYER = {"swa": 0, "full": 1}


def truth(tags, full, swa, freed_swa=E, evicted=E):
    a = lambda x: np.asarray(x, dtype=np.int64)
    return BatchTruth(tags=a(tags), full_slots=a(full), swa_slots=a(swa), freed_full=E, freed_swa=a(freed_swa),
                      evicted_swa=a(evicted), mapping_changed=E)


class Rig:
    def __init__(self, skip=0):
        self.ref = ReferencePool(17, 9)
        self.pool = TaggedKVPool(MODEL, 17, 9, skip_index=skip)
        self.checker = Checker(self.ref, lambda t: Owner(t, 0 if t > 0 else None, t - 1 if t > 0 else None),
                               reserved=np.array([0]))

    def step(self, n, tr, targets: dict[str, list[int]]):
        self.ref.apply(tr)
        writes = []
        for kind, target in targets.items():
            loc = torch.tensor(target, dtype=torch.int64)
            tags = pad_tags(torch.from_numpy(tr.tags), len(target))
            k, v = self.pool.make_rows(tags, LAYER[kind], kind)
            try:
                self.pool.store(kind, 0, loc, k[: len(target)], v[: len(target)])
                writes.append(LayerWrite(LAYER[kind], kind, 0, loc, None))
            except KVLengthMismatch as e:
                writes.append(LayerWrite(LAYER[kind], kind, 0, None, str(e)))
        return self.checker.check(n, "flashinfer", self.pool, tr, writes, (0,))


@pytest.fixture
def rig():
    r = Rig()
    fs, counts = r.step(0, truth([1, 2, 3], [1, 2, 3], [1, 2, 3]), {"full": [1, 2, 3], "swa": [1, 2, 3]})
    assert fs == [] and sum(counts.values()) == 0
    return r


def classes(fs):
    return sorted((f.kind, f.cls, f.slot) for f in fs)


def test_correct_writes_are_clean(rig):
    fs, _ = rig.step(1, truth([4, 5], [4, 5], [4, 5]), {"full": [4, 5], "swa": [4, 5]})
    assert fs == []


def test_row_sent_to_padding_slot(rig):
    fs, counts = rig.step(1, truth([4, 5], [4, 5], [4, 5]), {"full": [4, 0], "swa": [4, 5]})
    assert classes(fs) == [("full", "padding_slot", 5)]
    f = fs[0]
    assert (f.step, f.backend, f.layer, f.expected.tag, f.observed.tag) == (1, "flashinfer", 1, 5, 0)
    assert counts["padding_slot"] == 1


def test_live_slot_clobbered_and_own_slot_missed(rig):
    fs, _ = rig.step(1, truth([4, 5], [4, 5], [4, 5]), {"full": [4, 5], "swa": [2, 5]})
    assert classes(fs) == [("swa", "clobbered", 2), ("swa", "missed", 4)]
    clob = next(f for f in fs if f.cls == "clobbered")
    assert clob.expected.tag == 2 and clob.observed.tag == 4


def test_padding_row_into_live_slot_is_clobbered(rig):
    # three rows, the last one padding (tag -1), sent to live slot 1
    fs, _ = rig.step(1, truth([4, 5], [4, 5], [4, 5]), {"full": [4, 5, 0], "swa": [4, 5, 1]})
    assert classes(fs) == [("swa", "clobbered", 1)]
    assert fs[0].observed.tag == -1 and fs[0].observed.label == "padding"


def test_a_slot_two_tokens_of_one_step_own_may_hold_either(rig):
    # a double hand-out (R3's stale mapping): tokens 4 and 5 both own SWA slot 4. The reference keeps the later
    # token; a GPU store of duplicate indices may keep either. Here the earlier token's row lands last, as it
    # may on a GPU: the slot holds one of the step's own writes, no write finding (its reads are the read check's)
    tr = truth([4, 5], [4, 5], [4, 4])
    rig.ref.apply(tr)
    writes = []
    for kind, target in {"full": [4, 5], "swa": [4, 4]}.items():
        loc = torch.tensor(target, dtype=torch.int64)
        k, v = rig.pool.make_rows(pad_tags(torch.from_numpy(tr.tags), 2), LAYER[kind], kind)
        order = [1, 0] if kind == "swa" else [0, 1]
        rig.pool.store(kind, 0, loc[order], k[order], v[order])
        writes.append(LayerWrite(LAYER[kind], kind, 0, loc, None))
    fs, counts = rig.checker.check(1, "flashinfer", rig.pool, tr, writes, (0,))
    assert fs == [] and sum(counts.values()) == 0
    # a row none of the slot's tokens wrote landing there last (a padding row) is still a finding
    tr = truth([6, 7], [6, 7], [6, 6])
    rig.ref.apply(tr)
    tags = pad_tags(torch.from_numpy(tr.tags), 3)
    k, v = rig.pool.make_rows(tags, LAYER["full"], "full")
    rig.pool.store("full", 0, torch.tensor([6, 7, 0]), k, v)
    k, v = rig.pool.make_rows(tags, LAYER["swa"], "swa")
    rig.pool.store("swa", 0, torch.tensor([6, 6, 6]), k, v)
    writes = [LayerWrite(LAYER["full"], "full", 0, torch.tensor([6, 7, 0]), None),
              LayerWrite(LAYER["swa"], "swa", 0, torch.tensor([6, 6, 6]), None)]
    fs, _ = rig.checker.check(2, "flashinfer", rig.pool, tr, writes, (0,))
    assert classes(fs) == [("swa", "clobbered", 6)] and fs[0].observed.tag == -1


def test_write_into_evicted_slot(rig):
    fs, _ = rig.step(1, truth([4, 5], [4, 5], [4, 5], freed_swa=[1], evicted=[1]), {"full": [4, 5], "swa": [1, 5]})
    assert classes(fs) == [("swa", "evicted_slot", 1), ("swa", "missed", 4)]
    assert "evicted" in next(f for f in fs if f.cls == "evicted_slot").message


def test_out_of_range_is_caught_before_the_write_and_not_counted_twice(rig):
    fs, counts = rig.step(1, truth([4, 5], [4, 5], [4, 5]), {"full": [4, 99], "swa": [4, -7]})
    assert classes(fs) == [("full", "out_of_range", 99), ("swa", "out_of_range", -7)]
    assert counts["missed"] == 0
    # the pool's rows did not move: slot 4 was written, nothing else
    k, _ = rig.pool.read_tags("full", torch.tensor([4, 5]))
    assert k[0].tolist() == [4, 0]


def test_length_mismatch_is_recorded_and_the_run_goes_on(rig):
    # one row of K and V, two indices: the store raises before writing anything
    tr = truth([6], [6], [6])
    rig.ref.apply(tr)
    k, v = rig.pool.make_rows(torch.tensor([6]), 0, "swa")
    with pytest.raises(KVLengthMismatch, match=r"Size mismatch: expected .*1.* but got 2"):
        rig.pool.store("swa", 0, torch.tensor([6, 0]), k, v)
    fs, counts = rig.checker.check(1, "triton", rig.pool, tr, [LayerWrite(0, "swa", 0, None, "Size mismatch: x")], (0,))
    assert [(f.cls, f.slot, f.layer, f.backend) for f in fs] == [("length_mismatch", -1, 0, "triton")]
    assert counts["missed"] == 0


def test_first_finding_per_backend_is_earliest(rig):
    rig.step(1, truth([4, 5], [4, 5], [4, 5]), {"full": [4, 0], "swa": [4, 5]})
    first = rig.checker.first["flashinfer"]
    assert (first.step, first.cls) == (1, "padding_slot")
