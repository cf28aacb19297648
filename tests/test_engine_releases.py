"""SGLang's real write path against slotscope's oracle, per release (0.5.14: before the #29460 fix; 0.5.23).

Each release is imported once, in a subprocess of its own (one release per process: the session's warm
server of it, tests/warm_engine.py), whose forked child runs engine_path.checks.release_report; the two
releases run at once. The tests below assert on what the
release's own code did there.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from engine_path import isolate

pytestmark = pytest.mark.engine

SCENARIOS = ["scenarios/b1-pcg-dp-padding.toml", "scenarios/gap-swa-shorter.toml", "scenarios/paths-paged.toml"]
#: run through the shared step and the run's own step (engine_path.checks.shared_step_run)
SHARED = ["scenarios/b1-pcg-dp-padding.toml", "scenarios/gap-swa-shorter.toml"]
ALL_BACKENDS = ("flashinfer", "triton", "flashattention", "trtllm_mha", "aiter", "xpu", "torch_native", "musa")


@pytest.fixture(scope="module")
def _children(engine_releases, warm):
    """Every child of this module at once: one report per release (forked from the session's one import of
    it: tests/warm_engine.py), and ``--engine sglang`` (the cached 0.5.23 put on PYTHONPATH, as an installed or
    editable checkout would be) in a fresh subprocess of its own."""
    with ThreadPoolExecutor(len(engine_releases) + 1) as ex:
        futures = {v: ex.submit(warm(f"sglang=={v}").call, "engine_path.checks:release_report", SCENARIOS, SHARED)
                   for v in engine_releases}
        installed = ex.submit(isolate.call, "sglang", "engine_path.checks:info",
                              env={"PYTHONPATH": str(engine_releases["0.5.23"])})
        return {v: f.result() for v, f in futures.items()}, installed.result()


@pytest.fixture(scope="module")
def reports(_children):
    return _children[0]


def test_engine_info_names_the_cached_release(reports, engine_releases):
    for v, rep in reports.items():
        assert rep["info"]["name"] == "sglang" and rep["info"]["version"] == v
        assert rep["info"]["path"] == str(engine_releases[v] / "sglang")


def test_features_are_found_by_probing(reports):
    old, new = reports["0.5.14"]["features"], reports["0.5.23"]["features"]
    assert not old["has_post_init_slice"] and old["write_loc_fields"] == ["loc", "swa_loc"]
    assert not old["has_plan_ids"] and old["plan_backends"] == []
    assert old["pool_takes_transpose_flag"] and old["eviction_api"] == "req"
    assert not old["paged_alloc_has_cpu_path"]           # its paged allocator is Triton-only (interpreted on CPU)
    assert new["has_post_init_slice"] and new["write_loc_fields"] == ["loc", "swa_loc", "full_loc", "physical"]
    assert new["has_plan_ids"] and new["eviction_api"] == "kv"
    assert new["plan_backends"] == sorted(["flashinfer", "triton", "flashattention", "trtllm_mha", "musa"])


def test_b1_in_the_real_code_0514_raises_the_shape_error(reports):
    for backend, r in reports["0.5.14"]["b1_longer"].items():
        assert (r["out_cache_loc_len"], r["loc_len"], r["swa_len"]) == (17, 14, 17), backend
        assert r["full"] == "ok"
        assert r["swa"].startswith("KVLengthMismatch: RuntimeError: shape mismatch")
        assert "[14, 1, 16]" in r["swa"] and "[17, 1, 16]" in r["swa"]


def test_b1_in_the_real_code_0523_slices(reports):
    b1 = reports["0.5.23"]["b1_longer"]
    assert b1["flashinfer"]["translation"] == "plan" and b1["torch_native"]["translation"] == "translate"
    for backend, r in b1.items():
        assert (r["out_cache_loc_len"], r["loc_len"], r["swa_len"]) == (17, 14, 14), backend
        assert r["full"] == "ok" and r["swa"] == "ok"     # and the rows read back are the tokens'


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_a_shorter_swa_loc_still_fails_the_fixes_gap(reports, version):
    r = reports[version]["b1_shorter"]
    assert (r["loc_len"], r["swa_len"]) == (14, 12)
    assert r["full"] == "ok"
    assert "shape mismatch" in r["swa"] and "[12, 1, 16]" in r["swa"]


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
@pytest.mark.parametrize("page", ["1", "16"])
def test_engine_allocator_keeps_the_models_invariants(reports, version, page):
    """Extends, decodes, evictions, truncations and frees at random; the model's invariants asserted after
    every operation inside the child (a failure there fails the report)."""
    r = reports[version]["alloc"][page]
    assert r["extend"] > 50 and r["decode"] > 20 and r["evict"] > 5 and r["truncate"] > 5 and r["free"] > 30
    assert r["full_used_at_end"] == 0 and r["swa_used_at_end"] == 0


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_every_backends_swa_ids_equal_the_mapping_on_the_static_pool(reports, version):
    tr = reports[version]["translation"]
    assert set(tr) == set(ALL_BACKENDS)
    for backend, t in tr.items():
        assert t["equal"], backend
    plan = {b for b, t in tr.items() if t["source"] == "plan"}
    assert plan == set(reports[version]["features"]["plan_backends"])


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_the_releases_eviction_rule_keeps_the_window(reports, version):
    window = 8
    for page, r in reports[version]["eviction"].items():
        p = int(page)
        want = [((40 + i) - window) // p * p for i in range(40)]       # no prefix sharing: up to the window
        assert r["evicted"] == want, page
        assert r["length"] == 80


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_tags_round_trip_through_the_releases_pool(reports, version):
    r = reports[version]["pool"]
    assert r["full"] and r["swa"] and r["full_mismatch_free"] and r["swa_mismatch_free"]
    assert r["out_of_range"] == [1, 1]          # one index past the buffer, at position 1


def test_one_release_per_process(reports):
    for rep in reports.values():
        assert "one release per process" in rep["second_release"]


def test_b1_scenario_with_0514_gives_length_mismatch_on_every_backend(reports):
    run = reports["0.5.14"]["scenarios"]["scenarios/b1-pcg-dp-padding.toml"]
    assert run["design"] == "sglang-0.5.14"
    for backend, st in run["backends"].items():
        # every backend: no release's backend slices its own swa_loc (0.5.14's trtllm_mha neither)
        assert st["findings"]["length_mismatch"] > 0, backend
        assert st["first_finding"]["class"] == "length_mismatch"
        assert sum(v for k, v in st["findings"].items() if k != "length_mismatch") == 0, backend


def test_b1_scenario_with_0523_is_clean(reports):
    run = reports["0.5.23"]["scenarios"]["scenarios/b1-pcg-dp-padding.toml"]
    assert run["swa_ids"]["flashinfer"] == "plan" and run["swa_ids"]["aiter"] == "translate"
    for backend, st in run["backends"].items():
        assert sum(st["findings"].values()) == 0, (backend, st)
        assert st["writes"] > 0


def test_gap_scenario_fails_in_0523s_real_code(reports):
    run = reports["0.5.23"]["scenarios"]["scenarios/gap-swa-shorter.toml"]
    for backend, st in run["backends"].items():
        assert st["findings"]["length_mismatch"] > 0, backend


def test_installed_sglang_is_used_as_it_is(_children, engine_releases):
    """``--engine sglang``: whatever ``import sglang`` finds (here the cached 0.5.23 put on PYTHONPATH, as an
    installed or editable checkout would be), reported with its own version and path."""
    where = engine_releases["0.5.23"]
    got = _children[1]
    assert got["info"] == {"name": "sglang", "version": "0.5.23", "path": str(where / "sglang")}
    assert got["features"]["has_post_init_slice"]


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_page1_fifo_model_hands_out_the_engines_slots(reports, version):
    """Conformance of the allocator model: at page size 1 the model's FIFO free lists give exactly the slots
    the release gives, op for op, until the pool runs out; LIFO does not. At page size 16 the release hands
    the most recently freed pages out first, so neither order of the model matches it throughout
    (docs/ENGINE.md)."""
    d = reports[version]["differential"]
    assert d["page 1 fifo"]["first_difference"] is None and d["page 1 fifo"]["ops"] > 200
    assert d["page 1 lifo"]["first_difference"] is not None
    assert d["page 16 fifo"]["first_difference"] is not None


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_engine_design_follows_the_design_interface(reports, version):
    d = reports[version]["design"]
    assert d["name"] == f"sglang-{version}"
    assert d["shares_translator"]                      # the run's deep copies read one live mapping
    assert d["is_sim_write_loc"] and d["translate_equal"]
    assert d["lens"] == ([10, 13] if version == "0.5.14" else [10, 10])     # the release's __post_init__
    plan = set(reports[version]["features"]["plan_backends"])
    assert {b for b, s in d["swa_ids"].items() if s == "plan"} == plan
    assert "SWATokenToKVPoolAllocator" in d["describe"]["allocator"]


def test_each_adapter_says_what_it_found(reports):
    old, new = reports["0.5.14"]["design"]["found"], reports["0.5.23"]["design"]["found"]
    assert not old["allocator"]["has_free_full"] and new["allocator"]["has_free_full"]
    assert not old["allocator"]["paged_alloc_has_cpu_path"] and new["allocator"]["paged_alloc_has_cpu_path"]
    assert not old["translator"]["has_post_init_slice"] and new["translator"]["has_post_init_slice"]
    assert old["translator"]["plan_backends"] == [] and "flashinfer" in new["translator"]["plan_backends"]
    assert old["pool"]["pool_takes_transpose_flag"] and not new["pool"]["pool_takes_transpose_flag"]
    assert not old["pool"]["kv_halves_of_one_allocation"] and new["pool"]["kv_halves_of_one_allocation"]
    assert reports["0.5.14"]["eviction"]["1"]["found"]["options_passed"] == {"drop_page_margin": True}
    assert reports["0.5.23"]["eviction"]["1"]["found"]["options_passed"] == {"supports_prefix_sharing": False,
                                                                            "eviction_interval": 1}


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_paged_scenario_runs_on_the_releases_allocator_and_eviction_rule(reports, version):
    """Page size 16 end to end: the release's alloc_extend / alloc_decode and its eviction rule ran (0.5.14's
    through the Triton interpreter); 0.5.23 is clean, 0.5.14 shows only B1 (the scenario pads DP ranks
    under piecewise graphs, on every backend: none slices its own swa_loc)."""
    run = reports[version]["scenarios"]["scenarios/paths-paged.toml"]
    calls = run["engine_calls"]
    assert run["page_size"] == 16
    assert calls["alloc_extend"] > 0 and calls["alloc_decode"] > 0 and calls["eviction_rule"] > 0 and calls["free"] > 0
    assert calls["alloc"] == 0
    for backend, st in run["backends"].items():
        others = sum(n for cls, n in st["findings"].items() if cls != "length_mismatch")
        assert others == 0, (backend, st)
        if version == "0.5.23":
            assert st["findings"]["length_mismatch"] == 0, (backend, st)


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_graph_static_buffers_are_refreshed_by_the_releases_code(reports, version):
    """fill_graph_loc_buffer / fill_graph_swa_buffer: the release's registry slot and triton's refresh
    where the release has them (decode / verify loc buffers, triton's SWA buffer), the model's refresh
    elsewhere, and the same buffer up to the padded length either way. Stale 99s show whose code ran:
    triton's method zeroes the whole tail, the registry slot and the model only [n:padded]."""
    g = reports[version]["graph_buffers"]
    assert len(g["describe"]["engine"]) == 2 and len(g["describe"]["model"]) == 2
    head = [7, 9, 11, 0, 0]
    for key, loc_whose, swa_whose in (("decode/triton", "engine", "engine"), ("decode/flashinfer", "engine", "model"),
                                      ("draft_decode/triton", "model", "engine"),
                                      ("target_verify/trtllm_mha", "engine", "model")):
        row = g[key]
        assert (row["loc"]["whose"], row["swa"]["whose"]) == (loc_whose, swa_whose), key
        assert row["loc"]["buffer"] == head + [99, 99, 99], key
        assert row["swa"]["buffer"] == [3, 4, 5, 0, 0] + ([0, 0, 0] if swa_whose == "engine" else [99, 99, 99]), key
        assert row["loc"]["equals_model_upto_padded"] and row["swa"]["equals_model_upto_padded"], key


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_the_releases_store_per_device(reports, version):
    """CPU: the release's fallback store, which writes slot 0 (skip_index None). CUDA on a machine without
    it: one clear error naming why the release's CUDA store cannot run (tests/test_engine_gpu.py runs it)."""
    import torch

    st = reports[version]["stores"]
    assert st["cpu"] == {"store": "CPU fallback k_cache[loc] = k", "skip_index": None, "is_cuda": False}
    if not torch.cuda.is_available():
        assert st["cuda"]["error"].startswith(f"sglang {version}: --device cuda, but the release's is_cuda() was "
                                              f"False at import (torch.cuda.is_available() False")


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_shared_step_gives_what_every_backend_s_own_release_store_gives(reports, version):
    """Engine pools grouped by class (the release's store once per class and layer, its error every member's):
    the findings, in order, and every count are those of each backend on its own pool and store."""
    for path in SHARED:
        got = reports[version]["shared_step"][path]
        shared, own = got["shared"], got["own"]
        assert shared["findings"] == own["findings"], path
        assert shared["backends"] == own["backends"] and shared["crossings"] == own["crossings"], path
        assert own["stores"] == own["crossings"] and shared["stores"] * 4 <= own["stores"], path
    b1 = reports[version]["shared_step"]["scenarios/b1-pcg-dp-padding.toml"]
    gap = reports[version]["shared_step"]["scenarios/gap-swa-shorter.toml"]
    per_backend = {b: st["findings"]["length_mismatch"] for b, st in b1["own"]["backends"].items()}
    if version == "0.5.14":
        # torch's shape error from the release's store, on every backend (none slices its swa_loc)
        assert per_backend == dict.fromkeys(ALL_BACKENDS, 18)
        assert {f["message"] for f in b1["shared"]["findings"]} == {
            "RuntimeError: shape mismatch: value tensor of shape [51, 1, 16] cannot be broadcast to indexing "
            "result of shape [1048, 1, 16]"}
        assert b1["shared"]["classes"] == [list(ALL_BACKENDS)]     # one class, in the run's backend order
    else:
        assert per_backend == dict.fromkeys(ALL_BACKENDS, 0)
    gap_counts = {b: st["findings"]["length_mismatch"] for b, st in gap["own"]["backends"].items()}
    if version == "0.5.23":
        assert gap_counts == dict.fromkeys(ALL_BACKENDS, 12)


def test_the_release_is_kept_out_of_the_collectors_scans_and_freed_at_exit(monkeypatch):
    """slotscope/engine_run.py freezes what the release's import left (the cyclic collector's scans of it cost a
    run 0.3-0.4 s each) once per release, and unfreezes at exit, once however many releases a process loads."""
    import atexit
    import gc

    from slotscope import engine_run

    registered = []
    monkeypatch.setattr(engine_run, "_FROZEN", set())
    monkeypatch.setattr(atexit, "register", registered.append)
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    for release in ("sglang 0.5.23 a", "sglang 0.5.23 a", "vllm 0.34.0 b"):
        engine_run._kept_out_of_collections(release)
    assert gc.get_freeze_count() > 1000
    assert registered == [gc.unfreeze]


def test_an_earlier_runs_garbage_is_collected_not_frozen(monkeypatch):
    """A freeze keeps whatever is alive for ever: the cyclic garbage an earlier run left (its pools, the release's
    block pool: ~45 MB a vLLM fuzz draw) is collected before the one freeze, and a later run of the same release
    freezes nothing more."""
    import gc
    import weakref

    from slotscope import engine_run

    class Node:
        def __init__(self):
            self.me = self          # a cycle: only the cyclic collector frees it

    monkeypatch.setattr(engine_run, "_FROZEN", set())
    gc.unfreeze()
    try:
        before = weakref.ref(Node())
        engine_run._kept_out_of_collections("vllm 0.34.0 x")
        assert before() is None, "garbage alive at the freeze was frozen"
        frozen = gc.get_freeze_count()
        later = weakref.ref(Node())
        engine_run._kept_out_of_collections("vllm 0.34.0 x")
        assert gc.get_freeze_count() == frozen
        gc.collect()
        assert later() is None, "a later run's garbage was frozen"
    finally:
        gc.unfreeze()


def test_a_dependency_server_holds_the_releases_dependencies_and_never_the_release(warm, tmp_path):
    """``deps:sglang==V`` (slotscope/forkserver.py): the server imported what the release imports from outside itself
    (torch, transformers, triton), never the release, so each child imports it afresh and applies its run's
    patches; a patched run of an SGLang server goes there by itself, and the release's patcher applied the patch."""
    probe = tmp_path / "probe.py"
    probe.write_text("import sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'sglang'), "
                     "all(m in sys.modules for m in ('torch', 'transformers', 'triton')))\n")
    got = warm("deps:sglang==0.5.23").script(str(probe))
    assert got.returncode == 0 and got.stdout.strip() == "[] True", got.stdout + got.stderr
    out = tmp_path / "b1"
    proc = warm("sglang==0.5.23").cli("run", "scenarios/b1-pcg-dp-padding.toml", "--engine", "sglang==0.5.23",
                                      "--backends", "triton", "--engine-patch",
                                      "examples/engine-patches/revert-29460-slice.yaml", "--out", str(out),
                                      "--no-report", "-q", "--device", "cpu")
    assert proc.returncode == 1, proc.stderr[-2000:]
    import json

    summary = json.loads((out / "summary.json").read_text())
    assert {c: n for c, n in summary["backends"]["triton"]["findings"].items() if n} == {"length_mismatch": 18}
    assert [p["applied_by"] for p in summary["engine"]["patches"]] == ["sglang"]
