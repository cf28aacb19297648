"""Bad input never ends in a traceback: exit 2, and the message names the file and the field or position."""
from __future__ import annotations

import pytest

from simulator.designs import load_design
from simulator.scenario import ScenarioError, load_scenario, parse_scenario
from slotscope.cli import main
from slotscope.resources import GIB, check_resources, estimate

from helpers import ROOT

BASE = '[model]\npreset = "gpt-oss-20b"\n\n[pool]\nfull_size = 4096\n\n[workload]\nrequests = 2\n'
HUGE = 2**70


def _run(path, tmp_path, capsys, *extra) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["run", str(path), "--out", str(tmp_path / "out"), "-q", "--no-report", "--trace-level", "off",
               "--device", "cpu", *extra])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def _write(tmp_path, text: str | bytes, name: str = "s.toml"):
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def _with(key_line: str, after: str = "") -> str:
    """BASE with ``key_line`` inserted after the line ``after`` (at the top when empty)."""
    if not after:
        return key_line + "\n" + BASE
    assert after in BASE
    key = key_line.split(" = ")[0] + " = "
    if after.startswith(key):                     # the same key: replace its line
        return BASE.replace(after, key_line, 1)
    return BASE.replace(after, after + "\n" + key_line, 1)


# --------------------------------------------------------------------------- the file itself

def test_not_utf8_names_the_byte_offset(tmp_path, capsys):
    p = _write(tmp_path, b'name = "caf\xe9"\n' + BASE.encode())
    rc, err = _run(p, tmp_path, capsys)
    assert rc == 2
    assert str(p) in err and "not UTF-8" in err and "offset 11" in err and "line 1" in err and "0xe9" in err


def test_not_utf8_later_line(tmp_path, capsys):
    p = _write(tmp_path, BASE.encode() + b'# \xff\xfe\n')
    rc, err = _run(p, tmp_path, capsys)
    assert rc == 2 and f"offset {len(BASE) + 2}" in err and "line 9, column 3" in err


def test_directory_empty_and_comment_only(tmp_path, capsys):
    d = tmp_path / "dir.toml"
    d.mkdir()
    rc, err = _run(d, tmp_path, capsys)
    assert rc == 2 and str(d) in err and "is a directory" in err
    rc, err = _run(_write(tmp_path, ""), tmp_path, capsys)
    assert rc == 2 and "s.toml" in err and "empty" in err
    rc, err = _run(_write(tmp_path, "# nothing\n\n", "c.toml"), tmp_path, capsys)
    assert rc == 2 and "c.toml" in err and "no scenario" in err
    rc, err = _run(tmp_path / "missing.toml", tmp_path, capsys)
    assert rc == 2 and "missing.toml" in err and "No such file" in err


def test_deeply_nested_toml(tmp_path, capsys):
    p = _write(tmp_path, "x = " + "[" * 100_000 + "]" * 100_000 + "\n" + BASE)
    rc, err = _run(p, tmp_path, capsys)
    assert rc == 2 and "s.toml" in err and "nested too deeply" in err


def test_byte_order_mark_is_accepted():
    # (a BOM is not an error: editors on Windows write one)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "bom.toml"
        p.write_bytes(b"\xef\xbb\xbf" + BASE.encode())
        assert load_scenario(p).pool.full_size == 4096


# --------------------------------------------------------------------------- NaN, inf, huge numbers

@pytest.mark.parametrize("line,after,field", [
    ("swa_ratio = nan", "full_size = 4096", "pool.swa_ratio"),
    ("swa_ratio = inf", "full_size = 4096", "pool.swa_ratio"),
    ('arrival = "poisson"\nrate = inf', "requests = 2", "workload.rate"),
    ("rate = nan", "requests = 2", "workload.rate"),
    ("rate = -inf", "requests = 2", "workload.rate"),
    ('prompt_len = { dist = "lognormal", mean = inf, sigma = 1.0, min = 1, max = 100 }', "requests = 2",
     "workload.prompt_len.mean"),
    ('prompt_len = { dist = "lognormal", mean = 1.0, sigma = nan, min = 1, max = 100 }', "requests = 2",
     "workload.prompt_len.sigma"),
    ('prompt_len = { dist = "choice", values = [1, 2], weights = [nan, 1.0] }', "requests = 2",
     "workload.prompt_len.weights[0]"),
    ('prompt_len = { dist = "choice", values = [1, 2], weights = [1.0, inf] }', "requests = 2",
     "workload.prompt_len.weights[1]"),
    ("[engine.speculative]\naccept_rate = nan", "requests = 2", "engine.speculative.accept_rate"),
    ("[engine.speculative]\ndraft_swa_ratio = inf", "requests = 2", "engine.speculative.draft_swa_ratio"),
])
def test_nan_and_inf_floats(tmp_path, capsys, line, after, field):
    rc, err = _run(_write(tmp_path, _with(line, after)), tmp_path, capsys)
    assert rc == 2 and f"s.toml: {field}: must be a finite number" in err, err


