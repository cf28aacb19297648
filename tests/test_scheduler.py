"""Scheduling and padding: chunked prefill, DP-attention padding, piecewise and decode graph padding."""
from __future__ import annotations

import numpy as np

from simulator.memory.allocator import HybridAllocator
from simulator.scenario.capture import (default_decode_capture_sizes, default_piecewise_capture_sizes,
                                        smallest_capture, speculative_decode_capture_sizes)
from simulator.scheduling.scheduler import Scheduler
from simulator.scheduling.workload import make_requests

from helpers import tiny

BASE = """
[model]
preset = "gpt-oss-20b"
[pool]
full_size = 4096
[workload]
requests = 5
prompt_len = {{ dist = "uniform", min = 50, max = 700 }}
output_len = {{ dist = "uniform", min = 1, max = 40 }}
[engine]
{engine}
"""


def batches(engine: str, seed: int = 0):
    sc = tiny(BASE.format(engine=engine))
    rng = np.random.default_rng(seed)
    alloc = HybridAllocator(sc.pool.full_size, sc.pool.swa_size, sc.pool.page_size)
    sched = Scheduler(sc, alloc, make_requests(sc.workload, rng), rng)
    return sc, list(sched.steps()), sched, alloc


def test_capture_sizes_follow_sglang():
    d = default_decode_capture_sizes(256)
    assert d[:6] == (1, 2, 4, 8, 12, 16) and d[-1] == 256 and all(b - a == 8 for a, b in zip(d[5:], d[6:]))
    p = default_piecewise_capture_sizes(4096)
    assert p[:8] == (4, 8, 12, 16, 20, 24, 28, 32) and 48 in p and 288 in p and 576 in p and 1280 in p
    assert p[-1] == 4096
    s = speculative_decode_capture_sizes(64)
    assert s[:8] == tuple(range(1, 9)) and 10 in s and 40 in s and s[-1] == 64
    assert smallest_capture(d, 13) == 16 and smallest_capture(d, 257) is None


def test_chunked_prefill_respects_budget_and_covers_every_prompt_token():
    sc, steps, sched, alloc = batches("chunked_prefill_size = 256\ncuda_graph = false")
    for b, t in steps:
        if b.mode == "extend":
            assert b.num_token_non_padded <= 256
        assert b.graph == "eager" and b.padded_len == b.dp_padded_len == b.num_token_non_padded
        assert (b.out_cache_loc == t.full_slots).all()
    total = sum(r.prompt_len + r.output_len for r in make_requests(sc.workload, np.random.default_rng(0)))
    assert sum(b.num_token_non_padded for b, _ in steps) == total
    # every tag is written once: unique per (request, position)
    tags = np.concatenate([t.tags for _, t in steps])
    assert np.unique(tags).size == tags.size
    # everything is freed at the end
    assert alloc.full_used == 0 and alloc.swa_used == 0


def test_decode_graph_pads_batch_to_capture_size_with_slot_zero():
    _, steps, _, _ = batches("cuda_graph = true")
    dec = [b for b, _ in steps if b.mode == "decode"]
    assert dec
    for b in dec:
        assert b.graph == "decode_graph"
        assert b.padded_len == smallest_capture(default_decode_capture_sizes(256), b.num_token_non_padded)


def test_dp_padding_pads_out_cache_loc_with_zero_after_recording_real_tokens():
    _, steps, _, _ = batches("dp_size = 4\ndp_other_tokens = { dist = \"uniform\", min = 100, max = 900 }\n"
                             "piecewise_cuda_graph = true\nchunked_prefill_size = 400")
    ext = [b for b, _ in steps if b.mode == "extend"]
    assert any(b.dp_padded_len > b.num_token_non_padded for b in ext)
    for b in ext:
        n = b.num_token_non_padded
        assert (b.out_cache_loc[n:] == 0).all() and (b.out_cache_loc[:n] > 0).all()
        assert b.graph == "piecewise"
        assert b.padded_len == smallest_capture(default_piecewise_capture_sizes(4096), b.dp_padded_len)


def test_mixed_chunk_puts_decode_tokens_beside_prefill():
    sc = tiny(BASE.format(engine="mixed_chunk = true\nchunked_prefill_size = 128").replace(
        'requests = 5', 'requests = 6\narrival = "poisson"\nrate = 0.3'))
    rng = np.random.default_rng(1)
    alloc = HybridAllocator(sc.pool.full_size, sc.pool.swa_size, 1)
    steps = list(Scheduler(sc, alloc, make_requests(sc.workload, rng), rng).steps())
    assert "mixed" in {b.mode for b, _ in steps}


def test_swa_eviction_keeps_the_window_and_frees_the_rest():
    sc, steps, sched, alloc = batches("chunked_prefill_size = 128")
    evicted = np.concatenate([t.evicted_swa for _, t in steps])
    assert evicted.size > 0
    # no step writes a token whose SWA slot was already evicted
    for _, t in steps:
        assert (t.swa_slots > 0).all()
