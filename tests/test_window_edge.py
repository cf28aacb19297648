"""The read check is exact at the sliding window's edge (issue 29 point 6): a read table one position too wide
(the position before the window's first) or too narrow (the window's first left out) is a ``stale_read``, at
the window's start, where it falls on a page boundary (page size 16) and under speculative verify, on the
shipped scenarios that exercise each place; the base design is clean there. Before, the check compared only
the slots read: every wide read below held its own token (eviction keeps the slot before the window, page-
floored and one cadence late) and a narrow table had nothing to compare, so none of these was seen.
The designs: tests/window_edge_designs.py."""
from __future__ import annotations

import pytest

from cuda_path.pool import TaggedKVPool
from simulator.designs import Design
from simulator.records import Owner
from simulator.run import run_simulation

import window_edge_designs as W
from helpers import scenario

BACKENDS = ["flashinfer", "triton"]


def run(name, design, executor=None, backends=BACKENDS):
    sc = scenario(name).with_overrides(backends=backends)
    make = lambda f, s, skip: TaggedKVPool(sc.model, f, s, geometry="compact", skip_index=skip)  # noqa: E731
    return run_simulation(sc, design, make, executor=executor)


def stale(r, backend="flashinfer"):
    return [f for f in r.findings if f.cls == "stale_read" and f.backend == backend]


@pytest.mark.parametrize("name", ["smoke", "paths-paged", "paths-spec", "paths-spec-paged",
                                  "b4-draft-extend-window"])
def test_the_base_design_is_clean_at_every_window_edge(name):
    r = run(name, Design())
    assert r.total_findings == 0 and len(r.steps) > 0


#: (scenario, design) -> (stale reads per backend, by the forward mode they are in, the first one's step, layer and
#: message); the backends here (flashinfer, triton) give the same; a design off at a place the scenario never
#: reaches is clean there (verify on smoke and paths-paged, which run no speculative decoding)
EXPECTED = {
    ("smoke", W.WindowStartWide): (165, {"extend": 1, "mixed": 67, "decode": 97}, 1, 0,
                                   "req 0 pos 128 reads swa slot 129 at layer 0 (and 7 more swa layers reading the "
                                   "same table): position 128 is outside its window [129, 280)"),
    ("smoke", W.WindowStartNarrow): (165, {"extend": 1, "mixed": 67, "decode": 97}, 1, 0,
                                     "req 0 pos 129 is not read by the swa table at layer 0 (and 7 more swa layers "
                                     "reading the same table): the table leaves out position 129 of its window "
                                     "[129, 280)"),
    ("smoke", W.VerifyWide): (0, {}, None, None, None),
    ("smoke", W.VerifyNarrow): (0, {}, None, None, None),
    ("paths-paged", W.WindowStartWide): (189, {"extend": 2, "mixed": 47, "decode": 140}, 1, 0,
                                         "req 0 pos 128 reads swa slot 144 at layer 0 (and 1 more swa layers reading "
                                         "the same table): position 128 is outside its window [129, 512)"),
    ("paths-paged", W.WindowStartNarrow): (189, {"extend": 2, "mixed": 47, "decode": 140}, 1, 0,
                                           "req 0 pos 129 is not read by the swa table at layer 0 (and 1 more swa "
                                           "layers reading the same table): the table leaves out position 129 of its "
                                           "window [129, 512)"),
    # page 16: only the windows that start on a page's first position
    ("paths-paged", W.PageEdgeWide): (11, {"mixed": 2, "decode": 9}, 5, 0,
                                      "req 1 pos 31 reads swa slot 239 at layer 0 (and 1 more swa layers reading the "
                                      "same table): position 31 is outside its window [32, 160)"),
    ("paths-paged", W.PageEdgeNarrow): (11, {"mixed": 2, "decode": 9}, 5, 0,
                                        "req 1 pos 32 is not read by the swa table at layer 0 (and 1 more swa layers "
                                        "reading the same table): the table leaves out position 32 of its window "
                                        "[32, 160)"),
    ("paths-paged", W.VerifyWide): (0, {}, None, None, None),
    ("paths-spec", W.WindowStartWide): (298, {"extend": 4, "draft_extend": 62, "draft_decode": 174,
                                              "target_verify": 58}, 7, 0,
                                        "req 3 pos 35 reads swa slot 150 at layer 0 (and 1 more swa layers reading "
                                        "the same table): position 35 is outside its window [36, 195)"),
    # TARGET_VERIFY: 4 draft tokens per request, the span from the first one's window to the last token
    ("paths-spec", W.VerifyWide): (58, {"target_verify": 58}, 16, 0,
                                   "req 1 pos 1 reads swa slot 22 at layer 0 (and 1 more swa layers reading the same "
                                   "table): position 1 is outside its window [2, 37)"),
    ("paths-spec", W.VerifyNarrow): (58, {"target_verify": 58}, 16, 0,
                                     "req 1 pos 2 is not read by the swa table at layer 0 (and 1 more swa layers "
                                     "reading the same table): the table leaves out position 2 of its window [2, 37)"),
    ("paths-spec-paged", W.PageEdgeWide): (6, {"draft_decode": 4, "target_verify": 1, "draft_extend": 1}, 43, 5,
                                           "req 0 pos 463 reads swa slot 31 at layer 5: position 463 is outside its "
                                           "window [464, 496)"),
    ("paths-spec-paged", W.PageEdgeNarrow): (6, {"draft_decode": 4, "target_verify": 1, "draft_extend": 1}, 43, 5,
                                             "req 0 pos 464 is not read by the swa table at layer 5: the table leaves "
                                             "out position 464 of its window [464, 496)"),
    ("paths-spec-paged", W.VerifyWide): (17, {"target_verify": 17}, 19, 0,
                                         "req 0 pos 448 reads swa slot 16 at layer 0 (and 1 more swa layers reading "
                                         "the same table): position 448 is outside its window [449, 484)"),
    ("paths-spec-paged", W.VerifyNarrow): (17, {"target_verify": 17}, 19, 0,
                                           "req 0 pos 449 is not read by the swa table at layer 0 (and 1 more swa "
                                           "layers reading the same table): the table leaves out position 449 of its "
                                           "window [449, 484)"),
    ("b4-draft-extend-window", W.WindowStartWide): (220, {"extend": 25, "draft_extend": 59, "draft_decode": 102,
                                                          "target_verify": 34}, 2, 0,
                                                    "req 0 pos 32 reads swa slot 33 at layer 0 (and 1 more swa layers "
                                                    "reading the same table): position 32 is outside its window "
                                                    "[33, 128)"),
    ("b4-draft-extend-window", W.WindowStartNarrow): (220, {"extend": 25, "draft_extend": 59, "draft_decode": 102,
                                                            "target_verify": 34}, 2, 0,
                                                      "req 0 pos 33 is not read by the swa table at layer 0 (and 1 "
                                                      "more swa layers reading the same table): the table leaves out "
                                                      "position 33 of its window [33, 128)"),
}


