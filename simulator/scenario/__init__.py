"""Scenario files: TOML in, a validated, frozen :class:`Scenario` out.

Every bad input is reported as :class:`ScenarioError` naming the file, the dotted field and, where
the field takes a closed set of values, the values allowed. Unknown keys are errors too, since a
misspelt key silently ignored would run a different experiment than the one the user wrote.
"""
from __future__ import annotations

import hashlib
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from simulator.scenario.models import KV_DTYPES, PRESETS, KVGeometry, Model, format_pattern, parse_pattern
from simulator.scenario.capture import (default_decode_capture_sizes, default_piecewise_capture_sizes,
                                        speculative_decode_capture_sizes)

#: the design a scenario runs when it names none: the model of the newest release, SGLang 0.5.23
DEFAULT_DESIGN = "sglang-0.5.23"

BACKENDS: tuple[str, ...] = (
    "flashinfer", "triton", "flashattention", "trtllm_mha", "aiter", "xpu", "torch_native", "musa",
)
ARRIVALS = ("all_at_once", "poisson")
SPEC_ALGORITHMS = ("eagle",)
DISTRIBUTIONS = ("fixed", "uniform", "lognormal", "choice")
MAX_SEED = 2**63 - 1
MAX_INT = 2**31 - 1              # the largest value of any integer field without its own limit
MAX_FILE_BYTES = 64 * 2**20      # a scenario file is at most this large


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
        from simulator.scenario.toml_write import dumps

        return dumps(scenario_data(self, defaults=defaults))


# --------------------------------------------------------------------------- field readers

class _Table:
    """A TOML table being validated: typed reads that name the field, and a check for unknown keys."""

    def __init__(self, data: dict[str, Any], path: str, source: str):
        if not isinstance(data, dict):
            raise ScenarioError(f"{source}: [{path}] must be a table, got {type(data).__name__}")
        self.data, self.path, self.source = data, path, source
        self.seen: set[str] = set()

    def where(self, key: str) -> str:
        return f"{self.source}: {self.path + '.' if self.path else ''}{key}"

    def fail(self, key: str, msg: str) -> ScenarioError:
        return ScenarioError(f"{self.where(key)}: {msg}")

    def has(self, key: str) -> bool:
        return key in self.data

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ..., *, allowed=None,
            minimum=None, maximum=None) -> Any:
        self.seen.add(key)
        if key not in self.data:
            if default is ...:
                raise self.fail(key, "is required" + (f" (allowed: {', '.join(map(str, allowed))})" if allowed else ""))
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            try:
                value = float(value)
            except OverflowError:
                raise self.fail(key, f"must be a finite number, got an integer of {value.bit_length()} bits") from None
        if isinstance(value, bool) and bool not in kinds:
            raise self.fail(key, f"must be {_kind_names(kinds)}, got a boolean")
        if not isinstance(value, kinds):
            raise self.fail(key, f"must be {_kind_names(kinds)}, got {type(value).__name__} {_short(value)}")
        _check_number(value, maximum, lambda msg: self.fail(key, msg))
        if allowed is not None and value not in allowed:
            raise self.fail(key, f"{value!r} is not allowed (allowed: {', '.join(map(str, allowed))})")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value!r}")
        if maximum is not None and value > maximum:
            raise self.fail(key, f"must be <= {maximum}, got {value!r}")
        return value

    def table(self, key: str, required: bool = False) -> Optional["_Table"]:
        self.seen.add(key)
        if key not in self.data:
            if required:
                raise self.fail(key, "table is required")
            return None
        return _Table(self.data[key], f"{self.path + '.' if self.path else ''}{key}", self.source)

    def int_list(self, key: str, default: Any = ..., minimum: int = 0) -> tuple[int, ...]:
        value = self.get(key, list, default)
        if value is default and default is not ...:
            return default
        out = []
        for i, v in enumerate(value):
            if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
                raise self.fail(f"{key}[{i}]", f"must be an integer >= {minimum}, got {_short(v)}")
            _check_number(v, None, lambda msg: self.fail(f"{key}[{i}]", msg))
            out.append(v)
        return tuple(out)

    def float_list(self, key: str, default: Any = ..., minimum: float = 0.0) -> tuple[float, ...]:
        value = self.get(key, list, default)
        if value is default and default is not ...:
            return tuple(default)
        out = []
        for i, v in enumerate(value):
            if isinstance(v, int) and not isinstance(v, bool):
                try:
                    v = float(v)
                except OverflowError:
                    raise self.fail(f"{key}[{i}]", "must be a finite number, got a huge integer") from None
            if not isinstance(v, float):
                raise self.fail(f"{key}[{i}]", f"must be a number, got {type(v).__name__} {_short(v)}")
            _check_number(v, None, lambda msg: self.fail(f"{key}[{i}]", msg))
            if v < minimum:
                raise self.fail(f"{key}[{i}]", f"must be >= {minimum}, got {v!r}")
            out.append(v)
        return tuple(out)

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.seen)
        if unknown:
            raise self.fail(unknown[0], f"unknown key (known keys here: {', '.join(sorted(self.seen))})")


