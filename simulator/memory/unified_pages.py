"""The unified pool's page bookkeeping: one end of the byte buffer, and the virtual page ids.

:class:`BufferEnd` is one sub-pool of :class:`~simulator.memory.unified_pool.UnifiedPool`: its page tables, its
watermark, its holes and its compaction pass. It knows its peer only through the peer's frontier (``low_bytes`` /
``high_bytes``), so the two ends stay symmetric and the pool alone decides when each grows, frees or flushes.
:class:`VirtualPageIds` is the FULL side's FIFO of the virtual page ids the scheduler sees. The model they follow
is in unified_pool's docstring.
"""
from __future__ import annotations

from typing import Iterator, Optional

import numpy as np

from simulator.memory.allocator import OutOfSlots

#: the release's cap on the moves of one non-urgent flush (``SGLANG_LAZY_COMPACTION_MAX_MOVES_PER_CALL``)
MAX_MOVES_PER_FLUSH = 4096


class BufferEnd:
    """One sub-pool: an end of the buffer growing ``up`` (SWA) or ``down`` (FULL), its page tables, its
    watermark, its holes (the lazy free list, in list order) and its live page count."""

    def __init__(self, name: str, direction: str, token_bytes: int, page_size: int, budget: int, floor: int,
                 table_len: int):
        self.name, self.direction, self.page_size = name, direction, page_size
        self.token_bytes = token_bytes
        self.page_bytes = token_bytes * page_size
        self.max_slots = budget // token_bytes
        self.num_pages = self.max_slots // page_size
        min_slot = -(-floor // token_bytes)
        self.min_page = -(-min_slot // page_size)
        if self.num_pages <= self.min_page:
            raise ValueError(f"a budget of {budget} bytes leaves the {name} side no page past its sink floor")
        self.wm = self.min_page if direction == "up" else self.num_pages - 1
        self.v2p = np.full(table_len, -1, dtype=np.int64)      # the last entry: the -1 sentinel
        self.v2p[0] = 0
        self.p2v = np.full(self.num_pages + 1, -1, dtype=np.int64)
        self.p2v[0] = 0
        self.holes: list[int] = []
        self.live = 0

    # ---- extent
    def span(self) -> int:
        """Pages between the side's end and its watermark (live pages and holes)."""
        return self.wm - self.min_page if self.direction == "up" else self.num_pages - 1 - self.wm

    def index_room(self) -> int:
        return self.num_pages - self.min_page - self.span()

    def low_bytes(self) -> int:
        return self.min_page * self.page_bytes if self.direction == "up" else (self.wm + 1) * self.page_bytes

    def high_bytes(self) -> int:
        return self.wm * self.page_bytes if self.direction == "up" else self.num_pages * self.page_bytes

    def in_span(self) -> np.ndarray:
        if self.direction == "up":
            return np.arange(self.min_page, self.wm, dtype=np.int64)
        return np.arange(self.wm + 1, self.num_pages, dtype=np.int64)

    # ---- hand-out
    def extend_watermark(self, n: int, peer: "BufferEnd") -> bool:
        """Advance the watermark by n pages unless it leaves the index space or crosses the peer's frontier."""
        if self.direction == "up":
            new = self.wm + n
            if new > self.num_pages or new > peer.low_bytes() // self.page_bytes:
                return False
        else:
            new = self.wm - n
            if new < self.min_page - 1 or new + 1 < peer.high_bytes() // self.page_bytes:
                return False
        self.wm = new
        return True

    def take(self, n: int, peer: "BufferEnd") -> Optional[list[int]]:
        """n physical pages: new pages past the watermark (ascending) when there are no holes; else the holes
        nearest the end first, then new pages for what they lack (SWA ascending, FULL descending)."""
        if not self.holes:
            old = self.wm
            if not self.extend_watermark(n, peer):
                return None
            start = old if self.direction == "up" else old - n + 1
            return list(range(start, start + n))
        drain = min(n, len(self.holes))
        more = n - drain
        if more and not self.extend_watermark(more, peer):
            return None
        if drain == len(self.holes):
            taken, self.holes = self.holes, []
        else:
            self.holes.sort()
            if self.direction == "up":
                taken, self.holes = self.holes[:drain], self.holes[drain:]
            else:
                taken, self.holes = self.holes[len(self.holes) - drain:], self.holes[:len(self.holes) - drain]
        if self.direction == "up":
            return taken + list(range(self.wm - more, self.wm))
        return taken + list(range(self.wm + more, self.wm, -1))

    def available_pages(self, extra_gap_bytes: int, gap_bytes: int) -> int:
        """Pages this side alone could take now (``_available_tokens`` in pages)."""
        return min((gap_bytes + extra_gap_bytes) // self.page_bytes, self.index_room()) + len(self.holes)

    # ---- compaction
    def _absorb(self) -> list[int]:
        """Holes next to the watermark: the watermark retreats past them. Returns the interior holes, sorted."""
        holes = sorted(self.holes)
        if self.direction == "up":
            while holes and holes[-1] == self.wm - 1:
                holes.pop()
                self.wm -= 1
        else:
            k = 0
            while k < len(holes) and holes[k] == self.wm + 1 + k:
                k += 1
            holes = holes[k:]
            self.wm += k
        return holes

    def _survivors(self, holes: list[int]) -> Iterator[int]:
        """The span's live pages, farthest from the side's end first."""
        skip = set(holes)
        pages = range(self.wm - 1, self.min_page - 1, -1) if self.direction == "up" else \
            range(self.wm + 1, self.num_pages)
        return (p for p in pages if p not in skip)

    def flush(self, urgent: bool, write_pages) -> list[tuple[int, int]]:
        """One compaction pass (``_flush``); returns the (src, dst) page moves, already applied to the tables.
        ``write_pages()``: the in-flight forward's physical pages on this side (asked once, non-urgent only)."""
        holes = self._absorb()
        full_pack = urgent and bool(holes)
        dsts = holes if self.direction == "up" else holes[::-1]
        write_set: Optional[set] = set() if full_pack else None
        moves: list[tuple[int, int]] = []
        for src, dst in zip(self._survivors(holes), dsts):
            if write_set is None:
                write_set = write_pages()
            if src in write_set:
                break                                  # non-urgent: the in-flight window stops the walk
            if (src < dst) if self.direction == "up" else (src > dst):
                break                                  # crossed: the rest is packed
            moves.append((src, dst))
            if not urgent and len(moves) >= MAX_MOVES_PER_FLUSH:
                break
        for src, dst in moves:
            v = int(self.p2v[src])
            self.v2p[v] = dst
            self.p2v[dst] = v
            self.p2v[src] = -1
        if full_pack:
            self.wm += -len(holes) if self.direction == "up" else len(holes)
            self.holes = []
        else:
            k = len(moves)
            rest = holes[k:] if self.direction == "up" else holes[:len(holes) - k]
            self.holes = rest + [s for s, _ in moves]
        return moves


class VirtualPageIds:
    """The virtual page ids not in use, a FIFO: minted at the head, freed ids joining the tail in free order.

    The head advances instead of popping, so minting k ids is a slice; the list is cut back now and then,
    once the consumed head is both long and most of it."""

    def __init__(self, first: int, end: int):
        self._ids: list[int] = list(range(first, end))     # head first
        self._head = 0

    def free_count(self) -> int:
        return len(self._ids) - self._head

    def peek(self, k: int) -> np.ndarray:
        """The next k ids :meth:`mint` would hand out, without taking them (to check them first)."""
        return np.asarray(self._ids[self._head:self._head + k], dtype=np.int64)

    def mint(self, k: int) -> np.ndarray:
        """Take k ids from the head, or OutOfSlots."""
        if k > self.free_count():
            raise OutOfSlots(f"asked for {k} virtual pages, {self.free_count()} free")
        v = np.asarray(self._ids[self._head:self._head + k], dtype=np.int64)
        self._head += k
        if self._head > 4096 and self._head * 2 > len(self._ids):
            self._ids = self._ids[self._head:]
            self._head = 0
        return v

    def give_back(self, pages: np.ndarray) -> None:
        """Freed ids join the tail, in the order given."""
        self._ids.extend(int(v) for v in pages)
