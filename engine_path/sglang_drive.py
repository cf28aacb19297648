"""Drive a real SGLang release's request logger and request tracing on a CPU, to make test fixtures.

Run under a release with ``engine_path.isolate.call("sglang==0.5.23", "slotscope.sglang_fixtures:drive", OUT_DIR)``
(scripts/make-sglang-fixtures does it for each release it is given): slotscope/sglang_fixtures.py hands
``drive`` tracing's OTLP JSON lines file exporter, as engine_path imports nothing of tracing/ (and every
``import sglang`` of slotscope lives in engine_path/, docs/ARCHITECTURE.md). Nothing of SGLang is copied: the
release's own ``RequestLogger`` (sglang/srt/utils/request_logger.py) writes the JSON and the text request
logs, and its own ``APIServerReqTimeStats`` / ``SchedulerReqTimeStats`` / ``set_schedule_time_batch``
(sglang/srt/observability/req_time_stats.py) drive its ``TraceReqContext`` (observability/trace.py),
which makes the spans; ``process_tracing_init`` sets up its OpenTelemetry provider with its
``BatchSpanProcessor``. What stands in for a server:

* the requests: a small fixed workload (prompt, output and cached-prefix lengths) pushed through a toy
  continuous-batching schedule on a simulated clock (prefill batches of the waiting requests, then
  decode batches); the release's ``GenerateReqInput`` as the logged request object, an ``out`` dict with
  ``meta_info`` as the tokenizer manager fills it (id, finish_reason, prompt/completion/cached tokens,
  e2e_latency, and the metrics' request_received_ts / request_finished_ts);
* the clocks: the module globals ``time`` of req_time_stats.py and ``datetime`` of log_utils.py, and the
  log records' ``created`` time, read the simulated clock, so timestamps, latencies and batch times are
  those of the schedule (deterministic apart from the start time and ids);
* the exporter: the gRPC OTLP exporter SGLang asks for is served by the caller's file exporter
  (``file_exporter(path)``: tracing/otlp_json.py's, the Collector's file-exporter format), so the spans
  land in a file;
* a Scheduler thread (``trace_set_thread_info("Scheduler", tp_rank=0)``) next to the main thread
  ("TokenizerManager"), and the time stats crossing between them by pickling, as between processes.
"""
from __future__ import annotations

import json
import logging
import os
import pickle
import sys
import threading
import types
from pathlib import Path
from typing import Any, Callable

#: the fixture workload: (prompt_tokens, completion_tokens, cached_tokens, arrival ms)
WORKLOAD = (
    (40, 6, 0, 0.0), (52, 4, 32, 3.0), (36, 8, 32, 4.0), (64, 5, 0, 30.0),
    (44, 3, 32, 31.0), (30, 7, 0, 55.0),
)
T0 = 1_780_000_000.0          # the simulated clock's start (Unix seconds)


class _Clock:
    """A simulated clock, read through ``time.perf_counter`` / ``time.time`` of the patched modules."""

    def __init__(self) -> None:
        self.now = 0.0                              # seconds since T0

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        return T0 + self.now

    def time_ns(self) -> int:
        return int((T0 + self.now) * 1e9)


