"""slotscope beside SGLang's own KV checker (kv_canary), per bug and per fault (issue 15 points 3 and 4).

Runs the known-bug corpus (scenarios/corpus.toml, each case under its buggy design), every ``--inject`` kind
(simulator/plugins/faults.py, on smoke at PROB 1 as tests/test_faults.py does) and the shipped scenarios (under their
own designs; the bug scenarios the corpus already runs are not run twice) through slotscope and, in the same
run, through the canary's own CPU torch references of each cached SGLang release (engine_path/canary.py:
plan, verify before each forward, write after it, over the same req_to_token, full_to_swa and pool rows), in
its default mode (metadata only) and its real-data mode (partial: the first 16 bytes of layer 0's K).

Each run uses one backend (the first the case expects to fail; flashinfer otherwise) and at most
``--max-steps`` steps: the references are Python loops (about 0.1 ms per entry). Per row: slotscope's first
finding (class, steps after the fault) and the canary's (reasons, steps after), and the per-step cost of
each (slotscope: the run without the canary's time; the canary: its plan, verify and write references).
For a corpus bug or a shipped scenario "the fault" is the first step slotscope found (its write check runs
at every step); for injected faults each fault is matched as --inject matches slotscope's findings: the
first violation at its step or later touching its slots. The canary's own log line would come one step
later (its ring is read a step late); the table counts the step of the launch that raised it.

    .venv/bin/python bench/vs_kv_canary.py [--releases 0.5.14,0.5.23] [--quick] [--max-steps N]

One subprocess per release (one release per process). A release without the references prints one line
saying so in its row. The last line is one JSON object.
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
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODES = ("none", "partial")
MODE_NAMES = {"none": "canary default", "partial": "canary real-data"}
#: kind -> (mixed_chunk, max_steps): smoke on flashinfer at PROB 1 (tests/test_faults.py's cases)
FAULT_CASES = {
    "repoint_req_to_token": (True, 4), "corrupt_live_slot": (True, 4), "corrupt_idle_cached_slot": (False, 21),
    "corrupt_after_write": (True, 4), "drop_write": (True, 4), "shift_loc": (True, 4),
    "stale_graph_tail": (False, 31), "clear_swa_mapping": (True, 4), "repoint_swa_mapping": (True, 4),
    "misroute_layer": (True, 4), "corrupt_v_only": (True, 4), "write_slot0": (True, 4),
    "write_out_of_range": (True, 4),
}
QUICK_SHIPPED = ("smoke.toml", "sharing-system-prompt.toml")
#: shipped scenarios whose batches are deployment-size: fewer steps (the references' cost grows with the prefix)
STEP_CAP = {"scale.toml": 6, "paths-big-pool.toml": 12}
AFTER = 4          # steps the canary runs past slotscope's first finding, when that comes after --max-steps


class _Both:
    """A ForwardObserver fan-out: several canary drivers over one run."""

    def __init__(self, drivers):
        self.drivers = drivers

    def before_forward(self, view):
        for d in self.drivers:
            d.before_forward(view)

    def after_forward(self, view):
        for d in self.drivers:
            d.after_forward(view)


def server_refusal(sc) -> str:
    """What makes a live server refuse the canary for this scenario ("" when it runs): piecewise prefill
    graphs and the unified pool (../shared/KV_CANARY.md, "Where it runs")."""
    if getattr(sc.pool, "unified", False):
        return "unified pool"
    if sc.engine.piecewise_cuda_graph:
        return "piecewise CUDA graphs"
    return ""


def _run(scenario, backend: str, design, max_steps: int, refs, inject=()):
    from engine_path.canary import CanaryDriver
    from slotscope.pipeline import RunOptions, run_scenario

    # the unified pool's ids are virtual: its req_to_token holds no pool rows, so there is nothing to drive
    drivers = [] if getattr(scenario.pool, "unified", False) else [CanaryDriver(refs, m) for m in MODES]
    t0 = time.perf_counter()
    out = run_scenario(scenario, None, RunOptions(design=design, backends=(backend,), device="cpu", report=False,
                                                  trace_level="off", max_steps=max_steps, inject=tuple(inject),
                                                  forward_observer=_Both(drivers)))
    wall = time.perf_counter() - t0
    steps = max(len(out.result.steps), 1)
    cost = {"slotscope_ms_step": round(1e3 * (wall - sum(d.seconds for d in drivers)) / steps, 2)}
    for m in MODES:
        d = next((x for x in drivers if x.mode == m), None)
        cost[f"{m}_ms_step"] = None if d is None else round(1e3 * d.seconds / steps, 2)
    out.server_refusal = server_refusal(scenario)
    return out, drivers, cost, steps


def _bug_row(group: str, item: str, backend: str, design: str, out, drivers, cost, steps) -> dict:
    first = out.result.backends[backend].first_finding
    total = out.result.backends[backend].total
    ss = None if first is None else {"class": first.cls, "step": first.step, "steps_after": 0, "findings": total}
    at = None if first is None else first.step
    row = {"group": group, "item": item, "backend": backend, "design": design or out.summary["design"],
           "steps": steps, "slotscope": ss, "cost": cost, "server": out.server_refusal}
    for m in MODES:
        row[m] = "not driven"
    for d in drivers:
        v = d.violations[0] if d.violations else None
        row[d.mode] = None if v is None else {
            "reason": "+".join(v.reasons), "kind": v.kind, "stage": v.stage, "step": v.step,
            "steps_after": None if at is None else v.step - at, "violations": len(d.violations)}
    return row


def _steps(sc, design: str, backend: str, max_steps: int) -> int:
    """Steps to run with the canary: ``max_steps``, or up to ``AFTER`` steps past slotscope's first finding
    (found by a run without the canary) when that comes later."""
    from slotscope.pipeline import RunOptions, run_scenario

    probe = run_scenario(sc, None, RunOptions(design=design, backends=(backend,), device="cpu", report=False,
                                              trace_level="off"))
    first = probe.result.backends[backend].first_finding
    return max(max_steps, 0 if first is None else first.step + 1 + AFTER)


def _case_backend(case) -> str:
    from simulator.scenario import BACKENDS

    bad = [b for b in BACKENDS if case.expected("buggy", b) != "clean"]
    return bad[0] if bad else "flashinfer"


def corpus_rows(refs, max_steps: int, quick: bool, only=None) -> list[dict]:
    from slotscope.corpus import load_corpus

    rows = []
    cases = load_corpus()
    for case in (cases[:2] if quick else cases):
        if only is not None and case.id not in only:
            continue
        backend = _case_backend(case)
        sc = case.load()
        rows.append(_guard("corpus", case.id, backend, lambda: _bug_row(
            "corpus", case.id, backend, case.buggy,
            *_run(sc, backend, case.buggy, _steps(sc, case.buggy, backend, max_steps), refs))))
        _progress(rows[-1])
    return rows


def _fault_scenario(mixed: bool, tmp: Path):
    from simulator.scenario import load_scenario

    smoke = ROOT / "scenarios" / "smoke.toml"
    if mixed:
        return load_scenario(smoke)
    p = tmp / "smoke-nomix.toml"
    p.write_text(smoke.read_text().replace("mixed_chunk = true", "mixed_chunk = false"))
    return load_scenario(p)


def _canary_match(fault, violations):
    slots = set(fault.slots)
    for v in violations:
        if v.step >= fault.step and (fault.backend == "all" or v.backend == fault.backend) and \
                (v.kind, v.slot) in slots:
            return v
    return None


def fault_row(kind: str, refs, tmp: Path) -> dict:
    mixed, steps = FAULT_CASES[kind]
    out, drivers, cost, n = _run(_fault_scenario(mixed, tmp), "flashinfer", None, steps, refs, (f"{kind}:1",))
    faults = out.faults.faults
    det = [f.detected for f in faults if f.detected is not None]
    classes = sorted({d["class"] for d in det})
    row = {"group": "fault", "item": kind, "backend": "flashinfer", "design": out.summary["design"], "steps": n,
           "injected": len(faults), "cost": cost, "server": out.server_refusal,
           "slotscope": {"detected": len(det), "class": "+".join(classes),
                         "steps_after": max((d["steps_after"] for d in det), default=None)}}
    for d in drivers:
        hits = [(f, v) for f in faults for v in [_canary_match(f, d.violations)] if v is not None]
        reasons = sorted({r for _, v in hits for r in v.reasons})
        row[d.mode] = {"detected": len(hits), "reason": "+".join(reasons),
                       "steps_after": max((v.step - f.step for f, v in hits), default=None),
                       "violations": len(d.violations)}
    return row


def fault_rows(refs, quick: bool, only=None) -> list[dict]:
    from simulator.plugins.faults import FAULT_KINDS

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in (list(FAULT_KINDS)[:2] if quick else FAULT_KINDS):
            if only is not None and kind not in only:
                continue
            rows.append(_guard("fault", kind, "flashinfer", lambda: fault_row(kind, refs, Path(tmp))))
            _progress(rows[-1])
    return rows


def shipped_rows(refs, max_steps: int, quick: bool, only=None) -> list[dict]:
    from simulator.scenario import BACKENDS, load_scenario
    from slotscope.corpus import load_corpus
    from slotscope.pipeline import RunOptions, run_scenario

    in_corpus = {(c.scenario.name, c.buggy) for c in load_corpus() if not c.overrides}
    rows = []
    for path in sorted((ROOT / "scenarios").glob("*.toml")):
        if path.stem.startswith("corpus") or (quick and path.name not in QUICK_SHIPPED) or \
                (only is not None and path.stem not in only):
            continue
        sc = load_scenario(path)
        if (path.name, sc.design or "") in in_corpus:
            continue
        cap = STEP_CAP.get(path.name)
        # the backend slotscope finds first (a model run without the canary), else flashinfer
        probe = run_scenario(sc, None, RunOptions(device="cpu", report=False, trace_level="off",
                                                  max_steps=cap, backends=tuple(sc.backends)))
        hit = [b for b in BACKENDS if b in probe.result.backends and probe.result.backends[b].first_finding]
        backend = hit[0] if hit else ("flashinfer" if "flashinfer" in sc.backends else sc.backends[0])
        first = probe.result.backends[backend].first_finding
        steps = cap or max(max_steps, 0 if first is None else first.step + 1 + AFTER)
        rows.append(_guard("shipped", path.stem, backend, lambda: _bug_row(
            "shipped", path.stem, backend, None, *_run(sc, backend, None, steps, refs))))
        _progress(rows[-1])
    return rows


def _guard(group: str, item: str, backend: str, make) -> dict:
    """A row, or the row's one-line error (the bench goes on)."""
    try:
        return make()
    except Exception as e:  # one row's failure is reported in its row
        return {"group": group, "item": item, "backend": backend, "error": f"{type(e).__name__}: {e}"[:300]}


