"""Load one run directory into a typed, read-only ``RunData`` for the report.

Why a module of its own: the report must work on directories written by other versions, other
machines, or edited by hand (a shared report is untrusted input). So every file is read here, once,
with clear errors that name the file and line, and nothing downstream touches the file system.

Only ``summary.json`` is required. A missing ``run.json`` (older pipelines wrote it after the report),
``steps.jsonl``, ``shapes.jsonl`` or ``findings.jsonl`` leaves that part of the report empty or
"unknown". ``findings.jsonl`` can hold up to 100,000 detailed findings: it is streamed, every line is
counted into the (layer, step) heat map, and only the first ``detail_cap`` are kept as records.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

import numpy as np

#: The finding classes in the order the report lists them (the simulator's order).
FINDING_CLASSES: tuple[str, ...] = (
    "missed", "clobbered", "padding_slot", "evicted_slot", "out_of_range", "length_mismatch",
)

#: How many findings are kept as records (for the first divergence and the mismatch table).
DEFAULT_DETAIL_CAP = 2000

UNKNOWN = "unknown"


class RunDirError(ValueError):
    """A run directory that cannot be reported on; the message names the file (and line)."""


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
class BackendVerdict:
    """One row of the verdict table: a backend's writes and findings by class."""

    name: str
    writes: int
    findings: Mapping[str, int]
    first: Optional[FirstFinding]

    @property
    def total(self) -> int:
        return sum(self.findings.values())

    @property
    def clean(self) -> bool:
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

    @property
    def clean(self) -> bool:
        return self.findings_total == 0 and all(b.clean for b in self.backends)

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


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RunDirError(f"{where}: expected a number, got {value!r}"[:300])
    return int(value)


def _json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise RunDirError(f"{path}:{lineno}: not a JSON line ({e.msg})") from None
            if not isinstance(row, dict):
                raise RunDirError(f"{path}:{lineno}: expected a JSON object")
            yield lineno, row


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


def _load_summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "summary.json"
    if not path.is_file():
        raise RunDirError(f"{run_dir}: no summary.json (is this a slotscope run directory?)")
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as e:
        raise RunDirError(f"{path}:{e.lineno}: not JSON ({e.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("backends"), dict):
        raise RunDirError(f"{path}: field 'backends' must be an object of backend -> verdict")
    return data


def _verdicts(summary: dict[str, Any], path: Path) -> tuple[BackendVerdict, ...]:
    out = []
    for name, b in summary["backends"].items():
        where = f"{path}: backends.{name}"
        if not isinstance(b, dict):
            raise RunDirError(f"{where}: expected an object")
        found = b.get("findings") or {}
        if not isinstance(found, dict):
            raise RunDirError(f"{where}.findings: expected an object of class -> count")
        counts = {str(c): _int(n, f"{where}.findings.{c}") for c, n in found.items()}
        ff = b.get("first_finding")
        first = None
        if isinstance(ff, dict):
            first = FirstFinding(_int(ff.get("step"), f"{where}.first_finding.step"),
                                 _int(ff.get("layer"), f"{where}.first_finding.layer"), str(ff.get("class")))
        out.append(BackendVerdict(str(name), _int(b.get("writes", 0), f"{where}.writes"), counts, first))
    return tuple(out)


def _load_provenance(run_dir: Path, notes: list[str]) -> Provenance:
    path = run_dir / "run.json"
    if not path.is_file():
        notes.append("run.json is missing: provenance shows 'unknown'.")
        return Provenance()
    try:
        d = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as e:
        notes.append(f"run.json line {e.lineno} is not JSON ({e.msg}): provenance shows 'unknown'.")
        return Provenance()
    if not isinstance(d, dict):
        return Provenance()
    layers: list[tuple[int, str]] = []
    for item in d.get("layers") or ():
        if isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], int):
            layers.append((int(item[0]), str(item[1])))
    timings = d.get("timings") if isinstance(d.get("timings"), dict) else {}
    run_s = timings.get("run_s")
    return Provenance(
        version=_str(d.get("version")), commit=_str(d.get("commit")), scenario_hash=_str(d.get("scenario_hash")),
        scenario_path=_str(d.get("scenario_path")), design_description=_str(d.get("design_description"), ""),
        description=_str(d.get("description"), ""), device=_str(d.get("device")),
        device_name=_str(d.get("device_name")), geometry=_str(d.get("geometry")), store=_str(d.get("store")),
        model=_str(d.get("model")), window=_str(d.get("window")), python=_str(d.get("python")),
        torch=_str(d.get("torch")), run_s=float(run_s) if isinstance(run_s, (int, float)) else None,
        layers=tuple(layers), present=True)


_STEP_INT_FIELDS = ("step", "num_requests", "real_tokens", "dp_padded_tokens", "padded_tokens",
                    "full_used", "swa_used", "full_size", "swa_size")