def _modes(r) -> dict[int, str]:
    out: dict[int, str] = {}
    for rec in r.steps:
        out.setdefault(rec.step, rec.mode)
    return out


@pytest.mark.parametrize("name, design", list(EXPECTED), ids=[f"{n}-{d.__name__}" for n, d in EXPECTED])
def test_one_position_off_at_the_window_edge_is_a_stale_read(name, design):
    n, modes, step, layer, message = EXPECTED[name, design]
    r = run(name, design())
    got = stale(r)
    assert {b: s.findings["stale_read"] for b, s in r.backends.items()} == dict.fromkeys(BACKENDS, n)
    assert r.total_findings == 2 * n          # reads only: the writes are the base design's
    by_mode: dict[str, int] = {}
    m = _modes(r)
    for f in got:
        by_mode[m[f.step]] = by_mode.get(m[f.step], 0) + 1
    assert by_mode == modes
    if n == 0:
        return
    assert (got[0].step, got[0].layer, got[0].message) == (step, layer, message)
    if design.shift < 0:
        # too wide: each reads the position just before its window, whose slot still holds that token live
        # (what the old, contents-only check saw: nothing)
        assert all(f.slot >= 0 and f.observed == f.expected for f in got)
        starts = [f.expected.position + 1 for f in got]
    else:
        # too narrow: the window's first position is not read at all
        assert all(f.slot == -1 and f.observed is None and f.expected is not None for f in got)
        starts = [f.expected.position for f in got]
    if issubclass(design, W.PageEdgeWide) or issubclass(design, W.PageEdgeNarrow):
        page = scenario(name).pool.page_size
        assert page == 16 and all(p % page == 0 for p in starts)


