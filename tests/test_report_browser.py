"""The report in a real browser: headless Chromium renders it, every image loads, nothing is logged.

Why a browser and not only string checks: a page can be well-formed and still render blank (an SVG
with no size, a corrupt data URI, a CSP that blocks our own script). Chromium loads the file with
--dump-dom (the page's static check script marks <body data-images-ok>), logs console messages to
stderr (our page logs nothing, so any console line from it is a failure), and takes a screenshot that
must not be blank. The harness itself is checked on a page that is broken on purpose.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from reports.html import TEMPLATES, write_comparison, write_report

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars")

needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")


@dataclass
class Rendered:
    dom: str
    console: list[str]
    screenshot: Path

    @property
    def body_data(self) -> dict[str, str]:
        m = re.search(r"<body([^>]*)>", self.dom)
        assert m, "no <body> in the dumped DOM"
        return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', m.group(1)))


def _chromium(args: list[str], timeout: int = 90) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="slotscope-chromium-") as profile:
        return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                              text=True, timeout=timeout)


def render(page: Path, shot: Path, height: int = 2000) -> Rendered:
    url = page.resolve().as_uri()
    dom = _chromium(["--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom", url])
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    snap = _chromium([f"--screenshot={shot}", f"--window-size=1280,{height}", url])
    assert snap.returncode == 0 and shot.is_file(), snap.stderr[-2000:]
    return Rendered(dom.stdout, console, shot)


def ink(png: Path) -> tuple[float, float]:
    """Fraction of non-white pixels, and of clearly coloured ones (not grey), in a screenshot."""
    from PIL import Image

    rgb = np.asarray(Image.open(png).convert("RGB")).astype(np.int16)
    nonwhite = (rgb < 245).any(axis=2).mean()
    coloured = ((rgb.max(axis=2) - rgb.min(axis=2)) > 60).mean()
    return float(nonwhite), float(coloured)


def _run(tmp: Path, scenario: str, name: str, *extra: str) -> Path:
    from slotscope.cli import main

    out = tmp / name
    rc = main(["run", str(ROOT / "scenarios" / scenario), "--out", str(out), "--trace-level", "off",
               "--no-report", "--device", "cpu", "-q", *extra])
    assert rc in (0, 1)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed")
    tmp = tmp_path_factory.mktemp("browser-runs")
    return {
        "b1": _run(tmp, "b1-pcg-dp-padding.toml", "b1", "--max-steps", "4"),
        "b2": _run(tmp, "b2-decode-stale-tail.toml", "b2"),
        "b2_fixed": _run(tmp, "b2-decode-stale-tail.toml", "b2-fixed", "--design", "sglang-post-29460"),
    }


def _assert_rendered(r: Rendered, min_svgs: int) -> None:
    data = r.body_data
    assert data.get("images-ok") == "yes", data
    assert int(data.get("svg-count", "0")) >= min_svgs, data
    assert r.console == [], r.console
    nonwhite, coloured = ink(r.screenshot)
    assert nonwhite > 0.03, f"screenshot looks blank ({nonwhite:.3%} non-white)"
    assert coloured > 0.002, f"no colour in the screenshot ({coloured:.3%})"


@needs_chromium
@pytest.mark.parametrize("name,min_svgs", [("b1", 4), ("b2", 4), ("b2_fixed", 2)])
def test_report_renders_in_chromium(runs, tmp_path, name, min_svgs):
    page = write_report(runs[name])
    assert page.stat().st_size < 3_000_000
    r = render(page, tmp_path / f"{name}.png")
    _assert_rendered(r, min_svgs)
    assert "First divergence" in r.dom


@needs_chromium
def test_comparison_renders_in_chromium(runs, tmp_path):
    page = write_comparison([runs["b2"], runs["b2_fixed"]], tmp_path / "cmp.html")
    r = render(page, tmp_path / "cmp.png")
    _assert_rendered(r, 6)


@needs_chromium
def test_harness_catches_broken_pages(tmp_path):
    """A page with a console error and an image that cannot decode must fail every check above."""
    script = (TEMPLATES / "check.js").read_text(encoding="utf-8")
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><figure><img src='data:image/png;base64,AAAA' alt=''></figure>"
                    f"<script>console.error('boom');</script><script>{script}</script></body></html>")
    r = render(page, tmp_path / "broken.png", height=400)
    assert r.body_data.get("images-ok") == "no"
    assert any("boom" in line for line in r.console)
    nonwhite, _ = ink(r.screenshot)
    assert nonwhite < 0.03


@needs_chromium
def test_hostile_report_runs_no_injected_script(runs, tmp_path):
    """Markup in every name of a run directory renders as text: no script of it runs, nothing is logged."""
    import json

    bad = "<script>console.error('injected')</script><img src=x onerror=\"console.error('img')\">\"'"
    d = tmp_path / "hostile"
    shutil.copytree(runs["b2"], d)
    s = json.loads((d / "summary.json").read_text())
    s["scenario"], s["design"] = bad, bad
    s["backends"] = {(name + bad if name == "triton" else name): v for name, v in s["backends"].items()}
    (d / "summary.json").write_text(json.dumps(s))
    (d / "scenario.toml").write_text(f"name = '{bad}'\n")
    r = render(write_report(d), tmp_path / "hostile.png")
    _assert_rendered(r, 4)
    assert "injected" not in "\n".join(r.console)
    assert "<script>console.error('injected')" not in r.dom


def _red_rows(png: Path) -> np.ndarray:
    """Row indices of the screenshot that hold a band of the report's red (#b42318 as a background)."""
    from PIL import Image

    rgb = np.asarray(Image.open(png).convert("RGB")).astype(np.int16)
    red = (np.abs(rgb - np.array([0xb4, 0x23, 0x18])).max(axis=2) < 24)
    return np.nonzero(red.mean(axis=1) > 0.3)[0]


@needs_chromium
def test_incomplete_run_shows_a_red_banner_first(runs, tmp_path):
    """b1 ran with --max-steps 4: its report must open with the red "Incomplete run" banner, above the
    title, and nothing green."""
    page = write_report(runs["b1"])
    r = render(page, tmp_path / "b1.png", height=900)
    _assert_rendered(r, 4)
    dom = r.dom
    assert 'id="incomplete"' in dom and dom.index('id="incomplete"') < dom.index("<h1")
    rows = _red_rows(r.screenshot)
    assert rows.size > 10, "no red banner in the screenshot"
    assert rows.min() < 120, f"the red banner is not at the top (first red row {rows.min()})"
    assert "verdict ok" not in dom and 'class="tag clean"' not in dom
