"""``slotscope minimize DIR``: shrink a failing run to the smallest scenario with the same finding.

The finding to keep is the first finding of the run's first failing backend: its class and the kind
of the boundary where it happened (a full or an SWA layer, of the target or of the speculative
draft). A greedy delta-debugging loop then tries smaller scenarios and keeps each change after which
the finding still appears: one failing backend; the workload as an explicit request list, with
requests dropped and prompt / output lengths halved; layers dropped (at least one of the failing
kind stays); smaller pools and window; engine knobs back to their defaults or smaller; fewer decode
capture sizes. Passes repeat until none changes anything.

Candidates are validated :class:`~simulator.scenario.Scenario` objects: each is made with
``dataclasses.replace`` on the scenario and its parts (``PoolConfig``, ``WorkloadConfig``,
``EngineConfig``, ``SpeculativeConfig``, ``Model``), written with :meth:`Scenario.to_toml` and read
back by ``parse_scenario``, so it is a valid scenario file by construction; one the parser (or the
scheduler, before the first step) refuses with a :class:`ScenarioError` is a rejected candidate.
Each runs in-process on the CPU and stops at the first matching finding. The passes that propose the
candidates are slotscope/minimize_candidates.py's; this module is the search that runs and keeps them.

A candidate whose pools can never admit a waiting request (the scheduler's "stalled" error: a smaller
pool that a dummy request's page fills) does not reproduce, nor does one that the design cannot set up (a
``DesignError``: draft pools it sizes below zero for a smaller pool); a given scenario that stalls is bad
input (exit 2, saying so). Any other exception while a candidate runs is an internal error of slotscope, not "does not
reproduce": the search stops, the candidate is written to ``minimize-error.toml`` and the command
exits 3 with the error. (A design that raises inside a hook is not one: the run loop reports that
as a ``design_error`` finding.) Progress goes to stderr; the minimal scenario is written
(DIR/minimal.toml or -o) and printed. Exit codes: 0 minimized, 2 bad input (no run there, what is
missing, no finding to keep), 3 internal error.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

from simulator.designs.catalogue import BUILTIN_DESIGNS
from simulator.designs.base import Design
from simulator.designs.types import DesignError
from simulator.designs.loading import load_design
from simulator.scenario.models import format_pattern
from simulator.core.observe import NullObserver
from simulator.records import Finding
from simulator.scenario import Scenario, ScenarioError, parse_scenario

from .minimize_candidates import Candidates
from .rundir import UsageError, describe, write_atomic

EXIT_OK, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 2, 3
ERROR_FILE = "minimize-error.toml"
_READ_LIMIT = 64 * 2**20        # summary.json / run.json / one findings line are small; never read more


@dataclass(frozen=True)
class Target:
    """What the minimal scenario must still show."""

    cls: str
    kind: Optional[str]      # "full" | "swa"; None: a finding of a per-forward design hook (no layer)
    draft: Optional[bool]    # at a layer of the speculative draft model; None: either
    backend: str

    def describe(self) -> str:
        if self.kind is None:
            return f"{self.cls} (per-forward hook) on {self.backend}"
        where = f"a {'draft ' if self.draft else ''}{self.kind} layer"
        return f"{self.cls} at {where} on {self.backend}"


class _Reproduced(Exception):
    pass


#: the scheduler's words for a scenario whose pools can never admit a waiting request (simulator/scheduling/scheduler.py)
STALLED = "scheduler stalled"


def stalled(exc: BaseException) -> bool:
    """Whether a run's exception is the scheduler's stall: the scenario cannot run, not an error of slotscope."""
    return isinstance(exc, RuntimeError) and str(exc).startswith(STALLED)


class InternalError(Exception):
    """slotscope itself failed while running a candidate: the search stops and says so."""

    def __init__(self, candidate: Scenario, exc: BaseException, what: str):
        self.candidate, self.exc, self.what = candidate, exc, what
        self.trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        super().__init__(f"{type(exc).__name__}: {exc}")


class _Watch(NullObserver):
    """Stops the run at the first finding that matches the target."""

    def __init__(self, target: Target, num_layers: int):
        self.target, self.num_layers = target, num_layers

    def on_findings(self, findings) -> None:
        for f in findings:
            if self.matches(f):
                raise _Reproduced()

    def matches(self, f: Finding) -> bool:
        t = self.target
        if f.cls != t.cls:
            return False
        if t.kind is not None and f.kind != t.kind:
            return False
        return t.draft is None or (f.layer >= self.num_layers) == t.draft


# --------------------------------------------------------------------------- reading the run

def _read_json(p: Path) -> Any:
    try:
        with open(p, "rb") as f:
            data = f.read(_READ_LIMIT + 1)
    except OSError as e:
        raise UsageError(f"{p}: cannot read: {e.strerror or e}") from None
    if len(data) > _READ_LIMIT:
        raise UsageError(f"{p}: larger than {_READ_LIMIT // 2**20} MiB: not written by `slotscope run`")
    try:
        out = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise UsageError(f"{p}: cannot read: not valid JSON ({str(e)[:200]})") from None
    if not isinstance(out, dict):
        raise UsageError(f"{p}: cannot read: expected a JSON object, got {type(out).__name__}")
    return out


def _first_finding_line(p: Path) -> Optional[dict]:
    """The first finding of findings.jsonl (streamed as the run went), or None."""
    try:
        with open(p, "rb") as f:
            line = f.readline(_READ_LIMIT)
    except OSError:
        return None
    try:
        rec = json.loads(line) if line.strip() else None
    except (ValueError, RecursionError):
        return None
    return rec if isinstance(rec, dict) and {"backend", "layer", "class"} <= set(rec) else None


@dataclass
class RunDir:
    scenario: Scenario
    summary: Optional[dict]
    run: dict
    first_line: Optional[dict]          # findings.jsonl's first finding (when summary.json is missing)


def read_run(run_dir: Path) -> RunDir:
    """The run's scenario, summary and provenance, with errors that say what is missing."""
    if not run_dir.exists():
        raise UsageError(f"{run_dir}: no such run directory")
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: not a directory (give the --out directory of `slotscope run`)")
    present = {p.name for p in run_dir.iterdir()}
    expected = ("scenario.toml", "summary.json", "run.json", "findings.jsonl")
    if "scenario.toml" not in present:
        have = [n for n in expected if n in present]
        raise UsageError(f"{run_dir / 'scenario.toml'}: missing; minimize needs the scenario as run (a directory "
                         f"written by `slotscope run`)" + (f"; present: {', '.join(have)}" if have else
                                                            "; this is not a run directory"))
    from simulator.scenario import load_scenario

    scenario = load_scenario(run_dir / "scenario.toml")
    run = _read_json(run_dir / "run.json") if "run.json" in present else {}
    summary = _read_json(run_dir / "summary.json") if "summary.json" in present else None
    first_line = None
    if summary is None:
        first_line = _first_finding_line(run_dir / "findings.jsonl")
        if first_line is None:
            missing = [n for n in ("summary.json", "run.json", "findings.jsonl") if n not in present]
            why = ("findings.jsonl is empty" if "findings.jsonl" in present
                   else "no findings.jsonl either")
            raise UsageError(f"{run_dir}: the run is incomplete: no summary.json, and {why}, so there is no "
                             f"finding to keep (missing: {', '.join(missing)}). Rerun it to the end: "
                             f"slotscope run {run_dir / 'scenario.toml'} --out {run_dir}")
    return RunDir(scenario, summary, run, first_line)


