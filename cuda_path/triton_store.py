"""The Triton store kernel: one launch writes the K and V rows of a batch into one layer's pool.

It follows the store contract of :mod:`cuda_path.store` bit for bit, so that the checker can compare
a pool written here with one written by ``store_kv_torch`` using exact equality:

* **Grid.** Program ``p`` owns tokens ``[p*BLOCK_T, (p+1)*BLOCK_T)``. It loads their slots once, then
  walks the full row width in column blocks of ``BLOCK_C`` elements, for K and V together (the K block
  and the V block are both loaded before either is stored, so each thread has two or more 16-byte
  loads in flight). Every tensor is seen as 2-D rows ``[rows, heads*head_dim]``: its base pointer and
  its row stride (the ``[heads, head_dim]`` part of a row must be contiguous); caches are never
  copied. Tokens per program and warps come from :func:`launch_config`.
* **Bad indices never reach memory.** A slot outside ``[0, rows)`` that is not the skip index is
  masked out of the store and recorded in ``err`` (an int64 ``[2]`` row of ``new_error_buffer``):
  ``atomic_add`` of the program's count into ``err[0]`` and ``atomic_min`` of its first bad
  position into ``err[1]``. No device assert, so the CUDA context survives and no host sync is
  needed: the launch is CUDA-graph capturable.
* **Exact conversions in integer arithmetic.** Same-dtype stores (bf16 -> bf16, fp16 -> fp16) move raw
  16-bit words, so any bit pattern (including tags that look like NaNs) survives. Conversions to
  bf16 and to fp8 e4m3fn are written as integer rounding on the float's bits, with torch's rules
  (round to nearest even; for fp8, magnitudes past 448 saturate to +-448 or become NaN, whichever
  the installed torch does: it changed between releases, so it is probed once at import). Doing it
  by hand also makes the result identical under ``TRITON_INTERPRET=1``, whose float casts truncate
  and do not round to even. fp8 stores first divide by the scale with IEEE division and round to the
  input dtype, exactly like ``x / scale`` on a CPU tensor in torch. NaN stays NaN; its payload and
  sign are not part of the contract (torch itself is not consistent about them).

On CPU tensors the kernel runs under Triton's interpreter, which must be chosen before triton is
imported (``TRITON_INTERPRET=1``); that is how CI exercises this same kernel code.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .store import NO_POSITION, check_lengths

# dtype kinds shared by host and kernel (constexpr values)
_BF16, _FP16, _FP32, _FP8 = 0, 1, 2, 3

_SRC_KINDS = {torch.bfloat16: _BF16, torch.float16: _FP16, torch.float32: _FP32}
_DST_KINDS = {torch.bfloat16: _BF16, torch.float16: _FP16, torch.uint8: _FP8}

#: Widest column block, in elements (2 KiB of bf16 per row per block).
MAX_BLOCK_C = 1024
#: Tokens per program once the batch is large enough to fill the device.
LARGE_BLOCK_T = 2
#: 16-byte vectors each thread moves per row block, of K and of V.
VECTORS_PER_THREAD = 2
#: Below this many tokens each program takes one token, for parallelism.
SMALL_BATCH = 8192
#: Most warps per program.
MAX_WARPS = 8


@triton.jit
def _bf16_bits_to_f32(bits):
    """bf16 words (int16) to float32: exact, the word is the high half of the float."""
    return (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _f32_to_bf16_bits(x):
    """float32 to bf16 words (int16), rounding to nearest even on the bits; NaN -> quiet NaN."""
    b = x.to(tl.uint32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    r = tl.where(x != x, 0x7FC0, r)
    return r.to(tl.uint16).to(tl.int16, bitcast=True)


def _torch_fp8_saturates() -> bool:
    """Whether this torch casts out-of-range floats to fp8 e4m3fn as +-448 (newer) or NaN (older)."""
    probe = torch.tensor([1000.0]).to(torch.float8_e4m3fn).view(torch.uint8)
    return int(probe[0]) == 0x7E


#: torch's rule for magnitudes past 448, probed once so that the kernel matches the running torch.
FP8_SATURATES = _torch_fp8_saturates()


@triton.jit
def _f32_to_e4m3_bits(x, SATURATE: tl.constexpr):
    """float32 to float8_e4m3fn bytes (uint8) with torch's rules.

    Round to nearest even; below 2**-6 the result is a subnormal, round_half_even(|x| * 2**9).
    Magnitudes that round above 448 and inf become +-448 when SATURATE (newer torch releases), else
    NaN (0x7f) with the sign; NaN stays NaN (0x7f) with its sign.
    """
    b = x.to(tl.uint32, bitcast=True)
    sign = ((b >> 24) & 0x80).to(tl.int32)
    a = b & 0x7FFFFFFF
    # normal range: keep 3 mantissa bits with round-to-nearest-even, then rebias 127 -> 7
    normal = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20).to(tl.int32) - (120 << 3)
    if SATURATE:
        normal = tl.where(a > 0x7F800000, 0x7F, tl.minimum(normal, 0x7E))
    else:
        normal = tl.minimum(normal, 0x7F)
    # subnormal range: the significand shifted down to units of 2**-9, rounded half to even
    e = (a >> 23).to(tl.int32)
    sig = (a & 0x7FFFFF).to(tl.int32) | tl.where(e > 0, 0x800000, 0)
    shift = tl.minimum(tl.maximum(141 - e, 21), 30)
    q = sig >> shift
    rem = sig & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    up = (rem > half) | ((rem == half) & ((q & 1) == 1))
    sub = q + up.to(tl.int32)
    r = tl.where(a < (121 << 23), sub, normal) | sign
    return r.to(tl.uint8)


@triton.jit
def _to_f32(x, SRC: tl.constexpr):
    if SRC == 0:  # bf16: widen its bits by hand (exact everywhere, the interpreter included)
        return _bf16_bits_to_f32(x.to(tl.int16, bitcast=True))
    else:
        return x.to(tl.float32)


@triton.jit
def _convert(x, scale, SRC: tl.constexpr, DST: tl.constexpr, HAS_SCALE: tl.constexpr,
             SATURATE: tl.constexpr):
    """One tile from the input's dtype to the cache's storage (kinds: 0 bf16, 1 fp16, 2 fp32, 3 fp8)."""
    if SRC == DST:
        return x  # same 16-bit dtype: the words move untouched
    else:
        y = _to_f32(x, SRC)
        if DST == 3:
            if HAS_SCALE:
                # torch: (x / scale) in the input dtype, then the cast
                y = tl.div_rn(y, scale)
                if SRC == 0:
                    y = _bf16_bits_to_f32(_f32_to_bf16_bits(y))
                elif SRC == 1:
                    y = y.to(tl.float16).to(tl.float32)
            return _f32_to_e4m3_bits(y, SATURATE)
        elif DST == 0:
            return _f32_to_bf16_bits(y).to(tl.bfloat16, bitcast=True)
        else:
            return y.to(tl.float16)


@triton.jit
def _slots(loc, err, pid, n, rows, skip, HAS_SKIP: tl.constexpr, NO_POS: tl.constexpr, BLOCK_T: tl.constexpr):
    """Both store kernels' preamble: program ``pid``'s tokens, their slots, and which of them are written
    (in the batch, in ``[0, rows)``, not the skip index); the others that are not the skip index are out of
    range: their count is added to ``err[0]`` and their first position folded into ``err[1]``."""
    tok = pid.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_batch = tok < n
    slot = tl.load(loc + tok, mask=in_batch, other=0).to(tl.int64)
    in_range = (slot >= 0) & (slot < rows)
    if HAS_SKIP:
        keep = slot != skip
    else:
        keep = in_batch
    write = in_batch & in_range & keep
    bad = in_batch & (~in_range) & keep
    n_bad = tl.sum(bad.to(tl.int64), axis=0)
    if n_bad > 0:
        tl.atomic_add(err, n_bad)
        tl.atomic_min(err + 1, tl.min(tl.where(bad, tok, NO_POS), axis=0))
    return tok, slot, write


@triton.jit
def _store_kv_kernel(
    k_cache, v_cache, loc, k, v, err,
    n, rows, skip,
    k_cache_stride, v_cache_stride, k_stride, v_stride,
    k_scale, v_scale,
    K_WIDTH: tl.constexpr, V_WIDTH: tl.constexpr,
    K_SRC: tl.constexpr, K_DST: tl.constexpr, V_SRC: tl.constexpr, V_DST: tl.constexpr,
    K_HAS_SCALE: tl.constexpr, V_HAS_SCALE: tl.constexpr,
    HAS_SKIP: tl.constexpr, NO_POS: tl.constexpr, SATURATE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, N_BLOCKS: tl.constexpr,
):
    pid = tl.program_id(0)
    tok, slot, write = _slots(loc, err, pid, n, rows, skip, HAS_SKIP, NO_POS, BLOCK_T)

    k_src = k + tok[:, None] * k_stride
    v_src = v + tok[:, None] * v_stride
    k_dst = k_cache + slot[:, None] * k_cache_stride
    v_dst = v_cache + slot[:, None] * v_cache_stride
    row_mask = write[:, None]
    for j in tl.static_range(N_BLOCKS):
        cols = j * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
        if (j + 1) * BLOCK_C <= K_WIDTH:
            k_mask = row_mask
        else:
            k_mask = row_mask & (cols < K_WIDTH)
        if (j + 1) * BLOCK_C <= V_WIDTH:
            v_mask = row_mask
        else:
            v_mask = row_mask & (cols < V_WIDTH)
        if j * BLOCK_C < K_WIDTH and j * BLOCK_C < V_WIDTH:
            kx = tl.load(k_src + cols, mask=k_mask)
            vx = tl.load(v_src + cols, mask=v_mask)
            tl.store(k_dst + cols, _convert(kx, k_scale, K_SRC, K_DST, K_HAS_SCALE, SATURATE), mask=k_mask)
            tl.store(v_dst + cols, _convert(vx, v_scale, V_SRC, V_DST, V_HAS_SCALE, SATURATE), mask=v_mask)
        elif j * BLOCK_C < K_WIDTH:
            kx = tl.load(k_src + cols, mask=k_mask)
            tl.store(k_dst + cols, _convert(kx, k_scale, K_SRC, K_DST, K_HAS_SCALE, SATURATE), mask=k_mask)
        else:
            vx = tl.load(v_src + cols, mask=v_mask)
            tl.store(v_dst + cols, _convert(vx, v_scale, V_SRC, V_DST, V_HAS_SCALE, SATURATE), mask=v_mask)


def _is_interpreted() -> bool:
    return not isinstance(_store_kv_kernel, triton.runtime.JITFunction)


def _operand(x: torch.Tensor, cache: torch.Tensor, name: str) -> tuple[int, int, torch.Tensor]:
    """Check one of K/V against its cache; return (source kind, cache kind, rows to read)."""
    src, dst = _SRC_KINDS.get(x.dtype), _DST_KINDS.get(cache.dtype)
    if src is None:
        raise TypeError(f"{name} dtype {x.dtype} not supported (bfloat16, float16, float32)")
    if dst is None:
        raise TypeError(f"{name}_cache dtype {cache.dtype} not supported (bfloat16, float16, uint8 for fp8)")
    if cache.dim() != 3:
        raise ValueError(f"{name}_cache must be [rows, heads, head_dim], got shape {tuple(cache.shape)}")
    if cache.stride(2) != 1 or (cache.shape[1] > 1 and cache.stride(1) != cache.shape[2]):
        raise ValueError(f"{name}_cache rows must be contiguous (strides {tuple(cache.stride())})")
    if x.dim() != 3 or x.shape[1:] != cache.shape[1:]:
        raise ValueError(f"{name} must be [n, {cache.shape[1]}, {cache.shape[2]}] to match its cache, "
                         f"got shape {tuple(x.shape)}")
    if x.stride(2) != 1 or (x.shape[1] > 1 and x.stride(1) != x.shape[2]):
        x = x.contiguous()  # rows must be contiguous; the row stride may be anything
    return src, dst, x


def _scale_arg(scale, dst: int) -> tuple[float, bool]:
    if dst != _FP8 or scale is None:
        return 1.0, False
    s = float(scale)
    return s, s != 1.0


def launch_config(n: int, k_width: int, v_width: int, elem_bytes: int) -> tuple[int, int, int]:
    """(tokens per program, column block, warps) for a batch of ``n`` rows of the given widths.

    One token per program while the batch is small (parallelism), a few once it fills the device
    (fewer, longer programs); the column block spans the row up to ``MAX_BLOCK_C`` elements; warps
    are sized so that each thread moves ``VECTORS_PER_THREAD`` 16-byte vectors per row block of K
    and as many of V (all loaded before any is stored). Chosen with ``bench/store_bandwidth.py --sweep``
    on an H200 (bf16, 8 x 128): 1 token x 2 warps and 2 tokens x 4 warps were the best, within noise
    of each other, at every size from 4,096 tokens up.
    """
    block_t = 1 if n < SMALL_BATCH else LARGE_BLOCK_T
    block_c = min(MAX_BLOCK_C, 1 << (max(k_width, v_width) - 1).bit_length())
    vectors = block_t * block_c * elem_bytes // 16
    num_warps = max(1, min(MAX_WARPS, vectors // (32 * VECTORS_PER_THREAD)))
    return block_t, block_c, num_warps


def store_kv_triton(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    skip_index: Optional[int],
    err: torch.Tensor,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
) -> None:
    """Write ``k``/``v`` rows at ``loc`` into ``k_cache``/``v_cache`` in one launch (see module doc).

    Scales should be Python floats: a tensor scale is read with ``float()``, a host sync that CUDA
    graph capture does not allow.
    """
    check_lengths(loc, k, v)
    n = k.shape[0]
    k_src, k_dst, k = _operand(k, k_cache, "k")
    v_src, v_dst, v = _operand(v, v_cache, "v")
    rows = k_cache.shape[0]
    if v_cache.shape[0] != rows:
        raise ValueError(f"k_cache has {rows} rows but v_cache has {v_cache.shape[0]}")
    if loc.dim() != 1 or (loc.dtype != torch.int64 and loc.dtype != torch.int32):
        raise ValueError(f"loc must be a 1-D int32/int64 tensor, got {loc.dtype} of shape {tuple(loc.shape)}")
    if err.dtype != torch.int64 or err.shape != (2,) or err.stride(0) != 1:
        raise ValueError(f"err must be a contiguous int64 [2] row of new_error_buffer, got "
                         f"{err.dtype} of shape {tuple(err.shape)}")
    device = k_cache.get_device()  # -1 on the CPU
    for name, t in (("v_cache", v_cache), ("loc", loc), ("k", k), ("v", v), ("err", err)):
        if t.get_device() != device:
            raise ValueError(f"{name} is on {t.device} but k_cache is on {k_cache.device}")
    if device < 0 and not _is_interpreted():
        raise RuntimeError(
            "the Triton store needs CUDA tensors, or TRITON_INTERPRET=1 set before triton is imported "
            "to run on CPU tensors"
        )
    if n == 0:
        return
    if loc.stride(0) != 1:
        loc = loc.contiguous()
    k_s, k_has = _scale_arg(k_scale, k_dst)
    v_s, v_has = _scale_arg(v_scale, v_dst)
    # the kernel sees each tensor as 2-D rows [rows, heads*head_dim]: base pointer + row stride
    k_width, v_width = k.shape[1] * k.shape[2], v.shape[1] * v.shape[2]
    block_t, block_c, num_warps = launch_config(n, k_width, v_width, max(k.element_size(), v.element_size()))
    _store_kv_kernel[((n + block_t - 1) // block_t,)](
        k_cache, v_cache, loc, k, v, err,
        n, rows, 0 if skip_index is None else int(skip_index),
        k_cache.stride(0), v_cache.stride(0), k.stride(0), v.stride(0),
        k_s, v_s,
        K_WIDTH=k_width, V_WIDTH=v_width,
        K_SRC=k_src, K_DST=k_dst, V_SRC=v_src, V_DST=v_dst,
        K_HAS_SCALE=k_has, V_HAS_SCALE=v_has,
        HAS_SKIP=skip_index is not None, NO_POS=NO_POSITION, SATURATE=FP8_SATURATES,
        BLOCK_T=block_t, BLOCK_C=block_c, N_BLOCKS=(max(k_width, v_width) + block_c - 1) // block_c,
        num_warps=num_warps,
    )


@triton.jit
def _store_kv_layers_kernel(
    k_cache, v_cache, layers, k_stamp, v_stamp, loc, k, v, err,
    n, rows, skip,
    k_layer_stride, v_layer_stride, k_cache_stride, v_cache_stride, k_stride, v_stride,
    k_scale, v_scale,
    K_WIDTH: tl.constexpr, V_WIDTH: tl.constexpr,
    K_SRC: tl.constexpr, K_DST: tl.constexpr, V_SRC: tl.constexpr, V_DST: tl.constexpr,
    K_HAS_SCALE: tl.constexpr, V_HAS_SCALE: tl.constexpr,
    HAS_SKIP: tl.constexpr, NO_POS: tl.constexpr, SATURATE: tl.constexpr, STAMP_LANE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, N_BLOCKS: tl.constexpr,
):
    """:func:`_store_kv_kernel` for several layers of one sub-pool at once (grid axis 1: the layer).

    Every layer gets the same rows except lane ``STAMP_LANE``, which takes the layer's stamp
    (``k_stamp[i]`` / ``v_stamp[i]``: what ``set_layer_lane`` writes there); layer ``layers[i]``'s
    out-of-range count goes to its own ``err`` row."""
    pid = tl.program_id(0)
    li = tl.program_id(1)
    layer = tl.load(layers + li).to(tl.int64)
    ks = tl.load(k_stamp + li)
    vs = tl.load(v_stamp + li)
    tok, slot, write = _slots(loc, err + layer * 2, pid, n, rows, skip, HAS_SKIP, NO_POS, BLOCK_T)

    k_src = k + tok[:, None] * k_stride
    v_src = v + tok[:, None] * v_stride
    k_dst = k_cache + layer * k_layer_stride + slot[:, None] * k_cache_stride
    v_dst = v_cache + layer * v_layer_stride + slot[:, None] * v_cache_stride
    row_mask = write[:, None]
    for j in tl.static_range(N_BLOCKS):
        cols = j * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
        if (j + 1) * BLOCK_C <= K_WIDTH:
            k_mask = row_mask
        else:
            k_mask = row_mask & (cols < K_WIDTH)
        if (j + 1) * BLOCK_C <= V_WIDTH:
            v_mask = row_mask
        else:
            v_mask = row_mask & (cols < V_WIDTH)
        if j * BLOCK_C < K_WIDTH:
            kx = tl.load(k_src + cols, mask=k_mask)
            if j * BLOCK_C <= STAMP_LANE and STAMP_LANE < (j + 1) * BLOCK_C:
                kx = tl.where(cols == STAMP_LANE, ks, kx)
            tl.store(k_dst + cols, _convert(kx, k_scale, K_SRC, K_DST, K_HAS_SCALE, SATURATE), mask=k_mask)
        if j * BLOCK_C < V_WIDTH:
            vx = tl.load(v_src + cols, mask=v_mask)
            if j * BLOCK_C <= STAMP_LANE and STAMP_LANE < (j + 1) * BLOCK_C:
                vx = tl.where(cols == STAMP_LANE, vs, vx)
            tl.store(v_dst + cols, _convert(vx, v_scale, V_SRC, V_DST, V_HAS_SCALE, SATURATE), mask=v_mask)


def store_kv_layers_triton(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    layers: torch.Tensor,
    k_stamp: torch.Tensor,
    v_stamp: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    skip_index: Optional[int],
    err: torch.Tensor,
    stamp_lane: int,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
) -> None:
    """One launch for the layers ``layers`` (int64 device tensor of layer indices into ``[L, rows, heads,
    dim]`` caches) that all write ``k``/``v`` at ``loc``, lane ``stamp_lane`` of each row replaced by the
    layer's stamp (``k_stamp``/``v_stamp``, in ``k``'s / ``v``'s dtype, one per entry of ``layers``);
    ``err`` is the sub-pool's ``[L, 2]`` error buffer. The same contract per layer as
    :func:`store_kv_triton` (which checks the lengths the same way before anything is written)."""
    check_lengths(loc, k, v)
    n = k.shape[0]
    k_src, k_dst, k = _operand(k, k_cache[0], "k")
    v_src, v_dst, v = _operand(v, v_cache[0], "v")
    if n == 0 or layers.shape[0] == 0:
        return
    if loc.stride(0) != 1:
        loc = loc.contiguous()
    k_s, k_has = _scale_arg(k_scale, k_dst)
    v_s, v_has = _scale_arg(v_scale, v_dst)
    k_width, v_width = k.shape[1] * k.shape[2], v.shape[1] * v.shape[2]
    block_t, block_c, num_warps = launch_config(n, k_width, v_width, max(k.element_size(), v.element_size()))
    grid = ((n + block_t - 1) // block_t, layers.shape[0])
    _store_kv_layers_kernel[grid](
        k_cache, v_cache, layers, k_stamp, v_stamp, loc, k, v, err,
        n, k_cache.shape[1], 0 if skip_index is None else int(skip_index),
        k_cache.stride(0), v_cache.stride(0), k_cache.stride(1), v_cache.stride(1), k.stride(0), v.stride(0),
        k_s, v_s,
        K_WIDTH=k_width, V_WIDTH=v_width,
        K_SRC=k_src, K_DST=k_dst, V_SRC=v_src, V_DST=v_dst,
        K_HAS_SCALE=k_has, V_HAS_SCALE=v_has,
        HAS_SKIP=skip_index is not None, NO_POS=NO_POSITION, SATURATE=FP8_SATURATES, STAMP_LANE=stamp_lane,
        BLOCK_T=block_t, BLOCK_C=block_c, N_BLOCKS=(max(k_width, v_width) + block_c - 1) // block_c,
        num_warps=num_warps,
    )
