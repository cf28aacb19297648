"""One step of a run on a CUDA pool with few host synchronisations: every backend first, one verdict read.

The run loop's own step (:meth:`simulator.run.Run.step`) checks each backend right after its writes, and
the checker decides on the host whether anything differs: several device-to-host reads per backend and
kind. :class:`GpuStepRunner` (the run's ``step_runner``) runs the same step in three phases:

1. the oracle learns the step (host), its device mirrors are updated with copies from pinned memory
   (no synchronisation); per backend in order: metadata init (the design's hooks, on the device), the
   read ids (the design's ``read_ids`` on host copies of the same inputs: the read check is a host
   comparison with the oracle, so the table never has to cross), the layers (the executor: graph
   replays, grouped stores); the boundary observations are queued, not yet delivered;
2. per backend and kind a device **verdict** (:func:`cuda_path.check_kernel.verdict`): the number of
   candidate slots (the step's expected slots and the writes' targets, as the checker takes them) whose
   K or V tag words differ from the oracle's in a written layer, plus the layers' out-of-range counts.
   All verdicts of the step are read back in **one** copy;
3. per backend in order: its observations delivered, then its findings: where the verdict is zero and
   the writes are plain (no failed write, one target per kind) the checker would find nothing, so it
   is not called; otherwise the checker runs exactly as in the run's own step (the pool is as the
   writes left it). The read check and the counts follow as in the run's own step.

So findings, counts and observations are the run's own, in the same order. Steps the runner does not
model (fault injection, an overlap timeline's scheduler writes between layers) go through the run's step.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import torch

from simulator.batch import BatchTruth, ForwardBatch
from simulator.checker import LayerWrite
from simulator.designs import Design, HookFailure, ReadTable, call_hook, check_read_table
from simulator.execute import BackendStep
from simulator.kvrows import tag_lanes
from simulator.records import DRAFT_MODES, FINDING_CLASSES, STATIC_GRAPHS, StepRecord

from .check_kernel import verdict

CPU = torch.device("cpu")


def h2d(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on the device without a host synchronisation (a pinned staging copy, then async)."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


class _Queue:
    """Boundary observations of one backend, held until its findings are delivered (same order)."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_boundary(self, *args) -> None:
        self.calls.append(args)


