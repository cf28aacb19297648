"""Load one run directory into a typed, read-only ``RunData`` for the report.

Why a module of its own: the report must work on directories written by other versions, other
machines, or edited by hand (a shared report is untrusted input). So every file is read here, once,
through runfiles.py's guarded readers, with clear errors that name the file and line, and nothing
downstream touches the file system.

A run directory is one that holds any of summary.json, run.json, steps.jsonl, findings.jsonl or the run
lock. A run that did not finish says so: summary.json's ``incomplete`` entry (reason, message, steps
done), or, when there is no summary.json at all (the run was killed), the report is built from the
streamed files (findings.jsonl, steps.jsonl) and run.json, and says that. A missing ``run.json``,
``steps.jsonl``, ``shapes.jsonl`` or ``findings.jsonl`` leaves that part of the report empty or
"unknown". ``findings.jsonl`` can hold up to 100,000 detailed findings: it is streamed, every line is
counted into the (layer, step) heat map, and only the first ``detail_cap`` are kept as records.

Hostile or damaged input ends in :class:`RunDirError` naming the file and line, never in a traceback:
lines longer than ``runfiles.MAX_LINE_BYTES``, JSON files larger than ``runfiles.MAX_JSON_BYTES``, JSON
nested too deeply, numbers that are not finite or not 64-bit. A last line without its newline (a kill
mid-write) is left out with a note.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np

from .runfiles import MAX_JSON_BYTES, RunDirError, int_field, json_lines, opt_float, opt_int, read_json_file

#: The finding classes in the order the report lists them (the simulator's order).
FINDING_CLASSES: tuple[str, ...] = (
    "missed", "clobbered", "padding_slot", "evicted_slot", "out_of_range", "length_mismatch", "design_error",
)

#: How many findings are kept as records (for the first divergence and the mismatch table).
DEFAULT_DETAIL_CAP = 2000

UNKNOWN = "unknown"

#: Files whose presence makes a directory a run directory (slotscope/rundir.py writes the lock).
RUN_MARKERS = ("summary.json", "run.json", "steps.jsonl", "findings.jsonl", ".slotscope.lock")


@dataclass(frozen=True)
class Owner:
    """Who a slot's row belongs to, as the checker recorded it."""

    tag: Optional[int]
    request: Optional[int]
    position: Optional[int]
    label: str

    @property
    def is_padding(self) -> bool:
        return self.label == "padding" or self.tag == -1


@dataclass(frozen=True)
class FindingRecord:
    """One finding line of findings.jsonl."""

    step: int
    backend: str
    layer: int
    kind: str
    cls: str
    slot: int
    expected: Optional[Owner]
    observed: Optional[Owner]
    message: str


@dataclass(frozen=True)
class FirstFinding:
    step: int
    layer: int
    cls: str


@dataclass(frozen=True)
class Incomplete:
    """Why a run did not finish, as its files say."""

    reason: str                       # max_steps | error | SIGINT | SIGTERM | killed | unknown
    message: str                      # in words
    steps_done: Optional[int]
    max_steps: Optional[int] = None


@dataclass(frozen=True)
class BackendVerdict:
    """One row of the verdict table: a backend's writes and findings by class."""

    name: str
    writes: Optional[int]             # None: not recorded (a run killed before its summary)
    findings: Mapping[str, int]
    first: Optional[FirstFinding]

    @property
    def total(self) -> int:
        return sum(self.findings.values())

    @property
    def clean(self) -> bool:
        """No findings on this backend (in the steps that ran: see ``RunData.complete``)."""
        return self.total == 0