def test_weight_that_is_not_a_number(tmp_path, capsys):
    line = 'prompt_len = { dist = "choice", values = [1, 2], weights = [1.0, "x"] }'
    rc, err = _run(_write(tmp_path, _with(line, "requests = 2")), tmp_path, capsys)
    assert rc == 2 and "s.toml: workload.prompt_len.weights[1]: must be a number, got str 'x'" in err


@pytest.mark.parametrize("line,after,field", [
    (f"full_size = {HUGE}", "full_size = 4096", "pool.full_size"),
    (f"page_size = {HUGE}", "[pool]", "pool.page_size"),
    (f"requests = {HUGE}", "requests = 2", "workload.requests"),
    (f"prompt_len = {HUGE}", "requests = 2", "workload.prompt_len"),
    (f"output_len = {{ dist = \"uniform\", min = 1, max = {HUGE} }}", "requests = 2", "workload.output_len.max"),
    (f"prompt_len = {{ dist = \"choice\", values = [1, {HUGE}] }}", "requests = 2", "workload.prompt_len.values[1]"),
    (f"window = {HUGE}", 'preset = "gpt-oss-20b"', "model.window"),
    (f"num_layers = {HUGE}", 'preset = "gpt-oss-20b"', "model.num_layers"),
    (f"[model.full]\nheads = {HUGE}", 'preset = "gpt-oss-20b"', "model.full.heads"),
    (f"[engine]\nchunked_prefill_size = {HUGE}", "requests = 2", "engine.chunked_prefill_size"),
    (f"[engine]\ncuda_graph_bs = [1, {HUGE}]", "requests = 2", "engine.cuda_graph_bs[1]"),
    (f"[engine]\ncuda_graph_max_bs = {HUGE}", "requests = 2", "engine.cuda_graph_max_bs"),
    (f"[engine]\ndp_size = {HUGE}", "requests = 2", "engine.dp_size"),
    (f"[[workload.request]]\nprompt_len = {HUGE}\noutput_len = 1", "requests = 2", "workload.request[0].prompt_len"),
    (f"max_steps = {HUGE}", "", "max_steps"),
])
def test_huge_integers(tmp_path, capsys, line, after, field):
    text = _with(line, after)
    if "[[workload.request]]" in line:
        text = text.replace("requests = 2\n", "")
    rc, err = _run(_write(tmp_path, text), tmp_path, capsys)
    assert rc == 2 and f"s.toml: {field}: must be <= " in err, err


def test_huge_integer_for_a_float_field(tmp_path, capsys):
    rc, err = _run(_write(tmp_path, _with("swa_ratio = " + "1" + "0" * 400, "full_size = 4096")), tmp_path, capsys)
    assert rc == 2 and "s.toml: pool.swa_ratio: must be a finite number" in err


@pytest.mark.parametrize("value,msg", [(2**63, "must be an integer in [0, 2^63), got 9223372036854775808"),
                                       (HUGE, "must be an integer in [0, 2^63), got 1180591620717411303424"),
                                       (-1, "must be an integer in [0, 2^63), got -1"),
                                       ('"7"', "must be an integer in [0, 2^63), got '7'"),
                                       ("nan", "must be an integer in [0, 2^63), got nan")])
def test_seed_outside_range(tmp_path, capsys, value, msg):
    rc, err = _run(_write(tmp_path, _with(f"seed = {value}")), tmp_path, capsys)
    assert rc == 2 and f"s.toml: seed: {msg}" in err
    assert parse_scenario(_with(f"seed = {2**63 - 1}")).seed == 2**63 - 1


