"""The PD decode node (engine.pd_decode, simulator/scheduling/pd_decode.py): validation, the SWA-tail length, the transfer's
ownership in the oracle, and the switches A1 / A2 on its paths (corpus rows A1, A2: tests/test_pinned_counts.py)."""
from __future__ import annotations

import numpy as np
import pytest

from simulator.scheduling.batch import BatchTruth, Transfer
from simulator.scheduling.pd_decode import swa_tail_len
from simulator.oracle.reference import ReferencePool
from simulator.scenario import ScenarioError, parse_scenario

from helpers import ROOT

BASE = """
[model]
layers = "SF"
window = 32
[pool]
full_size = 1024
page_size = {page}
[workload]
requests = 2
[engine]
pd_decode = true
{extra}
"""


@pytest.mark.parametrize("page, extra, field, words", [
    (16, "radix_cache = true", "engine.radix_cache", "chunk cache"),
    (16, "reserve = \"none\"", "engine.reserve", "pre-allocates whole requests"),
    (16, "overlap = true", "engine.overlap", "not modelled on a decode node"),
    (16, "mixed_chunk = true", "engine.mixed_chunk", "no prefill chunks"),
])
def test_pd_decode_refuses_what_it_does_not_run_with(page, extra, field, words):
    with pytest.raises(ScenarioError) as e:
        parse_scenario(BASE.format(page=page, extra=extra), "x.toml")
    assert "x.toml" in str(e.value) and field in str(e.value) and words in str(e.value)


def test_pd_decode_parses_and_round_trips():
    from simulator.scenario import scenario_data
    from simulator.scenario.toml_write import dumps

    sc = parse_scenario(BASE.format(page=16, extra=""), "x.toml")
    assert sc.engine.pd_decode is True and sc.engine.radix_cache is False
    data = scenario_data(sc, defaults=False)
    assert data["engine"]["pd_decode"] is True
    assert parse_scenario(dumps(data), "y.toml").engine == sc.engine


@pytest.mark.parametrize("seq, tail", [(20, 20), (32, 32), (40, 40), (48, 32), (49, 33), (400, 32), (401, 33), (0, 0)])
def test_swa_tail_len_starts_at_the_page_of_the_window(seq, tail):
    # window 32, page 16: the window's first token is seq - 32, floored to its page
    assert swa_tail_len(seq, 32, 16) == tail


def test_the_transfer_is_owned_not_written():
    ref = ReferencePool(64, 64)
    E = np.zeros(0, np.int64)
    tr = Transfer(np.array([16, 17, 18]), np.array([5, 6, 7]), np.array([33]), np.array([7]))
    ref.apply_frees(BatchTruth(E, E, E, E, E, E, E, transferred=tr))
    assert ref.live["full"][[16, 17, 18]].all() and ref.expected["full"][[16, 17, 18]].tolist() == [5, 6, 7]
    assert ref.live["swa"][33] and ref.live_tag["swa"][33] == 7 and ref.live["swa"].sum() == 1
    assert ref.live_tag["full"].sum() == 18


def test_a2_first_divergent_slot_history_shows_the_foreign_free(tmp_path):
    """A2's first finding: SWA page 13 given back by request 6's rejected drafts (step 49), freed again at step 80 by
    request 7's finish (through a stale mapping on its non-tail ids, A1's seed that A2 kept), so the free list holds
    it twice and requests 11 and 13 are both given it at step 80."""
    from slotscope.pipeline import RunOptions, run_scenario

    res = run_scenario(ROOT / "scenarios" / "a2-pd-decode-swa-tail.toml", tmp_path / "a2",
                       RunOptions(backends=("triton",), device="cpu", trace_level="off", report=False))
    own = res.summary["radix"]["ownership"]
    assert (own["pool"], own["slot"], own["step"], own["class"]) == ("swa", 208, 83, "stale_read")
    at80 = [e[:4] for e in own["events"] if e[0] in (49, 80)]
    assert at80[:4] == [[49, "free", "reject", "request:6"], [80, "free", "release", "request:7"],
                        [80, "available", "release", None], [80, "alloc", "transfer", "request:11"]]
    assert [80, "alloc", "transfer", "request:13"] in at80


def test_the_mid_2026_decode_node_refuses_an_engine_allocator():
    """The mid-2026 node's free paths (the A1 / A2 switches) are the model's only: another allocator than the
    model's is refused under that release behaviour (0.5.23's row free runs on an engine's: test_engine_pd.py)."""
    from simulator.scheduling.pd_decode import PDDecodeScheduler
    from simulator.scenario import load_scenario

    sc = load_scenario(ROOT / "scenarios" / "a2-pd-decode-swa-tail.toml")
    with pytest.raises(ScenarioError, match=r"a2-pd-decode-swa-tail\.toml: engine\.pd_decode on an engine's allocator "
                                            r"\(--engine\) under release behaviour mid-2026"):
        PDDecodeScheduler(sc, object(), [], np.random.default_rng(0))