def _schedule(workload) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A toy continuous batching on simulated time: per request its stage times, and the batches."""
    reqs = [{"i": i, "prompt": p, "output": o, "cached": c, "arrive": a / 1e3, "decoded": 0}
            for i, (p, o, c, a) in enumerate(workload)]
    pending = sorted(reqs, key=lambda r: r["arrive"])
    waiting: list[dict[str, Any]] = []
    running: list[dict[str, Any]] = []
    batches = []
    t = 0.0
    while pending or waiting or running:
        while pending and pending[0]["arrive"] <= t:
            r = pending.pop(0)
            r["recv"] = r["arrive"] + 0.0004
            r["queued"] = r["arrive"] + 0.0006
            waiting.append(r)
        if waiting:
            batch = waiting
            waiting = []
            t = max(t, max(r["queued"] for r in batch))
            dur = 0.002 + 1e-5 * sum(r["prompt"] - r["cached"] for r in batch)
            batches.append({"mode": "prefill", "start": t, "reqs": batch, "dur": dur})
            for r in batch:
                r["forward"] = t
                r["prefilled"] = t + dur
            running.extend(batch)
        elif running:
            dur = 0.004 + 0.0002 * len(running)
            batches.append({"mode": "decode", "start": t, "reqs": list(running), "dur": dur})
            for r in running:
                r["decoded"] += 1
                r.setdefault("decode_ends", []).append(t + dur)
            done = [r for r in running if r["decoded"] >= r["output"] - 1]
            for r in done:
                r["finish"] = t + dur + 0.0003
            running = [r for r in running if r not in done]
        else:
            t = pending[0]["arrive"]
            continue
        t += batches[-1]["dur"]
    return reqs, batches


def drive(out_dir: str, file_exporter: Callable[[Path], Any]) -> dict[str, Any]:
    """Write ``requests.json.log``, ``requests.text.log`` and ``trace.otlp.jsonl`` into ``out_dir``
    with the active release's logger and tracing; returns what was written. ``file_exporter(path)``
    makes the OpenTelemetry span exporter that writes OTLP JSON lines to ``path``."""
    import sglang

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    version = getattr(sglang, "__version__", "?")
    reqs, batches = _schedule(WORKLOAD)
    clock = _Clock()
    logs = _drive_logs(out, reqs, clock)
    spans = _drive_trace(out, reqs, batches, clock, file_exporter)
    return {"version": version, "requests": len(reqs), "batches": len(batches), "logs": logs, "spans": spans}


# -- request logs -------------------------------------------------------------------------------
def _drive_logs(out: Path, reqs, clock: _Clock) -> dict[str, Any]:
    """``requests.{json,text}.log`` by the release's RequestLogger, one format after the other; returns the
    lines of each."""
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.utils import log_utils, request_logger

    sim_created = _logging_on(log_utils, clock)
    written = {}
    for fmt in ("json", "text"):
        target = out / f".{fmt}"
        rl = request_logger.RequestLogger(log_requests=True, log_requests_level=1, log_requests_format=fmt,
                                          log_requests_target=[str(target)])
        for lg in rl.targets:
            lg.addFilter(sim_created)
        _log_requests(rl, GenerateReqInput, reqs, clock)
        written[fmt] = _gather_log(rl, target, out / f"requests.{fmt}.log")
    return written


def _logging_on(log_utils, clock: _Clock) -> Callable[[logging.LogRecord], bool]:
    """The release's log times on the simulated clock: log_json's ``datetime.now()`` (of ``log_utils``), and
    a filter that sets each record's ``created`` (the "[asctime]" prefix)."""
    class _SimDatetime:                      # log_json's datetime.now(), on the simulated clock
        @staticmethod
        def now():
            import datetime as _dt

            return _dt.datetime.fromtimestamp(clock.time())

    log_utils.datetime = _SimDatetime

    def _sim_created(record: logging.LogRecord) -> bool:      # the "[asctime]" prefix
        record.created = clock.time()
        record.msecs = (record.created % 1) * 1000
        return True

    return _sim_created


