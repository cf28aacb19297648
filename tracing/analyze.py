"""Offline analysis of OTLP JSON traces: ours (divergence tables) and anyone's (span summary).

Streaming and bounded: every document is folded into fixed-size tallies as it is read, so a
trace ten times larger needs no more memory (only the number of distinct runs, backends, modes
and span names matters, and names are capped).

Which spans count. A slotscope ``slotscope.backend`` span carries the shapes of every layer of one
(step, backend) as arrays and exists at every trace level, so the divergence and findings tables
are built from those; ``slotscope.boundary`` spans repeat a subset of the same facts (all of them
at level ``boundary``) and are used only for a run that has no backend spans (e.g. a trimmed file
from another tool). That way no boundary is counted twice whatever the level.

A document is applied only once it was read completely, so ``skip_bad`` never leaves half a line
in the counts.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Union

from simulator.records import FINDING_CLASSES

from . import attributes as A
from .analysis import DIMENSIONS, ELLIPSIS, MAX_STORED_CHARS, TraceAnalysis
from .otlp_read import (TRACE_FILE, BadLine, TraceFormatError, attributes, missing_trace, norm_id,
                        read_documents)
from .quantiles import Quantiles
from .recorder import agrees, direction

__all__ = ["TraceFormatError", "TraceAnalysis", "analyze_files", "Analyzer"]

MAX_NAMES = 10_000              # distinct foreign span names tracked; the rest fold into "(other)"
MAX_KEYS = 1_000                # distinct backends / modes / graph paths / layer kinds per run; the rest "(other)"
MAX_RUNS = 1_000                # distinct slotscope runs; the rest fold into one "(other runs)"
OTHER = "(other)"
_ERROR_CODES = (2, "2", "STATUS_CODE_ERROR")
_MAX_BAD_KEPT = 20
_FINDING_KEYS = tuple(A.FINDINGS_PREFIX + c for c in FINDING_CLASSES)
# Only these attributes are decoded from backend / boundary spans: the rest cost time, not answers.
_BACKEND_KEYS = frozenset((A.LAYER_IDS, A.LAYER_KINDS, A.LOC_LENS, A.SWA_LOC_LENS, A.BACKEND,
                           A.STEP, A.MODE, A.GRAPH, A.ERROR_LAYERS) + _FINDING_KEYS)
_BOUNDARY_KEYS = frozenset((A.LAYER, A.LAYER_KIND, A.LOC_SHAPE, A.SWA_LOC_SHAPE, A.BACKEND,
                            A.STEP, A.MODE, A.GRAPH) + _FINDING_KEYS)
# What each span kind needs for the tables; a span without one is counted ("N spans lack ...")
_BACKEND_NEEDS = (A.BACKEND, A.STEP, A.MODE, A.GRAPH, A.LAYER_IDS, A.LAYER_KINDS, A.LOC_LENS, A.SWA_LOC_LENS)
_BOUNDARY_NEEDS = (A.BACKEND, A.STEP, A.MODE, A.GRAPH, A.LAYER, A.LAYER_KIND, A.LOC_SHAPE, A.SWA_LOC_SHAPE)
# without these a span says nothing about shapes: it is counted as lacking and left out of the tables
_BACKEND_ESSENTIAL = (A.LAYER_IDS, A.LOC_LENS, A.SWA_LOC_LENS)
_BOUNDARY_ESSENTIAL = (A.LAYER, A.LOC_SHAPE)


def _cut(value: Any) -> str:
    """A name as stored: a string of at most MAX_STORED_CHARS characters."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= MAX_STORED_CHARS else text[:MAX_STORED_CHARS - 1] + ELLIPSIS


def _capped_row(table: dict[str, list[int]], key: str) -> list[int]:
    row = table.get(key)
    if row is None:
        if len(table) >= MAX_KEYS:
            key = OTHER
            row = table.get(key)
        if row is None:
            row = table[key] = [0, 0, 0]
    return row


