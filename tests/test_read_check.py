"""Read checking (issue 11 point 1): the slots a forward's attention reads, by the backend's read table,
against the oracle's ownership at the time of the read; ``stale_read`` findings, exact counts.

The hand-checked scenario: one request, prompt 8, output 12, window 4, layers SFSF (SWA layers 0 and 2),
page size 1, eager, one backend. Mid-2026 eviction frees SWA slots in decode when ``decoded % 4 == 1``,
against the request's length L before the new token: up to L - 4. So after the extend (step 0) and the
first decode (step 1), positions [0, 5) are evicted at step 2, [0, 9) at step 6, [0, 13) at step 10.
A decode token at position L reads the window [L - 3, L]: the eviction keeps one position more than that,
and the read check is exact all the same (simulator/oracle/read_rules.py): an entry outside the window is a
``stale_read`` whatever its slot holds.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from simulator.designs import Design, KVWriteLoc, ReadIds, ReadTable, read_ranges
from simulator.records import FINDING_CLASSES

from helpers import simulate, tiny

ONE = """
seed = 1
backends = ["flashinfer"]
[model]
layers = "SFSF"
window = 4
[pool]
full_size = 256
[workload]
requests = 1
arrival = "all_at_once"
prompt_len = { dist = "choice", values = [8] }
output_len = { dist = "choice", values = [12] }
[engine]
cuda_graph = false
chunked_prefill_size = 64
"""


def stale(r):
    return [f for f in r.findings if f.cls == "stale_read"]


class WholePrefixSWA(Design):
    """A read-side bug: SWA layers read the whole prefix through the mapping (the window is ignored):
    evicted positions' entries were cleared to 0, so they read the sink slot."""

    name = "test-whole-prefix-swa"

    def read_ids(self, req_to_token, seq_lens, extend_lens, full_to_swa, ctx):
        full = read_ranges(req_to_token, torch.zeros_like(seq_lens), seq_lens)
        return ReadTable(full=full, swa=ReadIds(full.indptr, full_to_swa[full.indices], full.start))


class PastWindow(Design):
    """The SWA read range starts ``extra`` positions before the window."""

    name = "test-past-window"
    extra = 1

    def read_ids(self, req_to_token, seq_lens, extend_lens, full_to_swa, ctx):
        t = super().read_ids(req_to_token, seq_lens, extend_lens, full_to_swa, ctx)
        start = (seq_lens - extend_lens + 1 - ctx.window - self.extra).clamp(min=0)
        w = read_ranges(req_to_token, start, seq_lens)
        return ReadTable(full=t.full, swa=ReadIds(w.indptr, full_to_swa[w.indices], w.start))


class TwoPastWindow(PastWindow):
    name = "test-two-past-window"
    extra = 2


def run(design: Design, text: str = ONE):
    from cuda_path.pool import TaggedKVPool
    from simulator.run import run_simulation

    sc = tiny(text)

    def make(full_rows, swa_rows, skip):
        return TaggedKVPool(sc.model, full_rows, swa_rows, geometry="compact", skip_index=skip)

    return run_simulation(sc, design, make)


def test_stale_read_is_a_finding_class():
    assert "stale_read" in FINDING_CLASSES


def test_the_default_read_table_is_clean():
    r = run(Design())
    assert len(r.steps) == 13
    assert r.total_findings == 0


def test_reading_one_position_before_the_window_is_a_finding_though_eviction_keeps_its_slot():
    # SGLang frees up to prefix_len - window: the token at L reads [L - 3, L], L - 4 is still held (its slot live,
    # holding its own token): the read is outside the window all the same, once per decode step
    r = run(PastWindow())
    got = [(f.step, f.expected.position, f.slot, f.observed.label) for f in stale(r)]
    assert got == [(s, 3 + s, slot, f"req 0 pos {3 + s}")
                   for s, slot in zip(range(1, 13), (5, 6, 7, 8, 9, 1, 2, 3, 4, 6, 7, 8))]
    assert r.backends["flashinfer"].findings["stale_read"] == 12 and r.total_findings == 12
    assert stale(r)[0].message == ("req 0 pos 4 reads swa slot 5 at layer 0 (and 1 more swa layers reading the "
                                   "same table): position 4 is outside its window [5, 9)")