# --------------------------------------------------------------------------- sizes that do not fit

def test_pools_that_do_not_fit_are_refused_before_allocating(tmp_path, capsys):
    # gemma4-31b: 60 layers; 2^31 - 1 slots x 64 B (compact) is about 7.5 TiB in the one pool the backends share
    text = ('[model]\npreset = "gemma4-31b"\n\n[pool]\nfull_size = 2147483640\npage_size = 8\n\n'
            '[workload]\nrequests = 1\nprompt_len = 4\noutput_len = 1\n')
    rc, err = _run(_write(tmp_path, text), tmp_path, capsys)
    assert rc == 2
    assert "s.toml: pool.full_size = 2,147,483,640: the run would not fit in memory" in err
    assert ("the pools under test (1 pool shared by 8 backends, copied only where a backend's writes diverge: "
            "10 full layers x 2,147,483,648 rows x 64 B + 50 SWA layers") in err
    assert "GiB" in err and "MemAvailable" in err
    assert not (tmp_path / "out").exists()     # refused before the run directory was made


def test_generated_requests_that_do_not_fit(tmp_path, capsys):
    sc = parse_scenario(_with("requests = 2000000000", "requests = 2").replace("requests = 2\n", "", 1), "w.toml")
    with pytest.raises(ScenarioError, match=r"w\.toml: workload\.requests = 2,000,000,000: .*2,000,000,000 "
                                            r"generated requests need about 476\.8 GiB"):
        check_resources(sc, load_design(sc.design), "cpu", "compact", host_bytes=64 * GIB)


def test_draft_pool_named_when_it_dominates():
    text = _with("[engine.speculative]\ndraft_full_size = 200000000", "requests = 2")
    sc = parse_scenario(text, "d.toml")
    design = load_design("sglang-pre-17630")      # keeps the configured (here: huge) draft size
    with pytest.raises(ScenarioError, match=r"d\.toml: engine\.speculative\.draft_full_size = 200,000,000: .*"
                                            r"the draft's pools \(8 backends x \(1 full layers x 200,000,001 rows"):
        check_resources(sc, design, "cpu", "compact", host_bytes=16 * GIB)


def test_estimate_matches_the_pools_allocated():
    from cuda_path.pool import TaggedKVPool

    sc = load_scenario(ROOT / "scenarios/b3-draft-pool-size.toml")
    design = load_design(sc.design)
    for geometry in ("compact", "real"):
        est = estimate(sc, design, "cpu", geometry)
        pools = est.parts[0]
        rows = (sc.pool.full_size + 1, sc.pool.swa_size + 1)
        one = TaggedKVPool(sc.model, *rows, geometry=geometry).bytes()
        assert pools.nbytes == len(sc.backends) * one and pools.field == "pool.full_size"
        draft = est.parts[1]
        assert draft.field == "engine.speculative.draft_full_size"


def test_gpu_estimate_is_checked_against_device_memory():
    sc = load_scenario(ROOT / "scenarios/scale.toml")
    design = load_design(sc.design)
    check_resources(sc, design, "cuda", "real", host_bytes=64 * GIB, device_bytes=139 * GIB)   # an H200: fits
    with pytest.raises(ScenarioError, match=r"scale\.toml: pool\.full_size = 65,536: .*real geometry\) need about "
                                            r"32\.9 GiB.*free memory on cuda.*use --geometry compact"):
        check_resources(sc, design, "cuda", "real", host_bytes=64 * GIB, device_bytes=16 * GIB)


