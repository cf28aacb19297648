"""Scenario.to_toml: every validated scenario written back as TOML reads back equal (all fields)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from simulator.scenario.models import PRESETS
from simulator.scenario import BACKENDS, EngineConfig, ScenarioError, load_scenario, parse_scenario
from simulator.scenario.toml_write import dumps

from helpers import ROOT

SCENARIOS = [p for p in sorted((ROOT / "scenarios").glob("*.toml")) if not p.stem.startswith("corpus")]


@pytest.mark.parametrize("defaults", [True, False], ids=["explicit", "compact"])
@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_shipped_scenario_round_trips(path, defaults):
    sc = load_scenario(path)
    back = parse_scenario(sc.to_toml(defaults=defaults), "back.toml")
    assert back == sc
    # equality covers every field; check the ones a writer most easily drops
    assert back.model.layer_kinds == sc.model.layer_kinds and back.model.unverified == sc.model.unverified
    assert back.engine.cuda_graph_bs == sc.engine.cuda_graph_bs
    assert back.engine.piecewise_capture_sizes == sc.engine.piecewise_capture_sizes
    assert back.engine.speculative == sc.engine.speculative


def test_explicit_toml_names_the_model_and_engine_in_full():
    text = load_scenario(ROOT / "scenarios/b3-draft-pool-size.toml").to_toml()
    for line in ('layers = "SFSF"', "window = 32", 'kv_dtype = "bf16"', "[model.full]", "[model.swa]",
                 "cuda_graph_bs = [1, 2, 3,", "piecewise_capture_sizes = [4, 8,", "[engine.speculative]",
                 "draft_full_size = 1024", "accept_rate = 0.7"):
        assert line in text


def test_max_steps_key_and_override():
    base = 'name = "m"\n[model]\npreset = "gpt-oss-20b"\n[pool]\nfull_size = 64\n[workload]\nrequests = 1\n'
    assert parse_scenario(base).max_steps is None
    sc = parse_scenario("max_steps = 5\n" + base)
    assert sc.max_steps == 5 and "max_steps = 5" in sc.to_toml()
    assert parse_scenario(sc.to_toml()) == sc
    assert sc.with_overrides(max_steps=2).max_steps == 2 and sc.with_overrides().max_steps == 5
    for bad in ("0", "-3", "1.5", "true", '"7"'):
        with pytest.raises(ScenarioError, match=r"x\.toml: max_steps"):
            parse_scenario(f"max_steps = {bad}\n" + base, "x.toml")
    with pytest.raises(ScenarioError, match="max_steps"):
        sc.with_overrides(max_steps=0)


def _dist(lo: int):
    fixed = st.integers(lo, 500)
    table = st.one_of(
        st.builds(lambda v: {"dist": "fixed", "value": v}, st.integers(lo, 500)),
        st.tuples(st.integers(lo, 200), st.integers(0, 300)).map(
            lambda t: {"dist": "uniform", "min": t[0], "max": t[0] + t[1]}),
        st.tuples(st.floats(-2, 6, allow_nan=False), st.floats(0, 2, allow_nan=False), st.integers(lo, 50),
                  st.integers(1, 400)).map(
            lambda t: {"dist": "lognormal", "mean": t[0], "sigma": t[1], "min": t[2], "max": max(t[2], 1) + t[3]}),
        st.lists(st.integers(lo, 400), min_size=1, max_size=5).flatmap(
            lambda vs: st.one_of(st.just({"dist": "choice", "values": vs}),
                                 st.lists(st.floats(0.1, 10), min_size=len(vs), max_size=len(vs)).map(
                                     lambda ws: {"dist": "choice", "values": vs, "weights": ws}))),
    )
    return st.one_of(fixed, table)


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
_geom = st.fixed_dictionaries({}, optional={"heads": st.integers(1, 16), "head_dim": st.integers(1, 512),
                                            "v_head_dim": st.integers(1, 512)})


@st.composite
def scenario_data(draw) -> dict:
    page = draw(st.sampled_from([1, 1, 2, 16]))
    d: dict = {"name": draw(_text), "description": draw(_text), "seed": draw(st.integers(0, 2**63 - 1)),
               "design": draw(_text)}
    if draw(st.booleans()):
        d["backends"] = draw(st.lists(st.sampled_from(BACKENDS), min_size=1, max_size=8, unique=True))
    if draw(st.booleans()):
        d["max_steps"] = draw(st.integers(1, 10**6))
    model: dict = {}
    if draw(st.booleans()):
        model["preset"] = draw(st.sampled_from(sorted(PRESETS)))
    if "preset" not in model or draw(st.booleans()):
        model["layers"] = draw(st.text("SF", min_size=1, max_size=12))
    if "preset" not in model or draw(st.booleans()):
        model["window"] = draw(st.integers(1, 10**5))
    for key, strat in (("name", _text), ("kv_dtype", st.sampled_from(["bf16", "fp16", "fp8_e4m3"])),
                       ("full", _geom), ("swa", _geom)):
        if draw(st.booleans()):
            model[key] = draw(strat)
    d["model"] = model
    d["pool"] = {"full_size": page * draw(st.integers(2, 5000)), "page_size": page}
    if draw(st.booleans()):
        d["pool"]["swa_ratio"] = draw(st.floats(0.3, 1.0))
    wl: dict = {}
    if draw(st.booleans()):
        wl["request"] = draw(st.lists(st.fixed_dictionaries(
            {"prompt_len": st.integers(1, 900), "output_len": st.integers(0, 50)},
            optional={"arrival_step": st.integers(0, 30)}), min_size=1, max_size=6))
        _sharing_requests(draw, wl["request"])
    else:
        wl["requests"] = draw(st.integers(1, 100))
        if draw(st.booleans()):
            wl["system_prompts"] = draw(st.integers(1, 4))
            for key, strat in (("system_prompt_len", _dist(1)), ("share", st.floats(0, 1))):
                if draw(st.booleans()):
                    wl[key] = draw(strat)
        if draw(st.booleans()):
            wl["turns"] = draw(st.one_of(st.integers(2, 5), _dist(1)))
            if draw(st.booleans()):
                wl["think_time"] = draw(_dist(0))
    for key, strat in (("arrival", st.sampled_from(["all_at_once", "poisson"])), ("rate", st.floats(0.01, 50)),
                       ("prompt_len", _dist(1)), ("output_len", _dist(0))):
        if draw(st.booleans()):
            wl[key] = draw(strat)
    d["workload"] = wl
    if draw(st.booleans()):
        eng: dict = {}
        spec = draw(st.booleans())
        for key, strat in (("chunked_prefill_size", st.integers(1, 9000)), ("max_running_requests", st.integers(1, 64)),
                           ("mixed_chunk", st.just(False) if spec else st.booleans()), ("dp_size", st.integers(1, 8)),
                           ("dp_other_tokens", _dist(0)), ("piecewise_cuda_graph", st.booleans()),
                           ("piecewise_max_tokens", st.integers(4, 9000)),
                           ("piecewise_capture_sizes", st.sets(st.integers(1, 9000), min_size=1, max_size=8).map(sorted)),
                           ("piecewise_shrink", st.booleans()), ("cuda_graph", st.booleans()),
                           ("cuda_graph_max_bs", st.integers(1, 600)),
                           ("cuda_graph_bs", st.sets(st.integers(1, 600), min_size=1, max_size=8).map(sorted)),
                           ("attn_tp_size", st.integers(1, 1024)), ("swa_eviction_interval", st.integers(1, 10**6)),
                           ("radix_cache", st.booleans())):
            if draw(st.booleans()):
                eng[key] = draw(strat)
        if spec:
            s: dict = {}
            for key, strat in (("enabled", st.booleans()), ("num_draft_tokens", st.integers(2, 64)),
                               ("accept_rate", st.floats(0, 1)), ("draft_layers", st.text("SF", min_size=1, max_size=3)),
                               ("draft_full_size", st.integers(2, 5000).map(lambda n: n * page)),
                               ("draft_swa_ratio", st.floats(0.3, 1.0))):
                if draw(st.booleans()):
                    s[key] = draw(strat)
            eng["speculative"] = s
        d["engine"] = eng
    return d


def _sharing_requests(draw, reqs: list) -> None:
    """Give explicit requests prefix groups and make a run of them one conversation (valid lengths)."""
    for r in reqs:
        if draw(st.booleans()):
            r["prefix_group"] = draw(st.sampled_from(["sys", "b", "\u00e9"]))
            r["prefix_len"] = draw(st.integers(1, r["prompt_len"]))
    if len(reqs) >= 2 and draw(st.booleans()):
        first = draw(st.integers(0, len(reqs) - 2))
        n = draw(st.integers(2, len(reqs) - first))
        for k, r in enumerate(reqs[first:first + n], start=1):
            r["conversation"], r["turn"] = "c", k
            if k > 1:
                prev = reqs[first + k - 2]
                r["prompt_len"] = prev["prompt_len"] + prev["output_len"] + draw(st.integers(1, 50))
                r.pop("prefix_group", None)
                r.pop("prefix_len", None)
                if draw(st.booleans()):
                    r["think_time"] = draw(st.integers(0, 20))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario_data())
def test_round_trip_of_any_valid_scenario(data):
    try:
        sc = parse_scenario(dumps(data), "gen.toml")
    except ScenarioError:
        assume(False)
        raise
    for defaults in (True, False):
        text = sc.to_toml(defaults=defaults)
        assert parse_scenario(text, "back.toml") == sc, text


SHARED = """name = "s"
[model]
preset = "gpt-oss-20b"
[pool]
full_size = 4096
[engine]
radix_cache = true
[workload]
[[workload.request]]
prompt_len = 100
output_len = 10
prefix_group = "sys"
prefix_len = 40
conversation = "c"
turn = 1
[[workload.request]]
prompt_len = 130
output_len = 5
conversation = "c"
turn = 2
think_time = 3
[[workload.request]]
prompt_len = 60
output_len = 1
prefix_group = "sys"
prefix_len = 40
[[workload.request]]
prompt_len = 60
output_len = 1
"""


def test_sharing_fields_round_trip_and_token_identity():
    sc = parse_scenario(SHARED, "s.toml")
    assert sc.engine.radix_cache and EngineConfig().radix_cache is False
    t1, t2, r3, r4 = sc.workload.explicit
    assert t2.prefix_group == "sys" and t2.prefix_len == 40 and t2.think_time == 3    # inherited from turn 1
    for defaults in (True, False):
        text = sc.to_toml(defaults=defaults)
        assert parse_scenario(text, "back.toml") == sc
        assert text.count("prefix_group") == 2 and "radix_cache = true" in text
    a, b, c, d = (r.tokens() for r in sc.workload.explicit)
    assert (b[:110] == a).all() and not np.isin(b[110:], a).any()             # turn 2 starts with turn 1
    assert (c[:40] == a[:40]).all() and not np.isin(c[40:], a).any()          # the group's 40 tokens only
    assert not np.isin(d, np.concatenate([a, b, c])).any()                    # nothing shared
    assert (r3.tokens(35, 45) == c[35:45]).all()
    # a scenario that leaves the sharing keys out writes none of them
    plain = load_scenario(ROOT / "scenarios/smoke.toml").to_toml(defaults=True)
    for key in ("radix_cache", "system_prompts", "turns", "prefix_group", "conversation"):
        assert key not in plain


def test_generated_sharing_is_deterministic_and_leaves_plain_workloads_alone():
    from simulator.scheduling.workload import make_requests

    base = 'name = "g"\n[model]\npreset = "gpt-oss-20b"\n[pool]\nfull_size = 4096\n[workload]\nrequests = 6\n'
    plain = parse_scenario(base + 'arrival = "poisson"\nrate = 0.5\nprompt_len = { dist = "uniform", min = 5, max = 50 }\n')
    got = make_requests(plain.workload, np.random.default_rng(3))
    rng = np.random.default_rng(3)                       # what make_requests drew before sharing existed
    arrivals = np.floor(np.cumsum(rng.exponential(2.0, size=6))).astype(np.int64)
    prompts = plain.workload.prompt_len.sample(rng, 6)
    outputs = plain.workload.output_len.sample(rng, 6)
    assert [(r.arrival_step, r.prompt_len, r.output_len) for r in got] == list(zip(arrivals, prompts, outputs))
    assert all(r.prefix_group is None and r.conversation is None for r in got)
    shared = parse_scenario(base + 'system_prompts = 2\nsystem_prompt_len = 32\nshare = 0.5\nturns = 3\n'
                                   'think_time = { dist = "uniform", min = 0, max = 4 }\n')
    reqs = make_requests(shared.workload, np.random.default_rng(0))
    assert reqs == make_requests(shared.workload, np.random.default_rng(0))
    assert len(reqs) == 18 and sorted({r.uid for r in reqs}) == list(range(18))
    convs: dict = {}
    for r in reqs:
        convs.setdefault(r.conversation, []).append(r)
    assert len(convs) == 6
    for turns in convs.values():
        assert [t.turn for t in turns] == [1, 2, 3]
        for prev, nxt in zip(turns, turns[1:]):
            assert nxt.prompt_len > prev.total_len and 0 <= nxt.think_time <= 4
            assert (nxt.tokens(0, prev.total_len) == prev.tokens()).all()
        with_sys = turns[0].prefix_group is not None
        assert not with_sys or (turns[0].prefix_len == 32 and turns[0].prompt_len == 32 + 128)
    groups = {r.prefix_group for r in reqs} - {None}
    assert groups <= {"system0", "system1"}
    same = [r for r in reqs if r.prefix_group == "system0" and r.turn == 1]
    if len(same) > 1:
        assert (same[0].tokens(0, 32) == same[1].tokens(0, 32)).all()
        assert not (same[0].tokens(32, 40) == same[1].tokens(32, 40)).any()