def test_two_positions_before_the_window_are_two_findings_per_decode_held_or_evicted():
    r = run(TwoPastWindow())
    got = [(f.step, f.expected.position, f.slot) for f in stale(r)]
    # the slot two before is the sink right after each eviction (steps 2, 6, 10), else still held
    assert got == [(1, 3, 4), (1, 4, 5), (2, 4, 0), (2, 5, 6), (3, 5, 6), (3, 6, 7), (4, 6, 7), (4, 7, 8),
                   (5, 7, 8), (5, 8, 9), (6, 8, 0), (6, 9, 1), (7, 9, 1), (7, 10, 2), (8, 10, 2), (8, 11, 3),
                   (9, 11, 3), (9, 12, 4), (10, 12, 0), (10, 13, 6), (11, 13, 6), (11, 14, 7), (12, 14, 7),
                   (12, 15, 8)]
    assert r.backends["flashinfer"].findings["stale_read"] == 24 and r.total_findings == 24
    f = stale(r)[2]
    # the window comes first: the reason is the table's shape, not the sink it happens to reach
    assert f.message == ("req 0 pos 4 reads swa slot 0 at layer 0 (and 1 more swa layers reading the same "
                         "table): position 4 is outside its window [6, 10)")
    assert f.observed.tag == 0


def test_ignoring_the_window_reads_every_position_before_it():
    r = run(WholePrefixSWA())
    per_step = np.bincount([f.step for f in stale(r)], minlength=13).tolist()
    # decode step s (seq_len 8 + s) reads [0, 4 + s) outside its window [4 + s, 8 + s); the extend reads its window
    assert per_step == [0] + [4 + s for s in range(1, 13)]
    assert r.total_findings == r.backends["flashinfer"].findings["stale_read"] == 126
    assert {f.layer for f in stale(r)} == {0}
    assert [f.expected.position for f in stale(r) if f.step == 6] == list(range(10))
    # evicted [0, 5) from step 2, [0, 9) from step 6, [0, 13) from step 10: those read the sink
    assert [f.slot for f in stale(r) if f.step == 6] == [0] * 9 + [1]


class RaisingReads(Design):
    name = "test-raising-reads"

    def read_ids(self, req_to_token, seq_lens, extend_lens, full_to_swa, ctx):
        if ctx.mode == "decode":
            raise ValueError("no decode tables")
        return super().read_ids(req_to_token, seq_lens, extend_lens, full_to_swa, ctx)


class FloatReads(Design):
    name = "test-float-reads"

    def read_ids(self, req_to_token, seq_lens, extend_lens, full_to_swa, ctx):
        t = super().read_ids(req_to_token, seq_lens, extend_lens, full_to_swa, ctx)
        return ReadTable(full=t.full, swa=ReadIds(t.swa.indptr, t.swa.indices.float(), t.swa.start))


def test_a_raising_read_hook_is_one_design_error_per_forward_and_the_forward_is_skipped():
    r = run(RaisingReads())
    errs = [f for f in r.findings if f.cls == "design_error"]
    assert len(errs) == 12 and r.total_findings == 12
    assert errs[0].layer == -1 and errs[0].kind == "full"
    assert "read_ids raised ValueError: no decode tables at step 1 on flashinfer" in errs[0].message
    assert r.backends["flashinfer"].writes == 4       # only the extend's four layers wrote


def test_an_ill_typed_read_table_is_a_design_error_naming_the_kind():
    r = run(FloatReads())
    errs = [f for f in r.findings if f.cls == "design_error"]
    assert len(errs) == 13 and {f.kind for f in errs} == {"swa"}
    assert "swa.indices of dtype float32" in errs[0].message


def test_read_checking_off_calls_no_read_hook():
    class Boom(Design):
        name = "test-boom"

        def read_ids(self, *a):
            raise AssertionError("called")

    import simulator.run as R

    orig = R.Run.__init__

    def init(self, *a, **k):
        orig(self, *a, **k)
        self.read_check = False
    R.Run.__init__ = init
    try:
        assert run(Boom()).total_findings == 0
    finally:
        R.Run.__init__ = orig


# ------------------------------------------------------------------------------ per-token consistency (point 3)

class RetranslatePerLayer(Design):
    """W5 (#32460): every SWA layer re-translates out_cache_loc through the live mapping instead of the
    metadata's snapshot."""

    name = "test-w5-retranslate"

    def make_write_loc(self, loc, swa_loc, ctx):
        if ctx.kind == "swa":
            return KVWriteLoc(loc, ctx.full_to_swa[loc])
        return super().make_write_loc(loc, swa_loc, ctx)


