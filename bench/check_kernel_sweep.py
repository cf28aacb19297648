#!/usr/bin/env python3
"""The checker's kernel (cuda_path.check_kernel.tag_mismatches) under launch configurations and pool
layouts, against the copy ceiling, with store_bandwidth.py's method and byte count (K and V tag
sectors + slot index + expected words + result byte per slot; device time in a CUDA graph over input
sets that together exceed the L2 cache several times).

Layouts: ``separate`` (K and V in two allocations, as today) and ``interleaved`` (one allocation
``[rows, 2, heads, dim]``, K and V of a row side by side: flashinfer's paged layout puts K and V of a
page together the same way), where a slot's K and V tag sectors are one row apart instead of 2 GB.

    python bench/check_kernel_sweep.py       # N = 32768 and 262144 in a 1M-row, 8 x 128 bf16 pool
Ends with one JSON line.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from store_bandwidth import Timer, gbps, sets_needed  # noqa: E402

from cuda_path.check_kernel import tag_mismatches  # noqa: E402

CONFIGS = ((128, 2), (128, 4), (256, 4), (512, 4), (512, 8), (1024, 8), (128, 1), (64, 1))
SIZES = (32768, 262144)


def main() -> int:
    if not torch.cuda.is_available():
        print("check_kernel_sweep: no CUDA device; nothing measured")
        return 0
    dev = torch.device("cuda")
    rows, heads, dim = 1_000_000, 8, 128
    l2 = int(torch.cuda.get_device_properties(dev).L2_cache_size)
    timer = Timer(25.0, 100.0)
    gen = torch.Generator().manual_seed(0)
    results = []
    layer0 = torch.zeros(1, dtype=torch.int64, device=dev)
    for layout in ("separate", "interleaved"):
        if layout == "separate":
            k = torch.randint(1, 1000, (rows, heads, dim), device=dev).to(torch.bfloat16)
            v = torch.randint(1, 1000, (rows, heads, dim), device=dev).to(torch.bfloat16)
        else:
            kv = torch.randint(1, 1000, (rows, 2, heads, dim), device=dev).to(torch.bfloat16)
            k, v = kv[:, 0], kv[:, 1]
        v[:, 0, :8] = k[:, 0, :8]
        kw = k.view(torch.int64)[:, 0, :2]
        for n in SIZES:
            moved = n * (32 + 32 + 8 + 16 + 1)
            count = sets_needed(moved, l2)
            sets = []
            for _ in range(count):
                s = (torch.randperm(rows - 1, generator=gen)[:n] + 1).to(dev)
                want = kw[s].clone()
                want[: max(1, n // 100), 0] ^= 1
                sets.append((s, want))
            half = moved // 2
            src = torch.randint(0, 256, (count * half,), dtype=torch.uint8, device=dev)
            dst = torch.empty_like(src)
            copy_ms = min(timer.device(lambda i: dst[i * half:(i + 1) * half].copy_(src[i * half:(i + 1) * half]),
                                       count),
                          timer.eager(lambda i: dst[i * half:(i + 1) * half].copy_(src[i * half:(i + 1) * half]),
                                      count))
            for block, warps in CONFIGS:
                for cg in (False, True):
                    def call(i, b=block, w=warps, c=cg):
                        s, want = sets[i]
                        tag_mismatches(k[None], v[None], rows, s, want, layer0, block=b, num_warps=w, cg=c)

                    s, want = sets[0]
                    got = tag_mismatches(k[None], v[None], rows, s, want, layer0, block=block, num_warps=warps, cg=cg)
                    ms = timer.device(call, count)
                    r = {"layout": layout, "n": n, "block": block, "warps": warps, "cg": cg,
                         "check_ms": ms, "copy_ms": copy_ms, "pct_of_copy": 100.0 * copy_ms / ms,
                         "gbps": gbps(moved, ms), "correct": int(got.sum()) == max(1, n // 100)}
                    results.append(r)
                    print(f"{layout:12s} N={n:<7} block {block:5d} warps {warps} cg {int(cg)}  "
                          f"{r['pct_of_copy']:6.1f}% of copy  {ms * 1e3:7.2f} us  {'ok' if r['correct'] else 'WRONG'}",
                          flush=True)
            sets = src = dst = None
        k = v = kw = None
        torch.cuda.empty_cache()
    best = {}
    for r in results:
        key = f"{r['layout']}/{r['n']}"
        if r["correct"] and (key not in best or r["pct_of_copy"] > best[key]["pct_of_copy"]):
            best[key] = r
    print("\n# best per layout and size")
    for key, r in best.items():
        print(f"{key:22s} {r['pct_of_copy']:6.1f}% of copy  block {r['block']} warps {r['warps']} cg {int(r['cg'])}")
    print(json.dumps({"bench": "check_kernel_sweep", "results": results, "best": best}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