def _progress(row: dict) -> None:
    print(f"  {row['group']:8s} {row['item']:28s} done", file=sys.stderr, flush=True)


def child(version: str, max_steps: int, quick: bool, only=None) -> dict:
    """Under one release: every row, or the release's one-line reason why the canary cannot be driven."""
    from engine_path.canary import CanaryAbsent, load_references
    from engine_path.errors import EngineError
    from engine_path.releases import activate

    try:
        info = activate(f"sglang=={version}")
        refs = load_references(info.version)
    except CanaryAbsent as e:
        return {"release": version, "absent": str(e)}
    except EngineError as e:
        return {"release": version, "error": str(e)}
    t0 = time.perf_counter()
    rows = corpus_rows(refs, max_steps, quick, only) + fault_rows(refs, quick, only) + \
        shipped_rows(refs, max_steps, quick, only)
    return {"release": version, "references": refs.describe(), "rows": rows, "wall_s": round(time.perf_counter() - t0, 1)}


# ------------------------------------------------------------------------------------------------ the table

def _cell_bug(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return f"{x.get('class') or x.get('reason')} ({x['steps_after']:+d})" if x.get("steps_after") is not None \
        else f"{x.get('class') or x.get('reason')}"


def _cell_fault(x, injected: int) -> str:
    if not x or not x["detected"]:
        return f"0/{injected}"
    after = "" if x["steps_after"] is None else f" (<=+{x['steps_after']})"
    return f"{x['detected']}/{injected} {x.get('class') or x.get('reason')}{after}"


def format_table(result: dict) -> str:
    lines = []
    head = ("| item | backend | slotscope (class, steps after) | canary default (reason, steps after) | "
            "canary real-data | a server refuses the canary | ms/step slotscope / default / real-data |")
    for rel in result["releases"]:
        if "rows" not in rel:
            lines.append(f"sglang {rel['release']}: {rel.get('absent') or rel.get('error')}")
            continue
        lines.append(f"sglang {rel['release']}: canary driven through {rel['references']}")
        lines += ["", head, "|---|---|---|---|---|---|---|"]
        for r in rel["rows"]:
            if "error" in r:
                lines.append(f"| {r['group']} {r['item']} | {r['backend']} | error: {r['error']} | | | | |")
                continue
            c = r["cost"]
            cost = " / ".join("-" if c[k] is None else f"{c[k]:.0f}" for k in
                              ("slotscope_ms_step", "none_ms_step", "partial_ms_step"))
            if r["group"] == "fault":
                n = r["injected"]
                cells = [_cell_fault(r["slotscope"], n), _cell_fault(r["none"], n), _cell_fault(r["partial"], n)]
                item = f"inject {r['item']}"
            else:
                cells = [_cell_bug(r["slotscope"]) if r["slotscope"] else "clean", _cell_bug(r["none"]),
                         _cell_bug(r["partial"])]
                item = f"{r['group']} {r['item']} ({r['design']})"
            lines.append(f"| {item} | {r['backend']} | " + " | ".join(cells) + f" | {r.get('server') or '-'} | {cost} |")
        lines.append("")
    return "\n".join(lines)


def _cached_releases() -> list[str]:
    from engine_path.releases import engines_dir

    d = engines_dir()
    names = sorted(p.name.split("-", 1)[1] for p in d.glob("sglang-*")) if d.is_dir() else []
    return sorted(names, key=lambda v: tuple(int(x) for x in v.split(".") if x.isdigit()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--releases", help="comma list (default: every release in the cache)")
    ap.add_argument("--max-steps", type=int, default=12)
    ap.add_argument("--quick", action="store_true", help="two cases of each group")
    ap.add_argument("--only", help="comma list of items (corpus ids, fault kinds, scenario stems)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        only = frozenset(a.only.split(",")) if a.only else None
        print(json.dumps(child(a.child, a.max_steps, a.quick, only), sort_keys=True))
        return 0
    releases = a.releases.split(",") if a.releases else _cached_releases()
    result = {"bench": "vs_kv_canary", "max_steps": a.max_steps, "quick": a.quick, "releases": []}
    procs = []
    for v in releases:                       # one process per release, side by side
        print(f"sglang {v} ...", file=sys.stderr, flush=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", v, "--max-steps", str(a.max_steps)]
        err = tempfile.TemporaryFile(mode="w+")
        procs.append((v, err, subprocess.Popen(cmd + (["--quick"] if a.quick else []) + (["--only", a.only] if a.only else []),
                                               stdout=subprocess.PIPE, stderr=err, text=True,
                                               env=dict(os.environ, PYTHONWARNINGS="ignore"))))
    for v, errf, proc in procs:
        out, _ = proc.communicate()
        errf.seek(0)
        err = errf.read()
        sys.stderr.write("".join(f"[{v}] {x}\n" for x in err.splitlines() if x.startswith("  ")))
        line = next((x for x in reversed(out.splitlines()) if x.startswith("{")), None)
        result["releases"].append(json.loads(line) if line else
                                  {"release": v, "error": f"exit {proc.returncode}: {err.strip()[-300:]}"})
    print(format_table(result))
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
