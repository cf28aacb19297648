"""The report's figures: matplotlib (Agg, no pyplot) -> inline SVG, or a base64 PNG where dense.

Why these choices:
- The report must cost little next to the run, so timelines are reduced to at most ``MAX_POINTS``
  points per line with a min/max envelope (a one-step spike, like B1's length mismatch, survives),
  categorical strips and the heat map are binned to a fixed number of columns, and nothing loops over
  rows in Python: numpy does the binning.
- Text is kept as SVG ``<text>`` (``svg.fonttype = none``): small, selectable, and escaped by
  matplotlib's SVG writer. Untrusted names (backends from a foreign file) are still shortened and their
  ``$`` escaped, so mathtext cannot fail on them, and ``safe_svg`` rejects anything that is not plain
  drawing (no script, no foreignObject, no event attributes) before the SVG goes into the page.
- Each figure gets its own ``svg.hashsalt`` so element ids do not collide when several SVGs share one
  HTML document.
"""
from __future__ import annotations

import base64
import io
import re
from dataclasses import dataclass
from typing import Optional, Sequence

import matplotlib
import numpy as np
from matplotlib.colors import LogNorm, Normalize, to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

from .data import RunData, ShapeSeries

MAX_POINTS = 1200        # points per timeline line (min/max envelope beyond that)
MAX_COLUMNS = 600        # columns of the heat map and of the categorical strips
NAME_MAX = 40            # characters of an untrusted name shown inside a figure

CLASS_COLORS = {
    "missed": "#7f7f7f",
    "clobbered": "#d62728",
    "padding_slot": "#9467bd",
    "evicted_slot": "#ff7f0e",
    "out_of_range": "#8c564b",
    "length_mismatch": "#1f77b4",
    "design_error": "#e377c2",
}
GRAPH_COLORS = {"eager": "#c7c7c7", "decode_graph": "#6baed6", "piecewise": "#fd8d3c",
                "draft_graph": "#2171b5", "draft_extend_graph": "#08306b"}
MODE_COLORS = {"extend": "#74c476", "decode": "#9e9ac8", "mixed": "#fdd0a2", "draft_extend": "#31a354",
               "draft_decode": "#756bb1", "target_verify": "#e6550d"}
GROUP_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")

#: matplotlib settings every report figure is drawn under (timeline.py, ownership.py and engine_trace.py too)
STYLE = {
    "svg.fonttype": "none",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e6e6e6",
    "grid.linewidth": 0.6,
    "legend.frameon": False,
    "legend.fontsize": 8,
}


class UnsafeFigure(ValueError):
    """matplotlib's SVG held something other than plain drawing; the figure is left out."""


@dataclass(frozen=True)
class Plot:
    """One figure ready for the page: ``svg`` markup, or a ``png`` data URI for an <img>."""

    key: str
    title: str
    alt: str
    svg: Optional[str] = None
    png_uri: Optional[str] = None
    width_px: int = 0
    height_px: int = 0


# ------------------------------------------------------------------------------------------ helpers

def label_text(name: str) -> str:
    """An untrusted name as figure text: short, and no mathtext ($ ... $ would be parsed)."""
    s = "".join(ch if ch.isprintable() else "?" for ch in str(name))
    if len(s) > NAME_MAX:
        s = s[: NAME_MAX - 1] + "\u2026"
    return s.replace("$", r"\$")


_FORBIDDEN = re.compile(r"<\s*(script|foreignobject|iframe|object|embed|a)\b"
                        r"|<[^>]*\son[a-z]+\s*="
                        r"|<[^>]*javascript:"
                        r"|<[^>]*href\s*=\s*[\"'](?!#|data:image/png;base64,)", re.IGNORECASE)
_PNG_DATA = re.compile(r"data:image/png;base64,[A-Za-z0-9+/=\s]*")
_FONT_LIST = re.compile(r"font-family: 'DejaVu Sans'[^;\"]*sans-serif")