def _check_number(value: Any, maximum: Any, fail) -> None:
    """Floats must be finite; integers without an explicit maximum must stay <= MAX_INT."""
    if isinstance(value, float) and not math.isfinite(value):
        raise fail(f"must be a finite number, got {value!r}")
    if isinstance(value, int) and not isinstance(value, bool) and maximum is None and abs(value) > MAX_INT:
        raise fail(f"must be <= {MAX_INT}, got {_short(value)}")


def _short(value: Any, limit: int = 60) -> str:
    """repr of a value for a message, cut to ``limit`` characters (a huge list or integer stays readable)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    r = repr(value)
    return r if len(r) <= limit else r[:limit - 3] + "..."


def _kind_names(kinds: tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
             list: "a list", dict: "a table"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _distribution(t: _Table, key: str, default: Distribution, minimum: int = 0) -> Distribution:
    if not t.has(key):
        t.seen.add(key)
        return default
    raw = t.data[key]
    if isinstance(raw, int) and not isinstance(raw, bool):
        t.seen.add(key)
        if raw < minimum:
            raise t.fail(key, f"must be >= {minimum}, got {_short(raw)}")
        _check_number(raw, None, lambda msg: t.fail(key, msg))
        return Distribution("fixed", value=raw)
    d = t.table(key)
    assert d is not None
    kind = d.get("dist", str, allowed=DISTRIBUTIONS)
    if kind == "fixed":
        out = Distribution("fixed", value=d.get("value", int, minimum=minimum))
    elif kind == "uniform":
        lo = d.get("min", int, minimum=minimum)
        hi = d.get("max", int, minimum=lo)
        out = Distribution("uniform", min=lo, max=hi)
    elif kind == "lognormal":
        lo = d.get("min", int, minimum, minimum=minimum)
        hi = d.get("max", int, minimum=max(lo, 1))
        out = Distribution("lognormal", mean=d.get("mean", float), sigma=d.get("sigma", float, minimum=0.0),
                           min=lo, max=hi)
    else:
        values = d.int_list("values", minimum=minimum)
        if not values:
            raise d.fail("values", "must not be empty")
        weights = d.float_list("weights", ())
        if weights and len(weights) != len(values):
            raise d.fail("weights", f"must have one weight per value ({len(values)}), got {len(weights)}")
        if weights and (min(weights) < 0 or sum(weights) <= 0):
            raise d.fail("weights", "must be non-negative with a positive sum")
        out = Distribution("choice", values=values, weights=weights)
    d.done()
    return out


def _geometry(t: Optional[_Table], base: KVGeometry) -> KVGeometry:
    if t is None:
        return base
    heads = t.get("heads", int, base.heads, minimum=1)
    head_dim = t.get("head_dim", int, base.head_dim, minimum=1)
    v_head_dim = t.get("v_head_dim", int, head_dim if t.has("head_dim") else base.v_head_dim, minimum=1)
    t.done()
    return KVGeometry(heads, head_dim, v_head_dim)


def _model(t: _Table) -> Model:
    preset = t.get("preset", str, None, allowed=tuple(PRESETS))
    if preset is not None:
        base = PRESETS[preset]
    else:
        if not t.has("layers"):
            t.seen.add("preset")
            raise t.fail("preset", f"give a preset (allowed: {', '.join(PRESETS)}) or an explicit 'layers' pattern")
        base = CUSTOM_MODEL
    kinds = base.layer_kinds
    if t.has("layers"):
        try:
            kinds = parse_pattern(t.get("layers", str))
        except ValueError as e:
            raise t.fail("layers", str(e)) from None
        if not kinds:
            raise t.fail("layers", "must hold at least one layer")
    num_layers = t.get("num_layers", int, None, minimum=1)
    if num_layers is not None:
        if num_layers > len(kinds):
            raise t.fail("num_layers", f"must be <= the pattern's {len(kinds)} layers, got {num_layers}")
        kinds = kinds[:num_layers]
    window = t.get("window", int, base.window if preset else ..., minimum=1)
    name = t.get("name", str, base.name)
    kv_dtype = t.get("kv_dtype", str, base.kv_dtype, allowed=KV_DTYPES)
    full = _geometry(t.table("full"), base.full)
    swa = _geometry(t.table("swa"), base.swa)
    t.done()
    return Model(name=name, layer_kinds=kinds, window=window, full=full, swa=swa, kv_dtype=kv_dtype,
                 unverified=base.unverified, preset=preset)


def _pool(t: _Table) -> PoolConfig:
    page_size = t.get("page_size", int, 1, minimum=1)
    full_size = t.get("full_size", int, minimum=page_size * 2)
    if full_size % page_size:
        raise t.fail("full_size", f"must be a multiple of page_size {page_size}, got {full_size}")
    ratio = t.get("swa_ratio", float, 0.8, minimum=0.0, maximum=1.0)
    unified = t.get("unified", bool, False)
    cfg = PoolConfig(full_size=full_size, swa_ratio=ratio, page_size=page_size, unified=unified)
    if cfg.swa_size < page_size:
        raise t.fail("swa_ratio", f"leaves an SWA pool of {cfg.swa_size} slots, smaller than one page ({page_size})")
    t.done()
    return cfg


def _workload(t: _Table) -> WorkloadConfig:
    explicit = []
    t.seen.add("request")
    raw_requests = t.data.get("request", [])
    if not isinstance(raw_requests, list):
        raise t.fail("request", "must be an array of tables ([[workload.request]])")
    tables = []
    for i, r in enumerate(raw_requests):
        rt = _Table(r, f"{t.path}.request[{i}]", t.source)
        spec = _request(rt, i)
        rt.done()
        explicit.append(spec)
        tables.append(rt)
    explicit = _resolve_conversations(explicit, tables)
    requests = t.get("requests", int, len(explicit), minimum=0 if explicit else 1)
    if explicit and t.has("requests") and requests != len(explicit):
        raise t.fail("requests", f"is {requests} but {len(explicit)} [[workload.request]] tables are given")
    sharing = ("system_prompts", "system_prompt_len", "share", "turns", "think_time")
    if explicit:
        for key in sharing:
            if t.has(key):
                t.seen.add(key)
                raise t.fail(key, "applies to generated requests only; explicit [[workload.request]] tables share "
                                  "through prefix_group / prefix_len and conversation / turn")
    system_prompts = t.get("system_prompts", int, 0, minimum=0)
    for key in ("system_prompt_len", "share"):
        if t.has(key) and system_prompts == 0:
            t.seen.add(key)
            raise t.fail(key, "needs workload.system_prompts >= 1")
    turns = _distribution(t, "turns", ONE_TURN, minimum=1)
    if t.has("think_time") and turns == ONE_TURN:
        t.seen.add("think_time")
        raise t.fail("think_time", "needs workload.turns (more than one turn per conversation)")
    cfg = WorkloadConfig(
        requests=requests,
        arrival=t.get("arrival", str, "all_at_once", allowed=ARRIVALS),
        rate=t.get("rate", float, 1.0, minimum=1e-9),
        prompt_len=_distribution(t, "prompt_len", DEFAULT_PROMPT_LEN, minimum=1),
        output_len=_distribution(t, "output_len", DEFAULT_OUTPUT_LEN, minimum=0),
        explicit=tuple(explicit),
        system_prompts=system_prompts,
        system_prompt_len=_distribution(t, "system_prompt_len", DEFAULT_SYSTEM_PROMPT_LEN, minimum=1),
        share=t.get("share", float, 1.0, minimum=0.0, maximum=1.0),
        turns=turns,
        think_time=_distribution(t, "think_time", NO_THINK_TIME, minimum=0),
    )
    t.done()
    return cfg


def _paired(rt: _Table, id_key: str, int_key: str, missing_int: str, missing_id: str) -> tuple:
    """A non-empty string id and the integer (>= 1) that must come with it: both or neither."""
    ident = rt.get(id_key, str, None)
    if ident is not None and not ident:
        raise rt.fail(id_key, "must not be empty")
    value = rt.get(int_key, int, None, minimum=1)
    if ident is not None and value is None:
        raise rt.fail(int_key, missing_int)
    if ident is None and value is not None:
        raise rt.fail(int_key, missing_id)
    return ident, value


def _request(rt: _Table, i: int) -> RequestSpec:
    """One [[workload.request]] table (its sharing fields checked on their own)."""
    prompt_len = rt.get("prompt_len", int, minimum=1)
    group, prefix_len = _paired(rt, "prefix_group", "prefix_len",
                                "is required with prefix_group (the tokens shared with the group)",
                                "needs prefix_group (the group whose first tokens these are)")
    if prefix_len is not None and prefix_len > prompt_len:
        raise rt.fail("prefix_len", f"{prefix_len} is larger than prompt_len {prompt_len}")
    conversation, turn = _paired(rt, "conversation", "turn",
                                 "is required with conversation (1 for its first turn)",
                                 "needs conversation (the conversation this is a turn of)")
    think_time = rt.get("think_time", int, None, minimum=0)
    if think_time is not None and (turn is None or turn < 2):
        raise rt.fail("think_time", "applies to a conversation's turns after the first (turn >= 2)")
    return RequestSpec(
        arrival_step=rt.get("arrival_step", int, 0, minimum=0),
        prompt_len=prompt_len,
        output_len=rt.get("output_len", int, minimum=0),
        prefix_group=group, prefix_len=prefix_len or 0,
        conversation=conversation, turn=turn or 0, think_time=think_time or 0, uid=i,
    )


def _resolve_conversations(specs: list[RequestSpec], tables: list[_Table]) -> list[RequestSpec]:
    """Check each conversation's turns (1..n, each once; each prompt holds the whole previous turn) and
    give later turns the first turn's prefix group."""
    by_conv: dict[str, dict[int, int]] = {}
    for i, r in enumerate(specs):
        if r.conversation is None:
            continue
        turns = by_conv.setdefault(r.conversation, {})
        if r.turn in turns:
            raise tables[i].fail("turn", f"turn {r.turn} of conversation {r.conversation!r} is given twice "
                                         f"(also request[{turns[r.turn]}])")
        turns[r.turn] = i
    out = list(specs)
    for conv, turns in by_conv.items():
        missing = sorted(set(range(1, max(turns) + 1)) - set(turns))
        if missing:
            last = turns[max(turns)]
            raise tables[last].fail("turn", f"conversation {conv!r} has turn {max(turns)} but no turn {missing[0]}")
        first = specs[turns[1]]
        for k in range(2, max(turns) + 1):
            i, prev = turns[k], specs[turns[k - 1]]
            r = specs[i]
            if r.prompt_len <= prev.total_len:
                raise tables[i].fail("prompt_len", f"turn {k} of conversation {conv!r} starts with the whole of turn "
                                                   f"{k - 1} ({prev.prompt_len} + {prev.output_len} tokens), so its "
                                                   f"prompt must be longer than {prev.total_len}, got {r.prompt_len}")
            if r.prefix_group is not None and (r.prefix_group, r.prefix_len) != (first.prefix_group, first.prefix_len):
                raise tables[i].fail("prefix_group", f"a later turn inherits turn 1's prefix "
                                                     f"({first.prefix_group!r}, {first.prefix_len} tokens); "
                                                     f"leave it out or give the same")
            out[i] = replace(r, prefix_group=first.prefix_group, prefix_len=first.prefix_len)
    return out


