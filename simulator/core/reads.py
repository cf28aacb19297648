"""The read check of one backend forward: each layer kind's read table against the oracle, once per ownership epoch.

The table is held to its span exactly (:mod:`simulator.oracle.read_rules`): full layers the prefix, SWA layers
each new token's window where the forward's graph path builds window indices, else (B4) the prefix they read
through the full table. A boundary whose table is not held to a span (``Boundary.span_checked``: the base
formula's, the design's ``read_ids`` declared ``base_reads``, exact by construction, and on the GPU step runner
only its entries not known clean, cuda_path/read_cache.py) has its entries held to the requests' positions and
slots alone, on every executor alike."""
from __future__ import annotations

from typing import Optional

import numpy as np

from simulator.core.sides import ModelSide
from simulator.oracle.read_rules import ReadSpan, prefix_span, window_span
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

    __slots__ = ("side", "backend", "batch", "truth", "table", "pool", "found", "_epoch", "_reported", "_left",
                 "_spans")

    def __init__(self, side: ModelSide, backend: str, batch: ForwardBatch, truth: BatchTruth, table, pool):
        self.side, self.backend, self.batch, self.truth, self.table, self.pool = side, backend, batch, truth, table, pool
        self.found: list[Finding] = []
        self._epoch: dict[str, int] = {}
        self._reported: dict[str, np.ndarray] = {}
        # per kind, the layers still to run (the count a finding names)
        self._left = dict(_kind_counts(side.layers))
        # (window, whether the graph path builds window indices) of the span check; None: the base formula's table
        b = side.boundaries.get(backend)
        self._spans = None if b is None or not b.span_checked() else \
            (b.window, batch.graph in b.spec.window_graphs)

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
            self.pool.rows(kind), layer, n_layers, self._reported.get(kind), self._span(kind))
        if found:
            self.found.extend(found)
            prev = self._reported.get(kind)
            self._reported[kind] = bad if prev is None else np.concatenate([prev, bad])

    def _span(self, kind: str) -> Optional[ReadSpan]:
        """The positions a correct table of ``kind`` reads, or None (the base formula's table: not checked); a
        table that states its kernels' own rule (``ReadTable.spans``) is held to that."""
        own = self.table.spans
        if own is not None:
            return own.get(kind)
        if self._spans is None:
            return None
        rq = self.batch.requests
        window, windowed = self._spans
        if kind == "swa" and windowed:
            return window_span(rq.seq_lens, rq.extend_lens, window)
        return prefix_span(rq.seq_lens)
