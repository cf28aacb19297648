"""The unified pool: SGLang 0.5.23's unified memory model (``--enable-unified-memory``) as slots.

A reference model written from the 0.5.23 source (read, not copied): ``mem_cache/allocator/
unified_hybrid_swa.py`` (the composite that mints virtual pages on the FULL side and binds them on both),
``mem_cache/allocator/unified_sub_pool.py`` (``MultiEndedAllocator``: sub-pools that grow from opposite
ends of one buffer, ``virtual_to_physical`` / ``physical_to_virtual``, ``translate_kv_loc``, compaction,
``set_inflight_forward``), ``mem_cache/kv_loc_plan.py`` and ``mem_cache/kv_index_translator.py`` (the
write window translated once per sub-pool, the write door). docs/SHARING.md ("The unified pool")
describes the model and what is left out.

* **One byte budget.** Both sub-pools live in one buffer of ``budget_bytes``: the FULL side's physical
  pages from the low end (page p at ``[p * full_page_bytes, (p + 1) * full_page_bytes)``), the SWA side's
  from the high end. The split is not fixed: it holds while ``(hf + 1) * full_page_bytes + (hs + 1) *
  swa_page_bytes <= budget_bytes`` where hf / hs are the highest physical pages in use (page 0 of each
  side is its sink, always held). A page is handed out lowest-free first; when the next one would cross
  the other side's extent the pool compacts and tries again.
* **Virtual ids.** The scheduler sees *virtual* token ids (``out_cache_loc``, ``req_to_token``): virtual
  page ``v`` holds tokens ``v * ps .. v * ps + ps - 1``. Virtual pages are minted from the FULL side's
  free virtual ids (a FIFO: ascending at start, freed ids join the tail, so cumulative allocation walks
  the whole id space) and bound on both sides.
* **Page tables.** Per sub-pool ``v2p[v]``: the physical page, ``-1`` unmapped / tombstoned (the SWA side
  after the token left the window), ``v2p[0] = 0`` the sink. ``p2v`` is its inverse (the page's content).
* **Compaction** moves live pages toward the low end of their side's index space (holes filled by the
  highest pages), never a page of the in-flight forward's virtual write window (:meth:`set_inflight_forward`).
* **Translation** (:meth:`UnifiedPool.translate_kv_loc`): ``v2p[t // ps] * ps + t % ps``; an unmapped,
  negative or out-of-range id goes to 0, the sink.
* **The write door** (:meth:`UnifiedPool.write_loc`, :func:`check_physical_write_loc`): a backend writes
  only at a :class:`PhysicalLoc`; a bare array is an :class:`UnmarkedWriteLoc` error.
* Every bind, move and free is a :class:`~simulator.prefix_cache.SlotEvent` in :attr:`UnifiedPool.events`
  (slots: physical token ids of that pool; ``peers``: the virtual ids for BIND / UNBIND, the destination
  physical ids for MOVE), so an oracle can follow who owns each physical slot.
* :class:`UnifiedBehaviour` holds the U1 and U2 switches (0.5.23 defaults: both fixed).

The allocator API is :class:`~simulator.allocator.HybridAllocator`'s (``extend``, ``evict_swa``,
``truncate``, ``free``, ``free_group``, counts, a ``full_to_swa`` view), so the pool can be swapped in; the
ids it hands out are virtual. ``pool.unified = true`` runs it in the loop through
:class:`simulator.unified_run.UnifiedPlan` (which also drives engine_path's adapter of the release's own
unified allocator through the same interface: ``translate_kv_loc``, ``physical_full_to_swa``,
``set_inflight_forward``, ``flush_opportunistic``, ``drain_events``).
"""
from __future__ import annotations

import heapq
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Iterator, Optional

import numpy as np

from .allocator import OutOfSlots, RequestSlots
from .prefix_cache import AVAILABLE, SlotEvent

