"""The checker: compare the pool under test with the reference after each step, and explain.

Per (step, backend, sub-pool) it reads back, in one gather over every layer of the kind, the tags at
the slots that matter this step: the slots the reference expects written, and the slots the writes
actually targeted. Equal everywhere is the fast path. Each difference is then classified from the
reference's slot state and the layer's write log (which row went where):

* a slot with no live token that changed           -> ``evicted_slot``
* a live slot the step did not expect to write     -> ``clobbered``
* the expected slot of token t, when t's row went
  to the padding slot                              -> ``padding_slot``
  elsewhere (or nowhere)                           -> ``missed``
  to this slot, but something overwrote it         -> ``clobbered``

Out-of-range indices (skipped by the store, counted in its error buffer) and length mismatches (the
store raised) are reported per write; the differences they cause are not counted twice.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from .batch import BatchTruth
from .pool import PoolWriter
from .records import FINDING_CLASSES, PAD_TAG, Finding, Owner
from .reference import ReferencePool


@dataclass(slots=True)
class LayerWrite:
    """One layer's store call at a backend boundary, as the checker needs it."""

    layer: int
    kind: str
    index: int                       # layer index inside its sub-pool
    target: Optional[torch.Tensor]   # the indices handed to the store (None if the store raised)
    error: Optional[str]             # the store's error text (length mismatch)


