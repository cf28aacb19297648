"""The scenario as the run sees it: frozen dataclasses, the values its fields allow, their defaults, and the
TOML data they write back to (:func:`scenario_data`).

Nothing here reads TOML (:mod:`simulator.scenario.parse` does), so everything downstream of the parser depends
only on these types. The two directions are tied by the round trip ``parse_scenario(dumps(scenario_data(sc)))
== sc`` (tests/test_scenario_toml.py); with ``defaults=False`` a field equal to what the parser would fill in is
left out. A :class:`Scenario` is built
once, validated, and never changed: command-line overrides make a new one (:meth:`Scenario.with_overrides`).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from simulator.scenario.models import PRESETS, KVGeometry, Model, format_pattern
from simulator.scenario.capture import (default_decode_capture_sizes, default_piecewise_capture_sizes,
                                        speculative_decode_capture_sizes)
from simulator.scenario.toml_write import dumps

#: the design a scenario runs when it names none: the model of the newest release, SGLang 0.5.23
DEFAULT_DESIGN = "sglang-0.5.23"

BACKENDS: tuple[str, ...] = (
    "flashinfer", "triton", "flashattention", "trtllm_mha", "aiter", "xpu", "torch_native", "musa",
)
ARRIVALS = ("all_at_once", "poisson")
#: "extract_hidden_states": vLLM's speculator that caches the target's hidden states (vLLM runs only)
SPEC_ALGORITHMS = ("eagle", "extract_hidden_states")
DISTRIBUTIONS = ("fixed", "uniform", "lognormal", "choice")
MAX_SEED = 2**63 - 1


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the file and field."""


@dataclass(frozen=True, slots=True)
class Distribution:
    """A length distribution: fixed, uniform [min, max], lognormal clipped to [min, max], or choice."""

    dist: str
    value: int = 0
    min: int = 1
    max: int = 1
    mean: float = 0.0
    sigma: float = 1.0
    values: tuple[int, ...] = ()
    weights: tuple[float, ...] = ()

    @property
    def upper(self) -> int:
        """The largest length it can draw."""
        if self.dist == "fixed":
            return self.value
        if self.dist == "choice":
            return max(self.values)
        return self.max

    def sample(self, rng, n: int):
        import numpy as np

        if self.dist == "fixed":
            return np.full(n, self.value, dtype=np.int64)
        if self.dist == "uniform":
            return rng.integers(self.min, self.max + 1, size=n, dtype=np.int64)
        if self.dist == "lognormal":
            x = rng.lognormal(self.mean, self.sigma, size=n)
            return np.clip(np.rint(x), self.min, self.max).astype(np.int64)
        p = np.asarray(self.weights, dtype=float) if self.weights else None
        if p is not None:
            p = p / p.sum()
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=n, p=p)

    def to_toml(self) -> dict[str, Any]:
        if self.dist == "fixed":
            return {"dist": "fixed", "value": self.value}
        if self.dist == "uniform":
            return {"dist": "uniform", "min": self.min, "max": self.max}
        if self.dist == "lognormal":
            return {"dist": "lognormal", "mean": self.mean, "sigma": self.sigma, "min": self.min, "max": self.max}
        d: dict[str, Any] = {"dist": "choice", "values": list(self.values)}
        if self.weights:
            d["weights"] = list(self.weights)
        return d


CUSTOM_MODEL = Model(name="custom", layer_kinds=(), window=0, full=KVGeometry(8, 128, 128),
                     swa=KVGeometry(8, 128, 128))   # the base of a model given without a preset
DEFAULT_PROMPT_LEN = Distribution("fixed", value=128)
DEFAULT_OUTPUT_LEN = Distribution("fixed", value=16)
DEFAULT_DP_OTHER_TOKENS = Distribution("uniform", min=0, max=512)
DEFAULT_SYSTEM_PROMPT_LEN = Distribution("fixed", value=256)
ONE_TURN = Distribution("fixed", value=1)
NO_THINK_TIME = Distribution("fixed", value=0)

