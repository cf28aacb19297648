"""--inject (simulator/plugins/faults.py): every kind injects on a small shipped scenario and every fault is detected;
the same seed gives byte-identical faults.jsonl."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.plugins.faults import FAULT_KINDS, parse_inject
from simulator.scenario import load_scenario
from slotscope.pipeline import RunOptions, run_scenario
from slotscope.rundir import UsageError

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "scenarios" / "smoke.toml"

#: kind -> (mixed_chunk, max_steps, injected): smoke on flashinfer at PROB 1. Without mixed chunks the smoke
#: workload has prefill batches leaving decoding requests idle (step 20) and decode graph replays whose
#: batch shrinks (step 30), which the idle-slot and stale-tail kinds need.
CASES = {
    "repoint_req_to_token": (True, 4, 3),
    "corrupt_live_slot": (True, 4, 3),
    "corrupt_idle_cached_slot": (False, 21, 10),
    "corrupt_after_write": (True, 4, 4),
    "drop_write": (True, 4, 4),
    "shift_loc": (True, 4, 4),
    "stale_graph_tail": (False, 31, 1),
    "clear_swa_mapping": (True, 4, 3),
    "repoint_swa_mapping": (True, 4, 3),
    "misroute_layer": (True, 4, 3),
    "corrupt_v_only": (True, 4, 4),
    "write_slot0": (True, 4, 4),
    "write_out_of_range": (True, 4, 4),
}


def _run(tmp_path: Path, kind: str, mixed: bool, steps: int, name: str = "o"):
    sc = load_scenario(SMOKE) if mixed else _nomix(tmp_path)
    out = tmp_path / name
    res = run_scenario(sc, out, RunOptions(backends=("flashinfer",), max_steps=steps, inject=(f"{kind}:1",),
                                           report=False, trace_level="off", device="cpu"))
    return res, out


def _nomix(tmp_path: Path):
    p = tmp_path / "smoke-nomix.toml"
    p.write_text(SMOKE.read_text().replace("mixed_chunk = true", "mixed_chunk = false"))
    return load_scenario(p)


def test_every_kind_has_a_case():
    assert set(CASES) == set(FAULT_KINDS)


@pytest.mark.parametrize("kind", list(CASES))
def test_kind_is_injected_and_detected(tmp_path, kind):
    mixed, steps, injected = CASES[kind]
    res, out = _run(tmp_path, kind, mixed, steps)
    faults = res.summary["faults"]
    assert faults["injected"] == injected, faults
    assert faults["detected"] == injected, faults
    assert set(faults["by_kind"]) == {kind}
    lines = [json.loads(x) for x in (out / "faults.jsonl").read_text().splitlines()]
    assert len(lines) == injected
    for rec in lines:
        assert rec["kind"] == kind and rec["detected"] is not None, rec
        assert {"step", "backend", "layer", "slot", "detail"} <= set(rec)
        assert rec["detected"]["steps_after"] >= 0
    assert json.loads((out / "summary.json").read_text())["faults"] == faults


def test_same_seed_same_faults(tmp_path):
    _, a = _run(tmp_path, "drop_write", True, 3, "a")
    _, b = _run(tmp_path, "drop_write", True, 3, "b")
    assert (a / "faults.jsonl").read_bytes() == (b / "faults.jsonl").read_bytes()
    assert (a / "faults.jsonl").read_bytes()


def test_bad_inject_spec_is_usage_error(tmp_path):
    with pytest.raises(ValueError):
        parse_inject(["nope:1"])
    with pytest.raises(ValueError):
        parse_inject(["drop_write:2"])
    assert parse_inject(["drop_write"]) == {"drop_write": 0.05}
    with pytest.raises(UsageError):
        run_scenario(SMOKE, tmp_path / "x", RunOptions(backends=("flashinfer",), max_steps=1, inject=("nope",),
                                                       report=False, trace_level="off", device="cpu"))


def test_report_has_the_fault_table(tmp_path):
    from reports.html import render_report
    from reports.data import load_run

    _, out = _run(tmp_path, "write_slot0", True, 2)
    html = render_report(load_run(out))
    assert 'id="faults"' in html and "write_slot0" in html
    _, clean = _run(tmp_path, "write_slot0", True, 1, "c")
    (clean / "faults.jsonl").unlink()
    assert 'id="faults"' not in render_report(load_run(clean))
