"""The GPU-side tag check kernel gives exactly the torch comparison's answer (CPU: Triton interpreter)."""
from __future__ import annotations

import pytest
import torch

from cuda_path.pool import TaggedKVPool
from simulator.kvrows import tag_lanes

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
