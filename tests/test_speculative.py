"""Speculative decoding: the [engine.speculative] section, EAGLE rounds in the scheduler, the draft's
pools in the run loop, and bugs B3 (#17630) and B4 (#29858)."""
from __future__ import annotations

import numpy as np
import pytest

from simulator.memory.allocator import HybridAllocator, RequestSlots
from simulator.scenario.capture import speculative_decode_capture_sizes
from simulator.records import DRAFT_MODES
from simulator.scenario import BACKENDS, ScenarioError
from simulator.scheduling.scheduler import Scheduler
from simulator.scheduling.workload import make_requests

from helpers import scenario, simulate, tiny

SPEC = """
seed = 3
[model]
layers = "SFSF"
window = 32
[pool]
full_size = 2048
swa_ratio = 0.5
{pool}
[workload]
requests = 5
prompt_len = {{ dist = "uniform", min = 20, max = 300 }}
output_len = {{ dist = "uniform", min = 4, max = 30 }}
[engine]
chunked_prefill_size = 128
{engine}
[engine.speculative]
{spec}
"""


def spec_scenario(spec: str = "", engine: str = "", pool: str = ""):
    return tiny(SPEC.format(spec=spec, engine=engine, pool=pool))


def schedule(sc):
    rng = np.random.default_rng(sc.seed)
    alloc = HybridAllocator(sc.pool.full_size, sc.pool.swa_size, sc.pool.page_size)
    sched = Scheduler(sc, alloc, make_requests(sc.workload, rng), rng)
    out = []
    for batch, truth in sched.steps():
        out.append((batch, truth))
        alloc.check_invariants([r.slots for r in sched.running])
    return out, sched, alloc


# ------------------------------------------------------------------------------------------ scenario

def test_section_defaults_and_speculative_capture_sizes():
    sc = spec_scenario()
    s = sc.engine.speculative
    assert s.enabled and s.algorithm == "eagle" and s.num_draft_tokens == 4 and s.num_steps == 3
    assert s.draft_layers == ("full",)
    assert s.draft_pool(sc.pool) == sc.pool          # draft pools default to the target's sizes
    assert sc.engine.cuda_graph_bs == speculative_decode_capture_sizes(256)
    assert not scenario("smoke").engine.speculative.enabled


@pytest.mark.parametrize("spec,engine,needle", [
    ("num_draft_tokens = 1", "", "engine.speculative.num_draft_tokens: must be >= 2"),
    ('algorithm = "medusa"', "",
     "engine.speculative.algorithm: 'medusa' is not allowed (allowed: eagle, extract_hidden_states)"),
    ('draft_layers = "FX"', "", "engine.speculative.draft_layers: layer pattern may hold only"),
    ('draft_layers = ""', "", "engine.speculative.draft_layers: must hold at least one layer"),
    ("draft_full_size = 1000", "", "engine.speculative.draft_full_size: must be a multiple of pool.page_size 16"),
    ("accept_rate = 1.5", "", "engine.speculative.accept_rate: must be <= 1.0"),
    ("draft_swa_ratio = 0.001\ndraft_layers = \"S\"", "", "engine.speculative.draft_swa_ratio: leaves the draft an SWA"),
    ("bogus = 1", "", "engine.speculative.bogus: unknown key"),
    ("", "mixed_chunk = true", "engine.mixed_chunk: cannot be true with speculative decoding"),
])
def test_bad_fields_are_named(spec, engine, needle):
    with pytest.raises(ScenarioError) as e:
        spec_scenario(spec, engine, pool="page_size = 16")
    assert needle in str(e.value) and "tiny.toml" in str(e.value)


# ------------------------------------------------------------------------------------------ allocator

@pytest.mark.parametrize("page", [1, 4])
def test_truncate_gives_back_whole_pages_and_keeps_invariants(page):
    a = HybridAllocator(64, 32, page)
    r = RequestSlots(40)
    a.extend(r, 9)
    full_used = a.full_used
    a.extend(r, 7)                       # 16 tokens
    assert a.truncate(r, 9) == 7
    assert r.length == 9 and a.full_used == full_used and a.swa_used == full_used
    assert (a.full_to_swa[r.full[:9]] > 0).all()
    a.check_invariants([r])
    again = a.extend(r, 3)               # refills the kept page first
    assert again[0] == r.full[8] + 1 or page == 1
    a.check_invariants([r])
    a.free(r)
    assert a.full_used == 0 and a.swa_used == 0


# ------------------------------------------------------------------------------------------ scheduler

def test_eagle_round_order_sizes_and_graphs():
    sc = spec_scenario()
    out, sched, alloc = schedule(sc)
    d = sc.engine.speculative.num_draft_tokens
    modes = [b.mode for b, _ in out]
    assert set(modes) == {"extend", "draft_extend", "draft_decode", "target_verify"}
    for i, (b, t) in enumerate(out):
        if b.mode == "extend":     # prefill, then the draft extends over the same tokens, eagerly
            nb, nt = out[i + 1]
            assert nb.mode == "draft_extend" and nb.graph == "eager"
            assert np.array_equal(nb.out_cache_loc, b.out_cache_loc) and np.array_equal(nt.tags, t.tags)
        if b.mode == "target_verify":
            bs = b.num_requests
            assert [x.mode for x, _ in out[i - d + 1:i]] == ["draft_decode"] * (d - 1)
            assert all(x.num_token_non_padded == bs for x, _ in out[i - d + 1:i])
            assert b.num_token_non_padded == bs * d
            cap = min(c for c in sc.engine.cuda_graph_bs if c >= bs)
            assert b.graph == "decode_graph" and b.padded_len == cap * d
            de, dt = out[i + 1]
            assert de.mode == "draft_extend" and de.graph == "draft_extend_graph" and de.padded_len == cap * d
            assert bs <= de.num_token_non_padded <= bs * d
            # the accepted tokens are the first ones the target verified, in the same slots
            assert set(dt.full_slots.tolist()) <= set(t.full_slots.tolist())
            assert set(dt.freed_full.tolist()) == set(t.full_slots.tolist()) - set(dt.full_slots.tolist())
    assert sched.finished_count == sched.total_requests
    assert alloc.full_used == 0 and alloc.swa_used == 0       # nothing leaks: rejected tokens gave slots back


