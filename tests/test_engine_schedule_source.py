"""`slotscope run --engine sglang==0.5.23 --scheduler release`: the release's own Scheduler makes every batch.

The oracle learns owners from what the release did (its batches' out_cache_loc, its mapping, its free lists, its
req_to_token rows), never from the model's scheduler. Whole runs against the cached 0.5.23, two at a time, on two
backends (the bugs here are in scheduling code, before any backend): B2, scenarios/sched-evict-retract.toml and
scenarios/cover-radix-paged.toml run clean with the release deciding (the second with its retractions and
out-of-window SWA evictions, the third through the release's own radix tree under pressure, by default: --scheduler
auto); a bug put into the release's decode allocation, its SWA eviction or its radix tree's insert gives findings; the decode allocation's bug, which keeps every count right, is clean when the model schedules (the
release's allocation never runs there). R2 (#29352) with its fix reverted gives the model's count through the
release's own scheduler and tree, and the model schedules r2's scenario as the release does, forward by forward.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from simulator.scenario import RequestSpec
from simulator.scheduling.batch import BatchRequests
from simulator.scheduling.content_tags import ContentTags
from helpers import slotscope_cli

ROOT = Path(__file__).resolve().parent.parent
PATCHES = ROOT / "tests" / "engine_patches"
B2 = "scenarios/b2-decode-stale-tail.toml"
SER = "scenarios/sched-evict-retract.toml"
RADIX = "scenarios/cover-radix-paged.toml"
R2 = "scenarios/r2-locked-full-recovery.toml"
RUNS = {
    "b2": (B2, "release", None),
    "ser": (SER, "release", None),
    "row_shift": (SER, "release", "sched-decode-row-shift.yaml"),
    "row_shift_model": (SER, "model", "sched-decode-row-shift.yaml"),
    "evict": (SER, "release", "sched-evict-into-window.yaml"),
    "evict_model": (SER, "model", "sched-evict-into-window.yaml"),
    "radix": (RADIX, "auto", None),
    "dup_row": (RADIX, "auto", "sched-insert-keeps-duplicate-row.yaml"),
    "r2_revert": (R2, "auto", ROOT / "examples" / "engine-patches" / "revert-29352-locked-full-recovery.yaml"),
}


slotscope = slotscope_cli


@pytest.fixture(scope="module")
def runs(warm, tmp_path_factory):
    """The runs of RUNS, two at a time, each forked from a warm server of the session (slotscope/forkserver.py): an
    unpatched one from the release's import, a patched one from the release's dependencies (the child imports the
    release and applies the patch, as a fresh process)."""
    base = tmp_path_factory.mktemp("schedule-source")

    def one(key):
        scenario, scheduler, patch = RUNS[key]
        out = base / key
        cmd = ["run", scenario, "--engine", "sglang==0.5.23", "--scheduler", scheduler, "--backends",
               "triton,flashinfer", "--out", str(out), "--no-report", "-q"]
        if patch:
            cmd += ["--engine-patch", str(PATCHES / patch)]     # (an absolute path stays itself)
        proc = warm("sglang==0.5.23").cli(*cmd, timeout=900)
        got = {"proc": proc}
        if (out / "summary.json").exists():
            got["summary"] = json.loads((out / "summary.json").read_text())
            got["run"] = json.loads((out / "run.json").read_text())
        return key, got

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, RUNS))


def _findings(got: dict) -> dict:
    """Findings by class over the backends (non-zero only)."""
    out: dict = {}
    for b in got["summary"]["backends"].values():
        for k, n in b["findings"].items():
            if n:
                out[k] = out.get(k, 0) + n
    return out


@pytest.mark.slow
@pytest.mark.engine
def test_b2_runs_clean_with_the_release_deciding(runs):
    got = runs["b2"]
    assert got["proc"].returncode == 0, got["proc"].stderr[-2000:]
    assert got["summary"]["steps"] == 61 and got["summary"]["findings_total"] == 0
    src = got["run"]["sources"]
    assert src["scheduler"] == "sglang 0.5.23 Scheduler"
    assert src["tree_cache"] == "sglang 0.5.23 UnifiedRadixCache"
    pieces = got["run"]["engine_pieces"]
    engine_rows = [r["piece"] for r in pieces["rows"] if r["whose"] == "engine"]
    assert any(p.startswith("sglang 0.5.23 Scheduler") for p in engine_rows)
    assert not any(r["piece"] == "scheduler" for r in pieces["rows"] if r["whose"] == "slotscope")
    assert "init_tp_model_worker" in pieces["scheduler"]["stand_ins"]
    assert pieces["scheduler"]["did"] == {"extend": 1, "decode": 60, "mixed": 0, "freed_full_slots": 1254,
                                          "freed_swa_slots": 1254, "evicted_swa_slots": 0, "retractions": 0}


@pytest.mark.slow
@pytest.mark.engine
def test_retractions_and_evictions_run_clean_with_the_release_deciding(runs):
    got = runs["ser"]
    assert got["proc"].returncode == 0, got["proc"].stderr[-2000:]
    assert got["summary"]["steps"] == 536 and got["summary"]["findings_total"] == 0
    assert got["run"]["engine_pieces"]["scheduler"]["did"] == {
        "extend": 15, "decode": 521, "mixed": 0, "freed_full_slots": 1485, "freed_swa_slots": 1625,
        "evicted_swa_slots": 1159, "retractions": 2}


@pytest.mark.slow
@pytest.mark.engine
def test_a_bug_in_the_release_decode_allocation_is_found(runs):
    got = runs["row_shift"]
    assert got["proc"].returncode == 1, got["proc"].stderr[-2000:]
    # every later read of a shifted row reads a slot its position does not own (the two backends alike)
    assert _findings(got) == {"stale_read": 156162}
    # the same bug with the model scheduling: the release's allocation never runs, the run is clean
    model = runs["row_shift_model"]
    assert model["proc"].returncode == 0, model["proc"].stderr[-2000:]
    assert model["summary"]["findings_total"] == 0 and model["run"]["sources"]["scheduler"] == "model"


@pytest.mark.slow
@pytest.mark.engine
def test_a_bug_in_the_release_swa_eviction_is_found(runs):
    got = runs["evict"]
    assert got["proc"].returncode == 1, got["proc"].stderr[-2000:]
    assert _findings(got) == {"stale_read": 119}
    # the model scheduling drives the same patched rule through our eviction adapter (its request interface read off
    # the rule's byte code: a patched function has no source): since the model schedules as 0.5.23 does (its
    # disabled tree, decode eviction at seqlen - 1 = the tokens with K/V), the same 536 forwards and the same 119
    # stale reads as the release's own scheduler
    model = runs["evict_model"]
    assert model["proc"].returncode == 1, model["proc"].stderr[-2000:]
    assert model["summary"]["steps"] == 536 and _findings(model) == {"stale_read": 119}


@pytest.mark.slow
@pytest.mark.engine
def test_a_row_left_on_freed_duplicates_by_the_release_tree_is_found(runs):
    clean = runs["radix"]
    assert clean["proc"].returncode == 0, clean["proc"].stderr[-2000:]
    assert clean["summary"]["findings_total"] == 0 and clean["summary"]["steps"] == 265
    choice = clean["run"]["engine_pieces"]["scheduler_choice"]
    assert choice == {"scheduler": "release", "asked": "auto", "why": "the release's own scheduler runs this scenario"}
    assert clean["run"]["sources"]["tree_cache"] == "sglang 0.5.23 UnifiedRadixCache"
    # the tree's insert frees a request's duplicate of a prefix it already holds; the row left on it reads freed,
    # then reused, slots
    got = runs["dup_row"]
    assert got["proc"].returncode == 1, got["proc"].stderr[-2000:]
    assert _findings(got) == {"stale_read": 19370}


# --------------------------------------------------------------------------- refusals and tags, no engine run

def test_release_scheduler_needs_an_engine():
    proc = slotscope("run", B2, "--scheduler", "release", "--out", "/dev/null/x")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--scheduler release needs --engine" in proc.stderr


def test_content_tags_name_the_first_writer():
    a = RequestSpec(0, prompt_len=4, output_len=2, prefix_group="sys", prefix_len=3, uid=0)
    b = RequestSpec(0, prompt_len=5, output_len=1, prefix_group="sys", prefix_len=3, uid=1)
    ct = ContentTags()
    ct.rows.append(ct.tags_of(0, a, 6))
    ct.rows.append(ct.tags_of(1, b, 7))
    ra, rb = ct.rows
    assert ra.tolist() == [1, 2, 3, 4, 5, 6]
    assert rb[:3].tolist() == [1, 2, 3] and rb[3:].tolist() == [7, 8, 9, 10]      # its own content past the prefix
    assert (ct.owner_of(2).request, ct.owner_of(2).position) == (0, 1)
    assert (ct.owner_of(10).request, ct.owner_of(10).position) == (1, 6)             # room past its content
    assert ct.owner_of(0).request is None and ct.owner_of(11).request is None
    req = BatchRequests(rids=np.array([1, 0]), seq_lens=np.array([5, 4]), extend_lens=np.array([1, 1]), slots=(),
                        tag_bases=np.zeros(2, dtype=np.int64))
    keys = ct.keys(req, np.array([0, 0, 1]), np.array([0, 4, 3]))
    assert keys.tolist() == [1, 8, 4]


@pytest.mark.slow
@pytest.mark.engine
def test_r2_through_the_release_scheduler_and_tree_with_its_fix_reverted(runs, engine_releases):
    """The release's checkpoints (at each completed prefill too), its tombstone over A's out-of-window prefix and
    B's recovery over it in the same result group: with #29352 reverted A reads its freed Full, the model's 510
    stale_read per backend; and the model makes the release's batches on this scenario, every forward."""
    got = runs["r2_revert"]
    assert got["proc"].returncode == 1, got["proc"].stderr[-2000:]
    assert got["run"]["engine_pieces"]["scheduler_choice"]["scheduler"] == "release"
    assert _findings(got) == {"stale_read": 2 * 510} and got["summary"]["steps"] == 31
    proc = slotscope("conform", R2, "--engine", "sglang==0.5.23", "--scheduler", "--json")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["first_difference"] is None and res["forwards"] == {"model": 31, "engine": 31}
    # the trees too, after every forward (the model caps a fresh live leaf at one window as the release does,
    # _maybe_split_leaf_for_swa_lock, so that a lock pins one window)
    assert proc.returncode == 0 and res["first_tree_difference"] is None
