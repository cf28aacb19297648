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
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator, Optional, Union

_loads = json.loads

#: a run directory's trace file (tracing.otlp_json.TRACE_FILE; repeated so reading needs no OTel SDK)
TRACE_FILE = "trace.otlp.jsonl"

#: the longest line (JSON lines) or document (pretty-printed) read; longer ones are rejected by
#: number, never held in memory whole. Our own lines are a few MB (512 spans each).
MAX_LINE_BYTES = 64 * 2**20
_SKIP_CHUNK = 2**20


class TraceFormatError(ValueError):
    """A trace file that is not OTLP JSON, at a known place (line 0: the file as a whole)."""

    def __init__(self, path: str, line: int, reason: str):
        self.path = path
        self.line = line
        self.reason = reason
        super().__init__(f"{path}:{line}: {reason}" if line > 0 else f"{path}: {reason}")


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line (or document) that could not be read, for ``skip_bad`` bookkeeping."""

    line: int
    reason: str


Item = Union[tuple[int, Any], BadLine]


def open_bytes(path: str) -> BinaryIO:
    """The file as bytes; gzip-compressed traces (``.jsonl.gz``) are read transparently (request logs
    too: sglang_records.py reads them through this and :func:`read_lines`)."""
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _short(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):   # its own "line 1" would be the line's, not the file's
        return f"{exc.msg} at column {exc.colno}"
    if isinstance(exc, RecursionError):
        return "nested too deeply to parse (arrays or objects inside each other beyond Python's limit)"
    if isinstance(exc, MemoryError):
        return "too large to parse in the memory available"
    text = str(exc)
    return text if len(text) <= 200 else text[:200] + "..."


#: what json.loads may raise on hostile input besides ValueError
PARSE_ERRORS = (ValueError, RecursionError, MemoryError)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n:,} bytes"


def too_long(limit: int, seen: int) -> str:
    """The reason a line past ``limit`` was not read: both sizes, and what to do about it."""
    return (f"line longer than the {_mib(limit)} limit ({_mib(seen)}); not read (a line of OTLP JSON "
            f"holds one export batch: split the file, or raise the limit)")


_COMPRESSED_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)


class BrokenLine(bytes):
    """Stands for a line that could not be read at all (a truncated or corrupt .gz); carries why."""

    def __new__(cls, reason: str) -> "BrokenLine":
        obj = super().__new__(cls, b"")
        obj.reason = reason  # type: ignore[attr-defined]
        return obj


def read_lines(fh: BinaryIO, line_no: int, limit: int) -> Iterator[tuple[int, Optional[bytes], int]]:
    """(line number, bytes or None when longer than ``limit``, length) per line, never holding
    more than ``limit`` bytes of one line: an over-long line is skipped in chunks. A compressed file
    cut short ends the lines with a :class:`BrokenLine` saying so."""
    readline = fh.readline
    while True:
        try:
            raw = readline(limit + 1)
        except _COMPRESSED_ERRORS as exc:
            yield line_no + 1, BrokenLine(f"the compressed file is cut short or corrupt: {exc}"), 0
            return
        if not raw:
            return
        line_no += 1
        if len(raw) <= limit or raw.endswith(b"\n"):
            yield line_no, raw, len(raw)
            continue
        seen = len(raw)
        del raw
        while True:
            try:
                chunk = readline(_SKIP_CHUNK)
            except _COMPRESSED_ERRORS:
                chunk = b""
            seen += len(chunk)
            if not chunk or chunk.endswith(b"\n"):
                break
        yield line_no, None, seen


def read_documents(path: Union[str, os.PathLike[str]], max_line_bytes: Optional[int] = None) -> Iterator[Item]:
    """Yield ``(line_number, object)`` per document, or :class:`BadLine` for what cannot parse.

    The caller decides whether a BadLine is fatal; this generator keeps going where it can.
    Layout detection: if the first non-blank line is a complete JSON value the file is JSON
    lines; otherwise it is read as one (or several concatenated) pretty-printed documents.
    Memory is bounded by ``max_line_bytes`` (default :data:`MAX_LINE_BYTES`): a longer line, or
    a pretty-printed document larger than that, is reported (a BadLine) and never read whole;
    JSON nested too deeply to parse is a BadLine too.
    """
    p = os.fspath(path)
    limit = max_line_bytes or MAX_LINE_BYTES
    with open_bytes(p) as fh:
        lines = read_lines(fh, 0, limit)
        for first_no, first, length in lines:
            if isinstance(first, BrokenLine):
                yield BadLine(first_no, first.reason)  # type: ignore[attr-defined]
                return
            if first is None:
                # an over-long first line: JSON lines with a huge batch (a pretty document has short lines)
                yield BadLine(first_no, too_long(limit, length))
                yield from _jsonl_rest(lines, limit)
                return
            if first.strip():
                break
        else:
            return                                     # empty file: no spans, not an error
        try:
            obj = _loads(first)
        except (RecursionError, MemoryError) as exc:   # a complete line, too deep or too big: JSON lines
            yield BadLine(first_no, f"invalid JSON: {_short(exc)}")
            yield from _jsonl_rest(lines, limit)
            return
        except ValueError:
            obj = None
            first_ok = False
        else:
            first_ok = True
        if first_ok:
            yield (first_no, obj)
            yield from _jsonl_rest(lines, limit)
            return
        try:
            rest = fh.read(limit - len(first) + 1)
        except _COMPRESSED_ERRORS as exc:
            yield BadLine(first_no, f"the compressed file is cut short or corrupt: {exc}")
            return
        if len(first) + len(rest) > limit:
            yield BadLine(first_no, f"a pretty-printed JSON document larger than the {_mib(limit)} limit; not "
                                    f"read (write the trace as JSON lines, one document per line)")
            return
    text_b = b"\n" * (first_no - 1) + first + rest
    yield from _documents(p, text_b, first_no)


def _jsonl_rest(lines: Iterator[tuple[int, Optional[bytes], int]], limit: int = 0) -> Iterator[Item]:
    loads = _loads
    for line_no, raw, length in lines:
        if isinstance(raw, BrokenLine):
            yield BadLine(line_no, raw.reason)  # type: ignore[attr-defined]
            return
        if raw is None:
            yield BadLine(line_no, too_long(limit or MAX_LINE_BYTES, length))
            continue
        try:
            yield (line_no, loads(raw))
        except PARSE_ERRORS as exc:
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
        except (RecursionError, MemoryError) as exc:
            line_at += text.count("\n", counted_to, pos)
            yield BadLine(line_at, f"invalid JSON document: {_short(exc)}")
            return
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
                            except PARSE_ERRORS as e2:
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
            except PARSE_ERRORS:
                return False
    return False


def _first_error(line: str) -> BaseException:
    try:
        json.loads(line)
    except PARSE_ERRORS as exc:
        return exc
    return ValueError("not a JSON object")


def missing_trace(run_dir: Union[str, os.PathLike[str]]) -> str:
    """Why a run directory has no trace file to read, in words: what is there, what is missing."""
    d = os.fspath(run_dir)
    expected = (TRACE_FILE, "steps.jsonl", "summary.json", "run.json", "scenario.toml")
    present = [n for n in expected if os.path.isfile(os.path.join(d, n))]
    missing = [n for n in expected if n not in present]
    if not present:
        return (f"no {TRACE_FILE} here, and not a run directory either (none of {', '.join(expected)}): "
                f"give the --out directory of `slotscope run`, or an OTLP JSON file")
    why = ""
    try:
        with open(os.path.join(d, "run.json"), "rb") as f:
            run = json.loads(f.read(MAX_LINE_BYTES))
        level = run.get("trace_level") if isinstance(run, dict) else None
        if level == "off":
            why = " (the run was made with --trace-level off)"
    except (OSError, *PARSE_ERRORS):
        pass
    if not why and "summary.json" not in present:
        why = " (the run did not finish: the trace is written at its end)"
    elif not why:
        try:
            with open(os.path.join(d, "summary.json"), "rb") as f:
                summary = json.loads(f.read(MAX_LINE_BYTES))
            if isinstance(summary, dict) and summary.get("incomplete"):
                why = " (summary.json says the run is incomplete)"
        except (OSError, *PARSE_ERRORS):
            pass
    return (f"no {TRACE_FILE} to read{why or ' (the run may have used --trace-level off)'}; missing: "
            f"{', '.join(missing)}; present: {', '.join(present)}")


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
