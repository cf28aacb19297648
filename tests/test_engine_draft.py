"""An EAGLE draft's own forward as release code (engine_path/forward/runner.py's draft stand-in): the draft's
extend after each prefill runs through the release's eight backends over the draft's own pool (a hybrid
``SWAKVPool`` for a draft with SWA layers, the plain ``MHATokenToKVPool`` for one of full layers), its layers
numbered from 0 as the release numbers them; the draft's other forwards are the model's, each with its reason;
a bug put into a backend's draft-only code is found on that backend's draft side only."""
from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.scenario.parse import load_scenario

ROOT = Path(__file__).resolve().parent.parent
PATCHES = Path(__file__).resolve().parent / "engine_patches"
BACKENDS = ("flashinfer", "triton", "flashattention", "trtllm_mha", "aiter", "xpu", "torch_native", "musa")


def _run(scenario: str, out: Path, *patches: str) -> tuple[int, dict, dict, list[dict]]:
    cmd = [sys.executable, "-m", "slotscope", "run", str(ROOT / "scenarios" / f"{scenario}.toml"),
           "--engine", "sglang==0.5.23", "--out", str(out), "--no-report", "-q"]
    for p in patches:
        cmd += ["--engine-patch", str(PATCHES / p)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    findings = [json.loads(x) for x in (out / "findings.jsonl").read_text().splitlines() if x]
    return (p.returncode, json.loads((out / "summary.json").read_text()), json.loads((out / "run.json").read_text()),
            findings)


def _by_side(findings: list[dict], scenario: str) -> collections.Counter:
    """Findings by (backend, class, model side): a design error names its side, the draft's layers are numbered
    after the target's."""
    n = load_scenario(ROOT / "scenarios" / f"{scenario}.toml").model.num_layers
    return collections.Counter((f["backend"], f["class"], "draft" if "(draft, " in f["message"] or f["layer"] >= n
                                else "target") for f in findings)


def _run_in_process(scenario: str, out: Path) -> tuple[int, dict, dict, list[dict]]:
    from slotscope.cli import main

    rc = main(["run", str(ROOT / "scenarios" / f"{scenario}.toml"), "--engine", "sglang==0.5.23", "--out", str(out),
               "--no-report", "-q"])
    findings = [json.loads(x) for x in (out / "findings.jsonl").read_text().splitlines() if x]
    return rc, json.loads((out / "summary.json").read_text()), json.loads((out / "run.json").read_text()), findings


@pytest.fixture(scope="module")
def runs(tmp_path_factory, engine_releases):
    d = tmp_path_factory.mktemp("draft")
    return {name: _run_in_process(name, d / name) for name in ("paths-spec", "b3-draft-pool-size")}


#: (draft extends after a prefill, draft decodes, draft extends after a verify, target verifies) per scenario
FORWARDS = {"paths-spec": (11, 108, 36, 36), "b3-draft-pool-size": (23, 36, 12, 12)}


@pytest.mark.engine
@pytest.mark.parametrize("name", sorted(FORWARDS))
def test_the_drafts_extend_after_a_prefill_is_the_releases_on_every_backend(runs, name):
    rc, summary, run, findings = runs[name]
    pieces = run["engine_pieces"]["backends"]
    assert sorted(pieces) == sorted(f"{b}/{side}" for b in BACKENDS for side in ("target", "draft"))
    extends, decodes, after_verify, verifies = FORWARDS[name]
    for b in BACKENDS:
        draft = pieces[f"{b}/draft"]
        assert [p for p in draft["pieces"] if p["piece"] == "the whole forward"] == [], b   # its constructor ran
        assert draft["release_forwards"] == extends and draft["release_paths"] == {"eager": extends}, b
        why = {k.split(" (")[0]: n for k, n in draft["model_forwards"].items()}
        assert why == {"mode draft_decode": decodes, "mode draft_extend after a verify": after_verify}, b
        assert all("not driven yet" in k for k in draft["model_forwards"]), b
        target = pieces[f"{b}/target"]
        assert sum(target["model_forwards"].values()) == verifies, b
        assert (target["release_forwards"] + verifies + draft["release_forwards"] + decodes + after_verify
                == summary["steps"]), b
    # torch_native's own SDPA gathers an SWA layer at full-pool ids (the release's bug, engine mode's one finding
    # class on these scenarios): on the hybrid draft's SWA layer too; the full-layer draft of b3 has none
    got = _by_side(findings, name)
    want = {"paths-spec": {("torch_native", "design_error", "target"): 6, ("torch_native", "design_error", "draft"): 6},
            "b3-draft-pool-size": {("torch_native", "design_error", "target"): 7}}[name]
    assert got == want and rc == 1
    assert {f["message"].split(" raised ")[1].split(":")[0] for f in findings} == {"IndexError"}


@pytest.mark.slow
@pytest.mark.engine
def test_a_bug_in_a_backends_draft_pool_resolution_is_found_on_that_draft_only(tmp_path, engine_releases):
    rc, summary, run, findings = _run("paths-spec", tmp_path / "patched", "flashinfer-draft-drops-its-swa-pool.yaml")
    assert rc == 1
    rec = summary["engine"]["patches"]
    assert [x["applied_by"] for x in rec] == ["slotscope"] and "static or class method" in rec[0]["why"]
    got = _by_side(findings, "paths-spec")
    # the draft's flashinfer never translates: its SWA layer hands the pool no swa_loc (the hybrid pool asserts one)
    # at every one of its extends, and its SWA table reads the SWA pool at full-pool ids
    assert {k: n for k, n in got.items() if k[0] == "flashinfer"} == {
        ("flashinfer", "stale_read", "draft"): 96, ("flashinfer", "design_error", "draft"): 11}
    assert {k: n for k, n in got.items() if k[0] != "flashinfer"} == {
        ("torch_native", "design_error", "target"): 6, ("torch_native", "design_error", "draft"): 6}
