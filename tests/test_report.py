"""The HTML report: content for real runs, escaping of hostile run directories, the subcommands.

Real run directories come from short runs of the shipped bug scenarios through the CLI (a few
seconds in all). Hostile ones are copies whose JSON and TOML were edited to carry markup, quotes and
mathtext in every string a report shows: the raw text must never reach the page unescaped, and the
page must hold exactly one script, the static image check.
"""
from __future__ import annotations

import argparse
import base64
import html
import io
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import markupsafe
import numpy as np
import pytest

from reports import commands
from reports.data import RunDirError, load_run
from reports.html import TEMPLATES, render_report, write_comparison, write_report
from reports.plots import UnsafeFigure, envelope, safe_svg

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = "<script>alert(1)</script>\"' --> $x$ {{7*7}}"
RAW_MARKERS = ("<script>alert(1)</script>", "<script>alert(1)")


def _run(tmp: Path, scenario: str, name: str, *extra: str) -> Path:
    from slotscope.cli import main

    out = tmp / name
    rc = main(["run", str(ROOT / "scenarios" / scenario), "--out", str(out), "--trace-level", "off",
               "--no-report", "--device", "cpu", "-q", *extra])
    assert rc in (0, 1), f"slotscope run {scenario} exited {rc}"
    assert (out / "summary.json").is_file()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("runs")
    return {
        "b1": _run(tmp, "b1-pcg-dp-padding.toml", "b1", "--max-steps", "3"),
        "b2": _run(tmp, "b2-decode-stale-tail.toml", "b2", "--max-steps", "14"),
        # a clean verdict needs a complete run: no --max-steps here
        "b2_fixed": _run(tmp, "b2-decode-stale-tail.toml", "b2-fixed", "--design", "sglang-post-29460"),
    }


