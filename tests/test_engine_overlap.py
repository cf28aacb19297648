"""The engine in the loop under the overlap timeline (issue 11 point 7): SGLang 0.5.23's own allocator and
eviction rule make the scheduler's writes, the overlap timeline lands them inside our forward.

One child of the release's process, one import of the release (engine_path.isolate's child, forked from the
session's one import of it: tests/warm_engine.py), five runs in it:

* W7 (ROCm, 0.5.23's default there has no WAR barrier) gives exactly the model's pinned counts
  (tests/test_pinned_counts.py, ("W7", "buggy")), and the same scenario under the barrier 0.5.23 uses on CUDA /
  with SGLANG_ENABLE_WAR_BARRIER=1 (``war_barrier = "after_launch"``) is clean;
* W1 as shipped (``slotscope run scenarios/w1-overlap-no-barrier.toml --engine sglang==0.5.23``: retraction
  through the release's ``free``, its eviction rule) is clean under 0.5.23's CUDA barrier (but aiter, below), and with the
  barrier off (``war_barrier = "none"``, W1's ordering on 0.5.23's allocator) gives exactly the model's counts
  (the model run, design sglang-0.5.23, in this process);
* W5 with the barrier releasing right after metadata init (``war_barrier = "read_done_after_metadata"``, W5's
  ordering) is clean on every backend but aiter, trtllm_mha included: 0.5.23's SWA layers write through the
  metadata-init snapshot (#33587), so no landing tears a token; aiter's store kernel maps each SWA slot at its own
  layer (W5's class in aiter, the model's and the release's alike).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.slow]   # the W-series engine runs (~90 s): the slow tier

ROOT = Path(__file__).resolve().parent.parent
W7 = ROOT / "scenarios" / "w7-rocm-no-barrier.toml"
ALL = ("flashinfer", "triton", "flashattention", "trtllm_mha", "aiter", "xpu", "torch_native", "musa")

#: the model's pins for W7 (tests/test_pinned_counts.py): steps, and per backend (writes, counts, first)
STEPS = 31
WRITES = 124
BUGGY = {"padding_slot": 4, "stale_read": 107}
FIRST = {"step": 13, "layer": 0, "class": "padding_slot"}


W1 = ROOT / "scenarios" / "w1-overlap-no-barrier.toml"
W5 = ROOT / "scenarios" / "w5-overlap-torn-write.toml"

#: W1 with the barrier off: the model's counts (design sglang-0.5.23; the same as ("W1", "buggy") in
#: tests/test_pinned_counts.py: the same seed's landings, and 0.5.23's eviction changes no entry they race)
W1_STEPS, W1_WRITES = 130, 520
W1_NONE = {"padding_slot": 2, "stale_read": 59}
W1_FIRST = {"step": 28, "layer": 0, "class": "padding_slot"}
W5_STEPS, W5_WRITES = 95, 760
CLI = ("w1", "w1_none", "w5", "w5_early", "w1_chunked")


def _cli_run(path: str, out: str, *how: str) -> dict:
    from slotscope.cli import main

    rc = main(["run", path, *how, "--out", out, "--no-report", "--trace-level", "off", "-q"])
    summary = json.loads((Path(out) / "summary.json").read_text())
    return {"rc": rc, "summary": summary, "out": out}


def all_runs(out_root: str, *paths: str) -> dict:
    """In the child (the release imported once): W7 through engine_path.checks.scenario_run, then the W1 and
    W5 runs exactly as ``slotscope run FILE --engine sglang==0.5.23`` makes them (the CLI, in process)."""
    import slotscope.engine_run as engine_run
    from engine_path.checks import scenario_run

    out = {"buggy": scenario_run(paths[0]), "fixed": scenario_run(paths[1])}
    made = []
    load = engine_run.load_runtime

    def load_and_keep(*a, **k):          # the CLI's runtime, to read which engine calls it made
        made.append(load(*a, **k))
        return made[-1]
    engine_run.load_runtime = load_and_keep
    for name, p in zip(CLI, paths[2:]):
        out[name] = _cli_run(p, str(Path(out_root) / name), "--engine", "sglang==0.5.23")
        rt = made[-1]
        out[name]["engine_calls"] = dict(rt.allocator.calls)
        out[name]["scheduler_release"] = rt.design.release.name
    return out


def _chunked(tmp) -> str:
    """W1 with prompts past the window prefilled in 64-token chunks, no barrier: 0.5.23's chunked-prefill and
    decode eviction (its overlap guards) run through the release's eviction rule while writes race."""
    text = W1.read_text()
    for a, b in (('min = 16, max = 120 }', 'min = 300, max = 600 }'), ("chunked_prefill_size = 256", "chunked_prefill_size = 64"),
                 ("full_size = 384", "full_size = 4096"), ('reserve = "none"\n', 'war_barrier = "none"\n')):
        assert a in text
        text = text.replace(a, b, 1)
    # seed 4: one whose landings put finish frees before metadata init (the scenario's own seed lands none)
    text = text.replace("seed = 26380", "seed = 4", 1).replace('name = "w1-overlap-no-barrier"',
                                                               'name = "w1-chunked-prefill"', 1)
    out = tmp / "w1-chunked-prefill.toml"
    out.write_text(text)
    return str(out)


