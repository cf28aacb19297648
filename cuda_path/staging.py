"""A step's host arrays on the device: one staged copy from pinned memory, without a host synchronisation, and the copies they feed."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch


def h2d(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on the device without a host synchronisation (a pinned staging copy, then async)."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


#: numpy dtypes -> torch dtypes (the staged arrays' own, viewed on the device)
_TORCH_DTYPES: dict = {}


def _torch_dtype(dt: np.dtype) -> torch.dtype:
    got = _TORCH_DTYPES.get(dt)
    if got is None:
        got = _TORCH_DTYPES[dt] = torch.from_numpy(np.zeros(1, dtype=dt)).dtype
    return got


def stage_layout(arrays) -> tuple[list[np.ndarray], list[int], int]:
    """The arrays C-contiguous, each one's byte offset in one buffer (8-byte aligned: any dtype's view of
    its slice is valid) and the buffer's length in bytes."""
    arrays = [np.ascontiguousarray(a) for a in arrays]
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += _padded(a)
    return arrays, offsets, total


def _padded(a: np.ndarray) -> int:
    """An array's bytes in a staging buffer: its own, padded to whole 8-byte words."""
    return -(-a.nbytes // 8) * 8


def stage_pack(host: np.ndarray, arrays, offsets) -> None:
    """Each array's bytes into the uint8 buffer ``host`` at its offset."""
    for a, o in zip(arrays, offsets):
        if a.nbytes:
            host[o:o + a.nbytes] = a.reshape(-1).view(np.uint8)


def stage_views(buf: torch.Tensor, arrays, offsets) -> list[torch.Tensor]:
    """Each array as a view of its slice of the uint8 tensor ``buf``, in its own dtype and shape (no copy):
    the buffer's 8-byte words split at the arrays' offsets in one op, each part viewed in its array's dtype
    only where that is not int64 (most of a step's arrays are) and shaped only where it is not 1-D."""
    if not arrays:
        return []
    words = buf[:offsets[-1] + _padded(arrays[-1])].view(torch.int64)
    sizes = [(b - a) // 8 for a, b in zip(offsets, offsets[1:])]
    sizes.append(words.shape[0] - sum(sizes))
    out = list(words.split_with_sizes(sizes))
    for i, a in enumerate(arrays):
        if a.dtype != np.int64:
            out[i] = out[i].view(_torch_dtype(a.dtype))[:a.size]
        if a.ndim != 1:
            out[i] = out[i].view(a.shape)
    return out


class Staging:
    """A step's host arrays on the device in one copy from pinned memory, without a host synchronisation.
    Four pinned byte buffers in turn (a step makes one copy); a buffer is filled again only once its last
    copy has completed. Almost every step ends with a read that waits for its copy (:meth:`synced`); only
    after one that did not (its writes all failed) is an event recorded, at the next copy, and waited on
    before the buffer is filled again (an event costs about 10 us of host time on the H200's host)."""

    RING = 4

    def __init__(self) -> None:
        self._bufs: list[Optional[tuple]] = [None] * self.RING     # (pinned uint8 tensor, its numpy view)
        self._events: list = [None] * self.RING                    # None: no copy of the buffer is in flight
        self._i = 0
        self._pending: Optional[int] = None                         # the buffer whose copy nothing waited for

    def put(self, arrays, dev: torch.device) -> list[torch.Tensor]:
        """The host arrays on ``dev``, each in its own dtype and shape: on CUDA their bytes in one pinned
        buffer (:func:`stage_layout`) and one copy, each result a view of its slice (no cast on the device)."""
        if dev.type != "cuda":
            return [h2d(a, dev) for a in arrays]
        if self._pending is not None:        # (the last copy: no read waited for it, so an event marks it)
            ev = self._events[self._pending] = torch.cuda.Event()
            ev.record()
        arrays, offsets, total = stage_layout(arrays)
        self._i = i = (self._i + 1) % self.RING
        ev = self._events[i]
        if ev is not None:
            if not ev.query():
                ev.synchronize()
            self._events[i] = None
        got = self._bufs[i]
        if got is None or got[0].shape[0] < total:
            buf = torch.empty(max(total, 1 << 19) * 2, dtype=torch.uint8).pin_memory()
            got = self._bufs[i] = (buf, buf.numpy())
        stage_pack(got[1], arrays, offsets)
        d = got[0][:total].to(dev, non_blocking=True)
        self._pending = i
        return stage_views(d, arrays, offsets)

    def synced(self) -> None:
        """A host synchronisation with the device's stream has completed since the last copy: it is done."""
        self._pending = None


def copy_all(copies: list[tuple]) -> None:
    """Each (destination, source) pair's ``dst.copy_(src)``: those of one dtype in one ``_foreach_copy_`` (on
    CUDA one launch for all where the pairs allow it), a lone pair as it is. The destinations are distinct."""
    by_dtype: dict = {}
    for dst, src in copies:
        by_dtype.setdefault((dst.dtype, src.dtype), []).append((dst, src))
    for pairs in by_dtype.values():
        if len(pairs) == 1:
            pairs[0][0].copy_(pairs[0][1])
        else:       # (torch's multi-tensor copy: in every torch pyproject.toml allows)
            torch._foreach_copy_([d for d, _ in pairs], [s for _, s in pairs])


def put_rows(dst: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> None:
    """``dst[index] = src`` along dim 0: ``index_copy_`` where the dtypes allow it (one op; indexed assignment
    goes through several on the host), else the indexed assignment. Rows listed twice hold equal values here
    (a step's slots are distinct; a mapping change repeats the allocator's one value), so either is the same."""
    if index.dtype == torch.int64 and src.dtype == dst.dtype:
        dst.index_copy_(0, index, src)
    else:
        dst[index] = src
