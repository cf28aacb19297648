"""The pool under test, as the simulator sees it: a small protocol that cuda_path implements.

The run loop writes through :class:`PoolWriter` and the checker reads tags back through it. Keeping
the protocol here keeps the dependency one-way (cuda_path imports the simulator, never the reverse).
"""
from __future__ import annotations

from typing import Protocol

import torch


class KVLengthMismatch(ValueError):
    """Raised by a store before launch when K, V and the index tensor disagree in length."""


def check_lengths(loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """The host-side check of the real store kernel, with its kind of message (every store runs it first)."""
    n = k.shape[0]
    if v.shape[0] != n:
        raise KVLengthMismatch(f"Size mismatch: expected value rows {n} but got {v.shape[0]}")
    if loc.shape[0] != n:
        raise KVLengthMismatch(
            f"Size mismatch: expected out_loc of length {n} (rows of key) but got {loc.shape[0]}"
        )


class PoolWriter(Protocol):
    device: torch.device
    skip_index: int | None          # the index the store skips (0, -1) or None (absorbs slot 0)

    def rows(self, kind: str) -> int:
        """Rows of each K/V buffer of a sub-pool ("full" | "swa")."""

    def make_rows(self, tags: torch.Tensor, layer: int, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V rows carrying ``tags`` for a layer of this kind, in the model's dtype and geometry."""

    def restamp(self, k: torch.Tensor, v: torch.Tensor, layer: int) -> None:
        """Re-stamp rows from :meth:`make_rows` for another layer of the same kind."""

    def store(self, kind: str, index: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write rows at ``loc`` in layer ``index`` of sub-pool ``kind``; raises KVLengthMismatch."""

    def mismatches(self, kind: str, slots: torch.Tensor, expected: torch.Tensor,
                   layers: list[int] | None = None) -> torch.Tensor:
        """``[layers, len(slots)]`` bool, True where the K or V row at a slot does not carry the expected
        tag (0 expects a zeroed row). The fast path of the checker: no decoding, no host transfer."""

    def read_tags(self, kind: str, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tags ``[layers_of_kind, len(slots)]`` read back from the K and the V buffers."""

    def take_out_of_range(self, kind: str) -> torch.Tensor:
        """Per layer of this kind, (count, first position) of skipped out-of-range indices since the
        last call, as an int64 ``[layers, 2]`` host tensor; resets the counters."""
