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


def test_paged_cases_run_the_releases_alloc_kernels_on_the_gpu(tmp_path):
    """At page size 16 the release's paged alloc_extend / alloc_decode take their Triton kernels on a GPU
    platform; engine_path.host_kernels runs them there over copies of the host allocator's tensors, so the
    paged corpus cases are release code on CUDA too (static: B2/p16; unified: U2/p16), each verdict holding."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from engine_path.releases import is_cached

    if not is_cached(VERSION):
        pytest.skip(f"sglang=={VERSION} is not in slotscope's cache")
    out = tmp_path / "bugs.json"
    proc = subprocess.run([sys.executable, "-m", "slotscope", "bugs", "--engine", "sglang", "--device", "cuda",
                           "--only", "B2/p16,U2/p16", "--json", str(out), "--out", str(tmp_path / "runs"), "-q"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = {v["case"]: (v["real"], v["holds"]) for v in json.loads(out.read_text())}
    assert got == {"B2/p16": (True, True), "U2/p16": (True, True)}
    runs = [json.loads(p.read_text()) for p in (tmp_path / "runs").rglob("run.json")]
    rows = [[x["piece"] for x in r["engine_pieces"]["rows"] if x["whose"] == "engine"] for r in runs]
    assert len(rows) == 4
    for engine in rows:                 # each run names the bridged kernels, and they ran
        kernel = [p for p in engine if p.startswith("alloc_extend_kernel (the release's Triton kernel on cuda")]
        assert len(kernel) == 1 and not kernel[0].endswith(": 0 launches)"), engine