def _kinds(sc: Scenario) -> dict[int, tuple[str, bool]]:
    """Global layer id -> (kind, at the draft), as the run loop numbers them."""
    out = {li.layer: (li.kind, False) for li in sc.model.layers()}
    if sc.engine.speculative.enabled:
        n = sc.model.num_layers
        for i, kind in enumerate(sc.engine.speculative.draft_layers):
            out[n + i] = (kind, True)
    return out


def find_target(rd: RunDir, sc: Scenario) -> Target:
    kinds = _kinds(sc)
    recorded = {int(l[0]): l[1] for l in rd.run.get("layers", []) if isinstance(l, list) and len(l) == 2}
    firsts: list[tuple[str, dict]] = []
    if rd.summary is not None:
        for backend, b in (rd.summary.get("backends") or {}).items():
            ff = b.get("first_finding") if isinstance(b, dict) else None
            if ff:
                firsts.append((backend, ff))
    elif rd.first_line is not None:
        firsts.append((str(rd.first_line["backend"]), rd.first_line))
    for backend, ff in firsts:
        try:
            layer, cls = int(ff["layer"]), str(ff["class"])
        except (KeyError, TypeError, ValueError):
            raise UsageError(f"summary.json: the first finding on {backend} is malformed: {str(ff)[:200]}") from None
        if layer < 0:
            return Target(cls, None, None, backend)
        if layer in kinds:
            kind, draft = kinds[layer]
        elif layer in recorded:
            kind, draft = recorded[layer], layer >= sc.model.num_layers
        else:
            raise UsageError(f"the first finding on {backend} is at layer {layer}, which the scenario does not have")
        return Target(cls, kind, draft, backend)
    if rd.summary is not None and rd.summary.get("incomplete"):
        raise UsageError("the run is incomplete and had no findings before it stopped: nothing to minimize "
                         "(rerun it to the end)")
    raise UsageError("the run has no findings: nothing to minimize")


