"""Reading OTLP JSON from any producer, one document at a time, with file positions.

Two layouts exist in the wild: JSON lines (the Collector's file exporter, our exporter: one
``{"resourceSpans": ...}`` per line) and one pretty-printed document (hand-written, or saved from
an HTTP request body). JSON lines are streamed line by line so memory does not grow with the
file; a pretty-printed document is one object, so it is parsed whole (several concatenated
documents are read one after another). Every problem becomes a :class:`TraceFormatError` that
names the file and the line, because "invalid JSON" alone is useless on a 2 GB trace.

Values follow the OTLP/JSON mapping but also the looser protobuf-JSON forms other producers
write: 64-bit integers as strings or numbers, ids as hex in either case or as base64.
"""
from __future__ import annotations

import base64
import binascii
import gzip
import json
import os
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator, Optional, Union

_loads = json.loads


class TraceFormatError(ValueError):
    """A trace file that is not OTLP JSON, at a known place."""

    def __init__(self, path: str, line: int, reason: str):
        self.path = path
        self.line = line
        self.reason = reason
        super().__init__(f"{path}:{line}: {reason}")


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line (or document) that could not be read, for ``skip_bad`` bookkeeping."""

    line: int
    reason: str


Item = Union[tuple[int, Any], BadLine]


def _open(path: str) -> BinaryIO:
    """The file as bytes; gzip-compressed traces (``.jsonl.gz``) are read transparently."""
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _short(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):   # its own "line 1" would be the line's, not the file's
        return f"{exc.msg} at column {exc.colno}"
    text = str(exc)
    return text if len(text) <= 200 else text[:200] + "..."


def read_documents(path: Union[str, os.PathLike[str]]) -> Iterator[Item]:
    """Yield ``(line_number, object)`` per document, or :class:`BadLine` for what cannot parse.

    The caller decides whether a BadLine is fatal; this generator keeps going where it can.
    Layout detection: if the first non-blank line is a complete JSON value the file is JSON
    lines; otherwise it is read as one (or several concatenated) pretty-printed documents.
    """
    p = os.fspath(path)
    with _open(p) as fh:
        first_no = 0
        first = b""
        for raw in fh:
            first_no += 1
            if raw.strip():
                first = raw
                break
        else:
            return                                     # empty file: no spans, not an error
        try:
            obj = _loads(first)
        except ValueError:
            obj = None
            first_ok = False
        else:
            first_ok = True
        if first_ok:
            yield (first_no, obj)
            yield from _jsonl_rest(fh, first_no)
            return
        rest = fh.read()
    text_b = b"\n" * (first_no - 1) + first + rest
    yield from _documents(p, text_b, first_no)


def _jsonl_rest(fh: BinaryIO, line_no: int) -> Iterator[Item]:
    loads = _loads
    for raw in fh:
        line_no += 1
        try:
            yield (line_no, loads(raw))
        except ValueError as exc:
            if raw.strip():
                yield BadLine(line_no, f"invalid JSON: {_short(exc)}")


def _documents(path: str, data: bytes, first_no: int) -> Iterator[Item]:
    """One or more pretty-printed documents; falls back to JSON lines if line 1 alone is bad."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        yield BadLine(line, f"not UTF-8: {_short(exc)}")
        return
    decoder = json.JSONDecoder()
    pos = 0
    parsed_any = False
    line_at, counted_to = 1, 0          # line number at offset counted_to, kept incrementally
    n = len(text)
    ws = " \t\r\n"
    while True:
        while pos < n and text[pos] in ws:
            pos += 1
        if pos >= n:
            return
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            if not parsed_any:
                # Nothing parsed yet: maybe JSON lines whose first line is broken.
                lines = text.split("\n")
                if _looks_like_jsonl(lines[first_no:]):
                    yield BadLine(first_no, "invalid JSON: " + _short(_first_error(lines[first_no - 1])))
                    for i, line in enumerate(lines[first_no:], start=first_no + 1):
                        if line.strip():
                            try:
                                yield (i, json.loads(line))
                            except ValueError as e2:
                                yield BadLine(i, f"invalid JSON: {_short(e2)}")
                    return
            yield BadLine(exc.lineno, f"invalid JSON document: {exc.msg} (column {exc.colno})")
            return
        parsed_any = True
        line_at += text.count("\n", counted_to, pos)
        counted_to = pos
        yield (line_at, obj)
        pos = end


def _looks_like_jsonl(lines: list[str]) -> bool:
    for line in lines:
        if line.strip():
            try:
                return isinstance(json.loads(line), dict)
            except ValueError:
                return False
    return False


def _first_error(line: str) -> Exception:
    try:
        json.loads(line)
    except ValueError as exc:
        return exc
    return ValueError("not a JSON object")


# -- values ---------------------------------------------------------------------------------------
def any_value(v: Any) -> Any:
    """An OTLP ``AnyValue`` as a Python value (int for intValue, list for arrayValue, ...)."""
    if not v:
        return None
    for k, x in v.items():
        if k == "stringValue":
            return x
        if k == "intValue":
            return int(x)
        if k == "arrayValue":
            return _array((x or {}).get("values") or ())
        if k == "boolValue":
            return x if isinstance(x, bool) else str(x).lower() == "true"
        if k == "doubleValue":
            return float(x)
        if k == "kvlistValue":
            return {kv["key"]: any_value(kv.get("value")) for kv in (x or {}).get("values") or ()}
        if k == "bytesValue":
            return x
    return None


def _array(values: Any) -> list[Any]:
    """Arrays are nearly always homogeneous (our per-layer int and string arrays): decode them
    with one comprehension, falling back to per-element decoding for anything unusual."""
    if not values:
        return []
    head = values[0]
    try:
        if "intValue" in head:
            return [int(e["intValue"]) for e in values]
        if "stringValue" in head:
            return [e["stringValue"] for e in values]
    except (KeyError, TypeError, ValueError):
        pass
    return [any_value(e) for e in values]


def attributes(attrs: Optional[list[dict[str, Any]]],
               wanted: Optional[frozenset[str]] = None) -> dict[str, Any]:
    """A KeyValue list as a dict; with ``wanted``, only those keys are decoded (speed)."""
    if not attrs:
        return {}
    if wanted is None:
        return {kv["key"]: any_value(kv.get("value")) for kv in attrs}
    return {kv["key"]: any_value(kv.get("value")) for kv in attrs if kv["key"] in wanted}


def norm_id(value: Any, nbytes: int) -> str:
    """A trace/span id as lowercase hex, from hex in any case or from base64 (protobuf JSON)."""
    if not value:
        return ""
    s = str(value)
    if len(s) == 2 * nbytes:
        try:
            int(s, 16)
            return s.lower()
        except ValueError:
            pass
    try:
        raw = base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        return s
    return raw.hex() if len(raw) == nbytes else s


def as_int(value: Any, default: int = 0) -> int:
    """A 64-bit integer that may come as a string or a number."""
    if value is None or value == "":
        return default
    return int(value)
