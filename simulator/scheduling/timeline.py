"""The overlap scheduler's timeline of one forward (SGLang 0.5.23 ``Scheduler.event_loop_overlap``).

With ``engine.overlap = true`` forward k is still running on the GPU while the host schedules
iteration k+1 and processes the result of the previous batch. Both write buffers forward k reads: the
``full_to_swa`` mapping above all. This module says *where* in forward k each of those scheduler
writes can land, and picks one place per write from a seed.

Landing points of a forward with L layers, in GPU order (a write "lands at" a point when it is
visible to everything from that point on)::

    metadata_init         before metadata init (translate, the graph buffers, the read ids see it)
    in_graph_metadata     after out-of-graph metadata init, before in-graph metadata reads
    read_done             after every metadata read (0.5.23's read-done event), before layer 0
    layer:1 .. layer:L-1  before that layer's write location is built (a per-layer re-translation sees it)
    forward_end           after the last layer (the sequential order: nothing in the forward sees it)

Scheduler writes come in two classes:

``result``    the previous batch's result processing (frees of finished requests), which SGLang runs
              right after launching forward k in the *same* iteration;
``schedule``  the next iteration's scheduling: out-of-window ``free_swa``, retraction, allocation.

A barrier (``engine.war_barrier``) is data: per class, the earliest point a write may land at
(:data:`BARRIERS`). ``after_launch`` (0.5.23, #31687) waits on the forward's read-done event where the
runner publishes one and on the whole forward otherwise (:func:`read_done_published`). Between the
earliest point and ``forward_end`` the seed picks, uniformly and independently per write, from a random
stream of its own (:func:`landing_rng`), so turning overlap on perturbs no other randomness, and every
ordering the barrier allows is reachable and replayable. No scheduler write lands before the forward's
own launch (the forward stream waits on the schedule stream's earlier work), so a forward's own
allocation is always visible to it.

What lands mid-forward is the *device-visible* mapping (:class:`Landing`); the oracle (the reference
pool) learns the frees after the forward's checks, because a free changes no K/V: the slot's contents
stay until a later forward writes it, so a read or write that still goes to the right slot is right.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

#: Fixed points before the layers and after them (layer points sit between).
HEAD_POINTS: tuple[str, ...] = ("metadata_init", "in_graph_metadata", "read_done")
END_POINT = "forward_end"

WRITE_CLASSES: tuple[str, ...] = ("result", "schedule")
#: scheduler write kinds and their class
WRITE_KINDS: dict[str, str] = {"free": "result", "free_swa": "schedule", "retract": "schedule", "alloc": "schedule"}

#: Per barrier and write class: the earliest point a write may land at ("read_done*": the read-done point
#: where the forward publishes one, else forward_end). The latest is always forward_end.
BARRIERS: dict[str, dict[str, str]] = {
    # no barrier (before #26380; ROCm in 0.5.23 unless SGLANG_ENABLE_WAR_BARRIER): anything anywhere
    "none": {"result": "metadata_init", "schedule": "metadata_init"},
    # #26380: schedule_stream waits for the whole previous forward at the loop top; result processing of
    # the same iteration is not ordered against the just-launched forward (W2, #31687)
    "loop_top": {"result": "metadata_init", "schedule": END_POINT},
    # #28363 + #31687: the barrier after launch waits on a read-done recorded right after metadata init,
    # before in-graph metadata reads (W4) and the layers (W5)
    "read_done_after_metadata": {"result": "in_graph_metadata", "schedule": "in_graph_metadata"},
    # 0.5.23: right after launch, on the read-done event published after every metadata read (#33587), or
    # on the whole forward where none is published
    "after_launch": {"result": "read_done*", "schedule": "read_done*"},
    # SGLANG_FORCE_COARSE_WAR_BARRIER: the whole forward, always
    "coarse": {"result": END_POINT, "schedule": END_POINT},
}

def read_done_published(mode: str, graph: str, platform: str = "cuda") -> bool:
    """Whether 0.5.23 publishes a read-done event for this forward: the decode CUDA graph (IN_REPLAY,
    after the in-graph metadata, where the graph has the in-graph marker: not on ROCm, whose HIP graphs fall
    back to after the replay, ``_resolve_shared_read_ends``) and prefill (``SGLANG_ENABLE_PREFILL_WAR_READ_DONE``,
    default on, after metadata init); eager decode, target-verify and the draft forwards wait coarsely."""
    return (mode == "decode" and graph == "decode_graph" and platform != "rocm") or mode in ("extend", "mixed")


def points(n_layers: int) -> tuple[str, ...]:
    """The landing points of a forward of ``n_layers`` layers, in GPU order."""
    return HEAD_POINTS + tuple(f"layer:{i}" for i in range(1, n_layers)) + (END_POINT,)


def earliest(barrier: str, cls: str, mode: str, graph: str, n_layers: int, platform: str = "cuda") -> int:
    """Index (into :func:`points`) of the earliest point a write of class ``cls`` may land at."""
    try:
        first = BARRIERS[barrier][cls]
    except KeyError:
        raise ValueError(f"unknown barrier {barrier!r} or write class {cls!r}") from None
    if first == "read_done*":
        first = "read_done" if read_done_published(mode, graph, platform) else END_POINT
    pts = points(n_layers)
    return pts.index(first)


@dataclass(frozen=True, slots=True)
class SchedWrite:
    """One scheduler write, as the host made it: its mapping entries and what the oracle learns."""

    kind: str                  # free | free_swa | retract | alloc
    rid: int                   # the request it belongs to
    full: np.ndarray           # full slots whose full_to_swa entry it sets
    values: np.ndarray         # those entries' values right after the write (read from the allocator)

    @property
    def cls(self) -> str:
        return WRITE_KINDS[self.kind]


@dataclass(frozen=True, slots=True)
class Landing:
    """The writes racing one forward and the point (index into ``pts``) each lands at."""

    barrier: str
    pts: tuple[str, ...]
    writes: tuple[SchedWrite, ...]
    at: tuple[int, ...]

    def landing_at(self, point: int) -> list[SchedWrite]:
        return [w for w, a in zip(self.writes, self.at) if a == point]

    def record(self) -> dict:
        """Compact form for steps.jsonl: the barrier, the layer count and [kind, request, point, entries,
        full slots as inclusive [first, last] runs] per write (the report's timeline names the slots)."""
        return {"barrier": self.barrier, "layers": len(self.pts) - len(HEAD_POINTS),
                "writes": [[w.kind, w.rid, self.pts[a], int(w.full.shape[0]), slot_runs(w.full)]
                           for w, a in zip(self.writes, self.at)]}


def slot_runs(slots: np.ndarray) -> list[list[int]]:
    """Slots as sorted inclusive runs: [1040, 1041, 1042, 7] -> [[7, 7], [1040, 1042]]."""
    s = np.unique(np.asarray(slots, dtype=np.int64))
    if s.size == 0:
        return []
    cut = np.nonzero(np.diff(s) != 1)[0]
    starts = np.concatenate([[0], cut + 1])
    ends = np.concatenate([cut, [s.size - 1]])
    return [[int(s[a]), int(s[b])] for a, b in zip(starts, ends)]


Chooser = Callable[[Sequence[SchedWrite], Sequence[int], int], Sequence[int]]   # (writes, earliest, end) -> points


def landing_rng(seed: int) -> np.random.Generator:
    """The timeline's own random stream: derived from the scenario seed, apart from the run's stream."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x71AE,)))


#: the chance that a write slips past the point the write before it landed at
SLIP = 0.25


def random_chooser(rng: np.random.Generator) -> Chooser:
    """The schedule stream catches up in bursts: per write class one uniform point in the range the barrier
    allows (the result writes' burst, then the scheduling writes' at or after it); each write lands at its
    class's burst, or (with probability :data:`SLIP`) at a uniform later point. Landing points never
    decrease in host order (the schedule stream runs its writes in order), and every non-decreasing
    assignment within the barrier has a non-zero chance."""
    def choose(writes, lo, end):
        at, prev, burst = [], 0, {}
        for w, a in zip(writes, lo):
            cls = w.cls
            if cls not in burst:
                burst[cls] = int(rng.integers(max(a, prev), end + 1))
            p = max(a, prev, burst[cls])
            if rng.random() < SLIP:
                p = int(rng.integers(p, end + 1))
            at.append(p)
            prev = p
        return at
    return choose


def earliest_chooser(writes, lo, end):
    """Every write as early as its barrier allows (the worst case)."""
    return list(lo)


def latest_chooser(writes, lo, end):
    """Every write after the forward (the sequential order)."""
    return [end] * len(lo)


def plan(writes: Sequence[SchedWrite], barrier: str, mode: str, graph: str, n_layers: int,
         choose: Chooser, platform: str = "cuda") -> Landing:
    """Where each of ``writes`` lands in one forward under ``barrier`` on ``platform``."""
    pts = points(n_layers)
    end = len(pts) - 1
    lo = [earliest(barrier, w.cls, mode, graph, n_layers, platform) for w in writes]
    at = tuple(int(a) for a in choose(writes, lo, end)) if writes else ()
    prev = 0
    for a, low in zip(at, lo):
        if not low <= a <= end:
            raise ValueError(f"a chooser put a write at point {a}, outside [{low}, {end}] allowed by {barrier}")
        if a < prev:
            raise ValueError("landing points must not decrease in host order (the schedule stream is FIFO)")
        prev = a
    return Landing(barrier, pts, tuple(writes), at)


def resolve_barrier(setting: str, release_barriers: Optional[dict[str, str]], platform: str) -> str:
    """``engine.war_barrier`` made concrete: an explicit value, or the release's barrier on the platform."""
    if setting != "release":
        if setting not in BARRIERS:
            raise ValueError(f"unknown war_barrier {setting!r}")
        return setting
    table = release_barriers if release_barriers is not None else PLATFORM_BARRIERS_DEFAULT
    return table.get(platform, table.get("cuda", "after_launch"))


#: a release that says nothing about its barrier: 0.5.23's gating (after_launch on CUDA, none on ROCm)
PLATFORM_BARRIERS_DEFAULT: dict[str, str] = {"cuda": "after_launch", "rocm": "none"}


class Journal:
    """The scheduler's writes of one scheduling decision, as discrete writes (made through the allocator
    interface: the values are read back from ``alloc.full_to_swa`` right after each call, so an engine's
    allocator with the same interface serves)."""

    def __init__(self, alloc) -> None:
        self.alloc = alloc
        self.writes: list[SchedWrite] = []

    def note(self, kind: str, rid: int, full: np.ndarray) -> None:
        full = np.asarray(full, dtype=np.int64)
        if full.size:
            self.writes.append(SchedWrite(kind, rid, full.copy(), self.alloc.full_to_swa[full].copy()))

    def take(self) -> list[SchedWrite]:
        out, self.writes = self.writes, []
        return out
