"""The tree cache seam: what the radix scheduler and the PD decode node ask of a prefix cache.

The model's source is :class:`~simulator.scheduling.prefix_cache.PrefixCache` (SGLang 0.5.23's
``UnifiedRadixCache`` as slots, with its bug switches); a release's ``UnifiedRadixCache`` driven through its
own ``Req`` objects is the other source the engine's scheduler brings. Every change of slot ownership comes
out as :class:`~simulator.memory.events.SlotEvent` values (``drain_events``), in order: the oracle learns owners
from them, never from the tree's internals.
"""
from __future__ import annotations

from typing import Optional, Protocol, runtime_checkable

import numpy as np

from simulator.memory.events import Owner, SlotEvent


@runtime_checkable
class TreeCache(Protocol):
    """A prefix cache with FULL and SWA components between the scheduler and the allocator."""

    #: the tree's nodes by id (their ``full`` / ``swa`` slot values: what the tree holds)
    nodes: dict

    def drain_events(self) -> list[SlotEvent]:
        """Every ownership change since the last call, in order."""

    def admit(self, req, limit: Optional[int] = None):
        """Match a request's prompt (up to ``limit`` tokens), take the matched slots into its row, lock them."""

    def cache_unfinished(self, req, length: Optional[int] = None):
        """Insert a chunked request's KV so far (its checkpoint)."""

    def cache_finished(self, req, kv_len: Optional[int] = None) -> None:
        """Insert a finished request's KV and release it."""

    def release(self, req) -> None:
        """Release a request without inserting (retraction; an admission undone)."""

    def free_out_of_window(self, req, end: int) -> int:
        """Free a request's SWA slots below ``end`` (its own, not the tree's); returns how many."""

    def evict(self, full_tokens: int = 0, swa_tokens: int = 0) -> tuple[int, int]:
        """Evict unlocked leaves, then SWA tombstones, until the pools have room; returns what was freed."""

    def free(self, full: np.ndarray, owner: Optional[Owner], cause: str) -> None:
        """The token-level free (SWA through the mapping, then the full pages): a decode node's finish."""

    def extend_swa_tail(self, req, n: int, tail: int) -> np.ndarray:
        """A decode node's pre-allocation: full slots for ``n`` tokens, SWA slots for the last ``tail``."""