class Checker:
    def __init__(self, reference: ReferencePool, owner_of: Callable[[int], Owner], reserved: np.ndarray,
                 max_detail: int = 100_000):
        self.reference = reference
        self.owner_of = owner_of
        self.reserved = reserved            # slots of the reserved/padding page(s): never compared
        self.max_detail = max_detail
        self.detailed = 0
        self.truncated = False
        self.first: dict[str, Finding] = {}   # per backend, the earliest (step, layer) finding

    def check(self, step: int, backend: str, pool: PoolWriter, truth: BatchTruth, writes: list[LayerWrite],
              pad_slots: tuple[int, ...]) -> tuple[list[Finding], dict[str, int]]:
        """Findings of one (step, backend), and counts by class (complete even when details are capped)."""
        findings: list[Finding] = []
        counts = dict.fromkeys(FINDING_CLASSES, 0)
        for kind in ("full", "swa"):
            kw = [w for w in writes if w.kind == kind]
            if kw:
                self._check_kind(step, backend, kind, pool, truth, kw, pad_slots, findings, counts)
        return findings, counts

    # ------------------------------------------------------------------ internals

    def _emit(self, findings: list[Finding], counts: dict[str, int], f: Finding) -> None:
        counts[f.cls] += 1
        first = self.first.get(f.backend)
        if first is None or (f.step, f.layer) < (first.step, first.layer):
            self.first[f.backend] = f
        if self.detailed < self.max_detail:
            findings.append(f)
            self.detailed += 1
        else:
            self.truncated = True

    def _owner(self, tag: int) -> Owner:
        return self.owner_of(int(tag))

    def _check_kind(self, step, backend, kind, pool, truth, writes, pad_slots, findings, counts) -> None:
        rows = pool.rows(kind)
        expected_slots = truth.full_slots if kind == "full" else truth.swa_slots
        tags = truth.tags
        real = expected_slots.shape[0]

        # length mismatches: one finding per failed store; its layer is left out of the comparison
        ok_layers: list[LayerWrite] = []
        for w in writes:
            if w.error is not None:
                self._emit(findings, counts, Finding(step, backend, w.layer, kind, "length_mismatch", -1,
                                                     None, None, w.error))
            else:
                ok_layers.append(w)
        if not ok_layers:
            pool.take_out_of_range(kind)
            return

        # host copies of the targets, shared between layers that used the same tensor
        host: dict[tuple, np.ndarray] = {}
        targets: dict[int, np.ndarray] = {}
        for w in ok_layers:
            t = w.target
            key = (t.data_ptr(), t.shape[0], t.stride(0), t.dtype)
            if key not in host:
                host[key] = t.to("cpu").numpy().astype(np.int64, copy=False)
            targets[w.index] = host[key]

        # out of range: the store skipped and counted them; name each offending position
        oor = pool.take_out_of_range(kind)
        skip = pool.skip_index
        for w in ok_layers:
            tgt = targets[w.index]
            bad = ((tgt < 0) | (tgt >= rows)) & (tgt != skip if skip is not None else True)
            n_bad = int(np.count_nonzero(bad))
            if n_bad != int(oor[w.index, 0]):
                raise RuntimeError(f"store error buffer counted {int(oor[w.index, 0])} out-of-range indices at "
                                   f"step {step} {backend} layer {w.layer}, the host sees {n_bad}")
            for pos in np.flatnonzero(bad):
                tag = int(tags[pos]) if pos < real else PAD_TAG
                self._emit(findings, counts, Finding(
                    step, backend, w.layer, kind, "out_of_range", int(tgt[pos]), self._owner(tag), None,
                    f"index {int(tgt[pos])} at position {int(pos)} is outside [0, {rows})"))

        # the slots to compare: expected writes and in-range targets, minus the reserved page
        parts = [expected_slots] + [t[(t >= 0) & (t < rows)] for t in host.values()]
        cand = np.unique(np.concatenate(parts))
        cand = cand[~np.isin(cand, self.reserved)]
        if cand.size == 0:
            return
        idx = [w.index for w in ok_layers]
        all_layers = len(idx) == len(writes) and idx == list(range(len(idx)))
        cand_t = torch.from_numpy(cand).to(pool.device)
        exp_np = self.reference.expected[kind][cand]
        diff = pool.mismatches(kind, cand_t, torch.from_numpy(exp_np).to(pool.device),
                               None if all_layers else idx)
        if not bool(diff.any()):
            return
        li, ci = (x.cpu().numpy() for x in torch.nonzero(diff, as_tuple=True))
        # decode only the columns that differ
        cols = np.unique(ci)
        ktags, vtags = pool.read_tags(kind, torch.from_numpy(cand[cols]).to(pool.device))
        col_of = np.searchsorted(cols, ci)
        rows_i = np.asarray(idx)[li]
        kt = ktags.cpu().numpy()[rows_i, col_of]
        vt = vtags.cpu().numpy()[rows_i, col_of]
        observed = np.where(kt != exp_np[ci], kt, vt)

        live = self.reference.live[kind]
        evicted = self.reference.evicted if kind == "swa" else None
        # row of each expected slot (expected slots are unique within a step)
        order = np.argsort(expected_slots, kind="stable")
        sorted_slots = expected_slots[order]
        for l_i, c_i, obs in zip(li.tolist(), ci.tolist(), observed.tolist()):
            w = ok_layers[l_i]
            slot = int(cand[c_i])
            exp_tag = int(self.reference.expected[kind][slot])
            if not live[slot]:
                why = "evicted" if evicted is not None and evicted[slot] else "freed"
                cls, msg = "evicted_slot", f"write into a {why} slot"
                expected_owner = None
            else:
                j = np.searchsorted(sorted_slots, slot)
                if j < sorted_slots.size and sorted_slots[j] == slot:
                    row = int(order[j])
                    tgt = targets[w.index]
                    went = int(tgt[row]) if row < tgt.shape[0] else None
                    if went is not None and (went < 0 or went >= rows) and went != skip:
                        continue  # reported as out_of_range
                    if went == slot:
                        cls, msg = "clobbered", "the row was written here, then overwritten"
                    elif went in pad_slots:
                        cls, msg = "padding_slot", f"the token's row was sent to padding slot {went}"
                    else:
                        cls = "missed"
                        msg = "the token's row was not written" if went is None else f"the token's row went to slot {went}"
                else:
                    cls, msg = "clobbered", "a live slot was overwritten"
                expected_owner = self._owner(exp_tag)
            self._emit(findings, counts, Finding(step, backend, w.layer, kind, cls, slot, expected_owner,
                                                 self._owner(obs), msg))
