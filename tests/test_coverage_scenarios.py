"""The coverage scenarios (scenarios/cover-*.toml, issue 29 point 7): each valid, clean under its design on every
backend, reaching the path it was written for (read back from its steps, timeline and summary), failing under
the states that lack the fix of that path (exact counts), and catching the buggy designs of
tests/coverage_designs.py; fuzz counts each of these paths as a feature (tests/test_fuzz_search.py: it draws them).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from simulator.scenario import BACKENDS, load_scenario
from slotscope.fuzz_coverage import COMBOS, features
from slotscope.fuzz_search import FirstFinding, StopAtFirst
from slotscope.pipeline import RunOptions, run_scenario

import coverage_designs as cd
from helpers import ROOT

COVER = ("cover-overlap-mixed-dp-paged", "cover-overlap-retract", "cover-dp-attn-tp-eager", "cover-radix-paged",
         "cover-unified-dp-pcg-mixed")
MODULE = ROOT / "tests" / "coverage_designs.py"

#: each buggy design of tests/coverage_designs.py -> (the coverage scenario that catches it, its first finding
#: there: class, backend, step)
CATCHER = {
    cd.MixedLiveSwa: ("cover-overlap-mixed-dp-paged", ("padding_slot", "flashinfer", 23)),
    cd.SliceToWholePages: ("cover-overlap-mixed-dp-paged", ("length_mismatch", "flashinfer", 7)),
    cd.DecodeGraphLiveSwa: ("cover-overlap-retract", ("padding_slot", "flashinfer", 32)),
    cd.EagerCutToDpLength: ("cover-dp-attn-tp-eager", ("length_mismatch", "flashinfer", 7)),
    cd.EagerSliceFromEnd: ("cover-dp-attn-tp-eager", ("missed", "flashinfer", 7)),
    cd.ReadIdsPageEarly: ("cover-radix-paged", ("stale_read", "flashinfer", 1)),
    cd.RadixReadMemo: ("cover-radix-paged", ("stale_read", "flashinfer", 11)),
    cd.MixedPlanLagsOneForward: ("cover-unified-dp-pcg-mixed", ("missed", "flashinfer", 15)),
    cd.MixedPlanReusesMappedRows: ("cover-unified-dp-pcg-mixed", ("missed", "flashinfer", 15)),
}


def run(name: str, design=None, backends=None, observers=(), edit=None):
    sc = load_scenario(ROOT / "scenarios" / f"{name}.toml")
    if edit is not None:
        sc = edit(sc)
    return run_scenario(sc, None, RunOptions(design=design, backends=backends, device="cpu", trace_level="off",
                                             report=False, extra_observers=tuple(observers)))


def on_rocm(sc):
    return replace(sc, engine=replace(sc.engine, platform="rocm"))


def each(res) -> dict:
    """The findings per class, checked to be the same on every backend of the run."""
    per = [{c: n for c, n in s.findings.items() if n} for s in res.result.backends.values()]
    assert all(p == per[0] for p in per), per
    return per[0]


def landings(res) -> Counter:
    """(kind, landing point) of every scheduler write but allocations, over the run."""
    return Counter((w[0], w[2]) for s in res.result.steps for w in (s.timeline or {}).get("writes", ())
                   if w[0] != "alloc")


def combos(res, padded: bool = False) -> Counter:
    return Counter((s.mode, s.graph) for s in res.result.steps
                   if not padded or s.dp_padded_tokens > s.real_tokens)


@pytest.fixture(scope="module")
def clean():
    """Each coverage scenario under its own design, every backend."""
    return {name: run(name) for name in COVER}


#: W5's class in 0.5.23's aiter (its store kernel maps each SWA slot at its own layer, after the read-done event the
#: barrier waits for): the overlap scenario under its own design (sglang-0.5.23) is clean on every other backend
AITER_UNDER_OVERLAP = {"cover-overlap-mixed-dp-paged": {"padding_slot": 8, "torn_write": 4}}


@pytest.mark.parametrize("name", COVER)
def test_clean_under_its_design_on_every_backend(clean, name):
    res = clean[name]
    assert list(res.result.backends) == list(BACKENDS)
    assert res.incomplete is None
    found = {b: {c: n for c, n in s.findings.items() if n} for b, s in res.result.backends.items()}
    assert found == {b: AITER_UNDER_OVERLAP.get(name, {}) if b == "aiter" else {} for b in BACKENDS}
    assert all(s.writes > 0 for s in res.result.backends.values())


def test_overlap_with_mixed_dp_piecewise_paged(clean):
    """(7a): every non-speculative (mode, graph) path under the overlap scheduler on a page-16 pool, DP-padded
    piecewise MIXED batches, and frees and free_swa landing inside the forwards (from read-done on: the barrier)."""
    res = clean["cover-overlap-mixed-dp-paged"]
    sc = load_scenario(ROOT / "scenarios" / "cover-overlap-mixed-dp-paged.toml")
    assert sc.engine.overlap and sc.engine.mixed_chunk and sc.engine.piecewise_cuda_graph and sc.pool.page_size == 16
    assert len(res.result.steps) == 102
    assert combos(res) == {("decode", "decode_graph"): 23, ("decode", "eager"): 25, ("extend", "eager"): 2,
                           ("extend", "piecewise"): 6, ("mixed", "eager"): 7, ("mixed", "piecewise"): 39}
    # a full MIXED batch is 128 real tokens (the decodes come off the chunk budget), itself a capture size: of the
    # 39 piecewise ones 14 are DP-padded, 6 full ones (the other rank past 128) and 8 shorter last chunks
    assert combos(res, padded=True) == {("decode", "decode_graph"): 8, ("extend", "piecewise"): 1,
                                        ("mixed", "piecewise"): 14}
    assert landings(res) == {("free", "forward_end"): 9, ("free", "layer:1"): 2, ("free", "layer:2"): 2,
                             ("free", "layer:3"): 5, ("free", "read_done"): 2, ("free_swa", "forward_end"): 7,
                             ("free_swa", "layer:1"): 3, ("free_swa", "layer:2"): 3, ("free_swa", "layer:3"): 3,
                             ("free_swa", "read_done"): 5}
    inside_mixed = {w[0] for s in res.result.steps if s.mode == "mixed" and s.dp_padded_tokens > s.real_tokens
                    for w in (s.timeline or {}).get("writes", ()) if w[2] != "forward_end"}
    assert inside_mixed == {"alloc", "free", "free_swa"}


def test_overlap_mixed_fails_without_a_barrier():
    assert each(run("cover-overlap-mixed-dp-paged", "sglang-pre-26380", ("triton", "trtllm_mha"))) == {
        "padding_slot": 8, "stale_read": 408}
    assert each(run("cover-overlap-mixed-dp-paged", None, ("triton",), edit=on_rocm)) == {
        "padding_slot": 4, "stale_read": 256}                                            # W7: 0.5.23 on ROCm
    assert each(run("cover-overlap-mixed-dp-paged", "sglang-0.5.23-war-barrier", ("triton",), edit=on_rocm)) == {}


def test_retractions_land_inside_the_forwards(clean):
    """(7b): memory pressure retracts requests again and again; under the barrier their clears land from read-done
    on, inside decode-graph forwards."""
    res = clean["cover-overlap-retract"]
    assert len(res.result.steps) == 171
    assert combos(res) == {("decode", "decode_graph"): 147, ("decode", "eager"): 7, ("extend", "eager"): 17}
    assert {p: n for (k, p), n in landings(res).items() if k == "retract"} == {
        "forward_end": 1, "layer:2": 1, "layer:3": 2, "read_done": 3}


def test_retractions_land_before_metadata_init_without_a_barrier():
    """Without a WAR barrier three retractions' mapping clears land before the in-flight forward's metadata init,
    and every finding is on a request whose retraction raced that forward."""
    res = run("cover-overlap-retract", "sglang-pre-26380", ("triton", "trtllm_mha"))
    assert each(res) == {"padding_slot": 6, "stale_read": 96}
    writes = {s.step: (s.timeline or {}).get("writes", ()) for s in res.result.steps}
    early = [(step, w[1]) for step, ws in writes.items() for w in ws if w[0] == "retract" and w[2] == "metadata_init"]
    assert early == [(10, 3), (59, 3), (70, 5)]
    for f in res.result.findings:
        assert any(w[0] == "retract" and w[1] == f.expected.request for w in writes[f.step]), f.to_json()
    assert each(run("cover-overlap-retract", "sglang-0.5.23", ("triton",))) == {}


def test_dp_attention_tp_aligned_eager_prefills(clean):
    """(7c): extends and MIXED batches run eagerly, padded to attn_tp_size (4) and narrowed per layer: swa_loc
    longer than loc at every layer of those forwards, cut by 0.5.23's KVWriteLoc."""
    res = clean["cover-dp-attn-tp-eager"]
    sc = load_scenario(ROOT / "scenarios" / "cover-dp-attn-tp-eager.toml")
    assert sc.engine.attn_tp_size == 4 and sc.engine.dp_size == 4 and not sc.engine.piecewise_cuda_graph
    assert len(res.result.steps) == 56
    assert combos(res) == {("decode", "decode_graph"): 25, ("decode", "eager"): 4, ("extend", "eager"): 3,
                           ("mixed", "eager"): 24}
    # a full MIXED batch is 254 real tokens (the decodes come off the chunk budget), aligned up to 256: 20 of 24 padded
    assert combos(res, padded=True) == {("decode", "decode_graph"): 18, ("decode", "eager"): 4, ("extend", "eager"): 3,
                                        ("mixed", "eager"): 20}
    assert all((s.dp_padded_tokens - s.real_tokens) < 4 for s in res.result.steps
               if s.graph == "eager" and s.mode in ("extend", "mixed"))