@dataclass(frozen=True)
class Provenance:
    """What was run, where, and from which code: run.json, with "unknown" for anything missing."""

    version: str = UNKNOWN
    commit: str = UNKNOWN
    scenario_hash: str = UNKNOWN
    scenario_path: str = UNKNOWN
    design_description: str = ""
    description: str = ""
    device: str = UNKNOWN
    device_name: str = UNKNOWN
    geometry: str = UNKNOWN
    store: str = UNKNOWN
    model: str = UNKNOWN
    window: str = UNKNOWN
    python: str = UNKNOWN
    torch: str = UNKNOWN
    run_s: Optional[float] = None
    layers: tuple[tuple[int, str], ...] = ()
    present: bool = False
    #: the real engine in the write path (run.json "engine": name, version, path); None: a model run
    engine: Optional[dict[str, Any]] = None
    #: run.json "engine_pieces" rows: (piece, whose, by), as engine_path listed what it ran
    engine_pieces: tuple[tuple[str, str, str], ...] = ()

    @property
    def engine_label(self) -> str:
        if not self.engine:
            return ""
        label = f"{self.engine.get('name', '?')} {self.engine.get('version', '?')}"
        pats = self.engine.get("patches") or ()        # --engine-patch: each file with its hash
        if pats:
            label += " patched with " + ", ".join(
                f"{str(p.get('path', '?')).rsplit('/', 1)[-1]} (sha256 {str(p.get('sha256', ''))[:12]}, "
                f"applied by {p.get('applied_by', '?')})" for p in pats)
        return label


@dataclass(frozen=True)
class StepTable:
    """steps.jsonl as columns (one entry per forward step, in file order)."""

    step: np.ndarray
    mode: tuple[str, ...]
    graph: tuple[str, ...]
    num_requests: np.ndarray
    real_tokens: np.ndarray
    dp_padded_tokens: np.ndarray
    padded_tokens: np.ndarray
    full_used: np.ndarray
    swa_used: np.ndarray
    full_size: np.ndarray
    swa_size: np.ndarray

    def __len__(self) -> int:
        return int(self.step.shape[0])

    def index_of(self, step: int) -> Optional[int]:
        """Row of ``step``, or None (steps are sorted in the file; searched, not scanned)."""
        if len(self) == 0:
            return None
        i = int(np.searchsorted(self.step, step))
        if i < len(self) and int(self.step[i]) == step:
            return i
        hits = np.nonzero(self.step == step)[0]  # unsorted file: fall back to a scan
        return int(hits[0]) if hits.size else None


@dataclass(frozen=True)
class ShapeSeries:
    """For one (backend, layer kind): the first layer's loc and swa_loc lengths per step (-1: none)."""

    backend: str
    kind: str
    step: np.ndarray
    loc_len: np.ndarray
    swa_loc_len: np.ndarray

    def at(self, step: int) -> Optional[tuple[int, int]]:
        hits = np.nonzero(self.step == step)[0]
        if not hits.size:
            return None
        i = int(hits[0])
        return int(self.loc_len[i]), int(self.swa_loc_len[i])


@dataclass(frozen=True)
class HeatCounts:
    """Findings counted per (layer, step), summed over backends, from every detailed finding."""

    layers: np.ndarray   # sorted layer ids seen
    steps: np.ndarray    # step of each count
    layer_idx: np.ndarray
    counts: np.ndarray

    @property
    def empty(self) -> bool:
        return self.counts.size == 0


@dataclass(frozen=True)
class RunData:
    """Everything the report shows about one run directory."""

    path: Path
    scenario: str
    design: str
    seed: str
    backends: tuple[BackendVerdict, ...]
    num_steps: int
    crossings: int
    findings_total: int
    detail_truncated: bool
    provenance: Provenance
    steps: StepTable
    shapes: tuple[ShapeSeries, ...]
    findings: tuple[FindingRecord, ...]
    findings_lines: int
    heat: HeatCounts
    scenario_text: Optional[str]
    notes: tuple[str, ...] = field(default=())
    incomplete: Optional[Incomplete] = None
    max_steps: Optional[int] = None

    @property
    def complete(self) -> bool:
        """The run finished: every step ran and its summary was written."""
        return self.incomplete is None

    @property
    def clean(self) -> bool:
        """A clean verdict needs a complete run: no findings in a run that stopped early proves nothing."""
        return self.complete and self.findings_total == 0 and all(b.clean for b in self.backends)

    def class_totals(self) -> dict[str, int]:
        out = {c: 0 for c in self.classes}
        for b in self.backends:
            for c, n in b.findings.items():
                out[c] = out.get(c, 0) + n
        return out

    @property
    def classes(self) -> tuple[str, ...]:
        """Known classes first, in order, then any unknown class names a foreign file carries."""
        extra = sorted({c for b in self.backends for c in b.findings if c not in FINDING_CLASSES})
        return FINDING_CLASSES + tuple(extra)

    def shape(self, backend: str, kind: str) -> Optional[ShapeSeries]:
        for s in self.shapes:
            if s.backend == backend and s.kind == kind:
                return s
        return None

    def layer_kind(self, layer: int) -> Optional[str]:
        for lid, kind in self.provenance.layers:
            if lid == layer:
                return kind
        return None


