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

This module holds the policy (admission, the scheduling decision, eviction, retraction, the writes);
its mixins the rest: the speculative forwards (:mod:`simulator.scheduling.speculative`), padding and the
oracle's truth of each batch (:mod:`simulator.scheduling.batch_making`) and the decode part written at
once (:mod:`simulator.scheduling.vector_decode`).
"""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np

from simulator.memory.allocator import HybridAllocator, RequestSlots
from simulator.scheduling.batch import BatchTruth, ForwardBatch
from simulator.scheduling.batch_making import BatchMaking
from simulator.scheduling.speculative import SpeculativeRounds
from simulator.scheduling.vector_decode import VectorDecode
from simulator.records import Owner
from simulator.engine_model.release_model import MID_2026, EvictionContext, ReleaseBehaviour, eviction_end
from simulator.scenario import RequestSpec, Scenario, ScenarioError


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


class Scheduler(SpeculativeRounds, VectorDecode, BatchMaking):
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
            total, where = r.prompt_len + r.output_len + self._extra, f"{self.sc.source}: workload request {i}"
            if self._pages(total) * self.page > self.alloc.full_size:
                raise ScenarioError(f"{where} needs {total} tokens but pool.full_size is {self.alloc.full_size}: "
                                    "raise pool.full_size or shorten the request")
            if (swa := self._swa_need(total)) > self.alloc.swa_size:
                raise ScenarioError(f"{where} may hold {swa} SWA slots at once but the SWA pool has "
                                    f"{self.alloc.swa_size}: raise pool.full_size or pool.swa_ratio")

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
        prefill = self._take_prefill(chunked, decoding)
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
        decode_part = self._write_batch(prefill, decode_part, tags, full, swa)
        if prefill:
            if mode == "mixed" and not decode_part:
                mode = "extend"             # the running requests sat this one out (no room to decode)
            self._reorder_running(prefill, mixed=mode == "mixed")
        batch, truth = self._make_batch(self._step, mode, len(prefill) + len(decode_part), tags, full, swa)
        yield batch, truth
        if self.spec is not None:
            # EAGLE: the draft model extends over the tokens the target just prefilled (eagerly, same slots)
            yield self._draft_batch(batch, truth)

    def _reorder_running(self, prefill: list[tuple[Request, int]], mixed: bool) -> None:
        """The decode order SGLang's running batch takes after this batch: the requests whose prefill it
        completes join the running batch in batch order, behind it after an extend batch (``merge_batch``),
        in front of it after a mixed one (the mixed batch, extend requests first, becomes the running batch).
        Called once the batch is written."""
        done = [r for r, _ in prefill if r.prefilled >= r.prefill_len]
        if not done:
            return
        ids = {id(r) for r in done}
        rest = [r for r in self.running if id(r) not in ids]
        self.running = done + rest if mixed else rest + done

    def _take_prefill(self, chunked: list[Request], decoding: list[Request]) -> list[tuple[Request, int]]:
        """The batch's prefill chunks, (request, tokens), within ``chunked_prefill_size``: the in-progress
        chunked requests continue first, then the waiting queue's head is admitted while the budget lasts.
        An admitted request that already decodes is appended to ``decoding``. Under ``mixed_chunk`` the
        running requests' decode tokens come off the budget first (SGLang's ``PrefillAdder`` is given the
        running batch's size as ``num_mixed_decode_tokens``, whether or not the batch ends up mixed)."""
        prefill: list[tuple[Request, int]] = []
        budget = self.sc.engine.chunked_prefill_size
        if self.sc.engine.mixed_chunk:
            budget -= len(decoding)
        for r in chunked:
            if budget > 0:
                take = min(r.prefill_len - r.prefilled, budget)
                prefill.append((r, take))
                budget -= take
        while self.waiting and budget > 0:
            req = self._admit_head(decoding)
            if req is None:
                break
            take = min(req.prefill_len - req.prefilled, budget)   # a radix cache admits past the matched prefix
            prefill.append((req, take))
            budget -= take
        return prefill

    def _admit_head(self, decoding: list[Request]) -> Optional[Request]:
        """The waiting queue's head admitted (None: it does not fit): it joins the running requests, and
        ``decoding`` where it already decodes."""
        req = self._try_admit(self.waiting[0])
        if req is None:
            return None
        self.waiting.popleft()
        self.running.append(req)
        if req.decodes:
            decoding.append(req)
        return req

    def _mixed_decode(self, decode_part: list[Request]) -> list[Request]:
        """A MIXED batch's decoding requests once its prefill is allocated: all here (SharingScheduler checks)."""
        return decode_part

    def _write_batch(self, prefill: list, decode_part: list[Request], tags, full, swa) -> list[Request]:
        """A batch's evictions and allocations: the prefill chunks, then one token per decoding request.
        Returns the requests that decoded (:meth:`_mixed_decode` may leave a MIXED batch's out)."""
        if self._eviction.batched:
            # SGLang 0.5.23: prepare_for_extend frees the batch's out-of-window slots (one free group),
            # then allocates; a mixed batch's running requests then do the same in prepare_for_decode
            with self.alloc.free_group(self._grouped):
                for r, _ in prefill:
                    self._evict_extend(r)
            self._make_room(prefill, [])
            for r, take in prefill:
                self._write_tokens(r, take, tags, full, swa)
                r.prefilled += take
                r.extend_batches += 1
            decode_part = self._mixed_decode(decode_part) if prefill else decode_part
            with self.alloc.free_group(self._grouped):
                for r in decode_part:
                    self._evict_decode(r)
            self._make_room([], decode_part)
            self._decode_tokens(decode_part, tags, full, swa, evict=False)
        else:
            for r, take in prefill:
                self._evict_extend(r)
                self._write_tokens(r, take, tags, full, swa)
                r.prefilled += take
                r.extend_batches += 1
            decode_part = self._mixed_decode(decode_part) if prefill else decode_part
            # mid-2026: SGLang evicts lazily in decode, when decode_step % window == 1
            self._decode_tokens(decode_part, tags, full, swa, evict=True)
        return decode_part

    def _make_room(self, prefill: list, decoding: list[Request]) -> None:
        """Before the extend (``prefill``) or the decode allocation, what 0.5.23 asks its prefix cache to evict
        (``evict_from_tree_cache``): nothing without one (SharingScheduler)."""

    def _decode_tokens(self, reqs: list[Request], tags, full, swa, evict: bool) -> None:
        """One token for each decoding request, in order (``evict``: each request's lazy eviction first)."""
        # (the plain scheduler only: a subclass's allocations are its own)
        if reqs and type(self) is Scheduler and self._vector_decode(reqs, tags, full, swa, evict):
            return
        for r in reqs:
            if evict:
                self._evict_decode(r)
            self._write_tokens(r, 1, tags, full, swa)
            self._count_decoded(r)
            r.decode_batches += 1

    @staticmethod
    def _count_decoded(r: Request) -> None:
        if r.decoded < r.spec.output_len:
            r.decoded += 1
        else:
            r.lagged = True      # the overlap scheduler's token past the end: its output is dropped

    def _evict_extend(self, req: Request) -> None:
        if (point := self._eviction.extend_point(self._ev_ctx, prefix_len=req.prefilled,
                                                 evicted=req.slots.swa_evicted, chunk=req.extend_batches)) is not None:
            self._lazy_evict(req, point)

    def _evict_decode(self, req: Request) -> None:
        if (point := self._decode_point(req)) is not None:
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