# -- per-name duration statistics ---------------------------------------------------------------
class Durations(Quantiles):
    """One foreign span name's durations: count/total/mean/max exactly, p50 exact up to
    quantiles.EXACT samples, then within about 0.5%."""

    __slots__ = ()

    def p50(self) -> float:
        return self.quantile(0.5, capped=False)

    def to_json(self, name: str) -> dict[str, Any]:
        return {"name": name, "count": self.count, "total_ns": self.total, "mean_ns": self.mean,
                "p50_ns": self.p50(), "max_ns": self.max, "p50_exact": self.exact is not None}


# -- slotscope tallies ----------------------------------------------------------------------------
class _Tally:
    """Divergence and findings counts from one source (backend spans or boundary spans)."""

    def __init__(self) -> None:
        # dimension -> key -> [boundaries, longer, shorter]
        self.tables: dict[str, dict[str, list[int]]] = {d: {} for d in DIMENSIONS}
        self.findings: dict[str, dict[str, int]] = {}
        self.boundaries = 0
        self.longer = 0
        self.shorter = 0
        self.first: Optional[tuple[tuple[Any, ...], dict[str, Any]]] = None

    def add(self, rec: "_Crossings") -> None:
        n, lo, sh = rec.total
        self.boundaries += n
        self.longer += lo
        self.shorter += sh
        for dim, key in (("backend", rec.backend), ("mode", rec.mode), ("graph_path", rec.graph)):
            row = _capped_row(self.tables[dim], key)
            row[0] += n
            row[1] += lo
            row[2] += sh
        kinds = self.tables["layer_kind"]
        for kind, (kn, klo, ksh) in rec.by_kind.items():
            row = _capped_row(kinds, kind)
            row[0] += kn
            row[1] += klo
            row[2] += ksh
        if rec.findings:
            backend = rec.backend if rec.backend in self.findings or len(self.findings) < MAX_KEYS else OTHER
            per = self.findings.setdefault(backend, {})
            for cls, c in rec.findings.items():
                per[cls] = per.get(cls, 0) + c
        if rec.first is not None and (self.first is None or rec.first[0] < self.first[0]):
            self.first = rec.first


@dataclass(slots=True)
class _Crossings:
    """What one backend or boundary span says, reduced to counts (built before applying)."""

    run: tuple[str, str, str]
    source: int                      # 0: backend span arrays, 1: boundary span
    backend: str
    mode: str
    graph: str
    total: tuple[int, int, int]
    by_kind: dict[str, tuple[int, int, int]]
    findings: dict[str, int]
    first: Optional[tuple[tuple[Any, ...], dict[str, Any]]]
    error: Optional[tuple[tuple[Any, ...], dict[str, Any]]]


class _Run:
    """Everything known about one slotscope run (resource scenario/design/seed)."""

    def __init__(self, key: tuple[str, str, str], resource: dict[str, Any]):
        self.key = key
        self.resource = {k: v for k, v in resource.items()
                         if k.startswith(A.NS) or k.startswith("service.")}
        backends = resource.get(A.BACKENDS)
        self.order = {b: i for i, b in enumerate(backends)} if isinstance(backends, list) else {}
        self.spans = 0
        self.names: dict[str, int] = {}
        self.error_spans = 0
        self.tallies = (_Tally(), _Tally())
        self.has_arrays = False
        self.first_error: Optional[tuple[tuple[Any, ...], dict[str, Any]]] = None
        self.lacking: dict[str, int] = {}        # attribute -> spans that needed it and lacked it
        self.unused = 0                          # spans left out of the tables for lack of shapes

    def backend_rank(self, backend: str) -> tuple[int, str]:
        return (self.order.get(backend, len(self.order)), backend)


# -- the analyser ---------------------------------------------------------------------------------
@dataclass
class FileStats:
    path: str
    documents: int = 0
    spans: int = 0
    bad_lines: int = 0
    other_signals: int = 0            # resourceMetrics / resourceLogs documents, ignored
    bad: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "documents": self.documents, "spans": self.spans,
                "bad_lines": self.bad_lines, "other_signals": self.other_signals,
                "bad": list(self.bad)}