# --------------------------------------------------------------------------- the search

class Minimizer(Candidates):
    """The search: each candidate the passes propose is run, and kept when it still shows the target."""

    def __init__(self, sc: Scenario, design: Optional[Design], target: Target, log: Callable[[str], None],
                 engine: Optional[Any] = None, scheduler: str = "auto"):
        """``engine`` (an EngineSpec): each candidate runs through that release (in this process, as imported:
        the patches its environment names), ``scheduler`` its choice; else through ``design``."""
        self.sc = sc
        self.design = design
        self.engine, self.scheduler = engine, scheduler
        self.target = target
        self.log = log
        self.runs = 0
        self.stalled = False     # whether the last candidate run stalled the scheduler
        self.t0 = time.perf_counter()

    # ------------------------------------------------------------------ evaluation

    @staticmethod
    def validated(cand: Scenario) -> Optional[Scenario]:
        """The candidate as a file would give it (written, read back), or None when the parser refuses it."""
        try:
            return parse_scenario(cand.to_toml(defaults=False), "candidate.toml")
        except ScenarioError:
            return None

    def reproduces(self, cand: Scenario, what: str = "candidate") -> bool:
        from simulator.run import run_simulation

        from .pools import make_draft_pool_factory, make_pool_factory

        self.stalled = False
        sc = self.validated(cand)
        if sc is None:
            return False
        self.runs += 1
        watch = _Watch(self.target, sc.model.num_layers)
        if self.engine is not None:
            return self._reproduces_in_release(sc, watch, what)
        cpu = _cpu()
        try:
            run_simulation(sc, self.design, make_pool_factory(sc, cpu, "compact", "torch"), device=cpu,
                           observer=watch, max_steps=sc.max_steps,
                           make_draft_pool=make_draft_pool_factory(cpu, "compact", "torch"))
        except _Reproduced:
            return True
        except ScenarioError:
            return False   # refused before it ran (a request that cannot fit its pools, ...): rejected
        except (KeyboardInterrupt, SystemExit):
            raise
        except DesignError:
            return False   # the design cannot set this candidate up (draft pools sized below zero, ...): rejected
        except RuntimeError as exc:
            if not stalled(exc):
                raise InternalError(sc, exc, what) from exc
            # pools too small for a waiting request (a smaller pool, a dummy request's page): cannot run
            self.stalled = True
            return False
        except BaseException as exc:   # slotscope failed: not "does not reproduce"
            raise InternalError(sc, exc, what) from exc
        return False

    def _reproduces_in_release(self, sc: Scenario, watch: "_Watch", what: str) -> bool:
        """A candidate through the release (slotscope run --engine, in process, no outputs): a draw the release,
        slotscope's adapter of it or its pools cannot run does not reproduce; a stall is said as such."""
        from engine_path.errors import AdapterLacks, ReleaseBroke, ReleaseLacks, SchedulerStalled

        from .pipeline import RunOptions, run_scenario

        opts = RunOptions(device="cpu", trace_level="off", report=False, engine=self.engine, quiet_engine=True,
                          scheduler=self.scheduler, extra_observers=(watch,))
        try:
            run_scenario(sc, None, opts)
        except _Reproduced:
            return True
        except SchedulerStalled:
            self.stalled = True
            return False
        except (ScenarioError, UsageError, ReleaseLacks, AdapterLacks, ReleaseBroke):
            return False        # refused, or the release failed otherwise (not the finding kept)
        except (KeyboardInterrupt, SystemExit):
            raise
        except RuntimeError as exc:
            if stalled(exc):
                self.stalled = True
                return False
            raise InternalError(sc, exc, what) from exc
        except BaseException as exc:   # slotscope failed: not "does not reproduce"
            raise InternalError(sc, exc, what) from exc
        return False

    @property
    def under(self) -> str:
        """What the candidates run under: the design, or the release and its patches."""
        if self.engine is None:
            return f"design {self.design.name}"
        from engine_path.patches import env_paths

        return f"{self.engine}" + "".join(f" + {Path(p).name}" for p in env_paths())

    def attempt(self, what: str, cand: Scenario) -> bool:
        if cand == self.sc or not self.reproduces(cand, what):
            return False
        self.sc = cand
        self.log(f"minimize: {what}  [{self.runs} runs, {time.perf_counter() - self.t0:.1f}s]")
        return True

    # ------------------------------------------------------------------ rounds of passes

    def run(self, max_rounds: int = 6) -> Scenario:
        if not self.reproduces(self.sc, "the run's own scenario"):
            if self.stalled:
                raise UsageError(f"the run's scenario cannot run in-process: the scheduler stalls (its pools can "
                                 f"never admit a waiting request under {self.under}); nothing to minimize")
            raise UsageError(f"the run's scenario does not reproduce {self.target.describe()} in-process under "
                             f"{self.under}" + (" (was it run with a different design? pass --design)"
                                                if self.engine is None else ""))
        self.pass_backend()
        self.pass_explicit_requests()
        for _ in range(max_rounds):
            before = self.sc
            self.pass_requests()
            self.pass_scale()
            self.pass_layers()
            self.pass_lengths()
            self.pass_engine()
            self.pass_pool()
            self.pass_model()
            if self.sc == before:
                break
        self.pass_last()
        return self.sc