def test_radix_cache_on_paged_pools(clean):
    """(7d): prefix hits, tombstones, recoveries and tree evictions at page 16, clean under radix-fixed and 0.5.23
    (no linker: R8 stays unreached); R2 and R3 show at page 16, R7 does not reach its trigger here."""
    res = clean["cover-radix-paged"]
    assert len(res.result.steps) == 265          # as many as the release's own scheduler (test_engine_schedule_source)
    # prompts checkpointed into the tree when their prefill completes, finished requests inserting all their KV,
    # admission by 0.5.23's per-pass budget, fresh leaves capped at one window, the paged allocations' eviction
    # demand (a page per request): 28 recoveries, 17 of them over a Full a running request locks (R2's trigger)
    assert {k: res.result.radix[k] for k in ("hit_tokens", "tombstones", "recoveries", "evicted_leaves")} == {
        "hit_tokens": 1072, "tombstones": 109, "recoveries": 28, "evicted_leaves": 163}
    assert res.result.radix["events"]["adopt:swa:recover_locked"] == 17
    assert each(run("cover-radix-paged", "sglang-0.5.23", ("triton",))) == {}
    assert each(run("cover-radix-paged", "radix-r2", ("triton",))) == {"stale_read": 5296}
    assert each(run("cover-radix-paged", "radix-r3", ("triton",))) == {"stale_read": 2519}
    assert each(run("cover-radix-paged", "radix-r7", ("triton",))) == {}


