"""--inject on a CUDA device: every injected store goes through the injector, decode-graph steps included
(a graph replay cannot call it, so those steps run eagerly), and the faults and findings are the CPU run's.
Skipped without CUDA."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.scenario import load_scenario
from slotscope.pipeline import RunOptions, run_scenario

pytestmark = pytest.mark.gpu

SMOKE = Path(__file__).resolve().parents[1] / "scenarios" / "smoke.toml"


def _run(tmp_path: Path, kind: str, device: str):
    out = tmp_path / device
    res = run_scenario(load_scenario(SMOKE), out, RunOptions(backends=("flashinfer",), max_steps=40,
                                                             inject=(f"{kind}:1",), report=False,
                                                             trace_level="off", device=device))
    return res, [json.loads(x) for x in (out / "faults.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("kind", ["drop_write", "shift_loc", "corrupt_after_write"])
def test_faults_on_cuda_are_the_cpu_runs(tmp_path, kind):
    cpu, cpu_faults = _run(tmp_path, kind, "cpu")
    gpu, gpu_faults = _run(tmp_path, kind, "cuda")
    modes = {s.step: s.graph for s in gpu.result.steps}
    assert any(modes[f["step"]] == "decode_graph" for f in gpu_faults), "no fault on a decode-graph step"
    assert gpu.summary["faults"] == cpu.summary["faults"]
    assert [(f["step"], f["layer"], f["slot"]) for f in gpu_faults] == \
        [(f["step"], f["layer"], f["slot"]) for f in cpu_faults]
    assert gpu.summary["faults"]["detected"] == gpu.summary["faults"]["injected"] == len(gpu_faults) > 0
    assert gpu.summary["backends"] == cpu.summary["backends"]
