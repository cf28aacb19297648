"""``slotscope conform SCENARIO --engine sglang==VERSION --scheduler``: does the model schedule as the release does?

The model's scheduler (the design ``sglang-<version>`` unless ``--design``) runs in this process; the release's own
``Scheduler`` (engine_path/scheduler.py: its policy, batches, allocation, tree cache and normal event loop, no model)
in a process of the release's own. Every forward of each side is a decision (mode, requests, new tokens, lengths,
write slots, free slots left); the first forward where they differ is printed with both sides' values.
"""
from __future__ import annotations

import json
import sys
import time

EXIT_CONFORMS, EXIT_DIVERGES = 0, 1


def run_schedule_conform(scenario: str, engine, *, design: str, max_steps=None, timeout: float = 1800) -> dict:
    from engine_path import isolate
    from engine_path.schedule_conformance import compare_schedules, model_schedule

    opts = {"design": design, "max_steps": max_steps}
    t0 = time.perf_counter()
    model = model_schedule(scenario, opts)
    t1 = time.perf_counter()
    eng = isolate.call(str(engine), "engine_path.scheduler:trace_schedule", scenario, opts, timeout=timeout)
    t2 = time.perf_counter()
    res = compare_schedules(model["steps"], eng["steps"])
    res.update(scenario=model["info"]["scenario"], path=scenario, design=design, release=eng["info"]["release"],
               model_scheduler=model["info"]["scheduler"], engine_scheduler=eng["info"]["scheduler"],
               tree_cache=eng["info"]["tree_cache"], stand_ins=eng["info"]["stand_ins"], max_steps=max_steps,
               model_s=round(t1 - t0, 2), engine_s=round(t2 - t1, 2))
    return res


def print_schedule_conform(res: dict, out=sys.stdout) -> None:
    n = res["forwards"]
    print(f"scheduler conformance: {res['scenario']} ({res['path']})", file=out)
    print(f"  model:  {res['model_scheduler']} under {res['design']}, {n['model']} forwards ({res['model_s']} s)",
          file=out)
    print(f"  engine: {res['engine_scheduler']}, tree cache {res['tree_cache']}, {n['engine']} forwards "
          f"({res['engine_s']} s)", file=out)
    for piece, why in res["stand_ins"].items():
        print(f"    stand-in {piece}: {why}", file=out)
    first = res["first_difference"]
    if first is None:
        print(f"  every forward conforms: mode, requests, new tokens, lengths, write slots and free slots "
              f"({n['model']} forwards{'' if res['max_steps'] is None else ', --max-steps'})", file=out)
    else:
        print(f"  first difference at forward {first['step']}: {first['field']}", file=out)
        print(f"    model:  {_short(first['model'])}", file=out)
        print(f"    engine: {_short(first['engine'])}", file=out)
        for side in ("model", "engine"):
            fwd = first.get(f"{side}_forward")
            if fwd:
                print(f"    {side} forward: " + ", ".join(f"{k}={_short(v, 60)}" for k, v in fwd.items()), file=out)
    tree = res.get("first_tree_difference")
    what = "the tree (Full tokens evictable, locked; live SWA tokens evictable, locked)"
    if tree is None:
        print(f"  {what}: the same after every forward compared", file=out)
    else:
        print(f"  {what}: first differs after forward {tree['step']}: model {_short(tree['model'])}, "
              f"engine {_short(tree['engine'])}", file=out)


def _short(v, limit: int = 160) -> str:
    s = json.dumps(v)
    if len(s) <= limit:
        return s
    return s[:limit] + (f"... ({len(v)} items)" if isinstance(v, (list, tuple)) else "...")


def cmd_conform_scheduler(args, design: str) -> int:
    res = run_schedule_conform(args.scenario, args.engine, design=design, max_steps=args.max_steps)
    print_schedule_conform(res)
    if args.json:
        print(json.dumps(res, default=str))
    return EXIT_CONFORMS if res["conforms"] else EXIT_DIVERGES
