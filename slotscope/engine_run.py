"""A run with a real SGLang release in the write path (``slotscope run --engine``), over engine_path.

What this module adds to engine_path (which owns every ``import sglang``):

* :func:`load_runtime` activates the release an ``engine_path.EngineSpec`` names (``--engine``, read by
  slotscope/options.py, or the scenario's ``engine_release``), fetching it into slotscope's cache when
  missing, and builds its ``EngineRuntime``: the design, allocator factory and pool factory of
  docs/ENGINE.md's "Integration plan".
* :func:`check_scenario` refuses a scenario an engine run cannot drive (a PD decode node on a release
  without a model of its row free) before the import;
* :func:`check_options` says which ``run`` options an engine run cannot honour (a clear UsageError):
  the compact K/V geometry and the release's own store (on the CPU its fallback ``k_cache[loc] = k``;
  with ``--device cuda`` its CUDA store, engine_path.pool.release_store); :func:`engine_layout` is
  the geometry and draft-pool store an engine run takes on either device.
* :func:`allocator_seam` hands the engine's allocator to ``run_simulation`` (its
  ``allocator_factory`` argument).
* :func:`verdict` is one release's verdict on one scenario, run in a subprocess of its own by
  ``slotscope bisect`` (``engine_path.isolate.call``).
* :func:`release_log_kept` keeps the release's log records of a run off the terminal (one line after it).
* :func:`pieces_table` is the "which pieces were the engine's" table, from the runtime's own
  ``describe()`` (engine_path's list of what it ran), for run.json and the report.
"""
from __future__ import annotations

import atexit
import gc
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional



def check_options(device: str, geometry: Optional[str], store: Optional[str], design: Optional[str]) -> None:
    """The run options an engine run cannot honour (UsageError, exit 2)."""
    from .rundir import UsageError

    if device not in ("cpu", "cuda", "auto"):
        raise UsageError(f"--device {device} with --engine: the adapter drives the release's CPU and CUDA "
                         f"stores only (--device cpu | cuda | auto)")
    if geometry not in (None, "compact"):
        raise UsageError(f"--geometry {geometry} with --engine: the engine's pool is built with the compact "
                         f"geometry (1 head of 16 lanes per row); leave --geometry out")
    if store not in (None, "torch"):
        raise UsageError(f"--store {store} with --engine: the store is the release's own "
                         f"(SWAKVPool.set_kv_buffer: its CPU fallback, or its CUDA store with --device cuda); "
                         f"leave --store out")
    if design is not None:
        raise UsageError(f"--design {design} with --engine: the engine's design is the release's own code "
                         f"(translation and KVWriteLoc); run the model design without --engine")


def check_scenario(scenario, spec=None) -> None:
    """What of a scenario an engine run cannot drive, refused before the release is imported (ScenarioError,
    exit 2): a PD decode node (engine.pd_decode) on a pinned release slotscope has no model of with the decode
    node's row free (``ReleaseBehaviour.pd_row_free``: sglang-0.5.23's). The decode node's pre-allocation
    (``alloc_extend_swa_tail``) and finish (``free_kv_row_segments``) then run through the release; the
    mid-2026 node's free paths (the A1 / A2 switches) are the model's only. An installed sglang (no version
    pinned) is checked once imported, by the scheduler (simulator/scheduling/pd_decode.py), with the same exit."""
    from simulator.engine_model.release_model import release_of
    from simulator.run import scheduler_kind
    from simulator.scenario import ScenarioError

    version = getattr(spec, "version", None)
    if scheduler_kind(scenario) != "pd_decode" or version is None:
        return
    model = release_model_design(version)
    if model is None or not release_of(model).pd_row_free:
        raise ScenarioError(f"{scenario.source}: engine.pd_decode with --engine sglang=={version}: slotscope has no "
                            f"model of that release's PD decode node (its finish through free_kv_row_segments: "
                            f"sglang-0.5.23); the mid-2026 node's free paths (A1 / A2) are the model's: run it "
                            f"without --engine, or with --engine sglang==0.5.23")


