"""``slotscope sweep GRID.toml``: a grid of runs as Ray tasks, cached by scenario hash, one comparison report.

A grid file (examples/sweeps/) names the axes; every combination is one *point*:

    name      = "b1-b2"                           # optional, the report's title
    scenarios = ["../../scenarios/b1-pcg-dp-padding.toml"]   # files, relative to the grid file
    presets   = ["gpt-oss-20b"]                   # and/or model presets, each on the `base` scenario
    base      = "../../scenarios/smoke.toml"      # the scenario a preset replaces the model of (default smoke)
    designs   = ["sglang-pre-29460", "sglang-post-29460"]   # built-in or path.py:Class (relative to the file)
    engines   = ["sglang==0.5.23", "vllm==0.34.0"]   # real releases in the write path (docs/ENGINE.md,
                                                   # docs/VLLM.md); a release a worker has not imported runs in
                                                   # a process of its own
    backends  = ["flashinfer", "triton"]          # one point per backend (default: each scenario's own list)
    dp_sizes  = [1, 2]                            # engine.dp_size (default: the scenario's)
    page_sizes = [1, 16]                          # pool.page_size (pool sizes rounded up to a page)
    seeds     = [1, 2]                            # the run's seed (default: the scenario's)
    device    = "cpu"                             # "cuda": each point asks Ray for one GPU, else one CPU
    max_steps = 200                               # optional cut per point

At least one of scenarios / presets and one of designs / engines (``--engine SPEC`` on the command line
stands in for both: every point then runs with that engine). Every key is checked; an error names
the grid file and the field. A point's scenario (the overrides applied, then validated by
``parse_scenario``) has a hash: sha256 of its TOML as run, with a user design file's text. Results are
cached by it in ``OUT/points/<hash>/`` (``point.json`` and the run directory ``run/``), so a rerun of the
same or a grown grid runs only new points.

Runs: ``ray.init()`` on this machine by default (every core), ``--address`` for an existing cluster,
``--local`` for one process without Ray. A task whose worker dies is retried once by Ray
(``max_retries=1``) and reported as ``worker_died`` when it dies again; each point is written as soon as
it completes; ^C cancels what is left, keeps every finished point and writes the report for them (exit
130). The report ``OUT/report.html`` (reports/sweep.py): a verdict table (design or release x point),
the first divergence of each failing point, links to each point's own report. Exit 0 every point ran
(whatever its verdict), 1 some point could not run (error, worker died), 2 bad grid, 130 interrupted.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from engine_path.errors import EngineError
from engine_path.releases import EngineSpec
from simulator.scenario import (BACKENDS, Scenario, ScenarioError, design_file_spec, load_scenario, parse_scenario,
                                path_name_problem)
from simulator.scenario.models import PRESETS

from .rundir import UsageError, confined, describe, write_atomic

EXIT_OK, EXIT_POINT_FAILED, EXIT_BAD_INPUT, EXIT_SIGINT = 0, 1, 2, 130
DEFAULT_BASE = Path(__file__).resolve().parent.parent / "scenarios" / "smoke.toml"
RAY_HINT = "pip install 'slotscope[sweep]' (or pip install ray)"
GRID_KEYS = ("name", "scenarios", "presets", "base", "designs", "engines", "backends", "dp_sizes", "page_sizes",
             "seeds", "device", "max_steps")


# --------------------------------------------------------------------------- the grid

@dataclass(frozen=True)
class Grid:
    name: str
    sources: tuple[tuple[str, Scenario], ...]     # (label, base scenario) per scenario file or preset
    runners: tuple[tuple[str, str], ...]          # ("design", spec) | ("engine", release spec)
    backends: tuple[Optional[str], ...]           # None: the scenario's own backends
    dp_sizes: tuple[Optional[int], ...]
    page_sizes: tuple[Optional[int], ...]
    seeds: tuple[Optional[int], ...]
    device: str
    max_steps: Optional[int]


@dataclass(frozen=True)
class Point:
    source: str
    runner: tuple[str, str]
    backend: Optional[str]
    dp_size: Optional[int]
    page_size: Optional[int]
    seed: Optional[int]

    @property
    def label(self) -> str:
        """The point's column in the report (everything but the design or release)."""
        parts = [self.source]
        for key, v in (("backend", self.backend), ("dp", self.dp_size), ("page", self.page_size), ("seed", self.seed)):
            if v is not None:
                parts.append(f"{key}={v}")
        return " ".join(parts)

    @property
    def row(self) -> str:
        kind, spec = self.runner
        return spec if kind == "design" else f"engine {spec}"