__all__ = ["UnifiedBehaviour", "UNIFIED_0_5_23", "UNIFIED_BUG_SWITCHES", "with_unified_bug", "unified_bugs_of",
           "UnifiedPool", "PhysicalLoc", "OutOfRange", "IndexOutOfRange", "UnmarkedWriteLoc",
           "check_physical_write_loc", "BIND", "MOVE", "UNBIND", "TOMBSTONE"]

#: event kinds of the unified pool (AVAILABLE is the prefix cache's: pages back in a free list)
BIND = "bind"            # physical ``slots`` of ``pool`` now hold virtual ``peers``
MOVE = "move"            # compaction: the content of physical ``slots`` moved to physical ``peers``
UNBIND = "unbind"        # physical ``slots`` given up by virtual ``peers`` (a free, a truncation)
TOMBSTONE = "tombstone"  # SWA side: virtual ``peers`` left the window; their physical ``slots`` are given up


# --------------------------------------------------------------------------- behaviour switches

@dataclass(frozen=True, slots=True)
class UnifiedBehaviour:
    """How the unified pool behaves; each bug is one switch. The defaults are SGLang 0.5.23's code."""

    name: str = "sglang-0.5.23"
    #: U1 (#37560): the SWA side's v2p has the SWA side's own page count of entries, but is indexed by the
    #: FULL side's virtual page ids. 0.5.23 sizes it by ``full.num_virtual_ids``.
    swa_table_own_size: bool = False
    #: U2 (#35933): translation returns the raw lookup: a tombstoned ``-1`` becomes slot ``-1`` (page size
    #: 1) or ``-ps .. -1``. 0.5.23's ``translate_kv_loc`` clamps to the sink 0.
    unclamped_translate: bool = False


UNIFIED_0_5_23 = UnifiedBehaviour()

#: bug id -> (field, value that has the bug)
UNIFIED_BUG_SWITCHES: dict[str, tuple[str, bool]] = {
    "U1": ("swa_table_own_size", True),
    "U2": ("unclamped_translate", True),
}


def with_unified_bug(bug: str, base: UnifiedBehaviour = UNIFIED_0_5_23) -> UnifiedBehaviour:
    if bug not in UNIFIED_BUG_SWITCHES:
        raise KeyError(f"no unified-pool switch for {bug!r} (known: {', '.join(UNIFIED_BUG_SWITCHES)})")
    name, value = UNIFIED_BUG_SWITCHES[bug]
    return replace(base, name=f"{base.name}+{bug}", **{name: value})


def unified_bugs_of(b: UnifiedBehaviour) -> tuple[str, ...]:
    return tuple(bug for bug, (name, value) in UNIFIED_BUG_SWITCHES.items() if getattr(b, name) == value)


# --------------------------------------------------------------------------- findings and the write door

@dataclass(frozen=True, slots=True)
class OutOfRange:
    """An index past a table or buffer (the device-side index assert): where, the index, the table's length,
    and the virtual token id that produced it."""

    where: str        # "swa.v2p.bind" | "swa.v2p.translate" | "full.write" | "swa.write" | ...
    index: int
    length: int
    token: int

    def __str__(self) -> str:
        return (f"out_of_range{' (negative)' if self.index < 0 else ''}: {self.where} index {self.index} "
                f"of a table of {self.length} (virtual token {self.token})")


class IndexOutOfRange(IndexError):
    """Raised where the GPU would raise a device-side index assert; carries the :class:`OutOfRange`."""

    def __init__(self, finding: OutOfRange):
        super().__init__(str(finding))
        self.finding = finding


class UnmarkedWriteLoc(TypeError):
    """A write location not marked physical reached a unified pool (0.5.23 ``_check_physical_write_loc``)."""


@dataclass(frozen=True, slots=True)
class PhysicalLoc:
    """Write ids of one sub-pool, marked physical (0.5.23 ``KVWriteLoc.physical``)."""

    pool: str               # "full" | "swa"
    ids: np.ndarray         # physical token ids in that sub-pool
    virtual: np.ndarray     # the virtual ids they were translated from


