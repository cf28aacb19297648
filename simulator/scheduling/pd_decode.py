"""A PD-disaggregated decode node (``engine.pd_decode = true``): the state that had A1 and A2 (docs/CORPUS.md).

A prefill node computes each request's prompt and transfers its KV; the decode node pre-allocates the
request (``alloc_extend_swa_tail``: full slots for the whole prompt, SWA slots for the window's pages
only, ``swa_tail_len = seq_len - page_floor(max(seq_len - window, 0))``), receives the KV and decodes. Read
in the 0.5.14 release (the first one cached here; both fixes are in it, the paths around them are the
ones of their time): disaggregation/decode.py (``_swa_tail_len``, the pre-allocation, the SWA payload
``translate_loc_from_full_to_swa`` of the window only, ``swa_evicted_seqlen = fill_len - tail``),
mem_cache/chunk_cache.py (the decode node's chunk cache: a finish frees the row ``[0, committed)`` with
``free()``), mem_cache/common.py ``release_kv_cache`` (speculative over-allocation freed from
``ceil_align(committed, page)``) and speculative/eagle_info_v2.py (``kv_allocated_len`` runs ahead of
``kv_committed_len``: over-allocated slots stay allocated and mapped until the finish).

:class:`PDDecodeScheduler` is the plain scheduler with three changes:

* admission is the pre-allocation plus the transfer: the prompt's slots come from
  :meth:`~simulator.scheduling.prefix_cache.PrefixCache.extend_swa_tail` (A2's switch decides whether the non-tail full
  ids' mapping is cleared) and their ownership reaches the oracle as the next step's ``Transfer``, whose
  rows the run writes into the pools outside the backends (``Run.write_transfer``: no backend write, nothing
  counted or write-checked); no prefill forward runs. At page size 1 there is no SWA-tail allocation (the
  release's ``_uses_swa_tail_prealloc`` needs ``page_size > 1``; ``alloc_for_decode_prealloc`` calls
  ``alloc(n)``): both pools are allocated for the whole prompt, the transfer fills the window's SWA rows
  (``_swa_payload``: from ``max(0, seq_len - window)``) and the eviction cadence frees the rest; A1 and A2
  cannot arise there;
* a speculative round's rejected slots on the page the request keeps stay mapped (over-allocation, as
  ``kv_allocated_len``); whole pages past it go back as before;
* a finish or retraction frees the row ``[0, length)`` through the token-level
  :meth:`~simulator.scheduling.prefix_cache.PrefixCache.free` (``free_swa`` then the full pages: A1's switch decides
  whether the partial last page's other ids are cleared); the over-allocated ids past ``length`` on that
  page are not passed (they are freed with the page; ``release_kv_cache`` starts at ``ceil_align``). Under a
  release with ``pd_row_free`` (0.5.23, read in its disaggregation/decode.py and mem_cache/common.py: the
  finish is ``release_kv_cache`` -> ``free_kv_row_segments``) the row is freed by segments instead, through the
  allocator's row ``free`` (:meth:`PDDecodeScheduler._free_row`): the live pages' mapping is cleared whole,
  both fixes hold, and on an engine's allocator (engine_path) both the pre-allocation and this free are the
  release's own calls.

A1 leaves the over-allocated ids of a finished request's last page mapped to the SWA page just freed (a
stale mapping on a free full page); A2 keeps such entries on a recycled page's non-tail ids, and that
request's finish frees the SWA pages they name a second time (pages free again by then, or another request's).
The free lists take them unchecked (SGLang's ``free_page_ids``): a page held twice, or the capacity
assert (``available_size() <= size``), which ends the run (``stopped`` in the summary's ``radix`` entry, as
the radix cache's).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

import numpy as np

from simulator.memory.allocator import HybridAllocator
from simulator.scheduling.batch import Transfer
from simulator.engine_model.sharing import FIXED, SharingBehaviour
from simulator.scheduling.cache_log import CacheLog
from simulator.scheduling.prefix_cache import CachedRequest, PrefixCache
from simulator.engine_model.release_model import MID_2026, ReleaseBehaviour
from simulator.scenario import RequestSpec, Scenario, ScenarioError
from simulator.scheduling.scheduler import Request, Scheduler


def swa_tail_len(seq_len: int, window: int, page: int) -> int:
    """``_swa_tail_len``: the positions from the page holding the window's first token to the end."""
    start = max(0, seq_len - window)
    return seq_len - (start - start % page)


