"""How the scheduler turns a forward's writes into a :class:`~simulator.scheduling.batch.ForwardBatch`
and its :class:`~simulator.scheduling.batch.BatchTruth`, a mixin of
:class:`~simulator.scheduling.scheduler.Scheduler`.

Padding is applied as the engine does: DP-attention padding first (to the largest token count over the
DP ranks, pad value in ``out_cache_loc``; the release's ``dp_padding`` plans it), then the graph's
capture size. The truth carries what the scheduler freed, evicted and re-mapped since the previous
batch; making a batch clears that record.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from simulator.records import STATIC_GRAPHS
from simulator.scenario.capture import smallest_capture
from simulator.scheduling.batch import BatchRequests, BatchTruth, ForwardBatch

_EMPTY = np.zeros(0, dtype=np.int64)


class BatchMaking:
    """Batches and their truth from the per-request arrays a forward wrote (tags, full and SWA slots)."""

    #: the read check's content keys (None: each request's own tags); a sharing scheduler sets its own
    _content_keys = None

    #: the decode part's requests when ``_vector_decode`` wrote it (one tag array for all of them)
    _block: Optional[BatchRequests] = None

    def _make_batch(self, step: int, mode: str, num_requests: int, tags, full, swa, per_request: int = 1,
                    graph_kind: Optional[str] = None):
        """Pad a batch (DP attention, then the graph's capture size) and pair it with the oracle's truth.

        ``graph_kind`` names the batch-size graph runner of a speculative forward (``per_request``
        tokens per request); plain decode and extend batches choose their graphs as before.
        """
        if self._block is not None and len(tags) == 1:
            # (a vectorised decode part alone: its own arrays, made for this batch and held by no one else)
            tags_a, full_a, swa_a = tags[0], full[0], swa[0]
        else:
            tags_a, full_a, swa_a = np.concatenate(tags), np.concatenate(full), np.concatenate(swa)
        real = int(full_a.shape[0])
        dp_len, basis, prefill_graph = self._dp_padding(mode, real, per_request, graph_kind)
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
        return batch, self._take_truth(tags_a, full_a, swa_a, [full_a], self._content_keys)

    def _dp_padding(self, mode: str, real: int, per_request: int,
                    graph_kind: Optional[str]) -> tuple[int, int, bool]:
        """DP attention: every rank pads to the largest token count over the ranks (pad value in loc). The
        padded length, the token count the graph is chosen on, and whether a prefill graph may run."""
        eng = self.sc.engine
        if eng.dp_size <= 1:
            return real, real, True
        others = eng.dp_other_tokens.sample(self.rng, eng.dp_size - 1)
        if mode == "decode" or graph_kind is not None:
            # other ranks decode too: their batch sizes, bounded like ours
            others = np.minimum(others, max(eng.cuda_graph_bs[-1] * per_request, real))
        extend = mode in ("extend", "mixed")
        plan = self.release.dp_padding.plan(
            real=real, others=others, extend=extend, dp_size=eng.dp_size, attn_tp_size=eng.attn_tp_size,
            prefill_graph_sizes=eng.piecewise_capture_sizes if extend and eng.piecewise_cuda_graph else None)
        return plan.tokens, plan.graph_basis, plan.prefill_graph

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

    def _take_truth(self, tags: np.ndarray, full: np.ndarray, swa: np.ndarray, written: list[np.ndarray],
                    content_keys) -> BatchTruth:
        """The oracle's truth of a forward writing ``tags`` into ``full`` / ``swa``: with the frees, evictions
        and mapping changes recorded since the previous batch (plus ``written``: the full slots this
        forward newly maps), which are then cleared."""
        truth = BatchTruth(
            tags=tags, full_slots=full, swa_slots=swa,
            freed_full=_cat(self._freed_full), freed_swa=_cat(self._freed_swa),
            evicted_swa=_cat(self._evicted_swa),
            mapping_changed=_cat(self._mapping_changed + written),
            content_keys=content_keys,
        )
        self._clear_pending()
        return truth

    def _batch_requests(self, tags: list) -> BatchRequests:
        """The batch's requests as metadata init reads them, from its per-request tag arrays (the last
        one all of a vectorised decode part's: those requests are kept whole, ``_vector_decode``)."""
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