def _fail(path: Path, key: str, msg: str) -> ScenarioError:
    return ScenarioError(f"{path}: {key}: {msg}")


def _list(data: dict, path: Path, key: str, kind: type, minimum: Optional[int] = None) -> list:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise _fail(path, key, f"must be a list, got {type(value).__name__}")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, kind):
            raise _fail(path, f"{key}[{i}]", f"must be {'an integer' if kind is int else 'a string'}, got {v!r}")
        if minimum is not None and v < minimum:
            raise _fail(path, f"{key}[{i}]", f"must be >= {minimum}, got {v}")
    if len(set(value)) != len(value):
        raise _fail(path, key, "names a value twice")
    return value


def _rel(path: Path, value: str) -> Path:
    p = Path(value)
    return p if p.is_absolute() else (path.parent / p)


def _sources(data: dict, path: Path) -> list[tuple[str, Scenario]]:
    out = []
    for i, f in enumerate(_list(data, path, "scenarios", str)):
        p = _rel(path, f)
        try:
            out.append((p.stem, load_scenario(p)))
        except ScenarioError as e:
            raise _fail(path, f"scenarios[{i}]", str(e)) from None
    presets = _list(data, path, "presets", str)
    if presets:
        base_key = data.get("base")
        if base_key is not None and not isinstance(base_key, str):
            raise _fail(path, "base", f"must be a scenario file path, got {base_key!r}")
        try:
            base = load_scenario(_rel(path, base_key) if base_key else DEFAULT_BASE)
        except ScenarioError as e:
            raise _fail(path, "base", str(e)) from None
        for i, name in enumerate(presets):
            if name not in PRESETS:
                raise _fail(path, f"presets[{i}]", f"{name!r} is not a preset (allowed: {', '.join(PRESETS)})")
            layers = len(base.model.layer_kinds)
            model = replace(PRESETS[name], layer_kinds=PRESETS[name].layer_kinds[:layers])
            out.append((f"{name}@{base.name}", replace(base, model=model, name=f"{base.name}-{name}")))
    if not out:
        raise _fail(path, "scenarios", "the grid needs at least one scenario file or preset (scenarios / presets)")
    labels = [label for label, _ in out]
    if len(set(labels)) != len(labels):
        raise _fail(path, "scenarios", "two scenarios have the same name")
    return out


def _runners(data: dict, path: Path, engine: Optional[EngineSpec] = None,
             allow_design_files: bool = False) -> list[tuple[str, str]]:
    """The grid's designs and engine releases, checked; with ``engine`` (--engine) that engine alone. A design
    file (path.py:Class) is imported only with ``allow_design_files`` (a grid is data, like a scenario)."""
    from simulator.designs.types import DesignError
    from simulator.designs.loading import load_design

    from .options import engine_release_spec

    out: list[tuple[str, str]] = []
    for i, d in enumerate(_list(data, path, "designs", str)):
        spec = d
        file_spec = design_file_spec(d)
        if file_spec is not None:
            spec = f"{_rel(path, file_spec[0]).resolve()}:{file_spec[1]}"
            if not allow_design_files:
                raise UsageError(f"{path}: designs[{i}]: names the Python file {spec.rsplit(':', 1)[0]}, which the "
                                 f"sweep would import and execute. A grid file is data you may have got from someone "
                                 f"else, so its design files run only when you say so: pass --allow-design-files "
                                 f"if you trust it")
        try:
            load_design(spec)
        except (DesignError, ValueError, OSError) as e:
            raise _fail(path, f"designs[{i}]", str(e)) from None
        out.append(("design", spec))
    for i, e in enumerate(_list(data, path, "engines", str)):
        try:
            out.append(("engine", str(engine_release_spec(e, f"{path}: engines[{i}]"))))
        except EngineError as exc:          # names the file and the field
            raise ScenarioError(str(exc)) from None
    if engine is not None:
        return [("engine", str(engine))]
    if not out:
        raise _fail(path, "designs", "the grid needs at least one design or engine release (designs / engines)")
    return out


