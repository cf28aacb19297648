"""Padding conventions end to end: SGLang's slot 0 (skipped or absorbed), vLLM's -1 with skip, mini-sglang's
dummy request; each clean under its fixed design, paged or not, with padded rows landing where the
convention says; and B2's stale tail under each."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from cuda_path.pool import TaggedKVPool
from simulator.memory.allocator import HybridAllocator
from simulator.designs import Design, load_design
from simulator.records import PAD_TAG, STATIC_GRAPHS
from simulator.engine_model.padding_convention import PADDING_CONVENTIONS
from simulator.run import run_simulation
from simulator.scheduling.scheduler import Scheduler
from simulator.scheduling.workload import make_requests

from helpers import scenario, tiny

BASE = """
seed = 11
backends = ["flashinfer", "triton"]
[model]
preset = "gpt-oss-20b"
num_layers = 4
[pool]
full_size = 4096
page_size = {page}
[workload]
requests = 7
prompt_len = {{ dist = "uniform", min = 10, max = 300 }}
output_len = {{ dist = "uniform", min = 1, max = 40 }}
[engine]
chunked_prefill_size = 256
dp_size = 2
dp_other_tokens = {{ dist = "uniform", min = 0, max = 64 }}
piecewise_cuda_graph = true
"""


class Absorb(Design):
    name = "test-slot0-absorb"
    padding = "slot0-absorb"


class NullBlock(Design):
    name = "test-null-block"
    padding = "skip-1-null-block"      # vLLM's: the reserved page compared like any other (nothing may write it)


CONVENTIONS = {"slot0": "sglang-post-29460", "slot0-absorb": Absorb, "skip-1": "sglang-skip-minus-1",
               "skip-1-null-block": NullBlock, "dummy": "mini-sglang-dummy"}


def run_keeping_pools(sc, design: Design):
    pools = []

    def make(full_rows, swa_rows, skip):
        pool = TaggedKVPool(sc.model, full_rows, swa_rows, geometry="compact", skip_index=skip)
        pools.append((pool, full_rows))
        return pool

    result = run_simulation(sc, design, make)
    # backends whose writes are identical share one physical pool (simulator/memory/pool.py's PoolClasses): the pools
    # the run wrote are the ones holding any row; every backend's contents are one of them
    written = [p for p, rows in pools if bool((p.read_tags("full", torch.arange(rows))[0] != 0).any())]
    assert written, "the run wrote no pool"
    return result, written


def design_of(convention: str) -> Design:
    d = CONVENTIONS[convention]
    return d() if isinstance(d, type) else load_design(d)


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("convention", list(CONVENTIONS))
def test_each_convention_is_clean_and_pads_where_it_says(convention, page):
    sc = tiny(BASE.format(page=page))
    design = design_of(convention)
    assert design.padding is PADDING_CONVENTIONS[convention]
    r, pools = run_keeping_pools(sc, design)
    assert r.total_findings == 0, {b: s.findings for b, s in r.backends.items()}
    assert {s.graph for s in r.steps} >= {"piecewise", "decode_graph"}
    assert any(s.padded_tokens > s.real_tokens for s in r.steps)
    for pool in pools:
        for kind in ("full", "swa"):
            k, v = pool.read_tags(kind, torch.tensor([0, page], dtype=torch.int64))
            slot0 = set(k[:, 0].tolist()) | set(v[:, 0].tolist())
            first_page = set(k[:, 1].tolist())
            if convention == "slot0-absorb":
                assert slot0 == {PAD_TAG}, kind          # padded rows written into the reserved slot
            else:
                assert slot0 == {0}, kind                # the reserved slot is never written
            if convention == "dummy":
                assert first_page == {PAD_TAG}, kind     # the dummy request's page absorbs padded rows


def test_pad_values_in_out_cache_loc():
    sc = tiny(BASE.format(page=1))
    for convention in CONVENTIONS:
        conv = design_of(convention).padding
        assert (conv.pad_value, conv.skip_index) == {"slot0": (0, 0), "slot0-absorb": (0, None), "skip-1": (-1, -1),
                               "skip-1-null-block": (-1, -1), "dummy": (None, None)}[convention]
    rng = np.random.default_rng(sc.seed)
    alloc = HybridAllocator(sc.pool.full_size, sc.pool.swa_size, 1)
    sched = Scheduler(sc, alloc, make_requests(sc.workload, rng), rng, pad_value=-1)
    padded = [b for b, _ in sched.steps() if b.dp_padded_len > b.num_token_non_padded]
    assert padded and all((b.out_cache_loc[b.num_token_non_padded:] == -1).all() for b in padded)


def test_dummy_request_pads_the_batch_itself_to_the_capture_size():
    sc = tiny(BASE.format(page=1))
    rng = np.random.default_rng(sc.seed)
    alloc = HybridAllocator(sc.pool.full_size, sc.pool.swa_size, 1)
    sched = Scheduler(sc, alloc, make_requests(sc.workload, rng), rng, pad_value=7, pad_to_capture=True)
    for b, _ in sched.steps():
        if b.graph in STATIC_GRAPHS:
            assert b.dp_padded_len == b.padded_len       # no tail for the graph's static buffers to keep
            assert (b.out_cache_loc[b.num_token_non_padded:] == 7).all()


@pytest.mark.parametrize("buggy,expect", [
    ("sglang-pre-24743", "clobbered"),
    ("sglang-skip-minus-1-pre-24743", "clobbered"),
    ("mini-sglang-dummy-pre-24743", None),      # the padded rows are the dummy's, translated: nothing stale
])
def test_b2_stale_tail_under_each_convention(buggy, expect):
    sc = scenario("b2-decode-stale-tail").with_overrides(backends=("triton",))
    r, _ = run_keeping_pools(sc, load_design(buggy))
    st = r.backends["triton"]
    if expect is None:
        assert st.total == 0
    else:
        assert st.findings[expect] > 0
        assert set(c for c, n in st.findings.items() if n) <= {"clobbered", "evicted_slot"}
        assert all(f.observed.tag == PAD_TAG for f in r.findings)
