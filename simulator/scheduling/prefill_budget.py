"""One scheduling pass's admission budget with the radix cache on: how SGLang 0.5.23 decides who is admitted.

The release's ``PrefillAdder`` over its hybrid allocator's ``SWAPrefillBudget`` (managers/schedule_policy.py,
mem_cache/prefill_budget.py), modelled in our own terms. Nothing is reserved across passes: each pass counts what is
free now plus what the tree could evict (its unlocked nodes), less what the running requests may still decode and
what this pass has already admitted. A request is admitted when

* its prefill, its output and a page for alignment fit the Full side: ``extend + max_new + page`` below
  ``full_free + full_evictable - offset``, where the offset starts at the running requests' remaining outputs
  (every request ignores EOS, so each counts whole) plus the decode tokens a MIXED batch carries;
* its SWA need fits the SWA side (:func:`swa_need`, below ``swa_free + swa_evictable - swa_offset``), or, when it
  never could (the need is the whole SWA pool), a smaller chunk does;

then its chunk is cut to the pass's chunk budget (a truncated chunk ends on a page boundary) and charged. The
pass stops at the first request that does not fit, or once the chunk budget, the pass's prefill tokens
(``max_prefill_tokens``, 16,384) or a side's room is spent. Over a disabled tree (the radix cache off) the release
weighs each request as one that ignores EOS (:meth:`PrefillPass.admit_ignore_eos`). The
candidate's matched prefix is locked while it is weighed (it is no longer evictable), as the release's
``_lock_node`` does; the tree evicts only later, when the batch allocates.
"""
from __future__ import annotations

from dataclasses import dataclass


#: ``max_prefill_tokens`` (0.5.23's default): the prefill tokens one pass takes (``rem_input_tokens``)
MAX_PREFILL_TOKENS = 16384


def ceil_page(tokens: int, page: int) -> int:
    return -(-tokens // page) * page


def swa_need(extend: int, max_new: int, window: int, page: int, limit: int) -> int:
    """The SWA slots a request may hold at once (``estimate_swa_kv_tokens``): what its first chunk (up to
    ``limit``) leaves behind the window, plus a window's worth (less for a short request), plus a page."""
    tail = max(min(extend, limit) - window, 0)
    return tail + min(extend + max_new, window) + page


@dataclass
class PrefillPass:
    """The budget of one pass (see the module docstring); :meth:`rooms` reads the pools and the tree live."""

    page: int
    window: int
    swa_size: int
    chunk: int                 # the pass's chunk budget left (rem_chunk_tokens)
    offset: int                # Full tokens promised: running outputs, MIXED decode tokens, admitted prefills
    swa_offset: int = 0        # SWA tokens promised to this pass's admissions
    admitted: int = 0          # chunks charged in this pass
    current: int = 0           # Full tokens this pass allocates now: MIXED decode tokens, admitted chunks
    inputs: int = MAX_PREFILL_TOKENS   # prefill tokens the pass may still take (rem_input_tokens)

    @classmethod
    def start(cls, sched, decoding: list) -> "PrefillPass":
        """A pass over ``sched`` (a SharingScheduler) whose running, decoding requests are ``decoding``."""
        eng = sched.sc.engine
        mixed = len(decoding) if eng.mixed_chunk else 0
        outputs = sum(max(r.spec.output_len - r.decoded, 0) for r in decoding)
        return cls(page=sched.page, window=sched.window, swa_size=sched.alloc.swa_size,
                   chunk=eng.chunked_prefill_size - mixed, offset=mixed + outputs, current=mixed,
                   inputs=MAX_PREFILL_TOKENS - mixed)

    def rooms(self, sched) -> tuple[int, int]:
        """(Full, SWA) tokens left to promise: free now plus evictable, less what is promised."""
        full_ev, swa_ev = sched.cache.evictable()
        return (sched.alloc.full_free + full_ev - self.offset,
                sched.alloc.swa_free + swa_ev - self.swa_offset)

    def open(self, sched) -> bool:
        """Whether the pass admits anyone more (``budget_state`` is CONTINUE)."""
        full, swa = self.rooms(sched)
        return self.chunk > 0 and self.inputs > 0 and full > 0 and swa > 0

    def continuing_chunk(self, sched, left: int) -> int:
        """The next chunk of the request being prefilled in chunks (``add_chunked_req``), 0 when none fits."""
        full, swa = self.rooms(sched)
        room = min(self.chunk, full, swa - self.page)
        return min(left, room) if room > 0 else 0

    def admit(self, sched, prefix: int, extend: int, max_new: int) -> int:
        """Weigh a new request (``prefix`` matched, ``extend`` to prefill, ``max_new`` tokens to sample): the
        tokens of its first chunk, or 0 when it does not fit (the pass then stops)."""
        full, swa = self.rooms(sched)
        if extend + max_new + self.page >= full:
            return 0
        limit = self.chunk
        need = swa_need(ceil_page(extend, self.page), max_new, self.window, self.page, limit)
        if need >= swa:
            if need < self.swa_size:
                return 0
            cap = (swa - swa_need(0, max_new, self.window, self.page, limit)) // self.page * self.page
            if cap <= 0:
                return 0
            limit = min(limit, cap)
        if ceil_page(extend, self.page) > limit:
            end = (prefix + limit // self.page * self.page) // self.page * self.page
            extend = end - prefix
            if extend <= 0:
                return 0
        return extend

    def admit_ignore_eos(self, sched, extend: int, max_new: int) -> int:
        """Weigh a new request over a disabled tree (``add_one_req_ignore_eos``: every request ignores EOS): its
        paged prefill and a page fit what is free less both what is promised and what this pass allocates, its
        SWA need (:func:`swa_need`, unpaged) the SWA room; then the whole prefill, or, past the pass's chunk
        budget, that budget (uncut to pages). 0: it does not fit (the pass then stops)."""
        full, swa = self.rooms(sched)
        now = full + self.offset - self.current
        if ceil_page(extend, self.page) + self.page > min(full, now):
            return 0
        if swa_need(extend, max_new, self.window, self.page, self.chunk) > swa:
            return 0
        return extend if extend <= self.chunk else max(self.chunk, 0)

    def charge(self, extend: int, max_new: int) -> None:
        """An admitted chunk of ``extend`` tokens (``max_new`` 0 while the prefill goes on in chunks)."""
        paged = ceil_page(extend, self.page)
        self.offset += paged + self.page + max_new
        self.current += paged + self.page
        self.inputs -= paged
        self.swa_offset += swa_need(paged, max_new, self.window, self.page, self.chunk)
        self.chunk -= paged
        self.admitted += 1


__all__ = ["MAX_PREFILL_TOKENS", "PrefillPass", "swa_need", "ceil_page"]