# ---------------------------------------------------------------------------------------------- reading

def _str(value: Any, default: str = UNKNOWN) -> str:
    if value is None or value == "":
        return default
    return str(value)


def _owner(value: Any, where: str) -> Optional[Owner]:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RunDirError(f"{where}: expected an owner object or null")
    tag = value.get("tag")
    req = value.get("request")
    pos = value.get("position")
    label = value.get("label")
    if label is None:
        label = "padding" if tag == -1 else ("empty" if tag == 0 else f"req {req} pos {pos}")
    return Owner(tag if isinstance(tag, int) else None, req if isinstance(req, int) else None,
                 pos if isinstance(pos, int) else None, str(label))


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and any((path / m).exists() for m in RUN_MARKERS)


def _load_summary(run_dir: Path) -> Optional[dict[str, Any]]:
    """summary.json, or None when there is none (a run killed before writing it)."""
    path = run_dir / "summary.json"
    if not path.is_file():
        if not is_run_dir(run_dir):
            raise RunDirError(f"{run_dir}: not a slotscope run directory (no summary.json, run.json, "
                              "steps.jsonl or findings.jsonl)")
        return None
    data = read_json_file(path)
    if not isinstance(data, dict) or not isinstance(data.get("backends"), dict):
        raise RunDirError(f"{path}: field 'backends' must be an object of backend -> verdict")
    return data


def _incomplete(summary: dict[str, Any]) -> Optional[Incomplete]:
    inc = summary.get("incomplete")
    if inc is None or inc is False:
        return None
    max_steps = opt_int(summary.get("max_steps"))
    if not isinstance(inc, dict):
        return Incomplete("unknown", f"the run did not finish ({str(inc)[:300]})", None, max_steps)
    reason = _str(inc.get("reason"), "error" if inc.get("error") else "unknown")[:100]
    message = inc.get("message")
    if not isinstance(message, str) or not message:
        message = f"the run failed: {inc['error']}" if inc.get("error") else "the run did not finish"
    return Incomplete(reason, str(message)[:2000], opt_int(inc.get("steps_done")),
                      opt_int(inc.get("max_steps")) or max_steps)


def _verdicts(summary: dict[str, Any], path: Path) -> tuple[BackendVerdict, ...]:
    out = []
    for name, b in summary["backends"].items():
        where = f"{path}: backends.{name}"
        if not isinstance(b, dict):
            raise RunDirError(f"{where}: expected an object")
        found = b.get("findings") or {}
        if not isinstance(found, dict):
            raise RunDirError(f"{where}.findings: expected an object of class -> count")
        counts = {str(c): int_field(n, f"{where}.findings.{c}") for c, n in found.items()}
        ff = b.get("first_finding")
        first = None
        if isinstance(ff, dict):
            first = FirstFinding(int_field(ff.get("step"), f"{where}.first_finding.step"),
                                 int_field(ff.get("layer"), f"{where}.first_finding.layer"), str(ff.get("class")))
        out.append(BackendVerdict(str(name), int_field(b.get("writes", 0), f"{where}.writes"), counts, first))
    return tuple(out)