class Analyzer:
    """Feed files with :meth:`add_file`; read the result with :meth:`result`."""

    def __init__(self, skip_bad: bool = False, max_line_bytes: Optional[int] = None):
        self.skip_bad = skip_bad
        self.max_line_bytes = max_line_bytes
        self.files: list[FileStats] = []
        self.runs: dict[tuple[str, str, str], _Run] = {}
        self.foreign: dict[str, Durations] = {}
        self.foreign_spans = 0
        self.foreign_error_spans = 0
        self.names_folded = 0

    # -- input ------------------------------------------------------------------------------
    def add_file(self, path: Union[str, os.PathLike[str]]) -> FileStats:
        p = os.fspath(path)
        if os.path.isdir(p):                 # a run's output directory: its trace file
            trace = os.path.join(p, TRACE_FILE)
            if not os.path.isfile(trace):
                raise TraceFormatError(p, 0, missing_trace(p))
            p = trace
        stats = FileStats(p)
        self.files.append(stats)
        try:
            items = read_documents(p, self.max_line_bytes)
            for item in items:
                if isinstance(item, BadLine):
                    self._bad(stats, item.line, item.reason)
                    continue
                line, doc = item
                try:
                    pending = self._read_document(doc)
                except TraceFormatError:
                    raise
                except (KeyError, TypeError, AttributeError, ValueError, IndexError, RecursionError,
                        MemoryError) as exc:
                    self._bad(stats, line, f"not an OTLP trace document: {_describe(exc)}")
                    continue
                if pending is None:
                    stats.other_signals += 1
                    continue
                stats.documents += 1
                stats.spans += self._apply(pending)
        except OSError as exc:
            raise TraceFormatError(p, 0, f"cannot read: {exc.strerror or exc}") from exc
        return stats

    def _bad(self, stats: FileStats, line: int, reason: str) -> None:
        if not self.skip_bad:
            raise TraceFormatError(stats.path, line, reason)
        stats.bad_lines += 1
        if len(stats.bad) < _MAX_BAD_KEPT:
            stats.bad.append({"line": line, "reason": reason})

    def _read_document(self, doc: Any) -> Optional[list[Any]]:
        """Reduce one document to a list of pending records; raises on malformed structure."""
        if not isinstance(doc, dict):
            raise TypeError(f"expected a JSON object, got {type(doc).__name__}")
        rs_list = doc.get("resourceSpans")
        if rs_list is None:
            if "resourceMetrics" in doc or "resourceLogs" in doc or "resourceProfiles" in doc:
                return None
            if not doc:
                return []
            raise KeyError("resourceSpans")
        if not isinstance(rs_list, list):
            raise TypeError("resourceSpans is not a list")
        pending: list[Any] = []
        for rs in rs_list:
            res_attrs = attributes((rs.get("resource") or {}).get("attributes"))
            ours = res_attrs.get("service.name") == "slotscope" or any(
                k.startswith(A.NS) for k in res_attrs)
            run_key = (_cut(res_attrs.get(A.SCENARIO, "?")), _cut(res_attrs.get(A.DESIGN, "?")),
                       _cut(res_attrs.get(A.SEED, "?")))
            if run_key not in self.runs and len(self.runs) >= MAX_RUNS:
                run_key = ("(other runs)", OTHER, OTHER)
            run = self.runs.get(run_key) if ours else None
            scope_spans = rs.get("scopeSpans")
            if scope_spans is None:
                scope_spans = rs.get("instrumentationLibrarySpans") or []   # pre-1.0 producers
            for ss in scope_spans:
                spans = ss.get("spans") or []
                if not isinstance(spans, list):
                    raise TypeError("spans is not a list")
                for span in spans:
                    name = span.get("name", "")
                    if not isinstance(name, str):
                        raise TypeError("span name is not a string")
                    if len(name) > MAX_STORED_CHARS:
                        name = _cut(name)
                    if ours or name in A.SPAN_NAMES:
                        if run is None:
                            run = self.runs.get(run_key)
                            if run is None:
                                run = self.runs[run_key] = _Run(run_key, res_attrs)
                        pending.append(self._slotscope_span(run, span, name))
                    else:
                        t0 = int(span.get("startTimeUnixNano") or 0)
                        t1 = int(span.get("endTimeUnixNano") or 0)
                        st = span.get("status")
                        err = bool(st) and st.get("code") in _ERROR_CODES
                        pending.append((name, t1 - t0, err))
        return pending

    def _slotscope_span(self, run: _Run, span: dict[str, Any], name: str) -> Any:
        st = span.get("status")
        err = bool(st) and st.get("code") in _ERROR_CODES
        if name == A.SPAN_BACKEND:
            a = attributes(span.get("attributes"), _BACKEND_KEYS)
            lacking = tuple(k for k in _BACKEND_NEEDS if a.get(k) is None)
            usable = not any(k in lacking for k in _BACKEND_ESSENTIAL)
            return (run, name, err, self._backend_span(run, span, a, st if err else None) if usable else None,
                    lacking)
        if name == A.SPAN_BOUNDARY and (not run.has_arrays or err):
            a = attributes(span.get("attributes"), _BOUNDARY_KEYS)
            lacking = tuple(k for k in _BOUNDARY_NEEDS if a.get(k) is None)
            usable = not any(k in lacking for k in _BOUNDARY_ESSENTIAL)
            return (run, name, err, self._boundary_span(run, span, a, st if err else None) if usable else None,
                    lacking)
        return (run, name, err, None, ())

    def _backend_span(self, run: _Run, span: dict[str, Any], a: dict[str, Any],
                      status: Optional[dict[str, Any]]) -> Optional[_Crossings]:
        layers = a.get(A.LAYER_IDS)
        if layers is None:
            return None
        kinds = a.get(A.LAYER_KINDS) or ["swa"] * len(layers)
        locs = a[A.LOC_LENS]
        swas = a[A.SWA_LOC_LENS]
        if not (len(layers) == len(kinds) == len(locs) == len(swas)):
            raise ValueError(f"{A.SPAN_BACKEND} arrays differ in length "
                             f"({len(layers)}, {len(kinds)}, {len(locs)}, {len(swas)})")
        backend = _cut(a.get(A.BACKEND, "?"))
        step = int(a.get(A.STEP, -1))
        mode, graph = _cut(a.get(A.MODE, "?")), _cut(a.get(A.GRAPH, "?"))
        by_kind: dict[str, list[int]] = {}
        first = None
        lo_all = sh_all = 0
        for layer, kind, loc, swa in zip(layers, kinds, locs, swas):
            if not isinstance(kind, str) or len(kind) > MAX_STORED_CHARS:
                kind = _cut(kind)
            row = by_kind.get(kind)
            if row is None:
                row = by_kind[kind] = [0, 0, 0]
            row[0] += 1
            if not agrees(kind, loc, swa):
                if swa > loc:
                    row[1] += 1
                    lo_all += 1
                else:
                    row[2] += 1
                    sh_all += 1
                if first is None or layer < first[0]:
                    first = (layer, kind, loc, swa)
        fd = self._first(run, step, backend, first, mode, graph, span)
        error = None
        if status is not None:
            el = a.get(A.ERROR_LAYERS) or [-1]
            error = ((step, run.backend_rank(backend), el[0], 1),
                     {"step": step, "backend": backend, "layer": el[0],
                      "message": _exception_message(span) or status.get("message", "")})
        return _Crossings(run.key, 0, backend, mode, graph, (len(layers), lo_all, sh_all),
                          {k: tuple(v) for k, v in by_kind.items()}, _findings(a), fd, error)

    def _boundary_span(self, run: _Run, span: dict[str, Any], a: dict[str, Any],
                       status: Optional[dict[str, Any]]) -> Optional[_Crossings]:
        if A.LAYER not in a:
            return None
        backend = _cut(a.get(A.BACKEND, "?"))
        step = int(a.get(A.STEP, -1))
        layer = int(a[A.LAYER])
        kind = _cut(a.get(A.LAYER_KIND, "swa"))
        loc_shape = a.get(A.LOC_SHAPE) or [0]
        swa_shape = a.get(A.SWA_LOC_SHAPE) or []
        loc = int(loc_shape[0])
        swa = int(swa_shape[0]) if swa_shape else -1
        mode, graph = _cut(a.get(A.MODE, "?")), _cut(a.get(A.GRAPH, "?"))
        lo = sh = 0
        first = None
        if not agrees(kind, loc, swa):
            if swa > loc:
                lo = 1
            else:
                sh = 1
            first = (layer, kind, loc, swa)
        fd = self._first(run, step, backend, first, mode, graph, span)
        error = None
        if status is not None:
            error = ((step, run.backend_rank(backend), layer, 0),
                     {"step": step, "backend": backend, "layer": layer,
                      "message": _exception_message(span) or status.get("message", "")})
        return _Crossings(run.key, 1, backend, mode, graph, (1, lo, sh),
                          {kind: (1, lo, sh)}, _findings(a), fd, error)

    @staticmethod
    def _first(run: _Run, step: int, backend: str, first: Optional[tuple[int, str, int, int]],
               mode: str, graph: str, span: dict[str, Any]):
        if first is None:
            return None
        layer, kind, loc, swa = first
        key = (step, run.backend_rank(backend), layer)
        return key, {"step": step, "backend": backend, "layer": layer, "layer_kind": kind,
                     "loc_len": loc, "swa_loc_len": swa,
                     "direction": direction(loc, swa),
                     "mode": mode, "graph_path": graph,
                     "trace_id": norm_id(span.get("traceId"), 16),
                     "span_id": norm_id(span.get("spanId"), 8)}

    def _apply(self, pending: list[Any]) -> int:
        foreign = self.foreign
        for rec in pending:
            if len(rec) == 3:                                   # foreign span
                name, dur, err = rec
                self.foreign_spans += 1
                if err:
                    self.foreign_error_spans += 1
                d = foreign.get(name)
                if d is None:
                    if len(foreign) >= MAX_NAMES:
                        self.names_folded += 1
                        name = "(other)"
                        d = foreign.get(name)
                    if d is None:
                        d = foreign[name] = Durations()
                d.add(dur)
                continue
            run, name, err, cross, lacking = rec
            run.spans += 1
            if name in run.names or len(run.names) < MAX_NAMES:
                run.names[name] = run.names.get(name, 0) + 1
            else:
                run.names[OTHER] = run.names.get(OTHER, 0) + 1
            if err:
                run.error_spans += 1
            for key in lacking:
                run.lacking[key] = run.lacking.get(key, 0) + 1
            if cross is None:
                if lacking:
                    run.unused += 1
                continue
            if cross.source == 0:
                run.has_arrays = True
            run.tallies[cross.source].add(cross)
            if cross.error is not None and (run.first_error is None
                                            or cross.error[0] < run.first_error[0]):
                run.first_error = cross.error
        return len(pending)

    # -- output -----------------------------------------------------------------------------
    def result(self) -> "TraceAnalysis":
        runs = []
        for run in sorted(self.runs.values(), key=lambda r: r.key):
            if not run.spans:          # created by a document that turned out malformed
                continue
            arrays, bounds = run.tallies
            tally, source = ((arrays, "backend_spans") if arrays.boundaries or run.has_arrays
                             else (bounds, "boundary_spans") if bounds.boundaries
                             else (arrays, "none"))
            runs.append(_run_json(run, tally, source))
        names = sorted(self.foreign.items(), key=lambda kv: (-kv[1].total, kv[0]))
        return TraceAnalysis(
            files=[f.to_json() for f in self.files],
            slotscope_runs=runs,
            foreign={"spans": self.foreign_spans, "error_spans": self.foreign_error_spans,
                     "names": [d.to_json(n) for n, d in names],
                     "names_folded": self.names_folded})


