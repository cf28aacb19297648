"""The ``paired`` pool layout (cuda_path/pool.py): a slot's K row, then its V row, in one allocation per kind,
K's tail tag and V's head tag in one 32-byte sector; the checker reads that sector in one load
(cuda_path/check_kernel.py). Both layouts must give the same answers for the same writes.
CPU tensors run the Triton kernels under the interpreter (tests/conftest.py)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from cuda_path.check_kernel import pair_words, tag_mismatches, verdict
from cuda_path.pool import SECTOR, TaggedKVPool, estimate_bytes
from simulator.oracle.kvrows import TAG_LANES, TAIL_TAG_MIN_WIDTH, decode_tags, encode_rows, tag_lanes
from simulator.scenario.models import PRESETS
from simulator.memory.pool import clone_pool

from helpers import scenario

DTYPES = ("bf16", "fp16", "fp8_e4m3")


def _model(kv_dtype: str, preset: str = "gpt-oss-20b"):
    return dataclasses.replace(PRESETS[preset], kv_dtype=kv_dtype)


def _pools(kv_dtype: str, store: str = "torch", rows=(48, 40)):
    m = _model(kv_dtype)
    return {lay: TaggedKVPool(m, *rows, layout=lay, store_impl=store, k_scale=0.5, v_scale=2.0)
            for lay in ("split", "paired")}


@pytest.mark.parametrize("kv_dtype", DTYPES)
def test_encode_rows_carries_the_tag_at_both_ends_of_wide_rows(kv_dtype):
    tags = torch.tensor([1, 7, 255, 4096, 2**31 - 9, -1])
    for heads, dim in ((1, 16), (1, 17), (8, 64), (4, 512)):
        rows = encode_rows(tags, 3, heads, dim, torch.bfloat16 if kv_dtype != "fp16" else torch.float16)
        flat = rows.view(tags.shape[0], -1)
        assert torch.equal(decode_tags(flat[:, :TAG_LANES]), tags)
        assert (flat[:, TAG_LANES] == 4).all()                      # the layer lane, untouched
        tail = flat[:, -TAG_LANES:]
        if heads * dim >= TAIL_TAG_MIN_WIDTH:
            assert torch.equal(tail, flat[:, :TAG_LANES])
            assert torch.equal(decode_tags(tail), tags)
        else:                                                        # compact rows keep their payload
            assert not torch.equal(tail, flat[:, :TAG_LANES])


@pytest.mark.parametrize("kv_dtype", DTYPES)
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_k_tail_and_v_head_tags_share_one_aligned_sector(kv_dtype, preset):
    """From data_ptr arithmetic, for every shipped model's real geometry: V's row starts where K's ends, K's
    last tag bytes and V's first lie in one aligned 32-byte sector, and the checker's pair words start there."""
    m = _model(kv_dtype, preset)
    pool = TaggedKVPool(m, 5, 3, layout="paired")
    for kind in ("full", "swa"):
        k, v = pool.k[kind], pool.v[kind]
        if k.shape[0] == 0:
            continue
        tag = TAG_LANES * k.element_size()
        kb = k.shape[2] * k.shape[3] * k.element_size()
        pair = pair_words(k, v)
        assert pair is not None and pair.shape[2] * 8 == 2 * tag
        assert (k.stride(1) * k.element_size()) % SECTOR == 0
        for layer in sorted({0, k.shape[0] - 1}):
            for row in range(k.shape[1]):
                tail = k[layer, row].data_ptr() + kb - tag
                head = v[layer, row].data_ptr()
                assert head == tail + tag
                assert tail // SECTOR == (head + tag - 1) // SECTOR, (kind, layer, row)
                assert pair[layer, row].data_ptr() == tail
    assert pool.bytes() == estimate_bytes(m, 5, 3, layout="paired")
    assert TaggedKVPool(m, 5, 3, layout="split").bytes() == estimate_bytes(m, 5, 3)


def _write(pools, tags, slots):
    """The same writes into each pool, then a K-only overwrite (another tag, both ends) of one slot in layer 1,
    a V-only one in layer 2, and a zeroed K row in layer 3."""
    for p in pools.values():
        n = p.k["swa"].shape[0]
        p.store_layers("swa", tuple(range(n)), tuple(range(0, 2 * n, 2)), slots, *p.make_rows(tags, 0, "swa"))
        p.store_layers("full", (0, 1), (1, 3), slots, *p.make_rows(tags, 1, "full"))
        bad_k, _ = p.make_rows(torch.tensor([99999]), 2, "swa")
        _, good_v = p.make_rows(tags[4:5], 2, "swa")
        p.store("swa", 1, slots[4:5], bad_k, good_v)
        good_k, _ = p.make_rows(tags[7:8], 4, "swa")
        _, bad_v = p.make_rows(torch.tensor([88888]), 4, "swa")
        p.store("swa", 2, slots[7:8], good_k, bad_v)
        p.k["swa"][3, slots[9]] = 0


@pytest.mark.parametrize("kv_dtype,store", [("bf16", "torch"), ("fp8_e4m3", "torch"), ("bf16", "triton")])
def test_both_layouts_give_the_same_mismatches_verdicts_and_tags(kv_dtype, store):
    pools = _pools(kv_dtype, store)
    g = torch.Generator().manual_seed(5)
    slots = torch.randperm(38, generator=g)[:20] + 1
    tags = torch.randint(1, 10**6, (20,), generator=g)
    _write(pools, tags, slots)
    assert pair_words(pools["paired"].k["swa"], pools["paired"].v["swa"]) is not None
    assert pair_words(pools["split"].k["swa"], pools["split"].v["swa"]) is None
    got = {}
    for lay, p in pools.items():
        k, v = p.k["swa"], p.v["swa"]
        want = tag_lanes(tags, k.dtype).contiguous().view(torch.int64)
        layers = torch.arange(k.shape[0])
        expected = torch.zeros(40, dtype=torch.int64)
        expected[slots] = tags
        exp_words = tag_lanes(expected, k.dtype).contiguous().view(torch.int64)
        reserved = torch.zeros(40, dtype=torch.bool)
        reserved[slots[0]] = True
        counts = []
        for kernel in (False, True):
            out = torch.zeros(1, dtype=torch.int64)
            verdict(k, v, layers, slots, slots[:5], exp_words, reserved, p.err["swa"], out, kernel=kernel)
            counts.append(int(out))
        got[lay] = (p.mismatches("swa", slots, tags), tag_mismatches(k, v, 40, slots, want, layers),
                    p.mismatches("swa", slots, tags, [1, 2]), counts, p.read_tags("swa", slots),
                    p.mismatches("full", slots, tags, [0, 1]), p.read_tags("full", slots))
    split, paired = got["split"], got["paired"]
    for a, b in zip(split, paired):
        if isinstance(a, tuple):
            assert all(torch.equal(x, y) for x, y in zip(a, b))
        elif isinstance(a, list):
            assert a == b
        else:
            assert torch.equal(a, b)
    ref = torch.zeros_like(split[0])
    ref[1, 4] = ref[2, 7] = ref[3, 9] = True
    assert torch.equal(split[0], ref) and torch.equal(split[1], ref)
    assert torch.equal(split[2], ref[[1, 2]])
    assert split[3] == [4, 4]         # positions 4, 7, 9, and 4 again in the second list (counted per entry)
    kt, vt = paired[4]
    assert int(kt[1, 4]) == 99999 and int(vt[2, 7]) == 88888 and int(kt[3, 9]) == 0 and int(vt[3, 9]) == tags[9]
    assert not bool(split[5].any()) and bool(paired[6][0][2:].eq(0).all())   # full: layers 0, 1 written only


def test_verdict_counts_each_candidate_entry_on_both_layouts():
    """The second candidate list repeats slot 4 (K-only difference): it counts once more, on both layouts."""
    pools = _pools("bf16")
    slots = torch.arange(1, 21)
    tags = torch.arange(100, 120)
    _write(pools, tags, slots)
    res = []
    for p in pools.values():
        expected = torch.zeros(40, dtype=torch.int64)
        expected[slots] = tags
        exp_words = tag_lanes(expected, p.k["swa"].dtype).contiguous().view(torch.int64)
        out = torch.zeros(1, dtype=torch.int64)
        verdict(p.k["swa"], p.v["swa"], torch.arange(p.k["swa"].shape[0]), slots, slots[4:5], exp_words,
                torch.zeros(40, dtype=torch.bool), p.err["swa"], out, kernel=True)
        res.append(int(out))
    assert res == [4, 4]


def test_a_pool_class_copy_of_a_paired_pool_is_equal_and_independent():
    p = _pools("bf16")["paired"]
    slots, tags = torch.arange(3, 13), torch.arange(50, 60)
    k, v = p.make_rows(tags, 0, "swa")
    p.store("swa", 0, slots, k, v)
    c = clone_pool(p)
    assert c.layout == "paired"
    for kind in ("full", "swa"):
        assert c.kv[kind].data_ptr() != p.kv[kind].data_ptr() and c.kv[kind].data_ptr() % SECTOR == 0
        assert torch.equal(c.kv[kind], p.kv[kind]) and torch.equal(c.err[kind], p.err[kind])
        assert c.k[kind].data_ptr() - c.kv[kind].data_ptr() == p.k[kind].data_ptr() - p.kv[kind].data_ptr()
        assert pair_words(c.k[kind], c.v[kind]) is not None
    c.store("swa", 0, slots[:2], *c.make_rows(torch.tensor([7, 8]), 0, "swa"))
    assert p.read_tags("swa", slots[:2])[0][0].tolist() == [50, 51]
    assert c.read_tags("swa", slots[:2])[0][0].tolist() == [7, 8]
    assert not bool(p.mismatches("swa", slots, tags, [0]).any())
    assert c.mismatches("swa", slots, tags, [0])[0].tolist() == [True, True] + [False] * 8


def test_layout_defaults_and_narrow_rows():
    m = _model("bf16")
    assert TaggedKVPool(m, 8, 8).layout == "split"                          # CPU
    assert TaggedKVPool(m, 8, 8, geometry="compact").layout == "split"
    with pytest.raises(ValueError, match="compact.*1 heads x 16 lanes"):
        TaggedKVPool(m, 8, 8, geometry="compact", layout="paired")
    with pytest.raises(ValueError, match="layout 'tiled'"):
        TaggedKVPool(m, 8, 8, layout="tiled")


def test_a_run_gives_the_same_findings_on_both_layouts():
    """CPU, real geometry: the B2 scenario (stale graph tails corrupt live slots: findings on several backends)
    on a split and a paired pool: the same findings, one by one."""
    from simulator.designs import load_design
    from simulator.run import run_simulation
    from slotscope.pools import make_pool_factory

    sc = scenario("b2-decode-stale-tail").with_overrides(max_steps=12)
    out = {}
    for lay in ("split", "paired"):
        r = run_simulation(sc, load_design(sc.design), make_pool_factory(sc, torch.device("cpu"), "real", "torch",
                                                                         layout=lay), device="cpu")
        out[lay] = ([f.to_json() for f in r.findings], {b: dict(s.findings) for b, s in r.backends.items()})
    assert out["split"] == out["paired"]
    assert out["split"][0]


# ---------------------------------------------------------------------------- on the GPU (the lead's H200 runs)

@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", DTYPES)
def test_gpu_paired_and_split_pools_agree(kv_dtype):
    """On CUDA, the Triton store and the checker's kernels: a paired pool (the default there) and a split one
    give the same mismatches, verdicts and tags, K-only and V-only differences included."""
    m = _model(kv_dtype)
    pools = {lay: TaggedKVPool(m, 4096, 3000, device="cuda", store_impl="triton", layout=lay)
             for lay in ("split", "paired")}
    assert TaggedKVPool(m, 64, 64, device="cuda").layout == "paired"
    g = torch.Generator().manual_seed(9)
    slots = (torch.randperm(2998, generator=g)[:600] + 1).cuda()
    tags = torch.randint(1, 10**6, (600,), generator=g).cuda()
    _write(pools, tags, slots)
    got = {}
    for lay, p in pools.items():
        k, v = p.k["swa"], p.v["swa"]
        expected = torch.zeros(3000, dtype=torch.int64, device="cuda")
        expected[slots] = tags
        exp_words = tag_lanes(expected, k.dtype).contiguous().view(torch.int64)
        out = torch.zeros(1, dtype=torch.int64, device="cuda")
        verdict(k, v, torch.arange(k.shape[0], device="cuda"), slots, slots[:50], exp_words,
                torch.zeros(3000, dtype=torch.bool, device="cuda"), p.err["swa"], out)
        got[lay] = (p.mismatches("swa", slots, tags).cpu(), int(out), [t.cpu() for t in p.read_tags("swa", slots)])
    # the three differing slots (4, 7, 9) are candidates twice (in slots and in slots[:50]): counted twice
    assert torch.equal(got["split"][0], got["paired"][0]) and got["split"][1] == got["paired"][1] == 6
    assert all(torch.equal(a, b) for a, b in zip(got["split"][2], got["paired"][2]))
    assert got["split"][0].nonzero().tolist() == [[1, 4], [2, 7], [3, 9]]


@pytest.mark.gpu
@pytest.mark.parametrize("name,design,steps", [("scale", None, 40), ("b2-decode-stale-tail", None, None),
                                               ("b1-pcg-dp-padding", "sglang-pre-29460", None)])
def test_gpu_runs_give_the_same_findings_on_both_layouts(name, design, steps):
    """--device cuda (graphs, the Triton store, the step runner's verdicts): the same findings on a paired
    and a split pool, one by one."""
    from cuda_path.graphs import CudaGraphExecutor
    from simulator.designs import load_design
    from simulator.run import run_simulation
    from slotscope.pools import make_pool_factory

    sc = scenario(name).with_overrides(design=design, max_steps=steps)
    out = {}
    for lay in ("split", "paired"):
        r = run_simulation(sc, load_design(sc.design), make_pool_factory(sc, torch.device("cuda"), "real", "triton",
                                                                         layout=lay),
                           device="cuda", executor=CudaGraphExecutor())
        out[lay] = ([f.to_json() for f in r.findings], {b: dict(s.findings) for b, s in r.backends.items()},
                    len(r.steps))
    assert out["split"] == out["paired"]
