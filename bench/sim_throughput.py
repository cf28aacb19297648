#!/usr/bin/env python3
"""Simulator throughput on the scale scenario against a baseline tree, side by side, and how run time scales.

Every run is a child process started in a source tree (this one, or ``--baseline REF`` checked out as a git
worktree), so that each tree runs its own code; runs alternate between the trees (machines here are noisy:
only ratios within one run count). Per tree and variant it prints the simulation's run time as CPU time of
the process (scheduler, boundaries, writes, checker on the CPU pool with compact rows, one torch thread, no
output files; CPU time, not wall time, since the cores here are shared by other work), the
crossings per second, the child's peak memory, and whether the deterministic outputs (summary.json and
findings.jsonl, as that tree's pipeline writes them) are byte-identical to the baseline's. Beside it the
work's floor: the bytes the run's writes and checks must move (every backend's K and V rows of every layer
written, the tag lanes of K and V read back at each written slot) over the copy bandwidth measured in the
same run, and the run's time over that floor.

Variants (point 5 of issue 13; ``--scaling``): pool x4 (<= 1.2x the base), requests x2 (<= 2.4x), backends
8 vs 4 (<= 2.4x) and layers x2 (<= 2.4x), on this tree only.

    python bench/sim_throughput.py --baseline dcd362d              # the scale scenario, both trees
    python bench/sim_throughput.py --baseline dcd362d --scaling    # ... and the scaling variants
    python bench/sim_throughput.py --quick                         # 200 requests, this tree only

Ends with one line holding a JSON object of the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: What a child runs (in its tree, which it imports): argv[1] is a JSON object of the variant.
CHILD = r'''
import dataclasses, hashlib, json, resource, sys, time
sys.path.insert(0, ".")
import torch
torch.set_num_threads(1)
from simulator.designs import load_design
from simulator.run import run_simulation
from simulator.scenario import load_scenario
try:
    from slotscope.outputs import summary_of
    from slotscope.pools import make_pool_factory
except ImportError:       # a baseline tree from before slotscope/pipeline.py was split (they lived there)
    from slotscope.pipeline import make_pool_factory, summary_of
a = json.loads(sys.argv[1])
sc = load_scenario(a["scenario"])
w, p, m = sc.workload, sc.pool, sc.model
if a.get("requests"):
    sc = dataclasses.replace(sc, workload=dataclasses.replace(w, requests=a["requests"]))
if a.get("pool_x", 1) != 1:
    sc = dataclasses.replace(sc, pool=dataclasses.replace(p, full_size=p.full_size * a["pool_x"]))
if a.get("layers_x", 1) != 1:
    sc = dataclasses.replace(sc, model=dataclasses.replace(m, layer_kinds=m.layer_kinds * a["layers_x"]))
if a.get("backends"):
    sc = dataclasses.replace(sc, backends=tuple(sc.backends)[: a["backends"]])
design = load_design(sc.design)
make = make_pool_factory(sc, torch.device("cpu"), "compact", "torch")
t0, c0 = time.perf_counter(), time.process_time()
r = run_simulation(sc, design, make, max_steps=a.get("max_steps"))
secs, wall = time.process_time() - c0, time.perf_counter() - t0
summary = (json.dumps(summary_of(sc, design, r), indent=2) + "\n").encode()
findings = "".join(json.dumps(f.to_json(), separators=(",", ":")) + "\n" for f in r.findings).encode()
if a.get("out"):
    open(a["out"] + ".summary.json", "wb").write(summary)
    open(a["out"] + ".findings.jsonl", "wb").write(findings)
def peak_mb():
    """This process's own peak RSS (VmHWM: ru_maxrss would carry the parent's high-water mark over exec)."""
    for ln in open("/proc/self/status"):
        if ln.startswith("VmHWM:"):
            return int(ln.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
width = 1 if sc.model.kv_dtype == "fp8_e4m3" else 2
rb = {k: 2 * 16 * width for k in ("full", "swa")}      # compact rows: K and V of 16 lanes each
per_token = sum(rb[li.kind] for li in sc.model.layers())
tag_read = 2 * 8 * 2 * sc.model.num_layers          # K and V tag lanes (8 lanes, 2 bytes) per layer
nb = len(sc.backends)
written = sum(s.padded_tokens for s in r.steps) * per_token * nb
read = sum(s.real_tokens for s in r.steps) * tag_read * nb
print("RESULT " + json.dumps({
    "seconds": secs, "wall_s": wall, "steps": len(r.steps), "crossings": r.crossings, "findings": r.total_findings,
    "peak_rss_mb": peak_mb(),
    "bytes_written": written, "bytes_read": read,
    "summary_sha": hashlib.sha256(summary).hexdigest()[:16],
    "findings_sha": hashlib.sha256(findings).hexdigest()[:16]}))
'''


def child(tree: Path, variant: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(variant)], cwd=tree, env=env,
                       capture_output=True, text=True)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        raise SystemExit(f"child in {tree} failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def copy_bandwidth(mb: int = 256) -> float:
    """Bytes moved per second (read + written) by a large tensor copy on one thread, best of five."""
    import torch

    torch.set_num_threads(1)
    src = torch.ones(mb * 2**20 // 8, dtype=torch.int64)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        dst.copy_(src)
        best = min(best, time.process_time() - t0)
    return 2 * src.numel() * 8 / best


def worktree(ref: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="slotscope-baseline-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), ref], check=True,
                   capture_output=True)
    return path


def drop_worktree(path: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], capture_output=True)


def line(label: str, r: dict, bw: float) -> str:
    floor = (r["bytes_written"] + r["bytes_read"]) / bw
    return (f"{label:26s} {r['seconds']:8.2f} s  {r['steps']:6d} steps  {r['crossings'] / r['seconds']:10,.0f} "
            f"crossings/s  peak {r['peak_rss_mb']:6.0f} MB  floor {floor:6.3f} s (x{r['seconds'] / floor:.0f})")


def side_by_side(args, scenario: str, base_tree, out: Path) -> dict:
    v = {"scenario": scenario, "requests": args.requests, "max_steps": args.max_steps}
    runs: dict[str, list[dict]] = {"current": []}
    if base_tree is not None:
        runs["baseline"] = []
    for i in range(args.repeat):
        for name in runs:
            tree = ROOT if name == "current" else base_tree
            runs[name].append(child(tree, dict(v, out=str(out / f"{name}-{i}"))))
    return {name: min(rs, key=lambda r: r["seconds"]) | {"all_seconds": [round(r["seconds"], 3) for r in rs]}
            for name, rs in runs.items()}


def outputs_same(out: Path, a: str, b: str) -> bool:
    return all((out / f"{a}-0.{f}").read_bytes() == (out / f"{b}-0.{f}").read_bytes()
               for f in ("summary.json", "findings.jsonl"))


def scaling(args, scenario: str, bw: float) -> dict:
    v = {"scenario": scenario, "requests": args.requests, "max_steps": args.max_steps}
    variants = {"base": {}, "pool_x4": {"pool_x": 4}, "requests_x2": {"requests": 2 * (args.requests or 1000)},
                "backends_4": {"backends": 4}, "layers_x2": {"layers_x": 2}}
    if args.max_steps:     # a step budget: twice the requests needs twice the steps to be compared
        variants["requests_x2"]["max_steps"] = args.max_steps * 2
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for i in range(args.repeat):          # round robin over the variants, as side_by_side alternates trees
        for name, extra in variants.items():
            runs[name].append(child(ROOT, dict(v, **extra)))
            print(line(f"scaling {name} (run {i + 1})", runs[name][-1], bw), flush=True)
    res = {name: min(rs, key=lambda r: r["seconds"]) | {"all_seconds": [round(r["seconds"], 3) for r in rs]}
           for name, rs in runs.items()}
    t = {k: r["seconds"] for k, r in res.items()}
    ratios = {"pool_x4": t["pool_x4"] / t["base"], "requests_x2": t["requests_x2"] / t["base"],
              "backends_8_over_4": t["base"] / t["backends_4"], "layers_x2": t["layers_x2"] / t["base"]}
    limits = {"pool_x4": 1.2, "requests_x2": 2.4, "backends_8_over_4": 2.4, "layers_x2": 2.4}
    print("scaling ratios: " + "   ".join(f"{k} {r:.2f} (<= {limits[k]})" for k, r in ratios.items()))
    return {"runs": res, "ratios": {k: round(r, 3) for k, r in ratios.items()},
            "targets_met": all(ratios[k] <= limits[k] for k in ratios)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="scenarios/scale.toml", help="path inside each tree")
    ap.add_argument("--baseline", metavar="REF", help="git ref to compare with, side by side (a worktree)")
    ap.add_argument("--quick", action="store_true", help="200 requests instead of the scenario's count")
    ap.add_argument("--max-steps", type=int, default=None, help="stop each run after N steps")
    ap.add_argument("--repeat", type=int, default=1, help="runs per tree and per scaling variant (alternating; the fastest counts)")
    ap.add_argument("--scaling", action="store_true", help="also the scaling variants (this tree)")
    args = ap.parse_args()
    args.requests = 200 if args.quick else None
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e9:.2f} GB/s (read + written, one thread)", flush=True)
    base_tree = worktree(args.baseline) if args.baseline else None
    figures: dict = {"bench": "sim_throughput", "scenario": args.scenario, "copy_bandwidth_gbs": round(bw / 1e9, 3),
                     "requests": args.requests, "max_steps": args.max_steps}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            scen = str((base_tree or ROOT) / args.scenario)    # the scenario as the baseline ships it
            res = side_by_side(args, scen, base_tree, out)
            for name, r in res.items():
                print(line(name, r, bw), flush=True)
            cur = res["current"]
            cur_floor = (cur["bytes_written"] + cur["bytes_read"]) / bw
            figures.update(current=cur, floor_s=round(cur_floor, 4), over_floor=round(cur["seconds"] / cur_floor, 2))
            if base_tree is not None:
                same = outputs_same(out, "current", "baseline")
                ratio = res["baseline"]["seconds"] / cur["seconds"]
                print(f"\nspeed-up over {args.baseline}: {ratio:.2f}x   outputs byte-identical: {same}   "
                      f"time over the work's floor: {cur['seconds'] / cur_floor:.1f}x")
                figures.update(baseline=args.baseline, baseline_run=res["baseline"], speedup=round(ratio, 3),
                               outputs_identical=same)
            if args.scaling:
                figures["scaling"] = scaling(args, scen, bw)
    finally:
        if base_tree is not None:
            drop_worktree(base_tree)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
