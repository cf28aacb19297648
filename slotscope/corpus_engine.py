"""The corpus in real code: ``slotscope bugs --engine sglang [--json FILE]``.

A case's ``engine`` entry in scenarios/corpus.toml says how it runs as release code:

    engine = { buggy = "sglang==0.5.14", fixed = "sglang==0.5.15", mechanism = ["KVWriteLoc"] }
    engine = { buggy = "sglang==0.5.23", buggy_patches = ["examples/engine-patches/revert-X.yaml"],
               fixed = "sglang==0.5.23", mechanism = [...], expect = {...}, also = [...], why = "..." }
    engine = "model-only: why"

``buggy`` is a release that had the bug, or today's with its fix reverted by a shipped engine patch (one per fix
PR, examples/engine-patches/); ``fixed`` the release with the fix. Each runs the case's scenario through
``slotscope run --engine SPEC`` in a process of its own (a release is imported, and patched, once per process),
the scenario's design replaced by the release (the verdict names the release and its patches, never the
design). A verdict holds as the case's ``expect`` / ``expect_fixed`` / ``also`` say (the engine entry's own where
the real code's findings differ from the model's, e.g. a backend whose refresh the release does not run here yet,
or a class the release's own code adds). A
case is **real** only where both runs took the release's code for every piece its ``mechanism`` names (run.json's
``engine_pieces``: a row or a backend piece whose code was the engine's); otherwise it is model-only, and why.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from simulator.records import FINDING_CLASSES
from simulator.scenario import ScenarioError

from .corpus import ROLES, Case, Outcome, expect_table, slug
from .forkserver import DEPS, on_cpu

ROOT = Path(__file__).resolve().parent.parent
MODEL_ONLY = "model-only:"
ENGINES = ("sglang", "vllm")


@dataclass(frozen=True)
class EngineCase:
    """A case's engine entry, validated."""

    buggy: str
    fixed: str
    buggy_patches: tuple[Path, ...] = ()
    fixed_patches: tuple[Path, ...] = ()
    mechanism: tuple[str, ...] = ()
    expect: Optional[dict] = None
    expect_fixed: Optional[dict] = None
    why: str = ""
    also: Optional[tuple[str, ...]] = None
    stops: str = ""                    # the buggy run must stop with a message holding this text (a hang, a crash)
    hits: str = ""                     # "lost": the buggy run must hit fewer prefix tokens than the fixed run

    @property
    def engine(self) -> str:
        """The engine both runs take: "sglang" or "vllm"."""
        return self.buggy.partition("==")[0]

    def spec(self, role: str) -> str:
        """The engine spec and its patches, as the verdict names them."""
        spec, patches = (self.buggy, self.buggy_patches) if role == "buggy" else (self.fixed, self.fixed_patches)
        return spec + "".join(f" + {p.name}" for p in patches)


