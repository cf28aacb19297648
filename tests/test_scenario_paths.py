"""The shipped path scenarios exercise every path of the write path, clean under their fixed designs.

``scenarios/smoke.toml`` and ``scenarios/paths-*.toml`` claim (in their descriptions and the README's
"Shipped scenarios" table) that together they cover every (forward mode, graph path) combination the
scheduler can produce, page sizes 1 and > 1, DP-attention padding, speculative decoding with an SWA draft
layer whose configured draft pools are smaller than what it uses, pools filled to their last page, a
piecewise path that hands the design a shorter ``swa_loc``, and a pool the size of a real deployment. This
test reads those claims back from the runs' own outputs (steps.jsonl, summary.json), so they cannot
silently become false.
"""
from __future__ import annotations

import json
from collections import Counter

import pytest

from simulator.scenario import BACKENDS, load_scenario
from slotscope.pipeline import RunOptions, run_scenario

from helpers import ROOT

PATH_SCENARIOS = ("smoke", "paths-paged", "paths-spec", "paths-spec-paged", "paths-noshrink", "paths-big-pool")

#: every (mode, graph) combination the scheduler can make: EXTEND / MIXED run eagerly or in piecewise graphs,
#: DECODE eagerly or in the decode graph; with speculative decoding (no MIXED batches then) the draft extends
#: eagerly after a prefill and in its draft-extend graph after a verify, and every decode-like forward runs in its
#: graph runner or, past the largest capture size, eagerly
NON_SPECULATIVE = {("extend", "eager"), ("extend", "piecewise"), ("mixed", "eager"), ("mixed", "piecewise"),
                   ("decode", "eager"), ("decode", "decode_graph")}
SPECULATIVE = {("extend", "eager"), ("extend", "piecewise"),
               ("draft_extend", "eager"), ("draft_extend", "draft_extend_graph"),
               ("draft_decode", "eager"), ("draft_decode", "draft_graph"),
               ("target_verify", "eager"), ("target_verify", "decode_graph")}
REACHABLE = NON_SPECULATIVE | SPECULATIVE

