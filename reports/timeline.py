"""The overlap timeline of the first divergence's step: a plot and words (issue 11 point 6).

Why: under the overlap scheduler (``engine.overlap = true``, docs/OVERLAP.md) a finding comes from *where*
a scheduler write landed inside the forward: a finished request's free before metadata init, a mapping
change between two SWA layers of trtllm_mha. The step's record in steps.jsonl carries that timeline
(``timeline``: the barrier, the layer count, and per scheduler write its kind, request, landing point,
entry count and full slots); this module draws it as one horizontal lane per point of the forward
(metadata init, in-graph metadata, read-done, layer 0..L-1, forward end) with a marker per landed write
between the lanes it landed between, and says in one sentence which write landed where and what the
backend then did. A run without overlap has no timeline: nothing is shown.

Only what the files show is said: the write named is the latest one visible to the finding's layer that
belongs to the finding's token's request (else the latest visible non-allocation write), and the layers
named are those with a finding on that token in the kept records.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .data import FindingRecord, RunData
from .runfiles import RunDirError, json_lines

HEAD = ("metadata_init", "in_graph_metadata", "read_done")
END = "forward_end"
KIND_WORDS = {"free": "free", "free_swa": "out-of-window free_swa", "retract": "retraction", "alloc": "allocation"}
KIND_COLORS = {"free": "#d62728", "free_swa": "#ff7f0e", "retract": "#9467bd", "alloc": "#2ca02c"}
KIND_MARKERS = {"free": "v", "free_swa": "s", "retract": "X", "alloc": "o"}
MAX_WRITES = 400          # writes drawn per step (a foreign file may hold more)


@dataclass(frozen=True)
class LandedWrite:
    """One scheduler write of the step's timeline, as steps.jsonl recorded it."""

    index: int                                   # host order
    kind: str
    request: Optional[int]
    point: str                                   # landing point (metadata_init .. forward_end)
    entries: int
    runs: Optional[tuple[tuple[int, int], ...]]  # full slots as inclusive runs (None: an older record)

    @property
    def slots(self) -> str:
        if self.runs is None:
            return f"{self.entries} entr{'y' if self.entries == 1 else 'ies'}"
        parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in self.runs[:4]]
        more = f", +{len(self.runs) - 4} more runs" if len(self.runs) > 4 else ""
        return f"full {', '.join(parts)}{more}"

    @property
    def label(self) -> str:
        who = f"request {self.request}'s" if self.request is not None else "a request's"
        return f"the {KIND_WORDS.get(self.kind, self.kind)} of {who} slots ({self.slots})"


@dataclass(frozen=True)
class StepTimeline:
    step: int
    barrier: str
    layers: int
    writes: tuple[LandedWrite, ...]

    @property
    def points(self) -> tuple[str, ...]:
        return HEAD + tuple(f"layer:{i}" for i in range(1, self.layers)) + (END,)


@dataclass(frozen=True)
class TimelineView:
    """What the report shows: the words, the plot (None when the figure could not be made) and notes."""

    step: int
    sentences: tuple[str, ...]
    plot: Any
    notes: tuple[str, ...] = ()


# ------------------------------------------------------------------------------------------ reading

def _write(i: int, item: Any, layers: int) -> Optional[LandedWrite]:
    if not isinstance(item, list) or len(item) < 4:
        return None
    kind, req, point, entries = item[:4]
    valid = set(HEAD) | {END} | {f"layer:{j}" for j in range(1, max(layers, 1))}
    if not isinstance(point, str) or point not in valid or not isinstance(entries, int) or isinstance(entries, bool):
        return None
    runs = None
    if len(item) >= 5 and isinstance(item[4], list):
        runs = tuple((int(r[0]), int(r[1])) for r in item[4]
                     if isinstance(r, list) and len(r) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                    for v in r))
    return LandedWrite(i, str(kind)[:40], req if isinstance(req, int) and not isinstance(req, bool) else None,
                       point, entries, runs)


def step_timeline(run: RunData, step: int) -> Optional[StepTimeline]:
    """The ``timeline`` of ``step`` in the run's steps.jsonl, or None (no overlap, no such step, no file)."""
    path = run.path / "steps.jsonl"
    if not path.is_file():
        return None
    try:
        for _, row in json_lines(path):
            if row.get("step") != step:
                continue
            tl = row.get("timeline")
            if not isinstance(tl, dict) or not isinstance(tl.get("layers"), int) or isinstance(tl.get("layers"), bool):
                return None
            layers = max(1, min(int(tl["layers"]), 4096))
            items = tl.get("writes") if isinstance(tl.get("writes"), list) else []
            writes = [w for i, it in enumerate(items[:MAX_WRITES]) if (w := _write(i, it, layers)) is not None]
            return StepTimeline(step, str(tl.get("barrier", "?"))[:60], layers, tuple(writes))
    except (RunDirError, OSError):
        return None
    return None


