"""A reference consumer of the prefix cache's :class:`~simulator.memory.events.SlotEvent` stream: who holds
and who reads each slot, as the events alone say (docs/SHARING.md). Tests check it against the cache's
own structures; an oracle needs no more than it.
"""
from __future__ import annotations

import numpy as np

from simulator.memory.events import ADOPT, FREE, LOCK, UNLOCK, Owner, SlotEvent


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
