"""Ownership over time of the first divergent slot: a plot and words (issue 12 point 5).

Why: with the radix cache on (``engine.radix_cache``, docs/SHARING.md) a finding is usually the end of a
story of ownership: a tree node took a slot from the request that wrote it, a tombstone or an eviction
freed it, a request was given it, and then a free on behalf of someone who no longer held it (R3's stale
mapping, R7's flush, R8's sink) gave it away under a reader. The run records every slot event and
allocation of the cache (simulator/scheduling/prefix_cache.py's ``SlotEvent``s, the scheduler's allocations); the
summary's ``radix.ownership`` holds those that touched the first finding's slot (``SharingScheduler.
ownership``). This module draws them as one lane per owner (a bar while the owner held the slot, a marker
where it was given, freed or read) and says in words who held it, who freed it and who was given it.

Only what summary.json says is said. A run without the cache (or without a finding with a slot) has no
history: nothing is shown.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from .data import RunData

GIVEN = ("alloc", "adopt")
KIND_WORDS = {"alloc": "given to {o} (allocation)", "adopt": "{o} took it ({c})",
              "free": "freed on behalf of {o} ({c})", "available": "back in the free list",
              "map": "a full id re-pointed at it ({c})", "lock": "read by {o}", "unlock": "no longer read by {o}"}
MAX_CLAUSES = 24
MAX_LANES = 14


@dataclass(frozen=True)
class SlotEvent:
    """One event of the slot's history, as summary.json recorded it."""

    step: int
    kind: str
    cause: str
    owner: Optional[str]      # "request:3" | "node:7" | None
    peer: Optional[int]


@dataclass(frozen=True)
class Holding:
    owner: str
    start: int
    end: Optional[int]        # None: still held at the end of the history
    how: str                  # the cause it was given by
    ended_by: str             # "freed" | "passed" | "" (still held)


@dataclass(frozen=True)
class OwnershipHistory:
    pool: str
    slot: int
    step: int                 # the finding's step
    backend: str
    cls: str
    message: str
    events: tuple[SlotEvent, ...]
    truncated: bool


@dataclass(frozen=True)
class OwnershipView:
    """What the report shows: the words, the plot (None when it could not be made) and notes."""

    slot: int
    pool: str
    sentences: tuple[str, ...]
    plot: Any
    notes: tuple[str, ...] = ()


# ------------------------------------------------------------------------------------------ reading