# ------------------------------------------------------------------------------------------ words

def _visible_from(point: str) -> int:
    """Lane index (0 metadata init, 1 in-graph metadata, 2 read-done, 3 + i layer i, 3 + L forward end) of the
    first event that sees a write landing at ``point``."""
    if point == "metadata_init":
        return 0
    if point == "in_graph_metadata":
        return 1
    if point == "read_done":
        return 3
    if point.startswith("layer:"):
        return 3 + int(point.split(":", 1)[1])
    return 1 << 30   # forward_end: nothing of the forward


def _where(point: str) -> str:
    if point == "metadata_init":
        return "before metadata init"
    if point == "in_graph_metadata":
        return "after metadata init and before the in-graph metadata reads"
    if point == "read_done":
        return "after every metadata read (the read-done point) and before layer 0's write"
    if point.startswith("layer:"):
        i = int(point.split(":", 1)[1])
        return f"after metadata init, between layer {i - 1}'s write and layer {i}'s"
    return "after the forward (nothing in it saw it)"


def _short(point: str) -> str:
    if point.startswith("layer:"):
        i = int(point.split(":", 1)[1])
        return f"between layer {i - 1} and layer {i}"
    return {"metadata_init": "before metadata init", "in_graph_metadata": "before the in-graph metadata reads",
            "read_done": "after the read-done point", END: "after the forward"}.get(point, point)


def _ranges(xs: Sequence[int]) -> str:
    xs = sorted(set(xs))
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ", ".join(out)


def _layer_index(run: RunData, layer: int) -> int:
    ids = [lid for lid, _ in run.provenance.layers]
    return ids.index(layer) if layer in ids else layer


def _lane_of_layer(run: RunData, layer: int) -> int:
    return 0 if layer < 0 else 3 + _layer_index(run, layer)


def culprit(run: RunData, tl: StepTimeline, rec: Optional[FindingRecord], layer: int) -> Optional[LandedWrite]:
    """The write the finding most plausibly follows from: visible at the finding's layer, of the token's
    request where one is (latest such), else the latest visible write that clears or re-points entries."""
    lane = _lane_of_layer(run, layer)
    seen = [w for w in tl.writes if _visible_from(w.point) <= lane]
    if not seen:
        return None
    req = rec.expected.request if rec is not None and rec.expected is not None else None
    for pool in ([w for w in seen if req is not None and w.request == req],
                 [w for w in seen if w.kind != "alloc"], seen):
        if pool:
            return max(pool, key=lambda w: (_visible_from(w.point), w.index))
    return None


def _token_findings(run: RunData, backend: str, step: int, rec: FindingRecord) -> list[FindingRecord]:
    tok = rec.expected
    return [f for f in run.findings if f.backend == backend and f.step == step and f.expected is not None
            and tok is not None and (f.expected.request, f.expected.position) == (tok.request, tok.position)]


def _finding_words(run: RunData, backend: str, step: int, rec: Optional[FindingRecord], cls: str,
                   layer: int) -> str:
    if rec is None:
        return f"{backend} then showed its first finding ({cls}) at layer {layer}"
    tok = rec.expected
    token = f"token (req {tok.request}, pos {tok.position})" if tok is not None and tok.request is not None \
        else (tok.label if tok is not None else "a token")
    mine = _token_findings(run, backend, step, rec)
    pad = sorted({f.layer for f in mine if f.cls == "padding_slot"})
    torn = [f for f in mine if f.cls == "torn_write"]
    reads = [f for f in run.findings if f.backend == backend and f.step == step and f.cls == "stale_read"]
    parts = []
    if pad:
        word = "layer" if len(pad) == 1 else "layers"
        own = next((f.slot for f in mine if f.cls == "padding_slot"), None)
        parts.append(f"{word} {_ranges(pad)} of {backend} then wrote {token} to padding slot 0"
                     + (f" instead of its own SWA slot {own}" if own is not None and own > 0 else ""))
    if torn:
        msg = torn[0].message.split(": ", 1)[-1] if torn[0].message else ""
        parts.append(f"a torn write ({msg})" if msg else "a torn write")
    if reads:
        who = sorted({f.expected.request for f in reads if f.expected is not None and f.expected.request is not None})
        lay = sorted({f.layer for f in reads})
        parts.append(f"{len(reads)} window read(s) of request(s) {_ranges(who)} at layer(s) {_ranges(lay)} went "
                     f"through the changed entries to slot {reads[0].slot} (stale_read)")
    if not parts:
        parts.append(f"{backend} then showed {cls} at layer {layer} on {token}"
                     + (f": \u201c{rec.message}\u201d" if rec.message else ""))
    return "; ".join(parts)