_MASK63 = (1 << 63) - 1


def _source_id(name: str) -> int:
    """A stable 64-bit id of a token source (a prefix group, a conversation, a request)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def content_ids(source: str, lo: int, hi: int):
    """Deterministic token-content ids of positions [lo, hi) of ``source``: equal (source, position),
    equal id; different ones collide with probability about 2^-63 (a splitmix64 of the two)."""
    import numpy as np

    z = np.arange(lo, hi, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(_source_id(source))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z & np.uint64(_MASK63)).astype(np.int64)


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request. Token *content* (what prefix matching compares) is not stored: :meth:`tokens`
    computes it. Positions [0, prefix_len) are the prefix group's; a conversation's turns share every
    position (turn k's prompt is turn k-1's prompt and output, then its own message); other positions
    are the request's own (keyed by ``uid``, the request's index in the workload)."""

    arrival_step: int
    prompt_len: int
    output_len: int
    prefix_group: Optional[str] = None     # the first prefix_len tokens are this group's
    prefix_len: int = 0
    conversation: Optional[str] = None     # a turn of this conversation
    turn: int = 0                          # 1, 2, ... within the conversation (0: not a turn)
    think_time: int = 0                    # turn > 1: steps after the previous turn finished, at least
    uid: int = field(default=-1, compare=False)

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.output_len

    @property
    def content_key(self) -> str:
        """The source of the positions past the prefix group's."""
        if self.conversation is not None:
            return f"conversation:{self.conversation}"
        if self.uid < 0:
            raise ValueError("a request outside a conversation needs its uid (make_requests sets it) for its tokens")
        return f"request:{self.uid}"

    def tokens(self, lo: int = 0, hi: Optional[int] = None):
        """Content ids of positions [lo, hi) (default: the prompt and the output)."""
        import numpy as np

        hi = self.total_len if hi is None else hi
        if not 0 <= lo <= hi:
            raise ValueError(f"bad token range [{lo}, {hi})")
        cut = min(max(self.prefix_len if self.prefix_group is not None else 0, lo), hi)
        parts = []
        if cut > lo:
            parts.append(content_ids(f"group:{self.prefix_group}", lo, cut))
        if hi > cut:
            parts.append(content_ids(self.content_key, cut, hi))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class PoolConfig:
    full_size: int
    swa_ratio: float = 0.8
    page_size: int = 1
    unified: bool = False      # 0.5.23's unified memory pool (simulator/memory/unified_pool.py); docs/SHARING.md

    @property
    def swa_size(self) -> int:
        size = int(self.full_size * self.swa_ratio)
        return size - size % self.page_size


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    requests: int = 0
    arrival: str = "all_at_once"
    rate: float = 1.0                          # poisson: mean arrivals per step
    prompt_len: Distribution = DEFAULT_PROMPT_LEN
    output_len: Distribution = DEFAULT_OUTPUT_LEN
    explicit: tuple[RequestSpec, ...] = ()     # when given, replaces the generated requests
    # sharing (generated requests): system prompts and multi-turn conversations
    system_prompts: int = 0                    # distinct shared system prompts
    system_prompt_len: Distribution = DEFAULT_SYSTEM_PROMPT_LEN
    share: float = 1.0                         # fraction of requests that start with a system prompt
    turns: Distribution = ONE_TURN             # turns per conversation (each generated request is turn 1)
    think_time: Distribution = NO_THINK_TIME   # steps between a turn's finish and the next turn's arrival


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """EAGLE-style speculative decoding (chain drafting, topk 1) with a draft model that has its own pools.

    The draft shares the target's allocator (SGLang's draft worker shares its token-to-KV allocator): its
    full layers are addressed by ``out_cache_loc``, its SWA layers by ``full_to_swa[out_cache_loc]``. So
    its pools must hold at least as many slots as the target's; B3 (#17630) is a draft pool sized smaller.
    """

    enabled: bool = False
    algorithm: str = "eagle"
    num_draft_tokens: int = 4                 # tokens verified per request per round (num_steps + 1)
    accept_rate: float = 0.7                  # chance each drafted token is accepted; the chain stops at a reject
    draft_layers: tuple[str, ...] = ("full",)
    draft_full_size: Optional[int] = None     # None: the target's pool.full_size
    draft_swa_ratio: Optional[float] = None   # None: the target's pool.swa_ratio
    #: vLLM only (its speculative config's disable_lookahead_block_hashes, negated): a block's prefix-cache hash also
    #: covers the next token, on which the drafter's K/V of its last position depends (0.34's default); off, a hit
    #: drops its last block instead (EAGLE's block drop)
    lookahead_block_hashes: bool = True

    @property
    def num_steps(self) -> int:
        """Draft decode forwards per round (EAGLE's speculative_num_steps, topk 1)."""
        return self.num_draft_tokens - 1

    def draft_pool(self, target: "PoolConfig") -> "PoolConfig":
        """The draft's pool sizes as configured (a design may enlarge them: see Design.size_draft_pools)."""
        return PoolConfig(
            full_size=self.draft_full_size if self.draft_full_size is not None else target.full_size,
            swa_ratio=self.draft_swa_ratio if self.draft_swa_ratio is not None else target.swa_ratio,
            page_size=target.page_size,
        )


