"""Writing back: a :class:`~simulator.scenario.config.Scenario` as the TOML data its parser reads to an equal one.

Kept apart from the parser so that each direction reads on its own; what ties them is the round trip
``parse_scenario(dumps(scenario_data(sc))) == sc`` (tests/test_scenario_toml.py). With ``defaults=False`` a
field equal to what the parser would fill in is left out; the release-model knobs and ``pool.unified`` are
written only when set either way, so the files of scenarios that leave them stay as they were.
"""
from __future__ import annotations

from typing import Any

from simulator.scenario.models import PRESETS, KVGeometry, Model, format_pattern
from simulator.scenario.capture import (default_decode_capture_sizes, default_piecewise_capture_sizes,
                                        speculative_decode_capture_sizes)
from simulator.scenario.config import (CUSTOM_MODEL, DEFAULT_OUTPUT_LEN, DEFAULT_PROMPT_LEN, DEFAULT_SYSTEM_PROMPT_LEN,
                                       NO_SPECULATIVE, NO_THINK_TIME, ONE_TURN, Distribution, EngineConfig,
                                       PoolConfig, RequestSpec, Scenario, SpeculativeConfig, WorkloadConfig)


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
