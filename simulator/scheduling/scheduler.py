"""Continuous batching with chunked prefill, SWA eviction, DP-attention and CUDA-graph padding.

The policy is SGLang's in outline (its mid-2026 scheduler; 0.5.23's changes are the release model's,
docs/RELEASE_MODEL.md): prefill first; a prefill batch
takes up to ``chunked_prefill_size`` prompt tokens, finishing an in-progress chunked request before
admitting new ones; with ``mixed_chunk`` the running requests' decode tokens ride along (MIXED);
otherwise every running request decodes one token. Admission reserves each request's full-pool need
and a bound on its SWA-pool need, so allocation never fails mid-request.

Per step it yields a :class:`ForwardBatch` (what backends see) and a :class:`BatchTruth` (what the
oracle knows). Padding is applied as the engine does: DP-attention padding first (to the largest
token count over the DP ranks, pad value in ``out_cache_loc``), then the graph's capture size.

With speculative decoding (EAGLE, chain drafting) a prefill batch is followed by the draft model's
DRAFT_EXTEND over the same tokens, and every decode round is ``num_steps`` DRAFT_DECODE forwards (one
token per request each, in slots given back after the round's drafting), one TARGET_VERIFY forward
(``num_draft_tokens`` tokens per request), then a DRAFT_EXTEND forward over the tokens the target
accepted; the rejected ones give their slots back. Decode-like speculative forwards pad to the
speculative capture sizes: TARGET_VERIFY replays the decode graph runner, DRAFT_DECODE and
DRAFT_EXTEND the draft's own graph runners (graph paths ``draft_graph``, ``draft_extend_graph``).
Every forward is generated lazily: the allocator's state (and so ``full_to_swa``) is the one the
forward runs under when the run loop receives it.

What changed between engine releases (free-list order, the SWA eviction cadence, DP padding modes,
the multi-step draft's window) is asked of a :class:`~simulator.engine_model.release_model.ReleaseBehaviour`
(``release``; mid-2026 by default), one policy object per concern.
"""
from __future__ import annotations

import bisect
from collections import deque
from operator import ge
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np

from simulator.memory.allocator import HybridAllocator, RequestSlots
from simulator.scheduling.batch import BatchRequests, BatchTruth, ForwardBatch
from simulator.scenario.capture import smallest_capture
from simulator.records import STATIC_GRAPHS, Owner
from simulator.engine_model.release_model import MID_2026, EvictionContext, ReleaseBehaviour, eviction_end
from simulator.scenario import RequestSpec, Scenario, ScenarioError

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class Request:
    rid: int
    spec: RequestSpec
    slots: RequestSlots
    tag_base: int             # tag of position p is tag_base + p
    prefilled: int = 0
    decoded: int = 0
    swa_reserve: int = 0
    full_reserve: int = 0
    extend_batches: int = 0   # prefill chunks run so far (SGLang's extend_batch_idx)
    decode_batches: int = 0   # decode batches (or speculative rounds) run so far (decode_batch_idx)
    prefill_len: int = -1     # positions the (re-)prefill covers: the prompt, plus the decoded tokens after a retraction
    lag: bool = False         # overlap: the request decodes one more token before its finish is seen
    lagged: bool = False      # that token was scheduled

    def __post_init__(self) -> None:
        if self.prefill_len < 0:
            self.prefill_len = self.spec.prompt_len

    @property
    def total_len(self) -> int:
        return self.spec.prompt_len + self.spec.output_len

    @property
    def prefill_done(self) -> bool:
        return self.prefilled >= self.prefill_len

    @property
    def finished(self) -> bool:
        return self.prefill_done and self.decoded >= self.spec.output_len and (self.lagged or not self.lag)

    @property
    def decodes(self) -> bool:
        """Decodes a token in the next batch (its own, or the overlap scheduler's one past the end)."""
        return self.prefill_done and (self.decoded < self.spec.output_len or (self.lag and not self.lagged))


def _decode_candidates(eviction):
    """The eviction policy's ``decode_candidates`` where it answers for the ``decode_point`` in force: defined by
    the class that defines ``decode_point`` or a subclass of it, neither replaced on the instance; else None
    (ask every request)."""
    fn = getattr(eviction, "decode_candidates", None)
    if fn is None:
        return None
    own = getattr(eviction, "__dict__", None)
    if own and ("decode_point" in own or "decode_candidates" in own):
        return None
    # (the first class of the MRO that defines either name: one loop, asked at every decode step)
    for c in type(eviction).__mro__:
        d = c.__dict__
        if "decode_candidates" in d:
            return fn
        if "decode_point" in d:
            return None
    return fn


