"""Tags of token content: the oracle's expected value of a slot when requests share KV.

Two requests writing the same content at the same position (a shared system prompt, a conversation's earlier turns)
write the same tag, and a request that matched a prefix reads the tag the prefix's first writer wrote. Content ids
(:meth:`~simulator.scenario.RequestSpec.tokens`) are interned into small tags, numbered as they are first seen;
each tag's owner is the request and position that first had it. Used by every scheduler whose requests share slots:
the model's radix scheduler and a release's own scheduler (engine_path).
"""
from __future__ import annotations

import numpy as np

from simulator.records import Owner
from simulator.scenario import RequestSpec
from simulator.scheduling.batch import BatchRequests


class ContentTags:
    """Interned content tags, a tag row per request id (``rows[rid][p]``: the tag of request rid's position p)."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self._intern: dict[int, int] = {}
        self._owner: list[tuple[int, int]] = [(-1, -1)]        # tag -> (first rid, position); tag 0 is no one's

    def tags_of(self, rid: int, spec: RequestSpec, total: int) -> np.ndarray:
        """The tags of request ``rid``'s positions [0, total): its content's, then (past its content, where the
        request has extra room) tags of its own."""
        ids = spec.tokens(0, spec.total_len).tolist()
        out = np.empty(total, dtype=np.int64)
        intern, owners = self._intern, self._owner
        for p, cid in enumerate(ids[:total]):
            t = intern.get(cid)
            if t is None:
                t = intern[cid] = len(owners)
                owners.append((rid, p))
            out[p] = t
        for p in range(len(ids), total):
            out[p] = len(owners)
            owners.append((rid, p))
        return out

    def owner_of(self, tag: int) -> Owner:
        """The request and position that first had ``tag``; padding, empty and unknown tags by themselves."""
        if tag <= 0 or tag >= len(self._owner):
            return Owner(tag)
        rid, pos = self._owner[tag]
        return Owner(tag, request=rid, position=pos)

    def keys(self, requests: BatchRequests, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The read check's content keys (``batch.ContentKeys``): the tag of each (request row, position)."""
        out = np.zeros(rows.shape[0], dtype=np.int64)
        for r in np.unique(rows).tolist():
            m = rows == r
            out[m] = self.rows[int(requests.rids[r])][positions[m]]
        return out
