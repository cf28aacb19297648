"""The base read table of the GPU step runner, incremental over steps (cuda_path/step.py).

The read check compares every entry of every request's read table with the oracle: entry (request r, position
p) reads slot ``idx`` and must find the tag ``tag_base[r] + p`` live there (own tags, no shared content). An entry
found so at one step stays so until the oracle's tag at its slot changes (a free, a write, a KV transfer: the
step's truth lists each) or the entry itself changes: a full entry is ``slots.full[p]`` of the request's
``RequestSlots`` (changed only after that slot was freed, or with a new ``RequestSlots`` on a retraction), an
SWA entry ``full_to_swa[slots.full[p]]`` (changed only where the step's ``mapping_changed`` lists the full slot).
So per request the runner keeps the positions checked clean, ``[lo, hi)``, and per slot which (request,
position) was checked clean there; each step cuts a request's range at the first position whose slot (or, for
SWA, whose full slot's mapping) the step's truth touched, and the table it builds holds only the entries past
the range: the checker finds in it exactly the entries it would find stale in the whole table, with the same
request rows, positions, slots and messages, in the same order (tests/test_step_runner.py compares the findings
with the run's own step on scenarios with stale reads).
"""
from __future__ import annotations

from operator import attrgetter, getitem
from typing import Optional

import numpy as np
import torch

from simulator.designs.types import ReadIds, ReadTable

_EMPTY = np.zeros(0, dtype=np.int64)
_FULL = attrgetter("full")
_POS = np.int64(0xFFFFFFFF)


class _Kind:
    """One kind's clean ranges (per request id) and slot owners of one oracle (for SWA, owners by full slot too).

    An owner is ``(request id << 32) | position`` (:func:`_owner`), -1 for none: one array per slot kind, so that
    a cut reads one array where the slots' owners are mostly out of cache (a free's, an eviction's).
    ``banded``: a clean range may start past 0 (SWA; a full kind's ``dlo`` is 0 or -1 and every recorded position
    is at least 0, so an entry is never below its range there and :meth:`cut` spares the comparison)."""

    __slots__ = ("own", "fown", "dlo", "dhi", "banded")

    def __init__(self, rows: int, full_rows: int = 0, banded: bool = True):
        self.own = np.full(rows, -1, dtype=np.int64)
        self.fown = np.full(full_rows, -1, dtype=np.int64)
        self.dlo, self.dhi = (np.full(0, -1, dtype=np.int64) for _ in range(2))   # per request id: [dlo, dhi)
        self.banded = banded

    def grow(self, n: int) -> None:
        if n > self.dlo.shape[0]:
            self.dlo, self.dhi = (_grown(a, n) for a in (self.dlo, self.dhi))

    def cut(self, slots: np.ndarray, by_full: bool = False) -> None:
        """The clean entries reading ``slots`` (``by_full``: whose full slot is one of them) are clean no more:
        their requests' clean ranges end before them (a range ``[lo, hi)`` is cut only by its own positions:
        an entry below ``lo``, such as one of the SWA slots a request's window left, ends nothing)."""
        got = self._hits(slots, by_full)
        if got is not None:
            self._end(*got)

    def cut_both(self, slots: np.ndarray, full_slots: np.ndarray) -> None:
        """``cut(slots)`` then ``cut(full_slots, by_full=True)``, their ranges ended at once (one minimum over
        both: the same ends, as each owner array is cleared by its own slots only)."""
        a, b = self._hits(slots, False), self._hits(full_slots, True)
        if a is None or b is None:
            if a is not None or b is not None:
                self._end(*(a if b is None else b))
            return
        self._end(np.concatenate((a[0], b[0])), np.concatenate((a[1], b[1])))

    def _hits(self, slots: np.ndarray, by_full: bool):
        """(request ids, positions) of the clean entries recorded at ``slots`` (in range), their owners cleared;
        None: no such entry."""
        own = self.fown if by_full else self.own
        n = own.shape[0]
        if slots.size == 0 or n == 0:
            return None
        if slots.dtype != np.int64 or int(slots.view(np.uint64).max()) >= n:
            # (a slot out of range, or negative: as unsigned, past every row; the in-range ones only)
            slots = slots[(slots >= 0) & (slots < n)]
        o = own[slots]
        m = o >= 0
        if not np.count_nonzero(m):
            return None
        o = o.compress(m)           # (compress: a fraction of a boolean index's cost)
        own[slots.compress(m)] = -1
        return o >> 32, o & _POS

    def _end(self, r: np.ndarray, p: np.ndarray) -> None:
        if self.banded:
            inside = p >= self.dlo[r]   # (an entry below a clean range is not in it: an evicted SWA slot's, mostly)
            if np.count_nonzero(inside) < inside.size:
                r, p = r.compress(inside), p.compress(inside)
        np.minimum.at(self.dhi, r, p)


