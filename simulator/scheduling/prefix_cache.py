"""The radix prefix cache with FULL and SWA components: SGLang 0.5.23's ``UnifiedRadixCache`` as slots.

A reference model of what the tree does to slot ownership, written from the 0.5.23 source (read, not
copied): ``mem_cache/unified_radix_cache.py`` (``checkpoint_into_tree``), ``mem_cache/unified_cache/
unified_tree_core.py`` (match walk, insert walk, overlap step, leaf eviction), ``mem_cache/unified_cache/
components/swa.py`` (``SWAComponent``: match validator, ``update_component_on_insert_overlap``,
``_recover_from_incoming``, ``_set_swa``, ``evict_component``, window locks), ``mem_cache/common.py``
(``release_kv_cache``, ``free_kv_row_segments``, ``free_swa_out_of_window_slots``) and
``mem_cache/allocator/swa.py`` (``free``, ``free_swa``, ``free_swa_segment`` / ``_free_swa_pages``,
``free_full``, ``free_group_begin`` / ``free_group_end``, ``alloc_extend_swa_tail``). docs/SHARING.md
describes each operation and what is left out.

* A node holds a key (token content ids, a whole number of pages), its FULL value (full slot ids) and
  its SWA value (SWA slot ids, or ``None``: a *tombstone*, whose full part is kept).
* Requests (:class:`CachedRequest`) hold an allocator :class:`~simulator.memory.allocator.RequestSlots`; the
  positions below ``protected`` (SGLang's ``cache_protected_len``) are the tree's, the rest the request's.
* Every change of slot ownership is appended to :attr:`PrefixCache.events` as a :class:`SlotEvent`.
* :class:`SharingBehaviour` holds one switch per modelled bug (R2, R3, R7, R8, A1, A2).
"""
from __future__ import annotations

import itertools
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np

from simulator.memory.allocator import HybridAllocator, RequestSlots
from simulator.engine_model.sharing import SGLANG_0_5_23, SharingBehaviour, bugs_of
from simulator.memory.events import ADOPT, AVAILABLE, FREE, LOCK, MAP, UNLOCK, Owner, SlotEvent


# --------------------------------------------------------------------------- behaviour switches


# --------------------------------------------------------------------------- events


# --------------------------------------------------------------------------- tree and requests

class Node:
    __slots__ = ("id", "key", "parent", "children", "full", "swa", "full_lock", "swa_lock", "last_access",
                 "boundary")

    def __init__(self, nid: int, key: np.ndarray, parent: Optional["Node"], full: np.ndarray,
                 swa: Optional[np.ndarray]):
        self.id = nid
        self.key = key
        self.parent = parent
        self.children: dict[tuple, Node] = {}
        self.full = full
        self.swa = swa                      # None: tombstone
        self.full_lock = 0
        self.swa_lock = 0
        self.last_access = 0
        self.boundary: set[int] = set()     # tags of SWA window locks whose segment ends here

    @property
    def owner(self) -> Owner:
        return Owner("node", self.id)

    @property
    def tombstone(self) -> bool:
        return self.swa is None

    def __repr__(self) -> str:
        return (f"Node({self.id}, len={len(self.key)}, {'tomb' if self.swa is None else 'live'}, "
                f"locks={self.full_lock}/{self.swa_lock})")


@dataclass(eq=False)
class Lock:
    """A request's lock on a node: Full to the root, SWA over the trailing window (SGLang's receipt)."""

    node: Node
    tag: Optional[int]        # the SWA segment's boundary tag (None: the segment reached the root)
    full_slots: np.ndarray = None     # what the LOCK event said the request reads (its UNLOCK repeats it)
    swa_slots: np.ndarray = None


@dataclass(eq=False)
class CachedRequest:
    """A request as the cache sees it. ``tokens``: the content ids of its positions (prompt, then output
    as far as known): :meth:`simulator.scenario.RequestSpec.tokens`."""

    rid: int
    slots: RequestSlots
    tokens: np.ndarray
    protected: int = 0        # positions [0, protected) are the tree's (cache_protected_len)
    lock: Optional[Lock] = None

    @property
    def owner(self) -> Owner:
        return Owner("request", self.rid)


