"""On a CUDA device: the pool under test on the GPU with real geometry, the Triton store, real CUDA
graphs (decode replays, piecewise pieces), GPU-side checking. Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

from cuda_path.graphs import CudaGraphExecutor
from cuda_path.pool import TaggedKVPool
from simulator.designs import load_design
from simulator.core.observe import NullObserver
from simulator.run import run_simulation
from simulator.scenario import BACKENDS

from helpers import scenario, simulate

pytestmark = pytest.mark.gpu


def gpu_run(name, design=None, graphs=True, backends=None, geometry="real", observer=None):
    sc = scenario(name).with_overrides(design=design, backends=backends)
    d = load_design(sc.design)
    ex = CudaGraphExecutor() if graphs else None

    def make(full_rows, swa_rows, skip):
        return TaggedKVPool(sc.model, full_rows, swa_rows, device="cuda", geometry=geometry, store_impl="triton",
                            skip_index=skip)

    return run_simulation(sc, d, make, device="cuda", executor=ex, observer=observer), ex


class _Crossings(NullObserver):
    """Every boundary observation but its times, in order."""

    def __init__(self):
        self.rows = []

    def on_boundary(self, step, backend, layer, loc_len, swa_len, loc_dtype, swa_dtype, t0, t1, err):
        self.rows.append((step, backend, layer, loc_len, swa_len, loc_dtype, swa_dtype, err))


@pytest.mark.parametrize("name, design", [("b1-pcg-dp-padding", "sglang-pre-29460"),    # failed writes
                                          ("smoke", None), ("b2-decode-stale-tail", "sglang-pre-24743")])
def test_gpu_step_observations_are_the_cpu_runs(name, design):
    """The GPU step runner's observations (decode replays, grouped stores, a group's followers' rows made from
    its first backend's) are the CPU run's, crossing by crossing, on every backend."""
    sc = scenario(name).with_overrides(design=design)
    cpu, gpu = _Crossings(), _Crossings()
    d = load_design(sc.design)
    run_simulation(sc, d, lambda f, w, skip: TaggedKVPool(sc.model, f, w, geometry="compact", skip_index=skip),
                   observer=cpu)
    _, ex = gpu_run(name, design, observer=gpu)
    assert ex.replays + ex.grouped_stores > 0 and ex.steps is not None and ex.steps.verdict_reads > 0
    assert len(gpu.rows) > 0 and gpu.rows == cpu.rows


def counts(r):
    return {b: dict(s.findings) for b, s in r.backends.items()}


def test_b1_through_real_piecewise_graphs():
    r, ex = gpu_run("b1-pcg-dp-padding", "sglang-pre-29460")
    assert ex.piece_replays > 0 and ex.captures > 0
    # no backend slices its own swa_loc (0.5.14's trtllm_mha neither): 18 SWA-layer mismatches on each
    assert {b: r.backends[b].findings["length_mismatch"] for b in BACKENDS} == dict.fromkeys(BACKENDS, 18)
    fixed, _ = gpu_run("b1-pcg-dp-padding", "sglang-post-29460")
    assert fixed.total_findings == 0


def test_b2_stale_tail_corrupts_live_slots_on_the_gpu_through_graph_replays():
    r, ex = gpu_run("b2-decode-stale-tail", "sglang-pre-24743")
    assert ex.replays > 0
    for b in BACKENDS:
        assert r.backends[b].findings["clobbered"] > 0, b
    fixed, ex2 = gpu_run("b2-decode-stale-tail", "sglang-post-29460")
    assert ex2.replays > 0 and fixed.total_findings == 0


@pytest.mark.parametrize("name, design", [("b2-decode-stale-tail", "sglang-pre-24743"),
                                          ("b1-pcg-dp-padding", "sglang-pre-29460"),
                                          ("smoke", None)])
def test_gpu_graphs_and_cpu_eager_agree_exactly(name, design):
    cpu = simulate(name, design, backends=("flashinfer", "trtllm_mha"))
    gpu, _ = gpu_run(name, design, backends=("flashinfer", "trtllm_mha"))
    assert counts(gpu) == counts(cpu)
    assert [f.to_json() for f in gpu.findings] == [f.to_json() for f in cpu.findings]


def test_fp8_pool_on_gpu_round_trips_tags():
    import dataclasses
    sc = scenario("smoke")
    sc = dataclasses.replace(sc, model=dataclasses.replace(sc.model, kv_dtype="fp8_e4m3"), backends=("triton",))
    d = load_design(sc.design)
    make = lambda f, s, skip: TaggedKVPool(sc.model, f, s, device="cuda", store_impl="triton", skip_index=skip,
                                           k_scale=2.0, v_scale=0.5)
    r = run_simulation(sc, d, make, device="cuda", executor=CudaGraphExecutor())
    assert r.total_findings == 0 and r.backends["triton"].writes > 0


def test_out_of_range_on_gpu_is_reported_and_context_survives():
    pool = TaggedKVPool(scenario("smoke").model, 64, 32, device="cuda", store_impl="triton")
    k, v = pool.make_rows(torch.tensor([5, 6, 7], device="cuda"), 0, "swa")
    pool.store("swa", 0, torch.tensor([3, 1000, -5], device="cuda"), k, v)
    err = pool.take_out_of_range("swa")
    assert err[0].tolist() == [2, 1]
    torch.cuda.synchronize()            # the context is alive
    kt, _ = pool.read_tags("swa", torch.tensor([3], device="cuda"))
    assert kt[0].tolist() == [5]


def test_gpu_check_kernel_matches_the_torch_comparison():
    from cuda_path.check_kernel import tag_mismatches
    from simulator.oracle.kvrows import tag_lanes

    sc = scenario("smoke")
    pool = TaggedKVPool(sc.model, 4096, 2048, device="cuda", store_impl="triton")
    g = torch.Generator(device="cuda").manual_seed(0)
    slots = torch.randperm(2047, device="cuda", generator=g)[:500] + 1
    tags = torch.randint(1, 10**6, (500,), device="cuda", generator=g)
    for layer in range(pool.k["swa"].shape[0]):
        k, v = pool.make_rows(tags, layer, "swa")
        pool.store("swa", layer, slots, k, v)
    expected = tags.clone()
    expected[::7] += 1                                      # planted differences
    pool.v["swa"][3, slots[5]] = 0                          # a V-only difference in one layer
    want = tag_lanes(expected, pool.k["swa"].dtype).contiguous().view(torch.int64)
    layers = torch.tensor([0, 3, 5], device="cuda")
    got = tag_mismatches(pool.k["swa"], pool.v["swa"], 2048, slots, want, layers)
    ref = torch.zeros_like(got)
    ref[:, ::7] = True
    ref[1, 5] = True
    assert torch.equal(got, ref)


def test_steady_decode_steps_synchronise_the_host_at_most_twice():
    """The step runner (cuda_path/step.py): once every capture size has been seen, a decode step of all
    eight backends performs at most two host synchronisations (torch's sync debug mode counts them), and
    the run gives the CPU path's findings."""
    import warnings

    sc = scenario("smoke")
    d = load_design(sc.design)
    ex = CudaGraphExecutor()
    make = lambda f, s, skip: TaggedKVPool(sc.model, f, s, device="cuda", store_impl="triton", skip_index=skip)  # noqa: E731
    per_step = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def progress(step, done, total):
            per_step.append(len(caught))

        torch.cuda.set_sync_debug_mode("warn")
        try:
            r = run_simulation(sc, d, make, device="cuda", executor=ex, progress=progress)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    counts_per_step = [b - a for a, b in zip([0] + per_step[:-1], per_step)]
    seen, steady = set(), []
    for rec, n in zip(r.steps, counts_per_step):
        if rec.graph == "decode_graph" and rec.padded_tokens in seen:
            steady.append(n)
        seen.add(rec.padded_tokens)
    assert steady and max(steady) <= 2, counts_per_step
    assert ex.steps is not None and ex.steps.verdict_reads == len(r.steps)
    assert counts(r) == counts(simulate("smoke"))


def test_grouped_stores_run_on_extend_steps_and_agree_with_the_cpu():
    r, ex = gpu_run("b1-pcg-dp-padding", "sglang-post-29460")
    assert ex.grouped_stores > 0 and r.total_findings == 0
    assert counts(r) == counts(simulate("b1-pcg-dp-padding", "sglang-post-29460"))
