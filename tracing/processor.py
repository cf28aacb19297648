"""A span processor that cannot drop spans, and the check that proves it did not.

The SDK's BatchSpanProcessor drops spans silently when its queue is full; for a tool whose point
is to show *every* divergent boundary that is unacceptable. This processor is synchronous: each
ended span is appended to a batch, and a full batch is handed to every exporter right away, in
the emitting thread. Nothing is queued beyond one batch, so nothing can overflow. Exporter
failures are counted, and :meth:`LosslessBatchProcessor.check` raises :class:`SpanLossError`
unless every exporter accepted exactly as many spans as were created.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Optional, Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

DEFAULT_BATCH_SIZE = 512


class SpanLossError(RuntimeError):
    """Fewer spans reached an exporter than were created: the trace is incomplete."""


@dataclass
class ExporterTally:
    name: str
    exported: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)


class LosslessBatchProcessor(SpanProcessor):
    """Synchronous batching processor with per-exporter accounting."""

    def __init__(self, exporters: Sequence[SpanExporter], batch_size: int = DEFAULT_BATCH_SIZE):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.exporters = list(exporters)
        self.batch_size = batch_size
        names = [type(e).__name__ for e in self.exporters]
        self.tallies = [ExporterTally(n if names.count(n) == 1 else f"{n}#{i}")
                        for i, n in enumerate(names)]
        self.ended = 0
        self.truncated = 0          # spans that lost attributes, events or links to SDK limits
        self._batch: list[ReadableSpan] = []
        self._lock = threading.Lock()
        self._shut = False

    def on_start(self, span: Span, parent_context: Optional[Context] = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            self.ended += 1
            if span.dropped_attributes or span.dropped_events or span.dropped_links:
                self.truncated += 1
            self._batch.append(span)
            if len(self._batch) >= self.batch_size:
                self._flush_locked()

    def _flush_locked(self) -> None:
        batch, self._batch = self._batch, []
        if not batch:
            return
        for exporter, tally in zip(self.exporters, self.tallies):
            try:
                result = exporter.export(batch)
            except Exception as exc:  # an exporter bug must not hide the loss: count and report
                tally.failed += len(batch)
                if len(tally.errors) < 5:
                    tally.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if result is SpanExportResult.SUCCESS:
                tally.exported += len(batch)
            else:
                tally.failed += len(batch)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            self._flush_locked()
        for exporter in self.exporters:
            flush = getattr(exporter, "force_flush", None)
            if flush is not None:
                flush(timeout_millis)
        return True

    def shutdown(self) -> None:
        if self._shut:
            return
        self.force_flush()
        self._shut = True
        for exporter in self.exporters:
            exporter.shutdown()

    def check(self, created: int) -> dict[str, int]:
        """Raise :class:`SpanLossError` unless every exporter took exactly ``created`` spans.

        Exporters that count what they actually wrote (``spans_written``, as ours does) are
        held to that count too, so an exporter that reports success but loses spans is caught.
        """
        problems = []
        if self.ended != created:
            problems.append(f"{created} spans created but {self.ended} reached the processor "
                            "(a sampler, OTEL_SDK_DISABLED or span limits interfered)")
        if self.truncated:
            problems.append(f"{self.truncated} spans lost attributes/events to SDK span limits")
        for exporter, tally in zip(self.exporters, self.tallies):
            if tally.exported != created:
                msg = (f"{tally.name}: exported {tally.exported} of {created} spans "
                       f"({tally.failed} failed)")
                if tally.errors:
                    msg += "; " + "; ".join(tally.errors)
                problems.append(msg)
            written = getattr(exporter, "spans_written", None)
            if written is not None and written != created:
                problems.append(f"{tally.name}: wrote {written} of {created} spans")
        if problems:
            raise SpanLossError("trace incomplete: " + " | ".join(problems))
        return {t.name: t.exported for t in self.tallies}