def engine_layout(opts_geometry: Optional[str], opts_store: Optional[str]) -> tuple[str, str]:
    """(geometry, store) of an engine run on any device: the release's pool is built with the compact
    geometry, and "torch" is the store of the pools that stay ours (draft pools); no CUDA-graph executor."""
    return opts_geometry or "compact", opts_store or "torch"


def load_runtime(spec, *, quiet: bool = False, device: str = "cpu"):
    """Import the release (fetching it first if needed) and build its runtime on ``device`` ("cpu" or
    "cuda"); EngineError on failure."""
    from engine_path.api import load
    from engine_path.releases import active, is_cached
    from engine_path.runtime import EngineRuntime

    t0 = time.perf_counter()
    if not quiet and active() is None:
        what = str(spec)
        if spec.version is not None and not is_cached(spec.version):
            what += " (fetching it into slotscope's cache first)"
        print(f"slotscope: importing {what} ...", file=sys.stderr, flush=True)
    api = load(spec, device=device)
    rt = EngineRuntime(api, device=device, model=release_model_design(api.info.version))
    rt.import_s = time.perf_counter() - t0        # type: ignore[attr-defined]
    _kept_out_of_collections(f"sglang {api.info.version} {api.info.path}")
    if not quiet:
        print(f"slotscope: engine sglang {api.info.version} from {api.info.path} ({rt.import_s:.1f} s"
              f"{', device ' + device if device != 'cpu' else ''})", file=sys.stderr, flush=True)
    return rt


def load_vllm_runtime(scenario, spec, opts, device: str):
    """A vLLM run's scenario (one backend boundary, both pools the block pool's size) and runtime, the release
    imported (fetched first if needed); ScenarioError for what vLLM's driver cannot run yet, UsageError for
    options it cannot honour, EngineError on the import."""
    from engine_path.vllm.release import activate, resolved
    from engine_path.vllm.runtime import VllmRuntime
    from engine_path.vllm.scheduler import unsupported
    from simulator.scenario import ScenarioError

    from .rundir import UsageError

    spec = resolved(spec)
    why = unsupported(scenario)
    if why:
        raise ScenarioError(f"{scenario.source}: --engine {spec}: {why}")
    if device not in ("cpu", "cuda"):
        raise UsageError(f"--engine {spec} --device {device}: vLLM runs on the CPU or on CUDA")
    if opts.backends is not None:
        raise UsageError(f"--backends with --engine {spec}: a vLLM run has one boundary, 'vllm' (every vLLM attention "
                         f"backend writes through reshape_and_cache_flash with its group's slot mapping)")
    if opts.scheduler not in (None, "auto", "release"):
        raise UsageError(f"--scheduler {opts.scheduler} with --engine {spec}: vLLM's own scheduler makes every batch "
                         f"(slotscope has no model of vLLM's scheduler yet)")
    t0 = time.perf_counter()
    if not opts.quiet_engine:
        print(f"slotscope: importing {spec} ...", file=sys.stderr, flush=True)
    info = activate(spec, device)
    rt = VllmRuntime(info, device=device)
    rt.import_s = time.perf_counter() - t0
    _kept_out_of_collections(f"vllm {info.version} {info.path}")
    if not opts.quiet_engine:
        print(f"slotscope: engine vllm {info.version} from {info.path} ({rt.import_s:.1f} s)", file=sys.stderr,
              flush=True)
    return rt.scenario_as_run(scenario), rt


