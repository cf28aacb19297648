"""Cost of the real engine in the write path: engine runs of B1, B2 and the scale scenario against model runs.

Why: `slotscope run --engine sglang==X` swaps the modelled allocator, translation, KVWriteLoc and pool
for the release's own (engine_path/); the target (issue 26 point 7) is at most 10x the model run's time on a
CPU and 3x on CUDA (``--device``), and the release's import at most 10 s warm: ``import_warm_s`` is a second
import in a fresh process, after the first has left its byte code (the first, ``import_s``, is excluded from
the ratios; ``bytecode_cached`` is false where none is written, PYTHONDONTWRITEBYTECODE, as on the lent GPU
machines: scripts/gpu-check gives byte code a cache of its own there). Then, per scenario (``--scenarios``,
default B1, B2 and scale; B4 on request), model and engine
runs alternate in this one process (same CPU state for both), best of ``--repeat``, each the whole
in-memory ``run_scenario`` (no trace, no report) on the device. Two model runs per scenario: the scenario's
own design (what ``slotscope run SCENARIO`` runs; B1's and B2's are buggy, so they also find and record
their bugs) and the model of the engine's release (``sglang-<version>``: the same allocator behaviour and
the same findings as the engine run, i.e. the same work). Prints per scenario the times, both ratios and
the findings of each; ``worst_ratio`` is the larger of the two ratios; ends with one line holding a JSON
object of the figures.

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

SCENARIOS = {"B1": "scenarios/b1-pcg-dp-padding.toml", "B2": "scenarios/b2-decode-stale-tail.toml",
             "scale": "scenarios/scale.toml", "B4": "scenarios/b4-draft-extend-window.toml"}
#: the issue's three (B4, EAGLE rounds through the release's draft metadata and draft-extend graphs, on request)
DEFAULT = ("B1", "B2", "scale")
#: engine / model run time at most, by device; the release's warm import at most IMPORT_TARGET_S
TARGETS = {"cpu": 10.0, "cuda": 3.0}
IMPORT_TARGET_S = 10.0
TARGET = TARGETS["cpu"]
DEVICE = {"name": "cpu", "scheduler": "auto"}


def _once(path: str, engine, design=None):
    from slotscope.pipeline import RunOptions, run_scenario

    t0 = time.perf_counter()
    out = run_scenario(ROOT / path, None, RunOptions(engine=engine, design=design, device=DEVICE["name"],
                                                     report=False, trace_level="off", quiet_engine=True,
                                                     scheduler=DEVICE["scheduler"] if engine else "model"))
    wall = time.perf_counter() - t0
    run_s = out.timings["run_s"]
    return {"wall_s": wall, "run_s": run_s, "setup_s": wall - run_s, "findings": out.result.total_findings,
            "steps": len(out.result.steps), "crossings": out.result.crossings}


def main(argv=None) -> int:
    from engine_path.releases import EngineSpec
    from slotscope.options import add_engine_option

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_option(ap, default=EngineSpec("sglang", "0.5.23"), help="the release (default sglang==0.5.23)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each kind per scenario, best taken (default 3)")
    ap.add_argument("--scenarios", default=",".join(DEFAULT),
                    help=f"which, comma-separated, of {', '.join(SCENARIOS)} (default {','.join(DEFAULT)})")
    ap.add_argument("--device", choices=sorted(TARGETS), default="cpu", help="where the runs go (default cpu)")
    ap.add_argument("--scheduler", choices=("auto", "model", "release"), default="auto",
                    help="who makes the engine runs' batches (run --scheduler; default auto, as run does: the "
                         "release's own Scheduler where it runs, B2 and scale; B1 the model's)")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        print(f"engine_overhead: --scenarios: unknown {', '.join(unknown) or '(none given)'}; "
              f"choose from {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    global TARGET
    TARGET = TARGETS[args.device]
    DEVICE["name"] = args.device
    DEVICE["scheduler"] = args.scheduler

    from engine_path.api import load
    from engine_path.errors import EngineError

    t0 = time.perf_counter()
    try:
        api = load(args.engine, device=args.device)     # cuda: Triton native, not interpreted
    except EngineError as e:
        print(f"engine_overhead: {e}", file=sys.stderr)
        return 2
    import_s = time.perf_counter() - t0
    warm_s = _warm_import_s(str(args.engine), args.device)
    print(f"engine: sglang {api.info.version} ({api.info.path}); import {import_s:.1f} s (excluded), warm import "
          f"in a fresh process {warm_s:.1f} s (target <= {IMPORT_TARGET_S:.0f} s)")
    if sys.dont_write_bytecode:
        print("  (byte code is not written here, PYTHONDONTWRITEBYTECODE: each process compiles again every module "
              "without cached byte code; unset it, with PYTHONPYCACHEPREFIX=DIR, for what a machine that keeps byte "
              "code pays)")
    figures = {"engine": api.info.to_json(), "device": args.device, "import_s": round(import_s, 2),
               "import_warm_s": round(warm_s, 2), "bytecode_cached": not sys.dont_write_bytecode,
               "import_target_s": IMPORT_TARGET_S, "repeat": args.repeat,
               "scheduler": args.scheduler,
               "target_ratio": TARGET, "scenarios": {}}
    release_model = _release_model(api.info.version)
    figures["release_model"] = release_model
    for name in names:
        figures["scenarios"][name] = _scenario(name, SCENARIOS[name], args, release_model)
    worst = max(max(s["ratio"], s.get("ratio_vs_release_model", 0.0)) for s in figures["scenarios"].values())
    figures["worst_ratio"] = worst
    figures["within_target"] = worst <= TARGET and warm_s <= IMPORT_TARGET_S
    print(json.dumps(figures, separators=(",", ":")))
    return 0


def _warm_import_s(spec: str, device: str) -> float:
    """Seconds a fresh process takes to load the release (engine_path.api.load), its byte code already
    written by this process's import: what a user's second run pays."""
    import subprocess

    code = ("import time; t0 = time.perf_counter(); from engine_path.api import load; "
            "from engine_path.releases import parse_spec; load(parse_spec(%r), device=%r); "
            "print(time.perf_counter() - t0)" % (spec, device))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        print(f"engine_overhead: the warm import failed: {out.stderr.strip()[-500:]}", file=sys.stderr)
        return float("nan")
    return float(out.stdout.strip().splitlines()[-1])


def _release_model(version: str):
    """The model design of the release itself (``sglang-<version>``) where slotscope has one, else None."""
    from simulator.designs import load_design

    try:
        load_design(f"sglang-{version}")
    except Exception:  # no model of that release: only the scenario's own design is compared
        return None
    return f"sglang-{version}"


def _best(runs):
    return min(runs, key=lambda r: r["run_s"])


def _scenario(name: str, path: str, args, release_model) -> dict:
    """Model and engine runs of one scenario, alternating, best of ``args.repeat``: the model with the
    scenario's own design (what ``slotscope run SCENARIO`` runs) and, where it exists, the model of the
    engine's release (the same work as the engine run: same allocator behaviour, same findings)."""
    kinds = {"model": (None, None), "engine": (args.engine, None)}
    if release_model:
        kinds["release_model"] = (None, release_model)
    for engine, design in kinds.values():
        _once(path, engine, design)                        # warm-up of each (first-call costs)
    runs = {k: [] for k in kinds}
    for _ in range(args.repeat):
        for k, (engine, design) in kinds.items():
            runs[k].append(_once(path, engine, design))
    m, e = _best(runs["model"]), _best(runs["engine"])
    ratio = e["run_s"] / max(m["run_s"], 1e-9)
    wall_ratio = e["wall_s"] / max(m["wall_s"], 1e-9)
    print(f"{name} ({path}): {m['steps']} steps, {m['crossings']} crossings")
    print(f"  model  run {m['run_s']:.3f} s  (wall {m['wall_s']:.3f} s)  findings {m['findings']}  "
          f"(the scenario's design)")
    out = {"path": path, "steps": m["steps"], "crossings": m["crossings"],
           "model_run_s": round(m["run_s"], 4), "engine_run_s": round(e["run_s"], 4),
           "model_wall_s": round(m["wall_s"], 4), "engine_wall_s": round(e["wall_s"], 4),
           "engine_setup_s": round(e["setup_s"], 4), "ratio": round(ratio, 3), "wall_ratio": round(wall_ratio, 3),
           "model_findings": m["findings"], "engine_findings": e["findings"],
           "model_runs_s": [round(r["run_s"], 4) for r in runs["model"]],
           "engine_runs_s": [round(r["run_s"], 4) for r in runs["engine"]]}
    if release_model:
        r = _best(runs["release_model"])
        rr = e["run_s"] / max(r["run_s"], 1e-9)
        print(f"  model  run {r['run_s']:.3f} s  (wall {r['wall_s']:.3f} s)  findings {r['findings']}  "
              f"({release_model}, the model of the release)")
        out.update({"release_model_run_s": round(r["run_s"], 4), "release_model_findings": r["findings"],
                    "release_model_runs_s": [round(x["run_s"], 4) for x in runs["release_model"]],
                    "ratio_vs_release_model": round(rr, 3)})
    print(f"  engine run {e['run_s']:.3f} s  (wall {e['wall_s']:.3f} s, setup {e['setup_s']:.3f} s)  "
          f"findings {e['findings']}")
    print(f"  ratio engine/model: {ratio:.2f}x run, {wall_ratio:.2f}x wall "
          f"({'within' if ratio <= TARGET else 'OVER'} the {TARGET:.0f}x target)")
    if release_model:
        print(f"  ratio engine/{release_model}: {rr:.2f}x run "
              f"({'within' if rr <= TARGET else 'OVER'} the {TARGET:.0f}x target)")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