class _Tags(HTMLParser):
    """Every start tag with its attributes, and the text of each <script>."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))
        if tag == "script":
            self._in_script = True
            self.scripts.append("")

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data


def _assert_inert(page: str) -> None:
    """One script (the static check), no event-handler attributes, no javascript: URLs."""
    p = _Tags()
    p.feed(page)
    assert p.scripts == [(TEMPLATES / "check.js").read_text(encoding="utf-8")]
    for tag, attrs in p.tags:
        for name, value in attrs:
            assert not name.lower().startswith("on"), (tag, name)
            assert "javascript:" not in (value or "").lower(), (tag, name)
    assert "Content-Security-Policy" in page


# ------------------------------------------------------------------------------------------ content

def test_clean_run_says_clean_and_still_plots(runs):
    out = write_report(runs["b2_fixed"])
    assert out == runs["b2_fixed"] / "report.html"
    page = out.read_text()
    assert "Clean: on all 8 backend(s)" in page
    assert "Not clean" not in page
    assert "No divergence" in page
    assert 'id="fig-run-shapes"' in page and 'id="fig-run-occupancy"' in page
    assert 'id="fig-run-heat"' not in page
    assert "No findings" in page
    _assert_inert(page)


def test_b1_report_names_length_mismatch_and_the_kernel_message(runs):
    page = write_report(runs["b1"]).read_text()
    first = json.loads((runs["b1"] / "findings.jsonl").read_text().splitlines()[0])
    assert first["class"] == "length_mismatch"
    assert "Size mismatch" in first["message"]
    assert "length_mismatch" in page
    assert html.escape(first["message"]) in page
    shape = next(json.loads(line) for line in (runs["b1"] / "shapes.jsonl").read_text().splitlines()
                 if json.loads(line)["step"] == first["step"] and json.loads(line)["backend"] == first["backend"]
                 and json.loads(line)["kind"] == "swa")
    assert shape["swa_loc_len"] > shape["loc_len"]
    assert f"swa_loc has {shape['swa_loc_len']} entries but loc has {shape['loc_len']}" in page
    assert "DP-padded out_cache_loc" in page
    # every backend hit B1 in the three steps that ran; the run was cut by --max-steps, so no backend is "clean"
    assert "Not clean: 8 of 8 backend(s) diverge" in page and "no findings in the steps that ran" not in page


def test_a_cut_run_names_a_backend_without_findings_as_unfinished_not_clean(tmp_path):
    """B4 cut at step 60: triton has findings (from step 58), flashinfer none in the steps that ran."""
    out = _run(tmp_path, "b4-draft-extend-window.toml", "b4", "--max-steps", "60", "--backends", "triton,flashinfer")
    page = write_report(out).read_text()
    assert "no findings in the steps that ran (the run did not finish): flashinfer" in page
    assert "clean: flashinfer" not in page and "triton" in page


def test_b2_report_names_clobbered_and_padding(runs):
    page = write_report(runs["b2"]).read_text()
    assert "clobbered" in page
    assert "A padding row of the decode graph wrote into a live slot of the SWA pool" in page
    first = next(json.loads(line) for line in (runs["b2"] / "findings.jsonl").read_text().splitlines()
                 if json.loads(line)["class"] == "clobbered")
    assert f"slot {first['slot']} of {first['expected']['label']}" in page
    assert 'id="fig-run-heat"' in page and 'id="fig-run-classes"' in page


def test_mismatch_table_merges_backends_and_layers(runs):
    run = load_run(runs["b2"])
    from reports.tables import first_mismatches

    rows, distinct = first_mismatches(run)
    assert 0 < len(rows) <= 50 and distinct >= len(rows)
    assert rows[0].backends == "all 8"
    assert rows[0].layers.startswith("all ")


def test_compare_contains_both_designs(runs, tmp_path):
    out = write_comparison([runs["b2"], runs["b2_fixed"]], tmp_path / "cmp.html")
    page = out.read_text()
    assert "sglang-pre-24743" in page and "sglang-post-29460" in page
    assert "clobbered" in page and "Clean: on all 8 backend(s)" in page
    assert "same scenario hash" in page
    assert page.count("<svg") >= 5
    _assert_inert(page)


def test_compare_sets_the_write_paths_side_by_side(runs):
    """The "Write paths" rows: whose scheduler and allocator, the padding convention (from run.json's sources.padding),
    SWA slots freed ahead of their full slots (steps.jsonl), each run's cell in order; a row says when they differ."""
    from reports.write_paths import write_path_rows

    rows = {r.aspect: r for r in write_path_rows([load_run(runs["b2"]), load_run(runs["b2_fixed"])])}
    assert rows["engine"].cells == ("model: sglang-pre-24743", "model: sglang-post-29460") and rows["engine"].differs
    assert rows["batches made by"].cells == ("model", "model") and not rows["batches made by"].differs
    assert rows["padded rows of loc"].cells == ("slot0: padded rows hold 0, index 0 skipped by the store",) * 2
    assert rows["what the release's scheduler did"].cells == ("the model's scheduler (no release counts)",) * 2
    assert rows["SWA slots freed ahead of their full slots (tokens)"].cells[0].startswith("mean ")


def test_report_is_deterministic(runs):
    run = load_run(runs["b2"])
    assert render_report(run) == render_report(run)


def test_missing_run_json_shows_unknown(runs, tmp_path):
    d = tmp_path / "norunjson"
    shutil.copytree(runs["b1"], d)
    (d / "run.json").unlink()
    page = write_report(d).read_text()
    assert "unknown" in page
    assert "run.json is missing" in page


def test_page_size_of_b2_is_small(runs):
    size = write_report(runs["b2"]).stat().st_size
    assert size < 1_500_000, size


# ------------------------------------------------------------------------------------------ hostile input

def _hostile_copy(src: Path, dst: Path) -> Path:
    """A real run directory whose every displayed string carries HOSTILE."""
    shutil.copytree(src, dst)
    s = json.loads((dst / "summary.json").read_text())
    s["scenario"] = HOSTILE
    s["design"] = HOSTILE
    backends = list(s["backends"].items())
    bad_backend = "flashinfer" + HOSTILE
    s["backends"] = {(bad_backend if name == "flashinfer" else name): v for name, v in backends}
    (dst / "summary.json").write_text(json.dumps(s))
    lines = []
    for line in (dst / "findings.jsonl").read_text().splitlines():
        f = json.loads(line)
        if f["backend"] == "flashinfer":
            f["backend"] = bad_backend
        f["message"] = HOSTILE
        if f.get("expected"):
            f["expected"]["label"] = HOSTILE
        if f.get("observed"):
            f["observed"]["label"] = HOSTILE
        lines.append(json.dumps(f))
    (dst / "findings.jsonl").write_text("\n".join(lines) + "\n")
    lines = []
    for line in (dst / "shapes.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["backend"] == "flashinfer":
            r["backend"] = bad_backend
        lines.append(json.dumps(r))
    (dst / "shapes.jsonl").write_text("\n".join(lines) + "\n")
    lines = []
    for i, line in enumerate((dst / "steps.jsonl").read_text().splitlines()):
        r = json.loads(line)
        if i % 3 == 0:
            r["mode"] = HOSTILE
            r["graph"] = HOSTILE
        lines.append(json.dumps(r))
    (dst / "steps.jsonl").write_text("\n".join(lines) + "\n")
    run = json.loads((dst / "run.json").read_text())
    for k in ("scenario", "design", "design_description", "description", "commit", "device_name", "model",
              "scenario_hash", "scenario_path", "version"):
        run[k] = HOSTILE
    run["layers"] = [[lid, HOSTILE if kind == "swa" else kind] for lid, kind in run["layers"]]
    (dst / "run.json").write_text(json.dumps(run))
    (dst / "scenario.toml").write_text(f'name = "{HOSTILE}"\ndescription = """{HOSTILE}</pre></details>"""\n')
    return dst


def _assert_escaped(page: str) -> None:
    for raw in RAW_MARKERS:
        assert raw not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert str(markupsafe.escape(HOSTILE)) in page            # Jinja's escaping of the whole string
    assert "{{7*7}}" in page                                  # data is never evaluated as a template
    assert "</pre></details>\"\"\"" not in page
    _assert_inert(page)


def test_hostile_run_dir_is_escaped_everywhere(runs, tmp_path):
    d = _hostile_copy(runs["b2"], tmp_path / "hostile")
    page = write_report(d).read_text()
    _assert_escaped(page)
    # the hostile backend name reached the figures (legend, bar labels) escaped by the SVG writer
    svgs = page.split("<svg")[1:]
    assert any("&lt;script&gt;" in s.split("</svg>")[0] for s in svgs)


def test_hostile_compare_is_escaped(runs, tmp_path):
    d = _hostile_copy(runs["b1"], tmp_path / "hostile-b1")
    page = write_comparison([d, runs["b2_fixed"]], tmp_path / "c.html").read_text()
    _assert_escaped(page)


def test_safe_svg_refuses_active_content():
    plain = '<?xml version="1.0"?>\n<!-- <script>x</script> -->\n<svg><text>a</text></svg>'
    assert safe_svg(plain) == "<svg><text>a</text></svg>"
    for bad in ('<svg><script>alert(1)</script></svg>', '<svg><rect onload="x()"/></svg>',
                '<svg><foreignObject/></svg>', '<svg><a href="javascript:x"/></svg>',
                '<svg><image href="http://example.com/x.png"/></svg>'):
        with pytest.raises(UnsafeFigure):
            safe_svg(bad)
    ok = '<svg><image xlink:href="data:image/png;base64,\nonab=" /><use xlink:href="#m1"/></svg>'
    assert safe_svg(ok) == ok


# ------------------------------------------------------------------------------------------ data, plots

def test_malformed_findings_line_names_file_and_line(runs, tmp_path):
    d = tmp_path / "bad"
    shutil.copytree(runs["b1"], d)
    with open(d / "findings.jsonl", "a") as f:
        f.write("{not json\n")
    n = len((d / "findings.jsonl").read_text().splitlines())
    with pytest.raises(RunDirError, match=rf"findings\.jsonl:{n}: not a JSON line"):
        load_run(d)


def test_envelope_keeps_spikes_and_bounds_points():
    x = np.arange(100_000)
    y = np.zeros(100_000)
    y[54_321] = 1048
    xs, ys = envelope(x, y, max_points=1000)
    assert xs.size <= 1000
    assert ys.max() == 1048
    assert xs[np.argmax(ys)] <= 54_321 + 200 and xs[np.argmax(ys)] >= 54_321 - 200
    xs, ys = envelope(x[:10], y[:10], max_points=1000)
    assert xs.size == 10


def _synthetic_run(d: Path, steps: int, findings: int, backends: int = 8, layers: int = 36) -> Path:
    """A large run directory without the simulator: the report's cost grows with these sizes."""
    d.mkdir()
    rng = np.random.default_rng(0)
    names = [f"backend{i}" for i in range(backends)]
    summary = {"scenario": "synthetic", "design": "d", "seed": 1, "steps": steps, "crossings": steps * 8,
               "findings_total": findings, "findings_detail_truncated": False,
               "backends": {n: {"writes": steps, "findings": {"clobbered": findings // backends},
                                "first_finding": {"step": 5, "layer": 0, "class": "clobbered"}} for n in names}}
    (d / "summary.json").write_text(json.dumps(summary))
    with open(d / "steps.jsonl", "w") as f:
        for s in range(steps):
            f.write(json.dumps({"step": s, "mode": "decode" if s % 7 else "extend",
                                "graph": "decode_graph" if s % 7 else "eager", "num_requests": 8,
                                "real_tokens": 8, "dp_padded_tokens": 8, "padded_tokens": 8,
                                "full_used": 1000 + s % 500, "swa_used": 800 + s % 300, "full_size": 8192,
                                "swa_size": 4096}) + "\n")
    with open(d / "shapes.jsonl", "w") as f:
        for s in range(steps):
            for n in names:
                for kind in ("swa", "full"):
                    f.write(json.dumps({"step": s, "backend": n, "kind": kind, "loc_len": 8,
                                        "swa_loc_len": 8 if s != 777 else 900}) + "\n")
    st = np.sort(rng.integers(5, steps, findings))
    with open(d / "findings.jsonl", "w") as f:
        for i in range(findings):
            f.write(json.dumps({"step": int(st[i]), "backend": names[i % backends], "layer": int(2 * (i % 18)),
                                "kind": "swa", "subpool": "swa", "class": "clobbered", "slot": int(i % 4000),
                                "expected": {"tag": 5, "request": 1, "position": 2, "label": "req 1 pos 2"},
                                "observed": {"tag": -1, "request": None, "position": None, "label": "padding"},
                                "message": "a live slot was overwritten"}) + "\n")
    (d / "run.json").write_text(json.dumps({"layers": [[i, "swa" if i % 2 == 0 else "full"] for i in range(layers)]}))
    return d


@pytest.mark.slow
def test_large_run_stays_small_and_dense_heat_map_is_png(tmp_path):
    d = _synthetic_run(tmp_path / "big", steps=20_000, findings=100_000)
    page = write_report(d).read_text()
    assert len(page.encode()) < 3_000_000
    uris = [part.split('"')[0] for part in page.split('src="data:image/png;base64,')[1:]]
    assert uris, "the dense heat map should be a PNG"
    from PIL import Image

    img = Image.open(io.BytesIO(base64.b64decode(uris[0])))
    assert img.format == "PNG" and img.size[0] > 500


# ------------------------------------------------------------------------------------------ commands

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slotscope")
    commands.register(p.add_subparsers(dest="command"))
    return p


def _call(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    return args.func(args)


def test_report_command_exit_codes(runs, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert _call(["report", str(runs["b1"]), "-o", str(out)]) == 0
    assert out.is_file() and "length_mismatch" in out.read_text()
    empty = tmp_path / "not-a-run"
    empty.mkdir()
    assert _call(["report", str(empty)]) == 2
    err = capsys.readouterr().err
    assert str(empty) in err and "summary.json" in err
    assert _call(["report", str(tmp_path / "missing")]) == 2
    assert str(tmp_path / "missing") in capsys.readouterr().err


def test_report_command_bad_file_exits_2(runs, tmp_path, capsys):
    d = tmp_path / "bad"
    shutil.copytree(runs["b1"], d)
    (d / "summary.json").write_text("{oops")
    assert _call(["report", str(d)]) == 2
    assert "summary.json" in capsys.readouterr().err


def test_compare_command_default_output_and_missing_dir(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert _call(["compare", str(runs["b2"]), str(runs["b2_fixed"])]) == 0
    assert (tmp_path / "compare.html").is_file()
    assert _call(["compare", str(runs["b2"]), str(tmp_path / "nope")]) == 2
    assert str(tmp_path / "nope") in capsys.readouterr().err


def test_commands_through_the_slotscope_cli(runs, tmp_path):
    cli = pytest.importorskip("slotscope.cli")
    assert cli.main(["report", str(runs["b2_fixed"]), "-o", str(tmp_path / "x.html")]) == 0
    assert cli.main(["report", str(tmp_path)]) == 2
    assert cli.main(["compare", str(runs["b1"]), str(runs["b2"]), "-o", str(tmp_path / "c.html")]) == 0


def test_summary_only_dir_still_reports(runs, tmp_path):
    d = tmp_path / "bare"
    d.mkdir()
    shutil.copy(runs["b2"] / "summary.json", d / "summary.json")
    page = write_report(d).read_text()
    assert "Not clean" in page and "clobbered" in page
    assert "shapes.jsonl missing" in page and "steps.jsonl missing" in page
    assert "findings.jsonl is missing" in page
    _assert_inert(page)


def test_first_divergence_without_its_detail_record(runs, tmp_path):
    """Detail truncated away: the summary's first finding is still explained, and the gap is said."""
    d = tmp_path / "nodetail"
    shutil.copytree(runs["b2"], d)
    (d / "findings.jsonl").write_text("")
    from reports.explain import first_divergence

    div = first_divergence(load_run(d))
    assert div is not None and div.cls == "clobbered"
    assert any("not in findings.jsonl" in s for s in div.why)
    page = write_report(d).read_text()
    assert "First divergence: step" in page and "No detailed findings" in page
