"""The CPU speed levers of issue 13 trade no exactness.

The eager executor runs CPU steps on shared pools (simulator/core/eager.py SharedStep): one physical pool per class
of backends whose writes were identical so far, split on the first difference (copy on divergence), the layers
of a kind that write one target in one store (cuda_path/store.py store_kv_layers_torch), a layer-free
``make_write_loc`` asked once per kind. Each test runs the same scenario through that step and through the
per-forward step (``EagerExecutor(shared=False)``: every backend and layer on its own pool and store) and
requires the same findings, in the same order, and the same counts; a bug on one backend or one layer only is
reported there alone.
"""
from __future__ import annotations

import torch

from cuda_path.pool import TaggedKVPool
from cuda_path.store import new_error_buffer, store_kv_layers_torch, store_kv_torch
from simulator.engine_model.backends import BACKEND_SPECS
from simulator.core.boundary import BackendBoundary
from simulator.designs.sglang import SGLangPost29460, SGLangPre29460
from simulator.designs import load_design
from simulator.core.eager import EagerExecutor
from simulator.oracle.kvrows import TAG_LANES, encode_rows, set_layer_lane
from simulator.memory.pool import KVLengthMismatch
from simulator.run import run_simulation

from helpers import scenario


def OwnSteps() -> EagerExecutor:
    """The eager executor without its whole-step path: every step per forward, backend after backend."""
    return EagerExecutor(shared=False)


class TritonTranslateBug(SGLangPost29460):
    """triton only: the first token's SWA slot is its neighbour's (the other backends translate right)."""

    name = "test-triton-translate-bug"

    def translate(self, out_cache_loc, full_to_swa, ctx):
        swa = full_to_swa[out_cache_loc]
        if ctx.backend == "triton" and ctx.num_token_non_padded > 1:
            swa = swa.clone()
            swa[0] = swa[1]
        return swa


class Layer3Bug(SGLangPost29460):
    """Full layer 3 only (every backend, or the named one): the first token's row goes to the second's slot."""

    name = "test-layer3-bug"
    backend = None

    def make_write_loc(self, loc, swa_loc, ctx):
        wl = super().make_write_loc(loc, swa_loc, ctx)
        if ctx.layer == 3 and loc.shape[0] > 1 and (self.backend is None or ctx.backend == self.backend):
            bad = loc.clone()
            bad[0] = loc[1]
            wl = type(wl)(bad, wl.swa_loc)
        return wl


class Layer3BugOnFlashinfer(Layer3Bug):
    name = "test-layer3-bug-flashinfer"
    backend = "flashinfer"


def run(design, executor, sc="smoke"):
    sc = scenario(sc)

    def make(full_rows, swa_rows, skip):
        return TaggedKVPool(sc.model, full_rows, swa_rows, geometry="compact", skip_index=skip)

    return run_simulation(sc, design, make, executor=executor)


def both(design, sc="smoke"):
    shared_exec = EagerExecutor()
    shared = run(design, shared_exec, sc)
    own = run(design, OwnSteps(), sc)
    assert [f.to_json() for f in shared.findings] == [f.to_json() for f in own.findings]
    assert {b: s.to_json() for b, s in shared.backends.items()} == {b: s.to_json() for b, s in own.backends.items()}
    assert shared.crossings == own.crossings and len(shared.steps) == len(own.steps)
    return shared, shared_exec


def classes(executor) -> list[list[str]]:
    (_, pc), = executor.stepwise._classes.values()
    out: dict[int, list[str]] = {}
    for name, cid in pc.of.items():
        out.setdefault(cid, []).append(name)
    return sorted(out.values())


def test_clean_run_keeps_one_pool_for_every_backend():
    r, ex = both(SGLangPost29460())
    assert r.total_findings == 0
    (members,) = classes(ex)
    assert len(members) == 8


def test_a_bug_on_one_backend_is_reported_there_alone():
    r, ex = both(TritonTranslateBug())
    per_backend = {b: s.total for b, s in r.backends.items()}
    assert per_backend["triton"] > 0
    assert {b for b, n in per_backend.items() if n} == {"triton"}
    assert {f.backend for f in r.findings} == {"triton"}
    groups = classes(ex)
    assert ["triton"] in groups and sorted(len(g) for g in groups) == [1, 7]


def test_a_bug_on_one_layer_is_reported_there_alone():
    r, _ = both(Layer3Bug())
    assert r.total_findings > 0
    assert {f.layer for f in r.findings} == {3}
    assert len({f.backend for f in r.findings}) == 8


def test_a_bug_on_one_layer_of_one_backend_is_reported_there_alone():
    r, ex = both(Layer3BugOnFlashinfer())
    assert r.total_findings > 0
    assert {(f.backend, f.layer) for f in r.findings} == {("flashinfer", 3)}
    assert sorted(len(g) for g in classes(ex)) == [1, 7]


def test_bug_scenarios_match_their_own_steps():
    for name, design in (("b1-pcg-dp-padding", "sglang-pre-29460"), ("b2-decode-stale-tail", "sglang-pre-24743")):
        r, _ = both(load_design(design), name)
        assert r.total_findings > 0