def check_physical_write_loc(loc, pool: str) -> np.ndarray:
    """The write door: the ids a store may write at, or :class:`UnmarkedWriteLoc`."""
    if not isinstance(loc, PhysicalLoc):
        raise UnmarkedWriteLoc(f"the {pool} sub-pool of a unified pool takes physical write locations only; got an "
                               f"unmarked {type(loc).__name__} (virtual ids written as physical land in the wrong slot)")
    if loc.pool != pool:
        raise UnmarkedWriteLoc(f"a {loc.pool} physical write location handed to the {pool} sub-pool")
    return loc.ids


# --------------------------------------------------------------------------- one sub-pool

class _Side:
    """One sub-pool: its physical pages (lowest free first), page tables and the page cost."""

    def __init__(self, name: str, page_bytes: int, max_pages: int, table_len: int):
        self.name = name
        self.page_bytes = page_bytes
        self.max_pages = max_pages                       # physical pages 1..max_pages (0: the sink)
        self.v2p = np.full(table_len, -1, dtype=np.int64)
        self.v2p[0] = 0
        self.p2v = np.full(max_pages + 1, -1, dtype=np.int64)
        self.p2v[0] = 0
        self._heap = list(range(1, max_pages + 1))       # free physical pages (a min-heap)
        self.live = 0

    def high(self) -> int:
        """The highest physical page in use (0: only the sink)."""
        used = np.flatnonzero(self.p2v[1:] >= 0)
        return int(used[-1]) + 1 if used.size else 0

    def lowest_free(self, k: int) -> list[int]:
        return heapq.nsmallest(k, self._heap)

    def take(self, pages: list[int]) -> None:
        taken = set(pages)
        self._heap = [p for p in self._heap if p not in taken]
        heapq.heapify(self._heap)

    def give(self, pages) -> None:
        for p in pages:
            heapq.heappush(self._heap, int(p))


# --------------------------------------------------------------------------- the pool

