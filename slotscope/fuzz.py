"""``slotscope fuzz --design D``: search the scenario space for a failing scenario, no scenario given.

Scenarios are drawn from a seed (:class:`Generator`, a ``random.Random`` of its own) over the whole
space: presets and explicit layer patterns, pool sizes, SWA ratios and page sizes (deployment-size
pools whose indices pass 32,767 and 65,535 too), chunked prefill, MIXED batches, DP attention sizes
and their padding (``dp_other_tokens``, ``attn_tp_size``), piecewise graphs (capture sizes, shrink or
not) and decode graphs (capture sizes), speculative decoding (draft tokens, draft layers, draft pool
sizes and ratio), the overlap timeline (WAR barrier, platform), the radix prefix cache with shared
system prompts and multi-turn conversations, and retraction (``engine.reserve = "none"``). Each draw
is TOML data written with :mod:`simulator.toml_write` and read back by ``parse_scenario``: the
scenario validator decides what is a scenario, and a draw it refuses (or that the scheduler or the
resource check refuses before the first step) is counted as rejected and never run.

Small first, growing: the size level (layers, requests, lengths, pool, steps) grows with the number
of scenarios drawn. Coverage-guided: each run's steps and summary give its *features* (forward mode x
graph runner x backend group, DP / graph padding, SWA eviction, prefix hits, the id range reached,
the knobs that shape the write path); a scenario that reached a feature not seen before joins the
pool of interesting scenarios, and half the draws mutate one of them (a few knob groups redrawn), the
others are fresh. Everything depends only on the seed and the runs' deterministic results, so the
same seed gives the same sequence of scenarios (``--max-scenarios`` bounds it for a test).

On the first failing scenario (any finding on any backend) the search stops, minimizes it with
:class:`slotscope.minimize.Minimizer` and writes into ``--out``: ``found.toml`` (the scenario as
drawn), ``minimal.toml``, ``run/`` (the minimal scenario's run: summary, findings, report.html) and
``fuzz.json`` (seed, counts, the finding, timings). Exit 1 then; 0 when the budget ran out clean;
3 on an internal error of slotscope (the scenario that triggered it is written to ``--out``).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from simulator.scenario import BACKENDS, Scenario, ScenarioError, parse_scenario
from simulator.toml_write import dumps

from .minimize import stalled
from .rundir import UsageError

EXIT_CLEAN, EXIT_FOUND, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
MAX_LEVEL = 6
PRESET_NAMES = ("gpt-oss-20b", "gpt-oss-120b", "llama4", "mimo-v2-flash", "gemma4-31b")
WINDOWS = (2, 4, 8, 16, 32, 64, 128)
PAGES = (1, 1, 1, 2, 4, 16, 16, 64)
#: the WAR barriers drawn: the design's release decides, or one that orders every scheduler write (an explicit
#: weaker one, none / loop_top / read_done_after_metadata, fails every design: it is what the W designs model)
BARRIERS = ("release", "release", "release", "release", "after_launch", "coarse")
#: backend groups: how each backend builds swa_loc (simulator/backends.py's specs)
BACKEND_GROUP = {"flashinfer": "plan", "triton": "plan-noDE", "flashattention": "plan", "trtllm_mha": "plan-slices",
                 "aiter": "translate", "xpu": "translate", "torch_native": "translate", "musa": "plan"}


def parse_budget(text: str) -> float:
    """'10m', '90s', '1h', '1.5m' or plain seconds -> seconds."""
    t = text.strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600}.get(t[-1:], None)
    num = t[:-1] if scale else t
    try:
        value = float(num) * (scale or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--budget {text!r}: give seconds or a number with s, m or h "
                                         f"(e.g. 90s, 10m)") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--budget {text!r}: must be positive")
    return value


# --------------------------------------------------------------------------- drawing scenarios

class Generator:
    """Scenario data (the TOML tables) drawn from its own seeded stream, in knob groups."""

    GROUPS = ("model", "workload", "pool", "chunking", "dp", "graphs", "speculative", "overlap", "sharing",
              "retraction")

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def fresh(self, level: int, index: int) -> dict[str, Any]:
        data: dict[str, Any] = {"name": f"fuzz-{index}", "seed": self.rng.randrange(2**31), "backends": list(BACKENDS)}
        for g in self.GROUPS:
            getattr(self, f"g_{g}")(data, level)
        return data

    def mutate(self, parent: dict[str, Any], level: int, index: int) -> dict[str, Any]:
        data = json.loads(json.dumps(parent))         # a deep copy of plain data
        data["name"], data["seed"] = f"fuzz-{index}", self.rng.randrange(2**31)
        for g in self.rng.sample(self.GROUPS, self.rng.randint(1, 3)):
            getattr(self, f"g_{g}")(data, level)
        return data

    # ---------------------------------------------------------------- groups
    def g_model(self, d: dict, level: int) -> None:
        r = self.rng
        nl = r.randint(1, 2 + level)
        if self.chance(0.4):
            d["model"] = {"preset": r.choice(PRESET_NAMES), "num_layers": nl}
            if self.chance(0.5):
                d["model"]["window"] = r.choice(WINDOWS)
        else:
            layers = "".join(r.choice("SF") for _ in range(nl))
            if "S" not in layers:
                layers = "S" + layers[1:]
            d["model"] = {"layers": layers, "window": r.choice(WINDOWS)}
        if self.chance(0.15):
            d["model"]["kv_dtype"] = r.choice(("bfloat16", "float16", "fp8_e4m3"))

    def g_workload(self, d: dict, level: int) -> None:
        r = self.rng
        n = r.randint(1, 2 + 3 * level)
        hi = r.randint(4, 16 * 2 ** level)
        w: dict[str, Any] = {"requests": n, "prompt_len": {"dist": "uniform", "min": r.randint(1, hi), "max": hi},
                             "output_len": {"dist": "uniform", "min": r.randint(0, 4), "max": r.randint(4, 8 * level + 8)}}
        if self.chance(0.5):
            w["arrival"], w["rate"] = "poisson", r.choice((0.5, 1.0, 2.0, 4.0))
        if self.chance(0.25):                      # explicit requests: one long first (high ids), then short ones
            w = self._explicit(level)
        d["workload"] = w
        self.g_pool(d, level)                      # the pool follows the load

    def _explicit(self, level: int) -> dict:
        r = self.rng
        if self.chance(0.3):                       # a deployment-size prompt: ids past 32,767 / 65,535
            first = r.choice((33000, 40000, 66000, 70000))
        else:
            first = r.randint(8, 48 * 2 ** level)
        reqs = [{"arrival_step": 0, "prompt_len": first, "output_len": r.randint(1, 6)}]
        for _ in range(r.randint(1, 2 + level)):
            reqs.append({"arrival_step": r.randint(0, 4 * level), "prompt_len": r.randint(1, 24 * level),
                         "output_len": r.randint(1, 12)})
        return {"request": reqs}

    def g_pool(self, d: dict, level: int) -> None:
        """Pools sized from the load: from tight (a few requests at a time, pools filled to the last page,
        eviction and retraction) to roomy."""
        r = self.rng
        biggest, demand = _demand(d.get("workload", {}))
        page = r.choice(PAGES)
        full = max(int(biggest * r.choice((1.05, 1.2, 1.5))) + 8, int(demand * r.choice((0.3, 0.5, 0.8, 1, 1.5, 3, 6))))
        full = max(2 * page, full + (-full) % page)
        ratio = r.choice((0.25, 0.5, 0.5, 0.8, 1.0, round(r.uniform(0.1, 1), 2)))
        if biggest > 30000:                        # one chunk: the SWA pool holds the whole deployment-size prompt
            ratio = 1.0
        d["pool"] = {"full_size": full, "swa_ratio": ratio}
        if page > 1:
            d["pool"]["page_size"] = page
        if self.chance(0.25):                      # 0.5.23's unified pool (one byte budget, virtual ids)
            d["pool"]["unified"] = True

    def g_chunking(self, d: dict, level: int) -> None:
        e = d.setdefault("engine", {})
        e["chunked_prefill_size"] = self.rng.choice((16, 32, 64, 128, 256, 1024, 8192))
        e["mixed_chunk"] = self.chance(0.35)
        if self.chance(0.2):
            e["max_running_requests"] = self.rng.randint(1, 8)
        if self.chance(0.2):
            e["swa_eviction_interval"] = self.rng.choice((1, 8, 32, 128))

    def g_dp(self, d: dict, level: int) -> None:
        e = d.setdefault("engine", {})
        for k in ("dp_size", "dp_other_tokens", "attn_tp_size"):
            e.pop(k, None)
        if self.chance(0.45):
            e["dp_size"] = self.rng.choice((2, 2, 4, 8))
            vals = sorted({self.rng.choice((0, 8, 50, 200, 400, 900, 1500)) for _ in range(3)})
            e["dp_other_tokens"] = {"dist": "choice", "values": vals}
            if self.chance(0.3):
                e["attn_tp_size"] = self.rng.choice((2, 4, 8))

    def g_graphs(self, d: dict, level: int) -> None:
        r, e = self.rng, d.setdefault("engine", {})
        for k in ("piecewise_cuda_graph", "piecewise_max_tokens", "piecewise_shrink", "cuda_graph", "cuda_graph_bs",
                  "cuda_graph_max_bs"):
            e.pop(k, None)
        e["piecewise_cuda_graph"] = self.chance(0.55)
        if e["piecewise_cuda_graph"]:
            e["piecewise_max_tokens"] = r.choice((16, 64, 256, 512, 4096))
            if self.chance(0.3):
                e["piecewise_shrink"] = False
        e["cuda_graph"] = self.chance(0.8)
        if e["cuda_graph"] and self.chance(0.7):
            e["cuda_graph_bs"] = sorted(r.sample((1, 2, 3, 4, 6, 8, 12, 16), r.randint(1, 4)))

    def g_speculative(self, d: dict, level: int) -> None:
        r, e = self.rng, d.setdefault("engine", {})
        e.pop("speculative", None)
        if not self.chance(0.3):
            return
        s: dict[str, Any] = {"num_draft_tokens": r.randint(2, 5), "accept_rate": r.choice((0.0, 0.5, 0.7, 1.0)),
                             "draft_layers": "".join(r.choice("FS") for _ in range(r.randint(1, 2)))}
        full = d.get("pool", {}).get("full_size", 512)
        page = d.get("pool", {}).get("page_size", 1)
        if self.chance(0.5):
            size = r.choice((full // 2, full - page, full // 4, full))
            s["draft_full_size"] = max(2 * page, size - size % page)
        if self.chance(0.4):
            s["draft_swa_ratio"] = r.choice((0.25, 0.5, 1.0))
        e["speculative"] = s

    def g_overlap(self, d: dict, level: int) -> None:
        e = d.setdefault("engine", {})
        for k in ("overlap", "war_barrier", "platform"):
            e.pop(k, None)
        if self.chance(0.3):
            e["overlap"] = True
            e["war_barrier"] = self.rng.choice(BARRIERS)
            if self.chance(0.35):
                e["platform"] = "rocm"

    def g_sharing(self, d: dict, level: int) -> None:
        e, w = d.setdefault("engine", {}), d.setdefault("workload", {})
        e.pop("radix_cache", None)
        e.pop("cache_linker", None)
        for k in ("system_prompts", "system_prompt_len", "share", "turns", "think_time"):
            w.pop(k, None)
        if not self.chance(0.25):
            return
        e["radix_cache"] = True
        e.pop("cache_linker", None)
        if self.chance(0.3):                       # an external cache linker (R8's trigger)
            e["cache_linker"] = True
        if "request" in w:
            return
        w["system_prompts"] = self.rng.randint(1, 3)
        w["system_prompt_len"] = {"dist": "uniform", "min": 4, "max": self.rng.randint(8, 16 * 2 ** level)}
        w["share"] = self.rng.choice((0.5, 0.8, 1.0))
        if self.chance(0.5):
            w["turns"] = {"dist": "choice", "values": [1, 2, 3]}
            w["think_time"] = {"dist": "uniform", "min": 0, "max": 4}

    def g_retraction(self, d: dict, level: int) -> None:
        e = d.setdefault("engine", {})
        e.pop("reserve", None)
        if self.chance(0.25):
            e["reserve"] = "none"


def _demand(w: dict) -> tuple[int, int]:
    """(the largest request's tokens, all requests' tokens) of drawn workload data."""
    if "request" in w:
        sizes = [q["prompt_len"] + q["output_len"] for q in w["request"]]
    else:
        one = w["prompt_len"]["max"] + w["output_len"]["max"] + w.get("system_prompt_len", {}).get("max", 0)
        sizes = [one] * w["requests"]
    return max(sizes), sum(sizes)


def fix_up(data: dict[str, Any], level: int) -> dict[str, Any]:
    """Resolve the validator's exclusions the cheap way (the second knob gives way): overlap and retraction
    run without speculative decoding, mixed chunks without speculative decoding or retraction, the unified
    pool without the radix cache, overlap or speculative decoding. A
    deployment-size prompt is prefilled in one chunk on two layers (its high ids in one forward, in seconds)."""
    e = data.get("engine", {})
    if data["pool"].get("unified") and (e.get("radix_cache") or e.get("overlap") or "speculative" in e):
        del data["pool"]["unified"]        # the unified pool runs without them yet: it gives way
    biggest, _ = _demand(data.get("workload", {}))
    if biggest > 30000:
        e["chunked_prefill_size"] = max(e.get("chunked_prefill_size", 8192), biggest)
        m = data["model"]
        if "layers" in m:
            m["layers"] = m["layers"][:2]
        else:
            m["num_layers"] = min(m.get("num_layers", 2), 2)
    if "speculative" in e and (e.get("overlap") or e.get("reserve") == "none"):
        del e["speculative"]
    spec, page = e.get("speculative", {}), data["pool"].get("page_size", 1)
    if "draft_full_size" in spec:          # drawn against an earlier pool: keep it a multiple of this one's page
        spec["draft_full_size"] = max(2 * page, spec["draft_full_size"] - spec["draft_full_size"] % page)
    if e.get("mixed_chunk") and ("speculative" in e or e.get("reserve") == "none"):
        e["mixed_chunk"] = False
    data["max_steps"] = 40 + 40 * level
    return data


def draw_scenario(data: dict[str, Any], design: str) -> Optional[Scenario]:
    """The drawn data as a validated scenario, or None when the validator refuses it."""
    data = dict(data, design=design)
    try:
        return parse_scenario(dumps(data), f"{data['name']}.toml")
    except ScenarioError:
        return None


# --------------------------------------------------------------------------- coverage

def features(sc: Scenario, steps, radix: Optional[dict]) -> set[tuple]:
    """What a run reached: combinations of the steps' modes and graph runners with the backend groups, the
    padding, eviction, sharing and the id range, and the knobs that shape the write path."""
    e = sc.engine
    groups = sorted({BACKEND_GROUP.get(b, b) for b in sc.backends})
    knobs = ("unified" if sc.pool.unified else "page>1" if sc.pool.page_size > 1 else "page1", "spec" if e.speculative.enabled else "-",
             f"overlap:{e.war_barrier}:{e.platform}" if e.overlap else "-", "noshrink" if not e.piecewise_shrink else "-",
             "retract" if e.reserve == "none" else "-", "radix" if e.radix_cache else "-")
    out: set[tuple] = {("knobs",) + knobs}
    top = 0
    for s in steps:
        pad = ("dp" if s.dp_padded_tokens > s.real_tokens else "") + ("graph" if s.padded_tokens > s.dp_padded_tokens else "")
        evict = "evicted" if s.swa_used < s.full_used else "-"
        for g in groups:
            out.add(("path", s.mode, s.graph, g, pad or "-"))
        out.add(("mode-knobs", s.mode, s.graph) + knobs)
        out.add(("evict", s.mode, evict, knobs[0]))
        top = max(top, s.full_used)
    out.add(("ids", "past-65535" if top > 65535 else "past-32767" if top > 32767 else f"2^{max(top, 1).bit_length()}"))
    if radix:
        out.add(("sharing", "hits" if radix.get("hit_tokens") else "no-hits",
                 "tombstones" if radix.get("tombstones") else "-", "evicted" if radix.get("evicted_leaves") else "-"))
    return out


# --------------------------------------------------------------------------- running

class _Found(Exception):
    def __init__(self, finding):
        self.finding = finding


class _StopAtFirst:
    """A run observer that ends the run at its first finding (the fuzzer needs one)."""

    def on_run_start(self, run) -> None: pass
    def on_step(self, step) -> None: pass
    def on_boundary(self, *args) -> None: pass
    def on_run_end(self) -> None: pass

    def on_findings(self, findings) -> None:
        if findings:
            raise _Found(findings[0])


@dataclass
class Outcome:
    status: str                                   # "clean" | "found" | "rejected"
    finding: Any = None
    steps: list = field(default_factory=list)
    radix: Optional[dict] = None


def run_one(sc: Scenario, engine: Optional[str]) -> Outcome:
    """One scenario in-process on the CPU, no outputs; stopped at the first finding."""
    from .pipeline import RunOptions, run_scenario

    opts = RunOptions(device="cpu", trace_level="off", report=False, engine=engine, quiet_engine=True,
                      extra_observers=(_StopAtFirst(),))
    try:
        out = run_scenario(sc, None, opts)
    except _Found as f:
        return Outcome("found", f.finding)
    except (ScenarioError, UsageError):
        return Outcome("rejected")
    except RuntimeError as e:
        if stalled(e):     # pools too small for any request (a dummy request's page): a draw that cannot run
            return Outcome("rejected")
        raise
    return Outcome("clean", None, out.result.steps, out.result.radix)


# --------------------------------------------------------------------------- the search

@dataclass
class FuzzResult:
    status: str                                   # "clean" | "found" | "internal"
    tried: int
    rejected: int
    elapsed_s: float
    coverage: int
    hashes: list[str]
    scenario: Optional[Scenario] = None           # the failing one, as drawn
    finding: Any = None
    error: Optional[str] = None
    shared: int = 0                               # --against: failures the reference design showed too


class Fuzzer:
    def __init__(self, design: str, seed: int, engine: Optional[str] = None,
                 log: Callable[[str], None] = lambda s: None, progress_s: float = 5.0, against: Optional[str] = None):
        self.design, self.seed, self.engine, self.log, self.progress_s = design, seed, engine, log, progress_s
        self.against = against              # a reference design: a failure counts only where it is clean
        self.shared = 0                     # failures the reference design shows too (not the design's own)
        self.gen = Generator(seed)
        self.seen: set[tuple] = set()
        self.interesting: list[dict] = []
        self.tried = self.rejected = 0
        self.hashes: list[str] = []

    def level(self) -> int:
        """1 for the first 8 draws, then one more each time the count doubles, up to MAX_LEVEL."""
        return min(MAX_LEVEL, 1 + (self.tried + self.rejected + 8).bit_length() - 4)

    def next_data(self) -> dict:
        i, level = self.tried + self.rejected, self.level()
        if self.interesting and self.gen.chance(0.5):
            # prefer recent finds (they reached the newest combinations)
            k = len(self.interesting) - 1 - min(int(self.gen.rng.expovariate(0.3)), len(self.interesting) - 1)
            return fix_up(self.gen.mutate(self.interesting[k], level, i), level)
        return fix_up(self.gen.fresh(level, i), level)

    def run(self, budget_s: float, max_scenarios: Optional[int] = None) -> FuzzResult:
        t0 = last = time.perf_counter()
        while time.perf_counter() - t0 < budget_s and (max_scenarios is None or self.tried < max_scenarios):
            data = self.next_data()
            sc = draw_scenario(data, self.design)
            if sc is None:
                self.rejected += 1
                continue
            try:
                out = run_one(sc, self.engine)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:     # slotscope itself failed on a valid scenario
                err = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                return self._result("internal", t0, sc, error=err)
            if out.status == "rejected":
                self.rejected += 1
                continue
            self.tried += 1
            self.hashes.append(sc.hash)
            if out.status == "found" and not self.shared_failure(sc):
                return self._result("found", t0, sc, out.finding)
            new = features(sc, out.steps, out.radix) - self.seen
            if new:
                self.seen |= new
                self.interesting.append(data)
            if time.perf_counter() - last >= self.progress_s:
                last = time.perf_counter()
                self.log(self.progress_line(last - t0))
        return self._result("clean", t0)

    def shared_failure(self, sc: Scenario) -> bool:
        """With --against: whether the reference design fails the same scenario (then it is not this design's)."""
        if self.against is None:
            return False
        if run_one(replace(sc, design=self.against), None).status != "found":
            return False
        self.shared += 1
        return True

    def progress_line(self, elapsed: float) -> str:
        paths = sorted({f"{f[1]}/{f[2]}" for f in self.seen if f[0] == "path"})
        return (f"fuzz: {self.tried} scenarios in {elapsed:.0f}s ({self.tried / max(elapsed, 1e-9):.2f}/s), "
                f"{self.rejected} rejected, " + (f"{self.shared} failing under {self.against} too, " if self.against else "")
                + f"level {self.level()}, coverage {len(self.seen)} combinations; "
                f"mode/graph: {', '.join(paths)}")

    def _result(self, status: str, t0: float, sc: Optional[Scenario] = None, finding=None,
                error: Optional[str] = None) -> FuzzResult:
        return FuzzResult(status, self.tried, self.rejected, time.perf_counter() - t0, len(self.seen),
                          list(self.hashes), sc, finding, error, self.shared)


# --------------------------------------------------------------------------- on a failure

def target_of(sc: Scenario, finding):
    """The minimizer's target: the finding's class, layer kind and model side, on its backend."""
    from .minimize import Target

    if finding.layer < 0:
        return Target(finding.cls, None, None, finding.backend)
    return Target(finding.cls, finding.kind, finding.layer >= sc.model.num_layers, finding.backend)


def minimize_found(sc: Scenario, finding, log: Callable[[str], None]) -> tuple[Scenario, int]:
    """The smallest scenario that still shows the finding (slotscope/minimize.py's search)."""
    from simulator.designs import load_design

    from .minimize import Minimizer

    m = Minimizer(sc, load_design(sc.design), target_of(sc, finding), log)   # a candidate that stalls: rejected
    out = m.run()
    return replace(out, name=f"{sc.name}-minimal",
                   description=f"Found by slotscope fuzz and minimized: {m.target.describe()} under design "
                               f"{sc.design} ({m.runs} candidate runs)."), m.runs


def write_found(res: FuzzResult, out_dir: Path, engine: Optional[str], log: Callable[[str], None],
                against: Optional[str] = None) -> dict:
    """found.toml, minimal.toml, run/ (the minimal scenario's run and report) and fuzz.json."""
    from .pipeline import RunOptions, run_scenario

    out_dir.mkdir(parents=True, exist_ok=True)
    sc, f = res.scenario, res.finding
    (out_dir / "found.toml").write_text(sc.to_toml(defaults=False))
    t0 = time.perf_counter()
    minimal, runs = (sc, 0) if engine else minimize_found(sc, f, log)
    (out_dir / "minimal.toml").write_text(minimal.to_toml(defaults=False))
    back = parse_scenario(minimal.to_toml(defaults=False), str(out_dir / "minimal.toml"))
    run = run_scenario(back, out_dir / "run", RunOptions(device="cpu", engine=engine, quiet_engine=True))
    info = {"status": "found", "design": sc.design, "engine": engine, "tried": res.tried, "rejected": res.rejected,
            "found_after_s": round(res.elapsed_s, 2), "minimize_s": round(time.perf_counter() - t0, 2),
            "minimize_runs": runs, "coverage": res.coverage, "scenario_hash": sc.hash,
            "finding": {"class": f.cls, "backend": f.backend, "step": f.step, "layer": f.layer, "kind": f.kind,
                        "message": f.message},
            "minimal_findings_total": run.summary["findings_total"]}
    if against is not None:
        info["against"] = against
        info["shared_with_against"] = res.shared
        info["against_on_minimal"] = run_one(replace(back, design=against), None).status
    (out_dir / "fuzz.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def fuzz(design: str, *, seed: int = 0, budget_s: float = 600.0, engine: Optional[str] = None,
         max_scenarios: Optional[int] = None, log: Callable[[str], None] = lambda s: None,
         progress_s: float = 5.0, against: Optional[str] = None) -> FuzzResult:
    """Search until the first failing scenario or the end of the budget (no outputs written)."""
    import torch

    from simulator.designs import load_design

    torch.set_num_threads(1)
    load_design(design)                  # a bad --design is bad input before anything runs
    if against is not None:
        load_design(against)
    return Fuzzer(design, seed, engine, log, progress_s, against).run(budget_s, max_scenarios)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fuzz", help="search the scenario space for a scenario that makes a design fail",
        description="Draw scenarios from a seed over the whole space (models, pools, pages, every forward mode, DP "
                    "padding, piecewise and decode graphs, speculative decoding, the overlap timeline, prefix "
                    "sharing, retraction), small first and growing, preferring those that reach combinations not "
                    "seen yet. On the first failure: minimize it and write found.toml, minimal.toml, run/ (its run "
                    "and report.html) and fuzz.json into --out. Progress on stderr.",
        epilog="exit codes: 0 the budget ran out clean, 1 a failing scenario was found, 2 bad input,\n"
               "            3 internal error of slotscope (the scenario is written to --out)\n"
               "example: slotscope fuzz --design sglang-pre-24743 --budget 2m --seed 1 --out out/fuzz-b2",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--design", required=True, help="a built-in design or path/to/file.py:ClassName")
    p.add_argument("--engine", help="sglang or sglang==VERSION: the real release in the write path")
    p.add_argument("--budget", type=parse_budget, default=600.0, metavar="TIME",
                   help="how long to search: 90s, 10m, 1h (default 10m)")
    p.add_argument("--seed", type=int, default=0, help="the search's seed (same seed, same scenarios)")
    p.add_argument("--out", metavar="DIR", help="where a failure goes (default out/fuzz-<design>)")
    p.add_argument("--against", metavar="DESIGN",
                   help="a reference design: count a failure only where it runs clean (e.g. the design yours "
                        "started from: a bug they share, like W7 on ROCm, is not yours)")
    p.add_argument("--max-scenarios", type=int, metavar="N", help="stop after N scenarios run")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_fuzz)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(text.split(":")[-1]).name)


