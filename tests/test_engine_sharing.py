"""The engine in the loop on the radix cache's free paths (issue 12 point 4): R8 in SGLang 0.5.23's own code.

scenarios/r8-sink-free-list.toml (the radix cache on, #38519's external linker attached, page size 16) runs
with the release's SWA allocator (engine_path.allocator.EngineAllocator): every free the cache makes goes
through the release's ``free_swa_segment`` / ``free_swa`` / ``free_full`` and its free groups, so what frees
the sink is 0.5.23's ``_free_swa_pages`` (``mapping[rep] // page`` for every representative, nothing
filtered). The run gives the model's counts exactly (tests/test_sharing_run.py pins them: 9042 stale_read on
the sink page, request 12 given page 0 at step 45, then others), and the release's own free list holds page 0
(up to 7 times at once; this schedule never frees enough twice over to reach the release's capacity assert,
``available_size() <= size``). As ``slotscope run scenarios/r8-sink-free-list.toml --engine sglang==0.5.23`` does, the
run takes our model of the release for what stays ours (the scheduler's cadence and free groups).

One child of the session's one import of the release (engine_path.isolate's, tests/warm_engine.py).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parent.parent
R8 = ROOT / "scenarios" / "r8-sink-free-list.toml"


def r8_run(path: str) -> dict:
    """In the child (the release imported once): R8's scenario through the release's allocator."""
    import dataclasses

    from engine_path.api import load
    from engine_path.runtime import EngineRuntime
    from simulator.designs import BUILTIN_DESIGNS
    from simulator.run import run_simulation
    from simulator.scenario import load_scenario

    api = load()
    sc = dataclasses.replace(load_scenario(path), backends=("triton",))
    # as `slotscope run --engine sglang==0.5.23` (slotscope/engine_run.py): our model of the release for what
    # stays ours (the scheduler's release behaviour: grouped frees, the eviction cadence)
    rt = EngineRuntime(api, model=BUILTIN_DESIGNS[f"sglang-{api.info.version}"]())
    sink: dict = {"first": None, "max": 0}

    def watch(step, finished, total):
        n = int((rt.allocator.swa_free_list == 0).sum())
        if n and sink["first"] is None:
            sink["first"] = step
        sink["max"] = max(sink["max"], n)

    res = run_simulation(sc, rt.design, rt.pool_factory(sc.model), device="cpu", progress=watch,
                         allocator_factory=rt.allocator_factory)
    b = res.backends["triton"]
    return {"version": api.info.version, "steps": len(res.steps), "findings": b.to_json()["findings"],
            "first": [res.findings[0].step, res.findings[0].kind, res.findings[0].slot],
            "stopped": res.radix.get("stopped"), "calls": dict(rt.allocator.calls), "sink": sink,
            "given": [e for e in res.radix["ownership"]["events"] if e[1] == "alloc"][:12],
            "allocator": rt.allocator.describe()["allocator"]}


@pytest.fixture(scope="module")
def run(warm):
    path = os.pathsep.join(p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")) if p)
    return warm("sglang==0.5.23").call("test_engine_sharing:r8_run", str(R8), env={"PYTHONPATH": path})


def test_r8_reproduces_in_0523s_own_free_paths(run):
    assert run["version"] == "0.5.23" and run["allocator"].endswith("SWATokenToKVPoolAllocator")
    # the cache's frees ran through the release
    assert run["calls"]["free_swa_segment"] > 0 and run["calls"]["free_full"] > 0
    # the sink page handed out and read (as the model: step 45, request 12, then others)
    assert run["steps"] == 94
    assert {k: v for k, v in run["findings"].items() if v} == {"stale_read": 9042}
    assert run["first"] == [45, "swa", 0]
    assert run["given"][:3] == [[45, "alloc", "alloc", "request:12", None], [48, "alloc", "alloc", "request:11", None],
                                [55, "alloc", "alloc", "request:13", None]]
    # the release's own free list held page 0 (from step 45, up to 6 times at once); no over-free ended the run
    assert run["sink"] == {"first": 45, "max": 6}
    assert run["stopped"] is None
    assert (run["calls"]["free_swa_segment"], run["calls"]["free_full"]) == (80, 71)
