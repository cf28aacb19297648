"""``slotscope minimize DIR``: shrink a failing run to the smallest scenario with the same finding.

The finding to keep is the first finding of the run's first failing backend: its class and the kind
of the boundary where it happened (a full or an SWA layer, of the target or of the speculative
draft). A greedy delta-debugging loop then tries smaller scenarios and keeps each change after which
the finding still appears: one failing backend; the workload as an explicit request list, with
requests dropped and prompt / output lengths halved; an explicit layer pattern with layers dropped
(at least one of the failing kind stays); smaller pools and window; engine knobs back to their
defaults or smaller; fewer decode capture sizes. Passes repeat until none changes anything.

Each candidate is written with the TOML writer and read back by ``parse_scenario`` (so it is a valid
scenario file by construction) and run in-process on the CPU; a run stops at the first matching
finding. Progress goes to stderr; the minimal scenario is written (DIR/minimal.toml or -o) and
printed. Exit codes: 0 minimized, 2 bad input (no run there, no finding to keep).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from simulator.designs import BUILTIN_DESIGNS, Design, DesignError, load_design
from simulator.observe import NullObserver
from simulator.padding import default_decode_capture_sizes, speculative_decode_capture_sizes
from simulator.records import Finding
from simulator.scenario import Scenario, ScenarioError, parse_scenario, tomllib
from simulator.toml_write import dumps
from simulator.workload import make_requests

from .pipeline import UsageError

EXIT_OK, EXIT_BAD_INPUT = 0, 2


@dataclass(frozen=True)
class Target:
    """What the minimal scenario must still show."""

    cls: str
    kind: str          # "full" | "swa"
    draft: bool        # at a layer of the speculative draft model
    backend: str

    def describe(self) -> str:
        where = f"a {'draft ' if self.draft else ''}{self.kind} layer"
        return f"{self.cls} at {where} on {self.backend}"


class _Reproduced(Exception):
    pass


class _Watch(NullObserver):
    """Stops the run at the first finding that matches the target."""

    def __init__(self, target: Target, num_layers: int):
        self.target, self.num_layers = target, num_layers

    def on_findings(self, findings) -> None:
        for f in findings:
            if self.matches(f):
                raise _Reproduced()

    def matches(self, f: Finding) -> bool:
        t = self.target
        return f.cls == t.cls and f.kind == t.kind and (f.layer >= self.num_layers) == t.draft


def read_run(run_dir: Path) -> tuple[dict, dict, dict]:
    """(scenario TOML data, summary, run.json) of a run directory, with clear errors."""
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run directory")
    out = []
    for name in ("scenario.toml", "summary.json", "run.json"):
        p = run_dir / name
        if not p.is_file():
            raise UsageError(f"{p}: missing (minimize needs a directory written by `slotscope run`)")
        try:
            out.append(tomllib.loads(p.read_text()) if name.endswith(".toml") else json.loads(p.read_text()))
        except (ValueError, tomllib.TOMLDecodeError) as e:
            raise UsageError(f"{p}: cannot read: {e}") from None
    return out[0], out[1], out[2]


def find_target(summary: dict, run: dict, num_layers: int) -> Target:
    kinds = {int(l[0]): l[1] for l in run.get("layers", [])}
    for backend, b in summary.get("backends", {}).items():
        ff = b.get("first_finding")
        if ff:
            layer = int(ff["layer"])
            kind = kinds.get(layer)
            if kind is None:
                raise UsageError(f"run.json has no layer {layer} (the first finding's layer on {backend})")
            return Target(ff["class"], kind, layer >= num_layers, backend)
    raise UsageError("the run has no findings: nothing to minimize")


class Minimizer:
    def __init__(self, data: dict, design: Design, target: Target, log: Callable[[str], None]):
        self.data = data
        self.design = design
        self.target = target
        self.log = log
        self.runs = 0
        self.t0 = time.perf_counter()

    # ------------------------------------------------------------------ evaluation

    def scenario(self, data: dict) -> Scenario:
        return parse_scenario(dumps(data), "minimal.toml")

    def reproduces(self, data: dict) -> bool:
        from .pipeline import make_pool_factory
        from simulator.run import run_simulation

        try:
            sc = self.scenario(data)
        except ScenarioError:
            return False
        self.runs += 1
        watch = _Watch(self.target, sc.model.num_layers)
        try:
            run_simulation(sc, self.design, make_pool_factory(sc, _cpu(), "compact", "torch"), device="cpu",
                           observer=watch)
        except _Reproduced:
            return True
        except (ScenarioError, ValueError, RuntimeError, DesignError):
            return False   # a candidate the simulator refuses (does not fit its pools, ...) is no reproduction
        return False

    def attempt(self, what: str, candidate: dict) -> bool:
        if candidate == self.data or not self.reproduces(candidate):
            return False
        self.data = candidate
        self.log(f"minimize: {what}  [{self.runs} runs, {time.perf_counter() - self.t0:.1f}s]")
        return True

    # ------------------------------------------------------------------ passes

    def run(self, max_rounds: int = 6) -> dict:
        if not self.reproduces(self.data):
            raise UsageError(f"the run's scenario does not reproduce {self.target.describe()} in-process "
                             f"(was it run with --max-steps or a different design?)")
        self.pass_backend()
        self.pass_explicit_requests()
        for _ in range(max_rounds):
            before = _copy(self.data)
            self.pass_requests()
            self.pass_scale()
            self.pass_layers()
            self.pass_lengths()
            self.pass_engine()
            self.pass_pool()
            self.pass_model()
            if self.data == before:
                break
        # last, the capture sizes back to the default when the finding does not need a shorter list
        if "cuda_graph_bs" in self.data.get("engine", {}):
            d = _copy(self.data)
            del d["engine"]["cuda_graph_bs"]
            self.attempt("engine.cuda_graph_bs -> default", d)
        return self.data

    def pass_backend(self) -> None:
        d = _copy(self.data)
        d["backends"] = [self.target.backend]
        self.attempt(f"backends -> {self.target.backend}", d)

    def pass_explicit_requests(self) -> None:
        w = self.data.get("workload", {})
        if w.get("request"):
            return
        sc = self.scenario(self.data)
        specs = make_requests(sc.workload, np.random.default_rng(sc.seed))
        d = _copy(self.data)
        d["workload"] = {"request": [{"arrival_step": r.arrival_step, "prompt_len": r.prompt_len,
                                      "output_len": r.output_len} for r in specs]}
        if not self.attempt(f"workload -> {len(specs)} explicit requests", d):
            # the generated workload stays: fewer of them, then
            n = int(w.get("requests", len(specs)))
            while n > 1:
                d = _copy(self.data)
                d["workload"]["requests"] = n // 2
                if not self.attempt(f"requests {n} -> {n // 2}", d):
                    break
                n //= 2

    def pass_requests(self) -> None:
        reqs = self.data.get("workload", {}).get("request")
        if not reqs:
            return

        def ok(items: list) -> bool:
            d = _copy(self.data)
            d["workload"]["request"] = items
            d["workload"].pop("requests", None)
            return self.attempt(f"requests {len(reqs)} -> {len(items)}", d)

        _shrink_list(reqs, ok, lambda items: len(items) >= 1)

    def pass_layers(self) -> None:
        """Drop layers: the target's (at least one of the failing kind stays), then the draft's."""
        sc = self.scenario(self.data)
        if "layers" not in self.data["model"] or "num_layers" in self.data["model"]:
            d = _copy(self.data)
            d["model"]["layers"] = _pattern(list(sc.model.layer_kinds))
            d["model"].pop("num_layers", None)
            self.data = d      # the same model, written out: no run needed
        keep = None if self.target.draft else self.target.kind
        self._shrink_pattern(list(sc.model.layer_kinds), ("model",), "layers", keep)
        if self.target.draft:
            sc = self.scenario(self.data)
            self._shrink_pattern(list(sc.engine.speculative.draft_layers), ("engine", "speculative"),
                                 "draft_layers", self.target.kind)

    def _shrink_pattern(self, kinds: list, path: tuple[str, ...], key: str, keep: Optional[str]) -> None:
        where = ".".join(path + (key,))

        def ok(items: list) -> bool:
            d = _copy(self.data)
            table = d
            for p in path:
                table = table[p]
            table[key] = _pattern(items)
            return self.attempt(f"{where} {_pattern(kinds)} -> {_pattern(items)}", d)

        _shrink_list(kinds, ok, lambda items: keep is None or keep in items)

    def pass_scale(self) -> None:
        """Halve the pools and every prompt together: bugs about index ranges need both to shrink at once."""
        while True:
            d = _copy(self.data)
            page = self._page()
            pool, reqs = d.get("pool", {}), d.get("workload", {}).get("request")
            if not reqs or pool.get("full_size", 0) // 2 < 2 * page:
                return
            pool["full_size"] = pool["full_size"] // 2 - (pool["full_size"] // 2) % page
            spec = d.get("engine", {}).get("speculative", {})
            if "draft_full_size" in spec:
                spec["draft_full_size"] = max(2 * page, spec["draft_full_size"] // 2 - (spec["draft_full_size"] // 2) % page)
            for r in reqs:
                r["prompt_len"] = max(1, r["prompt_len"] // 2)
            if not self.attempt(f"pool.full_size and every prompt_len halved (full_size {pool['full_size']})", d):
                return

    def pass_lengths(self) -> None:
        reqs = self.data.get("workload", {}).get("request")
        if not reqs:
            return
        for i in range(len(reqs)):
            for field, floor in (("output_len", 0), ("prompt_len", 1)):
                while True:
                    cur = self.data["workload"]["request"][i][field]
                    if cur <= floor:
                        break
                    tried = False
                    for new in dict.fromkeys((floor, max(floor, cur // 2), cur - cur // 4, cur - cur // 8)):
                        if new >= cur:
                            continue
                        d = _copy(self.data)
                        d["workload"]["request"][i][field] = new
                        if self.attempt(f"request {i} {field} {cur} -> {new}", d):
                            tried = True
                            break
                    if not tried:
                        break
            if self.data["workload"]["request"][i].get("arrival_step", 0):
                d = _copy(self.data)
                d["workload"]["request"][i]["arrival_step"] = 0
                self.attempt(f"request {i} arrives at step 0", d)

    def pass_engine(self) -> None:
        eng = self.data.get("engine")
        if not eng:
            return
        # knobs back to their defaults, one at a time (a table of its own stays: speculative)
        for key in [k for k in eng if k not in ("speculative", "cuda_graph_bs")]:
            if key not in self.data.get("engine", {}):
                continue
            d = _copy(self.data)
            del d["engine"][key]
            self.attempt(f"engine.{key} -> default", d)
        # (a smaller chunked_prefill_size would only add steps: it goes back to the default or stays)
        for key, floor in (("dp_size", 1), ("max_running_requests", 1)):
            self._halve(("engine", key), floor)
        if "speculative" in self.data.get("engine", {}):
            self._halve(("engine", "speculative", "num_draft_tokens"), 2)
            self._halve(("engine", "speculative", "draft_full_size"), 2 * self._page())
            for key in ("accept_rate",):
                if key in self.data["engine"]["speculative"]:
                    d = _copy(self.data)
                    del d["engine"]["speculative"][key]
                    self.attempt(f"engine.speculative.{key} -> default", d)
        # fewer decode capture sizes
        sc = self.scenario(self.data)
        if sc.engine.cuda_graph:
            sizes = list(sc.engine.cuda_graph_bs)
            default = (speculative_decode_capture_sizes if sc.engine.speculative.enabled
                       else default_decode_capture_sizes)()

            def ok(items: list) -> bool:
                d = _copy(self.data)
                d.setdefault("engine", {})["cuda_graph_bs"] = items
                d["engine"].pop("cuda_graph_max_bs", None)
                return self.attempt(f"engine.cuda_graph_bs {_sizes(sizes)} -> {_sizes(items)}", d)

            if len(sizes) > 1 or tuple(sizes) != default:
                _shrink_list(sizes, ok, lambda items: len(items) >= 1)

    def pass_pool(self) -> None:
        page = self._page()
        if page > 1:
            d = _copy(self.data)
            d["pool"]["page_size"] = 1
            if self.attempt(f"pool.page_size {page} -> 1", d):
                page = 1
        self._halve(("pool", "full_size"), 2 * page, multiple=page)

    def pass_model(self) -> None:
        sc = self.scenario(self.data)
        w = sc.model.window
        while w > 1:
            d = _copy(self.data)
            d["model"]["window"] = w // 2
            if not self.attempt(f"model.window {w} -> {w // 2}", d):
                break
            w //= 2

    # ------------------------------------------------------------------ helpers

    def _page(self) -> int:
        return int(self.data.get("pool", {}).get("page_size", 1))

    def _halve(self, path: tuple[str, ...], floor: int, multiple: int = 1) -> None:
        while True:
            table = self.data
            for p in path[:-1]:
                table = table.get(p, {})
            cur = table.get(path[-1])
            if not isinstance(cur, int) or isinstance(cur, bool) or cur <= floor:
                return
            new = max(floor, cur // 2)
            new -= new % multiple
            if new >= cur or new < floor:
                return
            d = _copy(self.data)
            t = d
            for p in path[:-1]:
                t = t[p]
            t[path[-1]] = new
            if not self.attempt(f"{'.'.join(path)} {cur} -> {new}", d):
                return


def _shrink_list(items: list, ok: Callable[[list], bool], valid: Callable[[list], bool]) -> list:
    """Greedy delta debugging: drop chunks (halves, quarters, ... single items) while ``ok`` holds."""
    items = list(items)
    n = 2
    while items:
        chunk = max(1, -(-len(items) // n))
        for start in range(0, len(items), chunk):
            cand = items[:start] + items[start + chunk:]
            if cand and valid(cand) and ok(cand):
                items = cand
                n = max(n - 1, 2)
                break
        else:
            if chunk == 1:
                break
            n = min(n * 2, len(items))
    return items


def _copy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _copy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_copy(v) for v in d]
    return d


def _pattern(kinds: list) -> str:
    return "".join("S" if k == "swa" else "F" for k in kinds)


def _sizes(sizes: list) -> str:
    return str(sizes) if len(sizes) <= 6 else f"[{sizes[0]}, {sizes[1]}, ... {sizes[-1]}] ({len(sizes)})"


def _cpu():
    import torch

    return torch.device("cpu")


def minimize(run_dir: Path, design_spec: Optional[str] = None,
             log: Callable[[str], None] = lambda s: None) -> tuple[dict, Target, Minimizer]:
    """The minimal scenario (TOML data) for a run directory's first finding."""
    import torch

    torch.set_num_threads(1)
    data, summary, run = read_run(run_dir)
    spec = design_spec or run.get("design")
    if not spec:
        raise UsageError(f"{run_dir / 'run.json'}: no design recorded: pass --design")
    if design_spec is None and spec not in BUILTIN_DESIGNS:
        raise UsageError(f"{run_dir / 'run.json'}: design {spec!r} is not built in (a user design records only its "
                         f"name): pass --design path/to/file.py:ClassName")
    design = load_design(spec)
    data = _copy(data)
    data["design"] = spec
    data["seed"] = int(run.get("seed", summary.get("seed", data.get("seed", 0))))
    if run.get("backends"):
        data["backends"] = list(run["backends"])
    try:
        num_layers = parse_scenario(dumps(data), str(run_dir / "scenario.toml")).model.num_layers
    except ScenarioError as e:
        raise UsageError(str(e)) from None
    target = find_target(summary, run, num_layers)
    log(f"minimize: keeping {target.describe()} under {design.name}")
    m = Minimizer(data, design, target, log)
    out = m.run()
    out = _copy(out)
    name = str(out.get("name", "scenario"))
    out["name"] = name if name.endswith("-minimal") else f"{name}-minimal"
    out["description"] = (f"Minimal scenario from {run_dir}: reproduces {target.describe()} under design "
                          f"{design.name} ({m.runs} candidate runs).")
    # order the top-level keys like the shipped scenarios
    order = ["name", "description", "seed", "design", "backends", "model", "pool", "workload", "engine"]
    out = {k: out[k] for k in order if k in out} | {k: v for k, v in out.items() if k not in order}
    return out, target, m


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "minimize", help="shrink a failing run to the smallest scenario with the same finding",
        description="Take a run directory with findings (written by `slotscope run`) and search for the smallest "
                    "scenario (fewest backends, requests, layers, tokens, steps) that still gives the same finding "
                    "class at a layer of the same kind. Writes it as TOML (DIR/minimal.toml, or -o) and prints it; "
                    "progress goes to stderr.",
        epilog="exit codes: 0 minimized, 2 bad input (no run directory, no finding)\n"
               "example: slotscope run scenarios/b1-pcg-dp-padding.toml --out out/b1 && slotscope minimize out/b1",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="DIR", help="a run directory with findings")
    p.add_argument("-o", "--output", metavar="PATH", help="where to write the minimal scenario (default DIR/minimal.toml)")
    p.add_argument("--design", help="the run's design, when it was a user design (path/to/file.py:ClassName)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_minimize)


def cmd_minimize(args) -> int:
    run_dir = Path(args.run_dir)

    def log(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    data, target, m = minimize(run_dir, args.design, log)
    text = dumps(data)
    out = Path(args.output) if args.output else run_dir / "minimal.toml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    sc = parse_scenario(text, str(out))
    reqs = len(sc.workload.explicit) or sc.workload.requests
    layers = "".join("S" if k == "swa" else "F" for k in sc.model.layer_kinds)
    log(f"minimize: done in {time.perf_counter() - t0:.1f}s, {m.runs} runs: {reqs} request(s), layers {layers}, "
        f"backend {', '.join(sc.backends)}; wrote {out}")
    print(text, end="")
    return EXIT_OK
