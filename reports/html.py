"""Render a run (or several) into one self-contained HTML file.

Why it looks like this: the report is shared with people who were not there when the run happened,
often as a mail attachment or a CI artifact, so it must work offline and alone (inline CSS, inline SVG,
data-URI PNGs, no external fetches) and be safe to open even when the run directory came from someone
else: Jinja2 autoescapes every value, the figures are checked by ``plots.safe_svg``, and a
Content-Security-Policy allows exactly one script, the small static check in ``templates/check.js``
(it marks on <body> whether every image loaded; the browser test reads it).
"""
from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

import jinja2
from markupsafe import Markup

from .data import FINDING_CLASSES, RunData, load_run
from .explain import Divergence, first_divergence, incomplete_sentence, verdict_sentence
from .tables import compare_rows, first_mismatches, verdict_rows
from .write_paths import write_path_rows

if TYPE_CHECKING:  # plots pulls in matplotlib; imported when a figure is made
    from .plots import Plot

TEMPLATES = Path(__file__).resolve().parent / "templates"

try:  # the report names the slotscope version that rendered it, from the installed distribution's
    # metadata: reports/ sits below slotscope/ in the dependency order and must not import it
    from importlib.metadata import PackageNotFoundError, version as _dist_version

    _VERSION = _dist_version("slotscope")
except PackageNotFoundError:  # pragma: no cover - run from a source tree without installing
    _VERSION = "unknown"


@dataclass(frozen=True)
class Plots:
    shapes: Optional["Plot"] = None
    heat: Optional["Plot"] = None
    classes: Optional["Plot"] = None
    occupancy: Optional["Plot"] = None


def _cls_css(name: str) -> str:
    return f"cls-{name}" if name in FINDING_CLASSES else "cls-other"


def _num(value: object) -> str:
    if value is None:
        return "unknown"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _svg_filter(svg: str) -> Markup:
    from .plots import safe_svg

    return Markup(safe_svg(svg))


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The one Jinja2 environment of every page (run, comparison, engine trace, sweep): autoescaping, strict
    about undefined names, with the report's filters; templates from ``TEMPLATES``."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["cls_css"] = _cls_css
    env.filters["num"] = _num
    env.filters["svg"] = _svg_filter
    return env


@lru_cache(maxsize=1)
def _check_script() -> tuple[Markup, str]:
    """The one static script and its CSP hash (the hash covers the exact text between the tags)."""
    text = (TEMPLATES / "check.js").read_text(encoding="utf-8")
    digest = base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")
    return Markup(text), f"sha256-{digest}"


def page_context() -> dict[str, object]:
    """What base.html.j2 needs on every page: the check script, its CSP hash, the generating version."""
    js, digest = _check_script()
    return {"check_js": js, "script_hash": digest, "generator_version": _VERSION}


def _plots(run: RunData, key: str, div: Optional[Divergence], width: float) -> tuple[Plots, list[str]]:
    """All figures of one run; a figure that fails the SVG safety check is left out with a note."""
    from . import plots as P

    mark = div.step if div is not None else None
    notes: list[str] = []
    made = {}
    for name, fn, kwargs in (("shapes", P.shape_timeline, {"mark_step": mark}),
                             ("heat", P.heatmap, {}),
                             ("classes", P.class_bars, {}),
                             ("occupancy", P.occupancy, {"mark_step": mark})):
        try:
            made[name] = fn(run, f"{key}-{name}", width=width, **kwargs)
        except P.UnsafeFigure as e:
            made[name] = None
            notes.append(f"The {name} figure was left out: {e}.")
    if made["shapes"] is None:
        notes.append("No loc / swa_loc lengths recorded (shapes.jsonl missing or empty).")
    if made["occupancy"] is None:
        notes.append("No per-step records (steps.jsonl missing or empty): no occupancy plot.")
    return Plots(**made), notes


def _layer_mix(run: RunData) -> str:
    kinds = [k for _, k in run.provenance.layers]
    if not kinds:
        return ""
    return f"{len(kinds)} layers ({kinds.count('swa')} SWA, {kinds.count('full')} full)"


