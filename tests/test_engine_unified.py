"""The engine in the loop on the unified pool (issue 12 point 4): SGLang 0.5.23's own unified allocator.

scenarios/u2-unified-tombstone-escape.toml (pool.unified, page size 1) runs 70 forwards with the release's
``UnifiedSWATokenToKVPoolAllocator`` (engine_path.unified.UnifiedEngineAllocator, built by the release's
``init_unified_swa_pools`` on the CPU over the model's byte budget): every allocation, SWA tombstone, free,
free group, translation and compaction is the release's, and the oracle learns ownership from its page tables.
The same run on the model (simulator/memory/unified_pool.py) is compared with it: the same virtual ids at every step,
the same live counts after every forward, clean on both, and the same 479 compaction page moves (the release's
lazy compaction, flushed at each scheduler boundary as the model's is). Under the U1 and U2 designs the release is what
allocates and translates, so both stay clean: 0.5.23 has both fixes in its own code (its SWA page table
spans the full side's virtual ids; its translation clamps a tombstoned page to the sink).

One child of the session's one import of the release (engine_path.isolate's, tests/warm_engine.py).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parent.parent
U2 = ROOT / "scenarios" / "u2-unified-tombstone-escape.toml"
U1 = ROOT / "scenarios" / "u1-unified-swa-table.toml"


def _run(sc, design_name, allocator_factory=None, max_steps=None):
    """One run, recording the virtual ids the scheduler handed to each forward."""
    from cuda_path.pool import TaggedKVPool
    from simulator.designs import load_design
    from simulator.core.observe import NullObserver
    from simulator.run import run_simulation

    design = load_design(design_name)
    seen: list = []

    class Record(NullObserver):
        def on_step(self, rec):
            seen.append([rec.step, rec.full_used, rec.swa_used])

    def make(full_rows, swa_rows, skip):
        return TaggedKVPool(sc.model, full_rows, swa_rows, device="cpu", geometry="compact", store_impl="torch",
                            skip_index=skip)
    res = run_simulation(sc, design, make, device="cpu", observer=Record(), max_steps=max_steps,
                         allocator_factory=allocator_factory(design) if allocator_factory else None)
    return res, seen


def child(u2: str, u1: str) -> dict:
    """In the child (the release imported once): the u2 scenario on the release and on the model; U1's."""
    import dataclasses

    import numpy as np
    import torch

    from engine_path.api import load
    from engine_path.unified import UnifiedEngineRuntime
    from simulator.scenario import load_scenario

    api = load()
    sc = dataclasses.replace(load_scenario(u2), backends=("triton", "flashattention"))
    out: dict = {"version": api.info.version}
    runtimes = {}

    def engine_factory(design):
        rt = runtimes[design.name] = UnifiedEngineRuntime(api, design, sc)
        return rt.allocator_factory

    for name in ("sglang-0.5.23-unified", "sglang-unified-pre-35933"):
        res, used = _run(sc, name, engine_factory, max_steps=70)
        alloc = runtimes[name].allocator
        out[name] = {"steps": len(res.steps), "used": used, "unified": res.info.extra["unified"],
                     "backends": {b: [s.writes, {c: n for c, n in s.findings.items() if n}]
                                  for b, s in res.backends.items()},
                     "calls": dict(alloc.calls), "allocator": alloc.describe()}
    model, used = _run(sc, "sglang-0.5.23-unified", max_steps=70)
    out["model"] = {"steps": len(model.steps), "used": used, "unified": model.info.extra["unified"],
                    "backends": {b: [s.writes, {c: n for c, n in s.findings.items() if n}]
                                 for b, s in model.backends.items()}}
    # the release's own fixes, probed on its allocator: the SWA table spans the virtual ids (U1), and a
    # tombstoned, negative or out-of-range id translates to the sink (U2)
    a = runtimes["sglang-0.5.23-unified"].allocator
    from simulator.memory.allocator import RequestSlots
    r = RequestSlots(8)
    v = a.extend(r, 4)
    a.evict_swa(r, 2)
    probe = np.asarray([int(v[0]), int(v[1]), int(v[3]), -1, 10 ** 7], dtype=np.int64)
    out["probe"] = {"swa_v2p_len": int(a.sa.virtual_to_physical.shape[0]), "num_virtual_ids": a.num_virtual_ids,
                    "swa": a.translate_kv_loc(probe, "swa").tolist(), "v": v.tolist(),
                    "swa_v2p": a.sa.virtual_to_physical[torch.from_numpy(v)].tolist()}
    # U1's scenario on the release, under the U1 design: the release's table has the full id space, no assert
    sc1 = dataclasses.replace(load_scenario(u1), backends=("triton",))
    rt1: dict = {"max": 0}

    def engine1(design):
        rt1["rt"] = rt = UnifiedEngineRuntime(api, design, sc1)

        def make(cfg):
            alloc = rt.allocator_factory(cfg)
            extend = alloc.extend

            def recorded(slots, n):
                ids = extend(slots, n)
                rt1["max"] = max(rt1["max"], int(ids.max(initial=0)))
                return ids
            alloc.extend = recorded
            return alloc
        return make
    res1, _ = _run(sc1, "sglang-unified-pre-37560", engine1, max_steps=40)
    out["u1"] = {"steps": len(res1.steps), "died": res1.info.extra["unified"]["died"],
                 "findings": {c: n for c, n in res1.backends["triton"].findings.items() if n},
                 "minted_max": rt1["max"], "num_virtual_ids": rt1["rt"].allocator.num_virtual_ids,
                 "swa_v2p_len": int(rt1["rt"].allocator.sa.virtual_to_physical.shape[0])}
    return out