def load_grid(path: str | Path, engine: Optional[EngineSpec] = None, allow_design_files: bool = False) -> Grid:
    """Read and check a grid file; every error names the file and the field. ``engine`` (--engine): every
    point runs with it, in place of the grid's designs and engines (which are still checked).
    ``allow_design_files``: the grid's design files may be imported (--allow-design-files)."""
    import tomllib

    path = Path(path)
    if path.is_dir():
        raise ScenarioError(f"{path}: is a directory, not a grid file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read grid file: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ScenarioError(f"{path}: not valid TOML: {e}") from None
    unknown = sorted(set(data) - set(GRID_KEYS))
    if unknown:
        raise _fail(path, unknown[0], f"unknown key (known keys: {', '.join(GRID_KEYS)})")
    backends = _list(data, path, "backends", str)
    for i, b in enumerate(backends):
        if b not in BACKENDS:
            raise _fail(path, f"backends[{i}]", f"{b!r} is not a modelled backend (allowed: {', '.join(BACKENDS)})")
    device = data.get("device", "cpu")
    if device not in ("cpu", "cuda"):
        raise _fail(path, "device", f"{device!r} is not allowed (allowed: cpu, cuda)")
    max_steps = data.get("max_steps")
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
        raise _fail(path, "max_steps", f"must be an integer >= 1, got {max_steps!r}")
    name = data.get("name", path.stem)
    problem = path_name_problem(name)     # it names the default output directory, out/sweep-<name>
    if problem is not None:
        raise _fail(path, "name", f"{name!r:.80} {problem}")
    return Grid(name=name, sources=tuple(_sources(data, path)),
                runners=tuple(_runners(data, path, engine, allow_design_files)),
                backends=tuple(backends) or (None,),
                dp_sizes=tuple(_list(data, path, "dp_sizes", int, 1)) or (None,),
                page_sizes=tuple(_list(data, path, "page_sizes", int, 1)) or (None,),
                seeds=tuple(_list(data, path, "seeds", int, 0)) or (None,), device=device, max_steps=max_steps)


def points(grid: Grid) -> list[Point]:
    return [Point(src, runner, b, dp, page, seed) for (src, _), runner, b, dp, page, seed in itertools.product(
        grid.sources, grid.runners, grid.backends, grid.dp_sizes, grid.page_sizes, grid.seeds)]


def _round_up(n: int, page: int) -> int:
    return -(-n // page) * page


def point_scenario(grid: Grid, p: Point) -> Scenario:
    """The point's scenario: the base with the point's overrides, written and read back (validated)."""
    sc = dict(grid.sources)[p.source]
    if p.page_size is not None:
        pool = replace(sc.pool, page_size=p.page_size, full_size=max(2 * p.page_size, _round_up(sc.pool.full_size,
                                                                                                  p.page_size)))
        spec = sc.engine.speculative
        if spec.draft_full_size is not None:
            spec = replace(spec, draft_full_size=max(2 * p.page_size, _round_up(spec.draft_full_size, p.page_size)))
        sc = replace(sc, pool=pool, engine=replace(sc.engine, speculative=spec))
    if p.dp_size is not None:
        sc = replace(sc, engine=replace(sc.engine, dp_size=p.dp_size))
    kind, spec_s = p.runner
    sc = sc.with_overrides(design=spec_s if kind == "design" else None,
                           engine_release=spec_s if kind == "engine" else None,
                           backends=(p.backend,) if p.backend else None, seed=p.seed, max_steps=grid.max_steps)
    if kind == "design":
        sc = replace(sc, engine_release=None)
    return parse_scenario(sc.to_toml(), f"{p.source}.toml")


def point_hash(sc: Scenario) -> str:
    """The cache key: the scenario as run, and a user design file's text."""
    h = hashlib.sha256(sc.raw.encode())
    file_spec = design_file_spec(sc.design)
    if file_spec is not None:
        try:
            h.update(Path(file_spec[0]).read_bytes())
        except OSError:
            pass
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------- one point (a task)

def run_point(toml_text: str, source: str, out_dir: str, device: str) -> dict[str, Any]:
    """Run one point's scenario into ``out_dir/run`` and return its record (also what point.json holds).

    Runs in a Ray worker (or in-process with --local); never raises for a finding or a failing run: the
    record says what happened. Only the worker dying loses it (Ray retries that once). A point whose engine release
    cannot run in this process (it imported another release, or the other engine: one release per process) runs in
    a process of its own (engine_path.isolate)."""
    import torch

    from engine_path import isolate

    from .pipeline import RunOptions, run_scenario

    torch.set_num_threads(1)
    sc = parse_scenario(toml_text, f"{source}.toml")
    if sc.engine_release is not None and not isolate.fits_this_process(sc.engine_release):
        try:
            return isolate.call(sc.engine_release, "slotscope.sweep:run_point", toml_text, source, out_dir, device,
                                timeout=None, device=device)
        except Exception as e:      # the child died or could not import the release: this point's verdict
            return {"hash": point_hash(sc), "scenario": sc.name, "design": sc.design, "engine": sc.engine_release,
                    "seed": sc.seed, "backends": list(sc.backends), "pid": os.getpid(), "started": time.time(),
                    "status": "error", "error": f"{type(e).__name__}: {e}"[:2000], "wall_s": 0.0}
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"hash": point_hash(sc), "scenario": sc.name, "design": sc.design,
                           "engine": sc.engine_release, "seed": sc.seed, "backends": list(sc.backends),
                           "pid": os.getpid(), "started": time.time()}
    try:
        out = run_scenario(sc, Path(out_dir) / "run", RunOptions(device=device, quiet_engine=True))
    except Exception as e:          # a failing run is a verdict of this point, not a lost task
        rec.update(status="error", error=f"{type(e).__name__}: {e}"[:2000])
    else:
        s = out.summary
        classes = sorted({c for b in s["backends"].values() for c, n in b["findings"].items() if n})
        rec.update(status="findings" if s["findings_total"] else ("incomplete" if out.incomplete else "clean"),
                   findings_total=s["findings_total"], classes=classes, steps=s["steps"],
                   backends_verdict={k: v["findings"] for k, v in s["backends"].items()},
                   first=_first(s))
    rec["wall_s"] = round(time.perf_counter() - t0, 3)
    return rec


def _first(summary: dict) -> Optional[dict]:
    """The earliest first finding over the backends (step, then backend order)."""
    best = None
    for name, b in summary["backends"].items():
        ff = b.get("first_finding")
        if ff and (best is None or ff["step"] < best["step"]):
            best = dict(ff, backend=name)
    return best


def _write_point(cache: Path, p: Point, rec: dict[str, Any]) -> None:
    d = confined(cache, str(rec["hash"]), "a point's hash")
    d.mkdir(parents=True, exist_ok=True)
    rec = dict(rec, point={"source": p.source, "row": p.row, "label": p.label})
    write_atomic(d / "point.json", json.dumps(rec, indent=2, sort_keys=True) + "\n")


def _cached(cache: Path, h: str) -> Optional[dict[str, Any]]:
    f = cache / h / "point.json"
    try:
        rec = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    return rec if rec.get("status") in ("clean", "findings", "incomplete") else None   # errors run again


# --------------------------------------------------------------------------- the sweep

@dataclass
class Todo:
    point: Point
    scenario: Scenario
    hash: str


def plan(grid: Grid, cache: Path) -> tuple[list[Todo], dict[Point, dict], list[tuple[Point, str]]]:
    """Points to run, points already cached (their records), and invalid points (with the error)."""
    todo, done, invalid = [], {}, []
    for p in points(grid):
        try:
            sc = point_scenario(grid, p)
        except ScenarioError as e:
            invalid.append((p, str(e)))
            continue
        h = point_hash(sc)
        rec = _cached(cache, h)
        if rec is not None:
            done[p] = rec
        else:
            todo.append(Todo(p, sc, h))
    return todo, done, invalid


def _ray():
    try:
        import ray
    except ModuleNotFoundError:
        raise UsageError(f"slotscope sweep runs its points on Ray, which is not installed: {RAY_HINT}; "
                         f"or run in one process without Ray: slotscope sweep GRID.toml --local") from None
    return ray


def run_local(todo: Sequence[Todo], cache: Path, device: str, on_done: Callable[[Todo, dict], None]) -> None:
    for t in todo:
        on_done(t, run_point(t.scenario.raw, t.point.source, str(cache / t.hash), device))


def init_ray(address: Optional[str] = None, num_cpus: Optional[int] = None, tries: int = 2) -> None:
    """``ray.init`` here (``num_cpus``; None: every core) or at ``address``, without the dashboard; one
    torch thread per worker. A local start that times out (Ray gives its raylet 30 s, which a loaded
    machine can miss) is tried once more."""
    ray = _ray()
    kw: dict[str, Any] = {"address": address} if address else {"num_cpus": num_cpus}
    for attempt in range(tries):
        try:
            ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False,
                     runtime_env={"env_vars": {"SLOTSCOPE_TORCH_THREADS": "1"}}, **kw)
            return
        except Exception as e:
            if address or "timed out during startup" not in str(e) or attempt == tries - 1:
                raise
            ray.shutdown()


