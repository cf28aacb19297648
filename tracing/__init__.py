"""Tracing of the KV-cache write path: boundary recorder, OpenTelemetry spans, OTLP JSON export
and import, offline analysis, Chrome/Perfetto export.

Names are loaded lazily, so ``import tracing`` stays cheap for code that only needs the level
names (the CLI's argument parser) and does not pull in the OpenTelemetry SDK.

Typical use by a run loop::

    session = TraceSession(out_dir, level="anomaly")
    run(..., observer=session.observer)          # RunObserver
    figures = session.finish(run_info)           # writes out_dir/trace.otlp.jsonl
"""
from __future__ import annotations

import importlib
from typing import Any

from .levels import DEFAULT_LEVEL, LEVELS, parse_level

_LAZY = {
    "BoundaryRecorder": "recorder",
    "TraceSession": "session",
    "SpanLossError": "processor",
    "LosslessBatchProcessor": "processor",
    "OtlpJsonLinesExporter": "otlp_json",
    "TRACE_FILE": "otlp_json",
    "emit_spans": "spans",
    "analyze_files": "analyze",
    "TraceAnalysis": "analysis",
    "TraceFormatError": "otlp_read",
    "export_chrome": "chrome",
    "register": "commands",
}

__all__ = ["DEFAULT_LEVEL", "LEVELS", "parse_level", *_LAZY]


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'tracing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value