def render_report(run: RunData) -> str:
    """The report of one run as an HTML string."""
    div = first_divergence(run)
    plots, notes = _plots(run, "run", div, width=10.0)
    mismatches, distinct = first_mismatches(run)
    from .timeline import timeline_view  # the first divergence's step under the overlap scheduler, else None
    from .faults import fault_view        # --inject: the injected faults and what detected them, else None
    from .ownership import ownership_view  # the radix cache: the first divergent slot's owners over time, else None

    return environment().get_template("report.html.j2").render(
        run=run, verdict=verdict_sentence(run), incomplete=incomplete_sentence(run), verdict_rows=verdict_rows(run),
        divergence=div, plots=plots, timeline=timeline_view(run, div), ownership=ownership_view(run),
        plot_notes=notes, mismatches=mismatches, distinct_mismatches=distinct, layer_mix=_layer_mix(run),
        faults=fault_view(run.path), **page_context())


class OutputError(ValueError):
    """The report's output path cannot be written (a directory, no permission); names the path."""


def write_atomic(out: Path, html: str) -> Path:
    """Write a page through a temporary file, so a reader never sees half a report; the temporary file never
    stays behind, whatever fails."""
    if out.is_dir():
        raise OutputError(f"{out}: is a directory; name the output file (e.g. {out / 'report.html'})")
    tmp = out.with_name(out.name + ".tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(html, encoding="utf-8")
        tmp.replace(out)
    except OSError as e:
        raise OutputError(f"{out}: cannot write ({e.strerror or e})") from None
    finally:
        if tmp.exists():
            try:
                tmp.unlink()
            except OSError:
                pass
    return out


def write_report(run_dir: str | Path, out_path: Optional[str | Path] = None) -> Path:
    """Write DIR/report.html (or ``out_path``) for the run in ``run_dir``; returns the path written."""
    run = load_run(run_dir)
    out = Path(out_path) if out_path is not None else Path(run_dir) / "report.html"
    html = render_report(run)
    return write_atomic(out, html)


@dataclass(frozen=True)
class _Column:
    letter: str
    run: RunData
    verdict: str
    incomplete: Optional[str]
    divergence: Optional[Divergence]
    plots: Plots
    plot_notes: list[str]


def _letter(i: int) -> str:
    s = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        s = chr(65 + r) + s
    return s


_COMPARE_ROWS = (
    ("shapes", "loc vs swa_loc length", "No loc / swa_loc lengths recorded."),
    ("classes", "Findings by class per backend", "No findings."),
    ("heat", "Findings per layer and step", "No findings."),
    ("occupancy", "Pool occupancy", "No per-step records."),
)


def render_comparison(runs: Sequence[RunData]) -> str:
    """Several runs side by side (typically one scenario under two designs) as an HTML string."""
    if not runs:
        raise ValueError("render_comparison needs at least one run")
    width = 6.0 if len(runs) > 1 else 10.0
    columns = []
    for i, run in enumerate(runs):
        div = first_divergence(run)
        plots, notes = _plots(run, f"r{i}", div, width=width)
        columns.append(_Column(_letter(i), run, verdict_sentence(run), incomplete_sentence(run), div, plots, notes))
    names = list(dict.fromkeys(r.scenario for r in runs))
    hashes = {r.provenance.scenario_hash for r in runs}
    same = len(names) == 1 and (len(hashes) == 1)
    designs = ", ".join(dict.fromkeys(r.design for r in runs))
    title = f"{names[0]} under {designs}" if len(names) == 1 else f"{', '.join(names)} under {designs}"
    return environment().get_template("compare.html.j2").render(
        title=title, columns=columns, same_scenario=same, compare_rows=compare_rows(runs), rows=_COMPARE_ROWS,
        write_paths=write_path_rows(runs),
        **page_context())


def write_comparison(run_dirs: Sequence[str | Path], out_path: str | Path) -> Path:
    """Write one HTML file comparing the runs in ``run_dirs``; returns the path written."""
    runs = [load_run(d) for d in run_dirs]
    out = Path(out_path)
    html = render_comparison(runs)
    return write_atomic(out, html)