NO_SPECULATIVE = SpeculativeConfig()


#: engine.war_barrier values ("release": the design's release chooses; the rest: simulator.scheduling.timeline.BARRIERS)
WAR_BARRIERS = ("release", "none", "loop_top", "read_done_after_metadata", "after_launch", "coarse")
PLATFORMS = ("cuda", "rocm")
RESERVES = ("whole", "none")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    chunked_prefill_size: int = 8192
    max_running_requests: int = 1024
    mixed_chunk: bool = False
    dp_size: int = 1
    dp_other_tokens: Distribution = DEFAULT_DP_OTHER_TOKENS
    piecewise_cuda_graph: bool = False
    piecewise_capture_sizes: tuple[int, ...] = field(default_factory=default_piecewise_capture_sizes)
    piecewise_shrink: bool = True
    cuda_graph: bool = True
    cuda_graph_bs: tuple[int, ...] = field(default_factory=default_decode_capture_sizes)
    speculative: SpeculativeConfig = NO_SPECULATIVE
    #: attention-TP size under DP attention: SGLang 0.5.23 aligns every rank's token count to it
    attn_tp_size: int = 1
    #: SGLANG_SWA_EVICTION_INTERVAL: tokens past the window a request accumulates before SGLang 0.5.23
    #: evicts them in decode (read by the 0.5.23 release model only)
    swa_eviction_interval: int = 128
    #: the radix prefix cache (simulator/scheduling/prefix_cache.py); SGLang's default is on, slotscope's stays off
    #: until the scheduler uses it, so existing scenarios keep their results
    radix_cache: bool = False
    #: an external cache linker is attached to the radix cache (#38519's trigger of R8): evicting a leaf
    #: frees its SWA side through ``free_swa_segment`` even when the leaf is a tombstone (docs/SHARING.md)
    cache_linker: bool = False
    #: a PD-disaggregated decode node (simulator/scheduling/pd_decode.py): each request arrives with its prompt's KV
    #: computed by a prefill node and transferred; the node allocates it by SWA tail (full slots for the
    #: whole prompt, SWA slots for the window's pages only: ``alloc_extend_swa_tail``) and decodes. The
    #: node runs the chunk cache (no radix tree), as decode nodes did in mid-2026. At page size 1 there is no
    #: SWA-tail allocation (the release's ``_uses_swa_tail_prealloc`` needs page_size > 1): both pools are
    #: allocated for the whole prompt, the transfer fills the window's SWA rows, eviction frees the rest
    pd_decode: bool = False
    #: an offload tier behind the prefix cache: a finished request's computed blocks are saved off the device, and
    #: a later request whose prefix the device's cache lost but the tier holds loads it (synchronously, before its
    #: forward). Driven as vLLM's KV connector only (--engine vllm: engine_path/vllm/connector.py); no model has it
    kv_offload: bool = False
    #: how the offload tier loads: "sync" (before the forward that follows the schedule, on its stream) or "async"
    #: (the request waits for its load; the load runs beside the forwards, unordered with the one in flight)
    kv_offload_load: str = "sync"
    #: the overlap scheduler (docs/OVERLAP.md): forward k runs while the scheduler makes iteration k+1's
    #: writes (and k's result processing), each landing where the WAR barrier allows, chosen by the seed.
    #: SGLang's default is on; slotscope's stays off so existing scenarios keep their results
    overlap: bool = False
    #: the overlap scheduler's WAR barrier: "release" (the design's release decides, per platform) or one
    #: of simulator.scheduling.timeline.BARRIERS (none, loop_top, read_done_after_metadata, after_launch, coarse)
    war_barrier: str = "release"
    #: the accelerator platform: 0.5.23 enables the WAR barrier on CUDA only (ROCm: W7)
    platform: str = "cuda"
    #: what admission reserves: "whole" (prompt and output, so allocation never fails) or "none" (the
    #: prompt only; decode grows each request and retracts requests when the pools run out)
    reserve: str = "whole"
    #: check every forward's reads (the backends' read tables) against the oracle: stale_read findings
    read_check: bool = True


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    seed: int
    design: str
    backends: tuple[str, ...]
    model: Model
    pool: PoolConfig
    workload: WorkloadConfig
    engine: EngineConfig
    max_steps: Optional[int] = None            # stop after this many forward steps (None: run to the end)
    # the real engine in the write path ("sglang" or "sglang==VERSION"; None: the design's model).
    # Checked by slotscope (engine_path.releases.parse_spec), never imported here.
    engine_release: Optional[str] = None
    # where the scenario came from and its text: provenance, not part of the experiment (not compared)
    source: str = field(default="<inline>", compare=False)
    raw: str = field(default="", compare=False)   # the file's text, for the scenario hash

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.raw.encode()).hexdigest()[:16]

    def with_overrides(self, *, design: Optional[str] = None, backends: Optional[tuple[str, ...]] = None,
                       seed: Optional[int] = None, max_steps: Optional[int] = None,
                       engine_release: Optional[str] = None) -> "Scenario":
        """The scenario with command-line overrides; None keeps the file's value."""
        if seed is not None and not (isinstance(seed, int) and 0 <= seed <= MAX_SEED):
            raise ScenarioError(f"seed must be an integer in [0, 2^63), got {seed!r}")
        if max_steps is not None and not (isinstance(max_steps, int) and max_steps >= 1):
            raise ScenarioError(f"max_steps must be an integer >= 1, got {max_steps!r}")
        return replace(
            self,
            design=design if design is not None else self.design,
            backends=tuple(backends) if backends is not None else self.backends,
            seed=seed if seed is not None else self.seed,
            max_steps=max_steps if max_steps is not None else self.max_steps,
            engine_release=engine_release if engine_release is not None else self.engine_release,
        )

    def to_toml(self, *, defaults: bool = True) -> str:
        """The scenario as TOML text that :func:`parse_scenario` reads back to an equal scenario.

        With ``defaults=True`` every field is written explicitly (the model as a layer pattern, window,
        dtype and geometries; the engine's capture-size lists); with ``defaults=False`` fields equal to
        what the parser would fill in are left out, for a shorter file that still round-trips.
        """
        return dumps(scenario_data(self, defaults=defaults))


