"""A PD decode node (engine.pd_decode) with SGLang 0.5.23's own allocator: ``alloc_extend_swa_tail`` and the row free.

One child of the session's one import of the release (engine_path.isolate's, tests/warm_engine.py): (1)
``EngineAllocator.extend_swa_tail`` (the release's ``alloc_extend_swa_tail``) and its row free against the model's ``HybridAllocator`` (0.5.23's "head"
free lists), id for id and entry for entry of the mapping, over a sequence that recycles a long request's full
pages (the non-tail ids' mapping must be cleared: #25805); (2) the conformance traces of A1 at page 16 and of
A1 / A2 at page 1 (their first 200 forwards; A2 at page 16 runs whole in tests/test_conform.py through the CLI),
the engine side's compared with the model's (design sglang-0.5.23) by ``slotscope.conform.compare``.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parent.parent
A1 = str(ROOT / "scenarios" / "a1-spec-partial-page-free.toml")
A2 = str(ROOT / "scenarios" / "a2-pd-decode-swa-tail.toml")
JOBS = [(A1, 16), (A1, 1), (A2, 1)]
STEPS = 200

#: (rid, prompt length, SWA tail) allocations, and frees (rid) in between: request 0's 25 full pages come back
#: and request 3 takes them, its non-tail ids included
SEQUENCE = [("alloc", 0, 400, 32), ("alloc", 1, 20, 20), ("alloc", 2, 48, 32), ("free", 0), ("free", 2),
            ("alloc", 3, 400, 32), ("alloc", 4, 33, 33), ("free", 1), ("alloc", 5, 64, 32)]


def _drive(alloc) -> list:
    """Run :data:`SEQUENCE` on one allocator; each step's (full ids, SWA ids, swa_evicted) and the whole mapping."""
    import numpy as np

    from simulator.memory.allocator import RequestSlots

    rows, out = {}, []
    for op in SEQUENCE:
        if op[0] == "alloc":
            _, rid, n, tail = op
            s = rows[rid] = RequestSlots(512)
            alloc.extend_swa_tail(s, n, tail)
            out.append([s.full[:n].tolist(), s.swa[:n].tolist(), s.swa_evicted])
        else:
            with alloc.free_group():
                alloc.free(rows.pop(op[1]))
        out.append(np.asarray(alloc.full_to_swa).tolist())
    return out


def child(jobs: list, steps: int) -> dict:
    """In the child (the release imported once): the allocator sequence, then the engine side's traces."""
    from engine_path.allocator import EngineAllocator
    from engine_path.api import load
    from engine_path.conformance import trace

    api = load()
    eng = EngineAllocator(api, 2048, 1024, 16)
    seq = _drive(eng)
    traces = [trace(path, {"design": "sglang-0.5.23", "page_size": page, "max_steps": steps, "engine": True})
              for path, page in jobs]
    return {"version": api.info.version, "sequence": seq, "calls": dict(eng.calls), "pieces": eng.pieces_ran(),
            "traces": traces}


@pytest.fixture(scope="module")
def run(warm):
    path = os.pathsep.join(p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")) if p)
    return warm("sglang==0.5.23").call("test_engine_pd:child", [list(j) for j in JOBS], STEPS,
                                       env={"PYTHONPATH": path}, timeout=1200)


def test_alloc_extend_swa_tail_gives_the_models_ids(run):
    from simulator.memory.allocator import HybridAllocator

    model = HybridAllocator(2048, 1024, 16, free_order="head")
    want = _drive(model)
    assert run["version"] == "0.5.23"
    assert run["calls"]["alloc_extend_swa_tail"] == 6 and run["calls"]["free"] == 3
    assert len(run["sequence"]) == len(want) == 15
    # what run.json's engine_pieces adds for them (engine_path.runtime.EngineRuntime.describe)
    assert [p.split(" ")[0] for p in run["pieces"]] == ["SWATokenToKVPoolAllocator.alloc_extend_swa_tail",
                                                       "free_kv_row_segments"]
    for i, (got, exp) in enumerate(zip(run["sequence"], want)):
        assert got == exp, i
    # request 3 took back request 2's 3 full pages (freed last: ahead of the list) and 22 of request 0's, its 23
    # non-tail pages' mapping cleared
    full0, full2, full3 = want[0][0], want[4][0], want[8][0]
    assert set(full3) == set(full2) | (set(full0) & set(full3)) and len(set(full0) & set(full3)) == 352
    assert want[8][2] == 368
    assert all(want[9][f] == 0 for f in full3[:368]) and all(want[9][f] > 0 for f in full3[368:])


@pytest.mark.parametrize("k", range(len(JOBS)))
def test_the_decode_node_conforms(run, k):
    from engine_path.conformance import trace
    from slotscope.conform import compare

    path, page = JOBS[k]
    eng = run["traces"][k]
    model = trace(path, {"design": "sglang-0.5.23", "page_size": page, "max_steps": STEPS})
    # the release's torch_native cannot verify (its forward_extend reads the extend lengths a TARGET_VERIFY batch has
    # not got): its value at every verify of the engine's trace is the error; the model's torch_native verifies, so
    # the node is compared on the other seven backends
    verifies = [r for r in eng["steps"] if r["mode"] == "target_verify"]
    assert verifies and all(r["swa_loc"]["torch_native"][0] == "raised" and "AttributeError" in
                            r["swa_loc"]["torch_native"][1] for r in verifies)
    for tr in (model, eng):
        tr["info"]["swa_ids"].pop("torch_native")
        for r in tr["steps"]:
            for field in ("swa_loc", "write_loc", "write_loc_full"):
                r[field].pop("torch_native", None)
    res = compare(model, eng)
    assert res["first"] is None and res["steps_compared"] == STEPS
    assert eng["info"]["scheduler"] == model["info"]["scheduler"] == "PDDecodeScheduler"
    assert eng["info"]["not_compared"] == []
    assert all(d == 0 for _, d in res["fields"].values())
    assert res["fields"]["transfer"][0] > 0 and res["fields"]["freed_full"] == [STEPS, 0]
    calls = eng["info"]["engine_calls"]
    assert calls["free"] > 0
    assert calls.get("alloc_extend_swa_tail", 0) == (0 if page == 1 else eng["info"]["radix"]["pd_decode"]["transfers"])
    assert (calls["alloc"] > 0) == (page == 1)
