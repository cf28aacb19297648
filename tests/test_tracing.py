"""Recorder, spans, levels, loss detection, OTLP JSON file and live export."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from simulator.core.observe import NullObserver
from simulator.records import Finding, LayerInfo, RunInfo, StepRecord
from tracing import attributes as A
from tracing import synthetic as S
from tracing.levels import LEVELS, parse_level
from tracing.live import otlp_http_exporter, traces_url
from tracing.processor import SpanLossError
from tracing.recorder import BoundaryRecorder, agrees
from tracing.session import TraceSession

LAYERS = (LayerInfo(0, "full", 0), LayerInfo(1, "swa", 0), LayerInfo(2, "swa", 1))
RUN = RunInfo(scenario="B1", scenario_path="scenarios/b1.toml", scenario_hash="abc123",
              design="prefix", seed=7, backends=("flashinfer", "triton"), layers=LAYERS,
              device="cpu", version="0.1.0", extra={"window": 128, "nested": {"x": 1}})
T0 = 1_700_000_000_000_000_000          # epoch nanoseconds
ERR = "RuntimeError: Size mismatch: expected 5 but got 8"


def small_run(observer: Any) -> None:
    """Two steps; step 1 is B1 on flashinfer (swa_loc longer, error on layer 1)."""
    observer.on_run_start(RUN)
    t = T0
    for step in (0, 1):
        for b in RUN.backends:
            for li in LAYERS:
                swa = 8 if (step == 1 and b == "flashinfer") else 5
                err = ERR if (step == 1 and b == "flashinfer" and li.layer == 1) else None
                observer.on_boundary(step, b, li.layer, 5, swa, "torch.int64", "torch.int32",
                                     t, t + 100, err)
                t += 200
            if step == 1 and b == "flashinfer":
                observer.on_findings([Finding(1, b, 1, "swa", "length_mismatch", -1, None, None, ERR)])
            elif step == 0 and b == "triton":
                observer.on_findings([Finding(0, b, 2, "swa", "clobbered", 9, None, None),
                                      Finding(0, b, 2, "swa", "clobbered", 10, None, None),
                                      Finding(0, b, 2, "swa", "missed", 11, None, None)])
            else:
                observer.on_findings([])
        observer.on_step(StepRecord(step, "extend", "piecewise", 2, 5, 8, 16, 10, 10, 100, 80,
                                    t_start_ns=T0 + step * 1200, t_end_ns=t))
    observer.on_run_end()


def session_spans(level: str, tmp_path, drive=small_run, **kw) -> tuple[list[ReadableSpan], dict]:
    mem = InMemorySpanExporter()
    s = TraceSession(tmp_path, level, exporters=[mem], **kw)
    drive(s.observer)
    figures = s.finish()
    return list(mem.get_finished_spans()), figures


def by_name(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


# -- recorder ---------------------------------------------------------------------------------------
def test_recorder_buffers_columns_and_interns_strings():
    rec = BoundaryRecorder()
    small_run(rec)
    assert len(rec) == 12
    b = rec.boundary(7)   # step 1, flashinfer, layer 1
    assert (b.step, b.backend, b.layer, b.kind) == (1, "flashinfer", 1, "swa")
    assert (b.loc_len, b.swa_loc_len, b.loc_dtype, b.swa_loc_dtype) == (5, 8, "torch.int64", "torch.int32")
    assert b.error == ERR and not b.agrees
    assert rec.boundary(6).agrees        # a full layer agrees whatever swa_loc says
    assert sorted(rec.names) == sorted({"flashinfer", "triton", "torch.int64", "torch.int32"})
    assert rec.errors == {7: ERR}
    tri = rec.intern("triton")
    vec = rec.findings[(0, tri, 2)]
    assert vec[0] == 1 and vec[1] == 2 and sum(vec) == 3   # missed 1, clobbered 2
    assert rec.findings_total == 4
    assert [(s, rec.names[b]) for s, b, _ in rec.groups()] == [
        (0, "flashinfer"), (0, "triton"), (1, "flashinfer"), (1, "triton")]


def test_agreement_rule():
    assert agrees("full", 5, 9)
    assert agrees("swa", 5, -1)
    assert agrees("swa", 5, 5)
    assert not agrees("swa", 5, 9) and not agrees("swa", 5, 3)


def test_recorder_rejects_unknown_finding_class():
    rec = BoundaryRecorder()
    rec.on_run_start(RUN)
    with pytest.raises(ValueError, match="bogus"):
        rec.on_findings([Finding(0, "triton", 1, "swa", "bogus", 1, None, None)])


def test_recorder_groups_interleaved_backends():
    rec = BoundaryRecorder()
    rec.on_run_start(RUN)
    for layer in (0, 1):
        for b in RUN.backends:
            rec.on_boundary(0, b, layer, 4, 4, "i64", "i64", 1, 2, None)
    groups = rec.groups()
    assert [(s, rec.names[b], [r for rg in ranges for r in rg]) for s, b, ranges in groups] == [
        (0, "flashinfer", [0, 2]), (0, "triton", [1, 3])]


def test_monotonic_timestamps_are_moved_to_the_epoch():
    rec = BoundaryRecorder()
    rec.on_run_start(RUN)
    now_mono = time.perf_counter_ns()
    assert abs(rec.wall_ns(now_mono) - time.time_ns()) < 50_000_000
    assert rec.wall_ns(T0) == T0


def test_on_boundary_only_appends_to_buffers():
    """The hot path stays cheap by construction: it touches no OpenTelemetry object and keeps no per-call
    Python objects (its cost is measured by bench/trace_overhead.py, not asserted here)."""
    import tracemalloc

    rec = BoundaryRecorder()
    rec.on_run_start(RUN)
    f = rec.on_boundary
    for i in range(1000):   # warm the buffers and interned strings
        f(i >> 6, "flashinfer", i & 63, 1000, 1000, "torch.int64", "torch.int64", i, i + 5, None)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    n = 20_000
    for i in range(n):
        f(i >> 6, "flashinfer", i & 63, 1000, 1000, "torch.int64", "torch.int64", i, i + 5, None)
    grown = sum(st.size_diff for st in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    assert len(rec) == 1000 + n
    assert grown / n < 100      # bytes per crossing: plain column buffers, not objects
    assert "opentelemetry" not in type(rec).on_boundary.__code__.co_names


# -- spans and levels ---------------------------------------------------------------------------------
def test_level_names():
    assert set(LEVELS) == {"off", "step", "boundary", "anomaly"}
    assert parse_level("Anomaly") == "anomaly"
    with pytest.raises(ValueError, match="off, step, boundary, anomaly"):
        parse_level("verbose")


@pytest.mark.parametrize("level,expected", [
    # run + 2 steps + 4 (step, backend) spans, then boundary spans per level
    ("step", 7),
    ("boundary", 7 + 12),
    # step 1 flashinfer: layers 1 and 2 disagree (layer 0 is full); step 0 triton layer 2 has findings
    ("anomaly", 7 + 3),
])
def test_span_counts_per_level(tmp_path, level, expected):
    spans, figures = session_spans(level, tmp_path)
    assert len(spans) == expected == figures["spans"]
    assert figures["level"] == level and figures["boundaries_recorded"] == 12
    assert figures["exported"]["InMemorySpanExporter"] == expected
    assert len(by_name(spans, A.SPAN_RUN)) == 1
    assert len(by_name(spans, A.SPAN_STEP)) == 2
    assert len(by_name(spans, A.SPAN_BACKEND)) == 4


@pytest.mark.parametrize("level", ["step", "boundary", "anomaly"])
def test_span_counts_on_a_synthetic_run(tmp_path, level):
    run = S.run_info(n_layers=12)
    box: dict[str, Any] = {}

    def drive(obs):
        box["exp"] = S.drive(obs, run, 40, seed=3)

    spans, figures = session_spans(level, tmp_path, drive=drive, batch_size=64)
    exp = box["exp"]
    base = 1 + exp.steps + exp.backend_steps
    extra = {"step": 0, "boundary": exp.boundaries, "anomaly": exp.anomalous}[level]
    assert len(spans) == figures["spans"] == base + extra
    assert figures["lines"] == -(-figures["spans"] // 64)


def test_hierarchy_one_trace_and_recorded_times(tmp_path):
    spans, _ = session_spans("boundary", tmp_path)
    ids = {s.context.span_id: s for s in spans}
    assert len({s.context.trace_id for s in spans}) == 1
    run = by_name(spans, A.SPAN_RUN)[0]
    assert run.parent is None
    parent_name = {A.SPAN_STEP: A.SPAN_RUN, A.SPAN_BACKEND: A.SPAN_STEP, A.SPAN_BOUNDARY: A.SPAN_BACKEND}
    for s in spans:
        if s.name != A.SPAN_RUN:
            assert ids[s.parent.span_id].name == parent_name[s.name]
    for s in spans:                          # children inside their parents
        if s.parent is not None:
            p = ids[s.parent.span_id]
            assert p.start_time <= s.start_time and s.end_time <= p.end_time
    first = min(by_name(spans, A.SPAN_BOUNDARY), key=lambda s: s.start_time)
    assert first.start_time == T0 and first.end_time == T0 + 100
    assert run.start_time == T0


def test_resource_and_attributes(tmp_path):
    spans, _ = session_spans("boundary", tmp_path)
    res = spans[0].resource.attributes
    assert res["service.name"] == "slotscope" and res["service.version"] == "0.1.0"
    assert res[A.SCENARIO] == "B1" and res[A.DESIGN] == "prefix" and res[A.SEED] == 7
    run = by_name(spans, A.SPAN_RUN)[0].attributes
    assert run[A.EXTRA_PREFIX + "window"] == 128 and A.EXTRA_PREFIX + "nested" not in run
    assert run[A.NUM_BOUNDARIES] == 12 and run[A.LEVEL] == "boundary"
    step = by_name(spans, A.SPAN_STEP)[1].attributes
    assert (step[A.STEP], step[A.MODE], step[A.GRAPH], step[A.REAL_TOKENS], step[A.PADDED_TOKENS],
            step[A.DP_PADDED_TOKENS]) == (1, "extend", "piecewise", 5, 16, 8)
    assert step[A.MISMATCH_COUNT] == 2 and step[A.FINDINGS] == 1

    fi1 = [s for s in by_name(spans, A.SPAN_BACKEND)
           if s.attributes[A.STEP] == 1 and s.attributes[A.BACKEND] == "flashinfer"][0].attributes
    assert tuple(fi1[A.LAYER_IDS]) == (0, 1, 2)
    assert tuple(fi1[A.LAYER_KINDS]) == ("full", "swa", "swa")
    assert tuple(fi1[A.LOC_LENS]) == (5, 5, 5) and tuple(fi1[A.SWA_LOC_LENS]) == (8, 8, 8)
    assert fi1[A.MISMATCH] is True and tuple(fi1[A.MISMATCH_LAYERS]) == (1, 2)
    assert fi1[A.FINDINGS] == 1 and fi1[A.FINDINGS_PREFIX + "length_mismatch"] == 1
    assert A.FINDINGS_PREFIX + "missed" not in fi1           # only non-zero classes
    assert fi1[A.MODE] == "extend" and fi1[A.GRAPH] == "piecewise"

    tri0 = [s for s in by_name(spans, A.SPAN_BOUNDARY) if s.attributes[A.STEP] == 0
            and s.attributes[A.BACKEND] == "triton" and s.attributes[A.LAYER] == 2][0].attributes
    assert tri0[A.FINDINGS] == 3 and tri0[A.FINDINGS_PREFIX + "clobbered"] == 2
    assert tri0[A.FINDINGS_PREFIX + "missed"] == 1 and tri0[A.MISMATCH] is False

    b = [s for s in by_name(spans, A.SPAN_BOUNDARY) if s.attributes[A.STEP] == 1
         and s.attributes[A.BACKEND] == "flashinfer" and s.attributes[A.LAYER] == 2][0].attributes
    assert tuple(b[A.LOC_SHAPE]) == (5,) and tuple(b[A.SWA_LOC_SHAPE]) == (8,)
    assert b[A.LOC_DTYPE] == "torch.int64" and b[A.SWA_LOC_DTYPE] == "torch.int32"
    assert b[A.LAYER_KIND] == "swa" and b[A.MISMATCH] is True
    assert b[A.MISMATCH_DIRECTION] == "longer"
    for s in spans:
        assert all(k.startswith(A.NS) for k in s.attributes)


def test_error_boundary_has_status_and_exception_event(tmp_path):
    spans, _ = session_spans("anomaly", tmp_path)
    errs = [s for s in spans if s.status.status_code is StatusCode.ERROR]
    bnd = [s for s in errs if s.name == A.SPAN_BOUNDARY]
    assert len(bnd) == 1
    span = bnd[0]
    assert span.status.description == ERR and span.attributes[A.ERROR] is True
    (ev,) = span.events
    assert ev.name == "exception"
    assert ev.attributes["exception.type"] == "RuntimeError"
    assert ev.attributes["exception.message"] == "Size mismatch: expected 5 but got 8"
    assert ev.timestamp == span.end_time
    be = [s for s in errs if s.name == A.SPAN_BACKEND]
    assert len(be) == 1 and "layer 1" in be[0].status.description


def test_step_level_keeps_kernel_messages_on_backend_span(tmp_path):
    spans, _ = session_spans("step", tmp_path)
    (be,) = [s for s in spans if s.status.status_code is StatusCode.ERROR]
    assert be.name == A.SPAN_BACKEND and be.attributes[A.ERROR_LAYERS] == (1,)
    (ev,) = be.events
    assert ev.attributes["exception.message"] == "Size mismatch: expected 5 but got 8"
    assert ev.attributes[A.LAYER] == 1


def test_level_off_records_nothing(tmp_path):
    s = TraceSession(tmp_path, "off")
    assert isinstance(s.observer, NullObserver)
    small_run(s.observer)
    assert s.finish(RUN) == {"spans": 0, "boundaries_recorded": 0, "level": "off", "file": None}
    assert not (tmp_path / "trace.otlp.jsonl").exists()


def test_finish_needs_run_info(tmp_path):
    s = TraceSession(tmp_path, "step")
    with pytest.raises(ValueError, match="RunInfo"):
        s.finish()


def test_finish_accepts_run_info_without_on_run_start(tmp_path):
    s = TraceSession(tmp_path, "step", write_file=False, exporters=[InMemorySpanExporter()])
    s.observer.on_boundary(0, "triton", 1, 3, 3, "i64", "i64", T0, T0 + 5, None)
    assert s.finish(RUN)["spans"] == 3


# -- loss detection -----------------------------------------------------------------------------------
class FlakyExporter(SpanExporter):
    """Fails every second batch, as a collector under pressure would."""

    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        return SpanExportResult.FAILURE if self.calls % 2 == 0 else SpanExportResult.SUCCESS


class LiarExporter(SpanExporter):
    """Claims success but keeps only half of each batch."""

    def __init__(self) -> None:
        self.spans_written = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans_written += len(spans) // 2
        return SpanExportResult.SUCCESS


class CrashingExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise ConnectionError("collector went away")


@pytest.mark.parametrize("exporter,match", [
    (FlakyExporter(), "FlakyExporter: exported"),
    (LiarExporter(), "LiarExporter: wrote"),
    (CrashingExporter(), "collector went away"),
])
def test_lossy_exporter_makes_finish_raise(tmp_path, exporter, match):
    s = TraceSession(tmp_path, "boundary", exporters=[exporter], batch_size=4)
    small_run(s.observer)
    with pytest.raises(SpanLossError, match=match):
        s.finish()
    # the file exporter still got everything, and the file is closed and complete
    lines = (tmp_path / "trace.otlp.jsonl").read_text().splitlines()
    assert sum(len(json.loads(l)["resourceSpans"][0]["scopeSpans"][0]["spans"]) for l in lines) == 19


def test_disabled_sdk_is_a_loss(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    s = TraceSession(tmp_path, "step", write_file=False, exporters=[InMemorySpanExporter()])
    small_run(s.observer)
    with pytest.raises(SpanLossError):
        s.finish()


def test_env_span_limits_do_not_truncate(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_ATTRIBUTE_COUNT_LIMIT", "3")
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "3")
    spans, fig = session_spans("step", tmp_path)
    assert fig["spans"] == 7 and len(by_name(spans, A.SPAN_BACKEND)[0].attributes) > 10


def test_finish_twice_is_an_error(tmp_path):
    s = TraceSession(tmp_path, "step", write_file=False, exporters=[InMemorySpanExporter()])
    small_run(s.observer)
    s.finish()
    with pytest.raises(RuntimeError, match="twice"):
        s.finish()


# -- the OTLP JSON lines file -------------------------------------------------------------------------
def test_otlp_json_lines_file_format(tmp_path):
    s = TraceSession(tmp_path, "boundary", batch_size=5)
    small_run(s.observer)
    fig = s.finish()
    lines = (tmp_path / "trace.otlp.jsonl").read_text().splitlines()
    assert len(lines) == fig["lines"] == 4         # 19 spans in batches of 5
    total = 0
    for line in lines:
        doc = json.loads(line)
        (rs,) = doc["resourceSpans"]
        res = {kv["key"]: kv["value"] for kv in rs["resource"]["attributes"]}
        assert res["service.name"] == {"stringValue": "slotscope"}
        assert res[A.SEED] == {"intValue": "7"}
        assert res[A.BACKENDS] == {"arrayValue": {"values": [{"stringValue": "flashinfer"},
                                                             {"stringValue": "triton"}]}}
        (ss,) = rs["scopeSpans"]
        assert ss["scope"]["name"] == "slotscope.tracing" and ss["scope"]["version"]
        for sp in ss["spans"]:
            total += 1
            assert len(sp["traceId"]) == 32 and sp["traceId"] == sp["traceId"].lower()
            int(sp["traceId"], 16)
            assert len(sp["spanId"]) == 16
            assert sp["kind"] == 1
            assert isinstance(sp["startTimeUnixNano"], str) and isinstance(sp["endTimeUnixNano"], str)
            if sp["name"] != A.SPAN_RUN:
                assert len(sp["parentSpanId"]) == 16
            else:
                assert "parentSpanId" not in sp
            attrs = {kv["key"]: kv["value"] for kv in sp["attributes"]}
            assert attrs[A.STEP]["intValue"].isdigit() if A.STEP in attrs else True
            if sp["name"] == A.SPAN_BOUNDARY:
                assert attrs[A.LOC_SHAPE] == {"arrayValue": {"values": [{"intValue": "5"}]}}
                assert set(attrs[A.MISMATCH]) == {"boolValue"}
                if sp["status"]:
                    assert sp["status"] == {"code": 2, "message": ERR}
                    (ev,) = sp["events"]
                    assert ev["name"] == "exception" and ev["timeUnixNano"].isdigit()
    assert total == 19
    first = json.loads(lines[0])["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert first[0]["name"] == A.SPAN_RUN and first[1]["name"] == A.SPAN_STEP   # pre-order


# -- live OTLP/HTTP export ------------------------------------------------------------------------------
class _Collector:
    """A tiny OTLP/HTTP receiver on 127.0.0.1 that counts requests and spans."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        outer = self
        self.requests = 0
        self.spans = 0
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                outer.requests += 1
                outer.paths.append(self.path)
                outer.headers.append(dict(self.headers))
                outer.spans += sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector():
    c = _Collector()
    yield c
    c.close()