# ---------------------------------------------------------------------------- writing back: the TOML data

def scenario_data(sc: Scenario, *, defaults: bool = True) -> dict[str, Any]:
    """The TOML data of a scenario (see :meth:`Scenario.to_toml`); ``parse_scenario`` reads it back equal."""
    out: dict[str, Any] = {"name": sc.name}
    if defaults or sc.description:
        out["description"] = sc.description
    out["seed"] = sc.seed
    out["design"] = sc.design
    out["backends"] = list(sc.backends)
    if sc.max_steps is not None:
        out["max_steps"] = sc.max_steps
    if sc.engine_release is not None:
        out["engine_release"] = sc.engine_release
    out["model"] = _model_data(sc.model, defaults)
    out["pool"] = _pool_data(sc.pool, defaults)
    out["workload"] = _workload_data(sc.workload, defaults)
    engine = _engine_data(sc.engine, defaults)
    if engine:
        out["engine"] = engine
    return out


def _put(d: dict[str, Any], key: str, value: Any, default: Any, defaults: bool) -> None:
    if defaults or value != default:
        d[key] = value


def _geometry_data(g: KVGeometry) -> dict[str, Any]:
    return {"heads": g.heads, "head_dim": g.head_dim, "v_head_dim": g.v_head_dim}


def _model_data(m: Model, defaults: bool) -> dict[str, Any]:
    base = PRESETS[m.preset] if m.preset is not None else CUSTOM_MODEL
    d: dict[str, Any] = {}
    if m.preset is not None:
        d["preset"] = m.preset
    _put(d, "name", m.name, base.name, defaults)
    if defaults or m.preset is None or m.layer_kinds != base.layer_kinds:
        d["layers"] = format_pattern(m.layer_kinds)
    if defaults or m.preset is None or m.window != base.window:
        d["window"] = m.window
    _put(d, "kv_dtype", m.kv_dtype, base.kv_dtype, defaults)
    for kind in ("full", "swa"):
        _put(d, kind, _geometry_data(m.geometry(kind)), _geometry_data(base.geometry(kind)), defaults)
    return d