def engine_of(case: Case, source: str = "corpus") -> EngineCase | str:
    """A case's EngineCase, or the reason it is model-only (a ScenarioError naming the field on bad input)."""
    raw, where = case.engine, f"{source}: case {case.id}.engine"
    if raw is None:
        return "model-only: no engine entry yet"
    if isinstance(raw, str):
        if not raw.startswith(MODEL_ONLY):
            raise ScenarioError(f"{where}: a string must start with {MODEL_ONLY!r} and say why")
        return raw
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: must be a table or a '{MODEL_ONLY} why' string")
    known = {"buggy", "fixed", "buggy_patches", "fixed_patches", "mechanism", "expect", "expect_fixed", "also", "why",
             "stops", "hits"}
    bad = sorted(set(raw) - known)
    if bad:
        raise ScenarioError(f"{where}.{bad[0]}: unknown key (known: {', '.join(sorted(known))})")
    for key in ("buggy", "fixed"):
        if not isinstance(raw.get(key), str) or raw[key].partition("==")[0] not in ENGINES or "==" not in raw[key]:
            raise ScenarioError(f"{where}.{key}: an engine spec sglang==VERSION or vllm==VERSION is required")
    if raw["buggy"].partition("==")[0] != raw["fixed"].partition("==")[0]:
        raise ScenarioError(f"{where}.fixed: {raw['fixed']!r} is another engine than buggy's {raw['buggy']!r}")
    if not isinstance(raw.get("stops", ""), str):
        raise ScenarioError(f"{where}.stops: must be the text the buggy run's stop message holds")
    if raw.get("hits", "lost") != "lost":
        raise ScenarioError(f"{where}.hits: must be \"lost\" (the buggy run hits fewer prefix tokens than the "
                            f"fixed run), not {raw['hits']!r}")

    def paths(key: str) -> tuple[Path, ...]:
        got = raw.get(key, [])
        if not isinstance(got, list) or not all(isinstance(x, str) for x in got):
            raise ScenarioError(f"{where}.{key}: must list patch files")
        out = tuple((ROOT / x).resolve() for x in got)
        for x, p in zip(got, out):
            if not p.is_file():
                raise ScenarioError(f"{where}.{key}: {x} does not exist")
        return out
    mech = raw.get("mechanism", [])
    if not isinstance(mech, list) or not all(isinstance(x, str) for x in mech):
        raise ScenarioError(f"{where}.mechanism: must list engine pieces")
    exp = {k: expect_table(raw[k], source, f"case {case.id}.engine.{k}") for k in ("expect", "expect_fixed")
           if k in raw}
    also = raw.get("also")
    if also is not None and (not isinstance(also, list) or any(a not in FINDING_CLASSES for a in also)):
        raise ScenarioError(f"{where}.also: must list finding classes (allowed: {', '.join(FINDING_CLASSES)})")
    return EngineCase(raw["buggy"], raw["fixed"], paths("buggy_patches"), paths("fixed_patches"), tuple(mech),
                      exp.get("expect"), exp.get("expect_fixed"), str(raw.get("why", "")),
                      None if also is None else tuple(also), raw.get("stops", ""), raw.get("hits", ""))


def engine_scenario(case: Case, spec: str):
    """The case's scenario as its engine run takes it. A static-pool run replaces the scenario's design by the
    release's code; a ``pool.unified`` run keeps a design for what stays slotscope's there (write locations,
    read ids, the byte budget: engine_path/unified.py), so it gets our model of the release's unified pool
    (``sglang-V-unified``, where slotscope has one) instead of the case's buggy or fixed design: otherwise both
    runs would carry, and be labelled with, the scenario's buggy design while the bug is the release's."""
    from simulator.designs.catalogue import BUILTIN_DESIGNS

    sc = case.load()
    if not spec.startswith("sglang=="):
        return sc
    name = f"sglang-{spec.partition('==')[2]}-unified"
    return sc.with_overrides(design=name) if sc.pool.unified and name in BUILTIN_DESIGNS else sc


#: a mechanism piece that only the release's own scheduler runs (its event loop), which engine runs drive on the CPU
#: only so far (slotscope/run_setup.py's choose_scheduler): a case that needs it runs on the CPU on a CUDA machine too
SCHEDULER_PIECE = "event_loop_normal"


def on_cpu_here(eng: EngineCase) -> bool:
    """Whether the case's runs go to the CPU on this machine although CUDA is here (its mechanism is the release's
    scheduler, which a CUDA run would replace by the model's: its verdict would be about the model)."""
    import torch

    return eng.engine == "sglang" and SCHEDULER_PIECE in eng.mechanism and torch.cuda.is_available()


def _launch(argv: list[str], warm=None) -> subprocess.CompletedProcess:
    """``python -m slotscope *argv``: forked from ``warm``'s import of the release (slotscope/forkserver.py) where
    given, else a process of its own."""
    if warm is not None:
        return warm.cli(*argv, cwd=str(ROOT))
    return subprocess.run([sys.executable, "-m", "slotscope", *argv], cwd=ROOT, capture_output=True, text=True)