def cmd_fuzz(args) -> int:
    def log(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    engine = None
    if args.engine:
        from .engine_run import engine_spec

        engine = str(engine_spec(args.engine))
    out_dir = Path(args.out or f"out/fuzz-{_slug(args.design)}")
    log(f"fuzz: design {args.design}, seed {args.seed}, budget {args.budget:.0f}s")
    res = fuzz(args.design, seed=args.seed, budget_s=args.budget, engine=engine, max_scenarios=args.max_scenarios,
               log=log, against=args.against)
    log(f"fuzz: {res.status}: {res.tried} scenarios run, {res.rejected} rejected, {res.elapsed_s:.1f}s, "
        f"coverage {res.coverage} combinations")
    if res.status == "internal":
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "internal-error.toml").write_text(res.scenario.to_toml(defaults=False))
        sys.stderr.write(res.error or "")
        log(f"slotscope: error: internal error of slotscope on a valid scenario; it is in "
            f"{out_dir / 'internal-error.toml'} (rerun: slotscope run {out_dir / 'internal-error.toml'})")
        return EXIT_INTERNAL
    if res.status == "clean":
        return EXIT_CLEAN
    f = res.finding
    log(f"fuzz: FOUND after {res.elapsed_s:.1f}s ({res.tried} scenarios): {f.cls} on {f.backend} at step {f.step}, "
        f"layer {f.layer} ({f.kind}); minimizing")
    from .minimize import InternalError

    try:
        info = write_found(res, out_dir, engine, log, args.against)
    except InternalError as e:
        (out_dir / "minimize-error.toml").write_text(e.candidate.to_toml(defaults=False))
        sys.stderr.write(e.trace)
        log(f"slotscope: error: internal error of slotscope while minimizing: {e}; the failing scenario is in "
            f"{out_dir / 'found.toml'}, the candidate that triggered the error in {out_dir / 'minimize-error.toml'}")
        return EXIT_INTERNAL
    log(f"fuzz: wrote {out_dir}/found.toml, minimal.toml, run/report.html, fuzz.json "
        f"(minimized in {info['minimize_s']}s)")
    print((out_dir / "minimal.toml").read_text(), end="")
    return EXIT_FOUND