def timeline_words(run: RunData, tl: StepTimeline, backend: str, layer: int, cls: str,
                   rec: Optional[FindingRecord]) -> tuple[str, ...]:
    """The sentences of the timeline section: the landed write and the finding, then the other writes."""
    w = culprit(run, tl, rec, layer)
    if w is None:
        where = f"layer {layer}" if layer >= 0 else "metadata init"
        return (f"At step {tl.step} no scheduler write landed before {where} (barrier {tl.barrier}): this "
                "first finding does not follow from the overlap timeline.",)
    first = (f"At step {tl.step}, under barrier {tl.barrier}, {w.label} landed {_where(w.point)}: "
             f"{_finding_words(run, backend, tl.step, rec, cls, layer)}.")
    others = [o for o in tl.writes if o.index != w.index]
    out = [first[0].upper() + first[1:]]
    if others:
        groups: dict[tuple[str, str], list[LandedWrite]] = {}
        for o in others:
            groups.setdefault((o.kind, o.point), []).append(o)
        parts = []
        for (kind, point), ws in list(groups.items())[:8]:
            if len(ws) == 1:
                parts.append(f"{KIND_WORDS.get(kind, kind)} of request {ws[0].request} ({ws[0].slots}) {_short(point)}")
            else:
                reqs = ", ".join(str(o.request) for o in ws[:12]) + (", ..." if len(ws) > 12 else "")
                parts.append(f"{len(ws)} {KIND_WORDS.get(kind, kind)}s (requests {reqs}; "
                             f"{sum(o.entries for o in ws)} entries) {_short(point)}")
        more = f"; and {len(groups) - 8} more groups" if len(groups) > 8 else ""
        out.append(f"Also racing forward {tl.step} ({len(tl.writes)} scheduler write(s), in host order): "
                   f"{'; '.join(parts)}{more}.")
    return tuple(out)


# ------------------------------------------------------------------------------------------ the plot

def _short_label(w: LandedWrite) -> str:
    """A marker's label: kind, request, the first run of slots and how many entries."""
    head = f"{w.kind} r{w.request}"
    if not w.runs:
        return f"{head} ({w.entries})"
    a, b = w.runs[0]
    first = f"{a}" if a == b else f"{a}-{b}"
    more = f" +{len(w.runs) - 1} runs" if len(w.runs) > 1 else ""
    return f"{head}: full {first}{more} ({w.entries})"


def _lanes(run: RunData, tl: StepTimeline) -> list[str]:
    """The plot's lanes, top to bottom: the metadata points, each layer with its kind, the forward's end."""
    kinds = dict(run.provenance.layers)
    ids = [lid for lid, _ in run.provenance.layers]
    layer_names = [f"layer {ids[i] if i < len(ids) else i} ({kinds.get(ids[i], '?') if i < len(ids) else '?'})"
                   for i in range(tl.layers)]
    return ["metadata init", "in-graph metadata", "read-done", *layer_names, "forward end"]


def _draw_writes(ax, writes: Sequence[LandedWrite], highlight: Optional[LandedWrite], n: int) -> None:
    """A marker per write between the lanes it landed between; labels on all of a few, else on the highlight."""
    from .plots import label_text

    label_each = len(writes) <= 10
    for w in writes:
        y = (_visible_from(w.point) if w.point != END else n - 1) - 0.5
        big = highlight is not None and w.index == highlight.index
        ax.scatter([w.index], [y], marker=KIND_MARKERS.get(w.kind, "D"), s=90 if big else 40, zorder=3,
                   color=KIND_COLORS.get(w.kind, "#555555"), edgecolors="black" if big else "none",
                   linewidths=1.4 if big else 0)
        if label_each or big:
            ax.annotate(label_text(_short_label(w)), (w.index, y), xytext=(7, 4 if w.index % 2 == 0 else -10),
                        textcoords="offset points", fontsize=7.5, zorder=4,
                        fontweight="bold" if big else "normal")


