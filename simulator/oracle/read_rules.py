"""The read check's rules: what a correct read table reads, and why a read is stale (class ``stale_read``).

A backend's read table (``Design.read_ids``, simulator/designs/base.py) lists per request a run of consecutive
positions and the slot each is read at. :class:`TableCheck` holds it to two things, both exact:

* **its shape**: a correct table reads exactly the request's :class:`ReadSpan`: full layers the whole prefix
  ``[0, seq_len)`` (:func:`prefix_span`), SWA layers the window of every new token (:func:`window_span`:
  ``window`` positions ending at each new token, so from ``seq_len - extend_len + 1 - window``, floored at 0,
  to ``seq_len``: decode, extend, target verify's draft tokens, draft extend alike). An entry outside it is
  stale whatever its slot holds (one position before the window's first is as wrong as a freed slot: the
  engine may keep that slot mapped, page-floored and one eviction late, but attention must not read it); a
  position of it that the table leaves out is stale too (slot -1: nothing is read there). A position the
  request does not have (negative, or past its seq_len) is stale and never reaches the content keys;
* **each entry's slot**: live, holding the content key of its (request, position) by the reference.

Where a design's ``read_ids`` is declared ``base_reads`` its table is the base formula's (or the part of it not
known clean, cuda_path/read_cache.py), exact by construction: then only the positions are held to the request's
(no span is given). Every difference is one ``stale_read`` per (forward, request, position) and kind, its reason
from :data:`READ_RULES`, in (request, position) order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from simulator.oracle.reference import ReferencePool
from simulator.records import Finding, Owner
from simulator.scheduling.batch import own_tags


@dataclass(frozen=True, slots=True)
class ReadSpan:
    """The positions a correct read table reads, per request (batch order): ``[lo, hi)``. ``name`` says which
    (``prefix``: every position with K/V, full layers; ``window``: the SWA window of every new token)."""

    lo: np.ndarray                   # int64 per request
    hi: np.ndarray                   # int64 per request: its seq_len
    name: str
    window: int = 0                  # the window of a "window" span


def prefix_span(seq_lens: np.ndarray) -> ReadSpan:
    """What full layers read (and SWA layers where the graph path builds no window indices, B4): ``[0, seq_len)``."""
    seq = np.asarray(seq_lens, dtype=np.int64)
    return ReadSpan(np.zeros_like(seq), seq, "prefix")


def window_span(seq_lens: np.ndarray, extend_lens: np.ndarray, window: int) -> ReadSpan:
    """What SWA layers read: the window of each new token, the ``window`` positions ending at it, together
    ``[max(0, seq_len - extend_len + 1 - window), seq_len)`` (decode: the last ``window`` positions; extend,
    target verify and draft extend: from the first new token's window to the last new token). Exact at the
    window's first position and at page boundaries alike: what eviction keeps mapped before the window
    (page-floored, one cadence late) is not read."""
    seq = np.asarray(seq_lens, dtype=np.int64)
    return ReadSpan(np.maximum(seq - np.asarray(extend_lens, dtype=np.int64) + (1 - window), 0), seq, "window",
                    int(window))


@dataclass(frozen=True, slots=True)
class ReadFacts:
    """What the checker knows about one read that does not hold its expected content, or that a correct table
    does not make (or makes and this one leaves out), for the rules below."""

    slot: int
    rows: int                        # rows of the sub-pool read
    reserved: bool                   # the reserved / padding page (slot 0, the sink) or a dummy request's
    live: bool                       # the reference holds a live token there
    evicted: bool                    # freed by out-of-window eviction (SWA), not by a finish
    last: Optional[Owner]            # the slot's last (or current) owner by the reference, None if never written
    pos: int = 0                     # the position read
    seq_len: int = 1                 # the request's positions with K/V: [0, seq_len)
    span: tuple[int, int, str] = (0, 1, "prefix")   # (lo, hi, name): the positions a correct table reads
    omitted: bool = False            # a position of the span the table does not read (no slot: ``slot`` is -1)
    reserved_words: str = "the sink / padding slot"     # the reserved page as the run's convention names it


def _span_words(f: ReadFacts) -> str:
    lo, hi, name = f.span
    return f"its {name} [{lo}, {hi})"


#: Why a read is stale (class ``stale_read``): (reason or None when the rule does not apply); first match wins.
#: The first four are the table's shape, exact: a position the request does not have, one of the span a correct
#: table reads that this one leaves out (too narrow), one outside that span (too wide, at the window's first
#: position as anywhere: eviction keeping a slot mapped does not make its read right); then the slot's content.
READ_RULES: tuple[Callable[[ReadFacts], Optional[str]], ...] = (
    lambda f: f"position {f.pos} is past the request's length ({f.seq_len} positions with K/V)"
    if f.pos >= f.seq_len else None,
    lambda f: f"position {f.pos} is before the request's first" if f.pos < 0 else None,
    lambda f: f"the table leaves out position {f.pos} of {_span_words(f)}" if f.omitted else None,
    lambda f: None if f.span[0] <= f.pos < f.span[1] else f"position {f.pos} is outside {_span_words(f)}",
    lambda f: None if 0 <= f.slot < f.rows else f"slot {f.slot} is outside the pool [0, {f.rows})",
    lambda f: f"slot {f.slot} is {f.reserved_words}" if f.reserved else None,
    lambda f: None if f.live else (f"the slot was {'evicted out of the window' if f.evicted else 'freed'}"
                                   + (f" (last held {f.last.label})" if f.last is not None else "")),
    lambda f: f"the slot was reassigned to another token ({f.last.label if f.last else 'unknown'})",
)


def read_reason(facts: ReadFacts) -> str:
    for rule in READ_RULES:
        msg = rule(facts)
        if msg is not None:
            return msg
    raise AssertionError("READ_RULES end with a rule that always matches")


def omitted_positions(odd: np.ndarray, start: np.ndarray, lens: np.ndarray, lo: np.ndarray,
                      hi: np.ndarray) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """(request rows, positions) of ``[lo, hi)`` that the requests ``odd`` do not read (their table reads the
    consecutive positions ``[start, start + lens)``), or None when there are none."""
    rs, ps = [], []
    for r in odd.tolist():
        a, b = int(lo[r]), int(hi[r])
        s = e = a
        if lens[r] > 0:
            s, e = int(start[r]), int(start[r] + lens[r])
        for x, y in ((a, min(b, s)), (max(a, e), b)):
            if y > x:
                ps.append(np.arange(x, y, dtype=np.int64))
                rs.append(np.full(y - x, r, dtype=np.int64))
    if not ps:
        return None
    return np.concatenate(rs), np.concatenate(ps)


class TableCheck:
    """One side's read-table check against its reference (the :class:`~simulator.oracle.checker.Checker` keeps
    its cache)."""

    def __init__(self, reference: ReferencePool, reserved: np.ndarray, owner_of: Callable[[int], Owner],
                 reserved_words: str = "the sink / padding slot"):
        self.reference = reference
        self.reserved = reserved
        self.reserved_words = reserved_words
        self.owner_of = owner_of

    def _owner(self, tag: int) -> Owner:
        return self.owner_of(int(tag))

    def check(self, step, backend, kind, ids, requests, content_keys, rows, layer, n_layers, skip, span):
        """:meth:`Checker.check_reads` without its cache: (findings, the flat entries found stale)."""
        idx = ids.indices.cpu().numpy().astype(np.int64, copy=False)
        n = idx.shape[0]
        indptr = ids.indptr.cpu().numpy()
        start = ids.start.cpu().numpy()
        lens = np.diff(indptr)
        seq = np.asarray(requests.seq_lens, dtype=np.int64)
        lo, hi = (np.zeros_like(seq), seq) if span is None else (span.lo, span.hi)
        # the table's shape per request: exactly [lo, hi) (without a span: inside [0, seq_len)); O(requests)
        if span is None:
            shaped = (lens == 0) | ((start >= 0) & (start + lens <= seq))
        else:
            shaped = (lens == hi - lo) & ((start == lo) | (lens == 0))
        odd = None if bool(shaped.all()) else np.flatnonzero(~shaped)
        omitted = omitted_positions(odd, start, lens, lo, hi) if odd is not None and span is not None \
            and skip is None else None
        if n == 0 and omitted is None:
            return [], np.zeros(0, dtype=np.int64)
        row_of = pos = outside = None
        if odd is not None or content_keys is not None:
            row_of = np.repeat(np.arange(lens.shape[0]), lens)
            pos = np.arange(n, dtype=np.int64) - indptr[:-1][row_of] + start[row_of]
            if odd is not None:
                outside = (pos < lo[row_of]) | (pos >= hi[row_of])
                outside = outside if outside.any() else None
        keys = self._keys(requests, content_keys, start, indptr, lens, row_of, pos, outside, seq)
        bad = self._stale_entries(kind, idx, keys, rows)
        if outside is not None:
            bad = np.union1d(bad, np.flatnonzero(outside))
        if bad.size and row_of is None:
            row_of = np.repeat(np.arange(lens.shape[0]), lens)
            pos = np.arange(n, dtype=np.int64) - indptr[:-1][row_of] + start[row_of]
        if skip is not None and skip.size and bad.size:
            bad = bad[~np.isin(bad, skip)]
        if bad.size == 0 and omitted is None:
            return [], bad
        spans = (lo, hi, "prefix" if span is None else span.name)
        also = f" (and {n_layers - 1} more {kind} layers reading the same table)" if n_layers > 1 else ""
        where = (step, backend, kind, layer, also, requests, seq, spans)
        found = self._stale_findings(where, idx, keys, bad, row_of, pos, rows)
        if omitted is not None:
            found = self._merge_omitted(where, found, omitted, content_keys)
        return [f for _, f in found], bad

    @staticmethod
    def _keys(requests, content_keys, start, indptr, lens, row_of, pos, outside, seq) -> np.ndarray:
        """Each entry's content key: own tags (entry j of request r: ``tag_base[r] + start[r] + j - indptr[r]``)
        or the scheduler's, asked for the request's own positions only (past its length there is no content)."""
        n = indptr[-1]
        if content_keys is None:
            return np.repeat(requests.tag_bases + start - indptr[:-1], lens) + np.arange(n, dtype=np.int64)
        if outside is None:
            return content_keys(requests, row_of, pos)
        keys = np.zeros(n, dtype=np.int64)
        mine = ~outside & (pos >= 0) & (pos < seq[row_of])
        keys[mine] = content_keys(requests, row_of[mine], pos[mine])
        return keys

    def _stale_entries(self, kind: str, idx: np.ndarray, keys: np.ndarray, rows: int) -> np.ndarray:
        """The flat entries whose slot does not hold its key live (outside the pool included)."""
        live_tag = self.reference.live_tag[kind]      # 0 where not live: never a real tag
        hi = min(rows, live_tag.shape[0])
        if idx.size == 0:
            return np.zeros(0, dtype=np.int64)
        if int(idx.min()) >= 0 and int(idx.max()) < hi:
            return np.flatnonzero(live_tag[idx] != keys)
        inr = (idx >= 0) & (idx < hi)
        return np.flatnonzero(~inr | (live_tag[np.where(inr, idx, 0)] != keys))

    def _stale_findings(self, where, idx, keys, bad, row_of, pos, rows) -> list[tuple[tuple[int, int], Finding]]:
        """One finding per stale entry, each with its (request row, position) to order by."""
        step, backend, kind, layer, also, requests, seq, (lo, hi, name) = where
        exp, live = self.reference.expected[kind], self.reference.live[kind]
        hi_rows = min(rows, exp.shape[0])
        evicted = self.reference.evicted if kind == "swa" else None
        reserved = np.isin(idx[bad], self.reserved)
        out = []
        for j, e in enumerate(bad.tolist()):
            slot, r, p = int(idx[e]), int(row_of[e]), int(pos[e])
            in_range = 0 <= slot < hi_rows
            tag = int(exp[slot]) if in_range else 0
            is_live = in_range and bool(live[slot])
            n_r = int(seq[r])
            facts = ReadFacts(slot=slot, rows=rows, reserved=bool(reserved[j]), live=is_live,
                              evicted=bool(evicted is not None and in_range and evicted[slot]),
                              last=self._owner(tag) if tag != 0 else None, pos=p, seq_len=n_r,
                              span=(int(lo[r]), int(hi[r]), name), reserved_words=self.reserved_words)
            observed = (self._owner(tag) if is_live else Owner(0)) if in_range else None
            expected = self._owner(int(keys[e])) if 0 <= p < n_r else None
            msg = (f"req {int(requests.rids[r])} pos {p} reads {kind} slot {slot} at layer {layer}{also}: "
                   f"{read_reason(facts)}")
            out.append(((r, p), Finding(step, backend, layer, kind, "stale_read", slot, expected, observed, msg)))
        return out

    def _merge_omitted(self, where, found, omitted, content_keys):
        """The positions of the span the table leaves out (nothing read there: slot -1), merged into ``found`` by
        (request row, position)."""
        step, backend, kind, layer, also, requests, seq, (lo, hi, name) = where
        r_of, p_of = omitted
        keys = (content_keys or own_tags)(requests, r_of, p_of)
        for r, p, k in zip(r_of.tolist(), p_of.tolist(), keys.tolist()):
            facts = ReadFacts(slot=-1, rows=0, reserved=False, live=False, evicted=False, last=None, pos=p,
                              seq_len=int(seq[r]), span=(int(lo[r]), int(hi[r]), name), omitted=True)
            msg = (f"req {int(requests.rids[r])} pos {p} is not read by the {kind} table at layer {layer}{also}: "
                   f"{read_reason(facts)}")
            found.append(((r, p), Finding(step, backend, layer, kind, "stale_read", -1, self._owner(int(k)), None,
                                          msg)))
        found.sort(key=lambda x: x[0])
        return found
