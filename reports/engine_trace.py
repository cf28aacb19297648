"""The HTML report of an engine's request trace (``slotscope analyze FILE --report OUT.html``).

A new module next to the run report: the same self-contained page machinery (reports/html.py: the
autoescaping Jinja2 environment, the one static script and its CSP hash, atomic writes) and the same
figure helpers (reports/plots.py: fixed-margin figures, min/max envelopes, checked inline SVG). Figures:
batch size and tokens per batch over time (engine), and, with a slotscope run, the engine's batches and
the simulator's steps side by side, each on its own index axis (batch k / step k).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from .html import environment, page_context, write_atomic
from .plots import Plot, UnsafeFigure, envelope

MODE_COLORS = {0: "#74c476", 1: "#9e9ac8", 2: "#c7c7c7"}
MODE_NAMES = {0: "prefill", 1: "decode", 2: "other"}


def _timeline(key: str, title: str, alt: str, x: np.ndarray, series: Sequence[tuple[np.ndarray, str, str]],
              xlabel: str, modes: Optional[np.ndarray] = None, width: float = 10.0) -> Optional[Plot]:
    import matplotlib

    from .plots import STYLE, new_figure, to_svg

    if x.size == 0:
        return None
    with matplotlib.rc_context(STYLE):
        fig = new_figure(width, 3.0, left=0.75, right=1.6)
        ax = fig.subplots(1, 1)
        for y, color, label in series:
            xx, yy = envelope(x, y.astype(np.float64))
            ax.plot(xx, yy, color=color, linewidth=1.1, label=label, drawstyle="steps-post")
        if modes is not None and modes.size == x.size and x.size <= 4000:
            ymax = max(float(max(np.max(y) for y, _, _ in series)), 1.0)
            for code, color in MODE_COLORS.items():
                sel = modes == code
                if sel.any():
                    ax.scatter(x[sel], np.full(int(sel.sum()), -0.04 * ymax), s=6, color=color, marker="s",
                               label=f"mode: {MODE_NAMES[code]}")
        ax.set_xlabel(xlabel)
        ax.set_title(title, y=1.02)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        svg = to_svg(fig, key)
    return Plot(key, title, alt, svg=svg)


def _plots(an: Any) -> tuple[list[Plot], list[Plot], list[str]]:
    et = an.trace
    notes: list[str] = []
    plots: list[Plot] = []
    ts = np.frombuffer(et.batch_ts, dtype=np.int64) if len(et.batch_ts) else np.zeros(0, np.int64)
    if ts.size:
        t = (ts - ts[0]) / 1e9
        size = np.frombuffer(et.batch_size, dtype=np.int64)
        tokens = np.frombuffer(et.batch_tokens, dtype=np.int64)
        modes = np.frombuffer(et.batch_mode, dtype=np.int8)
        for key, title, y, color, alt in (
                ("engine-size", "Batch size over time (engine)", size, "#1f77b4",
                 "Requests per batch at each batch's schedule time, seconds from the first batch."),
                ("engine-tokens", "Tokens per batch over time (engine)", tokens, "#d62728",
                 "New tokens per batch: uncached prompt tokens of prefill batches, one per request of decode "
                 "batches.")):
            try:
                p = _timeline(key, title, alt, t, [(y, color, title.split(" over")[0].lower())],
                              "seconds since the first batch", modes)
            except UnsafeFigure as e:
                notes.append(f"The {title} figure was left out: {e}.")
                continue
            if p is not None:
                plots.append(p)
    run_plots: list[Plot] = []
    if an.run is not None:
        st = an.run["steps"]
        sim_size = np.asarray(st["size"], dtype=np.int64)
        sim_tokens = np.asarray(st["tokens"], dtype=np.int64)
        eng_size = np.frombuffer(et.batch_size, dtype=np.int64) if len(et.batch_size) else np.zeros(0, np.int64)
        eng_tokens = np.frombuffer(et.batch_tokens, dtype=np.int64) if len(et.batch_tokens) else np.zeros(0, np.int64)
        for key, title, eng, sim, alt in (
                ("beside-size", "Batch size: engine batch k beside simulator step k", eng_size, sim_size,
                 "Requests per engine batch and per simulator step, by index."),
                ("beside-tokens", "Tokens: engine batch k beside simulator step k", eng_tokens, sim_tokens,
                 "New tokens per engine batch and real tokens per simulator step, by index.")):
            n = max(eng.size, sim.size)
            if n == 0:
                continue
            x = np.arange(n, dtype=np.float64)
            pad = lambda a: np.concatenate([a, np.full(n - a.size, np.nan)]) if a.size < n else a.astype(np.float64)
            try:
                p = _timeline(key, title, alt, x, [(pad(eng), "#1f77b4", "engine"), (pad(sim), "#ff7f0e", "simulator")],
                              "batch / step index")
            except UnsafeFigure as e:
                notes.append(f"The {title} figure was left out: {e}.")
                continue
            if p is not None:
                run_plots.append(p)
    return plots, run_plots, notes


def render_engine_report(an: Any, sources: Sequence[str] = ()) -> str:
    plots, run_plots, notes = _plots(an)
    st = an.trace.stats
    run_rows = []
    if an.run is not None:
        from tracing.engine_analysis import CMP_KEYS

        run_rows = [("engine", [an.run["engine"][k] for k in CMP_KEYS]),
                    ("simulator", [an.run["sim"][k] for k in CMP_KEYS])]
    title = ", ".join(Path(s).name for s in sources)[:200] or "trace"
    return environment().get_template("engine_trace.html.j2").render(
        title=title, sources=list(sources), requests=an.requests, batches=an.batches,
        spans=sorted(st.events.items()), bad_lines=st.bad_lines, stages=an.stages,
        exact=all(s["exact"] for s in an.stages),
        unknown=sorted(st.unknown.items(), key=lambda kv: -kv[1])[:20],
        plots=plots + [], run=an.run, run_rows=run_rows, run_plots=run_plots, notes=notes, **page_context())


def write_engine_report(an: Any, out_path: str | Path, sources: Sequence[str] = ()) -> Path:
    """Write the engine-trace report to ``out_path`` (atomically); returns the path."""
    return write_atomic(Path(out_path), render_engine_report(an, sources))
