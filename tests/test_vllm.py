"""`slotscope run --engine vllm==0.34.0`: vLLM's own Scheduler and hybrid KVCacheManager decide every batch and block.

Whole runs against the cached release (fetched when missing), two at a time: scenarios/sched-evict-retract.toml
(preemptions under a small pool, a 32-token window freed block by block) and scenarios/sharing-system-prompt.toml
(prefix caching: shared system prompts and later turns) run clean; a bug put into the release's sliding-window
manager (its skip count one token too far; its cache hit one block short of the window) gives stale reads there.
The worker side's block tables (ours: engine_path/vllm/worker.py) are checked on their own, without vLLM.
"""
from __future__ import annotations

import collections
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from helpers import slotscope_cli


ROOT = Path(__file__).resolve().parent.parent
PATCHES = ROOT / "tests" / "engine_patches" / "vllm"
SER = "scenarios/sched-evict-retract.toml"
SHARING = "scenarios/sharing-system-prompt.toml"
RUNS = {          # key: (scenario, patch, extra arguments); a patched worker kernel is interpreted (~50 ms a step)
    "ser": (SER, None, ()),
    "ser_skip": (SER, "swa-skip-one-more.yaml", ("--max-steps", "80")),
    "sharing": (SHARING, None, ()),
    "sharing_hit": (SHARING, "swa-hit-one-block-short.yaml", ()),
    "pad": (SER, "slot-pad-off-by-one.yaml", ("--max-steps", "60")),
    "leak": ("scenarios/vllm-graph-pad.toml", "swa-window-free-leaks.yaml", ()),
    "cover": ("scenarios/vllm-cover-paged.toml", None, ()),
    "async": ("scenarios/vllm-async.toml", None, ()),
    "async_pad": ("scenarios/vllm-async.toml", "slot-pad-off-by-one.yaml", ()),
    "async_inject": ("scenarios/vllm-async.toml", None, ("--inject", "drop_write")),
    "dp": ("scenarios/vllm-dp-decode.toml", None, ()),
    "dp_zero": ("scenarios/vllm-dp-decode.toml", "dp-dummy-slots-zero.yaml", ()),
    "eagle": ("scenarios/vllm-eagle.toml", None, ()),
    "eagle_rollback": ("scenarios/vllm-eagle.toml", "spec-rejection-not-rolled-back.yaml", ()),
    "null_block": ("scenarios/vllm-hidden-states-null-block.toml", None, ()),
    "smoke": ("scenarios/smoke.toml", None, ()),
    "smoke_v1": ("scenarios/smoke.toml", ROOT / "examples/engine-patches/vllm/revert-36580-pad-from-padded-count.yaml",
                 ()),
}


slotscope = slotscope_cli


@pytest.fixture(scope="module")
def runs(warm_vllm, tmp_path_factory):
    """The runs of RUNS, each forked from one import of the release (tests/warm_engine.py: the child activates it,
    applying the run's patch, as a fresh process would); the tests below that run fresh processes cover that path."""
    base = tmp_path_factory.mktemp("vllm")

    def one(key):
        scenario, patch, extra = RUNS[key]
        out = base / key
        cmd = ["run", scenario, "--engine", "vllm==0.34.0", "--out", str(out), "--no-report", "-q", *extra]
        if patch:
            cmd += ["--engine-patch", str(PATCHES / patch)]
        proc = warm_vllm.cli(*cmd)
        summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else None
        run = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else None
        return key, (proc, summary, run, out)

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, RUNS))


def _found(summary) -> dict:
    return {k: v for k, v in summary["backends"]["vllm"]["findings"].items() if v}


@pytest.mark.vllm
def test_pressure_runs_clean_with_the_release_deciding(runs):
    proc, summary, run, _ = runs["ser"]
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
    proc, summary, run, _ = runs["ser_skip"]
    assert proc.returncode == 1, proc.stderr[-3000:]
    # its first 80 forwards (the whole run: 1,013): the window's first token's block freed while still read
    assert _found(summary) == {"stale_read": 140}
    assert summary["backends"]["vllm"]["first_finding"] == {"step": 1, "layer": 0, "class": "stale_read"}
    assert run["engine"]["patches"][0]["applied_by"] == "slotscope"


@pytest.mark.vllm
def test_a_slot_kernel_pad_bug_writes_padded_rows_at_stale_slots(runs):
    """The release's slot-mapping kernel (a Triton kernel, patched) pads one row late: a decode graph's first padded
    row writes where an earlier step's token was, now freed (evicted_slot)."""
    proc, summary, run, _ = runs["pad"]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert _found(summary) == {"evicted_slot": 52}
    assert summary["backends"]["vllm"]["first_finding"]["step"] == 4


