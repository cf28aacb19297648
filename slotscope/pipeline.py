"""The pipeline: compose simulator, cuda_path, tracing and reports into one run with outputs on disk.

Outputs of ``run_scenario`` in DIR (deterministic ones are byte-identical for the same seed):
  summary.json      verdict per backend (the shape other tools rely on)        deterministic
  findings.jsonl    one finding per line                                        deterministic
  steps.jsonl       one forward step per line (mode, graph, tokens, occupancy)  deterministic
  shapes.jsonl      per step and backend: loc / swa_loc lengths per layer kind  deterministic
  scenario.toml     the scenario as run (options applied; rerunnable as it is)  deterministic
  run.json          provenance and timings (version, commit, device, wall time)
  trace.otlp.jsonl  OpenTelemetry spans (when tracing is on)
  report.html       the self-contained report

scenario.toml and run.json are written before the first step; findings.jsonl and steps.jsonl stream as
the run goes; the other files are written under a temporary name and renamed. A run that does not finish
(an exception, ^C, SIGTERM, a max_steps cut) says so in summary.json and run.json ("incomplete": reason,
message, steps done). The directory is locked for the run and cleared of an earlier run's files first
(slotscope/rundir.py).

This module runs the pieces in order; each lives with its concern: the options and what they resolve to
(run_setup.py), the pools under test (pools.py), the files as they are made (outputs.py), and what a run
that stops leaves (partial.py).
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from simulator.core.observe import ObserverFanout, RunObserver
from simulator.records import RunInfo
from simulator.run import RunResult, run_simulation
from simulator.scenario import Scenario

from . import __version__
from .outputs import ShapeTimeline, StreamingOutputs, jsonl_text, summary_of
from .partial import (REFUSALS, ProgressTracker, RunStopped, as_output_error, cut_marker, signals_held, stop_marker,
                      whole_lines)
from .pools import make_draft_pool_factory, make_pool_factory
from .resources import check_resources, pools_shared
from .rundir import OutputError, RunDir, UsageError, check_out, write_atomic, write_json_atomic  # noqa: F401
from .run_setup import RunOptions, Setup, engine_of, overlap_timeline, setup


@dataclass
class RunOutput:
    result: RunResult
    summary: dict[str, Any]
    out_dir: Optional[Path]
    timings: dict[str, float]
    incomplete: Optional[dict[str, Any]] = None       # set when the run was cut short (--max-steps)
    live_export_error: Optional[str] = None           # set when --otlp-endpoint did not take the spans
    faults: Any = None                                # --inject: the run's FaultInjector (its Fault records)

    @property
    def complete(self) -> bool:
        return self.incomplete is None


# ------------------------------------------------------------------------------------ one run

def _uses_graph_executor(su: Setup) -> bool:
    """On CUDA with the Triton store, CUDA graphs replay the steps (cuda_path/graphs.py)."""
    return su.device.type == "cuda" and su.store == "triton" and bool(su.opts.cuda_graphs)


def _simulate(su: Setup, observer: RunObserver, progress: ProgressTracker) -> RunResult:
    executor = None
    if _uses_graph_executor(su):
        from cuda_path.graphs import CudaGraphExecutor

        executor = CudaGraphExecutor()
    su.extra["cuda_graphs"] = executor is not None
    kwargs: dict[str, Any] = dict(device=su.device, observer=observer, progress=progress, run_info_extra=su.extra,
                                  version=__version__, max_steps=su.scenario.max_steps, executor=executor,
                                  make_draft_pool=make_draft_pool_factory(su.device, su.geometry, su.store))
    if su.faults is not None:
        kwargs["faults"] = su.faults
    if su.opts.forward_observer is not None:
        kwargs["forward_observer"] = su.opts.forward_observer
    if su.runtime is None:
        return run_simulation(su.scenario, su.design, make_pool_factory(su.scenario, su.device, su.geometry, su.store),
                              **kwargs)
    from .engine_run import release_log_kept

    with release_log_kept(su.runtime, quiet=su.opts.quiet_engine):
        return _simulate_engine(su, kwargs)


def _simulate_engine(su: Setup, kwargs: dict[str, Any]) -> RunResult:
    from .engine_run import allocator_seam

    if getattr(su.runtime, "own_pools", False):
        # vLLM: its scheduler and block pool decide, our pools take the writes (engine_path/vllm/runtime.py)
        kwargs.update(allocator_factory=su.runtime.allocator_factory, backends=su.runtime.backends(su.scenario),
                      scheduler_factory=su.runtime.scheduler_factory)
        return run_simulation(su.scenario, su.design, make_pool_factory(su.scenario, su.device, su.geometry, su.store),
                              **kwargs)
    if getattr(su.runtime, "unified", False):
        kwargs["allocator_factory"] = su.runtime.allocator_factory     # pool.unified: the release's allocator
        return run_simulation(su.scenario, su.design, make_pool_factory(su.scenario, su.device, su.geometry, su.store),
                              **kwargs)
    # the release's allocator, its backends' forward, KVWriteLoc and SWAKVPool (docs/ENGINE.md); draft pools stay ours
    with allocator_seam(su.runtime, kwargs):
        kwargs["backends"] = su.runtime.backends(su.scenario)
        if su.runtime.release_scheduler:
            kwargs["scheduler_factory"] = su.runtime.scheduler_factory    # the release's own Scheduler
        try:
            return run_simulation(su.scenario, su.design, su.runtime.pool_factory(su.scenario.model), **kwargs)
        finally:
            su.runtime.close()


def run_scenario(scenario_or_path: Scenario | str | Path, out_dir: Optional[str | Path] = None,
                 options: Optional[RunOptions] = None) -> RunOutput:
    """Run one scenario end to end and write its outputs to ``out_dir`` (if given).

    Every check that can refuse the run (the options, ``--inject``, the design and its ``backend_spec``, the
    engine's options, the memory estimate, ``out_dir`` itself, what the run's set-up refuses) comes before
    anything in ``out_dir`` is touched: a refused run leaves the previous run's files as they were. The
    directory is locked for the run and the previous run's files are removed when the first step is next
    (slotscope/rundir.py). A run stopped by an exception or a signal writes its partial outputs, marked
    incomplete, and re-raises; ``exc.partial_outputs`` then holds the "incomplete" entry.
    """
    opts = options or RunOptions()
    try:
        if out_dir is not None:
            check_out(out_dir)            # a bad --out before anything is loaded (touches nothing)
        su = setup(scenario_or_path, opts)
        shared = pools_shared(su.scenario, su.device, cuda_graphs=_uses_graph_executor(su),
                              plugins=su.faults is not None or su.opts.forward_observer is not None,
                              timeline=overlap_timeline(su.scenario, engine_of(su.scenario, su.opts)))
        check_resources(su.scenario, su.design, su.device, su.geometry, shared=shared)   # will it fit? (exit 2)
        rd = None if out_dir is None else RunDir.open(out_dir)            # checked and locked, not yet cleared
    except (KeyboardInterrupt, RunStopped) as exc:
        exc.outputs_untouched = True  # type: ignore[attr-defined]
        raise
    if rd is None:
        return _run_in_memory(su)
    with rd:
        return _RunWriter(su, rd).run()


def _run_in_memory(su: Setup) -> RunOutput:
    timeline = ShapeTimeline()
    observers: list[RunObserver] = [timeline, *su.opts.extra_observers]
    observer: RunObserver = ObserverFanout(observers) if len(observers) > 1 else observers[0]
    progress = ProgressTracker(su.opts.progress)
    t0 = time.perf_counter()
    result = _simulate(su, observer, progress)
    incomplete = cut_marker(su.scenario.max_steps, len(result.steps), progress)
    return RunOutput(result, summary_of(su.scenario, su.design, result, incomplete, su.engine), None,
                     {"run_s": time.perf_counter() - t0}, incomplete=incomplete, faults=su.faults)


class _RunWriter:
    """One run into a locked directory: nothing touched until the run begins (its set-up done, the first step
    next), then provenance first, streamed files while it runs, the rest at the end, partial outputs marked
    incomplete when it is stopped (also while the last outputs are written)."""

    def __init__(self, su: Setup, rd: RunDir):
        self.su, self.rd, self.out = su, rd, rd.path
        self.timeline = ShapeTimeline()
        self.layers: list[list[Any]] = [[l.layer, l.kind] for l in su.scenario.model.layers()]
        self.timings: dict[str, Any] = {}
        self.trace = None
        self.live_export_error: Optional[str] = None
        #: which source served each concern (simulator RunResult.sources), once the run has a result
        self.sources: Optional[dict[str, Any]] = None
        self.complete_claims: set[str] = set()       # files written saying "complete"

    # ---------------------------------------------------------------------------- provenance
    def run_json(self, status: str, incomplete: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        sc, su = self.su.scenario, self.su
        d: dict[str, Any] = {
            "tool": "slotscope", "status": status,
            "version": __version__, "commit": su.extra["commit"], "scenario": sc.name,
            "scenario_path": sc.source, "scenario_hash": sc.hash, "design": su.design.name,
            "design_description": su.design.description, "seed": sc.seed, "max_steps": sc.max_steps,
            "device": str(su.device), "device_name": su.extra["device_name"], "geometry": su.geometry,
            "store": su.store, "cuda_graphs": su.extra.get("cuda_graphs"),
            "backends": list(sc.backends), "layers": self.layers,
            "model": sc.model.name, "window": sc.model.window,
            "description": sc.description, "timings": self.timings, "python": sys.version.split()[0],
            "torch": torch.__version__, "pid": os.getpid(),
            "engine": su.engine, "engine_release": sc.engine_release,
        }
        if su.runtime is not None:
            from .engine_run import pieces_table

            d["engine_pieces"] = pieces_table(su.runtime)
            d["timings"].setdefault("engine_import_s", round(getattr(su.runtime, "import_s", 0.0), 3))
        if self.sources is not None:
            d["sources"] = self.sources
        if incomplete is not None:
            d["incomplete"] = incomplete
        if self.live_export_error is not None:
            d["live_export_error"] = self.live_export_error
        return d

    def write_run_json(self, status: str, incomplete: Optional[dict[str, Any]] = None) -> None:
        write_json_atomic(self.out / "run.json", self.run_json(status, incomplete))
        (self.complete_claims.add if status == "complete" else self.complete_claims.discard)("run.json")

    def _begin(self, run: Optional[RunInfo] = None) -> None:
        """The run begins (its set-up passed; its layers, the draft's too, are known): the previous run's files
        go, scenario.toml and run.json come before the first step."""
        if run is not None:
            self.layers = [[l.layer, l.kind] for l in run.layers]
        self.rd.begin()
        write_atomic(self.out / "scenario.toml", (self.su.given or self.su.scenario).to_toml())
        self.write_run_json("running")

    # ---------------------------------------------------------------------------- the run
    def run(self) -> RunOutput:
        su = self.su
        streaming = StreamingOutputs(self.out, on_start=self._begin)
        observers: list[RunObserver] = [self.timeline, *su.opts.extra_observers, streaming]
        if su.opts.trace_level != "off":
            from tracing.session import TraceSession

            self.trace = TraceSession(self.out, su.opts.trace_level, otlp_endpoint=su.opts.otlp_endpoint)
            observers.append(self.trace.observer)
        progress = ProgressTracker(su.opts.progress)
        t0 = time.perf_counter()
        try:
            result = _simulate(su, ObserverFanout(observers), progress)
        except BaseException as exc:
            self.timings["run_s"] = time.perf_counter() - t0
            self._stopped(exc, streaming)
            raise
        self.timings["run_s"] = time.perf_counter() - t0
        incomplete = cut_marker(su.scenario.max_steps, len(result.steps), progress)
        try:
            streaming.close()
            summary = self._write_outputs(result, incomplete)
        except BaseException as exc:      # a signal or a failed write after the last step: never left complete
            self._stopped_writing(exc, result)
            raise
        return RunOutput(result, summary, self.out, self.timings, incomplete=incomplete,
                         live_export_error=self.live_export_error, faults=self.su.faults)

    def _stopped(self, exc: BaseException, streaming: StreamingOutputs) -> None:
        """The run stopped. Refused or signalled before it began: nothing was touched (say so). Otherwise its
        partial outputs, marked incomplete."""
        if not self.rd.begun and isinstance(exc, REFUSALS + (KeyboardInterrupt, RunStopped)):
            exc.outputs_untouched = True  # type: ignore[attr-defined]
            return
        partial = getattr(exc, "partial_result", None)
        try:
            if not self.rd.begun:
                self._begin()                # a crash in the set-up: the directory records it
            streaming.close(partial.steps if partial is not None else ())
        except Exception as e:  # noqa: BLE001 - the summary must still be written
            self.timings["streaming_error"] = f"{type(e).__name__}: {e}"[:500]
        marker = stop_marker(exc, len(partial.steps) if partial is not None else 0)
        exc.partial_outputs = marker  # type: ignore[attr-defined]
        self._write_partial(exc, partial, marker)

    def _stopped_writing(self, exc: BaseException, result: RunResult) -> None:
        marker = stop_marker(exc, len(result.steps))
        if not isinstance(exc, OutputError):
            marker["message"] += " while the outputs were written"
        exc.partial_outputs = marker  # type: ignore[attr-defined]
        self._write_partial(exc, result, marker)

    def _write_outputs(self, result: RunResult, incomplete: Optional[dict[str, Any]]) -> dict[str, Any]:
        """summary.json, shapes.jsonl and run.json first (cheap, what every other tool reads), then the
        trace and the report; run.json again with their timings."""
        t1 = time.perf_counter()
        self.sources = result.sources
        summary = summary_of(self.su.scenario, self.su.design, result, incomplete, self.su.engine)
        if self.su.faults is not None:
            # --inject: every fault, and what detected it (simulator/plugins/faults.py)
            summary["faults"] = self.su.faults.summary()
            write_atomic(self.out / "faults.jsonl", self.su.faults.jsonl())
        self._write_shapes()
        write_json_atomic(self.out / "summary.json", summary)
        if incomplete is None:
            self.complete_claims.add("summary.json")
        status = "complete" if incomplete is None else "incomplete"
        self.write_run_json(status, incomplete)
        self.timings["write_s"] = time.perf_counter() - t1
        if self.trace is not None:
            from tracing.processor import SpanLossError

            t2 = time.perf_counter()
            self.timings["trace"] = as_output_error(lambda: self.trace.finish(result.info, live_failure="report"),
                                                    self.out / "trace.otlp.jsonl", (SpanLossError,))
            self.live_export_error = self.timings["trace"].get("live_export_error")
            self.timings["trace_s"] = time.perf_counter() - t2
        if self.su.opts.report:
            t3 = time.perf_counter()
            from reports.html import write_report

            as_output_error(lambda: write_report(self.out), self.out / "report.html")
            if incomplete is None:
                self.complete_claims.add("report.html")
            self.timings["report_s"] = time.perf_counter() - t3
        self.write_run_json(status, incomplete)
        self.rd.free_reserve()
        return summary

    def _write_partial(self, exc: BaseException, partial: Optional[RunResult], marker: dict[str, Any]) -> None:
        """What a stopped run leaves: the summary so far (marked incomplete), shapes, run.json, then, as far as
        they go, the trace and the report. The kept-back room is freed first (a full disk); a file that cannot
        say incomplete and said complete is removed; a failure here never hides the run's own error."""
        self.rd.free_reserve()
        exc.partial_summary = None if partial is None else False  # type: ignore[attr-defined]
        with signals_held():                 # summary.json and run.json say incomplete before a signal acts
            if partial is not None:
                self.sources = partial.sources
                summary = summary_of(self.su.scenario, self.su.design, partial, marker, self.su.engine)
                exc.partial_summary = self._try_write("summary.json", lambda: write_json_atomic(  # type: ignore
                    self.out / "summary.json", summary))
                self._try_write("shapes.jsonl", self._write_shapes)
            self._try_write("run.json", lambda: self.write_run_json("incomplete", marker))
        if partial is None:
            return
        if self.trace is not None and not self.trace.finished:
            try:
                self.timings["trace"] = self.trace.finish(partial.info, live_failure="report")
                self.live_export_error = self.timings["trace"].get("live_export_error")
            except Exception as e:  # noqa: BLE001 - the run's own failure is what gets reported
                self.timings["trace_error"] = f"{type(e).__name__}: {e}"[:500]
        whole_lines(self.out / "trace.otlp.jsonl")
        if self.su.opts.report:
            from reports.html import write_report

            self._try_write("report.html", lambda: write_report(self.out), (Exception,))
        self._try_write("run.json", lambda: self.write_run_json("incomplete", marker))

    def _try_write(self, name: str, write, catch: tuple = (OSError,)) -> bool:
        """``write()``; on failure the error goes to run.json's timings and a file of ``name`` that said complete
        goes (whole or absent, never a complete claim). Whether it was written."""
        try:
            write()
            self.complete_claims.discard(name)
            return True
        except catch as e:
            self.timings.setdefault("write_errors", []).append(f"{name}: {type(e).__name__}: {e}"[:500])
            if name in self.complete_claims:
                try:
                    (self.out / name).unlink()
                except OSError:
                    pass
                self.complete_claims.discard(name)
            return False

    def _write_shapes(self) -> None:
        write_atomic(self.out / "shapes.jsonl", jsonl_text(
            {"step": s, "backend": b, "kind": k, "loc_len": l, "swa_loc_len": w} for s, b, k, l, w in self.timeline.rows))
