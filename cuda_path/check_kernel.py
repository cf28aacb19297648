"""GPU-side tag check: one Triton launch compares the tag lanes of K and V at given slots, in every
layer of a sub-pool, with the expected tags' bits. Only the boolean result stays on the device; the
checker moves to the host just the positions that differ.

Rows are read as int64 words (the tag lanes are 16 bytes in bf16/fp16 pools, 8 in fp8 pools). On a
``split`` pool (K and V in separate buffers, SGLang's layout) a check reads one 32-byte sector of K and one
of V per (layer, slot). On a ``paired`` pool (cuda_path/pool.py: a slot's V row right after its K row, the
boundary mid-sector) it reads K's *tail* tag and V's head tag, side by side in one 32-byte sector, in one
vector load: one random sector per (layer, slot) instead of two, the rate the device's memory bounds.

Why the tail is as good as the head: rows wide enough for the paired layout carry the same tag encoding in
their first and last ``TAG_LANES`` lanes (simulator/oracle/kvrows.py ``encode_rows``), and the pool's rows are only
ever written whole: the stores (cuda_path/store.py, triton_store.py) write whole rows, a pool-class copy
(simulator/memory/pool.py, ``TaggedKVPool.clone``) copies a whole pool, and faults and other partial writes go
through the run's own step, never the GPU step runner (``GpuStepRunner.__call__`` returns None on
``run.faults``), and store whole rows too. So a row's tail tag always equals its head tag, a paired check
finds exactly the slots a split check finds, and the verdict stays exactly "the checker would find nothing".
The kernels take the paired path only for the ``k``/``v`` views a paired pool marked (:func:`mark_paired`);
any other buffers (however laid out) are read head and head, as before.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

BLOCK = 128
NUM_WARPS = 2
#: slots per program and warps of the paired check (the one-sector probe's launch shape)
PAIRED_BLOCK = 256
PAIRED_WARPS = 4
_PAIR = "_slotscope_tag_pair"    # attribute a paired pool sets on its K view: (its V view, the pair words)
#: load the random tag sectors with .cg (L2 only)
CACHE_GLOBAL = False


@triton.jit
def _tag_mismatch_kernel(k_words, v_words, layers, slots, want, out, n, k_layer_stride, k_row_stride,
                         v_layer_stride, v_row_stride, NW: tl.constexpr, BLOCK: tl.constexpr, CG: tl.constexpr,
                         PAIRED: tl.constexpr):
    li = tl.program_id(1)
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    m2 = m[:, None]
    layer = tl.load(layers + li).to(tl.int64)
    slot = tl.load(slots + i, mask=m, other=0).to(tl.int64)
    if PAIRED:    # K's tail tag then V's head tag: 2 * NW words in one sector, one load (strides: 32-byte multiples)
        w2 = tl.arange(0, 2 * NW)[None, :]
        at = tl.multiple_of(layer * k_layer_stride + slot * k_row_stride, 4)
        exp2 = tl.load(want + i[:, None] * NW + (w2 % NW), mask=m2, other=0)
        if CG:
            x = tl.load(k_words + at[:, None] + w2, mask=m2, other=0, cache_modifier=".cg")
        else:
            x = tl.load(k_words + at[:, None] + w2, mask=m2, other=0)
        bad = tl.max((x != exp2).to(tl.int32), axis=1)
    else:
        w = tl.arange(0, NW)[None, :]
        # each row's tag words in one vector load (16 bytes for bf16/fp16 pools); K's and V's issued together
        k_at = k_words + (layer * k_layer_stride + slot * k_row_stride)[:, None] + w
        v_at = v_words + (layer * v_layer_stride + slot * v_row_stride)[:, None] + w
        if CG:        # random sectors: read through L2 only, not L1
            kw = tl.load(k_at, mask=m2, other=0, cache_modifier=".cg")
            vw = tl.load(v_at, mask=m2, other=0, cache_modifier=".cg")
        else:
            kw = tl.load(k_at, mask=m2, other=0)
            vw = tl.load(v_at, mask=m2, other=0)
        exp = tl.load(want + i[:, None] * NW + w, mask=m2, other=0)
        bad = tl.max(((kw != exp) | (vw != exp)).to(tl.int32), axis=1)
    tl.store(out + li * n + i, bad.to(tl.int8), mask=m)


def mark_paired(k: torch.Tensor, v: torch.Tensor, pair: torch.Tensor) -> None:
    """Mark ``k``/``v`` (a paired pool's views) for the one-load check: ``pair`` is the int64 ``[layers, rows,
    2 * words]`` view of each slot's K tail tag words followed by its V head tag words (row stride a multiple
    of 32 bytes). Only rows that carry their tag at both ends may be marked (simulator/oracle/kvrows.py)."""
    setattr(k, _PAIR, (v, pair))


def pair_words(k: torch.Tensor, v: torch.Tensor) -> Optional[torch.Tensor]:
    """The pair words of ``k`` and ``v`` when a paired pool marked exactly these two views, else None."""
    got = getattr(k, _PAIR, None)
    return got[1] if got is not None and got[0] is v else None


def as_words(buf: torch.Tensor, rows: int) -> torch.Tensor:
    """A ``[layers, rows, ...]`` buffer as int64 words ``[layers, rows, words]`` (its row stride kept: the
    K and V halves of an interleaved pool are strided views)."""
    if buf.is_contiguous():
        return buf.view(buf.shape[0], rows, -1).view(torch.int64)
    return buf.view(torch.int64).flatten(2) if buf.dim() == 3 else buf.view(torch.int64)[..., 0, :]


def tag_mismatches(k: torch.Tensor, v: torch.Tensor, rows: int, slots: torch.Tensor, want: torch.Tensor,
                   layers: torch.Tensor, block: int | None = None, num_warps: int | None = None,
                   cg: bool | None = None) -> torch.Tensor:
    """``[len(layers), len(slots)]`` bool. ``k``/``v``: ``[layers, rows, ...]`` buffers; ``want``:
    ``[len(slots), words]`` int64 expected tag-lane words."""
    pair = pair_words(k, v)
    kw, vw = (pair, pair) if pair is not None else (as_words(k, rows), as_words(v, rows))
    n, nw = want.shape
    out = torch.empty((layers.shape[0], n), dtype=torch.int8, device=k.device)
    if n == 0 or layers.shape[0] == 0:
        return out.bool()
    block = block or (BLOCK if pair is None else PAIRED_BLOCK)
    grid = (triton.cdiv(n, block), layers.shape[0])
    _tag_mismatch_kernel[grid](kw, vw, layers, slots, want.contiguous(), out, n, kw.stride(0), kw.stride(1),
                               vw.stride(0), vw.stride(1), NW=nw, BLOCK=block, CG=CACHE_GLOBAL if cg is None else cg,
                               PAIRED=pair is not None,
                               num_warps=num_warps or (NUM_WARPS if pair is None else PAIRED_WARPS))
    return out.bool()


@triton.jit
def _verdict_kernel(k_words, v_words, layers, n_layers, slots_a, n_a, slots_b, n_b, exp_words, ref_rows,
                    reserved, err, out, rows, k_layer_stride, k_row_stride, v_layer_stride, v_row_stride,
                    NW: tl.constexpr, BLOCK: tl.constexpr, PAIRED: tl.constexpr):
    """Adds to ``out[0]`` the number of candidate slots (``slots_a`` then ``slots_b``; out of range and
    reserved ones skipped) whose K or V tag words differ from ``exp_words[slot]`` in any of ``layers``,
    plus (program 0) the out-of-range counts of those layers in ``err``. Zero: the checker finds nothing.
    PAIRED: ``k_words`` is a paired pool's pair words (K's tail tag, V's head tag: one load per layer)."""
    pid = tl.program_id(0)
    blocks_a = tl.cdiv(n_a, BLOCK)
    if pid < blocks_a:
        i = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = i < n_a
        s = tl.load(slots_a + i, mask=m, other=-1).to(tl.int64)
    else:
        i = (pid - blocks_a).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = i < n_b
        s = tl.load(slots_b + i, mask=m, other=-1).to(tl.int64)
    ok = m & (s >= 0) & (s < rows)
    s0 = tl.where(ok, s, 0)
    res = tl.load(reserved + s0, mask=ok, other=1)
    ok = ok & (res == 0)
    beyond = ok & (s0 >= ref_rows)          # a slot the reference does not hold: let the checker decide
    ok = ok & (s0 < ref_rows)
    ok2 = ok[:, None]
    bad = beyond.to(tl.int32)
    if PAIRED:
        w2 = tl.arange(0, 2 * NW)[None, :]
        exp2 = tl.load(exp_words + s0[:, None] * NW + (w2 % NW), mask=ok2, other=0)
        for li in range(n_layers):
            layer = tl.load(layers + li).to(tl.int64)
            at = tl.multiple_of(layer * k_layer_stride + s0 * k_row_stride, 4)
            x = tl.load(k_words + at[:, None] + w2, mask=ok2, other=0)
            bad = bad | tl.max((x != exp2).to(tl.int32), axis=1)
    else:
        w = tl.arange(0, NW)[None, :]
        exp = tl.load(exp_words + s0[:, None] * NW + w, mask=ok2, other=0)
        for li in range(n_layers):
            layer = tl.load(layers + li).to(tl.int64)
            kw = tl.load(k_words + layer * k_layer_stride + s0[:, None] * k_row_stride + w, mask=ok2, other=0)
            vw = tl.load(v_words + layer * v_layer_stride + s0[:, None] * v_row_stride + w, mask=ok2, other=0)
            bad = bad | tl.max(((kw != exp) | (vw != exp)).to(tl.int32), axis=1)
    total = tl.sum(bad, axis=0).to(tl.int64)
    if pid == 0:
        for li in range(n_layers):
            layer = tl.load(layers + li).to(tl.int64)
            total += tl.load(err + layer * 2)
    if total > 0:
        tl.atomic_add(out, total)


