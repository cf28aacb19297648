"""Table rows for the report: the verdict per backend and the first expected-vs-observed mismatches.

Why group mismatches: the eight backends usually fail the same way at the same slot, and every layer
of a kind repeats it, so the raw first 50 findings would be one slot seen 50 times. Rows that differ
only by layer or backend are merged and list both, so the table shows 50 *distinct* mismatches.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from .data import BackendVerdict, RunData

MISMATCH_ROWS = 50


@dataclass(frozen=True)
class ClassCount:
    cls: str
    count: int


@dataclass(frozen=True)
class VerdictRow:
    """One backend of the design x backend table."""

    backend: str
    writes: Optional[int]               # None: not recorded
    clean: bool                         # no findings in a complete run (an incomplete run has no clean cell)
    counts: tuple[ClassCount, ...]      # only the non-zero classes
    first: str                          # "step 1, layer 0, length_mismatch" or "-"


@dataclass(frozen=True)
class MismatchRow:
    step: int
    layers: str
    kind: str
    cls: str
    slot: str
    expected: str
    observed: str
    message: str
    backends: str


def verdict_rows(run: RunData) -> list[VerdictRow]:
    rows = []
    for b in run.backends:
        counts = tuple(ClassCount(c, b.findings.get(c, 0)) for c in run.classes if b.findings.get(c, 0))
        rows.append(VerdictRow(b.name, b.writes, b.clean and run.complete, counts, _first(b)))
    return rows


def _first(b: BackendVerdict) -> str:
    if b.first is None:
        return "\u2014"
    return f"step {b.first.step}, layer {b.first.layer}, {b.first.cls}"


def backends_label(names: Sequence[str], all_names: Sequence[str]) -> str:
    """'all 8', 'all but trtllm_mha', or the list."""
    names_set = set(names)
    if len(all_names) > 1 and names_set >= set(all_names):
        return f"all {len(all_names)}"
    missing = [n for n in all_names if n not in names_set]
    if len(all_names) > 2 and len(missing) <= 2 and len(names_set) == len(all_names) - len(missing):
        return "all but " + ", ".join(missing)
    return ", ".join(names)


def layers_label(layers: Sequence[int], kind: str, run: RunData) -> str:
    """'all 18 swa', or a short list of layer ids."""
    of_kind = [lid for lid, k in run.provenance.layers if k == kind]
    if len(of_kind) > 1 and set(layers) >= set(of_kind):
        return f"all {len(of_kind)} {kind}"
    ids = sorted(layers)
    shown = ", ".join(str(i) for i in ids[:8])
    return shown + (f" \u2026 (+{len(ids) - 8})" if len(ids) > 8 else "")


def first_mismatches(run: RunData, limit: int = MISMATCH_ROWS) -> tuple[list[MismatchRow], int]:
    """The first ``limit`` distinct mismatches and how many distinct ones were read.

    A distinct mismatch is (step, pool, class, slot, expected, observed, message); the layers and
    backends that show it are merged into one row, listed as their union.
    """
    layers: dict[tuple, list[int]] = {}
    backends: dict[tuple, list[str]] = {}
    firsts: dict[tuple, int] = {}
    for i, f in enumerate(run.findings):
        exp = f.expected.label if f.expected else "\u2014"
        obs = f.observed.label if f.observed else "\u2014"
        key = (f.step, f.kind, f.cls, f.slot, exp, obs, f.message)
        if key not in firsts:
            firsts[key] = i
            layers[key] = []
            backends[key] = []
        if f.layer not in layers[key]:
            layers[key].append(f.layer)
        if f.backend not in backends[key]:
            backends[key].append(f.backend)
    order = sorted(firsts, key=lambda k: (k[0], firsts[k]))
    all_names = [b.name for b in run.backends]
    rows = [MismatchRow(step=k[0], layers=layers_label(layers[k], k[1], run), kind=k[1], cls=k[2],
                        slot="\u2014" if k[3] < 0 else str(k[3]), expected=k[4], observed=k[5], message=k[6],
                        backends=backends_label(backends[k], all_names))
            for k in order[:limit]]
    return rows, len(order)


def compare_rows(runs: Sequence[RunData]) -> list[tuple[str, list[Optional[VerdictRow]]]]:
    """Backend x run cells for the comparison table (None where a run did not test that backend)."""
    names: list[str] = []
    for r in runs:
        for b in r.backends:
            if b.name not in names:
                names.append(b.name)
    per_run = [{v.backend: v for v in verdict_rows(r)} for r in runs]
    return [(n, [m.get(n) for m in per_run]) for n in names]