def test_shared_pools_make_a_deployment_size_pool_fit_an_h200():
    """Issue 30: scale at pool.full_size = 262144 needs 8 x 16.5 GiB of pools when each backend owns one (refused
    with 120 GiB free), one pool when the graph executor shares it; the message counts the shared pool."""
    import dataclasses

    from slotscope.resources import pools_shared

    sc = load_scenario(ROOT / "scenarios/scale.toml")
    sc = dataclasses.replace(sc, pool=dataclasses.replace(sc.pool, full_size=262144))
    design = load_design(sc.design)
    assert pools_shared(sc, "cuda", cuda_graphs=True) and not pools_shared(sc, "cuda")
    assert pools_shared(sc, "cpu") and not pools_shared(sc, "cpu", plugins=True)
    own = estimate(sc, design, "cuda", "real").parts[0]
    one = estimate(sc, design, "cuda", "real", shared=True).parts[0]
    assert own.nbytes == 8 * one.nbytes and one.nbytes > 16 * GIB
    assert "1 pool shared by 8 backends, copied only where a backend's writes diverge" in one.what
    check_resources(sc, design, "cuda", "real", shared=True, host_bytes=64 * GIB, device_bytes=139 * GIB)
    with pytest.raises(ScenarioError, match=r"pool\.full_size = 262,144: .*8 backends x .*the number of layers or "
                                            r"backends"):
        check_resources(sc, design, "cuda", "real", host_bytes=64 * GIB, device_bytes=120 * GIB)
    check_resources(sc, design, "cuda", "real", shared=True, host_bytes=64 * GIB, device_bytes=120 * GIB)
    with pytest.raises(ScenarioError, match=r"1 pool shared by 8 backends.* need about 16\.\d GiB.*the number of "
                                            r"layers or use --geometry compact"):
        check_resources(sc, design, "cuda", "real", shared=True, host_bytes=64 * GIB, device_bytes=12 * GIB)
    overlap = dataclasses.replace(sc, engine=dataclasses.replace(sc.engine, overlap=True))
    assert not pools_shared(overlap, "cuda", cuda_graphs=True) and not pools_shared(overlap, "cpu")


def test_real_geometry_rows_too_small_for_a_tag():
    text = _with("[model.swa]\nheads = 1\nhead_dim = 4", 'preset = "gpt-oss-20b"')
    sc = parse_scenario(text, "g.toml")
    check_resources(sc, load_design(sc.design), "cpu", "compact", host_bytes=64 * GIB)
    with pytest.raises(ScenarioError, match=r"g\.toml: model\.swa\.head_dim: rows of 1 head\(s\) x 4 lanes"):
        check_resources(sc, load_design(sc.design), "cpu", "real", host_bytes=64 * GIB)


def test_cuda_estimate_takes_the_layout_the_pools_take():
    """SWA rows of 1 x 16 lanes are too narrow for the paired layout's tail tag: a CUDA pool of this model is
    split (cuda_path.pool.pool_layout), and the estimate counts split rows, not paired slots."""
    from cuda_path.pool import estimate_bytes, pool_layout

    sc = parse_scenario(_with("[model.swa]\nheads = 1\nhead_dim = 16", 'preset = "gpt-oss-20b"'), "g.toml")
    assert pool_layout(sc.model, "cuda", "real") == "split"
    est = estimate(sc, load_design(sc.design), "cuda", "real")
    rows = (sc.pool.full_size + sc.pool.page_size, sc.pool.swa_size + sc.pool.page_size)
    split = estimate_bytes(sc.model, *rows, "real", pools=len(sc.backends), layout="split")
    assert est.parts[0].nbytes == split != estimate_bytes(sc.model, *rows, "real", pools=len(sc.backends),
                                                          layout="paired")


def test_shipped_scenarios_fit_here():
    for path in sorted((ROOT / "scenarios").glob("*.toml")):
        if path.stem.startswith("corpus"):
            continue
        sc = load_scenario(path)
        check_resources(sc, load_design(sc.design), "cpu", "compact", host_bytes=4 * GIB)


