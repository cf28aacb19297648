"""The pipeline: compose simulator, cuda_path, tracing and reports into one run with outputs on disk.

Outputs of ``run_scenario`` in DIR (deterministic ones are byte-identical for the same seed):
  summary.json      verdict per backend (the shape other tools rely on)        deterministic
  findings.jsonl    one finding per line                                        deterministic
  steps.jsonl       one forward step per line (mode, graph, tokens, occupancy)  deterministic
  shapes.jsonl      per step and backend: loc / swa_loc lengths per layer kind  deterministic
  scenario.toml     the scenario as run                                         deterministic
  run.json          provenance and timings (version, commit, device, wall time)
  trace.otlp.jsonl  OpenTelemetry spans (when tracing is on)
  report.html       the self-contained report

scenario.toml and run.json are written before the first step; findings.jsonl and steps.jsonl stream as
the run goes; the other files are written under a temporary name and renamed. A run that does not finish
(an exception, ^C, SIGTERM, a max_steps cut) says so in summary.json and run.json ("incomplete": reason,
message, steps done). The directory is locked for the run and cleared of an earlier run's files first
(slotscope/rundir.py).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from engine_path.releases import EngineSpec
from simulator.designs.base import Design
from simulator.designs.loading import load_design
from simulator.core.observe import ObserverFanout, RunObserver
from simulator.records import FINDING_CLASSES, RunInfo, StepRecord
from simulator.run import RunResult, run_simulation
from simulator.scenario import MAX_SEED, Scenario, load_scenario

from . import __version__
from .rundir import RunDir, UsageError, write_atomic, write_json_atomic
from .resources import check_resources

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available here (use --device cpu or auto)")
    if name not in DEVICES:
        raise UsageError(f"--device {name!r} (allowed: {', '.join(DEVICES)})")
    return torch.device(name)


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent.parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


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

    Each step's lines go to the file in one ``write`` of whole lines (no Python buffer that could
    spill half a line), so even after SIGKILL both files hold whole JSON lines only."""

    def __init__(self, out: Path, on_start: Optional[Callable[[RunInfo], None]] = None):
        self._on_start = on_start
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        self._findings = os.open(out / "findings.jsonl", flags, 0o644)
        self._steps = os.open(out / "steps.jsonl", flags, 0o644)
        self._pending: list[str] = []
        self.steps_written = 0
        self.closed = False

    def on_run_start(self, run: RunInfo) -> None:
        if self._on_start is not None:
            self._on_start(run)

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
            _write_all(self._findings, data)

    def on_step(self, step: StepRecord) -> None:
        self._write_step(step)

    def _write_step(self, step: StepRecord) -> None:
        self._write_findings()
        _write_all(self._steps, (json.dumps(_step_json(step), separators=(",", ":")) + "\n").encode())
        self.steps_written += 1

    def on_run_end(self) -> None:
        self.close()

    def close(self, steps: Sequence[StepRecord] = ()) -> None:
        """Write what is pending and close. ``steps``: the run's step records, when it stopped; any the
        file lacks (a signal between a step's two writes) are written first."""
        if self.closed:
            return
        self.closed = True
        try:
            self._write_findings()       # a step cut short: the findings its backends already had
            for step in steps[self.steps_written:]:
                self._write_step(step)
        finally:
            for fd in (self._findings, self._steps):
                os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


@dataclass
class RunOptions:
    design: Optional[str] = None
    backends: Optional[tuple[str, ...]] = None
    seed: Optional[int] = None
    device: str = "auto"
    geometry: Optional[str] = None        # default: compact on CPU, real on CUDA
    store: Optional[str] = None           # default: triton on CUDA, torch on CPU
    trace_level: str = "anomaly"
    otlp_endpoint: Optional[str] = None
    report: bool = True
    cuda_graphs: bool = True              # on CUDA with the Triton store: decode and piecewise graphs
    max_steps: Optional[int] = None
    progress: Optional[Callable[[int, int, int], None]] = None
    engine: Optional[EngineSpec] = None   # the release in the write path (None: the scenario's engine_release)
    quiet_engine: bool = False            # no "importing sglang ..." lines on stderr
    extra_observers: Sequence[RunObserver] = field(default_factory=tuple)
    inject: Sequence[str] = ()            # --inject KIND[:PROB] (simulator/plugins/faults.py)
    forward_observer: Any = None          # simulator.core.observe.ForwardObserver (bench/vs_kv_canary.py)


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


