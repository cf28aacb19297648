"""Continuous batching with chunked prefill, SWA eviction, DP-attention and CUDA-graph padding.

The policy is SGLang's in outline (SGLANG_FACTS sections 1 and 4): prefill first; a prefill batch
takes up to ``chunked_prefill_size`` prompt tokens, finishing an in-progress chunked request before
admitting new ones; with ``mixed_chunk`` the running requests' decode tokens ride along (MIXED);
otherwise every running request decodes one token. Admission reserves each request's full-pool need
and a bound on its SWA-pool need, so allocation never fails mid-request.

Per step it yields a :class:`ForwardBatch` (what backends see) and a :class:`BatchTruth` (what the
oracle knows). Padding is applied as the engine does: DP-attention padding first (to the largest
token count over the DP ranks, pad value in ``out_cache_loc``), then the graph's capture size.
"""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np

from .allocator import HybridAllocator, RequestSlots
from .batch import BatchTruth, ForwardBatch
from .padding import smallest_capture
from .records import Owner
from .scenario import RequestSpec, Scenario, ScenarioError

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

    @property
    def total_len(self) -> int:
        return self.spec.prompt_len + self.spec.output_len

    @property
    def prefill_done(self) -> bool:
        return self.prefilled >= self.spec.prompt_len

    @property
    def finished(self) -> bool:
        return self.prefill_done and self.decoded >= self.spec.output_len


