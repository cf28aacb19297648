"""`slotscope run --engine vllm==0.34.0`: vLLM's own Scheduler and hybrid KVCacheManager decide every batch and block.

Whole runs against the cached release (fetched when missing), two at a time: scenarios/sched-evict-retract.toml
(preemptions under a small pool, a 32-token window freed block by block) and scenarios/sharing-system-prompt.toml
(prefix caching: shared system prompts and later turns) run clean; a bug put into the release's sliding-window
manager (its skip count one token too far; its cache hit one block short of the window) gives stale reads there.
The worker side's block tables (ours: engine_path/vllm/worker.py) are checked on their own, without vLLM.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from engine_path.vllm.worker import BlockTables

ROOT = Path(__file__).resolve().parent.parent
PATCHES = ROOT / "tests" / "engine_patches" / "vllm"
SER = "scenarios/sched-evict-retract.toml"
SHARING = "scenarios/sharing-system-prompt.toml"
RUNS = {
    "ser": (SER, None),
    "ser_skip": (SER, "swa-skip-one-more.yaml"),
    "sharing": (SHARING, None),
    "sharing_hit": (SHARING, "swa-hit-one-block-short.yaml"),
}


def slotscope(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slotscope", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


@pytest.fixture(scope="module")
def vllm_release():
    from engine_path.errors import EngineError
    from engine_path.releases import EngineSpec, fetch
    from engine_path.vllm.release import missing_deps

    lacking = missing_deps()
    if lacking:
        pytest.skip(f"vLLM's dependencies are not installed ({', '.join(lacking)}): pip install -e '.[vllm]'")
    try:
        return fetch(EngineSpec("vllm", "0.34.0"))
    except EngineError as e:
        pytest.skip(f"vllm==0.34.0 is not in the cache and cannot be fetched: {e}")


@pytest.fixture(scope="module")
def runs(vllm_release, tmp_path_factory):
    base = tmp_path_factory.mktemp("vllm")

    def one(key):
        scenario, patch = RUNS[key]
        out = base / key
        cmd = ["run", scenario, "--engine", "vllm==0.34.0", "--out", str(out), "--no-report", "-q"]
        if patch:
            cmd += ["--engine-patch", str(PATCHES / patch)]
        proc = slotscope(*cmd)
        summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else None
        run = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else None
        return key, (proc, summary, run)

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, RUNS))


def _found(summary) -> dict:
    return {k: v for k, v in summary["backends"]["vllm"]["findings"].items() if v}


@pytest.mark.vllm
def test_pressure_runs_clean_with_the_release_deciding(runs):
    proc, summary, run = runs["ser"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["findings_total"] == 0
    assert run["sources"]["scheduler"] == "vllm 0.34.0 Scheduler"
    assert run["sources"]["allocator"] == "vllm 0.34.0 BlockPool (KVCacheManager)"
    assert run["backends"] == ["vllm"]
    sched = run["engine_pieces"]["scheduler"]
    # no prefix caching in this scenario (engine.radix_cache off): the release's coordinator without it
    assert sched["kv_cache_manager"] == "KVCacheCoordinatorNoPrefixCache"
    assert [g["kind"] for g in sched["groups"]] == ["swa", "full"]        # vLLM orders them by the first layer
    assert sched["num_blocks"] == 257 and sched["block_size"] == 1
    did = sched["did"]
    # what the release did, as the oracle saw it: preemptions (the pool is too small for the decodes) and the
    # sliding-window manager's frees of out-of-window blocks while the full blocks stay held
    assert (did["forwards"], did["finished"], did["preemptions"]) == (619, 12, 15)
    assert (did["freed_swa_slots"], did["evicted_swa_slots"]) == (1013, 220)
    assert "the platform" in sched["stand_ins"] and "ModelConfig" in sched["stand_ins"]


@pytest.mark.vllm
def test_window_skip_off_by_one_is_a_stale_read(runs):
    proc, summary, run = runs["ser_skip"]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert _found(summary) == {"stale_read": 1013}
    assert run["engine"]["patches"][0]["applied_by"] == "slotscope"


@pytest.mark.vllm
def test_prefix_caching_runs_clean_and_hits(runs):
    proc, summary, run = runs["sharing"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["findings_total"] == 0
    did = run["engine_pieces"]["scheduler"]["did"]
    assert did["prefix_hit_tokens"] == 7143 and did["forwards"] == 272
    assert run["engine_pieces"]["scheduler"]["prefix_caching"] is True
    assert run["engine_pieces"]["scheduler"]["kv_cache_manager"] == "HybridKVCacheCoordinator"


@pytest.mark.vllm
def test_window_hit_one_block_short_is_a_stale_read(runs):
    proc, summary, _ = runs["sharing_hit"]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert _found(summary) == {"stale_read": 32}


@pytest.mark.vllm
def test_what_vllm_cannot_run_yet_is_refused(vllm_release):
    proc = slotscope("run", "scenarios/smoke.toml", "--engine", "vllm==0.34.0", "--no-report", "-q")
    assert proc.returncode == 2
    assert "DP attention (engine.dp_size > 1)" in proc.stderr
    proc = slotscope("run", SER, "--engine", "vllm", "--design", "sglang-0.5.23", "--no-report", "-q")
    assert proc.returncode == 2 and "--design sglang-0.5.23 with --engine" in proc.stderr


def test_worker_rows_keep_freed_ids_and_null_below_the_window():
    t = BlockTables(block_size=4, num_groups=2)
    t.apply({"a": [[1, 2], [3, 4]]}, {}, set())
    t.apply({}, {"a": [[5], [6]]}, set())
    assert t.rows["a"] == [[1, 2, 5], [3, 4, 6]]
    np.testing.assert_array_equal(t.slots("a", 1, 6, 10), np.array([18, 19, 24, 25]))
    # the SWA group's table as attention reads it: entries wholly below first - retained nulled (block 0)
    np.testing.assert_array_equal(t.read_slots("a", 1, 9, 10, retained=3)[:4], np.array([0, 1, 2, 3]))
    np.testing.assert_array_equal(t.read_slots("a", 1, 9, 10, retained=3)[4:8], np.array([16, 17, 18, 19]))
    # a resumed request's row is replaced, a finished one dropped
    t.apply({"a": [[7], [8]]}, {}, set())
    assert t.rows["a"] == [[7], [8]]
    t.apply({}, {}, {"a"})
    assert "a" not in t.rows
    t.apply({"b": [[1], [2]]}, {}, set())
    with pytest.raises(IndexError, match="position 4 needs block 1"):
        t.slots("b", 0, 0, 5)