class RunStopped(BaseException):
    """Raised inside a run by the SIGTERM handler of :func:`stop_on_signals` (SIGINT raises
    KeyboardInterrupt); like it, it stops the run, whose partial outputs are then written."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


@contextmanager
def stop_on_signals():
    """While inside: SIGTERM raises :class:`RunStopped` and SIGINT KeyboardInterrupt, once; a second
    signal is ignored (with a line on stderr) so the partial outputs are written whole. A no-op outside
    the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum, frame):
        if fired:
            print(f"slotscope: {signal.Signals(signum).name} again: still writing the partial outputs "
                  "(SIGKILL abandons them)", file=sys.stderr)
            return
        fired.append(signum)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise RunStopped(signum)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def make_draft_pool_factory(device: torch.device, geometry: str, store: str, layout: Optional[str] = None):
    """Pools under test for any model (the draft's own layers and geometry, or the target's). ``layout``:
    cuda_path/pool.py's ``split`` or ``paired``; None: paired for real geometry on CUDA, else split."""
    from cuda_path.pool import TaggedKVPool

    def make(model, full_rows: int, swa_rows: int, skip_index):
        return TaggedKVPool(model, full_rows, swa_rows, device=device, geometry=geometry, store_impl=store,
                            skip_index=skip_index, layout=layout)

    return make


def make_pool_factory(scenario: Scenario, device: torch.device, geometry: str, store: str,
                      layout: Optional[str] = None):
    """Pools under test for the scenario's (target) model (``layout``: as :func:`make_draft_pool_factory`)."""
    make = make_draft_pool_factory(device, geometry, store, layout)
    return lambda full_rows, swa_rows, skip_index: make(scenario.model, full_rows, swa_rows, skip_index)


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


def _jsonl_text(rows) -> str:
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)


# ------------------------------------------------------------------------------------ one run

@dataclass
class _Setup:
    """What a run is made of, resolved from the scenario and the options before anything runs."""

    scenario: Scenario
    design: Design
    device: torch.device
    geometry: str
    store: str
    extra: dict[str, Any]
    opts: RunOptions
    runtime: Any = None                   # engine_path.runtime.EngineRuntime of an engine run
    faults: Any = None                    # --inject: simulator.plugins.faults.FaultInjector

    @property
    def engine(self) -> Optional[dict[str, Any]]:
        from .engine_run import engine_json

        return engine_json(self.runtime)


class _ProgressTracker:
    """Passes progress on and remembers the last (finished, total) requests, to tell a run that ended
    by itself from one cut by max_steps."""

    def __init__(self, inner: Optional[Callable[[int, int, int], None]]):
        self.inner = inner
        self.done: Optional[int] = None
        self.total: Optional[int] = None

    def __call__(self, step: int, done: int, total: int) -> None:
        self.done, self.total = done, total
        if self.inner is not None:
            self.inner(step, done, total)

    @property
    def all_finished(self) -> bool:
        return self.total is not None and self.done is not None and self.done >= self.total


def scenario_as_run(scenario_or_path: Scenario | str | Path, opts: RunOptions) -> Scenario:
    """The scenario with the command line's overrides (design, backends, seed, max_steps) applied."""
    scenario = scenario_or_path if isinstance(scenario_or_path, Scenario) else load_scenario(scenario_or_path)
    if opts.max_steps is not None and not (isinstance(opts.max_steps, int) and opts.max_steps >= 1):
        raise UsageError(f"--max-steps must be an integer >= 1, got {opts.max_steps!r}")
    if opts.seed is not None and not (isinstance(opts.seed, int) and 0 <= opts.seed <= MAX_SEED):
        raise UsageError(f"--seed must be an integer in [0, 2^63), got {opts.seed!r}")
    if opts.engine is not None and not isinstance(opts.engine, EngineSpec):
        raise TypeError(f"RunOptions.engine is an EngineSpec (engine_path.releases.parse_spec makes one), "
                        f"got {opts.engine!r}")
    engine_release = None if opts.engine is None else str(opts.engine)
    return scenario.with_overrides(design=opts.design, backends=opts.backends, seed=opts.seed,
                                   max_steps=opts.max_steps, engine_release=engine_release)


