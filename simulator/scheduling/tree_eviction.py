"""The prefix cache's tree eviction, a mixin of :class:`~simulator.scheduling.prefix_cache.PrefixCache`:
``unified_tree_core.py``'s leaf eviction and ``SWAComponent.evict_component`` of SGLang 0.5.23 (read, not
copied). Under memory pressure unlocked leaves go whole by LRU; SWA alone is then taken from nodes with
live, unlocked SWA: a leaf whose Full is unlocked goes whole, any other node becomes a tombstone (its
full part kept, its SWA freed). The R3 and #38519 (cache linker) switches change how the SWA is freed.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.scheduling.prefix_cache import Node


class TreeEviction:
    """LRU eviction over the tree's nodes (the root is never evicted)."""

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