def test_without_window_indices_the_swa_layers_read_the_prefix_and_that_span_holds():
    """B4 live (sglang-post-29460's engine: triton's draft-extend graph builds no window indices): there triton's
    SWA layers read the full prefix, held to the prefix span, and the design's one-too-wide window is not read;
    B4's own stale reads (full ids in the SWA pool) are as before."""
    from simulator.designs.sglang import SGLangPost29460

    class B4Wide(W.WindowStartWide, SGLangPost29460):
        name = "test-b4-window-start-wide"

    b4 = run("b4-draft-extend-window", SGLangPost29460())
    assert {b: s.findings["stale_read"] for b, s in b4.backends.items()} == {"flashinfer": 0, "triton": 9790}
    r = run("b4-draft-extend-window", B4Wide())
    m = _modes(r)
    graph_de = {rec.step for rec in r.steps if rec.mode == "draft_extend" and rec.graph == "draft_extend_graph"}
    fi = stale(r)
    assert len(fi) == 220 and sum(1 for f in fi if f.step in graph_de) == 34
    # triton: B4's 9,790 in its draft-extend graph, the window's 220 elsewhere less those 34
    tr = stale(r, "triton")
    assert len(tr) == 9790 + 220 - 34
    assert not [f for f in tr if f.step in graph_de and "outside its window" in f.message]
    assert sum(1 for f in tr if m[f.step] != "draft_extend" or f.step not in graph_de) == 220 - 34
    assert {c: n for c, n in r.backends["triton"].findings.items() if c != "stale_read"} == \
        {c: n for c, n in b4.backends["triton"].findings.items() if c != "stale_read"}


@pytest.mark.parametrize("name, design", [("smoke", W.WindowStartNarrow), ("paths-spec-paged", W.VerifyWide),
                                          ("paths-paged", W.PageEdgeNarrow)])
def test_every_executor_gives_the_same_window_findings(name, design):
    """The per-forward grain, the CPU's shared step and the GPU step runner (on the CPU, metadata on host copies
    as on a GPU) check the same tables the same way."""
    from cuda_path.step import StepwiseExecutor
    from simulator.core.eager import EagerExecutor

    own = run(name, design(), EagerExecutor(shared=False))
    ref = [f.to_json() for f in own.findings]
    assert ref and all(f["class"] == "stale_read" for f in ref)
    assert [f.to_json() for f in run(name, design(), EagerExecutor()).findings] == ref
    for host in (None, True):
        ex = StepwiseExecutor(EagerExecutor())
        ex.runner.host_metadata = host
        assert [f.to_json() for f in run(name, design(), ex).findings] == ref


# ------------------------------------------------------------------------------ the rules, by hand

def _table(start: int, n: int, first_slot: int):
    import torch

    from simulator.designs import ReadIds

    return ReadIds(torch.tensor([0, n]), torch.arange(first_slot, first_slot + n), torch.tensor([start]))


def _checker():
    """One request (id 0, own tags 1 + position) with K/V at positions [0, 12) in SWA slots 1..12."""
    import numpy as np

    from simulator.oracle.checker import Checker
    from simulator.oracle.reference import ReferencePool
    from simulator.records import Owner
    from simulator.scheduling.batch import BatchTruth

    ref = ReferencePool(32, 32)
    a = np.arange(1, 13, dtype=np.int64)
    e = np.zeros(0, dtype=np.int64)
    ref.apply(BatchTruth(tags=a, full_slots=a, swa_slots=a, freed_full=e, freed_swa=e, evicted_swa=e,
                         mapping_changed=e))
    return Checker(ref, lambda t: Owner(t, 0 if t > 0 else None, t - 1 if t > 0 else None), reserved=np.array([0]))


def _requests(extend: int):
    import numpy as np

    from simulator.scheduling.batch import BatchRequests

    one = lambda v: np.array([v], dtype=np.int64)  # noqa: E731
    return BatchRequests(rids=one(0), seq_lens=one(12), extend_lens=one(extend), slots=(), tag_bases=one(1))


@pytest.mark.parametrize("extend, start, n, want", [
    (1, 8, 4, []),                                                   # decode: the last 4 positions, exactly
    (1, 7, 5, [(7, 8, "position 7 is outside its window [8, 12)")]),
    (1, 9, 3, [(8, -1, "the table leaves out position 8 of its window [8, 12)")]),
    (1, 9, 4, [(8, -1, "the table leaves out position 8 of its window [8, 12)"),
               (12, 13, "position 12 is past the request's length (12 positions with K/V)")]),
    (1, 8, 0, [(p, -1, f"the table leaves out position {p} of its window [8, 12)") for p in range(8, 12)]),
    (3, 6, 6, []),                                                   # verify, 3 draft tokens: from 9's window
    (3, 5, 7, [(5, 6, "position 5 is outside its window [6, 12)")]),
    (3, 8, 4, [(6, -1, "the table leaves out position 6 of its window [6, 12)"),
               (7, -1, "the table leaves out position 7 of its window [6, 12)")]),
])
def test_a_table_is_held_to_its_window_exactly(extend, start, n, want):
    from simulator.oracle.read_rules import window_span

    ck, rq = _checker(), _requests(extend)
    span = window_span(rq.seq_lens, rq.extend_lens, 4)
    found, _ = ck.check_reads(3, "flashinfer", "swa", _table(start, n, start + 1), rq, None, 32, 0, 1, span=span)
    pos = lambda f: int(f.message.split()[3])  # noqa: E731
    assert [(pos(f), f.slot, f.message.split(": ", 1)[1]) for f in found] == want
    for f in found:
        what = f"reads swa slot {f.slot}" if f.slot >= 0 else "is not read by the swa table"
        assert f.message.startswith(f"req 0 pos {pos(f)} {what} at layer 0") and f.cls == "stale_read"
        # a position of the request names its token (a past-the-end one has none); nothing was read where omitted
        assert f.expected == (Owner(1 + pos(f), 0, pos(f)) if pos(f) < 12 else None)
        assert (f.observed is None) == (f.slot == -1)


