"""The corpus as one self-contained HTML page (``slotscope bugs --report``).

A page to attach to a CI run or a review: the verdict first, then the corpus table (expected and
observed per backend), then each case with its scenario, its designs and the first finding per
backend in words. Inline CSS, no script, no external fetch; Jinja2 autoescapes every value.
"""
from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Sequence

import jinja2

from simulator.records import FINDING_CLASSES

from . import __version__
from .corpus import CLEAN, Outcome

_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>slotscope bug corpus: {{ held }} of {{ total }} verdicts hold</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1400px; color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .6em 0; } td, th { border: 1px solid #ccc; padding: 3px 7px; }
th { background: #f4f4f4; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.ok { background: #e7f6e7; } .bad { background: #fbe3e3; font-weight: bold; }
.verdict { font-size: 1.15em; padding: .6em 1em; border-radius: 4px; display: inline-block; }
code, pre { font-family: ui-monospace, monospace; font-size: 12px; } pre { background: #f7f7f7; padding: .6em; overflow-x: auto; }
.muted { color: #666; } footer { margin-top: 3em; color: #666; font-size: 12px; }
</style></head><body>
<h1>slotscope bug corpus</h1>
<p class="verdict {{ 'ok' if held == total else 'bad' }}">{{ held }} of {{ total }} verdicts hold
{%- if held == total %}: every buggy design reproduces its bug where expected, every fix is clean{% endif %}.</p>
<p class="muted">Each case runs its scenario under the design that had the bug and the design that fixed it, on
every backend. A cell shows the finding class seen (the expected one when present; +k for k other classes), or
"clean". docs/CORPUS.md explains each case and how it is modelled.</p>
<table>
<tr><th>bug</th><th>issue</th><th>design</th><th>role</th><th>expected</th>
{% for b in backends %}<th>{{ b }}</th>{% endfor %}<th>verdict</th></tr>
{% for o in outcomes %}
<tr><td><a href="#{{ o.anchor }}">{{ o.case.id }}</a></td><td>{{ o.case.issue }}</td><td><code>{{ o.design }}</code></td>
<td>{{ o.role }}</td><td>{{ o.expected_text }}</td>
{% for b in backends %}<td class="{{ 'ok' if o.holds_on[b] else 'bad' }}">{{ o.cells[b] }}</td>{% endfor %}
<td class="{{ 'ok' if o.holds else 'bad' }}">{{ 'holds' if o.holds else 'FAILS' }}</td></tr>
{% endfor %}
</table>
{% for c in cases %}
<h2 id="{{ c.anchor }}">{{ c.case.id }} {{ c.case.issue }}: {{ c.case.title }}</h2>
<p>Scenario <code>{{ c.scenario_file }}</code>{% if c.case.overrides %} with
{% for k, v in c.case.overrides.items() %}<code>{{ k }} = {{ v }}</code>{% if not loop.last %}, {% endif %}{% endfor %}{% endif %},
{{ c.steps }} steps.</p>
<pre>{{ c.description }}</pre>
{% for o in c.outcomes %}
<h3>{{ o.role }}: <code>{{ o.design }}</code> &mdash; {{ 'holds' if o.holds else 'FAILS' }}</h3>
<p class="muted">{{ o.design_description }}</p>
<table>
<tr><th>backend</th><th>expected</th>{% for cls in classes %}<th>{{ cls }}</th>{% endfor %}<th>first finding (step / layer)</th><th>verdict</th></tr>
{% for b in backends %}
<tr><td>{{ b }}</td><td>{{ o.expected[b] }}</td>
{% for cls in classes %}<td class="num">{{ o.counts[b].get(cls, 0) }}</td>{% endfor %}
<td>{% if o.first[b] %}{{ o.first[b] }}{% if o.messages.get(b) %}<br><span class="muted">{{ o.messages[b] }}</span>{% endif %}{% else %}-{% endif %}</td>
<td class="{{ 'ok' if o.holds_on[b] else 'bad' }}">{{ 'holds' if o.holds_on[b] else 'fails' }}</td></tr>
{% endfor %}
</table>
{% endfor %}
{% endfor %}
<footer>slotscope {{ version }} &middot; generated {{ generated }} &middot; corpus of {{ cases|length }} cases</footer>
</body></html>
"""


def _view(o: Outcome) -> dict:
    from simulator.designs.catalogue import BUILTIN_DESIGNS

    backends = o.backends
    first = {}
    for b in backends:
        ff = o.summary["backends"][b]["first_finding"]
        first[b] = None if ff is None else f"{ff['class']} at step {ff['step']}, layer {ff['layer']}"
    cls = BUILTIN_DESIGNS.get(o.design)
    return {
        "case": o.case, "role": o.role, "design": o.design, "anchor": _anchor(o.case.id),
        "design_description": getattr(cls, "description", ""),
        "expected_text": o.expected_text(), "expected": {b: o.expected(b) for b in backends},
        "cells": {b: o.observed_cell(b) for b in backends}, "holds_on": {b: o.holds_on(b) for b in backends},
        "holds": o.holds, "counts": {b: o.counts(b) for b in backends}, "first": first, "messages": o.messages,
    }


def _anchor(case_id: str) -> str:
    return "case-" + "".join(ch if ch.isalnum() else "-" for ch in case_id)


def render_corpus_report(outcomes: Sequence[Outcome]) -> str:
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    views = [_view(o) for o in outcomes]
    cases = []
    for o, v in zip(outcomes, views):
        if not cases or cases[-1]["case"] is not o.case:
            cases.append({"case": o.case, "anchor": v["anchor"], "outcomes": [],
                          "scenario_file": f"scenarios/{o.case.scenario.name}",
                          "description": o.scenario.description, "steps": o.summary.get("steps", 0)})
        cases[-1]["outcomes"].append(v)
    held = sum(o.holds for o in outcomes)
    return env.from_string(_TEMPLATE).render(
        outcomes=views, cases=cases, held=held, total=len(outcomes),
        backends=outcomes[0].backends if outcomes else [], classes=FINDING_CLASSES, clean=CLEAN,
        version=__version__, generated=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))


def write_corpus_report(outcomes: Sequence[Outcome], path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(render_corpus_report(outcomes), encoding="utf-8")
    tmp.replace(out)
    return out
