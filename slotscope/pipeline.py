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
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from simulator.designs import Design, load_design
from simulator.observe import ObserverFanout, RunObserver
from simulator.records import FINDING_CLASSES, RunInfo, StepRecord
from simulator.run import RunResult, run_simulation
from simulator.scenario import Scenario, load_scenario

from . import __version__
from .resources import check_resources

DEVICES = ("auto", "cpu", "cuda")


class UsageError(ValueError):
    """A command-line choice that cannot be honoured here (exit 2)."""


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
        self._seen: set[tuple[int, str, str]] = set()

    def on_run_start(self, run: RunInfo) -> None:
        self._kind = {l.layer: l.kind for l in run.layers}

    def on_step(self, step: StepRecord) -> None:
        self._seen.clear()

    def on_boundary(self, step, backend, layer, loc_len, swa_loc_len, loc_dtype, swa_loc_dtype, t0, t1, error):
        kind = self._kind[layer]
        key = (step, backend, kind)
        if key not in self._seen:
            self._seen.add(key)
            self.rows.append((step, backend, kind, loc_len, swa_loc_len))

    def on_findings(self, findings) -> None:
        pass

    def on_run_end(self) -> None:
        pass


class StreamingOutputs:
    """Observer that writes findings.jsonl and steps.jsonl as the run goes, flushed every step, so a
    crash, ^C or kill keeps everything found up to the last finished step."""

    def __init__(self, out: Path):
        self._findings = open(out / "findings.jsonl", "w")
        self._steps = open(out / "steps.jsonl", "w")

    def on_run_start(self, run: RunInfo) -> None:
        pass

    def on_boundary(self, *args) -> None:
        pass

    def on_findings(self, findings) -> None:
        for f in findings:
            self._findings.write(json.dumps(f.to_json(), separators=(",", ":")))
            self._findings.write("\n")

    def on_step(self, step: StepRecord) -> None:
        self._steps.write(json.dumps(_step_json(step), separators=(",", ":")))
        self._steps.write("\n")
        self._findings.flush()
        self._steps.flush()

    def on_run_end(self) -> None:
        self.close()

    def close(self) -> None:
        for f in (self._findings, self._steps):
            if not f.closed:
                f.close()


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
    extra_observers: Sequence[RunObserver] = field(default_factory=tuple)


@dataclass
class RunOutput:
    result: RunResult
    summary: dict[str, Any]
    out_dir: Optional[Path]
    timings: dict[str, float]


def make_draft_pool_factory(device: torch.device, geometry: str, store: str):
    """Pools under test for any model (the draft's own layers and geometry, or the target's)."""
    from cuda_path.pool import TaggedKVPool

    def make(model, full_rows: int, swa_rows: int, skip_index):
        return TaggedKVPool(model, full_rows, swa_rows, device=device, geometry=geometry, store_impl=store,
                            skip_index=skip_index)

    return make


def make_pool_factory(scenario: Scenario, device: torch.device, geometry: str, store: str):
    """Pools under test for the scenario's (target) model."""
    make = make_draft_pool_factory(device, geometry, store)
    return lambda full_rows, swa_rows, skip_index: make(scenario.model, full_rows, swa_rows, skip_index)


def summary_of(scenario: Scenario, design: Design, result: RunResult) -> dict[str, Any]:
    return {
        "scenario": scenario.name,
        "design": design.name,
        "seed": scenario.seed,
        "backends": {name: st.to_json() for name, st in result.backends.items()},
        "steps": len(result.steps),
        "crossings": result.crossings,
        "findings_total": result.total_findings,
        "findings_detail_truncated": result.findings_truncated,
    }


def _write_jsonl(path: Path, rows) -> None:
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")))
            f.write("\n")