def _sorted_unique(t: _Table, key: str, values: tuple[int, ...]) -> tuple[int, ...]:
    if not values:
        raise t.fail(key, "must not be empty")
    if list(values) != sorted(set(values)):
        raise t.fail(key, "must be strictly increasing")
    return values


def _speculative(t: _Table, pool: PoolConfig) -> SpeculativeConfig:
    enabled = t.get("enabled", bool, True)
    algorithm = t.get("algorithm", str, "eagle", allowed=SPEC_ALGORITHMS)
    num_draft_tokens = t.get("num_draft_tokens", int, 4, minimum=2, maximum=64)
    accept_rate = t.get("accept_rate", float, 0.7, minimum=0.0, maximum=1.0)
    try:
        draft_layers = parse_pattern(t.get("draft_layers", str, "F"))
    except ValueError as e:
        raise t.fail("draft_layers", str(e)) from None
    if not draft_layers:
        raise t.fail("draft_layers", "must hold at least one layer (an EAGLE draft has one: \"F\")")
    page = pool.page_size
    draft_full = t.get("draft_full_size", int, None, minimum=page * 2)
    if draft_full is not None and draft_full % page:
        raise t.fail("draft_full_size", f"must be a multiple of pool.page_size {page}, got {draft_full}")
    ratio = t.get("draft_swa_ratio", float, None, minimum=0.0, maximum=1.0)
    cfg = SpeculativeConfig(enabled=enabled, algorithm=algorithm, num_draft_tokens=num_draft_tokens,
                            accept_rate=accept_rate, draft_layers=draft_layers, draft_full_size=draft_full,
                            draft_swa_ratio=ratio)
    if "swa" in draft_layers and cfg.draft_pool(pool).swa_size < page:
        key = "draft_swa_ratio" if ratio is not None else "draft_full_size"
        raise t.fail(key, f"leaves the draft an SWA pool of {cfg.draft_pool(pool).swa_size} slots, smaller than "
                          f"one page ({page})")
    t.done()
    return cfg


