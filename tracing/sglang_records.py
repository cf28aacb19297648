"""Reading an SGLang server's own records: its request log and its OpenTelemetry request traces.

Request log (``--log-requests``, sglang/srt/utils/request_logger.py, releases 0.5.14 to 0.5.23), one
message per line behind the logger's ``[YYYY-MM-DD HH:MM:SS] `` prefix:

* ``--log-requests-format json``: ``{"timestamp": ISO, "event": "request.received" | "request.finished" |
  ..., "rid": ..., "obj": {...}, "out": {"meta_info": {...}}}``;
* the text format: ``Receive: obj=GenerateReqInput(rid='...', ...)`` and
  ``Finish: obj=GenerateReqInput(...), out={'meta_info': {'prompt_tokens': 12, ...}}``.

A finished request's numbers come from ``out.meta_info``: ``prompt_tokens``, ``completion_tokens``,
``cached_tokens``, ``e2e_latency`` and, with metrics on, ``request_received_ts``. Its arrival is, in this
order: ``request_received_ts``; the ``request.received`` event of the same rid (its timestamp); the
finish's timestamp minus ``e2e_latency``.

Request traces (``--enable-trace``, sglang/srt/observability/trace.py): one trace per request with a root
span ``"[role] Req <rid[:8]>"`` (attributes ``rid``, ``module`` and at the finish ``gen_ai.usage.prompt_tokens``
/ ``completion_tokens`` / ``cached_tokens``), a span per thread (``thread_label``, ``tp_rank``, ...) and
per stage below it (``prefill_forward``, ``decode_loop``, ...), the stages carrying ``schedule`` events
with the batch (``bid``, ``batch_size``, ``forward_mode``). Read through tracing/otlp_read.py, so every
OTLP JSON form ``slotscope analyze`` reads is accepted.

Everything streams: one line (or OTLP document) at a time, at most ``max_line_bytes`` of it; what is
kept is one small tuple per request and per batch. Bad input: a line that cannot be read is a
``TraceFormatError`` with ``FILE:LINE`` (``skip_bad``: counted, the first ones kept); unknown events,
other log lines and unknown spans are skipped and counted; requests that lack a number are listed.
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import re
from array import array
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Optional, Union

from .otlp_read import (MAX_LINE_BYTES, PARSE_ERRORS, BadLine, BrokenLine, TraceFormatError, as_int, attributes,
                        norm_id, open_bytes, read_documents, read_lines, too_long)
from .quantiles import Quantiles

KNOWN_EVENTS = ("request.received", "request.finished")
#: the stage span names of SGLang's request tracing (RequestStage in req_time_stats.py, 0.5.14..0.5.23)
STAGES = frozenset((
    "tokenize", "api_server_dispatch", "dpc_dispatch", "request_process", "prefill_waiting",
    "decode_forward", "decode_loop", "prefill_forward", "chunked_prefill", "mm_encode", "prefill_prepare",
    "prefill_bootstrap", "prefill_transfer_kv_cache", "decode_prepare", "decode_bootstrap",
    "decode_waiting", "decode_transferred", "fake_output", "quick_finish", "spec_draft", "spec_verify",
    "run_batch_cpu",
))
BATCH_EVENT = "schedule"
MAX_KEPT = 20                       # bad lines and lacking requests kept by reason (the rest counted)
MAX_BATCHES = 4_000_000             # batch timeline entries kept (3 x 8 bytes each); the rest counted

PROMPT, COMPLETION, CACHED = "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens", "gen_ai.usage.cached_tokens"

_PREFIX = re.compile(rb"^\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)\] ")
_ROOT_NAME = re.compile(r"^\s*\w*\s*Req \S+$")
_META_NUM = re.compile(r"'(prompt_tokens|completion_tokens|cached_tokens|e2e_latency|request_received_ts)'"
                       r":\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")
_META_ID = re.compile(r"'meta_info':\s*\{'id':\s*'([^']*)'")
_RID = re.compile(r"\brid='([^']*)'")
_EXTRA_KEY = re.compile(r"\bextra_key='([^']*)'")
#: a conversation's id in a request object (GenerateReqInput, 0.5.14..0.5.23): conversation_id, session_id
#: (0.5.23), session_params' id (a dict, or the struct's array form with the id first)
_CONV_TEXT = (re.compile(r"\bconversation_id='([^']+)'"), re.compile(r"\bsession_id='([^']+)'"),
              re.compile(r"\bsession_params=\{'id': '([^']+)'"))


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One finished request as the engine recorded it (times in Unix seconds)."""

    rid: str
    arrival: Optional[float]
    prompt_tokens: Optional[int]
    completion_tokens: Optional[int]
    cached_tokens: Optional[int]
    e2e_latency: Optional[float]
    where: str                       # FILE:LINE of the record
    arrival_from: str = ""           # request_received_ts | received_event | finish_minus_e2e | root_span
    extra_key: Optional[str] = None  # SGLang's cache namespace (requests of different keys never share)
    conversation: Optional[str] = None  # conversation_id, session_id or session_params' id of the request

    def lacking(self) -> list[str]:
        out = []
        if self.prompt_tokens is None or self.prompt_tokens < 1:
            out.append("prompt_tokens")
        if self.completion_tokens is None or self.completion_tokens < 0:
            out.append("completion_tokens")
        if self.arrival is None:
            out.append("arrival time")
        return out


