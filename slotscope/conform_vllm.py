"""``slotscope conform SCENARIO --engine vllm==VERSION``: slotscope's model of vLLM's worker tables (the ``vllm-0.34``
worker model, engine_path/vllm/conformance.py) against the release's own ``BlockTables``, step by step, under the
release's own scheduler. Exit 0 every step conforms, 1 a divergence (the first printed), 2 bad input."""
from __future__ import annotations

import json
import sys
import time

EXIT_CONFORMS, EXIT_DIVERGES, EXIT_BAD_INPUT = 0, 1, 2
#: the release slotscope's worker model is written from
MODELLED = ("0.34.0",)


def cmd_conform_vllm(args) -> int:
    from engine_path.errors import EngineError
    from engine_path.vllm import release
    from engine_path.vllm.conformance import conform
    from simulator.scenario import ScenarioError, load_scenario

    spec = release.resolved(args.engine)
    given = [flag for flag, on in (("--scheduler", args.scheduler), ("--design", args.design),
                                   ("--page-size", args.page_size), ("--backends", args.backends),
                                   ("--allow", args.allow)) if on]
    if given:
        raise ScenarioError(f"{given[0]} with --engine {spec}: a vLLM comparison is of the worker's tables under the "
                            f"release's own scheduler (one boundary, the scenario's page size, no model design to "
                            f"choose)")
    if spec.version not in MODELLED:
        raise EngineError(f"no model of vllm {spec.version}: slotscope's model of vLLM's worker tables is written "
                          f"from {', '.join(MODELLED)} (the releases it has a model of)")
    sc = load_scenario(args.scenario)
    t0 = time.perf_counter()
    info = release.activate(spec)
    res = conform(sc, max_steps=args.max_steps)
    res.update(scenario=sc.name, path=args.scenario, engine=info.to_json(), max_steps=args.max_steps,
               wall_s=round(time.perf_counter() - t0, 2))
    from engine_path.patches import env_paths, sha256_of

    if env_paths():
        res["patches"] = [{"path": p, "sha256": sha256_of(p)} for p in env_paths()]
    _print(res)
    if args.json:
        print(json.dumps(res, default=str))
    return EXIT_CONFORMS if res["first"] is None else EXIT_DIVERGES


def _print(res: dict, out=sys.stdout) -> None:
    from .conform_table import print_fields

    e = res["engine"]
    print(f"conform {res['path']}: slotscope's vllm-{MODELLED[0]} worker model vs vllm {e.get('version')}'s "
          f"BlockTables ({e.get('path')}), under vLLM's own scheduler"
          + (f", first {res['max_steps']} steps" if res.get("max_steps") else ""), file=out)
    for pt in res.get("patches") or ():
        print(f"  engine patch: {pt['path']} (sha256 {pt['sha256'][:16]})", file=out)
    f = res["first"]
    if f is None:
        print(f"every step conforms ({res['steps_compared']} steps)", file=out)
    else:
        print(f"first divergence: step {f['step']}, {f['field']}: {f['detail']}", file=out)
    print_fields(res["fields"], out)
    d = res["did"]
    print(f"\nsteps compared: {res['steps_compared']} ({d['preemptions']} preemptions, {d['prefix_hit_tokens']} "
          f"prefix-hit tokens); the release's tables {res['release_s']} s (its kernels interpreted), the model's "
          f"{res['model_s']} s; {res['wall_s']} s in all", file=out)


__all__ = ["cmd_conform_vllm"]
