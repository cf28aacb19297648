"""One step of a run on a CUDA pool with few host synchronisations: every backend first, one verdict read.

The run loop's own step (:meth:`simulator.run.Run.step`) checks each backend right after its writes, and
the checker decides on the host whether anything differs: several device-to-host reads per backend and
kind. :class:`GpuStepRunner` (the run's ``step_runner``) runs the same step in three phases:

1. the oracle learns the step (host), its device mirrors are updated with copies from pinned memory
   (no synchronisation); per backend in order: metadata init (the design's hooks; on host copies of
   the inputs and of the backend's boundary where every design's ``make_write_loc`` is layer-free, see
   :meth:`GpuStepRunner._host_metadata`, else on the device), the read ids (the design's ``read_ids`` on
   host copies of the same inputs: the read check is a host comparison with the oracle, so the table
   never has to cross) and, where the design's ``make_write_loc`` is layer-free, each kind's write
   location; nothing is written yet;
2. the backends of each pool class (:class:`simulator.memory.pool.PoolClasses`, as the CPU's ``SharedStep``:
   one physical pool per class of backends whose writes were identical so far) whose targets are equal
   by value form a group (device targets that could be equal cross in one copy first: a synchronisation
   that host metadata does not need); a class whose members differ splits (copy on divergence: the pool
   as it was before the step); each group's first backend (its host locations copied to the device, into
   its static buffers under a graph runner) runs the layers once (the executor: graph replays, grouped
   stores) and gets one device **verdict** per kind (:func:`cuda_path.check_kernel.verdict`): the number
   of candidate slots (the step's expected slots and the writes' targets, as the checker takes them)
   whose K or V tag words differ from the oracle's in a written layer, plus the layers' out-of-range
   counts. All verdicts of the step are read back in **one** copy (the step's synchronisation);
3. per backend in order: its observations (made before the verdict read, while the device still writes),
   then its findings: where the group's verdict is zero and the writes are plain (no failed write, one
   target per kind) the checker would find nothing, so it is not called; otherwise the group's first
   backend runs the checker exactly as in the run's own step (the pool is as the writes left it) and the
   others take its findings under their own name. The read check and the counts follow as in the run's
   own step.

So findings, counts and observations are the run's own, in the same order. Steps the runner does not
model (fault injection, an overlap timeline's scheduler writes between layers) go through the run's step.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Optional, Sequence

import numpy as np
import torch

from simulator.core.context import Forward, StepContext
from simulator.core.delivery import count_writes
from simulator.core.pipeline import apply_truth
from simulator.core.reads import ReadCheck
from simulator.core.writes import BackendStep
from simulator.designs.checks import HookFailure, call_hook, check_read_table
from simulator.designs.types import ReadTable
from simulator.memory.pool import PoolClasses
from simulator.oracle.checker import LayerWrite
from simulator.records import PAD_TAG, STATIC_GRAPHS
from simulator.scheduling.batch import BatchTruth

from .observations import ObservationQueue, observations_of
from .plans import (BackendPlan, BoundaryFacts, base_read_ids, base_read_table, padded_expected, plan_by_kind,
                    twin_key, write_signatures)
from .read_cache import IncrementalReads
from .staging import Staging, copy_all, put_rows
from .tag_words import host_tag_words
from .verdicts import DeviceVerdicts

CPU = torch.device("cpu")


class GpuStepRunner:
    """The step pipeline's whole-step executor for pools on a CUDA device (see the module docstring)."""

    #: metadata init on host tensors (:meth:`_host_metadata`): None on CUDA runs only; True also on the CPU
    #: (tests: host boundaries and their copies to the run's own, as on a GPU)
    host_metadata: Optional[bool] = None
    #: the base read tables hold only the entries not known clean since an earlier step (cuda_path/read_cache.py)
    incremental_reads: bool = True

    def __init__(self, executor, require_cuda: bool = False, pool_type: type = object) -> None:
        """``executor``: the layer executor that writes each group's layers (graph replays, grouped stores);
        ``require_cuda``: take only steps of runs on CUDA whose pools are all ``pool_type``."""
        self.executor = executor
        self.require_cuda, self.pool_type = require_cuda, pool_type
        self._zeros: Optional[torch.Tensor] = None       # as many zeros (the slots' zeroing is one of the copies)
        self._exp_slots: dict[int, torch.Tensor] = {}    # capture size -> static expected slots (both kinds)
        self._scratch: Optional[torch.Tensor] = None
        self._staging = Staging()
        #: the verdict slots and the oracle's device mirrors (cuda_path/verdicts.py)
        self.verdicts = DeviceVerdicts(self._staging)
        # the step in progress (plan -> write -> verdict): every backend's plan, the groups, the plans by name
        self._step_plans: list = []
        self._step_groups: list = []
        self._by_name: dict = {}
        self._step_slots: dict = {}
        self._reads = IncrementalReads()
        self._classes: dict[int, tuple] = {}             # id(side) -> (side, PoolClasses)
        self._host: dict[int, tuple] = {}                # id(side) -> (side, metadata on the host)
        self._host_b: dict[int, BoundaryFacts] = {}             # id(boundary) -> its host copy and facts
        self.twin_plans = 0                              # backends' metadata taken from an earlier backend's
        self.signature_reads = 0
        self.exact_checks = 0
        self.fast_checks = 0

    @property
    def verdict_reads(self) -> int:
        """The verdict reads made (one per step it ran, but where every backend's writes failed)."""
        return self.verdicts.reads

    # ------------------------------------------------------------------ the run's seam

    def classes(self, side) -> PoolClasses:
        """The pool classes of a model side (simulator/memory/pool.py): made at the side's first step here."""
        got = self._classes.get(id(side))
        if got is None or got[0] is not side:
            got = self._classes[id(side)] = (side, PoolClasses(side.pools))
        return got[1]

    def _unshare(self, run) -> None:
        """Before a step of the run's own (it writes every backend's pool): one pool per backend again."""
        for side, classes in self._classes.values():
            if any(m is side for m in run.sides):
                classes.partition([(n, ("own", n)) for n in side.boundaries])

    # ------------------------------------------------------------------ the pipeline's phases

    def takes(self, ctx: StepContext) -> bool:
        """Whether it runs this step: on CUDA pools it writes (the Triton store's ``TaggedKVPool``), where no
        plug-in acts between backends (fault injection, an overlap timeline, the unified pool, a forward
        observer). A step left to the per-forward grain moves the oracle and writes every backend's own pool:
        the mirrors are refreshed after it, no read is known clean, and each backend gets its own pool."""
        run = ctx.run
        if self.shares(run):
            return True
        if not run.plugins.stepwise:
            self.verdicts.stale = True
            self._reads.reset()
            self._unshare(run)
        return False

    def shares(self, run) -> bool:
        """Whether it takes the run's steps (asked before the first: the backends then start on one pool)."""
        return run.plugins.stepwise and (not self.require_cuda or run.device.type == "cuda" and all(
            isinstance(p, self.pool_type) for m in run.sides for p in m.pools.values()))

    def truth(self, ctx: StepContext) -> None:
        """The oracle learns the step (the run's order: frees on every side, a KV transfer, the side's writes);
        the incremental read tables note it; the read inputs in the runner's form (the requests themselves:
        tables are built on the host). The device mapping follows in the plan's staged copy."""
        run, truth, side = ctx.run, ctx.truth, ctx.side
        self.verdicts.side, self.verdicts.run_sides = side, run.sides
        for p in run.plugins:
            p.before_truth(ctx)
        apply_truth(ctx)
        if truth.transferred is not None:     # the references adopted its slots: every mirror again
            self.verdicts.stale = True
        self._reads.note_step(side.reference, truth)
        batch = ctx.batch
        if run.read_check and batch.requests is not None:
            rq = batch.requests
            ctx.read_in = (rq, torch.from_numpy(rq.seq_lens), torch.from_numpy(rq.extend_lens),
                           {"incremental": self._incremental(side, truth)})   # the last: tables (and req_to_token,
            # made when a design asks) shared within the step
        for p in run.plugins:
            p.read_inputs(ctx)

    def plan(self, ctx: StepContext) -> None:
        """Every backend's metadata init and read table, on host copies where every design's ``make_write_loc``
        is layer-free (:meth:`_host_metadata`), and the step's one staged copy; the groups of equal writes."""
        run, side, batch, truth = ctx.run, ctx.side, ctx.batch, ctx.truth
        classes = self.classes(side)
        if self._host_metadata(run, side):
            # the design hooks on host tensors (the run's mapping is the allocator's array), then the step's one
            # staged copy with the groups' first backends' write locations in it
            at = (torch.from_numpy(batch.out_cache_loc), torch.from_numpy(run.alloc.full_to_swa))
            plans, groups, by_name = self._groups(run, side, classes, batch, truth, at, ctx.read_in, True)
            leads = [by_name[ns[0]] for ns in groups if by_name[ns[0]].failure is None]
            self._twin_metas(leads, batch, at[1])
            ctx.tags, self._step_slots, _ = self._stage(run, side, batch, truth, leads, ctx.rows_cache)
        else:
            ctx.tags, self._step_slots, loc = self._stage(run, side, batch, truth, None, ctx.rows_cache)
            plans, groups, by_name = self._groups(run, side, classes, batch, truth, (loc, run.mapping), ctx.read_in,
                                                  False)
        self._step_plans, self._step_groups, self._by_name = plans, groups, by_name

    def write(self, ctx: StepContext) -> None:
        """Each group's layers written once, by its first backend."""
        by_name = self._by_name
        for names in self._step_groups:
            lead = by_name[names[0]]
            if lead.failure is None:
                self._forward(ctx.run, ctx.side, lead, ctx.batch, ctx.tags, ctx.rows_cache)
            for n in names:
                by_name[n].lead = lead

    def verdict(self, ctx: StepContext) -> None:
        """One device verdict per group, read back in one copy; the exact checker only where a verdict is not
        zero; every backend's observations (made while the device still writes) and findings for delivery."""
        side, groups, by_name = ctx.side, self._step_groups, self._by_name
        plain = self.verdicts.launch(side, self._step_slots, [by_name[names[0]] for names in groups], ctx.run.device)
        # the backends' observations made while the device still writes (host work only; delivered in order)
        calls = [self._calls(side, ctx.batch, p) for p in self._step_plans]
        flags = self.verdicts.read(side, plain)
        raw: dict[str, list] = {}
        for p, c in zip(self._step_plans, calls):
            ctx.forwards.append(self._findings(ctx, p, flags.get(p.lead.name), raw, c))

    # ------------------------------------------------------------------ phase 1

    def _groups(self, run, side, classes, batch, truth, at, read_in, host: bool) -> tuple:
        """The backends' plans (:meth:`_plans`), the groups of equal writes in the side's pool classes, and
        the plans by backend."""
        plans = self._plans(run, side, batch, truth, at, read_in, host)
        sigs, synced = write_signatures(plans)
        self.signature_reads += synced
        groups = classes.partition(list(zip(side.boundaries, sigs)))
        return plans, groups, {p.name: p for p in plans}

    def _stage(self, run, side, batch, truth: BatchTruth, leads: Optional[list], rows_cache: dict) -> tuple:
        """The step's host arrays on the device in one staged copy (:class:`_Staging`), then what they feed,
        in this order: the mirrors' expected words (made on the host, :func:`host_tag_words`), the static
        expected slots (padded on the host, :func:`padded_expected`), the run's device mapping, on host
        metadata (``leads``: the groups' first backends) their write locations (:meth:`_device_meta`) and, on a
        decode-graph step, the static tags its replays read (padded on the host; the executor's
        ``decode_tags_copy``, marked done in ``rows_cache``). Returns the device tags, this step's slots per kind
        and (without ``leads``) the device ``out_cache_loc``."""
        dev = run.device
        ch = truth.mapping_changed if dev.type != "cpu" else truth.mapping_changed[:0]
        storages = self.verdicts.mirror_storages(side.reference) if truth.tags.size else []
        arrays = [ch, run.alloc.full_to_swa[ch], truth.tags, truth.full_slots, truth.swa_slots]
        arrays += [host_tag_words(truth.tags, storage) for storage in storages]
        padded = padded_expected(batch, truth)
        if padded is not None:
            arrays.append(padded)
        if leads is None:
            arrays.append(batch.out_cache_loc)
        else:
            arrays += [a for p in leads for a in (p.meta.layer_loc.numpy(), p.meta.swa_loc.numpy())]
        n, m = batch.padded_len, truth.tags.shape[0]
        tag_copy = getattr(self.executor, "decode_tags_copy", None) \
            if batch.graph == "decode_graph" and 0 < m <= n else None
        if tag_copy is not None:
            padded_tags = np.full(n, PAD_TAG, dtype=np.int64)
            padded_tags[:m] = truth.tags
            arrays.append(padded_tags)
        got = self._staging.put(arrays, dev)
        ch_d, ch_to, tags, full_slots, swa_slots = got[:5]
        step_slots = {"full": full_slots, "swa": swa_slots}
        k = 5 + len(storages)
        self.verdicts.mirror(side, truth, dict(zip(storages, got[5:k])), step_slots)
        copies = self.verdicts.begin(batch, None if padded is None else got[k], dev)
        if ch.size:
            put_rows(run.mapping, ch_d, ch_to)
        rest = got[k + (padded is not None):]
        if leads is not None:
            copies += self._device_meta(leads, rest, batch)
        if tag_copy is not None:
            copies += tag_copy(n, m, got[-1], rows_cache)
        copy_all(copies)
        return tags, step_slots, None if leads is not None else rest[0]

    def _plans(self, run, side, batch, truth, at, read_in, host: bool) -> list["BackendPlan"]:
        """Every backend's :meth:`_plan`, in order. On host metadata a backend whose metadata init is provably
        an earlier backend's (:func:`twin_key`: the same design class with the base, backend-blind hooks,
        and the same spec but for its name; of its window graphs, whether they hold the step's graph) takes
        that backend's results instead of running the hooks again:
        the same values, with its own context (and, where its spec's ``slices_swa_loc`` is the same too, the
        same write locations)."""
        plans: list[BackendPlan] = []
        firsts: dict[tuple, BackendPlan] = {}
        graph = batch.graph
        for name, b in side.boundaries.items():
            facts = self._facts(b) if host else None
            key = None if facts is None or facts.twin_key is None else (facts.twin_key, graph in facts.window_graphs)
            twin = firsts.get(key) if key is not None else None
            p = self._plan(run, side, name, b, facts, batch, truth, at, read_in, twin)
            if key is not None and twin is None and p.failure is None:
                firsts[key] = p
            plans.append(p)
        return plans

    def _plan(self, run, side, name, b, facts: Optional["BoundaryFacts"], batch, truth, at, read_in,
              twin: Optional["BackendPlan"] = None) -> "BackendPlan":
        """A backend's metadata init (the design's hooks, on ``at``'s tensors: the host's where
        :meth:`_host_metadata`, ``facts`` its host boundary's; ``twin``: an earlier backend's, see :meth:`_plans`;
        where nothing here reads its own context, made later only if it leads a group: :meth:`_twin_metas`, and its
        read table is the twin's), its read ids (host) and, where its ``make_write_loc`` is layer-free, each kind's
        write location and the store's length check: what decides whether its writes are another backend's
        (:meth:`_signatures`). Nothing is written."""
        p = BackendPlan(name, b)
        if facts is not None:
            boundary, base_reads, slices = facts.host, facts.base_reads, facts.slices
        else:
            boundary, base_reads, slices = b, base_read_ids(b), b.spec.slices_swa_loc
        p.base_reads = base_reads
        # the same write locations: the same slicing and store kernel (_kernel_write: one that maps its slots itself)
        shared = twin is not None and twin.per_kind is not None and twin.boundary.spec.slices_swa_loc == slices and \
            _kernel_write(twin.boundary) == _kernel_write(boundary)
        try:
            table = None
            if twin is not None:
                self.twin_plans += 1
                if shared and (read_in is None or base_reads):
                    # nothing here reads its own context: made only where it leads a group (_twin_metas); the
                    # base read table depends on the inputs and the window alone (the twin key holds it)
                    p.twin, meta = twin, twin.meta
                    if twin.base_reads:
                        table = twin.table
                else:
                    p.meta = meta = dataclasses.replace(twin.meta, ctx=boundary.context(batch, at[1]))
            else:
                p.meta = meta = boundary.init_metadata(batch, *at)
            if table is None and read_in is not None:
                table = self._read_table(boundary, meta, read_in[:3], run, read_in[3], base_reads)
        except HookFailure as f:
            p.failure = (f, boundary)
            return p
        p.table = table
        if table is not None and not self._reads.known_clean(table):   # (else: no stale read to report)
            p.reads = ReadCheck(side, name, batch, truth, table, side.pools[name])
        if shared:
            p.per_kind = twin.per_kind           # the same targets: one tensor each (_signatures by identity)
        elif (facts.layer_free if facts is not None else boundary.layer_free_write_loc()):
            p.per_kind = plan_by_kind(boundary, meta, side.layers)
        run.crossings += len(side.layers)
        return p

    def _twin_metas(self, leads: list["BackendPlan"], batch, full_to_swa: torch.Tensor) -> None:
        """The metadata of the groups' first backends whose :meth:`_plan` took it from a twin without their own
        context: the twin's (host) metadata with their own (before :meth:`_device_meta` replaces the twin's)."""
        for p in leads:
            if p.twin is not None:
                ctx = self._facts(p.boundary).host.context(batch, full_to_swa)
                p.meta = dataclasses.replace(p.twin.meta, ctx=ctx)
                p.twin = None

    def _host_metadata(self, run, side) -> bool:
        """Whether a side's metadata init runs on host tensors (on a CUDA run whose designs all have a
        layer-free ``make_write_loc``): the hooks' results are the same values (the CPU run's), their
        small ops cost no launches, the targets compare on the host without a synchronisation, and only
        each group's first backend's locations cross (:meth:`_device_meta`). Each backend keeps host
        static buffers of its own (the stale tail of B2 lives there), copied to its device buffers
        before each of its graph replays."""
        got = self._host.get(id(side))
        if got is None or got[0] is not side:
            on = run.device.type == "cuda" if self.host_metadata is None else self.host_metadata
            ok = on and all(b.layer_free_write_loc() for b in side.boundaries.values())
            got = self._host[id(side)] = (side, ok)
        return got[1]

    def _facts(self, boundary) -> "BoundaryFacts":
        """A boundary's host copy and what the runner asks of it every step (made once: their inputs are set-up's)."""
        got = self._host_b.get(id(boundary))
        if got is None or got.boundary is not boundary:
            hb = copy.copy(boundary)      # the same design instance and spec; static buffers of its own
            hb.device, hb._static = CPU, {}
            got = self._host_b[id(boundary)] = BoundaryFacts(boundary, hb, twin_key(hb), base_read_ids(hb),
                                                      hb.spec.slices_swa_loc, hb.layer_free_write_loc(),
                                                      hb.spec.window_graphs)
        return got

    def _device_meta(self, leads: list["BackendPlan"], got: list, batch) -> list[tuple]:
        """The groups' first backends' host metadata on the device (``got``: their layer and SWA locations as
        staged, :meth:`_stage`): under a graph runner each one's device static buffers (the addresses its
        graphs captured; returns the copies into them, (buffer, staged) pairs), otherwise those tensors."""
        static = batch.graph in STATIC_GRAPHS
        n = batch.padded_len
        copies = []
        for i, p in enumerate(leads):
            loc, swa = got[2 * i], got[2 * i + 1]
            if static:
                loc_buf, swa_buf = p.boundary.static_buffers(batch.graph)
                copies += ((loc_buf[:n], loc), (swa_buf[:n], swa))
                loc, swa = copies[-2][0], copies[-1][0]
            p.meta = dataclasses.replace(p.meta, layer_loc=loc, swa_loc=swa)
        return copies

    def _forward(self, run, side, p: "BackendPlan", batch, tags, rows_cache) -> None:
        """A group's writes, once, by its first backend (the executor: graph replays, grouped stores)."""
        name = p.name
        pool = side.pools[name]
        if p.reads is not None:
            p.reads.pool = pool
        queue = ObservationQueue()
        self.executor.verdict_in_graph = False
        p.writes = self.executor.run(BackendStep(batch, name, p.boundary, pool, p.meta, side.layers, tags,
                                                 queue, run.now, rows_cache, None))
        p.calls = queue.calls
        # a graph's verdict counts only where this step filled the static expected slots it reads
        p.in_graph = bool(getattr(self.executor, "verdict_in_graph", False)) and self.verdicts.expected is not None

    def _incremental(self, side, truth) -> Optional[tuple]:
        """(the side's oracle, pool rows per kind) where the base read tables can be incremental: own tags (no
        shared content keys) and one pool size per kind over the side's backends; else None."""
        if not self.incremental_reads or truth.content_keys is not None:
            return None
        pools = side.pools.values()
        full, swa = {p.rows("full") for p in pools}, {p.rows("swa") for p in pools}
        if len(full) != 1 or len(swa) != 1:
            return None
        return side.reference, {"full": full.pop(), "swa": swa.pop()}

    def _read_table(self, boundary, meta, read_in, run, shared: dict, base: bool) -> ReadTable:
        """BackendBoundary.read_table on host copies of its inputs (and the allocator's own mapping).

        Backends whose design keeps the base ``Design.read_ids`` (``base``: a function of the inputs and
        ``ctx.window`` alone) share one table per step: the same object, so its read check runs once."""
        design = boundary.design
        key = None
        inc = None
        if base:
            # (without window indices SWA layers read the full table: then the whole of it, not the unclean part)
            inc = shared.get("incremental") if meta.window else None
            key = ("base read_ids", meta.ctx.window, inc is not None)
        table = shared.get(key) if key is not None else None
        if table is None:
            rq, seq_lens, extend_lens = read_in
            if key is not None:     # the base hook's table from the requests' slots (no dense req_to_token)
                # (int64 CSR tensors on the host by construction: check_read_table's conditions hold, so it is
                # not asked; tests/test_step_runner.py asks it)
                f2s = run.alloc.full_to_swa
                table = shared[key] = (base_read_table(rq, seq_lens, meta.ctx.window, f2s) if inc is None else
                                       self._reads.table(inc[0], rq, meta.ctx.window, f2s, inc[1]))
            else:
                rtt = shared.get("req_to_token")
                if rtt is None:
                    rtt = shared["req_to_token"] = torch.from_numpy(rq.req_to_token())
                mapping = torch.from_numpy(run.alloc.full_to_swa)
                ctx = dataclasses.replace(meta.ctx, full_to_swa=mapping)
                seq_lens, _ = boundary.kernel_read_lens(meta, seq_lens)
                table = call_hook("read_ids", design.read_ids, rtt, seq_lens, extend_lens, mapping, ctx)
                table = check_read_table(table, int(seq_lens.shape[0]), CPU)
                return boundary.as_kernels_read(meta, table, rtt, mapping)
        return boundary.as_kernels_read(meta, table, None, torch.from_numpy(run.alloc.full_to_swa))

    # ------------------------------------------------------------------ phase 3

    def _calls(self, side, batch, p: "BackendPlan") -> Sequence[tuple]:
        """A backend's boundary observations: its group's first backend's own, or made from them."""
        lead = p.lead
        return lead.calls if lead is p else observations_of(batch.step, p.name, p.per_kind, side.layers, lead)

    def _findings(self, ctx: StepContext, p: "BackendPlan", flag, raw: dict, calls: Sequence[tuple]) -> Forward:
        """A backend's forward for delivery: its observations (``calls``: :meth:`_calls`) and its findings: its
        group's first backend runs the checker where the verdict is not zero; the others take those findings
        under their own name (same pool, same writes)."""
        run, side, batch, name, lead = ctx.run, ctx.side, ctx.batch, p.name, p.lead
        f = Forward(name, p.boundary, side.pools[name], meta=p.meta, table=p.table, reads=p.reads,
                    writes=p.writes, observations=calls)
        if p.failure is not None:
            f.failure, f.boundary = p.failure
            return f
        if lead.n_writes < 0:
            lead.n_writes = count_writes(lead.writes)
        run.stats[name].writes += lead.n_writes
        if flag == 0:
            self.fast_checks += 1
            f.raw = []          # nothing found: the pipeline counts only what the read check finds
        elif lead is p:
            self.exact_checks += 1
            f.raw = raw[name] = side.checker.collect(batch.step, name, side.pools[name], ctx.truth, p.writes,
                                                     run.pad_slots)
        else:
            f.raw = [dataclasses.replace(x, backend=name) for x in raw[lead.name]]
        return f


    def graph_verdict(self, s: BackendStep, writes: list[LayerWrite], warm: bool = False) -> bool:
        """Called by a decode graph's capture (cuda_path/graphs.py): :meth:`DeviceVerdicts.graph_verdict`."""
        return self.verdicts.graph_verdict(s, writes, warm)


class StepwiseExecutor:
    """Any layer executor with its whole steps run by :class:`GpuStepRunner` (the tests run it on the CPU too)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.runner = self.stepwise = GpuStepRunner(inner)

    def run(self, s):
        return self.inner.run(s)


def _kernel_write(boundary) -> bool:
    """Whether the backend's store kernel maps each slot itself under its release (0.5.23's aiter: its full layers'
    writes carry no SWA ids, ReleaseBehaviour.kernel_write_backends)."""
    return boundary.spec.name in boundary.release.kernel_write_backends
