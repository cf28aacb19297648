#!/usr/bin/env python3
"""Simulator throughput on the scale scenario, and how run time scales with pool size and load.

Measured side by side in one process (machines here are noisy, so only ratios within one run count):
  base      scenarios/scale.toml as shipped: boundary crossings per second
  pool x4   the same workload with pool.full_size four times larger; its run time over base must be
            <= 1.2 (no per-step work may be proportional to the pool)
  req x2    twice the requests (same arrival rate and lengths); run time over base must be <= 2.4

Run time is the simulation (scheduler, boundaries, writes, checker) on the CPU pool with compact rows,
excluding output files. Ends with one line holding a JSON object of the figures.

    python bench/sim_throughput.py            # full scale scenario (a few minutes)
    python bench/sim_throughput.py --quick    # 200 requests, for a smoke check
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
from slotscope.pipeline import make_pool_factory  # noqa: E402


def timed_run(sc) -> tuple[float, int, int]:
    design = load_design(sc.design)
    t0 = time.perf_counter()
    r = run_simulation(sc, design, make_pool_factory(sc, torch.device("cpu"), "compact", "torch"))
    return time.perf_counter() - t0, r.crossings, len(r.steps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default=str(ROOT / "scenarios/scale.toml"))
    ap.add_argument("--quick", action="store_true", help="200 requests instead of the scenario's count")
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = load_scenario(args.scenario)
    if args.quick:
        base = dataclasses.replace(base, workload=dataclasses.replace(base.workload, requests=200))
    w, p = base.workload, base.pool
    variants = {
        "base": base,
        "pool_x4": dataclasses.replace(base, pool=dataclasses.replace(p, full_size=p.full_size * 4)),
        "req_x2": dataclasses.replace(base, workload=dataclasses.replace(w, requests=w.requests * 2)),
    }
    results = {}
    for name, sc in variants.items():
        secs, crossings, steps = timed_run(sc)
        results[name] = {"seconds": round(secs, 3), "crossings": crossings, "steps": steps,
                         "crossings_per_s": round(crossings / secs, 1)}
        print(f"{name:8s} {secs:8.2f} s  {steps:6d} steps  {crossings:9d} crossings  "
              f"{crossings / secs:10,.0f} crossings/s", flush=True)
    ratio_pool = results["pool_x4"]["seconds"] / results["base"]["seconds"]
    ratio_req = results["req_x2"]["seconds"] / results["base"]["seconds"]
    print(f"\npool x4 run-time ratio {ratio_pool:.2f} (target <= 1.2)   "
          f"requests x2 run-time ratio {ratio_req:.2f} (target <= 2.4)")
    figures = {
        "bench": "sim_throughput", "scenario": base.name, "requests": base.workload.requests,
        "crossings_per_s": results["base"]["crossings_per_s"], "ratio_pool_x4": round(ratio_pool, 3),
        "ratio_requests_x2": round(ratio_req, 3), "runs": results,
        "targets_met": ratio_pool <= 1.2 and ratio_req <= 2.4,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
