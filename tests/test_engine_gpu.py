"""On a CUDA device: ``--engine sglang==0.5.23 --device cuda``, the release's CUDA store in the write path.

Skipped without CUDA, and where the release is not in slotscope's cache (a GPU machine has no
network: ``scripts/engine-carry`` packs the release and the wheels of its import needs, and
``scripts/gpu-check`` unpacks the release into ``$SLOTSCOPE_CACHE`` before the GPU tests run; nothing
is fetched here). The run is a subprocess of its own (one release per process), as a user runs it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
VERSION = "0.5.23"
B1 = "scenarios/b1-pcg-dp-padding.toml"


@pytest.fixture(scope="module")
def b1_on_cuda(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from engine_path.releases import engines_dir, is_cached

    if not is_cached(VERSION):
        pytest.skip(f"sglang=={VERSION} is not in {engines_dir()} (carry it: scripts/engine-carry, then "
                    f"scripts/gpu-check unpacks it)")
    out = tmp_path_factory.mktemp("b1-engine-cuda")
    proc = subprocess.run([sys.executable, "-m", "slotscope", "run", B1, "--engine", f"sglang=={VERSION}",
                           "--device", "cuda", "--out", str(out), "-q", "--no-report", "--trace-level", "off"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"))
    return proc, out


def test_b1_runs_through_the_releases_cuda_store_and_is_clean(b1_on_cuda):
    proc, out = b1_on_cuda
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine"]["name"] == "sglang" and summary["engine"]["version"] == VERSION
    assert summary["findings_total"] == 0
    assert len(summary["backends"]) == 8
    run = json.loads((out / "run.json").read_text())
    pieces = run["engine_pieces"]
    assert pieces["device"] == "cuda"
    store = pieces["store"]
    assert store["is_cuda"] is True
    # the release's CUDA path of _set_kv_buffer_impl: its JIT kernel (skips slot 0) or torch's index put
    assert store["store"] == "JIT store_cache kernel" or store["store"].startswith("torch index_put on CUDA")
    assert store["skip_index"] == (0 if store["store"] == "JIT store_cache kernel" else None)
    engine_rows = [r["piece"] for r in pieces["rows"] if r["whose"] == "engine"]
    assert any(p.startswith("SWAKVPool.set_kv_buffer (") and p.endswith(" on cuda)") for p in engine_rows)