#: what each scenario covers, exactly
COVERS = {
    "smoke": NON_SPECULATIVE,
    "paths-paged": NON_SPECULATIVE,
    "paths-noshrink": NON_SPECULATIVE,
    "paths-spec": SPECULATIVE,
    # every prefill chunk fits the largest piecewise capture size
    "paths-spec-paged": SPECULATIVE - {("extend", "eager")},
    "paths-big-pool": {("extend", "eager"), ("extend", "piecewise"), ("decode", "decode_graph")},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each path scenario run once under its own (fixed) design, outputs on disk."""
    out = {}
    for name in PATH_SCENARIOS:
        d = tmp_path_factory.mktemp(name)
        run_scenario(ROOT / "scenarios" / f"{name}.toml", d, RunOptions(device="cpu", trace_level="off", report=False))
        steps = [json.loads(line) for line in (d / "steps.jsonl").read_text().splitlines()]
        summary = json.loads((d / "summary.json").read_text())
        out[name] = (load_scenario(ROOT / "scenarios" / f"{name}.toml"), steps, summary)
    return out


def combos(steps) -> Counter:
    return Counter((s["mode"], s["graph"]) for s in steps)


@pytest.mark.parametrize("name", PATH_SCENARIOS)
def test_path_scenario_is_clean_on_every_backend_and_covers_its_paths(runs, name):
    sc, steps, summary = runs[name]
    assert "incomplete" not in summary
    assert list(summary["backends"]) == list(BACKENDS)
    for backend, b in summary["backends"].items():
        assert b["writes"] > 0, backend
        assert not any(b["findings"].values()), (name, backend, b)
        assert b["first_finding"] is None
    assert set(combos(steps)) == COVERS[name], (name, combos(steps))


def test_together_every_reachable_mode_and_graph_path(runs):
    seen = Counter()
    for _, steps, _ in runs.values():
        seen.update(combos(steps))
    assert set(seen) == REACHABLE
    # and not just once: every combination at least twice over the set
    assert min(seen.values()) >= 2, seen


def test_dp_padding_reaches_piecewise_eager_and_graph_batches(runs):
    """DP-attention padding (B1's precondition) in piecewise EXTEND and MIXED batches and in speculative ones."""
    padded = Counter()
    for name, (_, steps, _) in runs.items():
        for s in steps:
            if s["dp_padded_tokens"] > s["real_tokens"]:
                padded[(name, s["mode"], s["graph"])] += 1
    for name in ("smoke", "paths-paged", "paths-noshrink"):
        assert padded[(name, "mixed", "piecewise")] >= 1, name
        assert padded[(name, "mixed", "eager")] >= 1, name
        assert padded[(name, "decode", "decode_graph")] >= 1, name
    for mode_graph in (("extend", "piecewise"), ("extend", "eager"), ("draft_decode", "draft_graph"),
                       ("target_verify", "decode_graph"), ("draft_extend", "draft_extend_graph")):
        assert padded[("paths-spec", *mode_graph)] >= 1, mode_graph
    # and batches without DP padding under graphs too (the rows past the batch are graph padding only)
    for name in ("smoke", "paths-spec"):
        _, steps, _ = runs[name]
        assert any(s["graph"] == "piecewise" and s["dp_padded_tokens"] == s["real_tokens"] < s["padded_tokens"]
                   for s in steps), name


def test_page_sizes_one_and_sixteen(runs):
    pages = {name: sc.pool.page_size for name, (sc, _, _) in runs.items()}
    assert pages == {"smoke": 1, "paths-paged": 16, "paths-spec": 1, "paths-spec-paged": 16, "paths-noshrink": 1,
                     "paths-big-pool": 1}
    for name in ("paths-paged", "paths-spec-paged"):
        _, steps, _ = runs[name]
        # page-aligned allocation: occupancy moves in whole pages
        assert all(s["full_used"] % 16 == 0 and s["swa_used"] % 16 == 0 for s in steps), name


def test_speculative_swa_draft_outgrows_its_configured_pools(runs):
    """An SWA draft layer, and live indices past the draft's configured pool sizes (the fixed design enlarges them)."""
    for name in ("paths-spec", "paths-spec-paged"):
        sc, steps, _ = runs[name]
        spec = sc.engine.speculative
        assert spec.enabled and "swa" in spec.draft_layers and "full" in spec.draft_layers, name
        cfg = spec.draft_pool(sc.pool)
        assert cfg.full_size < sc.pool.full_size and cfg.swa_size < sc.pool.swa_size, name
        assert max(s["full_used"] for s in steps) > cfg.full_size, name
        assert max(s["swa_used"] for s in steps) > cfg.swa_size, name


def test_paged_speculative_pools_fill_to_their_last_page(runs):
    """A draft pool even one page short of the target's is caught only if the last page is ever used."""
    sc, steps, _ = runs["paths-spec-paged"]
    assert max(s["full_used"] for s in steps) == sc.pool.full_size == 512
    assert max(s["swa_used"] for s in steps) == sc.pool.swa_size == 256


def test_unshrunk_piecewise_hands_a_shorter_swa_loc(runs):
    """paths-noshrink: piecewise layers see the capture size, metadata the DP-padded batch: shorter swa_loc."""
    sc, steps, _ = runs["paths-noshrink"]
    assert sc.engine.piecewise_cuda_graph and not sc.engine.piecewise_shrink
    assert sc.design == "kvwriteloc-strict"
    shorter = [s for s in steps if s["graph"] == "piecewise" and s["dp_padded_tokens"] < s["padded_tokens"]]
    assert {s["mode"] for s in shorter} == {"extend", "mixed"}


def test_big_pool_is_deployment_size_and_its_indices_pass_16_bits(runs):
    """Low pages are handed out first, so occupancy past 65,536 means indices past 65,535 in both pools."""
    sc, steps, summary = runs["paths-big-pool"]
    assert sc.pool.full_size == 262144
    assert {s["full_size"] for s in steps} == {262144} and {s["swa_size"] for s in steps} == {209715}
    assert max(s["full_used"] for s in steps) > 65536 and max(s["swa_used"] for s in steps) > 65536
    # the decode graph replays at full-pool indices past 65,535 too (the long request keeps its slots)
    assert any(s["graph"] == "decode_graph" and s["full_used"] > 70000 for s in steps)
    assert summary["steps"] == len(steps) <= 32        # kept fast by a short workload
