"""The model's unified pool against SGLang 0.5.23's unified allocator (issue 10 point 5, the unified-pool rows).

* A differential (engine_path.unified.differential, in the release's own process, forked from the session's one
  import of it: tests/warm_engine.py): the same random operations
  (admit, grow, evict, truncate, grouped and plain frees, in-flight windows and lazy flushes), then a pressure
  phase that makes the release run its urgent, allocation-time flush, on the model's
  :class:`~simulator.memory.unified_pool.UnifiedPool` and on the release's ``UnifiedSWATokenToKVPoolAllocator``, at page
  sizes 1 and 16: after every operation the ids handed out, both sides' page tables, the used and available
  counts and the ownership events are identical.
* ``slotscope conform`` of u1 and u2 at page sizes 1 and 16 (four runs, two at a time, in the session's warm
  processes): every step conforms, exit 0,
  nothing listed as not compared; at page 16 the release's paged ``alloc_extend`` / ``alloc_decode`` were driven.
* Without the engine: the model's trace at page 16 binds each forward to the release's layout.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
U1 = "scenarios/u1-unified-swa-table.toml"
U2 = "scenarios/u2-unified-tombstone-escape.toml"

#: (scenario, page size) -> forwards compared
CONFORM = {(U1, 1): 66, (U2, 1): 180, (U1, 16): 73, (U2, 16): 197}


@pytest.mark.engine
def test_the_model_hands_out_the_release_ids(warm):
    got = warm("sglang==0.5.23").call("engine_path.unified:differentials", 0)
    assert got == {
        "page 1": {"first_difference": None, "moves": 577, "refused": 99, "urgent_flushes": 8, "ops": 540},
        "page 16": {"first_difference": None, "moves": 96, "refused": 118, "urgent_flushes": 8, "ops": 540},
    }


@pytest.fixture(scope="module")
def conform_runs(warm):
    """``python -m slotscope conform`` in a child of the session's warm CLI process, its engine side in a child
    forked from the session's one import of 0.5.23 (tests/warm_engine.py; tests/test_conform.py runs one
    conform in fresh processes end to end)."""
    route = {"sglang==0.5.23": warm.socket("sglang==0.5.23")}

    def one(key):
        path, page = key
        proc = warm("none").cli("conform", path, "--engine", "sglang==0.5.23", "--page-size", str(page), "--json",
                                cwd=ROOT, route=route, timeout=900)
        return key, proc

    with ThreadPoolExecutor(2) as ex:
        return dict(ex.map(one, CONFORM))


@pytest.mark.engine
@pytest.mark.parametrize("key", list(CONFORM), ids=[f"{Path(p).stem[:2]}-page{n}" for p, n in CONFORM])
def test_unified_scenarios_conform(conform_runs, key):
    proc = conform_runs[key]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["first"] is None and res["steps_compared"] == CONFORM[key] and res["page_size"] == key[1]
    assert res["not_compared"] == [] and res["design"] == "sglang-0.5.23"
    assert all(differs == 0 and equal > 0 for equal, differs in res["fields"].values()), res["fields"]
    assert {"out_cache_loc", "physical_loc", "mapping", "moves", "freed_full", "freed_swa"} <= set(res["fields"])
    calls = res["engine_calls"]
    if key[1] == 1:
        assert calls["alloc"] > 0 and "alloc_extend" not in calls
    else:
        assert calls["alloc_extend"] > 0 and calls["alloc_decode"] > 0 and "alloc" not in calls
    assert calls["flush_opportunistic"] == CONFORM[key]
    assert f"every step conforms ({CONFORM[key]} steps)" in proc.stdout


def test_the_model_trace_at_page_16_takes_the_release_layout():
    """u2 at page 16, model side only: the first forward's 159 tokens are virtual pages 1..10; the full side binds
    them to its top pages 88..97 (ascending), the SWA side to 1..10; nothing is listed as not compared."""
    from engine_path.conformance import trace

    t = trace(str(ROOT / U2), {"design": "sglang-0.5.23", "page_size": 16, "max_steps": 30, "backends": ["triton"]})
    assert t["info"]["unified"] is True and t["info"]["not_compared"] == [] and t["info"]["stopped"] is None
    first = t["steps"][0]
    assert first["out_cache_loc"] == list(range(16, 175))
    assert first["physical_loc"][0] == list(range(88 * 16, 88 * 16 + 159))
    assert first["physical_loc"][1] == list(range(16, 175))
    assert sum(len(s["moves"]) for s in t["steps"]) == 208           # compaction page moves (in slots) over 30 forwards
