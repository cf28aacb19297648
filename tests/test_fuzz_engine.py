"""slotscope fuzz of a patched release (issue 27 point 6): a failure counts only where the release as released runs
the same draw clean, so the release's own bugs (F1 in 0.5.23) do not end a search for the bug a patch puts back.

The unpatched release runs in a worker process of its own (slotscope/fuzz_release_ref.py): a process imports one
release once, patched or not. Draws that the release, slotscope's adapter of it or its pools cannot run are
rejected, not slotscope's internal errors.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import slotscope.pipeline as pipeline
from engine_path.errors import AdapterLacks, ReleaseLacks, SchedulerStalled
from engine_path.patches import ENV as PATCHES_ENV
from engine_path.releases import EngineSpec
from simulator.scenario import load_scenario
from slotscope.fuzz_release_ref import ReleaseReference
from slotscope.fuzz_search import DesignReference, reference, run_one

ROOT = Path(__file__).resolve().parent.parent
SPEC = EngineSpec("sglang", "0.5.23")
REVERT_29352 = ROOT / "examples" / "engine-patches" / "revert-29352-locked-full-recovery.yaml"


def test_a_patched_release_is_searched_against_the_release_as_released():
    ref = reference("radix-r2", "release", SPEC, patched=True)
    assert isinstance(ref, ReleaseReference) and ref.name == "sglang==0.5.23 as released"
    assert ref._proc is None                          # the worker starts at the first failure, not before
    assert reference("radix-r2", "release", SPEC, patched=False) is None       # the release itself: nothing
    assert reference("radix-r2", "none", SPEC, patched=True) is None
    named = reference("radix-r2", "radix-fixed", SPEC, patched=True)
    assert isinstance(named, DesignReference) and named.name == "radix-fixed"
    own = reference("radix-r2", "release", None)
    assert isinstance(own, DesignReference) and own.name == "sglang-0.5.23"


@pytest.mark.parametrize("error", [SchedulerStalled, AdapterLacks, ReleaseLacks])
def test_a_draw_the_engine_cannot_run_is_rejected(monkeypatch, error):
    def refuse(*args, **kwargs):
        raise error("cannot run this one")
    monkeypatch.setattr(pipeline, "run_scenario", refuse)
    assert run_one(load_scenario(ROOT / "scenarios" / "smoke.toml"), SPEC).status == "rejected"


def test_any_other_engine_error_is_not_a_rejection(monkeypatch):
    from engine_path.errors import EngineError

    def fail(*args, **kwargs):
        raise EngineError("the adapter broke")
    monkeypatch.setattr(pipeline, "run_scenario", fail)
    with pytest.raises(EngineError, match="the adapter broke"):
        run_one(load_scenario(ROOT / "scenarios" / "smoke.toml"), SPEC)


def test_the_worker_runs_the_release_without_the_patches(engine_releases, monkeypatch):
    # the search's process has the patch in its environment; the worker must not apply it: R2's scenario is then
    # clean (the patched release gives 510 stale_read per backend: tests/test_engine_schedule_source.py), while
    # F1's scenario fails there as in any run of 0.5.23 (its first finding on aiter, in the backends' order)
    monkeypatch.setenv(PATCHES_ENV, str(REVERT_29352))
    ref = ReleaseReference(SPEC)
    try:
        r2 = ref.run(load_scenario(ROOT / "scenarios" / "r2-locked-full-recovery.toml"))
        first = ref._proc.pid
        f1 = ref.run(load_scenario(ROOT / "scenarios" / "f1-flashinfer-round-swa-reads.toml"))
        assert ref._proc.pid == first                 # one worker, one import, for the whole search
    finally:
        ref.close()
    assert (r2.status, r2.finding) == ("clean", None)
    assert f1.status == "found" and (f1.finding["class"], f1.finding["backend"]) == ("stale_read", "aiter")
    assert ref._proc is None