def _log_requests(rl, GenerateReqInput, reqs, clock: _Clock) -> None:
    """Each request's arrival and finish, in time order, through the logger's own entry points."""
    events = []
    for r in reqs:
        events.append((r["arrive"], 0, r))
        events.append((r["finish"], 1, r))
    for ts, kind, r in sorted(events, key=lambda e: (e[0], e[1])):
        clock.now = ts
        obj = GenerateReqInput(text="x" * 8, sampling_params={"max_new_tokens": r["output"], "temperature": 0},
                               rid=f"req-{r['i']:04d}")
        if kind == 0:
            rl.log_received_request(obj)
        else:
            meta = {"id": obj.rid, "finish_reason": {"type": "length", "length": r["output"]},
                    "prompt_tokens": r["prompt"], "weight_version": "default", "num_retractions": 0,
                    "reasoning_tokens": 0, "completion_tokens": r["output"], "cached_tokens": r["cached"],
                    "e2e_latency": r["finish"] - r["arrive"],
                    "request_received_ts": T0 + r["arrive"], "request_finished_ts": T0 + r["finish"],
                    "queue_time": r["forward"] - r["queued"]}
            rl.log_finished_request(obj, {"text": "y" * r["output"], "output_ids": list(range(r["output"])),
                                          "meta_info": meta})


def _gather_log(rl, target: Path, dst: Path) -> int:
    """The logger's files under ``target`` flushed, joined into ``dst`` and removed; returns dst's lines."""
    for lg in rl.targets:
        for h in lg.handlers:
            h.flush()
    files = sorted(target.glob("*.log*"))
    with open(dst, "w", encoding="utf-8") as f:
        for src in files:
            f.write(src.read_text(encoding="utf-8"))
    for lg in rl.targets:
        for h in list(lg.handlers):
            h.close()
            lg.removeHandler(h)
    for src in files:
        src.unlink()
    target.rmdir()
    return sum(1 for _ in open(dst, encoding="utf-8"))


# -- request traces -----------------------------------------------------------------------------
def _drive_trace(out: Path, reqs, batches, clock: _Clock, file_exporter: Callable[[Path], Any]) -> int:
    """``trace.otlp.jsonl``: the requests' time stats on both sides of the release's tracing (the tokenizer
    here, the scheduler in a thread of its own); returns the spans written."""
    path = out / "trace.otlp.jsonl"
    _serve_exporter(path, file_exporter)
    rel = _tracing_on(clock)
    rel.trace.trace_set_thread_info("TokenizerManager")
    api = _tokenizer_receives(reqs, clock, rel.rts)
    wire = {i: pickle.dumps(st) for i, st in api.items()}
    th = threading.Thread(target=_scheduler, args=(reqs, batches, clock, wire, rel), name="scheduler")
    th.start()
    th.join()
    _tokenizer_finishes(reqs, clock, api, rel.SpanAttributes)
    from opentelemetry import trace as otel_trace

    provider = otel_trace.get_tracer_provider()
    provider.force_flush()
    provider.shutdown()
    return _count_spans(path)


def _serve_exporter(path: Path, file_exporter: Callable[[Path], Any]) -> None:
    """The gRPC OTLP exporter SGLang asks for, served by the caller's file exporter writing ``path``."""
    def _FileExporter(endpoint=None, insecure=None, **_kw):     # stands in for the Collector behind SGLang's exporter
        return file_exporter(path)

    name = "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"
    if name not in sys.modules:
        try:
            __import__(name)
        except ImportError:
            for part in ("opentelemetry.exporter.otlp.proto.grpc",):
                sys.modules.setdefault(part, types.ModuleType(part))
            mod = types.ModuleType(name)
            sys.modules[name] = mod
    sys.modules[name].OTLPSpanExporter = _FileExporter
    os.environ.pop("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", None)    # SGLang's default: grpc


def _tracing_on(clock: _Clock) -> types.SimpleNamespace:
    """The release's tracing set up (its provider and exporter) and its time stats on the simulated clock;
    returns the release's pieces the drive uses: ``trace`` and ``rts`` (its trace and req_time_stats
    modules), ``ForwardMode``, ``SpanAttributes``."""
    import sglang.srt.observability.trace as trace_mod
    if not trace_mod.opentelemetry_imported:
        import importlib

        trace_mod = importlib.reload(trace_mod)
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.observability import req_time_stats as rts
    from sglang.srt.observability.trace import SpanAttributes

    # every tracer of the release reads this module's `tracer`; reload only if it came up without OTel
    trace_mod.process_tracing_init("localhost:4317", "sglang")
    rts.time = clock                                # the stats' perf_counter() on the simulated clock
    rts.global_diff_realtime_monotonic = T0
    rts.calibrate_time_diff = lambda: None
    trace_mod.get_cur_time_ns = clock.time_ns
    return types.SimpleNamespace(trace=trace_mod, rts=rts, ForwardMode=ForwardMode, SpanAttributes=SpanAttributes)


