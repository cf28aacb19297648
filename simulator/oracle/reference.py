"""The reference pool (the oracle): which token should own each slot, from first principles.

It never looks at designs, backends or the pool under test. It applies each step's truth (tokens and
the slots the allocator gave them, slots freed before the step) to an expected tag per slot of each
sub-pool, plus whether the slot is live. Every layer of a kind expects the same contents, so one array
per sub-pool serves all layers: small enough for large pools on a CPU.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from simulator.scheduling.batch import BatchTruth


def _on(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on the device; to CUDA through pinned memory, without a host synchronisation."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


#: pending mirror writes (elements) past which the device mirror is brought up to date without being asked
MIRROR_PENDING_MAX = 1 << 22


def last_writes(slots: list, tags: list) -> tuple[np.ndarray, np.ndarray]:
    """Writes made in order (lists of slot and tag arrays) as one: each slot once, with the tag written to it last
    (what applying them in order leaves), in slot order."""
    s = np.concatenate(slots).astype(np.int64, copy=False)
    t = np.concatenate(tags).astype(np.int64, copy=False)
    last = s.shape[0] - 1 - np.unique(s[::-1], return_index=True)[1]
    return s[last], t[last]


class ReferencePool:
    """Expected owner tag and liveness per slot; ``expected_on`` mirrors the tags on the pool's device
    so that the checker compares there (on the CPU the mirror shares memory with the host array).

    A device mirror is brought up to date when it is asked for, not at every step: the writes since the last
    ask are kept (host arrays, in order) and applied then in one scatter per kind, each slot taking the last
    tag written to it, which is what applying them step by step leaves. A run whose checks all pass on the
    device never asks (cuda_path/step.py keeps tag words of its own), so its steps make no copy for it.
    ``mirror``: keep a separate mirror even on the CPU (tests of the deferred writes)."""

    def __init__(self, full_rows: int, swa_rows: int, device: torch.device | str = "cpu",
                 mirror: Optional[bool] = None):
        self.device = torch.device(device)
        self.expected = {"full": np.zeros(full_rows, dtype=np.int64), "swa": np.zeros(swa_rows, dtype=np.int64)}
        self._mirrored = self.device.type != "cpu" if mirror is None else mirror
        self._expected_on = {k: (torch.from_numpy(v.copy()).to(self.device) if self._mirrored else torch.from_numpy(v))
                             for k, v in self.expected.items()}
        self._pending: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {"full": [], "swa": []}
        self._pending_n = 0
        self.live = {"full": np.zeros(full_rows, dtype=bool), "swa": np.zeros(swa_rows, dtype=bool)}
        self.evicted = np.zeros(swa_rows, dtype=bool)   # SWA slots whose last owner was evicted (not finished)
        #: the expected tag where the slot is live, else 0 (no real tag): a read checks against it in one gather
        self.live_tag = {"full": np.zeros(full_rows, dtype=np.int64), "swa": np.zeros(swa_rows, dtype=np.int64)}
        #: bumped by every change of ownership: a read checked at one epoch needs no re-check until it moves
        self.epoch = 0
        #: per kind, the slots no read finds its token at (:meth:`reserve`)
        self._reserved = {"full": np.zeros(0, dtype=np.int64), "swa": np.zeros(0, dtype=np.int64)}

    def reserve(self, slots: np.ndarray) -> None:
        """Slots no token is read at: the sink / padding page (and a dummy request's), which every padded row may
        write. ``live_tag`` stays 0 there, so a read of one is stale even where the allocator handed it to a
        token (R8: 0.5.23's unfiltered SWA free puts the sink page in the free list); liveness and the expected
        tag (the write check's) are as the allocator says."""
        slots = np.unique(np.asarray(slots, dtype=np.int64))
        for kind, tag in self.live_tag.items():
            self._reserved[kind] = s = slots[(slots >= 0) & (slots < tag.shape[0])]
            tag[s] = 0

    @property
    def expected_on(self) -> dict[str, torch.Tensor]:
        """The expected tags per kind on the device, up to date with every step applied so far."""
        if self._pending_n:
            self._flush()
        return self._expected_on

    def _defer(self, kind: str, slots: np.ndarray, tags: np.ndarray) -> None:
        """A write of the device mirror, kept until :attr:`expected_on` is asked for."""
        if self._mirrored and tags.size:
            self._pending[kind].append((slots.copy(), tags.copy()))   # (the caller's arrays may change later)
            self._pending_n += tags.size
            if self._pending_n > MIRROR_PENDING_MAX:
                self._flush()

    def _flush(self) -> None:
        for kind, writes in self._pending.items():
            if not writes:
                continue
            slots, tags = last_writes([w[0] for w in writes], [w[1] for w in writes])
            self._expected_on[kind][_on(slots, self.device)] = _on(tags, self.device)
            writes.clear()
        self._pending_n = 0

    def apply(self, truth: BatchTruth) -> None:
        """Frees first (they happened while the step was scheduled), then the step's writes."""
        self.apply_frees(truth)
        self.apply_writes(truth)

    def apply_frees(self, truth: BatchTruth, transfer: bool = True) -> None:
        """The slots freed before the step. With speculative decoding the draft's reference takes every
        step's frees too: target and draft share one allocator, so a freed index is free in both. ``transfer``:
        whether the step's KV transfer reaches this reference too (not a draft's, for one the target's
        reference alone takes: ``Transfer.target_reference_only``)."""
        self.epoch += 1
        self.live["full"][truth.freed_full] = False
        self.live["swa"][truth.freed_swa] = False
        self.live_tag["full"][truth.freed_full] = 0
        self.live_tag["swa"][truth.freed_swa] = 0
        self.evicted[truth.freed_swa] = False
        self.evicted[truth.evicted_swa] = True
        if truth.transferred is not None and transfer:
            self._adopt(truth.transferred)

    def _adopt(self, tr) -> None:
        """A KV transfer's slots (``batch.Transfer``): live with their tokens' tags, from every side (target
        and draft share the allocator; the transfer carries both models' KV). Its ``written`` rows, where it has
        them, are then what the slots hold (the last write of each), owned or not: a row written over a live
        slot another token owns is what that owner's reads find."""
        for kind, slots, tags in (("full", tr.full_slots, tr.full_tags), ("swa", tr.swa_slots, tr.swa_tags)):
            self.expected[kind][slots] = tags
            self.live[kind][slots] = True
            self.live_tag[kind][slots] = tags
            self.live_tag[kind][self._reserved[kind]] = 0
            self._defer(kind, slots, tags)
        self.evicted[tr.swa_slots] = False
        if tr.written is not None:
            fs, ft, ss, st = tr.written
            for kind, slots, tags in (("full", fs, ft), ("swa", ss, st)):
                self.expected[kind][slots] = tags
                self.live_tag[kind][slots] = np.where(self.live[kind][slots], tags, 0)
                self.live_tag[kind][self._reserved[kind]] = 0
                self._defer(kind, slots, tags)

    def apply_writes(self, truth: BatchTruth) -> None:
        """The step's tokens, in the slots the allocator gave them (only the model that runs the step)."""
        self.epoch += 1
        self.expected["full"][truth.full_slots] = truth.tags
        self.live["full"][truth.full_slots] = True
        self.expected["swa"][truth.swa_slots] = truth.tags
        self.live["swa"][truth.swa_slots] = True
        self.live_tag["full"][truth.full_slots] = truth.tags
        self.live_tag["swa"][truth.swa_slots] = truth.tags
        for kind, r in self._reserved.items():
            self.live_tag[kind][r] = 0
        self.evicted[truth.swa_slots] = False
        self._defer("full", truth.full_slots, truth.tags)
        self._defer("swa", truth.swa_slots, truth.tags)

    def slots_of(self, kind: str, truth: BatchTruth) -> np.ndarray:
        return truth.full_slots if kind == "full" else truth.swa_slots