class Scheduler:
    def __init__(self, scenario: Scenario, allocator: HybridAllocator, requests: list[RequestSpec],
                 rng: np.random.Generator, pad_value: int = 0, pad_to_capture: bool = False,
                 release: Optional[ReleaseBehaviour] = None):
        self.sc = scenario
        self.alloc = allocator
        self.rng = rng
        self.release = release if release is not None else MID_2026
        allocator.set_free_order(self.release.free_lists.order(allocator.page_size))
        self._grouped = self.release.free_lists.grouped
        self.pad_value = pad_value
        # a dummy-request convention (mini-sglang) pads the batch itself up to the capture size, so the
        # graph's static buffers are written in full at every replay
        self.pad_to_capture = pad_to_capture
        spec = scenario.engine.speculative
        self.spec = spec if spec.enabled else None
        # room a request needs past its last token: the verify tokens of its last round; under the overlap
        # scheduler the token of the batch scheduled before its finish was seen
        self.overlap = scenario.engine.overlap
        self._extra = (spec.num_draft_tokens if self.spec else 0) + (1 if self.overlap else 0)
        #: admission reserves the whole request ("whole") or its prefill only ("none": decode grows, retracts)
        self.reserve_whole = scenario.engine.reserve == "whole"
        self.retractions = 0
        #: the overlap timeline's record of discrete writes (simulator.scheduling.timeline.Journal); None: not recorded
        self.journal = None
        self.page = allocator.page_size
        self._eviction = self.release.eviction
        self._ev_ctx = EvictionContext(
            window=scenario.model.window, page_size=self.page,
            chunked_prefill_size=scenario.engine.chunked_prefill_size,
            interval=scenario.engine.swa_eviction_interval,
            # the draft's SWA layers read the same window of the shared SWA pool
            draft_window=scenario.model.window if self.spec is not None and "swa" in spec.draft_layers else 0,
            extra=self._extra, overlap=self.overlap)
        # the window an evicting request keeps (SGLang 0.5.23: max(window, draft window))
        self.window = self._eviction.retain_window(self._ev_ctx)
        self.pending: deque[RequestSpec] = deque(requests)
        self.total_requests = len(requests)
        self.waiting: deque = deque()          # RequestSpec, or a retracted Request to prefill again
        self.running: list[Request] = []       # admitted: prefilling or decoding
        self.finished_count = 0
        self._next_rid = 0
        self._next_tag = 1
        self._full_reserved = allocator.full_used     # pages already taken (a dummy request's)
        self._swa_reserved = allocator.swa_used
        self._freed_full: list[np.ndarray] = []
        self._freed_swa: list[np.ndarray] = []
        self._evicted_swa: list[np.ndarray] = []
        self._mapping_changed: list[np.ndarray] = []
        self._tag_bases: list[int] = []               # append-only (a subclass appends too)
        self._tag_array = np.zeros(0, dtype=np.int64)  # its first _tag_count entries mirror it (_tag_base_array)
        self._tag_count = 0
        self._slots_by_rid: list[RequestSlots] = []   # req_to_token rows, for the batches' read ids
        self._check_fits(requests)

    # ------------------------------------------------------------------ admission

    def _pages(self, tokens: int) -> int:
        return -(-tokens // self.page)

    def _swa_need(self, total: int) -> int:
        bound = self._eviction.swa_hold_bound(self._ev_ctx)
        return self._pages(min(total, bound)) * self.page

    def _check_fits(self, requests: list[RequestSpec]) -> None:
        for i, r in enumerate(requests):
            total = r.prompt_len + r.output_len + self._extra
            if self._pages(total) * self.page > self.alloc.full_size:
                raise ScenarioError(
                    f"{self.sc.source}: workload request {i} needs {total} tokens but pool.full_size is "
                    f"{self.alloc.full_size}: raise pool.full_size or shorten the request")
            if self._swa_need(total) > self.alloc.swa_size:
                raise ScenarioError(
                    f"{self.sc.source}: workload request {i} may hold {self._swa_need(total)} SWA slots at once "
                    f"but the SWA pool has {self.alloc.swa_size}: raise pool.full_size or pool.swa_ratio")

    def _try_admit(self, item) -> Optional[Request]:
        retracted = item if isinstance(item, Request) else None
        spec = item.spec if retracted is not None else item
        total = spec.prompt_len + spec.output_len + self._extra
        # "none": the (re-)prefill only; decode grows the reservation (_grow_or_retract)
        need = total if self.reserve_whole else (spec.prompt_len if retracted is None else retracted.prefill_len)
        full_need = self._pages(need) * self.page
        swa_need = self._swa_need(need)
        if (self._full_reserved + full_need > self.alloc.full_size
                or self._swa_reserved + swa_need > self.alloc.swa_size
                or len(self.running) >= self.sc.engine.max_running_requests):
            return None
        self._full_reserved += full_need
        self._swa_reserved += swa_need
        if retracted is not None:
            # prefilled again from position 0 into a fresh req_to_token row, with the same tags
            retracted.slots = RequestSlots(max(total, 1))
            retracted.full_reserve, retracted.swa_reserve = full_need, swa_need
            self._slots_by_rid[retracted.rid] = retracted.slots
            return retracted
        req = Request(rid=self._next_rid, spec=spec, slots=RequestSlots(max(total, 1)), tag_base=self._next_tag,
                      swa_reserve=swa_need, full_reserve=full_need, lag=self.overlap)
        self._tag_bases.append(self._next_tag)
        self._slots_by_rid.append(req.slots)
        self._next_rid += 1
        self._next_tag += max(total, 1)
        return req

    def _release(self, req: Request, kind: str = "free") -> None:
        s = req.slots
        full = s.full[: s.length].copy()
        self._freed_full.append(full)
        self._freed_swa.append(s.swa[s.swa_evicted: s.length].copy())
        self._mapping_changed.append(full)
        self.alloc.free(s)
        self._note(kind, req, full)
        self._full_reserved -= req.full_reserve
        self._swa_reserved -= req.swa_reserve
        if kind == "free":
            self.finished_count += 1

    def _note(self, kind: str, req: Request, full: np.ndarray) -> None:
        if self.journal is not None:
            self.journal.note(kind, req.rid, full)

    def _retract(self, req: Request) -> None:
        """SGLang 0.5.23 ``retract_decode`` -> ``release_kv_cache``: the request's KV (full and SWA) is
        freed, its mapping cleared and its req_to_token row given back; it waits at the queue's head to be
        prefilled again over its prompt and the tokens it had decoded."""
        self._release(req, "retract")
        self.running.remove(req)
        req.prefilled, req.prefill_len = 0, req.spec.prompt_len + req.decoded
        req.extend_batches = req.decode_batches = 0      # decode_batch_idx restarts (X4, #33404)
        self.waiting.appendleft(req)
        self.retractions += 1

    def _grow_or_retract(self, decoding: list[Request]) -> list[Request]:
        """``reserve = "none"``: grow each decoding request's reservation by its next token; while the pools
        cannot hold that, retract a request (the fewest decoded tokens first, then the longest prompt, then
        the latest admitted, as retract_decode orders them). Returns the requests that still decode."""
        if self.reserve_whole:
            return decoding
        decoding = list(decoding)
        while decoding:
            grow = [(max(0, self._pages(r.slots.length + 1) * self.page - r.full_reserve),
                     max(0, self._swa_need(r.slots.length + 1) - r.swa_reserve)) for r in decoding]
            if (self._full_reserved + sum(g[0] for g in grow) <= self.alloc.full_size
                    and self._swa_reserved + sum(g[1] for g in grow) <= self.alloc.swa_size):
                for r, (gf, gs) in zip(decoding, grow):
                    r.full_reserve += gf
                    r.swa_reserve += gs
                    self._full_reserved += gf
                    self._swa_reserved += gs
                return decoding
            victim = min(decoding, key=lambda r: (r.decoded, -r.spec.prompt_len, -r.rid))
            decoding.remove(victim)
            self._retract(victim)
        return decoding

    def owner_of(self, tag: int) -> Owner:
        """The (request, position) a tag names; padding, empty and corrupt rows by their special tags."""
        if tag <= 0:
            return Owner(tag)
        i = bisect.bisect_right(self._tag_bases, tag) - 1
        if i < 0:
            return Owner(tag)
        return Owner(tag, request=i, position=tag - self._tag_bases[i])

    # ------------------------------------------------------------------ steps

    def done(self) -> bool:
        return not self.pending and not self.waiting and not self.running

    def steps(self) -> Iterator[tuple[ForwardBatch, BatchTruth]]:
        self._step = 0
        while not self.done():
            step = self._step
            while self.pending and self.pending[0].arrival_step <= step:
                self.waiting.append(self.pending.popleft())
            produced = False
            for out in self._schedule():
                produced = True
                yield out
                self._step += 1
            if not produced:
                if self.pending and not self.running and not self.waiting:
                    self._step = max(step + 1, self.pending[0].arrival_step)
                    continue
                if not self.running and self.waiting:
                    raise RuntimeError("scheduler stalled: waiting requests can never be admitted")
                self._step += 1

    def _release_finished(self) -> None:
        """Release every finished running request (in running order) and keep the others running; the caller
        holds the free group the releases belong to."""
        self._sweep()

    def _sweep(self) -> tuple[list[Request], list[Request]]:
        """One pass over the running requests: release the finished ones (in running order; the caller
        holds the free group) and return the others that still prefill and those that decode, in running
        order (a prefilled request that has not finished decodes: :attr:`Request.decodes`)."""
        # the properties prefill_done / finished inlined (a pass per step over every running request);
        # the running list is rebuilt only when a request finished
        running = self.running
        chunked, decoding, gone = [], [], []
        for r in running:
            if r.prefilled < r.prefill_len:
                chunked.append(r)
            elif r.decoded >= r.spec.output_len and (r.lagged or not r.lag):
                self._release(r)
                gone.append(r)
            else:
                decoding.append(r)
        if gone:
            ids = set(map(id, gone))
            self.running = [r for r in running if id(r) not in ids]
        return chunked, decoding

    def _schedule(self) -> Iterator[tuple[ForwardBatch, BatchTruth]]:
        """The forwards of one scheduling decision: one batch, or a speculative round / prefill + draft."""
        # finished requests free their slots before the next batch is formed
        if self._grouped:
            with self.alloc.free_group():
                chunked, decoding = self._sweep()
        else:                           # free_group(False) is a no-op: spare its context manager
            chunked, decoding = self._sweep()

        eng = self.sc.engine
        prefill: list[tuple[Request, int]] = []
        budget = eng.chunked_prefill_size
        for r in chunked:  # an in-progress chunked request continues first
            if budget > 0:
                take = min(r.prefill_len - r.prefilled, budget)
                prefill.append((r, take))
                budget -= take
        while self.waiting and budget > 0:
            req = self._try_admit(self.waiting[0])
            if req is None:
                break
            self.waiting.popleft()
            self.running.append(req)
            if req.decodes:
                decoding.append(req)
            take = min(req.prefill_len - req.prefilled, budget)   # a radix cache admits past the matched prefix
            prefill.append((req, take))
            budget -= take

        if prefill:
            mode = "mixed" if (eng.mixed_chunk and decoding) else "extend"
            decode_part = decoding if mode == "mixed" else []
        elif decoding:
            if self.spec is not None:
                yield from self._speculative_round(decoding)
                return
            mode, decode_part = "decode", self._grow_or_retract(decoding)
            if not decode_part:
                return
        else:
            return

        tags, full, swa = [], [], []
        self._write_batch(prefill, decode_part, tags, full, swa)
        batch, truth = self._make_batch(self._step, mode, len(prefill) + len(decode_part), tags, full, swa)
        yield batch, truth
        if self.spec is not None:
            # EAGLE: the draft model extends over the tokens the target just prefilled (eagerly, same slots)
            yield self._draft_batch(batch, truth)

    def _write_batch(self, prefill: list, decode_part: list[Request], tags, full, swa) -> None:
        """A batch's evictions and allocations: the prefill chunks, then one token per decoding request."""
        if self._eviction.batched:
            # SGLang 0.5.23: prepare_for_extend frees the batch's out-of-window slots (one free group),
            # then allocates; a mixed batch's running requests then do the same in prepare_for_decode
            with self.alloc.free_group(self._grouped):
                for r, _ in prefill:
                    self._evict_extend(r)
            for r, take in prefill:
                self._write_tokens(r, take, tags, full, swa)
                r.prefilled += take
                r.extend_batches += 1
            with self.alloc.free_group(self._grouped):
                for r in decode_part:
                    self._evict_decode(r)
            self._decode_tokens(decode_part, tags, full, swa, evict=False)
        else:
            for r, take in prefill:
                self._evict_extend(r)
                self._write_tokens(r, take, tags, full, swa)
                r.prefilled += take
                r.extend_batches += 1
            # mid-2026: SGLang evicts lazily in decode, when decode_step % window == 1
            self._decode_tokens(decode_part, tags, full, swa, evict=True)

    def _decode_tokens(self, reqs: list[Request], tags, full, swa, evict: bool) -> None:
        """One token for each decoding request, in order (``evict``: each request's lazy eviction first)."""
        if reqs and self._vector_decode(reqs, tags, full, swa, evict):
            return
        for r in reqs:
            if evict:
                self._evict_decode(r)
            self._write_tokens(r, 1, tags, full, swa)
            self._count_decoded(r)
            r.decode_batches += 1

    def _vector_decode(self, reqs: list[Request], tags, full, swa, evict: bool) -> bool:
        """:meth:`_decode_tokens` for the plain scheduler on the model's allocator at page size 1, with the
        same allocations in the same order: one token per request takes one page from each free list, so
        the requests' pops are one pop of len(reqs) pages (the full list gets no frees in between; the SWA
        list is popped up to each request whose lazy eviction may free pages, before it evicts). Appends
        one array for the whole decode part and keeps the requests for :meth:`_batch_requests`. False
        (nothing done): another scheduler, allocator or page size, a journal, or a request or free list
        without room (the per-request path then raises where it would)."""
        a = self.alloc
        if type(self) is not Scheduler or type(a) is not HybridAllocator or self.page != 1 \
                or self.journal is not None or self.spec is not None or self._block is not None:
            return False
        k = len(reqs)
        slots = [r.slots for r in reqs]
        lengths = [s.length for s in slots]
        if k > a._full.free or k > a._swa.free or any(map(ge, lengths, [s.capacity for s in slots])):
            return False
        new_full = a._full.pop(k)
        new_swa = self._vector_swa_pops(reqs, evict)    # evictions keep every length
        for r, s, n, f, w in zip(reqs, slots, lengths, new_full.tolist(), new_swa.tolist()):
            s.full[n] = f
            s.swa[n] = w
            s.length = n + 1
            if r.decoded < r.spec.output_len:     # _count_decoded, inlined
                r.decoded += 1
            else:
                r.lagged = True
            r.decode_batches += 1
        lengths = np.array(lengths, dtype=np.int64)
        a.full_to_swa[new_full] = new_swa
        bases = np.array([r.tag_base for r in reqs], dtype=np.int64)
        tags.append(bases + lengths)
        full.append(new_full)
        swa.append(new_swa)
        self._block = BatchRequests(rids=np.array([r.rid for r in reqs], dtype=np.int64),
                                    seq_lens=lengths + 1, extend_lens=np.ones(k, dtype=np.int64),
                                    slots=tuple(slots), tag_bases=bases)
        return True

    def _vector_swa_pops(self, reqs: list[Request], evict: bool) -> np.ndarray:
        """The SWA pages of :meth:`_vector_decode`'s requests, one per request in order: popped in runs
        up to each request whose lazy eviction may free pages (the release's :meth:`_decode_point`), which
        evicts first. A release that names its candidates at once (``decode_candidates``: a superset of
        the requests whose decode point is not None) is asked only about those."""
        swa = self.alloc._swa
        k = len(reqs)
        if not evict:
            return swa.pop(k)
        candidates = _decode_candidates(self._eviction)
        if candidates is None:
            hits = range(k)
        else:
            decoded = np.array([r.decoded for r in reqs], dtype=np.int64)
            hits = np.flatnonzero(candidates(self._ev_ctx, decoded)).tolist()
        parts, popped = [], 0
        for i in hits:
            r = reqs[i]
            point = self._decode_point(r)
            if point is not None:
                if i > popped:
                    parts.append(swa.pop(i - popped))
                    popped = i
                self._lazy_evict(r, point)
        parts.append(swa.pop(k - popped))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    @staticmethod
    def _count_decoded(r: Request) -> None:
        if r.decoded < r.spec.output_len:
            r.decoded += 1
        else:
            r.lagged = True      # the overlap scheduler's token past the end: its output is dropped

    def _draft_batch(self, batch: ForwardBatch, truth: BatchTruth) -> tuple[ForwardBatch, BatchTruth]:
        """DRAFT_EXTEND after a prefill: the same out_cache_loc, run eagerly by the draft model."""
        b = ForwardBatch(step=self._step, mode="draft_extend", graph="eager", out_cache_loc=batch.out_cache_loc,
                         num_token_non_padded=batch.num_token_non_padded, padded_len=batch.dp_padded_len,
                         pad_value=batch.pad_value, num_requests=batch.num_requests, requests=batch.requests)
        t = BatchTruth(tags=truth.tags, full_slots=truth.full_slots, swa_slots=truth.swa_slots,
                       freed_full=_cat(self._freed_full), freed_swa=_cat(self._freed_swa),
                       evicted_swa=_cat(self._evicted_swa), mapping_changed=_cat(self._mapping_changed))
        self._clear_pending()
        return b, t

    def _speculative_round(self, reqs: list[Request]) -> Iterator[tuple[ForwardBatch, BatchTruth]]:
        """One EAGLE round (topk 1): draft decode steps, target verify, draft extend over the accepted tokens."""
        spec = self.spec
        assert spec is not None
        d = spec.num_draft_tokens
        with self.alloc.free_group(self._grouped):
            for r in reqs:
                # lazy SWA eviction by position: a round adds up to num_draft_tokens tokens at once
                s = r.slots
                point = self._eviction.speculative_point(self._ev_ctx, length=s.length, evicted=s.swa_evicted,
                                                         decode_batches=r.decode_batches)
                if point is not None:
                    self._lazy_evict(r, point)
                r.decode_batches += 1
        if self.release.draft_columns:
            yield from self._speculative_round_columns(reqs)
            return
        starts = [r.slots.length for r in reqs]
        # DRAFT_DECODE: step i writes the draft's K/V of position start + i, in slots held for the round only
        for _ in range(spec.num_steps):
            tags, full, swa = [], [], []
            for r in reqs:
                self._write_tokens(r, 1, tags, full, swa)
            yield self._make_batch(self._step, "draft_decode", len(reqs), tags, full, swa, per_request=1,
                                   graph_kind="draft_graph")
        for r, start in zip(reqs, starts):
            self._give_back(r, start)
        # TARGET_VERIFY: num_draft_tokens tokens per request, in the decode graph runner
        tags, full, swa = [], [], []
        for r in reqs:
            self._write_tokens(r, d, tags, full, swa)
        yield self._make_batch(self._step, "target_verify", len(reqs), tags, full, swa, per_request=d,
                               graph_kind="decode_graph")
        yield self._accept_round(reqs, starts)

    def _speculative_round_columns(self, reqs: list[Request]) -> Iterator[tuple[ForwardBatch, BatchTruth]]:
        """SGLang 0.5.23's chain draft: the round's window of num_draft_tokens slots per request is
        allocated once (request by request), draft step i writes column i of it (position start + i of
        every request), TARGET_VERIFY writes the whole window, then the rejected slots go back."""
        spec = self.spec
        assert spec is not None
        d = spec.num_draft_tokens
        starts = [r.slots.length for r in reqs]
        for r in reqs:
            new_full = self.alloc.extend(r.slots, d)
            self._mapping_changed.append(new_full)
        for i in range(spec.num_steps):
            cols = [start + i for start in starts]
            tags = [np.array([r.tag_base + c], dtype=np.int64) for r, c in zip(reqs, cols)]
            full = [r.slots.full[c:c + 1].copy() for r, c in zip(reqs, cols)]
            swa = [r.slots.swa[c:c + 1].copy() for r, c in zip(reqs, cols)]
            yield self._make_batch(self._step, "draft_decode", len(reqs), tags, full, swa, per_request=1,
                                   graph_kind="draft_graph")
        tags = [np.arange(r.tag_base + st, r.tag_base + st + d, dtype=np.int64) for r, st in zip(reqs, starts)]
        full = [r.slots.full[st:st + d].copy() for r, st in zip(reqs, starts)]
        swa = [r.slots.swa[st:st + d].copy() for r, st in zip(reqs, starts)]
        yield self._make_batch(self._step, "target_verify", len(reqs), tags, full, swa, per_request=d,
                               graph_kind="decode_graph")
        yield self._accept_round(reqs, starts)

    def _accept_round(self, reqs: list[Request], starts: list[int]) -> tuple[ForwardBatch, BatchTruth]:
        """The end of a speculative round: each request accepts 1 + its leading accepted drafts, the rest
        give their slots back (in one free group where the release groups frees); then DRAFT_EXTEND, the
        draft's K/V of the accepted tokens, in the draft-extend graph runner."""
        d = self.spec.num_draft_tokens
        drafts_ok = self.rng.random((len(reqs), d - 1)) < self.spec.accept_rate
        accepted = 1 + np.cumprod(drafts_ok, axis=1).sum(axis=1)
        tags, full, swa = [], [], []
        with self.alloc.free_group(self._grouped):
            for r, start, a in zip(reqs, starts, accepted.tolist()):
                self._give_back(r, start + a)
                s = r.slots
                tags.append(np.arange(r.tag_base + start, r.tag_base + start + a, dtype=np.int64))
                full.append(s.full[start:start + a].copy())
                swa.append(s.swa[start:start + a].copy())
                r.decoded += a
        return self._make_batch(self._step, "draft_extend", len(reqs), tags, full, swa, per_request=d,
                                graph_kind="draft_extend_graph")

    def _give_back(self, req: Request, length: int) -> None:
        s = req.slots
        if length >= s.length:
            return
        self._freed_full.append(s.full[length:s.length].copy())
        self._freed_swa.append(s.swa[length:s.length].copy())
        self._mapping_changed.append(s.full[length:s.length].copy())
        self.alloc.truncate(s, length)

    def _evict_extend(self, req: Request) -> None:
        point = self._eviction.extend_point(self._ev_ctx, prefix_len=req.prefilled, evicted=req.slots.swa_evicted,
                                            chunk=req.extend_batches)
        if point is not None:
            self._lazy_evict(req, point)

    def _evict_decode(self, req: Request) -> None:
        point = self._decode_point(req)
        if point is not None:
            self._lazy_evict(req, point)

    def _decode_point(self, req: Request) -> Optional[int]:
        s = req.slots
        return self._eviction.decode_point(self._ev_ctx, length=s.length, evicted=s.swa_evicted,
                                           decoded=req.decoded, decode_batches=req.decode_batches)

    def _lazy_evict(self, req: Request, prefix_len: int) -> None:
        s = req.slots
        begin = s.swa_evicted
        release_rule = getattr(self.alloc, "evict_out_of_window", None)
        if release_rule is not None:
            # an engine's allocator (engine_path) applies the release's own rule for how far to free;
            # when to ask stays this scheduler's cadence
            swa_before, full_before = s.swa[begin:s.length].copy(), s.full[begin:s.length].copy()
            end = release_rule(s, prefix_len, self.window)
            if end > begin:
                self._mapping_changed.append(full_before[:end - begin])
                self._freed_swa.append(swa_before[:end - begin])
                self._evicted_swa.append(swa_before[:end - begin])
                self._note("free_swa", req, full_before[:end - begin])
            return
        end = eviction_end(prefix_len, self.window, self.page)
        if end > begin:
            swa = s.swa[begin:end].copy()
            self._mapping_changed.append(s.full[begin:end].copy())
            self.alloc.evict_swa(s, end)
            self._freed_swa.append(swa)
            self._evicted_swa.append(swa)
            self._note("free_swa", req, s.full[begin:end])

    def _write_tokens(self, req: Request, n: int, tags, full, swa) -> None:
        s = req.slots
        start = s.length
        new_full = self.alloc.extend(s, n)
        self._note("alloc", req, new_full)
        tags.append(np.arange(req.tag_base + start, req.tag_base + start + n, dtype=np.int64))
        full.append(new_full)
        swa.append(s.swa[start:start + n].copy())

    def _make_batch(self, step: int, mode: str, num_requests: int, tags, full, swa, per_request: int = 1,
                    graph_kind: Optional[str] = None):
        """Pad a batch (DP attention, then the graph's capture size) and pair it with the oracle's truth.

        ``graph_kind`` names the batch-size graph runner of a speculative forward (``per_request``
        tokens per request); plain decode and extend batches choose their graphs as before.
        """
        eng = self.sc.engine
        if self._block is not None and len(tags) == 1:
            # (a vectorised decode part alone: its own arrays, made for this batch and held by no one else)
            tags_a, full_a, swa_a = tags[0], full[0], swa[0]
        else:
            tags_a, full_a, swa_a = np.concatenate(tags), np.concatenate(full), np.concatenate(swa)
        real = int(full_a.shape[0])
        # DP attention: every rank pads to the largest token count over the ranks (pad value in loc)
        dp_len = real
        if eng.dp_size > 1:
            others = eng.dp_other_tokens.sample(self.rng, eng.dp_size - 1)
            if mode == "decode" or graph_kind is not None:
                # other ranks decode too: their batch sizes, bounded like ours
                others = np.minimum(others, max(eng.cuda_graph_bs[-1] * per_request, real))
            extend = mode in ("extend", "mixed")
            plan = self.release.dp_padding.plan(
                real=real, others=others, extend=extend, dp_size=eng.dp_size, attn_tp_size=eng.attn_tp_size,
                prefill_graph_sizes=eng.piecewise_capture_sizes if extend and eng.piecewise_cuda_graph else None)
            dp_len, basis, prefill_graph = plan.tokens, plan.graph_basis, plan.prefill_graph
        else:
            basis, prefill_graph = dp_len, True
        graph, padded = self._graph_of(mode, basis, prefill_graph, num_requests, per_request, graph_kind, dp_len)
        if self.pad_to_capture and graph in STATIC_GRAPHS:
            dp_len = padded
        if dp_len == real:
            loc = full_a.copy()
        else:
            loc = np.full(dp_len, self.pad_value, dtype=np.int64)
            loc[:real] = full_a
        batch = ForwardBatch(step=step, mode=mode, graph=graph, out_cache_loc=loc, num_token_non_padded=real,
                             padded_len=padded, pad_value=self.pad_value, num_requests=num_requests,
                             requests=self._batch_requests(tags))
        truth = BatchTruth(
            tags=tags_a, full_slots=full_a, swa_slots=swa_a,
            freed_full=_cat(self._freed_full), freed_swa=_cat(self._freed_swa),
            evicted_swa=_cat(self._evicted_swa),
            mapping_changed=_cat(self._mapping_changed + [full_a]),
            content_keys=self._content_keys,
        )
        self._clear_pending()
        return batch, truth

    def _graph_of(self, mode: str, basis: int, prefill_graph: bool, num_requests: int, per_request: int,
                  graph_kind: Optional[str], dp_len: int) -> tuple[str, int]:
        """The batch's graph path and its padded rows: a captured graph's size (``basis``: the tokens the choice
        is made on), or ("eager", ``dp_len``) where none fits."""
        eng = self.sc.engine
        if mode == "decode" and eng.cuda_graph:
            cap = smallest_capture(eng.cuda_graph_bs, basis)
            if cap is not None:
                return "decode_graph", cap
        elif mode in ("extend", "mixed") and eng.piecewise_cuda_graph:
            cap = smallest_capture(eng.piecewise_capture_sizes, basis) if prefill_graph else None
            if cap is not None:
                return "piecewise", cap
        elif graph_kind is not None and eng.cuda_graph:
            # captured per batch size (requests), num_draft_tokens rows each for TARGET_VERIFY / DRAFT_EXTEND
            cap = smallest_capture(eng.cuda_graph_bs, max(num_requests, -(-basis // per_request)))
            if cap is not None:
                return graph_kind, cap * per_request
        return "eager", dp_len

    #: the read check's content keys (None: each request's own tags); a sharing scheduler sets its own
    _content_keys = None

    #: the decode part's requests when :meth:`_vector_decode` wrote it (one tag array for all of them)
    _block: Optional[BatchRequests] = None

    def _batch_requests(self, tags: list) -> BatchRequests:
        """The batch's requests as metadata init reads them, from its per-request tag arrays (the last
        one all of a vectorised decode part's: those requests are kept whole, :meth:`_vector_decode`)."""
        block, self._block = self._block, None
        if block is None:
            return BatchRequests.from_tags(tags, self._tag_base_array(), self._slots_by_rid.__getitem__)
        if len(tags) == 1:
            return block
        head = BatchRequests.from_tags(tags[:-1], self._tag_base_array(), self._slots_by_rid.__getitem__)
        return BatchRequests(rids=np.concatenate([head.rids, block.rids]),
                             seq_lens=np.concatenate([head.seq_lens, block.seq_lens]),
                             extend_lens=np.concatenate([head.extend_lens, block.extend_lens]),
                             slots=head.slots + block.slots, tag_bases=np.concatenate([head.tag_bases, block.tag_bases]))

    def _tag_base_array(self) -> np.ndarray:
        """``_tag_bases`` as an int64 array, extended by the entries appended since the last call (capacity
        doubling) instead of converted whole at every batch."""
        n, m = len(self._tag_bases), self._tag_count
        if n != m:
            if n > self._tag_array.size:
                grown = np.zeros(max(n, 2 * self._tag_array.size, 64), dtype=np.int64)
                grown[:m] = self._tag_array[:m]
                self._tag_array = grown
            self._tag_array[m:n] = self._tag_bases[m:n]
            self._tag_count = n
        return self._tag_array[:n]

    def _clear_pending(self) -> None:
        self._mapping_changed.clear()
        self._freed_full.clear()
        self._freed_swa.clear()
        self._evicted_swa.clear()


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else _EMPTY
