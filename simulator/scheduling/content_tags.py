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

    def __init__(self, room: int = 0) -> None:
        #: positions past each request's content a row also has (tags of its own): where an engine writes ahead of
        #: the tokens a request will have (EAGLE's drafts past its last one)
        self.room = room
        self.rows: list[np.ndarray] = []
        self._intern: dict[int, int] = {}
        self._owner: list[tuple[int, int]] = [(-1, -1)]        # tag -> (first rid, position); tag 0 is no one's
        self._laid = None               # (requests, their tag rows end to end, each row's start): the last batch's

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

    def fresh(self, rid: int, positions: np.ndarray) -> np.ndarray:
        """Tags of their own, one per position of request ``rid``, for content no workload token has (the K/V of a
        draft token the target rejected): a read that expects the position's content and meets one is stale."""
        first = len(self._owner)
        self._owner.extend((rid, int(p)) for p in positions)
        return np.arange(first, len(self._owner), dtype=np.int64)

    def row(self, index: int, specs) -> np.ndarray:
        """Workload request ``index``'s tag row, rows interned in workload order up to it: a content's tag is the
        same whoever writes it, and :meth:`owner_of` names the first request in that order that has it (a later
        turn's first forward may come first)."""
        rows = self.rows
        while len(rows) <= index:
            spec = specs[len(rows)]
            rows.append(self.tags_of(len(rows), spec, max(spec.total_len, 1) + self.room))
        return rows[index]

    def owner_of(self, tag: int) -> Owner:
        """The request and position that first had ``tag``; padding, empty and unknown tags by themselves."""
        if tag <= 0 or tag >= len(self._owner):
            return Owner(tag)
        rid, pos = self._owner[tag]
        return Owner(tag, request=rid, position=pos)

    def keys(self, requests: BatchRequests, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The read check's content keys (``batch.ContentKeys``): the tag of each (request row, position).

        One gather over the batch's tag rows laid end to end, made once per batch (every backend and layer kind of
        a step asks with the same requests), not a pass per request."""
        if self._laid is None or self._laid[0] is not requests:
            tag_rows = [self.rows[int(r)] for r in requests.rids.tolist()]
            lens = np.fromiter((t.shape[0] for t in tag_rows), dtype=np.int64, count=len(tag_rows))
            starts = np.zeros(len(tag_rows), dtype=np.int64)
            np.cumsum(lens[:-1], out=starts[1:])
            flat = np.concatenate(tag_rows) if tag_rows else np.zeros(0, dtype=np.int64)
            self._laid = (requests, flat, starts)
        _, flat, starts = self._laid
        return flat[starts[rows] + positions]