def _cpu():
    import torch

    return torch.device("cpu")


def _design_spec(sc: Scenario, run: dict, given: Optional[str], run_dir: Path) -> str:
    """The design to minimize under: --design, else the one that ran (run.json), else the scenario's."""
    if given:
        return given
    recorded = run.get("design")
    if not recorded or recorded == sc.design:
        return sc.design
    if recorded in BUILTIN_DESIGNS:
        return recorded
    # a user design: run.json records only its name; the scenario as run has its spec (path.py:Class)
    if ":" in sc.design:
        return sc.design
    raise UsageError(f"{run_dir / 'run.json'}: design {recorded!r} is not built in (a user design records only its "
                     f"name): pass --design path/to/file.py:ClassName")


def minimize(run_dir: Path, design_spec: Optional[str] = None,
             log: Callable[[str], None] = lambda s: None,
             allow_design_files: bool = False) -> tuple[Scenario, Target, Minimizer]:
    """The minimal scenario for a run directory's first finding. A design file that the run directory's
    scenario.toml names runs only with ``allow_design_files`` (--allow-design-files) or as ``design_spec``."""
    import torch

    from .resources import check_resources
    from .run_setup import check_design_file

    torch.set_num_threads(1)
    rd = read_run(run_dir)
    if rd.run.get("engine_release"):
        return _minimize_release_run(rd, run_dir, design_spec, log)
    spec = _design_spec(rd.scenario, rd.run, design_spec, run_dir)
    if design_spec is None:
        check_design_file(replace(rd.scenario, design=spec), None, allow_design_files)
    design = load_design(spec)
    recorded = rd.run.get("design")
    if design_spec is None and recorded and spec != recorded and design.name != recorded:
        raise UsageError(f"{run_dir / 'run.json'}: the run's design is {recorded!r} but the scenario names "
                         f"{spec!r} ({design.name}): pass --design")
    seed = rd.run.get("seed", (rd.summary or {}).get("seed", rd.scenario.seed))
    backends = rd.run.get("backends") or rd.scenario.backends
    try:
        sc = rd.scenario.with_overrides(design=spec, seed=int(seed), backends=tuple(backends))
        sc = parse_scenario(sc.to_toml(), str(run_dir / "scenario.toml"))
    except (ScenarioError, TypeError, ValueError) as e:
        raise UsageError(f"{run_dir}: the run's scenario with its recorded design, seed and backends is not valid: "
                         f"{e}") from None
    check_resources(sc, design, "cpu", "compact")
    target = find_target(rd, sc)
    if target.backend not in sc.backends:
        raise UsageError(f"the first finding is on backend {target.backend!r}, which the run's scenario does not list")
    if rd.summary is None:
        print(f"slotscope: note: {run_dir} has no summary.json (the run did not finish): minimizing the first "
              f"finding streamed to findings.jsonl", file=sys.stderr)
    return _search(Minimizer(sc, design, target, log), run_dir, log)