def run_scenario(scenario_or_path: Scenario | str | Path, out_dir: Optional[str | Path] = None,
                 options: Optional[RunOptions] = None) -> RunOutput:
    """Run one scenario end to end and write its outputs to ``out_dir`` (if given)."""
    opts = options or RunOptions()
    scenario = scenario_or_path if isinstance(scenario_or_path, Scenario) else load_scenario(scenario_or_path)
    scenario = scenario.with_overrides(design=opts.design, backends=opts.backends, seed=opts.seed)
    design = load_design(scenario.design)
    device = resolve_device(opts.device)
    if "SLOTSCOPE_TORCH_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["SLOTSCOPE_TORCH_THREADS"]))
    elif device.type == "cpu":
        # the hot path is many small tensor ops: intra-op threads only add hand-off latency
        torch.set_num_threads(1)
    geometry = opts.geometry or ("real" if device.type == "cuda" else "compact")
    store = opts.store or ("triton" if device.type == "cuda" else "torch")
    check_resources(scenario, design, device, geometry)   # will it fit? (exit 2 naming the field)
    if store == "triton" and device.type == "cpu":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise UsageError("--store triton on cpu needs TRITON_INTERPRET=1 before triton is imported")
        os.environ["TRITON_INTERPRET"] = "1"    # the same kernel, run by Triton's interpreter
    timeline = ShapeTimeline()
    observers: list[RunObserver] = [timeline, *opts.extra_observers]
    trace = None
    out = Path(out_dir) if out_dir is not None else None
    streaming = None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        streaming = StreamingOutputs(out)
        observers.append(streaming)
        if opts.trace_level != "off":
            from tracing.session import TraceSession

            trace = TraceSession(out, opts.trace_level, otlp_endpoint=opts.otlp_endpoint)
            observers.append(trace.observer)
    observer: RunObserver = ObserverFanout(observers) if len(observers) > 1 else observers[0]
    extra = {"geometry": geometry, "store": store, "commit": git_commit(), "device_name": device_name(device)}
    executor = None
    if device.type == "cuda" and store == "triton" and opts.cuda_graphs:
        from cuda_path.graphs import CudaGraphExecutor

        executor = CudaGraphExecutor()
    extra["cuda_graphs"] = executor is not None
    t0 = time.perf_counter()
    try:
        result = run_simulation(scenario, design, make_pool_factory(scenario, device, geometry, store),
                                device=device, observer=observer, progress=opts.progress, run_info_extra=extra,
                                version=__version__, max_steps=opts.max_steps, executor=executor,
                                make_draft_pool=make_draft_pool_factory(device, geometry, store))
    except BaseException as exc:
        partial = getattr(exc, "partial_result", None)
        if out is not None and partial is not None:
            streaming.close()
            summary = summary_of(scenario, design, partial)
            summary["incomplete"] = {"error": f"{type(exc).__name__}: {exc}", "steps_done": len(partial.steps)}
            (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
            _write_shapes(out, timeline)
            print(f"slotscope: run stopped after {len(partial.steps)} steps ({type(exc).__name__}); "
                  f"partial outputs in {out}/ (summary.json says incomplete)", file=sys.stderr)
        raise
    timings = {"run_s": time.perf_counter() - t0}
    summary = summary_of(scenario, design, result)
    if out is not None:
        t1 = time.perf_counter()
        (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
        _write_shapes(out, timeline)
        (out / "scenario.toml").write_text(scenario.raw)
        timings["write_s"] = time.perf_counter() - t1
        if trace is not None:
            t2 = time.perf_counter()
            timings["trace"] = trace.finish(result.info)
            timings["trace_s"] = time.perf_counter() - t2
        run_json = {
            "version": __version__, "commit": extra["commit"], "scenario": scenario.name,
            "scenario_path": scenario.source, "scenario_hash": scenario.hash, "design": design.name,
            "design_description": design.description, "seed": scenario.seed, "device": str(device),
            "device_name": extra["device_name"], "geometry": geometry, "store": store,
            "cuda_graphs": extra["cuda_graphs"],
            "backends": list(scenario.backends), "layers": [[l.layer, l.kind] for l in result.info.layers],
            "model": scenario.model.name, "window": scenario.model.window,
            "description": scenario.description, "timings": timings, "python": sys.version.split()[0],
            "torch": torch.__version__,
        }
        (out / "run.json").write_text(json.dumps(run_json, indent=2) + "\n")
        if opts.report:
            t3 = time.perf_counter()
            from reports.html import write_report

            write_report(out)
            timings["report_s"] = time.perf_counter() - t3
            run_json["timings"] = timings
            (out / "run.json").write_text(json.dumps(run_json, indent=2) + "\n")
    return RunOutput(result=result, summary=summary, out_dir=out, timings=timings)


def _write_shapes(out: Path, timeline: ShapeTimeline) -> None:
    _write_jsonl(out / "shapes.jsonl", ({"step": s, "backend": b, "kind": k, "loc_len": l, "swa_loc_len": w}
                                        for s, b, k, l, w in timeline.rows))


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
             "out_of_range": "oor", "length_mismatch": "len_mism"}
    head = ["design", "backend", "writes"] + [short[c] for c in FINDING_CLASSES] + ["first (step/layer/class)"]
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