@pytest.mark.vllm
def test_prefix_caching_runs_clean_and_hits(runs):
    proc, summary, run, _ = runs["sharing"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["findings_total"] == 0
    did = run["engine_pieces"]["scheduler"]["did"]
    assert did["prefix_hit_tokens"] == 6441 and did["forwards"] == 280
    assert run["engine_pieces"]["scheduler"]["prefix_caching"] is True
    assert run["engine_pieces"]["scheduler"]["kv_cache_manager"] == "HybridKVCacheCoordinator"


@pytest.mark.vllm
def test_window_hit_one_block_short_is_a_stale_read(runs):
    proc, summary, _, _ = runs["sharing_hit"]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert _found(summary) == {"stale_read": 29}


@pytest.mark.vllm
def test_every_vllm_path_with_paged_blocks_runs_clean(runs):
    """vllm-cover-paged: preemption and resumption, prefix hits, chunked prefill beside decodes, graph padding, all
    with 16-token blocks, clean as released (the scenario the plausible bugs are tried on, docs/VLLM.md)."""
    proc, summary, run, _ = runs["cover"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    did = run["engine_pieces"]["scheduler"]["did"]
    assert (did["forwards"], did["preemptions"], did["prefix_hit_tokens"]) == (388, 4, 704)
    assert did["mixed"] > 0 and run["engine_pieces"]["scheduler"]["block_size"] == 16


@pytest.mark.vllm
def test_async_scheduling_runs_the_releases_async_scheduler_one_schedule_ahead(runs):
    """engine.overlap: vLLM's AsyncScheduler under its engine core's batch queue of two (every schedule but the first
    made before the output of the forward before it), clean as released, and its batches differ from stepping
    synchronously (vllm-cover-paged: 388 forwards, 4 preemptions, 704 hit tokens)."""
    proc, summary, run, _ = runs["async"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    sched = run["engine_pieces"]["scheduler"]
    assert sched["class"] == "vllm.v1.core.sched.async_scheduler.AsyncScheduler"
    did = sched["did"]
    assert (did["forwards"], did["preemptions"], did["prefix_hit_tokens"]) == (436, 1, 432)
    assert did["schedules_ahead_of_output"] == 436
    assert run["sources"]["plugins"] == []          # not SGLang's overlap timeline: vLLM's own loop decides
    # a plausible bug of the slot kernel is found under async scheduling too
    proc, summary, _, _ = runs["async_pad"]
    assert proc.returncode == 1 and _found(summary) == {"clobbered": 260, "evicted_slot": 88}
    # --inject runs there too (no SGLang overlap timeline to refuse it for): a dropped write is found
    proc, summary, _, _ = runs["async_inject"]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert _found(summary) == {"clobbered": 21, "stale_read": 21}


@pytest.mark.vllm
def test_a_leak_in_the_window_frees_fails_the_run_at_its_end(runs):
    """No write or read goes wrong when the sliding-window manager keeps blocks from the pool: every request of the
    roomy scenario finishes; the pool's accounting at the end does not hold (exit 3, not a clean verdict). The
    unpatched release gets every block back on every other run here (they end with exit 0 or 1)."""
    proc, summary, _, _ = runs["leak"]
    assert proc.returncode == 3, proc.stderr[-3000:]
    inc = summary["incomplete"]
    assert inc["reason"] == "error" and inc["steps_done"] == 37 and summary["findings_total"] == 0
    assert ("ReleaseBroke: vLLM's block pool after every request finished: 109 of 128 blocks free, 19 still "
            "referenced") in inc["message"]
    assert "Traceback" not in proc.stderr and proc.stderr.rstrip().endswith("(exit 3)")


@pytest.mark.vllm
def test_compare_shows_where_sglang_and_vllm_write_differently(runs, tmp_path):
    """One scenario under SGLang 0.5.23's model and under vLLM: `slotscope compare`'s write paths differ in who
    schedules and allocates, the padding convention and eviction timing (issue 28 point 5)."""
    from reports.data import load_run
    from reports.write_paths import write_path_rows

    model = tmp_path / "model"
    proc = slotscope("run", SER, "--out", str(model), "--no-report", "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r.aspect: r.cells for r in write_path_rows([load_run(model), load_run(runs["ser"][3])])}
    assert rows["engine"] == ("model: sglang-0.5.23", "vllm 0.34.0")
    assert rows["batches made by"] == ("model", "vllm 0.34.0 Scheduler")
    assert rows["padded rows of loc"] == ("slot0: padded rows hold 0, index 0 skipped by the store",
                                          "skip-1-null-block: padded rows hold -1, index -1 skipped by the store; "
                                          "page 0 a null block nothing may write")
    assert rows["forwards"] == ("536", "619")
    evicted = rows["SWA slots freed ahead of their full slots (tokens)"]
    assert evicted[0].endswith("first at step 3") and evicted[1].endswith("first at step 1")
    assert rows["what the release's scheduler did"][1] == ("15 retractions / preemptions, 220 SWA slots evicted, "
                                                          "0 prefix-hit tokens")
    out = tmp_path / "cmp.html"
    proc = slotscope("compare", str(model), str(runs["ser"][3]), "-o", str(out))
    assert proc.returncode == 0 and 'id="write-paths"' in out.read_text()


@pytest.mark.vllm
def test_dp_attention_runs_under_the_releases_dp_agreement(runs):
    """scenarios/vllm-dp-decode.toml: decode batches replay a graph padded for the other rank's count (rows past the
    real tokens -1, skipped), prefills and mixed batches run every rank eager and unpadded, and while this rank holds
    no request it runs the engine core's dummy forwards (all rows PAD_SLOT_ID); clean."""
    proc, summary, run, out = runs["dp"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert summary["findings_total"] == 0 and summary["steps"] == 81
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    graphs = [s for s in steps if s["graph"] == "decode_graph"]
    assert len(graphs) == 67 and all(s["mode"] == "decode" for s in graphs)
    # before the first arrival: four dummy forwards, padded to the graph of the other rank's decode
    assert [(s["num_requests"], s["real_tokens"], s["padded_tokens"]) for s in steps[:4]] == \
        [(0, 0, 8), (0, 0, 8), (0, 0, 4), (0, 0, 4)]
    assert sum(s["padded_tokens"] > s["real_tokens"] for s in graphs if s["num_requests"]) > 40
    assert all(s["padded_tokens"] == s["real_tokens"] for s in steps if s["graph"] == "eager")
    sched = run["engine_pieces"]["scheduler"]
    g = sched["graphs"]
    assert g["dp_size"] == 2 and g["decode_graph_requests"] == [1, 2, 4, 8] and g["cudagraph_mode"] == "FULL_DECODE_ONLY"
    assert sched["did"]["dp_dummy_forwards"] == 4


@pytest.mark.vllm
def test_a_dummy_forward_that_writes_the_null_block_is_found(runs):
    """tests/engine_patches/vllm/dp-dummy-slots-zero.yaml (the dummy slot mappings 0, #39444's shape): every layer of
    each of the four dummy forwards writes slot 0 of the null block, which nothing may write."""
    proc, summary, run, out = runs["dp_zero"]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert _found(summary) == {"evicted_slot": 16}
    first = json.loads((out / "findings.jsonl").read_text().splitlines()[0])
    assert (first["step"], first["slot"], first["observed"]["label"]) == (0, 0, "padding")
    assert first["message"] == "write in vLLM's null block (block 0), which nothing may write"


@pytest.mark.vllm
def test_piecewise_graphs_run_attention_over_the_padded_slot_mapping(runs):
    """scenarios/smoke.toml (piecewise and decode graphs, DP 2, MIXED): the release's FULL_AND_PIECEWISE dispatch puts
    prefills and MIXED batches on piecewise graphs of its token sizes, whose attention runs eagerly over the padded
    slot mapping: clean as released; with #36580's revert the padded rows keep stale slots and the piecewise
    batches write there too, not the decode graphs alone."""
    proc, summary, run, out = runs["smoke"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    pw = [s for s in steps if s["graph"] == "piecewise"]
    assert len(steps) == 34 and len(pw) == 10 and sum(s["padded_tokens"] > s["real_tokens"] for s in pw) == 5
    g = run["engine_pieces"]["scheduler"]["graphs"]
    assert g["cudagraph_mode"] == "FULL_AND_PIECEWISE" and g["piecewise_graph_tokens"][:3] == [4, 8, 12]
    proc, summary, run, out = runs["smoke_v1"]
    assert proc.returncode == 1 and _found(summary) == {"clobbered": 704}
    by_step = {s["step"]: s["graph"] for s in steps}
    graphs = {by_step[json.loads(line)["step"]] for line in (out / "findings.jsonl").read_text().splitlines()}
    assert graphs == {"piecewise", "decode_graph"}


@pytest.mark.vllm
def test_what_vllm_cannot_run_yet_is_refused(vllm_release):
    proc = slotscope("run", "scenarios/b3-draft-pool-size.toml", "--engine", "vllm==0.34.0", "--no-report", "-q")
    assert proc.returncode == 2
    assert "draft_full_size / draft_swa_ratio size SGLang's draft pools" in proc.stderr
    proc = slotscope("run", SER, "--engine", "vllm", "--design", "sglang-0.5.23", "--no-report", "-q")
    assert proc.returncode == 2 and "--design sglang-0.5.23 with --engine" in proc.stderr


WORKER_PROBE = """
import json, sys
import numpy as np
from types import SimpleNamespace
from engine_path.releases import EngineSpec
from engine_path.vllm.release import activate
from engine_path.vllm.scheduler import VllmScheduler
from engine_path.vllm.worker import WorkerTables, slots_of
from simulator.scenario import load_scenario
activate(EngineSpec("vllm", "0.34.0"))
sc = load_scenario("scenarios/sched-evict-retract.toml")
driver = VllmScheduler(sc, [], lambda i: np.zeros(1, dtype=np.int64))
g = driver.groups.index("swa")
w = WorkerTables(driver)
w.apply({"a": [[1, 2, 5], [3, 4, 6]]}, {}, set())
w.apply({}, {"a": [[9], [10]]}, set())
slots, tables = w.prepare(["a"], np.array([3]), np.array([1]))
out = {"slots": slots[:, :1].tolist(), "rows": [t[0, :4].tolist() for t in tables], "swa": g}
w.apply({"b": [[7], [8]]}, {}, {"a"})
slots, tables = w.prepare(["b"], np.array([0]), np.array([1]))
out["b"] = slots[:, :1].tolist()
print(json.dumps(out))
"""


def _warm_probe(warm_vllm, tmp_path, source: str):
    """``source`` run as a script forked from the warm import of the release (the repository first on its path)."""
    path = tmp_path / "probe.py"
    path.write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n" + source)
    return warm_vllm.script(str(path), cwd=str(ROOT), timeout=600)


@pytest.mark.vllm
def test_the_releases_worker_tables_append_and_map_slots(warm_vllm, tmp_path):
    """The release's BlockTables under Triton's interpreter: rows grow by appended ids, slot = block * size + offset
    (block size 1 here); a finished request's row goes back and the next request's row is written whole."""
    proc = _warm_probe(warm_vllm, tmp_path, WORKER_PROBE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["swa"] == 0               # vLLM orders the groups by the first layer: gpt-oss's is a window layer
    # position 3 of request a: the 4th block (block size 1) of each group's row, [1, 2, 5, 9] and [3, 4, 6, 10]
    assert got["slots"] == [[9], [10]]
    # the window (32) reaches back past position 0: nothing of the SWA row is nulled in the gathered table
    assert got["rows"] == [[1, 2, 5, 9], [3, 4, 6, 10]]
    assert got["b"] == [[7], [8]]


GRAPH_PROBE = """
import dataclasses, json
import numpy as np
from engine_path.releases import EngineSpec
from engine_path.vllm.release import activate
from engine_path.vllm.graphs import ReleaseGraphs
from engine_path.vllm.scheduler import VllmScheduler
from simulator.scenario import load_scenario
activate(EngineSpec("vllm", "0.34.0"))

class Drawn:                                  # the other ranks' token counts, in order
    def __init__(self, *n): self.n = list(n)
    def sample(self, rng, k): return np.array([self.n.pop(0) for _ in range(k)])

def graphs(dp, *drawn):
    sc = load_scenario("scenarios/sched-evict-retract.toml")       # decode graphs of 1, 2 and 4 requests
    sc = dataclasses.replace(sc, engine=dataclasses.replace(sc.engine, dp_size=dp, dp_other_tokens=Drawn(*drawn)))
    return ReleaseGraphs(VllmScheduler(sc, [], lambda i: np.zeros(1, dtype=np.int64)), sc, np.random.default_rng(0))

def go(g, starts, counts, prompts):
    d = g.dispatch(np.array(starts), np.array(counts), np.array(prompts))
    return [d.graph, d.tokens, list(d.ranks)]

one = graphs(1)
out = {"decode3": go(one, [9, 9, 9], [1, 1, 1], [5, 5, 5]),
       "decode5": go(one, [9] * 5, [1] * 5, [5] * 5),
       "last_prompt_token": go(one, [4, 9], [1, 1], [5, 5]),
       "first_prompt_token": go(one, [0, 9], [1, 1], [5, 5]),
       "extend": go(one, [0, 9], [7, 1], [7, 5]),
       "describe": one.describe()["decode_graph_requests"]}
two = graphs(2, 3, 0, 9, 2)
out["dp_decode"] = go(two, [9], [1], [5])            # the other rank decodes 3: both pad to the graph of 4
out["dp_idle_other"] = go(two, [9, 9, 9], [1, 1, 1], [5, 5, 5])     # idle rank (a dummy of 1): ours alone
out["dp_extend"] = go(two, [0], [7], [7])            # this rank prefills: every rank eager, unpadded
out["dp_other_capped"] = go(two, [9], [1], [5])      # drawn 2
# the batch as the model runner lays it out (its sort_batch_req_ids): decodes first, then by token count
from types import SimpleNamespace as NS
d = VllmScheduler(load_scenario("scenarios/sched-evict-retract.toml"), [], lambda i: np.zeros(1, dtype=np.int64))
fake = NS(scheduled_new_reqs=[NS(req_id="n", num_computed_tokens=0, block_ids=([1], [2]))],
          scheduled_cached_reqs=NS(req_ids=["c7", "d1", "d2"], num_computed_tokens=[40, 30, 20],
                                   new_block_ids=[None, None, None]),
          num_scheduled_tokens={"n": 12, "c7": 7, "d1": 1, "d2": 1}, scheduled_spec_decode_tokens={})
st = d._step_of(fake)
out["order"] = [st.req_ids, st.starts.tolist(), st.counts.tolist()]
# an empty schedule's finished requests: the model runner frees their rows without a forward; ours at the next one
empty = NS(total_num_scheduled_tokens=0, finished_req_ids={"f"}, preempted_req_ids=set())
fake.total_num_scheduled_tokens, fake.finished_req_ids, fake.preempted_req_ids = 21, {"g"}, set()
outs = [empty, fake]
d.done, d._arrivals, d.pending = (lambda: False), (lambda: None), [(0, None)]
d.scheduler.schedule = lambda: outs.pop(0)
d.scheduler.update_from_output = lambda *a: None
st = d.next_step()
out["gone"] = sorted(st.gone)
print(json.dumps(out))
"""


@pytest.mark.vllm
def test_the_releases_graph_manager_and_dp_agreement_pad_each_forward(warm_vllm, tmp_path):
    """The release's CudaGraphManager and dispatch_cg_and_sync_dp choose each forward's graph and padded rows: a
    uniform decode (a prefill's last token over computed context included) takes the smallest FULL decode graph
    that holds it, anything else runs eager unpadded; with DP every rank pads to the largest rank's graph, and a
    rank that prefills makes every rank eager. The batch's rows are in the model runner's order."""
    proc = _warm_probe(warm_vllm, tmp_path, GRAPH_PROBE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["describe"] == [1, 2, 4]
    assert got["decode3"] == ["decode_graph", 4, []]
    assert got["decode5"] == ["eager", 5, []]                # past the largest decode graph
    assert got["last_prompt_token"] == ["decode_graph", 2, []]
    assert got["first_prompt_token"] == ["eager", 2, []]      # a prompt's first token has no context: a prefill
    assert got["extend"] == ["eager", 8, []]
    assert got["dp_decode"] == ["decode_graph", 4, [1, 3]]
    assert got["dp_idle_other"] == ["decode_graph", 4, [3, 1]]
    assert got["dp_extend"] == ["eager", 7, [7, 9]]
    assert got["dp_other_capped"] == ["decode_graph", 2, [1, 2]]
    # scheduler output order n, c7, d1, d2 (new requests first); the runner's: decodes, then 7 tokens, then 12
    assert got["order"] == [["d1", "d2", "c7", "n"], [30, 20, 40, 0], [1, 1, 7, 12]]
    # a request that finished before an empty (blocked) schedule leaves the worker at the next forward
    assert got["gone"] == ["f", "g"]


@pytest.mark.parametrize("driver", ["none", "its_own"])
def test_vllm_sees_exactly_one_active_triton_driver_while_it_imports(monkeypatch, driver):
    """vLLM hands out Triton only where it finds exactly one active (non-cpu) driver, else a placeholder whose kernels
    are plain functions ("'function' object is not subscriptable" at the first launch). A CPU machine has none, so
    one is reported while vLLM imports; a GPU machine's own is active, and a second made every --device cpu vLLM run
    there fail (the bugs --engine vllm corpus on the H100, 2026-12-07)."""
    from types import SimpleNamespace

    import triton.backends as tb

    from engine_path.vllm.release import _triton_driver_reported

    gpu = SimpleNamespace(driver=SimpleNamespace(is_active=lambda: True))
    broken = SimpleNamespace(driver=SimpleNamespace(is_active=lambda: 1 / 0))     # a probe that fails: inactive
    monkeypatch.setattr(tb, "backends", {"nvidia": gpu, "amd": broken} if driver == "its_own" else {"amd": broken})
    with _triton_driver_reported():
        active = [n for n, b in tb.backends.items() if n != "cpu" and b.driver and _probe(b.driver)]
        assert active == (["nvidia"] if driver == "its_own" else ["slotscope-interpreter"])
    assert "slotscope-interpreter" not in tb.backends


def _probe(driver) -> bool:
    try:
        return bool(driver.is_active())
    except ZeroDivisionError:
        return False


def test_slots_through_a_block_table_row():
    from engine_path.vllm.worker import slots_of

    row = np.array([3, 4, 6], dtype=np.int64)
    np.testing.assert_array_equal(slots_of(row, 4, 6, 10), np.array([18, 19, 24, 25]))
    with pytest.raises(IndexError, match="3 blocks read at position 12"):
        slots_of(row, 4, 10, 13)


@pytest.mark.gpu
@pytest.mark.vllm
def test_on_cuda_the_releases_kernels_run_natively_and_find_what_the_cpu_finds(vllm_release, tmp_path):
    """`--device cuda`: the worker's Triton kernels on the GPU (no interpreter), the pools under test on the GPU, and
    the same verdicts as on the CPU: vllm-graph-pad clean, and with the #36580 revert 4 clobbered."""
    patch = str(ROOT / "examples" / "engine-patches" / "vllm" / "revert-36580-pad-from-padded-count.yaml")
    got = {}
    for device in ("cuda", "cpu"):
        for name, extra in (("clean", ()), ("v1", ("--engine-patch", patch))):
            out = tmp_path / f"{device}-{name}"
            proc = slotscope("run", "scenarios/vllm-graph-pad.toml", "--engine", "vllm==0.34.0", "--device", device,
                             "--out", str(out), "--no-report", "-q", *extra)
            summary = json.loads((out / "summary.json").read_text())
            run = json.loads((out / "run.json").read_text())
            got[device, name] = (proc.returncode, _found(summary), summary["steps"])
            if device == "cuda":
                rows = {r["piece"]: r["whose"] for r in run["engine_pieces"]["rows"]}
                assert any("its Triton kernels on the GPU" in p and w == "engine" for p, w in rows.items()), rows
    assert got["cuda", "clean"] == got["cpu", "clean"] == (0, {}, 37)
    assert got["cuda", "v1"] == got["cpu", "v1"] == (1, {"clobbered": 4}, 37)


@pytest.mark.vllm
def test_a_stall_on_a_pool_below_vllms_startup_minimum_says_so(warm_vllm, tmp_path):
    """vllm-long-prompt on 24 blocks: its 384-token prompt can never be admitted (24 full blocks and up to 7 SWA ones; max_model_len 392: 384 + 6 outputs + 2), and
    vLLM's own startup check (check_enough_kv_cache_memory) would not have started a server on that pool: the stall
    names it, so it is not taken for the release's bug (as V2's stall, on a pool that passes the check, is)."""
    sc = tmp_path / "small.toml"
    sc.write_text((ROOT / "scenarios" / "vllm-long-prompt.toml").read_text().replace("full_size = 512",
                                                                                      "full_size = 384"))
    out = tmp_path / "out"
    proc = warm_vllm.cli("run", str(sc), "--engine", "vllm==0.34.0", "--out", str(out), "--no-report", "-q")
    assert proc.returncode == 2
    assert ("SchedulerStalled" in json.loads((out / "summary.json").read_text())["incomplete"]["message"])
    assert ("24 of 24 blocks of 16 tokens free; the head of its queue, request 0, has 384 prompt tokens (vLLM would "
            "not start with this pool (check_enough_kv_cache_memory): one request of max_model_len 392 tokens may "
            "hold 32 blocks across its groups, the pool has 24") in proc.stderr
    run = json.loads((out / "run.json").read_text())
    assert run["engine_pieces"]["scheduler"]["startup_check"].startswith("vLLM would not start with this pool")


@pytest.mark.vllm
def test_an_exception_in_the_releases_own_code_ends_the_run_in_one_line_naming_where(vllm_release, tmp_path):
    """The release raising inside its own scheduler (a crash a server would have) is the release's failure: exit 3,
    one line naming the call, the exception and the frame of the release's code (a patched function by its target),
    summary.json incomplete with the same words; no traceback of slotscope's."""
    out = tmp_path / "out"
    proc = slotscope("run", SER, "--engine", "vllm==0.34.0", "--engine-patch",
                     str(PATCHES / "pool-cannot-get-blocks.yaml"), "--out", str(out), "--no-report", "-q",
                     "--trace-level", "off")
    said = ("vLLM 0.34.0's scheduler (schedule) raised ValueError: Cannot get 41 free blocks from the pool (raised at "
            "<patched vllm.v1.core.block_pool.BlockPool.get_new_blocks>:")
    assert proc.returncode == 3 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert said in json.loads((out / "summary.json").read_text())["incomplete"]["message"]


@pytest.mark.vllm
def test_eagle_runs_clean_with_the_drafter_in_the_targets_group_and_a_rollback_bug_shows(runs):
    """engine.speculative on vLLM: the release's SpeculativeConfig puts an EAGLE-3 drafter layer into the target's
    full-attention group; every verify (4 tokens a request) is followed by the drafter's prefill over the same slots
    and two decode steps past the accepted tokens, their slots the release's compute_slot_mappings. Clean as
    released; a verify's rejected drafts not rolled back (update_from_output) gives stale reads on the target's
    layers and the drafter's."""
    proc, summary, run, out = runs["eagle"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    sched = run["engine_pieces"]["scheduler"]
    assert sched["speculative"]["drafter_layers"] == {"swa": [], "full": ["draft.layers.0"]}
    assert sched["speculative"]["num_speculative_tokens"] == 3 and sched["speculative"]["lookahead_block_hashes"] == 1
    assert sched["did"]["preemptions"] > 0 and sched["did"]["prefix_hit_tokens"] > 0
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    modes = collections.Counter(s["mode"] for s in steps)
    target = modes["extend"] + modes["decode"] + modes["mixed"]
    assert modes["draft_extend"] == target == sched["did"]["forwards"] and modes["draft_decode"] > target
    # a verify of the same number of drafts per request replays a FULL decode graph captured at that query length
    # (the model runner's decode_query_len, 1 + 3), as the release captures them with speculative decoding
    assert any(s["mode"] == "decode" and s["graph"] == "decode_graph" for s in steps)
    proc, summary, run, out = runs["eagle_rollback"]
    assert proc.returncode == 1 and set(_found(summary)) == {"stale_read"}
    layers = {json.loads(line)["layer"] >= 8 for line in (out / "findings.jsonl").read_text().splitlines()}
    assert layers == {True, False}         # the target's layers (0-7) and the drafter's (8)


@pytest.mark.vllm
def test_extract_hidden_states_stores_padded_rows_in_the_null_block_as_released(runs):
    """vLLM's extract_hidden_states on 0.34.0 as released: its cache-only layer is a KV-cache group of its own, and
    the store's clamp (#43869) puts the padded rows of a verify replayed in a decode graph (one request of 2 tokens in
    the graph of 2 requests) in slot 0 of the null block: one finding, at the cache-only layer (2, after S and F),
    the store's piece the release's and named in run.json."""
    proc, summary, run, out = runs["null_block"]
    assert proc.returncode == 1, proc.stderr[-2000:]
    sched = run["engine_pieces"]["scheduler"]
    assert [g["kind"] for g in sched["groups"]] == ["swa", "full", "hidden"]
    assert sched["speculative"]["method"] == "extract_hidden_states"
    assert sched["speculative"]["drafter_layers"]["hidden"] == ["draft.cache_only_layers.0"]
    whose = {r["piece"].split(" (")[0]: r["whose"] for r in run["engine_pieces"]["rows"]}
    assert whose["extract_hidden_states' store"] == "engine"
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [(s["mode"], s["graph"], s["real_tokens"], s["padded_tokens"]) for s in steps] == [
        ("extend", "eager", 1, 1), ("draft_extend", "eager", 1, 1),
        ("decode", "decode_graph", 2, 4), ("draft_extend", "eager", 2, 4)]
    found = [json.loads(line) for line in (out / "findings.jsonl").read_text().splitlines()]
    assert [(f["step"], f["layer"], f["class"], f["slot"]) for f in found] == [(3, 2, "evicted_slot", 0)]
    assert found[0]["message"] == "write in vLLM's null block (block 0), which nothing may write"


@pytest.mark.vllm
def test_dp_with_piecewise_graphs_only_runs(warm_vllm, tmp_path):
    """DP 2 with piecewise graphs and no FULL decode graph: the release's decode mode is PIECEWISE, whose
    descriptors have no request count, so the other ranks' decodes are bounded by this rank's (a fuzz draw once
    ended in a TypeError of slotscope's own graphs.py, reported as the release's)."""
    text = (ROOT / "scenarios" / "vllm-dp-decode.toml").read_text()
    sc = tmp_path / "dp-piecewise.toml"
    sc.write_text(text.replace("[engine]\n", "[engine]\ncuda_graph = false\npiecewise_cuda_graph = true\n", 1))
    proc = warm_vllm.cli("run", str(sc), "--engine", "vllm==0.34.0", "--out", str(tmp_path / "out"), "--no-report",
                         "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = [json.loads(line) for line in (tmp_path / "out" / "steps.jsonl").read_text().splitlines()]
    assert {s["graph"] for s in steps} <= {"piecewise", "eager"} and any(s["graph"] == "piecewise" for s in steps)


@pytest.mark.vllm
def test_the_drafters_prefill_runs_on_the_targets_padded_rows(warm_vllm, tmp_path):
    """EAGLE's draft prefill runs on the target's batch, its padded rows included (the speculator's
    num_tokens_padded), at the target's slot mappings: with V1's revert (#36580: a graph's padded rows keep earlier
    forwards' slots) the drafter's layers write there too (layers 6+; before 2026-12-07 the drafter's prefill ran
    unpadded and only the target's 268 findings showed)."""
    text = (ROOT / "scenarios" / "vllm-hidden-states-pad.toml").read_text()
    sc = tmp_path / "eagle-pad.toml"
    sc.write_text(text.replace('algorithm = "extract_hidden_states"', 'algorithm = "eagle"')
                  .replace("num_layers = 4", "num_layers = 6"))
    out = tmp_path / "out"
    proc = warm_vllm.cli("run", str(sc), "--engine", "vllm==0.34.0", "--engine-patch",
                         str(ROOT / "examples/engine-patches/vllm/revert-36580-pad-from-padded-count.yaml"),
                         "--out", str(out), "--no-report", "--trace-level", "off", "-q")
    assert proc.returncode == 1, proc.stderr[-2000:]
    found = collections.Counter((f["layer"] >= 6, f["class"]) for f in map(
        json.loads, (out / "findings.jsonl").read_text().splitlines()))
    assert found == {(False, "clobbered"): 189, (False, "evicted_slot"): 75, (False, "missed"): 3,
                     (False, "stale_read"): 1, (True, "clobbered"): 37, (True, "evicted_slot"): 7}


#: a fuzz draw (seed 11) whose other DP rank voted a decode of 64 requests of 2 tokens (a verify) under a token budget
#: of 64: slotscope padded the forward to 128 rows, past the release's slot mappings (an internal error)
DP_VERIFY = """name = "dp-verify"
seed = 319477262
design = "sglang-0.5.23"
max_steps = 200
[model]
layers = "SFSFSF"
window = 8192
[pool]
full_size = 848
swa_ratio = 0.25
page_size = 16
[workload]
requests = 5
arrival = "poisson"
rate = 0.5
prompt_len = { dist = "uniform", min = 9, max = 76 }
output_len = { dist = "uniform", min = 2, max = 12 }
[engine]
chunked_prefill_size = 64
dp_size = 2
dp_other_tokens = { dist = "choice", values = [0, 64] }
piecewise_cuda_graph = true
piecewise_max_tokens = 64
[engine.speculative]
num_draft_tokens = 2
accept_rate = 0.5
"""


#: a fuzz draw (seed 20261208) with 2 drafts a request and a budget of 128: its decode graphs were captured up to
#: the largest request count (the recorded max taken in requests), so a graph of 44 verifies ran 132 rows
DP_VERIFY_3 = DP_VERIFY.replace("chunked_prefill_size = 64", "chunked_prefill_size = 128").replace(
    "values = [0, 64]", "values = [0, 200, 1500]").replace("piecewise_cuda_graph = true\npiecewise_max_tokens = 64\n",
                                                          "").replace("num_draft_tokens = 2", "num_draft_tokens = 3")


@pytest.mark.vllm
@pytest.mark.parametrize("text, widest", [(DP_VERIFY, 64), (DP_VERIFY_3, 126)])     # budgets 64 and 128
def test_the_other_dp_ranks_verifies_stay_in_the_token_budget(warm_vllm, tmp_path, text, widest):
    """With speculative decoding a uniform decode is a verify (1 + drafts tokens a request): the decode graphs are
    captured within the token budget (the recorded max in tokens, as vLLM's config resolution makes it) and the
    other ranks' votes are bounded by it, as every rank's batch is, so no forward is padded past the release's slot
    mappings."""
    sc = tmp_path / "dp-verify.toml"
    sc.write_text(text)
    proc = warm_vllm.cli("run", str(sc), "--engine", "vllm==0.34.0", "--out", str(tmp_path / "out"), "--no-report",
                         "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = [json.loads(line) for line in (tmp_path / "out" / "steps.jsonl").read_text().splitlines()]
    assert max(s["padded_tokens"] for s in steps) == widest and any(s["graph"] == "decode_graph" for s in steps)


def test_only_the_releases_own_frames_make_an_exception_the_releases():
    """engine_path.errors.raised_in: an exception with a frame in the release's package ends the run as ReleaseBroke
    naming that frame; one raised in slotscope's own adapter (engine_path/vllm/, whose path also holds "/vllm/")
    stays slotscope's, its traceback kept."""
    from engine_path import errors

    def compiled(path: str):
        ns: dict = {}
        exec(compile("def f(x):\n    return x['missing']\n", path, "exec"), ns)
        return ns["f"]

    release = compiled("/cache/engines/vllm-0.34.0/vllm/v1/core/thing.py")
    with pytest.raises(errors.ReleaseBroke, match=r"raised KeyError: 'missing' \(raised at v1/core/thing.py:2 in f\)"):
        errors.raised_in("vllm", "vLLM's thing", release, {})
    ours = compiled(str(ROOT / "engine_path" / "vllm" / "graphs.py"))
    with pytest.raises(KeyError):
        errors.raised_in("vllm", "vLLM's thing", ours, {})