def test_positions_the_request_does_not_have_never_ask_the_content_keys():
    """Without a span (a base table) the positions are held to the request's: before its first or past its length
    is a stale read, and the content keys are asked only for positions it has (a radix run's keys end there)."""
    asked = []

    def keys(requests, rows, positions):
        assert positions.min() >= 0 and positions.max() < 12
        asked.append(positions.tolist())
        return requests.tag_bases[rows] + positions

    ck, rq = _checker(), _requests(1)
    found, bad = ck.check_reads(3, "flashinfer", "swa", _table(-1, 14, 0), rq, keys, 32, 0, 1)
    assert [(f.expected, f.slot, f.message.split(": ", 1)[1]) for f in found] == [
        (None, 0, "position -1 is before the request's first"),
        (None, 13, "position 12 is past the request's length (12 positions with K/V)")]
    assert asked == [list(range(12))] and bad.tolist() == [0, 13]


def test_a_table_rechecked_in_the_same_forward_reports_nothing_twice():
    from simulator.oracle.read_rules import window_span

    ck, rq = _checker(), _requests(1)
    span = window_span(rq.seq_lens, rq.extend_lens, 4)
    t = _table(9, 4, 10)
    found, bad = ck.check_reads(3, "flashinfer", "swa", t, rq, None, 32, 0, 1, span=span)
    assert len(found) == 2 and bad.tolist() == [3]
    again, _ = ck.check_reads(3, "flashinfer", "swa", t, rq, None, 32, 0, 1, skip=bad, span=span)
    assert again == []


class PastEnd(Design):
    """SWA tables reading two positions past each request's K/V (its last slot again there)."""

    name = "test-past-end"
    extra = 2

    def read_ids(self, req_to_token, seq_lens, extend_lens, full_to_swa, ctx):
        import torch

        from simulator.designs import ReadIds, ReadTable

        t = super().read_ids(req_to_token, seq_lens, extend_lens, full_to_swa, ctx)
        w = t.swa
        parts, ptr = [], [0]
        for i in range(seq_lens.shape[0]):
            seg = w.indices[int(w.indptr[i]):int(w.indptr[i + 1])]
            parts.append(torch.cat([seg, seg[-1:].repeat(self.extra)]))
            ptr.append(ptr[-1] + seg.shape[0] + self.extra)
        return ReadTable(full=t.full, swa=ReadIds(torch.tensor(ptr, dtype=torch.int64), torch.cat(parts), w.start))


def test_a_table_past_the_requests_length_is_a_finding_in_a_radix_run_not_an_index_error():
    """radix content keys end at a request's last token: on main this run died at step 29 with IndexError
    (index 70 is out of bounds for axis 0 with size 70) in SharingScheduler._keys."""
    from simulator.designs.radix import RadixFixed

    class RadixPastEnd(PastEnd, RadixFixed):
        name = "test-radix-past-end"

    r = run("r7-grouped-free-flush", RadixPastEnd(), backends=None)
    got = [f for f in r.findings if f.cls == "stale_read"]
    # two per (forward, request): positions seq_len and seq_len + 1, neither the request's
    assert r.total_findings == len(got) == 2 * sum(rec.num_requests for rec in r.steps) == 102
    fixed = run("r7-grouped-free-flush", RadixFixed(), backends=None)
    assert fixed.total_findings == 0 and len(r.steps) == len(fixed.steps) == 31     # the whole run
    assert all(f.expected is None and "is past the request's length" in f.message for f in got)
    f = got[0]
    assert (f.step, f.slot, f.observed.label) == (0, 96, "req 0 pos 95")
    assert f.message == ("req 0 pos 96 reads swa slot 96 at layer 0: position 96 is past the request's length "
                         "(96 positions with K/V)")