@dataclass
class RecordStats:
    """What reading the records found, besides the requests."""

    files: list[str] = field(default_factory=list)
    lines: int = 0
    events: dict[str, int] = field(default_factory=dict)        # known events / span kinds read
    unknown: dict[str, int] = field(default_factory=dict)       # unknown events / spans, skipped
    other_lines: int = 0                                        # log lines that are no request record
    bad_lines: int = 0
    bad: list[dict[str, Any]] = field(default_factory=list)
    cached_missing: int = 0                                     # finished requests without cached_tokens (0 taken)
    unmatched_received: int = 0                                 # received events never finished

    def count(self, table: dict[str, int], key: str) -> None:
        if key in table or len(table) < 1000:
            table[key] = table.get(key, 0) + 1
        else:
            table["(other)"] = table.get("(other)", 0) + 1

    def to_json(self) -> dict[str, Any]:
        return {"files": self.files, "lines": self.lines, "events": self.events, "unknown": self.unknown,
                "other_lines": self.other_lines, "bad_lines": self.bad_lines, "bad": self.bad,
                "cached_missing": self.cached_missing, "unmatched_received": self.unmatched_received}


@contextlib.contextmanager
def no_gc():
    """The cyclic GC paused while records pile up: they hold no cycles (JSON values, strings, numbers),
    and a full collection walks every record kept so far, which made reading 10x the lines cost 13x the
    time (5.7x without it)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Reader:
    def __init__(self, skip_bad: bool, max_line_bytes: Optional[int]):
        self.skip_bad = skip_bad
        self.limit = max_line_bytes or MAX_LINE_BYTES
        self.stats = RecordStats()

    def bad(self, path: str, line: int, reason: str) -> None:
        if not self.skip_bad:
            raise TraceFormatError(path, line, reason)
        self.stats.bad_lines += 1
        if len(self.stats.bad) < MAX_KEPT:
            self.stats.bad.append({"file": path, "line": line, "reason": reason})


# -- request logs --------------------------------------------------------------------------------
def _iso_seconds(text: str) -> Optional[float]:
    try:
        return datetime.fromisoformat(text.replace(",", ".")).timestamp()
    except (ValueError, TypeError, OverflowError):
        return None


def _num(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _int(v: Any) -> Optional[int]:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def read_request_log(paths: Iterable[Union[str, os.PathLike[str]]], *, skip_bad: bool = False,
                     max_line_bytes: Optional[int] = None) -> tuple[list[EngineRequest], RecordStats]:
    """The finished requests of SGLang request logs (JSON or text format, mixed is fine), in file order."""
    with no_gc():
        return _read_request_log(paths, skip_bad, max_line_bytes)


def _read_request_log(paths, skip_bad, max_line_bytes):
    rd = _Reader(skip_bad, max_line_bytes)
    out: list[EngineRequest] = []
    for p in paths:
        path = os.fspath(p)
        rd.stats.files.append(path)
        received: dict[str, float] = {}
        try:
            with open_bytes(path) as fh:
                for line_no, raw, length in read_lines(fh, 0, rd.limit):
                    if isinstance(raw, BrokenLine):
                        rd.bad(path, line_no, raw.reason)  # type: ignore[attr-defined]
                        break
                    rd.stats.lines += 1
                    if raw is None:
                        rd.bad(path, line_no, too_long(rd.limit, length))
                        continue
                    rec = _log_line(rd, path, line_no, raw, received)
                    if rec is not None:
                        out.append(rec)
        except OSError as exc:
            raise TraceFormatError(path, 0, f"cannot read: {exc.strerror or exc}") from exc
        rd.stats.unmatched_received += len(received)
    return out, rd.stats


def _log_line(rd: _Reader, path: str, line_no: int, raw: bytes,
              received: dict[str, float]) -> Optional[EngineRequest]:
    st = rd.stats
    m = _PREFIX.match(raw)
    prefix_ts = None
    body = raw
    if m:
        prefix_ts = _iso_seconds(m.group(1).decode("ascii"))
        body = raw[m.end():]
    body = body.strip()
    if not body:
        return None
    if body[:1] == b"{":
        try:
            d = json.loads(body)
        except PARSE_ERRORS as exc:
            rd.bad(path, line_no, f"invalid JSON (a truncated or malformed request-log line): {_short(exc)}")
            return None
        if not isinstance(d, dict):
            rd.bad(path, line_no, "a JSON request-log line must be an object")
            return None
        return _json_record(rd, path, line_no, d, prefix_ts, received)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        rd.bad(path, line_no, f"not UTF-8: {_short(exc)}")
        return None
    if text.startswith("Receive: "):
        st.count(st.events, "request.received")
        m2 = _RID.search(text)
        if m2 and prefix_ts is not None:
            received[m2.group(1)] = prefix_ts
        return None
    if text.startswith("Finish: "):
        st.count(st.events, "request.finished")
        cut = text.rfind(", out={")
        if cut < 0 or not text.endswith("}"):
            rd.bad(path, line_no, "a 'Finish:' line without its out={...} (truncated?)")
            return None
        obj_part, out_part = text[:cut], text[cut:]
        nums: dict[str, float] = {}
        for k, v in _META_NUM.findall(out_part):
            nums.setdefault(k, float(v))
        mid = _META_ID.search(out_part)
        mrid = _RID.search(obj_part)
        rid = mid.group(1) if mid else (mrid.group(1) if mrid else f"line{line_no}")
        ek = _EXTRA_KEY.search(obj_part)
        conv = next((m3.group(1) for m3 in (rx.search(obj_part) for rx in _CONV_TEXT) if m3), None)
        return _finished(rd, path, line_no, rid, nums, prefix_ts, received, ek.group(1) if ek else None, conv)
    if text.startswith("Receive OpenAI: "):
        st.count(st.unknown, "request.received.openai")
        return None
    st.other_lines += 1
    return None


def _json_record(rd: _Reader, path: str, line_no: int, d: dict[str, Any], prefix_ts: Optional[float],
                 received: dict[str, float]) -> Optional[EngineRequest]:
    st = rd.stats
    event = d.get("event")
    if not isinstance(event, str):
        st.count(st.unknown, "(no event)")
        return None
    ts = _iso_seconds(d["timestamp"]) if isinstance(d.get("timestamp"), str) else None
    if ts is None:
        ts = prefix_ts
    rid = d.get("rid")
    rid = rid if isinstance(rid, str) else (str(rid) if rid is not None else None)
    if event == "request.received":
        st.count(st.events, event)
        if rid is not None and ts is not None:
            received[rid] = ts
        return None
    if event != "request.finished":
        st.count(st.unknown, event[:200])
        return None
    st.count(st.events, event)
    out = d.get("out")
    meta = out.get("meta_info") if isinstance(out, dict) else None
    if not isinstance(meta, dict):
        meta = {}
    nums = {}
    for k in ("prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency", "request_received_ts"):
        v = _num(meta.get(k))
        if v is not None:
            nums[k] = v
    if rid is None and isinstance(meta.get("id"), str):
        rid = meta["id"]
    obj = d.get("obj")
    extra = obj.get("extra_key") if isinstance(obj, dict) else None
    return _finished(rd, path, line_no, rid or f"line{line_no}", nums, ts, received,
                     extra if isinstance(extra, str) and extra else None, _conversation(obj))


def _conversation(obj: Any) -> Optional[str]:
    """The conversation a logged request object belongs to: conversation_id, session_id or session_params' id."""
    if not isinstance(obj, dict):
        return None
    sp = obj.get("session_params")
    sp_id = sp.get("id") if isinstance(sp, dict) else (sp[0] if isinstance(sp, list) and sp else None)
    for v in (obj.get("conversation_id"), obj.get("session_id"), sp_id):
        if isinstance(v, str) and v:
            return v[:200]
    return None


