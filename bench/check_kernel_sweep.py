#!/usr/bin/env python3
"""The checker's kernel (cuda_path.check_kernel.tag_mismatches) under launch configurations and pool
layouts, against the copy ceiling, with store_bandwidth.py's method and byte count (K and V tag
sectors + slot index + expected words + result byte per slot; device time in a CUDA graph over input
sets that together exceed the L2 cache several times).

Layouts: ``separate`` (K and V in two allocations, SGLang's layout and the split pools'), ``interleaved`` (one
allocation ``[rows, 2, heads, dim]``, K and V of a row side by side: flashinfer's paged layout puts K and V of a
page together the same way), where a slot's K and V tag sectors are one row apart instead of 2 GB, and
``paired`` (the pools' paired layout, what a CUDA run uses: K's tail tag and V's head tag in one sector).

    python bench/check_kernel_sweep.py           # N = 32768 and 262144 in a 1M-row, 8 x 128 bf16 pool
    python bench/check_kernel_sweep.py paired    # one layout only
    python bench/check_kernel_sweep.py --probe   # what bounds it: where the two tag sectors lie (below)

``--probe`` times one gather-and-compare kernel at N = 262,144 random slots of a 1M-row pool with the two tag
sectors placed differently (K and V in two allocations, as the pools are; one allocation with K and V of a row
side by side, tags 2 KB apart; the same with K's tags in its last lanes, so the two sectors are neighbours;
both tags in one 32-byte sector, one load; one table only), with the slots sorted, and with the L2 fetch
granularity limit (cuCtxSetLimit) at 32 and 128 bytes; each row prints % of copy and random sectors per second.
Ends with one JSON line.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from store_bandwidth import Timer, paired_copy, gbps, sets_needed  # noqa: E402

from cuda_path.check_kernel import tag_mismatches  # noqa: E402

CONFIGS = ((128, 2), (128, 4), (256, 4), (512, 4), (512, 8), (1024, 8), (128, 1), (64, 1))
SIZES = (32768, 262144)


@triton.jit
def _pair_kernel(buf_a, buf_b, slots, want, out, n, stride_a, off_a, stride_b, off_b, NW: tl.constexpr,
                 BLOCK: tl.constexpr, TWO: tl.constexpr, WIDE: tl.constexpr):
    """Per slot: NW int64 words at ``buf_a[slot * stride_a + off_a]`` (and at ``buf_b[...]`` when TWO) against
    ``want``; WIDE: both tags in one load of 2 * NW words from buf_a (one 32-byte sector)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    slot = tl.load(slots + i, mask=m, other=0).to(tl.int64)
    m2 = m[:, None]
    if WIDE:
        w2 = tl.arange(0, 2 * NW)[None, :]
        x = tl.load(buf_a + (slot * stride_a + off_a)[:, None] + w2, mask=m2, other=0)
        exp = tl.load(want + i[:, None] * NW + (w2 % NW), mask=m2, other=0)
        bad = tl.max((x != exp).to(tl.int32), axis=1)
    else:
        w = tl.arange(0, NW)[None, :]
        exp = tl.load(want + i[:, None] * NW + w, mask=m2, other=0)
        ka = tl.load(buf_a + (slot * stride_a + off_a)[:, None] + w, mask=m2, other=0)
        bad = tl.max((ka != exp).to(tl.int32), axis=1)
        if TWO:
            vb = tl.load(buf_b + (slot * stride_b + off_b)[:, None] + w, mask=m2, other=0)
            bad = bad | tl.max((vb != exp).to(tl.int32), axis=1)
    tl.store(out + i, bad.to(tl.int8), mask=m)


def _l2_fetch_limit(value=None):
    """The context's CU_LIMIT_MAX_L2_FETCH_GRANULARITY (a per-process performance hint, not a card setting);
    with ``value``, set it first. None where the driver library cannot be loaded."""
    import ctypes
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    if value is not None:
        cu.cuCtxSetLimit(ctypes.c_int(5), ctypes.c_size_t(value))
    got = ctypes.c_size_t(0)
    rc = cu.cuCtxGetLimit(ctypes.byref(got), ctypes.c_int(5))
    return int(got.value) if rc == 0 else None