def _engine(t: _Table, pool: PoolConfig) -> EngineConfig:
    d = EngineConfig()
    spec_t = t.table("speculative")
    spec = _speculative(spec_t, pool) if spec_t is not None else NO_SPECULATIVE
    pcg_max = t.get("piecewise_max_tokens", int, 4096, minimum=4)
    # with speculative decoding SGLang captures its decode graphs at the speculative batch sizes
    bs_sizes = speculative_decode_capture_sizes if spec.enabled else default_decode_capture_sizes
    cfg = EngineConfig(
        chunked_prefill_size=t.get("chunked_prefill_size", int, d.chunked_prefill_size, minimum=1),
        max_running_requests=t.get("max_running_requests", int, d.max_running_requests, minimum=1),
        mixed_chunk=t.get("mixed_chunk", bool, d.mixed_chunk),
        dp_size=t.get("dp_size", int, d.dp_size, minimum=1),
        dp_other_tokens=_distribution(t, "dp_other_tokens", d.dp_other_tokens, minimum=0),
        piecewise_cuda_graph=t.get("piecewise_cuda_graph", bool, d.piecewise_cuda_graph),
        piecewise_capture_sizes=_sorted_unique(
            t, "piecewise_capture_sizes",
            t.int_list("piecewise_capture_sizes", default_piecewise_capture_sizes(pcg_max), minimum=1)),
        piecewise_shrink=t.get("piecewise_shrink", bool, d.piecewise_shrink),
        cuda_graph=t.get("cuda_graph", bool, d.cuda_graph),
        cuda_graph_bs=_sorted_unique(
            t, "cuda_graph_bs",
            t.int_list("cuda_graph_bs", bs_sizes(t.get("cuda_graph_max_bs", int, 256, minimum=1)), minimum=1)),
        speculative=spec,
        attn_tp_size=t.get("attn_tp_size", int, d.attn_tp_size, minimum=1, maximum=1024),
        swa_eviction_interval=t.get("swa_eviction_interval", int, d.swa_eviction_interval, minimum=1),
        radix_cache=t.get("radix_cache", bool, d.radix_cache),
        cache_linker=t.get("cache_linker", bool, d.cache_linker),
        pd_decode=t.get("pd_decode", bool, d.pd_decode),
        overlap=t.get("overlap", bool, d.overlap),
        war_barrier=t.get("war_barrier", str, d.war_barrier, allowed=WAR_BARRIERS),
        platform=t.get("platform", str, d.platform, allowed=PLATFORMS),
        reserve=t.get("reserve", str, d.reserve, allowed=RESERVES),
        read_check=t.get("read_check", bool, d.read_check),
    )
    if cfg.overlap and spec.enabled:
        raise t.fail("overlap", "cannot be true with speculative decoding yet (the overlap timeline models "
                                "plain extend and decode forwards)")
    if cfg.reserve == "none" and (spec.enabled or cfg.mixed_chunk):
        raise t.fail("reserve", "\"none\" (retraction) is modelled without speculative decoding and mixed chunks")
    if spec.enabled and cfg.mixed_chunk:
        raise t.fail("mixed_chunk", "cannot be true with speculative decoding (SGLang turns mixed chunked "
                                    "prefill off under speculative decoding)")
    if pool.unified:
        _unified_combos(t, cfg)
    if cfg.pd_decode:
        _pd_decode_combos(t, cfg, pool)
    t.done()
    return cfg


