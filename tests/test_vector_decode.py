"""Scheduler._vector_decode (one pop per free list for a decode step's requests) gives the per-request path's
forwards exactly: the same slots, tags, frees, evictions, mapping and batch requests, step by step, under both
releases' eviction rules (mid-2026's lazy evictions between the requests' allocations; 0.5.23's batched ones)
and both free-list orders, with retractions (reserve = "none") and pools small enough to run out of room."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simulator.memory.allocator import HybridAllocator
from simulator.engine_model.release_model import MID_2026, SGLANG_0_5_23
from simulator.scheduling.scheduler import Scheduler
from simulator.scheduling.workload import make_requests

from helpers import tiny

BASE = """
[model]
preset = "gpt-oss-20b"
[pool]
full_size = {full}
[workload]
requests = 40
rate = 2.0
arrival = "poisson"
prompt_len = {{ dist = "uniform", min = 20, max = 400 }}
output_len = {{ dist = "uniform", min = 1, max = 300 }}
[engine]
chunked_prefill_size = 512
{engine}
"""

FIELDS_T = ("tags", "full_slots", "swa_slots", "freed_full", "freed_swa", "evicted_swa", "mapping_changed")
FIELDS_R = ("rids", "seq_lens", "extend_lens", "tag_bases")


def _forwards(release, full: int, engine: str, vector: bool):
    sc = tiny(BASE.format(full=full, engine=engine))
    rng = np.random.default_rng(7)
    alloc = HybridAllocator(sc.pool.full_size, sc.pool.swa_size, sc.pool.page_size)
    sched = Scheduler(sc, alloc, make_requests(sc.workload, rng), rng, release=release)
    calls = {"vector": 0}
    if vector:
        inner = sched._vector_decode

        def counted(*a):
            ok = inner(*a)
            calls["vector"] += ok
            return ok
        sched._vector_decode = counted
    else:
        sched._vector_decode = lambda *a: False
    out = []
    for b, t in sched.steps():
        rq = b.requests
        out.append((b.mode, b.graph, b.out_cache_loc.tolist(), [getattr(t, f).tolist() for f in FIELDS_T],
                    [getattr(rq, f).tolist() for f in FIELDS_R], [id(s) for s in rq.slots],
                    alloc.full_to_swa.tobytes(), [p.tobytes() for p in alloc.free_pages()]))
    return out, calls["vector"], sched


@pytest.mark.parametrize("release", [MID_2026, SGLANG_0_5_23], ids=["mid-2026", "0.5.23"])
@pytest.mark.parametrize("full, engine", [
    (16384, "cuda_graph = true"),                  # room for all: plain decode steps
    (4096, 'reserve = "none"'),                    # decode grows the reservation and retracts
    (16384, "mixed_chunk = true"),                 # the decode part after a prefill chunk
])
def test_vector_decode_is_the_per_request_path(release, full, engine):
    own, _, _ = _forwards(release, full, engine, vector=False)
    fast, used, sched = _forwards(release, full, engine, vector=True)
    assert used > 50                               # the vectorised path ran on most decode steps
    assert len(fast) == len(own)
    for i, (a, b) in enumerate(zip(own, fast)):
        assert a[:5] == b[:5], f"forward {i} differs"
        assert a[6:] == b[6:], f"allocator state after forward {i} differs"
    if 'reserve = "none"' in engine:
        assert sched.retractions > 0


def test_vector_decode_evicts_between_the_requests_pops():
    """mid-2026 frees a request's out-of-window SWA pages just before its own allocation: the request takes the
    page it freed (LIFO), not the one the per-request path would have given the next request."""
    rel = dataclasses.replace(MID_2026)
    own, _, _ = _forwards(rel, 16384, "cuda_graph = true", vector=False)
    evicting = [f for f in own if f[0] == "decode" and f[3][5]]     # decode steps with evictions
    assert evicting
    fast, _, _ = _forwards(rel, 16384, "cuda_graph = true", vector=True)
    assert [f[3] for f in fast] == [f[3] for f in own]


def test_decode_candidates_only_where_they_answer_for_the_decode_point_in_force():
    """The vector decode asks ``decode_point`` only of a release's ``decode_candidates`` where the class that
    defines ``decode_point`` defines them too (a policy that overrides ``decode_point`` alone, or an instance
    given its own, is asked about every request)."""
    import numpy as np

    from simulator.engine_model.release_model import EvictionContext, MidYear2026Eviction
    from simulator.scheduling.vector_decode import _decode_candidates

    base = MidYear2026Eviction()
    ctx = EvictionContext(window=4, page_size=1, chunked_prefill_size=64)
    got = _decode_candidates(base)
    assert got is not None and got(ctx, np.array([0, 1, 5, 6, 9])).tolist() == [False, True, True, False, True]

    class EveryOther(MidYear2026Eviction):
        def decode_point(self, ctx, *, length, evicted, decoded, decode_batches):
            return length if decoded % 2 == 0 else None

    class Both(EveryOther):
        def decode_candidates(self, ctx, decoded):
            return decoded % 2 == 0

    assert _decode_candidates(EveryOther()) is None
    assert _decode_candidates(Both()) is not None
    own = MidYear2026Eviction()
    own.decode_point = lambda ctx, **kw: None
    assert _decode_candidates(own) is None
    assert _decode_candidates(object()) is None


def test_decode_candidates_agree_with_the_mro_formula():
    """The one-loop MRO scan gives what the first-index formula gave (the class that defines decode_candidates
    at or before the one that defines decode_point), over subclasses, mixins, slots classes, instance attributes."""
    import numpy as np

    from simulator.engine_model.release_model import MidYear2026Eviction, Sglang0523Eviction
    from simulator.scheduling.vector_decode import _decode_candidates

    def formula(eviction):
        fn = getattr(eviction, "decode_candidates", None)
        if fn is None or "decode_point" in getattr(eviction, "__dict__", {}) \
                or "decode_candidates" in getattr(eviction, "__dict__", {}):
            return None
        mro = type(eviction).__mro__
        where = {name: next((i for i, c in enumerate(mro) if name in c.__dict__), len(mro))
                 for name in ("decode_point", "decode_candidates")}
        return fn if where["decode_candidates"] <= where["decode_point"] else None

    def point(self, ctx, **kw):
        return None

    def cands(self, ctx, decoded):
        return np.zeros(decoded.shape, dtype=bool)

    class Point(MidYear2026Eviction):
        decode_point = point

    class Cands(MidYear2026Eviction):
        decode_candidates = cands

    class Mixin:
        decode_candidates = cands

    class MixedFirst(Mixin, Point):
        pass

    class MixedLast(Point, Mixin):
        pass

    class CandsOnly:
        decode_candidates = cands

    class Neither:
        pass

    class Slotted(MidYear2026Eviction):
        __slots__ = ()

    objs = [MidYear2026Eviction(), Sglang0523Eviction(), Point(), Cands(), MixedFirst(), MixedLast(), CandsOnly(),
            Neither(), Slotted()]
    for o in (MidYear2026Eviction(), Cands()):
        o.decode_candidates = lambda ctx, decoded: decoded > 0
        objs.append(o)
    for o in objs:
        got, want = _decode_candidates(o), formula(o)
        assert (got is None) == (want is None) and (got is None or got == want), type(o).__name__
