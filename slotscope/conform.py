"""``slotscope conform SCENARIO --engine sglang==VERSION``: does our model of a release do what the release does?

The model side (the design ``sglang-<version>`` unless ``--design`` names another) runs in this process;
the release runs in a process of its own (``engine_path.isolate``). Each writes a per-step record
(``engine_path.conformance.trace``: ``out_cache_loc``, per backend where its SWA ids come from, its
``swa_loc`` and the ``KVWriteLoc`` an SWA layer gets, the mapping at the changed full slots, the SWA
slots evicted, the slots freed) under the same scheduler decisions; the records are compared step by
step, field by field. The first divergence is printed exactly (step, field, model value, engine value,
a few elements around the first differing index), then a table per field.

A difference documented in docs/ENGINE.md ("Conformance") has an id (:data:`KNOWN`); ``--allow ID``
accepts it explicitly (the run still says it was seen). Both sides run the scenario's own scheduler
(``simulator.run.make_scheduler``: the radix cache's included); what the engine side cannot run is listed
as ``not compared`` with its reason (``engine_path.conformance.not_compared``). Exit 0: every step
conforms (or only allowed differences), on the scenario's own path (a not-compared timeline model aside);
1: a divergence; 2: bad input, or the scenario cannot be compared (the trace had to run another path than
the scenario's: a PD decode node, the unified pool; the steps it compared are still printed).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

from engine_path.releases import EngineSpec

EXIT_CONFORMS, EXIT_DIVERGES, EXIT_BAD_INPUT = 0, 1, 2
#: why --engine needs a version here
NEEDS_VERSION = "conform needs a release version (sglang==VERSION, vllm==VERSION): the model is chosen by it"

#: documented differences (docs/ENGINE.md, "Conformance"): id -> (what it matches, reason)
KNOWN: dict[str, str] = {}

_GROUP_FIELDS = ("swa_loc", "write_loc", "write_loc_full")


def _first_index(a: list, b: list) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def _around(values: Any, i: int, k: int = 3) -> str:
    if not isinstance(values, list):
        return json.dumps(values)
    lo = max(0, i - k)
    part = values[lo:i + k + 1]
    return (("[..., " if lo else "[") + ", ".join(json.dumps(v) for v in part)
            + (", ...]" if i + k + 1 < len(values) else "]") + f" (len {len(values)})")


def _short(value: Any, limit: int = 120) -> str:
    """A value in JSON: a list longer than ``limit`` characters cut to its head and its length, anything else
    to ``3 * limit`` characters (an error's text is read whole where it can be)."""
    text = json.dumps(value)
    if isinstance(value, list):
        return text if len(text) <= limit else _around(value, 0, k=5)
    return text if len(text) <= 3 * limit else text[:3 * limit] + "..."


#: the two parts of a paired field's value
PARTS = {"mapping": ("slots", "entries"), "swa_loc": ("dtype", "values"), "write_loc": ("loc", "swa_loc"),
         "write_loc_full": ("loc", "swa_loc"),
         "physical_loc": ("full", "swa"), "transfer": ("full", "swa")}


def _diff(model: Any, engine: Any, parts: Optional[tuple] = None) -> Optional[str]:
    """Where two values of one field differ, in words (None: equal)."""
    if model == engine:
        return None
    if isinstance(model, list) and isinstance(engine, list):
        flat_m, flat_e = model, engine
        # [dtype, values] / [loc, swa_loc] / [slots, entries] pairs: name the part that differs
        if parts and len(model) == 2 and len(engine) == 2:
            names = parts
            for j in (0, 1):
                if model[j] != engine[j]:
                    if isinstance(model[j], list) and isinstance(engine[j], list):
                        i = _first_index(model[j], engine[j])
                        return (f"{names[j]} first differs at index {i}: model "
                                f"{_around(model[j], i)}, engine {_around(engine[j], i)}")
                    return f"{names[j]}: model {_short(model[j])}, engine {_short(engine[j])}"
        i = _first_index(flat_m, flat_e)
        return f"first differs at index {i}: model {_around(flat_m, i)}, engine {_around(flat_e, i)}"
    return f"model {_short(model)}, engine {_short(engine)}"


def compare(model: dict, engine: dict) -> dict:
    """Step-by-step comparison of two traces: per field (backend fields per backend group) equal/differs
    counts, and the first divergence."""
    m_steps, e_steps = model["steps"], engine["steps"]
    groups: dict[str, list[str]] = {}
    for b, src in model["info"]["swa_ids"].items():
        groups.setdefault(src, []).append(b)
    rows: dict[str, list[int]] = {}           # field -> [equal, differs]
    first: Optional[dict] = None

    def note(field: str, step: Optional[int], where: str, m: Any, e: Any) -> None:
        nonlocal first
        d = _diff(m, e, PARTS.get(field.split(" ")[0]))
        row = rows.setdefault(field, [0, 0])
        row[1 if d else 0] += 1
        if d and first is None:
            first = {"step": step, "field": field, "where": where, "detail": d,
                     "model": m if not isinstance(m, list) or len(json.dumps(m)) < 400 else None,
                     "engine": e if not isinstance(e, list) or len(json.dumps(e)) < 400 else None}

    # which backends take plan ids and which translate: once, from the runs' own boundaries
    for b in model["info"]["swa_ids"]:
        note("swa_ids", None, b, model["info"]["swa_ids"].get(b), engine["info"]["swa_ids"].get(b))
    n = min(len(m_steps), len(e_steps))
    for k in range(n):
        ms, es = m_steps[k], e_steps[k]
        step = ms["step"]
        for field in ("step", "mode", "graph"):
            if ms[field] != es[field]:
                note("schedule", step, field, ms[field], es[field])
                break
        else:
            rows.setdefault("schedule", [0, 0])[0] += 1
        for field in ("out_cache_loc", "physical_loc", "mapping", "moves", "evicted_swa", "freed_full", "freed_swa",
                      "transfer"):
            if field not in ms and field not in es:     # physical_loc, moves: pool.unified only; transfer: PD
                continue
            where = ""
            if field == "mapping" and ms[field] != es[field] and ms[field][0] == es[field][0]:
                i = _first_index(ms[field][1], es[field][1])
                if i < len(ms[field][0]):
                    where = f"full_to_swa[{ms[field][0][i]}]"
            note(field, step, where, ms.get(field), es.get(field))
        for field in _GROUP_FIELDS:
            for src, names in sorted(groups.items()):
                for b in names:
                    note(f"{field} [{src}]", step, b, ms.get(field, {}).get(b), es.get(field, {}).get(b))
    # a side that stopped early (a failure in its code) is the first thing to say, before the count it shortens
    for side, tr in (("model", model), ("engine", engine)):
        if tr["info"].get("stopped"):
            note("stopped", len(tr["steps"]), side, model["info"].get("stopped"), engine["info"].get("stopped"))
            break
    if len(m_steps) != len(e_steps):
        note("steps", None, "count", len(m_steps), len(e_steps))
    # the scheduler each side ran, and the radix cache's counters (engine.radix_cache) over the whole run
    note("scheduler", None, "class", model["info"].get("scheduler"), engine["info"].get("scheduler"))
    if model["info"].get("radix") is not None or engine["info"].get("radix") is not None:
        note("radix", None, "counters", model["info"].get("radix"), engine["info"].get("radix"))
    return {"steps_compared": n, "fields": rows, "first": first, "groups": groups}


def _known_match(first: Optional[dict], allowed: list[str]) -> Optional[str]:
    return None


def _default_design(version: str, explicit: Optional[str]) -> str:
    from simulator.designs.catalogue import BUILTIN_DESIGNS
    from simulator.designs.types import DesignError

    if explicit:
        return explicit
    name = f"sglang-{version}"
    if name in BUILTIN_DESIGNS:
        return name
    releases = sorted(n for n in BUILTIN_DESIGNS if n.startswith("sglang-0") or n.startswith("sglang-1"))
    raise DesignError(f"no model of sglang {version}: there is no design named {name!r} (release designs: "
                      f"{', '.join(releases) or 'none'}); pass --design NAME to compare another model with it")


def run_conform(scenario: str, engine: EngineSpec, *, page_size: Optional[int] = None, design: Optional[str] = None,
                max_steps: Optional[int] = None, backends: Optional[list[str]] = None,
                timeout: float = 1800) -> dict:
    """Both traces and their comparison (raises EngineError / DesignError / ScenarioError on bad input)."""
    from engine_path import isolate
    from engine_path.conformance import trace
    from engine_path.errors import EngineError
    from simulator.designs.loading import load_design
    from simulator.scenario import ScenarioError, load_scenario

    if engine.version is None:
        raise EngineError(f"--engine {engine}: {NEEDS_VERSION}")
    if not Path(scenario).is_file():
        raise ScenarioError(f"{scenario}: no such scenario file")
    sc = load_scenario(scenario)
    if page_size is not None and page_size < 1:
        raise ScenarioError(f"--page-size must be >= 1, got {page_size}")
    name = _default_design(engine.version, design)
    load_design(name)                                   # bad --design: DesignError before any run
    opts = {"design": name, "page_size": page_size, "max_steps": max_steps, "backends": backends}
    t0 = time.perf_counter()
    model = trace(scenario, dict(opts, engine=False))
    t1 = time.perf_counter()
    eng = isolate.call(str(engine), "engine_path.conformance:trace", scenario, dict(opts, engine=True),
                       timeout=timeout)
    t2 = time.perf_counter()
    result = compare(model, eng)
    result.update(scenario=sc.name, path=scenario, design=name, engine=eng["info"].get("engine"),
                  scheduler=model["info"].get("scheduler"), radix=model["info"].get("radix"),
                  not_compared=model["info"].get("not_compared") or [],
                  page_size=model["info"]["page_size"], max_steps=max_steps,
                  model_s=round(t1 - t0, 2), engine_s=round(t2 - t1, 2),
                  engine_calls=eng["info"].get("engine_calls"), forward=_forward_sources(eng["info"]))
    from engine_path.patches import env_paths, sha256_of

    if env_paths():                       # --engine-patch, applied in the release's process
        result["patches"] = [{"path": p, "sha256": sha256_of(p)} for p in env_paths()]
    return result


def _forward_sources(info: dict) -> dict:
    """Per backend of the engine side: how many forwards the release's own backend ran (metadata, write
    locations: engine_path/forward) and how many the model's boundary ran, by reason."""
    out = {}
    for key, d in (info.get("backends") or {}).items():
        backend = key.split("/")[0]
        if "release_forwards" in d:
            out[backend] = {"release": d["release_forwards"], "model": d["model_forwards"]}
        else:
            out[backend] = {"release": 0, "model": {d["pieces"][0]["why"]: "every forward"}}
    return out


def comparable(res: dict) -> bool:
    """Whether the comparison ran the scenario's own scheduler and allocator path (every ``not_compared``
    entry leaves it compared: ``own_path``); where not, the scenario cannot be said to conform (exit 2)."""
    return all(nc["own_path"] for nc in res.get("not_compared") or ())


def _print(res: dict, out=sys.stdout) -> None:
    from .conform_table import print_fields

    e = res.get("engine") or {}
    print(f"conform {res['path']} (page_size {res['page_size']}): model {res['design']} vs engine "
          f"sglang {e.get('version')} ({e.get('path')})"
          + (f", first {res['max_steps']} steps" if res.get("max_steps") else ""), file=out)
    for pt in e.get("patches") or ():
        print(f"  engine patch: {pt['path']} (sha256 {pt['sha256'][:16]}, applied by {pt['applied_by']})", file=out)
    f = res["first"]
    for nc in res.get("not_compared") or ():
        print(f"not compared: {nc['what']} ({nc['reason']}); the trace runs {nc['trace_runs']}", file=out)
    if f is None and not res.get("not_compared"):
        print(f"every step conforms ({res['steps_compared']} steps)", file=out)
    elif f is None and comparable(res):
        print(f"every compared step conforms ({res['steps_compared']} steps; the scenario's scheduler and "
              f"allocator path, but not what is listed above)", file=out)
    elif f is None:
        print(f"cannot be compared: the trace ran another path than the scenario's (see not compared above); "
              f"on that path every step agrees ({res['steps_compared']} steps), which says nothing about the "
              f"scenario's own", file=out)
    else:
        at = "before the first step" if f["step"] is None else f"step {f['step']}"
        print(f"first divergence: {at}, {f['field']}" + (f" ({f['where']})" if f["where"] else "")
              + f": {f['detail']}", file=out)
    print_fields(res["fields"], out)
    print(f"\nsteps compared: {res['steps_compared']}; backend groups: "
          + "; ".join(f"{g}: {', '.join(bs)}" for g, bs in sorted(res["groups"].items()))
          + f"; model {res['model_s']} s, engine {res['engine_s']} s (import included)", file=out)
    fwd = res.get("forward") or {}
    if fwd:
        print("engine side's backends: " + "; ".join(
            f"{b} {v['release']} forwards by the release" + (f", the rest by the model ({', '.join(v['model'])})"
                                                           if v["model"] else "")
            for b, v in fwd.items()), file=out)


def cmd_conform(args) -> int:
    from .cli import EXIT_BAD_INPUT as _bad  # noqa: F401  (same code)

    unknown = [a for a in args.allow or [] if a not in KNOWN]
    if unknown:
        print(f"slotscope: error: --allow {', '.join(unknown)}: not a documented difference (known: "
              f"{', '.join(sorted(KNOWN)) or 'none'}; docs/ENGINE.md, Conformance)", file=sys.stderr)
        return EXIT_BAD_INPUT
    from .options import use_engine_patches

    use_engine_patches(args, args.engine)
    if args.engine.name == "vllm":
        from .conform_vllm import cmd_conform_vllm

        return cmd_conform_vllm(args)
    if args.scheduler:
        return _conform_scheduler(args)
    res = run_conform(args.scenario, args.engine, page_size=args.page_size, design=args.design,
                      max_steps=args.max_steps, backends=list(args.backends) if args.backends else None)
    _print(res)
    allowed = _known_match(res["first"], args.allow or [])
    if args.json:
        print(json.dumps({k: v for k, v in res.items()}, default=str))
    if res["first"] is None:
        return EXIT_CONFORMS if comparable(res) else EXIT_BAD_INPUT
    if allowed:
        print(f"(allowed: {allowed})")
        return EXIT_CONFORMS
    return EXIT_DIVERGES


def _conform_scheduler(args) -> int:
    from engine_path.errors import EngineError
    from simulator.designs.loading import load_design
    from simulator.scenario import ScenarioError

    from .conform_scheduler import cmd_conform_scheduler

    if args.engine.version is None:
        raise EngineError(f"--engine {args.engine}: {NEEDS_VERSION}")
    if args.page_size is not None or args.backends or args.allow:
        raise ScenarioError("--scheduler compares the schedulers' decisions: --page-size, --backends and --allow "
                            "are for the write path's comparison")
    if not Path(args.scenario).is_file():
        raise ScenarioError(f"{args.scenario}: no such scenario file")
    name = _default_design(args.engine.version, args.design)
    load_design(name)
    return cmd_conform_scheduler(args, name)


def register(sub) -> None:
    from .options import VERSION_REQUIRED, add_engine_option, add_engine_patch, backend_list, positive_int

    p = sub.add_parser(
        "conform", help="compare our model of an SGLang (or vLLM) release with the release, step by step",
        description="Drive the model of a release (the design sglang-VERSION unless --design) and the real release "
                    "(its allocator, eviction rule, and each backend's own metadata, graph buffers, narrowing and "
                    "layer forward up to the pool write, in a process of its own) through SCENARIO under the same "
                    "scheduler decisions, and compare every step: out_cache_loc, where each backend takes its SWA "
                    "ids from, swa_loc per backend group, the write location of a full and of an SWA layer, "
                    "mapping entries at the changed full slots, evictions, frees. A side that stops early (its "
                    "code raised) is named with the error.",
        epilog="examples:\n"
               "  slotscope conform scenarios/b1-pcg-dp-padding.toml --engine sglang==0.5.23\n"
               "  slotscope conform scenarios/paths-paged.toml --engine sglang==0.5.23 --page-size 1\n"
               "  slotscope conform scenarios/b2-decode-stale-tail.toml --engine sglang==0.5.23 --scheduler\n"
               "  slotscope conform scenarios/sched-evict-retract.toml --engine vllm==0.34.0\n\n"
               "exit codes:\n"
               "  0    every step conforms (on the scenario's own path; 'not compared' lines say what is not)\n"
               "  1    a divergence (the first is printed: step, field, model value, engine value)\n"
               "  2    bad input, or cannot be compared (the trace ran another path than the scenario's:\n"
               "       the not-compared lines say why)\n",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", help="scenario TOML file")
    add_engine_option(p, required=True, version=VERSION_REQUIRED, why=NEEDS_VERSION, metavar="{sglang,vllm}==VERSION",
                      engines=("sglang", "vllm"),
                      help="the release to compare with; a version is needed (the model design sglang-VERSION is "
                           "chosen by it). vllm==0.34.0: slotscope's model of vLLM's worker tables (slot mappings, "
                           "their padding, the forward's block tables) against the release's, under vLLM's own "
                           "scheduler (slotscope/conform_vllm.py)")
    add_engine_patch(p)
    p.add_argument("--page-size", type=positive_int, metavar="N",
                   help="run at this page size (pool sizes rounded up to whole pages)")
    p.add_argument("--design", metavar="MODEL_DESIGN", help="the model design (default: sglang-VERSION)")
    p.add_argument("--max-steps", type=positive_int, metavar="N", help="compare the first N forwards only")
    p.add_argument("--backends", type=backend_list, help="comma-separated backends (default: the scenario's; 'all')")
    p.add_argument("--allow", action="append", metavar="KNOWN_ID",
                   help="accept a documented difference (docs/ENGINE.md, Conformance); repeatable")
    p.add_argument("--json", action="store_true", help="end with one JSON line: the comparison")
    p.add_argument("--scheduler", action="store_true",
                   help="compare the schedulers instead: the model's against the release's own Scheduler (its "
                        "policy, batches, allocation, tree cache and event loop; no model), forward by forward: mode, "
                        "requests, new tokens, lengths, write slots, free slots (not yet: overlap, speculative, DP "
                        "attention, PD decode, the unified pool)")
    p.set_defaults(func=cmd_conform)