def run_with_seam(design: Design, before_layer, text: str = ONE):
    """The run loop by hand, with a timeline's callback at the layer seam: a plug-in whose ``before_layer`` hook
    lands the scheduler's writes between a forward's layers (as the overlap timeline's does)."""
    from cuda_path.pool import TaggedKVPool
    from simulator.core.eager import EagerExecutor
    from simulator.core.plugins import StepPlugin
    from simulator.run import make_run

    sc = tiny(text)

    def make(full_rows, swa_rows, skip):
        return TaggedKVPool(sc.model, full_rows, swa_rows, geometry="compact", skip_index=skip)

    class Seam(StepPlugin):
        name = "test-seam"

        def interleaves(self, ctx, f):
            return True

        def before_layer(self, ctx, f, layer):
            before_layer(ctx.run, ctx.batch, f.name, layer)

    run = make_run(sc, design, make, executor=EagerExecutor())
    run.install(Seam())
    for batch, truth in run.stream():
        run.step(batch, truth)
    return run.result()


class Repoint:
    """At step 3, before SWA layer 2, the scheduler re-points the decoding token's mapping entry at another
    SWA slot (what the next iteration's alloc does under the overlap scheduler); restored before the last
    (full) layer 3, or with ``late`` only at the next forward's first layer, after its metadata init."""

    def __init__(self, late: bool = False):
        self.saved = None
        self.seen = []
        self.late = late

    def __call__(self, run, batch, backend, layer):
        m = run.alloc.full_to_swa
        if self.saved is not None and (batch.step != 3 or (layer.layer == 3 and not self.late)):
            m[self.saved[0]] = self.saved[1]
            self.saved = None
        if batch.step == 3 and layer.layer == 2:
            full = int(batch.out_cache_loc[0])
            self.saved = (full, int(m[full]))
            m[full] = 200                      # a free SWA slot
            run.sync_mapping(np.array([full]))
        self.seen.append((batch.step, layer.layer))


def test_the_seam_is_called_before_every_layer_of_every_forward():
    seam = Repoint()
    r = run_with_seam(Design(), seam)
    assert seam.seen == [(s, l) for s in range(13) for l in range(4)]
    assert r.total_findings == 0          # the metadata's snapshot does not see the change


def test_per_layer_retranslation_after_a_mapping_change_is_a_torn_write():
    r = run_with_seam(RetranslatePerLayer(), Repoint())
    by = {c: n for c, n in r.backends["flashinfer"].findings.items() if n}
    assert by == {"torn_write": 1, "missed": 1, "evicted_slot": 1}
    torn = next(f for f in r.findings if f.cls == "torn_write")
    own = next(f for f in r.findings if f.cls == "missed")
    assert (torn.step, torn.layer, torn.kind, torn.slot) == (3, 2, "swa", 200)
    assert (torn.expected.request, torn.expected.position) == (0, 10)
    assert torn.message == (f"torn write: the token's swa layers wrote different slots: layer 0 wrote slot "
                            f"{own.slot}; layer 2 wrote slot 200; it owns slot {own.slot}")
    assert (own.step, own.layer) == (3, 2) and own.message == "the token's row went to slot 200"
    assert run(RetranslatePerLayer()).total_findings == 0       # no mapping change: the same slots


def test_a_mapping_repointed_before_the_next_metadata_read_is_a_stale_read():
    # the entry is restored only after step 4's metadata init: its SWA read table takes slot 200 for pos 10
    r = run_with_seam(Design(), Repoint(late=True))
    assert [(f.step, f.cls, f.layer, f.slot, f.expected.position) for f in r.findings] == [
        (4, "stale_read", 0, 200, 10)]
    assert r.findings[0].message == ("req 0 pos 10 reads swa slot 200 at layer 0 (and 1 more swa layers reading "
                                     "the same table): the slot was freed")


def test_ownership_changed_between_layers_rechecks_the_later_layers_reads():
    """A timeline free lands before SWA layer 2 of step 5 (pos 12 decoding, window [10, 13)): the slot of
    pos 11 is freed for the oracle; layer 2's reads are checked again and find it; restored before layer 3."""
    from simulator.scheduling.batch import BatchTruth

    E = np.zeros(0, dtype=np.int64)

    def seam(run, batch, backend, layer):
        s = run.scheduler._slots_by_rid[0]
        swa, full, tag = np.array([s.swa[11]]), np.array([s.full[11]]), np.array([1 + 11])
        ref = run.target.reference
        if batch.step == 5 and layer.layer == 2:
            ref.apply_frees(BatchTruth(E, E, E, E, swa, E, E))
        if batch.step == 5 and layer.layer == 3:
            ref.apply_writes(BatchTruth(tag, full, swa, E, E, E, E))

    r = run_with_seam(Design(), seam)
    assert [(f.step, f.cls, f.layer, f.expected.position) for f in r.findings] == [(5, "stale_read", 2, 11)]
    assert r.findings[0].message.endswith("at layer 2: the slot was freed (last held req 0 pos 11)")
