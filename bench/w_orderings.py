#!/usr/bin/env python3
"""Which orderings of each W bug reproduce: every shipped W scenario, under its buggy and its fixed design,
with every scheduler write forced to one landing point (or the earliest its barrier allows, when that is
later), with all of them as early as allowed, and with the scenario's own seeded landings.

Per run it prints the finding counts (one line when every backend agrees, else per backend) and whose tokens
the findings are on: ``dropped`` = a request whose free (its finish, seen one batch late: the token past its
end) or retraction races that very forward, so SGLang drops that token's output; ``live`` = any other
request. docs/OVERLAP.md quotes the table this prints. Ends with one line holding a JSON object.

    python bench/w_orderings.py                  # the four W scenarios, in parallel (--jobs, default: CPUs)
    python bench/w_orderings.py --scenarios w2-overlap-result-frees --jobs 1
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: scenario -> (buggy design, fixed design)
W = {
    "w1-overlap-no-barrier": ("sglang-pre-26380", "sglang-post-33587"),
    "w2-overlap-result-frees": ("sglang-pre-31687", "sglang-post-33587"),
    "w5-overlap-torn-write": ("sglang-pre-33587", "sglang-post-33587"),
    "w7-rocm-no-barrier": ("sglang-0.5.23", "sglang-0.5.23-war-barrier"),
}


def _chooser(name: str):
    from simulator.scheduling.timeline import earliest_chooser

    if name == "seed":
        return None
    if name == "earliest":
        return earliest_chooser
    p = int(name)
    return lambda writes, lo, end: [max(p, a) for a in lo]


BARRIER_NAMES = ("none", "loop_top", "read_done_after_metadata", "after_launch", "coarse")


def one(job: tuple) -> dict:
    import torch

    from cuda_path.pool import TaggedKVPool
    from simulator.designs import load_design
    from simulator.core.eager import EagerExecutor
    from simulator.plugins.overlap import OverlapDriver
    from simulator.run import make_run
    from simulator.scenario import load_scenario

    torch.set_num_threads(1)
    import dataclasses

    scen, design, choose, barrier = job
    sc = load_scenario(ROOT / "scenarios" / f"{scen}.toml")
    if barrier is not None:
        sc = dataclasses.replace(sc, engine=dataclasses.replace(sc.engine, war_barrier=barrier))

    def make(full_rows, swa_rows, skip):
        return TaggedKVPool(sc.model, full_rows, swa_rows, device="cpu", skip_index=skip)

    run = make_run(sc, load_design(design), make, executor=EagerExecutor())
    overlap = run.plugin(OverlapDriver)
    c = _chooser(choose)
    if c is not None:
        overlap.choose = c
    steps = []
    for batch, truth in run.stream():
        run.step(batch, truth)
        steps.append(batch.step)
    res = run.result()
    landing = dict(zip(steps, overlap.landings))
    pts = overlap.landings[0].pts if overlap.landings else ()
    counts = {b: {k: n for k, n in s.findings.items() if n} for b, s in res.backends.items()}
    whose = {"live": 0, "dropped": 0, "no request": 0}
    for f in res.findings:
        rid = f.expected.request if f.expected is not None else None
        if rid is None:
            whose["no request"] += 1
            continue
        ld = landing.get(f.step)
        gone = {w.rid for w in ld.writes if w.kind in ("free", "retract")} if ld is not None else set()
        whose["dropped" if rid in gone else "live"] += 1
    first = {b: s.first_finding for b, s in res.backends.items()}
    return {"scenario": scen, "design": design, "barrier": overlap.barrier, "choose": choose,
            "point": _point_name(choose, pts),
            "steps": len(res.steps), "counts": counts, "whose": whose,
            "first": {b: (f.step, f.layer, f.cls) if f is not None else None for b, f in first.items()},
            "retractions": run.scheduler.retractions,
            "writes": sum(len(ld.writes) for ld in overlap.landings)}


def _point_name(choose: str, pts) -> str:
    if choose in ("seed", "earliest"):
        return choose
    return pts[int(choose)] if int(choose) < len(pts) else choose


def jobs_for(scen: str) -> list[tuple]:
    """Both designs at every landing point (their own barrier), then the buggy design's seeded landings
    under every barrier (engine.war_barrier forced)."""
    from simulator.scenario import load_scenario

    n = load_scenario(ROOT / "scenarios" / f"{scen}.toml").model.num_layers
    choosers = ["seed", "earliest"] + [str(p) for p in range(3 + n)]     # metadata_init .. forward_end
    return ([(scen, d, c, None) for d in W[scen] for c in choosers]
            + [(scen, W[scen][0], "seed", b) for b in BARRIER_NAMES])


def show(r: dict) -> str:
    cs = r["counts"]
    vals = list(cs.values())
    if all(v == vals[0] for v in vals):
        text = f"every backend {vals[0] or 'clean'}"
    else:
        text = "; ".join(f"{b} {v}" for b, v in cs.items() if v) + "; others clean"
    w = r["whose"]
    return (f"{r['scenario']:24s} {r['design']:26s} {r['barrier']:24s} {r['point']:18s} {text}   "
            f"[live {w['live']}, dropped {w['dropped']}, no request {w['no request']}]")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default=",".join(W), help="comma-separated W scenario names")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    jobs = [j for s in args.scenarios.split(",") for j in jobs_for(s)]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        results = list(ex.map(one, jobs))
    for r in results:
        print(show(r), flush=True)
    print(json.dumps({"bench": "w_orderings", "runs": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