def _search(m: Minimizer, run_dir: Path, log: Callable[[str], None]) -> tuple[Scenario, Target, Minimizer]:
    """The search of ``m`` (a model design's or a release's), its result named and described."""
    log(f"minimize: keeping {m.target.describe()} under {m.under if m.engine is not None else m.design.name}")
    out = m.run()
    name = out.name if out.name.endswith("-minimal") else minimal_name(out.name)
    out = replace(out, name=name,
                  description=f"Minimal scenario from {run_dir}: reproduces {m.target.describe()} under {m.under} "
                              f"({m.runs} candidate runs).")
    return out, m.target, m


def _release_of(rd: RunDir, run_dir: Path):
    """An engine run's release (``name==version`` as it ran), its patches (each still the file that ran: its
    sha256 checked) put into the environment for the release's import, and whose scheduler made its batches."""
    from engine_path.patches import set_env, sha256_of
    from engine_path.releases import EngineSpecError, parse_spec

    eng = rd.run.get("engine") if isinstance(rd.run.get("engine"), dict) else {}
    text = str(rd.run["engine_release"])
    if eng.get("name") and eng.get("version"):
        text = f"{eng['name']}=={eng['version']}"
    try:
        spec = parse_spec(text)
    except EngineSpecError as e:
        raise UsageError(f"{run_dir / 'run.json'}: engine_release {text!r}: {e.problem}") from None
    paths = []
    for i, pt in enumerate(eng.get("patches") or ()):
        path = Path(str(pt.get("path", "")))
        if not path.is_file():
            raise UsageError(f"{run_dir / 'run.json'}: engine.patches[{i}]: {path} is not there any more; the run's "
                             f"release ran with it (minimize reruns the release as the run ran it)")
        if pt.get("sha256") and sha256_of(path) != pt["sha256"]:
            raise UsageError(f"{run_dir / 'run.json'}: engine.patches[{i}]: {path} changed since the run (sha256 "
                             f"{sha256_of(path)[:16]}, the run's {str(pt['sha256'])[:16]})")
        paths.append(str(path))
    set_env(paths)
    scheduler = eng.get("scheduler") if eng.get("scheduler") in ("release", "model") else "auto"
    return spec, scheduler


def _minimize_release_run(rd: RunDir, run_dir: Path, design_spec: Optional[str],
                          log: Callable[[str], None]) -> tuple[Scenario, Target, Minimizer]:
    """An engine run's first finding, each candidate run through the release (and patches) the run ran."""
    if design_spec is not None:
        raise UsageError(f"--design with {run_dir}: an engine run ({rd.run['engine_release']}) is minimized "
                         f"through the release it ran, not a design")
    spec, scheduler = _release_of(rd, run_dir)
    seed = rd.run.get("seed", (rd.summary or {}).get("seed", rd.scenario.seed))
    try:
        sc = parse_scenario(rd.scenario.with_overrides(seed=int(seed)).to_toml(), str(run_dir / "scenario.toml"))
    except (ScenarioError, TypeError, ValueError) as e:
        raise UsageError(f"{run_dir}: the run's scenario with its recorded seed is not valid: {e}") from None
    target = find_target(rd, sc)
    if spec.name == "sglang" and target.backend not in sc.backends:
        raise UsageError(f"the first finding is on backend {target.backend!r}, which the run's scenario does not list")
    return _search(Minimizer(sc, None, target, log, engine=spec, scheduler=scheduler), run_dir, log)