class Scheduler:
    def __init__(self, scenario: Scenario, allocator: HybridAllocator, requests: list[RequestSpec],
                 rng: np.random.Generator, pad_value: int = 0):
        self.sc = scenario
        self.alloc = allocator
        self.rng = rng
        self.pad_value = pad_value
        self.window = scenario.model.window
        self.page = allocator.page_size
        self.pending: deque[RequestSpec] = deque(requests)
        self.total_requests = len(requests)
        self.waiting: deque[RequestSpec] = deque()
        self.running: list[Request] = []       # admitted: prefilling or decoding
        self.finished_count = 0
        self._next_rid = 0
        self._next_tag = 1
        self._full_reserved = 0
        self._swa_reserved = 0
        self._freed_full: list[np.ndarray] = []
        self._freed_swa: list[np.ndarray] = []
        self._evicted_swa: list[np.ndarray] = []
        self._mapping_changed: list[np.ndarray] = []
        self._tag_bases: list[int] = []
        self._check_fits(requests)

    # ------------------------------------------------------------------ admission

    def _pages(self, tokens: int) -> int:
        return -(-tokens // self.page)

    def _swa_need(self, total: int) -> int:
        eng = self.sc.engine
        bound = 2 * self.window + eng.chunked_prefill_size + 2 * self.page
        return self._pages(min(total, bound)) * self.page

    def _check_fits(self, requests: list[RequestSpec]) -> None:
        for i, r in enumerate(requests):
            total = r.prompt_len + r.output_len
            if self._pages(total) * self.page > self.alloc.full_size:
                raise ScenarioError(
                    f"{self.sc.source}: workload request {i} needs {total} tokens but pool.full_size is "
                    f"{self.alloc.full_size}: raise pool.full_size or shorten the request")
            if self._swa_need(total) > self.alloc.swa_size:
                raise ScenarioError(
                    f"{self.sc.source}: workload request {i} may hold {self._swa_need(total)} SWA slots at once "
                    f"but the SWA pool has {self.alloc.swa_size}: raise pool.full_size or pool.swa_ratio")

    def _try_admit(self, spec: RequestSpec) -> Optional[Request]:
        total = spec.prompt_len + spec.output_len
        full_need = self._pages(total) * self.page
        swa_need = self._swa_need(total)
        if (self._full_reserved + full_need > self.alloc.full_size
                or self._swa_reserved + swa_need > self.alloc.swa_size
                or len(self.running) >= self.sc.engine.max_running_requests):
            return None
        self._full_reserved += full_need
        self._swa_reserved += swa_need
        req = Request(rid=self._next_rid, spec=spec, slots=RequestSlots(max(total, 1)), tag_base=self._next_tag,
                      swa_reserve=swa_need, full_reserve=full_need)
        self._tag_bases.append(self._next_tag)
        self._next_rid += 1
        self._next_tag += max(total, 1)
        return req

    def _release(self, req: Request) -> None:
        s = req.slots
        self._freed_full.append(s.full[: s.length].copy())
        self._freed_swa.append(s.swa[s.swa_evicted: s.length].copy())
        self._mapping_changed.append(s.full[: s.length].copy())
        self.alloc.free(s)
        self._full_reserved -= req.full_reserve
        self._swa_reserved -= req.swa_reserve
        self.finished_count += 1

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
        step = 0
        while not self.done():
            while self.pending and self.pending[0].arrival_step <= step:
                self.waiting.append(self.pending.popleft())
            out = self._schedule(step)
            if out is None:
                if self.pending and not self.running and not self.waiting:
                    step = max(step + 1, self.pending[0].arrival_step)
                    continue
                if not self.running and self.waiting:
                    raise RuntimeError("scheduler stalled: waiting requests can never be admitted")
                step += 1
                continue
            yield out
            step += 1

    def _schedule(self, step: int):
        # finished requests free their slots before the next batch is formed
        still = []
        for r in self.running:
            if r.finished:
                self._release(r)
            else:
                still.append(r)
        self.running = still

        eng = self.sc.engine
        prefill: list[tuple[Request, int]] = []
        budget = eng.chunked_prefill_size
        for r in self.running:  # an in-progress chunked request continues first
            if not r.prefill_done and budget > 0:
                take = min(r.spec.prompt_len - r.prefilled, budget)
                prefill.append((r, take))
                budget -= take
        while self.waiting and budget > 0:
            req = self._try_admit(self.waiting[0])
            if req is None:
                break
            self.waiting.popleft()
            self.running.append(req)
            take = min(req.spec.prompt_len, budget)
            prefill.append((req, take))
            budget -= take

        decoding = [r for r in self.running if r.prefill_done and r.decoded < r.spec.output_len]
        if prefill:
            mode = "mixed" if (eng.mixed_chunk and decoding) else "extend"
            decode_part = decoding if mode == "mixed" else []
        elif decoding:
            mode, decode_part = "decode", decoding
        else:
            return None

        tags, full, swa = [], [], []
        for r, take in prefill:
            self._lazy_evict(r, r.prefilled)
            self._write_tokens(r, take, tags, full, swa)
            r.prefilled += take
        for r in decode_part:
            # SGLang evicts lazily in decode, when decode_step % window == 1
            if r.decoded % self.window == 1:
                self._lazy_evict(r, r.slots.length)
            self._write_tokens(r, 1, tags, full, swa)
            r.decoded += 1
        return self._make_batch(step, mode, len(prefill) + len(decode_part), tags, full, swa)

    def _lazy_evict(self, req: Request, prefix_len: int) -> None:
        s = req.slots
        begin = s.swa_evicted
        end = max(prefix_len - self.window, 0)
        end -= end % self.page
        if end > begin:
            swa = s.swa[begin:end].copy()
            self._mapping_changed.append(s.full[begin:end].copy())
            self.alloc.evict_swa(s, end)
            self._freed_swa.append(swa)
            self._evicted_swa.append(swa)

    def _write_tokens(self, req: Request, n: int, tags, full, swa) -> None:
        s = req.slots
        start = s.length
        new_full = self.alloc.extend(s, n)
        tags.append(np.arange(req.tag_base + start, req.tag_base + start + n, dtype=np.int64))
        full.append(new_full)
        swa.append(s.swa[start:start + n].copy())

    def _make_batch(self, step: int, mode: str, num_requests: int, tags, full, swa):
        eng = self.sc.engine
        tags_a = np.concatenate(tags)
        full_a = np.concatenate(full)
        swa_a = np.concatenate(swa)
        real = int(full_a.shape[0])
        # DP attention: every rank pads to the largest token count over the ranks (pad value in loc)
        dp_len = real
        if eng.dp_size > 1:
            others = eng.dp_other_tokens.sample(self.rng, eng.dp_size - 1)
            if mode == "decode":
                # other ranks decode too: their batch sizes, bounded like ours
                others = np.minimum(others, max(eng.cuda_graph_bs[-1], real))
            dp_len = max(real, int(others.max()))
        loc = np.full(dp_len, self.pad_value, dtype=np.int64)
        loc[:real] = full_a
        graph, padded = "eager", dp_len
        if mode == "decode" and eng.cuda_graph:
            cap = smallest_capture(eng.cuda_graph_bs, dp_len)
            if cap is not None:
                graph, padded = "decode_graph", cap
        elif mode in ("extend", "mixed") and eng.piecewise_cuda_graph:
            cap = smallest_capture(eng.piecewise_capture_sizes, dp_len)
            if cap is not None:
                graph, padded = "piecewise", cap
        batch = ForwardBatch(step=step, mode=mode, graph=graph, out_cache_loc=loc, num_token_non_padded=real,
                             padded_len=padded, pad_value=self.pad_value, num_requests=num_requests)
        truth = BatchTruth(
            tags=tags_a, full_slots=full_a, swa_slots=swa_a,
            freed_full=_cat(self._freed_full), freed_swa=_cat(self._freed_swa),
            evicted_swa=_cat(self._evicted_swa),
            mapping_changed=_cat(self._mapping_changed + [full_a]),
        )
        self._mapping_changed.clear()
        self._freed_full.clear()
        self._freed_swa.clear()
        self._evicted_swa.clear()
        return batch, truth


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else _EMPTY
