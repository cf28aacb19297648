"""The allocator seams: what the scheduler, the tree cache and the run ask of an allocator, whoever wrote it.

Two sources serve each: the model's (:class:`~simulator.memory.allocator.HybridAllocator`,
:class:`~simulator.memory.unified_pool.UnifiedPool`) and a release's (engine_path's ``EngineAllocator``
over SGLang's ``SWATokenToKVPoolAllocator``, ``UnifiedEngineAllocator`` over its unified allocator).
``slotscope conform`` drives both through one scenario and compares them at this boundary. Every source
names itself in ``source`` (run.json's ``sources.allocator``).
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

import numpy as np

from simulator.memory.allocator import RequestSlots


@runtime_checkable
class SlotAllocator(Protocol):
    """The static hybrid pool: full and SWA sub-pools, ``full_to_swa`` (int64: 0 = no SWA slot, -1 sentinel)."""

    #: whose code this is: "model", or the release ("sglang 0.5.23")
    source: str
    full_size: int
    swa_size: int
    page_size: int
    #: the live mapping, indexed by full slot (the array the backends' translation reads on the CPU)
    full_to_swa: np.ndarray

    @property
    def full_rows(self) -> int: ...
    @property
    def swa_rows(self) -> int: ...
    @property
    def full_used(self) -> int: ...
    @property
    def swa_used(self) -> int: ...
    @property
    def full_free(self) -> int: ...
    @property
    def swa_free(self) -> int: ...

    def pages_needed(self, slots: RequestSlots, n: int) -> int:
        """Pages an ``extend`` of ``n`` tokens takes (the capacity check's unit)."""

    def extend(self, slots: RequestSlots, n: int) -> np.ndarray:
        """``n`` more tokens for a request: both pools, the mapping set; returns the new full slots."""

    def evict_swa(self, slots: RequestSlots, end: int) -> int:
        """SWA slots of positions below ``end`` freed (the full ones kept); returns how many."""

    def truncate(self, slots: RequestSlots, length: int) -> int:
        """A request cut back to ``length`` tokens (rejected speculative slots); returns the slots freed."""

    def free(self, slots: RequestSlots) -> None:
        """A request's slots back to the free lists (both pools), its mapping cleared."""

    def free_group(self, enabled: bool = True) -> AbstractContextManager:
        """Frees inside are held and released at its end (SGLang's grouped frees)."""

    def set_mapping(self, full: np.ndarray, swa: np.ndarray) -> None: ...

    def clear_mapping(self, full: np.ndarray) -> None: ...

    def free_pages(self) -> tuple[np.ndarray, np.ndarray]:
        """The free (full, SWA) pages, in hand-out order."""


@runtime_checkable
class UnifiedAllocator(SlotAllocator, Protocol):
    """The unified pool (``pool.unified``): virtual ids handed out, physical ids per sub-pool behind page tables."""

    def drain_events(self) -> list:
        """Its ownership events since the last call (bind, unbind, tombstone, move: memory.unified_pool's kinds)."""

    def translate_kv_loc(self, loc: np.ndarray, kind: str) -> np.ndarray:
        """Virtual ids to one sub-pool's physical ids (unmapped, negative or out-of-range ones to the sink)."""

    def physical_full_to_swa(self) -> np.ndarray:
        """The SWA translation per physical full slot (what a design's ``translate`` reads)."""

    def set_inflight_forward(self, virtual_loc) -> None:
        """Pin the write window of the forward in flight (compaction stops at it); None unpins."""

    def flush_opportunistic(self) -> int:
        """The scheduler boundary's lazy compaction; returns the pages moved."""