def _run(case: Case, eng: EngineCase, role: str, out: Path, backends, vllm_device: str = "cpu",
         servers=None) -> dict:
    """One engine run of a case (a subprocess, or a child of ``servers``' warm import of a vLLM release on the CPU),
    its summary and engine pieces; a vLLM case on ``vllm_device``."""
    scenario = out.with_suffix(".toml")
    spec, patches = (eng.buggy, eng.buggy_patches) if role == "buggy" else (eng.fixed, eng.fixed_patches)
    scenario.write_text(engine_scenario(case, spec).to_toml())
    cmd = ["run", str(scenario), "--engine", spec, "--out", str(out), "--no-report", "--trace-level", "off", "-q"]
    if eng.engine == "sglang":             # a vLLM run has one boundary of its own
        cmd += ["--backends", ",".join(backends)]
    for p in patches:
        cmd += ["--engine-patch", str(p)]
    if eng.engine == "vllm":               # the CPU unless asked (bugs --engine vllm --device cuda)
        cmd += ["--device", vllm_device]
    elif on_cpu_here(eng):
        cmd += ["--device", "cpu"]
    t0 = time.perf_counter()
    proc = _launch(cmd, _warm(servers, _server_spec(eng, spec, cmd, vllm_device)))
    got = {"rc": proc.returncode, "wall_s": time.perf_counter() - t0, "stderr": proc.stderr[-2000:], "out": str(out)}
    try:
        got["summary"] = json.loads((out / "summary.json").read_text())
        got["pieces"] = json.loads((out / "run.json").read_text()).get("engine_pieces") or {}
    except (OSError, ValueError):
        got["summary"], got["pieces"] = None, {}
    return got


def _server_spec(eng: EngineCase, spec: str, cmd: list[str], vllm_device: str) -> Optional[str]:
    """The warm server a run of ``spec`` forks from (slotscope/forkserver.py), or None (a process of its own): a vLLM
    run on the CPU from the release's import, an SGLang run on the CPU from its release's dependency server (the
    child imports the release and applies the run's patches); a CUDA run never."""
    if eng.engine == "vllm":
        return spec if vllm_device == "cpu" else None
    return DEPS + spec if on_cpu(cmd) else None


def _forks(eng: EngineCase, vllm_device: str) -> bool:
    """Whether a case's runs may fork from a warm server (:func:`_server_spec`): a vLLM case's on the CPU, an
    SGLang case's where they go to the CPU."""
    if eng.engine == "vllm":
        return vllm_device == "cpu"
    import torch

    return on_cpu_here(eng) or not torch.cuda.is_available()


def _warm(servers, spec: Optional[str]):
    """``servers``' warm server of ``spec`` (None: no servers or no spec, or it would not start: the run goes to a
    process of its own)."""
    if servers is None or spec is None:
        return None
    try:
        return servers.get(spec, timeout=300)
    except (RuntimeError, TimeoutError, OSError):
        return None


def engine_pieces(pieces: dict) -> list[str]:
    """Every piece whose code was the engine's (rows, and each driven backend's pieces)."""
    out = [r["piece"] for r in pieces.get("rows", ()) if r.get("whose") == "engine"]
    for b, d in (pieces.get("backends") or {}).items():
        if d.get("release_forwards"):
            out += [f"{b.split('/')[0]}:{p['piece']}" for p in d["pieces"] if p["whose"] == "engine"]
    return out


def _missing(eng: EngineCase, runs: dict) -> list[str]:
    """The mechanism's pieces some run did not take from the release."""
    out = []
    for m in eng.mechanism:
        if not all(any(m in p for p in engine_pieces(r["pieces"])) for r in runs.values()):
            out.append(m)
    return out


def _hit_tokens(run: dict) -> Optional[int]:
    """The prefix-cache hit tokens a run's release scheduler counted (run.json ``engine_pieces.scheduler.did``), or
    None where it counts none."""
    n = (((run.get("pieces") or {}).get("scheduler") or {}).get("did") or {}).get("prefix_hit_tokens")
    return None if n is None else int(n)


def lost_hits(runs: dict) -> tuple[bool, str]:
    """A case with ``hits = "lost"`` (a bug whose symptom is prefix-cache hits not taken, class P): whether the
    buggy run hit fewer prefix tokens than the fixed run on the same workload, and the counts in words."""
    buggy, fixed = (_hit_tokens(runs[r]) for r in ROLES)
    if buggy is None or fixed is None:
        return False, "the runs count no prefix-hit tokens, so lost hits cannot be told"
    ok = buggy < fixed
    return ok, f"prefix-hit tokens: {buggy} buggy against {fixed} fixed" + ("" if ok else ", no hits lost")


