"""The overlap scheduler's timeline (simulator/scheduling/timeline.py, simulator/plugins/overlap.py), retraction, and the W-series.

docs/OVERLAP.md explains the model; the table of orderings under which each W bug reproduces is
``test_orderings_that_reproduce_each_w_bug`` below (and the same table in the doc).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from simulator.designs import load_design
from simulator.core.eager import EagerExecutor
from simulator.records import FINDING_CLASSES
from simulator.plugins.overlap import OverlapDriver
from simulator.run import make_run
from simulator.scheduling.timeline import (BARRIERS, END_POINT, Journal, SchedWrite, earliest_chooser, landing_rng,
                                           latest_chooser, plan, points, random_chooser, resolve_barrier)

from helpers import tiny

L = 4   # layers of the hand-made forwards (gpt-oss at 4 layers: swa, full, swa, full): points 0 metadata_init, 1 in_graph_metadata, 2 read_done,
        # 3 layer:1, 4 layer:2, 5 layer:3, 6 forward_end


def _w(kind: str, rid: int = 0) -> SchedWrite:
    return SchedWrite(kind, rid, np.array([5], dtype=np.int64), np.array([0], dtype=np.int64))


# ------------------------------------------------------------------ landing points per barrier

def test_points_of_a_forward():
    assert points(L) == ("metadata_init", "in_graph_metadata", "read_done", "layer:1", "layer:2", "layer:3",
                         END_POINT)


#: (barrier, mode, graph) -> earliest point of (a result write, a schedule write)
EARLIEST = {
    ("none", "decode", "decode_graph"): (0, 0),
    ("loop_top", "decode", "decode_graph"): (0, 6),
    ("read_done_after_metadata", "decode", "decode_graph"): (1, 1),
    ("after_launch", "decode", "decode_graph"): (2, 2),      # read-done published after the in-graph metadata
    ("after_launch", "extend", "eager"): (2, 2),             # prefill read-done (default on in 0.5.23)
    ("after_launch", "decode", "eager"): (6, 6),             # no event published: the whole forward
    ("coarse", "decode", "decode_graph"): (6, 6),
}


@pytest.mark.parametrize("key", list(EARLIEST), ids=lambda k: "-".join(k))
def test_exact_landing_points_per_barrier(key):
    barrier, mode, graph = key
    writes = [_w("free"), _w("free_swa"), _w("retract"), _w("alloc")]
    early = plan(writes, barrier, mode, graph, L, earliest_chooser)
    r, s = EARLIEST[key]
    assert early.at == (r, s, s, s)
    assert [early.pts[a] for a in early.at][0] == points(L)[r]
    late = plan(writes, barrier, mode, graph, L, latest_chooser)
    assert late.at == (6, 6, 6, 6)
    assert late.record() == {"barrier": barrier, "layers": L,
                             "writes": [[w.kind, 0, END_POINT, 1, [[5, 5]]] for w in writes]}


def test_every_barrier_is_covered():
    assert {k[0] for k in EARLIEST} == set(BARRIERS)


def test_landings_outside_the_barrier_or_out_of_order_are_refused():
    with pytest.raises(ValueError, match="outside"):
        plan([_w("alloc")], "loop_top", "decode", "decode_graph", L, lambda w, lo, end: [0])
    with pytest.raises(ValueError, match="decrease"):
        plan([_w("free"), _w("alloc")], "none", "decode", "decode_graph", L, lambda w, lo, end: [3, 1])


def test_random_landings_stay_in_range_in_order_and_reach_every_ordering():
    writes = [_w("free"), _w("alloc")]
    seen = set()
    for seed in range(400):
        at = plan(writes, "none", "decode", "decode_graph", 2, random_chooser(landing_rng(seed))).at
        assert at[0] <= at[1] <= 4
        seen.add(at)
    # every non-decreasing pair over the 5 points of a 2-layer forward
    assert seen == {(a, b) for a in range(5) for b in range(a, 5)}


def test_the_timeline_stream_is_its_own():
    a = np.random.default_rng(7).random(4)
    landing_rng(7).random(100)
    assert np.array_equal(np.random.default_rng(7).random(4), a)
    assert not np.array_equal(landing_rng(7).random(4), a)


def test_barrier_resolution_per_platform():
    rel = load_design("sglang-0.5.23").release.behaviour
    assert resolve_barrier("release", dict(rel.war_barriers), "cuda") == "after_launch"
    assert resolve_barrier("release", dict(rel.war_barriers), "rocm") == "none"          # W7
    fixed = load_design("sglang-0.5.23-war-barrier").release.behaviour
    assert resolve_barrier("release", dict(fixed.war_barriers), "rocm") == "after_launch"
    assert resolve_barrier("coarse", dict(rel.war_barriers), "rocm") == "coarse"
    assert load_design("sglang-pre-26380").release.behaviour.war_barrier("cuda") == "none"
    assert load_design("sglang-pre-31687").release.behaviour.war_barrier("cuda") == "loop_top"
    assert load_design("sglang-pre-33587").release.behaviour.war_barrier("cuda") == "read_done_after_metadata"


def test_a_hip_decode_graph_publishes_its_read_done_after_the_replay():
    """0.5.23's IN_REPLAY read-done needs the graph's in-graph marker, which HIP graphs have not got: on ROCm a
    decode graph's read-done falls back to after the replay, so under the barrier nothing lands inside it; a
    prefill publishes after its metadata init on either platform."""
    pts = points(4)
    s = SchedWrite("free", 0, np.array([5]), np.array([0]))
    on = {p: plan([s], "after_launch", "decode", "decode_graph", 4, earliest_chooser, p).at for p in ("cuda", "rocm")}
    assert on == {"cuda": (pts.index("read_done"),), "rocm": (pts.index(END_POINT),)}
    for p in ("cuda", "rocm"):
        assert plan([s], "after_launch", "extend", "eager", 4, earliest_chooser, p).at == (pts.index("read_done"),)


def test_journal_reads_values_back_through_the_allocator_interface():
    class Alloc:
        full_to_swa = np.array([0, 7, 8, 9], dtype=np.int64)
    j = Journal(Alloc())
    j.note("alloc", 3, np.array([1, 2]))
    j.note("free", 3, np.array([], dtype=np.int64))        # nothing to record
    Alloc.full_to_swa[1] = 0
    (w,) = j.take()
    assert (w.kind, w.rid, w.full.tolist(), w.values.tolist(), w.cls) == ("alloc", 3, [1, 2], [7, 8], "schedule")
    assert j.take() == []


# ------------------------------------------------------------------ runs

def _scenario(extra_engine: str = "", *, requests: int = 10, full: int = 1024, out_max: int = 12, seed: int = 5,
              layers: int = 4):
    return tiny(f"""