def _kept_out_of_collections(release: str) -> None:
    """The release's modules live as long as the process (0.5.23: some 600 000 objects): frozen, they are out of
    every scan of the cyclic collector, each of which took 0.3-0.4 s of a run on a CPU (docs/BENCHMARKS.md).

    Once per release and process, after its import (the first run's runtime with it), the garbage of earlier runs
    collected first: a freeze keeps whatever is alive then for ever, so freezing at every run's start
    kept each earlier run's cyclic garbage (its pools, the release's block pool) and a long ``fuzz --engine vllm``
    grew by some 30 MB a draw until the kernel killed it. Unfrozen at exit, so the interpreter's teardown still
    frees them (triton's bindings print leak reports otherwise)."""
    if release in _FROZEN:
        return
    gc.collect()
    gc.freeze()
    _FROZEN.add(release)
    if len(_FROZEN) == 1:
        atexit.register(gc.unfreeze)


_FROZEN: set = set()          # the releases whose import this process froze


def release_model_design(version: str):
    """Our model of the release (``sglang-VERSION``), for the parts of an engine run that stay ours
    (backend metadata beyond the SWA ids, the scheduler's release behaviour); None when slotscope has
    no model of that release (the base backend specs and the mid-2026 behaviour are used then)."""
    from simulator.designs.catalogue import BUILTIN_DESIGNS

    cls = BUILTIN_DESIGNS.get(f"sglang-{version}")
    return None if cls is None else cls()


@contextmanager
def release_log_kept(runtime, *, quiet: bool = False) -> Iterator[None]:
    """The release's log records of the run kept (engine_path.release_log) instead of printed as they come;
    afterwards, unless ``quiet``, one line on stderr with their count and the first (crash or not)."""
    from engine_path.release_log import ReleaseLog

    log = runtime.release_log = ReleaseLog().attach()
    try:
        yield
    finally:
        log.detach()
        line = log.summary_line()
        if line is not None and not quiet:
            print(f"slotscope: {line}", file=sys.stderr, flush=True)


@contextmanager
def allocator_seam(runtime, run_kwargs: dict) -> Iterator[None]:
    """Make ``run_simulation`` allocate through the release's allocator."""
    run_kwargs["allocator_factory"] = runtime.allocator_factory
    yield


def engine_json(runtime) -> Optional[dict]:
    return None if runtime is None else runtime.api.info.to_json()


def pieces_table(runtime) -> dict[str, Any]:
    """run.json's ``engine_pieces``: what engine_path says it ran of the release, and what stayed ours."""
    d = runtime.describe()
    info = d.get("engine") or runtime.api.info.to_json()
    choice = getattr(runtime, "scheduler_choice", None)
    rows = [{"piece": p, "whose": "engine", "by": f"{info['name']} {info['version']}"} for p in d.get("engine_pieces", ())]
    backends = d.get("backends")
    forward = ("backend metadata beyond the SWA ids", "per-layer narrowing")
    for p in d.get("model_pieces", ()):
        if backends is not None and p in forward:
            own = sorted(b for b, v in backends.items() if v["pieces"][0]["whose"] == "model")
            if not own:
                continue          # every backend's forward is the release's (its pieces: "backends" below)
            p = f"{p} (for {', '.join(own)})"
        if p == "scheduler" and choice is not None:
            p = f"scheduler ({choice['why']})"
        rows.append({"piece": p, "whose": "slotscope", "by": "modelled"})
    out = {"rows": rows, "features": d.get("features", {}), "device": d.get("device", "cpu")}
    if backends is not None:
        out["backends"] = backends           # per backend and model side: whose code ran each piece, and why
    for key in ("store", "graph_buffer_refreshes"):      # which store ran; whose code refreshed graph buffers
        if key in d:
            out[key] = d[key]
    if "allocator" in d:
        out["allocator"] = d["allocator"]
    if "scheduler" in d:
        out["scheduler"] = d["scheduler"]        # the release's Scheduler: what of its start-up stood in, and why
    if choice is not None:
        out["scheduler_choice"] = choice         # who made the batches (--scheduler), and why
    log = getattr(runtime, "release_log", None)
    if log is not None:
        out["release_log"] = log.describe()      # what the release logged during the run (kept off the terminal)
    return out