def test_unified_pool_with_dp_piecewise_mixed(clean):
    """(7e): DP-padded piecewise EXTEND and MIXED batches on the unified pool, which compacts under them; U2's state
    fails it on the two whole-row backends."""
    res = clean["cover-unified-dp-pcg-mixed"]
    assert len(res.result.steps) == 223
    # DP-padded piecewise MIXED batches (a full one is 128 real tokens, the decodes off the chunk budget: a capture
    # size, padded only when the other rank is past it)
    assert combos(res, padded=True) == {("decode", "decode_graph"): 110, ("extend", "piecewise"): 5,
                                        ("mixed", "piecewise"): 7}
    assert res.summary["unified"]["moves"] == 940 and res.summary["unified"]["pinned_moves"] == 0
    bad = run("cover-unified-dp-pcg-mixed", "sglang-unified-pre-35933", ("triton", "flashattention", "musa"))
    assert {b: {c: n for c, n in s.findings.items() if n} for b, s in bad.result.backends.items() if s.total} == {
        "flashattention": {"out_of_range": 155}, "musa": {"out_of_range": 155}}


@pytest.mark.parametrize("name", COVER)
def test_fuzz_counts_each_path_as_a_feature(clean, name):
    """fuzz_coverage names the path each coverage scenario reaches (a feature the search keeps scenarios for)."""
    sc = load_scenario(ROOT / "scenarios" / f"{name}.toml")
    reached = {f[1] for f in features(sc, clean[name].result.steps, clean[name].result.radix) if f[0] == "combo"}
    assert reached == {COMBOS[COVER.index(name)]}




def test_the_buggy_designs():
    assert len(CATCHER) >= 8 and len({m.name for m in CATCHER}) == len(CATCHER)
    for m in CATCHER:
        assert m.__doc__ and len(m.__doc__.split()) >= 20, m.__name__
        assert issubclass(m, (cd.Release0523, cd.Post33587, cd.RadixFixed, cd.Unified0523)), m.__name__


@pytest.mark.parametrize("mutant", list(CATCHER), ids=lambda m: m.__name__)
def test_buggy_design_is_caught_by_a_coverage_scenario(mutant):
    """Each buggy design fails its path's scenario (the clean design of that path runs it clean: above); the
    first finding, exactly."""
    scenario, first = CATCHER[mutant]
    assert load_scenario(ROOT / "scenarios" / f"{scenario}.toml").design == \
        next(b for b in (cd.Unified0523, cd.RadixFixed, cd.Post33587, cd.Release0523) if issubclass(mutant, b)).name
    with pytest.raises(FirstFinding) as caught:
        run(scenario, f"{MODULE}:{mutant.__name__}", observers=[StopAtFirst()])
    f = caught.value.finding
    assert (f.cls, f.backend, f.step) == first


def test_decode_graph_live_swa_is_caught_through_retractions():
    """DecodeGraphLiveSwa's findings on the retraction scenario are on requests whose retraction (8) or finish (6)
    cleared their mapping between the forward's layers."""
    res = run("cover-overlap-retract", f"{MODULE}:DecodeGraphLiveSwa", ("triton",))
    writes = {s.step: (s.timeline or {}).get("writes", ()) for s in res.result.steps}
    by = Counter(next(w[0] for w in writes[f.step] if w[0] in ("retract", "free") and w[1] == f.expected.request)
                 for f in res.result.findings)
    assert by == {"retract": 8, "free": 6}
