"""The unified pool in the run loop (``pool.unified = true``): 0.5.23's per-iteration plan, as the run sees it.

The scheduler allocates *virtual* ids (``out_cache_loc``, ``req_to_token``) from a unified allocator
(:class:`~simulator.memory.unified_pool.UnifiedPool`, or engine_path's adapter of the release's own
``UnifiedSWATokenToKVPoolAllocator``); the backends, the pools under test and the oracle work in
*physical* ids of each sub-pool. :class:`UnifiedPlan` stands between them, once per forward:

* **The allocator's events, in order** (bind, unbind, tombstone, move, available): frees end the oracle's
  liveness of the physical slots (a tombstone is an SWA eviction), and a compaction move moves the
  reference's tag and liveness *and* each pool's rows (every layer's K and V, read back and stored at the
  destination), as the engine's page copy does. The step's truth then carries no frees of its own.
* **The bind** (``KVLocPlan.bind``): ``out_cache_loc`` translated to physical full ids; the truth's slots to
  each side's physical ids; the mapping handed to the design hooks is the SWA translation per *physical*
  full slot (:meth:`physical_full_to_swa`), so a design's ``translate`` gives the plan's SWA write ids
  (``write_ids(SLIDING_WINDOW)``, the sink 0 on padded rows). ``req_to_token`` is translated for the read
  ids (the translator's ``read_table``).
* **The in-flight write window**: ``set_inflight_forward(virtual out_cache_loc)`` when a forward is
  planned; it stays pinned while the next forward is scheduled (0.5.23's overlap default: the scheduler of
  k+1 runs while forward k is in flight), so the lazy flush stops at it. An urgent flush (an allocation that
  fits only once compacted) does not spare it, as the release does not when no forward-done event is set; in this
  loop forward k has completed by then, and such moves are counted as ``pinned_moves``.
* **The read door of page-table backends** (flashattention and musa, whose SWA ``page_table`` is the
  translator's ``read_table`` over each request's whole ``req_to_token`` row; the kernel skips sink
  entries and positions outside the window): an entry that is negative or past the SWA buffer is an
  ``out_of_range`` finding (U2, #35933: a tombstoned ``-1`` escaping the translation).
* **A device-side index assert** (:class:`~simulator.memory.unified_pool.IndexOutOfRange`, U1 #37560: a virtual page
  past the SWA page table) ends the run: an ``out_of_range`` finding on every backend, as the engine dies.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np
import torch

from simulator.core.plugins import StepPlugin
from simulator.memory.unified_pool import ENTRY_ALIGN_BYTES, MOVE, TOMBSTONE, UNBIND, IndexOutOfRange, UnifiedPool
from simulator.records import Finding
from simulator.scheduling.batch import BatchTruth, ForwardBatch

#: backends whose SWA page table spans each request's whole row (read_table of the translator)
WHOLE_ROW_SWA_TABLE = frozenset({"flashattention", "musa"})

_EMPTY = np.zeros(0, dtype=np.int64)
_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8_e4m3": 1}


def bytes_per_token(model, kind: str) -> int:
    """One token's K and V bytes over every layer of a kind (what a page of that sub-pool costs per token),
    rounded up to the release's entry alignment (:data:`~simulator.memory.unified_pool.ENTRY_ALIGN_BYTES`)."""
    g = model.geometry(kind)
    raw = model.count(kind) * g.heads * (g.head_dim + g.v_head_dim) * _DTYPE_BYTES.get(model.kv_dtype, 2)
    return -(-raw // ENTRY_ALIGN_BYTES) * ENTRY_ALIGN_BYTES


def model_unified_pool(scenario, behaviour) -> UnifiedPool:
    """The model's unified pool for a scenario: the static pool's bytes as one budget, page costs from the
    model's layers, the release's unified pool behaviour (``Release.unified_pool``)."""
    m = scenario.model
    return UnifiedPool.from_pool_config(scenario.pool, max(1, bytes_per_token(m, "full")),
                                        max(1, bytes_per_token(m, "swa")), behaviour)


class UnifiedPlan(StepPlugin):
    """One run's bridge between the scheduler's virtual ids and the physical ids of the rest (see above), as a
    plug-in of the step pipeline: it binds each step, translates its read inputs, checks the page-table
    backends' read door, ends the run at a device-side assert and reports its counters (run.json's
    ``extra.unified``)."""

    name = "unified"
    #: the backends read the plan's physical mapping (made at each bind)
    owns_mapping = True

    def __init__(self, run):
        self.run = run
        self.alloc = run.alloc
        self.moves = 0
        #: slots of the pinned (in-flight) write window a compaction moved (an urgent flush may; the lazy one stops)
        self.pinned_moves = 0
        self._window: dict[str, np.ndarray] = {}     # the pinned window's physical slots per sub-pool
        self._seen: dict[str, set] = {}
        self.door_findings = 0
        self.died: dict | None = None

    # ------------------------------------------------------------------ events -> oracle and pools

    def _apply_events(self) -> tuple[np.ndarray, np.ndarray]:
        """The allocator's events since the last forward, in order; returns the physical (full, SWA) slots freed."""
        freed = {"full": [], "swa": []}
        for e in self.alloc.drain_events():
            if e.kind in (UNBIND, TOMBSTONE):
                for side in self.run.sides:
                    ref = side.reference
                    ref.live[e.pool][e.slots] = False
                    ref.live_tag[e.pool][e.slots] = 0
                    if e.pool == "swa":
                        ref.evicted[e.slots] = e.kind == TOMBSTONE
                freed[e.pool].append(e.slots)
            elif e.kind == MOVE:
                pinned = self._window.get(e.pool)
                if pinned is not None:
                    self.pinned_moves += int(np.isin(e.slots, pinned).sum())
                self._move(e.pool, e.slots, e.peers)
        return tuple(np.concatenate(freed[k]) if freed[k] else _EMPTY for k in ("full", "swa"))

    def _move(self, kind: str, src: np.ndarray, dst: np.ndarray) -> None:
        """Compaction: the page contents at ``src`` now live at ``dst`` (oracle and every pool under test)."""
        self.moves += int(src.size)
        for side in self.run.sides:
            ref = side.reference
            for arr in (ref.expected[kind], ref.live[kind], ref.live_tag[kind]) + ((ref.evicted,) if kind == "swa" else ()):
                arr[dst] = arr[src]
            vacated = np.setdiff1d(src, dst)       # a chain of moves: a source may be another move's destination
            ref.live[kind][vacated] = False
            ref.live_tag[kind][vacated] = 0
            if ref.device.type != "cpu":
                ref.expected_on[kind][torch.from_numpy(dst).to(ref.device)] = \
                    torch.from_numpy(ref.expected[kind][dst]).to(ref.device)
            ref.epoch += 1
            layers = [li for li in side.layers if li.kind == kind]
            if not layers:
                continue
            step = getattr(self.run.scheduler, "_step", 0)
            for name, pool in side.pools.items():
                s = torch.from_numpy(src).to(pool.device)
                d = torch.from_numpy(dst).to(pool.device)
                k_tags, v_tags = pool.read_tags(kind, s)
                for i, li in enumerate(layers):
                    k, _ = pool.make_rows(k_tags[i], li.layer, kind)
                    _, v = pool.make_rows(v_tags[i], li.layer, kind)
                    pool.store(kind, li.index, d, k, v)
                # the oracle checks the moved pages: every live destination must carry its owner's rows
                found = side.checker.check_contents(step, name, kind, pool, dst, side.layers,
                                                    self._seen.setdefault(name, set()))
                if found:
                    self.run.count(side, name, *side.checker.emit_all(found))

    # ------------------------------------------------------------------ one forward

    # ------------------------------------------------------------------ the pipeline's hooks

    def source(self, run, steps: Iterator) -> Iterator:
        return self.guard(steps)     # a device-side index assert (U1) ends the run

    def bind(self, ctx) -> None:
        ctx.batch, ctx.truth = self.bind_ids(ctx.batch, ctx.truth)     # virtual ids -> physical (the plan's bind)

    def read_inputs(self, ctx) -> None:
        if ctx.read_in is not None:
            ctx.read_in = self.physical_read_inputs(ctx.read_in)
        self.read_door(ctx.side, ctx.batch)

    def bind_ids(self, batch: ForwardBatch, truth: BatchTruth) -> tuple[ForwardBatch, BatchTruth]:
        """The step's batch and truth in physical ids (frees and moves applied to the oracle already)."""
        a = self.alloc
        # the scheduler's boundary flush (lazy compaction), the previous forward's window still pinned (under the
        # overlap default it is in flight while this batch is scheduled); then this forward's window is pinned
        a.flush_opportunistic()
        self._apply_events()
        virtual = batch.out_cache_loc
        window = virtual[: batch.num_token_non_padded]
        a.set_inflight_forward(window)
        self._window = {k: a.translate_kv_loc(window, k) for k in ("full", "swa")}
        loc = a.translate_kv_loc(virtual, "full")
        batch = dataclasses.replace(batch, out_cache_loc=loc)
        evicted = _EMPTY
        truth = dataclasses.replace(
            truth, full_slots=a.translate_kv_loc(truth.full_slots, "full"),
            swa_slots=a.translate_kv_loc(truth.swa_slots, "swa"), freed_full=_EMPTY, freed_swa=_EMPTY,
            evicted_swa=evicted, mapping_changed=_EMPTY)
        mapping = torch.from_numpy(a.physical_full_to_swa())
        self.run.mapping = mapping if self.run.device.type == "cpu" else mapping.to(self.run.device)
        return batch, truth

    def physical_read_inputs(self, read_in):
        """``req_to_token`` rows translated to physical full ids (zeros past a row's length: the sink)."""
        rtt, seq_lens, extend_lens = read_in
        phys = self.alloc.translate_kv_loc(rtt.cpu().numpy().ravel(), "full").reshape(tuple(rtt.shape))
        return torch.from_numpy(phys).to(rtt.device), seq_lens, extend_lens

    def read_door(self, side, batch: ForwardBatch) -> None:
        """Page-table backends: the SWA page table of every request's whole row, as the translator gives it;
        a negative or past-the-buffer entry is out_of_range (one finding per request and step)."""
        names = [b for b in side.boundaries if b in WHOLE_ROW_SWA_TABLE]
        rq = batch.requests
        if not names or rq is None:
            return
        rows = self.alloc.swa_rows
        found = []
        for i, (s, n) in enumerate(zip(rq.slots, rq.seq_lens.tolist())):
            table = self.alloc.translate_kv_loc(s.full[:n], "swa")
            bad = np.flatnonzero((table < 0) | (table >= rows))
            if bad.size:
                j = int(bad[0])
                found.append((int(rq.rids[i]), j, int(table[j]), int(s.full[j]), int(bad.size)))
        for name in names:
            out = [Finding(batch.step, name, -1, "swa", "out_of_range", slot, None, None,
                           f"req {rid} pos {pos}: the SWA page table (read_table of the whole row) holds {slot} "
                           f"for virtual token {virt} ({k} such entries), outside [0, {rows}): an illegal "
                           f"address under captured-graph replay")
                   for rid, pos, slot, virt, k in found]
            if out:
                self.door_findings += len(out)
                self.run.count(side, name, *side.checker.emit_all(out))

    # ------------------------------------------------------------------ the run's end

    def guard(self, source: Iterator) -> Iterator:
        """The scheduler's forwards until a device-side index assert (U1) ends the run: then one
        out_of_range finding per backend."""
        try:
            yield from source
        except IndexOutOfRange as e:
            f = e.finding
            step = getattr(self.run.scheduler, "_step", 0)
            self.died = {"step": step, "where": f.where, "index": f.index, "length": f.length, "token": f.token}
            side = self.run.target
            for name in side.boundaries:
                msg = f"the engine dies: {f} (a device-side index assert; the scheduler is gone)"
                self.run.count(side, name, *side.checker.emit_all(
                    [Finding(step, name, -1, "swa", "out_of_range", f.index, None, None, msg)]))
        finally:
            self.alloc.set_inflight_forward(None)

    def run_extra(self, run=None) -> dict:
        a = self.alloc
        return {"moves": self.moves, "pinned_moves": self.pinned_moves, "read_door_findings": self.door_findings, "died": self.died,
                "num_virtual_ids": int(a.num_virtual_ids), "full_pages": int(a.full.num_pages)
                if hasattr(a, "full") else None,
                "swa_table": int(a.swa.v2p.shape[0]) if hasattr(a, "swa") else None}
