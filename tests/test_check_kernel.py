"""The GPU-side tag check kernel gives exactly the torch comparison's answer (CPU: Triton interpreter)."""
from __future__ import annotations

import pytest
import torch

from cuda_path.pool import TaggedKVPool
from simulator.oracle.kvrows import tag_lanes

from helpers import scenario

# CPU tensors run the kernel under Triton's interpreter, which is only on where there is no GPU
DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
def test_tag_mismatches_equals_torch(device, kv_dtype):
    import dataclasses

    from cuda_path.check_kernel import tag_mismatches

    model = dataclasses.replace(scenario("smoke").model, kv_dtype=kv_dtype)
    pool = TaggedKVPool(model, 512, 300, device=device, geometry="compact", store_impl="torch")
    g = torch.Generator().manual_seed(1)
    slots = (torch.randperm(298, generator=g)[:90] + 1).to(device)
    tags = torch.randint(1, 10**6, (90,), generator=g).to(device)
    for layer in range(pool.k["swa"].shape[0]):
        k, v = pool.make_rows(tags, layer, "swa")
        pool.store("swa", layer, slots, k, v)
    expected = tags.clone()
    expected[::9] += 1
    pool.k["swa"][2, slots[4]] = 0
    want = tag_lanes(expected, pool.k["swa"].dtype).contiguous().view(torch.int64)
    layers = torch.tensor([0, 2, 7], device=device)
    got = tag_mismatches(pool.k["swa"], pool.v["swa"], 300, slots, want, layers)
    words_k = pool._tag_words(pool.k["swa"], "swa", slots, [0, 2, 7])
    words_v = pool._tag_words(pool.v["swa"], "swa", slots, [0, 2, 7])
    ref = (words_k != want).any(-1) | (words_v != want).any(-1)
    assert torch.equal(got, ref)
    assert int(ref.sum()) == 3 * 10 + 1


@pytest.mark.parametrize("device", DEVICES)
def test_tag_mismatches_reads_an_interleaved_pool(device):
    """K and V as strided halves of one [rows, 2, heads, dim] allocation: the same answer as torch."""
    from cuda_path.check_kernel import tag_mismatches

    g = torch.Generator().manual_seed(3)
    kv = torch.randint(1, 200, (1, 400, 2, 2, 16), generator=g).to(torch.bfloat16).to(device)
    k, v = kv[:, :, 0], kv[:, :, 1]
    slots = (torch.randperm(399, generator=g)[:70] + 1).to(device)
    want = k.reshape(1, 400, -1).view(torch.int64)[0, slots, :2].clone()
    v[0, :, 0, :8] = k[0, :, 0, :8]
    want[::7, 1] ^= 1
    v[0, slots[3], 0, 0] += 1                                # a V-only difference
    got = tag_mismatches(k, v, 400, slots, want, torch.tensor([0], device=device))
    ref = torch.zeros((1, 70), dtype=torch.bool)
    ref[0, ::7] = True
    ref[0, 3] = True
    assert torch.equal(got.cpu(), ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", [False, True])
def test_verdict_is_zero_exactly_when_the_checker_finds_nothing(device, kernel):
    """The step runner's verdict: planted K-only, V-only and out-of-range differences are each counted;
    reserved slots, slots past the pool and unwritten layers are not; a clean pool gives 0."""
    from cuda_path.check_kernel import verdict

    model = scenario("smoke").model
    pool = TaggedKVPool(model, 512, 300, device=device, geometry="compact", store_impl="torch", skip_index=0)
    g = torch.Generator().manual_seed(2)
    slots = (torch.randperm(298, generator=g)[:40] + 1).to(device)
    tags = torch.randint(1, 10**6, (40,), generator=g).to(device)
    n_layers = pool.k["swa"].shape[0]
    for layer in range(n_layers - 1):                         # the last layer is not written
        k, v = pool.make_rows(tags, layer, "swa")
        pool.store("swa", layer, slots, k, v)
    expected = torch.zeros(300, dtype=torch.int64, device=device)
    expected[slots] = tags
    exp_words = tag_lanes(expected, pool.k["swa"].dtype).contiguous().view(torch.int64)
    reserved = torch.zeros(300, dtype=torch.bool, device=device)
    reserved[0] = True
    layers = torch.arange(n_layers - 1, device=device)
    target = torch.cat([slots, torch.tensor([0, 0], device=device)]).to(torch.int32)   # padded rows at 0

    def run() -> int:
        out = torch.zeros(1, dtype=torch.int64, device=device)
        verdict(pool.k["swa"], pool.v["swa"], layers, slots, target, exp_words, reserved, pool.err["swa"], out,
                kernel=kernel)
        return int(out)

    assert run() == 0
    pool.k["swa"][0, 0] = 7                                   # the reserved slot: never compared
    assert run() == 0
    pool.k["swa"][2, slots[5]] = 0                           # K only, in one layer
    assert run() == 2                                         # slot 5 is in both candidate lists
    pool.v["swa"][1, slots[9]] += 1                           # V only
    assert run() == 4
    pool.err["swa"][3, 0] = 2                                 # the store skipped two out-of-range indices
    assert run() == 6