def _describe(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"missing field {exc.args[0]!r}"
    return f"{type(exc).__name__}: {exc}"


def _findings(a: dict[str, Any]) -> dict[str, int]:
    out = {}
    for cls, key in zip(FINDING_CLASSES, _FINDING_KEYS):
        n = a.get(key)
        if n:
            out[cls] = int(n)
    return out


def _exception_message(span: dict[str, Any]) -> str:
    for ev in span.get("events") or ():
        if ev.get("name") == "exception":
            ea = attributes(ev.get("attributes"))
            return str(ea.get("exception.message", ""))
    return ""


def _run_json(run: _Run, tally: _Tally, source: str) -> dict[str, Any]:
    tables = {}
    for dim in DIMENSIONS:
        rows = {}
        for key in sorted(tally.tables[dim], key=lambda k: (
                run.backend_rank(k) if dim == "backend" else (0, k))):
            n, lo, sh = tally.tables[dim][key]
            rows[key] = {"boundaries": n, "agree": n - lo - sh, "longer": lo, "shorter": sh}
        tables[dim] = rows
    findings = {b: {c: per.get(c, 0) for c in FINDING_CLASSES if per.get(c)}
                for b, per in sorted(tally.findings.items(), key=lambda kv: run.backend_rank(kv[0]))}
    scenario, design, seed = run.key
    seed_value: Any = run.resource.get(A.SEED, seed)
    return {
        "run": f"{scenario} / {design} / seed {seed}",
        "scenario": scenario, "design": design, "seed": seed_value,
        "service_version": run.resource.get("service.version"),
        "spans": run.spans, "span_names": dict(sorted(run.names.items())),
        "error_spans": run.error_spans, "source": source,
        "boundaries": tally.boundaries, "diverging": tally.longer + tally.shorter,
        "longer": tally.longer, "shorter": tally.shorter,
        "divergence": tables,
        "findings": findings,
        "findings_total": sum(sum(per.values()) for per in findings.values()),
        "first_divergence": tally.first[1] if tally.first else None,
        "first_error": run.first_error[1] if run.first_error else None,
        "lacking_attributes": dict(sorted(run.lacking.items(), key=lambda kv: (-kv[1], kv[0]))),
        "spans_unused": run.unused,
        "warnings": _lacking_warnings(run.lacking, run.unused),
    }


def _lacking_warnings(lacking: dict[str, int], unused: int) -> list[str]:
    """"312 spans lack slotscope.backend; 12 lack slotscope.step" (most first), and what was left out."""
    if not lacking:
        return []
    parts = sorted(lacking.items(), key=lambda kv: (-kv[1], kv[0]))
    (k0, n0), rest = parts[0], parts[1:]
    text = f"{n0} span{'s' if n0 != 1 else ''} lack {k0}" + "".join(f"; {n} lack {k}" for k, n in rest)
    out = [text + " (the tables count those as '?' or assume 'swa')"]
    if unused:
        out.append(f"{unused} span{'s' if unused != 1 else ''} without per-layer shapes "
                   f"({A.LAYER_IDS} / {A.LOC_LENS} / {A.SWA_LOC_LENS}, or {A.LAYER} / {A.LOC_SHAPE}) "
                   f"left out of the tables")
    return out


def analyze_files(paths: Iterable[Union[str, os.PathLike[str]]],
                  skip_bad: bool = False, max_line_bytes: Optional[int] = None) -> TraceAnalysis:
    """Analyse OTLP JSON files; raises TraceFormatError (file:line) unless ``skip_bad``."""
    an = Analyzer(skip_bad=skip_bad, max_line_bytes=max_line_bytes)
    for p in paths:
        an.add_file(p)
    return an.result()