@dataclass
class EngineVerdict:
    case: Case
    engine: Optional[EngineCase]
    why: str
    outcomes: dict                     # role -> Outcome (or None: the run failed)
    runs: dict
    hits_lost: Optional[bool] = None   # a case with hits = "lost": whether the buggy run lost hits (None: no check)

    @property
    def holds(self) -> bool:
        return (self.engine is not None and all(o is not None and o.holds for o in self.outcomes.values())
                and self.hits_lost is not False)

    @property
    def real(self) -> bool:
        return self.engine is not None and self.holds and not _missing(self.engine, self.runs)

    def differences(self) -> dict[str, list[str]]:
        """Per run that finished but whose verdict fails: one line per backend where it fails, with what the case
        expects, what the run saw and how many of that backend's forwards went through the release's code."""
        return {role: [f"{b}: {text}; {_forwards(self.runs[role], b)}" for b, text in o.differences().items()]
                for role, o in self.outcomes.items() if o is not None and not o.holds}

    def to_json(self) -> dict:
        e = self.engine
        return {"case": self.case.id, "pr": self.case.issue, "real": self.real,
                "buggy": None if e is None else e.spec("buggy"), "fixed": None if e is None else e.spec("fixed"),
                "holds": self.holds, "why": self.why,
                "mechanism": [] if e is None else list(e.mechanism),
                "missing": [] if e is None else _missing(e, self.runs) if self.runs else [],
                "differs": self.differences(),
                **({"prefix_hit_tokens": {r: _hit_tokens(self.runs[r]) for r in ROLES if r in self.runs}}
                   if e is not None and e.hits else {})}


def _forwards(run: dict, backend: str) -> str:
    """A backend's forwards in a run's engine pieces: the release's and the model's, its sides summed."""
    sides = [d for k, d in (run.get("pieces", {}).get("backends") or {}).items() if k.split("/")[0] == backend]
    if not sides:
        return "no engine pieces for it"
    rel, mod = (sum(int(d.get(k) or 0) for d in sides) for k in ("release_forwards", "model_forwards"))
    return f"{rel} forwards through the release's code, {mod} through the model's"


def _failure(run: dict) -> str:
    """Why a run did not finish, on one line: its summary's incomplete message (the exception's type and its whole
    message), else the last line of its stderr."""
    inc = (run.get("summary") or {}).get("incomplete") or {}
    msg = inc.get("message") if isinstance(inc, dict) else None
    if not msg:
        msg = (run["stderr"].strip().splitlines() or ["(no message)"])[-1]
    return " ".join(str(msg).split())


def _outcome(seen: Case, eng: EngineCase, role: str, run: dict) -> tuple[Optional[Outcome], str]:
    """A run's outcome (None: it did not end as the case says), and why not where that is the case's ``stops``.
    A run finishes, or, for the buggy role of a case with ``stops``, stops with a message holding that text (a
    release that hangs or raises: the steps before are checked as usual)."""
    s = run["summary"]
    if s is None:
        return None, ""
    stops = eng.stops if role == "buggy" else ""
    inc = s.get("incomplete")
    if stops:
        if not inc or inc.get("reason") != "error" or stops not in _failure(run):
            said = "finished" if not inc else f"stopped: {_failure(run)}"
            return None, f"the buggy run should stop with {stops!r}; it {said}"
    elif inc:
        return None, ""
    note = f"the buggy run stopped: {_failure(run)}" if stops else ""
    return Outcome(seen, role, eng.spec(role), seen.load(), s, {}, run["wall_s"]), note


