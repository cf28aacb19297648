"""The scheduler's speculative forwards (EAGLE, chain drafting, topk 1), a mixin of
:class:`~simulator.scheduling.scheduler.Scheduler`.

A prefill batch is followed by the draft model's DRAFT_EXTEND over the same tokens. A decode round is the
release's choice (``draft_columns``):

* mid-2026: ``num_steps`` DRAFT_DECODE forwards (one token per request each) in slots held for the round's
  drafting only and given back before the verify, one TARGET_VERIFY forward (``num_draft_tokens`` tokens per
  request), then a DRAFT_EXTEND forward over the tokens the target accepted; the rejected ones give their
  slots back first;
* SGLang 0.5.23 (spec v2): the round's window of ``num_draft_tokens`` slots per request is allocated once;
  ``num_steps - 1`` DRAFT_DECODE forwards write its columns ``0 .. num_steps - 2`` (the draft worker breaks
  before the last step's forward: ``draft_forward``), TARGET_VERIFY writes the whole window, the
  DRAFT_EXTEND_V2 after it rewrites the whole window in the draft's pools (accepted or not:
  ``prepare_for_draft_extend``), and only then do the rejected slots go back.

The rounds allocate, evict and pad through the scheduler's own steps (``_write_tokens``,
``_lazy_evict``, ``_make_batch``), so a subclass that changes those changes the rounds the same way.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import numpy as np

from simulator.scheduling.batch import BatchTruth, ForwardBatch


class SpeculativeRounds:
    """The speculative forwards of a :class:`~simulator.scheduling.scheduler.Scheduler` whose ``spec`` is set."""

    def _draft_batch(self, batch: ForwardBatch, truth: BatchTruth) -> tuple[ForwardBatch, BatchTruth]:
        """DRAFT_EXTEND after a prefill: the same out_cache_loc, run eagerly by the draft model."""
        b = ForwardBatch(step=self._step, mode="draft_extend", graph="eager", out_cache_loc=batch.out_cache_loc,
                         num_token_non_padded=batch.num_token_non_padded, padded_len=batch.dp_padded_len,
                         pad_value=batch.pad_value, num_requests=batch.num_requests, requests=batch.requests,
                         of_prefill=True)
        # its slots' mapping was counted with the prefill's batch: only the changes since then
        t = self._take_truth(truth.tags, truth.full_slots, truth.swa_slots, [], None)
        return b, t

    def _speculative_round(self, reqs: list) -> Iterator[tuple[ForwardBatch, BatchTruth]]:
        """One EAGLE round (topk 1): draft decode steps, target verify, draft extend over the accepted tokens."""
        spec = self.spec
        assert spec is not None
        d = spec.num_draft_tokens
        self._evict_for_round(reqs)
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

    def _evict_for_round(self, reqs: list) -> None:
        """Each request's lazy SWA eviction by position before a round (one free group where the release
        groups frees): a round adds up to num_draft_tokens tokens at once; the round counts as a decode batch."""
        with self.alloc.free_group(self._grouped):
            for r in reqs:
                s = r.slots
                point = self._eviction.speculative_point(self._ev_ctx, length=s.length, evicted=s.swa_evicted,
                                                         decode_batches=r.decode_batches)
                if point is not None:
                    self._lazy_evict(r, point)
                r.decode_batches += 1

    def _speculative_round_columns(self, reqs: list) -> Iterator[tuple[ForwardBatch, BatchTruth]]:
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
        for i in range(spec.num_steps - 1):
            cols = [start + i for start in starts]
            tags = [np.array([r.tag_base + c], dtype=np.int64) for r, c in zip(reqs, cols)]
            full = [r.slots.full[c:c + 1].copy() for r, c in zip(reqs, cols)]
            swa = [r.slots.swa[c:c + 1].copy() for r, c in zip(reqs, cols)]
            batch, truth = self._make_batch(self._step, "draft_decode", len(reqs), tags, full, swa, per_request=1,
                                            graph_kind="draft_graph")
            yield replace(batch, draft_step=i), truth
        tags = [np.arange(r.tag_base + st, r.tag_base + st + d, dtype=np.int64) for r, st in zip(reqs, starts)]
        full = [r.slots.full[st:st + d].copy() for r, st in zip(reqs, starts)]
        swa = [r.slots.swa[st:st + d].copy() for r, st in zip(reqs, starts)]
        yield self._make_batch(self._step, "target_verify", len(reqs), tags, full, swa, per_request=d,
                               graph_kind="decode_graph")
        # DRAFT_EXTEND_V2 over the whole window, then the rejected slots go back
        accepted = self._accepted(len(reqs))
        batch, truth = self._make_batch(self._step, "draft_extend", len(reqs), tags, full, swa, per_request=d,
                                        graph_kind="draft_extend_graph")
        yield replace(batch, accepted=accepted), truth
        with self.alloc.free_group(self._grouped):
            for r, start, a in zip(reqs, starts, accepted.tolist()):
                self._give_back(r, start + a)
                r.decoded += a

    def _accepted(self, n: int) -> np.ndarray:
        """Per request of a round: 1 + its leading accepted drafts (the chain stops at the first reject)."""
        d = self.spec.num_draft_tokens
        drafts_ok = self.rng.random((n, d - 1)) < self.spec.accept_rate
        return 1 + np.cumprod(drafts_ok, axis=1).sum(axis=1)

    def _accept_round(self, reqs: list, starts: list[int]) -> tuple[ForwardBatch, BatchTruth]:
        """The end of a speculative round: each request accepts 1 + its leading accepted drafts, the rest
        give their slots back (in one free group where the release groups frees); then DRAFT_EXTEND, the
        draft's K/V of the accepted tokens, in the draft-extend graph runner."""
        d = self.spec.num_draft_tokens
        accepted = self._accepted(len(reqs))
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

    def _give_back(self, req, length: int) -> None:
        """Rejected speculative slots past ``length`` go back to the free lists (full and SWA)."""
        s = req.slots
        if length >= s.length:
            return
        self._freed_full.append(s.full[length:s.length].copy())
        self._freed_swa.append(s.swa[length:s.length].copy())
        self._mapping_changed.append(s.full[length:s.length].copy())
        self.alloc.truncate(s, length)