class _State:
    """One oracle's (and window's) :class:`_Kind` pair and, per request id, the ``RequestSlots`` its clean ranges
    were recorded with: ``did``, the id() of the object kept in ``refs`` (so the id is never reused)."""

    __slots__ = ("ref", "full", "swa", "did", "refs")

    def __init__(self, ref, full_to_swa: np.ndarray):
        self.ref = ref
        self.full = _Kind(ref.live_tag["full"].shape[0], banded=False)
        self.swa = _Kind(ref.live_tag["swa"].shape[0], full_to_swa.shape[0])
        self.did = np.full(0, -1, dtype=np.int64)
        self.refs: dict[int, object] = {}

    def grow(self, n: int) -> None:
        """(request ids up to ``n``, every array)"""
        if n > self.did.shape[0]:
            self.did = _grown(self.did, n)
            self.full.grow(self.did.shape[0])
            self.swa.grow(self.did.shape[0])


def _grown(a: np.ndarray, n: int) -> np.ndarray:
    m = max(n, 2 * a.shape[0], 64)
    return np.concatenate([a, np.full(m - a.shape[0], -1, dtype=np.int64)])


class IncrementalReads:
    """The runner's base read tables, each holding only the entries not known clean (see the module).

    ``fast``: the decode step's shortcuts (every request reads one new entry: no per-request slices; every new
    entry's slot in range: no range masks); off, the general path gives the same tables (tests/test_read_cache.py)."""

    def __init__(self, fast: bool = True) -> None:
        self._states: dict[tuple, _State] = {}       # (id(reference), window) -> its state
        self._clean: list[ReadTable] = []            # this step's tables whose every entry was found clean
        self._clean_ids: set[int] = set()            # their id()s (each kept alive in _clean until the step ends)
        self.fast = fast
        self.entries_skipped = 0
        self.clean_tables = 0
        self.one_entry_gathers = 0                   # gathers by the decode shortcut
        self._ones_bytes: dict[int, bytes] = {}      # n -> the bytes of n int64 ones

    def reset(self) -> None:
        """After a step the runner did not see (the run's own): nothing is known clean."""
        self._states.clear()

    def known_clean(self, table: ReadTable) -> bool:
        """Whether ``table`` is one of this step's whose entries :meth:`table` found all clean: the checker's
        comparison (the same slots, tags and pool rows, the oracle unchanged until the step's next truth) finds
        no stale read in it, so the read check has nothing to report."""
        return id(table) in self._clean_ids

    def note_step(self, stepping_ref, truth) -> None:
        """The step's frees (every oracle), its writes (the stepping side's), its transfer and mapping changes."""
        self._clean.clear()
        self._clean_ids.clear()
        if not self._states:
            return
        tr = truth.transferred
        # (one cut per kind over all its touched slots: the same entries end the same ranges at the same minimum)
        if tr is None:
            cut_f, cut_s = truth.freed_full, truth.freed_swa
        else:           # (its rows written over other tokens' slots too: a group's load in every group's view)
            wf, ws = (tr.written[0], tr.written[2]) if tr.written is not None else (tr.full_slots[:0], tr.swa_slots[:0])
            cut_f = _joined([truth.freed_full, tr.full_slots, wf])
            cut_s = _joined([truth.freed_swa, tr.swa_slots, ws])
        step = None
        mapping = truth.mapping_changed
        for st in self._states.values():
            if st.ref is stepping_ref:
                if step is None:    # (made once, for the first stepping state)
                    step = _joined([cut_f, truth.full_slots]), _joined([cut_s, truth.swa_slots])
                st.full.cut(step[0])
                st.swa.cut_both(step[1], mapping)
            else:
                st.full.cut(cut_f)
                st.swa.cut_both(cut_s, mapping)

    def table(self, ref, rq, window: int, full_to_swa: np.ndarray, rows: dict) -> ReadTable:
        """The base ``read_ids`` table of the batch's requests without their clean entries (and the new
        entries checked here as the checker checks them, to extend the clean ranges)."""
        key = (id(ref), window)
        st = self._states.get(key)
        if st is None or st.ref is not ref:
            st = self._states[key] = _State(ref, full_to_swa)
        seq = rq.seq_lens.astype(np.int64, copy=False)
        start = np.maximum(seq - rq.extend_lens + (1 - window), 0).astype(np.int64, copy=False)
        rids = rq.rids.astype(np.int64, copy=False)
        ids = np.fromiter(map(id, rq.slots), dtype=np.int64, count=len(rq.slots))
        try:
            same = st.did[rids] == ids      # (the same RequestSlots as at the request's last table)
        except IndexError:                  # (a request id past the arrays: they grow first)
            st.grow(int(rids.max()) + 1)
            same = st.did[rids] == ids
        req = (rids, same, np.count_nonzero(same) == same.shape[0], seq, {})   # (count_nonzero: cheaper than all())
        full, full_ok = self._kind(st.full, ref, "full", rq, req, None, None, rows["full"])
        swa, swa_ok = self._kind(st.swa, ref, "swa", rq, req, start, full_to_swa, rows["swa"])
        st.did[rids] = ids
        if not req[2]:
            for i in np.flatnonzero(~same).tolist():   # (new requests, retractions' new RequestSlots)
                st.refs[int(rids[i])] = rq.slots[i]
        table = ReadTable(full=full, swa=swa)
        if full_ok and swa_ok:
            self._clean.append(table)
            self._clean_ids.add(id(table))
            self.clean_tables += 1
        return table

    def _kind(self, st: _Kind, ref, kind: str, rq, req: tuple, start: Optional[np.ndarray],
              mapping: Optional[np.ndarray], rows: int) -> tuple[ReadIds, bool]:
        """One kind's table: per request the first position left to check is past its clean range where that
        range holds ``start`` (None: 0 everywhere, full layers)."""
        rids, same, all_same, seq, memo = req
        hi = st.dhi[rids]
        # (every request's RequestSlots the same as at its last table, the usual case: no ``same`` in the masks)
        if start is None:       # (a full kind's dlo is 0 wherever its did matches, and -1 elsewhere)
            held = hi > 0 if all_same else same & (hi > 0)
            first = np.where(held, np.minimum(hi, seq), 0)
            self.entries_skipped += int(np.add.reduce(first))
        else:
            held = (st.dlo[rids] <= start) & (start < hi)
            if not all_same:
                held &= same
            first = np.where(held, np.minimum(hi, seq), start)
            self.entries_skipped += int(np.add.reduce(first)) - int(np.add.reduce(start))
        g = self._gather(rq.slots, seq, first, memo, rq.tag_bases, rids)
        lens, indptr, fidx = g[:3]
        idx = fidx if mapping is None else mapping[fidx]
        ends, ok = self._extend_clean(st, ref, kind, g, first, idx, None if mapping is None else fidx, rows)
        if start is not None:
            st.dlo[rids] = start
        elif not all_same:      # (else every one is 0 already)
            st.dlo[rids] = 0
        st.dhi[rids] = ends
        return ReadIds(torch.from_numpy(indptr), torch.from_numpy(idx), torch.from_numpy(first)), ok

    def _gather(self, slots: tuple, seq: np.ndarray, first: np.ndarray, memo: dict, tag_bases, rids) -> tuple:
        """:func:`_gather` with each entry's own tag and request id, or where every request reads one new entry
        (a decode step's: ``first`` is seq_len - 1 everywhere) the same arrays without per-request slices; the
        same ``first`` (both kinds of a decode step, most often) gathers once per table (``memo``)."""
        key = first.tobytes()
        got = memo.get(key)
        if got is None:
            lens = seq - first
            n = lens.shape[0]
            if self.fast and n and lens.tobytes() == self._ones(n):
                fidx = np.fromiter(map(getitem, map(_FULL, slots), first.tolist()), dtype=np.int64, count=n)
                indptr = np.arange(n + 1, dtype=np.int64)
                got = (lens, indptr, fidx, indptr[:-1], first, tag_bases + first, rids)
                self.one_entry_gathers += 1
            else:
                got = _gather(slots, seq, first, np.maximum(lens, 0))
                row_of, pos = got[3], got[4]
                got = got + (tag_bases[row_of] + pos, rids[row_of])
            memo[key] = got
        return got

    def _ones(self, n: int) -> bytes:
        got = self._ones_bytes.get(n)
        if got is None:
            got = self._ones_bytes[n] = np.ones(n, dtype=np.int64).tobytes()
        return got

    def _extend_clean(self, st: _Kind, ref, kind, g: tuple, first, idx, fidx, rows) -> tuple:
        """The checker's comparison of the new entries (own tags): the slots of each request's entries before its
        first stale one record their (request, position). Returns per request where its clean range now ends
        (the entries from ``start`` to ``first`` were clean and untouched), and whether every new entry was clean."""
        lens, indptr, _, row_of, pos, want, rid_of = g
        live_tag = ref.live_tag[kind]
        hi = min(rows, live_tag.shape[0])
        if self.fast and idx.size and idx.dtype == np.int64 and int(idx.view(np.uint64).max()) < hi:
            # (every slot in range: as unsigned, a negative one is past every row)
            bad = live_tag[idx] != want
            bad = np.flatnonzero(bad) if np.count_nonzero(bad) else _EMPTY    # (count_nonzero: cheaper)
        else:
            inr = (idx >= 0) & (idx < hi)
            bad = np.flatnonzero(~(inr & (live_tag[np.where(inr, idx, 0)] == want)))
        if bad.size == 0:                           # (all clean: every new entry records its owner)
            o = _owner(rid_of, pos)
            st.own[idx] = o
            if fidx is not None:
                st.fown[fidx] = o
            return first + lens, True
        stop = indptr[1:].copy()                    # per request, its first stale entry (flat), else its end
        uniq, at = np.unique(row_of[bad], return_index=True)
        stop[uniq] = bad[at]
        clean = np.arange(idx.shape[0], dtype=np.int64) < stop[row_of]
        o = _owner(rid_of[clean], pos[clean])
        st.own[idx[clean]] = o
        if fidx is not None:
            st.fown[fidx[clean]] = o
        return first + (stop - indptr[:-1]), False


def _owner(rid: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The owner entries of (request id, position) pairs (ids below 2**31, positions below 2**32)."""
    return (rid << 32) | pos


def _joined(parts: list) -> np.ndarray:
    parts = [p for p in parts if p.size]
    return _EMPTY if not parts else parts[0] if len(parts) == 1 else np.concatenate(parts)


def _gather(slots, seq: np.ndarray, first: np.ndarray, lens: np.ndarray) -> tuple:
    """Per request the entries from ``first`` to its seq_len (``lens``: how many, ``max(seq - first, 0)``):
    (lengths, CSR indptr, their full slots, and per entry its row and position)."""
    indptr = np.zeros(seq.shape[0] + 1, dtype=np.int64)
    np.cumsum(lens, out=indptr[1:])
    parts = [sl.full[a:b] for sl, a, b in zip(slots, first.tolist(), seq.tolist()) if b > a]
    fidx = np.concatenate(parts).astype(np.int64, copy=False) if parts else _EMPTY
    row_of = np.repeat(np.arange(lens.shape[0]), lens)
    pos = np.repeat(first - indptr[:-1], lens) + np.arange(fidx.shape[0], dtype=np.int64)
    return lens, indptr, fidx, row_of, pos
