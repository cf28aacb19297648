#!/usr/bin/env python3
"""Sweep throughput: points per second of one grid on a local Ray with one core, then with two, in one run.

The grid (written to a temporary directory): scenarios/gap-swa-shorter.toml and scenarios/smoke.toml x
sglang-post-29460 and kvwriteloc-strict x ``--seeds`` seeds, every backend (each point a full run with its
report). Each pass starts a fresh ``ray.init(num_cpus=N)`` and an empty cache, so both run every point; the
time counted is from the first task submitted to the last point written (Ray's own start is printed apart,
the workers' imports are inside). ``--local`` adds the one-process baseline (no Ray). The machines here are
shared and noisy: compare the two figures of one run, not runs with each other.

    python bench/sweep_throughput.py              # 8 points, 1 core vs 2
    python bench/sweep_throughput.py --seeds 4    # 16 points
    python bench/sweep_throughput.py --local      # ... and the one-process baseline

Ends with one line holding a JSON object of the figures.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def grid_text(seeds: int) -> str:
    return (f'name = "bench"\nscenarios = ["{ROOT / "scenarios" / "gap-swa-shorter.toml"}", '
            f'"{ROOT / "scenarios" / "smoke.toml"}"]\n'
            f'designs = ["sglang-post-29460", "kvwriteloc-strict"]\nseeds = {list(range(1, seeds + 1))}\n')


def one_pass(grid, out: Path, cores: int | None) -> dict:
    """One sweep of the grid into an empty directory: on Ray with ``cores`` CPUs, or in-process (None)."""
    from slotscope.sweep import sweep

    ray_start = 0.0
    if cores is not None:
        from slotscope.sweep import init_ray

        t = time.perf_counter()
        init_ray(num_cpus=cores)
        ray_start = time.perf_counter() - t
    t = time.perf_counter()
    records, invalid, _ = sweep(grid, out, local=cores is None)
    wall = time.perf_counter() - t
    if cores is not None:
        import ray

        ray.shutdown()
    statuses = sorted(r["status"] for r in records.values())
    spans = sorted((r["started"], r["started"] + r["wall_s"]) for r in records.values() if "started" in r)
    overlap = max((sum(1 for a, b in spans if a <= t < b) for t, _ in spans), default=0)
    return {"cores": cores or "local", "points": len(records), "wall_s": round(wall, 2),
            "points_per_s": round(len(records) / wall, 4), "ray_start_s": round(ray_start, 2),
            "statuses": {s: statuses.count(s) for s in set(statuses)}, "invalid": len(invalid),
            "max_concurrent": overlap, "workers": len({r.get("pid") for r in records.values()})}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=2, help="seeds per (scenario, design): points = 4 x seeds")
    ap.add_argument("--local", action="store_true", help="also the one-process baseline (no Ray)")
    args = ap.parse_args()
    from slotscope.sweep import load_grid

    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        g = Path(tmp) / "grid.toml"
        g.write_text(grid_text(args.seeds))
        grid = load_grid(g)
        passes = [one_pass(grid, Path(tmp) / f"out-{n}", n) for n in (1, 2)]
        if args.local:
            passes.append(one_pass(grid, Path(tmp) / "out-local", None))
    for p in passes:
        print(f"{str(p['cores']):>5} core(s): {p['points']} points in {p['wall_s']:.1f}s = {p['points_per_s']:.3f} "
              f"points/s (Ray start {p['ray_start_s']:.1f}s), {p['workers']} worker(s), at most {p['max_concurrent']} "
              f"points at once {p['statuses']}", file=sys.stderr)
    one, two = passes[0], passes[1]
    out = {"bench": "sweep_throughput", "points": one["points"], "one_core_points_per_s": one["points_per_s"],
           "two_core_points_per_s": two["points_per_s"],
           "speedup": round(two["points_per_s"] / one["points_per_s"], 3), "passes": passes}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
