"""TraceSession: what the run loop holds to trace a run, from first boundary to written file.

The run loop needs two things: an observer to pass to the simulator, and one call after the
run that turns what was recorded into spans, exports them and proves none were lost. Keeping
the provider private to the session (never the global one) lets several runs trace in one
process (the pipeline runs designs side by side) without their spans mixing.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from simulator.observe import NullObserver
from simulator.records import RunInfo

from .levels import OFF, parse_level
from .live import otlp_http_exporter
from .otlp_json import TRACE_FILE, OtlpJsonLinesExporter
from .processor import DEFAULT_BATCH_SIZE, LosslessBatchProcessor
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
            self._live: Optional[SpanExporter] = otlp_http_exporter(self.otlp_endpoint)
        else:
            self._live = None
        self.trace_path: Optional[Path] = None
        self.finished = False

    def finish(self, run_info: Optional[RunInfo] = None) -> dict[str, Any]:
        """Emit, export and verify; raises SpanLossError if any exporter missed a span."""
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
        exporters: list[SpanExporter] = []
        file_exporter = None
        if self.write_file:
            self.trace_path = self.out_dir / TRACE_FILE
            file_exporter = OtlpJsonLinesExporter(self.trace_path)
            exporters.append(file_exporter)
        if self._live is not None:
            exporters.append(self._live)
        exporters.extend(self.extra_exporters)
        processor = LosslessBatchProcessor(exporters, batch_size=self.batch_size)
        provider = TracerProvider(resource=run_resource(run), sampler=ALWAYS_ON,
                                  span_limits=SpanLimits(**_LIMITS), shutdown_on_exit=False)
        provider.add_span_processor(processor)
        try:
            tracer = provider.get_tracer(SCOPE_NAME, _VERSION)
            created = emit_spans(rec, tracer, self.level, run)
            processor.force_flush()
            per_exporter = processor.check(created)
        finally:
            provider.shutdown()
        figures: dict[str, Any] = {
            "spans": created,
            "boundaries_recorded": len(rec),
            "level": self.level,
            "file": str(self.trace_path) if self.trace_path else None,
            "exported": per_exporter,
            "emit_s": round(time.perf_counter() - t0, 3),
        }
        if file_exporter is not None:
            figures["lines"] = file_exporter.lines_written
        return figures
