"""The analyser's answer (:class:`TraceAnalysis`) and its text tables.

Apart from the reading (analyze.py) because the answer is plain data once built: JSON-ready dicts
that the CLI prints as tables or as ``--json``, and that tests query. Nothing here reads a file.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from simulator.records import FINDING_CLASSES

from .tables import format_table

DIMENSIONS = ("backend", "layer_kind", "mode", "graph_path")
MAX_STORED_CHARS = 512          # longer names and attribute values are cut when read (memory stays bounded)
TABLE_NAME_CHARS = 48           # longer names are shortened with an ellipsis in the text tables
ELLIPSIS = "\u2026"


@dataclass
class TraceAnalysis:
    """The analyser's answer: JSON for machines (:meth:`to_json`), tables for people."""

    files: list[dict[str, Any]]
    slotscope_runs: list[dict[str, Any]]
    foreign: dict[str, Any]

    @property
    def spans(self) -> int:
        return sum(f["spans"] for f in self.files)

    @property
    def bad_lines(self) -> int:
        return sum(f["bad_lines"] for f in self.files)

    def run(self, scenario: Optional[str] = None, design: Optional[str] = None) -> dict[str, Any]:
        """The one run matching the filters (tests and reports use this)."""
        found = [r for r in self.slotscope_runs
                 if (scenario is None or r["scenario"] == scenario)
                 and (design is None or r["design"] == design)]
        if len(found) != 1:
            raise LookupError(f"{len(found)} runs match scenario={scenario} design={design}")
        return found[0]

    def to_json(self) -> dict[str, Any]:
        return {"files": self.files, "spans": self.spans, "bad_lines": self.bad_lines,
                "slotscope_runs": self.slotscope_runs, "foreign": self.foreign}

    def render_text(self) -> str:
        return render_text(self)


class _Names:
    """Shortens long names for the text tables (``abc…``) and counts how many it shortened."""

    def __init__(self, limit: int = TABLE_NAME_CHARS):
        self.limit = limit
        self.cut: set[str] = set()

    def __call__(self, value: Any) -> str:
        text = str(value)
        if len(text) <= self.limit:
            return text
        self.cut.add(text)
        return text[:self.limit - 1] + ELLIPSIS


def render_text(res: TraceAnalysis) -> str:
    nm = _Names()
    out = _files_text(res.files)
    for r in res.slotscope_runs:
        out += _run_text(r, nm)
    fo = res.foreign
    if fo["spans"]:
        out += _foreign_text(fo, nm)
    if not res.slotscope_runs and not fo["spans"]:
        out += ["", "no spans found"]
    if nm.cut:
        out.append("")
        out.append(f"warning: {len(nm.cut)} name{'s' if len(nm.cut) != 1 else ''} longer than {nm.limit} "
                   f"characters shortened with {ELLIPSIS} in these tables (--json has them in full, up to "
                   f"{MAX_STORED_CHARS} characters)")
    return "\n".join(out) + "\n"


def _files_text(files: list[dict[str, Any]]) -> list[str]:
    out = ["Files", format_table(("file", "documents", "spans", "bad lines"),
                                 [(f["path"], f["documents"], f["spans"], f["bad_lines"]) for f in files])]
    for f in files:
        for b in f["bad"]:
            out.append(f"  skipped {f['path']}:{b['line']}: {b['reason']}")
        if f["bad_lines"] > len(f["bad"]):
            out.append(f"  ... and {f['bad_lines'] - len(f['bad'])} more bad lines skipped in {f['path']}")
    return out


def _run_text(r: dict[str, Any], nm: _Names) -> list[str]:
    """One slotscope run: its divergence tables, findings, first divergence and error, warnings."""
    out = ["", f"slotscope run: {nm(r['scenario'])} / {nm(r['design'])} / seed {nm(r['seed'])}  "
               f"(version {nm(r['service_version'])}, "
               f"{r['spans']} spans, {r['error_spans']} with status ERROR)",
           f"  boundaries {r['boundaries']}, diverging {r['diverging']} "
           f"(swa_loc longer {r['longer']}, shorter {r['shorter']}); from {r['source']}"]
    for dim in DIMENSIONS:
        rows = r["divergence"][dim]
        out += ["", f"  shape divergence by {dim.replace('_', ' ')}",
                format_table((dim, "boundaries", "agree", "longer", "shorter"),
                             [(nm(k), v["boundaries"], v["agree"], v["longer"], v["shorter"])
                              for k, v in rows.items()], indent="    ")]
    out += ["", f"  findings by class ({r['findings_total']} in all)"]
    classes = [c for c in FINDING_CLASSES if any(c in per for per in r["findings"].values())]
    if classes:
        out.append(format_table(["backend"] + classes,
                                [[nm(b)] + [per.get(c, 0) for c in classes]
                                 for b, per in r["findings"].items()], indent="    "))
    else:
        out.append("    none")
    fd = r["first_divergence"]
    out.append("")
    if fd:
        out.append(f"  first divergence: step {fd['step']}, backend {nm(fd['backend'])}, layer "
                   f"{fd['layer']} ({nm(fd['layer_kind'])}): swa_loc {fd['swa_loc_len']} vs loc "
                   f"{fd['loc_len']} ({fd['direction']}), mode {nm(fd['mode'])}, "
                   f"graph {nm(fd['graph_path'])}")
    else:
        out.append("  first divergence: none")
    fe = r["first_error"]
    if fe:
        msg = str(fe["message"])
        msg = msg if len(msg) <= 300 else msg[:299] + ELLIPSIS
        out.append(f"  first error: step {fe['step']}, backend {nm(fe['backend'])}, layer "
                   f"{fe['layer']}: {msg}")
    out += [f"  warning: {w}" for w in r.get("warnings", ())]
    return out


def _foreign_text(fo: dict[str, Any], nm: _Names) -> list[str]:
    """Any other producer's spans: the summary per span name."""
    return ["", f"Other spans: {fo['spans']} ({fo['error_spans']} with status ERROR)"
                + (f", {fo['names_folded']} folded into (other)" if fo["names_folded"] else ""),
            format_table(("name", "count", "total ms", "mean ms", "p50 ms", "max ms"),
                         [(nm(n["name"]), n["count"], n["total_ns"] / 1e6, n["mean_ns"] / 1e6,
                           n["p50_ns"] / 1e6, n["max_ns"] / 1e6) for n in fo["names"]])]
