"""engine_path.host_kernels: the host allocator's Triton kernels run where the run's device is, over copies.

No GPU here: the bridge's device is ``cpu:0``, which torch treats as another device than the host tensors' ``cpu``
(``.to`` copies), so every step of a GPU launch is taken: copies in, the kernel on the copies, results copied back
into the host tensors, scalars and the grid passed as they are."""
from __future__ import annotations

import sys
import types

import pytest
import torch

from engine_path import host_kernels
from engine_path.host_kernels import DeviceBridge


class _Kernel:
    """A Triton-like kernel: ``kernel[grid](prefix, out, n)`` writes prefix + i into out, and records its launch."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def launch(prefix, out, n, *, scale=1):
            self.launches.append((grid, prefix.data_ptr(), out.data_ptr(), n, scale))
            out.copy_((prefix[0] + torch.arange(out.numel(), dtype=out.dtype)) * scale)
            prefix.add_(n)                   # kernels write inputs too: those come back as well
        return launch


def test_a_launch_over_host_tensors_runs_on_copies_and_writes_back():
    k = _Kernel()
    b = DeviceBridge(k, "cpu:0")
    prefix, out = torch.tensor([5], dtype=torch.int64), torch.zeros(4, dtype=torch.int64)
    b[(2,)](prefix, out, 4, scale=3)
    (grid, p_ptr, o_ptr, n, scale), = k.launches
    assert (grid, n, scale) == ((2,), 4, 3)
    assert p_ptr != prefix.data_ptr() and o_ptr != out.data_ptr()      # the kernel saw copies
    assert out.tolist() == [15, 18, 21, 24] and prefix.tolist() == [9]  # ... and the host tensors have its results
    assert b.launches == 1


def test_a_launch_already_on_the_device_goes_to_the_kernel_as_it_is():
    k = _Kernel()
    b = DeviceBridge(k, "cpu")
    prefix, out = torch.tensor([1], dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
    b[(1,)](prefix, out, 2)
    assert k.launches[0][1:3] == (prefix.data_ptr(), out.data_ptr()) and b.launches == 0
    assert out.tolist() == [1, 2]


def test_install_puts_one_bridge_per_kernel_in_every_release_module_holding_it(monkeypatch):
    kernel, other = _Kernel(), _Kernel()
    a, b, c = (types.ModuleType(n) for n in ("sglang.fake_paged", "sglang.fake_unified", "not_sglang.paged"))
    a.alloc_extend_kernel = b.alloc_extend_kernel = c.alloc_extend_kernel = kernel
    b.alloc_decode_kernel = other
    for m in (a, b, c):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    monkeypatch.setattr(host_kernels, "_bridges", {})
    got = host_kernels.install("cpu:0")
    assert set(got) == {"alloc_extend_kernel", "alloc_decode_kernel"}
    assert a.alloc_extend_kernel is b.alloc_extend_kernel is got["alloc_extend_kernel"]
    assert got["alloc_extend_kernel"].kernel is kernel and b.alloc_decode_kernel.kernel is other
    assert c.alloc_extend_kernel is kernel                     # only the release's modules
    assert host_kernels.install("cpu:0") == got                # idempotent: no bridge of a bridge
    said = host_kernels.pieces()
    assert said[0] == ("alloc_extend_kernel (the release's Triton kernel on cpu:0, over device copies of the host "
                       "allocator's tensors: 0 launches)") and len(said) == 2


def child() -> dict:
    """In a child of the warm release: the same paged allocations by the release's CPU path (its naive alloc, as
    a CPU platform takes), then by its Triton kernels as a GPU platform takes them, bridged (device ``cpu:0``:
    copies in and out, the kernel interpreted on the copies)."""
    import numpy as np

    from engine_path.allocator import EngineAllocator
    from engine_path.api import load
    from simulator.memory.allocator import RequestSlots

    api = load()

    def drive(kernel_device):
        alloc = EngineAllocator(api, 1024, 512, 16, kernel_device=kernel_device)
        if kernel_device is not None:
            # what a GPU platform sets (current_platform.capabilities.supports_triton): the Triton path
            for side in (alloc.engine.full_attn_allocator, alloc.engine.swa_attn_allocator):
                assert side.use_triton_kernels is False
                side.use_triton_kernels = True
        rows = [RequestSlots(256) for _ in range(3)]
        got = []
        for step, (r, n) in enumerate([(0, 37), (1, 16), (0, 1), (2, 5), (1, 1), (0, 27), (2, 1)]):
            got.append(alloc.extend(rows[r], n).tolist())
            if step == 4:
                alloc.free(rows[1])
        return got, dict(alloc.calls), np.asarray(alloc.full_to_swa).tolist(), alloc.pieces_ran()

    plain, bridged = drive(None), drive("cpu:0")
    kernels = [[p for p in run[3] if "_kernel (" in p] for run in (plain, bridged)]
    return {"plain": plain[:3], "bridged": bridged[:3], "plain_kernels": kernels[0], "kernels": kernels[1]}


@pytest.mark.engine
def test_the_releases_paged_kernels_bridged_hand_out_the_same_slots(warm):
    """The release's own alloc_extend_kernel / alloc_decode_kernel through the bridge: the same ids, calls and
    mapping as the release's CPU path, and run.json's allocator piece counts the bridged launches."""
    import os
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    path = os.pathsep.join(p for p in (str(tests), os.environ.get("PYTHONPATH", "")) if p)
    got = warm("sglang==0.5.23").call("test_host_kernels:child", env={"PYTHONPATH": path})
    assert got["plain"] == got["bridged"]
    ids, calls, _ = got["bridged"]
    assert [len(x) for x in ids] == [37, 16, 1, 5, 1, 27, 1]
    assert len({i for x in ids[:5] for i in x}) == 60                 # distinct slots while all rows live
    assert (calls["alloc_extend"], calls["alloc_decode"]) == (4, 3)
    assert got["plain_kernels"] == []
    # one launch a call on each side (full and SWA sub-allocators), said in run.json's engine_pieces
    tail = " (the release's Triton kernel on cpu:0, over device copies of the host allocator's tensors: {} launches)"
    assert got["kernels"] == ["alloc_extend_kernel" + tail.format(8), "alloc_decode_kernel" + tail.format(6)]