def _words(buf: torch.Tensor) -> torch.Tensor:
    return as_words(buf, buf.shape[1])


def verdict(k: torch.Tensor, v: torch.Tensor, layers: torch.Tensor, slots_a: torch.Tensor, slots_b: torch.Tensor,
            exp_words: torch.Tensor, reserved: torch.Tensor, err: torch.Tensor, out: torch.Tensor,
            kernel: bool | None = None) -> None:
    """Add to ``out`` (an int64 device scalar view) a count that is zero exactly when no candidate slot
    differs and no layer counted an out-of-range index; no host sync (``out`` is read once per step).

    ``k``/``v``: ``[layers, rows, ...]`` pool buffers; ``layers``: int64 indices of the layers written;
    ``slots_a``/``slots_b``: candidate slots (int32/int64, any values); ``exp_words``: ``[ref_rows, words]``
    int64, the tag-lane words each slot should hold; ``reserved``: bool ``[rows]``; ``err``: ``[L, 2]``.
    ``kernel``: the Triton kernel (default on CUDA; on CPU tensors only under ``TRITON_INTERPRET=1``).
    A paired pool's marked views are read one sector per (layer, slot) (module docstring)."""
    pair = pair_words(k, v)
    kw, vw = (pair, None) if pair is not None else (_words(k), _words(v))
    n_a, n_b = slots_a.shape[0], slots_b.shape[0]
    if layers.shape[0] == 0:
        return
    if not (k.device.type == "cuda" if kernel is None else kernel):   # CPU: the same verdict with torch ops
        out += _verdict_torch(kw, vw, layers, torch.cat([slots_a.to(torch.int64), slots_b.to(torch.int64)]),
                              exp_words, reserved, err)
        return
    block = BLOCK
    grid = (max(1, triton.cdiv(n_a, block) + triton.cdiv(n_b, block)),)
    vk = kw if pair is not None else vw     # (a paired pool's V words are in its pair words)
    _verdict_kernel[grid](kw, vk, layers, layers.shape[0], slots_a, n_a, slots_b, n_b, exp_words, exp_words.shape[0],
                          reserved, err, out, k.shape[1], kw.stride(0), kw.stride(1), vk.stride(0), vk.stride(1),
                          NW=exp_words.shape[1], BLOCK=block, PAIRED=pair is not None, num_warps=NUM_WARPS)


def _verdict_torch(kw, vw, layers, s, exp_words, reserved, err) -> torch.Tensor:
    """The kernel's count with torch ops; ``vw`` None: ``kw`` is a paired pool's pair words."""
    rows, ref_rows = kw.shape[1], exp_words.shape[0]
    s = s[(s >= 0) & (s < rows)]
    s = s[~reserved[s]]
    beyond = int((s >= ref_rows).sum())
    s = s[s < ref_rows]
    nw = exp_words.shape[1]
    exp = exp_words[s]
    if vw is None:      # K's tail words then V's head words, against the expected words twice
        bad = (kw.index_select(1, s)[layers] != torch.cat([exp, exp], dim=-1)).any(dim=-1).any(dim=0)
        return bad.sum() + beyond + err[layers, 0].sum()
    k = kw.index_select(1, s)[layers][:, :, :nw]
    v = vw.index_select(1, s)[layers][:, :, :nw]
    bad = ((k != exp) | (v != exp)).any(dim=-1).any(dim=0)
    return bad.sum() + beyond + err[layers, 0].sum()
