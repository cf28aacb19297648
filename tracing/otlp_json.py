"""OTLP JSON lines: the format of the OpenTelemetry Collector's file exporter.

Each line is one ``{"resourceSpans": [...]}`` document holding a batch of spans, encoded as the
OTLP/JSON mapping says: trace and span ids as lowercase hex (not protobuf's base64), 64-bit
integers (timestamps, ``intValue``) as decimal strings, enums (span kind, status code) as
integers, lowerCamelCase field names, empty fields left out. That is what Jaeger's UI upload,
the Collector's ``otlpjsonfile`` receiver and our own analyser read.

The exporter is ours (not the SDK's console exporter, whose JSON is a different, ad-hoc shape).
"""
from __future__ import annotations

import base64
import json
import math
import os
import threading
from pathlib import Path
from typing import Any, Optional, Sequence, TextIO

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

TRACE_FILE = "trace.otlp.jsonl"

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def any_value(v: Any) -> dict[str, Any]:
    """One attribute value as an OTLP ``AnyValue``."""
    t = type(v)
    if t is str:                                  # the common cases first, by exact type
        return {"stringValue": v}
    if t is int:
        return {"intValue": str(v)}
    if t is bool:
        return {"boolValue": v}
    if t is tuple or t is list:
        return {"arrayValue": {"values": _array(v)}}
    if isinstance(v, bool):                       # before int: bool is an int subclass
        return {"boolValue": bool(v)}
    if isinstance(v, int):
        return {"intValue": str(int(v))}
    if isinstance(v, float):
        if math.isfinite(v):
            return {"doubleValue": v}
        return {"doubleValue": "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")}
    if isinstance(v, str):
        return {"stringValue": str(v)}
    if isinstance(v, bytes):
        return {"bytesValue": base64.b64encode(v).decode("ascii")}
    if isinstance(v, dict):
        return {"kvlistValue": {"values": key_values(v)}}
    if isinstance(v, (list, tuple)):
        return {"arrayValue": {"values": [any_value(x) for x in v]}}
    return {"stringValue": str(v)}


_ARRAY_CACHE: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
_ARRAY_CACHE_MAX = 512


def _array(v: Sequence[Any]) -> list[dict[str, Any]]:
    """Per-layer arrays are long and homogeneous: encode them in one comprehension.

    The same arrays recur on every (step, backend) span (layer ids and kinds, often the
    lengths), so encoded long int/str tuples are memoised in a small bounded cache; the encoded
    lists are only ever serialised, never changed, so sharing them is safe. Only tuples whose
    elements all have exactly the same type are cached (1 == True must not alias).
    """
    if not v:
        return []
    t = type(v[0])
    if (t is int or t is str) and all(type(x) is t for x in v):
        if type(v) is tuple and len(v) >= 8:
            hit = _ARRAY_CACHE.get(v)
            if hit is not None:
                return hit
            out = ([{"intValue": str(x)} for x in v] if t is int
                   else [{"stringValue": x} for x in v])
            if len(_ARRAY_CACHE) >= _ARRAY_CACHE_MAX:
                _ARRAY_CACHE.clear()
            _ARRAY_CACHE[v] = out
            return out
        return [{"intValue": str(x)} for x in v] if t is int else [{"stringValue": x} for x in v]
    return [any_value(x) for x in v]


def key_values(attrs: Optional[Any]) -> list[dict[str, Any]]:
    if not attrs:
        return []
    return [{"key": k, "value": any_value(v)} for k, v in attrs.items()]


def encode_span(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.context
    out: dict[str, Any] = {
        "traceId": format(ctx.trace_id, "032x"),
        "spanId": format(ctx.span_id, "016x"),
    }
    if span.parent is not None:
        out["parentSpanId"] = format(span.parent.span_id, "016x")
    out["name"] = span.name
    out["kind"] = span.kind.value + 1             # SDK INTERNAL=0 -> OTLP SPAN_KIND_INTERNAL=1
    out["startTimeUnixNano"] = str(span.start_time)
    out["endTimeUnixNano"] = str(span.end_time)
    if span.attributes:
        out["attributes"] = key_values(span.attributes)
    if span.dropped_attributes:
        out["droppedAttributesCount"] = span.dropped_attributes
    if span.events:
        out["events"] = [_event(e) for e in span.events]
    if span.dropped_events:
        out["droppedEventsCount"] = span.dropped_events
    if span.links:
        out["links"] = [{"traceId": format(l.context.trace_id, "032x"),
                         "spanId": format(l.context.span_id, "016x"),
                         **({"attributes": key_values(l.attributes)} if l.attributes else {})}
                        for l in span.links]
    status: dict[str, Any] = {}
    code = span.status.status_code.value          # UNSET=0, OK=1, ERROR=2: same as OTLP
    if code:
        status["code"] = code
    if span.status.description:
        status["message"] = span.status.description
    out["status"] = status
    return out


def _event(e: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"timeUnixNano": str(e.timestamp), "name": e.name}
    if e.attributes:
        ev["attributes"] = key_values(e.attributes)
    return ev


def encode_batch(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """Group spans by resource, then by instrumentation scope, as ``ExportTraceServiceRequest``."""
    by_resource: dict[int, tuple[Any, dict[tuple[str, str], list[dict[str, Any]]]]] = {}
    for span in spans:
        res = span.resource
        entry = by_resource.get(id(res))
        if entry is None:
            entry = by_resource[id(res)] = (res, {})
        scope = span.instrumentation_scope
        key = (scope.name if scope else "", (scope.version or "") if scope else "")
        entry[1].setdefault(key, []).append(encode_span(span))
    resource_spans = []
    for res, scopes in by_resource.values():
        rs: dict[str, Any] = {"resource": {"attributes": key_values(res.attributes)}}
        scope_spans = []
        for (name, version), encoded in scopes.items():
            scope: dict[str, Any] = {"name": name}
            if version:
                scope["version"] = version
            scope_spans.append({"scope": scope, "spans": encoded})
        rs["scopeSpans"] = scope_spans
        if res.schema_url:
            rs["schemaUrl"] = res.schema_url
        resource_spans.append(rs)
    return {"resourceSpans": resource_spans}


class OtlpJsonLinesExporter(SpanExporter):
    """Writes each exported batch as one line of OTLP JSON to a file.

    ``spans_written`` counts spans whose line reached the file, so the processor's loss check
    holds this exporter to what is really on disk, not to what it claimed.
    """

    def __init__(self, path: os.PathLike[str] | str, append: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: Optional[TextIO] = open(self.path, "a" if append else "w", encoding="utf-8")
        self._lock = threading.Lock()
        self.spans_written = 0
        self.lines_written = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        line = _dumps(encode_batch(spans)) + "\n"
        with self._lock:
            if self._fh is None:
                return SpanExportResult.FAILURE
            self._fh.write(line)
            self._fh.flush()     # a crash later in the run still leaves whole lines behind
            self.spans_written += len(spans)
            self.lines_written += 1
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            if self._fh is not None:
                self._fh.flush()
        return True

    def shutdown(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
