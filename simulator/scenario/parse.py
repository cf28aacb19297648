"""Scenario TOML in, a validated :class:`~simulator.scenario.config.Scenario` out.

One reader per table ([model], [pool], [workload] and its [[workload.request]] tables, [engine] and
[engine.speculative]), each filling in the defaults of what the file leaves out; then the checks that span
fields (a conversation's turns, combinations a mode does not run with), each refused by the field to change.
"""
from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from simulator.scenario.models import KV_DTYPES, PRESETS, KVGeometry, Model, format_pattern, parse_pattern
from simulator.scenario.capture import (default_decode_capture_sizes, default_piecewise_capture_sizes,
                                        speculative_decode_capture_sizes)
from simulator.scenario.config import (ARRIVALS, BACKENDS, CUSTOM_MODEL, DEFAULT_DESIGN, DEFAULT_OUTPUT_LEN,
                                       DEFAULT_PROMPT_LEN, DEFAULT_SYSTEM_PROMPT_LEN, MAX_SEED, NO_SPECULATIVE,
                                       NO_THINK_TIME, ONE_TURN, PLATFORMS, RESERVES, SPEC_ALGORITHMS, WAR_BARRIERS,
                                       EngineConfig, PoolConfig, RequestSpec, Scenario, ScenarioError,
                                       SpeculativeConfig, WorkloadConfig)
from simulator.scenario.fields import TomlTable, design_file_spec, path_name_problem, read_distribution, short_repr

MAX_FILE_BYTES = 64 * 2**20    # a scenario file is at most this large


def _geometry(t: Optional[TomlTable], base: KVGeometry) -> KVGeometry:
    if t is None:
        return base
    heads = t.get("heads", int, base.heads, minimum=1)
    head_dim = t.get("head_dim", int, base.head_dim, minimum=1)
    v_head_dim = t.get("v_head_dim", int, head_dim if t.has("head_dim") else base.v_head_dim, minimum=1)
    t.done()
    return KVGeometry(heads, head_dim, v_head_dim)


def _model(t: TomlTable) -> Model:
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


def _pool(t: TomlTable) -> PoolConfig:
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


def _workload(t: TomlTable) -> WorkloadConfig:
    explicit = []
    t.seen.add("request")
    raw_requests = t.data.get("request", [])
    if not isinstance(raw_requests, list):
        raise t.fail("request", "must be an array of tables ([[workload.request]])")
    tables = []
    for i, r in enumerate(raw_requests):
        rt = TomlTable(r, f"{t.path}.request[{i}]", t.source)
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
    turns = read_distribution(t, "turns", ONE_TURN, minimum=1)
    if t.has("think_time") and turns == ONE_TURN:
        t.seen.add("think_time")
        raise t.fail("think_time", "needs workload.turns (more than one turn per conversation)")
    cfg = WorkloadConfig(
        requests=requests,
        arrival=t.get("arrival", str, "all_at_once", allowed=ARRIVALS),
        rate=t.get("rate", float, 1.0, minimum=1e-9),
        prompt_len=read_distribution(t, "prompt_len", DEFAULT_PROMPT_LEN, minimum=1),
        output_len=read_distribution(t, "output_len", DEFAULT_OUTPUT_LEN, minimum=0),
        explicit=tuple(explicit),
        system_prompts=system_prompts,
        system_prompt_len=read_distribution(t, "system_prompt_len", DEFAULT_SYSTEM_PROMPT_LEN, minimum=1),
        share=t.get("share", float, 1.0, minimum=0.0, maximum=1.0),
        turns=turns,
        think_time=read_distribution(t, "think_time", NO_THINK_TIME, minimum=0),
    )
    t.done()
    return cfg


def _paired(rt: TomlTable, id_key: str, int_key: str, missing_int: str, missing_id: str) -> tuple:
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


def _request(rt: TomlTable, i: int) -> RequestSpec:
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


def _resolve_conversations(specs: list[RequestSpec], tables: list[TomlTable]) -> list[RequestSpec]:
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


def _sorted_unique(t: TomlTable, key: str, values: tuple[int, ...]) -> tuple[int, ...]:
    if not values:
        raise t.fail(key, "must not be empty")
    if list(values) != sorted(set(values)):
        raise t.fail(key, "must be strictly increasing")
    return values


