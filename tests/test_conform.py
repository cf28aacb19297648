"""slotscope conform: our model of SGLang 0.5.23 against the release, step by step.

Five ``slotscope conform`` runs against the cached 0.5.23, two at a time (B1's in fresh processes, the others
forked from the session's warm processes: tests/warm_engine.py): B1 at page 1 and paths-paged at page 16 under
the design ``sglang-0.5.23`` conform on every field; a model with LIFO free lists at page 1
(tests/conform_designs.py) exits 1 naming its first divergence exactly. The comparison itself is
tested on hand-made traces without the engine.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import slotscope_cli

ROOT = Path(__file__).resolve().parent.parent
B1 = "scenarios/b1-pcg-dp-padding.toml"
PAGED = "scenarios/paths-paged.toml"
LIFO = "tests/conform_designs.py:LifoAtPage1"
R3 = "scenarios/r3-stale-tombstone-mapping.toml"
A2 = "scenarios/a2-pd-decode-swa-tail.toml"

RUNS = {
    "b1": (B1, "--page-size", "1"),
    # torch_native left out: the release's own SDPA raises there from step 7 (an SWA gather at full-pool ids past
    # the SWA pool's rows; tests/test_engine_backends.py NATIVE_CRASHES)
    "paged": (PAGED, "--page-size", "16", "--backends", "flashinfer,triton,flashattention,trtllm_mha,aiter,xpu,musa"),
    "lifo": (B1, "--design", LIFO),
    "radix": (R3, "--page-size", "1", "--max-steps", "60"),
    # the release's torch_native cannot verify (its forward_extend reads the extend lengths a TARGET_VERIFY batch has
    # not got): conform names it at A2's first verify; the decode node is compared on the other seven backends
    "pd": (A2, "--page-size", "16", "--backends",
           "flashinfer,triton,flashattention,trtllm_mha,aiter,xpu,musa"),
}


slotscope = slotscope_cli


#: the run that stays two fresh processes end to end (the CLI's and the release's, engine_path.isolate)
FRESH = "b1"


@pytest.fixture(scope="module")
def conform_runs(warm):
    """The five runs, two at a time: b1 as ``python -m slotscope conform`` whose engine side is a fresh
    ``engine_path.isolate`` child; the others the same command in a child of the session's warm CLI process,
    its engine side in a child forked from the session's one import of 0.5.23 (tests/warm_engine.py)."""
    route = {"sglang==0.5.23": warm.socket("sglang==0.5.23")}

    def one(item):
        key, args = item
        argv = ("conform", *args, "--engine", "sglang==0.5.23", "--json")
        return key, slotscope(*argv) if key == FRESH else warm("none").cli(*argv, route=route, timeout=900)

    with ThreadPoolExecutor(2) as ex:
        return dict(ex.map(one, RUNS.items()))


def _json(proc) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("key,steps", [("b1", 9), ("paged", 40)])
def test_model_conforms(conform_runs, key, steps):
    proc = conform_runs[key]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = _json(proc)
    assert res["first"] is None and res["steps_compared"] == steps
    assert res["design"] == "sglang-0.5.23" and res["engine"]["version"] == "0.5.23"
    assert all(differs == 0 and equal > 0 for equal, differs in res["fields"].values()), res["fields"]
    # every field was compared: the backend groups and the allocator's records
    assert {"swa_ids", "schedule", "out_cache_loc", "mapping", "evicted_swa", "freed_full", "freed_swa",
            "swa_loc [plan]", "swa_loc [translate]", "write_loc [plan]", "write_loc [translate]"} <= set(res["fields"])
    assert res["groups"] == {"plan": ["flashinfer", "triton", "flashattention", "trtllm_mha", "musa"],
                             "translate": ["aiter", "xpu"] + (["torch_native"] if key == "b1" else [])}
    assert "every step conforms" in proc.stdout


@pytest.mark.slow
@pytest.mark.engine
def test_paged_run_used_the_paged_allocator(conform_runs):
    calls = _json(conform_runs["paged"])["engine_calls"]
    assert calls["alloc_extend"] > 0 and calls["alloc_decode"] > 0 and calls["eviction_rule"] > 0
    assert _json(conform_runs["paged"])["page_size"] == 16


