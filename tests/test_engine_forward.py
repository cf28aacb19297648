"""The release's own forward in the loop (engine_path/forward): its backends' metadata, write locations and read
tables, and a bug put into that code is not clean."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slotscope.cli import main

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parent.parent
PATCHES = Path(__file__).resolve().parent / "engine_patches"


def _run(tmp_path, name: str, *extra: str) -> tuple[int, dict, dict]:
    out = tmp_path / name
    rc = main(["run", str(ROOT / "scenarios" / "smoke.toml"), "--engine", "sglang==0.5.23", "--backends",
               "triton,torch_native", "--out", str(out), "--no-report", "-q", *extra])
    summary = json.loads((out / "summary.json").read_text())
    pieces = json.loads((out / "run.json").read_text())["engine_pieces"]
    return rc, summary, pieces


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("fwd"), "clean")


def test_the_releases_backends_run_the_eager_forwards_and_say_so(clean):
    rc, summary, pieces = clean
    assert rc == 0 and summary["findings_total"] == 0
    for b in ("triton/target", "torch_native/target"):
        got = pieces["backends"][b]
        assert got["release_forwards"] > 0
        whose = {p["piece"]: p["whose"] for p in got["pieces"]}
        assert whose["init_forward_metadata"] == "engine"
        assert whose["forward_extend / forward_decode up to set_kv_buffer (the write location)"] == "engine"
        # what stays the model's is named, with why: graph paths (for now) and triton's kernels on a CPU
        assert sum(got["model_forwards"].values()) + got["release_forwards"] == summary["steps"]
    triton = {p["piece"]: p for p in pieces["backends"]["triton/target"]["pieces"]}
    assert triton["read tables"]["whose"] == "engine"
    assert triton["attention arithmetic: decode_attention_fwd"]["whose"] == "model"
    native = {p["piece"]: p for p in pieces["backends"]["torch_native/target"]["pieces"]}
    assert native["read tables"]["whose"] == "model" and "req_to_token" in native["read tables"]["why"]


def _patched(tmp_path, patch: str) -> tuple[int, dict]:
    """A run with an engine patch, in a process of its own (a release is patched as it is imported)."""
    out = tmp_path / "patched"
    p = subprocess.run([sys.executable, "-m", "slotscope", "run", str(ROOT / "scenarios" / "smoke.toml"), "--engine",
                        "sglang==0.5.23", "--backends", "triton,torch_native", "--out", str(out), "--no-report", "-q",
                        "--engine-patch", str(PATCHES / patch)], cwd=ROOT, capture_output=True, text=True)
    return p.returncode, json.loads((out / "summary.json").read_text())


def test_a_shifted_swa_write_id_in_tritons_own_metadata_is_not_clean(tmp_path):
    rc, summary = _patched(tmp_path, "triton-swa-write-shift.yaml")
    found = {b: {c: n for c, n in s["findings"].items() if n} for b, s in summary["backends"].items()}
    assert rc == 1 and found["torch_native"] == {}
    assert found["triton"].get("missed", 0) > 0


def test_bugs_engine_runs_cases_as_release_code_and_says_which(tmp_path):
    """`slotscope bugs --engine sglang --json`: B1 real on 0.5.14 / 0.5.15, the gap real on 0.5.23 (fixed by the
    shipped patch); a case without an engine entry is model-only, with why."""
    out = tmp_path / "bugs.json"
    p = subprocess.run([sys.executable, "-m", "slotscope", "bugs", "--engine", "sglang", "--only", "B1,gap,B3",
                        "--json", str(out), "--out", str(tmp_path / "runs"), "-q"], cwd=ROOT, capture_output=True,
                       text=True)
    got = {v["case"]: v for v in json.loads(out.read_text())}
    assert p.returncode == 0, p.stdout + p.stderr
    assert {k: (v["real"], v["holds"], v["buggy"], v["fixed"]) for k, v in got.items() if k != "B3"} == {
        "B1": (True, True, "sglang==0.5.14", "sglang==0.5.15"),
        "gap": (True, True, "sglang==0.5.23", "sglang==0.5.23 + fix-gap-pad-short-swa-loc.yaml")}
    assert got["B3"]["real"] is False and got["B3"]["buggy"] is None and got["B3"]["why"]
    assert set(got["B1"]) >= {"case", "pr", "real", "buggy", "fixed", "holds"}


def test_bugs_engine_runs_fix_reverts_and_proposed_fixes_as_release_code(tmp_path):
    """B2 on 0.5.23 with #24743 reverted by a shipped patch (triton's own graph SWA refresh), R8 on 0.5.23 and with
    #38519's proposed fix as a patch: both real, both verdicts hold; W1 (the overlap scheduler's timeline) stays
    model-only, saying why."""
    out = tmp_path / "bugs.json"
    p = subprocess.run([sys.executable, "-m", "slotscope", "bugs", "--engine", "sglang", "--only", "B2,R8,W1",
                        "--json", str(out), "-q"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    got = {v["case"]: v for v in json.loads(out.read_text())}
    assert {k: (v["real"], v["holds"], v["buggy"], v["fixed"]) for k, v in got.items() if k != "W1"} == {
        "B2": (True, True, "sglang==0.5.23 + revert-24743-swa-graph-tail.yaml", "sglang==0.5.23"),
        "R8": (True, True, "sglang==0.5.23", "sglang==0.5.23 + fix-38519-filter-unmapped-swa-pages.yaml")}
    assert got["W1"]["real"] is False and "overlap scheduler" in got["W1"]["why"]
    assert "2 of 3 cases real; 2 of 2 engine verdicts hold" in p.stdout