def _int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def read_history(run: RunData) -> Optional[OwnershipHistory]:
    """``radix.ownership`` of the run's summary.json, or None (no cache, no finding with a slot, no file)."""
    path = run.path / "summary.json"
    try:
        own = json.loads(path.read_text())["radix"]["ownership"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(own, dict) or _int(own.get("slot")) is None or own.get("pool") not in ("full", "swa"):
        return None
    events = []
    for e in own.get("events", [])[:2000] if isinstance(own.get("events"), list) else []:
        if isinstance(e, list) and len(e) >= 4 and _int(e[0]) is not None and isinstance(e[1], str):
            events.append(SlotEvent(e[0], e[1][:20], str(e[2])[:40], None if e[3] is None else str(e[3])[:40],
                                    _int(e[4]) if len(e) > 4 else None))
    return OwnershipHistory(own["pool"], own["slot"], _int(own.get("step")) or 0, str(own.get("backend", "?"))[:40],
                            str(own.get("class", "?"))[:40], str(own.get("message", ""))[:300], tuple(events),
                            bool(own.get("truncated")))


def holdings(h: OwnershipHistory) -> list[Holding]:
    """Who held the slot when: an allocation starts a holding beside any still open (a second owner); a
    tree node's adopt takes it over (the open holdings pass to it); a free on behalf of a holder ends its
    holding, a free on behalf of anyone else leaves the holders as they were (they still hold it)."""
    open_: dict[str, tuple[int, str]] = {}
    out: list[Holding] = []
    for e in h.events:
        if e.owner is None:
            continue
        if e.kind == "adopt":
            for o, (start, how) in list(open_.items()):
                if o != e.owner:
                    out.append(Holding(o, start, e.step, how, "passed"))
                    del open_[o]
        if e.kind in GIVEN and e.owner not in open_:
            open_[e.owner] = (e.step, e.cause)
        elif e.kind == "free" and e.owner in open_:
            start, how = open_.pop(e.owner)
            out.append(Holding(e.owner, start, e.step, how, "freed"))
    out += [Holding(o, start, None, how, "") for o, (start, how) in open_.items()]
    return sorted(out, key=lambda x: (x.start, x.owner))


# ------------------------------------------------------------------------------------------ words

def _who(owner: Optional[str]) -> str:
    if not owner:
        return "nobody"
    kind, _, ident = owner.partition(":")
    return f"{kind} {ident}" if ident else owner


def _clauses(h: OwnershipHistory) -> list[str]:
    out = []
    for e in h.events:
        if e.kind in ("lock", "unlock", "available"):
            continue
        text = KIND_WORDS.get(e.kind, e.kind + " ({c})").format(o=_who(e.owner), c=e.cause)
        if e.kind == "map" and e.peer is not None:
            text += f": full {e.peer}" if h.pool == "swa" else f": to SWA {e.peer}"
        out.append(f"step {e.step}: {text}")
    return out


def _conflict(h: OwnershipHistory) -> Optional[str]:
    """The first free on behalf of someone who did not hold the slot while someone else did, or the first
    allocation while another owner still held it."""
    open_: dict[str, int] = {}
    for e in h.events:
        if e.owner is None:
            continue
        if e.kind == "adopt":
            open_ = {o: s for o, s in open_.items() if o == e.owner}
        if e.kind == "free" and e.owner not in open_ and open_:
            held = ", ".join(f"{_who(o)} (since step {s})" for o, s in open_.items())
            return (f"At step {e.step} it was freed on behalf of {_who(e.owner)} ({e.cause}) while {held} held "
                    f"it: a free of a slot its owner still uses.")
        if e.kind == "alloc" and open_ and e.owner not in open_:
            held = ", ".join(f"{_who(o)} (since step {s})" for o, s in open_.items())
            return (f"At step {e.step} it was given to {_who(e.owner)} while {held} still held it: two owners "
                    f"of one slot.")
        if e.kind in GIVEN:
            open_.setdefault(e.owner, e.step)
        elif e.kind == "free":
            open_.pop(e.owner, None)
    return None


def ownership_words(h: OwnershipHistory) -> tuple[str, ...]:
    pool = "SWA" if h.pool == "swa" else "full"
    out = [f"{pool} slot {h.slot} is the first divergent slot ({h.cls} at step {h.step} on {h.backend}: "
           f"{h.message})." if h.message else
           f"{pool} slot {h.slot} is the first divergent slot ({h.cls} at step {h.step} on {h.backend})."]
    if not h.events:
        out.append("No event of the radix cache touched this slot: nobody was given it, held it or freed it "
                   "(a read of it went through a mapping entry, not through an owner).")
        return tuple(out)
    hold = holdings(h)
    if hold:
        parts = [f"{_who(x.owner)} from step {x.start} ({x.how})" +
                 (f" until it was {x.ended_by} at step {x.end}" if x.end is not None else ", still at the end")
                 for x in hold[:12]]
        more = f"; and {len(hold) - 12} more" if len(hold) > 12 else ""
        out.append("Who held it: " + "; ".join(parts) + more + ".")
    clauses = _clauses(h)
    more = f"; ... {len(clauses) - MAX_CLAUSES} more" if len(clauses) > MAX_CLAUSES else ""
    out.append("In order: " + "; ".join(clauses[:MAX_CLAUSES]) + more + ".")
    c = _conflict(h)
    if c:
        out.append(c)
    readers = sorted({e.owner for e in h.events if e.kind == "lock" and e.owner},
                     key=lambda o: (o.partition(":")[0], int(o.partition(":")[2]) if o.partition(":")[2].isdigit() else 0))
    if readers:
        out.append("Read through a prefix lock by " + ", ".join(_who(r) for r in readers[:12]) +
                   (", ..." if len(readers) > 12 else "") + ".")
    return tuple(out)


# ------------------------------------------------------------------------------------------ the plot

COLORS = {"alloc": "#2ca02c", "adopt": "#1f77b4", "free": "#d62728", "available": "#7f7f7f", "map": "#ff7f0e",
          "lock": "#9467bd"}
MARKERS = {"alloc": "o", "adopt": "s", "free": "v", "available": ".", "map": "D", "lock": "|"}


def ownership_plot(h: OwnershipHistory, key: str, width: float = 10.0):
    """One lane per owner (first appearance order), a bar while it held the slot, markers for the events;
    the finding's step dashed."""
    import matplotlib
    from matplotlib.lines import Line2D

    from .plots import STYLE, Plot, label_text, new_figure, to_svg

    owners = list(dict.fromkeys(e.owner for e in h.events if e.owner))[:MAX_LANES]
    lanes = owners + ["free list"]
    lane = {o: i for i, o in enumerate(owners)}
    last = max([e.step for e in h.events] + [h.step]) + 1
    first = min([e.step for e in h.events] + [h.step])
    with matplotlib.rc_context(STYLE):
        height = min(8.0, 1.6 + 0.3 * len(lanes))
        fig = new_figure(width, height, left=1.3, right=0.3, bottom=0.95, top=0.4)
        ax = fig.subplots()
        for x in holdings(h):
            if x.owner in lane:
                end = x.end if x.end is not None else last
                ax.barh(lane[x.owner], max(end - x.start, 0.4), left=x.start, height=0.5, color="#cfe3f3",
                        edgecolor="#1f77b4", linewidth=0.8, zorder=1)
        reading: dict[str, int] = {}
        for e in h.events:              # a reader's lock span: a thin line on its lane
            if e.kind == "lock" and e.owner in lane:
                reading.setdefault(e.owner, e.step)
            elif e.kind == "unlock" and e.owner in reading:
                ax.hlines(lane[e.owner], reading.pop(e.owner), e.step, color=COLORS["lock"], linewidth=2, zorder=2)
        for o, start in reading.items():
            ax.hlines(lane[o], start, last, color=COLORS["lock"], linewidth=2, zorder=2)
        present = []
        for e in h.events:
            y = lane.get(e.owner, len(owners)) if e.kind != "available" else len(owners)
            if e.kind == "unlock" or (e.owner and e.owner not in lane and e.kind != "available"):
                continue
            ax.scatter([e.step], [y], marker=MARKERS.get(e.kind, "x"), color=COLORS.get(e.kind, "#555"), s=36,
                       zorder=3)
            present.append(e.kind)
        ax.axvline(h.step, color="#a51d1d", linestyle="--", linewidth=1.2, zorder=2)
        ax.text(h.step, -0.75, f" {label_text(h.cls)} (step {h.step})", color="#a51d1d", fontsize=8, va="bottom")
        ax.set_yticks(range(len(lanes)), [label_text(_who(o)) if o != "free list" else o for o in lanes])
        ax.set_ylim(len(lanes) - 0.5, -1.0)
        ax.set_xlim(first - 1, last + 1)
        ax.grid(axis="y", visible=False)
        ax.set_xlabel("step")
        pool = "SWA" if h.pool == "swa" else "full"
        ax.set_title(f"Ownership of {pool} slot {h.slot} over time (bars: held; the first finding dashed)", y=1.02)
        kinds = list(dict.fromkeys(present))
        handles = [Line2D([], [], linestyle="none", marker=MARKERS.get(k, "x"), color=COLORS.get(k, "#555"),
                          label={"alloc": "given (allocation)", "adopt": "taken by a node", "free": "freed",
                                 "available": "in the free list", "map": "mapping re-pointed",
                                 "lock": "read (lock span)"}.get(k, k)) for k in kinds]
        if handles:
            ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.6 / (height - 1.35)),
                      ncol=len(handles), borderaxespad=0)
        svg = to_svg(fig, key)
    alt = (f"Ownership of {pool} slot {h.slot}: one lane per owner ({len(owners)}), bars while each held the "
           f"slot, markers where it was given, freed, re-pointed or read; the first finding at step {h.step}.")
    return Plot(key, "slot ownership", alt, svg=svg)


def read_stop(run: RunData) -> Optional[str]:
    """The sentence for ``radix.stopped`` (an over-free ended the run), or None."""
    try:
        st = json.loads((run.path / "summary.json").read_text())["radix"]["stopped"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(st, dict) or _int(st.get("step")) is None:
        return None
    return (f"The run stopped at step {st['step']}: the allocator's capacity assert ({str(st.get('assert', '?'))[:60]}) "
            f"failed, which ends SGLang's engine: {str(st.get('message', ''))[:200]}.")


def ownership_view(run: RunData, key: str = "run-ownership", width: float = 10.0) -> Optional[OwnershipView]:
    """The ownership section of the run's report, or None (no radix history in summary.json)."""
    h = read_history(run)
    if h is None:
        return None
    stop = read_stop(run)
    notes: list[str] = [] if stop is None else [stop]
    if h.truncated:
        notes.append("The history is cut: the summary keeps the first and last events of a busy slot.")
    plot = None
    if h.events:
        try:
            from .plots import UnsafeFigure
            plot = ownership_plot(h, key, width=width)
        except UnsafeFigure as e:
            notes.append(f"The ownership figure was left out: {e}.")
    return OwnershipView(h.slot, h.pool, ownership_words(h), plot, tuple(notes))
