"""The report's overlap timeline (issue 11 point 6; reports/timeline.py): for the first divergence's step, which
scheduler write landed between which reads and writes of which layer, in a plot and in words.

W5 (trtllm_mha re-translating SWA writes per layer, barrier read_done_after_metadata) at its seed: step 14's free
of request 1 lands between layers 5 and 6, so layer 6 writes request 1's last token (pos 49) to padding slot 0
while layers 0, 2, 4 wrote its own slot 249 (tests/test_pinned_counts.py pins the first finding at 14/6/torn_write).
A run without overlap shows nothing new.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from reports.data import load_run
from reports.explain import first_divergence
from reports.html import render_report, write_report
from reports.timeline import step_timeline, timeline_view
from simulator.scheduling.timeline import slot_runs

ROOT = Path(__file__).resolve().parent.parent


def _run(tmp: Path, scenario: str, name: str, *extra: str) -> Path:
    from slotscope.cli import main

    out = tmp / name
    rc = main(["run", str(ROOT / "scenarios" / scenario), "--out", str(out), "--trace-level", "off",
               "--no-report", "--device", "cpu", "-q", *extra])
    assert rc in (0, 1)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("timeline-runs")
    return {"w5": _run(tmp, "w5-overlap-torn-write.toml", "w5"),
            "b1": _run(tmp, "b1-pcg-dp-padding.toml", "b1", "--max-steps", "4")}


def _section(page: str) -> str:
    m = re.search(r'<section id="timeline">(.*?)</section>', page, re.DOTALL)
    assert m, "no timeline section"
    return m.group(1)


def test_slot_runs():
    assert slot_runs(np.array([1042, 7, 1040, 1041, 9, 8])) == [[7, 9], [1040, 1042]]
    assert slot_runs(np.array([], dtype=np.int64)) == []


def test_w5_steps_record_the_slots_of_each_write(runs):
    tl = step_timeline(load_run(runs["w5"]), 14)
    assert tl is not None and tl.barrier == "read_done_after_metadata" and tl.layers == 8
    free = [w for w in tl.writes if w.kind == "free"]
    assert [(w.request, w.point) for w in free] == [(1, "layer:6")]
    assert free[0].runs and sum(b - a + 1 for a, b in free[0].runs) == free[0].entries == 50


def test_w5_report_shows_the_timeline_plot_and_words(runs):
    page = render_report(load_run(runs["w5"]))
    sec = _section(page)
    assert "<svg" in sec and 'id="fig-run-timeline"' in sec
    words = re.sub(r"\s+", " ", sec)
    assert ("At step 14, under barrier read_done_after_metadata, the free of request 1&#39;s slots (full 98-138"
            in words)
    assert "landed after metadata init, between layer 5&#39;s write and layer 6&#39;s" in words
    assert ("layer 6 of trtllm_mha then wrote token (req 1, pos 49) to padding slot 0 instead of its own SWA slot "
            "249; a torn write (the token&#39;s swa layers wrote different slots: layers 0, 2, 4 wrote slot 249; "
            "layer 6 wrote slot 0" in words)
    assert "Also racing forward 14 (3 scheduler write(s), in host order)" in words
    # the section follows the first divergence and comes before the other plots
    assert page.index('id="divergence"') < page.index('id="timeline"') < page.index('id="plots"')


def test_a_run_without_overlap_has_no_timeline_section(runs):
    run = load_run(runs["b1"])
    assert step_timeline(run, first_divergence(run).step) is None
    page = render_report(run)
    assert 'id="timeline"' not in page and "overlap scheduler" not in page


def test_an_older_record_without_slots_says_so(runs, tmp_path):
    """A steps.jsonl written before the slots were recorded ([kind, request, point, entries]): counts, a note."""
    import shutil

    dst = tmp_path / "old"
    shutil.copytree(runs["w5"], dst)
    lines = []
    for line in (dst / "steps.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "timeline" in row:
            row["timeline"]["writes"] = [w[:4] for w in row["timeline"]["writes"]]
        lines.append(json.dumps(row))
    (dst / "steps.jsonl").write_text("\n".join(lines) + "\n")
    run = load_run(dst)
    view = timeline_view(run, first_divergence(run))
    assert view is not None and "the free of request 1's slots (50 entries)" in view.sentences[0]
    assert any("entry counts, not slots" in n for n in view.notes)


def test_a_damaged_timeline_is_left_out(runs, tmp_path):
    import shutil

    dst = tmp_path / "bad"
    shutil.copytree(runs["w5"], dst)
    lines = []
    for line in (dst / "steps.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["step"] == 14:
            row["timeline"] = {"barrier": "<script>", "layers": "x", "writes": 3}
        lines.append(json.dumps(row))
    (dst / "steps.jsonl").write_text("\n".join(lines) + "\n")
    page = render_report(load_run(dst))
    assert 'id="timeline"' not in page


@pytest.mark.browser
def test_the_timeline_figure_renders_in_chromium(runs, tmp_path):
    from test_report_browser import CHROMIUM, _assert_rendered, render

    if CHROMIUM is None:
        pytest.skip("chromium is not installed")
    page = write_report(runs["w5"], tmp_path / "w5.html")
    r = render(page, tmp_path / "w5.png", height=2600)
    _assert_rendered(r, 5)
    assert 'id="fig-run-timeline"' in r.dom
    m = re.search(r'<figure id="fig-run-timeline".*?</figure>', r.dom, re.DOTALL)
    assert m and "<svg" in m.group(0) and "free r1" in m.group(0)