def run_engine_case(case: Case, out_dir: Path, backends, vllm_device: str = "cpu", servers=None) -> EngineVerdict:
    eng = engine_of(case)
    if isinstance(eng, str):
        return EngineVerdict(case, None, eng[len(MODEL_ONLY):].strip(), {}, {})
    out_dir.mkdir(parents=True, exist_ok=True)
    seen = dataclasses.replace(case, expect=eng.expect or case.expect,
                               expect_fixed=eng.expect_fixed or case.expect_fixed,
                               also=case.also if eng.also is None else eng.also)
    with cf.ThreadPoolExecutor(2) as pool:
        futs = {role: pool.submit(_run, case, eng, role, out_dir / f"{slug(case.id)}-{role}", backends, vllm_device,
                                  servers)
                for role in ROLES}
        runs = {role: f.result() for role, f in futs.items()}
    outcomes, notes = {}, {}
    for role, r in runs.items():
        outcomes[role], notes[role] = _outcome(seen, eng, role, r)
    why, hits = eng.why, None
    if on_cpu_here(eng):
        why += "; run on the CPU: the release's scheduler is not driven on CUDA runs yet"
    failed = [role for role, o in outcomes.items() if o is None]
    stop_note = notes["buggy"]             # the case's stop: as expected (buggy holds) or not (buggy failed)
    if stop_note and "buggy" in failed:
        why = stop_note
    elif failed:
        why = f"the {' and '.join(failed)} run did not finish: {_failure(runs[failed[0]])}"
    else:
        missing = _missing(eng, runs)
        gap = "model-only: " + ", ".join(missing) + " did not run as the release's code" if missing else ""
        hit_note = ""
        if eng.hits:
            hits, hit_note = lost_hits(runs)
        why = "; ".join(w for w in (why, stop_note, hit_note, gap) if w)
    return EngineVerdict(case, eng, why, outcomes, runs, hits)


def format_engine_table(verdicts: list[EngineVerdict]) -> str:
    head = ["case", "pr", "real", "buggy", "fixed", "buggy verdict", "fixed verdict", "why"]
    rows = []
    for v in verdicts:
        cells = []
        for role in ROLES:
            o = v.outcomes.get(role)
            held = o is not None and o.holds and (role == "fixed" or v.hits_lost is not False)
            cells.append("-" if v.engine is None else "error" if o is None else "holds" if held else "FAILS")
        j = v.to_json()
        rows.append([v.case.id, v.case.issue, "real" if v.real else "model", j["buggy"] or "-", j["fixed"] or "-",
                     *cells, v.why[:100]])
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head] + rows)


def format_differences(verdicts: list[EngineVerdict]) -> str:
    """For each verdict that fails on a finished run: the run, its spec and outputs, and each backend where it
    fails."""
    lines = []
    for v in verdicts:
        for role, diffs in v.differences().items():
            store = (v.runs[role].get("pieces", {}).get("store") or {}).get("store")
            lines.append(f"{v.case.id} {role} run ({v.engine.spec(role)}, outputs in {v.runs[role]['out']}"
                         f"{f'; the store: {store}' if store else ''}): the verdict fails")
            lines += [f"  {d}" for d in diffs]
    return "\n".join(lines)


def write_json(verdicts: list[EngineVerdict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps([v.to_json() for v in verdicts], indent=1) + "\n")
    tmp.replace(path)


def run_engine_corpus(cases: list[Case], out_dir: Optional[Path], backends, progress=None,
                      vllm_device: str = "cpu") -> list[EngineVerdict]:
    """Every case as release code where it can be; vLLM's cases on ``vllm_device`` ("cpu" or "cuda"). On the CPU the
    runs fork from warm servers (slotscope/forkserver.py), each child activating the release and applying its run's
    patches as a fresh process does: a vLLM case's from one import of the release, an SGLang case's from one import
    of its release's dependencies (the release itself is imported by each child); ``SLOTSCOPE_FORK_SERVER=0`` runs
    each in a process of its own."""
    base = out_dir if out_dir is not None else Path(tempfile.mkdtemp(prefix="slotscope-bugs-engine-"))
    verdicts = []
    servers = None
    if os.environ.get("SLOTSCOPE_FORK_SERVER", "1") != "0" \
            and any(isinstance(e := engine_of(c), EngineCase) and _forks(e, vllm_device) for c in cases):
        from slotscope.forkserver import Servers

        servers = Servers()
    try:
        for case in cases:
            v = run_engine_case(case, base / slug(case.id), backends, vllm_device, servers)
            verdicts.append(v)
            if progress is not None:
                progress(v)
    finally:
        if servers is not None:
            servers.stop()
    return verdicts


__all__ = ["EngineCase", "EngineVerdict", "engine_of", "engine_scenario", "format_differences", "format_engine_table",
           "run_engine_corpus", "write_json"]
