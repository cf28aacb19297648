"""The oracle's expected tag-lane words made on the host (kvrows.tag_lanes' bits per nibble), so a step's mirror update is a staged copy, not device work."""
from __future__ import annotations

import sys
from typing import Optional

import numpy as np
import torch

from simulator.oracle.kvrows import tag_lanes
from simulator.records import PAD_TAG

#: storage dtype -> (per lane the stored bits of the 16 nibble values (tag_lanes' own), the byte table of
#: :func:`_byte_table` or None), or None: not reproduced nibble-wise
_NIBBLE_BITS: dict = {}


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _nibble_bits(storage: torch.dtype) -> Optional[tuple]:
    """[lanes, 16] of :func:`simulator.oracle.kvrows.tag_lanes`' bits: the lanes of the tags whose code (tag + 2)
    holds nibble j in every lane, as integers of the storage's size (and :func:`_byte_table`). Checked once
    against ``tag_lanes`` on tags incl. 0, PAD_TAG and large ones; None where it does not reproduce them
    (then the host asks ``tag_lanes`` itself)."""
    if storage in _NIBBLE_BITS:
        return _NIBBLE_BITS[storage]
    codes = torch.arange(16, dtype=torch.int64) * 0x11111111
    lanes = tag_lanes(codes - 2, storage).contiguous()
    bits = lanes.view(_INT_OF_SIZE[lanes.element_size()]).numpy().T.copy()
    _NIBBLE_BITS[storage] = got = (bits, _byte_table(bits))
    probe = np.concatenate([np.arange(-2, 70, dtype=np.int64), np.array([PAD_TAG, 2**31, 2**32 - 3, 2**40 + 5]),
                            np.random.default_rng(0).integers(-3, 2**34, 2000)])
    want = tag_lanes(torch.from_numpy(probe), storage).contiguous().view(torch.int64).numpy()
    if not np.array_equal(host_tag_words(probe, storage), want):
        _NIBBLE_BITS[storage] = got = None
    return got


def _byte_table(bits: np.ndarray) -> Optional[np.ndarray]:
    """Where every lane stores a nibble alike (an even number of lanes, a little-endian host): per byte of
    the code the two lanes it holds (low nibble: the lower lane, first in memory), as one integer of twice
    the storage's size; else None."""
    lanes, size = bits.shape[0], bits.dtype.itemsize
    if lanes % 2 or size > 4 or sys.byteorder != "little" or not (bits == bits[0]).all():
        return None
    one = bits[0].astype(np.int64) & ((1 << 8 * size) - 1)
    b = np.arange(256)
    return (one[b & 15] | one[b >> 4] << 8 * size).astype(np.dtype(f"<u{2 * size}"))


def host_tag_words(tags: np.ndarray, storage: torch.dtype) -> np.ndarray:
    """``tag_lanes(tags, storage).view(int64)`` made on the host (int64 ``[n, words]``; tag 0: zero words):
    the nibble values' stored bits (:func:`_nibble_bits`) looked up per byte of the code (or per lane)."""
    got = _nibble_bits(storage)
    if got is None:
        return tag_lanes(torch.from_numpy(np.asarray(tags, dtype=np.int64)), storage).contiguous().view(
            torch.int64).numpy()
    bits, pairs = got
    lanes = bits.shape[0]
    code = tags.astype(np.int64) + 2
    if pairs is not None:       # the code's low lanes / 2 bytes, each two lanes' bits
        vals = pairs.take(code.view(np.uint8).reshape(-1, 8)[:, :lanes // 2])
    else:
        vals = bits[np.arange(lanes), (code[:, None] >> (np.arange(lanes, dtype=np.int64) * 4)) & 0xF]
    vals[tags == 0] = 0
    return vals.view(np.int64)