def _speculative(t: TomlTable, pool: PoolConfig) -> SpeculativeConfig:
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
    if algorithm == "extract_hidden_states":
        if num_draft_tokens != 2:
            raise t.fail("num_draft_tokens", "must be 2 with extract_hidden_states (vLLM asks "
                                             "num_speculative_tokens = 1)")
        if draft_layers != ("full",):
            raise t.fail("draft_layers", "must be \"F\" with extract_hidden_states (its one cache-only layer)")
    page = pool.page_size
    draft_full = t.get("draft_full_size", int, None, minimum=page * 2)
    if draft_full is not None and draft_full % page:
        raise t.fail("draft_full_size", f"must be a multiple of pool.page_size {page}, got {draft_full}")
    ratio = t.get("draft_swa_ratio", float, None, minimum=0.0, maximum=1.0)
    lookahead = t.get("lookahead_block_hashes", bool, True)
    cfg = SpeculativeConfig(enabled=enabled, algorithm=algorithm, num_draft_tokens=num_draft_tokens,
                            accept_rate=accept_rate, draft_layers=draft_layers, draft_full_size=draft_full,
                            draft_swa_ratio=ratio, lookahead_block_hashes=lookahead)
    if "swa" in draft_layers and cfg.draft_pool(pool).swa_size < page:
        key = "draft_swa_ratio" if ratio is not None else "draft_full_size"
        raise t.fail(key, f"leaves the draft an SWA pool of {cfg.draft_pool(pool).swa_size} slots, smaller than "
                          f"one page ({page})")
    t.done()
    return cfg


def _engine(t: TomlTable, pool: PoolConfig) -> EngineConfig:
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
        dp_other_tokens=read_distribution(t, "dp_other_tokens", d.dp_other_tokens, minimum=0),
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
        kv_offload=t.get("kv_offload", bool, d.kv_offload),
        kv_offload_load=t.get("kv_offload_load", str, d.kv_offload_load, allowed=("sync", "async")),
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
    if cfg.kv_offload_load != "sync" and not cfg.kv_offload:
        raise t.fail("kv_offload_load", "needs engine.kv_offload = true (it says how the offload tier loads)")
    if cfg.kv_offload and cfg.pd_decode:
        raise t.fail("kv_offload", "cannot be true with engine.pd_decode = true (a decode node's KV comes by its "
                                   "transfer, not from an offload tier)")
    if cfg.pd_decode:
        _pd_decode_combos(t, cfg, pool)
    t.done()
    return cfg


def _pd_decode_combos(t: TomlTable, cfg: EngineConfig, pool: PoolConfig) -> None:
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


def _unified_combos(t: TomlTable, cfg: EngineConfig) -> None:
    """What the unified pool (pool.unified) does not run with yet: each refused by the [engine] field."""
    why = {"radix_cache": "the prefix cache's page-level entry points are not v2p operations yet",
           "overlap": "the overlap timeline keeps a mapping of its own; the unified run pins the previous "
                      "forward's write window instead",
           "speculative": "draft pools and speculative give-backs are not translated yet"}
    on = {"radix_cache": cfg.radix_cache, "overlap": cfg.overlap, "speculative": cfg.speculative.enabled}
    for key, is_on in on.items():
        if is_on:
            raise t.fail(key, f"cannot be on with pool.unified = true ({why[key]})")


def _name(top: TomlTable, stem: str) -> str:
    """The scenario's name: it is the default output directory (out/<name>), so one plain directory name."""
    given = top.has("name")
    name = top.get("name", str, stem)
    problem = path_name_problem(name)
    if problem is not None:
        if given:
            raise top.fail("name", f"{short_repr(name)} {problem}")
        raise top.fail("name", f"not given, and the file's name gives {short_repr(name)}, which {problem}; "
                               f"give the scenario a name")
    return name


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
    top = TomlTable(data, "", source)
    name = _name(top, Path(source).stem)
    description = top.get("description", str, "")
    try:
        seed = top.get("seed", int, 0, minimum=0, maximum=MAX_SEED)
    except ScenarioError:
        raise top.fail("seed", f"must be an integer in [0, 2^63), got {short_repr(top.data['seed'])}") from None
    max_steps = top.get("max_steps", int, None, minimum=1)
    engine_release = top.get("engine_release", str, None)
    design = top.get("design", str, DEFAULT_DESIGN)
    backends = top.get("backends", list, list(BACKENDS))
    for i, b in enumerate(backends):
        if b not in BACKENDS:
            raise top.fail(f"backends[{i}]",
                           f"{short_repr(b)} is not a modelled backend (allowed: {', '.join(BACKENDS)})")
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
    return _design_beside(parse_scenario(text, str(p)), p)


def _design_beside(sc: Scenario, path: Path) -> Scenario:
    """A design file the scenario names by a relative path is the one beside the scenario file (not one in the
    current directory): the spec becomes that file's absolute path (the scenario's text and hash stay)."""
    spec = design_file_spec(sc.design)
    if spec is None or Path(spec[0]).is_absolute():
        return sc
    return replace(sc, design=f"{os.path.normpath((path.parent / spec[0]).absolute())}:{spec[1]}")