def _pool_data(p: PoolConfig, defaults: bool) -> dict[str, Any]:
    d: dict[str, Any] = {"full_size": p.full_size}
    _put(d, "swa_ratio", p.swa_ratio, 0.8, defaults)
    _put(d, "page_size", p.page_size, 1, defaults)
    if p.unified:              # written only when on: existing scenarios' files stay byte-identical
        d["unified"] = True
    return d


def _dist_data(dist: Distribution, defaults: bool) -> Any:
    return dist.value if dist.dist == "fixed" and not defaults else dist.to_toml()


def _workload_data(w: WorkloadConfig, defaults: bool) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if defaults or not w.explicit:
        d["requests"] = w.requests
    _put(d, "arrival", w.arrival, "all_at_once", defaults)
    _put(d, "rate", w.rate, 1.0, defaults)
    for key, default in (("prompt_len", DEFAULT_PROMPT_LEN), ("output_len", DEFAULT_OUTPUT_LEN)):
        value = getattr(w, key)
        if defaults or value != default:
            d[key] = _dist_data(value, defaults)
    if w.system_prompts:
        d["system_prompts"] = w.system_prompts
        if defaults or w.system_prompt_len != DEFAULT_SYSTEM_PROMPT_LEN:
            d["system_prompt_len"] = _dist_data(w.system_prompt_len, defaults)
        _put(d, "share", w.share, 1.0, defaults)
    if w.turns != ONE_TURN:
        d["turns"] = _dist_data(w.turns, defaults)
        if defaults or w.think_time != NO_THINK_TIME:
            d["think_time"] = _dist_data(w.think_time, defaults)
    if w.explicit:
        d["request"] = [_request_data(r) for r in w.explicit]
    return d


