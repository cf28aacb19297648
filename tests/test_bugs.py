"""The known bugs reproduce under the designs that had them and vanish under the fixes."""
from __future__ import annotations

from simulator.scenario import BACKENDS

from helpers import ROOT, scenario, simulate

def test_b1_pre_fix_length_mismatch_at_first_swa_layer_on_every_backend():
    """No release backend sliced its own swa_loc (0.5.14's trtllm_mha neither): all eight hit B1."""
    sc = scenario("b1-pcg-dp-padding")
    first_swa = next(l.layer for l in sc.model.layers() if l.kind == "swa")
    r = simulate(sc, "sglang-pre-29460")
    for b in BACKENDS:
        st = r.backends[b]
        assert st.findings["length_mismatch"] > 0, b
        assert st.first_finding.cls == "length_mismatch"
        assert st.first_finding.layer == first_swa
        assert sum(st.findings.values()) == st.findings["length_mismatch"]
    msg = next(f.message for f in r.findings if f.cls == "length_mismatch")
    assert msg.startswith("Size mismatch") and "expected" in msg and "but got" in msg


def test_b1_post_fix_is_clean_everywhere():
    r = simulate("b1-pcg-dp-padding", "sglang-post-29460")
    assert {b: s.total for b, s in r.backends.items()} == dict.fromkeys(BACKENDS, 0)


def test_b1_findings_only_on_swa_layers_and_only_under_piecewise():
    r = simulate("b1-pcg-dp-padding", "sglang-pre-29460")
    graph_of = {s.step: s.graph for s in r.steps}
    assert r.findings
    for f in r.findings:
        assert f.kind == "swa"
        assert graph_of[f.step] == "piecewise"


def test_b2_pre_fix_clobbers_live_swa_slots_with_padding():
    r = simulate("b2-decode-stale-tail", "sglang-pre-24743")
    for b in BACKENDS:
        assert r.backends[b].findings["clobbered"] > 0, b
    clobbers = [f for f in r.findings if f.cls == "clobbered"]
    assert all(f.kind == "swa" for f in clobbers)
    # the observed owner is a padding row and the expected one a real token of another request
    assert all(f.observed.tag == -1 for f in clobbers)
    assert all(f.expected.request is not None for f in clobbers)
    graph_of = {s.step: s.graph for s in r.steps}
    assert {graph_of[f.step] for f in clobbers} == {"decode_graph"}


def test_b2_fixed_design_is_clean():
    for design in ("sglang-post-29460", "sglang-pre-29460"):
        r = simulate("b2-decode-stale-tail", design)
        assert r.total_findings == 0, design


def test_post_fix_gap_swa_loc_shorter_than_loc_still_fails():
    r = simulate("gap-swa-shorter", "sglang-post-29460")
    for b in BACKENDS:
        st = r.backends[b]
        assert st.findings["length_mismatch"] > 0, b
    # and the example user design that pads the short swa_loc closes the gap
    fixed = simulate("gap-swa-shorter", str(ROOT / "examples/designs/my_fix.py") + ":StrictSlice")
    assert fixed.total_findings == 0


def test_smoke_is_clean_and_exercises_every_path():
    r = simulate("smoke")
    assert r.total_findings == 0
    assert {s.mode for s in r.steps} >= {"extend", "decode"}
    assert {s.graph for s in r.steps} >= {"eager", "decode_graph"}