def _verdicts_from_findings(names: list[str], counts: dict[str, dict[str, int]],
                            firsts: dict[str, FirstFinding]) -> tuple[BackendVerdict, ...]:
    """Per backend verdicts counted from findings.jsonl (no summary.json: the run was killed)."""
    out = []
    for name in dict.fromkeys([*names, *counts]):
        found = {c: 0 for c in FINDING_CLASSES}
        found.update(counts.get(name, {}))
        out.append(BackendVerdict(name, None, found, firsts.get(name)))
    return tuple(out)


def _load_run_json(run_dir: Path, notes: list[str]) -> Optional[dict[str, Any]]:
    path = run_dir / "run.json"
    if not path.is_file():
        notes.append("run.json is missing: provenance shows 'unknown'.")
        return None
    try:
        d = read_json_file(path)
    except RunDirError as e:
        notes.append(f"run.json cannot be read ({str(e)[len(str(path)) + 2:][:300]}): provenance shows 'unknown'.")
        return None
    return d if isinstance(d, dict) else None


def _load_provenance(d: Optional[dict[str, Any]]) -> Provenance:
    if d is None:
        return Provenance()
    layers: list[tuple[int, str]] = []
    items = d.get("layers")
    for item in items if isinstance(items, list) else ():
        if isinstance(item, (list, tuple)) and len(item) == 2 and opt_int(item[0]) is not None:
            layers.append((int(item[0]), str(item[1])))
    timings = d.get("timings") if isinstance(d.get("timings"), dict) else {}
    run_s = timings.get("run_s")
    engine = d.get("engine")
    pats = engine.get("patches") if isinstance(engine, dict) else None
    replaced = engine.get("replaces_design") if isinstance(engine, dict) else None
    scheduler = engine.get("scheduler") if isinstance(engine, dict) else None
    engine = {k: _str(engine.get(k)) for k in ("name", "version", "path")} if isinstance(engine, dict) else None
    if engine is not None and isinstance(replaced, str):    # the scenario's own design, not what ran
        engine["replaces_design"] = _str(replaced)
    if engine is not None and scheduler in ("release", "model"):     # whose scheduler made the batches
        engine["scheduler"] = scheduler
    if engine is not None and isinstance(pats, list):     # --engine-patch: [{"path", "sha256", "applied_by"}]
        engine["patches"] = [{k: _str(p.get(k)) for k in ("path", "sha256", "applied_by")}
                             for p in pats if isinstance(p, dict)]
    pieces_d = d.get("engine_pieces")
    rows = pieces_d.get("rows") if isinstance(pieces_d, dict) else None
    pieces = tuple((_str(r.get("piece")), _str(r.get("whose")), _str(r.get("by"), ""))
                   for r in (rows if isinstance(rows, list) else ()) if isinstance(r, dict))
    return Provenance(
        version=_str(d.get("version")), commit=_str(d.get("commit")), scenario_hash=_str(d.get("scenario_hash")),
        scenario_path=_str(d.get("scenario_path")), design_description=_str(d.get("design_description"), ""),
        description=_str(d.get("description"), ""), device=_str(d.get("device")),
        device_name=_str(d.get("device_name")), geometry=_str(d.get("geometry")), store=_str(d.get("store")),
        model=_str(d.get("model")), window=_str(d.get("window")), python=_str(d.get("python")),
        torch=_str(d.get("torch")), run_s=opt_float(run_s),
        layers=tuple(layers), present=True, engine=engine, engine_pieces=pieces)


_STEP_INT_FIELDS = ("step", "num_requests", "real_tokens", "dp_padded_tokens", "padded_tokens",
                    "full_used", "swa_used", "full_size", "swa_size")


def _load_steps(run_dir: Path, notes: list[str]) -> StepTable:
    path = run_dir / "steps.jsonl"
    cols: dict[str, list[int]] = {k: [] for k in _STEP_INT_FIELDS}
    modes: list[str] = []
    graphs: list[str] = []
    if path.is_file():
        for lineno, row in json_lines(path, notes):
            for k in _STEP_INT_FIELDS:
                cols[k].append(int_field(row.get(k, 0), f"{path}:{lineno}: field {k!r}"))
            modes.append(str(row.get("mode", "?"))[:100])
            graphs.append(str(row.get("graph", "?"))[:100])
    arr = {k: np.asarray(v, dtype=np.int64) for k, v in cols.items()}
    return StepTable(mode=tuple(modes), graph=tuple(graphs), **arr)