name = "t"
seed = {seed}
backends = ["flashinfer", "trtllm_mha"]
[model]
preset = "gpt-oss-20b"
num_layers = {layers}
[pool]
full_size = {full}
swa_ratio = 0.5
[workload]
requests = {requests}
arrival = "poisson"
rate = 1.0
prompt_len = {{ dist = "uniform", min = 8, max = 96 }}
output_len = {{ dist = "uniform", min = 1, max = {out_max} }}
[engine]
chunked_prefill_size = 256
cuda_graph_bs = [1, 2, 4, 8]
{extra_engine}
""")


def _run(sc, design: str, chooser=None, setup=None):
    from cuda_path.pool import TaggedKVPool

    def make(full_rows, swa_rows, skip):
        return TaggedKVPool(sc.model, full_rows, swa_rows, device="cpu", skip_index=skip)

    run = make_run(sc, load_design(design), make, executor=EagerExecutor())
    if chooser is not None:
        run.plugin(OverlapDriver).choose = chooser
    if setup is not None:
        setup(run)
    for batch, truth in run.stream():
        run.step(batch, truth)
    return run, run.result()


def _counts(res) -> dict:
    return {b: {c: n for c, n in s.findings.items() if n} for b, s in res.backends.items()}


def _outputs(res) -> tuple:
    steps = [{k: v for k, v in r.to_json().items() if not k.startswith("t_")} for r in res.steps]
    return steps, [repr(f) for f in res.findings]


def test_same_seed_same_outputs():
    sc = _scenario("overlap = true\nwar_barrier = \"none\"")
    a, b = _run(sc, "sglang-post-33587")[1], _run(sc, "sglang-post-33587")[1]
    assert _outputs(a) == _outputs(b)
    assert all("timeline" in r.to_json() for r in a.steps)


def test_overlap_off_records_no_timeline():
    res = _run(_scenario(), "sglang-post-33587")[1]
    assert all("timeline" not in r.to_json() for r in res.steps)
    assert not any(_counts(res).values())


def test_device_mapping_ends_each_forward_equal_to_the_allocator():
    run, _ = _run(_scenario("overlap = true\nwar_barrier = \"none\""), "sglang-post-33587")
    assert np.array_equal(run.mapping.numpy(), run.alloc.full_to_swa)
    assert run.mapping.data_ptr() != torch.from_numpy(run.alloc.full_to_swa).data_ptr()


def _at_point(p: int):
    """Every write at point p, or the earliest its barrier allows when that is later."""
    return lambda writes, lo, end: [max(p, a) for a in lo]


#: (design, war_barrier) -> {landing point: backends that show findings} for the hand-made scenario
#: (4 layers: swa, full, swa, full). Point names: see test_points_of_a_forward.
ORDERINGS = {
    # W1 / W2 / W7: a cleared entry matters only if it lands before metadata init; later it changes nothing
    ("sglang-post-33587", "none"): {0: {"flashinfer", "trtllm_mha"}, 1: set(), 2: set(), 3: set(), 6: set()},
    # W2: loop-top barrier: result frees still land anywhere, scheduling writes after the forward
    ("sglang-post-33587", "loop_top"): {0: {"flashinfer", "trtllm_mha"}, 1: set(), 6: set()},
    # W5: per-layer live translation: a point before the last SWA layer (layer 2) breaks trtllm_mha: before
    # layer 0 or 1 every SWA layer sees the change, before layer 2 only the late one (torn); later: nothing
    ("sglang-pre-33587", "read_done_after_metadata"): {1: {"trtllm_mha"}, 2: {"trtllm_mha"}, 3: {"trtllm_mha"},
                                                       4: {"trtllm_mha"}, 5: set(), 6: set()},
    # the fixes: nothing lands before the read-done event
    ("sglang-post-33587", "after_launch"): {2: set(), 3: set(), 6: set()},
}


@pytest.mark.parametrize("key", list(ORDERINGS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_orderings_that_reproduce_each_w_bug(key):
    design, barrier = key
    sc = _scenario(f"overlap = true\nwar_barrier = \"{barrier}\"", requests=12)
    for p, want in ORDERINGS[key].items():
        counts = _counts(_run(sc, design, _at_point(p))[1])
        assert {b for b, c in counts.items() if c} == want, (p, counts)


def test_w5_torn_write_classes():
    sc = _scenario("overlap = true\nwar_barrier = \"read_done_after_metadata\"", requests=12)
    before_all = _counts(_run(sc, "sglang-pre-33587", _at_point(2))[1])["trtllm_mha"]
    between = _counts(_run(sc, "sglang-pre-33587", _at_point(4))[1])["trtllm_mha"]
    assert before_all.get("padding_slot", 0) > 0 and not before_all.get("torn_write", 0)   # every SWA layer
    assert between.get("padding_slot", 0) > 0                                              # layer 2 only
    if "torn_write" in FINDING_CLASSES:                  # the per-token consistency check: torn
        assert between.get("torn_write", 0) > 0


# ------------------------------------------------------------------ retraction

def test_retraction_releases_requeues_and_prefills_again():
    sc = _scenario('reserve = "none"', requests=8, full=384, out_max=40, seed=3)
    from cuda_path.pool import TaggedKVPool

    def make(full_rows, swa_rows, skip):
        return TaggedKVPool(sc.model, full_rows, swa_rows, device="cpu", skip_index=skip)

    run = make_run(sc, load_design("sglang-post-33587"), make, executor=EagerExecutor())
    sch = run.scheduler
    seen = []
    orig = sch._retract

    def retract(req):
        full = req.slots.full[: req.slots.length].copy()
        swa_live = int(np.count_nonzero(req.slots.swa[req.slots.swa_evicted: req.slots.length]))
        used = (sch.alloc.full_used, sch.alloc.swa_used)
        decoded = req.decoded
        orig(req)
        assert (sch.alloc.full_used, sch.alloc.swa_used) == (used[0] - full.size, used[1] - swa_live)
        assert not sch.alloc.full_to_swa[full].any()              # mapping cleared
        assert sch.waiting[0] is req and req not in sch.running     # re-queued at the head
        assert req.prefilled == 0 and req.prefill_len == req.spec.prompt_len + decoded
        seen.append(req.rid)
    sch._retract = retract
    re_prefilled = set()
    for batch, truth in sch.steps():
        if batch.mode == "extend" and batch.requests is not None:
            re_prefilled |= set(int(r) for r in batch.requests.rids) & set(seen)
        run.step(batch, truth)
    res = run.result()
    assert seen and sch.retractions == len(seen)
    assert re_prefilled == set(seen)                                 # every retracted request prefilled again
    assert sch.finished_count == sch.total_requests
    assert not any(_counts(res).values())                            # retraction alone corrupts nothing


def test_reserve_none_refuses_speculative():
    from simulator.scenario import ScenarioError
    with pytest.raises(ScenarioError, match="reserve"):
        _scenario('reserve = "none"\nmixed_chunk = true')


# ------------------------------------------------------------------ determinism (issue 11 point 2)

W2 = str(Path(__file__).resolve().parent.parent / "scenarios" / "w2-overlap-result-frees.toml")
RUN_OUTPUTS = ("summary.json", "findings.jsonl", "steps.jsonl", "shapes.jsonl")


def test_same_seed_gives_byte_identical_run_files_under_overlap(tmp_path):
    from slotscope.cli import main

    for d in ("a", "b"):
        assert main(["run", W2, "--out", str(tmp_path / d), "--no-report", "--trace-level", "off", "-q"]) == 1
    for name in RUN_OUTPUTS:
        a, b = (tmp_path / "a" / name).read_bytes(), (tmp_path / "b" / name).read_bytes()
        assert a == b, name
    steps = [json.loads(line) for line in (tmp_path / "a" / "steps.jsonl").read_text().splitlines()]
    assert all("timeline" in s for s in steps)
    assert sum(len(s["timeline"]["writes"]) for s in steps) > 0
    findings = (tmp_path / "a" / "findings.jsonl").read_text().splitlines()
    assert len(findings) > 0                     # the buggy W2 state: the identical files hold findings


def _landing_points(run) -> list[tuple]:
    return [tuple(ld.at) for ld in run.plugin(OverlapDriver).landings]


def _writes(run) -> list[tuple]:
    return [(w.kind, w.rid, w.full.tolist(), w.values.tolist()) for ld in run.plugin(OverlapDriver).landings for w in ld.writes]


def test_different_landing_seeds_give_different_orders_of_the_same_writes():
    """The same workload (the landing stream draws nothing from the run's), landings from four seeds: the
    scheduler makes the same writes in the same order every time, the seed moves where they land, and with
    them what the buggy barrier lets through."""
    sc = _scenario("overlap = true\nwar_barrier = \"none\"", requests=12)
    runs = {s: _run(sc, "sglang-post-33587", random_chooser(landing_rng(s))) for s in (1, 2, 3, 4)}
    writes = {s: _writes(r) for s, (r, _) in runs.items()}
    assert all(w == writes[1] for w in writes.values()) and len(writes[1]) == 116
    orders = {s: _landing_points(r) for s, (r, _) in runs.items()}
    assert len(set(map(tuple, orders.values()))) == 4                 # four different landing orders
    counts = {s: _counts(res)["flashinfer"] for s, (_, res) in runs.items()}
    assert counts == {1: {}, 2: {"padding_slot": 2, "stale_read": 95}, 3: {"padding_slot": 2, "stale_read": 95},
                      4: {"padding_slot": 2, "stale_read": 25}}      # and not the same findings
    # the scenario's own seed picks the stream: same seed, same order
    again = _run(sc, "sglang-post-33587")[0]
    assert _landing_points(again) == _landing_points(_run(sc, "sglang-post-33587")[0])


# ------------------------------------------------------------------ whose tokens the W findings are on

def _live_and_dropped(run, res) -> tuple[int, int]:
    """Findings on a request whose free (its finish, seen one batch late) or retraction races that very
    forward (SGLang drops that token's output) vs on any other request."""
    gone = {rec.step: {w.rid for w in ld.writes if w.kind in ("free", "retract")}
            for rec, ld in zip(res.steps, run.plugin(OverlapDriver).landings)}
    live = dropped = 0
    for f in res.findings:
        if f.expected.request in gone[f.step]:
            dropped += 1
        else:
            live += 1
    return live, dropped


def test_chunked_prefill_keeps_the_overlap_guard_so_w1_reaches_no_live_token():
    """Prompts past the window, prefilled in chunks under the overlap scheduler without a barrier (W1),
    every write as early as allowed: the next chunk's out-of-window free_swa would clear entries the
    in-flight chunk still reads, but mid-2026's maybe_evict_swa already guarded that (no eviction for the
    first two extend batches, then against prefix_len - chunked_prefill_size). So every finding is on a
    token SGLang drops; the fixed barrier is clean."""
    from simulator.engine_model.release_model import EvictionContext, MidYear2026Eviction

    ev = MidYear2026Eviction()
    on = EvictionContext(window=128, page_size=1, chunked_prefill_size=64, overlap=True)
    off = EvictionContext(window=128, page_size=1, chunked_prefill_size=64)
    assert [ev.extend_point(on, prefix_len=320, evicted=0, chunk=c) for c in (0, 1, 2)] == [None, None, 256]
    assert ev.extend_point(off, prefix_len=320, evicted=0, chunk=0) == 320
    assert (ev.swa_hold_bound(on), ev.swa_hold_bound(off)) == (386, 322)
    sc = tiny("""
name = "t"
seed = 26380
backends = ["flashinfer", "trtllm_mha"]
[model]
preset = "gpt-oss-20b"
num_layers = 4
[pool]
full_size = 4096
swa_ratio = 0.5
[workload]
requests = 6
arrival = "poisson"
rate = 2.0
prompt_len = { dist = "uniform", min = 300, max = 600 }
output_len = { dist = "uniform", min = 4, max = 40 }
[engine]
chunked_prefill_size = 64
cuda_graph_bs = [1, 2, 4, 8]
overlap = true
""")
    run, res = _run(sc, "sglang-pre-26380", earliest_chooser)
    assert len(res.steps) == 98
    assert sum(1 for ld in run.plugin(OverlapDriver).landings for w in ld.writes if w.kind == "free_swa") == 25
    assert _counts(res) == {b: {"padding_slot": 12, "stale_read": 768} for b in ("flashinfer", "trtllm_mha")}
    assert _live_and_dropped(run, res) == (0, 1560)
    assert not any(_counts(_run(sc, "sglang-post-33587", earliest_chooser)[1]).values())

    # without the guard the next chunk's free_swa clears entries the in-flight chunk still reads: live
    # requests' prefill tokens read slot 0 (what the guard is for, and what the read check would report)
    def unguarded(run):
        run.scheduler._ev_ctx = dataclasses.replace(run.scheduler._ev_ctx, overlap=False)
    run, res = _run(sc, "sglang-pre-26380", earliest_chooser, unguarded)
    assert _counts(res)["flashinfer"] == {"padding_slot": 12, "stale_read": 2250}
    assert _live_and_dropped(run, res) == (2964, 1560)
