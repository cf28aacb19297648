"""TraceSession: what the run loop holds to trace a run, from first boundary to written file.

The run loop needs two things: an observer to pass to the simulator, and one call after the
run that turns what was recorded into spans, exports them and proves none were lost. Keeping
the provider private to the session (never the global one) lets several runs trace in one
process (the pipeline runs designs side by side) without their spans mixing.
"""
from __future__ import annotations

import copy
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from simulator.core.observe import NullObserver
from simulator.records import RunInfo

from .levels import OFF, parse_level
from .live import otlp_http_exporter
from .otlp_json import TRACE_FILE, OtlpJsonLinesExporter
from .processor import DEFAULT_BATCH_SIZE, LosslessBatchProcessor, SpanLossError
from .recorder import BoundaryRecorder
from .spans import SCOPE_NAME, emit_spans, run_resource

try:  # the installed distribution's version, for the instrumentation scope
    from importlib.metadata import version as _dist_version
    _VERSION = _dist_version("slotscope")
except Exception:  # pragma: no cover - running from a bare checkout
    _VERSION = "0.0.0"

#: Generous explicit limits: the SDK's defaults (128 attributes, 128 events) or OTEL_* limit
#: variables in the user's shell must not truncate our spans silently.
_LIMITS = dict(max_attributes=1024, max_events=4096, max_links=128, max_span_attributes=1024,
               max_event_attributes=128, max_link_attributes=128, max_attribute_length=None,
               max_span_attribute_length=None)


#: resource attributes naming the real engine of an engine run (RunInfo.extra "engine.name" etc.)
ENGINE_ATTRS = ("name", "version", "path")


def session_resource(run: RunInfo) -> Resource:
    """The run's resource: spans.run_resource, plus ``slotscope.engine.name/version/path`` when a real
    SGLang release was in the write path (``slotscope run --engine``)."""
    base = run_resource(run)
    engine = {f"slotscope.engine.{k}": str(run.extra[f"engine.{k}"]) for k in ENGINE_ATTRS
              if run.extra.get(f"engine.{k}") is not None}
    return base.merge(Resource(engine)) if engine else base


class _LiveExport(SpanExporter):
    """The live (OTLP/HTTP) exporter, made to fail fast and quietly: after its first failed batch the
    rest are not sent (each would wait out the exporter's retries and timeout again), and the
    exporter's own log lines are kept as the reason instead of being printed."""

    def __init__(self, inner: SpanExporter, endpoint: str):
        self.inner = inner
        self.endpoint = endpoint
        self.error: Optional[str] = None
        self.failed = 0
        self.exported = 0

    def export(self, spans) -> SpanExportResult:
        if self.error is not None:
            self.failed += len(spans)
            return SpanExportResult.FAILURE
        log = _Captured()
        try:
            with log:
                result = self.inner.export(spans)
        except Exception as exc:  # noqa: BLE001 - counted as a failure, reported once
            result, log.first = SpanExportResult.FAILURE, f"{type(exc).__name__}: {exc}"
        if result is SpanExportResult.SUCCESS:
            self.exported += len(spans)
        else:
            self.failed += len(spans)
            self.error = _reason(log.first or "the collector did not accept the spans")
        return result

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with _Captured():
            return bool(self.inner.force_flush(timeout_millis))

    def shutdown(self) -> None:
        with _Captured():
            self.inner.shutdown()

    def message(self, created: int) -> str:
        return (f"live export to {self.endpoint} failed: {self.error} ({self.exported} of {created} spans "
                "exported)")


def _live_export(inner: SpanExporter, endpoint: str) -> _LiveExport:
    """The wrapper as a subclass named after the exporter it wraps, so the span accounting (which names
    exporters by type) still says "OTLPSpanExporter"."""
    cls = type(type(inner).__name__, (_LiveExport,), {"__doc__": _LiveExport.__doc__})
    return cls(inner, endpoint)


def _reason(text: str) -> str:
    """The gist of an exporter's log line: the OS error if it names one ("[Errno 111] Connection
    refused"), else its first line, shortened."""
    m = re.search(r"\[Errno -?\d+\][^\"')]*", text)
    if m:
        return m.group(0).strip()
    return text.splitlines()[0][:300] if text else text