@dataclass(frozen=True, slots=True)
class MatchResult:
    length: int               # matched prefix, a whole number of pages, ending where the SWA rules allow
    node: Node                # the deepest node of the match (root when nothing matched)
    full: np.ndarray          # the prefix's full slot ids
    swa: np.ndarray           # the prefix's SWA slot ids; 0 where the node is a tombstone
    swa_live_from: int        # the trailing run of live SWA starts here (0: no tombstone in the prefix)
    full_hit: int             # tokens matched in Full KV, past ``length`` too


def _common(a: np.ndarray, b: np.ndarray, p: int) -> int:
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    k = int(diff[0]) if diff.size else n
    return k - k % p


class PrefixCache:
    """The tree over an allocator. Operations mirror the 0.5.23 call sites (docs/SHARING.md)."""

    def __init__(self, alloc: HybridAllocator, window: int, behaviour: SharingBehaviour = SGLANG_0_5_23):
        if window < 1:
            raise ValueError("the sliding window must be >= 1")
        self.alloc, self.window, self.b = alloc, window, behaviour
        self.p = alloc.page_size
        self._ids = itertools.count(1)
        self._tags = itertools.count(1)
        self.root = Node(0, np.zeros(0, np.int64), None, np.zeros(0, np.int64), np.zeros(0, np.int64))
        self.nodes: dict[int, Node] = {0: self.root}
        self.events: list[SlotEvent] = []
        self._clock = 0
        self._deferred: list[tuple[np.ndarray, Owner, str, bool]] = []   # R7: SWA frees resolved at flush
        self._held: list[tuple[str, np.ndarray]] = []                     # frees waiting for the group's end
        #: an engine's allocator (engine_path.allocator.EngineAllocator) runs the free paths itself: the
        #: release's free_swa_segment / free_swa / free_full; the events say what they freed (read from the
        #: mapping before each call), and the model's switches of those paths do not apply
        self._release = bool(getattr(alloc, "release_frees", False))
        if self._release:
            model_only = [bug for bug in bugs_of(behaviour) if bug != "R8"]
            if model_only:
                raise ValueError(f"the release's own free paths run with an engine allocator: the model's "
                                 f"switches {', '.join(model_only)} cannot be set there")
        alloc.group_end_hooks.append(self._on_group_end)

    # ------------------------------------------------------------------ events and small helpers

    def drain_events(self) -> list[SlotEvent]:
        out, self.events = self.events, []
        return out

    def _emit(self, kind: str, pool: str, slots: np.ndarray, owner: Optional[Owner] = None,
              cause: str = "", peers: Optional[np.ndarray] = None) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size:
            self.events.append(SlotEvent(kind, pool, slots.copy(), owner,
                                         None if peers is None else np.asarray(peers, np.int64).copy(), cause))

    def _page_slots(self, pages: np.ndarray) -> np.ndarray:
        return (pages[:, None] * self.p + np.arange(self.p, dtype=np.int64)).ravel()

    def _pages(self, slots: np.ndarray) -> np.ndarray:
        """The pages of ``slots``, each once, in order of first appearance."""
        pages = slots // self.p
        _, idx = np.unique(pages, return_index=True)
        return pages[np.sort(idx)]

    def _ck(self, key: np.ndarray, off: int = 0) -> tuple:
        return tuple(key[off:off + self.p].tolist())

    def _touch(self, node: Node) -> None:
        self._clock += 1
        while node is not None:
            node.last_access = self._clock
            node = node.parent

    # ------------------------------------------------------------------ free paths (allocator/swa.py)

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

    def free_full(self, full: np.ndarray, owner: Optional[Owner], cause: str) -> None:
        """``free_full`` / ``free_full_segment``: the full pages only; the mapping is not read."""
        full = np.asarray(full, np.int64)
        if self._release and full.size:
            self.alloc.release_free_full(full)
        self._pushed("full", self._pages(full), owner, cause, push=not self._release)

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
        """``free_segment``: ``free_swa_segment`` then the full pages."""
        self.free_swa_segment(full, owner, cause)
        self.free_full(full, owner, cause)

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

    def extend_swa_tail(self, req: CachedRequest, n: int, tail: int) -> np.ndarray:
        """``alloc_extend_swa_tail`` for an empty request (A2's switch decides the non-tail mapping)."""
        full = self.alloc.extend_swa_tail(req.slots, n, tail, clear_stale=not self.b.keep_stale_tail_mapping)
        self._emit(ADOPT, "full", full, req.owner, "alloc_tail")
        self._emit(ADOPT, "swa", req.slots.swa[n - tail:n], req.owner, "alloc_tail")
        return full

    # ------------------------------------------------------------------ tree structure

    def _split(self, node: Node, k: int) -> Node:
        """Split ``node`` after ``k`` tokens; returns the new parent (the first part)."""
        assert 0 < k < len(node.key) and k % self.p == 0
        parent = node.parent
        new = Node(next(self._ids), node.key[:k].copy(), parent, node.full[:k].copy(),
                   None if node.swa is None else node.swa[:k].copy())
        new.full_lock, new.swa_lock, new.last_access = node.full_lock, node.swa_lock, node.last_access
        new.boundary, node.boundary = node.boundary, set()     # the older edge moves to the parent
        parent.children[self._ck(node.key)] = new
        node.key, node.full = node.key[k:].copy(), node.full[k:].copy()
        if node.swa is not None:
            node.swa = node.swa[k:].copy()
        node.parent = new
        new.children[self._ck(node.key)] = node
        self.nodes[new.id] = new
        self._emit(ADOPT, "full", new.full, new.owner, "split")
        if new.swa is not None:
            self._emit(ADOPT, "swa", new.swa, new.owner, "split")
        return new

    def _path(self, node: Node) -> list[Node]:
        out = []
        while node is not self.root:
            out.append(node)
            node = node.parent
        return out[::-1]

    def path_full(self, node: Node) -> np.ndarray:
        parts = [n.full for n in self._path(node)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def path_swa(self, node: Node) -> np.ndarray:
        parts = [n.swa if n.swa is not None else np.zeros(len(n.key), np.int64) for n in self._path(node)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    # ------------------------------------------------------------------ match

    def match_prefix(self, tokens: np.ndarray, limit: Optional[int] = None) -> MatchResult:
        """The longest cached prefix of ``tokens[:limit]`` whose SWA state is usable: each node on the
        path is valid while no tombstone has been seen, or once the live SWA since the last tombstone
        covers the window (SWAComponent.create_match_validator). Partial node matches split the node."""
        key = np.asarray(tokens, np.int64)[:limit]
        n = key.size - key.size % self.p
        node, off, run, full_hit = self.root, 0, math.inf, 0
        best, best_len, live_from, best_live_from = self.root, 0, 0, 0
        while off < n:
            child = node.children.get(self._ck(key, off))
            if child is None:
                break
            k = _common(child.key, key[off:n], self.p)
            if k == 0:
                break
            partial = k < len(child.key)
            if partial:
                child = self._split(child, k)
            off += k
            full_hit += k
            node = child
            if node.swa is None:
                run, live_from = 0, off
            else:
                run += k
                if run >= self.window:
                    best, best_len, best_live_from = node, off, live_from
            if partial:
                break
        if best is not self.root:
            self._touch(best)
        return MatchResult(best_len, best, self.path_full(best), self.path_swa(best),
                           best_live_from, full_hit)

    def admit(self, req: CachedRequest, limit: Optional[int] = None) -> MatchResult:
        """Match ``req``'s tokens (up to ``limit``; the scheduler leaves one token to compute), take the
        prefix into its empty slot record and lock it."""
        s = req.slots
        if s.length:
            raise ValueError(f"request {req.rid} already holds {s.length} slots")
        m = self.match_prefix(req.tokens, limit)
        L = m.length
        s.full[:L], s.swa[:L] = m.full, m.swa
        s.length, s.swa_evicted = L, m.swa_live_from
        req.protected = L
        req.lock = self._lock(m.node, req)
        return m

    # ------------------------------------------------------------------ locks

    def _lock(self, node: Node, req: CachedRequest) -> Lock:
        cur = node
        while cur is not self.root:
            cur.full_lock += 1
            cur = cur.parent
        cur, covered, tag, swa_slots = node, 0, None, []
        while cur is not self.root and covered < self.window:
            cur.swa_lock += 1
            covered += len(cur.key)
            if cur.swa is not None:
                swa_slots.append(cur.swa)
            if covered >= self.window:
                tag = next(self._tags)
                cur.boundary.add(tag)
            cur = cur.parent
        full = self.path_full(node)
        swa = np.concatenate(swa_slots[::-1]) if swa_slots else np.zeros(0, np.int64)
        self._emit(LOCK, "full", full, req.owner, "lock")
        self._emit(LOCK, "swa", swa, req.owner, "lock")
        return Lock(node, tag, full, swa)

    def _unlock(self, lock: Optional[Lock], req: CachedRequest) -> None:
        if lock is None or lock.node is self.root:
            return
        cur = lock.node
        self._emit(UNLOCK, "full", lock.full_slots, req.owner, "unlock")
        self._emit(UNLOCK, "swa", lock.swa_slots, req.owner, "unlock")
        while cur is not self.root:
            if cur.full_lock <= 0:
                raise AssertionError(f"full lock_ref would go negative on node {cur.id}")
            cur.full_lock -= 1
            cur = cur.parent
        cur = lock.node
        while cur is not self.root:
            if cur.swa_lock <= 0:
                raise AssertionError(f"SWA lock_ref would go negative on node {cur.id}")
            cur.swa_lock -= 1
            if lock.tag is not None and lock.tag in cur.boundary:
                cur.boundary.discard(lock.tag)
                break
            cur = cur.parent

    # ------------------------------------------------------------------ insert

    def _recover(self, node: Node, incoming: np.ndarray, req: CachedRequest) -> None:
        """``_recover_from_incoming`` on a tombstone fragment whose span the request has live SWA for."""
        mapping = self.alloc.full_to_swa
        if node.full_lock > 0 and not self.b.free_locked_full_on_recovery:
            # RecoverSWAWithLockedFull: keep the locked full, move the incoming SWA peers onto it
            kept = node.full
            swa_value = mapping[incoming].copy()
            self.alloc.clear_mapping(incoming)
            self._emit(MAP, "full", incoming, req.owner, "recover_locked", peers=np.zeros(incoming.size, np.int64))
            self.alloc.set_mapping(kept, swa_value)
            self._emit(MAP, "full", kept, node.owner, "recover_locked", peers=swa_value)
            self.free_full(incoming, req.owner, "recover_locked")
            node.swa = swa_value
            self._emit(ADOPT, "swa", swa_value, node.owner, "recover_locked")
            return
        old = node.full
        node.full = incoming.copy()
        self._emit(ADOPT, "full", node.full, node.owner, "recover")
        if self.b.stale_tombstone_mapping:
            self.free(old, node.owner, "recover")          # R3: the old base value through free()
        else:
            self.free_full(old, node.owner, "recover")     # FreeDeviceKVFullOnly
        node.swa = mapping[node.full].copy()               # SWARebuild
        self._emit(ADOPT, "swa", node.swa, node.owner, "recover")

    def _new_leaf(self, parent: Node, key: np.ndarray, full: np.ndarray, live: bool) -> Node:
        node = Node(next(self._ids), key.copy(), parent, full.copy(),
                    self.alloc.full_to_swa[full].copy() if live else None)
        parent.children[self._ck(key)] = node
        self.nodes[node.id] = node
        self._emit(ADOPT, "full", node.full, node.owner, "insert")
        if live:
            self._emit(ADOPT, "swa", node.swa, node.owner, "insert")
        return node

    def _insert(self, req: CachedRequest, length: int) -> Node:
        """``checkpoint_into_tree``: insert positions [0, length) page-aligned, free the request's
        duplicates, re-point its row at the tree's ids, move its lock to the node the insert ended on."""
        p, s = self.p, req.slots
        L = min(length, s.length)
        L -= L % p
        prev, evicted = req.protected, s.swa_evicted
        if L <= prev:
            return req.lock.node if req.lock is not None else self.root
        if evicted % p:
            raise ValueError(f"request {req.rid}: swa_evicted {evicted} is not page-aligned")
        key, value = np.asarray(req.tokens[:L], np.int64), s.full[:L].copy()
        node, total = self.root, 0
        while total < L:
            child = node.children.get(self._ck(key, total))
            if child is None:
                break
            k = _common(child.key, key[total:L], p)
            if k == 0:
                break
            if k < len(child.key):
                child = self._split(child, k)
            self._touch(child)
            if total + k > prev:           # nodes inside the request's own prefix are skipped
                consumed = k
                if child.swa is None:      # update_component_on_insert_overlap
                    live = max(total, evicted)
                    if live < total + k:
                        if live > total:
                            self._split(child, live - total)      # the tombstoned head stays a tombstone
                        self._recover(child, value[live:total + k], req)
                        consumed = live - total
                dup_lo = max(0, prev - total)
                if dup_lo < consumed:
                    dup = value[total + dup_lo: total + consumed]
                    gone = min(max(evicted - (total + dup_lo), 0), dup.size)
                    self.free_full(dup[:gone], req.owner, "dedup")       # below the request's SWA floor
                    self.free_segment(dup[gone:], req.owner, "dedup")
            node, total = child, total + k
        if total < L:
            live = max(total, evicted)
            if live > total:
                node = self._new_leaf(node, key[total:min(live, L)], value[total:min(live, L)], live=False)
            if live < L:
                node = self._new_leaf(node, key[live:L], value[live:L], live=True)
            self._touch(node)
        # the request's row now reads the tree's ids
        s.full[prev:L] = self.path_full(node)[prev:L]
        s.swa[prev:L] = self.path_swa(node)[prev:L]
        self._unlock(req.lock, req)
        req.lock = self._lock(node, req)
        req.protected = L
        return node

    def cache_unfinished(self, req: CachedRequest, length: Optional[int] = None) -> Node:
        """An unfinished (chunked) request's checkpoint: its KV so far joins the tree; it keeps running."""
        return self._insert(req, req.slots.length if length is None else length)

    def cache_finished(self, req: CachedRequest, kv_len: Optional[int] = None) -> None:
        """A finished request: insert its KV (``kv_len`` tokens, default all it holds), then release."""
        self._insert(req, req.slots.length if kv_len is None else kv_len)
        self.release(req)

    def release(self, req: CachedRequest) -> None:
        """``release_kv_cache`` / ``free_kv_row_segments``: positions [protected, length) go back;
        [protected, swa_evicted) full-side only, the rest both sides; then the lock is dropped."""
        s = req.slots
        lo, hi = req.protected, s.length
        if hi > lo:
            mid = min(max(s.swa_evicted, lo), hi)
            self.free_full(s.full[lo:mid], req.owner, "release")
            self.free_segment(s.full[mid:hi], req.owner, "release")
        self._unlock(req.lock, req)
        req.lock = None
        s.full[:hi] = 0
        s.swa[:hi] = 0
        s.length = s.swa_evicted = 0
        req.protected = 0

    def free_out_of_window(self, req: CachedRequest, end: int) -> int:
        """``free_swa_out_of_window_slots`` for the request's own positions: SWA of [floor, end) freed,
        end page-floored, floor = max(swa_evicted, protected); returns how many positions."""
        s, p = req.slots, self.p
        lo = max(s.swa_evicted, req.protected)
        end = min(end, s.length)
        end -= end % p
        if end <= lo:
            return 0
        self.free_swa_segment(s.full[lo:end], req.owner, "out_of_window")
        s.swa[lo:end] = 0
        s.swa_evicted = end
        return end - lo

    # ------------------------------------------------------------------ eviction

    def _leaf(self, node: Node) -> bool:
        return node is not self.root and not node.children

    def _evict_leaf(self, node: Node) -> None:
        if node.swa is not None or self.b.linker_frees_tombstones:
            self.free_swa_segment(node.full, node.owner, "evict_leaf")
        self.free_full(node.full, node.owner, "evict_leaf")
        del node.parent.children[self._ck(node.key)]
        del self.nodes[node.id]

    def _tombstone(self, node: Node) -> None:
        if self.b.stale_tombstone_mapping:
            # R3: the node's SWA value freed directly; its full ids keep the (now stale) mapping
            self._pushed("swa", self._pages(node.swa), node.owner, "tombstone")
        else:
            self.free_swa_segment(node.full, node.owner, "tombstone")
        node.swa = None

    def evict(self, full_tokens: int = 0, swa_tokens: int = 0) -> tuple[int, int]:
        """Tree eviction under memory pressure: unlocked leaves by LRU until ``full_tokens`` full slots
        are freed; then SWA by LRU over nodes with live, unlocked SWA until ``swa_tokens``: a leaf with
        unlocked Full goes whole, an internal node (or a leaf with locked Full) becomes a tombstone."""
        freed_full = freed_swa = 0
        while freed_full < full_tokens:
            leaves = [n for n in self.nodes.values() if self._leaf(n) and n.full_lock == 0]
            if not leaves:
                break
            victim = min(leaves, key=lambda n: (n.last_access, n.id))
            freed_full += len(victim.full)
            freed_swa += 0 if victim.swa is None else len(victim.swa)
            self._evict_leaf(victim)
        while freed_swa < swa_tokens:
            cands = [n for n in self.nodes.values() if n is not self.root and n.swa is not None and n.swa_lock == 0]
            if not cands:
                break
            victim = min(cands, key=lambda n: (n.last_access, n.id))
            freed_swa += len(victim.swa)
            if self._leaf(victim) and victim.full_lock == 0:
                freed_full += len(victim.full)
                self._evict_leaf(victim)
            else:
                self._tombstone(victim)
        return freed_full, freed_swa

    def describe(self) -> list[str]:
        """The tree as indented lines (node id, tokens, full and SWA slot ranges, locks): for reports."""
        def span(v: Optional[np.ndarray]) -> str:
            if v is None:
                return "tombstone"
            return f"{int(v[0])}..{int(v[-1])}" if v.size else "-"

        out: list[str] = []

        def walk(node: Node, depth: int) -> None:
            for child in sorted(node.children.values(), key=lambda n: n.id):
                out.append(f"{'  ' * depth}node {child.id}: {len(child.key)} tokens, full {span(child.full)}, "
                           f"swa {span(child.swa)}, locks full {child.full_lock} swa {child.swa_lock}")
                walk(child, depth + 1)

        walk(self.root, 0)
        return out

    def evictable(self) -> tuple[int, int]:
        """Full tokens in unlocked nodes, SWA tokens in live unlocked nodes."""
        full = sum(len(n.full) for n in self.nodes.values() if n is not self.root and n.full_lock == 0)
        swa = sum(len(n.swa) for n in self.nodes.values()
                  if n is not self.root and n.swa is not None and n.swa_lock == 0)
        return full, swa

    # ------------------------------------------------------------------ invariants

    def check_invariants(self, requests: list[CachedRequest]) -> None:
        """Assert the ownership invariants of the tree, the requests and the allocator together:
        no page owned twice or both owned and free, no leak, the sink never handed out nor free,
        every mapped full id maps to its owner's live SWA slot (0 elsewhere: tombstones own no SWA
        slot), lock counts equal to the live locks' and never negative."""
        full_owner, swa_owner, mapped = self._check_owners(requests)
        self._check_free_lists(full_owner, swa_owner, mapped)
        self._check_locks(requests)

    def _check_owners(self, requests: list[CachedRequest]) -> tuple[dict[int, Owner], dict[int, Owner], int]:
        """check_invariants' owners: every node's and request's pages owned once (never the sink), the mapping
        equal to each owner's SWA value (0 on tombstones and evicted positions); the owner tables and the
        count of mapped full ids."""
        p = self.p
        mapping = self.alloc.full_to_swa
        full_owner: dict[int, Owner] = {}
        swa_owner: dict[int, Owner] = {}
        mapped = 0

        def own(table: dict, pages: np.ndarray, who: Owner, pool: str) -> None:
            for pg in pages.tolist():
                assert pg != 0, f"{who} holds the sink page in the {pool} pool"
                assert pg not in table, f"{pool} page {pg} owned by {table.get(pg)} and {who}"
                table[pg] = who

        for node in self.nodes.values():
            if node is self.root:
                continue
            assert node.full_lock >= 0 and node.swa_lock >= 0, f"{node} has a negative lock count"
            assert len(node.key) == node.full.size and node.full.size % p == 0 and node.full.size
            assert (node.full[::p] % p == 0).all(), f"{node}: full value not page-aligned"
            assert node.parent.children.get(self._ck(node.key)) is node
            own(full_owner, self._pages(node.full), node.owner, "full")
            m = mapping[node.full]
            if node.swa is None:
                assert (m == 0).all(), f"tombstone {node} still maps {m[m != 0][:4].tolist()}"
            else:
                assert (m == node.swa).all(), f"{node}: mapping disagrees with its SWA value"
                own(swa_owner, self._pages(node.swa), node.owner, "swa")
                mapped += node.swa.size
        for r in requests:
            s = r.slots
            lo = r.protected
            path = self.path_full(r.lock.node) if r.lock is not None else np.zeros(0, np.int64)
            assert path.size == lo and (s.full[:lo] == path).all(), f"request {r.rid}: prefix is not its node's path"
            if s.length > lo:
                own(full_owner, self._pages(s.full[lo:s.length]), r.owner, "full")
                ev = max(lo, s.swa_evicted)
                assert (mapping[s.full[lo:ev]] == 0).all(), f"request {r.rid}: evicted position still mapped"
                live = s.full[ev:s.length]
                assert (mapping[live] == s.swa[ev:s.length]).all(), f"request {r.rid}: mapping disagrees"
                own(swa_owner, self._pages(s.swa[ev:s.length]), r.owner, "swa")
                mapped += live.size
        return full_owner, swa_owner, mapped

    def _check_free_lists(self, full_owner: dict[int, Owner], swa_owner: dict[int, Owner], mapped: int) -> None:
        """check_invariants' free lists: no page free twice, owned and free, or leaked; no sink; no stray mapping."""
        p, a = self.p, self.alloc
        mapping = a.full_to_swa
        free_full, free_swa = a.free_pages()
        for pool, free, owners, total in (("full", free_full, full_owner, a.full_size // p),
                                          ("swa", free_swa, swa_owner, a.swa_size // p)):
            assert free.size <= total, f"{pool}: {free.size} free pages of {total}"
            assert 0 not in free.tolist(), f"the sink page is in the {pool} free list"
            assert np.unique(free).size == free.size, f"{pool} free list holds a page twice"
            both = set(free.tolist()) & set(owners)
            assert not both, f"{pool} pages {sorted(both)[:4]} are owned and free"
            assert len(owners) + free.size == total, f"{pool}: {total - len(owners) - free.size} pages leaked"
        assert np.count_nonzero(mapping[:-1]) == mapped, "a full id maps to an SWA slot nobody owns"
        assert mapping[-1] == -1 and mapping[0] == 0

    def _check_locks(self, requests: list[CachedRequest]) -> None:
        """check_invariants' locks: each node's full / SWA lock count equal to the live locks through it."""
        expect_full: dict[int, int] = {}
        expect_swa: dict[int, int] = {}
        for r in requests:
            if r.lock is None or r.lock.node is self.root:
                continue
            cur = r.lock.node
            while cur is not self.root:
                expect_full[cur.id] = expect_full.get(cur.id, 0) + 1
                cur = cur.parent
            cur = r.lock.node
            while cur is not self.root:
                expect_swa[cur.id] = expect_swa.get(cur.id, 0) + 1
                if r.lock.tag is not None and r.lock.tag in cur.boundary:
                    break
                cur = cur.parent
        for node in self.nodes.values():
            if node is self.root:
                continue
            assert node.full_lock == expect_full.get(node.id, 0), f"{node}: full lock drifted"
            assert node.swa_lock == expect_swa.get(node.id, 0), f"{node}: SWA lock drifted"


class OwnershipLedger:
    """A reference consumer of :class:`SlotEvent`: who holds each slot and who reads it, as the events
    say; what an oracle needs. Allocations a request makes itself are given with :meth:`allocated`, in
    order with the events: apply the events drained so far before recording the allocation after them.

    ``problems`` collects, in order: ``sink_freed`` (page 0 given back), ``double_free`` (a page freed
    while already free), ``freed_foreign`` (a slot freed on behalf of one owner while another holds it),
    ``freed_while_read`` (a slot freed while a request reads it), ``allocated_while_owned`` (a page
    handed out while a slot on it is held by another owner), ``sink_allocated``.
    """

    def __init__(self, page_size: int, full_pages: int, swa_pages: int):
        self.p = page_size
        self.free = {"full": set(range(1, full_pages + 1)), "swa": set(range(1, swa_pages + 1))}
        self.owner: dict[str, dict[int, Owner]] = {"full": {}, "swa": {}}
        self.readers: dict[str, dict[int, dict[Owner, int]]] = {"full": {}, "swa": {}}
        self.problems: list[tuple] = []

    def _pages(self, slots: np.ndarray) -> list[int]:
        return sorted(set((np.asarray(slots, np.int64) // self.p).tolist()))

    def allocated(self, pool: str, slots: np.ndarray, owner: Owner) -> None:
        held = self.owner[pool]
        for page in self._pages(slots):
            if page == 0:
                self.problems.append(("sink_allocated", pool, 0, owner))
            if page in self.free[pool]:
                self.free[pool].discard(page)
                continue
            others = {held[s] for s in range(page * self.p, (page + 1) * self.p) if s in held} - {owner}
            if others:
                self.problems.append(("allocated_while_owned", pool, page, owner, sorted(others, key=str)))
        for s in np.asarray(slots, np.int64).tolist():
            held[s] = owner

    def apply(self, events: list[SlotEvent]) -> None:
        for ev in events:
            pool, slots = ev.pool, ev.slots.tolist()
            if ev.kind == ADOPT:
                for s in slots:
                    self.owner[pool][s] = ev.owner
            elif ev.kind == FREE:
                self._freed(ev, pool, slots)
            elif ev.kind in (LOCK, UNLOCK):
                table = self.readers[pool]
                for s in slots:
                    who = table.setdefault(s, {})
                    who[ev.owner] = who.get(ev.owner, 0) + (1 if ev.kind == LOCK else -1)
                    if not who[ev.owner]:
                        del who[ev.owner]
                    if not who:
                        del table[s]

    def _freed(self, ev: SlotEvent, pool: str, slots: list[int]) -> None:
        held, free = self.owner[pool], self.free[pool]
        for page in self._pages(np.asarray(slots)):
            if page == 0:
                self.problems.append(("sink_freed", pool, 0, ev.owner, ev.cause))
                continue
            if page in free:
                self.problems.append(("double_free", pool, page, ev.owner, ev.cause))
            free.add(page)
        for s in slots:
            if s < self.p:
                continue
            cur = held.get(s)
            if cur is not None and cur != ev.owner:
                self.problems.append(("freed_foreign", pool, s, cur, ev.owner, ev.cause))
            elif cur is not None:
                del held[s]
            readers = set(self.readers[pool].get(s, {})) - {ev.owner}
            if readers:
                self.problems.append(("freed_while_read", pool, s, sorted(readers, key=str), ev.owner, ev.cause))


__all__ = [
    "SharingBehaviour", "SGLANG_0_5_23", "FIXED", "BUG_SWITCHES", "with_bug", "bugs_of",
    "Owner", "SlotEvent", "ADOPT", "FREE", "AVAILABLE", "MAP", "LOCK", "UNLOCK",
    "Node", "Lock", "CachedRequest", "MatchResult", "PrefixCache", "OwnershipLedger",
]
