"""`slotscope conform --scheduler`: the model's scheduler against SGLang 0.5.23's own ``Scheduler`` (no model).

Four CLI runs against the cached 0.5.23, two at a time (the release's side forked from the session's warm import,
one fresh): sched-evict-retract (the radix cache off: 0.5.23's scheduler over its disabled tree, retractions,
decode-time SWA eviction) under the design ``sglang-0.5.23`` conforms on every forward (536: mode, requests, new
tokens, lengths, write slots, free slots), and so does its copy at page 16 (581: a finished or retracted request's
row freed in one call, page by page); a model with LIFO free lists
(tests/conform_designs.py) diverges at the first reuse of a freed slot, forward 7, on out_cache_loc; a scenario the
release's scheduler cannot run here yet (DP attention) is refused with the reason. The comparison itself is tested
on hand-made decisions without the engine.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from engine_path.schedule_conformance import compare_schedules
from engine_path.scheduler import Decision, unsupported
from helpers import slotscope_cli

ROOT = Path(__file__).resolve().parent.parent
B2 = "scenarios/b2-decode-stale-tail.toml"
RUNS = {
    "ser": ("scenarios/sched-evict-retract.toml",),
    "lifo": (B2, "--design", "tests/conform_designs.py:LifoAtPage1"),
    "dp": ("scenarios/smoke.toml",),
}


slotscope = slotscope_cli


#: the run that goes through a fresh process (the others' release side forks from the warm import)
FRESH = "ser"


@pytest.fixture(scope="module")
def runs(warm, tmp_path_factory):
    paged = tmp_path_factory.mktemp("sched") / "sched-evict-retract-p16.toml"
    text = (ROOT / RUNS["ser"][0]).read_text()
    paged.write_text(text.replace("full_size = 256\n", "full_size = 256\npage_size = 16\n"))
    route = {"sglang==0.5.23": warm.socket("sglang==0.5.23")}

    def one(key):
        args = (str(paged),) if key == "ser16" else RUNS[key]
        argv = ("conform", *args, "--engine", "sglang==0.5.23", "--scheduler", "--json")
        return key, slotscope(*argv) if key == FRESH else warm("none").cli(*argv, route=route, timeout=900)

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, [*RUNS, "ser16"]))


def _result(proc) -> dict:
    import json

    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.engine
def test_a_scheduler_under_pressure_with_the_radix_cache_off_schedules_as_the_release_does(runs):
    proc = runs["ser"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = _result(proc)
    assert res["conforms"] is True and res["first_difference"] is None
    assert res["forwards"] == {"model": 536, "engine": 536}
    assert res["engine_scheduler"].startswith("sglang 0.5.23 Scheduler")
    assert res["tree_cache"] == "UnifiedRadixCache"
    assert "init_tp_model_worker" in res["stand_ins"] and "every forward conforms" in proc.stdout


@pytest.mark.engine
def test_the_same_at_page_16_schedules_as_the_release_does(runs):
    proc = runs["ser16"]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = _result(proc)
    assert res["conforms"] is True and res["first_difference"] is None and res["first_tree_difference"] is None
    assert res["forwards"] == {"model": 581, "engine": 581}


@pytest.mark.engine
def test_a_model_that_reuses_freed_slots_first_diverges_at_the_first_reuse(runs):
    proc = runs["lifo"]
    assert proc.returncode == 1, proc.stderr[-2000:]
    first = _result(proc)["first_difference"]
    assert first["step"] == 7 and first["field"] == "out_cache_loc"
    assert first["model"] == list(range(566, 576)) and first["engine"] == list(range(1273, 1283))
    assert "first difference at forward 7: out_cache_loc" in proc.stdout


@pytest.mark.engine
def test_a_scenario_it_cannot_run_yet_is_refused(runs):
    proc = runs["dp"]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "engine.dp_size > 1" in proc.stderr


# --------------------------------------------------------------------------- the comparison, no engine

def _d(step=0, mode="decode", rids=(0, 1), loc=(5, 6), full_free=10, swa_free=8, tree=(0, 0, 0, 0)) -> dict:
    return Decision(step, mode, tuple(rids), (1,) * len(rids), (9,) * len(rids), tuple(loc), full_free,
                    swa_free, tuple(tree)).to_json()


def test_equal_decisions_conform():
    res = compare_schedules([_d(0), _d(1)], [_d(0), _d(1)])
    assert res == {"conforms": True, "first_difference": None, "first_tree_difference": None,
                   "forwards": {"model": 2, "engine": 2}}


def test_a_tree_difference_is_named_apart_from_the_decisions():
    res = compare_schedules([_d(0), _d(1, tree=(0, 96, 0, 34)), _d(2, swa_free=1)],
                            [_d(0), _d(1, tree=(0, 96, 1, 33)), _d(2, swa_free=2)])
    assert res["conforms"] is False
    assert res["first_tree_difference"] == {"step": 1, "model": (0, 96, 0, 34), "engine": (0, 96, 1, 33)}
    assert res["first_difference"]["step"] == 2 and res["first_difference"]["field"] == "swa_free"
    assert "tree" not in res["first_difference"]["model_forward"]


def test_the_first_differing_field_is_named_in_order():
    res = compare_schedules([_d(0), _d(1, rids=(0,), loc=(5,))], [_d(0), _d(1, rids=(1,), loc=(7,), swa_free=3)])
    first = res["first_difference"]
    assert res["conforms"] is False and first["step"] == 1 and first["field"] == "rids"
    assert first["model"] == (0,) and first["engine"] == (1,)
    assert first["engine_forward"]["swa_free"] == 3 and "out_cache_loc" not in first["engine_forward"]


def test_a_side_with_more_forwards_diverges_after_the_last_common_one():
    res = compare_schedules([_d(0), _d(1), _d(2)], [_d(0), _d(1)])
    assert res["first_difference"] == {"step": 2, "field": "forwards", "model": 3, "engine": 2}


def test_what_the_release_scheduler_cannot_run_yet_is_named():
    from simulator.scenario import load_scenario

    assert unsupported(load_scenario(ROOT / B2)) is None
    assert "dp_size" in unsupported(load_scenario(ROOT / "scenarios/smoke.toml"))
    assert "speculative" in unsupported(load_scenario(ROOT / "scenarios/p6-draft-step-swa.toml"))


@pytest.mark.slow
@pytest.mark.engine
def test_a_later_turn_reaches_the_release_after_the_turn_before_finished(engine_releases):
    """A conversation's turn k > 1 is handed to the release only once turn k - 1 has finished (plus its think
    time), as the model's radix scheduler holds it: its first forward comes after the previous turn's last."""
    import numpy as np

    from engine_path import isolate
    from simulator.scenario import load_scenario
    from simulator.scheduling.workload import make_requests

    path = str(ROOT / "scenarios/cover-radix-paged.toml")
    steps = isolate.call("sglang==0.5.23", "engine_path.scheduler:trace_schedule", path, {})["steps"]
    sc = load_scenario(path)
    specs = make_requests(sc.workload, np.random.default_rng(sc.seed))
    first, last = {}, {}
    for d in steps:
        for r in d["rids"]:
            first.setdefault(r, d["step"])
            last[r] = d["step"]
    index = {(s.conversation, s.turn): i for i, s in enumerate(specs) if s.conversation is not None}
    later = [(i, index[(s.conversation, s.turn - 1)]) for i, s in enumerate(specs) if s.turn > 1]
    assert len(later) >= 3 and all(i in first for i, _ in later)
    for i, prev in later:
        assert first[i] > last[prev], (i, prev, first[i], last[prev])
