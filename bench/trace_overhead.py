"""Cost of tracing a real run, at each level, over the same run untraced.

Why: tracing must be cheap enough to leave on. The hot path only appends to buffers; spans are
made after the run, so their cost grows with the level (``step`` < ``anomaly`` < ``boundary``).
This runs ``scenarios/scale.toml`` (about 300 boundary crossings per step, thousands of steps)
untraced and at each level, best of ``--repeat``, and prints run time ratios measured in the
same process, plus the recorder's own per-call cost.

Needs the simulator pipeline (``slotscope.pipeline.run_scenario``); without it, says so and
exits 1. Ends with one line holding a JSON object of the figures.

Figures per level: the whole ``run_scenario`` wall time, its simulation part (``run_s``, which
includes the recorder's hot path) and the span emission and export after the run (``trace_s``).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LEVELS = ("off", "step", "anomaly", "boundary")


def _load_pipeline() -> tuple[Callable[..., Any], Any]:
    try:  # lazy: the benchmark must say clearly when the simulator is not there
        from slotscope.pipeline import RunOptions, run_scenario
    except ImportError as exc:
        print(f"trace_overhead: cannot import slotscope.pipeline.run_scenario ({exc}); "
              "this benchmark needs the simulator run loop (simulator/run.py and "
              "slotscope/pipeline.py).", file=sys.stderr)
        raise SystemExit(1)
    return run_scenario, RunOptions


def _run_once(run_scenario: Callable[..., Any], options_cls: Any, scenario: Path, out_dir: Path,
              level: str, max_steps: Optional[int]) -> dict[str, Any]:
    opts = options_cls(trace_level=level, report=False, max_steps=max_steps)
    t = time.perf_counter()
    out = run_scenario(scenario, out_dir=out_dir, options=opts)
    wall = time.perf_counter() - t
    timings = dict(getattr(out, "timings", {}) or {})
    return {"wall_s": wall, "run_s": timings.get("run_s", wall),
            "trace_s": timings.get("trace_s", 0.0), "trace": timings.get("trace")}


def recorder_cost_ns(calls: int = 200_000) -> float:
    """Per-call cost of BoundaryRecorder.on_boundary, best of 5 (the hot-path figure)."""
    from tracing.recorder import BoundaryRecorder
    best = float("inf")
    for _ in range(5):
        rec = BoundaryRecorder()
        f = rec.on_boundary
        t = time.perf_counter_ns()
        for i in range(calls):
            f(i >> 8, "flashinfer", i & 63, 1000, 1000, "torch.int64", "torch.int64", i, i + 5, None)
        best = min(best, (time.perf_counter_ns() - t) / calls)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "scale.toml"))
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs first (imports, caches)")
    ap.add_argument("--max-steps", type=int, default=None, help="cut the run short (quick looks)")
    ap.add_argument("--levels", default=",".join(LEVELS))
    args = ap.parse_args(argv)
    run_scenario, options_cls = _load_pipeline()
    scenario = Path(args.scenario)
    if not scenario.is_file():
        print(f"trace_overhead: scenario file {scenario} not found", file=sys.stderr)
        return 1
    levels = [l.strip() for l in args.levels.split(",") if l.strip()]
    if "off" not in levels:
        levels.insert(0, "off")

    best: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in range(args.warmup):
            _run_once(run_scenario, options_cls, scenario, Path(tmp) / f"warmup-{w}", "off",
                      args.max_steps)
        for rep in range(args.repeat):
            for level in levels:          # interleaved, so drift hits every level alike
                r = _run_once(run_scenario, options_cls, scenario, Path(tmp) / f"{level}-{rep}",
                              level, args.max_steps)
                if level not in best or r["wall_s"] < best[level]["wall_s"]:
                    best[level] = r
    base = best["off"]
    print(f"scenario {scenario.name}, best of {args.repeat}"
          + (f", first {args.max_steps} steps" if args.max_steps else ""))
    print(f"  {'level':<9} {'wall s':>8} {'vs off':>7} {'run s':>8} {'vs off':>7} {'emit s':>7} "
          f"{'spans':>9} {'boundaries':>10}")
    for level in levels:
        r = best[level]
        tr = r["trace"] or {}
        print(f"  {level:<9} {r['wall_s']:8.2f} {r['wall_s'] / base['wall_s']:7.2f} "
              f"{r['run_s']:8.2f} {r['run_s'] / base['run_s']:7.2f} {r['trace_s']:7.2f} "
              f"{tr.get('spans', '-')!s:>9} {tr.get('boundaries_recorded', '-')!s:>10}")
    per_call = recorder_cost_ns()
    print(f"recorder on_boundary: {per_call:.0f} ns per call")
    figures: dict[str, Any] = {"bench": "trace_overhead", "scenario": scenario.name,
                               "max_steps": args.max_steps, "untraced_s": round(base["wall_s"], 3),
                               "recorder_ns_per_call": round(per_call)}
    for level in levels:
        if level == "off":
            continue
        r = best[level]
        figures[f"{level}_s"] = round(r["wall_s"], 3)
        figures[f"{level}_ratio"] = round(r["wall_s"] / base["wall_s"], 3)
        figures[f"{level}_run_ratio"] = round(r["run_s"] / base["run_s"], 3)
        figures[f"{level}_emit_s"] = round(r["trace_s"], 3)
        if r["trace"]:
            figures[f"{level}_spans"] = r["trace"].get("spans")
            figures["boundaries"] = r["trace"].get("boundaries_recorded")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