def _load_shapes(run_dir: Path, notes: list[str]) -> tuple[ShapeSeries, ...]:
    path = run_dir / "shapes.jsonl"
    if not path.is_file():
        return ()
    acc: dict[tuple[str, str], tuple[list[int], list[int], list[int]]] = {}
    for lineno, row in json_lines(path, notes):
        where = f"{path}:{lineno}"
        try:
            key = (str(row["backend"]), str(row["kind"]))
            vals = (int_field(row["step"], where), int_field(row["loc_len"], where),
                    int_field(row["swa_loc_len"], where))
        except KeyError as e:
            raise RunDirError(f"{where}: needs step, backend, kind, loc_len, swa_loc_len (no {e})") from None
        lists = acc.setdefault(key, ([], [], []))
        for lst, v in zip(lists, vals):
            lst.append(v)
    return tuple(ShapeSeries(b, k, np.asarray(s, np.int64), np.asarray(l, np.int64), np.asarray(w, np.int64))
                 for (b, k), (s, l, w) in acc.items())


def _finding(row: dict[str, Any], where: str) -> FindingRecord:
    return FindingRecord(
        step=int_field(row.get("step"), f"{where}: step"), backend=str(row.get("backend", "?")),
        layer=int_field(row.get("layer"), f"{where}: layer"), kind=str(row.get("kind", row.get("subpool", "?"))),
        cls=str(row.get("class", "?")), slot=int_field(row.get("slot", -1), f"{where}: slot"),
        expected=_owner(row.get("expected"), f"{where}: expected"),
        observed=_owner(row.get("observed"), f"{where}: observed"), message=str(row.get("message") or ""))


@dataclass
class _FindingScan:
    """What one pass over findings.jsonl yields: the first records, the heat map, and (for a run with no
    summary.json) counts per backend and class and each backend's first finding."""

    kept: tuple[FindingRecord, ...]
    lines: int
    heat: HeatCounts
    counts: dict[str, dict[str, int]]
    firsts: dict[str, FirstFinding]


def _load_findings(run_dir: Path, cap: int, notes: list[str]) -> _FindingScan:
    """Keep the first ``cap`` records; count every line into (layer, step) without keeping it."""
    path = run_dir / "findings.jsonl"
    kept: list[FindingRecord] = []
    steps: list[int] = []
    layers: list[int] = []
    counts: dict[str, dict[str, int]] = {}
    firsts: dict[str, FirstFinding] = {}
    n = 0
    if path.is_file():
        for lineno, row in json_lines(path, notes):
            n += 1
            where = f"{path}:{lineno}"
            step = int_field(row.get("step"), f"{where}: step")
            layer = int_field(row.get("layer"), f"{where}: layer")
            backend, cls = str(row.get("backend", "?"))[:200], str(row.get("class", "?"))[:100]
            if len(kept) < cap:
                kept.append(_finding(row, where))
            steps.append(step)
            layers.append(layer)
            per = counts.setdefault(backend, {})
            per[cls] = per.get(cls, 0) + 1
            if backend not in firsts or step < firsts[backend].step:
                firsts[backend] = FirstFinding(step, layer, cls)
    heat = _heat(np.asarray(steps, np.int64), np.asarray(layers, np.int64))
    return _FindingScan(tuple(kept), n, heat, counts, firsts)


