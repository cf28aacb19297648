"""Slot events: the vocabulary in which the tree cache and the unified pool tell the oracle every change of slot ownership."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Optional
import numpy as np


@dataclass(frozen=True, slots=True)
class Owner:
    """Who holds a slot: a tree node or a request."""

    kind: str                 # "node" | "request"
    id: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}"


#: event kinds
ADOPT = "adopt"          # ``owner`` now holds ``slots`` (the K/V they hold is the owner's token content)


FREE = "free"            # ``slots`` given up on behalf of ``owner`` (whole pages; the slots may be someone else's)


AVAILABLE = "available"  # ``slots`` entered the free list (at the free, or at the end of a free group)


MAP = "map"              # full ``slots`` now map to ``peers`` (0: no SWA slot)


LOCK = "lock"            # request ``owner`` reads ``slots`` (tree-owned) until the matching UNLOCK


UNLOCK = "unlock"


@dataclass(frozen=True, slots=True)
class SlotEvent:
    """One ownership change the cache made; an oracle applies them in order.

    ``pool`` is "full" or "swa" (for MAP the slots are full ids and ``peers`` the SWA ids); ``slots``
    are slot ids (frees of pages list every slot of the page); ``cause`` names the operation: match /
    insert / split / dedup / recover / recover_locked / tombstone / evict_leaf / release /
    out_of_window / flush.
    """

    kind: str
    pool: str
    slots: np.ndarray
    owner: Optional[Owner] = None
    peers: Optional[np.ndarray] = None
    cause: str = ""
