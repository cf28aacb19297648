"""The reference pool (the oracle): which token should own each slot, from first principles.

It never looks at designs, backends or the pool under test. It applies each step's truth (tokens and
the slots the allocator gave them, slots freed before the step) to an expected tag per slot of each
sub-pool, plus whether the slot is live. Every layer of a kind expects the same contents, so one array
per sub-pool serves all layers: small enough for large pools on a CPU.
"""
from __future__ import annotations

import numpy as np
import torch

from .batch import BatchTruth


def _on(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on the device; to CUDA through pinned memory, without a host synchronisation."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


class ReferencePool:
    """Expected owner tag and liveness per slot; ``expected_on`` mirrors the tags on the pool's device
    so that the checker compares there (on the CPU the mirror shares memory with the host array)."""

    def __init__(self, full_rows: int, swa_rows: int, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.expected = {"full": np.zeros(full_rows, dtype=np.int64), "swa": np.zeros(swa_rows, dtype=np.int64)}
        self.expected_on = {k: (torch.from_numpy(v) if self.device.type == "cpu" else torch.from_numpy(v).to(self.device))
                            for k, v in self.expected.items()}
        self.live = {"full": np.zeros(full_rows, dtype=bool), "swa": np.zeros(swa_rows, dtype=bool)}
        self.evicted = np.zeros(swa_rows, dtype=bool)   # SWA slots whose last owner was evicted (not finished)
        #: the expected tag where the slot is live, else 0 (no real tag): a read checks against it in one gather
        self.live_tag = {"full": np.zeros(full_rows, dtype=np.int64), "swa": np.zeros(swa_rows, dtype=np.int64)}
        #: bumped by every change of ownership: a read checked at one epoch needs no re-check until it moves
        self.epoch = 0

    def apply(self, truth: BatchTruth) -> None:
        """Frees first (they happened while the step was scheduled), then the step's writes."""
        self.apply_frees(truth)
        self.apply_writes(truth)

    def apply_frees(self, truth: BatchTruth) -> None:
        """The slots freed before the step. With speculative decoding the draft's reference takes every
        step's frees too: target and draft share one allocator, so a freed index is free in both."""
        self.epoch += 1
        self.live["full"][truth.freed_full] = False
        self.live["swa"][truth.freed_swa] = False
        self.live_tag["full"][truth.freed_full] = 0
        self.live_tag["swa"][truth.freed_swa] = 0
        self.evicted[truth.freed_swa] = False
        self.evicted[truth.evicted_swa] = True
        if truth.transferred is not None:
            self._adopt(truth.transferred)

    def _adopt(self, tr) -> None:
        """A KV transfer's slots (``batch.Transfer``): live with their tokens' tags, from every side (target
        and draft share the allocator; the transfer carries both models' KV)."""
        for kind, slots, tags in (("full", tr.full_slots, tr.full_tags), ("swa", tr.swa_slots, tr.swa_tags)):
            self.expected[kind][slots] = tags
            self.live[kind][slots] = True
            self.live_tag[kind][slots] = tags
            if self.device.type != "cpu" and tags.size:
                self.expected_on[kind][_on(slots, self.device)] = _on(tags, self.device)
        self.evicted[tr.swa_slots] = False

    def apply_writes(self, truth: BatchTruth) -> None:
        """The step's tokens, in the slots the allocator gave them (only the model that runs the step)."""
        self.epoch += 1
        self.expected["full"][truth.full_slots] = truth.tags
        self.live["full"][truth.full_slots] = True
        self.expected["swa"][truth.swa_slots] = truth.tags
        self.live["swa"][truth.swa_slots] = True
        self.live_tag["full"][truth.full_slots] = truth.tags
        self.live_tag["swa"][truth.swa_slots] = truth.tags
        self.evicted[truth.swa_slots] = False
        if self.device.type != "cpu" and truth.tags.size:
            tags = _on(truth.tags, self.device)
            self.expected_on["full"][_on(truth.full_slots, self.device)] = tags
            self.expected_on["swa"][_on(truth.swa_slots, self.device)] = tags

    def slots_of(self, kind: str, truth: BatchTruth) -> np.ndarray:
        return truth.full_slots if kind == "full" else truth.swa_slots
