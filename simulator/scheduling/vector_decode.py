"""The plain scheduler's decode part written at once, a mixin of
:class:`~simulator.scheduling.scheduler.Scheduler`: the same allocations, in the same order, as one
token per request through ``_write_tokens``, without a Python pass per request over the allocator.

On the model's allocator at page size 1 one token per request takes one page from each free list, so
the requests' pops are one pop of len(reqs) pages: the full list gets no frees in between; the SWA list
is popped up to each request whose lazy eviction may free pages, before it evicts.
"""
from __future__ import annotations

from operator import ge

import numpy as np

from simulator.memory.allocator import HybridAllocator
from simulator.scheduling.batch import BatchRequests


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


class VectorDecode:
    """The decode part of the plain scheduler (the scheduler asks only for its own class: a subclass's
    ``_write_tokens`` or ``_lazy_evict`` may do more than the allocator's pops)."""

    def _vector_decode(self, reqs: list, tags, full, swa, evict: bool) -> bool:
        """``_decode_tokens`` on the model's allocator at page size 1, with the same allocations in the same
        order. Appends one array for the whole decode part and keeps the requests for ``_batch_requests``.
        False (nothing done): another allocator or page size, a journal, speculative decoding, a decode
        part already kept, or a request or free list without room (the per-request path then raises where
        it would)."""
        a = self.alloc
        if type(a) is not HybridAllocator or self.page != 1 \
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

    def _vector_swa_pops(self, reqs: list, evict: bool) -> np.ndarray:
        """The SWA pages of :meth:`_vector_decode`'s requests, one per request in order: popped in runs
        up to each request whose lazy eviction may free pages (the release's ``_decode_point``), which
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