class PDDecodeScheduler(CacheLog, Scheduler):
    def __init__(self, scenario: Scenario, allocator: HybridAllocator, requests: list[RequestSpec],
                 rng: np.random.Generator, pad_value: int = 0, pad_to_capture: bool = False,
                 release: Optional[ReleaseBehaviour] = None, sharing: Optional[SharingBehaviour] = None):
        rel = release if release is not None else MID_2026
        #: the finish frees the kv row by segments (0.5.23's release_kv_cache), not with the token free()
        #: whose paths carry the A1 / A2 switches (the mid-2026 node's)
        self.row_free = rel.pd_row_free
        if not self.row_free and not isinstance(allocator, HybridAllocator):
            raise ScenarioError(f"{scenario.source}: engine.pd_decode on an engine's allocator (--engine) under "
                                f"release behaviour {rel.name}: that decode node's free paths (the A1 / A2 "
                                "switches) are the model's only; the engine runs a release modelled with the row "
                                "free (pd_row_free: sglang-0.5.23)")
        super().__init__(scenario, allocator, requests, rng, pad_value=pad_value, pad_to_capture=pad_to_capture,
                         release=rel)
        self.sharing = sharing if sharing is not None else FIXED
        #: the free paths and SWA-tail allocation of the switches (the tree is not used: a chunk cache); its
        #: events and this node's own allocations and frees are logged as the radix scheduler's
        self._open_log(PrefixCache(allocator, self.window, self.sharing))
        self._creq: dict[int, CachedRequest] = {}
        self._transfer: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    # ------------------------------------------------------------------ admission: pre-allocation + transfer

    def _try_admit(self, item) -> Optional[Request]:
        if isinstance(item, Request):
            raise RuntimeError("a decode node re-admits no retracted request (reserve = \"whole\")")
        req = super()._try_admit(item)
        if req is None:
            return None
        n = req.spec.prompt_len
        tail = swa_tail_len(n, self.sc.model.window, self.page)
        creq = CachedRequest(req.rid, req.slots, np.zeros(0, np.int64))
        self._creq[req.rid] = creq
        s = req.slots
        if self.page > 1:
            full = self.cache.extend_swa_tail(creq, n, tail)
        else:
            # page 1: no SWA-tail pre-allocation (the release's _uses_swa_tail_prealloc needs page_size > 1):
            # both pools for the whole prompt; the transfer fills the window's SWA rows only, eviction the rest
            full = self.alloc.extend(s, n)
        tags = np.arange(req.tag_base, req.tag_base + n, dtype=np.int64)
        self._transfer.append((full, tags, s.swa[n - tail:n].copy(), tags[n - tail:]))
        self._log_alloc(req, full, s.swa[n - tail:n], "transfer")
        self._mapping_changed.append(full)
        self._note("alloc", req, full)
        req.prefilled = req.prefill_len
        self.counts["transfers"] += 1
        self.counts["tail_tokens"] += tail
        self.counts["non_tail_tokens"] += n - tail
        return req

    def _schedule(self):
        """The finishes (one free group), then the admissions (each a transfer, no forward), then the plain
        scheduler's decision over an empty queue: its prefill list stays empty, so the step is a decode or a
        speculative round."""
        with self.alloc.free_group(self._grouped):
            self._release_finished()
        while self.waiting:
            req = self._try_admit(self.waiting[0])
            if req is None:
                break
            self.waiting.popleft()
            self.running.append(req)
        queue, self.waiting = self.waiting, type(self.waiting)()
        try:
            yield from super()._schedule()
        finally:
            self.waiting = queue

    # ------------------------------------------------------------------ frees

    def _release(self, req: Request, kind: str = "free") -> None:
        """A finish or retraction. Mid-2026 (the A1 / A2 state): the chunk cache's
        ``free(req_to_token[0:committed])`` (SWA through the mapping, then the full pages); the over-allocated
        ids past it on the last page go with that page, unpassed. A release with ``pd_row_free`` (0.5.23):
        :meth:`_free_row`."""
        s = req.slots
        creq = self._creq.pop(req.rid)
        full = s.full[:s.length].copy()
        if self.row_free:
            self._free_row(req)
        else:
            self.cache.free(full, creq.owner, "release")
            self._collect_events()
            s.full[:s.length] = 0
            s.swa[:s.length] = 0
            s.length = s.swa_evicted = 0
        self._note(kind, req, full)
        self._full_reserved -= req.full_reserve
        self._swa_reserved -= req.swa_reserve
        if kind == "free":
            self.finished_count += 1

    def _free_row(self, req: Request) -> None:
        """0.5.23's ``release_kv_cache`` on the decode node: the row ``[0, committed)`` by segments
        (``free_kv_row_segments``: the evicted prefix full side only, the rest ``free_segments``, whose SWA
        half clears the mapping of whole pages: the last page's over-allocated ids too), then
        ``[ceil_align(committed), allocated)`` (empty here: whole pages past the kept one went back at each
        round). Through the allocator's ``free`` (the model's row free, or the release's)."""
        s, p = req.slots, self.page
        n = s.length
        if n == 0:
            return
        offs = np.arange(p, dtype=np.int64)
        pages = (s.full[0:n:p] // p)[:, None] * p + offs
        lo = s.swa_evicted - s.swa_evicted % p
        live = s.swa[lo:n:p]
        swa_pages = ((live[live > 0] // p)[:, None] * p + offs).ravel()
        rows = pages.ravel()
        self._log_slots("free", "full", "release", req, rows.copy())
        self._log_slots("free", "swa", "release", req, swa_pages)
        self._freed_full.append(rows.copy())
        self._freed_swa.append(swa_pages)
        self._mapping_changed.append(rows.copy())
        self.counts["free:full:release"] += 1
        self.counts["free:swa:release"] += 1
        self.alloc.free(s)

    def _give_back(self, req: Request, length: int) -> None:
        """Rejected speculative slots: whole pages past the kept one go back (as the plain scheduler's); the
        kept page's rejected ids stay mapped (over-allocation, ``kv_allocated_len``)."""
        s = req.slots
        kept = s.kept_end(length, self.page)
        if kept is None:
            return
        hi = min(kept, s.length)
        ids, peers = s.full[length:hi].copy(), s.swa[length:hi].copy()
        if hi < s.length:      # whole pages past the kept one: back in the free lists
            self._log_slots("free", "full", "reject", req, s.full[hi:s.length].copy())
            self._log_slots("free", "swa", "reject", req, s.swa[hi:s.length].copy())
        super()._give_back(req, length)
        self.alloc.set_mapping(ids, peers)
        self.counts["overallocated_kept"] += int(ids.size)

    def _write_tokens(self, req: Request, n: int, tags, full, swa) -> None:
        super()._write_tokens(req, n, tags, full, swa)
        self._log_alloc(req, full[-1], swa[-1], "alloc")

    # ------------------------------------------------------------------ batches and the run

    def _make_batch(self, step, mode, num_requests, tags, full, swa, per_request=1, graph_kind=None):
        """The batch (the cache's events collected first, :class:`~simulator.scheduling.cache_log.CacheLog`),
        with the transfers since the previous batch in its truth."""
        tr = self._transfer
        batch, truth = super()._make_batch(step, mode, num_requests, tags, full, swa, per_request, graph_kind)
        if tr:
            self._transfer = []
            cat = [np.concatenate([t[i] for t in tr]) for i in range(4)]
            truth = replace(truth, transferred=Transfer(*cat))
        return batch, truth

    def stale_mappings(self) -> int:
        """Full ids on free full pages whose mapping is not 0 (the entries A1 leaves, A2 may keep)."""
        free_full, _ = self.alloc.free_pages()
        if not free_full.size:
            return 0
        ids = (np.unique(free_full)[:, None] * self.page + np.arange(self.page)).ravel()
        return int(np.count_nonzero(self.alloc.full_to_swa[ids]))

    def summary(self, findings: Optional[list] = None) -> dict:
        """The summary's ``radix`` entry for a decode node: where the run stopped (an over-free), the
        transfers, the over-allocated ids kept, the stale mappings on free full pages at the end, and every
        free-path event count by kind:pool:cause."""
        c = self.counts
        out = {} if self.stopped is None else {"stopped": dict(self.stopped)}
        out.update(self.ownership_summary(findings))
        return {**out, "pd_decode": {"transfers": c["transfers"], "tail_tokens": c["tail_tokens"],
                                     "non_tail_tokens": c["non_tail_tokens"],
                                     "overallocated_kept": c["overallocated_kept"],
                                     "stale_mappings_at_end": self.stale_mappings()},
                "hit_tokens": 0, "tombstones": 0, "recoveries": 0, "evicted_leaves": 0,
                "events": {k: v for k, v in sorted(c.items()) if ":" in k}}
