#!/usr/bin/env python3
"""What read checking costs: the scale scenario with and without it, side by side in one process.

Both variants run the same scenario (engine.read_check = true / false), alternately (each round in
the other order), ``--repeat`` times each; the figure per variant is its fastest run (machines here are shared and noisy, so only
the ratio within one invocation counts). Run time is the simulation (scheduler, boundaries, writes,
write check and, when on, the read ids and the read check) on the CPU pool with compact rows, excluding
output files. Target: with / without <= 1.5. Both variants must report the same write findings, and a
correct run reads clean (no stale_read). Ends with one line holding a JSON object of the figures.

    python bench/read_check_cost.py                      # the whole of scenarios/scale.toml (1,319 steps)
    python bench/read_check_cost.py --max-steps 200      # its first 200 steps (a quick look)
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.designs import load_design  # noqa: E402
from simulator.run import run_simulation  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from slotscope.pools import make_pool_factory  # noqa: E402


def timed_run(sc, max_steps):
    design = load_design(sc.design)
    t0 = time.perf_counter()
    r = run_simulation(sc, design, make_pool_factory(sc, torch.device("cpu"), "compact", "torch"),
                       max_steps=max_steps)
    secs = time.perf_counter() - t0
    counts: dict[str, int] = {}
    for st in r.backends.values():
        for c, n in st.findings.items():
            counts[c] = counts.get(c, 0) + n
    return secs, len(r.steps), r.crossings, {c: n for c, n in counts.items() if n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default=str(ROOT / "scenarios/scale.toml"))
    ap.add_argument("--max-steps", type=int, default=0, help="forward steps per run (0, the default: the whole "
                    "scenario)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per variant, alternating (the fastest counts)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = load_scenario(args.scenario)
    max_steps = args.max_steps or None
    variants = {
        "read_check_on": dataclasses.replace(base, engine=dataclasses.replace(base.engine, read_check=True)),
        "read_check_off": dataclasses.replace(base, engine=dataclasses.replace(base.engine, read_check=False)),
    }
    results: dict[str, dict] = {}
    for i in range(args.repeat):
        # alternate which variant goes first, so neither always pays the first run's warm-up
        for name, sc in (list(variants.items()) if i % 2 == 0 else list(variants.items())[::-1]):
            secs, steps, crossings, findings = timed_run(sc, max_steps)
            prev = results.get(name)
            if prev is not None and (prev["steps"], prev["findings"]) != (steps, findings):
                raise SystemExit(f"{name}: run {i} differs from run 0 ({steps} steps, {findings})")
            if prev is None or secs < prev["seconds"]:
                results[name] = {"seconds": round(secs, 3), "steps": steps, "crossings": crossings,
                                 "findings": findings}
            print(f"run {i} {name:15s} {secs:8.2f} s  {steps:6d} steps  {crossings:9d} crossings  "
                  f"findings {findings or 'none'}", flush=True)
    on, off = results["read_check_on"], results["read_check_off"]
    ratio = on["seconds"] / off["seconds"]
    writes_agree = {c: n for c, n in on["findings"].items() if c != "stale_read"} == off["findings"]
    print(f"\nread checking on / off run-time ratio {ratio:.2f} (target <= 1.5) over {on['steps']} steps"
          f"{' (--max-steps ' + str(max_steps) + ')' if max_steps else ''}; write findings agree: {writes_agree}")
    figures = {
        "bench": "read_check_cost", "scenario": base.name, "max_steps": max_steps, "steps": on["steps"],
        "ratio_on_off": round(ratio, 3), "runs": results, "writes_agree": writes_agree,
        "stale_reads": on["findings"].get("stale_read", 0), "target_met": ratio <= 1.5 and writes_agree,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
