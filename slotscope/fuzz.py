"""``slotscope fuzz --design D``: search the scenario space for a failing scenario, no scenario given.

Scenarios are drawn from a seed (:class:`Generator`, a ``random.Random`` of its own) over the whole
space: presets and explicit layer patterns, pool sizes, SWA ratios and page sizes (deployment-size
pools whose indices pass 32,767 and 65,535 too), chunked prefill, MIXED batches, DP attention sizes
and their padding (``dp_other_tokens``, ``attn_tp_size``), piecewise graphs (capture sizes, shrink or
not) and decode graphs (capture sizes), speculative decoding (draft tokens, draft layers, draft pool
sizes and ratio), the overlap timeline (WAR barrier, platform), the radix prefix cache with shared
system prompts and multi-turn conversations, and retraction (``engine.reserve = "none"``); fill loads
whose pools are sized to take every page of the full or the SWA pool (:func:`fit_fill`), and knobs of
different groups coupled where they only act together (:meth:`Generator.couple`). Each draw
is TOML data written with :mod:`simulator.scenario.toml_write` and read back by ``parse_scenario``: the
scenario validator decides what is a scenario, and a draw it refuses (or that the scheduler or the
resource check refuses before the first step) is counted as rejected and never run.

Small first, growing: the size level (layers, requests, lengths, pool, steps) grows with the number
of scenarios drawn. Coverage-guided: each run's steps and summary give its *features* (forward mode x
graph runner x backend group, DP / graph padding, SWA eviction, pools taken to their last page with
the draft's geometry, prefix hits, the id range reached, the knobs that shape the write path); a scenario that reached a feature not seen before joins the
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

from engine_path.releases import EngineSpec
from simulator.scenario.models import PRESETS
from simulator.scenario import BACKENDS, Scenario, ScenarioError, parse_scenario
from simulator.scenario.toml_write import dumps

from .minimize import stalled
from .rundir import UsageError

EXIT_CLEAN, EXIT_FOUND, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
MAX_LEVEL = 6
PRESET_NAMES = ("gpt-oss-20b", "gpt-oss-120b", "llama4", "mimo-v2-flash", "gemma4-31b")
WINDOWS = (2, 4, 8, 16, 32, 64, 128)
PAGES = (1, 1, 1, 2, 4, 16, 16, 64)
#: the pools a fill load takes to their last slot (Generator._fill_load, fit_fill)
FILLS = ("full", "swa", "both")
#: the draft's full pool as configured, a share of the target's (SGLang's draft pools are sized on their own)
DRAFT_SHARES = ("half", "page-short", "quarter", "same")
#: the WAR barriers drawn: the design's release decides, or one that orders every scheduler write (an explicit
#: weaker one, none / loop_top / read_done_after_metadata, fails every design: it is what the W designs model)
BARRIERS = ("release", "release", "release", "release", "after_launch", "coarse")
#: backend groups: how each backend builds swa_loc (simulator/engine_model/backends.py's specs)
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
        self.couple(data)
        return data

    def mutate(self, parent: dict[str, Any], level: int, index: int) -> dict[str, Any]:
        data = json.loads(json.dumps(parent))         # a deep copy of plain data
        data["name"], data["seed"] = f"fuzz-{index}", self.rng.randrange(2**31)
        for g in self.rng.sample(self.GROUPS, self.rng.randint(1, 3)):
            getattr(self, f"g_{g}")(data, level)
        self.couple(data)
        return data

    def couple(self, d: dict) -> None:
        """Knobs of different groups drawn to meet, half the time, where they only act together: DP padding
        that the piecewise graphs still capture (every rank's count within the largest capture size, prefill
        chunks too), MIXED batches with requests that arrive while others decode, and a speculative fill load
        on a paged pool (where its pages can all be taken)."""
        r, e, w = self.rng, d.get("engine", {}), d.get("workload", {})
        if e.get("piecewise_cuda_graph") and self.chance(0.5):
            top = e["piecewise_max_tokens"]
            e["chunked_prefill_size"] = min(e.get("chunked_prefill_size", 8192), top)
            if e.get("dp_size", 1) > 1:
                e["dp_other_tokens"] = {"dist": "choice",
                                        "values": sorted({r.choice((0, top // 8, top // 4, top // 2, top))
                                                          for _ in range(3)})}
        if e.get("mixed_chunk") and "request" not in w and w.get("arrival") != "poisson" and self.chance(0.5):
            w["arrival"], w["rate"] = "poisson", r.choice((0.5, 1.0, 2.0))
        if d.get("_fill") and "speculative" in e and self.chance(0.5):
            # a speculative request writes 1..3 slots fewer than the scheduler reserves: a page absorbs that
            d["pool"]["page_size"] = r.choice((4, 16, 16, 64))

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
            d["model"]["kv_dtype"] = r.choice(("bf16", "fp16", "fp8_e4m3"))

    def g_workload(self, d: dict, level: int) -> None:
        r = self.rng
        n = r.randint(1, 2 + 3 * level)
        hi = r.randint(4, 16 * 2 ** level)
        w: dict[str, Any] = {"requests": n, "prompt_len": {"dist": "uniform", "min": r.randint(1, hi), "max": hi},
                             "output_len": {"dist": "uniform", "min": r.randint(0, 4), "max": r.randint(4, 8 * level + 8)}}
        if self.chance(0.5):
            w["arrival"], w["rate"] = "poisson", r.choice((0.5, 1.0, 2.0, 4.0))
        d.pop("_fill", None)
        if self.chance(0.25):                      # explicit requests: one long first (high ids), then short ones
            w = self._explicit(level)
        elif self.chance(0.25):                    # a load that takes every slot of a pool (fix_up sizes the pool)
            w = self._fill_load(d, level)
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

    def _fill_load(self, d: dict, level: int) -> dict:
        """Explicit requests for a pool that the load fills to its last slot (``d["_fill"]`` says which pool;
        :func:`fit_fill` sizes the pool to the load once every group is drawn): one long request that takes
        every slot of the full pool ("full"), a wave of short ones arriving together that takes every slot of
        the SWA pool ("swa"), or the long one and then the wave ("both"), maybe with a later wave that
        reuses the pages the frees shuffled."""
        r = self.rng
        kind = r.choice(FILLS)
        reqs = []
        if kind != "swa":
            reqs.append({"arrival_step": 0, "prompt_len": r.randint(16, 48 * 2 ** level), "output_len": r.randint(2, 12)})
        if kind != "full":
            short = r.randint(2, 24)
            for _ in range(r.randint(2, 3 + 2 * level)):
                reqs.append({"arrival_step": 0 if kind == "swa" else 1, "prompt_len": max(1, short - r.randint(0, 2)),
                             "output_len": r.randint(1, 8)})
        for _ in range(r.choice((0, 1, 2) if kind == "full" else (1, 2))):   # later: through the freed pages
            reqs.append({"arrival_step": r.randint(8, 40 * level), "prompt_len": r.randint(8, 48 * level),
                         "output_len": r.randint(1, 8)})
        d["_fill"] = kind
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
        if not self.chance(0.4):
            return
        s: dict[str, Any] = {"num_draft_tokens": r.randint(2, 5), "accept_rate": r.choice((0.0, 0.5, 0.7, 1.0)),
                             "draft_layers": "".join(r.choice("FS") for _ in range(r.randint(1, 2)))}
        d.pop("_draft_share", None)
        if self.chance(0.5):               # the draft's full pool configured as a share of the target's (fix_up)
            d["_draft_share"] = r.choice(DRAFT_SHARES)
            s["draft_full_size"] = 0
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
        e.pop("pd_decode", None)
        for k in ("system_prompts", "system_prompt_len", "share", "turns", "think_time"):
            w.pop(k, None)
        if not self.chance(0.25):
            if self.chance(0.2):                   # a PD decode node: the prompts' KV transferred, a chunk cache
                e["pd_decode"] = True
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
    """Resolve the validator's exclusions the cheap way (one knob gives way): overlap and retraction run
    without speculative decoding (which of the two gives way: the draw's seed decides), mixed chunks without
    speculative decoding or retraction, the unified pool without the radix cache, overlap or speculative
    decoding, the radix cache without speculative decoding or overlap; a PD decode node (``pd_decode``) on a
    paged pool without overlap, retraction, MIXED batches, the unified pool or the radix cache (they give
    way). A deployment-size prompt is prefilled in one chunk on two layers (its high ids in one forward, in
    seconds). A fill load's pools are sized to it (:func:`fit_fill`) and it gets the steps to run to its end."""
    e, pool = data.get("engine", {}), data["pool"]
    if e.get("pd_decode"):                 # a decode node: its paged allocator, whole requests, no prefill chunks
        for k in ("overlap", "war_barrier", "platform", "reserve", "radix_cache", "cache_linker"):
            e.pop(k, None)
        pool.pop("unified", None)
        e["mixed_chunk"] = False
        if pool.get("page_size", 1) < 2:
            pool["page_size"] = 16
            pool["full_size"] = max(32, pool["full_size"] + (-pool["full_size"]) % 16)
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
        if data["seed"] % 2:               # half the time overlap and retraction give way to speculative decoding
            for k in ("overlap", "war_barrier", "platform", "reserve"):
                e.pop(k, None)
        else:
            del e["speculative"]
    if e.get("radix_cache") and ("speculative" in e or e.get("overlap")):
        e.pop("radix_cache")                # the radix cache runs without them yet: it gives way
        e.pop("cache_linker", None)
    fit_fill(data)
    spec, page = e.get("speculative", {}), data["pool"].get("page_size", 1)
    if "draft_full_size" in spec:          # the drawn share of this pool, a multiple of its page
        full = data["pool"]["full_size"]
        size = {"half": full // 2, "page-short": full - page, "quarter": full // 4}.get(data.get("_draft_share"), full)
        spec["draft_full_size"] = max(2 * page, size - size % page)
    if e.get("mixed_chunk") and ("speculative" in e or e.get("reserve") == "none"):
        e["mixed_chunk"] = False
    data["max_steps"] = 40 + 40 * level
    if "_fill" in data and "request" in data.get("workload", {}):     # every request (the later waves too)
        chunk, per = e.get("chunked_prefill_size", 8192), spec.get("num_draft_tokens", 0) + 1
        need = sum(-(-q["prompt_len"] // chunk) + q["output_len"] * per for q in data["workload"]["request"])
        data["max_steps"] = max(data["max_steps"], min(600, need + max(q["arrival_step"] for q in data["workload"]["request"])))
    return data


def _window(model: dict) -> int:
    return model.get("window") or PRESETS[model["preset"]].window


def _ratio_for(swa: int, full: int, page: int) -> float:
    """The ``swa_ratio`` that gives an SWA pool of exactly ``swa`` slots (a multiple of the page) next to a
    full pool of ``full`` (PoolConfig.swa_size: the product rounded down, then down to a page)."""
    if swa >= full:
        return 1.0
    for r in (round((swa + 0.5) / full, 6), round((swa + page / 2) / full, 6), swa / full):
        size = int(full * r)
        if size - size % page == swa and 0 < r <= 1:
            return r
    return round(swa / full, 6)


def fit_fill(data: dict[str, Any]) -> None:
    """Size the pools of a fill load (``data["_fill"]``, Generator._fill_load) to the load once every knob is
    drawn: each request's tokens (with the speculative or overlap extra the scheduler reserves) end at a page
    boundary, the full pool holds exactly the long request ("full", "both"), the SWA pool exactly the wave of
    short ones that arrive together ("swa", "both"; the full pool 1, 2 or 4 times it for "swa"), and a later
    request too long for the pools is dropped."""
    kind, w = data.get("_fill"), data.get("workload", {})
    if kind is None or "request" not in w:
        return
    e, pool = data.setdefault("engine", {}), data["pool"]
    pool.pop("unified", None)
    e.pop("max_running_requests", None)            # the wave is admitted together
    page, spec = pool.get("page_size", 1), e.get("speculative")
    x = (spec["num_draft_tokens"] if spec else 0) + (1 if e.get("overlap") else 0)
    reqs, first_wave = w["request"], 0 if kind == "swa" else 1
    cap = _window(data["model"]) // page * page    # a wave request within the window holds all its SWA slots
    _shape_wave(reqs, kind, first_wave, page, x, cap)
    _shape_later(reqs, first_wave, page, x, cap)
    total = [q["prompt_len"] + q["output_len"] + x for q in reqs]
    if kind != "swa" and data["seed"] % 4:        # the long request prefilled in chunks: it holds a window's SWA
        e["chunked_prefill_size"] = min(e.get("chunked_prefill_size", 8192),
                                        max(16, 1 << ((reqs[0]["prompt_len"] // 2).bit_length() - 1)))
    wave = sum(t for q, t in zip(reqs, total) if q["arrival_step"] == first_wave)
    chunk = e.get("chunked_prefill_size", 8192) * (2 if e.get("overlap") else 1)
    bound = 2 * _window(data["model"]) + max(chunk, e.get("swa_eviction_interval", 1) + 2) + 2 * page + 2 * x + 2
    def hold(t: int) -> int:                       # the SWA slots admission reserves for a request of t tokens
        return min(t, -(-bound // page) * page)

    if kind == "full":
        full = total[0]
        drawn = int(full * pool.get("swa_ratio", 0.8))
        swa = max(hold(full), min(full, drawn - drawn % page))
    elif kind == "swa":
        full, swa = wave * (1, 2, 4)[data["seed"] % 3], wave
    else:
        waves = [i for i, q in enumerate(reqs) if q["arrival_step"] == first_wave and i > 0]
        while waves and wave < hold(total[0]) and len(reqs) < 64:    # the wave takes the SWA pool the long needs
            reqs.append(dict(reqs[waves[-1]]))
            total.append(total[waves[-1]])
            wave += total[-1]
        swa = max(wave, hold(total[0]))
        full = max(total[0], swa)
    w["request"] = [q for q, t in zip(reqs, total) if t <= full and hold(t) <= swa]
    pool["full_size"], pool["swa_ratio"] = full, _ratio_for(swa, full, page)


def _shape_wave(reqs: list[dict], kind: str, first_wave: int, page: int, x: int, cap: int) -> None:
    """fit_fill's wave: each request of the first wave (all of it for "swa", but the long first request
    otherwise) within the window where it allows, and ending at a page boundary (every request does)."""
    for q in reqs:
        in_wave = q["arrival_step"] == first_wave and (kind == "swa" or q is not reqs[0])
        if in_wave and cap >= x + 2:
            q["prompt_len"] = max(1, min(q["prompt_len"], cap - x - q["output_len"]))
            q["output_len"] = min(q["output_len"], cap - x - q["prompt_len"])
        if in_wave and page > x + 1:
            # the decode fits the prompt's last page: the wave takes all its pages while it prefills, before
            # any of it finishes (the pool's last page with them)
            q["output_len"] = max(1, min(q["output_len"], page - 1 - x))
            q["prompt_len"] += (-(q["prompt_len"] + q["output_len"] + x)) % page
        q["output_len"] += (-(q["prompt_len"] + q["output_len"] + x)) % page   # ends at a page boundary


def _shape_later(reqs: list[dict], first_wave: int, page: int, x: int, cap: int) -> None:
    """fit_fill's later requests: each longer than the wave's longest by a page, ending at a page boundary."""
    longest = max([q["prompt_len"] + q["output_len"] + x for q in reqs if q["arrival_step"] == first_wave] + [0])
    for q in reqs:
        if q["arrival_step"] > first_wave:
            # a later request gets the wave's freed pages and more: the pool's last page in its middle, where
            # all of that page is written (within the window where it allows: no eviction hands its own
            # pages back first)
            if longest + page + x + 1 <= cap:
                q["prompt_len"] = min(q["prompt_len"], cap - x - q["output_len"])
            q["prompt_len"] = max(q["prompt_len"], longest + page)
            q["output_len"] = max(1, min(q["output_len"], cap - x - q["prompt_len"]))
            q["output_len"] += (-(q["prompt_len"] + q["output_len"] + x)) % page


def draw_scenario(data: dict[str, Any], design: str) -> Optional[Scenario]:
    """The drawn data as a validated scenario, or None when the validator refuses it."""
    data = {k: v for k, v in data.items() if not k.startswith("_")}     # the generator's own notes
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
             "retract" if e.reserve == "none" else "-", "radix" if e.radix_cache else "pd" if e.pd_decode else "-")
    out: set[tuple] = {("knobs",) + knobs}
    top, full_last, swa_last = 0, False, False
    for s in steps:
        pad = ("dp" if s.dp_padded_tokens > s.real_tokens else "") + ("graph" if s.padded_tokens > s.dp_padded_tokens else "")
        evict = "evicted" if s.swa_used < s.full_used else "-"
        for g in groups:
            out.add(("path", s.mode, s.graph, g, pad or "-"))
        out.add(("mode-knobs", s.mode, s.graph) + knobs)
        out.add(("pad-knobs", s.mode, s.graph, pad or "-", knobs[0]))
        out.add(("evict", s.mode, evict, knobs[0]))
        top = max(top, s.full_used)
        full_last, swa_last = full_last or s.full_used >= s.full_size, swa_last or s.swa_used >= s.swa_size
    out.add(("fill", "full-last-page" if full_last else "-", "swa-last-page" if swa_last else "-", knobs[0],
             _draft_geometry(sc)))
    out.add(("ids", "past-65535" if top > 65535 else "past-32767" if top > 32767 else f"2^{max(top, 1).bit_length()}"))
    if radix:
        out.add(("sharing", "hits" if radix.get("hit_tokens") else "no-hits",
                 "tombstones" if radix.get("tombstones") else "-", "evicted" if radix.get("evicted_leaves") else "-"))
    return out


def _draft_geometry(sc: Scenario) -> str:
    """The draft model's layer kinds and whether its pools are configured smaller than the target's."""
    spec = sc.engine.speculative
    if not spec.enabled:
        return "-"
    own = spec.draft_pool(sc.pool)
    smaller = own.full_size < sc.pool.full_size or own.swa_size < sc.pool.swa_size
    return "draft:" + "+".join(sorted(set(spec.draft_layers))) + (":smaller" if smaller else "")


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


def run_one(sc: Scenario, engine: Optional[EngineSpec]) -> Outcome:
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
    def __init__(self, design: str, seed: int, engine: Optional[EngineSpec] = None,
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
    from simulator.designs.loading import load_design

    from .minimize import Minimizer

    m = Minimizer(sc, load_design(sc.design), target_of(sc, finding), log)   # a candidate that stalls: rejected
    out = m.run()
    return replace(out, name=f"{sc.name}-minimal",
                   description=f"Found by slotscope fuzz and minimized: {m.target.describe()} under design "
                               f"{sc.design} ({m.runs} candidate runs)."), m.runs


def write_found(res: FuzzResult, out_dir: Path, engine: Optional[EngineSpec], log: Callable[[str], None],
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
    info = {"status": "found", "design": sc.design, "engine": None if engine is None else str(engine), "tried": res.tried, "rejected": res.rejected,
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


def fuzz(design: str, *, seed: int = 0, budget_s: float = 600.0, engine: Optional[EngineSpec] = None,
         max_scenarios: Optional[int] = None, log: Callable[[str], None] = lambda s: None,
         progress_s: float = 5.0, against: Optional[str] = None) -> FuzzResult:
    """Search until the first failing scenario or the end of the budget (no outputs written)."""
    import torch

    from simulator.designs.loading import load_design

    torch.set_num_threads(1)
    load_design(design)                  # a bad --design is bad input before anything runs
    if against is not None:
        load_design(against)
    return Fuzzer(design, seed, engine, log, progress_s, against).run(budget_s, max_scenarios)


def register(subparsers: Any) -> None:
    from .options import add_engine_option

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
    add_engine_option(p, help="sglang or sglang==VERSION: the real release in the write path of every scenario "
                              "drawn (default: none, the design's model)")
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

    engine = args.engine
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
