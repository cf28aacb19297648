"""Tables a design builds its answers with: host gathers, read ranges, the full layers' prefix."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from simulator.designs.types import ReadIds


def read_ranges(req_to_token: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> ReadIds:
    """Request i's slots ``req_to_token[i, start[i]:end[i]]`` as :class:`ReadIds` (all requests at once, no
    loop: one flat gather)."""
    if req_to_token.device.type == "cpu" and start.device.type == "cpu" and end.device.type == "cpu":
        got = _read_ranges_np(req_to_token, start, end)
        if got is not None:
            return got
    lens = (end - start).clamp(min=0)
    bs, dev = lens.shape[0], lens.device
    indptr = torch.zeros(bs + 1, dtype=torch.int64, device=dev)
    torch.cumsum(lens, 0, out=indptr[1:])
    total = int(indptr[-1])
    # entry j of request r is req_to_token[r, start[r] + j - indptr[r]]: one flat gather
    width = req_to_token.shape[1]
    offset = torch.arange(bs, device=dev) * width + start - indptr[:-1]
    flat = torch.arange(total, device=dev) + torch.repeat_interleave(offset, lens, output_size=total)
    return ReadIds(indptr, req_to_token.reshape(-1)[flat], start)


def _read_ranges_np(req_to_token: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> Optional[ReadIds]:
    """:func:`read_ranges` on CPU tensors, in numpy (the same values and dtypes; numpy's repeat and take are
    several times faster than torch's on the CPU). None where an entry would fall outside the table (the
    torch path raises its own error there)."""
    st = start.numpy()
    lens = np.maximum(end.numpy() - st, 0)
    bs = lens.shape[0]
    width = req_to_token.shape[1]
    nz = lens > 0
    if nz.any():
        lo = (np.arange(bs, dtype=np.int64) * width + st)[nz]
        if int(lo.min()) < 0 or int((lo + lens[nz]).max()) > bs * width:
            return None
    indptr = np.zeros(bs + 1, dtype=np.int64)
    np.cumsum(lens, out=indptr[1:])
    total = int(indptr[-1])
    offset = np.arange(bs, dtype=np.int64) * width + st - indptr[:-1]
    flat = np.repeat(offset, lens) + np.arange(total, dtype=np.int64)
    table = req_to_token.contiguous().numpy().reshape(-1)
    return ReadIds(torch.from_numpy(indptr), torch.from_numpy(table.take(flat)), start)


_PREFIX_CACHE: list = [None]     # (req_to_token, seq_lens, ReadIds) of the last call


def prefix_reads(req_to_token: torch.Tensor, seq_lens: torch.Tensor) -> ReadIds:
    """Every request's whole prefix, ``req_to_token[i, :seq_len[i]]`` (what full layers read). The same
    input tensors (the same objects: a step's backends get the same ones, and hooks do not mutate them)
    give the same table object, so the backends of a step share it and its read check."""
    last = _PREFIX_CACHE[0]
    if last is not None and last[0] is req_to_token and last[1] is seq_lens:
        return last[2]
    ids = read_ranges(req_to_token, torch.zeros_like(seq_lens), seq_lens)
    _PREFIX_CACHE[0] = (req_to_token, seq_lens, ids)
    return ids


def from_position_zero(ids: ReadIds, req_to_token: torch.Tensor, full_to_swa: torch.Tensor) -> ReadIds:
    """An SWA read table of ``ids``' positions whose slots are gathered from position 0 instead (the table a
    backend builds when it drops its window start, sglang#39287): the kernel reads each request's window
    positions at the SWA slots of the request's first positions."""
    lens = ids.indptr[1:] - ids.indptr[:-1]
    zero = torch.zeros_like(ids.start)
    full = read_ranges(req_to_token, zero, zero + lens)
    return ReadIds(ids.indptr, gather(full_to_swa, full.indices.to(torch.int64)), ids.start)


def gather(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` for a 1-D table and integer index: on host tensors through numpy (a few us instead of
    torch's indexing, tens of us per call), the same values and dtype; an index out of range raises torch's own
    error (the text a design's failure reports), as ``table[index]`` does."""
    if table.device.type == "cpu" and index.device.type == "cpu" and table.dim() == 1 and index.dim() == 1 \
            and index.dtype in (torch.int32, torch.int64):
        try:
            return torch.from_numpy(table.numpy()[index.numpy()])
        except (IndexError, TypeError, RuntimeError):
            pass
    return table[index]
