"""The prefix cache's recency and tree eviction, a mixin of :class:`~simulator.scheduling.prefix_cache.PrefixCache`:
``unified_tree_core.py``'s access times, LRU lists and leaf eviction and ``SWAComponent.evict_component`` of SGLang
0.5.23 (read, not copied). Under memory pressure unlocked leaves go whole by the Full side's access time; SWA
alone is then taken by the SWA side's LRU list from nodes with live, unlocked SWA: a leaf whose Full is unlocked
goes whole, any other node becomes a tombstone (its full part kept, its SWA freed). The R3 and #38519 (cache
linker) switches change how the SWA is freed.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.scheduling.prefix_cache import Node


class TreeEviction:
    """Recency and LRU eviction over the tree's nodes (the root is never evicted)."""

    # Recency, as 0.5.23's UnifiedTreeCore keeps it: the Full side by a time per node (a node's own on creation
    # and when an insert walks it, ``_touch_node``; one time for the whole path of a match), the SWA side by an
    # LRU list that only a match's or an insert's end refreshes, over the node and its ancestors within one
    # window and a page (``reset_node_and_window_ancestors_mru``: ancestors outside the window stay evictable).

    def _stamp(self, node: Node) -> None:
        self._clock += 1
        node.last_access = self._clock

    def _touch(self, node: Node) -> None:
        """A match's end: the matched path one Full time; the SWA window ending at ``node`` most recent."""
        self._clock += 1
        cur = node
        while cur is not None:
            cur.last_access = self._clock
            cur = cur.parent
        self._refresh_swa(node)

    def _swa_mru(self, node: Node) -> None:
        self._swa_clock += 1
        node.swa_access = self._swa_clock

    def _refresh_swa(self, node: Node) -> None:
        """The node and its live ancestors within ``window + page`` tokens to the SWA list's front, the node
        first (deeper nodes more recent)."""
        got, covered, cur = [], 0, node
        while cur is not self.root and covered < self.window + self.p:
            if cur.swa is not None:
                got.append(cur)
            covered += len(cur.key)
            cur = cur.parent
        for n in reversed(got):
            self._swa_mru(n)

    def _recency_of_split(self, parent: Node, child: Node) -> None:
        """``_split_node``: the new parent stamped, then the child (newer); on the SWA list the parent goes right
        behind the child (``insert_after``)."""
        self._stamp(parent)
        self._stamp(child)
        if child.swa is not None:
            older = [n.swa_access for n in self.nodes.values()
                     if n.swa is not None and n is not child and n.swa_access < child.swa_access]
            parent.swa_access = (max(older, default=0.0) + child.swa_access) / 2

    def _leaf(self, node: Node) -> bool:
        return node is not self.root and not node.children

    def _evict_leaf(self, node: Node) -> None:
        if node.swa is not None or self.b.linker_frees_tombstones:
            self.free_swa_segment(node.full, node.owner, "evict_leaf")
        self.free_full_segment(node.full, node.owner, "evict_leaf")
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
            victim = min(cands, key=lambda n: (n.swa_access, n.id))        # the SWA list's LRU end
            freed_swa += len(victim.swa)
            if self._leaf(victim) and victim.full_lock == 0:
                freed_full += len(victim.full)
                self._evict_leaf(victim)
            else:
                self._tombstone(victim)
        return freed_full, freed_swa

    def evictable(self) -> tuple[int, int]:
        """Full tokens in unlocked nodes, SWA tokens in live unlocked nodes."""
        full = sum(len(n.full) for n in self.nodes.values() if n is not self.root and n.full_lock == 0)
        swa = sum(len(n.swa) for n in self.nodes.values()
                  if n is not self.root and n.swa is not None and n.swa_lock == 0)
        return full, swa

    def held(self) -> tuple[int, int]:
        """Full tokens in every node, SWA tokens in every live node (locked or not)."""
        full = sum(len(n.full) for n in self.nodes.values())
        swa = sum(len(n.swa) for n in self.nodes.values() if n.swa is not None)
        return full, swa
