"""The unified pool: SGLang 0.5.23's unified memory model (``--enable-unified-memory``) as slots.

A reference model written from the 0.5.23 source (read, not copied): ``mem_cache/unified_memory_pool.py``
(``UnifiedKVPool``: one byte buffer, the reserved sink floor), ``mem_cache/allocator/unified_sub_pool.py``
(``MultiEndedAllocator``: two sub-pools growing from the two ends of the buffer, hole hand-out, watermarks,
lazy compaction) and ``mem_cache/allocator/unified_hybrid_swa.py`` (the composite that mints virtual pages
on the FULL side and binds them on both, its capacity checks); ``kv_loc_plan.py`` / ``kv_index_translator.py``
for the write door. docs/SHARING.md ("The unified pool") describes the model and what is left out.

* **One byte buffer, two ends.** Both sub-pools index their physical pages from byte 0 of one buffer of
  ``budget_bytes`` (page ``p`` of a side at ``[p * page_bytes, (p + 1) * page_bytes)``); the SWA side grows
  **up** from its first allocatable page, the FULL side grows **down** from its top page
  (``num_pages - 1``). Each side has ``num_pages = (budget // token_bytes) // page_size`` pages.
* **The reserved sink floor.** The bottom ``page_size * max(token bytes)`` bytes are the slot-0 padding
  sink of both sides: a side's first allocatable page is ``min_page = ceil(ceil(floor / token_bytes) /
  page_size)`` (the release's ``min_slot_index`` / ``min_page_index``), so the side with the cheaper entries
  starts several pages up (u1: the full side's first virtual id is 5).
* **Watermarks.** SWA: pages ``[min_page, wm)`` are its span; FULL: ``(wm, num_pages)``. The free byte gap
  between the two frontiers is what both grow into. A side's span holds its live pages and its *holes*
  (freed pages, the lazy free list, in the order they were freed or last sorted).
* **Hand-out** (``_alloc_bind_fast_or_slow`` / ``take_physical``): no holes: extend the watermark by N and
  bind the N pages in ascending order; holes: extend the watermark for what the holes lack, then take the
  holes nearest the side's own end (SWA: the lowest, FULL: the highest; all of them, in list order, when
  they are all needed), then the new pages (SWA ascending, FULL descending from the old watermark).
* **Virtual ids** are the FULL side's page ids ``min_page .. num_pages - 1``, a FIFO (minted at the head,
  freed ids joining the tail in free order; page size > 1: each free's pages ascending). The scheduler sees
  virtual token ids ``v * ps + o``.
* **Capacity** (``ensure_capacity``): an allocation that does not fit the current gap and holes, but would
  fit the compacted pool, first runs an *urgent* flush of each side (full first): every interior hole is
  filled by the survivor farthest from the side's end, and the watermark retreats past all of them; the
  in-flight window is not waited for (no forward-done event is set in the loop, so the release moves it too).
* **Lazy compaction** (``flush_opportunistic``, at each scheduler boundary, full then SWA): holes next to the
  watermark are absorbed (the watermark retreats), then survivors farthest from the end move into the holes
  nearest the end, until the first survivor of the in-flight forward's write window (the walk stops there),
  or the survivor and the hole cross. The vacated pages join the holes.
* **Frees** (``free``): the SWA side frees the pages still bound there (a tombstone ``-1`` or the sink is
  skipped), then the FULL side frees all of them and recycles the virtual ids; ``evict_swa`` tombstones the
  SWA side of whole pages. A free group defers every free to its end, as one free of their concatenation.
* **Translation** (:meth:`UnifiedPool.translate_kv_loc`): ``max(v2p[t // ps] * ps + t % ps, 0)``; a negative
  id, or a page past the table, goes to 0, the sink.
* **The write door** (:meth:`UnifiedPool.write_loc`, :func:`check_physical_write_loc`): a backend writes
  only at a :class:`PhysicalLoc`; a bare array is an :class:`UnmarkedWriteLoc` error.
* Every bind, move and free is a :class:`~simulator.memory.events.SlotEvent` in :attr:`UnifiedPool.events`
  (slots: physical token ids of that pool; ``peers``: the virtual ids for BIND / UNBIND, the destination
  physical ids for MOVE), so an oracle can follow who owns each physical slot.
* :class:`UnifiedBehaviour` holds the U1 and U2 switches (0.5.23 defaults: both fixed).

Left out: the release's pending-reuse queue (a moved page waits for a forward-done event before reuse; the
loop sets none, as engine_path's adapter sets none, so every vacated page is a hole at once), the move gates
(PD, HiCache), float middle pools (the tri-pool) and decode context parallelism.

The allocator API is :class:`~simulator.memory.allocator.HybridAllocator`'s (``extend``, ``evict_swa``,
``truncate``, ``free``, ``free_group``, counts, a ``full_to_swa`` view), so the pool can be swapped in; the
ids it hands out are virtual. ``pool.unified = true`` runs it in the loop through
:class:`simulator.plugins.unified.UnifiedPlan` (which also drives engine_path's adapter of the release's own
unified allocator through the same interface: ``translate_kv_loc``, ``physical_full_to_swa``,
``set_inflight_forward``, ``flush_opportunistic``, ``drain_events``).

Here: the composite (minting, binding on both sides, capacity, frees, the in-flight window) with the
allocator API. One end of the buffer and the virtual id FIFO are :mod:`simulator.memory.unified_pages`;
translation and the write door :mod:`simulator.memory.unified_translation`; the invariants the tests check
:mod:`simulator.memory.unified_invariants`.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import numpy as np

from simulator.memory.allocator import OutOfSlots, RequestSlots
from simulator.memory.events import SlotEvent
from simulator.memory.unified_invariants import check_unified_invariants
from simulator.memory.unified_pages import BufferEnd, VirtualPageIds
from simulator.memory.unified_translation import (IndexOutOfRange, OutOfRange, PhysicalLoc, UnmarkedWriteLoc,
                                                  VirtualToPhysical, check_physical_write_loc)
from simulator.engine_model.unified import UNIFIED_0_5_23, UnifiedBehaviour

__all__ = ["UnifiedBehaviour", "UNIFIED_0_5_23", "UnifiedPool", "PhysicalLoc", "OutOfRange", "IndexOutOfRange",
           "UnmarkedWriteLoc", "check_physical_write_loc", "BIND", "MOVE", "UNBIND", "TOMBSTONE"]

#: event kinds of the unified pool (AVAILABLE is the prefix cache's: pages back in a free list)
BIND = "bind"            # physical ``slots`` of ``pool`` now hold virtual ``peers``
MOVE = "move"            # compaction: the content of physical ``slots`` moved to physical ``peers``
UNBIND = "unbind"        # physical ``slots`` given up by virtual ``peers`` (a free, a truncation)
TOMBSTONE = "tombstone"  # SWA side: virtual ``peers`` left the window; their physical ``slots`` are given up

#: the release's entry alignment (``layout/token_major.py``: one slot's bytes over all its layers, rounded up)
ENTRY_ALIGN_BYTES = 32


# --------------------------------------------------------------------------- the pool

class UnifiedPool(VirtualToPhysical):
    """A unified hybrid SWA pool with :class:`~simulator.memory.allocator.HybridAllocator`'s API; ids are virtual.

    ``full_page_bytes`` / ``swa_page_bytes``: the bytes of one page of each side (all its layers' K and V,
    ``page_size`` entries); with ``budget_bytes`` they decide each side's pages and its sink floor.
    """

    #: whose code this is (run.json's ``sources.allocator``)
    source = "model"

    def __init__(self, budget_bytes: int, full_page_bytes: int, swa_page_bytes: int, page_size: int = 1,
                 behaviour: UnifiedBehaviour = UNIFIED_0_5_23):
        if min(budget_bytes, full_page_bytes, swa_page_bytes, page_size) <= 0:
            raise ValueError("budget, page costs and page size must be positive")
        if full_page_bytes % page_size or swa_page_bytes % page_size:
            raise ValueError("a page's bytes must be page_size entries")
        self.budget_bytes, self.page_size, self.behaviour = budget_bytes, page_size, behaviour
        floor = max(full_page_bytes, swa_page_bytes)              # the slot-0 sink of both sides
        fb, sb = full_page_bytes // page_size, swa_page_bytes // page_size
        full_pages = (budget_bytes // fb) // page_size
        #: virtual page ids min_page .. num_virtual_ids - 1, minted by the FULL side (0: the sink)
        self.num_virtual_ids = full_pages
        swa_pages = (budget_bytes // sb) // page_size
        swa_table = swa_pages + 1 if behaviour.swa_table_own_size else full_pages + 1
        self.full = BufferEnd("full", "down", fb, page_size, budget_bytes, floor, full_pages + 1)
        self.swa = BufferEnd("swa", "up", sb, page_size, budget_bytes, floor, swa_table)
        self._virtual = VirtualPageIds(self.full.min_page, full_pages)
        self._inflight: Optional[np.ndarray] = None     # the in-flight forward's virtual write window
        self.events: list[SlotEvent] = []
        self.findings: list[OutOfRange] = []            # out_of_range records (bind, translate, write door)
        self.record_events = True
        self._group: Optional[list[np.ndarray]] = None
        self.group_end_hooks: list = []
        self.moves = 0
        self.urgent_flushes = 0                         # passes of the urgent (allocation-time) compaction
        self._empty_gap = self._gap()
        self._cap_full = min(self._empty_gap // self.full.page_bytes, self.full.index_room()) * page_size
        self._cap_swa = min(min(self._empty_gap // self.swa.page_bytes, self.swa.index_room()) * page_size,
                            self._virtual.free_count() * page_size)
        #: the scheduler's limits (full, SWA tokens): the static split the budget was made from, when known
        #: (from_pool_config); else each side's capacity on the empty pool
        self.split: Optional[tuple[int, int]] = None

    @classmethod
    def from_pool_config(cls, cfg, full_bytes_per_token: int, swa_bytes_per_token: int,
                         behaviour: UnifiedBehaviour = UNIFIED_0_5_23) -> "UnifiedPool":
        """The static pool's memory (``full_size`` full tokens and ``swa_size`` SWA tokens plus each side's
        sink page) as one budget; per-page costs from the per-token bytes (all layers of the kind)."""
        p = cfg.page_size
        budget = (cfg.full_size + p) * full_bytes_per_token + (cfg.swa_size + p) * swa_bytes_per_token
        pool = cls(budget, full_bytes_per_token * p, swa_bytes_per_token * p, p, behaviour)
        pool.split = (cfg.full_size, cfg.swa_size)
        return pool

    #: the virtual ids are minted FIFO (0.5.23); physical pages as the release hands them out
    free_order = "fifo"

    def set_free_order(self, order: str) -> None:
        """The scheduler's knob: the unified pool's orders are its own (virtual ids FIFO, physical pages
        the release's); a valid order is accepted and not applied."""
        if order not in ("lifo", "fifo", "head"):
            raise ValueError(f"free order must be 'lifo', 'fifo' or 'head', got {order!r}")

    # ---- events

    def _emit(self, kind: str, side: BufferEnd, phys_pages, virt_pages, cause: str, to_pages=None) -> None:
        if not self.record_events or len(phys_pages) == 0:
            return
        p = self.page_size
        offs = np.arange(p, dtype=np.int64)

        def tok(pages):
            return (np.asarray(pages, dtype=np.int64)[:, None] * p + offs).ravel()
        peers = tok(to_pages) if to_pages is not None else tok(virt_pages)
        self.events.append(SlotEvent(kind, side.name, tok(phys_pages), None, peers, cause))

    def drain_events(self) -> list[SlotEvent]:
        out, self.events = self.events, []
        return out

    # ---- sizes and counts (HybridAllocator's, in tokens)

    @property
    def full_size(self) -> int:
        """What the scheduler may reserve full-side: the static split's full tokens, else the empty pool's."""
        return self.split[0] if self.split is not None else self._cap_full

    @property
    def swa_size(self) -> int:
        return self.split[1] if self.split is not None else self._cap_swa

    @property
    def full_rows(self) -> int:
        return self.full.max_slots

    @property
    def swa_rows(self) -> int:
        return self.swa.max_slots

    @property
    def full_used(self) -> int:
        return self.full.live * self.page_size

    @property
    def swa_used(self) -> int:
        return self.swa.live * self.page_size

    def _gap(self) -> int:
        """The free bytes between the SWA side's frontier and the FULL side's."""
        return max(0, self.full.low_bytes() - self.swa.high_bytes())

    @property
    def full_free(self) -> int:
        """The release's ``full_available_size``: the empty pool's capacity less what is live, capped by what
        the side could take once the SWA side's holes were compacted."""
        gap, p = self._gap(), self.page_size
        sched = self.full.available_pages(len(self.swa.holes) * self.swa.page_bytes, gap) * p
        return min(self._cap_full - self.full_used, sched)

    @property
    def swa_free(self) -> int:
        gap, p = self._gap(), self.page_size
        sched = self.swa.available_pages(len(self.full.holes) * self.full.page_bytes, gap) * p
        return min(self._cap_swa - self.swa_used, sched)

    def bytes_in_use(self) -> int:
        """The bytes the two spans and the sink floor take: the budget must hold them without crossing."""
        return self.swa.high_bytes() + (self.full.high_bytes() - self.full.low_bytes())

    def pages_needed(self, slots: RequestSlots, n: int) -> int:
        p = self.page_size
        room = (-slots.length) % p
        return -(-max(0, n - room) // p)

    # ---- capacity (the composite's ensure_capacity)

    def _fits(self, k: int, compacted: bool) -> bool:
        """Whether k more pages on each side fit (``_fits_page_demand`` with equal demands)."""
        f, s = self.full, self.swa
        vcap = self.num_virtual_ids - f.min_page
        fcap, scap = min(vcap, f.num_pages - f.min_page), min(vcap, s.num_pages - s.min_page)
        if f.live + k > fcap or s.live + k > scap:
            return False
        if compacted:
            vroom, fh, sh = vcap - f.live, 0, 0
            froom, sroom = fcap - f.live, scap - s.live
            gap = self._empty_gap - f.live * f.page_bytes - s.live * s.page_bytes
        else:
            vroom, fh, sh = self._virtual.free_count(), len(f.holes), len(s.holes)
            froom, sroom, gap = f.index_room(), s.index_room(), self._gap()
        if k > vroom or k > fh + froom or k > sh + sroom:
            return False
        return max(0, k - fh) * f.page_bytes + max(0, k - sh) * s.page_bytes <= max(0, gap)

    def _ensure_capacity(self, k: int) -> bool:
        """Fits now; or would fit compacted: then an urgent flush of each side (full first) and ask again."""
        if k == 0 or self._fits(k, False):
            return True
        if not self._fits(k, True):
            return False
        self._flush(self.full, urgent=True)
        self._flush(self.swa, urgent=True)
        return self._fits(k, False)

    def _alloc_pages(self, k: int, cause: str) -> np.ndarray:
        """k virtual pages bound on both sides (the composite's alloc / alloc_extend), or OutOfSlots."""
        if not self._ensure_capacity(k):
            raise OutOfSlots(f"need {k} pages a side: the unified budget of {self.budget_bytes} bytes has no room "
                             f"(gap {self._gap()} bytes, holes full {len(self.full.holes)} / SWA {len(self.swa.holes)})")
        gap = self._gap()
        if k > self.full.available_pages(0, gap):
            self._flush(self.swa, urgent=True)      # the full side's shortfall ladder: flush its neighbour
            if k > self.full.available_pages(0, self._gap()):
                raise OutOfSlots(f"need {k} full pages; the full side has room for "
                                 f"{self.full.available_pages(0, self._gap())}")
        virt = self._virtual.mint(k)
        fp = self.full.take(k, self.swa)
        if fp is None:
            raise OutOfSlots(f"the full side could not take {k} pages")
        self._bind(self.full, virt, fp, cause)
        sp = self.swa.take(k, self.full)
        if sp is None:
            raise OutOfSlots(f"the SWA side could not take {k} pages after the joint check")
        self._bind(self.swa, virt, sp, cause)
        return virt

    def _bind(self, side: BufferEnd, virt: np.ndarray, phys: list[int], cause: str) -> None:
        ph = np.asarray(phys, dtype=np.int64)
        side.v2p[virt] = ph
        side.p2v[ph] = virt
        side.live += len(phys)
        self._emit(BIND, side, ph, virt, cause)

    def _check_swa_table(self, virt: np.ndarray, where: str) -> None:
        """U1: a virtual page past the SWA table is the device-side index assert: record and raise."""
        n = self.swa.v2p.shape[0]
        bad = virt[virt >= n]
        if bad.size:
            finding = OutOfRange(where, int(bad[0]), n, int(bad[0]) * self.page_size)
            self.findings.append(finding)
            raise IndexOutOfRange(finding)

    # ---- HybridAllocator's API

    def extend(self, slots: RequestSlots, n: int) -> np.ndarray:
        """Allocate n more tokens for a request; returns their virtual ids (``out_cache_loc``): the tail of its
        last page first, then whole new pages."""
        if n <= 0:
            return np.zeros(0, dtype=np.int64)
        if slots.length + n > slots.capacity:
            raise ValueError(f"request grows to {slots.length + n} tokens, past its capacity {slots.capacity}")
        p, start = self.page_size, slots.length
        k = self.pages_needed(slots, n)
        room = min(n, (-start) % p)
        if room and slots.swa[start - 1] == 0:
            raise RuntimeError("the SWA page of a request's last token was evicted")
        if k:
            if self._virtual.free_count() < k:
                raise OutOfSlots(f"need {k} virtual pages; {self._virtual.free_count()} free")
            self._check_swa_table(self._virtual.peek(k), "swa.v2p.bind")     # before anything changes
            virt = self._alloc_pages(k, "extend")
        ids = np.empty(n, dtype=np.int64)
        if room:
            ids[:room] = slots.full[start - 1] + np.arange(1, room + 1, dtype=np.int64)
        if k:
            offs = np.arange(p, dtype=np.int64)
            ids[room:] = (virt[:, None] * p + offs).ravel()[: n - room]
        slots.full[start:start + n] = ids
        slots.swa[start:start + n] = ids            # the SWA side's ids are the same virtual ids
        slots.length = start + n
        return ids.copy()

    def _side_free(self, side: BufferEnd, tokens: np.ndarray, kind: str, cause: str) -> None:
        """Free the pages of ``tokens`` on one side (``_free_lazy``): unbound, their physical pages holes."""
        pages = tokens // self.page_size if self.page_size == 1 else np.unique(tokens // self.page_size)
        phys = side.v2p[pages].copy()
        side.v2p[pages] = -1
        side.p2v[phys] = -1
        if side is self.full:
            self._virtual.give_back(pages)
        side.holes.extend(int(x) for x in phys)
        side.live -= phys.size
        self._emit(kind, side, phys, pages, cause)

    def _free_tokens(self, tokens: np.ndarray, cause: str) -> None:
        """The composite's free: the SWA pages still bound (not tombstoned, not the sink), then every full page."""
        if tokens.size == 0:
            return
        if self._group is not None:
            self._group.append(tokens.copy())
            return
        self._check_swa_table(np.unique(tokens // self.page_size), "swa.v2p.free")
        live = tokens[self.swa.v2p[tokens // self.page_size] > 0]
        if live.size:
            self._side_free(self.swa, live, UNBIND, cause)
        self._side_free(self.full, tokens, UNBIND, cause)

    def evict_swa(self, slots: RequestSlots, end: int) -> int:
        """Tombstone the SWA side of positions [swa_evicted, end), end rounded down to a page (``free_swa``)."""
        p = self.page_size
        end = min(end, slots.length)
        end -= end % p
        if end <= slots.swa_evicted:
            return 0
        begin = slots.swa_evicted
        tokens = slots.full[begin:end]
        self._check_swa_table(np.unique(tokens // p), "swa.v2p.free")
        live = tokens[self.swa.v2p[tokens // p] > 0]
        if live.size:
            self._side_free(self.swa, live, TOMBSTONE, "out_of_window")
        slots.swa[begin:end] = 0
        slots.swa_evicted = end
        return end - begin

    def truncate(self, slots: RequestSlots, length: int) -> int:
        n, p = slots.length, self.page_size
        kept_end = slots.kept_end(length, p)
        if kept_end is None:
            return 0
        if kept_end < n:
            self._free_tokens(slots.full[kept_end:n].copy(), "truncate")
        return slots.cut(length)

    def free(self, slots: RequestSlots) -> None:
        n = slots.length
        if n == 0:
            return
        self._free_tokens(slots.full[:n].copy(), "release")
        slots.swa[:n] = 0
        slots.length = 0
        slots.swa_evicted = 0

    @property
    def in_free_group(self) -> bool:
        return self._group is not None

    @contextmanager
    def free_group(self, enabled: bool = True) -> Iterator[None]:
        """Defer the frees made inside to the group's end: then one free of their concatenation (the release's
        ``free_group_begin`` / ``free_group_end``)."""
        if not enabled or self._group is not None:
            yield
            return
        self._group = []
        try:
            yield
        finally:
            for hook in self.group_end_hooks:
                hook()
            held, self._group = self._group, None
            if held:
                self._free_tokens(np.concatenate(held), "flush")

    def free_pages(self) -> tuple[np.ndarray, np.ndarray]:
        """Each side's holes (sorted): the freed physical pages not yet reused or compacted away."""
        return (np.asarray(sorted(self.full.holes), dtype=np.int64),
                np.asarray(sorted(self.swa.holes), dtype=np.int64))

    # ---- the in-flight write window and compaction

    def set_inflight_forward(self, virtual_loc: Optional[np.ndarray]) -> None:
        """The current forward's virtual write window (None or empty: none in flight)."""
        if virtual_loc is None or len(virtual_loc) == 0:
            self._inflight = None
            return
        self._inflight = np.asarray(virtual_loc, dtype=np.int64).copy()

    @property
    def pinned(self) -> frozenset:
        """The virtual pages of the in-flight window (a non-urgent flush stops at their physical pages)."""
        if self._inflight is None:
            return frozenset()
        v = self._inflight[self._inflight >= 0] // self.page_size
        return frozenset(np.unique(v).tolist())

    def _write_pages(self, side: BufferEnd) -> set:
        if self._inflight is None:
            return set()
        pool = "full" if side is self.full else "swa"
        return set(np.unique(self.translate_kv_loc(self._inflight, pool) // self.page_size).tolist())

    def _flush(self, side: BufferEnd, urgent: bool) -> int:
        self.urgent_flushes += urgent
        moves = side.flush(urgent, lambda: self._write_pages(side))
        if moves:
            src, dst = np.asarray(moves, dtype=np.int64).T
            self._emit(MOVE, side, src, None, "compact", to_pages=dst)
        self.moves += len(moves)
        return len(moves)

    def flush_opportunistic(self) -> int:
        """0.5.23's lazy compaction at a scheduler boundary (non-urgent, full side then SWA side)."""
        moved = 0
        for side in (self.full, self.swa):
            if side.holes:
                moved += self._flush(side, urgent=False)
        return moved

    def compact(self) -> int:
        """A non-urgent compaction pass of both sides (:meth:`flush_opportunistic`)."""
        return self.flush_opportunistic()

    # ---- invariants (tests)

    def check_invariants(self, requests: list[RequestSlots] = ()) -> None:
        """:func:`~simulator.memory.unified_invariants.check_unified_invariants` of this pool."""
        check_unified_invariants(self, requests)
