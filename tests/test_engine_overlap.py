"""The engine in the loop under the overlap timeline (issue 11 point 7): SGLang 0.5.23's own allocator and
eviction rule make the scheduler's writes, the overlap timeline lands them inside our forward.

One subprocess, one import of the release (engine_path.isolate), two runs in it: W7 (ROCm, 0.5.23's default
there has no WAR barrier) gives exactly the model's pinned counts (tests/test_pinned_counts.py, ("W7", "buggy")),
and the same scenario under the barrier 0.5.23 uses on CUDA / with SGLANG_ENABLE_WAR_BARRIER=1
(``war_barrier = "after_launch"``) is clean.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parent.parent
W7 = ROOT / "scenarios" / "w7-rocm-no-barrier.toml"
ALL = ("flashinfer", "triton", "flashattention", "trtllm_mha", "aiter", "xpu", "torch_native", "musa")

#: the model's pins for W7 (tests/test_pinned_counts.py): steps, and per backend (writes, counts, first)
STEPS = 31
WRITES = 124
BUGGY = {"padding_slot": 4, "stale_read": 107}
FIRST = {"step": 13, "layer": 0, "class": "padding_slot"}


def both_runs(buggy: str, fixed: str) -> dict:
    """In the child (the release imported once): the two scenario runs through the engine."""
    from engine_path.checks import scenario_run

    return {"buggy": scenario_run(buggy), "fixed": scenario_run(fixed)}


@pytest.fixture(scope="module")
def runs(engine_releases, tmp_path_factory):
    from engine_path import isolate

    text = W7.read_text()
    assert "[engine]\n" in text and "war_barrier" not in text
    fixed = tmp_path_factory.mktemp("w7") / "w7-war-barrier.toml"
    fixed.write_text(text.replace("[engine]\n", '[engine]\nwar_barrier = "after_launch"\n', 1))
    path = os.pathsep.join(p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")) if p)
    return isolate.call("sglang==0.5.23", "test_engine_overlap:both_runs", str(W7), str(fixed),
                        env={"PYTHONPATH": path})


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
