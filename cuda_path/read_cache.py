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

from typing import Optional

import numpy as np
import torch

from simulator.designs import ReadIds, ReadTable

_EMPTY = np.zeros(0, dtype=np.int64)


class _Kind:
    """One kind's clean ranges (per request id) and slot owners of one oracle (for SWA, owners by full slot too)."""

    __slots__ = ("rid", "pos", "frid", "fpos", "did", "dlo", "dhi", "refs")

    def __init__(self, rows: int, full_rows: int = 0):
        self.rid, self.pos = np.full(rows, -1, dtype=np.int64), np.zeros(rows, dtype=np.int64)
        self.frid, self.fpos = np.full(full_rows, -1, dtype=np.int64), np.zeros(full_rows, dtype=np.int64)
        # per request id: id() of its RequestSlots (the object kept in refs, so the id is never reused), the
        # clean positions [dlo, dhi)
        self.did, self.dlo, self.dhi = (np.full(0, -1, dtype=np.int64) for _ in range(3))
        self.refs: dict[int, object] = {}

    def grow(self, n: int) -> None:
        if n > self.did.shape[0]:
            m = max(n, 2 * self.did.shape[0], 64)
            self.did, self.dlo, self.dhi = (np.concatenate([a, np.full(m - a.shape[0], -1, dtype=np.int64)])
                                            for a in (self.did, self.dlo, self.dhi))

    def cut(self, slots: np.ndarray, by_full: bool = False) -> None:
        """The clean entries reading ``slots`` (``by_full``: whose full slot is one of them) are clean no more:
        their requests' clean ranges end before them."""
        rid, pos = (self.frid, self.fpos) if by_full else (self.rid, self.pos)
        if slots.size == 0 or rid.size == 0:
            return
        s = slots[(slots >= 0) & (slots < rid.shape[0])]
        hit = s[rid[s] >= 0]
        if hit.size == 0:
            return
        np.minimum.at(self.dhi, rid[hit], pos[hit])
        rid[hit] = -1