def run_ray(todo: Sequence[Todo], cache: Path, device: str, on_done: Callable[[Todo, dict], None],
            address: Optional[str] = None, num_cpus: Optional[int] = None) -> None:
    """Each point a Ray task (one GPU or one CPU); a dead worker's task is retried once, then reported."""
    ray = _ray()
    if not ray.is_initialized():
        init_ray(address=address, num_cpus=num_cpus)
    res = {"num_gpus": 1, "num_cpus": 1} if device == "cuda" else {"num_cpus": 1}
    task = ray.remote(max_retries=1, **res)(run_point)
    pending = {task.remote(t.scenario.raw, t.point.source, str((cache / t.hash).resolve()), device): t for t in todo}
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                t = pending.pop(ref)
                on_done(t, _get(ray, ref, t))
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise


def _get(ray, ref, t: Todo) -> dict[str, Any]:
    from ray.exceptions import RayError, RayTaskError

    try:
        return ray.get(ref)
    except RayTaskError as e:        # raised inside run_point (it catches the run's own failures)
        return {"hash": t.hash, "status": "error", "error": str(e)[:2000], "design": t.scenario.design}
    except RayError as e:            # the worker died twice (WorkerCrashedError, ...): reported, not lost
        return {"hash": t.hash, "status": "worker_died", "error": f"{type(e).__name__}: {str(e)[:1500]}",
                "design": t.scenario.design, "retried": True}