def _probe_layouts(dev, rows: int, words: int):
    """The five placements of the two tag words (the same values in each), and the expected tag table."""
    sep_k = torch.randint(1, 1 << 40, (rows * words,), dtype=torch.int64, device=dev)
    sep_v = torch.randint(1, 1 << 40, (rows * words,), dtype=torch.int64, device=dev)
    kv = torch.randint(1, 1 << 40, (rows * 2 * words,), dtype=torch.int64, device=dev)
    # the tag words each layout's check reads hold the same values, so one expected table serves all
    tag = torch.randint(1, 1 << 40, (rows, 2), dtype=torch.int64, device=dev)
    r2 = torch.arange(rows, device=dev)[:, None] * words + torch.arange(2, device=dev)
    sep_k[r2] = tag
    sep_v[r2] = tag
    base = 2 * r2 - torch.arange(2, device=dev)      # a row pair's first word (K), its tag words
    kv[base] = tag                  # K first lanes
    kv[base + words] = tag          # V first lanes
    kv[base + words - 2] = tag      # K last lanes
    kv[base + 2] = tag              # second half of K's first sector
    variants = [  # name, a, b, stride_a, off_a, stride_b, off_b, two, wide, bytes per slot, sectors per slot
        ("separate K and V allocations (the pools)", sep_k, sep_v, words, 0, words, 0, True, False, 89, 2),
        ("one allocation, K|V of a row: tags 2 KB apart", kv, kv, 2 * words, 0, 2 * words, words, True, False, 89, 2),
        ("one allocation, K tag in last lanes: neighbour sectors", kv, kv, 2 * words, words - 2, 2 * words, words,
         True, False, 89, 2),
        ("both tags in one 32-byte sector (one load)", kv, kv, 2 * words, 0, 0, 0, False, True, 89, 1),
        ("one table only (K)", sep_k, sep_k, words, 0, 0, 0, False, False, 57, 1),
    ]
    return variants, tag