class _Captured(logging.Handler):
    """Holds the OpenTelemetry exporter's log records (its retries and failures) while active."""

    LOGGERS = ("opentelemetry.exporter", "opentelemetry.sdk", "urllib3")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.first: Optional[str] = None
        self._saved: list[tuple[logging.Logger, bool]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.WARNING:
            return
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001
            text = str(record.msg)
        if self.first is None:       # the first is the cause (a retry's reason); the last only "gave up"
            self.first = text

    def __enter__(self) -> "_Captured":
        for name in self.LOGGERS:
            lg = logging.getLogger(name)
            self._saved.append((lg, lg.propagate))
            lg.addHandler(self)
            lg.propagate = False
        return self

    def __exit__(self, *exc) -> None:
        for lg, propagate in self._saved:
            lg.removeHandler(self)
            lg.propagate = propagate
        self._saved.clear()


class TraceSession:
    """Records a run's boundaries and, at :meth:`finish`, writes ``out_dir/trace.otlp.jsonl``.

    ``level`` is one of ``off``, ``step``, ``boundary``, ``anomaly``. ``otlp_endpoint`` adds live
    export (a URL, or ``"env"`` for the OTEL_EXPORTER_OTLP_* variables). ``exporters`` adds more
    span exporters (tests use the SDK's InMemorySpanExporter); ``write_file=False`` leaves the
    file out. With level ``off`` the observer is a NullObserver and nothing is written.
    """

    def __init__(self, out_dir: os.PathLike[str] | str, level: str = "anomaly",
                 otlp_endpoint: Optional[str] = None, *,
                 exporters: Sequence[SpanExporter] = (), write_file: bool = True,
                 batch_size: int = DEFAULT_BATCH_SIZE):
        self.out_dir = Path(out_dir)
        self.level = parse_level(level)
        self.otlp_endpoint = otlp_endpoint or None
        self.extra_exporters = list(exporters)
        self.write_file = write_file
        self.batch_size = batch_size
        self.recorder: Optional[BoundaryRecorder] = None if self.level == OFF else BoundaryRecorder()
        self.observer: Any = self.recorder if self.recorder is not None else NullObserver()
        if self.otlp_endpoint and self.level != OFF:
            # Build it now so a bad endpoint fails before the run, not after it.
            self._live: Optional[_LiveExport] = _live_export(otlp_http_exporter(self.otlp_endpoint),
                                                             self.otlp_endpoint)
        else:
            self._live = None
        self.trace_path: Optional[Path] = None
        self.finished = False

    def finish(self, run_info: Optional[RunInfo] = None, *, live_failure: str = "raise") -> dict[str, Any]:
        """Emit, export and verify; raises SpanLossError if any exporter missed a span.

        The file is written as ``trace.otlp.jsonl.tmp`` and renamed at the end (a reader never sees a
        half-written trace). With ``live_failure="report"`` a failed live export does not raise: the
        figures then hold ``live_export_error``, one line naming the endpoint and the reason; the
        file and any extra exporter are still held to every span.
        """
        if live_failure not in ("raise", "report"):
            raise ValueError(f"live_failure must be 'raise' or 'report', got {live_failure!r}")
        if self.finished:
            raise RuntimeError("TraceSession.finish() called twice")
        self.finished = True
        if self.recorder is None:
            return {"spans": 0, "boundaries_recorded": 0, "level": self.level, "file": None}
        rec = self.recorder
        run = run_info or rec.run
        if run is None:
            raise ValueError("TraceSession.finish needs a RunInfo: pass it, or call "
                             "observer.on_run_start(run_info) before the run")
        t0 = time.perf_counter()
        exporters, file_exporter, tmp_path = self._exporters()
        processor = LosslessBatchProcessor(exporters, batch_size=self.batch_size)
        provider = TracerProvider(resource=session_resource(run), sampler=ALWAYS_ON,
                                  span_limits=SpanLimits(**_LIMITS), shutdown_on_exit=False)
        provider.add_span_processor(processor)
        try:
            tracer = provider.get_tracer(SCOPE_NAME, _VERSION)
            created = emit_spans(rec, tracer, self.level, run)
            processor.force_flush()
            per_exporter, live_error = self._check(processor, created, live_failure)
        finally:
            provider.shutdown()
            if tmp_path is not None and tmp_path.exists():
                os.replace(tmp_path, self.trace_path)
        figures: dict[str, Any] = {
            "spans": created,
            "boundaries_recorded": len(rec),
            "level": self.level,
            "file": str(self.trace_path) if self.trace_path else None,
            "exported": per_exporter,
            "emit_s": round(time.perf_counter() - t0, 3),
        }
        if live_error is not None:
            figures["live_export_error"] = live_error
        if file_exporter is not None:
            figures["lines"] = file_exporter.lines_written
        return figures

    def _exporters(self) -> tuple[list[SpanExporter], Optional[OtlpJsonLinesExporter], Optional[Path]]:
        """The file exporter (writing ``trace.otlp.jsonl.tmp``), the live one, the extra ones, in that order,
        plus the file exporter and its temporary path on their own (None without a file)."""
        exporters: list[SpanExporter] = []
        file_exporter = None
        tmp_path = None
        if self.write_file:
            self.trace_path = self.out_dir / TRACE_FILE
            tmp_path = self.trace_path.with_name(TRACE_FILE + ".tmp")
            file_exporter = OtlpJsonLinesExporter(tmp_path)
            exporters.append(file_exporter)
        if self._live is not None:
            exporters.append(self._live)
        exporters.extend(self.extra_exporters)
        return exporters, file_exporter, tmp_path

    def _check(self, processor: LosslessBatchProcessor, created: int,
               live_failure: str) -> tuple[dict[str, int], Optional[str]]:
        """Spans per exporter, and the live export's failure in words when it is reported, not raised.

        A loss raises, except where the live export alone failed and ``live_failure`` is ``"report"``:
        then the other exporters are checked on their own, still held to every span."""
        try:
            return processor.check(created), None
        except SpanLossError as exc:
            if self._live is None or self._live.error is None:
                raise
            if live_failure == "raise":
                raise SpanLossError(f"{exc} | {self._live.message(created)}") from None
            others = copy.copy(processor)            # the file and extra exporters: still every span
            kept = [(e, t) for e, t in zip(processor.exporters, processor.tallies) if e is not self._live]
            others.exporters, others.tallies = [e for e, _ in kept], [t for _, t in kept]
            return others.check(created), self._live.message(created)
