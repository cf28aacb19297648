"""The SGLang fixtures' driver with its exporter: engine_path/sglang_drive.py drives a release's request
logger and request tracing, tracing/otlp_json.py writes the spans. The application layer composes the
two, as engine_path imports nothing of tracing/ (docs/ARCHITECTURE.md).

Run under a release: ``engine_path.isolate.call("sglang==0.5.23", "slotscope.sglang_fixtures:drive", OUT_DIR)``
(scripts/make-sglang-fixtures; docs/REPLAY.md).
"""
from __future__ import annotations

from typing import Any


def drive(out_dir: str) -> dict[str, Any]:
    """``engine_path.sglang_drive.drive`` into ``out_dir``, its spans written as OTLP JSON lines."""
    from engine_path.sglang_drive import drive as drive_release
    from tracing.otlp_json import OtlpJsonLinesExporter

    return drive_release(out_dir, OtlpJsonLinesExporter)