def _with_barrier(tmp, src: Path, barrier: str) -> str:
    text = src.read_text()
    assert "[engine]\n" in text and "war_barrier" not in text
    out = tmp / f"{src.stem}-{barrier}.toml"
    out.write_text(text.replace("[engine]\n", f'[engine]\nwar_barrier = "{barrier}"\n', 1))
    return str(out)


@pytest.fixture(scope="module")
def runs(warm, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("w")
    paths = (str(W7), _with_barrier(tmp, W7, "after_launch"), str(W1), _with_barrier(tmp, W1, "none"),
             str(W5), _with_barrier(tmp, W5, "read_done_after_metadata"), _chunked(tmp))
    path = os.pathsep.join(p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")) if p)
    out = warm("sglang==0.5.23").call("test_engine_overlap:all_runs", str(tmp / "engine"), *paths,
                                      env={"PYTHONPATH": path})
    # the model runs beside them: slotscope run FILE --design sglang-0.5.23
    out["model"] = {name: _cli_run(p, str(tmp / "model" / name), "--design", "sglang-0.5.23")
                    for name, p in zip(CLI, paths[2:])}
    return out


def _counts(b: dict) -> dict:
    return {c: n for c, n in b["findings"].items() if n}


def test_w7_under_the_engine_gives_the_models_counts(runs):
    r = runs["buggy"]
    assert r["version"] == "0.5.23"
    assert r["steps"] == STEPS
    assert set(r["backends"]) == set(ALL)
    for name, b in r["backends"].items():
        assert b["writes"] == WRITES, name
        assert _counts(b) == BUGGY, name
        ff = b["first_finding"]
        assert (ff["step"], ff["layer"], ff["class"]) == (FIRST["step"], FIRST["layer"], FIRST["class"]), name
    # the scheduler's writes went through the release's own allocator
    calls = r["engine_calls"]
    assert sum(calls.values()) > 0 and calls.get("free", 0) > 0, calls


def test_w7_under_the_engine_with_the_barrier_is_clean(runs):
    r = runs["fixed"]
    assert r["steps"] == STEPS
    for name, b in r["backends"].items():
        assert b["writes"] == WRITES, name
        assert _counts(b) == {}, name


#: per CLI run: (steps, writes per backend, counts per backend, first finding)
CLI_PINS = {
    "w1": (W1_STEPS, W1_WRITES, {}, None),                       # 0.5.23's CUDA barrier (after_launch)
    "w1_none": (W1_STEPS, W1_WRITES, W1_NONE, W1_FIRST),         # W1's ordering on 0.5.23's allocator
    "w5": (W5_STEPS, W5_WRITES, {}, None),
    "w5_early": (W5_STEPS, W5_WRITES, {}, None),                 # W5's ordering: the snapshot keeps it clean
    # prompts past the window in 64-token chunks: 0.5.23's eviction rule asked 37 times while writes race
    "w1_chunked": (98, 392, {"padding_slot": 6, "stale_read": 384}, {"step": 77, "layer": 0, "class": "padding_slot"}),
}


#: aiter per CLI run (the model's and the release's alike): its store kernel maps each SWA slot at its own layer
#: (launch_reshape_and_cache_flash with the live mapping), so the scheduler's writes landing between layers tear its
#: writes: W5's class, live in 0.5.23's aiter under every barrier that releases before the layers run
AITER = {"w1": {"padding_slot": 5, "torn_write": 5}, "w1_none": {"padding_slot": 11, "torn_write": 1, "stale_read": 59},
         "w5": {"padding_slot": 21, "torn_write": 10}, "w5_early": {"padding_slot": 26, "torn_write": 9},
         "w1_chunked": {"padding_slot": 7, "torn_write": 1, "stale_read": 384}}

#: torch_native under the release's forward: (writes, forwards that raised, the first one's step); each raised
#: forward writes none of its layers (W1: 4 layers, W5: 8)
TORCH_NATIVE = {"w1": (500, 5, 19), "w1_none": (500, 5, 19), "w5": (712, 6, 22), "w5_early": (712, 6, 22),
                "w1_chunked": (292, 25, 33)}


@pytest.mark.parametrize("name", CLI)
def test_w1_w5_under_the_engine_cli_give_the_models_counts(runs, name):
    """slotscope run FILE --engine sglang==0.5.23 under the overlap timeline: 0.5.23's allocator, eviction rule
    and write path interleaved with our forward, exactly the counts of the model run (--design sglang-0.5.23)."""
    steps, writes, counts, first = CLI_PINS[name]
    eng, model = runs[name], runs["model"][name]
    es, ms = eng["summary"], model["summary"]
    assert es["engine"]["version"] == "0.5.23" and ms["engine"] is None
    assert es["design"] == ms["design"] == "sglang-0.5.23"
    assert es["steps"] == ms["steps"] == steps
    assert set(es["backends"]) == set(ALL)
    for b in ALL:
        e, m = es["backends"][b], ms["backends"][b]
        if b == "aiter":
            assert m["writes"] == e["writes"] == writes and _counts(m) == _counts(e) == AITER[name], b
            assert m["first_finding"] == e["first_finding"], b
            continue
        assert m["writes"] == writes and _counts(m) == counts and m["first_finding"] == first, b
        if b == "torch_native":
            continue
        assert e["writes"] == writes and _counts(e) == counts and e["first_finding"] == first, b
    # the release's own torch_native forward reads an SWA layer's cache through req_to_token's full-pool ids;
    # once those pass the SWA pool's size its SDPA gather raises IndexError (a crash the model does not have)
    tn_writes, tn_errors, tn_first = TORCH_NATIVE[name]
    e = es["backends"]["torch_native"]
    assert e["writes"] == tn_writes and _counts(e) == {**counts, "design_error": tn_errors}
    assert e["first_finding"] == {"step": tn_first, "layer": -1, "class": "design_error"}
    assert eng["rc"] == 1 and model["rc"] == 1
    errors = [json.loads(line) for line in (Path(eng["out"]) / "findings.jsonl").read_text().splitlines()
              if '"design_error"' in line]
    assert len(errors) == tn_errors and {f["backend"] for f in errors} == {"torch_native"}
    assert all("RadixAttention.forward (the release's) raised IndexError" in f["message"] for f in errors)


def test_the_engine_cli_runs_went_through_0523s_allocator_and_release_model(runs):
    for name in CLI:
        assert runs[name]["scheduler_release"] == "sglang-0.5.23", name
    # W1: 8 finishes and 2 retractions freed through the release's allocator, its eviction rule asked
    assert runs["w1"]["engine_calls"]["free"] == runs["w1_none"]["engine_calls"]["free"] == 10
    assert runs["w5"]["engine_calls"]["free"] == 12
    assert runs["w1"]["engine_calls"]["eviction_rule"] == 0     # 0.5.23's cadence: no request gets that long
    assert runs["w1_chunked"]["engine_calls"]["eviction_rule"] > 0
    assert all(runs[n]["engine_calls"]["alloc"] > 0 for n in CLI)