@pytest.mark.slow
@pytest.mark.engine
def test_lifo_model_diverges_at_first_reuse(conform_runs):
    proc = conform_runs["lifo"]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    first = _json(proc)["first"]
    # B1 step 1: out_cache_loc still agrees; the SWA slot of the token at full slot 1025 does not: the
    # model hands out an SWA slot freed by eviction (LIFO), the release the next one of its FIFO list
    assert (first["step"], first["field"]) == (1, "mapping")
    assert first["where"] == MAPPING_WHERE
    assert first["detail"] == LIFO_DETAIL
    assert f"first divergence: step 1, mapping ({MAPPING_WHERE}): {LIFO_DETAIL}" in proc.stdout
    fields = _json(proc)["fields"]
    assert fields["mapping"][1] > 0 and fields["swa_ids"] == [8, 0]


@pytest.mark.slow
@pytest.mark.engine
def test_radix_scenario_runs_the_radix_scheduler_on_both_sides(conform_runs):
    """R3 (engine.radix_cache): both sides run the SharingScheduler (the run's own choice), the release's free
    paths under the prefix cache; its counters over the first 60 forwards agree exactly."""
    proc = conform_runs["radix"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = _json(proc)
    assert res["scheduler"] == "SharingScheduler" and res["not_compared"] == []
    assert res["steps_compared"] == 60 and res["first"] is None
    assert res["fields"]["radix"] == [1, 0] and res["fields"]["scheduler"] == [1, 0]
    r = res["radix"]
    assert (r["hit_tokens"], r["tombstones"], r["recoveries"], r["evicted_leaves"]) == (1112, 20, 6, 22)
    # the tree's frees went through the release's own free paths
    assert res["engine_calls"]["free_swa_segment"] > 0
    assert "every step conforms (60 steps)" in proc.stdout


@pytest.mark.slow
@pytest.mark.engine
def test_pd_decode_scenario_runs_the_decode_node_on_both_sides(conform_runs):
    """A2 (engine.pd_decode) at page 16, whole: both sides run the PDDecodeScheduler, the engine side's
    pre-allocation through the release's alloc_extend_swa_tail (one per request) and its finishes through the
    release's row free; every step conforms, the transfers' slots included (tests/test_engine_pd.py: A1, page 1)."""
    proc = conform_runs["pd"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = _json(proc)
    assert res["scheduler"] == "PDDecodeScheduler" and res["not_compared"] == []
    assert res["first"] is None and res["steps_compared"] == 324
    assert res["fields"]["transfer"] == [25, 0] and res["fields"]["radix"] == [1, 0]
    assert res["engine_calls"]["alloc_extend_swa_tail"] == 48 and res["engine_calls"]["free"] == 95
    assert res["radix"]["pd_decode"] == {"transfers": 48, "tail_tokens": 1104, "non_tail_tokens": 4416,
                                         "overallocated_kept": 946, "stale_mappings_at_end": 0}
    assert "every step conforms (324 steps)" in proc.stdout and "not compared" not in proc.stdout


def test_not_compared_lists_what_the_trace_does_not_run():
    import dataclasses

    from engine_path.conformance import not_compared, with_page_size
    from simulator.scenario import load_scenario

    def what(path, page):
        return [(nc["what"], nc["own_path"]) for nc in not_compared(with_page_size(load_scenario(ROOT / path), page))]
    assert what(R3, 1) == [] and what(B1, 16) == []
    assert what(A2, 16) == [] and what(A2, 1) == []
    assert what("scenarios/u2-unified-tombstone-escape.toml", 1) == []
    assert what("scenarios/u2-unified-tombstone-escape.toml", 16) == []            # the paged unified allocator is driven
    assert what("scenarios/w1-overlap-no-barrier.toml", 1) == [("engine.overlap", True)]
    sc = load_scenario(ROOT / B1)
    assert not_compared(dataclasses.replace(sc, engine=dataclasses.replace(sc.engine, overlap=True)))[0]["what"] \
        == "engine.overlap"


MAPPING_WHERE = "full_to_swa[1025]"
LIFO_DETAIL = ("entries first differs at index 103: model [..., 0, 0, 0, 794, 795, 796, 797, ...] (len 154), "
               "engine [..., 0, 0, 0, 1025, 1026, 1027, 1028, ...] (len 154)")


@pytest.mark.engine
def test_bad_input(engine_releases):
    proc = slotscope("conform", B1, "--engine", "sglang==0.5.23", "--design", "no-such-design")
    assert proc.returncode == 2 and "unknown design 'no-such-design'" in proc.stderr
    proc = slotscope("conform", B1, "--engine", "sglang==0.5.15")
    assert proc.returncode == 2 and "no model of sglang 0.5.15" in proc.stderr and "sglang-0.5.23" in proc.stderr
    proc = slotscope("conform", B1, "--engine", "sglang==0.5.23", "--allow", "nope")
    assert proc.returncode == 2 and "not a documented difference" in proc.stderr


# --------------------------------------------------------------------------- the comparison, no engine

def _trace(out_cache_loc, mapping=([1], [1]), swa=None) -> dict:
    swa = swa or {"flashinfer": ["int64", out_cache_loc], "torch_native": ["int64", out_cache_loc]}
    step = {"step": 0, "mode": "extend", "graph": "eager", "out_cache_loc": out_cache_loc,
            "mapping": [list(mapping[0]), list(mapping[1])], "evicted_swa": [], "freed_full": [], "freed_swa": [],
            "swa_loc": swa, "write_loc": {b: [v[1], v[1]] for b, v in swa.items()}}
    return {"info": {"swa_ids": {"flashinfer": "plan", "torch_native": "translate"}, "stopped": None},
            "steps": [step]}


def test_compare_equal():
    from slotscope.conform import compare

    res = compare(_trace([1, 2, 3]), _trace([1, 2, 3]))
    assert res["first"] is None and res["steps_compared"] == 1
    assert res["fields"]["swa_loc [plan]"] == [1, 0] and res["fields"]["swa_loc [translate]"] == [1, 0]


def test_compare_names_first_index_and_neighbours():
    from slotscope.conform import compare

    res = compare(_trace(list(range(1, 11))), _trace([1, 2, 3, 4, 5, 6, 99, 8, 9, 10]))
    f = res["first"]
    assert (f["step"], f["field"]) == (0, "out_cache_loc")
    assert f["detail"] == ("first differs at index 6: model [..., 4, 5, 6, 7, 8, 9, 10] (len 10), "
                           "engine [..., 4, 5, 6, 99, 8, 9, 10] (len 10)")
    res = compare(_trace([1, 2], mapping=([1, 2], [5, 6])), _trace([1, 2], mapping=([1, 2], [5, 7])))
    assert res["first"]["field"] == "mapping" and res["first"]["where"] == "full_to_swa[2]"
    swa = {"flashinfer": ["int32", [1, 2]], "torch_native": ["int64", [1, 2]]}
    res = compare(_trace([1, 2]), _trace([1, 2], swa=swa))
    assert res["first"]["field"] == "swa_loc [plan]" and res["first"]["where"] == "flashinfer"
    assert res["first"]["detail"] == 'dtype: model "int64", engine "int32"'


def test_compare_cuts_a_long_value_against_none():
    """One side None, the other a long list: the detail names the list's head and length, not all of it."""
    from slotscope.conform import _diff

    assert _diff(list(range(100)), None) == "model [0, 1, 2, 3, 4, 5, ...] (len 100), engine null"
    assert _diff([[1], list(range(50))], [[1], None], ("loc", "swa_loc")) == (
        "swa_loc: model [0, 1, 2, 3, 4, 5, ...] (len 50), engine null")
    assert _diff("a" * 400, None) == 'model "' + "a" * 359 + '..., engine null'


def test_unified_trace_binds_each_forward_to_physical_ids():
    """pool.unified at page 1 (model side, no engine): the trace runs the model's unified pool and records each
    forward's physical ids and compaction moves; the swa_loc a backend gets is the physical SWA translation."""
    from engine_path.conformance import trace

    t = trace(str(ROOT / "scenarios/u2-unified-tombstone-escape.toml"),
              {"design": "sglang-0.5.23", "page_size": 1, "max_steps": 30, "backends": ["triton"]})
    assert t["info"]["unified"] is True and t["info"]["not_compared"] == [] and t["info"]["stopped"] is None
    assert t["info"]["scheduler"] == "Scheduler" and len(t["steps"]) == 30
    first = t["steps"][0]
    # the release's layout: the full side grows down from the buffer's top (page 1537), bound ascending; the SWA
    # side grows up from page 1 (u2's entries are equal, so the sink floor is one page on each side)
    assert first["out_cache_loc"] == list(range(1, 160))
    assert first["physical_loc"][0] == list(range(1379, 1538)) and first["physical_loc"][1] == list(range(1, 160))
    assert first["swa_loc"]["triton"] == ["int64", first["physical_loc"][1]]
    assert sum(len(s["moves"]) for s in t["steps"]) == 350          # compaction page moves over 30 forwards
