"""How the write paths of several runs differ: ``slotscope compare``'s "Write paths" table.

One scenario run under two engines (SGLang and vLLM, or a release and slotscope's model of it) writes and frees KV
by different rules; the table puts them side by side per run, from what each run recorded (run.json's ``sources``
and ``engine_pieces``, steps.jsonl's pool occupancy), never from what the engine is assumed to do:

* who made the batches and who handed out the slots (``sources.scheduler``, ``sources.allocator``);
* the padding convention: what a padded row of ``loc`` holds and whether the store skips it (``sources.padding``);
* eviction timing: how many tokens' SWA slots were given back while their full slots stayed held, per step (the
  gap between the pools' occupancy: SGLang frees a request's out-of-window SWA slots every
  ``swa_eviction_interval`` forwards, vLLM's sliding-window manager frees a block as soon as it leaves the window);
* the release's own counts where its scheduler ran (forwards, preemptions or retractions, SWA slots evicted).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .data import RunData
from .runfiles import RunDirError, read_json_file

@dataclass(frozen=True)
class WritePathRow:
    aspect: str
    cells: tuple[str, ...]

    @property
    def differs(self) -> bool:
        return len(set(self.cells)) > 1


def _run_json(run: RunData) -> dict[str, Any]:
    try:
        d = read_json_file(run.path / "run.json")
    except (OSError, RunDirError):
        return {}
    return d if isinstance(d, dict) else {}


def _padding(sources: dict) -> str:
    pad = sources.get("padding")
    if not isinstance(pad, dict):
        return "not recorded"
    value, skip = pad.get("pad_value"), pad.get("skip_index")
    said = "written (the reserved slot absorbs them)" if skip is None else f"index {skip} skipped by the store"
    null = "; page 0 a null block nothing may write" if pad.get("null_block") else ""
    return f"{pad.get('convention', '?')}: padded rows hold {value}, {said}{null}"


def _eviction(run: RunData) -> str:
    st = run.steps
    if len(st) == 0:
        return "no per-step records"
    gap = np.maximum(st.full_used - st.swa_used, 0)
    if not gap.any():
        return "none freed ahead of their full slots"
    first = int(st.step[np.flatnonzero(gap)[0]])
    return f"mean {gap.mean():.1f}, peak {int(gap.max())} a step; first at step {first}"


def _did(d: dict) -> str:
    pieces = d.get("engine_pieces")
    sched = pieces.get("scheduler") if isinstance(pieces, dict) else None
    did = sched.get("did") if isinstance(sched, dict) else None
    if not isinstance(did, dict):
        return "the model's scheduler (no release counts)"
    parts = [f"{did[k]} {label}" for k, label in (("retractions", "retractions / preemptions"),
                                                   ("evicted_swa_slots", "SWA slots evicted"),
                                                   ("prefix_hit_tokens", "prefix-hit tokens")) if k in did]
    return ", ".join(parts) or "not recorded"


def write_path_rows(runs: Sequence[RunData]) -> list[WritePathRow]:
    """The table's rows, one cell per run, in the runs' order."""
    data = [_run_json(r) for r in runs]
    src = [d.get("sources") if isinstance(d.get("sources"), dict) else {} for d in data]

    def engine(d: dict, r: RunData) -> str:
        e = d.get("engine")
        return f"{e.get('name', '?')} {e.get('version', '?')}" if isinstance(e, dict) else f"model: {r.design}"

    rows = [
        ("engine", [engine(d, r) for d, r in zip(data, runs)]),
        ("batches made by", [str(s.get("scheduler", "not recorded")) for s in src]),
        ("slots handed out by", [str(s.get("allocator", "not recorded")) for s in src]),
        ("padded rows of loc", [_padding(s) for s in src]),
        ("SWA slots freed ahead of their full slots (tokens)", [_eviction(r) for r in runs]),
        ("forwards", [str(r.num_steps) for r in runs]),
        ("what the release's scheduler did", [_did(d) for d in data]),
    ]
    return [WritePathRow(a, tuple(c)) for a, c in rows]
