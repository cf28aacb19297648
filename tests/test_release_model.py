"""The release model: FIFO free lists, SGLang 0.5.23's SWA eviction cadence, DP padding modes, draft columns,
and the ``sglang-0.5.23`` design on every shipped scenario (docs/RELEASE_MODEL.md)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest


import simulator.run as run_mod
from simulator.memory.allocator import HybridAllocator, RequestSlots
from simulator.engine_model.release_model import (MID_2026, SGLANG_0_5_23, DpPaddingModes, EvictionContext,
                                                  FreeLists, MaxPadding, ReleaseBehaviour, Sglang0523Eviction,
                                                  release_of)
from simulator.scenario import load_scenario
from simulator.scheduling.scheduler import Scheduler
from simulator.scheduling.workload import make_requests

from helpers import ROOT, simulate, tiny

# --------------------------------------------------------------------------- free lists


def _alloc(n_tokens: int, alloc: HybridAllocator) -> RequestSlots:
    s = RequestSlots(n_tokens)
    alloc.extend(s, n_tokens)
    return s


@pytest.mark.parametrize("page", [1, 16])
def test_fifo_hands_a_freed_page_back_last(page):
    alloc = HybridAllocator(8 * page, 8 * page, page, free_order="fifo")
    a, b, c = (_alloc(page, alloc) for _ in range(3))          # pages 1, 2, 3
    assert [a.full[0] // page, b.full[0] // page, c.full[0] // page] == [1, 2, 3]
    alloc.free(b)                                               # page 2 joins the tail: 4 5 6 7 8 2
    got = [(_alloc(page, alloc).full[0] // page) for _ in range(6)]
    assert got == [4, 5, 6, 7, 8, 2]
    assert alloc.full_free == 0 and alloc.swa_free == 0


@pytest.mark.parametrize("page", [1, 16])
def test_lifo_hands_a_freed_page_back_first(page):
    alloc = HybridAllocator(8 * page, 8 * page, page)           # the default: the stack of mid-2026
    _alloc(page, alloc)
    b = _alloc(page, alloc)
    alloc.free(b)
    assert _alloc(page, alloc).full[0] // page == 2


def test_fifo_ring_wraps_and_checks_double_frees():
    alloc = HybridAllocator(4, 4, 1, free_order="fifo")
    live = [_alloc(1, alloc) for _ in range(4)]                 # slots 1..4, list empty
    order = []
    for _ in range(3):                                          # free the oldest, take one: wraps the ring
        s = live.pop(0)
        order.append(int(s.full[0]))
        alloc.free(s)
        live.append(_alloc(1, alloc))
    assert [int(s.full[0]) for s in live[-3:]] == order == [1, 2, 3]
    with pytest.raises(RuntimeError, match="double free"):
        alloc._full.push(np.array([live[-1].full[0]]))
        alloc._full.push(np.array([live[-1].full[0]]))


@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("grouped", [False, True])
def test_fifo_matches_a_reference_queue_under_random_traffic(page, grouped):
    """Random extends, evictions and frees: every page comes out of the queue in the order it went in."""
    from collections import deque

    rng = np.random.default_rng(page * 10 + grouped)
    n_pages = 40
    alloc = HybridAllocator(n_pages * page, n_pages * page, page, free_order="fifo")
    ref_full, ref_swa = deque(range(1, n_pages + 1)), deque(range(1, n_pages + 1))
    live: list[RequestSlots] = []
    for _ in range(400):
        op = rng.integers(3)
        if op == 0 and alloc.full_free >= 3 * page and alloc.swa_free >= 3 * page:
            s = live[rng.integers(len(live))] if live and rng.random() < 0.5 else None
            if s is None or s.length + 2 * page > s.capacity:
                s = RequestSlots(12 * page)
                live.append(s)
            before = s.length
            k = alloc.pages_needed(s, 2 * page - 1)
            alloc.extend(s, 2 * page - 1)
            new_pages = [int(x) // page for x in s.full[before:s.length] if x % page == 0]
            assert new_pages == [ref_full.popleft() for _ in range(k)]
            assert [int(x) // page for x in s.swa[before:s.length] if x % page == 0] == \
                [ref_swa.popleft() for _ in range(k)]
        elif op == 1 and live:
            s = live[rng.integers(len(live))]
            end = s.length - page
            pages = [int(x) // page for x in s.swa[s.swa_evicted:max(end - end % page, s.swa_evicted):page]]
            with alloc.free_group(grouped):
                alloc.evict_swa(s, end)
            ref_swa.extend(pages)
        elif op == 2 and live:
            victims = [live.pop(rng.integers(len(live))) for _ in range(min(len(live), 1 + rng.integers(2)))]
            with alloc.free_group(grouped):
                for s in victims:
                    first = s.swa_evicted - s.swa_evicted % page
                    ref_swa.extend(int(x) // page for x in s.swa[first:s.length:page] if x > 0)
                    ref_full.extend(int(x) // page for x in s.full[0:s.length:page])
                    alloc.free(s)
        alloc.check_invariants(live)
        assert alloc.full_free == len(ref_full) * page and alloc.swa_free == len(ref_swa) * page
        assert alloc._full.in_order().tolist() == list(ref_full)
        assert alloc._swa.in_order().tolist() == list(ref_swa)


def test_switching_order_keeps_the_free_pages_in_hand_out_order():
    alloc = HybridAllocator(8, 8, 1)
    a = _alloc(3, alloc)                                        # 1 2 3
    alloc.free(a)                                               # stack hands out 1 2 3 4 ...
    alloc.set_free_order("fifo")
    assert _alloc(5, alloc).full.tolist() == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("order,expect", [("lifo", [1, 2, 3, 4]), ("fifo", [5, 6, 7, 8])])
def test_a_free_group_releases_its_frees_together_in_call_order(order, expect):
    page = 16
    alloc = HybridAllocator(8 * page, 8 * page, page, free_order=order)
    reqs = [_alloc(page, alloc) for _ in range(4)]              # pages 1 2 3 4
    with alloc.free_group():
        for r in reqs:
            alloc.free(r)
        assert alloc.full_free == 4 * page                      # held until the group ends
    assert alloc.full_free == 8 * page
    # lifo: the group's pages come first in the order they were freed (SGLang's paged allocator prepends
    # the concatenated group); one call at a time would have reversed them (4 3 2 1)
    got = [int(_alloc(page, alloc).full[0] // page) for _ in range(4)]
    assert got == expect


def test_free_lists_by_page_size():
    fl = SGLANG_0_5_23.free_lists
    assert fl.order(1) == "fifo" and fl.order(16) == "head" and fl.grouped
    assert MID_2026.free_lists == FreeLists() and MID_2026.free_lists.order(1) == "lifo"
    with pytest.raises(ValueError):
        FreeLists(token="random")


# --------------------------------------------------------------------------- SWA eviction cadence

CADENCE = """
[model]
layers = "SF"
window = 32
[pool]
full_size = 4096
page_size = {page}
[workload]
[[workload.request]]
prompt_len = {prompt}
output_len = {output}
[engine]
chunked_prefill_size = 64
swa_eviction_interval = 8
cuda_graph = false
"""


#: 0.5.23's rule with the overlap scheduler's guards (the scenario itself runs without the overlap loop)
OVERLAPPED_0523 = dataclasses.replace(SGLANG_0_5_23, eviction=Sglang0523Eviction(overlap=True))


def evictions(page: int, prompt: int, output: int, release: ReleaseBehaviour = OVERLAPPED_0523):
    """(step, first evicted position, end, SWA slots freed) for every step whose forming evicted."""
    sc = tiny(CADENCE.format(page=page, prompt=prompt, output=output))
    rng = np.random.default_rng(0)
    alloc = HybridAllocator(sc.pool.full_size, sc.pool.swa_size, page)
    sched = Scheduler(sc, alloc, make_requests(sc.workload, rng), rng, release=release)
    out, before = [], 0
    for batch, truth in sched.steps():
        if not sched.running:
            break
        now = sched.running[0].slots.swa_evicted
        if now != before:
            out.append((batch.step, before, now, truth.evicted_swa.tolist()))
            before = now
        else:
            assert truth.evicted_swa.size == 0
    return out


def test_decode_cadence_0523_page1_by_hand():
    # window 32, interval 8, prompt 40: decode k (step k + 1) sees 40 + k tokens, seqlen - 1 = 39 + k under
    # the overlap scheduler; evicts when k >= 1 and 39 + k - 32 >= evicted + 8, up to 39 + k - 32.
    # k = 1: 8 >= 8 -> [0, 8) at step 2; then every 8 decodes: [8j, 8j + 8) at step 2 + 8j (k = 97 the last)
    got = evictions(1, 40, 100)
    assert [(s, a, b) for s, a, b, _ in got] == [(2 + 8 * j, 8 * j, 8 * j + 8) for j in range(13)]
    # a fresh FIFO SWA pool gave position p the slot p + 1
    assert got[0][3] == list(range(1, 9)) and got[-1][3] == list(range(97, 105))


def test_decode_cadence_0523_without_the_overlap_scheduler_by_hand():
    # the run's own setting (no overlap loop): seqlen - 1 = 40 + k, the tokens with K/V; k = 1: 9 >= 8 -> [0, 9)
    # at step 2; then 8 + k >= 9 + 8 every 8 decodes: [9 + 8j, 17 + 8j) at step 2 + 8j (k = 97 the last)
    got = evictions(1, 40, 100, SGLANG_0_5_23)
    assert [(s, a, b) for s, a, b, _ in got] == [(2, 0, 9)] + [(2 + 8 * j, 1 + 8 * j, 9 + 8 * j) for j in range(1, 13)]


def test_decode_cadence_0523_page16_by_hand():
    # the same request at page_size 16: the end floors to a page, so k = 1..8 free nothing (end 0); k = 9:
    # 39 + 9 - 32 = 16 -> [0, 16) at step 10; evicted 16 then needs 7 + k >= 24 and frees at the next page
    # boundary, k = 25 -> [16, 32) at step 26; every 16 decodes after: step 10 + 16j frees [16j, 16j + 16)
    got = evictions(16, 40, 100)
    assert [(s, a, b) for s, a, b, _ in got] == [(10 + 16 * j, 16 * j, 16 * j + 16) for j in range(6)]
    # position p sits in SWA slot p + 16 (pages 1, 2, ... of a fresh pool)
    assert got[0][3] == list(range(16, 32))


@pytest.mark.parametrize("page", [1, 16])
def test_chunked_prefill_eviction_0523_by_hand(page):
    # prompt 200 in chunks of 64 (prefix 0, 64, 128, 192): under the overlap scheduler chunks 0 and 1 evict
    # nothing; chunk 2 evicts against 128 - 64 = 64 -> [0, 32); chunk 3 against 192 - 64 = 128 -> [32, 96)
    got = evictions(page, 200, 2)
    assert [(s, a, b) for s, a, b, _ in got[:2]] == [(2, 0, 32), (3, 32, 96)]


def test_mid_2026_cadence_is_unchanged():
    # decode when decoded % window == 1: k = 1, 33, 65, 97 (steps 2, 34, 66, 98) up to 40 + k - 32
    got = evictions(1, 40, 100, MID_2026)
    assert [(s, a, b) for s, a, b, _ in got] == [(2, 0, 9), (34, 9, 41), (66, 41, 73), (98, 73, 105)]


def test_0523_rule_functions():
    ev = Sglang0523Eviction(overlap=True)
    ctx = EvictionContext(window=128, page_size=1, chunked_prefill_size=8192, interval=128)
    # the overlap guard: never in the first decode batch
    assert ev.decode_point(ctx, length=10_000, evicted=0, decoded=0, decode_batches=0) is None
    # seqlen - 1 - W >= evicted + interval, with seqlen - 1 = length - 1 under overlap
    assert ev.decode_point(ctx, length=256, evicted=0, decoded=5, decode_batches=5) is None
    assert ev.decode_point(ctx, length=257, evicted=0, decoded=5, decode_batches=5) == 256
    no_overlap = Sglang0523Eviction(overlap=False)
    assert no_overlap.decode_point(ctx, length=256, evicted=0, decoded=5, decode_batches=5) == 256
    # extend without overlap: every chunk, interval 1
    assert no_overlap.extend_point(ctx, prefix_len=128, evicted=0, chunk=0) is None
    assert no_overlap.extend_point(ctx, prefix_len=129, evicted=0, chunk=1) == 129
    assert ev.extend_point(ctx, prefix_len=10_000, evicted=0, chunk=1) is None
    assert ev.extend_point(ctx, prefix_len=10_000, evicted=0, chunk=2) == 10_000 - 8192
    # the retained window is the larger of the target's and the draft's
    assert ev.retain_window(dataclasses.replace(ctx, draft_window=256)) == 256


# --------------------------------------------------------------------------- DP padding modes


def test_dp_padding_modes_by_hand():
    modes, plain = DpPaddingModes(), MaxPadding()
    kw = dict(dp_size=3, attn_tp_size=4)
    # aligned to attn_tp 4: 5 -> 8, 3 -> 4, 12 -> 12
    p = modes.plan(real=5, others=[3, 12], extend=True, prefill_graph_sizes=None, **kw)
    assert (p.tokens, p.mode) == (8, "sum_len")                 # extend over several ranks: own count
    p = modes.plan(real=5, others=[3, 12], extend=True, prefill_graph_sizes=(4, 8, 16, 32), **kw)
    assert (p.tokens, p.mode, p.bucket) == (16, "max_len", 16)  # fits a prefill graph: common bucket
    p = modes.plan(real=5, others=[3, 40], extend=True, prefill_graph_sizes=(4, 8, 16, 32), **kw)
    assert (p.tokens, p.mode, p.prefill_graph) == (8, "sum_len", False)   # too large for the graphs: eager
    p = modes.plan(real=5, others=[3, 11], extend=False, prefill_graph_sizes=None, **kw)
    assert (p.tokens, p.mode) == (12, "max_len")                # decode: 2 * 24 >= 12 * 3
    assert p.graph_basis == 12                                  # the decode graph keys on raw counts (11)
    p = modes.plan(real=5, others=[0, 39], extend=False, prefill_graph_sizes=None, **kw)
    assert (p.tokens, p.mode) == (8, "sum_len")                 # decode: 2 * 48 < 40 * 3
    assert p.graph_basis == 39                                  # ... but replays at the largest rank's size
    p = plain.plan(real=5, others=[3, 12], extend=True, prefill_graph_sizes=None, **kw)
    assert (p.tokens, p.graph_basis, p.prefill_graph) == (12, 12, True)


DP = """
[model]
layers = "SF"
window = 32
[pool]
full_size = 4096
[workload]
[[workload.request]]
prompt_len = 5
output_len = 2
[engine]
dp_size = 2
attn_tp_size = 4
dp_other_tokens = 10
cuda_graph = false
piecewise_cuda_graph = {pcg}
"""


@pytest.mark.parametrize("pcg,extend_len,graph", [("false", 8, "eager"), ("true", 12, "piecewise"),
                                                  ("true\npiecewise_max_tokens = 8", 8, "eager")])
def test_dp_padding_modes_in_the_scheduler(pcg, extend_len, graph):
    # the third: the other rank's 12 tokens fit no prefill graph (captures up to 8): SUM_LEN, eager
    sc = tiny(DP.format(pcg=pcg))
    rng = np.random.default_rng(0)
    alloc = HybridAllocator(sc.pool.full_size, sc.pool.swa_size, 1)
    steps = list(Scheduler(sc, alloc, make_requests(sc.workload, rng), rng, release=SGLANG_0_5_23).steps())
    ext, dec = steps[0][0], steps[1][0]
    # extend: 5 real tokens; SUM_LEN pads to 8 (attn_tp 4); a prefill graph forces MAX_LEN at bucket 12
    assert (ext.num_token_non_padded, ext.dp_padded_len, ext.graph) == (5, extend_len, graph)
    assert (ext.out_cache_loc[5:] == 0).all()
    # decode: counts 4 and 12, 2 * 16 >= 12 * 2: MAX_LEN, 12
    assert (dec.num_token_non_padded, dec.dp_padded_len) == (1, 12)
    mid = list(Scheduler(sc, HybridAllocator(sc.pool.full_size, sc.pool.swa_size, 1),
                         make_requests(sc.workload, np.random.default_rng(0)), np.random.default_rng(0)).steps())
    assert mid[0][0].dp_padded_len == 10                        # mid-2026: the largest count, unaligned
    if graph == "piecewise":
        assert mid[0][0].padded_len == 12


def test_eager_layer_rows():
    assert SGLANG_0_5_23.eager_layer_rows("extend", "eager", 5, 8) == 5
    assert SGLANG_0_5_23.eager_layer_rows("target_verify", "eager", 5, 8) is None
    assert SGLANG_0_5_23.eager_layer_rows("extend", "piecewise", 5, 8) is None
    assert MID_2026.eager_layer_rows("extend", "eager", 5, 8) is None
    assert SGLANG_0_5_23.takes_plan_swa_ids("triton") and not SGLANG_0_5_23.takes_plan_swa_ids("aiter")


# --------------------------------------------------------------------------- multi-step draft columns

SPEC = """
[model]
layers = "SF"
window = 32
[pool]
full_size = 4096
[workload]
requests = 2
prompt_len = 20
output_len = 8
[engine]
cuda_graph = false
[engine.speculative]
num_draft_tokens = 4
accept_rate = 0.5
draft_layers = "S"
"""


def _first_round(release, draft_steps: int):
    sc = tiny(SPEC)
    rng = np.random.default_rng(1)
    alloc = HybridAllocator(sc.pool.full_size, sc.pool.swa_size, 1)
    steps = list(Scheduler(sc, alloc, make_requests(sc.workload, rng), rng, release=release).steps())
    modes = [b.mode for b, _ in steps]
    assert modes[:4 + draft_steps] == ["extend", "draft_extend", *["draft_decode"] * draft_steps,
                                       "target_verify", "draft_extend"]
    return [b for b, _ in steps[2:4 + draft_steps]]


def test_draft_columns_layout():
    # 0.5.23: num_steps - 1 draft forwards (the draft worker breaks before the last step's), columns 0 and 1
    *drafts, verify, extend = _first_round(SGLANG_0_5_23, 2)
    # the window is allocated once, request by request: request 0 gets 41..44, request 1 45..48
    assert verify.out_cache_loc.tolist() == list(range(41, 49))
    window = verify.out_cache_loc.reshape(2, 4)
    for i, d in enumerate(drafts):
        assert d.out_cache_loc.tolist() == window[:, i].tolist() and d.draft_step == i  # step i writes column i
    # a step's slice is not a prefix of the all-steps loc
    assert drafts[0].out_cache_loc.tolist() != verify.out_cache_loc[:2].tolist()
    # DRAFT_EXTEND_V2 rewrites the whole window (accepted or not); the rejected slots go back after it
    assert extend.out_cache_loc.tolist() == verify.out_cache_loc.tolist()
    assert extend.accepted.tolist() == [1, 1] and extend.requests.extend_lens.tolist() == [4, 4]


def test_draft_steps_without_columns_allocate_per_step():
    *drafts, verify, extend = _first_round(MID_2026, 3)
    # mid-2026: one slot per request per step (step-major), given back before verify re-allocates
    assert [d.out_cache_loc.tolist() for d in drafts] == [[41, 42], [43, 44], [45, 46]]
    assert extend.accepted is None and extend.requests.extend_lens.tolist() == [1, 1]   # accepted tokens only


# --------------------------------------------------------------------------- the design on every scenario


class _ReleaseScheduler(Scheduler):
    """A scheduler with a release's behaviour given (the run passes its design's ``release.behaviour``)."""

    release_for_test: ReleaseBehaviour = SGLANG_0_5_23

    def __init__(self, *args, release=None, **kwargs):
        super().__init__(*args, release=release if release is not None else self.release_for_test, **kwargs)


#: every shipped scenario a model runs: not the scale scenario (time), nor those made for vLLM alone (their
#: ``engine_release`` a vLLM release: an offload tier, tests/test_vllm_offload.py; async scheduling with the radix
#: cache, tests/test_vllm.py)
SHIPPED = sorted(p.stem for p in (ROOT / "scenarios").glob("*.toml")
                 if p.stem != "scale" and not p.stem.startswith("corpus")
                 and not (load_scenario(p).engine_release or "").startswith("vllm"))
#: scenarios that show the fix's gap (a swa_loc shorter than loc: piecewise graphs without per-layer
#: narrowing), which 0.5.23's KVWriteLoc still has (ENGINE_IN_LOOP.md: the real 0.5.23 code raises there too).
#: paths-noshrink is not among them under 0.5.23: with DP attention a prefill graph only runs at the ranks'
#: common bucket (MAX_LEN), so out_cache_loc is already the capture's length when metadata translates it
GAP = {"gap-swa-shorter": {"length_mismatch"}}
#: W7: 0.5.23 on ROCm settings runs the overlap scheduler without its WAR barrier (docs/OVERLAP.md): live
LIVE_0523 = {"w7-rocm-no-barrier"}
#: R8: 0.5.23 lets the sink page into the SWA free list (unfiltered, docs/SHARING.md): live in its own scenario,
#: at page 16 as shipped and at page 1 (there the sink slot 0 is handed to request 9 and read at step 37)
R8_0523 = "r8-sink-free-list"


def test_the_release_design_declares_its_release():
    from simulator.designs import load_design

    d = load_design("sglang-0.5.23")
    assert release_of(d) is SGLANG_0_5_23 and str(d.graph_swa_dtype) == "torch.int64"
    assert release_of(load_design("sglang-post-29460")) is MID_2026


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("name", SHIPPED)
def test_sglang_0523_runs_clean_on_shipped_scenarios(name, page, monkeypatch):
    from helpers import scenario

    monkeypatch.setattr(run_mod, "Scheduler", _ReleaseScheduler)
    sc = scenario(name)
    if page != sc.pool.page_size:
        if sc.pool.full_size % page:
            pytest.skip(f"{name}: full_size {sc.pool.full_size} is not a multiple of {page}")
        sc = dataclasses.replace(sc, pool=dataclasses.replace(sc.pool, page_size=page))
    res = simulate(sc, "sglang-0.5.23")
    if "swa" in sc.engine.speculative.draft_layers and sc.engine.speculative.enabled:
        # P6 live in 0.5.23: xpu's multi-step draft backend writes a draft step's SWA layers at the first SWA ids
        # of the round's whole window (every other backend is per step)
        xpu = {c for c, n in res.backends.pop("xpu").findings.items() if n}
        assert xpu and xpu <= {"missed", "clobbered", "evicted_slot"}, (name, page, xpu)
        # F2 live in 0.5.23: aiter's draft steps over a hybrid draft pool read the committed keys only
        aiter = {c for c, n in res.backends.pop("aiter").findings.items() if n}
        assert aiter == {"stale_read"}, (name, page, aiter)
    if sc.engine.speculative.enabled:
        # F1 live in 0.5.23 (sglang#39287): flashinfer's verify SWA tables gather from position 0, stale once a
        # request outgrows the window (and nothing else)
        fi = {c for c, n in res.backends.pop("flashinfer").findings.items() if n}
        assert fi <= {"stale_read"}, (name, page, fi)
    if sc.engine.overlap and name not in LIVE_0523:
        # aiter's store kernel maps its SWA slots at each layer (launch_reshape_and_cache_flash with the live
        # mapping): the scheduler's writes landing from the read-done event on, between layers, tear them (W5's
        # class, live in 0.5.23's aiter wherever its WAR barrier is on); it may also stay clean
        aiter = {c for c, n in res.backends.pop("aiter").findings.items() if n} if "aiter" in res.backends else set()
        assert aiter <= {"padding_slot", "torn_write", "missed", "clobbered", "evicted_slot"}, (name, page, aiter)
    found = {c for st in res.backends.values() for c, n in st.findings.items() if n}
    expected = GAP.get(name, set())
    if name in GAP:
        assert found == expected, (name, page, found)
    elif name in LIVE_0523:
        assert "padding_slot" in found and found <= {"padding_slot", "stale_read", "missed", "clobbered",
                                                     "evicted_slot", "torn_write"}, (name, page, found)
    elif name == R8_0523:
        assert found == {"stale_read"}, (name, page, found)
    else:
        assert not found, (name, page, {b: st.to_json() for b, st in res.backends.items() if st.total})


class _RuleAllocator(HybridAllocator):
    """An allocator that decides how far to evict itself (the seam engine_path's allocator uses)."""

    calls: list

    def evict_out_of_window(self, slots, prefix_len, window):
        from simulator.engine_model.release_model import eviction_end

        self.calls.append((slots.swa_evicted, prefix_len, window))
        self.evict_swa(slots, eviction_end(prefix_len, window, self.page_size))
        return slots.swa_evicted


@pytest.mark.parametrize("page", [1, 16])
def test_an_allocator_with_its_own_eviction_rule_is_asked_at_the_same_cadence(page):
    sc = tiny(CADENCE.format(page=page, prompt=200, output=60))

    def run(alloc_cls):
        rng = np.random.default_rng(0)
        alloc = alloc_cls(sc.pool.full_size, sc.pool.swa_size, page)
        alloc.calls = []
        sched = Scheduler(sc, alloc, make_requests(sc.workload, rng), rng, release=SGLANG_0_5_23)
        out = [(b.step, t.evicted_swa.tolist(), t.freed_swa.tolist(), t.mapping_changed.tolist())
               for b, t in sched.steps()]
        return out, alloc.calls

    plain, _ = run(HybridAllocator)
    ruled, calls = run(_RuleAllocator)
    assert ruled == plain and calls and all(w == 32 for _, _, w in calls)
