"""The space ``slotscope fuzz`` draws from: scenario data drawn from a seed, in knob groups, made valid.

:class:`Generator` draws TOML data (a ``random.Random`` of its own, so a seed gives the same draws): presets and
explicit layer patterns, pool sizes, SWA ratios and page sizes (deployment-size pools whose indices pass 32,767
and 65,535 too), chunked prefill, MIXED batches, DP attention sizes and their padding, piecewise and decode
graphs, speculative decoding and its draft pools, the overlap timeline, the radix prefix cache and a PD decode
node, and retraction; knobs of different groups coupled where they only act together (:meth:`Generator.couple`).
:func:`fix_up` resolves the validator's exclusions the cheap way and :func:`fit_fill` sizes a fill load's pools
to take every page; :func:`draw_scenario` hands the data to ``parse_scenario``, which decides what is a scenario.
"""
from __future__ import annotations

import json
import random
from typing import Any, Optional

from simulator.scenario import BACKENDS, Scenario, ScenarioError, parse_scenario
from simulator.scenario.models import PRESETS
from simulator.scenario.toml_write import dumps

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
#: the paths of issue 29 point 7 drawn together (Generator.recipe; scenarios/cover-*.toml ship one of each)
RECIPES = ("overlap-mixed-dp-pcg-paged", "overlap-retract", "dp-attn-tp-eager", "radix-paged", "unified-dp-pcg-mixed")
#: the share of draws that take a recipe: fresh ones, and mutations (which redraw the knobs a recipe sets)
RECIPE_FRESH, RECIPE_MUTATE = 0.2, 0.1


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
        if self.chance(RECIPE_FRESH):
            self.recipe(data, level)
        self.couple(data)
        return data

    def mutate(self, parent: dict[str, Any], level: int, index: int) -> dict[str, Any]:
        data = json.loads(json.dumps(parent))         # a deep copy of plain data
        data["name"], data["seed"] = f"fuzz-{index}", self.rng.randrange(2**31)
        for g in self.rng.sample(self.GROUPS, self.rng.randint(1, 3)):
            getattr(self, f"g_{g}")(data, level)
        if self.chance(RECIPE_MUTATE):
            self.recipe(data, level)
        self.couple(data)
        return data

    def recipe(self, d: dict, level: int) -> None:
        """Knobs of several groups set together for one of the paths of issue 29 point 7 (:data:`RECIPES`), which
        independent draws reach only rarely: the overlap scheduler with MIXED batches, DP padding, piecewise graphs
        and a paged pool; retraction under the overlap scheduler on a tight pool; DP attention with attn_tp_size >
        1 and eager (not piecewise) prefills; the radix cache on a paged pool; the unified pool with DP padding,
        piecewise graphs and MIXED batches. The knobs the path does not take are cleared (fix_up would drop them)."""
        r, name = self.rng, self.rng.choice(RECIPES)
        e, pool = d.setdefault("engine", {}), d["pool"]
        for k in ("speculative", "pd_decode", "radix_cache", "cache_linker", "overlap", "war_barrier", "platform",
                  "reserve"):
            e.pop(k, None)
        pool.pop("unified", None)
        d.pop("_fill", None)                       # a fill load's pools are its own (fit_fill)
        if "request" in d.get("workload", {}) or name == "radix-paged":
            d["workload"] = self._generated(level)      # arrivals over time (shared prefixes for the radix cache)
            self.g_pool(d, level)
            pool = d["pool"]
            pool.pop("unified", None)
        if name in ("overlap-mixed-dp-pcg-paged", "unified-dp-pcg-mixed", "dp-attn-tp-eager"):
            top = r.choice((64, 256, 512))
            e["dp_size"] = r.choice((2, 2, 4))
            e["dp_other_tokens"] = {"dist": "choice", "values": sorted({0, r.choice((3, 5, top // 4)), top // 2})}
            e["mixed_chunk"] = True
            e["piecewise_cuda_graph"] = name != "dp-attn-tp-eager"
            for k in ("piecewise_max_tokens", "piecewise_shrink", "attn_tp_size"):
                e.pop(k, None)
            if e["piecewise_cuda_graph"]:
                e["piecewise_max_tokens"] = top
                e["chunked_prefill_size"] = min(e.get("chunked_prefill_size", 8192), top)
            else:
                e["attn_tp_size"] = r.choice((2, 4, 8))
                e["dp_other_tokens"]["values"] = sorted({0, r.choice((3, 5, 13)), r.choice((37, 301))})
        if name == "overlap-mixed-dp-pcg-paged":
            e["overlap"], e["war_barrier"] = True, r.choice(BARRIERS)
            self._paged(pool, r.choice((2, 4, 16)))
        elif name == "overlap-retract":
            e["overlap"], e["war_barrier"], e["reserve"], e["mixed_chunk"] = True, r.choice(BARRIERS), "none", False
            biggest, demand = _demand(d["workload"])
            pool["full_size"] = max(biggest + 8, int(demand * r.choice((0.3, 0.5))))
            pool["full_size"] += (-pool["full_size"]) % pool.get("page_size", 1)
        elif name == "radix-paged":
            self.g_sharing(d, level)
            e["radix_cache"] = True
            e.pop("pd_decode", None)
            self._paged(pool, r.choice((4, 16, 16, 64)))
        elif name == "unified-dp-pcg-mixed":
            pool["unified"] = True

    def _generated(self, level: int) -> dict:
        """A generated workload of arrivals over time (what the recipes' paths need: requests that meet)."""
        r = self.rng
        hi = r.randint(16, 32 * 2 ** level)
        return {"requests": r.randint(3, 3 + 3 * level), "arrival": "poisson", "rate": r.choice((0.5, 1.0, 2.0)),
                "prompt_len": {"dist": "uniform", "min": r.randint(1, hi), "max": hi},
                "output_len": {"dist": "uniform", "min": r.randint(1, 4), "max": r.randint(8, 8 * level + 16)}}

    @staticmethod
    def _paged(pool: dict, page: int) -> None:
        pool["page_size"] = page
        pool["full_size"] = max(2 * page, pool["full_size"] + (-pool["full_size"]) % page)

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


#: per engine, the knobs of a draw it does not drive (each refused by its adapter, e.g. engine_path/vllm/scheduler.py's
#: NOT_YET): :func:`for_engine` clears them, so a search spends its draws on what the engine runs
NOT_DRIVEN = {"vllm": {"engine": ("pd_decode", "war_barrier", "platform", "piecewise_shrink", "attn_tp_size"),
                       "pool": ("unified",)}}


def for_engine(data: dict[str, Any], engine: str) -> dict[str, Any]:
    """A draw as ``engine`` runs it: the knobs it does not drive cleared (:data:`NOT_DRIVEN`). For vLLM also a model
    of equal full and sliding-window layer counts, alternating (slotscope drives one group of each: vLLM groups
    a 3:1 or 5:1 pattern into several), enough of them that EAGLE's drafter layers join them, the drawn window
    kept, and a pool of whole blocks; EAGLE without async scheduling, an offload tier or SGLang's draft-pool
    sizes, half of its draws (by the draw's seed) with lookahead block hashes off (EAGLE's block drop on prefix
    hits). vLLM's extract_hidden_states is not drawn: its padded rows in the null block are a finding live in 0.34.0
    (V9), which would end every search of the release as released."""
    drop = NOT_DRIVEN.get(engine)
    if drop is None:
        return data
    for table, keys in drop.items():
        for k in keys:
            data.get(table, {}).pop(k, None)
    e = data.get("engine", {})
    if engine == "vllm" and e.get("dp_size", 1) > 1:
        e.pop("overlap", None)                    # async scheduling is driven on one DP rank's own loop only
    spec = e.get("speculative")
    if spec is not None:                          # EAGLE: synchronous steps, its drafter on the target's block pool
        for k in ("overlap", "kv_offload", "kv_offload_load"):
            e.pop(k, None)
        spec.pop("draft_full_size", None)
        spec.pop("draft_swa_ratio", None)
        if engine == "vllm" and (data.get("seed", 0) >> 3) % 2:   # by the draw's seed, half the time: the block drop
            spec["lookahead_block_hashes"] = False           # on prefix hits (vLLM's lookahead block hashes off)
    m = data["model"]
    layers = m.get("layers") or ""
    # enough layers of each kind that the drafter's join the target's groups (vLLM splits a kind whose count
    # reaches 1.5 times the other's)
    drafter = spec.get("draft_layers", "F") if spec is not None else ""
    pairs = 2 * max(drafter.count("F"), drafter.count("S")) + 1 if drafter else 1
    if layers.count("S") != layers.count("F") or not layers or len(layers) < 2 * pairs:
        n = max(len(layers) or m.get("num_layers", 2), 2 * pairs)
        data["model"] = {"layers": "SF" * max(1, n // 2), "window": window_of(m),
                         **({"kv_dtype": m["kv_dtype"]} if "kv_dtype" in m else {})}
    pool = data["pool"]
    page = pool.get("page_size", 1)
    pool["full_size"] += (-pool["full_size"]) % page
    return data


def window_of(model: dict) -> int:
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
    cap = window_of(data["model"]) // page * page    # a wave request within the window holds all its SWA slots
    _shape_wave(reqs, kind, first_wave, page, x, cap)
    _shape_later(reqs, first_wave, page, x, cap)
    total = [q["prompt_len"] + q["output_len"] + x for q in reqs]
    if kind != "swa" and data["seed"] % 4:        # the long request prefilled in chunks: it holds a window's SWA
        e["chunked_prefill_size"] = min(e.get("chunked_prefill_size", 8192),
                                        max(16, 1 << ((reqs[0]["prompt_len"] // 2).bit_length() - 1)))
    wave = sum(t for q, t in zip(reqs, total) if q["arrival_step"] == first_wave)
    chunk = e.get("chunked_prefill_size", 8192) * (2 if e.get("overlap") else 1)
    bound = 2 * window_of(data["model"]) + max(chunk, e.get("swa_eviction_interval", 1) + 2) + 2 * page + 2 * x + 2
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
