"""What a run is made of: the options of ``run_scenario`` and their resolution into a :class:`Setup`.

:func:`setup` decides everything before the first step (the scenario with the command line's overrides, the
design or the engine's runtime, the device, the K/V geometry and the store), so a bad option is refused
(``UsageError``, exit 2) before any pool is allocated; an engine run's options are checked before its
release is imported (10-30 s).
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from engine_path.releases import EngineSpec
from simulator.core.observe import RunObserver
from simulator.designs.base import Design
from simulator.designs.loading import load_design
from simulator.scenario import MAX_SEED, Scenario, design_file_spec, load_scenario

from .rundir import UsageError

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


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


#: who makes an engine run's batches (``--scheduler``): auto is the release's own scheduler wherever it can run here
#: (the release, the scenario's features, the CPU), the model's otherwise, with the reason in run.json
SCHEDULERS = ("auto", "model", "release")


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
    #: a design file (path.py:Class) that a scenario read from a path names may run (--allow-design-files);
    #: a Scenario object the caller built, or a design given here (``design``), runs without it
    allow_design_files: bool = False
    forward_observer: Any = None          # simulator.core.observe.ForwardObserver (bench/vs_kv_canary.py)
    #: who makes the batches of an engine run: "release" (the release's own Scheduler:
    #: engine_path/schedule_source.py), "model" (our scheduler over the release's allocator), or "auto" (the
    #: release's where it can run here, else the model's: :func:`choose_scheduler`)
    scheduler: str = "auto"


@dataclass
class Setup:
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
    #: the scenario with the options applied, before an engine's own form of it (vLLM: one boundary, one pool
    #: size): what scenario.toml holds, so that ``slotscope run DIR/scenario.toml`` runs it again
    given: Optional[Scenario] = None

    @property
    def engine(self) -> Optional[dict[str, Any]]:
        """The release in the write path (summary.json's and run.json's ``"engine"``); ``replaces_design``: the
        scenario's own design where the release's code ran instead of it (the verdict is about the release);
        ``scheduler``: whose scheduler made the batches ("release" or "model": engine_pieces.scheduler_choice)."""
        from .engine_run import engine_json

        got = engine_json(self.runtime)
        if got is not None and self.scenario.design != self.design.name:
            got = {**got, "replaces_design": self.scenario.design}
        choice = getattr(self.runtime, "scheduler_choice", None)
        if got is not None and choice is not None:
            got = {**got, "scheduler": choice["scheduler"]}      # whose scheduler made the batches (release | model)
        return got


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


ALLOW_FLAG = "--allow-design-files"


def check_design_file(scenario: Scenario, given: Optional[str], allowed: bool, *, field: str = "design",
                      flag: str = ALLOW_FLAG) -> None:
    """A scenario file is data (you may have it from someone else): a Python design file it names runs only when
    the user says so (``flag``), or gives the design on the command line (``given``). UsageError otherwise,
    naming the scenario file, the design file and the flag."""
    spec = design_file_spec(scenario.design)
    if given is not None or allowed or spec is None:
        return
    raise UsageError(f"{scenario.source}: {field}: names the Python file {spec[0]} (class {spec[1]}), which running "
                     f"the scenario would import and execute. A scenario file is data you may have got from someone "
                     f"else, so its design file runs only when you say so: pass {flag} if you trust {spec[0]}, or "
                     f"give the design yourself (--design {scenario.design})")


def overlap_timeline(scenario: Scenario, engine: str = "") -> bool:
    """Whether the run goes on SGLang's overlap timeline (simulator/plugins/overlap.py): ``engine.overlap`` on a run
    whose engine (its spec, "" for the model) does not drive its own (a vLLM run's engine.overlap is its async
    scheduling, driven by the release's scheduler: the step source says so with ``owns_overlap``)."""
    return bool(scenario.engine.overlap) and not engine.startswith("vllm")


def engine_of(scenario: Scenario, opts) -> str:
    """The run's engine spec ("" for the model): ``--engine``, else the scenario's ``engine_release``."""
    return str(opts.engine or scenario.engine_release or "")


def check_faults(scenario: Scenario, inject: Sequence[str], engine: str = ""):
    """--inject, read and checked before the run (a FaultInjector, or None): UsageError naming the flag. ``engine``:
    the run's engine spec (:func:`overlap_timeline`)."""
    if not inject:
        return None
    from simulator.plugins.faults import FaultInjector, parse_inject

    try:
        kinds = parse_inject(inject)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if overlap_timeline(scenario, engine):
        raise UsageError(f"--inject: not modelled on an overlap timeline ({scenario.source}: engine.overlap = true; "
                         f"its landings are the timeline driver's)")
    return FaultInjector(kinds, scenario.seed)


def check_scheduler(scenario: Scenario, scheduler: str) -> None:
    """``--scheduler``: a known source, and a scenario the release's scheduler can drive (UsageError, exit 2; before
    the release's import)."""
    if scheduler not in SCHEDULERS:
        raise UsageError(f"--scheduler {scheduler}: one of {', '.join(SCHEDULERS)}")
    if scheduler == "release":
        from engine_path.scheduler import unsupported

        why = unsupported(scenario)
        if why:
            raise UsageError(f"--scheduler release: {scenario.source}: {why}; run it with --scheduler model")


def choose_scheduler(scenario: Scenario, scheduler: str, version: str, device: str) -> dict:
    """Who makes an engine run's batches, once the release is imported: ``{"scheduler": "release" | "model",
    "asked": scheduler, "why": ...}`` (run.json's ``engine_pieces.scheduler_choice``). ``--scheduler release`` on a
    release whose scheduler is not driven here is refused (UsageError, exit 2)."""
    from engine_path.scheduler import release_unsupported, unsupported

    if scheduler == "model":
        return {"scheduler": "model", "asked": scheduler, "why": "--scheduler model"}
    not_release = release_unsupported(version)
    if scheduler == "release":
        if not_release:
            raise UsageError(f"--scheduler release: {not_release}; run it with --scheduler model")
        return {"scheduler": "release", "asked": scheduler, "why": "--scheduler release"}
    why = not_release or unsupported(scenario) or (
        None if device == "cpu" else f"--device {device}: the release's scheduler is checked on the CPU only so "
                                     f"far (--scheduler release runs it there)")
    if why:
        return {"scheduler": "model", "asked": scheduler, "why": why}
    return {"scheduler": "release", "asked": scheduler, "why": "the release's own scheduler runs this scenario"}


def _engine_setup(scenario: Scenario, opts: RunOptions):
    """An engine run's scenario (as the engine runs it), design, device and runtime: the release imported."""
    from .engine_run import check_options, check_scenario, load_runtime, load_vllm_runtime
    from .options import engine_release_spec

    spec = opts.engine or engine_release_spec(scenario.engine_release, f"{scenario.source}: engine_release")
    check_options(opts.device, opts.geometry, opts.store, opts.design)
    device = resolve_device(opts.device)
    if spec.name == "vllm":
        scenario, runtime = load_vllm_runtime(scenario, spec, opts, device.type)
        return scenario, runtime.design, device, runtime
    check_scenario(scenario, spec)    # before the release's import (~15 s)
    check_scheduler(scenario, opts.scheduler)
    runtime = load_runtime(spec, quiet=opts.quiet_engine, device=device.type)   # cuda: the release's CUDA store
    choice = choose_scheduler(scenario, opts.scheduler, runtime.api.info.version, device.type)
    runtime.scheduler_choice = choice
    design = runtime.design
    if scenario.pool.unified:
        # the release's unified allocator in the loop; the scenario's modelled design and our pools
        from engine_path.unified import UnifiedEngineRuntime

        design = load_design(scenario.design)
        runtime = UnifiedEngineRuntime(runtime.api, design, scenario, device=device.type)
        runtime.scheduler_choice = choice
    return scenario, design, device, runtime


def setup(scenario_or_path: Scenario | str | Path, opts: RunOptions) -> Setup:
    if not isinstance(scenario_or_path, Scenario):
        scenario_or_path = load_scenario(scenario_or_path)
        check_design_file(scenario_or_path, opts.design, opts.allow_design_files)
    scenario = scenario_as_run(scenario_or_path, opts)
    faults = check_faults(scenario, opts.inject, engine_of(scenario, opts))
    runtime = None
    given = scenario
    if scenario.engine_release is not None:
        scenario, design, device, runtime = _engine_setup(scenario, opts)
    else:
        if opts.scheduler == "release":
            raise UsageError(f"--scheduler {opts.scheduler} needs --engine (the release whose scheduler runs)")
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
    return Setup(scenario, design, device, geometry, store, extra, opts, runtime, faults, given)

