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
                 max_detail: int = 100_000, pool_layers: Optional[dict[str, int]] = None):
        self.reference = reference
        # layers per sub-pool of the pool under test, when it holds more than the layers written (a draft
        # model's pool laid out like the target's); None: every layer of a kind is written every step
        self.pool_layers = pool_layers
        self.owner_of = owner_of
        self.reserved = reserved            # slots of the reserved/padding page(s): never compared
        self.max_detail = max_detail
        self.detailed = 0
        self.truncated = False
        self.first: dict[str, Finding] = {}   # per backend, the earliest (step, layer) finding
        self._reserved_dev: dict[torch.device, torch.Tensor] = {}

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

    def _reserved_on(self, device: torch.device) -> torch.Tensor:
        t = self._reserved_dev.get(device)
        if t is None:
            t = self._reserved_dev[device] = torch.from_numpy(self.reserved).to(device)
        return t

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

        # distinct target tensors (layers usually share one), still on the device
        distinct: dict[tuple, torch.Tensor] = {}
        target_of: dict[int, tuple] = {}
        for w in ok_layers:
            t = w.target
            key = (t.data_ptr(), t.shape[0], t.stride(0), t.dtype)
            distinct.setdefault(key, t)
            target_of[w.index] = key
        host: dict[tuple, np.ndarray] = {}

        def on_host(index: int) -> np.ndarray:
            key = target_of[index]
            if key not in host:
                host[key] = distinct[key].to("cpu").numpy().astype(np.int64, copy=False)
            return host[key]

        # out of range: the store skipped and counted them (device error buffer); name each position
        oor = pool.take_out_of_range(kind)
        skip = pool.skip_index
        for w in ok_layers:
            if int(oor[w.index, 0]) == 0:
                continue
            tgt = on_host(w.index)
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

        # the slots to compare, on the device: expected writes and in-range targets, minus reserved slots
        dev = pool.device
        parts = [torch.from_numpy(expected_slots).to(dev)] + [t.to(torch.int64) for t in distinct.values()]
        cand_t = torch.unique(torch.cat(parts))
        keep = (cand_t >= 0) & (cand_t < rows) & ~torch.isin(cand_t, self._reserved_on(dev))
        cand_t = cand_t[keep]
        if cand_t.numel() == 0:
            return
        idx = [w.index for w in ok_layers]
        all_layers = (len(idx) == len(writes) and idx == list(range(len(idx)))
                      and (self.pool_layers is None or self.pool_layers.get(kind) == len(idx)))
        exp_t = self.reference.expected_on[kind][cand_t]
        diff = pool.mismatches(kind, cand_t, exp_t, None if all_layers else idx)
        if not bool(diff.any()):
            return
        # slow path: only now do the differing entries (and the targets) cross to the host
        li, ci = (x.cpu().numpy() for x in torch.nonzero(diff, as_tuple=True))
        cols = np.unique(ci)
        cand = cand_t.cpu().numpy()
        ktags, vtags = pool.read_tags(kind, torch.from_numpy(cand[cols]).to(dev))
        col_of = np.searchsorted(cols, ci)
        rows_i = np.asarray(idx)[li]
        kt = ktags.cpu().numpy()[rows_i, col_of]
        vt = vtags.cpu().numpy()[rows_i, col_of]
        exp_np = self.reference.expected[kind][cand]
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
                    tgt = on_host(w.index)
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