def safe_svg(svg: str) -> str:
    """matplotlib's SVG without prolog, DOCTYPE, metadata or comments; refuses anything active."""
    start = svg.find("<svg")
    if start < 0:
        raise UnsafeFigure("not an SVG document")
    svg = svg[start:]
    svg = re.sub(r"<!--.*?-->", "", svg, flags=re.DOTALL)
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.DOTALL)
    svg = _FONT_LIST.sub("font-family: 'DejaVu Sans', Verdana, Arial, sans-serif", svg)
    if _FORBIDDEN.search(_PNG_DATA.sub("data:image/png;base64,", svg)):
        raise UnsafeFigure("figure SVG contains active content; refusing to inline it")
    return svg.strip()


CHAR_IN = 0.063          # width of one 8-9 pt character, inches (for margins sized to labels)


def _text_width(labels: Sequence[str]) -> float:
    return CHAR_IN * max((len(x) for x in labels), default=0)


def new_figure(width: float, height: float, left: float = 0.75, right: float = 0.25, bottom: float = 0.5,
            top: float = 0.32) -> Figure:
    """A figure with fixed margins in inches: constrained layout costs half of a figure's time."""
    fig = Figure(figsize=(width, height), dpi=100)
    left = min(left, width * 0.3)          # very long (foreign) labels are clipped, never break the layout
    right = min(right, width * 0.4)
    bottom = min(bottom, height * 0.4)
    top = min(top, height * 0.3)
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height)
    return fig


def _legend_margin(labels: Sequence[str]) -> float:
    return 0.55 + _text_width(labels)


def _prefix_ids(svg: str, prefix: str) -> str:
    """Give every element id (and each reference to it) the figure's prefix: ids stay unique in the page."""
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}-{m.group(1)}"', svg)
    svg = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}-{m.group(1)})", svg)
    return re.sub(r'href="#([^"]+)"', lambda m: f'href="#{prefix}-{m.group(1)}"', svg)


def to_svg(fig: Figure, key: str) -> str:
    """The figure as checked inline SVG (``safe_svg``), its ids prefixed with ``key`` so that several figures
    share one page; the hash salt is the key too, so the same figure gives the same bytes."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": f"slotscope-{key}", "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return _prefix_ids(safe_svg(buf.getvalue()), re.sub(r"[^A-Za-z0-9_-]", "_", key))


def _to_png_uri(fig: Figure, dpi: int = 110) -> tuple[str, int, int]:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    w, h = fig.get_size_inches() * dpi
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii"), int(w), int(h)


def envelope(x: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Reduce a long series to per-bin min and max (NaN-aware) so spikes stay visible."""
    n = int(x.shape[0])
    if n <= max_points:
        return x, y
    bins = max_points // 2
    edges = np.linspace(0, n, bins + 1).astype(np.int64)
    starts = np.unique(edges[:-1])
    ends = np.append(starts[1:], n) - 1
    yf = y.astype(np.float64)
    lo = np.fmin.reduceat(yf, starts)
    hi = np.fmax.reduceat(yf, starts)
    xs = np.empty(2 * starts.size, dtype=np.float64)
    ys = np.empty(2 * starts.size, dtype=np.float64)
    xs[0::2], xs[1::2] = x[starts], x[ends]
    ys[0::2], ys[1::2] = lo, hi
    return xs, ys


def _bin_index(steps: np.ndarray, lo: int, hi: int, columns: int) -> tuple[np.ndarray, int, float]:
    """Column of each step when [lo, hi] is split into at most ``columns`` equal bins."""
    span = hi - lo + 1
    ncol = min(columns, max(span, 1))
    width = span / ncol
    idx = np.minimum(((steps - lo) / width).astype(np.int64), ncol - 1)
    return idx, ncol, width


def _categorical_strip(codes: np.ndarray, steps: np.ndarray, columns: int) -> tuple[np.ndarray, float, float]:
    """Bin categorical codes per column, keeping the highest code (graphs outrank eager)."""
    if steps.size == 0:
        return np.zeros((1, 1)), 0, 1
    lo, hi = int(steps.min()), int(steps.max())
    idx, ncol, _ = _bin_index(steps, lo, hi, columns)
    strip = np.full(ncol, -1, dtype=np.int64)
    np.maximum.at(strip, idx, codes)
    return strip[None, :], lo - 0.5, hi + 0.5