def _load_steps(run_dir: Path) -> StepTable:
    path = run_dir / "steps.jsonl"
    cols: dict[str, list[int]] = {k: [] for k in _STEP_INT_FIELDS}
    modes: list[str] = []
    graphs: list[str] = []
    if path.is_file():
        for lineno, row in _json_lines(path):
            for k in _STEP_INT_FIELDS:
                v = row.get(k, 0)
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise RunDirError(f"{path}:{lineno}: field {k!r} must be a number")
                cols[k].append(int(v))
            modes.append(str(row.get("mode", "?")))
            graphs.append(str(row.get("graph", "?")))
    arr = {k: np.asarray(v, dtype=np.int64) for k, v in cols.items()}
    return StepTable(mode=tuple(modes), graph=tuple(graphs), **arr)


def _load_shapes(run_dir: Path) -> tuple[ShapeSeries, ...]:
    path = run_dir / "shapes.jsonl"
    if not path.is_file():
        return ()
    acc: dict[tuple[str, str], tuple[list[int], list[int], list[int]]] = {}
    for lineno, row in _json_lines(path):
        try:
            key = (str(row["backend"]), str(row["kind"]))
            vals = (int(row["step"]), int(row["loc_len"]), int(row["swa_loc_len"]))
        except (KeyError, TypeError, ValueError) as e:
            raise RunDirError(f"{path}:{lineno}: needs step, backend, kind, loc_len, swa_loc_len ({e})") from None
        lists = acc.setdefault(key, ([], [], []))
        for lst, v in zip(lists, vals):
            lst.append(v)
    return tuple(ShapeSeries(b, k, np.asarray(s, np.int64), np.asarray(l, np.int64), np.asarray(w, np.int64))
                 for (b, k), (s, l, w) in acc.items())


def _finding(row: dict[str, Any], where: str) -> FindingRecord:
    return FindingRecord(
        step=_int(row.get("step"), f"{where}: step"), backend=str(row.get("backend", "?")),
        layer=_int(row.get("layer"), f"{where}: layer"), kind=str(row.get("kind", row.get("subpool", "?"))),
        cls=str(row.get("class", "?")), slot=_int(row.get("slot", -1), f"{where}: slot"),
        expected=_owner(row.get("expected"), f"{where}: expected"),
        observed=_owner(row.get("observed"), f"{where}: observed"), message=str(row.get("message") or ""))


def _load_findings(run_dir: Path, cap: int) -> tuple[tuple[FindingRecord, ...], int, HeatCounts]:
    """Keep the first ``cap`` records; count every line into (layer, step) without keeping it."""
    path = run_dir / "findings.jsonl"
    kept: list[FindingRecord] = []
    steps: list[int] = []
    layers: list[int] = []
    n = 0
    if path.is_file():
        for lineno, row in _json_lines(path):
            n += 1
            where = f"{path}:{lineno}"
            if len(kept) < cap:
                rec = _finding(row, where)
                kept.append(rec)
                steps.append(rec.step)
                layers.append(rec.layer)
            else:
                steps.append(_int(row.get("step"), f"{where}: step"))
                layers.append(_int(row.get("layer"), f"{where}: layer"))
    heat = _heat(np.asarray(steps, np.int64), np.asarray(layers, np.int64))
    return tuple(kept), n, heat


def _heat(steps: np.ndarray, layers: np.ndarray) -> HeatCounts:
    if steps.size == 0:
        e = np.zeros(0, np.int64)
        return HeatCounts(e, e, e, e)
    layer_ids, layer_idx = np.unique(layers, return_inverse=True)
    key = steps * len(layer_ids) + layer_idx
    uniq, counts = np.unique(key, return_counts=True)
    return HeatCounts(layer_ids, uniq // len(layer_ids), uniq % len(layer_ids), counts)


def load_run(run_dir: str | Path, detail_cap: int = DEFAULT_DETAIL_CAP) -> RunData:
    """Read a run directory; raises RunDirError (naming the file) when it cannot be reported on."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: not a directory")
    summary = _load_summary(run_dir)
    notes: list[str] = []
    prov = _load_provenance(run_dir, notes)
    findings, lines, heat = _load_findings(run_dir, detail_cap)
    if not (run_dir / "findings.jsonl").is_file():
        notes.append("findings.jsonl is missing: only the summary's counts are shown.")
    truncated = bool(summary.get("findings_detail_truncated", False))
    scenario_path = run_dir / "scenario.toml"
    scenario_text = scenario_path.read_text(encoding="utf-8", errors="replace") if scenario_path.is_file() else None
    where = run_dir / "summary.json"
    return RunData(
        path=run_dir,
        scenario=_str(summary.get("scenario")),
        design=_str(summary.get("design")),
        seed=_str(summary.get("seed")),
        backends=_verdicts(summary, where),
        num_steps=_int(summary.get("steps", 0), f"{where}: steps"),
        crossings=_int(summary.get("crossings", 0), f"{where}: crossings"),
        findings_total=_int(summary.get("findings_total", 0), f"{where}: findings_total"),
        detail_truncated=truncated,
        provenance=prov,
        steps=_load_steps(run_dir),
        shapes=_load_shapes(run_dir),
        findings=findings,
        findings_lines=lines,
        heat=heat,
        scenario_text=scenario_text,
        notes=tuple(notes),
    )
