"""The scheduler with the radix cache on (``engine.radix_cache = true``; docs/SHARING.md, issue 12 point 1), and
0.5.23's scheduler with it off: the same code over a disabled tree (``ReleaseBehaviour.disabled_tree``: nothing
matched or inserted, a finished request's KV freed whole, out-of-window SWA freed at extend).

:class:`SharingScheduler` is the plain :class:`~simulator.scheduling.scheduler.Scheduler` with a
:class:`~simulator.scheduling.prefix_cache.PrefixCache` between it and the allocator:

* admission matches the request's prompt (all but its last token) in the tree, takes the matched
  slots into the request's row and locks them; only the unmatched part is written. Who is admitted, and
  the first chunk, is 0.5.23's per-pass budget (:class:`~simulator.scheduling.prefill_budget.PrefillPass`:
  free plus evictable tokens, nothing reserved across passes); the tree evicts (unlocked leaves, then SWA
  tombstones) when a batch allocates. Before a decode batch 0.5.23's decode memory check, then its
  retraction (:meth:`SharingScheduler._grow_or_retract`);
* after each forward that extended a request which has not finished (a prefill chunk, or the whole
  prefill) its checkpoint, ``cache_unfinished`` (0.5.23's ``checkpoint_kv_cache``; up to the request's
  SWA branching point first: ``PrefixCache.insert_length``), at the finish ``cache_finished`` (all its
  K/V: prompt + output_len tokens, the scenario's output_len counting decodes), on retraction
  ``release``; request-side SWA eviction is ``free_out_of_window``;
* a conversation's turn k > 1 waits for turn k-1's finish plus its ``think_time``.

The oracle: a slot's expected tag is its token *content* (content ids interned into small tags, so
two requests writing the same content at the same position write the same tag, and a request that
matched a prefix reads the tag the prefix's writer wrote). Every :class:`~simulator.memory.events.SlotEvent`
reaches the step's truth in order: ``free`` ends the slot's liveness (whoever it was freed for: a
free of a slot someone still reads is what the read check then reports), ``map`` changes the
expected mapping (:class:`~simulator.scheduling.cache_log.CacheLog`, shared with the PD decode node);
the read check's content keys come from the content ids of each (request, position).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

import numpy as np

from simulator.memory.allocator import HybridAllocator, RequestSlots
from simulator.scheduling.prefill_budget import PrefillPass
from simulator.scheduling.batch import BatchRequests
from simulator.engine_model.sharing import FIXED, SharingBehaviour
from simulator.scheduling.cache_log import CacheLog
from simulator.scheduling.content_tags import ContentTags
from simulator.scheduling.prefix_cache import CachedRequest, PrefixCache
from simulator.records import Owner
from simulator.engine_model.release_model import ReleaseBehaviour, eviction_end
from simulator.scenario import RequestSpec, Scenario, ScenarioError
from simulator.scheduling.scheduler import Request, Scheduler

#: SGLANG_RETRACT_DECODE_STEPS (0.5.23's default): the decode steps per request a retraction makes room for
RETRACT_DECODE_STEPS = 20
#: ``WAITING_QUEUE_PREFIX_MATCH_MAX``: the waiting requests a prefix refresh matches at most
WAITING_TOUCH_MAX = 128


class SharingScheduler(CacheLog, Scheduler):
    def __init__(self, scenario: Scenario, allocator: HybridAllocator, requests: list[RequestSpec],
                 rng: np.random.Generator, pad_value: int = 0, pad_to_capture: bool = False,
                 release: Optional[ReleaseBehaviour] = None, sharing: Optional[SharingBehaviour] = None,
                 tree_disabled: bool = False):
        eng = scenario.engine
        if eng.speculative.enabled or eng.overlap:
            raise ScenarioError(f"{scenario.source}: engine.radix_cache is not modelled with speculative "
                                "decoding or the overlap scheduler yet")
        if not isinstance(allocator, HybridAllocator) and not getattr(allocator, "release_frees", False):
            raise ScenarioError(f"{scenario.source}: engine.radix_cache runs on the modelled allocator or on an "
                                "engine allocator that runs the release's free paths (engine_path.allocator)")
        # later turns wait for the previous turn: hold them back from the arrival queue
        first = [r for r in requests if r.turn <= 1]
        self._later = {(r.conversation, r.turn): r for r in requests if r.turn > 1}
        super().__init__(scenario, allocator, first, rng, pad_value=pad_value, pad_to_capture=pad_to_capture,
                         release=release)
        self.total_requests = len(requests)
        self._check_fits(list(self._later.values()))
        self.sharing = sharing if sharing is not None else FIXED
        if eng.cache_linker and not self.sharing.linker_frees_tombstones:
            # #38519's trigger: an external cache linker frees evicted leaves' SWA side, tombstones included
            self.sharing = replace(self.sharing, name=f"{self.sharing.name}+cache-linker", linker_frees_tombstones=True)
        self._open_log(PrefixCache(allocator, self.window, self.sharing, disabled=tree_disabled))
        self._ready: list[tuple[int, int, RequestSpec]] = []      # (step, order, spec): a turn that may arrive
        self._creq: dict[int, CachedRequest] = {}
        self._cached_len: dict[int, int] = {}
        self._content = ContentTags()
        self._waiting_touches = 0                                  # prefill passes with requests waiting
        self._tag_rows = self._content.rows                        # per rid: the tag of each position
        self._batch_rids: list[int] = []
        self._content_keys = self._content.keys
        #: prefix-hit tokens, for the summary (with the event counts: tombstones, recoveries, tree evictions)
        self.hit_tokens = 0

    # ------------------------------------------------------------------ tags

    def owner_of(self, tag: int) -> Owner:
        return self._content.owner_of(tag)

    def _batch_requests(self, tags: list) -> BatchRequests:
        rids = np.asarray(self._batch_rids, dtype=np.int64)
        self._batch_rids = []
        slots = tuple(self._slots_by_rid[r] for r in rids.tolist())
        n = np.fromiter((t.shape[0] for t in tags), dtype=np.int64, count=len(tags))
        seq = np.fromiter((s.length for s in slots), dtype=np.int64, count=len(slots))
        return BatchRequests(rids=rids, seq_lens=seq, extend_lens=n, slots=slots,
                             tag_bases=np.zeros(len(slots), dtype=np.int64))

    # ------------------------------------------------------------------ turns

    def done(self) -> bool:
        return super().done() and not self._ready and not self._later

    def _arrive_turns(self) -> None:
        if not self._ready:
            return
        self._ready.sort(key=lambda x: (x[0], x[1]))
        while self._ready and self._ready[0][0] <= self._step:
            self.waiting.append(self._ready.pop(0)[2])

    def _turn_finished(self, spec: RequestSpec) -> None:
        nxt = self._later.pop((spec.conversation, spec.turn + 1), None) if spec.conversation else None
        if nxt is not None:
            at = max(nxt.arrival_step, self._step + nxt.think_time)
            self._ready.append((at, nxt.uid, nxt))

    # ------------------------------------------------------------------ admission and release

    def _short(self, full_need: int, swa_need: int) -> tuple[int, int]:
        """How many full / SWA slots an admission reserving ``full_need`` / ``swa_need`` is short of (> 0)."""
        tf, ts = self.cache.held()
        return (self._full_reserved + tf + full_need - self.alloc.full_size,
                self._swa_reserved + ts + swa_need - self.alloc.swa_size)

    def _fit(self, creq: CachedRequest, matched: int, total: int,
             prefill_len: int) -> Optional[tuple[int, int, int]]:
        """The matched length and the full / SWA reservations of an admission whose match is ``matched``,
        after evicting the tree for room; None (the match's lock undone) when it does not fit."""
        need = (total if self.reserve_whole else prefill_len) - matched
        full_need, swa_need = self._pages(need) * self.page, self._swa_need(need)
        df, ds = self._short(full_need, swa_need)
        if df <= 0 and ds <= 0:
            return matched, full_need, swa_need
        self.cache.evict(full_tokens=max(df, 0), swa_tokens=max(ds, 0))
        self.counts["evict_calls"] += 1
        df, ds = self._short(full_need, swa_need)
        if df <= 0 and ds <= 0:
            return matched, full_need, swa_need
        self.cache.release(creq)     # undo the match's lock: nothing of the request's own is held
        if matched == 0 or self.running:
            return None
        # nothing runs: the matched path (locked by this admission only) may be what does not fit
        # beside the request's own need; admit it computing everything, after evicting the tree
        self.cache.admit(creq, 0)
        need = total if self.reserve_whole else prefill_len
        full_need, swa_need = self._pages(need) * self.page, self._swa_need(need)
        df, ds = self._short(full_need, swa_need)
        self.cache.evict(full_tokens=max(df, 0), swa_tokens=max(ds, 0))
        df, ds = self._short(full_need, swa_need)
        if df > 0 or ds > 0:
            self.cache.release(creq)
            return None
        self.counts["admit_unmatched"] += 1
        return 0, full_need, swa_need

    def _try_admit(self, item) -> Optional[Request]:
        if len(self.running) >= self.sc.engine.max_running_requests:
            return None
        retracted = item if isinstance(item, Request) else None
        spec = item.spec if retracted is not None else item
        total = spec.prompt_len + spec.output_len + self._extra
        prefill_len = spec.prompt_len if retracted is None else retracted.prefill_len
        rid = self._next_rid if retracted is None else retracted.rid
        slots = RequestSlots(max(total, 1))
        tag_row = self._content.tags_of(rid, spec, max(total, 1)) if retracted is None else self._tag_rows[rid]
        creq = CachedRequest(rid, slots, spec.tokens(0, spec.total_len))
        matched = self.cache.admit(creq, max(prefill_len - 1, 0)).length
        max_new = spec.output_len + 1 if retracted is None else spec.output_len - retracted.decoded
        if self.cache.disabled:         # add_one_req_ignore_eos; its charge is the whole max_new_tokens
            first = self._pass.admit_ignore_eos(self, prefill_len, max_new)
            charged_new = spec.output_len + 1
        else:
            first = self._pass.admit(self, matched, prefill_len - matched, max_new)
            charged_new = max_new
        if first:
            need = (total if self.reserve_whole else prefill_len) - matched
            fit = matched, self._pages(need) * self.page, self._swa_need(need)
        elif self.running or self._pass.admitted:
            self.cache.release(creq)     # undo the match's lock: nothing of the request's own is held
            return None
        else:                            # nothing runs: the model's fallback makes room (the release would wait)
            fit = self._fit(creq, matched, total, prefill_len)
            if fit is None:
                return None
            first = min(prefill_len - fit[0], self._pass.chunk)
        matched, full_need, swa_need = fit
        self._pass.charge(first, charged_new if matched + first >= prefill_len else 0)
        self._first_chunk = first
        self._full_reserved += full_need
        self._swa_reserved += swa_need
        self.hit_tokens += matched
        self._creq[rid] = creq
        self._cached_len[rid] = matched
        if retracted is not None:
            retracted.slots = slots
            retracted.full_reserve, retracted.swa_reserve = full_need, swa_need
            retracted.prefilled = matched
            self._slots_by_rid[rid] = slots
            return retracted
        req = Request(rid=rid, spec=spec, slots=slots, tag_base=0, swa_reserve=swa_need, full_reserve=full_need,
                      lag=self.overlap, prefilled=matched)
        self._tag_rows.append(tag_row)
        self._tag_bases.append(0)
        self._slots_by_rid.append(slots)
        self._next_rid += 1
        return req

    def _release(self, req: Request, kind: str = "free") -> None:
        creq = self._creq.pop(req.rid)
        if self.cache.disabled:
            # release_kv_cache over a disabled tree: the request's whole row in one free (free_kv_row_segments),
            # the plain scheduler's
            super()._release(req, kind)
            if kind == "free":
                self._turn_finished(req.spec)
            return
        if kind == "free":
            kv_len = min(req.slots.length, req.spec.prompt_len + req.spec.output_len)
            self.cache.cache_finished(creq, kv_len)
            self.finished_count += 1
            self._turn_finished(req.spec)
        else:
            self.cache.release(creq)
        self._full_reserved -= req.full_reserve
        self._swa_reserved -= req.swa_reserve

    def _retract(self, req: Request) -> None:
        """0.5.23's retraction (``release_req``: its K/V freed, nothing inserted), then the queue's tail
        (``_add_request_to_queue``). Its prefill again covers the prompt and every sampled token, the last one
        included (whose K/V its next decode would have written): one position more, one decode less."""
        super()._retract(req)
        self._cached_len.pop(req.rid, None)
        self.waiting.remove(req)
        self.waiting.append(req)
        req.prefill_len += 1
        req.decoded += 1

    def _decode_fits(self, decoding: list[Request]) -> bool:
        """``check_decode_mem``: the next decode's new pages (one for each request whose length ends a page),
        after the tree evicts for the shortfall, fit both pools."""
        need = sum(1 for r in decoding if r.slots.length % self.page == 0) * self.page
        self._evict_to_free(need)
        return need <= self.alloc.full_free and need <= self.alloc.swa_free

    def _mixed_decode(self, decode_part: list[Request]) -> list[Request]:
        """A MIXED batch's running requests decode only where the room is left once the prefill is allocated;
        else they sit this forward out (0.5.23: no retraction for a mixed step)."""
        return decode_part if not decode_part or self._decode_fits(decode_part) else []

    def _grow_or_retract(self, decoding: list[Request]) -> list[Request]:
        """0.5.23's ``check_decode_mem`` before a decode batch (:meth:`_decode_fits`); while it fails,
        ``retract_decode`` retracts the request it keeps least (the fewest outputs, then the longest
        prompt, then the last in batch order), always keeping one."""
        if self._decode_fits(decoding) or len(decoding) <= 1:
            return decoding
        # the order it keeps them in, which the running batch then has (a stable sort: ties keep batch order)
        decoding = sorted(decoding, key=lambda r: (r.decoded, -r.spec.prompt_len), reverse=True)
        while True:
            self._retract(decoding.pop())
            # release_req uses the room at once: the tree evicts for the requests left, RETRACT_DECODE_STEPS
            # decodes each (evict_from_tree_cache)
            self._make_room([], [], len(decoding) * RETRACT_DECODE_STEPS)
            if self._decode_fits(decoding) or len(decoding) <= 1:
                break
        kept = {id(r) for r in decoding}
        self.running = decoding + [r for r in self.running if id(r) not in kept]
        return decoding

    # ------------------------------------------------------------------ steps

    def _schedule(self):
        self._arrive_turns()
        # the previous forward's result (process_batch_result_prefill): one free group over its requests
        # in batch order, a mixed batch's extend requests first (merge_batch): each checkpoint of a request
        # whose prefill completed (its out-of-window SWA freed, then its KV so far inserted), then the finishes;
        # the request still prefilled in chunks is checkpointed after, outside a free group, as the next batch
        # is made (get_next_batch_to_run -> stash_chunked_request)
        due = [r for r in self.running if not r.finished and r.prefilled > self._cached_len.get(r.rid, 0)]
        with self.alloc.free_group(self._grouped):
            for r in due:
                if r.prefilled >= r.prefill_len:
                    self._checkpoint(r)
            self._release_finished()
        for r in due:
            if r.prefilled < r.prefill_len:
                self._checkpoint(r)
        yield from super()._schedule()

    def _take_prefill(self, chunked: list[Request], decoding: list[Request]) -> list[tuple[Request, int]]:
        """The batch's prefill chunks as 0.5.23's ``PrefillAdder`` sizes them with the radix cache on
        (:class:`~simulator.scheduling.prefill_budget.PrefillPass`): the request prefilled in chunks goes on
        first, then the waiting queue's head is admitted while the pass's budget lasts."""
        budget = self._pass = PrefillPass.start(self, decoding)
        if self.waiting and (chunked or len(self.running) < self.sc.engine.max_running_requests):
            self._touch_waiting()           # calc_priority, before the pass admits
        prefill: list[tuple[Request, int]] = []
        for r in chunked:
            left = r.prefill_len - r.prefilled
            take = budget.continuing_chunk(self, left)
            if take > 0:
                budget.charge(take, r.spec.output_len + 1 if take == left else 0)
                prefill.append((r, take))
        while self.waiting and budget.open(self):
            req = self._admit_head(decoding)
            if req is None:
                break
            prefill.append((req, self._first_chunk))
        return prefill

    def _touch_waiting(self) -> None:
        """``_touch_waiting_prefixes``: every ``waiting_prefix_refresh_interval``-th pass (the first included) the
        waiting requests' prefixes (prompt and decoded tokens), at most 128, the queue's head last, are matched:
        the matched paths' recency refreshed, partial nodes split, nothing locked."""
        every = self.cache.b.waiting_prefix_refresh_interval
        if not every:
            return
        calls, self._waiting_touches = self._waiting_touches, self._waiting_touches + 1
        if calls % every:
            return
        for item in reversed(list(self.waiting)[:WAITING_TOUCH_MAX]):
            spec = item.spec if isinstance(item, Request) else item
            n = item.prefill_len if isinstance(item, Request) else spec.prompt_len
            self.cache.match_prefix(spec.tokens(0, n))

    def _checkpoint(self, r: Request) -> None:
        """``checkpoint_into_tree`` of an unfinished request: ``free_out_of_window_slots(req, key - 1)``
        (SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS, on by default), then the insert. A key cut at the
        request's SWA branching point frees again after the insert, up to the forward's whole key
        (SWAComponent.cleanup_after_caching_req), the branch now the tree's."""
        creq, L = self._creq[r.rid], r.slots.length
        if self.cache.disabled:             # checkpoint_into_tree returns at once: nothing freed, nothing inserted
            self._cached_len[r.rid] = r.prefilled
            return
        margin = -(-max(self.window, self.page) // self.page) * self.page     # ceil_align(max(window, page))
        key = self.cache.insert_length(creq, L)
        branched = creq.branching is not None and key == creq.branching
        if key > 0:
            self.cache.free_out_of_window(creq, max(key - 1 - margin, 0))
        self.cache.cache_unfinished(creq, L)
        if branched and L > 0:
            self.cache.free_out_of_window(creq, max(L - 1 - margin, 0))
        self._cached_len[r.rid] = r.prefilled

    def _evict_extend(self, req: Request) -> None:
        """0.5.23 frees no out-of-window SWA at extend when the cache shares prefixes (prepare_for_extend's
        ``not supports_prefix_sharing()`` gate): the checkpoint does (:meth:`_checkpoint`); over a disabled
        tree the extend does, as the plain scheduler's."""
        if self.cache.disabled:
            super()._evict_extend(req)

    def _lazy_evict(self, req: Request, prefix_len: int) -> None:
        if self.cache.disabled:             # no tree: the plain scheduler's (an engine allocator's rule included)
            super()._lazy_evict(req, prefix_len)
            return
        end = eviction_end(prefix_len, self.window, self.page)
        self.cache.free_out_of_window(self._creq[req.rid], end)

    def _make_room(self, prefill: list, decoding: list[Request], tokens: int = 0) -> None:
        """``evict_from_tree_cache`` before a batch's allocation: the tree evicts for each pool's shortfall
        against the allocation's demand, ``tokens`` or that of ``alloc_for_extend`` (the new tokens, on paged
        pools a page per request more) and ``alloc_for_decode`` (a token per request, on paged pools a page)."""
        if prefill:
            tokens += sum(take for _, take in prefill) + (len(prefill) * self.page if self.page > 1 else 0)
        tokens += len(decoding) * self.page
        if self._evict_to_free(tokens):
            self.counts["evict_calls:alloc"] += 1

    def _evict_to_free(self, tokens: int) -> bool:
        """``evict_to_free_tokens``: the tree evicts for each pool's shortfall against ``tokens`` free slots
        (unlocked leaves, then SWA tombstones); whether either pool was short."""
        short_full, short_swa = tokens - self.alloc.full_free, tokens - self.alloc.swa_free
        if short_full <= 0 and short_swa <= 0:
            return False
        self.cache.evict(full_tokens=max(short_full, 0), swa_tokens=max(short_swa, 0))
        return True

    def _write_tokens(self, req: Request, n: int, tags, full, swa) -> None:
        s = req.slots
        start = s.length
        # alloc_token_slots: the tree evicts for this request's pages before allocating
        if self._evict_to_free(self.alloc.pages_needed(s, n) * self.page):
            self.counts["evict_calls:alloc"] += 1
        new_full = self._extend(s, n)
        self._collect_events()          # what the tree did before this allocation comes first in the log
        self._log_alloc(req, new_full, s.swa[start:start + n], "alloc")
        tags.append(self._tag_rows[req.rid][start:start + n].copy())
        full.append(new_full)
        swa.append(s.swa[start:start + n].copy())
        self._batch_rids.append(req.rid)

    def _extend(self, s: RequestSlots, n: int) -> np.ndarray:
        """``alloc.extend(s, n)``, except where the request's last token, in a page with room left, has SWA slot 0:
        the sink page, which 0.5.23's unfiltered SWA free (R8, #38519's trigger) put in the free list and this
        request was given. The release continues the page from ``swa_last_loc = full_to_swa[last_loc]``, 0 there,
        so the next tokens' SWA slots are the sink page's 1, 2, ... (``alloc_extend`` / ``alloc_decode``): their
        reads are the read check's (the sink is no token's), and the run goes on; the modelled allocator, whose 0
        means no SWA slot, would assert "the SWA page of a request's last token was evicted" instead. (The
        release's own allocator, engine_path, does its own arithmetic.)"""
        start = s.length
        room = min(n, (-start) % self.page)
        if not room or not isinstance(self.alloc, HybridAllocator) or s.swa[start - 1] != 0 or \
                start + n > s.capacity:
            return self.alloc.extend(s, n)
        end = start + room
        s.full[start:end] = s.full[start - 1] + np.arange(1, room + 1, dtype=np.int64)
        s.swa[start:end] = np.arange(1, room + 1, dtype=np.int64)
        s.length = end
        self.alloc.full_to_swa[s.full[start:end]] = s.swa[start:end]
        self.counts["extend:sink_page"] += 1
        return np.concatenate([s.full[start:end], self.alloc.extend(s, n - room)])

    def summary(self, findings: Optional[list] = None) -> dict:
        """What the summary's ``radix`` entry holds: prefix-hit tokens, SWA tombstones made, recoveries
        over a tombstone, tree leaves evicted, every event count by kind:cause, where the run stopped
        (``stopped``, an over-free) and, given the run's findings, the ``ownership`` history of the first
        finding's slot (the first divergent slot): reports/ownership.py draws it."""
        c = self.counts
        out = {} if self.stopped is None else {"stopped": dict(self.stopped)}
        out.update(self.ownership_summary(findings))
        return {**out, "hit_tokens": self.hit_tokens,
                "tombstones": c["free:swa:tombstone"] + c["free:swa:tombstone@flush"],
                "recoveries": c["adopt:swa:recover"] + c["adopt:swa:recover_locked"],
                "evicted_leaves": c["free:full:evict_leaf"],
                "events": dict(sorted(c.items()))}