def _group_label(names: Sequence[str], total: int) -> str:
    if len(names) == total and total > 1:
        return f"all {total} backends"
    shown = [label_text(n) for n in names[:3]]
    more = f" +{len(names) - 3}" if len(names) > 3 else ""
    return ", ".join(shown) + more


def _plain_number(value: float, _pos: object = None) -> str:
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def _mark_step(ax, step: Optional[int]) -> None:
    if step is not None:
        ax.axvline(step, color="#d62728", linestyle=":", linewidth=1.0, zorder=0)


# ------------------------------------------------------------------------------------------ figures

def _heat_layers(run: RunData) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """All layer ids (from run.json and the findings), the rows that get a tick, and their labels."""
    kinds = dict(run.provenance.layers)
    all_layers = np.asarray(sorted(set(kinds) | set(int(x) for x in run.heat.layers)), dtype=np.int64)
    every = max(1, int(np.ceil(all_layers.size / 48)))
    ticks = np.arange(0, all_layers.size, every)
    labels = [f"{int(all_layers[t])} {label_text(kinds.get(int(all_layers[t]), ''))}".strip() for t in ticks]
    return all_layers, ticks, labels


def _occupancy_labels(run: RunData) -> list[str]:
    st = run.steps
    return (["full pool", "SWA pool"] + [f"graph: {label_text(c)}" for c in set(st.graph)]
            + [f"mode: {label_text(c)}" for c in set(st.mode)])


def step_axis_margins(run: RunData) -> tuple[float, float]:
    """Left and right margins (inches) shared by every figure whose x axis is the step, so they align."""
    n_total = len(run.backends)
    labels = [_group_label(names, n_total) for names, _ in shape_groups(run)] + ["first divergence"]
    right = max(_legend_margin(labels), _legend_margin(_occupancy_labels(run)), 1.1)
    left = 0.85
    if not run.heat.empty:
        left = max(left, 0.5 + _text_width(_heat_layers(run)[2]))
    return left, right


def shape_groups(run: RunData, kind: str = "swa") -> list[tuple[list[str], ShapeSeries]]:
    """Backends whose loc / swa_loc length series are identical share one line."""
    groups: dict[bytes, tuple[list[str], ShapeSeries]] = {}
    for b in run.backends:
        s = run.shape(b.name, kind)
        if s is None:
            continue
        key = s.step.tobytes() + b"|" + s.loc_len.tobytes() + b"|" + s.swa_loc_len.tobytes()
        if key in groups:
            groups[key][0].append(b.name)
        else:
            groups[key] = ([b.name], s)
    for s in run.shapes:  # backends in shapes.jsonl but not in the summary
        if s.kind == kind and all(s.backend not in names for names, _ in groups.values()):
            groups.setdefault(s.backend.encode() + b"!", ([s.backend], s))
    return list(groups.values())