def timeline_plot(run: RunData, tl: StepTimeline, key: str, backend: str, highlight: Optional[LandedWrite],
                  width: float = 10.0):
    """One horizontal lane per forward point, the scheduler writes as markers between the lanes they landed
    between (x: host order), the lanes where ``backend`` had findings at this step shaded."""
    import matplotlib
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from .plots import STYLE, Plot, label_text, new_figure, to_svg

    lanes = _lanes(run, tl)
    n = len(lanes)
    per_lane: dict[int, list[str]] = {}
    for f in run.findings:
        if f.backend == backend and f.step == tl.step:
            per_lane.setdefault(_lane_of_layer(run, f.layer), []).append(f.cls)
    writes = tl.writes
    with matplotlib.rc_context(STYLE):
        height = min(10.0, 1.45 + 0.22 * n)
        fig = new_figure(width, height, left=1.45, right=2.0, bottom=0.95, top=0.4)
        ax = fig.subplots()
        for j, name in enumerate(lanes):
            kind = name.rsplit("(", 1)[-1].rstrip(")") if name.startswith("layer") else ""
            color = {"swa": "#eef5ee", "full": "#eef1f8"}.get(kind, "#f6f6f6")
            ax.axhspan(j - 0.4, j + 0.4, color=color, zorder=0, linewidth=0)
            if j in per_lane:
                ax.axhspan(j - 0.4, j + 0.4, color="#f4b6b0", zorder=0.5, linewidth=0)
        xmax = max(len(writes), 1)
        for j, classes in per_lane.items():
            if j < n:
                counts = {c: classes.count(c) for c in dict.fromkeys(classes)}
                ax.text(xmax - 0.35, j, " " + ", ".join(f"{label_text(c)} {k}" for c, k in counts.items()),
                        va="center", fontsize=7.5, color="#a51d1d", clip_on=False)
        _draw_writes(ax, writes, highlight, n)
        ax.set_ylim(n - 0.5, -1.15)       # room above metadata init for a write landing before it
        ax.set_xlim(-0.6, xmax - 0.4)
        every = max(1, -(-n // 48))
        ticks = list(range(0, n, every))
        if n - 1 not in ticks:
            ticks.append(n - 1)
        ax.set_yticks(ticks, [label_text(lanes[t]) for t in ticks], fontsize=8 if n <= 40 else 6.5)
        ax.set_xticks(range(len(writes)) if len(writes) <= 30 else ax.get_xticks())
        ax.grid(axis="y", visible=False)
        ax.set_xlabel("scheduler writes, in host order (a marker sits between the lanes it landed between)")
        ax.set_title(f"Step {tl.step}: where each scheduler write landed in the forward (barrier "
                     f"{label_text(tl.barrier)}); shaded: {label_text(backend)}'s findings", y=1.02)
        present = list(dict.fromkeys(w.kind for w in writes))
        handles = [Line2D([], [], linestyle="none", marker=KIND_MARKERS.get(k, "D"), color=KIND_COLORS.get(k, "#555"),
                          label=label_text(KIND_WORDS.get(k, k))) for k in present]
        handles.append(Patch(color="#f4b6b0", label="lane with findings"))
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.55 / (height - 1.35)),
                  ncol=len(handles), borderaxespad=0)
        svg = to_svg(fig, key)
    alt = (f"The overlap timeline of step {tl.step}: one lane per point of the forward (metadata init, in-graph "
           f"metadata, read-done, {tl.layers} layers, forward end) and a marker for each of its {len(writes)} "
           f"scheduler write(s) where it landed; lanes where {label_text(backend)} had findings are shaded.")
    return Plot(key, "overlap timeline", alt, svg=svg)


def timeline_view(run: RunData, div: Any, key: str = "run-timeline", width: float = 10.0) -> Optional[TimelineView]:
    """The timeline section of the first divergence ``div`` (reports.explain.Divergence), or None when the
    run has none (no divergence, or the step has no overlap timeline)."""
    if div is None:
        return None
    tl = step_timeline(run, div.step)
    if tl is None:
        return None
    from .explain import earliest_finding

    rec, _ = earliest_finding(run)
    rec = rec if rec is not None and rec.step == div.step and rec.backend == div.backend else None
    words = timeline_words(run, tl, div.backend, div.layer, div.cls, rec)
    notes: list[str] = []
    if any(w.runs is None for w in tl.writes):
        notes.append("This run's steps.jsonl records entry counts, not slots, for its scheduler writes.")
    try:
        from .plots import UnsafeFigure
        plot = timeline_plot(run, tl, key, div.backend, culprit(run, tl, rec, div.layer), width=width)
    except UnsafeFigure as e:
        plot = None
        notes.append(f"The timeline figure was left out: {e}.")
    return TimelineView(tl.step, words, plot, tuple(notes))
