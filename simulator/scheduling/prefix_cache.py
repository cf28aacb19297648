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
* The free paths (:mod:`simulator.scheduling.free_paths`), tree eviction
  (:mod:`simulator.scheduling.tree_eviction`) and the invariant checks
  (:mod:`simulator.scheduling.cache_invariants`) are mixins of :class:`PrefixCache`; the events' reference
  consumer is :class:`~simulator.scheduling.ownership_ledger.OwnershipLedger`.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from simulator.memory.allocator import HybridAllocator, RequestSlots
from simulator.engine_model.sharing import SGLANG_0_5_23, SharingBehaviour, bugs_of
from simulator.memory.events import ADOPT, LOCK, MAP, UNLOCK, Owner, SlotEvent
from simulator.scheduling.cache_invariants import InvariantChecks
from simulator.scheduling.free_paths import FreePaths
from simulator.scheduling.tree_eviction import TreeEviction


# --------------------------------------------------------------------------- tree and requests

class Node:
    __slots__ = ("id", "key", "parent", "children", "full", "swa", "full_lock", "swa_lock", "last_access",
                 "swa_access", "boundary")

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
        self.last_access = 0                # the Full side's recency (leaf eviction)
        self.swa_access = 0.0               # the SWA side's recency (its LRU list: SWA eviction)
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
    branching: Optional[int] = None   # the SWA branching point of its match (swa_branching_seqlen)

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


class PrefixCache(FreePaths, TreeEviction, InvariantChecks):
    """The tree over an allocator. Operations mirror the 0.5.23 call sites (docs/SHARING.md)."""

    def __init__(self, alloc: HybridAllocator, window: int, behaviour: SharingBehaviour = SGLANG_0_5_23,
                 disabled: bool = False):
        if window < 1:
            raise ValueError("the sliding window must be >= 1")
        self.alloc, self.window, self.b = alloc, window, behaviour
        #: the radix cache off in a release whose scheduler keeps its tree, disabled (0.5.23's ``disable``): no
        #: match; the scheduler inserts nothing into it and frees a request's row whole (SharingScheduler)
        self.disabled = disabled
        self.p = alloc.page_size
        self._ids = itertools.count(1)
        self._tags = itertools.count(1)
        self.root = Node(0, np.zeros(0, np.int64), None, np.zeros(0, np.int64), np.zeros(0, np.int64))
        self.nodes: dict[int, Node] = {0: self.root}
        self.events: list[SlotEvent] = []
        self._clock = 0                     # the Full side's time counter
        self._swa_clock = 0.0               # the SWA LRU list's order
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

    # ------------------------------------------------------------------ allocation (allocator/swa.py)

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
        new.full_lock, new.swa_lock = node.full_lock, node.swa_lock
        self._recency_of_split(new, node)
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
        n = 0 if self.disabled else key.size - key.size % self.p
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
        # the Full KV hit past the SWA-usable prefix: the request's first insert stops there
        # (SWAComponent.finalize_match_result_in_tree_core / prepare_for_caching_req)
        req.branching = m.full_hit if m.full_hit > L else None
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
            self.free_full_segment(incoming, req.owner, "recover_locked")
            node.swa = swa_value
            self._swa_mru(node)
            self._emit(ADOPT, "swa", swa_value, node.owner, "recover_locked")
            return
        old = node.full
        node.full = incoming.copy()
        self._emit(ADOPT, "full", node.full, node.owner, "recover")
        if self.b.stale_tombstone_mapping:
            self.free(old, node.owner, "recover")          # R3: the old base value through free()
        else:
            self.free_full_segment(old, node.owner, "recover")     # FreeDeviceKVFullOnly
        node.swa = mapping[node.full].copy()               # SWARebuild
        self._swa_mru(node)
        self._emit(ADOPT, "swa", node.swa, node.owner, "recover")

    def _new_leaf(self, parent: Node, key: np.ndarray, full: np.ndarray, live: bool) -> Node:
        node = Node(next(self._ids), key.copy(), parent, full.copy(),
                    self.alloc.full_to_swa[full].copy() if live else None)
        parent.children[self._ck(key)] = node
        self.nodes[node.id] = node
        self._stamp(node)
        self._emit(ADOPT, "full", node.full, node.owner, "insert")
        if live:
            self._swa_mru(node)
            self._emit(ADOPT, "swa", node.swa, node.owner, "insert")
        return node

    def _cap_for_swa_lock(self, leaf: Node) -> None:
        """A fresh live leaf longer than one page-aligned window is split so that the window's tail is a leaf
        of its own (``SWAComponent._maybe_split_leaf_for_swa_lock``): a lock then pins one window of SWA, and
        the older part (the new parent) can be tombstoned while the request runs."""
        tail = -(-self.window // self.p) * self.p
        if len(leaf.key) > tail:
            self._split(leaf, len(leaf.key) - tail)

    @staticmethod
    def insert_length(req: CachedRequest, length: int) -> int:
        """How much of ``length`` an insert of ``req`` takes: up to its SWA branching point while that lies
        past its protected prefix and within ``length`` (SWAComponent.prepare_for_caching_req), else all."""
        b = req.branching
        return b if b is not None and req.protected < b <= length else length

    def _insert_nothing(self, req: CachedRequest, at_lock: bool) -> Node:
        """An insert with nothing past the request's protected prefix. Ending at its lock (``at_lock``), it still
        walks its path and ends there (INSERT_END): the walked nodes stamped, root first, and the SWA window
        ending at the node most recent."""
        node = req.lock.node if req.lock is not None else self.root
        if at_lock and node is not self.root:
            for n in self._path(node):
                self._stamp(n)
            self._refresh_swa(node)
        return node

    def _insert(self, req: CachedRequest, length: int) -> Node:
        """``checkpoint_into_tree``: insert positions [0, length) page-aligned (up to the request's SWA
        branching point, :meth:`insert_length`, which the insert then clears), free the request's
        duplicates, re-point its row at the tree's ids, move its lock to the node the insert ended on."""
        p, s = self.p, req.slots
        capped = self.insert_length(req, length)
        if capped != length or req.branching == length:
            req.branching = None
        L = min(capped, s.length)
        L -= L % p
        prev, evicted = req.protected, s.swa_evicted
        if L <= prev:
            return self._insert_nothing(req, L == prev)
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
            self._stamp(child)             # _touch_node: the walked node, before a split makes it the child
            if k < len(child.key):
                child = self._split(child, k)
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
                    self.free_full_segment(dup[:gone], req.owner, "dedup")   # below the request's SWA floor
                    self.free_segment(dup[gone:], req.owner, "dedup")
            node, total = child, total + k
        if total < L:
            live = max(total, evicted)
            if live > total:
                node = self._new_leaf(node, key[total:min(live, L)], value[total:min(live, L)], live=False)
            if live < L:
                node = self._new_leaf(node, key[live:L], value[live:L], live=True)
                self._cap_for_swa_lock(node)
        if node is not self.root:
            self._refresh_swa(node)        # the insert's end: its SWA window most recent
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
            self.free_full_segment(s.full[lo:mid], req.owner, "release")
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

    # ------------------------------------------------------------------ report

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


__all__ = ["Node", "Lock", "CachedRequest", "MatchResult", "PrefixCache"]