def shape_timeline(run: RunData, key: str, mark_step: Optional[int] = None, width: float = 10.0) -> Optional[Plot]:
    """loc and swa_loc lengths seen by the first SWA layer per step; below, swa_loc - loc."""
    kind = "swa" if any(s.kind == "swa" for s in run.shapes) else "full"
    groups = shape_groups(run, kind)
    if not groups:
        return None
    n_total = len(run.backends) or len(groups)
    labels = [_group_label(names, n_total) for names, _ in groups] + ["first divergence"]
    left, right = step_axis_margins(run)
    with matplotlib.rc_context(STYLE):
        fig = new_figure(width, 4.2, left=left, right=right)
        ax, dx = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.3], "hspace": 0.12})
        few = max(len(s.step) for _, s in groups) <= 80
        positive = []
        for gi, (names, s) in enumerate(groups):
            color = GROUP_COLORS[gi % len(GROUP_COLORS)]
            loc = np.where(s.loc_len >= 0, s.loc_len, np.nan).astype(np.float64)
            swa = np.where(s.swa_loc_len >= 0, s.swa_loc_len, np.nan).astype(np.float64)
            mk = dict(marker="o", markersize=3) if few else {}
            x1, y1 = envelope(s.step, loc)
            x2, y2 = envelope(s.step, swa)
            ax.plot(x1, y1, color=color, linewidth=1.4, drawstyle="default", **mk)
            ax.plot(x2, y2, color=color, linewidth=1.4, linestyle=(0, (4, 2)), alpha=0.85,
                    **({"marker": "x", "markersize": 4} if few else {}))
            diff = np.where(np.isnan(loc) | np.isnan(swa), np.nan, swa - loc)
            x3, y3 = envelope(s.step, diff)
            dx.plot(x3, y3, color=color, linewidth=1.2, **mk)
            positive.append(np.nanmax(np.concatenate([loc, swa])) if np.isfinite(loc).any() else np.nan)
            positive.append(np.nanmin(np.where(np.concatenate([loc, swa]) > 0, np.concatenate([loc, swa]), np.nan))
                            if np.isfinite(loc).any() else np.nan)
        vals = np.asarray([v for v in positive if np.isfinite(v)])
        if vals.size and vals.min() > 0 and vals.max() / vals.min() > 8:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(_plain_number))  # mathtext 10^k costs 0.15 s
            ax.yaxis.set_minor_formatter(NullFormatter())
        if len(run.steps):
            real = run.steps.real_tokens.astype(np.float64)
            xr, yr = envelope(run.steps.step, np.where(real > 0, real, np.nan))
            ax.plot(xr, yr, color="#555555", linewidth=0.8, linestyle=":", zorder=1)
        _mark_step(ax, mark_step)
        _mark_step(dx, mark_step)
        ax.set_ylabel("entries")
        ax.set_title(f"loc vs swa_loc length at the first {kind.upper()} layer, per step", y=1.02)
        dx.axhline(0, color="#999999", linewidth=0.8)
        dx.yaxis.set_major_locator(MaxNLocator(nbins=3, integer=True))
        lo_d, hi_d = dx.get_ylim()
        if hi_d - lo_d < 2:
            dx.set_ylim(-1, 1)
        dx.set_ylabel("swa_loc \u2212 loc")
        dx.set_xlabel("step")
        ax.legend(handles=_shape_legend(labels[:len(groups)], mark_step is not None), loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        svg = to_svg(fig, key)
    alt = ("Per step and backend group: the lengths of loc and swa_loc at the first "
           f"{kind} layer and their difference; {len(groups)} distinct backend group(s).")
    return Plot(key, "loc vs swa_loc length", alt, svg=svg)


def _shape_legend(group_labels: Sequence[str], marked: bool) -> list[Line2D]:
    """The shape timeline's legend: a colour per backend group, then the line styles (and the marker)."""
    handles = [Line2D([], [], color=GROUP_COLORS[i % len(GROUP_COLORS)], linewidth=3, label=label)
               for i, label in enumerate(group_labels)]
    handles += [Line2D([], [], color="#333333", linewidth=1.4, label="loc"),
                Line2D([], [], color="#333333", linewidth=1.4, linestyle=(0, (4, 2)), label="swa_loc"),
                Line2D([], [], color="#555555", linewidth=0.8, linestyle=":", label="real tokens")]
    if marked:
        handles.append(Line2D([], [], color="#d62728", linestyle=":", label="first divergence"))
    return handles


def _category_rgb(values: Sequence[str], steps: np.ndarray, palette: dict[str, str]) -> tuple[np.ndarray, list[Patch], str]:
    """One strip row as RGB: each column the colour of the highest-ranked category in its bin."""
    cats = list(palette) + sorted({v for v in values if v not in palette})
    code_of = {c: i for i, c in enumerate(cats)}
    codes = np.fromiter((code_of[v] for v in values), dtype=np.int64, count=len(values))
    strip, _, _ = _categorical_strip(codes, steps, MAX_COLUMNS)
    table = np.asarray([to_rgb(palette.get(c, "#bbbbbb")) for c in cats] + [(1.0, 1.0, 1.0)])
    rgb = table[np.where(strip[0] < 0, len(cats), strip[0])]
    present = set(values)
    return rgb, [Patch(color=palette.get(c, "#bbbbbb"), label=label_text(c)) for c in cats if c in present], ""


def occupancy(run: RunData, key: str, mark_step: Optional[int] = None, width: float = 10.0) -> Optional[Plot]:
    """Full and SWA pool occupancy over time, with strips for graph path, mode and findings per step."""
    st = run.steps
    if len(st) == 0:
        return None
    left, right = step_axis_margins(run)
    with matplotlib.rc_context(STYLE):
        fig = new_figure(width, 3.5, left=left, right=right)
        ax, sax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [5, 1.25], "hspace": 0.1})
        full = 100.0 * st.full_used / np.maximum(st.full_size, 1)
        swa = 100.0 * st.swa_used / np.maximum(st.swa_size, 1)
        for y, color, label in ((full, "#1f77b4", "full pool"), (swa, "#2ca02c", "SWA pool")):
            x, yy = envelope(st.step, y)
            ax.plot(x, yy, color=color, linewidth=1.3, label=label)
        ax.set_ylim(0, max(100.0, float(np.nanmax(np.concatenate([full, swa])))) * 1.04)
        ax.set_ylabel("% of slots used")
        fs, ss = int(st.full_size.max()), int(st.swa_size.max())
        ax.set_title(f"Pool occupancy (full pool {fs:,} slots, SWA pool {ss:,} slots)", y=1.02)
        _mark_step(ax, mark_step)
        lo, hi = int(st.step.min()), int(st.step.max())
        graph_rgb, graph_patches, _ = _category_rgb(st.graph, st.step, GRAPH_COLORS)
        mode_rgb, mode_patches, _ = _category_rgb(st.mode, st.step, MODE_COLORS)
        ncol = graph_rgb.shape[0]
        per_step = np.zeros(ncol)
        heat = run.heat
        if not heat.empty:
            keep = (heat.steps >= lo) & (heat.steps <= hi)
            idx, _, _ = _bin_index(heat.steps[keep], lo, hi, MAX_COLUMNS)
            np.add.at(per_step, idx, heat.counts[keep])
        reds = matplotlib.colormaps["Reds"](0.25 + 0.75 * per_step / max(float(per_step.max()), 1.0))[:, :3]
        find_rgb = np.where((per_step > 0)[:, None], reds, 1.0)
        img = np.stack([graph_rgb, mode_rgb, find_rgb])
        sax.imshow(img, aspect="auto", interpolation="nearest", extent=(lo - 0.5, hi + 0.5, 2.5, -0.5))
        sax.set_yticks([0, 1, 2], ["graph", "mode", "findings"])
        sax.tick_params(axis="y", length=0)
        sax.grid(False)
        for y in (0.5, 1.5):
            sax.axhline(y, color="white", linewidth=1.5)
        sax.set_xlabel("step")
        sax.set_xlim(lo - 0.5, hi + 0.5)
        handles, _ = ax.get_legend_handles_labels()
        for p_ in graph_patches:
            p_.set_label(f"graph: {p_.get_label()}")
        for p_ in mode_patches:
            p_.set_label(f"mode: {p_.get_label()}")
        ax.legend(handles=handles + graph_patches + mode_patches, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0)
        svg = to_svg(fig, key)
    return Plot(key, "pool occupancy", "Full and SWA pool occupancy per step; below it, per step, the graph path, "
                "the forward mode and the number of findings (darker red: more).", svg=svg)


