"""The hybrid SWA allocator: a full and an SWA sub-pool, and the ``full_to_swa`` mapping.

Modelled on SGLang's hybrid SWA allocator as of mid-2026 (``SWATokenToKVPoolAllocator``; what 0.5.23
changed is in docs/RELEASE_MODEL.md). Every token takes one full slot *and* one SWA slot; the caller
gets the full slots (``out_cache_loc``) and the mapping records ``full_to_swa[full] = swa``. Tokens
that fall out of the window lose their SWA slot (the mapping entry goes back to 0) while keeping the
full one. Page 0 (slot 0 when page_size is 1) is reserved in both pools and never handed out.

With page_size P a request's tokens fill pages in order; a new page is taken in both pools at once,
and a full slot and its SWA slot share their offset inside the page. Free lists are fixed-size
arrays, so allocation and freeing cost O(tokens), never O(pool). Two orders
(:class:`~simulator.engine_model.release_model.FreeLists`): a stack (LIFO: the latest freed pages come back
first, in the order they were freed), the default; and a ring-buffer queue (FIFO: freed pages join
the tail), SGLang 0.5.23's token allocator. Inside a free group (:meth:`HybridAllocator.free_group`)
frees are held and released together when the group ends, as SGLang's ``free_group_begin`` /
``free_group_end`` do.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np


class OutOfSlots(RuntimeError):
    """The pool has fewer free pages than asked for (the scheduler should have prevented this)."""


class OverFree(RuntimeError):
    """An unchecked free would leave more free pages than the pool holds: SGLang's
    ``available_size() <= size`` assert (the symptom of A2, R8 and other double frees)."""


def _checked_free(state: np.ndarray, pages: np.ndarray, order: np.ndarray) -> None:
    """Mark ``pages`` free in a free list's ``state`` (0: live, negative: free), refusing a page that is
    free already or that occurs twice (nothing marked then). Repeats: each page's entry takes the ``order``
    value of one of its occurrences, so another occurrence of a repeated page reads a value not its own.
    O(len(pages)), where ``np.unique`` sorts or hashes; ``order``: -1, -2, ... (scratch of at least
    len(pages) entries, or fewer: then made here)."""
    if np.count_nonzero(state[pages]):      # (count_nonzero: a fraction of .any()'s call cost)
        raise RuntimeError(f"double free of pages {pages[state[pages] < 0][:8].tolist()}")
    k = pages.size
    own = order[:k] if k <= order.size else -1 - np.arange(k, dtype=order.dtype)
    state[pages] = own
    if np.count_nonzero(state[pages] != own):
        state[pages] = 0
        raise RuntimeError("double free of pages []")


#: a free list's page states and order scratch: int32 (half the cache lines of int64 where a free's pages are
#: scattered over the list; a pool holds fewer than 2**31 pages)
_STATE = np.int32


def _order_scratch(num_pages: int) -> np.ndarray:
    return -1 - np.arange(num_pages + 1, dtype=_STATE)


class _PageStack:
    """Free pages 1..num_pages as a stack; page 0 is the reserved page."""

    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        # popped from the end: hand out low pages first, like a fresh free list
        self._stack = np.arange(num_pages, 0, -1, dtype=np.int64)
        self._top = num_pages
        # per page: 0 live (handed out), negative free (the reserved page 0 counts as free)
        self._state = np.full(num_pages + 1, -1, dtype=_STATE)
        self._order = _order_scratch(num_pages)     # scratch of _checked_free

    @property
    def free(self) -> int:
        return self._top

    def pop(self, k: int) -> np.ndarray:
        if k > self._top:
            raise OutOfSlots(f"asked for {k} pages, {self._top} free")
        pages = self._stack[self._top - k:self._top][::-1].copy()
        self._top -= k
        self._state[pages] = 0
        return pages

    def push(self, pages: np.ndarray, checked: bool = True, exact: bool = False) -> None:
        """``checked=False``: SGLang's ``free_page_ids`` (no page twice, no dedup): a page that is
        already free, or the reserved page 0, goes in again; only over-capacity is refused.
        ``exact``: read by :class:`_PageHead` only."""
        if pages.size == 0:
            return
        if not checked:
            if self._top + pages.size > self.num_pages:
                raise OverFree(f"freeing {pages.size} pages leaves {self._top + pages.size} free of {self.num_pages}")
            self._state[pages] = -1
        else:
            _checked_free(self._state, pages, self._order)
        k = pages.size
        self._stack[self._top:self._top + k] = pages[::-1]
        self._top += k

    def in_order(self) -> np.ndarray:
        """The free pages in the order they would be handed out."""
        return self._stack[:self._top][::-1].copy()


class _PageQueue:
    """Free pages 1..num_pages as a FIFO ring buffer: allocation from the head, frees to the tail."""

    def __init__(self, num_pages: int, initial: Optional[np.ndarray] = None):
        self.num_pages = num_pages
        self._ring = np.zeros(max(num_pages, 1), dtype=np.int64)
        self._state = np.zeros(num_pages + 1, dtype=_STATE)     # as _PageStack's
        self._state[0] = -1
        self._order = _order_scratch(num_pages)
        pages = np.arange(1, num_pages + 1, dtype=np.int64) if initial is None else initial
        self._ring[:pages.size] = pages
        self._state[pages] = -1
        self._head = 0
        self._count = int(pages.size)

    @property
    def free(self) -> int:
        return self._count

    def _span(self, start: int, k: int) -> np.ndarray:
        cap = self._ring.size
        idx = (start + np.arange(k, dtype=np.int64)) % cap
        return idx

    def pop(self, k: int) -> np.ndarray:
        if k > self._count:
            raise OutOfSlots(f"asked for {k} pages, {self._count} free")
        pages = self._ring[self._span(self._head, k)].copy()
        self._head = (self._head + k) % self._ring.size
        self._count -= k
        self._state[pages] = 0
        return pages

    def push(self, pages: np.ndarray, checked: bool = True, exact: bool = False) -> None:
        """``checked=False``: as :meth:`_PageStack.push` (``exact`` ignored)."""
        if pages.size == 0:
            return
        if not checked:
            if self._count + pages.size > self.num_pages:
                raise OverFree(f"freeing {pages.size} pages leaves {self._count + pages.size} free of {self.num_pages}")
            self._state[pages] = -1
        else:
            _checked_free(self._state, pages, self._order)
        self._ring[self._span(self._head + self._count, pages.size)] = pages
        self._count += pages.size

    def in_order(self) -> np.ndarray:
        return self._ring[self._span(self._head, self._count)].copy()


class _PageHead(_PageStack):
    """SGLang 0.5.23's paged free list (page_size > 1, ``PagedTokenToKVPoolAllocator``): freed pages go
    ahead of the list. A free of slots (a truncation's: ``free``) puts its pages there deduplicated
    and ascending (``torch.unique``); a free of exact page ids (an eviction's ``free_swa_segment``, a
    finished request's row by ``free_kv_row_segments``: ``free_page_ids``) in the order given
    (``exact``)."""

    def push(self, pages: np.ndarray, checked: bool = True, exact: bool = False) -> None:
        # a slot free's pages are torch.unique'd by the release whether or not the free is checked (an
        # unchecked free: the radix cache's, which may free a page twice across calls, never within one)
        if not exact and pages.size:
            unique = np.unique(pages)
            if checked and unique.size != pages.size:
                raise RuntimeError(f"double free of pages {pages[:8].tolist()}")
            pages = unique
        super().push(pages, checked)


def _free_list(order: str, num_pages: int, initial: Optional[np.ndarray] = None):
    """A free list of the given order over pages 1..num_pages; ``initial``: the free pages, in hand-out order."""
    if order == "fifo":
        return _PageQueue(num_pages, initial)
    stack = _PageHead(num_pages) if order == "head" else _PageStack(num_pages)
    if initial is not None:
        stack._state[1:] = 0
        stack._state[initial] = -1
        stack._top = int(initial.size)
        stack._stack[:stack._top] = initial[::-1]
    return stack


class _Deferred:
    """A free list's frees held inside a free group, released in one push when the group ends."""

    __slots__ = ("target", "held", "checked", "exact")

    def __init__(self, target):
        self.target = target
        self.held: list[np.ndarray] = []
        self.exact: list[np.ndarray] = []   # a _PageHead's exact page-id frees (released first, as SGLang's group)
        self.checked = True            # False once an unchecked free joined the group

    def push(self, pages: np.ndarray, checked: bool = True, exact: bool = False) -> None:
        if pages.size:
            into = self.exact if exact and isinstance(self.target, _PageHead) else self.held
            into.append(np.asarray(pages, dtype=np.int64).copy())
            self.checked = self.checked and checked

    def release(self) -> None:
        # SGLang 0.5.23's free_group_end: the page-id frees first (free_page_ids), then the slot frees
        # (free: deduplicated, ascending), each block put ahead of the list
        if self.exact:
            pages = np.concatenate(self.exact)
            self.exact = []
            self.target.push(pages, self.checked, exact=True)
        if self.held:
            pages = np.concatenate(self.held)
            self.held = []
            self.target.push(pages, self.checked)


@dataclass(slots=True)
class RequestSlots:
    """The slots of one request's tokens, by position."""

    capacity: int
    full: np.ndarray = field(init=False)
    swa: np.ndarray = field(init=False)
    length: int = 0
    swa_evicted: int = 0       # positions [0, swa_evicted) have had their SWA slot freed

    def __post_init__(self) -> None:
        self.full = np.zeros(self.capacity, dtype=np.int64)
        self.swa = np.zeros(self.capacity, dtype=np.int64)

    def kept_end(self, length: int, page_size: int) -> int | None:
        """Where a truncation to ``length`` stops keeping pages: the first position of the first page no
        longer used; None when there is nothing to truncate. Positions below ``swa_evicted`` cannot go back."""
        if length >= self.length:
            return None
        if length < self.swa_evicted:
            raise ValueError(f"cannot truncate to {length}: positions below {self.swa_evicted} were evicted")
        return -(-length // page_size) * page_size

    def cut(self, length: int) -> int:
        """Forget positions [length, self.length) (their slots already given back); returns how many."""
        n = self.length
        self.full[length:n] = 0
        self.swa[length:n] = 0
        self.length = length
        return n - length


class HybridAllocator:
    """The model's static hybrid pool (memory.protocols.SlotAllocator): page stacks per sub-pool, ``full_to_swa``."""

    #: whose code this is (run.json's ``sources.allocator``)
    source = "model"

    def __init__(self, full_size: int, swa_size: int, page_size: int = 1, free_order: str = "lifo"):
        if full_size % page_size or swa_size % page_size:
            raise ValueError("pool sizes must be multiples of page_size")
        self.full_size, self.swa_size, self.page_size = full_size, swa_size, page_size
        self.free_order = "lifo"
        self._full = _PageStack(full_size // page_size)
        self._swa = _PageStack(swa_size // page_size)
        self._groups: Optional[tuple[_Deferred, _Deferred]] = None
        if free_order != "lifo":
            self.set_free_order(free_order)
        # 0 = no SWA slot; the last entry is the -1 sentinel (a -1 index translates to -1)
        self.full_to_swa = np.zeros(full_size + page_size + 1, dtype=np.int64)
        self.full_to_swa[-1] = -1
        #: called when a free group ends, before its frees are released (the prefix cache resolves
        #: frees deferred to the flush there: its R7 switch)
        self.group_end_hooks: list = []

    def set_free_order(self, order: str) -> None:
        """Switch both free lists to ``order`` ("lifo" | "fifo"), keeping the free pages and the order
        they would be handed out in (a one-off O(pool) rebuild, at set-up)."""
        if order not in ("lifo", "fifo", "head"):
            raise ValueError(f"free order must be 'lifo', 'fifo' or 'head', got {order!r}")
        if self._groups is not None:
            raise RuntimeError("cannot change the free order inside a free group")
        if order == self.free_order:
            return
        self._full = _free_list(order, self._full.num_pages, self._full.in_order())
        self._swa = _free_list(order, self._swa.num_pages, self._swa.in_order())
        self.free_order = order

    @contextmanager
    def free_group(self, enabled: bool = True) -> Iterator[None]:
        """Hold every free made inside (in both pools) and release each pool's in one push at the end.

        The pages stay unavailable until the group ends. Nested groups join the outer one;
        ``enabled=False`` makes it a no-op.
        """
        if not enabled or self._groups is not None:
            yield
            return
        groups = (_Deferred(self._full), _Deferred(self._swa))
        self._groups = groups
        try:
            yield
        finally:
            for hook in self.group_end_hooks:
                hook()
            self._groups = None
            groups[0].release()
            groups[1].release()

    def _push_full(self, pages: np.ndarray, checked: bool = True, exact: bool = False) -> None:
        (self._groups[0] if self._groups is not None else self._full).push(pages, checked, exact)

    def _push_swa(self, pages: np.ndarray, checked: bool = True, exact: bool = False) -> None:
        (self._groups[1] if self._groups is not None else self._swa).push(pages, checked, exact)

    # ---- page-level entry points for the prefix cache (simulator/scheduling/prefix_cache.py)

    @property
    def in_free_group(self) -> bool:
        return self._groups is not None

    def free_full_pages(self, pages: np.ndarray, *, checked: bool = True, exact: bool = False) -> None:
        """Give full pages back (held while a free group is open); the mapping is not touched. ``exact``: page
        ids in the order given (``free_page_ids``), else a slot free's pages (deduplicated, ascending at "head")."""
        self._push_full(np.asarray(pages, dtype=np.int64), checked, exact)

    def free_swa_pages(self, pages: np.ndarray, *, checked: bool = True, exact: bool = False) -> None:
        """Give SWA pages back (held while a free group is open); the mapping is not touched (``exact``: as
        :meth:`free_full_pages`)."""
        self._push_swa(np.asarray(pages, dtype=np.int64), checked, exact)

    def set_mapping(self, full: np.ndarray, swa: np.ndarray) -> None:
        self.full_to_swa[np.asarray(full, dtype=np.int64)] = swa

    def clear_mapping(self, full: np.ndarray) -> None:
        self.full_to_swa[np.asarray(full, dtype=np.int64)] = 0

    def free_pages(self) -> tuple[np.ndarray, np.ndarray]:
        """The free full and SWA pages, each in hand-out order (duplicates kept: an unchecked double free)."""
        return self._full.in_order(), self._swa.in_order()

    def extend_swa_tail(self, slots: RequestSlots, n: int, tail: int, *, clear_stale: bool = True) -> np.ndarray:
        """SGLang's ``alloc_extend_swa_tail`` (PD decode, page_size > 1): full slots for n tokens of an
        empty request, SWA slots only for the last ``tail``. ``clear_stale`` (0.5.23, #25805) clears the
        non-tail full ids' mapping; without it they keep what a previous owner of the recycled full
        pages left there (A2). The model keeps full and SWA offsets equal within a page, so the tail
        must start on a page boundary."""
        p = self.page_size
        if slots.length or not 0 <= tail <= n or (n - tail) % p:
            raise ValueError(f"SWA-tail allocation needs an empty request and a page-aligned tail start "
                             f"(n={n}, tail={tail}, page_size={p})")
        if n > slots.capacity:
            raise ValueError(f"request grows to {n} tokens, past its capacity {slots.capacity}")
        kf, ks = -(-n // p), -(-tail // p)
        if kf > self._full.free or ks > self._swa.free:
            raise OutOfSlots(f"need {kf} full and {ks} SWA pages; {self._full.free} and {self._swa.free} free")
        offs = np.arange(p, dtype=np.int64)
        full = (self._full.pop(kf)[:, None] * p + offs).ravel()[:n]
        slots.full[:n] = full
        head = n - tail
        if tail:
            slots.swa[head:n] = (self._swa.pop(ks)[:, None] * p + offs).ravel()[:tail]
            self.full_to_swa[full[head:]] = slots.swa[head:n]
        if clear_stale and head:
            self.full_to_swa[full[:head]] = 0
        slots.length, slots.swa_evicted = n, head
        return full.copy()

    # rows of the K/V buffers: slots 0 .. size + page_size - 1
    @property
    def full_rows(self) -> int:
        return self.full_size + self.page_size

    @property
    def swa_rows(self) -> int:
        return self.swa_size + self.page_size

    @property
    def full_used(self) -> int:
        return (self._full.num_pages - self._full.free) * self.page_size

    @property
    def swa_used(self) -> int:
        return (self._swa.num_pages - self._swa.free) * self.page_size

    @property
    def full_free(self) -> int:
        return self._full.free * self.page_size

    @property
    def swa_free(self) -> int:
        return self._swa.free * self.page_size

    def pages_needed(self, slots: RequestSlots, n: int) -> int:
        """New pages (in each pool) that extending by n tokens takes."""
        p = self.page_size
        room = (-slots.length) % p
        return -(-max(0, n - room) // p)

    def extend(self, slots: RequestSlots, n: int) -> np.ndarray:
        """Allocate n more tokens for a request; returns their full slots (out_cache_loc rows)."""
        if n <= 0:
            return np.zeros(0, dtype=np.int64)
        if slots.length + n > slots.capacity:
            raise ValueError(f"request grows to {slots.length + n} tokens, past its capacity {slots.capacity}")
        p = self.page_size
        start = slots.length
        k = self.pages_needed(slots, n)
        if k > self._full.free or k > self._swa.free:
            raise OutOfSlots(f"need {k} pages; full pool has {self._full.free}, SWA pool {self._swa.free}")
        room = min(n, (-start) % p)
        if room:
            last_f, last_s = slots.full[start - 1], slots.swa[start - 1]
            if last_s == 0:
                raise RuntimeError("the SWA page of a request's last token was evicted")
            step = np.arange(1, room + 1, dtype=np.int64)
            slots.full[start:start + room] = last_f + step
            slots.swa[start:start + room] = last_s + step
        if k:
            fp, sp = self._full.pop(k), self._swa.pop(k)
            if p == 1:          # a page is a slot (room is 0, k is n)
                f_new, s_new = fp, sp
            else:
                offs = np.arange(p, dtype=np.int64)
                f_new = (fp[:, None] * p + offs).ravel()[: n - room]
                s_new = (sp[:, None] * p + offs).ravel()[: n - room]
            slots.full[start + room:start + n] = f_new
            slots.swa[start + room:start + n] = s_new
        slots.length = start + n
        new_full = slots.full[start:start + n]
        self.full_to_swa[new_full] = slots.swa[start:start + n]
        return new_full.copy()

    def evict_swa(self, slots: RequestSlots, end: int) -> int:
        """Free the SWA slots of positions [swa_evicted, end), end rounded down to a page; returns count."""
        p = self.page_size
        end = min(end, slots.length)
        end -= end % p
        if end <= slots.swa_evicted:
            return 0
        begin = slots.swa_evicted
        # SGLang: free_swa_segment -> free_page_ids (the pages in position order, not sorted)
        self._push_swa(slots.swa[begin:end:p] // p if p > 1 else slots.swa[begin:end], exact=True)
        self.full_to_swa[slots.full[begin:end]] = 0
        slots.swa[begin:end] = 0
        slots.swa_evicted = end
        return end - begin

    def truncate(self, slots: RequestSlots, length: int) -> int:
        """Give back the slots of positions [length, slots.length) in both pools; returns how many.

        Speculative decoding allocates draft and verify tokens that the target may reject. Whole
        pages past the page holding position ``length - 1`` go back to the free lists; the rest of
        that page stays with the request (its mapping entries reset) and is refilled by the next
        ``extend``. Positions past ``length`` always have their SWA slot: eviction stops short of the
        window, which ends at the request's last token.
        """
        n, p = slots.length, self.page_size
        kept_end = slots.kept_end(length, p)
        if kept_end is None:
            return 0
        if kept_end < n:
            self._push_full(slots.full[kept_end:n:p] // p)
            self._push_swa(slots.swa[kept_end:n:p] // p)
        self.full_to_swa[slots.full[length:n]] = 0
        return slots.cut(length)

    def free(self, slots: RequestSlots) -> None:
        """Free every slot of a finished request, in both pools."""
        p, n = self.page_size, slots.length
        if n == 0:
            return
        first_page_pos = slots.swa_evicted - slots.swa_evicted % p
        live_swa = slots.swa[first_page_pos:n:p]
        # SGLang 0.5.23 frees a request's row by segments (free_kv_row_segments: page ids in position
        # order, the evicted prefix's full pages first); exact=True is read by the "head" list only
        live_swa = live_swa[live_swa > 0]
        self._push_swa(live_swa // p if p > 1 else live_swa, exact=True)
        self.full_to_swa[slots.full[:n]] = 0
        if p > 1 and n > first_page_pos:
            # free_swa_segment clears the mapping of the live pages whole (_expand_to_full_pages): ids past
            # n on the last page too (a PD decode node's over-allocated ids; 0 already elsewhere)
            self.full_to_swa[((slots.full[first_page_pos:n:p] // p)[:, None] * p + np.arange(p)).ravel()] = 0
        if isinstance(self._full, _PageHead) and 0 < first_page_pos < n:
            self._push_full(slots.full[0:first_page_pos:p] // p, exact=True)
            self._push_full(slots.full[first_page_pos:n:p] // p, exact=True)
        else:
            # page size 1: the row's view (every push copies what it keeps)
            self._push_full(slots.full[0:n:p] // p if p > 1 else slots.full[:n], exact=True)
        slots.swa[:n] = 0
        slots.length = 0
        slots.swa_evicted = 0

    def check_invariants(self, requests: list[RequestSlots]) -> None:
        """Assert the allocator's invariants against the live requests (used by tests)."""
        full_seen: set[int] = set()
        swa_seen: set[int] = set()
        for r in requests:
            full = r.full[: r.length].tolist()
            swa = r.swa[r.swa_evicted: r.length].tolist()
            assert 0 not in full and all(s >= self.page_size for s in full), "reserved page handed out"
            assert all(s >= self.page_size for s in swa), "reserved SWA page handed out"
            assert not full_seen.intersection(full), "full slot live twice"
            assert not swa_seen.intersection(swa), "SWA slot live twice"
            full_seen.update(full)
            swa_seen.update(swa)
            m = self.full_to_swa[r.full[: r.length]]
            assert (m[: r.swa_evicted] == 0).all(), "evicted token still mapped"
            assert (m[r.swa_evicted:] == r.swa[r.swa_evicted: r.length]).all(), "mapping disagrees"
        assert self.full_to_swa[-1] == -1 and self.full_to_swa[0] == 0
        assert len(full_seen) <= self.full_used and self.full_used <= self.full_size
        mapped = np.count_nonzero(self.full_to_swa[:-1])
        assert mapped == len(swa_seen), f"{mapped} mapped entries for {len(swa_seen)} live SWA slots"
