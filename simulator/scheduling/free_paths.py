"""The prefix cache's free paths, a mixin of :class:`~simulator.scheduling.prefix_cache.PrefixCache`: SGLang
0.5.23's ``mem_cache/allocator/swa.py`` (``free``, ``free_swa``, ``free_swa_segment`` / ``_free_swa_pages``,
``free_full``, ``free_group_begin`` / ``free_group_end``) as slot events, read from the source, not copied.

Every page given back is a ``free`` event for the owner it was freed for, then an ``available`` event
once the free list holds it: at once, or at the end of the free group it was freed in. The model's bug
switches of these paths (R7: SWA frees translated at the group's flush; R8: a segment free that does not
drop unmapped ids; A1: only the freed ids' mapping cleared) apply on the modelled allocator; an engine's
allocator (``release_frees``) runs the release's own paths, and the events say what they freed.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import numpy as np

from simulator.memory.events import AVAILABLE, FREE, MAP, Owner


class FreePaths:
    """The allocator's free paths as the cache calls them (owner and cause named for the events)."""

    def _push(self, pool: str, pages: np.ndarray, exact: bool = False) -> None:
        if pages.size:
            (self.alloc.free_full_pages if pool == "full" else self.alloc.free_swa_pages)(pages, checked=False,
                                                                                          exact=exact)

    def _pushed(self, pool: str, pages: np.ndarray, owner: Optional[Owner], cause: str, push: bool = True,
                exact: bool = False) -> None:
        """``exact``: page ids freed in the order given (``free_page_ids``: a segment's ``_free_swa_pages``);
        otherwise a slot free, whose pages a paged free list takes deduplicated and ascending (``free``)."""
        if not pages.size:
            return
        if push:
            self._push(pool, pages, exact)
        self._emit(FREE, pool, self._page_slots(pages), owner, cause)
        if self.alloc.in_free_group:
            self._held.append((pool, pages))
        else:
            self._emit(AVAILABLE, pool, self._page_slots(pages), None, cause)

    def free_full(self, full: np.ndarray, owner: Optional[Owner], cause: str, segment: bool = False) -> None:
        """``free_full``: the full pages only; the mapping is not read. ``segment``: ``free_full_segment``, a
        page-aligned run of a row or a tree value, whose pages the paged free list takes in position order
        (``free_page_ids``), not deduplicated and ascending as a slot free's."""
        full = np.asarray(full, np.int64)
        if self._release and full.size:
            self.alloc.release_free_full(full)
        self._pushed("full", self._pages(full), owner, cause, push=not self._release, exact=segment)

    def free_full_segment(self, full: np.ndarray, owner: Optional[Owner], cause: str) -> None:
        self.free_full(full, owner, cause, segment=True)

    def free_swa_segment(self, full: np.ndarray, owner: Optional[Owner], cause: str) -> None:
        """``free_swa_segment`` -> ``_free_swa_pages`` over a page-aligned run of full ids: one
        representative per page, its peer page freed and the whole page's mapping cleared."""
        full = np.asarray(full, np.int64)
        if not full.size:
            return
        reps = full[::self.p]
        if self.b.resolve_swa_at_flush and self.alloc.in_free_group and not self._release:
            self._deferred.append((reps.copy(), owner, cause, True))     # the ids, not a view of a row
            return
        self._resolve_segment(reps, owner, cause)

    def _resolve_segment(self, reps: np.ndarray, owner: Optional[Owner], cause: str) -> None:
        m = self.alloc.full_to_swa[reps].copy()
        if self.b.filter_unmapped_swa_frees and not self._release:
            reps, m = reps[m > 0], m[m > 0]
        rows = self._page_slots(reps // self.p)
        try:
            if self._release:
                self.alloc.release_free_swa_segment(rows)  # the release's _free_swa_pages: mapping[rep] // page
            else:
                self.alloc.clear_mapping(rows)
        finally:
            # the release clears the mapping before its capacity assert: the mapping changed either way
            self._emit(MAP, "full", rows, owner, cause, peers=np.zeros(rows.size, np.int64))
        self._pushed("swa", m // self.p, owner, cause, push=not self._release, exact=True)

    def free_swa(self, full: np.ndarray, owner: Optional[Owner], cause: str) -> None:
        """``free_swa`` of an arbitrary set of full ids. Page 1: ``_free_swa_pages`` (unfiltered in 0.5.23).
        Page > 1: the ids are expanded to their whole full pages, read, cleared, and the mapped SWA
        pages freed (``_release_swa`` drops the 0 entries); with A1 only the ids given are cleared."""
        full = np.asarray(full, np.int64)
        if not full.size:
            return
        if self.b.resolve_swa_at_flush and self.alloc.in_free_group and not self._release:
            self._deferred.append((full.copy(), owner, cause, False))
            return
        self._resolve_tokens(full, owner, cause)

    def _resolve_tokens(self, full: np.ndarray, owner: Optional[Owner], cause: str) -> None:
        if self.p == 1:
            self._resolve_segment(full, owner, cause)
            return
        rows = full if self.b.clear_freed_tokens_only else self._page_slots(self._pages(full))
        m = self.alloc.full_to_swa[rows].copy()
        try:
            if self._release:
                self.alloc.release_free_swa(full)           # expands to pages, frees the peers > 0 (_release_swa)
            else:
                self.alloc.clear_mapping(rows)
        finally:
            self._emit(MAP, "full", rows, owner, cause, peers=np.zeros(rows.size, np.int64))   # as above
        self._pushed("swa", self._pages(m[m > 0]), owner, cause, push=not self._release)

    def free(self, full: np.ndarray, owner: Optional[Owner], cause: str) -> None:
        """``free``: SWA first (it reads the mapping), then full."""
        self.free_swa(full, owner, cause)
        self.free_full(full, owner, cause)

    def free_segment(self, full: np.ndarray, owner: Optional[Owner], cause: str) -> None:
        """``free_segment``: ``free_swa_segment`` then the full pages (``free_full_segment``'s)."""
        self.free_swa_segment(full, owner, cause)
        self.free_full_segment(full, owner, cause)

    @contextmanager
    def free_group(self) -> Iterator[None]:
        """``free_group_begin`` ... ``free_group_end`` (the allocator's group; nested groups join)."""
        with self.alloc.free_group():
            yield

    def _on_group_end(self) -> None:
        deferred, self._deferred = self._deferred, []
        for ids, owner, cause, segment in deferred:       # R7: translated now, at the flush
            (self._resolve_segment if segment else self._resolve_tokens)(ids, owner, cause + "@flush")
        held, self._held = self._held, []
        for pool, pages in held:
            self._emit(AVAILABLE, pool, self._page_slots(pages), None, "flush")
