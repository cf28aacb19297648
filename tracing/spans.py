"""OpenTelemetry spans from a :class:`~tracing.recorder.BoundaryRecorder`, after the run.

Spans go through the SDK's Tracer with explicit ``start_time``/``end_time`` taken from the
recorded timestamps, so the trace shows when things happened during the run, not when we got
around to emitting them. The hierarchy is run -> step -> backend -> boundary, one trace per run.

Each parent span is ended right after it is started (its end time is known in advance). The
processor therefore sees parents before children and exports the file in pre-order, which lets a
streaming reader know a step before its backends and boundaries.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import chain
from typing import Any, Iterator, Optional

from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import Status, StatusCode

from simulator.records import FINDING_CLASSES, RunInfo, StepRecord

from . import attributes as A
from .levels import ANOMALY, BOUNDARY, LEVELS, OFF, STEP
from .recorder import BoundaryRecorder, agrees, direction

SERVICE_NAME = "slotscope"
SCOPE_NAME = "slotscope.tracing"

_EXC_TYPE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)):\s*(.*)$", re.S)


def run_resource(run: RunInfo) -> Resource:
    """Resource attributes: service identity plus what distinguishes this run from another."""
    attrs: dict[str, Any] = {
        "service.name": SERVICE_NAME,
        "service.version": run.version,
        A.SCENARIO: run.scenario,
        A.DESIGN: run.design,
        A.SEED: int(run.seed),
        A.SCENARIO_HASH: run.scenario_hash,
        A.BACKENDS: list(run.backends),
        A.DEVICE: run.device,
    }
    return Resource.create(attrs)


def split_exception(error: str) -> tuple[str, str]:
    """``"ValueError: msg"`` -> ("ValueError", "msg"); a bare message is a RuntimeError."""
    m = _EXC_TYPE.match(error)
    if m:
        return m.group(1), m.group(2)
    return "RuntimeError", error


def _finding_attrs(counts: Optional[list[int]], out: dict[str, Any]) -> None:
    total = 0
    if counts is not None:
        for cls, n in zip(FINDING_CLASSES, counts):
            if n:
                out[A.FINDINGS_PREFIX + cls] = n
                total += n
    out[A.FINDINGS] = total


def _step_attrs(step: int, rec: Optional[StepRecord]) -> dict[str, Any]:
    attrs: dict[str, Any] = {A.STEP: step}
    if rec is not None:
        attrs.update({
            A.MODE: rec.mode, A.GRAPH: rec.graph, A.NUM_REQUESTS: rec.num_requests,
            A.REAL_TOKENS: rec.real_tokens, A.DP_PADDED_TOKENS: rec.dp_padded_tokens,
            A.PADDED_TOKENS: rec.padded_tokens, A.FULL_USED: rec.full_used,
            A.SWA_USED: rec.swa_used, A.FULL_SIZE: rec.full_size, A.SWA_SIZE: rec.swa_size,
        })
    return attrs


@dataclass
class _Group:
    """The rows of one (step, backend) with their time span, computed before any span starts."""

    step: int
    backend_id: int
    ranges: list[range]      # row ranges (usually one): no per-row Python ints held at scale
    t0: int
    t1: int

    @property
    def rows(self) -> Iterator[int]:
        return chain.from_iterable(self.ranges)


@dataclass
class _BackendRows:
    """One (step, backend)'s layers as the backend span's arrays, gathered in one pass over its rows."""

    layer_ids: list[int]
    kinds: list[str]
    loc_lens: list[int]
    swa_lens: list[int]
    loc_dt: list[str]
    swa_dt: list[str]
    mism_layers: list[int]
    err_layers: list[int]
    totals: list[int]                                       # findings per class
    flagged: list[tuple[int, bool, Optional[list[int]]]]    # (row, agrees, findings): a boundary span each


def _backend_attrs(g: _Group, backend: str, sr: Optional[StepRecord], rows: _BackendRows) -> dict[str, Any]:
    attrs: dict[str, Any] = {A.STEP: g.step, A.BACKEND: backend}
    if sr is not None:
        attrs.update({A.MODE: sr.mode, A.GRAPH: sr.graph, A.REAL_TOKENS: sr.real_tokens,
                      A.DP_PADDED_TOKENS: sr.dp_padded_tokens,
                      A.PADDED_TOKENS: sr.padded_tokens})
    attrs.update({
        A.LAYER_IDS: rows.layer_ids, A.LAYER_KINDS: rows.kinds, A.LOC_LENS: rows.loc_lens,
        A.SWA_LOC_LENS: rows.swa_lens,
        A.MISMATCH: bool(rows.mism_layers), A.MISMATCH_COUNT: len(rows.mism_layers),
        A.MISMATCH_LAYERS: rows.mism_layers, A.ERROR_COUNT: len(rows.err_layers),
        A.ERROR_LAYERS: rows.err_layers,
    })
    # dtypes are nearly always uniform over layers: one scalar then, an array only if not
    for key_one, key_many, values in ((A.LOC_DTYPE, A.LOC_DTYPES, rows.loc_dt),
                                      (A.SWA_LOC_DTYPE, A.SWA_LOC_DTYPES, rows.swa_dt)):
        if values and all(v == values[0] for v in values):
            attrs[key_one] = values[0]
        elif values:
            attrs[key_many] = values
    _finding_attrs(rows.totals, attrs)
    return attrs


def emit_spans(recorder: BoundaryRecorder, tracer: trace_api.Tracer, level: str,
               run: Optional[RunInfo] = None) -> int:
    """Emit the spans of one run at ``level``; returns how many spans were started.

    The count is ours, not the processor's: a sampler or a disabled SDK that turns spans into
    no-ops makes it differ from what the exporters saw, and the session then fails loudly.
    """
    if level not in LEVELS:
        raise ValueError(f"trace level {level!r} is not one of {LEVELS}")
    if level == OFF:
        return 0
    run = run or recorder.run
    if run is None:
        raise ValueError("no RunInfo: on_run_start was never called and finish() got none")
    return _Emitter(recorder, tracer, level, run).emit()


class _Emitter:
    def __init__(self, rec: BoundaryRecorder, tracer: trace_api.Tracer, level: str, run: RunInfo):
        self.rec = rec
        self.tracer = tracer
        self.level = level
        self.run = run
        self.created = 0
        # Findings indexed once: (step, backend id) -> {layer: per-class counts}.
        self.found: dict[tuple[int, int], dict[int, list[int]]] = {}
        self.found_in_step: dict[int, int] = {}
        for (fs, fb, fl), vec in rec.findings.items():
            self.found.setdefault((fs, fb), {})[fl] = vec
            self.found_in_step[fs] = self.found_in_step.get(fs, 0) + sum(vec)

    def _start(self, name: str, parent: Optional[trace_api.Span], t0: int, t1: int,
               attrs: dict[str, Any]) -> trace_api.Span:
        ctx = trace_api.set_span_in_context(parent) if parent is not None else None
        span = self.tracer.start_span(name, context=ctx, start_time=t0, attributes=attrs)
        self.created += 1
        return span

    def _groups(self) -> list[_Group]:
        rec = self.rec
        wall = rec.wall_ns
        t_start, t_end = rec.col_t_start, rec.col_t_end
        out = []
        for step, b, ranges in rec.groups():
            rows = chain.from_iterable(ranges)
            t0 = min(t_start[r] for r in chain.from_iterable(ranges))
            t1 = max(max(t_end[r], t_start[r]) for r in rows)
            out.append(_Group(step, b, ranges, wall(t0), max(wall(t0), wall(t1))))
        return out

    def emit(self) -> int:
        rec, run = self.rec, self.run
        groups = self._groups()
        by_step: dict[int, list[_Group]] = {}
        for g in groups:
            by_step.setdefault(g.step, []).append(g)
        steps = sorted(set(by_step) | set(rec.steps) | set(self.found_in_step))

        step_times: dict[int, tuple[int, int]] = {}
        for s in steps:
            gs = by_step.get(s, [])
            sr = rec.steps.get(s)
            t0s = [g.t0 for g in gs]
            t1s = [g.t1 for g in gs]
            if sr is not None and sr.t_start_ns > 0:
                t0s.append(rec.wall_ns(sr.t_start_ns))
            if sr is not None and sr.t_end_ns > 0:
                t1s.append(rec.wall_ns(sr.t_end_ns))
            t0 = min(t0s) if t0s else rec.wall_start_ns
            t1 = max(t1s + [t0])
            step_times[s] = (t0, t1)
        run_t0 = min((t[0] for t in step_times.values()), default=rec.wall_start_ns)
        run_t1 = max((t[1] for t in step_times.values()), default=run_t0)

        swa_layers = sum(1 for li in run.layers if li.kind == "swa")
        run_attrs: dict[str, Any] = {
            A.SCENARIO: run.scenario, A.SCENARIO_PATH: run.scenario_path,
            A.SCENARIO_HASH: run.scenario_hash, A.DESIGN: run.design, A.SEED: int(run.seed),
            A.BACKENDS: list(run.backends), A.DEVICE: run.device, A.LEVEL: self.level,
            A.NUM_LAYERS: len(run.layers), A.NUM_SWA_LAYERS: swa_layers,
            A.NUM_STEPS: len(steps), A.NUM_BOUNDARIES: len(rec),
            A.FINDINGS: rec.findings_total,
        }
        for k, v in run.extra.items():
            if isinstance(v, (str, bool, int, float)):
                run_attrs[A.EXTRA_PREFIX + str(k)] = v
        run_span = self._start(A.SPAN_RUN, None, run_t0, run_t1, run_attrs)
        run_span.end(end_time=run_t1)

        for s in steps:
            sr = rec.steps.get(s)
            t0, t1 = step_times[s]
            sattrs = _step_attrs(s, sr)
            gs = by_step.get(s, [])
            mism = 0
            for g in gs:
                for r in g.rows:
                    if not agrees(rec.kind_of(rec.col_layer[r]), rec.col_loc_len[r],
                                  rec.col_swa_len[r]):
                        mism += 1
            sattrs[A.MISMATCH_COUNT] = mism
            sattrs[A.FINDINGS] = self.found_in_step.get(s, 0)
            step_span = self._start(A.SPAN_STEP, run_span, t0, t1, sattrs)
            step_span.end(end_time=t1)
            for g in gs:
                self._emit_backend(step_span, g, sr)
        return self.created

    def _emit_backend(self, step_span: trace_api.Span, g: _Group, sr: Optional[StepRecord]) -> None:
        rec = self.rec
        rows = self._backend_rows(g)
        attrs = _backend_attrs(g, rec.names[g.backend_id], sr, rows)
        span = self._start(A.SPAN_BACKEND, step_span, g.t0, g.t1, attrs)
        err_layers = rows.err_layers
        if err_layers:
            first = rec.errors[next(r for r in g.rows if r in rec.errors)]
            span.set_status(Status(StatusCode.ERROR,
                                   f"{len(err_layers)} boundary error(s); first at layer "
                                   f"{err_layers[0]}: {first}"))
            if self.level == STEP:   # no boundary spans carry them: keep the kernel's messages here
                for r in g.rows:
                    if r in rec.errors:
                        self._exception_event(span, rec.errors[r], rec.wall_ns(rec.col_t_end[r]),
                                              {A.LAYER: rec.col_layer[r]})
        span.end(end_time=g.t1)
        for r, ok, fv in rows.flagged:
            self._emit_boundary(span, r, ok, fv, sr)

    def _backend_rows(self, g: _Group) -> "_BackendRows":
        """The per-layer arrays of one (step, backend) and the rows that get a boundary span at this level."""
        rec = self.rec
        names = rec.names
        ncls = len(FINDING_CLASSES)
        layer_ids, kinds, loc_lens, swa_lens, loc_dt, swa_dt = [], [], [], [], [], []
        mism_layers, err_layers = [], []
        totals = [0] * ncls
        flagged: list[tuple[int, bool, Optional[list[int]]]] = []
        found = self.found.get((g.step, g.backend_id), {})
        for r in g.rows:
            layer = rec.col_layer[r]
            kind = rec.kind_of(layer)
            ll, sl = rec.col_loc_len[r], rec.col_swa_len[r]
            layer_ids.append(layer)
            kinds.append(kind)
            loc_lens.append(ll)
            swa_lens.append(sl)
            loc_dt.append(names[rec.col_loc_dtype[r]])
            swa_dt.append(names[rec.col_swa_dtype[r]])
            ok = agrees(kind, ll, sl)
            if not ok:
                mism_layers.append(layer)
            if r in rec.errors:
                err_layers.append(layer)
            fv = found.get(layer)
            if self.level == BOUNDARY or (self.level == ANOMALY and (
                    not ok or fv is not None or r in rec.errors)):
                flagged.append((r, ok, fv))
        # All findings of this (step, backend) count here, also any on a layer it never crossed.
        for fv in found.values():
            for i in range(ncls):
                totals[i] += fv[i]
        return _BackendRows(layer_ids, kinds, loc_lens, swa_lens, loc_dt, swa_dt, mism_layers, err_layers,
                            totals, flagged)

    def _emit_boundary(self, parent: trace_api.Span, r: int, ok: bool,
                       fv: Optional[list[int]], sr: Optional[StepRecord]) -> None:
        rec = self.rec
        names = rec.names
        layer = rec.col_layer[r]
        ll, sl = rec.col_loc_len[r], rec.col_swa_len[r]
        swa_dtype = names[rec.col_swa_dtype[r]]
        attrs: dict[str, Any] = {
            A.STEP: rec.col_step[r], A.BACKEND: names[rec.col_backend[r]], A.LAYER: layer,
            A.LAYER_KIND: rec.kind_of(layer), A.LOC_SHAPE: [ll],
            A.SWA_LOC_SHAPE: [sl] if sl >= 0 else [],
            A.LOC_DTYPE: names[rec.col_loc_dtype[r]], A.SWA_LOC_DTYPE: swa_dtype,
            A.MISMATCH: not ok,
        }
        if not ok:
            attrs[A.MISMATCH_DIRECTION] = direction(ll, sl)
        if sr is not None:
            attrs[A.MODE] = sr.mode
            attrs[A.GRAPH] = sr.graph
        error = rec.errors.get(r)
        attrs[A.ERROR] = error is not None
        _finding_attrs(fv, attrs)
        t0 = rec.wall_ns(rec.col_t_start[r])
        t1 = max(t0, rec.wall_ns(rec.col_t_end[r]))
        span = self._start(A.SPAN_BOUNDARY, parent, t0, t1, attrs)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
            self._exception_event(span, error, t1, None)
        span.end(end_time=t1)

    @staticmethod
    def _exception_event(span: trace_api.Span, error: str, t: int,
                         extra: Optional[dict[str, Any]]) -> None:
        """The semantic-convention ``exception`` event, stamped when the store raised.

        ``Span.record_exception`` wants a live exception object and stamps 'now'; we have the
        kernel's message and the recorded time, so the event is written by hand.
        """
        etype, msg = split_exception(error)
        attrs: dict[str, Any] = {"exception.type": etype, "exception.message": msg}
        if extra:
            attrs.update(extra)
        span.add_event("exception", attributes=attrs, timestamp=t)
