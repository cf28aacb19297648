"""The read check of one backend forward: each layer kind's read table against the oracle, once per ownership epoch."""
from __future__ import annotations

import numpy as np

from simulator.core.sides import ModelSide
from simulator.records import Finding, LayerInfo
from simulator.scheduling.batch import BatchTruth, ForwardBatch

_KIND_COUNTS: dict[int, tuple] = {}


def _kind_counts(layers) -> dict[str, int]:
    """Per kind, how many of ``layers`` are of it (made once per layers tuple: a read check is made per forward)."""
    got = _KIND_COUNTS.get(id(layers))
    if got is None or got[0] is not layers:
        got = _KIND_COUNTS[id(layers)] = (layers, {k: sum(1 for li in layers if li.kind == k) for k in ("full", "swa")})
    return got[1]


class ReadCheck:
    """One backend forward's read checking: each kind's table against the reference, once per ownership
    epoch (so once per forward unless a timeline changes ownership between layers)."""

    __slots__ = ("side", "backend", "batch", "truth", "table", "pool", "found", "_epoch", "_reported", "_left")

    def __init__(self, side: ModelSide, backend: str, batch: ForwardBatch, truth: BatchTruth, table, pool):
        self.side, self.backend, self.batch, self.truth, self.table, self.pool = side, backend, batch, truth, table, pool
        self.found: list[Finding] = []
        self._epoch: dict[str, int] = {}
        self._reported: dict[str, np.ndarray] = {}
        # per kind, the layers still to run (the count a finding names)
        self._left = dict(_kind_counts(side.layers))

    def at_layer(self, layer: LayerInfo) -> None:
        kind = layer.kind
        if self._epoch.get(kind) != self.side.reference.epoch:
            self._check(kind, layer.layer, self._left[kind])
        self._left[kind] -= 1

    def finish(self) -> None:
        """Kinds no layer hook checked (an executor that does not call it per layer): check them now."""
        for kind in ("full", "swa"):
            if kind not in self._epoch and self._left[kind] > 0:
                first = next(li.layer for li in self.side.layers if li.kind == kind)
                self._check(kind, first, self._left[kind])

    def _check(self, kind: str, layer: int, n_layers: int) -> None:
        self._epoch[kind] = self.side.reference.epoch
        ids = self.table.of(kind)
        if ids is None:
            return
        found, bad = self.side.checker.check_reads(
            self.batch.step, self.backend, kind, ids, self.batch.requests, self.truth.content_keys,
            self.pool.rows(kind), layer, n_layers, self._reported.get(kind))
        if found:
            self.found.extend(found)
            prev = self._reported.get(kind)
            self._reported[kind] = bad if prev is None else np.concatenate([prev, bad])