def heatmap(run: RunData, key: str, width: float = 10.0) -> Optional[Plot]:
    """Findings per (layer, step), all backends summed: which layers break, and when."""
    heat = run.heat
    if heat.empty:
        return None
    if len(run.steps):
        lo, hi = int(min(run.steps.step.min(), heat.steps.min())), int(max(run.steps.step.max(), heat.steps.max()))
    else:
        lo, hi = int(heat.steps.min()), int(heat.steps.max())
    all_layers, ticks, tick_labels = _heat_layers(run)
    row_of = np.searchsorted(all_layers, heat.layers)
    idx, ncol, bin_w = _bin_index(heat.steps, lo, hi, MAX_COLUMNS)
    grid = np.zeros((all_layers.size, ncol), dtype=np.float64)
    np.add.at(grid, (row_of[heat.layer_idx], idx), heat.counts)
    vmax = float(grid.max())
    left, right = step_axis_margins(run)
    with matplotlib.rc_context(STYLE):
        height = min(7.5, 1.1 + 0.12 * all_layers.size)
        fig = new_figure(width, height, left=left, right=right)
        ax = fig.subplots()
        cmap = matplotlib.colormaps["YlOrRd"].with_extremes(bad="#f4f4f4")
        norm = LogNorm(1, vmax) if vmax > 30 else Normalize(0.5, max(vmax, 1.0))
        im = ax.imshow(np.ma.masked_equal(grid, 0), aspect="auto", interpolation="nearest", cmap=cmap, norm=norm,
                       extent=(lo - 0.5, hi + 0.5, all_layers.size - 0.5, -0.5))
        ax.grid(False)
        ax.set_yticks(ticks)
        ax.set_yticklabels(tick_labels, fontsize=9 if len(ticks) <= 24 else 7)
        ax.set_ylabel("layer (kind)")
        ax.set_xlabel("step" + (f" (binned, {bin_w:.3g} steps per column)" if bin_w > 1 else ""))
        ax.set_title("Findings per layer and step, summed over backends", y=1.02)
        pos = ax.get_position()
        cax = fig.add_axes((pos.x1 + 0.15 / width, pos.y0, 0.15 / width, pos.height))
        cb = fig.colorbar(im, cax=cax)
        cb.set_label("findings")
        if ncol * all_layers.size > 4000:
            uri, w, h = _to_png_uri(fig)
            return Plot(key, "findings heat map", "Heat map of findings per layer and step.", png_uri=uri,
                        width_px=w, height_px=h)
        svg = to_svg(fig, key)
    return Plot(key, "findings heat map", "Heat map of findings per layer and step.", svg=svg)


