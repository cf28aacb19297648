"""A run's outputs on disk, as they are made: the observers that stream findings.jsonl and steps.jsonl
and keep shapes.jsonl's rows, summary.json's content, and the table the CLI prints.

Each streamed step goes to its file in one ``write`` of whole lines, so the files hold whole JSON lines
even after SIGKILL; the others are written by slotscope/pipeline.py under a temporary name and renamed.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from simulator.designs.base import Design
from simulator.records import FINDING_CLASSES, RunInfo, StepRecord
from simulator.run import RunResult
from simulator.scenario import Scenario

from .partial import signals_held, stop_if_signalled
from .rundir import output_error

class ShapeTimeline:
    """Observer that keeps, per (step, backend, kind), the first layer's loc and swa_loc lengths."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str, str, int, int]] = []
        self._kind: dict[int, str] = {}
        self._kinds: tuple[str, ...] = ()
        self._seen: set[tuple[int, str, str]] = set()

    def on_run_start(self, run: RunInfo) -> None:
        self._kind = {l.layer: l.kind for l in run.layers}
        self._kinds = tuple(dict.fromkeys(self._kind.values()))

    def on_step(self, step: StepRecord) -> None:
        self._seen.clear()

    def on_boundary(self, step, backend, layer, loc_len, swa_loc_len, loc_dtype, swa_loc_dtype, t0, t1, error):
        kind = self._kind[layer]
        key = (step, backend, kind)
        if key not in self._seen:
            self._seen.add(key)
            self.rows.append((step, backend, kind, loc_len, swa_loc_len))

    def on_boundaries(self, rows) -> None:
        """:meth:`on_boundary` for each row, in order (simulator.core.observe.boundary_sink); one backend's rows of one
        step (a ``BackendRows``) are read only up to each kind's first."""
        kind, seen, out = self._kind, self._seen, self.rows
        head = getattr(rows, "head", None)
        if head is not None:
            if not self._kinds:
                self._kinds = tuple(dict.fromkeys(kind.values()))
            left = [k for k in self._kinds if head + (k,) not in seen]
            for t in rows.tails:
                if not left:
                    return
                k = kind[t[0]]
                if k in left:
                    left.remove(k)
                    key = head + (k,)
                    seen.add(key)
                    out.append(key + (t[1], t[2]))
            return
        for r in rows:
            key = (r[0], r[1], kind[r[2]])
            if key not in seen:
                seen.add(key)
                out.append(key + (r[3], r[4]))

    def on_findings(self, findings) -> None:
        pass

    def on_run_end(self) -> None:
        pass