def _probe_sets(dev, rows: int, n: int, count: int, tag, gen):
    """Input sets: unique random slots (1% expected to differ), the same sorted, with their expected words."""
    sets = []
    for _ in range(count):
        s = (torch.randperm(rows - 1, generator=gen)[:n] + 1).to(dev)
        want = tag[s].clone()
        want[: n // 100, 0] ^= 1
        ss, order = torch.sort(s)
        sets.append((s, want, ss, want[order].contiguous()))
    return sets


def probe(rows: int = 1_000_000, n: int = 262144, dev=None, l2: int = 0) -> int:
    dev = dev or torch.device("cuda")
    words = 256                      # rows of 8 x 128 bf16 (2 KB = 256 int64 words)
    l2 = l2 or int(torch.cuda.get_device_properties(dev).L2_cache_size)
    timer = Timer(25.0, 100.0)
    variants, tag = _probe_layouts(dev, rows, words)
    count = sets_needed(n * 89, l2)
    sets = _probe_sets(dev, rows, n, count, tag, torch.Generator().manual_seed(1))
    out = torch.empty(n, dtype=torch.int8, device=dev)
    results = []

    def copy_ms(moved):
        half = moved // 2
        src = torch.randint(0, 256, (count * half,), dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        fn = lambda i: dst[i * half:(i + 1) * half].copy_(src[i * half:(i + 1) * half])  # noqa: E731
        return min(timer.device(fn, count), timer.eager(fn, count))

    copies = {b: copy_ms(n * b) for b in (89, 57)}

    def run(name, a, b, sa, oa, sb, ob, two, wide, nbytes, sectors, sort=False, tagname=""):
        def call(i):
            s, want, ss, ws = sets[i]
            _pair_kernel[(triton.cdiv(n, 256),)](a, b, ss if sort else s, ws if sort else want, out, n, sa, oa, sb, ob,
                                                  NW=2, BLOCK=256, TWO=two, WIDE=wide, num_warps=4)
        call(0)
        ok = int(out.sum()) == n // 100
        ms = timer.device(call, count)
        r = {"variant": name + tagname, "ms": ms, "pct_of_copy": 100 * copies[nbytes] / ms, "correct": ok,
             "sectors_per_s": n * sectors / (ms * 1e-3)}
        results.append(r)
        print(f"{r['variant']:72s} {r['pct_of_copy']:6.1f}% of copy  {ms * 1e3:7.2f} us  "
              f"{r['sectors_per_s'] / 1e9:5.1f} G sectors/s  {'ok' if ok else 'WRONG'}", flush=True)

    for v in variants:
        run(*v)
    run(*variants[0], sort=True, tagname=" [slots sorted]")
    st = timer.device(lambda i: torch.sort(sets[i][0]), count)
    print(f"{f'(torch.sort of the {n:,} slots alone)':72s} {st * 1e3:7.2f} us")
    default = _l2_fetch_limit()
    print(f"L2 fetch granularity limit: {default}")
    for g in (32, 128):
        got = _l2_fetch_limit(g)
        if got is None:
            break
        run(*variants[0], tagname=f" [L2 fetch limit {got} B]")
        run(*variants[4], tagname=f" [L2 fetch limit {got} B]")
    if default is not None:
        _l2_fetch_limit(default)
    print(json.dumps({"bench": "check_kernel_probe", "n": n, "copy_ms": copies, "sort_ms": st,
                      "l2_fetch_default": default, "results": results}))
    return 0


#: ``separate``: two allocations (SGLang's layout, the split pools); ``interleaved``: K and V of a row side by side,
#: tags 2 KB apart; ``paired``: the pools' paired layout (cuda_path.pool.paired_views: K's tail tag and V's head tag
#: in one sector, one load), the layout a CUDA run uses
LAYOUTS = ("separate", "interleaved", "paired")


def _layout_buffers(layout: str, rows: int, heads: int, dim: int, dev) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's K and V ``[1, rows, heads, dim]`` bf16 caches of random lanes in ``layout`` (a paired pair marked
    for the one-load check), V's tag lanes (and a paired K's tail tag lanes) equal to K's head tag lanes, so that
    one expected table serves every layout."""
    if layout in ("separate", "paired"):
        k = torch.randint(1, 1000, (rows, heads, dim), device=dev).to(torch.bfloat16)
        v = torch.randint(1, 1000, (rows, heads, dim), device=dev).to(torch.bfloat16)
    else:
        kv = torch.randint(1, 1000, (rows, 2, heads, dim), device=dev).to(torch.bfloat16)
        k, v = kv[:, 0], kv[:, 1]
    v[:, 0, :8] = k[:, 0, :8]
    if layout == "paired":      # the same rows in the pools' paired layout, K's tail tag lanes = its head's
        return paired_copy(k, v)
    return k[None], v[None]


def main() -> int:
    if not torch.cuda.is_available():
        print("check_kernel_sweep: no CUDA device; nothing measured")
        return 0
    if "--probe" in sys.argv[1:]:
        return probe()
    dev = torch.device("cuda")
    rows, heads, dim = 1_000_000, 8, 128
    l2 = int(torch.cuda.get_device_properties(dev).L2_cache_size)
    timer = Timer(25.0, 100.0)
    gen = torch.Generator().manual_seed(0)
    results = []
    layer0 = torch.zeros(1, dtype=torch.int64, device=dev)
    layouts = [a for a in sys.argv[1:] if a in LAYOUTS] or list(LAYOUTS)
    for layout in layouts:
        k, v = _layout_buffers(layout, rows, heads, dim, dev)
        kw = k[0].view(torch.int64)[:, 0, :2]
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
                        tag_mismatches(k, v, rows, s, want, layer0, block=b, num_warps=w, cg=c)

                    s, want = sets[0]
                    got = tag_mismatches(k, v, rows, s, want, layer0, block=block, num_warps=warps, cg=cg)
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