def test_page_1_allocates_both_pools_for_the_prompt_and_transfers_the_window():
    """Page 1 (no SWA-tail allocation at page 1 in the release): the transfer holds the whole prompt's full slots
    and the window's SWA slots; the prompt's other SWA slots are allocated (mapped) and evicted later; A1 / A2
    cannot arise: the buggy state runs clean over all 48 requests."""
    from slotscope.pipeline import RunOptions, run_scenario
    from simulator.memory.allocator import HybridAllocator
    from simulator.designs import load_design
    from simulator.run import make_scheduler
    from simulator.scenario import load_scenario

    sc = _at_page(load_scenario(ROOT / "scenarios" / "a2-pd-decode-swa-tail.toml").with_overrides(
        backends=("triton",)), 1)
    alloc = HybridAllocator(sc.pool.full_size, sc.pool.swa_size, 1)
    sched = make_scheduler(sc, alloc, load_design("sglang-0.5.23").release, np.random.default_rng(sc.seed), 0, False)
    for batch, truth in sched.steps():
        tr = truth.transferred
        if tr is not None and tr.full_slots.size >= 400:
            break
    long = next(r for r in sched.running if r.spec.prompt_len == 400)
    s = long.slots
    assert s.swa_evicted == 0 and np.count_nonzero(alloc.full_to_swa[s.full[:400]]) == 400
    assert np.isin(s.full[:400], tr.full_slots).all() and np.isin(s.swa[368:400], tr.swa_slots).all()
    assert not np.isin(s.swa[:368], tr.swa_slots).any()
    res = run_scenario(sc, None, RunOptions(design="pd-decode-pre-25805", device="cpu", trace_level="off",
                                            report=False))
    assert res.summary["steps"] == 385 and res.summary["radix"]["pd_decode"]["transfers"] == 48
    assert not any(res.summary["backends"]["triton"]["findings"].values())
    assert "stopped" not in res.summary["radix"]


def _at_page(sc, page):
    import dataclasses

    return dataclasses.replace(sc, pool=dataclasses.replace(sc.pool, page_size=page))


#: steps: 81 and 77 EAGLE rounds, each with num_steps - 1 = 2 draft forwards (0.5.23's draft_forward breaks before the last)
@pytest.mark.parametrize("page, steps, kept", [(16, 324, 946), (1, 308, 0)])
def test_the_0_5_23_node_frees_rows_whole_and_runs_clean(page, steps, kept):
    """sglang-0.5.23 (both fixes, the row free of release_kv_cache): A2's scenario is clean at either page size; the
    over-allocated ids of a finished request's last page are cleared with it (no stale mapping at the end)."""
    from slotscope.pipeline import RunOptions, run_scenario
    from simulator.scenario import load_scenario

    sc = _at_page(load_scenario(ROOT / "scenarios" / "a2-pd-decode-swa-tail.toml").with_overrides(
        backends=("triton",)), page)
    res = run_scenario(sc, None, RunOptions(design="sglang-0.5.23", device="cpu", trace_level="off", report=False))
    pd = res.summary["radix"]["pd_decode"]
    assert res.summary["steps"] == steps and pd["transfers"] == 48 and pd["overallocated_kept"] == kept
    assert pd["stale_mappings_at_end"] == 0 and "stopped" not in res.summary["radix"]
    assert res.summary["radix"]["events"]["free:full:release"] == 48
    assert not any(res.summary["backends"]["triton"]["findings"].values())


def test_the_transfer_writes_its_rows_into_every_pool_of_both_sides():
    """After the first step every slot the oracle holds live carries its tag in the pools (target and draft):
    the transferred prompt rows (full for the whole prompt, SWA for the tail) are there, though no backend wrote
    them; the SWA slots of the non-tail positions are not."""
    import torch

    from cuda_path.pool import TaggedKVPool
    from simulator.designs import load_design
    from simulator.core.eager import EagerExecutor
    from simulator.run import make_run
    from simulator.scenario import load_scenario

    sc = load_scenario(ROOT / "scenarios" / "a2-pd-decode-swa-tail.toml").with_overrides(backends=("triton",))

    def make(full_rows, swa_rows, skip):
        return TaggedKVPool(sc.model, full_rows, swa_rows, device="cpu", geometry="compact", store_impl="torch",
                            skip_index=skip)

    run = make_run(sc, load_design("pd-decode-post-25805"), make, executor=EagerExecutor())
    for batch, truth in run.scheduler.steps():      # up to the first transfer of a long prompt (a non-tail part)
        run.step(batch, truth)
        tr = truth.transferred
        if tr is not None and tr.full_slots.size > tr.swa_slots.size:
            break
    # two 400-token prompts: 2 x 368 non-tail positions
    assert batch.step == 5 and (tr.full_slots.size, tr.swa_slots.size) == (800, 64)
    for side in run.sides:
        for kind in ("full", "swa"):
            layers = [li.index for li in side.layers if li.kind == kind]
            if not layers:                 # the draft ("F") has no SWA layer
                continue
            live = np.flatnonzero(side.reference.live[kind])
            assert live.size >= (tr.full_slots.size if kind == "full" else tr.swa_slots.size)
            bad = side.pools["triton"].mismatches(kind, torch.from_numpy(live),
                                                  torch.from_numpy(side.reference.expected[kind][live]), layers)
            assert not bad.any(), (side.layers[0].draft, kind)


