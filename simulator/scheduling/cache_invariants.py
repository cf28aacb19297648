"""The prefix cache's ownership invariants, a mixin of :class:`~simulator.scheduling.prefix_cache.PrefixCache`:
what tests and fuzzing assert after each operation over the tree, its requests and the allocator together
(docs/SHARING.md). They read the structures, never the events (:class:`~simulator.scheduling.ownership_ledger.
OwnershipLedger` is the events' view).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simulator.memory.events import Owner

if TYPE_CHECKING:
    from simulator.scheduling.prefix_cache import CachedRequest


class InvariantChecks:
    """``check_invariants`` and its three parts: owners, free lists, locks."""

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