def test_memory_check_can_be_skipped(monkeypatch):
    from slotscope import resources

    sc = load_scenario(ROOT / "scenarios/scale.toml")
    monkeypatch.setattr(resources, "host_available", lambda: GIB // 4)
    with pytest.raises(ScenarioError, match="SLOTSCOPE_SKIP_MEMORY_CHECK=1 to run anyway"):
        check_resources(sc, load_design(sc.design), "cpu", "compact")
    monkeypatch.setenv("SLOTSCOPE_SKIP_MEMORY_CHECK", "1")
    assert check_resources(sc, load_design(sc.design), "cpu", "compact").total(False) > GIB // 4


# --------------------------------------------------------------------------- sharing fields

def _explicit(*reqs: str) -> str:
    return BASE.replace("requests = 2\n", "") + "".join(f"\n[[workload.request]]\n{r}\n" for r in reqs)


@pytest.mark.parametrize("text,field,msg", [
    (_with("share = 0.5", "requests = 2"), "workload.share", "needs workload.system_prompts >= 1"),
    (_with("system_prompts = 1\nshare = 1.5", "requests = 2"), "workload.share", "must be <= 1.0"),
    (_with("system_prompts = -1", "requests = 2"), "workload.system_prompts", "must be >= 0"),
    (_with("system_prompt_len = 9", "requests = 2"), "workload.system_prompt_len", "needs workload.system_prompts"),
    (_with("system_prompts = 1\nsystem_prompt_len = 0", "requests = 2"), "workload.system_prompt_len", "must be >= 1"),
    (_with("turns = 0", "requests = 2"), "workload.turns", "must be >= 1"),
    (_with("think_time = 2", "requests = 2"), "workload.think_time", "needs workload.turns"),
    (_with("turns = 2\nthink_time = -1", "requests = 2"), "workload.think_time", "must be >= 0"),
    (_explicit('prompt_len = 10\noutput_len = 1\nprefix_group = "g"\nprefix_len = 11'),
     "workload.request[0].prefix_len", "11 is larger than prompt_len 10"),
    (_explicit("prompt_len = 10\noutput_len = 1\nprefix_len = 4"), "workload.request[0].prefix_len", "needs prefix_group"),
    (_explicit('prompt_len = 10\noutput_len = 1\nprefix_group = "g"'), "workload.request[0].prefix_len", "is required"),
    (_explicit('prompt_len = 10\noutput_len = 1\nprefix_group = ""\nprefix_len = 1'),
     "workload.request[0].prefix_group", "must not be empty"),
    (_explicit("prompt_len = 10\noutput_len = 1\nturn = 1"), "workload.request[0].turn", "needs conversation"),
    (_explicit('prompt_len = 10\noutput_len = 1\nconversation = "c"'), "workload.request[0].turn", "is required"),
    (_explicit('prompt_len = 10\noutput_len = 1\nconversation = "c"\nturn = 0'), "workload.request[0].turn", "must be >= 1"),
    (_explicit('prompt_len = 10\noutput_len = 1\nconversation = "c"\nturn = 1\nthink_time = 2'),
     "workload.request[0].think_time", "turn >= 2"),
    (_explicit('prompt_len = 10\noutput_len = 1\nconversation = "c"\nturn = 1',
               'prompt_len = 30\noutput_len = 1\nconversation = "c"\nturn = 3'),
     "workload.request[1].turn", "has turn 3 but no turn 2"),
    (_explicit('prompt_len = 10\noutput_len = 1\nconversation = "c"\nturn = 1',
               'prompt_len = 30\noutput_len = 1\nconversation = "c"\nturn = 1'),
     "workload.request[1].turn", "turn 1 of conversation 'c' is given twice (also request[0])"),
    (_explicit('prompt_len = 10\noutput_len = 5\nconversation = "c"\nturn = 1',
               'prompt_len = 15\noutput_len = 1\nconversation = "c"\nturn = 2'),
     "workload.request[1].prompt_len", "must be longer than 15, got 15"),
    (_explicit('prompt_len = 10\noutput_len = 1\nconversation = "c"\nturn = 1\nprefix_group = "a"\nprefix_len = 4',
               'prompt_len = 20\noutput_len = 1\nconversation = "c"\nturn = 2\nprefix_group = "b"\nprefix_len = 4'),
     "workload.request[1].prefix_group", "inherits turn 1's prefix ('a', 4 tokens)"),
    (_explicit("prompt_len = 10\noutput_len = 1").replace("[workload]\n", "[workload]\nturns = 2\n"),
     "workload.turns", "applies to generated requests only"),
    (_with("[engine]\nradix_cache = 1", "requests = 2"), "engine.radix_cache", "must be true or false"),
])
def test_sharing_fields_are_validated_by_name(text, field, msg):
    with pytest.raises(ScenarioError) as e:
        parse_scenario(text, "s.toml")
    assert f"s.toml: {field}: " in str(e.value) and msg in str(e.value), str(e.value)


def test_sharing_field_error_through_the_cli(tmp_path, capsys):
    text = _explicit('prompt_len = 10\noutput_len = 1\nprefix_group = "g"\nprefix_len = 99')
    rc, err = _run(_write(tmp_path, text), tmp_path, capsys)
    assert rc == 2 and "s.toml: workload.request[0].prefix_len: 99 is larger than prompt_len 10" in err
