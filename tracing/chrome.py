"""Chrome / Perfetto trace export (JSON Trace Event Format) from our OTLP JSON file.

Jaeger shows a span tree; Perfetto (ui.perfetto.dev) and chrome://tracing show time lanes, which
suits "which layer of which backend, when": one process per backend (pid), one thread per layer
(tid = layer id), a complete ("X") event per boundary span. Run and step spans get a process of
their own; per-(step, backend) spans get a lane "steps" above the layers of their backend.

Two streaming passes over the input (the first finds the time origin and the lanes), and events
are written as they are read, so memory stays flat however large the trace.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator, Optional, TextIO, Union

from . import attributes as A
from .otlp_read import TRACE_FILE, BadLine, TraceFormatError, attributes, read_documents

RUN_PID = 0
STEPS_TID = 1_000_000          # the lane of per-(step, backend) spans inside a backend process
_BAD_CNAME = "bad"             # Chrome's reserved colour names
_ERROR_CNAME = "terrible"


_STRUCTURE_ERRORS = (AttributeError, TypeError, KeyError, ValueError, IndexError, RecursionError, MemoryError)


class _Reader:
    """Reads the spans of one OTLP JSON file, line by line; a bad line is fatal, or with
    ``skip_bad`` skipped and counted (each document whole: none of a bad one's spans are used)."""

    def __init__(self, path: str, skip_bad: bool = False, max_line_bytes: Optional[int] = None):
        self.path, self.skip_bad, self.max_line_bytes = path, skip_bad, max_line_bytes
        self.bad: list[tuple[int, str]] = []

    def bad_line(self, line: int, reason: str) -> None:
        if not self.skip_bad:
            raise TraceFormatError(self.path, line, reason)
        self.bad.append((line, reason))

    def documents(self) -> Iterator[tuple[int, list[tuple[dict[str, Any], dict[str, Any]]]]]:
        """(line, [(resource attributes, span), ...]) per readable document."""
        for item in read_documents(self.path, self.max_line_bytes):
            if isinstance(item, BadLine):
                self.bad_line(item.line, item.reason)
                continue
            line, doc = item
            try:
                spans = []
                for rs in doc.get("resourceSpans") or ():
                    res = attributes((rs.get("resource") or {}).get("attributes"))
                    for ss in rs.get("scopeSpans") or ():
                        for span in ss.get("spans") or ():
                            if not isinstance(span, dict):
                                raise TypeError(f"a span is a {type(span).__name__}, not an object")
                            spans.append((res, span))
            except _STRUCTURE_ERRORS as exc:
                self.bad_line(line, f"not an OTLP trace document: {_describe(exc)}")
                continue
            yield line, spans


def _describe(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"missing field {exc.args[0]!r}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, MemoryError):
        return "too large for the memory available"
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 200 else text[:200] + "..."


class _Lanes:
    """pid per backend (run order from the resource, then first seen), names per lane."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}
        self.threads: dict[tuple[int, int], str] = {}
        self.t0: Optional[int] = None

    def pid(self, process: str) -> int:
        p = self.pids.get(process)
        if p is None:
            p = self.pids[process] = len(self.pids) + 1
        return p

    def place(self, res: dict[str, Any], span: dict[str, Any],
              a: dict[str, Any]) -> tuple[int, int, str]:
        """(pid, tid, event name) of one span."""
        name = span.get("name", "")
        if name == A.SPAN_BOUNDARY:
            pid = self.pid(f"backend {a.get(A.BACKEND, '?')}")
            layer = int(a.get(A.LAYER, -1))
            kind = a.get(A.LAYER_KIND, "?")
            self.threads.setdefault((pid, layer), f"layer {layer} ({kind})")
            return pid, layer, f"L{layer} {kind} step {a.get(A.STEP, '?')}"
        if name == A.SPAN_BACKEND:
            pid = self.pid(f"backend {a.get(A.BACKEND, '?')}")
            self.threads.setdefault((pid, STEPS_TID), "steps")
            return pid, STEPS_TID, f"step {a.get(A.STEP, '?')}"
        if name in (A.SPAN_RUN, A.SPAN_STEP):
            tid = 0 if name == A.SPAN_RUN else 1
            self.threads.setdefault((RUN_PID, tid), "run" if tid == 0 else "steps")
            label = "run" if name == A.SPAN_RUN else f"step {a.get(A.STEP, '?')}"
            return RUN_PID, tid, label
        pid = self.pid(f"service {res.get('service.name', '?')}")
        self.threads.setdefault((pid, 0), "spans")
        return pid, 0, name


def _args(a: dict[str, Any], span: dict[str, Any]) -> dict[str, Any]:
    out = {(k[len(A.NS):] if k.startswith(A.NS) else k): v for k, v in a.items()}
    st = span.get("status") or {}
    if st.get("message"):
        out["status"] = st["message"]
    return out


def _event(lanes: _Lanes, res: dict[str, Any], span: dict[str, Any], t0: int) -> str:
    a = attributes(span.get("attributes"))
    pid, tid, label = lanes.place(res, span, a)
    start = int(span.get("startTimeUnixNano") or 0)
    end = int(span.get("endTimeUnixNano") or start)
    ev: dict[str, Any] = {"name": label, "cat": str(span.get("name", "")), "ph": "X",
                          "ts": (start - t0) / 1000.0, "dur": max(0, end - start) / 1000.0,
                          "pid": pid, "tid": tid, "args": _args(a, span)}
    code = (span.get("status") or {}).get("code")
    if code in (2, "2", "STATUS_CODE_ERROR"):
        ev["cname"] = _ERROR_CNAME
    elif a.get(A.MISMATCH):
        ev["cname"] = _BAD_CNAME
    return json.dumps(ev, separators=(",", ":"))


def export_chrome(src: Union[str, os.PathLike[str]], dst: Union[str, os.PathLike[str]], *,
                  skip_bad: bool = False, max_line_bytes: Optional[int] = None) -> dict[str, int]:
    """Convert an OTLP JSON file to a Chrome trace; returns {"events": n, "spans": n, "bad_lines": n}.

    A line that cannot be read or converted raises :class:`TraceFormatError` (file:line); with
    ``skip_bad`` it is left out whole and counted. The output appears only when complete.
    """
    src_s = os.fspath(src)
    lanes = _Lanes()
    # Pass 1: the time origin and a stable pid order (the run's backend order first).
    first_pass = _Reader(src_s, skip_bad, max_line_bytes)
    for line, spans in first_pass.documents():
        try:
            starts = [int(span.get("startTimeUnixNano") or 0) for _, span in spans]
        except _STRUCTURE_ERRORS as exc:
            first_pass.bad_line(line, f"not an OTLP trace document: {_describe(exc)}")
            continue
        for (res, _), t in zip(spans, starts):
            if lanes.t0 is None or t < lanes.t0:
                lanes.t0 = t
            backends = res.get(A.BACKENDS)
            if isinstance(backends, list) and not lanes.pids:
                for b in backends:
                    lanes.pid(f"backend {b}")
    t0 = lanes.t0 or 0
    dst_p = Path(dst)
    dst_p.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst_p.with_name(dst_p.name + ".part")
    n_spans = 0
    reader = _Reader(src_s, skip_bad, max_line_bytes)
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            out.write('{"displayTimeUnit":"ms","traceEvents":[\n')
            first = True
            for line, spans in reader.documents():
                try:
                    events = [_event(lanes, res, span, t0) for res, span in spans]
                except _STRUCTURE_ERRORS as exc:
                    reader.bad_line(line, f"cannot convert a span: {_describe(exc)}")
                    continue
                for ev in events:
                    if not first:
                        out.write(",\n")
                    out.write(ev)
                    first = False
                n_spans += len(events)
            n_meta = _write_metadata(out, lanes, first)
            out.write("\n]}\n")
        os.replace(tmp, dst_p)
    finally:
        if tmp.exists():
            tmp.unlink()
    return {"spans": n_spans, "events": n_spans + n_meta, "bad_lines": len(reader.bad),
            "bad": reader.bad[:20]}  # type: ignore[dict-item]


def _write(out: TextIO, ev: dict[str, Any], first: bool) -> None:
    if not first:
        out.write(",\n")
    out.write(json.dumps(ev, separators=(",", ":")))


def _write_metadata(out: TextIO, lanes: _Lanes, first: bool) -> int:
    n = 0
    procs = [(RUN_PID, "slotscope run")] + [(p, name) for name, p in lanes.pids.items()]
    for pid, name in procs:
        _write(out, {"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                     "args": {"name": name}}, first)
        _write(out, {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                     "args": {"sort_index": pid}}, False)
        first = False
        n += 2
    for (pid, tid), name in sorted(lanes.threads.items()):
        _write(out, {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                     "args": {"name": name}}, first)
        _write(out, {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                     "args": {"sort_index": -1 if tid == STEPS_TID else tid}}, False)
        first = False
        n += 2
    return n


def default_output(src: Union[str, os.PathLike[str]]) -> tuple[Path, Path]:
    """(input file, output file) for ``export DIR_OR_FILE``: DIR/trace.otlp.jsonl ->
    DIR/trace.chrome.json; any other FILE.x -> FILE.chrome.json beside it."""
    p = Path(src)
    if p.is_dir():
        return p / TRACE_FILE, p / "trace.chrome.json"
    name = p.name
    for suffix in (".otlp.jsonl", ".jsonl", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return p, p.with_name(name + ".chrome.json")
