"""The unified pool's invariants: what must hold between its page tables, spans, holes and requests.

Checked by the tests after each operation, never by a run: a violation is a bug in the model itself, not in
the design under test, so it is an assertion naming the broken relation rather than a finding.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simulator.memory.allocator import RequestSlots

if TYPE_CHECKING:
    from simulator.memory.unified_pool import UnifiedPool


def check_unified_invariants(pool: "UnifiedPool", requests: list[RequestSlots] = ()) -> None:
    """Both sides' tables agree and stay inside their spans, the sides do not cross, and each request's
    virtual pages are its own and bound where its window needs them."""
    for side in (pool.full, pool.swa):
        v2p, p2v = side.v2p, side.p2v
        bound = np.flatnonzero(v2p[1:] > 0) + 1
        phys = v2p[bound]
        assert np.unique(phys).size == phys.size, f"{side.name}: a physical page bound twice"
        assert (p2v[phys] == bound).all(), f"{side.name}: p2v disagrees with v2p"
        owned = np.flatnonzero(p2v[1:] >= 0) + 1
        assert owned.size == phys.size == side.live, f"{side.name}: {owned.size} owned, {side.live} live"
        assert v2p[0] == 0 and p2v[0] == 0, f"{side.name}: the sink moved"
        span = set(side.in_span().tolist())
        assert set(owned.tolist()) <= span, f"{side.name}: a live page outside the span"
        assert len(set(side.holes)) == len(side.holes), f"{side.name}: a hole listed twice"
        assert set(side.holes) <= span - set(owned.tolist()), f"{side.name}: a hole that is live or outside"
        assert side.span() == side.live + len(side.holes), f"{side.name}: span is not live + holes"
    assert pool.swa.high_bytes() <= pool.full.low_bytes(), "the two sides cross"
    assert pool.bytes_in_use() <= pool.budget_bytes, "the byte budget is exceeded"
    # every SWA-bound virtual page is bound on the full side
    swa_bound = np.flatnonzero(pool.swa.v2p[1:] > 0) + 1
    assert (pool.full.v2p[swa_bound] > 0).all(), "an SWA page bound to a virtual page the full side lacks"
    p = pool.page_size
    seen: set[int] = set()
    for r in requests:
        virt = r.full[: r.length:p] // p
        assert not seen.intersection(virt.tolist()), "a virtual page live in two requests"
        seen.update(virt.tolist())
        assert (pool.full.v2p[virt] > 0).all(), "a request's virtual page is not bound full-side"
        first = (r.swa_evicted - r.swa_evicted % p) // p
        assert (pool.swa.v2p[virt[first:]] > 0).all(), "a live window page is not bound SWA-side"
        ev = virt[: r.swa_evicted // p]
        assert (pool.swa.v2p[ev] == -1).all(), "a tombstoned page still owns an SWA page"