class UnifiedPool:
    """A unified hybrid SWA pool with :class:`~simulator.allocator.HybridAllocator`'s API; ids are virtual.

    ``full_page_bytes`` / ``swa_page_bytes``: the bytes of one page of each side (all its layers' K and V);
    their ratio decides how many pages each side can grow to in ``budget_bytes``.
    """

    def __init__(self, budget_bytes: int, full_page_bytes: int, swa_page_bytes: int, page_size: int = 1,
                 behaviour: UnifiedBehaviour = UNIFIED_0_5_23):
        if min(budget_bytes, full_page_bytes, swa_page_bytes, page_size) <= 0:
            raise ValueError("budget, page costs and page size must be positive")
        full_max = (budget_bytes - swa_page_bytes) // full_page_bytes - 1
        swa_max = (budget_bytes - full_page_bytes) // swa_page_bytes - 1
        if full_max < 1 or swa_max < 1:
            raise ValueError(f"a budget of {budget_bytes} bytes holds no page besides the sinks")
        self.budget_bytes, self.page_size, self.behaviour = budget_bytes, page_size, behaviour
        #: virtual page ids 1..num_virtual_ids - 1 (0: the sink), minted by the FULL side
        self.num_virtual_ids = full_max + 1
        swa_table = swa_max + 1 if behaviour.swa_table_own_size else self.num_virtual_ids
        self.full = _Side("full", full_page_bytes, full_max, self.num_virtual_ids)
        self.swa = _Side("swa", swa_page_bytes, swa_max, swa_table)
        self._free_virtual: list[int] = list(range(1, self.num_virtual_ids))   # FIFO: head first
        self._vhead = 0
        self._pinned: set[int] = set()          # virtual pages of the in-flight write window
        self.events: list[SlotEvent] = []
        self.findings: list[OutOfRange] = []    # out_of_range records (bind, translate, write door)
        self.record_events = True
        self._group: Optional[list[tuple[str, np.ndarray]]] = None
        self.group_end_hooks: list = []
        self.moves = 0
        #: the scheduler's limits (full, SWA tokens): the static split the budget was made from, when known
        #: (from_pool_config); else each side's maximum
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

    #: the virtual ids are minted FIFO (0.5.23); physical pages lowest free first
    free_order = "fifo"

    def set_free_order(self, order: str) -> None:
        """The scheduler's knob: the unified pool's orders are its own (virtual ids FIFO, physical pages
        lowest first); a valid order is accepted and not applied."""
        if order not in ("lifo", "fifo", "head"):
            raise ValueError(f"free order must be 'lifo', 'fifo' or 'head', got {order!r}")

    # ---- events

    def _emit(self, kind: str, side: _Side, phys_pages, virt_pages, cause: str, to_pages=None) -> None:
        if not self.record_events:
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

    # ---- counts (HybridAllocator's, in tokens)

    @property
    def full_size(self) -> int:
        """What the scheduler may reserve full-side: the static split's full tokens (every reservation
        within the split fits the budget once compacted), else the side's maximum."""
        return self.split[0] if self.split is not None else self.full.max_pages * self.page_size

    @property
    def swa_size(self) -> int:
        return self.split[1] if self.split is not None else self.swa.max_pages * self.page_size

    @property
    def full_rows(self) -> int:
        return (self.full.max_pages + 1) * self.page_size

    @property
    def swa_rows(self) -> int:
        return (self.swa.max_pages + 1) * self.page_size

    @property
    def full_used(self) -> int:
        return self.full.live * self.page_size

    @property
    def swa_used(self) -> int:
        return self.swa.live * self.page_size

    def _room(self, full_pages: int, swa_pages: int) -> bool:
        """Whether ``full_pages`` more FULL and ``swa_pages`` more SWA pages fit the budget once compacted."""
        need = (self.full.live + full_pages + 1) * self.full.page_bytes + \
               (self.swa.live + swa_pages + 1) * self.swa.page_bytes
        return need <= self.budget_bytes and self._vfree() >= full_pages

    def _vfree(self) -> int:
        return len(self._free_virtual) - self._vhead

    @property
    def full_free(self) -> int:
        """Tokens the FULL side could still take (each with an SWA page too)."""
        k = 0
        lo, hi = 0, self.full.max_pages
        while lo < hi:                               # the largest k with room for k pages on both sides
            mid = (lo + hi + 1) // 2
            if self._room(mid, mid):
                lo = mid
            else:
                hi = mid - 1
        k = lo
        return k * self.page_size

    @property
    def swa_free(self) -> int:
        return self.full_free

    def bytes_in_use(self) -> int:
        """The extent the two sides span: the budget must hold it."""
        return (self.full.high() + 1) * self.full.page_bytes + (self.swa.high() + 1) * self.swa.page_bytes

    def pages_needed(self, slots: RequestSlots, n: int) -> int:
        p = self.page_size
        room = (-slots.length) % p
        return -(-max(0, n - room) // p)

    # ---- physical hand-out

    def _fits(self, full_pages: list[int], swa_pages: list[int]) -> bool:
        hf = max([self.full.high()] + full_pages)
        hs = max([self.swa.high()] + swa_pages)
        return (hf + 1) * self.full.page_bytes + (hs + 1) * self.swa.page_bytes <= self.budget_bytes

    def _physical(self, kf: int, ks: int) -> tuple[list[int], list[int]]:
        """The lowest free physical pages of each side, compacting once if they would cross."""
        fp, sp = self.full.lowest_free(kf), self.swa.lowest_free(ks)
        if len(fp) < kf or len(sp) < ks or not self._fits(fp, sp):
            self.compact()
            fp, sp = self.full.lowest_free(kf), self.swa.lowest_free(ks)
            if len(fp) < kf or len(sp) < ks or not self._fits(fp, sp):
                raise OutOfSlots(f"need {kf} full and {ks} SWA pages: the budget of {self.budget_bytes} bytes "
                                 f"spans {self.bytes_in_use()} (pinned pages cannot move)")
        return fp, sp

    def _mint(self, k: int) -> np.ndarray:
        """Mint k virtual pages from the FULL side's free ids (FIFO)."""
        if k > self._vfree():
            raise OutOfSlots(f"asked for {k} virtual pages, {self._vfree()} free")
        v = np.asarray(self._free_virtual[self._vhead:self._vhead + k], dtype=np.int64)
        self._vhead += k
        if self._vhead > 4096 and self._vhead * 2 > len(self._free_virtual):
            self._free_virtual = self._free_virtual[self._vhead:]
            self._vhead = 0
        return v

    def _bind(self, side: _Side, virt: np.ndarray, phys: list[int], cause: str) -> None:
        side.take(phys)
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
        """Allocate n more tokens for a request; returns their virtual ids (``out_cache_loc``)."""
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
            if self._vfree() < k:
                raise OutOfSlots(f"need {k} virtual pages; {self._vfree()} free")
            virt = np.asarray(self._free_virtual[self._vhead:self._vhead + k], dtype=np.int64)
            self._check_swa_table(virt, "swa.v2p.bind")          # before anything changes
            fp, sp = self._physical(k, k)
            virt = self._mint(k)
            self._bind(self.full, virt, fp, "extend")
            self._bind(self.swa, virt, sp, "extend")
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

    def _release(self, side: _Side, virt: np.ndarray, kind: str, cause: str) -> None:
        """Unbind virtual pages on one side: their physical pages go back (held inside a free group)."""
        if virt.size == 0:
            return
        if side is self.swa:
            self._check_swa_table(virt, "swa.v2p.free")
        phys = side.v2p[virt]
        live = phys > 0
        virt, phys = virt[live], phys[live]
        side.v2p[virt] = -1
        side.p2v[phys] = -1
        side.live -= phys.size
        self._emit(kind, side, phys, virt, cause)
        if self._group is not None:
            self._group.append((side.name, phys))
        else:
            side.give(phys)
            self._emit(AVAILABLE, side, phys, phys, cause)

    def _free_virtual_pages(self, virt: np.ndarray) -> None:
        self._free_virtual.extend(int(v) for v in virt)

    def evict_swa(self, slots: RequestSlots, end: int) -> int:
        """Tombstone the SWA side of positions [swa_evicted, end), end rounded down to a page."""
        p = self.page_size
        end = min(end, slots.length)
        end -= end % p
        if end <= slots.swa_evicted:
            return 0
        begin = slots.swa_evicted
        self._release(self.swa, slots.full[begin:end:p] // p, TOMBSTONE, "out_of_window")
        slots.swa[begin:end] = 0
        slots.swa_evicted = end
        return end - begin

    def truncate(self, slots: RequestSlots, length: int) -> int:
        n, p = slots.length, self.page_size
        kept_end = slots.kept_end(length, p)
        if kept_end is None:
            return 0
        if kept_end < n:
            virt = slots.full[kept_end:n:p] // p
            self._release(self.swa, virt, UNBIND, "truncate")
            self._release(self.full, virt, UNBIND, "truncate")
            self._free_virtual_pages(virt)
        return slots.cut(length)

    def free(self, slots: RequestSlots) -> None:
        p, n = self.page_size, slots.length
        if n == 0:
            return
        virt = slots.full[0:n:p] // p
        first = (slots.swa_evicted - slots.swa_evicted % p) // p
        self._release(self.swa, virt[first:], UNBIND, "release")
        self._release(self.full, virt, UNBIND, "release")
        self._free_virtual_pages(virt)
        slots.swa[:n] = 0
        slots.length = 0
        slots.swa_evicted = 0

    @property
    def in_free_group(self) -> bool:
        return self._group is not None

    @contextmanager
    def free_group(self, enabled: bool = True) -> Iterator[None]:
        """Hold the physical pages freed inside and give them back when the group ends (virtual ids go back
        at once: their tables are already cleared)."""
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
            for name, phys in held:
                side = self.full if name == "full" else self.swa
                side.give(phys)
                self._emit(AVAILABLE, side, phys, phys, "flush")

    def free_pages(self) -> tuple[np.ndarray, np.ndarray]:
        return (np.asarray(sorted(self.full._heap), dtype=np.int64),
                np.asarray(sorted(self.swa._heap), dtype=np.int64))

    # ---- the in-flight write window and compaction

    def set_inflight_forward(self, virtual_loc: Optional[np.ndarray]) -> None:
        """Pin the virtual pages of the current forward's write window (None: the forward is done)."""
        if virtual_loc is None:
            self._pinned = set()
            return
        v = np.asarray(virtual_loc, dtype=np.int64)
        v = v[v > 0] // self.page_size
        self._pinned = set(np.unique(v).tolist())

    @property
    def pinned(self) -> frozenset:
        return frozenset(self._pinned)

    def flush_opportunistic(self) -> int:
        """0.5.23's lazy compaction at a scheduler boundary (``flush_opportunistic``; lazy compaction is on by
        default): the holes freed pages left are filled by moving the highest pages down, never a pinned one."""
        return self.compact()

    def compact(self) -> int:
        """Move live pages of each side into the lowest holes, highest first, never a pinned page; returns
        how many pages moved."""
        moved = 0
        for side in (self.full, self.swa):
            src_list, dst_list = [], []
            live = np.flatnonzero(side.p2v >= 0)
            live = live[live > 0][::-1]                    # highest first
            holes = sorted(side._heap)
            hi = 0
            for page in live.tolist():
                if hi >= len(holes) or holes[hi] >= page:
                    break
                v = int(side.p2v[page])
                if v in self._pinned:
                    continue
                dst = holes[hi]
                hi += 1
                side.v2p[v] = dst
                side.p2v[dst] = v
                side.p2v[page] = -1
                src_list.append(page)
                dst_list.append(dst)
            if src_list:
                side.take(dst_list)
                side.give(src_list)
                self._emit(MOVE, side, np.asarray(src_list), None, "compact", to_pages=np.asarray(dst_list))
                moved += len(src_list)
        self.moves += moved
        return moved

    # ---- translation and the write door

    def _table(self, pool: str) -> np.ndarray:
        return (self.full if pool == "full" else self.swa).v2p

    def translate_kv_loc(self, loc: np.ndarray, pool: str = "full") -> np.ndarray:
        """Virtual token ids -> physical token ids of ``pool``: ``v2p[t // ps] * ps + t % ps``. Unmapped,
        negative and out-of-range ids go to 0, the sink; with U2 the raw lookup escapes (-1 -> -ps .. -1),
        and with U1 an SWA index past the table is recorded and raised."""
        loc = np.asarray(loc, dtype=np.int64)
        p, table = self.page_size, self._table(pool)
        page, off = np.floor_divide(loc, p), np.mod(loc, p)
        inside = (page >= 0) & (page < table.shape[0])
        if self.behaviour.swa_table_own_size and pool == "swa" and bool((page >= table.shape[0]).any()):
            bad = int(np.flatnonzero(page >= table.shape[0])[0])
            finding = OutOfRange("swa.v2p.translate", int(page[bad]), table.shape[0], int(loc[bad]))
            self.findings.append(finding)
            raise IndexOutOfRange(finding)
        phys = np.where(inside, table[np.where(inside, page, 0)], -1)
        raw = phys * p + off
        if self.behaviour.unclamped_translate:
            return np.where(inside, raw, 0)
        return np.where(phys > 0, raw, 0)

    def physical_full_to_swa(self) -> np.ndarray:
        """Per *physical* full slot, the SWA physical slot of the same virtual token (0: none; the last
        entry the -1 sentinel): the static pool's ``full_to_swa`` in physical terms, what the design hooks
        of a forward whose ``out_cache_loc`` was bound physical translate through (the plan's SWA ids)."""
        p = self.page_size
        out = np.zeros(self.full_rows + 1, dtype=np.int64)
        out[-1] = -1
        bound = np.flatnonzero(self.full.v2p[1:] > 0) + 1
        if self.behaviour.swa_table_own_size:
            bound = bound[bound < self.swa.v2p.shape[0]]
        if bound.size:
            offs = np.arange(p, dtype=np.int64)
            virt = (bound[:, None] * p + offs).ravel()
            phys = (self.full.v2p[bound][:, None] * p + offs).ravel()
            out[phys] = self.translate_kv_loc(virt, "swa")
        return out

    @property
    def full_to_swa(self) -> np.ndarray:
        """A view like HybridAllocator's mapping: per virtual token id, its SWA physical slot (0: none)."""
        ids = np.arange(self.num_virtual_ids * self.page_size, dtype=np.int64)
        if self.behaviour.swa_table_own_size:
            ids = ids[: self.swa.v2p.shape[0] * self.page_size]
        out = self.translate_kv_loc(ids, "swa")
        return np.concatenate([out, np.asarray([-1], dtype=np.int64)])

    def write_loc(self, virtual_loc: np.ndarray, pool: str) -> PhysicalLoc:
        """The forward's write ids for ``pool``, marked physical; a negative or past-the-buffer id is
        recorded as an :class:`OutOfRange` finding (the store would index out of bounds)."""
        virtual_loc = np.asarray(virtual_loc, dtype=np.int64)
        ids = self.translate_kv_loc(virtual_loc, pool)
        rows = self.full_rows if pool == "full" else self.swa_rows
        bad = np.flatnonzero((ids < 0) | (ids >= rows))
        if bad.size:
            self.findings.append(OutOfRange(f"{pool}.write", int(ids[bad[0]]), rows, int(virtual_loc[bad[0]])))
        return PhysicalLoc(pool, ids, virtual_loc.copy())

    # ---- invariants (tests)

    def check_invariants(self, requests: list[RequestSlots] = ()) -> None:
        for side in (self.full, self.swa):
            v2p, p2v = side.v2p, side.p2v
            bound = np.flatnonzero(v2p[1:] > 0) + 1
            phys = v2p[bound]
            assert np.unique(phys).size == phys.size, f"{side.name}: a physical page bound twice"
            assert (p2v[phys] == bound).all(), f"{side.name}: p2v disagrees with v2p"
            assert (phys <= side.max_pages).all(), f"{side.name}: physical page past the side"
            owned = np.flatnonzero(p2v[1:] >= 0) + 1
            assert owned.size == phys.size == side.live, f"{side.name}: {owned.size} owned, {side.live} live"
            assert v2p[0] == 0 and p2v[0] == 0, f"{side.name}: the sink moved"
            assert not set(side._heap) & set(owned.tolist()), f"{side.name}: a live page is free"
        assert self.bytes_in_use() <= self.budget_bytes, "the byte budget is exceeded"
        # every SWA-bound virtual page is bound on the full side
        swa_bound = np.flatnonzero(self.swa.v2p[1:] > 0) + 1
        assert (self.full.v2p[swa_bound] > 0).all(), "an SWA page bound to a virtual page the full side lacks"
        p = self.page_size
        seen: set[int] = set()
        for r in requests:
            virt = r.full[: r.length:p] // p
            assert not seen.intersection(virt.tolist()), "a virtual page live in two requests"
            seen.update(virt.tolist())
            assert (self.full.v2p[virt] > 0).all(), "a request's virtual page is not bound full-side"
            first = (r.swa_evicted - r.swa_evicted % p) // p
            assert (self.swa.v2p[virt[first:]] > 0).all(), "a live window page is not bound SWA-side"
            ev = virt[: r.swa_evicted // p]
            assert (self.swa.v2p[ev] == -1).all(), "a tombstoned page still owns an SWA page"