class StreamingOutputs:
    """Observer that writes findings.jsonl and steps.jsonl as the run goes, so a crash, ^C or kill keeps
    everything found up to the last finished step.

    The files are opened when the run starts (``on_start`` runs first: the run directory begins there), never
    through a link. Each step's lines go to the file in one ``write`` of whole lines (no Python buffer that
    could spill half a line), so even after SIGKILL both files hold whole JSON lines only; a write that fails
    part-way (a full disk) is cut back to the last whole line and raises :class:`~slotscope.rundir.OutputError`."""

    def __init__(self, out: Path, on_start: Optional[Callable[[RunInfo], None]] = None):
        self._out = Path(out)
        self._on_start = on_start
        self._files: dict[str, tuple[int, list[int]]] = {}      # name -> (fd, [bytes written])
        self._pending: list[str] = []
        self.steps_written = 0
        self.closed = False

    def on_run_start(self, run: RunInfo) -> None:
        if self._on_start is not None:
            self._on_start(run)
        self.open()

    def open(self) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        for name in ("findings.jsonl", "steps.jsonl"):
            if name not in self._files:
                try:
                    self._files[name] = (os.open(self._out / name, flags, 0o644), [0])
                except OSError as e:
                    raise output_error(e, self._out / name) from e

    def on_boundary(self, *args) -> None:
        pass

    def on_boundaries(self, rows) -> None:
        pass

    def on_findings(self, findings) -> None:
        for f in findings:
            self._pending.append(json.dumps(f.to_json(), separators=(",", ":")) + "\n")

    def _write_findings(self) -> None:
        if self._pending:
            data, self._pending = "".join(self._pending).encode(), []
            self._append("findings.jsonl", data)

    def on_step(self, step: StepRecord) -> None:
        self._write_step(step)
        stop_if_signalled()

    def _write_step(self, step: StepRecord) -> None:
        line = (json.dumps(step_json(step), separators=(",", ":")) + "\n").encode()
        with signals_held():      # a signal between the write and the count would make close() write it twice
            self._write_findings()
            self._append("steps.jsonl", line)
            self.steps_written += 1

    def _append(self, name: str, data: bytes) -> None:
        if name not in self._files:
            self.open()
        fd, size = self._files[name]
        try:
            _write_all(fd, data)
        except OSError as e:
            try:
                os.ftruncate(fd, size[0])      # back to the last whole line (freeing space needs none)
                os.lseek(fd, size[0], os.SEEK_SET)
            except OSError:
                pass
            raise output_error(e, self._out / name) from e
        size[0] += len(data)

    def on_run_end(self) -> None:
        self.close()

    def close(self, steps: Sequence[StepRecord] = ()) -> None:
        """Write what is pending and close. ``steps``: the run's step records, when it stopped; any the
        file lacks (a signal between a step's two writes) are written first."""
        if self.closed:
            return
        self.closed = True
        try:
            if self._files:
                self._write_findings()       # a step cut short: the findings its backends already had
                for step in steps[self.steps_written:]:
                    self._write_step(step)
        finally:
            for fd, _ in self._files.values():
                os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def summary_of(scenario: Scenario, design: Design, result: RunResult,
               incomplete: Optional[dict[str, Any]] = None, engine: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    out = {
        "scenario": scenario.name,
        "design": design.name,
        "engine": engine,          # {"name", "version", "path"} of the release in the write path; None: a model run
        "seed": scenario.seed,
        "backends": {name: st.to_json() for name, st in result.backends.items()},
        "steps": len(result.steps),
        "crossings": result.crossings,
        "findings_total": result.total_findings,
        "findings_detail_truncated": result.findings_truncated,
    }
    if scenario.max_steps is not None:
        out["max_steps"] = scenario.max_steps
    if getattr(result, "radix", None) is not None:
        out["radix"] = result.radix          # engine.radix_cache's counters (written only when it is on)
    if "unified" in result.info.extra:
        out["unified"] = result.info.extra["unified"]    # pool.unified's plan counters (written only when it is on)
    if incomplete is not None:
        out["incomplete"] = incomplete
    return out


def jsonl_text(rows) -> str:
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)


def step_json(s: StepRecord) -> dict[str, Any]:
    d = s.to_json()
    d.pop("t_start_ns", None)
    d.pop("t_end_ns", None)
    return d


def format_table(summary: dict[str, Any]) -> str:
    """The design x backend table the CLI prints."""
    short = {"missed": "missed", "clobbered": "clobber", "padding_slot": "pad_slot", "evicted_slot": "evicted",
             "out_of_range": "oor", "length_mismatch": "len_mism", "design_error": "design_err"}
    head = ["design", "backend", "writes"] + [short.get(c, c) for c in FINDING_CLASSES] + ["first (step/layer/class)"]
    rows = []
    for name, b in summary["backends"].items():
        ff = b["first_finding"]
        first = "-" if ff is None else f"{ff['step']}/{ff['layer']}/{ff['class']}"
        rows.append([summary["design"], name, str(b["writes"])] + [str(b["findings"][c]) for c in FINDING_CLASSES]
                    + [first])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(c.ljust(w) if i < 2 or i == len(r) - 1 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(lines)