def class_bars(run: RunData, key: str, width: float = 10.0) -> Optional[Plot]:
    """Findings by class per backend, stacked: which backends fail, and how."""
    if not run.backends or all(b.clean for b in run.backends):
        return None
    classes = [c for c in run.classes if any(b.findings.get(c, 0) for b in run.backends)]
    names = [label_text(b.name) for b in run.backends]
    with matplotlib.rc_context(STYLE):
        fig = new_figure(width, 0.95 + 0.3 * len(run.backends), left=0.3 + _text_width(names),
                      right=_legend_margin(classes))
        ax = fig.subplots()
        y = np.arange(len(run.backends))
        left = np.zeros(len(run.backends))
        for c in classes:
            vals = np.asarray([b.findings.get(c, 0) for b in run.backends], dtype=np.float64)
            ax.barh(y, vals, left=left, color=CLASS_COLORS.get(c, "#bbbbbb"), label=label_text(c), height=0.65)
            left += vals
        for yi, total in zip(y, left):
            ax.text(total, yi, f" {int(total):,}" if total else " clean", va="center", fontsize=8,
                    color="#333333" if total else "#2ca02c")
        ax.set_yticks(y)
        ax.set_yticklabels(names)
        ax.invert_yaxis()
        ax.set_xlim(0, max(float(left.max()), 1.0) * 1.12)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(axis="y", visible=False)
        ax.set_xlabel("findings")
        ax.set_title("Findings by class per backend", y=1.02)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        svg = to_svg(fig, key)
    return Plot(key, "findings by class", "Stacked bars: findings per backend, split by class.", svg=svg)
