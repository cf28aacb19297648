"""The store contract, checked bit-exactly on both implementations (torch, Triton) and devices.

The pattern is the cache tests of vLLM and mini-sglang: poison the pool with a known pattern, store a
batch at random unique slots, then every written row must hold the input's bits and every other row
must still hold the poison. Integer views are compared with ``torch.equal``, never ``allclose``.

Without CUDA the Triton kernel runs under ``TRITON_INTERPRET=1``, chosen here before triton is imported
(it is fixed when the kernel module is imported). With CUDA, the CPU cases of the Triton store skip.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from cuda_path.pool import store_kv  # noqa: E402
from cuda_path.store import NO_POSITION, KVLengthMismatch, new_error_buffer  # noqa: E402

triton_store = pytest.importorskip("cuda_path.triton_store")

# the interpreter's numpy arithmetic warns on the inf/NaN inputs that the conversion tests feed it
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

IMPLS = ("torch", "triton")
DEVICES = (
    "cpu",
    pytest.param("cuda", marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    ]),
)


@pytest.fixture(params=IMPLS)
def impl(request):
    return request.param


def _skip_without_interpreter(device: str, impl: str = "triton") -> None:
    if device == "cpu" and impl == "triton" and not triton_store._is_interpreted():
        pytest.skip("the Triton store runs on CPU tensors only under TRITON_INTERPRET=1")


@pytest.fixture(params=DEVICES)
def device(request, impl):
    _skip_without_interpreter(request.param, impl)
    return torch.device(request.param)


def bits(t: torch.Tensor) -> torch.Tensor:
    """An integer view of the same storage, for exact comparison."""
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16)
    if t.dtype == torch.float32:
        return t.view(torch.int32)
    return t


def poisoned_pool(rows, heads, dim, dtype, device, salt=0):
    """A pool whose every 16-bit (or byte) lane holds a position-dependent pattern."""
    n = rows * heads * dim
    if dtype == torch.uint8:
        pattern = ((torch.arange(n) * 7 + 3 + salt) % 251).to(torch.uint8)
    else:
        pattern = ((torch.arange(n) * 2654435761 + salt) % 65536 - 32768).to(torch.int16).view(dtype)
    return pattern.reshape(rows, heads, dim).to(device)


def reference_rows(x: torch.Tensor, cache_dtype, scale=None) -> torch.Tensor:
    """What the store must write for input rows ``x``, computed on the CPU."""
    x = x.cpu()
    if cache_dtype == torch.uint8:
        if scale is not None and scale != 1.0:
            x = x / scale
        return x.to(torch.float8_e4m3fn).view(torch.uint8)
    return x.to(cache_dtype)


def assert_pool(cache, poison, loc, expected_rows, written_mask=None):
    """Written rows equal ``expected_rows``; all other rows equal ``poison``."""
    cache, poison, loc = cache.cpu(), poison.cpu(), loc.cpu().to(torch.int64)
    if written_mask is None:
        written_mask = torch.ones(loc.shape[0], dtype=torch.bool)
    slots = loc[written_mask]
    assert torch.equal(bits(cache[slots]), bits(expected_rows[written_mask]))
    untouched = torch.ones(cache.shape[0], dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(bits(cache[untouched]), bits(poison[untouched]))


def random_rows(n, heads, dim, dtype, device, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, heads, dim, generator=g) * scale).to(dtype).to(device)


def unique_slots(n, rows, seed, device, dtype=torch.int64):
    """Unique random slots in ``1..rows-1`` (slot 0 is the reserved one)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randperm(rows - 1, generator=g)[:n] + 1).to(dtype).to(device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("loc_dtype", [torch.int64, torch.int32])
def test_random_unique_slots(impl, device, dtype, loc_dtype):
    rows, heads, dim, n = 97, 2, 32, 23
    k_cache = poisoned_pool(rows, heads, dim, dtype, device, salt=1)
    v_cache = poisoned_pool(rows, heads, dim, dtype, device, salt=2)
    k_poison, v_poison = k_cache.clone(), v_cache.clone()
    loc = unique_slots(n, rows, seed=3, device=device, dtype=loc_dtype)
    k = random_rows(n, heads, dim, dtype, device, seed=4)
    v = random_rows(n, heads, dim, dtype, device, seed=5)
    err = new_error_buffer(device)[0]
    store_kv(k_cache, v_cache, loc, k, v, skip_index=0, err=err, impl=impl)
    assert_pool(k_cache, k_poison, loc, k.cpu())
    assert_pool(v_cache, v_poison, loc, v.cpu())
    assert err.cpu().tolist() == [0, NO_POSITION]


@pytest.mark.parametrize("scale", [1.0, 2.0])
@pytest.mark.parametrize("src_dtype", [torch.bfloat16, torch.float32])
def test_fp8_pool(impl, device, scale, src_dtype):
    rows, heads, dim, n = 61, 2, 16, 17
    k_cache = poisoned_pool(rows, heads, dim, torch.uint8, device, salt=1)
    v_cache = poisoned_pool(rows, heads, dim, torch.uint8, device, salt=2)
    k_poison, v_poison = k_cache.clone(), v_cache.clone()
    loc = unique_slots(n, rows, seed=6, device=device)
    # magnitudes from tiny (fp8 subnormals) to past fp8's 448 (saturation or NaN, as torch does)
    k = random_rows(n, heads, dim, src_dtype, device, seed=7, scale=200.0)
    v = random_rows(n, heads, dim, src_dtype, device, seed=8, scale=0.01)
    err = new_error_buffer(device)[0]
    store_kv(k_cache, v_cache, loc, k, v, skip_index=0, err=err, k_scale=scale, v_scale=scale, impl=impl)
    assert_pool(k_cache, k_poison, loc, reference_rows(k, torch.uint8, scale))
    assert_pool(v_cache, v_poison, loc, reference_rows(v, torch.uint8, scale))


@pytest.mark.parametrize("k_shape,v_shape", [
    ((2, 16), (2, 8)),      # V head_dim smaller than K
    ((3, 24), (3, 40)),     # widths that are not powers of two, V wider
    ((2, 640), (2, 96)),    # K spans two column blocks, V one
])
def test_v_geometry_differs(impl, device, k_shape, v_shape):
    rows, n = 29, 7
    k_cache = poisoned_pool(rows, *k_shape, torch.bfloat16, device, salt=1)
    v_cache = poisoned_pool(rows, *v_shape, torch.bfloat16, device, salt=2)
    k_poison, v_poison = k_cache.clone(), v_cache.clone()
    loc = unique_slots(n, rows, seed=9, device=device)
    k = random_rows(n, *k_shape, torch.bfloat16, device, seed=10)
    v = random_rows(n, *v_shape, torch.bfloat16, device, seed=11)
    store_kv(k_cache, v_cache, loc, k, v, skip_index=0, err=new_error_buffer(device)[0], impl=impl)
    assert_pool(k_cache, k_poison, loc, k.cpu())
    assert_pool(v_cache, v_poison, loc, v.cpu())


@pytest.mark.parametrize("skip_index", [0, -1, None])
def test_skip_index(impl, device, skip_index):
    rows, heads, dim = 16, 2, 8
    loc = torch.tensor([3, 0, 5, -1, 0, 7], device=device)
    n = loc.shape[0]
    k_cache = poisoned_pool(rows, heads, dim, torch.bfloat16, device, salt=1)
    v_cache = poisoned_pool(rows, heads, dim, torch.bfloat16, device, salt=2)
    k_poison, v_poison = k_cache.clone(), v_cache.clone()
    k = random_rows(n, heads, dim, torch.bfloat16, device, seed=12)
    v = random_rows(n, heads, dim, torch.bfloat16, device, seed=13)
    err = new_error_buffer(device)[0]
    store_kv(k_cache, v_cache, loc, k, v, skip_index=skip_index, err=err, impl=impl)

    lc = loc.cpu()
    if skip_index == 0:
        # slot 0 untouched; -1 is out of range (position 3)
        written = (lc > 0)
        expected_err = [1, 3]
    elif skip_index == -1:
        # -1 skipped; both writes to slot 0 land in the reserved slot
        written = (lc >= 0)
        expected_err = [0, NO_POSITION]
    else:
        written = (lc >= 0)
        expected_err = [1, 3]
    assert err.cpu().tolist() == expected_err
    # rows other than the reserved slot: exact
    real = written & (lc != 0)
    assert_pool_partial(k_cache, k_poison, lc, k.cpu(), real, ignore_slot0=(skip_index != 0))
    assert_pool_partial(v_cache, v_poison, lc, v.cpu(), real, ignore_slot0=(skip_index != 0))
    if skip_index == 0:
        assert torch.equal(bits(k_cache[0].cpu()), bits(k_poison[0].cpu()))
    else:
        # two tokens wrote slot 0: each lane holds one of theirs (which one is unspecified)
        got = bits(k_cache[0].cpu())
        assert bool(((got == bits(k[1].cpu())) | (got == bits(k[4].cpu()))).all())


def assert_pool_partial(cache, poison, loc, rows_in, written, ignore_slot0):
    cache, poison = cache.cpu(), poison.cpu()
    assert torch.equal(bits(cache[loc[written]]), bits(rows_in[written]))
    untouched = torch.ones(cache.shape[0], dtype=torch.bool)
    untouched[loc[written]] = False
    if ignore_slot0:
        untouched[0] = False
    assert torch.equal(bits(cache[untouched]), bits(poison[untouched]))


def test_out_of_range_is_reported_not_written(impl, device):
    rows, heads, dim = 20, 2, 8
    loc = torch.tensor([4, 9, rows, 11, rows + 5, 2, -3, 0], device=device)
    n = loc.shape[0]
    k_cache = poisoned_pool(rows, heads, dim, torch.bfloat16, device, salt=1)
    v_cache = poisoned_pool(rows, heads, dim, torch.bfloat16, device, salt=2)
    k_poison, v_poison = k_cache.clone(), v_cache.clone()
    k = random_rows(n, heads, dim, torch.bfloat16, device, seed=14)
    v = random_rows(n, heads, dim, torch.bfloat16, device, seed=15)
    errs = new_error_buffer(device, layers=3)
    store_kv(k_cache, v_cache, loc, k, v, skip_index=0, err=errs[1], impl=impl)
    lc = loc.cpu()
    good = (lc > 0) & (lc < rows)
    assert_pool_partial(k_cache, k_poison, lc, k.cpu(), good, ignore_slot0=False)
    assert_pool_partial(v_cache, v_poison, lc, v.cpu(), good, ignore_slot0=False)
    assert errs.cpu().tolist() == [[0, NO_POSITION], [3, 2], [0, NO_POSITION]]

    # a second batch accumulates: the count adds up, the first position is the minimum
    loc2 = torch.tensor([1, -7], device=device)
    store_kv(k_cache, v_cache, loc2, k[:2], v[:2], skip_index=0, err=errs[1], impl=impl)
    assert errs.cpu().tolist() == [[0, NO_POSITION], [4, 1], [0, NO_POSITION]]


@pytest.mark.parametrize("which", ["loc_longer", "loc_shorter", "v_shorter"])
def test_length_mismatch_raises_before_writing(impl, device, which):
    rows, heads, dim, n = 12, 2, 8, 5
    k_cache = poisoned_pool(rows, heads, dim, torch.bfloat16, device, salt=1)
    v_cache = poisoned_pool(rows, heads, dim, torch.bfloat16, device, salt=2)
    k_poison, v_poison = k_cache.clone(), v_cache.clone()
    k = random_rows(n, heads, dim, torch.bfloat16, device, seed=16)
    v = random_rows(n, heads, dim, torch.bfloat16, device, seed=17)
    loc = unique_slots(n, rows, seed=18, device=device)
    if which == "loc_longer":
        loc = unique_slots(n + 3, rows, seed=18, device=device)
        expected, got = n, n + 3
    elif which == "loc_shorter":
        loc = loc[:2]
        expected, got = n, 2
    else:
        v = v[:3]
        expected, got = n, 3
    err = new_error_buffer(device)[0]
    with pytest.raises(KVLengthMismatch) as info:
        store_kv(k_cache, v_cache, loc, k, v, skip_index=0, err=err, impl=impl)
    message = str(info.value)
    assert "Size mismatch" in message
    assert "expected" in message and str(expected) in message
    assert f"but got {got}" in message
    assert torch.equal(bits(k_cache.cpu()), bits(k_poison.cpu()))
    assert torch.equal(bits(v_cache.cpu()), bits(v_poison.cpu()))
    assert err.cpu().tolist() == [0, NO_POSITION]


def test_empty_batch(impl, device):
    k_cache = poisoned_pool(8, 2, 8, torch.bfloat16, device, salt=1)
    v_cache = poisoned_pool(8, 2, 8, torch.bfloat16, device, salt=2)
    k_poison, v_poison = k_cache.clone(), v_cache.clone()
    empty = torch.empty(0, 2, 8, dtype=torch.bfloat16, device=device)
    err = new_error_buffer(device)[0]
    store_kv(k_cache, v_cache, torch.empty(0, dtype=torch.int64, device=device), empty, empty,
             skip_index=0, err=err, impl=impl)
    assert torch.equal(bits(k_cache.cpu()), bits(k_poison.cpu()))
    assert torch.equal(bits(v_cache.cpu()), bits(v_poison.cpu()))
    assert err.cpu().tolist() == [0, NO_POSITION]


def test_strided_input_rows(impl, device):
    """K and V as column slices of one fused qkv tensor (row stride wider than the row)."""
    rows, heads, dim, n = 31, 2, 16, 9
    qkv = random_rows(n, 3 * heads, dim, torch.bfloat16, device, seed=19)
    k, v = qkv[:, heads:2 * heads], qkv[:, 2 * heads:]
    k_cache = poisoned_pool(rows, heads, dim, torch.bfloat16, device, salt=1)
    v_cache = poisoned_pool(rows, heads, dim, torch.bfloat16, device, salt=2)
    k_poison, v_poison = k_cache.clone(), v_cache.clone()
    loc = unique_slots(n, rows, seed=20, device=device)
    store_kv(k_cache, v_cache, loc, k, v, skip_index=0, err=new_error_buffer(device)[0], impl=impl)
    assert_pool(k_cache, k_poison, loc, k.cpu())
    assert_pool(v_cache, v_poison, loc, v.cpu())


# ---- torch and Triton agree bit for bit --------------------------------------------------------

CONVERSIONS = [
    # (input dtype, cache dtype, scale)
    (torch.bfloat16, torch.bfloat16, None),
    (torch.float16, torch.float16, None),
    (torch.float32, torch.bfloat16, None),
    (torch.float32, torch.float16, None),
    (torch.bfloat16, torch.float16, None),
    (torch.float16, torch.bfloat16, None),
    (torch.bfloat16, torch.uint8, 1.0),
    (torch.bfloat16, torch.uint8, 2.0),
    (torch.float16, torch.uint8, 0.37),
    (torch.float32, torch.uint8, 0.37),
]


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("src_dtype,cache_dtype,scale", CONVERSIONS)
def test_torch_and_triton_pools_identical(dev, src_dtype, cache_dtype, scale):
    _skip_without_interpreter(dev)
    device = torch.device(dev)
    if dev == "cuda" and scale not in (None, 1.0, 2.0):
        pytest.skip("torch on CUDA divides by a scalar as a reciprocal product; exact only for powers of 2")
    rows, heads, dim, n = 53, 2, 24, 19
    loc = unique_slots(n, rows, seed=21, device=device)
    loc[4], loc[9], loc[11] = 0, rows + 2, -1
    k = random_rows(n, heads, dim, src_dtype, device, seed=22, scale=100.0)
    v = random_rows(n, heads, dim, src_dtype, device, seed=23, scale=0.05)
    pools = {}
    for impl in IMPLS:
        k_cache = poisoned_pool(rows, heads, dim, cache_dtype, device, salt=1)
        v_cache = poisoned_pool(rows, heads, dim, cache_dtype, device, salt=2)
        err = new_error_buffer(device)[0]
        store_kv(k_cache, v_cache, loc, k, v, skip_index=0, err=err, k_scale=scale, v_scale=scale, impl=impl)
        pools[impl] = (bits(k_cache).cpu(), bits(v_cache).cpu(), err.cpu())
    for a, b in zip(pools["torch"], pools["triton"]):
        assert torch.equal(a, b)
    assert pools["triton"][2].tolist() == [2, 9]


def _every_16bit_pattern(dtype):
    words = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    return words.view(dtype).reshape(64, 8, 128)


@pytest.mark.parametrize("src_dtype,cache_dtype,scale", [
    (torch.bfloat16, torch.uint8, None),
    (torch.bfloat16, torch.uint8, 2.0),
    (torch.float16, torch.uint8, None),
    (torch.float16, torch.uint8, 2.0),
    (torch.bfloat16, torch.float16, None),
    (torch.float16, torch.bfloat16, None),
])
def test_every_16bit_input_converts_like_torch(impl, device, src_dtype, cache_dtype, scale):
    """All 65,536 input bit patterns through the store, against the CPU cast (NaN lanes aside)."""
    src = _every_16bit_pattern(src_dtype)
    n = src.shape[0]
    k_cache = torch.zeros(n, 8, 128, dtype=cache_dtype, device=device)
    v_cache = torch.zeros_like(k_cache)
    store_kv(k_cache, v_cache, torch.arange(n, device=device), src.to(device), src.to(device),
             skip_index=None, err=new_error_buffer(device)[0], k_scale=scale, v_scale=scale, impl=impl)
    expected = bits(reference_rows(src, cache_dtype, scale))
    got = bits(k_cache.cpu())
    not_nan = ~torch.isnan(src.float())
    assert torch.equal(got[not_nan], expected[not_nan])
    # NaN stays NaN (its payload is not part of the contract)
    got_values = k_cache.cpu().view(torch.float8_e4m3fn) if cache_dtype == torch.uint8 else k_cache.cpu()
    assert bool(torch.isnan(got_values.float()[~not_nan]).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_same_dtype_store_keeps_every_bit_pattern(impl, device, dtype):
    """Tags live in the first lanes of a row as integers: NaN-looking words must survive intact."""
    src = _every_16bit_pattern(dtype)
    n = src.shape[0]
    k_cache = poisoned_pool(n + 1, 8, 128, dtype, device, salt=1)
    v_cache = poisoned_pool(n + 1, 8, 128, dtype, device, salt=2)
    loc = torch.arange(1, n + 1, device=device)
    store_kv(k_cache, v_cache, loc, src.to(device), src.flip(0).to(device),
             skip_index=0, err=new_error_buffer(device)[0], impl=impl)
    assert torch.equal(bits(k_cache[1:].cpu()), bits(src))
    assert torch.equal(bits(v_cache[1:].cpu()), bits(src.flip(0)))


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("saturate", [True, False])
def test_fp8_overflow_rule_both_ways(dev, saturate, monkeypatch):
    """Both torch rules for |x| past 448 (saturate to +-448, or NaN), whichever torch is installed."""
    _skip_without_interpreter(dev)
    device = torch.device(dev)
    values = torch.tensor([440.0, 448.0, 463.9, 464.0, 464.1, 470.0, 479.0, 480.0, 500.0, 1e4,
                           float("inf"), 1.0, 2.0**-8, 0.0])
    x = torch.cat([values, -values]).reshape(4, 1, 7)
    expected = reference_rows(x, torch.uint8).clone()
    past = (x.abs() > 464.0)  # rounds past 448
    sign = torch.where(x < 0, 0x80, 0).to(torch.uint8)
    expected[past] = (0x7E if saturate else 0x7F) | sign[past]
    monkeypatch.setattr(triton_store, "FP8_SATURATES", saturate)
    k_cache = torch.zeros(4, 1, 7, dtype=torch.uint8, device=device)
    v_cache = torch.zeros_like(k_cache)
    triton_store.store_kv_triton(k_cache, v_cache, torch.arange(4, device=device), x.to(device), x.to(device),
                                 skip_index=None, err=new_error_buffer(device)[0])
    assert torch.equal(k_cache.cpu(), expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_triton_store_replays_in_cuda_graph():
    """Captured once, replayed with new slots and rows in the static buffers; errors still counted."""
    device = torch.device("cuda")
    rows, heads, dim, n = 64, 2, 16, 8
    k_cache = torch.zeros(rows, heads, dim, dtype=torch.bfloat16, device=device)
    v_cache = torch.zeros_like(k_cache)
    loc = torch.zeros(n, dtype=torch.int64, device=device)
    k = torch.zeros(n, heads, dim, dtype=torch.bfloat16, device=device)
    v = torch.zeros_like(k)
    err = new_error_buffer(device)[0]

    def step():
        triton_store.store_kv_triton(k_cache, v_cache, loc, k, v, skip_index=0, err=err)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    new_loc = unique_slots(n, rows, seed=30, device=device)
    new_loc[5] = rows + 1  # out of range: counted, not written
    loc.copy_(new_loc)
    k.copy_(random_rows(n, heads, dim, torch.bfloat16, device, seed=31))
    v.copy_(random_rows(n, heads, dim, torch.bfloat16, device, seed=32))
    graph.replay()
    torch.cuda.synchronize()
    good = torch.ones(n, dtype=torch.bool)
    good[5] = False
    zeros = torch.zeros_like(k_cache)
    assert_pool_partial(k_cache, zeros, new_loc.cpu(), k.cpu(), good, ignore_slot0=False)
    assert_pool_partial(v_cache, zeros, new_loc.cpu(), v.cpu(), good, ignore_slot0=False)
    assert err.cpu().tolist() == [1, 5]


# ---- argument checks of the Triton wrapper -----------------------------------------------------

@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("bad", ["heads", "err_shape", "err_dtype", "cache_dtype"])
def test_triton_rejects_bad_arguments(dev, bad):
    _skip_without_interpreter(dev)
    device = torch.device(dev)
    k_cache = torch.zeros(8, 2, 8, dtype=torch.bfloat16, device=device)
    v_cache = torch.zeros_like(k_cache)
    k = torch.zeros(3, 2, 8, dtype=torch.bfloat16, device=device)
    loc = torch.tensor([1, 2, 3], device=device)
    err = new_error_buffer(device)[0]
    if bad == "heads":
        k = torch.zeros(3, 4, 4, dtype=torch.bfloat16, device=device)
        kind, match = ValueError, "k must be"
    elif bad == "err_shape":
        err = new_error_buffer(device)
        kind, match = ValueError, "err must be"
    elif bad == "err_dtype":
        err = torch.zeros(2, dtype=torch.int32, device=device)
        kind, match = ValueError, "err must be"
    else:
        k_cache = torch.zeros(8, 2, 8, dtype=torch.float32, device=device)
        k = torch.zeros(3, 2, 8, dtype=torch.float32, device=device)
        kind, match = TypeError, "k_cache dtype"
    with pytest.raises(kind, match=match):
        triton_store.store_kv_triton(k_cache, v_cache, loc, k, torch.zeros(3, 2, 8, dtype=torch.bfloat16,
                                                                          device=device),
                                     skip_index=0, err=err)


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("geometry", ["compact", "real"])
def test_store_layers_equals_restamp_and_store_per_layer(impl, geometry):
    """TaggedKVPool.store_layers (one launch for the layers sharing a target) leaves every buffer and error
    row exactly as re-stamping and storing layer by layer does, padding and out-of-range indices included."""
    if impl == "triton" and not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton store runs on CPU tensors only under TRITON_INTERPRET=1")
    from cuda_path.pool import TaggedKVPool
    from helpers import scenario

    model = scenario("smoke").model
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = (TaggedKVPool(model, 512, 256, device=dev, geometry=geometry, store_impl=impl, skip_index=0)
            for _ in range(2))
    tags = torch.arange(1, 21, device=dev)
    loc = torch.tensor(list(range(5, 23)) + [0, 900], device=dev)
    idx = tuple(range(a.k["swa"].shape[0]))
    ids = tuple(3 * i + 1 for i in idx)
    k, v = a.make_rows(tags, ids[0], "swa")
    a.store_layers("swa", idx, ids, loc, k, v)
    k2, v2 = b.make_rows(tags, ids[0], "swa")
    for i, layer in zip(idx, ids):
        b.restamp(k2, v2, layer)
        b.store("swa", i, loc, k2, v2)
    for x, y in ((a.k["swa"], b.k["swa"]), (a.v["swa"], b.v["swa"])):
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))
    assert torch.equal(a.err["swa"], b.err["swa"]) and a.err["swa"][:, 0].tolist() == [1] * len(idx)
    with pytest.raises(KVLengthMismatch):
        a.store_layers("swa", idx, ids, loc[:5], k, v)
