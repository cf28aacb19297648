"""GPU-side tag check: one Triton launch compares the tag lanes of K and V at given slots, in every
layer of a sub-pool, with the expected tags' bits. Only the boolean result stays on the device; the
checker moves to the host just the positions that differ.

Rows are read as int64 words (the tag lanes are 16 bytes in bf16/fp16 pools, 8 in fp8 pools), so a
check reads one 32-byte sector of K and one of V per (layer, slot): the least any check can read.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 128
NUM_WARPS = 2


@triton.jit
def _tag_mismatch_kernel(k_words, v_words, layers, slots, want, out, n, k_layer_stride, k_row_stride,
                         v_layer_stride, v_row_stride, NW: tl.constexpr, BLOCK: tl.constexpr):
    li = tl.program_id(1)
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    w = tl.arange(0, NW)[None, :]
    m2 = m[:, None]
    layer = tl.load(layers + li).to(tl.int64)
    slot = tl.load(slots + i, mask=m, other=0).to(tl.int64)
    # each row's tag words in one vector load (16 bytes for bf16/fp16 pools)
    exp = tl.load(want + i[:, None] * NW + w, mask=m2, other=0)
    kw = tl.load(k_words + (layer * k_layer_stride + slot * k_row_stride)[:, None] + w, mask=m2, other=0)
    vw = tl.load(v_words + (layer * v_layer_stride + slot * v_row_stride)[:, None] + w, mask=m2, other=0)
    bad = tl.max(((kw != exp) | (vw != exp)).to(tl.int32), axis=1)
    tl.store(out + li * n + i, bad.to(tl.int8), mask=m)


def tag_mismatches(k: torch.Tensor, v: torch.Tensor, rows: int, slots: torch.Tensor, want: torch.Tensor,
                   layers: torch.Tensor, block: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """``[len(layers), len(slots)]`` bool. ``k``/``v``: ``[layers, rows, ...]`` buffers; ``want``:
    ``[len(slots), words]`` int64 expected tag-lane words."""
    n_layers = k.shape[0]
    kw = k.view(n_layers, rows, -1).view(torch.int64)
    vw = v.view(n_layers, rows, -1).view(torch.int64)
    n, nw = want.shape
    out = torch.empty((layers.shape[0], n), dtype=torch.int8, device=k.device)
    if n == 0 or layers.shape[0] == 0:
        return out.bool()
    block = block or BLOCK
    grid = (triton.cdiv(n, block), layers.shape[0])
    _tag_mismatch_kernel[grid](kw, vw, layers, slots, want.contiguous(), out, n, kw.stride(0), kw.stride(1),
                               vw.stride(0), vw.stride(1), NW=nw, BLOCK=block, num_warps=num_warps or NUM_WARPS)
    return out.bool()