def _heat(steps: np.ndarray, layers: np.ndarray) -> HeatCounts:
    if steps.size == 0:
        e = np.zeros(0, np.int64)
        return HeatCounts(e, e, e, e)
    layer_ids, layer_idx = np.unique(layers, return_inverse=True)
    key = steps * len(layer_ids) + layer_idx
    uniq, counts = np.unique(key, return_counts=True)
    return HeatCounts(layer_ids, uniq // len(layer_ids), uniq % len(layer_ids), counts)


def _scenario_text(run_dir: Path, notes: list[str]) -> Optional[str]:
    path = run_dir / "scenario.toml"
    if not path.is_file():
        return None
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            notes.append(f"scenario.toml is larger than {MAX_JSON_BYTES // 2**20} MiB: not shown.")
            return None
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        notes.append(f"scenario.toml cannot be read ({e.strerror}).")
        return None


def load_run(run_dir: str | Path, detail_cap: int = DEFAULT_DETAIL_CAP) -> RunData:
    """Read a run directory; raises RunDirError (naming the file) when it cannot be reported on."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: not a directory")
    summary = _load_summary(run_dir)
    notes: list[str] = []
    run_json = _load_run_json(run_dir, notes)
    prov = _load_provenance(run_json)
    scan = _load_findings(run_dir, detail_cap, notes)
    if not (run_dir / "findings.jsonl").is_file():
        notes.append("findings.jsonl is missing: only the summary's counts are shown.")
    steps = _load_steps(run_dir, notes)
    common = dict(path=run_dir, provenance=prov, steps=steps, shapes=_load_shapes(run_dir, notes),
                  findings=scan.kept, findings_lines=scan.lines, heat=scan.heat,
                  scenario_text=_scenario_text(run_dir, notes))
    if summary is None:
        return _from_streams(run_dir, run_json, scan, notes, common)
    where = run_dir / "summary.json"
    return RunData(
        scenario=_str(summary.get("scenario")),
        design=_str(summary.get("design")),
        seed=_str(summary.get("seed")),
        backends=_verdicts(summary, where),
        num_steps=int_field(summary.get("steps", 0), f"{where}: steps"),
        crossings=int_field(summary.get("crossings", 0), f"{where}: crossings"),
        findings_total=int_field(summary.get("findings_total", 0), f"{where}: findings_total"),
        detail_truncated=bool(summary.get("findings_detail_truncated", False)),
        notes=tuple(notes),
        incomplete=_incomplete(summary) or _incomplete(run_json or {}),   # either file saying so is enough
        max_steps=opt_int(summary.get("max_steps")),
        **common,
    )


def _live_lock_holder(run_dir: Path) -> Optional[int]:
    """The PID in the run's lock when that process is alive (a run still writing here), else None."""
    try:
        pid = int((run_dir / ".slotscope.lock").read_text(encoding="utf-8", errors="replace").split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if pid <= 0 or pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except PermissionError:
        return pid
    except OSError:
        return None
    return pid


def _from_streams(run_dir: Path, run_json: Optional[dict[str, Any]], scan: _FindingScan, notes: list[str],
                  common: dict[str, Any]) -> RunData:
    """A run killed before its summary: counts from findings.jsonl, steps from steps.jsonl, names from
    run.json. Never clean: the run did not finish."""
    d = run_json or {}
    names = d.get("backends")
    names = [str(n)[:200] for n in names] if isinstance(names, list) else []
    steps: StepTable = common["steps"]
    done = len(steps)
    max_steps = opt_int(d.get("max_steps"))
    missing = "no summary.json" + ("" if run_json is not None else " and no run.json")
    holder = _live_lock_holder(run_dir)
    if holder is not None:
        reason, message = "running", (f"the run is still in progress (PID {holder}); built from the streamed "
                                      "files so far")
    else:
        reason, message = "killed", f"the run did not finish ({missing}; built from the streamed files)"
    notes.insert(0, f"{missing}: this report is built from the streamed files (findings.jsonl, steps.jsonl); "
                    "writes per backend were not recorded.")
    return RunData(
        scenario=_str(d.get("scenario")), design=_str(d.get("design")), seed=_str(d.get("seed")),
        backends=_verdicts_from_findings(names, scan.counts, scan.firsts),
        num_steps=done, crossings=0, findings_total=scan.lines, detail_truncated=False, notes=tuple(notes),
        incomplete=Incomplete(reason, message, done, max_steps),
        max_steps=max_steps, **common)