def _pd_decode_combos(t: _Table, cfg: EngineConfig, pool: PoolConfig) -> None:
    """What a PD decode node (engine.pd_decode) needs and does not run with, each refused by its field."""
    if pool.unified:
        raise t.fail("pd_decode", "cannot be true with pool.unified = true (the decode node's SWA-tail allocation "
                                  "is the static pool's)")
    why = {"radix_cache": "the decode node runs the chunk cache (no radix tree)",
           "overlap": "the overlap timeline is not modelled on a decode node",
           "mixed_chunk": "a decode node runs no prefill chunks",
           "reserve": "a decode node pre-allocates whole requests (reserve = \"whole\")"}
    on = {"radix_cache": cfg.radix_cache, "overlap": cfg.overlap, "mixed_chunk": cfg.mixed_chunk,
          "reserve": cfg.reserve != "whole"}
    for key, is_on in on.items():
        if is_on:
            raise t.fail(key, f"cannot be set with engine.pd_decode = true ({why[key]})")


def _unified_combos(t: _Table, cfg: EngineConfig) -> None:
    """What the unified pool (pool.unified) does not run with yet: each refused by the [engine] field."""
    why = {"radix_cache": "the prefix cache's page-level entry points are not v2p operations yet",
           "overlap": "the overlap timeline keeps a mapping of its own; the unified run pins the previous "
                      "forward's write window instead",
           "speculative": "draft pools and speculative give-backs are not translated yet"}
    on = {"radix_cache": cfg.radix_cache, "overlap": cfg.overlap, "speculative": cfg.speculative.enabled}
    for key, is_on in on.items():
        if is_on:
            raise t.fail(key, f"cannot be on with pool.unified = true ({why[key]})")