def _setup(scenario_or_path: Scenario | str | Path, opts: RunOptions) -> _Setup:
    scenario = scenario_as_run(scenario_or_path, opts)
    runtime = None
    if scenario.engine_release is not None:
        from .engine_run import check_options, check_scenario, load_runtime
        from .options import engine_release_spec

        spec = opts.engine or engine_release_spec(scenario.engine_release, f"{scenario.source}: engine_release")
        check_options(opts.device, opts.geometry, opts.store, opts.design)
        check_scenario(scenario, spec)    # before the release's import (~15 s)
        device = resolve_device(opts.device)      # cuda: the release's CUDA store (engine_path.pool.release_store)
        runtime = load_runtime(spec, quiet=opts.quiet_engine, device=device.type)
        design = runtime.design
        if scenario.pool.unified:
            # the release's unified allocator in the loop; the scenario's modelled design and our pools
            from engine_path.unified import UnifiedEngineRuntime

            design = load_design(scenario.design)
            runtime = UnifiedEngineRuntime(runtime.api, design, scenario)
    else:
        design = load_design(scenario.design)
        device = resolve_device(opts.device)
    if "SLOTSCOPE_TORCH_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["SLOTSCOPE_TORCH_THREADS"]))
    elif device.type == "cpu":
        # the hot path is many small tensor ops: intra-op threads only add hand-off latency
        torch.set_num_threads(1)
    geometry = opts.geometry or ("real" if device.type == "cuda" else "compact")
    store = opts.store or ("triton" if device.type == "cuda" else "torch")
    if runtime is not None:
        from .engine_run import engine_layout

        geometry, store = engine_layout(opts.geometry, opts.store)
    if store == "triton" and device.type == "cpu":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise UsageError("--store triton on cpu needs TRITON_INTERPRET=1 before triton is imported")
        os.environ["TRITON_INTERPRET"] = "1"    # the same kernel, run by Triton's interpreter
    if opts.otlp_endpoint and opts.trace_level != "off":
        from tracing.live import FROM_ENV, traces_url

        if opts.otlp_endpoint != FROM_ENV:
            try:
                traces_url(opts.otlp_endpoint)
            except ValueError as e:
                raise UsageError(f"--otlp-endpoint: {e}") from None
    extra = {"geometry": geometry, "store": store, "commit": git_commit(), "device_name": device_name(device)}
    if runtime is not None:
        extra.update({f"engine.{k}": v for k, v in runtime.api.info.to_json().items()})
    return _Setup(scenario, design, device, geometry, store, extra, opts, runtime)


def _simulate(su: _Setup, observer: RunObserver, progress: _ProgressTracker) -> RunResult:
    executor = None
    if su.device.type == "cuda" and su.store == "triton" and su.opts.cuda_graphs:
        from cuda_path.graphs import CudaGraphExecutor

        executor = CudaGraphExecutor()
    su.extra["cuda_graphs"] = executor is not None
    if su.opts.inject:
        from simulator.plugins.faults import FaultInjector, parse_inject

        try:
            kinds = parse_inject(su.opts.inject)
        except ValueError as e:
            raise UsageError(str(e)) from None
        su.faults = FaultInjector(kinds, su.scenario.seed)
    kwargs: dict[str, Any] = dict(device=su.device, observer=observer, progress=progress, run_info_extra=su.extra,
                                  version=__version__, max_steps=su.scenario.max_steps, executor=executor,
                                  make_draft_pool=make_draft_pool_factory(su.device, su.geometry, su.store))
    if su.faults is not None:
        kwargs["faults"] = su.faults
    if su.opts.forward_observer is not None:
        kwargs["forward_observer"] = su.opts.forward_observer
    if su.runtime is None or getattr(su.runtime, "unified", False):
        if su.runtime is not None:
            kwargs["allocator_factory"] = su.runtime.allocator_factory     # pool.unified: the release's allocator
        return run_simulation(su.scenario, su.design, make_pool_factory(su.scenario, su.device, su.geometry, su.store),
                              **kwargs)
    from .engine_run import allocator_seam

    # the release's allocator, translation, KVWriteLoc and SWAKVPool (docs/ENGINE.md); draft pools stay ours
    with allocator_seam(su.runtime, kwargs):
        return run_simulation(su.scenario, su.design, su.runtime.pool_factory(su.scenario.model), **kwargs)


