"""What the schedulers whose frees run through a :class:`~simulator.scheduling.prefix_cache.PrefixCache`
(the radix scheduler, simulator/scheduling/sharing.py; the PD decode node, simulator/scheduling/pd_decode.py)
do with its slot events, a mixin placed before :class:`~simulator.scheduling.scheduler.Scheduler`.

* The cache's events reach the next batch's truth in order, before the batch is made: a ``free`` ends
  the slot's liveness (and an SWA free for eviction marks it evicted), a ``map`` changes the expected
  mapping; every event is counted by kind:pool:cause for the summary.
* Every event, and every allocation or free the scheduler makes itself, is kept in a log of
  (step, kind, pool, cause, owner, slots, peers): the first divergent slot's ownership history in the
  summary (:meth:`CacheLog.ownership_summary`; reports/ownership.py draws it).
* An over-free (the allocator's capacity assert ``available_size() <= size``, which kills SGLang's engine)
  ends the steps cleanly, recorded in ``stopped``, instead of raising.
"""
from __future__ import annotations

from collections import Counter
from typing import Optional

import numpy as np

from simulator.memory.allocator import OverFree
from simulator.memory.events import FREE, MAP
from simulator.scheduling.prefix_cache import PrefixCache

#: free causes that are SWA eviction (the slot's last owner was evicted, not finished); a free resolved at
#: a free group's flush (R7) carries its cause with "@flush"
EVICTION_CAUSES = ("out_of_window", "tombstone")


class CacheLog:
    """The event collection, the ownership log and the over-free stop of a scheduler with a prefix cache."""

    #: the most events an ownership history keeps (the first ones, and the last ones past the cap)
    OWNERSHIP_EVENTS = 400

    def _open_log(self, cache: PrefixCache) -> None:
        """Take ``cache``'s events from now on, with empty counts and log."""
        self.cache = cache
        self.counts: Counter = Counter()
        #: where the run ended early: the SWA or full allocator's capacity assert (SGLang's
        #: ``available_size() <= size``), which kills the engine; None when the run ran to its end
        self.stopped: Optional[dict] = None
        #: every slot event and allocation, in order: (step, kind, pool, cause, owner, slots, peers)
        self._log: list[tuple] = []

    def _collect_events(self) -> None:
        """The cache's events since the last call into the counts, the log and the pending truth."""
        for ev in self.cache.drain_events():
            self.counts[f"{ev.kind}:{ev.pool}:{ev.cause}"] += 1
            self._log.append((self._step, ev.kind, ev.pool, ev.cause, None if ev.owner is None else str(ev.owner),
                              ev.slots, ev.peers))
            if ev.kind == FREE:
                if ev.pool == "full":
                    self._freed_full.append(ev.slots)
                else:
                    self._freed_swa.append(ev.slots)
                    if ev.cause.split("@")[0] in EVICTION_CAUSES:
                        self._evicted_swa.append(ev.slots)
            elif ev.kind == MAP:
                self._mapping_changed.append(ev.slots)

    def _log_slots(self, kind: str, pool: str, cause: str, req, slots: np.ndarray) -> None:
        """A change the scheduler made to ``req``'s slots itself (no cache event), into the log."""
        self._log.append((self._step, kind, pool, cause, f"request:{req.rid}", slots, None))

    def _log_alloc(self, req, full: np.ndarray, swa: np.ndarray, cause: str) -> None:
        """``req``'s new full and SWA slots, into the log (copies: the rows change later)."""
        self._log_slots("alloc", "full", cause, req, full.copy())
        self._log_slots("alloc", "swa", cause, req, np.array(swa, np.int64))

    def _make_batch(self, step, mode, num_requests, tags, full, swa, per_request=1, graph_kind=None):
        self._collect_events()
        return super()._make_batch(step, mode, num_requests, tags, full, swa, per_request, graph_kind)

    def steps(self):
        """The plain scheduler's steps; an over-free ends them cleanly, recorded in :attr:`stopped` and the
        summary, instead of raising."""
        try:
            yield from super().steps()
        except OverFree as e:
            self._collect_events()
            self.stopped = {"step": self._step, "class": "over_free", "assert": "available_size() <= size",
                            "message": str(e)}

    def ownership(self, pool: str, slot: int) -> list[list]:
        """Every event that touched ``slot`` of ``pool`` in order, as [step, kind, cause, owner, peer]:
        ``alloc`` (given to a request), ``adopt`` (a tree node holds it), ``free`` (given up on behalf of
        the owner named), ``available`` (in the free list), ``lock`` / ``unlock`` (a request reads it),
        ``map`` (a full id now maps to it, or, for a full slot, to ``peer``)."""
        out: list[list] = []
        for step, kind, p, cause, owner, slots, peers in self._log:
            if kind == "map" and pool == "swa":
                # a full id re-pointed at this slot (a mapping cleared to 0 is no news for the sink)
                hit = np.flatnonzero(peers == slot) if peers is not None and slot != 0 else ()
                out += [[step, "map", cause, owner, int(slots[i])] for i in hit[:1]]
            elif p == pool and np.any(slots == slot):
                peer = int(peers[np.flatnonzero(slots == slot)[0]]) if peers is not None else None
                out.append([step, kind, cause, owner, peer])
        cap = self.OWNERSHIP_EVENTS
        return out if len(out) <= cap else out[:cap // 2] + out[-cap // 2:]

    def ownership_summary(self, findings: Optional[list]) -> dict:
        """``{"ownership": ...}``: the history of the first finding's slot (the first divergent slot), or {}."""
        first = next((f for f in findings or () if f.slot >= 0 and f.kind in ("full", "swa")), None)
        if first is None:
            return {}
        hist = self.ownership(first.kind, first.slot)
        return {"ownership": {"pool": first.kind, "slot": int(first.slot), "step": int(first.step),
                              "backend": first.backend, "class": first.cls, "message": first.message[:300],
                              "truncated": len(hist) == self.OWNERSHIP_EVENTS and len(self._log) > 0,
                              "events": hist}}
