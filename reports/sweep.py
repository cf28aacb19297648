"""The comparison report of a sweep (``slotscope sweep``): one self-contained HTML page.

A verdict table (a row per design or engine release, a column per point: scenario, backend, DP size,
page size, seed), each cell linking to that point's own report; then, for each failing point, its first
divergence in words (reports/explain.py over the point's run directory). Same style and safety as a
run's report (inline CSS, autoescaped values, the one static script under the page's CSP). It takes
plain records (what each point's ``point.json`` holds), so it imports nothing of ``slotscope``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Sequence

from .data import load_run
from .explain import first_divergence
from .html import environment, page_context, write_atomic

_TEMPLATE = """{% extends "base.html.j2" %}
{% block title %}slotscope sweep: {{ title }}{% endblock %}
{% block body %}
{% if interrupted %}<div class="verdict bad incomplete" role="alert">Interrupted sweep: only the {{ done }} points that finished are shown ({{ missing }} not run).</div>{% endif %}
<header class="top">
  <h1>slotscope sweep <span class="sub">&mdash; {{ title }}</span></h1>
  <div class="meta"><span>{{ done }} points</span><span>{{ rows | length }} designs / releases</span><span>{{ counts.clean }} clean</span><span>{{ counts.findings }} with findings</span>{% if counts.failed %}<span>{{ counts.failed }} could not run</span>{% endif %}{% if invalid %}<span>{{ invalid | length }} invalid</span>{% endif %}</div>
</header>
<section id="verdicts">
<h2>Verdict: design / release &times; point</h2>
<div class="scroll">
<table class="verdict-table">
  <thead><tr><th>design / release</th>{% for c in columns %}<th class="mono" style="white-space: normal">{{ c }}</th>{% endfor %}</tr></thead>
  <tbody>
  {% for row, cells in table %}
    <tr><td class="mono overflow">{{ row }}</td>{% for cell in cells %}<td>{% if cell %}{% if cell.link %}<a href="{{ cell.link }}">{% endif %}<span class="tag {{ cell.css }}">{{ cell.text }}</span>{% if cell.link %}</a>{% endif %}{% else %}&mdash;{% endif %}</td>{% endfor %}</tr>
  {% endfor %}
  </tbody>
</table>
</div>
</section>
{% if failing %}
<section id="divergences">
<h2>First divergence of each failing point</h2>
{% for f in failing %}
<h3 id="point-{{ f.hash }}"><span class="mono">{{ f.row }}</span> &middot; {{ f.label }}</h3>
{% if f.div %}<p><strong>{{ f.div.headline }}</strong></p>
<table>{% for fact in f.div.facts %}<tr><th>{{ fact.label }}</th><td>{% if fact.code %}<code>{{ fact.value }}</code>{% else %}{{ fact.value }}{% endif %}</td></tr>{% endfor %}</table>
{% for w in f.div.why %}<p>{{ w }}</p>{% endfor %}
{% else %}<p>{{ f.text }}</p>{% endif %}
{% if f.link %}<p><a href="{{ f.link }}">the point's report</a></p>{% endif %}
{% endfor %}
</section>
{% endif %}
{% if invalid %}
<section id="invalid">
<h2>Invalid points</h2>
<table><thead><tr><th>design / release</th><th>point</th><th>why</th></tr></thead><tbody>
{% for row, label, why in invalid %}<tr><td class="mono">{{ row }}</td><td>{{ label }}</td><td class="mono">{{ why }}</td></tr>{% endfor %}
</tbody></table>
</section>
{% endif %}
{% endblock %}
"""

_CSS = {"clean": "clean", "findings": "cls-clobbered", "incomplete": "incomplete", "error": "cls-design_error",
        "worker_died": "cls-design_error"}


def _cell(rec: dict[str, Any], out: Path) -> dict[str, Any]:
    status = rec.get("status", "error")
    text = status
    if status == "findings":
        text = ", ".join(rec.get("classes") or ["findings"])
    elif status == "worker_died":
        text = "worker died (retried)"
    report = out / "points" / str(rec.get("hash")) / "run" / "report.html"
    link = os.path.relpath(report, out) if report.exists() else None
    return {"text": text, "css": _CSS.get(status, "cls-other"), "link": link}


def _failing(point, rec: dict[str, Any], out: Path) -> Optional[dict[str, Any]]:
    if rec.get("status") not in ("findings", "error", "worker_died"):
        return None
    run_dir = out / "points" / str(rec.get("hash")) / "run"
    div = None
    if rec["status"] == "findings":
        try:
            div = first_divergence(load_run(run_dir))
        except Exception:           # an unreadable run directory: say so in words instead
            div = None
    text = rec.get("error") or (f"first finding: {rec.get('first')}" if rec.get("first") else rec["status"])
    return {"hash": rec.get("hash"), "row": point.row, "label": point.label, "div": div, "text": text,
            "link": _cell(rec, out)["link"]}


def render_sweep(title: str, out: Path, records: Sequence[tuple[Any, dict]], invalid: Sequence[tuple[Any, str]],
                 interrupted: bool, missing: int = 0) -> str:
    rows = list(dict.fromkeys(p.row for p, _ in records))
    columns = list(dict.fromkeys(p.label for p, _ in records))
    by = {(p.row, p.label): rec for p, rec in records}
    table = [(r, [_cell(by[(r, c)], out) if (r, c) in by else None for c in columns]) for r in rows]
    failing = [f for f in (_failing(p, rec, out) for p, rec in records) if f is not None]
    statuses = [rec.get("status") for _, rec in records]
    counts = {"clean": statuses.count("clean"), "findings": statuses.count("findings"),
              "failed": statuses.count("error") + statuses.count("worker_died")}
    return environment().from_string(_TEMPLATE).render(
        title=title, interrupted=interrupted, done=len(records), missing=missing, rows=rows, columns=columns, table=table,
        failing=failing, counts=counts, invalid=[(p.row, p.label, why) for p, why in invalid], **page_context())


def write_sweep_report(title: str, out: Path, records: Sequence[tuple[Any, dict]],
                       invalid: Sequence[tuple[Any, str]] = (), interrupted: bool = False, missing: int = 0) -> Path:
    """OUT/report.html for the finished points (``records``: (point, its record) in grid order)."""
    return write_atomic(Path(out) / "report.html", render_sweep(title, Path(out), records, invalid, interrupted, missing))
