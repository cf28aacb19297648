"""Analysis of an engine's own request traces (SGLang's ``--enable-trace`` spans), for ``slotscope analyze``.

Per stage (tokenize, request_process, prefill_waiting, prefill_forward, decode_loop, ...): count, p50,
p90, p99 and max of the span durations (exact up to 4096 spans per stage, then within about 1%); the
batches from the stage spans' ``schedule`` events (one per batch id: time, batch size, forward mode;
token counts: a decode batch one per request, a prefill batch its requests' uncached prompt tokens);
and, given a slotscope run of the replayed scenario, the engine's batches beside the simulator's steps.
All of it comes from tracing/sglang_records.py's streaming reader; the HTML is reports/engine_trace.py.
"""
from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Union

from .quantiles import Quantiles
from .sglang_records import EngineTrace, read_engine_trace
from .tables import format_table

#: stages in the order a request passes them (others follow by name)
STAGE_ORDER = ("tokenize", "api_server_dispatch", "dpc_dispatch", "request_process", "prefill_waiting",
               "prefill_forward", "chunked_prefill", "decode_waiting", "decode_forward", "decode_loop")


@dataclass
class EngineTraceAnalysis:
    trace: EngineTrace
    stages: list[dict[str, Any]]
    batches: dict[str, Any]
    requests: dict[str, Any]
    run: Optional[dict[str, Any]] = None          # the slotscope run beside it (--run DIR)

    @property
    def has_engine_spans(self) -> bool:
        ev = self.trace.stats.events
        return bool(ev.get("request span") or ev.get("stage span"))

    def to_json(self) -> dict[str, Any]:
        return {"stages": self.stages, "batches": self.batches, "requests": self.requests,
                "stats": self.trace.stats.to_json(), "other_events": self.trace.other_events,
                "batches_dropped": self.trace.batches_dropped, "run": self.run}

    def render_text(self) -> str:
        out = ["", "Engine request trace (SGLang spans)"]
        st = self.trace.stats
        out.append(f"  {self.requests['count']} requests, {self.batches['count']} batches "
                   f"({self.batches['prefill']} prefill, {self.batches['decode']} decode); spans read: "
                   + ", ".join(f"{n} {k}" for k, n in st.events.items()))
        if st.unknown:
            out.append("  skipped unknown spans: " + ", ".join(
                f"{k} x{n}" for k, n in sorted(st.unknown.items(), key=lambda kv: -kv[1])[:10]))
        if self.stages:
            out.append("")
            out.append("  latency per stage (ms)")
            out.append(format_table(("stage", "count", "p50", "p90", "p99", "max"),
                                    [(s["stage"], s["count"], s["p50_ms"], s["p90_ms"], s["p99_ms"], s["max_ms"])
                                     for s in self.stages], indent="    "))
        b = self.batches
        if b["count"]:
            out.append("")
            out.append(f"  batch size: median {b['size_p50']}, max {b['size_max']}; tokens per batch: median "
                       f"{b['tokens_p50']}, max {b['tokens_max']}; median time between batches "
                       f"{b['gap_p50_ms']:.3g} ms")
        if self.run is not None:
            r = self.run
            out.append("")
            out.append(f"  beside the slotscope run {r['dir']} ({r['scenario']}): engine {r['engine_batches']} "
                       f"batches, simulator {r['sim_steps']} steps")
            out.append(format_table(("", "batches/steps", "prefill/extend+mixed", "decode", "median batch size",
                                     "max batch size", "median tokens", "max tokens"),
                                    [("engine",) + tuple(r["engine"][k] for k in CMP_KEYS),
                                     ("simulator",) + tuple(r["sim"][k] for k in CMP_KEYS)], indent="    "))
        return "\n".join(out) + "\n"


#: the batch figures set side by side with --run (engine vs simulator; reports/engine_trace.py's table too)
CMP_KEYS = ("count", "prefill", "decode", "size_p50", "size_max", "tokens_p50", "tokens_max")


def stage_json(name: str, q: Quantiles) -> dict[str, Any]:
    """One row of the stage table, in milliseconds."""
    return {"stage": name, "count": q.count, "p50_ms": q.quantile(0.5) / 1e6,
            "p90_ms": q.quantile(0.9) / 1e6, "p99_ms": q.quantile(0.99) / 1e6,
            "max_ms": q.max / 1e6, "mean_ms": q.mean / 1e6, "exact": q.exact is not None}


def _median(xs) -> float:
    xs = list(xs)
    return float(statistics.median(xs)) if xs else 0.0