class IncrementalReads:
    """The runner's base read tables, each holding only the entries not known clean (see the module)."""

    def __init__(self) -> None:
        self._states: dict[tuple, tuple] = {}        # (id(reference), window) -> (reference, {kind: _Kind})
        self._clean: list[ReadTable] = []            # this step's tables whose every entry was found clean
        self.entries_skipped = 0
        self.clean_tables = 0

    def reset(self) -> None:
        """After a step the runner did not see (the run's own): nothing is known clean."""
        self._states.clear()

    def known_clean(self, table: ReadTable) -> bool:
        """Whether ``table`` is one of this step's whose entries :meth:`table` found all clean: the checker's
        comparison (the same slots, tags and pool rows, the oracle unchanged until the step's next truth) finds
        no stale read in it, so the read check has nothing to report."""
        return any(t is table for t in self._clean)

    def note_step(self, stepping_ref, truth) -> None:
        """The step's frees (every oracle), its writes (the stepping side's), its transfer and mapping changes."""
        self._clean.clear()
        if not self._states:
            return
        tr = truth.transferred
        # (one cut per kind over all its touched slots: the same entries end the same ranges at the same minimum)
        full, swa = [truth.freed_full], [truth.freed_swa]
        if tr is not None:
            full.append(tr.full_slots)
            swa.append(tr.swa_slots)
        cut_f, cut_s = _joined(full), _joined(swa)
        step_f, step_s = _joined(full + [truth.full_slots]), _joined(swa + [truth.swa_slots])
        for ref, kinds in self._states.values():
            stepping = ref is stepping_ref
            kinds["full"].cut(step_f if stepping else cut_f)
            kinds["swa"].cut(step_s if stepping else cut_s)
            kinds["swa"].cut(truth.mapping_changed, by_full=True)

    def table(self, ref, rq, window: int, full_to_swa: np.ndarray, rows: dict) -> ReadTable:
        """The base ``read_ids`` table of the batch's requests without their clean entries (and the new
        entries checked here as the checker checks them, to extend the clean ranges)."""
        key = (id(ref), window)
        got = self._states.get(key)
        if got is None or got[0] is not ref:
            got = self._states[key] = (ref, {"full": _Kind(ref.live_tag["full"].shape[0]),
                                             "swa": _Kind(ref.live_tag["swa"].shape[0], full_to_swa.shape[0])})
        seq = rq.seq_lens.astype(np.int64, copy=False)
        start = np.maximum(seq - rq.extend_lens + 1 - window, 0).astype(np.int64, copy=False)
        rids = rq.rids.astype(np.int64, copy=False)
        req = (rids, np.fromiter(map(id, rq.slots), dtype=np.int64, count=len(rq.slots)), seq, {})
        full, full_ok = self._kind(got[1]["full"], ref, "full", rq, req, np.zeros_like(seq), None, rows["full"])
        swa, swa_ok = self._kind(got[1]["swa"], ref, "swa", rq, req, start, full_to_swa, rows["swa"])
        table = ReadTable(full=full, swa=swa)
        if full_ok and swa_ok:
            self._clean.append(table)
            self.clean_tables += 1
        return table

    def _kind(self, st: _Kind, ref, kind: str, rq, req: tuple, start: np.ndarray,
              mapping: Optional[np.ndarray], rows: int) -> tuple[ReadIds, bool]:
        rids, ids, seq, memo = req
        st.grow(int(rids.max()) + 1 if rids.size else 0)
        same = st.did[rids] == ids
        lo, hi = st.dlo[rids], st.dhi[rids]
        # per request, the first position left to check: past its clean range where that range holds start
        first = np.where(same & (lo <= start) & (start < hi), np.minimum(hi, seq), start)
        self.entries_skipped += int((first - start).sum())
        g = _gather(rq.slots, seq, first, memo, rq.tag_bases, rids)
        lens, indptr, fidx = g[:3]
        idx = fidx if mapping is None else mapping[fidx]
        ends, ok = self._extend_clean(st, ref, kind, g, first, idx, None if mapping is None else fidx, rows)
        st.dlo[rids], st.dhi[rids], st.did[rids] = start, ends, ids
        for i in np.flatnonzero(~same).tolist():       # (new requests, retractions' new RequestSlots)
            st.refs[int(rids[i])] = rq.slots[i]
        return ReadIds(torch.from_numpy(indptr), torch.from_numpy(idx), torch.from_numpy(first)), ok

    @staticmethod
    def _extend_clean(st: _Kind, ref, kind, g: tuple, first, idx, fidx, rows) -> tuple:
        """The checker's comparison of the new entries (own tags): the slots of each request's entries before its
        first stale one record their (request, position). Returns per request where its clean range now ends
        (the entries from ``start`` to ``first`` were clean and untouched), and whether every new entry was clean."""
        lens, indptr, _, row_of, pos, want, rid_of = g
        n = idx.shape[0]
        live_tag = ref.live_tag[kind]
        hi = min(rows, live_tag.shape[0])
        inr = (idx >= 0) & (idx < hi)
        ok = inr & (live_tag[np.where(inr, idx, 0)] == want)
        bad = np.flatnonzero(~ok)
        if bad.size == 0:                           # (all clean: every new entry records its owner)
            st.rid[idx] = rid_of
            st.pos[idx] = pos
            if fidx is not None:
                st.frid[fidx] = rid_of
                st.fpos[fidx] = pos
            return first + lens, True
        stop = indptr[1:].copy()                    # per request, its first stale entry (flat), else its end
        uniq, at = np.unique(row_of[bad], return_index=True)
        stop[uniq] = bad[at]
        clean = np.arange(n, dtype=np.int64) < stop[row_of]
        st.rid[idx[clean]] = rid_of[clean]
        st.pos[idx[clean]] = pos[clean]
        if fidx is not None:
            st.frid[fidx[clean]] = rid_of[clean]
            st.fpos[fidx[clean]] = pos[clean]
        return first + (stop - indptr[:-1]), False


def _joined(parts: list) -> np.ndarray:
    parts = [p for p in parts if p.size]
    return _EMPTY if not parts else parts[0] if len(parts) == 1 else np.concatenate(parts)


def _gather(slots: list, seq: np.ndarray, first: np.ndarray, memo: dict, tag_bases, rids) -> tuple:
    """Per request the entries from ``first`` to its seq_len: (lengths, CSR indptr, their full slots, and per
    entry its row, position, own tag and request id); the same ``first`` (both kinds of a decode step, most
    often) gathers once per step (``memo``)."""
    key = first.tobytes()
    got = memo.get(key)
    if got is None:
        lens = np.maximum(seq - first, 0)
        indptr = np.zeros(seq.shape[0] + 1, dtype=np.int64)
        np.cumsum(lens, out=indptr[1:])
        parts = [sl.full[a:b] for sl, a, b in zip(slots, first.tolist(), seq.tolist()) if b > a]
        fidx = np.concatenate(parts).astype(np.int64, copy=False) if parts else _EMPTY
        row_of = np.repeat(np.arange(lens.shape[0]), lens)
        pos = np.repeat(first - indptr[:-1], lens) + np.arange(fidx.shape[0], dtype=np.int64)
        got = memo[key] = (lens, indptr, fidx, row_of, pos, tag_bases[row_of] + pos, rids[row_of])
    return got