def _tokenizer_receives(reqs, clock: _Clock, rts) -> dict[int, Any]:
    """The tokenizer side of each arrival (main thread): its APIServerReqTimeStats, by request."""
    api = {}
    for r in reqs:
        clock.now = r["arrive"]
        st = rts.APIServerReqTimeStats()
        st.init_trace_ctx(f"req-{r['i']:04d}", None)
        st.set_created_time(r["arrive"])
        st.set_tokenize_finish_time(r["arrive"] + 0.0001)
        st.set_api_server_dispatch_time(r["arrive"] + 0.0001)
        st.set_api_server_dispatch_finish_time(r["arrive"] + 0.0003)
        api[r["i"]] = st
    return api


def _scheduler(reqs, batches, clock: _Clock, wire: dict[int, bytes], rel: types.SimpleNamespace) -> None:
    """The scheduler side, in its own thread: the stats it receives (unpickled, as between processes), the
    batches scheduled, each request's prefill, decodes and completion."""
    rts, ForwardMode = rel.rts, rel.ForwardMode
    rel.trace.trace_set_thread_info("Scheduler", tp_rank=0, dp_rank=0)
    stats = {}
    for r in reqs:
        clock.now = r["recv"]
        st = rts.SchedulerReqTimeStats.new_from_obj(pickle.loads(wire[r["i"]]))
        st.set_scheduler_recv_time(r["recv"])
        st.set_wait_queue_entry_time(r["queued"])
        stats[r["i"]] = st
    for b in batches:
        clock.now = b["start"]
        mode = ForwardMode.EXTEND if b["mode"] == "prefill" else ForwardMode.DECODE
        items = [types.SimpleNamespace(time_stats=stats[r["i"]]) for r in b["reqs"]]
        rts.set_schedule_time_batch(types.SimpleNamespace(reqs=items, forward_mode=mode))
        end = b["start"] + b["dur"]
        for r in b["reqs"]:
            st = stats[r["i"]]
            if b["mode"] == "prefill":
                st.set_forward_entry_time(b["start"])
                st.set_prefill_finished_time(end)
            else:
                st.set_last_decode_finish_time(end)
                if r.get("finish") is not None and r["decode_ends"][-1] == end and r["decoded"] >= r["output"] - 1:
                    st.set_completion_time(r["finish"])


def _tokenizer_finishes(reqs, clock: _Clock, api: dict[int, Any], SpanAttributes) -> None:
    """The finish of each request, tokenizer side: the root span's usage attributes, then its end."""
    for r in reqs:
        clock.now = r["finish"]
        st = api[r["i"]]
        st.trace_ctx.trace_set_root_attrs({
            SpanAttributes.GEN_AI_USAGE_PROMPT_TOKENS: r["prompt"],
            SpanAttributes.GEN_AI_USAGE_COMPLETION_TOKENS: r["output"],
            SpanAttributes.GEN_AI_USAGE_CACHED_TOKENS: r["cached"],
            SpanAttributes.GEN_AI_REQUEST_ID: f"req-{r['i']:04d}",
        })
        st.set_finished_time(r["finish"])


def _count_spans(path: Path) -> int:
    n = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            for rs in doc.get("resourceSpans", ()):
                for ss in rs.get("scopeSpans", ()):
                    n += len(ss.get("spans", ()))
    return n