def _cut_marker(su: _Setup, result: RunResult, progress: _ProgressTracker) -> Optional[dict[str, Any]]:
    """The "incomplete" entry of a run that max_steps stopped before its requests finished."""
    n = su.scenario.max_steps
    if n is None or len(result.steps) < n or progress.all_finished:
        return None
    return {"reason": "max_steps", "message": f"stopped by max_steps = {n} before every request finished",
            "steps_done": len(result.steps), "max_steps": n}


def stop_marker(exc: BaseException, steps_done: int) -> dict[str, Any]:
    """The "incomplete" entry of a run that an exception or a signal stopped."""
    if isinstance(exc, RunStopped):
        name = signal.Signals(exc.signum).name
        return {"reason": name, "message": f"stopped by {name}", "steps_done": steps_done}
    if isinstance(exc, KeyboardInterrupt):
        return {"reason": "SIGINT", "message": "interrupted (^C / SIGINT)", "steps_done": steps_done}
    error = f"{type(exc).__name__}: {exc}"
    return {"reason": "error", "message": f"the run failed: {error}"[:2000], "error": error[:2000],
            "steps_done": steps_done}


def run_scenario(scenario_or_path: Scenario | str | Path, out_dir: Optional[str | Path] = None,
                 options: Optional[RunOptions] = None) -> RunOutput:
    """Run one scenario end to end and write its outputs to ``out_dir`` (if given).

    With ``out_dir`` the directory is locked for the run and the previous run's files are removed first
    (see slotscope/rundir.py). A run stopped by an exception or a signal writes its partial outputs,
    marked incomplete, and re-raises; ``exc.partial_outputs`` then holds the "incomplete" entry.
    """
    opts = options or RunOptions()
    su = _setup(scenario_or_path, opts)
    check_resources(su.scenario, su.design, su.device, su.geometry)   # will it fit? (exit 2 naming the field)
    if out_dir is None:
        return _run_in_memory(su)
    with RunDir.open(out_dir) as rd:
        return _RunWriter(su, rd.path).run()


def _run_in_memory(su: _Setup) -> RunOutput:
    timeline = ShapeTimeline()
    observers: list[RunObserver] = [timeline, *su.opts.extra_observers]
    observer: RunObserver = ObserverFanout(observers) if len(observers) > 1 else observers[0]
    progress = _ProgressTracker(su.opts.progress)
    t0 = time.perf_counter()
    result = _simulate(su, observer, progress)
    incomplete = _cut_marker(su, result, progress)
    return RunOutput(result, summary_of(su.scenario, su.design, result, incomplete, su.engine), None,
                     {"run_s": time.perf_counter() - t0}, incomplete=incomplete, faults=su.faults)