def sweep(grid: Grid, out: Path, *, local: bool = False, address: Optional[str] = None,
          num_cpus: Optional[int] = None, log: Callable[[str], None] = lambda s: None) -> tuple[dict, list, bool]:
    """Run the grid's new points; return (records by point, invalid points, interrupted)."""
    cache = out / "points"
    cache.mkdir(parents=True, exist_ok=True)
    todo, records, invalid = plan(grid, cache)
    log(f"sweep: {len(todo) + len(records) + len(invalid)} points: {len(records)} cached, {len(todo)} to run, "
        f"{len(invalid)} invalid")
    t0, n = time.perf_counter(), [0]

    def on_done(t: Todo, rec: dict) -> None:
        _write_point(cache, t.point, rec)
        records[t.point] = rec
        n[0] += 1
        log(f"sweep: [{n[0]}/{len(todo)}] {t.point.row} | {t.point.label}: {rec['status']}"
            f" ({n[0] / (time.perf_counter() - t0):.2f} points/s)")

    interrupted = False
    try:
        if local:
            run_local(todo, cache, grid.device, on_done)
        else:
            run_ray(todo, cache, grid.device, on_done, address, num_cpus)
    except KeyboardInterrupt:
        interrupted = True
        log(f"sweep: interrupted: {len(records)} finished points kept, {len(todo) - n[0]} not run")
    return records, invalid, interrupted