def test_layer_free_write_loc_is_told_by_the_method():
    engine = scenario("smoke").engine

    def free(design) -> bool:
        return BackendBoundary(BACKEND_SPECS["triton"], design, engine, torch.device("cpu")).layer_free_write_loc()

    assert free(SGLangPost29460()) and free(SGLangPre29460())
    assert not free(Layer3Bug())


def _per_layer(k_cache, v_cache, layers, loc, k, v, skip, err, k_scale=None, v_scale=None):
    for i in layers:
        set_layer_lane(k, i, k_scale or 1.0)
        if v is not k:
            set_layer_lane(v, i, v_scale or 1.0)
        store_kv_torch(k_cache[i], v_cache[i], loc, k, v, skip_index=skip, err=err[i], k_scale=k_scale,
                       v_scale=v_scale)


def test_grouped_store_leaves_what_the_per_layer_store_leaves():
    rows, layers = 64, (0, 2, 3)
    cases = {
        "clean": torch.tensor([5, 9, 17, 33]),
        "skip and out of range": torch.tensor([0, 7, 70, -3, 12, 0]),
        "written twice": torch.tensor([4, 8, 4, 0, 8]),
    }
    for fp8, (heads, dim) in ((False, (1, 16)), (True, (1, 16)), (False, (4, 8))):
        for what, loc in cases.items():
            storage = torch.uint8 if fp8 else torch.bfloat16
            scale = 0.5 if fp8 else None
            tags = torch.arange(1, loc.shape[0] + 1)
            got, want = [], []
            for fn in ("grouped", "per_layer"):
                kc = torch.zeros((4, rows, heads, dim), dtype=storage)
                vc = torch.zeros((4, rows, heads, dim), dtype=storage)
                err = new_error_buffer("cpu", 4)
                k = encode_rows(tags, 0, heads, dim, torch.bfloat16, scale or 1.0)
                v = encode_rows(tags, 0, heads, dim, torch.bfloat16, scale or 1.0)
                if fn == "grouped":
                    stamps = torch.tensor([float(i + 1) * (scale or 1.0) for i in layers], dtype=torch.bfloat16)
                    store_kv_layers_torch(kc, vc, torch.tensor(layers), stamps, stamps.clone(), loc, k, v,
                                          skip_index=0, err=err, stamp_lane=TAG_LANES, k_scale=scale,
                                          v_scale=scale)
                else:
                    _per_layer(kc, vc, layers, loc, k, v, 0, err, scale, scale)
                (got if fn == "grouped" else want).append((kc, vc, err, k, v))
            for a, b in zip(got[0], want[0]):
                assert torch.equal(a, b), (what, fp8)


class OwnCheckPool(TaggedKVPool):
    """A pool whose store makes its own length check, with its own text (as a release's pool does: torch's
    shape error from the release's store, engine_path.pool.EnginePool); the host check never runs first."""

    store_checks_lengths = True
    calls = 0

    def store(self, kind, index, loc, k, v):
        OwnCheckPool.calls += 1
        if loc.shape[0] != k.shape[0]:
            raise KVLengthMismatch(f"own store: {k.shape[0]} rows for {loc.shape[0]} ids at {kind} {index}")
        super().store(kind, index, loc, k, v)


def test_a_store_that_checks_lengths_gives_its_own_error_to_every_member():
    """B1 before its fix: the shared step groups the pools, stores each layer once per class, and every member
    of a class gets the store's own error (not the host check's ``Size mismatch``), as its own store gave it."""
    sc = scenario("b1-pcg-dp-padding")
    design = load_design("sglang-pre-29460")

    def go(executor):
        OwnCheckPool.calls = 0

        def make(full_rows, swa_rows, skip):
            return OwnCheckPool(sc.model, full_rows, swa_rows, geometry="compact", skip_index=skip)

        return run_simulation(sc, design, make, executor=executor), OwnCheckPool.calls

    shared_exec = EagerExecutor()
    (shared, shared_calls), (own, own_calls) = go(shared_exec), go(OwnSteps())
    assert [f.to_json() for f in shared.findings] == [f.to_json() for f in own.findings]
    assert {b: s.to_json() for b, s in shared.backends.items()} == {b: s.to_json() for b, s in own.backends.items()}
    per_backend = {b: s.findings["length_mismatch"] for b, s in own.backends.items()}
    assert per_backend == {b: 18 for b in sc.backends}      # no backend slices swa_loc (0.5.14's trtllm_mha too)
    # the store's own text (51 real rows against the 1,048 ids of the unsliced, DP-padded swa_loc), per layer
    assert {(f.step, f.message) for f in shared.findings} == {
        (1, f"own store: 51 rows for 1048 ids at swa {i}") for i in range(18)}
    assert sorted(len(g) for g in classes(shared_exec)) == [8]
    # every layer once per class and step (one class: every backend writes alike), not once per backend
    assert own_calls == shared.crossings and shared_calls * 8 == own_calls
