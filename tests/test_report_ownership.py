"""The report's ownership over time of the first divergent slot (issue 12 point 5; reports/ownership.py): who
held the slot, who freed it, who was given it, from the run's radix slot events (summary.json's
``radix.ownership``), as a plot and in words.

R3 (scenarios/r3-stale-tombstone-mapping.toml under radix-r3, one backend): SWA slot 106 is node 7's, freed by
its tombstone at step 38, given to request 11, then node 13, then request 13 at step 60; at step 61 node 7's
recovery frees it again through the stale mapping while request 13 holds it, and request 13 reads it freed
(tests/test_sharing_run.py pins the same run). A clean run with the cache on, and a run without it, show nothing.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from reports.data import load_run
from reports.html import render_report
from reports.ownership import OwnershipHistory, SlotEvent, holdings, ownership_view, ownership_words, read_history

ROOT = Path(__file__).resolve().parent.parent


def _run(tmp: Path, scenario: str, name: str, *extra: str) -> Path:
    from slotscope.cli import main

    out = tmp / name
    rc = main(["run", str(ROOT / "scenarios" / scenario), "--out", str(out), "--trace-level", "off",
               "--no-report", "--device", "cpu", "--backends", "triton", "-q", *extra])
    assert rc in (0, 1)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("ownership-runs")
    return {"r3": _run(tmp, "r3-stale-tombstone-mapping.toml", "r3", "--design", "radix-r3"),
            "clean": _run(tmp, "r2-locked-full-recovery.toml", "clean", "--design", "radix-fixed")}


def test_the_history_comes_from_the_runs_slot_events(runs):
    h = read_history(load_run(runs["r3"]))
    assert (h.pool, h.slot, h.step, h.cls, h.backend) == ("swa", 114, 28, "stale_read", "triton")
    given = [(e.step, e.owner) for e in h.events if e.kind == "alloc"]
    assert given[:5] == [(1, "request:0"), (16, "request:5"), (26, "request:4"), (28, "request:9"), (28, "request:10")]
    freed = [(e.step, e.owner, e.cause) for e in h.events if e.kind == "free"]
    assert freed[:4] == [(16, "node:2", "tombstone"), (26, "node:17", "tombstone"), (27, "node:19", "evict_leaf"),
                         (28, "node:17", "recover")]


def test_words_name_who_held_freed_and_was_given_the_slot(runs):
    view = ownership_view(load_run(runs["r3"]))
    words = view.sentences
    assert words[0].startswith("SWA slot 114 is the first divergent slot (stale_read at step 28 on triton: req 9 ")
    assert ("node 19 from step 27 (insert) until it was freed at step 27; request 10 from step 28 (alloc) until it "
            "was passed at step 29; request 9 from step 28 (alloc)") in words[1]
    # the stale mapping's recovery frees the slot a second time: it is in the free list twice, handed out twice
    assert ("step 27: freed on behalf of node 19 (evict_leaf); step 28: freed on behalf of node 17 (recover); "
            "step 28: given to request 9 (allocation); step 28: given to request 10 (allocation)") in words[2]
    assert words[3] == ("At step 28 it was given to request 10 while request 9 (since step 28) still held it: two "
                        "owners of one slot.")
    assert words[4].startswith("Read through a prefix lock by request 0, request 4, request 5, request 9, ")
    assert view.plot is not None and view.plot.svg.count("<svg") == 1 and "Ownership of SWA slot 114" in view.plot.svg
    # this run ends without an over-free: no note
    assert view.notes == ()


def test_the_report_has_the_section_and_clean_runs_do_not(runs):
    page = render_report(load_run(runs["r3"]))
    assert '<section id="ownership">' in page and "given to request 10 while request 9" in page
    assert ownership_view(load_run(runs["clean"])) is None
    assert '<section id="ownership">' not in render_report(load_run(runs["clean"]))


def test_an_over_free_that_ended_the_run_is_said(runs, tmp_path):
    import shutil

    stopped = tmp_path / "stopped"
    shutil.copytree(runs["r3"], stopped)
    s = json.loads((stopped / "summary.json").read_text())
    s["radix"]["stopped"] = {"step": 49, "class": "over_free", "assert": "available_size() <= size",
                             "message": "freeing 101 pages leaves 515 free of 512"}
    (stopped / "summary.json").write_text(json.dumps(s))
    assert ownership_view(load_run(stopped)).notes == (
        "The run stopped at step 49: the allocator's capacity assert (available_size() <= size) failed, which ends "
        "SGLang's engine: freeing 101 pages leaves 515 free of 512.",)


def test_a_damaged_or_missing_history_shows_nothing(runs, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(runs["r3"], bad)
    s = json.loads((bad / "summary.json").read_text())
    s["radix"]["ownership"] = {"pool": "swa", "slot": "x"}
    (bad / "summary.json").write_text(json.dumps(s))
    assert ownership_view(load_run(bad)) is None
    s["radix"]["ownership"] = {"pool": "swa", "slot": 3, "events": [[1, "alloc"], "junk", [2, "free", "c", None]]}
    (bad / "summary.json").write_text(json.dumps(s))
    h = read_history(load_run(bad))
    assert [(e.step, e.kind) for e in h.events] == [(2, "free")]
    del s["radix"]
    (bad / "summary.json").write_text(json.dumps(s))
    assert ownership_view(load_run(bad)) is None


def _h(*events) -> OwnershipHistory:
    return OwnershipHistory("full", 9, 5, "triton", "stale_read", "", tuple(SlotEvent(*e, None) for e in events),
                            False)


def test_holdings_two_owners_and_a_node_taking_over():
    h = _h((1, "alloc", "alloc", "request:0"), (2, "adopt", "insert", "node:1"), (3, "free", "tombstone", "node:9"),
           (4, "alloc", "alloc", "request:2"), (6, "free", "evict_leaf", "node:1"))
    hold = [(x.owner, x.start, x.end, x.ended_by) for x in holdings(h)]
    assert hold == [("request:0", 1, 2, "passed"), ("node:1", 2, 6, "freed"), ("request:2", 4, None, "")]
    words = ownership_words(h)
    assert words[-1] == ("At step 3 it was freed on behalf of node 9 (tombstone) while node 1 (since step 2) held it: "
                         "a free of a slot its owner still uses.")
    h2 = _h((1, "alloc", "alloc", "request:0"), (4, "alloc", "alloc", "request:2"))
    assert ownership_words(h2)[-1] == ("At step 4 it was given to request 2 while request 0 (since step 1) still "
                                       "held it: two owners of one slot.")
    assert "No event of the radix cache touched this slot" in ownership_words(_h())[1]