def minimal_name(name: str) -> str:
    """``NAME-minimal``, cut so that it still names one directory (a scenario name's limit)."""
    from simulator.scenario import MAX_NAME_BYTES

    suffix = "-minimal"
    data = name.encode("utf-8")[:MAX_NAME_BYTES - len(suffix)]
    return data.decode("utf-8", "ignore") + suffix


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "minimize", help="shrink a failing run to the smallest scenario with the same finding",
        description="Take a run directory with findings (written by `slotscope run`) and search for the smallest "
                    "scenario (fewest backends, requests, layers, tokens, steps) that still gives the same finding "
                    "class at a layer of the same kind. Writes it as TOML (DIR/minimal.toml, or -o) and prints it; "
                    "progress goes to stderr.",
        epilog="exit codes: 0 minimized, 2 bad input (no run directory, something missing, no finding),\n"
               f"            3 internal error of slotscope (the candidate that triggered it is written to "
               f"{ERROR_FILE})\n"
               "example: slotscope run scenarios/b1-pcg-dp-padding.toml --out out/b1 && slotscope minimize out/b1",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="DIR", help="a run directory with findings")
    p.add_argument("-o", "--output", metavar="PATH",
                   help="where to write the minimal scenario (default DIR/minimal.toml)")
    p.add_argument("--design", help="the run's design, when it was a user design (path/to/file.py:ClassName)")
    from .options import add_allow_design_files

    add_allow_design_files(p, "the run directory's scenario.toml")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_minimize)


def cmd_minimize(args) -> int:
    run_dir = Path(args.run_dir)
    out = Path(args.output) if args.output is not None else run_dir / "minimal.toml"
    if out.is_dir():
        raise UsageError(f"-o {out}: is a directory; give the file to write (e.g. {out / 'minimal.toml'})")
    if out.exists() and not out.is_file():
        raise UsageError(f"-o {out}: is {describe(out)}; give a file to write")

    def log(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    try:
        sc, target, m = minimize(run_dir, args.design, log, args.allow_design_files)
    except InternalError as e:
        return _report_internal(e, out.parent if args.output else run_dir)
    text = sc.to_toml(defaults=False)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, text)          # through a fresh temporary file: a link at OUT is replaced, not followed
    except OSError as e:
        print(text, end="")              # the search's result is not lost
        raise UsageError(f"-o {out}: cannot write the minimal scenario ({e.strerror or e}); it was printed "
                         f"above") from None
    back = parse_scenario(text, str(out))
    reqs = len(back.workload.explicit) or back.workload.requests
    where = "vllm (the release's one boundary)" if m.engine is not None and m.engine.name == "vllm" else \
        ", ".join(back.backends)
    log(f"minimize: done in {time.perf_counter() - t0:.1f}s, {m.runs} runs: {reqs} request(s), layers "
        f"{format_pattern(back.model.layer_kinds)}, backend {where}; wrote {out}"
        + (f" (under {m.under})" if m.engine is not None else ""))
    print(text, end="")
    return EXIT_OK


def _report_internal(e: InternalError, where: Path) -> int:
    path = where / ERROR_FILE
    try:
        where.mkdir(parents=True, exist_ok=True)
        write_atomic(path, e.candidate.to_toml(defaults=False))
        saved = f"the candidate that triggered it is in {path} (rerun it: slotscope run {path})"
    except OSError as ose:
        saved = f"the candidate could not be saved ({ose.strerror or ose})"
    sys.stderr.write(e.trace)
    print(f"slotscope: error: internal error of slotscope while minimizing ({e.what}): {e}; the search "
          f"stopped (this is not a 'does not reproduce'); {saved}", file=sys.stderr)
    return EXIT_INTERNAL