class GpuStepRunner:
    """Run.step for pools on a CUDA device (see the module docstring); ``syncs`` counts verdict reads."""

    def __init__(self, executor) -> None:
        self.executor = executor
        self._exp: dict[tuple, torch.Tensor] = {}        # (id(reference), kind, storage) -> [rows, words]
        self._reserved: dict[tuple, torch.Tensor] = {}   # (id(checker), kind, rows) -> bool [rows]
        self._layers: dict[tuple, torch.Tensor] = {}     # indices of written layers -> device tensor
        self._out: Optional[torch.Tensor] = None         # static verdict slots (decode graphs add into theirs)
        self._slot: dict[tuple, int] = {}                # (side, backend) -> its slot in _out
        self._exp_slots: dict[tuple, torch.Tensor] = {}  # (kind, capture size) -> static expected slots
        self._stale = False
        self._side = None
        self._run_sides = None
        self._expected: Optional[dict] = None
        self._scratch: Optional[torch.Tensor] = None
        self.verdict_reads = 0
        self.exact_checks = 0
        self.fast_checks = 0

    # ------------------------------------------------------------------ the run's seam

    def __call__(self, run, batch: ForwardBatch, truth: BatchTruth) -> Optional[StepRecord]:
        if run.faults is not None or run.before_layer is not None or getattr(run, "unified", None) is not None \
                or getattr(run, "forward_observer", None) is not None:
            self._stale = True         # the run's own step moves the oracle: refresh the mirrors after it
            return None
        t_start = run.now()
        side = run.draft if run.draft is not None and batch.mode in DRAFT_MODES else run.target
        dev = run.device
        self._side, self._run_sides = side, run.sides
        for m in run.sides:
            m.reference.apply_frees(truth)
        side.reference.apply_writes(truth)
        self._mirror(side, truth, dev)
        self._begin_verdicts(batch, truth, dev)
        ch = truth.mapping_changed
        if ch.size and dev.type != "cpu":     # on the CPU the run's mapping is the allocator's array
            run.mapping[h2d(ch, dev)] = h2d(run.alloc.full_to_swa[ch], dev)
        loc = h2d(batch.out_cache_loc, dev)
        tags = h2d(truth.tags, dev)
        read_in = None
        if run.read_check and batch.requests is not None:
            rq = batch.requests
            read_in = (torch.from_numpy(rq.req_to_token()), torch.from_numpy(rq.seq_lens),
                       torch.from_numpy(rq.extend_lens), {})     # the last: tables shared within the step
        rows_cache: dict = {}
        done = [self._forward(run, side, name, batch, truth, loc, tags, rows_cache, read_in)
                for name in side.boundaries]
        flags = self._verdicts(side, truth, done, dev)
        for i, d in enumerate(done):
            self._deliver(run, side, batch, truth, d, None if flags is None else flags[i])
        return run._record_step(batch, t_start)

    # ------------------------------------------------------------------ phase 1

    def _forward(self, run, side, name, batch, truth, loc, tags, rows_cache, read_in) -> dict:
        from simulator.run import _ReadCheck

        boundary, pool = side.boundaries[name], side.pools[name]
        queue = _Queue()
        d = {"name": name, "pool": pool, "queue": queue, "writes": None, "reads": None, "failure": None,
             "in_graph": False}
        try:
            meta = boundary.init_metadata(batch, loc, run.mapping)
            table = None if read_in is None else self._read_table(boundary, meta, read_in[:3], run, read_in[3])
        except HookFailure as f:
            d["failure"] = (f, boundary)
            return d
        if table is not None:
            d["reads"] = _ReadCheck(side, name, batch, truth, table, pool)
        self.executor.verdict_in_graph = False
        d["writes"] = writes = self.executor.run(BackendStep(batch, name, boundary, pool, meta, side.layers, tags,
                                                             queue, run.now, rows_cache, None))
        # a graph's verdict counts only where this step filled the static expected slots it reads
        d["in_graph"] = bool(getattr(self.executor, "verdict_in_graph", False)) and self._expected is not None
        run.crossings += len(side.layers)
        run.stats[name].writes += sum(1 for w in writes if w.error_class != "design_error" or w.error is None)
        return d

    @staticmethod
    def _read_table(boundary, meta, read_in, run, shared: dict) -> ReadTable:
        """BackendBoundary.read_table on host copies of its inputs (and the allocator's own mapping).

        Backends whose design keeps the base ``Design.read_ids`` (a function of the inputs and
        ``ctx.window`` alone) share one table per step: the same object, so its read check runs once."""
        design = boundary.design
        key = None
        if type(design).read_ids is Design.read_ids and "read_ids" not in getattr(design, "__dict__", {}):
            key = ("base read_ids", meta.ctx.window)
        table = shared.get(key) if key is not None else None
        if table is None:
            mapping = torch.from_numpy(run.alloc.full_to_swa)
            ctx = dataclasses.replace(meta.ctx, full_to_swa=mapping)
            table = call_hook("read_ids", design.read_ids, *read_in, mapping, ctx)
            table = check_read_table(table, int(read_in[1].shape[0]), CPU)
            if key is not None:
                shared[key] = table
        if not meta.window and table.full is not None:
            table = ReadTable(full=table.full, swa=table.full)
        return table

    # ------------------------------------------------------------------ the oracle's device mirrors

    def _mirror(self, side, truth: BatchTruth, dev: torch.device) -> None:
        """The expected tag-lane words of the slots this step writes, in every mirror of its reference."""
        ref = side.reference
        if self._stale:               # in place: decode graphs captured the tables' addresses
            for (rid, kind, storage), table in self._exp.items():
                refs = [m.reference for m in (self._run_sides or ()) if id(m.reference) == rid]
                if refs:
                    table.copy_(tag_lanes(refs[0].expected_on[kind], storage).contiguous().view(torch.int64))
            self._stale = False
        if not truth.tags.size:
            return
        tags, words = None, {}
        for (rid, kind, storage), table in self._exp.items():
            if rid != id(ref):
                continue
            if tags is None:
                tags = h2d(truth.tags, dev)
                slots = {"full": h2d(truth.full_slots, dev), "swa": h2d(truth.swa_slots, dev)}
            if storage not in words:        # the same words for both kinds: made once per step and dtype
                words[storage] = tag_lanes(tags, storage).contiguous().view(torch.int64)
            table[slots[kind]] = words[storage]

    def _exp_words(self, ref, kind: str, storage: torch.dtype) -> torch.Tensor:
        key = (id(ref), kind, storage)
        t = self._exp.get(key)
        if t is None:     # first use (or after a step of the run's own): from the oracle's device copy
            t = self._exp[key] = tag_lanes(ref.expected_on[kind], storage).contiguous().view(torch.int64)
        return t

    def _reserved_mask(self, checker, kind: str, rows: int, dev: torch.device) -> torch.Tensor:
        key = (id(checker), kind, rows)
        t = self._reserved.get(key)
        if t is None:
            r = checker.reserved
            mask = np.zeros(rows, dtype=bool)
            mask[r[(r >= 0) & (r < rows)]] = True
            t = self._reserved[key] = torch.from_numpy(mask).to(dev)
        return t

    def _layer_tensor(self, idx: tuple, dev: torch.device) -> torch.Tensor:
        t = self._layers.get(idx)
        if t is None:
            t = self._layers[idx] = torch.tensor(idx, dtype=torch.int64, device=dev)
        return t

    # ------------------------------------------------------------------ phase 2

    def _begin_verdicts(self, batch, truth, dev) -> None:
        """Zero the static verdict slots; under a graph runner, this step's expected slots into the static
        buffers of its capture size (padded with -1, which no check reads)."""
        if self._out is None:
            self._out = torch.zeros(256, dtype=torch.int64, device=dev)
            self._scratch = torch.zeros(1, dtype=torch.int64, device=dev)
        self._out.zero_()
        self._expected = None
        if batch.graph in STATIC_GRAPHS and truth.tags.size <= batch.padded_len:
            self._expected = {}
            for kind, slots in (("full", truth.full_slots), ("swa", truth.swa_slots)):
                buf = self._static_expected(kind, batch.padded_len, dev)
                buf.fill_(-1)
                if slots.size:
                    buf[:slots.size].copy_(h2d(slots, dev), non_blocking=True)
                self._expected[kind] = buf

    def _static_expected(self, kind: str, n: int, dev) -> torch.Tensor:
        buf = self._exp_slots.get((kind, n))
        if buf is None:
            buf = self._exp_slots[(kind, n)] = torch.full((n,), -1, dtype=torch.int64, device=dev)
        return buf

    def _out_slot(self, side, name: str) -> torch.Tensor:
        key = (id(side), name)
        i = self._slot.get(key)
        if i is None:
            i = self._slot[key] = len(self._slot)
            if i >= self._out.shape[0]:
                raise RuntimeError("more (side, backend) pairs than verdict slots")
        return self._out[i:i + 1]

    def graph_verdict(self, s: BackendStep, writes: list[LayerWrite], warm: bool = False) -> bool:
        """Called by a decode graph's capture: the backend's verdict, captured with its writes (it reads the
        static expected slots of the capture size and the graph's targets). ``warm``: the same launch just
        before the capture, into a scratch slot (it makes the tables and compiles the kernel outside the
        capture). False: not captured (the runner launches it, or the checker runs)."""
        if self._side is None or self._expected is None or s.pool is not self._side.pools.get(s.backend):
            return False
        out = self._scratch if warm else self._out_slot(self._side, s.backend)
        return self._verdict(self._side, s.pool, writes, self._expected, out, s.pool.device)

    def _verdicts(self, side, truth, done, dev) -> Optional[list]:
        """Per backend: None (the exact checker must run) or its verdict; one read for the step."""
        plain: list[bool] = []
        expected = self._expected
        for d in done:
            writes = d["writes"]
            ok = writes is not None and all(w.error is None for w in writes)
            if ok and not d["in_graph"]:
                if expected is None:
                    expected = {"full": h2d(truth.full_slots, dev), "swa": h2d(truth.swa_slots, dev)}
                ok = self._verdict(side, d["pool"], writes, expected, self._out_slot(side, d["name"]), dev)
            plain.append(ok)
        if not any(plain):
            return [None] * len(done)
        host = self._out[:len(self._slot)].cpu().tolist()
        self.verdict_reads += 1
        return [host[self._slot[(id(side), d["name"])]] if p else None for d, p in zip(done, plain)]

    def _verdict(self, side, pool, writes: list[LayerWrite], expected, out, dev) -> bool:
        """Launch the backend's verdict per kind into ``out``; False where only the checker can decide
        (the layers of a kind wrote different targets: its torn-write path)."""
        for kind in ("full", "swa"):
            kw = [w for w in writes if w.kind == kind]
            if not kw:
                continue
            keys = {(w.target.data_ptr(), w.target.shape[0], w.target.stride(0), w.target.dtype) for w in kw}
            if len(keys) != 1:
                return False
            k, v = pool.k[kind], pool.v[kind]
            layers = self._layer_tensor(tuple(w.index for w in kw), dev)
            verdict(k, v, layers, expected[kind], kw[0].target,
                    self._exp_words(side.reference, kind, k.dtype),
                    self._reserved_mask(side.checker, kind, pool.rows(kind), dev), pool.err[kind], out)
        return True

    # ------------------------------------------------------------------ phase 3

    def _deliver(self, run, side, batch, truth, d, flag) -> None:
        name, pool = d["name"], d["pool"]
        for args in d["queue"].calls:
            run.obs.on_boundary(*args)
        if d["failure"] is not None:
            f, boundary = d["failure"]
            text = f.describe(boundary.design.name, boundary.context(batch), -1)
            kind = f.kind or ("full" if f.hook in ("fill_graph_loc_buffer", "read_ids") else "swa")
            run._count(side, name, *side.checker.design_error(batch.step, name, kind, text))
            return
        if flag == 0:
            self.fast_checks += 1
            found, counts = [], dict.fromkeys(FINDING_CLASSES, 0)
        else:
            self.exact_checks += 1
            found, counts = side.checker.check(batch.step, name, pool, truth, d["writes"], run.pad_slots)
        reads = d["reads"]
        if reads is not None:
            reads.finish()
            if reads.found:
                more, more_counts = side.checker.emit_all(reads.found)
                found = found + more
                counts = {c: n + more_counts[c] for c, n in counts.items()}
        run._count(side, name, found, counts)


class StepwiseExecutor:
    """Any executor with its whole steps run by :class:`GpuStepRunner` (the tests run it on the CPU too)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.runner = GpuStepRunner(inner)

    def run(self, s):
        return self.inner.run(s)

    def run_step(self, run, batch, truth):
        return self.runner(run, batch, truth)