def test_draft_decode_slots_are_given_back_before_verify():
    sc = spec_scenario()
    out, _, _ = schedule(sc)
    for i, (b, t) in enumerate(out):
        if b.mode == "target_verify":
            temp = np.concatenate([x[1].full_slots for x in out[i - 3:i]])
            assert set(temp.tolist()) <= set(t.freed_full.tolist())


# ------------------------------------------------------------------------------------------ runs

def test_speculative_run_is_clean_with_paging_dp_and_graphs():
    sc = spec_scenario('draft_layers = "FS"', "dp_size = 2\npiecewise_cuda_graph = true", "page_size = 16")
    r = simulate(sc, "sglang-pr-29858")
    assert r.total_findings == 0
    graphs = {(s.mode, s.graph) for s in r.steps}
    assert {("draft_decode", "draft_graph"), ("target_verify", "decode_graph"),
            ("draft_extend", "draft_extend_graph"), ("extend", "piecewise")} <= graphs
    n = sc.model.num_layers
    draft = [li for li in r.info.layers if li.draft]
    assert [(li.layer, li.kind, li.index) for li in draft] == [(n, "full", 0), (n + 1, "swa", 0)]
    per_backend = sum(2 if s.mode in DRAFT_MODES else n for s in r.steps)
    assert all(st.writes == per_backend for st in r.backends.values())


def test_model_aware_draft_pool_factory_gives_the_same_result():
    from cuda_path.pool import TaggedKVPool
    from simulator.designs import load_design
    from simulator.run import run_simulation

    sc = scenario("b3-draft-pool-size").with_overrides(backends=("flashinfer", "xpu"))
    design = load_design(sc.design)

    def make(full_rows, swa_rows, skip):
        return TaggedKVPool(sc.model, full_rows, swa_rows, geometry="compact", skip_index=skip)

    def make_draft(model, full_rows, swa_rows, skip):
        assert model.layer_kinds == sc.engine.speculative.draft_layers
        return TaggedKVPool(model, full_rows, swa_rows, geometry="compact", skip_index=skip)

    a = run_simulation(sc, design, make)
    b = run_simulation(sc, design, make, make_draft_pool=make_draft)
    assert a.total_findings > 0
    assert [f.to_json() for f in a.findings] == [f.to_json() for f in b.findings]


def test_b3_draft_pool_smaller_than_target_full_pool_is_out_of_range_at_the_draft_layer():
    sc = scenario("b3-draft-pool-size")
    r = simulate(sc, "sglang-pre-17630")
    n = sc.model.num_layers
    mode_of = {s.step: s.mode for s in r.steps}
    rows = sc.engine.speculative.draft_full_size + sc.pool.page_size
    for b in BACKENDS:
        st = r.backends[b]
        # the draft's writes past its pools are out_of_range; its reads there stale_read ("outside the pool")
        assert st.findings["out_of_range"] > 0 and st.total == st.findings["out_of_range"] + st.findings["stale_read"], b
    for f in r.findings:
        assert f.layer == n and f.kind == "full" and mode_of[f.step] in DRAFT_MODES
        assert f.slot >= rows and f.expected is not None and f.expected.request is not None
    fixed = simulate(sc, "sglang-post-29460")
    assert fixed.total_findings == 0


def test_b4_triton_draft_extend_graph_writes_swa_layers_with_full_indices():
    sc = scenario("b4-draft-extend-window")
    r = simulate(sc, "sglang-post-29460")
    swa_rows = sc.pool.swa_size + sc.pool.page_size
    step_of = {s.step: s for s in r.steps}
    assert r.backends["triton"].findings["out_of_range"] > 0
    assert all(r.backends[b].total == 0 for b in BACKENDS if b != "triton")
    draft_swa = next(li.layer for li in r.info.layers if li.draft and li.kind == "swa")
    for f in r.findings:
        assert f.backend == "triton" and f.layer == draft_swa and f.kind == "swa"
        assert (step_of[f.step].mode, step_of[f.step].graph) == ("draft_extend", "draft_extend_graph")
        if f.cls == "out_of_range":
            assert f.slot >= swa_rows
    assert simulate(sc, "sglang-pr-29858").total_findings == 0


def test_stale_tail_leaks_into_the_speculative_graphs_too():
    sc = spec_scenario('draft_layers = "FS"')
    r = simulate(sc, "sglang-pre-24743", backends=("flashinfer",))
    graphs = {next(s.graph for s in r.steps if s.step == f.step) for f in r.findings}
    assert r.backends["flashinfer"].findings["clobbered"] > 0
    assert graphs <= {"decode_graph", "draft_graph", "draft_extend_graph"}