def register(subparsers: Any) -> None:
    from .options import add_allow_design_files, add_engine_option, positive_int

    p = subparsers.add_parser(
        "sweep", help="run a grid of scenarios x designs/releases x backends x DP x page sizes x seeds on Ray",
        description="Run every point of a grid file as a Ray task (ray.init() here by default, every core), "
                    "cached by scenario hash (a rerun runs only new points), and write one comparison report "
                    "(OUT/report.html): a verdict table, each failing point's first divergence, links to each "
                    "point's own report. The grid format is in slotscope/sweep.py's docstring and "
                    "examples/sweeps/.",
        epilog="exit codes: 0 every point ran (whatever its verdict), 1 a point could not run (error, worker died),\n"
               "            2 bad grid, 130 interrupted (^C: finished points and their report are kept)\n"
               f"Ray is the optional extra: {RAY_HINT}\n"
               "example: slotscope sweep examples/sweeps/b1-b2.toml --out out/sweep-b1-b2",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("grid", metavar="GRID.toml")
    p.add_argument("--out", metavar="DIR", help="the sweep's directory (default out/sweep-<grid name>)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--local", action="store_true", help="one process, no Ray")
    where.add_argument("--address", help="an existing Ray cluster (ray.init(address=...))")
    p.add_argument("--num-cpus", type=positive_int, metavar="N", help="local Ray: use N cores (default every core)")
    add_allow_design_files(p, "the grid file")
    add_engine_option(p, engines=("sglang", "vllm"),
                      help="sglang[==VERSION] or vllm[==VERSION]: every point runs with this engine in the write path, "
                           "in place of the grid's designs and engines (one row: engine SPEC)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_sweep)


def check_sweep_out(out: Path) -> Path:
    """A sweep's directory: a directory (or nothing yet) whose points/ and report.html can be written."""
    if str(out) == "":
        raise UsageError("--out: must not be empty (give a directory)")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: is {describe(out)}, not a directory")
    for name in ("points", "report.html"):
        p = out / name
        if p.exists() and p.is_dir() != (name == "points"):
            raise UsageError(f"--out {out}: {name} is {describe(p)}; the sweep writes "
                             f"{'a directory' if name == 'points' else 'a file'} of that name there")
    return out


def cmd_sweep(args) -> int:
    from reports.sweep import write_sweep_report

    def log(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    out = None if args.out is None else check_sweep_out(Path(args.out))
    grid = load_grid(args.grid, engine=args.engine, allow_design_files=args.allow_design_files)
    if args.engine is not None:
        log(f"sweep: --engine {args.engine}: every point runs with it (the grid's designs and engines are not run)")
    out = out or check_sweep_out(confined(Path("out"), f"sweep-{grid.name}", f"{args.grid}: name"))
    if not args.local:
        _ray()                       # a clear error naming the extra before anything runs
    records, invalid, interrupted = sweep(grid, out, local=args.local, address=args.address,
                                          num_cpus=args.num_cpus, log=log)
    every = points(grid)
    report = write_sweep_report(grid.name, out, [(p, records[p]) for p in every if p in records], invalid,
                                interrupted, len(every) - len(records) - len(invalid))
    log(f"sweep: report {report}")
    if interrupted:
        return EXIT_SIGINT
    failed = [r for r in records.values() if r["status"] in ("error", "worker_died")]
    return EXIT_POINT_FAILED if failed or invalid else EXIT_OK