class _RunWriter:
    """One run into a (locked, cleared) directory: provenance first, streamed files while it runs, the
    rest at the end, partial outputs when it is stopped."""

    def __init__(self, su: _Setup, out: Path):
        self.su, self.out = su, out
        self.timeline = ShapeTimeline()
        self.layers: list[list[Any]] = [[l.layer, l.kind] for l in su.scenario.model.layers()]
        self.timings: dict[str, Any] = {}
        self.trace = None
        self.live_export_error: Optional[str] = None

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
        if incomplete is not None:
            d["incomplete"] = incomplete
        if self.live_export_error is not None:
            d["live_export_error"] = self.live_export_error
        return d

    def write_run_json(self, status: str, incomplete: Optional[dict[str, Any]] = None) -> None:
        write_json_atomic(self.out / "run.json", self.run_json(status, incomplete))

    def _on_run_start(self, run: RunInfo) -> None:
        """The run's layers (the draft's too) are known now: run.json says so before the first step."""
        self.layers = [[l.layer, l.kind] for l in run.layers]
        self.write_run_json("running")

    # ---------------------------------------------------------------------------- the run
    def run(self) -> RunOutput:
        su = self.su
        write_atomic(self.out / "scenario.toml", su.scenario.to_toml())
        self.write_run_json("running")
        streaming = StreamingOutputs(self.out, on_start=self._on_run_start)
        observers: list[RunObserver] = [self.timeline, *su.opts.extra_observers, streaming]
        if su.opts.trace_level != "off":
            from tracing.session import TraceSession

            self.trace = TraceSession(self.out, su.opts.trace_level, otlp_endpoint=su.opts.otlp_endpoint)
            observers.append(self.trace.observer)
        progress = _ProgressTracker(su.opts.progress)
        t0 = time.perf_counter()
        try:
            result = _simulate(su, ObserverFanout(observers), progress)
        except BaseException as exc:
            partial = getattr(exc, "partial_result", None)
            self.timings["run_s"] = time.perf_counter() - t0
            try:
                streaming.close(partial.steps if partial is not None else ())
            except Exception as e:  # noqa: BLE001 - the summary must still be written
                self.timings["streaming_error"] = f"{type(e).__name__}: {e}"[:500]
            steps_done = len(partial.steps) if partial is not None else 0
            marker = stop_marker(exc, steps_done)
            exc.partial_outputs = marker  # type: ignore[attr-defined]
            self._write_partial(partial, marker)
            raise
        streaming.close()
        self.timings["run_s"] = time.perf_counter() - t0
        incomplete = _cut_marker(su, result, progress)
        summary = self._write_outputs(result, incomplete)
        return RunOutput(result, summary, self.out, self.timings, incomplete=incomplete,
                         live_export_error=self.live_export_error, faults=self.su.faults)

    def _write_outputs(self, result: RunResult, incomplete: Optional[dict[str, Any]]) -> dict[str, Any]:
        """summary.json, shapes.jsonl and run.json first (cheap, what every other tool reads), then the
        trace and the report; run.json again with their timings."""
        t1 = time.perf_counter()
        summary = summary_of(self.su.scenario, self.su.design, result, incomplete, self.su.engine)
        if self.su.faults is not None:
            # --inject: every fault, and what detected it (simulator/plugins/faults.py)
            summary["faults"] = self.su.faults.summary()
            write_atomic(self.out / "faults.jsonl", self.su.faults.jsonl())
        write_json_atomic(self.out / "summary.json", summary)
        self._write_shapes()
        status = "complete" if incomplete is None else "incomplete"
        self.write_run_json(status, incomplete)
        self.timings["write_s"] = time.perf_counter() - t1
        if self.trace is not None:
            t2 = time.perf_counter()
            self.timings["trace"] = self.trace.finish(result.info, live_failure="report")
            self.live_export_error = self.timings["trace"].get("live_export_error")
            self.timings["trace_s"] = time.perf_counter() - t2
        if self.su.opts.report:
            t3 = time.perf_counter()
            from reports.html import write_report

            write_report(self.out)
            self.timings["report_s"] = time.perf_counter() - t3
        self.write_run_json(status, incomplete)
        return summary

    def _write_partial(self, partial: Optional[RunResult], marker: dict[str, Any]) -> None:
        """What a stopped run leaves: the summary so far (marked incomplete), shapes, run.json, then,
        as far as they go, the trace and the report. A failure here never hides the run's own error."""
        if partial is not None:
            write_json_atomic(self.out / "summary.json", summary_of(self.su.scenario, self.su.design, partial, marker,
                                                                     self.su.engine))
            self._write_shapes()
        self.write_run_json("incomplete", marker)
        if partial is None:
            return
        if self.trace is not None:
            try:
                self.timings["trace"] = self.trace.finish(partial.info, live_failure="report")
                self.live_export_error = self.timings["trace"].get("live_export_error")
            except Exception as e:  # noqa: BLE001 - the run's own failure is what gets reported
                self.timings["trace_error"] = f"{type(e).__name__}: {e}"[:500]
        if self.su.opts.report:
            try:
                from reports.html import write_report

                write_report(self.out)
            except Exception as e:  # noqa: BLE001
                self.timings["report_error"] = f"{type(e).__name__}: {e}"[:500]
        self.write_run_json("incomplete", marker)

    def _write_shapes(self) -> None:
        write_atomic(self.out / "shapes.jsonl", _jsonl_text(
            {"step": s, "backend": b, "kind": k, "loc_len": l, "swa_loc_len": w} for s, b, k, l, w in self.timeline.rows))


def _step_json(s: StepRecord) -> dict[str, Any]:
    d = s.to_json()
    d.pop("t_start_ns", None)
    d.pop("t_end_ns", None)
    return d


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


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