def _batch_summary(sizes, tokens, modes, gaps_ns) -> dict[str, Any]:
    sizes, tokens, modes = list(sizes), list(tokens), list(modes)
    return {"count": len(sizes), "prefill": sum(1 for m in modes if m == 0), "decode": sum(1 for m in modes if m == 1),
            "size_p50": _median(sizes), "size_max": max(sizes, default=0),
            "tokens_p50": _median(tokens), "tokens_max": max(tokens, default=0),
            "gap_p50_ms": _median(gaps_ns) / 1e6}


def sim_steps(run_dir: Union[str, os.PathLike[str]]) -> dict[str, Any]:
    """A slotscope run's steps as batch columns (step, requests, real tokens, mode code), streamed."""
    d = Path(run_dir)
    steps_file = d / "steps.jsonl"
    if not steps_file.is_file():
        raise FileNotFoundError(f"{d}: no steps.jsonl (give the --out directory of `slotscope run`)")
    step, size, tokens, mode = [], [], [], []
    with open(steps_file, "rb") as f:
        for raw in f:
            try:
                s = json.loads(raw)
            except ValueError:
                continue                   # a torn last line of a killed run
            step.append(int(s.get("step", len(step))))
            size.append(int(s.get("num_requests", 0)))
            tokens.append(int(s.get("real_tokens", 0)))
            m = s.get("mode", "")
            mode.append(1 if m == "decode" else 0 if m in ("extend", "mixed") else 2)
    name = "?"
    try:
        name = json.loads((d / "summary.json").read_text()).get("scenario", "?")
    except (OSError, ValueError, AttributeError):
        pass
    return {"dir": str(d), "scenario": name, "step": step, "size": size, "tokens": tokens, "mode": mode}


def analyze_engine_trace(paths: Iterable[Union[str, os.PathLike[str]]], *, skip_bad: bool = False,
                         max_line_bytes: Optional[int] = None,
                         run_dir: Optional[Union[str, os.PathLike[str]]] = None) -> EngineTraceAnalysis:
    et = read_engine_trace(paths, skip_bad=skip_bad, max_line_bytes=max_line_bytes)
    names = sorted(et.stages, key=lambda n: (STAGE_ORDER.index(n) if n in STAGE_ORDER else len(STAGE_ORDER), n))
    stages = [stage_json(n, et.stages[n]) for n in names]
    ts = et.batch_ts
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    batches = _batch_summary(et.batch_size, et.batch_tokens, et.batch_mode, gaps)
    reqs = et.requests
    requests = {"count": len(reqs),
                "prompt_tokens": sum(r.prompt_tokens or 0 for r in reqs),
                "completion_tokens": sum(r.completion_tokens or 0 for r in reqs),
                "cached_tokens": sum(r.cached_tokens or 0 for r in reqs),
                "lacking": sum(1 for r in reqs if r.lacking())}
    run = None
    if run_dir is not None:
        sim = sim_steps(run_dir)
        run = {"dir": sim["dir"], "scenario": sim["scenario"], "engine_batches": batches["count"],
               "sim_steps": len(sim["step"]), "engine": {k: batches[k] for k in CMP_KEYS},
               "sim": {k: v for k, v in _batch_summary(sim["size"], sim["tokens"], sim["mode"], ()).items()
                       if k in CMP_KEYS},
               "steps": sim}
    return EngineTraceAnalysis(et, stages, batches, requests, run)


def engine_part(args: Any, result: Any) -> Optional[EngineTraceAnalysis]:
    """The engine part of ``slotscope analyze``: None unless the files hold SGLang request spans (or
    --report / --run asks for it). The HTML itself is reports/engine_trace.py's (slotscope's CLI passes its
    writer to tracing/commands.py: tracing imports nothing of reports/)."""
    report = getattr(args, "report", None)
    run_dir = getattr(args, "run", None)
    foreign = result.foreign.get("spans", 0) if hasattr(result, "foreign") else 0
    if not (foreign or report or run_dir):
        return None
    if run_dir is not None and not (Path(run_dir) / "steps.jsonl").is_file():
        raise FileNotFoundError(f"--run {run_dir}: no steps.jsonl here (give the --out directory of `slotscope run`)")
    an = analyze_engine_trace(args.files, skip_bad=args.skip_bad, max_line_bytes=args.max_line_mb * 2**20,
                              run_dir=run_dir)
    if not an.has_engine_spans and not (report or run_dir):
        return None
    return an
