"""The KV store: write K and V rows of a batch into one layer's buffers at given slots.

Semantics follow the store kernels that serving engines use (SGLang's ``set_kv_buffer`` path, mid-2026):

* the host checks that K, V and the index tensor have the same length and raises
  :class:`KVLengthMismatch` with the kernel's kind of message before anything is written;
* the *skip index* (0 for SGLang's reserved slot, -1 for vLLM's padding) is skipped outright;
  ``skip_index=None`` means no skip, so writes to slot 0 land in the reserved slot (absorbed);
* an index outside ``[0, rows)`` never reaches memory: it is skipped and counted in ``err``
  (``err[0]`` the count, ``err[1]`` the first offending position in the batch), so the device
  context survives and the checker can report ``out_of_range``;
* fp8 pools (uint8 storage) divide K and V by their scales, cast to float8_e4m3fn and store the bytes.

Two implementations share this contract: ``torch`` (index assignment, runs anywhere) and ``triton``
(one launch for K and V; on CPU under ``TRITON_INTERPRET=1``). ``err`` is a device tensor so that
the GPU path never has to synchronise per write; the caller reads it once per step.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from simulator.memory.pool import KVLengthMismatch, check_lengths

__all__ = ["KVLengthMismatch", "NO_POSITION", "STORE_IMPLS", "new_error_buffer", "check_lengths",
           "store_kv_torch", "store_kv_layers_torch"]

#: Sentinel stored in err[1] while no out-of-range index was seen.
NO_POSITION = 2**62

STORE_IMPLS = ("torch", "triton")


def new_error_buffer(device: torch.device | str, layers: int = 1) -> torch.Tensor:
    """An int64 ``[layers, 2]`` buffer of (out-of-range count, first offending position)."""
    err = torch.zeros((layers, 2), dtype=torch.int64, device=device)
    err[:, 1] = NO_POSITION
    return err


def _to_storage(x: torch.Tensor, cache: torch.Tensor, scale: Optional[float]) -> torch.Tensor:
    if cache.dtype == torch.uint8:
        if scale is not None and scale != 1.0:
            x = x / scale
        return x.to(torch.float8_e4m3fn).view(torch.uint8)
    return x if x.dtype == cache.dtype else x.to(cache.dtype)


def store_kv_torch(
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
    """Index assignment, ``cache[loc] = rows``, with the store contract above.

    One min/max reduction decides the common case (every index in range, none to skip) so that it
    costs a single ``index_copy_`` per buffer; only batches with padding or bad indices build masks.
    """
    check_lengths(loc, k, v)
    if loc.shape[0] == 0:
        return
    rows = k_cache.shape[0]
    if loc.dtype != torch.int64:
        loc = loc.to(torch.int64)
    lo, hi = (int(x) for x in torch.aminmax(loc))
    clean = lo >= 0 and hi < rows and (skip_index is None or not (lo <= skip_index <= hi))
    if not clean:
        in_range = (loc >= 0) & (loc < rows)
        keep = in_range if skip_index is None else in_range & (loc != skip_index)
        bad = ~in_range if skip_index is None else ~in_range & (loc != skip_index)
        pos = torch.nonzero(bad).flatten()
        if pos.numel():
            err[0] += pos.numel()
            err[1] = torch.minimum(err[1], pos[0])
        loc, k, v = loc[keep], k[keep], v[keep]
    k_cache.index_copy_(0, loc, _to_storage(k, k_cache, k_scale))
    v_cache.index_copy_(0, loc, _to_storage(v, v_cache, v_scale))


def store_kv_layers_torch(
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
    """:func:`store_kv_torch` into every layer of ``layers`` (int64 indices into ``[L, rows, ...]`` caches) at
    the same ``loc``, lane ``stamp_lane`` of each layer's rows set to its stamp (``k_stamp``/``v_stamp``, one
    per layer): what re-stamping the rows and storing them layer after layer leaves (``k``/``v`` end stamped
    for the last layer, as then), in one ``index_copy_`` per buffer. The padding filter and the out-of-range
    count run once for all layers (each layer's ``err`` row counts its own). Indices written twice keep the
    layer-by-layer path, whose order decides which row lands."""
    check_lengths(loc, k, v)
    n_layers = int(layers.shape[0])
    if n_layers == 0:
        return
    _stamp(k, v, k_stamp[-1], v_stamp[-1], stamp_lane)
    if loc.shape[0] == 0:
        return
    rows = k_cache.shape[1]
    loc = loc if loc.dtype == torch.int64 else loc.to(torch.int64)
    lo, hi = (int(x) for x in torch.aminmax(loc))
    kk, vv = k, v
    if not (lo >= 0 and hi < rows and (skip_index is None or not (lo <= skip_index <= hi))):
        in_range = (loc >= 0) & (loc < rows)
        keep = in_range if skip_index is None else in_range & (loc != skip_index)
        bad = ~in_range if skip_index is None else ~in_range & (loc != skip_index)
        pos = torch.nonzero(bad).flatten()
        if pos.numel():
            err[layers, 0] += pos.numel()
            err[layers, 1] = torch.minimum(err[layers, 1], pos[0])
        loc, kk, vv = loc[keep], k[keep], v[keep]
    n = loc.shape[0]
    if n == 0:
        return
    if n > 1 and torch.unique(loc).shape[0] != n:
        for i in range(n_layers):
            _stamp(kk, vv, k_stamp[i], v_stamp[i], stamp_lane)
            store_kv_torch(k_cache[int(layers[i])], v_cache[int(layers[i])], loc, kk, vv, skip_index=None,
                           err=err[int(layers[i])], k_scale=k_scale, v_scale=v_scale)
        _stamp(k, v, k_stamp[-1], v_stamp[-1], stamp_lane)
        return
    flat = (layers[:, None] * rows + loc[None, :]).reshape(-1)
    ks = _stacked(kk, k_stamp, stamp_lane)
    vs = ks if vv is kk and v_stamp is k_stamp else _stacked(vv, v_stamp, stamp_lane)
    _scatter_rows(k_cache, flat, _to_storage(ks, k_cache, k_scale))
    _scatter_rows(v_cache, flat, _to_storage(vs, v_cache, v_scale))


def _scatter_rows(cache: torch.Tensor, flat: torch.Tensor, src: torch.Tensor) -> None:
    """``cache`` viewed as ``[layers * rows, ...]`` gets ``src``'s rows at ``flat`` (distinct indices). On the
    CPU each row moves as one opaque item of its byte width (numpy), the same bytes ``index_copy_`` would
    write, in less than half its time for narrow rows."""
    dst = cache.view(-1, *cache.shape[2:])
    if cache.device.type != "cpu" or not (dst.is_contiguous() and src.is_contiguous()):
        dst.index_copy_(0, flat, src)
        return
    width = dst[0].numel() * dst.element_size()
    item = np.dtype((np.void, width))
    rows = (x.reshape(x.shape[0], -1).view(torch.uint8).numpy().view(item).reshape(-1) for x in (dst, src))
    d, s = rows
    d[flat.numpy()] = s


def _stamp(k: torch.Tensor, v: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor, lane: int) -> None:
    k.view(k.shape[0], -1)[:, lane] = ks
    if v is not k:
        v.view(v.shape[0], -1)[:, lane] = vs


def _stacked(x: torch.Tensor, stamps: torch.Tensor, lane: int) -> torch.Tensor:
    """``x`` once per layer, ``[L * n, ...]``, each copy's lane ``lane`` set to its layer's stamp."""
    n_layers, n = stamps.shape[0], x.shape[0]
    out = x.unsqueeze(0).expand(n_layers, *x.shape).contiguous()
    out.view(n_layers, n, -1)[:, :, lane] = stamps[:, None].to(x.dtype)
    return out.view(n_layers * n, *x.shape[1:])