def _request_data(r: RequestSpec) -> dict[str, Any]:
    d: dict[str, Any] = {"arrival_step": r.arrival_step, "prompt_len": r.prompt_len, "output_len": r.output_len}
    if r.prefix_group is not None and r.turn <= 1:      # later turns inherit turn 1's
        d["prefix_group"], d["prefix_len"] = r.prefix_group, r.prefix_len
    if r.conversation is not None:
        d["conversation"], d["turn"] = r.conversation, r.turn
        if r.think_time:
            d["think_time"] = r.think_time
    return d


def _sizes_data(d: dict[str, Any], key: str, max_key: str, sizes: tuple[int, ...], make, minimum: int,
                default: tuple[int, ...], defaults: bool) -> None:
    """A capture-size list: explicit, or (compact) left out / as its largest size when the rule gives it."""
    if not defaults and sizes == default:
        return
    if not defaults and sizes[-1] >= minimum and make(sizes[-1]) == sizes:
        d[max_key] = sizes[-1]
    else:
        d[key] = list(sizes)


def _engine_data(e: EngineConfig, defaults: bool) -> dict[str, Any]:
    base = EngineConfig()
    d: dict[str, Any] = {}
    for key in ("chunked_prefill_size", "max_running_requests", "mixed_chunk", "dp_size"):
        _put(d, key, getattr(e, key), getattr(base, key), defaults)
    if defaults or e.dp_other_tokens != base.dp_other_tokens:
        d["dp_other_tokens"] = _dist_data(e.dp_other_tokens, defaults)
    _put(d, "piecewise_cuda_graph", e.piecewise_cuda_graph, base.piecewise_cuda_graph, defaults)
    _sizes_data(d, "piecewise_capture_sizes", "piecewise_max_tokens", e.piecewise_capture_sizes,
                default_piecewise_capture_sizes, 4, default_piecewise_capture_sizes(), defaults)
    _put(d, "piecewise_shrink", e.piecewise_shrink, base.piecewise_shrink, defaults)
    _put(d, "cuda_graph", e.cuda_graph, base.cuda_graph, defaults)
    bs_sizes = speculative_decode_capture_sizes if e.speculative.enabled else default_decode_capture_sizes
    _sizes_data(d, "cuda_graph_bs", "cuda_graph_max_bs", e.cuda_graph_bs, bs_sizes, 1, bs_sizes(), defaults)
    # release-model knobs: written only when set, so files of scenarios that leave them stay as they were
    for key in ("attn_tp_size", "swa_eviction_interval", "radix_cache", "cache_linker", "pd_decode", "kv_offload",
                "kv_offload_load", "overlap",
                "war_barrier",
                "platform", "reserve", "read_check"):
        _put(d, key, getattr(e, key), getattr(base, key), False)
    if e.speculative != NO_SPECULATIVE:
        d["speculative"] = _speculative_data(e.speculative, defaults)
    return d


def _speculative_data(s: SpeculativeConfig, defaults: bool) -> dict[str, Any]:
    base = SpeculativeConfig(enabled=True)     # what a present [engine.speculative] table defaults to
    d: dict[str, Any] = {}
    _put(d, "enabled", s.enabled, base.enabled, defaults)
    _put(d, "algorithm", s.algorithm, base.algorithm, defaults)
    _put(d, "num_draft_tokens", s.num_draft_tokens, base.num_draft_tokens, defaults)
    _put(d, "accept_rate", s.accept_rate, base.accept_rate, defaults)
    _put(d, "draft_layers", format_pattern(s.draft_layers), format_pattern(base.draft_layers), defaults)
    if s.draft_full_size is not None:
        d["draft_full_size"] = s.draft_full_size
    if s.draft_swa_ratio is not None:
        d["draft_swa_ratio"] = s.draft_swa_ratio
    _put(d, "lookahead_block_hashes", s.lookahead_block_hashes, base.lookahead_block_hashes, defaults)
    return d