def parse_scenario(text: str, source: str = "<inline>") -> Scenario:
    """Parse and validate scenario TOML text; ``source`` names the file in error messages."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{source}: not valid TOML: {e}") from None
    except RecursionError:
        raise ScenarioError(f"{source}: not valid TOML for a scenario: arrays or tables nested too deeply") from None
    if not data:
        raise ScenarioError(f"{source}: the file holds no scenario (it is empty or only comments): "
                            f"a scenario needs at least [model], [pool] and [workload]")
    top = _Table(data, "", source)
    name = top.get("name", str, Path(source).stem)
    description = top.get("description", str, "")
    try:
        seed = top.get("seed", int, 0, minimum=0, maximum=MAX_SEED)
    except ScenarioError:
        raise top.fail("seed", f"must be an integer in [0, 2^63), got {_short(top.data['seed'])}") from None
    max_steps = top.get("max_steps", int, None, minimum=1)
    engine_release = top.get("engine_release", str, None)
    design = top.get("design", str, DEFAULT_DESIGN)
    backends = top.get("backends", list, list(BACKENDS))
    for i, b in enumerate(backends):
        if b not in BACKENDS:
            raise top.fail(f"backends[{i}]", f"{_short(b)} is not a modelled backend (allowed: {', '.join(BACKENDS)})")
    if not backends:
        raise top.fail("backends", f"must name at least one backend (allowed: {', '.join(BACKENDS)})")
    if len(set(backends)) != len(backends):
        raise top.fail("backends", "names a backend twice")
    model = _model(top.table("model", required=True))
    pool = _pool(top.table("pool", required=True))
    if pool.unified and not (model.count("full") and model.count("swa")):
        raise ScenarioError(f"{source}: pool.unified: needs both full and SWA layers (SGLang's unified SWA pool "
                            f"asserts both; model layers {format_pattern(model.layer_kinds)!r})")
    workload = _workload(top.table("workload", required=True))
    engine_t = top.table("engine")
    engine = _engine(engine_t, pool) if engine_t else EngineConfig()
    top.done()
    return Scenario(name=name, description=description, seed=seed, design=design, backends=tuple(backends),
                    model=model, pool=pool, workload=workload, engine=engine, max_steps=max_steps,
                    engine_release=engine_release,
                    source=source, raw=text)


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    if p.is_dir():
        raise ScenarioError(f"{p}: is a directory, not a scenario file")
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ScenarioError(f"{p}: cannot read scenario file: {e.strerror or e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ScenarioError(f"{p}: larger than {MAX_FILE_BYTES // 2**20} MiB: not a scenario file")
    if not data.strip():
        raise ScenarioError(f"{p}: the file is empty: a scenario needs at least [model], [pool] and [workload]")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ScenarioError(f"{p}: not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} (line {line}, "
                            f"column {col}); scenario files are UTF-8 TOML") from None
    if text.startswith("\ufeff"):
        text = text[1:]          # a byte-order mark is not part of the TOML
    return parse_scenario(text, str(p))


# --------------------------------------------------------------------------- writing back

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
    for key in ("attn_tp_size", "swa_eviction_interval", "radix_cache", "cache_linker", "pd_decode", "overlap",
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
    return d