def test_live_export_to_a_collector(tmp_path, collector):
    s = TraceSession(tmp_path, "boundary", otlp_endpoint=f"http://127.0.0.1:{collector.port}",
                     batch_size=8)
    small_run(s.observer)
    fig = s.finish()
    assert collector.spans == fig["spans"] == 19
    assert collector.requests == 3 and set(collector.paths) == {"/v1/traces"}
    assert fig["exported"]["OTLPSpanExporter"] == 19


def test_live_export_honours_otel_env(tmp_path, collector, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-team=kv")
    s = TraceSession(tmp_path, "step", otlp_endpoint="env")
    small_run(s.observer)
    assert s.finish()["spans"] == collector.spans == 7
    assert collector.paths == ["/v1/traces"] and collector.headers[0].get("x-team") == "kv"


def test_live_export_to_nowhere_fails_loudly(tmp_path, monkeypatch):
    import socket
    with socket.socket() as sock:          # a port with nobody listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    s = TraceSession(tmp_path, "step", otlp_endpoint=f"http://127.0.0.1:{port}/v1/traces")
    small_run(s.observer)
    with pytest.raises(SpanLossError, match="OTLPSpanExporter"):
        s.finish()


def test_otlp_endpoint_forms():
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert traces_url("https://c/otlp/v1/traces") == "https://c/otlp/v1/traces"
    with pytest.raises(ValueError, match="not a URL"):
        traces_url("collector:4318x")
    exp = otlp_http_exporter("http://127.0.0.1:9/")
    assert type(exp).__name__ == "OTLPSpanExporter"
    exp.shutdown()