#: ``slotscope minimize`` of a1-spec-partial-page-free's triton run (66 s, 352 candidate runs): 8 requests, one SWA
#: target layer; the chain in 65 forwards
A1_MINIMAL = """name = "a1-minimal"
seed = 1
design = "pd-decode-pre-25805"
backends = ["triton"]

[model]
layers = "S"
window = 32

[pool]
full_size = 2048
swa_ratio = 0.5
page_size = 16

[[workload.request]]
arrival_step = 0
prompt_len = 3
output_len = 10

[[workload.request]]
arrival_step = 5
prompt_len = 400
output_len = 18

[[workload.request]]
arrival_step = 5
prompt_len = 11
output_len = 18

[[workload.request]]
arrival_step = 5
prompt_len = 18
output_len = 12

[[workload.request]]
arrival_step = 6
prompt_len = 15
output_len = 16

[[workload.request]]
arrival_step = 0
prompt_len = 400
output_len = 15

[[workload.request]]
arrival_step = 9
prompt_len = 100
output_len = 0

[[workload.request]]
arrival_step = 10
prompt_len = 1
output_len = 7

[engine]
max_running_requests = 8
pd_decode = true

[engine.speculative]
accept_rate = 0.5
"""


@pytest.mark.parametrize("design, findings", [
    ("pd-decode-pre-25805", {"stale_read": 1}),
    ("pd-decode-post-25805", {}),                      # A2 fixed: A1's seeds stay, nothing frees them
    ("pd-decode-pre-25805-post-27779", {}),            # A1 fixed: no seed
])
def test_the_minimal_a1_chain(design, findings):
    from slotscope.pipeline import RunOptions, run_scenario

    sc = parse_scenario(A1_MINIMAL, "a1-minimal.toml")
    res = run_scenario(sc, None, RunOptions(design=design, device="cpu", trace_level="off", report=False))
    st = res.summary["backends"]["triton"]
    assert res.summary["steps"] == 65 and st["writes"] == 65
    assert {c: n for c, n in st["findings"].items() if n} == findings
    assert res.summary["radix"]["pd_decode"]["transfers"] == 8
    ff = st["first_finding"]
    assert (None if ff is None else (ff["step"], ff["class"])) == ((63, "stale_read") if findings else None)


SMALL_DRAFT = """
name = "pd-small-draft"
seed = 933096865
backends = ["flashinfer", "triton"]
max_steps = 120
[model]
preset = "gpt-oss-120b"
layers = "SFSF"
[pool]
full_size = 66
page_size = 2
[workload]
requests = 3
arrival = "poisson"
rate = 0.5
prompt_len = { dist = "uniform", min = 7, max = 31 }
output_len = { dist = "uniform", min = 2, max = 7 }
[engine]
piecewise_cuda_graph = true
cuda_graph = false
pd_decode = true
[engine.speculative]
num_draft_tokens = 5
accept_rate = 1.0
draft_full_size = 16
"""


@pytest.mark.parametrize("design, oor, stale", [("sglang-pre-17630", 23, 146), ("sglang-post-29460", 0, 0)])
def test_a_transfer_past_a_smaller_draft_pool_is_not_a_store_error(tmp_path, design, oor, stale):
    """A decode node with EAGLE and a draft pool configured smaller than the target's (B3's mistake, found by
    fuzz): the transfer writes the rows the draft pool holds and nothing past it, so the store's out-of-range
    count the checker reads is the forwards' own (the run used to stop: "store error buffer counted 11
    out-of-range indices ... the host sees 1"). The buggy design's forwards write past the draft pool and are
    reported; the fix (the draft pool as large as the target's) is clean."""
    from slotscope.pipeline import RunOptions, run_scenario

    path = tmp_path / "pd-small-draft.toml"
    path.write_text(SMALL_DRAFT)
    out = run_scenario(path, None, RunOptions(design=design, device="cpu", trace_level="off", report=False))
    assert len(out.result.steps) == 18
    for name in ("flashinfer", "triton"):
        found = out.result.backends[name].findings
        assert (found["out_of_range"], found["stale_read"]) == (oor, stale), name
        assert sum(found.values()) == oor + stale
