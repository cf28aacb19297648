"""Cost of the real engine in the write path: engine runs of B1 and B2 against model runs of the same.

Why: `slotscope run --engine sglang==X` swaps the modelled allocator, translation, KVWriteLoc and pool
for the release's own (engine_path/); the target is at most 3x the model run's time. The release is
imported once, before anything is timed (10-30 s, excluded); then, per scenario, model and engine runs
alternate in this one process (same CPU state for both), best of ``--repeat``, each the whole
in-memory ``run_scenario`` (no trace, no report) on the CPU. Prints per scenario the model and engine
times, their ratio and the findings of each, and ends with one line holding a JSON object of the figures.

Figures: ``run_s`` is the simulation (what the ratio is taken over); ``setup_s`` is what an engine run
adds before its first step (the runtime, the release's pools; the import itself excluded).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SCENARIOS = {"B1": "scenarios/b1-pcg-dp-padding.toml", "B2": "scenarios/b2-decode-stale-tail.toml"}
TARGET = 3.0


def _once(path: str, engine):
    from slotscope.pipeline import RunOptions, run_scenario

    t0 = time.perf_counter()
    out = run_scenario(ROOT / path, None, RunOptions(engine=engine, device="cpu", report=False, trace_level="off",
                                                     quiet_engine=True))
    wall = time.perf_counter() - t0
    run_s = out.timings["run_s"]
    return {"wall_s": wall, "run_s": run_s, "setup_s": wall - run_s, "findings": out.result.total_findings,
            "steps": len(out.result.steps), "crossings": out.result.crossings}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="sglang==0.5.23", help="the release (default sglang==0.5.23)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each kind per scenario, best taken (default 3)")
    args = ap.parse_args(argv)

    from engine_path.api import load
    from engine_path.errors import EngineError
    from slotscope.engine_run import engine_spec

    t0 = time.perf_counter()
    try:
        api = load(engine_spec(args.engine))
    except EngineError as e:
        print(f"engine_overhead: {e}", file=sys.stderr)
        return 2
    import_s = time.perf_counter() - t0
    print(f"engine: sglang {api.info.version} ({api.info.path}); import {import_s:.1f} s (excluded)")
    figures = {"engine": api.info.to_json(), "import_s": round(import_s, 2), "repeat": args.repeat,
               "target_ratio": TARGET, "scenarios": {}}
    for name, path in SCENARIOS.items():
        _once(path, None), _once(path, args.engine)            # warm-up of both (first-call costs)
        model, engine = [], []
        for _ in range(args.repeat):
            model.append(_once(path, None))
            engine.append(_once(path, args.engine))
        m = min(model, key=lambda r: r["run_s"])
        e = min(engine, key=lambda r: r["run_s"])
        ratio = e["run_s"] / max(m["run_s"], 1e-9)
        wall_ratio = e["wall_s"] / max(m["wall_s"], 1e-9)
        print(f"{name} ({path}): {m['steps']} steps, {m['crossings']} crossings")
        print(f"  model  run {m['run_s']:.3f} s  (wall {m['wall_s']:.3f} s)  findings {m['findings']}")
        print(f"  engine run {e['run_s']:.3f} s  (wall {e['wall_s']:.3f} s, setup {e['setup_s']:.3f} s)  "
              f"findings {e['findings']}")
        print(f"  ratio engine/model: {ratio:.2f}x run, {wall_ratio:.2f}x wall "
              f"({'within' if ratio <= TARGET else 'OVER'} the {TARGET:.0f}x target)")
        figures["scenarios"][name] = {
            "path": path, "steps": m["steps"], "crossings": m["crossings"],
            "model_run_s": round(m["run_s"], 4), "engine_run_s": round(e["run_s"], 4),
            "model_wall_s": round(m["wall_s"], 4), "engine_wall_s": round(e["wall_s"], 4),
            "engine_setup_s": round(e["setup_s"], 4), "ratio": round(ratio, 3), "wall_ratio": round(wall_ratio, 3),
            "model_findings": m["findings"], "engine_findings": e["findings"],
            "model_runs_s": [round(r["run_s"], 4) for r in model], "engine_runs_s": [round(r["run_s"], 4) for r in engine]}
    worst = max(s["ratio"] for s in figures["scenarios"].values())
    figures["worst_ratio"] = worst
    figures["within_target"] = worst <= TARGET
    print(json.dumps(figures, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
