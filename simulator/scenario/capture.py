"""Capture sizes of CUDA graphs: which padded size a batch runs at.

A decode CUDA graph is captured per batch size; a batch of b requests replays the smallest captured
size >= b. Piecewise CUDA graphs serve EXTEND and MIXED batches by token count the same way. What
the padded rows then hold is a padding convention (:mod:`simulator.engine_model.padding_convention`).
"""
from __future__ import annotations

import bisect
from typing import Optional, Sequence


def default_decode_capture_sizes(max_bs: int = 256) -> tuple[int, ...]:
    """1, 2, 4, 8, 12, then 16..256 step 8, 272..511 step 16, 512.. step 32, up to max_bs."""
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, 4097, 32))
    return tuple(s for s in sizes if s <= max_bs) or (max_bs,)


def speculative_decode_capture_sizes(max_bs: int = 256) -> tuple[int, ...]:
    """With speculative decoding: 1..8, 10..32 step 2, 40..64 step 4, 72..256 step 8, 272.. step 16."""
    sizes = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4)) + list(range(72, 257, 8))
             + list(range(272, 4097, 16)))
    return tuple(s for s in sizes if s <= max_bs) or (max_bs,)


def default_piecewise_capture_sizes(max_tokens: int = 4096) -> tuple[int, ...]:
    """4..32 step 4, 48..256 step 16, 288..512 step 32, 576..1024 step 64, 1280..4096 step 256, then step 512."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, 65537, 512)))
    return tuple(s for s in sizes if s <= max_tokens) or (max_tokens,)


def smallest_capture(sizes: Sequence[int], n: int) -> Optional[int]:
    """The smallest captured size >= n, or None when n exceeds the largest (the batch runs eagerly)."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None