@pytest.fixture(scope="module")
def run(warm):
    path = os.pathsep.join(p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")) if p)
    return warm("sglang==0.5.23").call("test_engine_unified:child", str(U2), str(U1), env={"PYTHONPATH": path})


def test_the_release_unified_allocator_runs_the_loop(run):
    eng = run["sglang-0.5.23-unified"]
    assert run["version"] == "0.5.23"
    assert eng["allocator"]["allocator"].endswith("unified_hybrid_swa.UnifiedSWATokenToKVPoolAllocator")
    assert eng["steps"] == 70
    assert eng["backends"] == {"triton": [280, {}], "flashattention": [280, {}]}
    assert eng["calls"] == {"alloc": 94, "free": 3, "free_swa": 2, "flush_opportunistic": 70,
                            "set_inflight_forward": 71}
    u = eng["unified"]
    assert (u["moves"], u["pinned_moves"], u["died"]) == (377, 0, None)


def test_the_release_matches_the_model_step_by_step(run):
    eng, model = run["sglang-0.5.23-unified"], run["model"]
    assert model["steps"] == eng["steps"] == 70
    assert model["backends"] == eng["backends"]
    # the same live full and SWA tokens after every forward (virtual ids FIFO on both, the same frees)
    assert eng["used"] == model["used"]
    assert model["unified"]["moves"] == eng["unified"]["moves"] == 377
    assert eng["used"][-1] == model["used"][-1] == [70, 413, 148]
    assert model["unified"]["num_virtual_ids"] == eng["allocator"]["num_virtual_ids"] == 1538


def test_u1_and_u2_are_fixed_in_the_release_code(run):
    p = run["probe"]
    assert p["swa_v2p_len"] == p["num_virtual_ids"] + 1             # the SWA table spans full's virtual ids
    assert p["swa_v2p"][:2] == [-1, -1] and min(p["swa_v2p"][2:]) > 0   # two tombstoned pages, two live
    assert p["swa"][:2] == [0, 0] and p["swa"][2] > 0 and p["swa"][3:] == [0, 0]   # tombstones, -1, 10**7: sink
    # the U2 design with the release translating: clean (no -1 ever reaches the page table)
    assert run["sglang-unified-pre-35933"]["backends"] == {"triton": [280, {}], "flashattention": [280, {}]}
    assert run["sglang-unified-pre-35933"]["unified"]["read_door_findings"] == 0
    # U1's scenario on the release: its ids run past the model-U1 table length (615) and nothing asserts
    u1 = run["u1"]
    assert u1["died"] is None and u1["findings"] == {} and u1["steps"] == 40 and u1["minted_max"] == 763
    assert (u1["num_virtual_ids"], u1["swa_v2p_len"]) == (3074, 3075)


def test_slotscope_run_engine_on_a_unified_scenario(warm, tmp_path):
    """``slotscope run SCENARIO --engine sglang==0.5.23`` on a pool.unified scenario: the release's unified
    allocator, the scenario's modelled design, our pools; 30 forwards, no findings (exit 5: cut short). The
    command runs in a child forked from the session's one import of the release (tests/warm_engine.py)."""
    import json

    out = tmp_path / "run"
    proc = warm("sglang==0.5.23").cli("run", str(U2), "--engine", "sglang==0.5.23", "--backends", "flashattention",
                                      "--max-steps", "30", "--out", str(out), "--no-report", cwd=ROOT, timeout=900)
    assert proc.returncode == 5, proc.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["engine"]["version"] == "0.5.23" and s["design"] == "sglang-unified-pre-35933" and s["steps"] == 30
    assert s["findings_total"] == 0
    assert (s["unified"]["moves"], s["unified"]["pinned_moves"], s["unified"]["num_virtual_ids"]) == (350, 0, 1538)
    pieces = json.loads((out / "run.json").read_text())["engine_pieces"]
    assert pieces["allocator"]["allocator"].endswith("UnifiedSWATokenToKVPoolAllocator")
    assert pieces["allocator"]["calls"] == {"alloc": 54, "free": 2, "free_swa": 0, "flush_opportunistic": 30,
                                            "set_inflight_forward": 31}
    assert [r["whose"] for r in pieces["rows"]][0] == "engine"


@pytest.mark.slow
def test_the_release_bind_past_its_own_swa_table_ends_the_run_as_the_device_assert(warm, tmp_path):
    """U1 in the release's own code: 0.5.23 with #37560 reverted (examples/engine-patches/revert-37560-swa-v2p-size.yaml)
    sizes the SWA page table by the SWA side's own page count (615 at page 1), and the release's bind indexes past it
    at the first virtual page the full side mints beyond. torch's IndexError there is, on a GPU, the device-side
    assert that kills the engine: engine_path.unified raises it as the run-ending IndexOutOfRange, so each backend has
    exactly one out_of_range finding at that step, naming the release's function, and the summary says where it died."""
    import json

    out = tmp_path / "u1"
    patch = ROOT / "examples" / "engine-patches" / "revert-37560-swa-v2p-size.yaml"
    proc = warm("sglang==0.5.23").cli("run", str(U1), "--engine", "sglang==0.5.23", "--engine-patch", str(patch),
                                      "--backends", "triton,flashattention", "--out", str(out), "--no-report", "-q")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["steps"] == 28 and s["findings_total"] == 2
    assert {b: {c: n for c, n in v["findings"].items() if n} for b, v in s["backends"].items()} == \
        {"triton": {"out_of_range": 1}, "flashattention": {"out_of_range": 1}}
    died = s["unified"]["died"]
    assert (died["step"], died["index"], died["length"], died["token"]) == (28, 615, 615, 615)
    assert died["where"].startswith("release alloc: ") and "bind" in died["where"]
    rows = [json.loads(line) for line in (out / "findings.jsonl").read_text().splitlines()]
    assert [(r["backend"], r["step"], r["class"], r["slot"]) for r in rows] == \
        [("triton", 28, "out_of_range", 615), ("flashattention", 28, "out_of_range", 615)]
