"""Round trip on real runs: run -> trace.otlp.jsonl -> analyze gives the counts of summary.json."""
from __future__ import annotations

import json

import pytest

from slotscope.cli import main
from tracing.analyze import analyze_files

from helpers import ROOT


@pytest.mark.parametrize("name, design, level", [
    ("b1-pcg-dp-padding", "sglang-pre-29460", "anomaly"),
    ("b2-decode-stale-tail", "sglang-pre-24743", "step"),
    ("gap-swa-shorter", "sglang-post-29460", "boundary"),
])
def test_analyze_reproduces_summary_counts(tmp_path, name, design, level):
    rc = main(["run", str(ROOT / f"scenarios/{name}.toml"), "--design", design, "--out", str(tmp_path), "-q",
               "--no-report", "--trace-level", level])
    assert rc == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    run = analyze_files([tmp_path / "trace.otlp.jsonl"]).to_json()["slotscope_runs"][0]
    assert (run["scenario"], run["design"], run["seed"]) == (summary["scenario"], design, summary["seed"])
    assert run["boundaries"] == summary["crossings"]
    expected = {b: {c: n for c, n in s["findings"].items() if n} for b, s in summary["backends"].items()}
    assert run["findings"] == {b: f for b, f in expected.items() if f}
    # swa_loc / loc divergence seen in the trace matches the length mismatches in the summary
    mism = sum(s["findings"]["length_mismatch"] for s in summary["backends"].values())
    assert run["diverging"] == mism
    if mism:
        first = run["first_divergence"]
        fb = summary["backends"][first["backend"]]["first_finding"]
        assert (first["step"], first["layer"]) == (fb["step"], fb["layer"])