def _finished(rd: _Reader, path: str, line_no: int, rid: str, nums: dict[str, float], ts: Optional[float],
              received: dict[str, float], extra_key: Optional[str],
              conversation: Optional[str] = None) -> EngineRequest:
    got = received.pop(rid, None)
    e2e = nums.get("e2e_latency")
    if "request_received_ts" in nums:
        arrival, src = nums["request_received_ts"], "request_received_ts"
    elif got is not None:
        arrival, src = got, "received_event"
    elif ts is not None and e2e is not None:
        arrival, src = ts - e2e, "finish_minus_e2e"
    else:
        arrival, src = None, ""
    cached = nums.get("cached_tokens")
    if cached is None:
        rd.stats.cached_missing += 1
    return EngineRequest(
        rid=rid[:200], arrival=arrival,
        prompt_tokens=_int(nums.get("prompt_tokens")), completion_tokens=_int(nums.get("completion_tokens")),
        cached_tokens=_int(cached) if cached is not None else None, e2e_latency=e2e,
        where=f"{path}:{line_no}", arrival_from=src, extra_key=extra_key, conversation=conversation)


def _short(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at column {exc.colno}"
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."


# -- request traces ------------------------------------------------------------------------------
@dataclass
class EngineTrace:
    """What the spans of SGLang's request tracing hold, reduced as they are read."""

    requests: list[EngineRequest] = field(default_factory=list)
    stats: RecordStats = field(default_factory=RecordStats)
    #: stage name -> durations (ns) in a bounded quantile sketch
    stages: dict[str, Quantiles] = field(default_factory=dict)
    #: batch timeline: start (Unix ns), batch size, forward mode (0 prefill, 1 decode, 2 other)
    batch_ts: array = field(default_factory=lambda: array("q"))
    batch_size: array = field(default_factory=lambda: array("q"))
    batch_mode: array = field(default_factory=lambda: array("b"))
    batch_tokens: array = field(default_factory=lambda: array("q"))   # filled by finish(): prefill: new tokens
    batches_dropped: int = 0
    other_events: dict[str, int] = field(default_factory=dict)
    _bids: dict[str, int] = field(default_factory=dict, repr=False)
    _prefill_members: dict[int, list[str]] = field(default_factory=dict, repr=False)
    _new_tokens: dict[str, int] = field(default_factory=dict, repr=False)

    MODES = ("prefill", "decode", "other")

    def finish(self) -> None:
        """Token counts per batch: a decode batch makes one token per request; a prefill batch the
        uncached prompt tokens of its requests (from their root spans, where present)."""
        self.batch_tokens = array("q", (int(s) if m == 1 else 0 for s, m in zip(self.batch_size, self.batch_mode)))
        for idx, traces in self._prefill_members.items():
            self.batch_tokens[idx] = sum(self._new_tokens.get(t, 0) for t in traces)
        self._prefill_members.clear()
        self._new_tokens.clear()
        self._bids.clear()
        order = sorted(range(len(self.batch_ts)), key=self.batch_ts.__getitem__)
        if order != list(range(len(order))):
            for name in ("batch_ts", "batch_size", "batch_mode", "batch_tokens"):
                col = getattr(self, name)
                setattr(self, name, array(col.typecode, (col[i] for i in order)))


def read_engine_trace(paths: Iterable[Union[str, os.PathLike[str]]], *, skip_bad: bool = False,
                      max_line_bytes: Optional[int] = None) -> EngineTrace:
    """SGLang request-trace spans from OTLP JSON files: requests (root spans), stage durations, batches."""
    with no_gc():
        return _read_engine_trace(paths, skip_bad, max_line_bytes)


def _read_engine_trace(paths, skip_bad, max_line_bytes) -> EngineTrace:
    rd = _Reader(skip_bad, max_line_bytes)
    et = EngineTrace(stats=rd.stats)
    for p in paths:
        path = os.fspath(p)
        rd.stats.files.append(path)
        try:
            for item in read_documents(path, max_line_bytes):
                if isinstance(item, BadLine):
                    rd.bad(path, item.line, item.reason)
                    continue
                line, doc = item
                rd.stats.lines += 1
                try:
                    pending = list(_doc_spans(doc))
                except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:
                    rd.bad(path, line, f"not an OTLP trace document: {type(exc).__name__}: {exc}")
                    continue
                for span in pending:
                    _apply_span(et, path, line, span)
        except OSError as exc:
            raise TraceFormatError(path, 0, f"cannot read: {exc.strerror or exc}") from exc
    et.finish()
    return et


def _doc_spans(doc: Any):
    if not isinstance(doc, dict):
        raise TypeError(f"expected a JSON object, got {type(doc).__name__}")
    rs_list = doc.get("resourceSpans")
    if rs_list is None:
        if not doc or "resourceMetrics" in doc or "resourceLogs" in doc:
            return
        raise KeyError("resourceSpans")
    for rs in rs_list:
        scopes = rs.get("scopeSpans")
        if scopes is None:
            scopes = rs.get("instrumentationLibrarySpans") or []
        for ss in scopes:
            for span in ss.get("spans") or []:
                if not isinstance(span, dict):
                    raise TypeError("a span is not an object")
                name = span.get("name", "")
                if not isinstance(name, str):
                    raise TypeError("span name is not a string")
                yield (name, as_int(span.get("startTimeUnixNano")), as_int(span.get("endTimeUnixNano")),
                       norm_id(span.get("traceId"), 16), span.get("attributes"), span.get("events"))


def _apply_span(et: EngineTrace, path: str, line: int, span) -> None:
    name, t0, t1, trace_id, raw_attrs, events = span
    st = et.stats
    a = attributes(raw_attrs)
    if PROMPT in a or ("rid" in a and str(a.get("module", "")).startswith("sglang::")) or _ROOT_NAME.match(name):
        st.count(st.events, "request span")
        prompt, completion, cached = _int(a.get(PROMPT)), _int(a.get(COMPLETION)), _int(a.get(CACHED))
        rid = str(a.get("rid") or a.get("gen_ai.request.id") or name.strip())[:200]
        if cached is None:
            st.cached_missing += 1
        et.requests.append(EngineRequest(
            rid=rid, arrival=t0 / 1e9 if t0 else None, prompt_tokens=prompt, completion_tokens=completion,
            cached_tokens=cached, e2e_latency=(t1 - t0) / 1e9 if t1 > t0 > 0 else None,
            where=f"{path}:{line}", arrival_from="root_span"))
        if prompt is not None:
            et._new_tokens[trace_id] = max(0, prompt - (cached or 0))
        return
    if "thread_label" in a or "(host:" in name:
        st.count(st.events, "thread span")
        return
    if name not in STAGES:
        st.count(st.unknown, name[:200] or "(no name)")
        return
    st.count(st.events, "stage span")
    q = et.stages.get(name)
    if q is None:
        q = et.stages[name] = Quantiles()
    q.add(max(0, t1 - t0))
    for ev in events or ():
        ename = ev.get("name", "") if isinstance(ev, dict) else ""
        if ename != BATCH_EVENT:
            et.other_events[str(ename)[:200]] = et.other_events.get(str(ename)[:200], 0) + 1
            continue
        ea = attributes(ev.get("attributes"))
        bid = str(ea.get("bid", ""))
        ts = as_int(ev.get("timeUnixNano"))
        idx = et._bids.get(bid) if bid else None
        if idx is None:
            if len(et.batch_ts) >= MAX_BATCHES:
                et.batches_dropped += 1
                continue
            mode = str(ea.get("forward_mode", ""))
            idx = len(et.batch_ts)
            et.batch_ts.append(ts)
            et.batch_size.append(_int(ea.get("batch_size")) or 0)
            et.batch_mode.append(0 if mode == "prefill" else 1 if mode == "decode" else 2)
            if bid:
                et._bids[bid] = idx
        if et.batch_mode[idx] == 0:
            et._prefill_members.setdefault(idx, []).append(trace_id)
