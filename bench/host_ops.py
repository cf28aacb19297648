#!/usr/bin/env python3
"""Host time of the small operations a GPU step makes, one by one, on this machine (CUDA).

The scale run on a GPU is bound by host work: per step a few dozen torch calls on small tensors, a staged
copy from pinned memory, events, graph replays. This bench times each kind of call on its own, in
``torch.inference_mode`` as the runner makes them: the median over many calls of the host time per call
(``perf_counter`` around batches of 200; the device is synchronised between batches, never inside one),
side by side with an empty Python call and a numpy op of the same size. Ends with one line holding a JSON
object of the figures (microseconds per call).

    python bench/host_ops.py
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np
import torch

BATCH, ROUNDS = 200, 15


def _time(fn) -> float:
    """Median over ROUNDS batches of BATCH calls of the host microseconds per call."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(BATCH):
            fn()
        per.append((time.perf_counter() - t0) / BATCH * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per)


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/host_ops.py needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    n = 4096
    pinned = torch.empty(1 << 20, dtype=torch.uint8).pin_memory()
    pinned_np = pinned.numpy()
    dev_buf = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
    a = torch.arange(n, dtype=torch.int64, device=dev)
    b = torch.zeros(n, dtype=torch.int64, device=dev)
    idx = torch.randperm(n, device=dev)[:256]
    src = torch.ones(256, dtype=torch.int64, device=dev)
    ev = torch.cuda.Event()
    ev.record()
    host = np.arange(n, dtype=np.int64)
    g = torch.cuda.CUDAGraph()
    x = torch.zeros(256, device=dev)
    with torch.cuda.graph(g):
        x.add_(1)
    parts = [torch.empty(64, dtype=torch.int64, device=dev) for _ in range(8)]
    srcs = [torch.ones(64, dtype=torch.int64, device=dev) for _ in range(8)]
    try:                        # a Triton launch (the store and the checker are Triton kernels)
        import triton
        import triton.language as tl

        @triton.jit
        def _add_one(x_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

        def triton_launch():
            _add_one[(1,)](x, 256, BLOCK=256)
    except ImportError:
        triton_launch = None
    ops = {
        "python call": lambda: None,
        "numpy add (4096 int64)": lambda: host + 1,
        "pinned[:8 KB].to(cuda, non_blocking)": lambda: pinned[:8192].to(dev, non_blocking=True),
        "dev[:8 KB].copy_(pinned, non_blocking)": lambda: dev_buf[:8192].copy_(pinned[:8192], non_blocking=True),
        "numpy 8 KB into pinned": lambda: pinned_np.__setitem__(slice(0, 8192), 7),
        "event.record()": ev.record,
        "event.query()": ev.query,
        "tensor slice a[:256]": lambda: a[:256],
        "tensor .view(int32)": lambda: a.view(torch.int32),
        "split_with_sizes (8 parts)": lambda: a.split_with_sizes([512] * 8),
        "a.add_(1) (launch)": lambda: a.add_(1),
        "index_copy_ (256 rows)": lambda: b.index_copy_(0, idx, src),
        "b[idx] = src": lambda: b.__setitem__(idx, src),
        "_foreach_copy_ (8 pairs)": lambda: torch._foreach_copy_(parts, srcs),
        "graph.replay() (one kernel)": g.replay,
        "torch.from_numpy (4096)": lambda: torch.from_numpy(host),
        "torch.empty(256, cuda)": lambda: torch.empty(256, dtype=torch.int64, device=dev),
    }
    if triton_launch is not None:
        ops["Triton kernel launch (one block)"] = triton_launch
    figures = {}
    with torch.inference_mode():
        for name, fn in ops.items():
            figures[name] = round(_time(fn), 2)
    base = figures["python call"]
    print(f"# host microseconds per call on {torch.cuda.get_device_name()} (torch {torch.__version__})")
    for name, us in figures.items():
        print(f"{name:42s} {us:8.2f} us   {us / base:7.1f}x a Python call")
    print(json.dumps({"bench": "host_ops", "us_per_call": figures}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
