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
import sys
from typing import Optional, Sequence

import numpy as np
import torch

from simulator.scheduling.batch import BatchTruth, ForwardBatch
from simulator.oracle.checker import LayerWrite
from simulator.designs.base import Design
from simulator.designs.checks import HookFailure, call_hook, check_read_table
from simulator.designs.types import ReadIds, ReadTable
from simulator.core.eager import BackendStep, loc_shapes, prepare_write_at
from simulator.oracle.kvrows import tag_lanes
from simulator.core.observe import BackendRows, EvenlyTimed, boundary_sink
from simulator.memory.pool import KVLengthMismatch, PoolClasses, check_lengths
from simulator.records import DRAFT_MODES, PAD_TAG, FINDING_CLASSES, STATIC_GRAPHS, StepRecord
from simulator.engine_model.release_model import release_of
from simulator.core.reads import _ReadCheck

from .check_kernel import verdict
from .read_cache import IncrementalReads

CPU = torch.device("cpu")


def h2d(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on the device without a host synchronisation (a pinned staging copy, then async)."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


#: numpy dtypes -> torch dtypes (the staged arrays' own, viewed on the device)
_TORCH_DTYPES: dict = {}


def _torch_dtype(dt: np.dtype) -> torch.dtype:
    got = _TORCH_DTYPES.get(dt)
    if got is None:
        got = _TORCH_DTYPES[dt] = torch.from_numpy(np.zeros(1, dtype=dt)).dtype
    return got


def stage_layout(arrays) -> tuple[list[np.ndarray], list[int], int]:
    """The arrays C-contiguous, each one's byte offset in one buffer (8-byte aligned: any dtype's view of
    its slice is valid) and the buffer's length in bytes."""
    arrays = [np.ascontiguousarray(a) for a in arrays]
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += _padded(a)
    return arrays, offsets, total


def _padded(a: np.ndarray) -> int:
    """An array's bytes in a staging buffer: its own, padded to whole 8-byte words."""
    return -(-a.nbytes // 8) * 8


def stage_pack(host: np.ndarray, arrays, offsets) -> None:
    """Each array's bytes into the uint8 buffer ``host`` at its offset."""
    for a, o in zip(arrays, offsets):
        if a.nbytes:
            host[o:o + a.nbytes] = a.reshape(-1).view(np.uint8)


def stage_views(buf: torch.Tensor, arrays, offsets) -> list[torch.Tensor]:
    """Each array as a view of its slice of the uint8 tensor ``buf``, in its own dtype and shape (no copy):
    the buffer's 8-byte words split at the arrays' offsets in one op, each part viewed in its array's dtype
    only where that is not int64 (most of a step's arrays are) and shaped only where it is not 1-D."""
    if not arrays:
        return []
    words = buf[:offsets[-1] + _padded(arrays[-1])].view(torch.int64)
    sizes = [(b - a) // 8 for a, b in zip(offsets, offsets[1:])]
    sizes.append(words.shape[0] - sum(sizes))
    out = list(words.split_with_sizes(sizes))
    for i, a in enumerate(arrays):
        if a.dtype != np.int64:
            out[i] = out[i].view(_torch_dtype(a.dtype))[:a.size]
        if a.ndim != 1:
            out[i] = out[i].view(a.shape)
    return out


class _Staging:
    """A step's host arrays on the device in one copy from pinned memory, without a host synchronisation.
    Four pinned byte buffers in turn (a step makes one copy); a buffer is filled again only once its last
    copy has completed. Almost every step ends with a read that waits for its copy (:meth:`synced`); only
    after one that did not (its writes all failed) is an event recorded, at the next copy, and waited on
    before the buffer is filled again (an event costs about 10 us of host time on the H200's host)."""

    RING = 4

    def __init__(self) -> None:
        self._bufs: list[Optional[tuple]] = [None] * self.RING     # (pinned uint8 tensor, its numpy view)
        self._events: list = [None] * self.RING                    # None: no copy of the buffer is in flight
        self._i = 0
        self._pending: Optional[int] = None                         # the buffer whose copy nothing waited for

    def put(self, arrays, dev: torch.device) -> list[torch.Tensor]:
        """The host arrays on ``dev``, each in its own dtype and shape: on CUDA their bytes in one pinned
        buffer (:func:`stage_layout`) and one copy, each result a view of its slice (no cast on the device)."""
        if dev.type != "cuda":
            return [h2d(a, dev) for a in arrays]
        if self._pending is not None:        # (the last copy: no read waited for it, so an event marks it)
            ev = self._events[self._pending] = torch.cuda.Event()
            ev.record()
        arrays, offsets, total = stage_layout(arrays)
        self._i = i = (self._i + 1) % self.RING
        ev = self._events[i]
        if ev is not None:
            if not ev.query():
                ev.synchronize()
            self._events[i] = None
        got = self._bufs[i]
        if got is None or got[0].shape[0] < total:
            buf = torch.empty(max(total, 1 << 19) * 2, dtype=torch.uint8).pin_memory()
            got = self._bufs[i] = (buf, buf.numpy())
        stage_pack(got[1], arrays, offsets)
        d = got[0][:total].to(dev, non_blocking=True)
        self._pending = i
        return stage_views(d, arrays, offsets)

    def synced(self) -> None:
        """A host synchronisation with the device's stream has completed since the last copy: it is done."""
        self._pending = None


#: storage dtype -> (per lane the stored bits of the 16 nibble values (tag_lanes' own), the byte table of
#: :func:`_byte_table` or None), or None: not reproduced nibble-wise
_NIBBLE_BITS: dict = {}
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _nibble_bits(storage: torch.dtype) -> Optional[tuple]:
    """[lanes, 16] of :func:`simulator.oracle.kvrows.tag_lanes`' bits: the lanes of the tags whose code (tag + 2)
    holds nibble j in every lane, as integers of the storage's size (and :func:`_byte_table`). Checked once
    against ``tag_lanes`` on tags incl. 0, PAD_TAG and large ones; None where it does not reproduce them
    (then the host asks ``tag_lanes`` itself)."""
    if storage in _NIBBLE_BITS:
        return _NIBBLE_BITS[storage]
    codes = torch.arange(16, dtype=torch.int64) * 0x11111111
    lanes = tag_lanes(codes - 2, storage).contiguous()
    bits = lanes.view(_INT_OF_SIZE[lanes.element_size()]).numpy().T.copy()
    _NIBBLE_BITS[storage] = got = (bits, _byte_table(bits))
    probe = np.concatenate([np.arange(-2, 70, dtype=np.int64), np.array([PAD_TAG, 2**31, 2**32 - 3, 2**40 + 5]),
                            np.random.default_rng(0).integers(-3, 2**34, 2000)])
    want = tag_lanes(torch.from_numpy(probe), storage).contiguous().view(torch.int64).numpy()
    if not np.array_equal(host_tag_words(probe, storage), want):
        _NIBBLE_BITS[storage] = got = None
    return got


def _byte_table(bits: np.ndarray) -> Optional[np.ndarray]:
    """Where every lane stores a nibble alike (an even number of lanes, a little-endian host): per byte of
    the code the two lanes it holds (low nibble: the lower lane, first in memory), as one integer of twice
    the storage's size; else None."""
    lanes, size = bits.shape[0], bits.dtype.itemsize
    if lanes % 2 or size > 4 or sys.byteorder != "little" or not (bits == bits[0]).all():
        return None
    one = bits[0].astype(np.int64) & ((1 << 8 * size) - 1)
    b = np.arange(256)
    return (one[b & 15] | one[b >> 4] << 8 * size).astype(np.dtype(f"<u{2 * size}"))


def host_tag_words(tags: np.ndarray, storage: torch.dtype) -> np.ndarray:
    """``tag_lanes(tags, storage).view(int64)`` made on the host (int64 ``[n, words]``; tag 0: zero words):
    the nibble values' stored bits (:func:`_nibble_bits`) looked up per byte of the code (or per lane)."""
    got = _nibble_bits(storage)
    if got is None:
        return tag_lanes(torch.from_numpy(np.asarray(tags, dtype=np.int64)), storage).contiguous().view(
            torch.int64).numpy()
    bits, pairs = got
    lanes = bits.shape[0]
    code = tags.astype(np.int64) + 2
    if pairs is not None:       # the code's low lanes / 2 bytes, each two lanes' bits
        vals = pairs.take(code.view(np.uint8).reshape(-1, 8)[:, :lanes // 2])
    else:
        vals = bits[np.arange(lanes), (code[:, None] >> (np.arange(lanes, dtype=np.int64) * 4)) & 0xF]
    vals[tags == 0] = 0
    return vals.view(np.int64)


def _copy_all(copies: list[tuple]) -> None:
    """Each (destination, source) pair's ``dst.copy_(src)``: those of one dtype in one ``_foreach_copy_`` (on
    CUDA one launch for all where the pairs allow it), a lone pair as it is. The destinations are distinct."""
    by_dtype: dict = {}
    for dst, src in copies:
        by_dtype.setdefault((dst.dtype, src.dtype), []).append((dst, src))
    for pairs in by_dtype.values():
        if len(pairs) == 1:
            pairs[0][0].copy_(pairs[0][1])
        else:       # (torch's multi-tensor copy: in every torch pyproject.toml allows)
            torch._foreach_copy_([d for d, _ in pairs], [s for _, s in pairs])


def _put_rows(dst: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> None:
    """``dst[index] = src`` along dim 0: ``index_copy_`` where the dtypes allow it (one op; indexed assignment
    goes through several on the host), else the indexed assignment. Rows listed twice hold equal values here
    (a step's slots are distinct; a mapping change repeats the allocator's one value), so either is the same."""
    if index.dtype == torch.int64 and src.dtype == dst.dtype:
        dst.index_copy_(0, index, src)
    else:
        dst[index] = src


class _Queue:
    """Boundary observations of one backend, held until its findings are delivered (same order). A lone batch
    of them (a graph replay's ``BackendRows``) is kept as it came: its tuples are made only where read."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls: Sequence[tuple] = []

    def on_boundary(self, *args) -> None:
        self._list().append(args)

    def on_boundaries(self, rows) -> None:
        if not self.calls and isinstance(rows, BackendRows):
            self.calls = rows
        else:
            self._list().extend(rows)

    def _list(self) -> list:
        """The observations as a list (a lone batch kept as it came made one now: more come)."""
        if not isinstance(self.calls, list):
            self.calls = list(self.calls)
        return self.calls


class GpuStepRunner:
    """Run.step for pools on a CUDA device (see the module docstring); ``syncs`` counts verdict reads."""

    #: metadata init on host tensors (:meth:`_host_metadata`): None on CUDA runs only; True also on the CPU
    #: (tests: host boundaries and their copies to the run's own, as on a GPU)
    host_metadata: Optional[bool] = None
    #: the base read tables hold only the entries not known clean since an earlier step (cuda_path/read_cache.py)
    incremental_reads: bool = True

    def __init__(self, executor) -> None:
        self.executor = executor
        self._exp: dict[tuple, torch.Tensor] = {}        # (id(reference), kind, storage) -> [rows, words]
        self._reserved: dict[tuple, torch.Tensor] = {}   # (id(checker), kind, rows) -> bool [rows]
        self._layers: dict[tuple, torch.Tensor] = {}     # indices of written layers -> device tensor
        self._out: Optional[torch.Tensor] = None         # static verdict slots (decode graphs add into theirs)
        self._zeros: Optional[torch.Tensor] = None       # as many zeros (the slots' zeroing is one of the copies)
        self._slot: dict[tuple, int] = {}                # (side, backend) -> its slot in _out
        self._exp_slots: dict[int, torch.Tensor] = {}    # capture size -> static expected slots (both kinds)
        self._stale = False
        self._side = None
        self._run_sides = None
        self._expected: Optional[dict] = None
        self._scratch: Optional[torch.Tensor] = None
        self._staging = _Staging()
        self._sink: Optional[tuple] = None               # (run.obs, simulator.core.observe.boundary_sink of it)
        self._reads = IncrementalReads()
        self._classes: dict[int, tuple] = {}             # id(side) -> (side, PoolClasses)
        self._host: dict[int, tuple] = {}                # id(side) -> (side, metadata on the host)
        self._host_b: dict[int, _Facts] = {}             # id(boundary) -> its host copy and facts
        self.verdict_reads = 0
        self.twin_plans = 0                              # backends' metadata taken from an earlier backend's
        self.signature_reads = 0
        self.exact_checks = 0
        self.fast_checks = 0

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

    def __call__(self, run, batch: ForwardBatch, truth: BatchTruth) -> Optional[StepRecord]:
        if run.faults is not None or run.before_layer is not None or getattr(run, "unified", None) is not None \
                or getattr(run, "forward_observer", None) is not None:
            self._stale = True         # the run's own step moves the oracle: refresh the mirrors after it
            self._reads.reset()        # (and what it wrote is not seen here: no read is known clean)
            self._unshare(run)
            return None
        t_start = run.now()
        side = run.draft if run.draft is not None and batch.mode in DRAFT_MODES else run.target
        dev = run.device
        self._side, self._run_sides = side, run.sides
        classes = self.classes(side)
        for m in run.sides:
            m.reference.apply_frees(truth)
        if truth.transferred is not None:     # a PD decode node's KV transfer (the run's own order)
            run.write_transfer(truth.transferred)
            self._stale = True                # the references adopted its slots: every mirror again
        side.reference.apply_writes(truth)
        self._reads.note_step(side.reference, truth)
        read_in = None
        if run.read_check and batch.requests is not None:
            rq = batch.requests
            read_in = (rq, torch.from_numpy(rq.seq_lens), torch.from_numpy(rq.extend_lens),
                       {"incremental": self._incremental(side, truth)})   # the last: tables (and req_to_token, made
            # when a design asks) shared within the step
        host = self._host_metadata(run, side)
        rows_cache: dict = {}       # (the executor's, shared by the step's backends)
        if host:        # the design hooks on host tensors (the run's mapping is the allocator's array), then
            # the step's one staged copy with the groups' first backends' write locations in it
            at = (torch.from_numpy(batch.out_cache_loc), torch.from_numpy(run.alloc.full_to_swa))
            plans, groups, by_name = self._groups(run, side, classes, batch, truth, at, read_in, True)
            leads = [by_name[ns[0]] for ns in groups if by_name[ns[0]].failure is None]
            self._twin_metas(leads, batch, at[1])
            tags, step_slots, _ = self._stage(run, side, batch, truth, leads, rows_cache)
        else:
            tags, step_slots, loc = self._stage(run, side, batch, truth, None, rows_cache)
            plans, groups, by_name = self._groups(run, side, classes, batch, truth, (loc, run.mapping), read_in,
                                                  False)
        for names in groups:
            lead = by_name[names[0]]
            if lead.failure is None:
                self._forward(run, side, lead, batch, tags, rows_cache)
            for n in names:
                by_name[n].lead = lead
        plain = self._launch_verdicts(side, step_slots, [by_name[names[0]] for names in groups], dev)
        # the backends' observations made while the device still writes (host work only; delivered in order)
        calls = [self._calls(side, batch, p) for p in plans]
        flags = self._read_verdicts(side, plain)
        raw: dict[str, list] = {}
        for p, c in zip(plans, calls):
            self._deliver(run, side, batch, truth, p, flags.get(p.lead.name), raw, c)
        return run._record_step(batch, t_start)

    # ------------------------------------------------------------------ phase 1

    def _groups(self, run, side, classes, batch, truth, at, read_in, host: bool) -> tuple:
        """The backends' plans (:meth:`_plans`), the groups of equal writes in the side's pool classes, and
        the plans by backend."""
        plans = self._plans(run, side, batch, truth, at, read_in, host)
        groups = classes.partition(list(zip(side.boundaries, self._signatures(plans))))
        return plans, groups, {p.name: p for p in plans}

    def _stage(self, run, side, batch, truth: BatchTruth, leads: Optional[list], rows_cache: dict) -> tuple:
        """The step's host arrays on the device in one staged copy (:class:`_Staging`), then what they feed,
        in this order: the mirrors' expected words (made on the host, :func:`host_tag_words`), the static
        expected slots (padded on the host, :func:`_padded_expected`), the run's device mapping, on host
        metadata (``leads``: the groups' first backends) their write locations (:meth:`_device_meta`) and, on a
        decode-graph step, the static tags its replays read (padded on the host; the executor's
        ``decode_tags_copy``, marked done in ``rows_cache``). Returns the device tags, this step's slots per kind
        and (without ``leads``) the device ``out_cache_loc``."""
        dev = run.device
        ch = truth.mapping_changed if dev.type != "cpu" else truth.mapping_changed[:0]
        storages = self._mirror_storages(side.reference) if truth.tags.size else []
        arrays = [ch, run.alloc.full_to_swa[ch], truth.tags, truth.full_slots, truth.swa_slots]
        arrays += [host_tag_words(truth.tags, storage) for storage in storages]
        padded = _padded_expected(batch, truth)
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
        self._mirror(side, truth, dict(zip(storages, got[5:k])), step_slots)
        copies = self._begin_verdicts(batch, None if padded is None else got[k], dev)
        if ch.size:
            _put_rows(run.mapping, ch_d, ch_to)
        rest = got[k + (padded is not None):]
        if leads is not None:
            copies += self._device_meta(leads, rest, batch)
        if tag_copy is not None:
            copies += tag_copy(n, m, got[-1], rows_cache)
        _copy_all(copies)
        return tags, step_slots, None if leads is not None else rest[0]

    def _plans(self, run, side, batch, truth, at, read_in, host: bool) -> list["_Plan"]:
        """Every backend's :meth:`_plan`, in order. On host metadata a backend whose metadata init is provably
        an earlier backend's (:func:`_twin_key`: the same design class with the base, backend-blind hooks,
        and the same spec but for its name; of its window graphs, whether they hold the step's graph) takes
        that backend's results instead of running the hooks again:
        the same values, with its own context (and, where its spec's ``slices_swa_loc`` is the same too, the
        same write locations)."""
        plans: list[_Plan] = []
        firsts: dict[tuple, _Plan] = {}
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

    def _plan(self, run, side, name, b, facts: Optional["_Facts"], batch, truth, at, read_in,
              twin: Optional["_Plan"] = None) -> "_Plan":
        """A backend's metadata init (the design's hooks, on ``at``'s tensors: the host's where
        :meth:`_host_metadata`, ``facts`` its host boundary's; ``twin``: an earlier backend's, see :meth:`_plans`;
        where nothing here reads its own context, made later only if it leads a group: :meth:`_twin_metas`, and its
        read table is the twin's), its read ids (host) and, where its ``make_write_loc`` is layer-free, each kind's
        write location and the store's length check: what decides whether its writes are another backend's
        (:meth:`_signatures`). Nothing is written."""
        p = _Plan(name, b)
        if facts is not None:
            boundary, base_reads, slices = facts.host, facts.base_reads, facts.slices
        else:
            boundary, base_reads, slices = b, _base_read_ids(b.design), b.spec.slices_swa_loc
        p.base_reads = base_reads
        shared = twin is not None and twin.per_kind is not None and twin.boundary.spec.slices_swa_loc == slices
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
            p.reads = _ReadCheck(side, name, batch, truth, table, side.pools[name])
        if shared:
            p.per_kind = twin.per_kind           # the same targets: one tensor each (_signatures by identity)
        elif (facts.layer_free if facts is not None else boundary.layer_free_write_loc()):
            p.per_kind = _plan_by_kind(boundary, meta, side.layers)
        run.crossings += len(side.layers)
        return p

    def _twin_metas(self, leads: list["_Plan"], batch, full_to_swa: torch.Tensor) -> None:
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

    def _facts(self, boundary) -> "_Facts":
        """A boundary's host copy and what the runner asks of it every step (made once: their inputs are set-up's)."""
        got = self._host_b.get(id(boundary))
        if got is None or got.boundary is not boundary:
            hb = copy.copy(boundary)      # the same design instance and spec; static buffers of its own
            hb.device, hb._static = CPU, {}
            got = self._host_b[id(boundary)] = _Facts(boundary, hb, _twin_key(hb), _base_read_ids(hb.design),
                                                      hb.spec.slices_swa_loc, hb.layer_free_write_loc(),
                                                      hb.spec.window_graphs)
        return got

    def _device_meta(self, leads: list["_Plan"], got: list, batch) -> list[tuple]:
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

    def _signatures(self, plans: list["_Plan"]) -> list[tuple]:
        """Per backend what decides its writes' effect: per kind the target by value and the length check's
        error (targets of one dtype and length that are distinct tensors are compared on the host after
        one copy of all of them: the step's first synchronisation, none where no two can be equal), or a
        signature of its own (a failed hook, a design whose write location depends on the layer)."""
        tensors: dict[tuple, torch.Tensor] = {}
        kinds = {id(p.per_kind): p.per_kind for p in plans if p.per_kind is not None}   # (twins share one)
        entries: dict[int, list] = {}        # id(per_kind) -> per kind (kind, its target's key or None, error)
        for i, per_kind in kinds.items():
            mine = entries[i] = []
            for kind, (_, target, err) in per_kind.items():
                key = None
                if err is None:
                    key = _target_key(target)
                    tensors.setdefault(key, target)
                mine.append((kind, key, err))
        buckets: dict[tuple, list] = {}
        for key, t in tensors.items():
            buckets.setdefault((t.dtype, t.shape[0]), []).append(key)
        ids = {key: ("tensor", key) for key in tensors}
        need = [key for keys in buckets.values() if len(keys) > 1 for key in keys]
        if need:
            seen: dict[tuple, int] = {}
            if all(tensors[k].device.type == "cpu" for k in need):     # (host metadata: compared in numpy)
                for k in need:       # (within a dtype equal values are equal bytes)
                    t = tensors[k]
                    ids[k] = ("value", seen.setdefault((t.dtype, t.numpy().tobytes()), len(seen)))
            else:
                both = torch.cat([tensors[k].reshape(-1).to(torch.int64) for k in need])
                self.signature_reads += 1                            # (a host synchronisation)
                host = both.cpu().numpy()
                off = 0
                for k in need:
                    n = tensors[k].shape[0]
                    ids[k] = ("value", seen.setdefault((tensors[k].dtype, host[off:off + n].tobytes()), len(seen)))
                    off += n
        sig = {i: ("by_kind",) + tuple((kind, None if err else ids[key], err) for kind, key, err in mine)
               for i, mine in entries.items()}
        return [("own", p.name) if p.failure is not None or p.per_kind is None else sig[id(p.per_kind)]
                for p in plans]

    def _forward(self, run, side, p: "_Plan", batch, tags, rows_cache) -> None:
        """A group's writes, once, by its first backend (the executor: graph replays, grouped stores)."""
        name = p.name
        pool = side.pools[name]
        if p.reads is not None:
            p.reads.pool = pool
        queue = _Queue()
        self.executor.verdict_in_graph = False
        p.writes = self.executor.run(BackendStep(batch, name, p.boundary, pool, p.meta, side.layers, tags,
                                                 queue, run.now, rows_cache, None))
        p.calls = queue.calls
        # a graph's verdict counts only where this step filled the static expected slots it reads
        p.in_graph = bool(getattr(self.executor, "verdict_in_graph", False)) and self._expected is not None

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
                table = shared[key] = (_base_read_table(rq, seq_lens, meta.ctx.window, f2s) if inc is None else
                                       self._reads.table(inc[0], rq, meta.ctx.window, f2s, inc[1]))
            else:
                rtt = shared.get("req_to_token")
                if rtt is None:
                    rtt = shared["req_to_token"] = torch.from_numpy(rq.req_to_token())
                mapping = torch.from_numpy(run.alloc.full_to_swa)
                ctx = dataclasses.replace(meta.ctx, full_to_swa=mapping)
                table = call_hook("read_ids", design.read_ids, rtt, seq_lens, extend_lens, mapping, ctx)
                table = check_read_table(table, int(seq_lens.shape[0]), CPU)
        if not meta.window and table.full is not None:
            table = ReadTable(full=table.full, swa=table.full)
        return table

    # ------------------------------------------------------------------ the oracle's device mirrors

    def _mirror_storages(self, ref) -> list:
        """The storage dtypes of the reference's mirror tables (the words a step's tags need), in table order."""
        rid = id(ref)
        return list(dict.fromkeys(storage for (r, _, storage) in self._exp if r == rid))

    def _mirror(self, side, truth: BatchTruth, words: dict, slots: dict) -> None:
        """The expected tag-lane words of the slots this step writes (``words``: per storage dtype, made on
        the host from its tags and staged; empty without tags), in every mirror of its reference."""
        ref = side.reference
        if self._stale:               # in place: decode graphs captured the tables' addresses
            for (rid, kind, storage), table in self._exp.items():
                refs = [m.reference for m in (self._run_sides or ()) if id(m.reference) == rid]
                if refs:
                    table.copy_(tag_lanes(refs[0].expected_on[kind], storage).contiguous().view(torch.int64))
            self._stale = False
        if not truth.tags.size:
            return
        for (rid, kind, storage), table in self._exp.items():
            if rid == id(ref):
                _put_rows(table, slots[kind], words[storage])

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

    def _begin_verdicts(self, batch, staged: Optional[torch.Tensor], dev) -> list[tuple]:
        """The copies (``(buffer, source)`` pairs, for :func:`_copy_all`: one launch with the step's other int64
        copies) that zero the static verdict slots and, under a graph runner (``staged``:
        :func:`_padded_expected`'s array as staged), put this step's expected slots into the static buffer of
        its capture size."""
        if self._out is None:
            self._out = torch.zeros(256, dtype=torch.int64, device=dev)
            self._zeros = torch.zeros(256, dtype=torch.int64, device=dev)
            self._scratch = torch.zeros(1, dtype=torch.int64, device=dev)
        self._expected = None
        copies = [(self._out, self._zeros)]
        if staged is not None:
            n = batch.padded_len
            buf = self._static_expected(n, dev)
            self._expected = {"full": buf[:n], "swa": buf[n:]}
            copies.append((buf, staged))
        return copies

    def _static_expected(self, n: int, dev) -> torch.Tensor:
        """The static expected slots of capture size ``n``: full then SWA, ``n`` each (graphs read their addresses)."""
        buf = self._exp_slots.get(n)
        if buf is None:
            buf = self._exp_slots[n] = torch.full((2 * n,), -1, dtype=torch.int64, device=dev)
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

    def _launch_verdicts(self, side, step_slots: dict, leads: list["_Plan"], dev) -> dict[str, bool]:
        """Per group (its first backend's name) whether its verdict decides (its launches made where no decode
        graph made them); False: the exact checker must run."""
        plain: dict[str, bool] = {}
        expected = self._expected
        for p in leads:
            writes = p.writes
            ok = writes is not None and all(w.error is None for w in writes)
            if ok and not p.in_graph:
                if expected is None:
                    expected = step_slots
                ok = self._verdict(side, side.pools[p.name], writes, expected, self._out_slot(side, p.name), dev)
            plain[p.name] = ok
        return plain

    def _read_verdicts(self, side, plain: dict[str, bool]) -> dict[str, Optional[int]]:
        """Per group: None (the exact checker must run) or its verdict; all of them in one read (the step's
        host synchronisation)."""
        if not any(plain.values()):
            return dict.fromkeys(plain)
        host = self._out[:len(self._slot)].cpu().tolist()
        self._staging.synced()          # (the read waited for the step's staged copy too: same stream)
        self.verdict_reads += 1
        return {n: host[self._slot[(id(side), n)]] if ok else None for n, ok in plain.items()}

    def _verdict(self, side, pool, writes: list[LayerWrite], expected, out, dev) -> bool:
        """Launch the backend's verdict per kind into ``out``; False where only the checker can decide
        (the layers of a kind wrote different targets: its torn-write path)."""
        for kind in ("full", "swa"):
            kw = [w for w in writes if w.kind == kind]
            if not kw:
                continue
            t0 = kw[0].target
            if not all(w.target is t0 for w in kw) and len({_target_key(w.target) for w in kw}) != 1:
                return False
            k, v = pool.k[kind], pool.v[kind]
            layers = self._layer_tensor(tuple(w.index for w in kw), dev)
            verdict(k, v, layers, expected[kind], kw[0].target,
                    self._exp_words(side.reference, kind, k.dtype),
                    self._reserved_mask(side.checker, kind, pool.rows(kind), dev), pool.err[kind], out)
        return True

    # ------------------------------------------------------------------ phase 3

    def _calls(self, side, batch, p: "_Plan") -> Sequence[tuple]:
        """A backend's boundary observations: its group's first backend's own, or made from them."""
        lead = p.lead
        return lead.calls if lead is p else _observations(batch.step, p.name, p.per_kind, side.layers, lead)

    def _deliver(self, run, side, batch, truth, p: "_Plan", flag, raw: dict, calls: Sequence[tuple]) -> None:
        """A backend's observations (``calls``: :meth:`_calls`), then its findings: its group's first backend runs
        the checker where the verdict is not zero; the others take those findings under their own name (same
        pool, same writes)."""
        name, lead = p.name, p.lead
        sink = self._sink
        if sink is None or sink[0] is not run.obs:
            sink = self._sink = (run.obs, boundary_sink(run.obs))
        sink[1](calls)
        if p.failure is not None:
            f, boundary = p.failure
            text = f.describe(boundary.design.name, boundary.context(batch), -1)
            kind = f.kind or ("full" if f.hook in ("fill_graph_loc_buffer", "read_ids") else "swa")
            run._count(side, name, *side.checker.design_error(batch.step, name, kind, text))
            return
        if lead.n_writes < 0:
            lead.n_writes = sum(1 for w in lead.writes if w.error_class != "design_error" or w.error is None)
        run.stats[name].writes += lead.n_writes
        if flag == 0:
            self.fast_checks += 1
            if p.reads is None:
                return      # nothing found, nothing to read-check: no counts (run._count would add none)
            mine = []
        elif lead is p:
            self.exact_checks += 1
            mine = raw[name] = side.checker.collect(batch.step, name, side.pools[name], truth, p.writes,
                                                    run.pad_slots)
        else:
            mine = [dataclasses.replace(f, backend=name) for f in raw[lead.name]]
        found, counts = side.checker.emit_all(mine)
        reads = p.reads
        if reads is not None:
            reads.finish()
            if reads.found:
                more, more_counts = side.checker.emit_all(reads.found)
                found = found + more
                counts = {c: n + more_counts[c] for c, n in counts.items()}
        run._count(side, name, found, counts)


@dataclasses.dataclass(slots=True, eq=False)
class _Plan:
    """One backend's forward of a step between its metadata init (phase 1) and its findings (phase 3)."""

    name: str
    boundary: object
    meta: object = None
    failure: Optional[tuple] = None             # (HookFailure, boundary): a per-forward hook failed
    reads: object = None                        # run._ReadCheck, or None
    per_kind: Optional[dict] = None             # kind -> (KVWriteLoc, target, length-check error)
    lead: Optional["_Plan"] = None              # the first backend of its group (itself when it writes)
    writes: Optional[list] = None               # the executor's LayerWrite log (the group's first backend)
    calls: list = dataclasses.field(default_factory=list)   # its boundary observations (the executor's)
    in_graph: bool = False                      # its verdict was added by a decode graph's replay
    n_writes: int = -1                          # its writes that count (-1: not counted yet)
    call_kinds: object = False                  # _call_kinds of its observations (False: not made yet)
    same_kinds: Optional[dict] = None           # id(per_kind) -> whether a follower's observations are its own
    tails: Optional[list] = None                # its observations but their step and backend (made when asked)
    twin: Optional["_Plan"] = None              # meta not made yet: it is this earlier backend's but the context
    table: object = None                        # its read table (None: no read check this step)
    base_reads: bool = False                    # its design keeps the base read_ids


@dataclasses.dataclass(slots=True, eq=False, frozen=True)
class _Facts:
    """A backend boundary's host copy (its own static buffers) and what the runner asks of it at every step."""

    boundary: object                            # the run's boundary (the key's owner)
    host: object                                # its host copy
    twin_key: Optional[tuple]                   # :func:`_twin_key`
    base_reads: bool                            # :func:`_base_read_ids` of its design
    slices: bool                                # its spec's slices_swa_loc
    layer_free: bool                            # its design's make_write_loc is layer-free
    window_graphs: frozenset                    # its spec's (a twin's step key holds whether the step's is in it)


class _Rows:
    """Stand-in for K/V rows in the store's length check (only their count matters there)."""

    __slots__ = ("shape",)

    def __init__(self, n: int):
        self.shape = (n,)


def _plan_by_kind(boundary, meta, layers) -> Optional[dict]:
    """A layer-free ``make_write_loc`` asked at the first layer of each kind: per kind (write location,
    target, the store's length-check error). None where it failed (the executor then builds every layer's
    failure itself: this backend's writes are its own)."""
    rows = _Rows(meta.rows)
    per_kind: dict[str, tuple] = {}
    for layer in layers:
        if layer.kind in per_kind:
            continue
        w = prepare_write_at(boundary, meta, layer)
        if isinstance(w, LayerWrite):
            return None
        wl, target = w
        try:
            check_lengths(target, rows, rows)
            err = None
        except KVLengthMismatch as e:
            err = str(e)
        per_kind[layer.kind] = (wl, target, err)
    return per_kind


def _call_kinds(calls: Sequence[tuple], layers) -> Optional[dict]:
    """Per kind what every one of a group's first backend's observations of that kind holds but its step,
    backend and times: (loc_len, swa_len, loc_dtype, swa_dtype, error); None where they are not one per
    layer, in layer order, alike within a kind. A graph replay's (``BackendRows`` of an :class:`EvenlyTimed`)
    from its static part, once per graph and layers (:data:`_STATIC_KINDS`)."""
    if len(calls) != len(layers):
        return None
    tails = getattr(calls, "tails", None)
    if isinstance(tails, EvenlyTimed):      # (the kinds hold no times: those of any one replay of the graph)
        got = _STATIC_KINDS.get(id(tails.static))
        if got is None or got[0] is not tails.static or got[1] is not layers:
            if len(_STATIC_KINDS) >= 4096:      # (graphs of runs gone: their parts are kept only until here)
                _STATIC_KINDS.clear()
            got = _STATIC_KINDS[id(tails.static)] = (tails.static, layers, _kinds_of(calls, layers))
        return got[2]
    return _kinds_of(calls, layers)


#: id(an EvenlyTimed's static part) -> (that part, the layers, :func:`_kinds_of` their rows): kept with the part
#: (a graph's, alive while its graph is) so that an id is never taken for another's
_STATIC_KINDS: dict[int, tuple] = {}


def _kinds_of(calls: Sequence[tuple], layers) -> Optional[dict]:
    """:func:`_call_kinds` row by row (as many rows as layers)."""
    got: dict[str, tuple] = {}
    for li, c in zip(layers, calls):
        t = c[3:7] + (c[9],)
        if c[2] != li.layer or got.setdefault(li.kind, t) != t:
            return None
    return got


def _observations(step: int, name: str, per_kind: dict, layers, lead: "_Plan") -> Sequence[tuple]:
    """A backend's boundary observations from its own write locations, in layer order, timed as its group's
    first backend's (a graph replay, a grouped store: one observation per layer, in the same order). Where
    its own per kind are what the first backend's hold (:func:`_call_kinds`; asked once per step for each
    ``per_kind``, which twins share), those under its own name (a ``BackendRows`` of the first backend's
    observations but their step and backend)."""
    if lead.call_kinds is False:
        lead.call_kinds, lead.same_kinds = _call_kinds(lead.calls, layers), {}
    same, seen = lead.same_kinds.get(id(per_kind)), None     # (the plans hold every per_kind through the step)
    if same is None:
        seen = _seen_kinds(per_kind)
        same = lead.same_kinds[id(per_kind)] = lead.call_kinds is not None and \
            lead.call_kinds == {k: seen[k] + (per_kind[k][2],) for k in seen}
    if same:
        if lead.tails is None:
            calls = lead.calls
            lead.tails = calls.tails if isinstance(calls, BackendRows) else [c[2:] for c in calls]
        return BackendRows((step, name), lead.tails)
    if seen is None:
        seen = _seen_kinds(per_kind)
    lead_calls = lead.calls
    if len(lead_calls) != len(layers):      # (not reached: the first backend observes every layer)
        lead_calls = [(None,) * 7 + (0, 0)] * len(layers)
    # (step, backend, layer, loc_len, swa_len, loc_dtype, swa_dtype, t0, t1, err)
    return [(step, name, li.layer, *seen[li.kind], c[7], c[8], per_kind[li.kind][2])
            for li, c in zip(layers, lead_calls)]


def _seen_kinds(per_kind: dict) -> dict:
    """Per kind what its observations hold of its write location: (loc_len, swa_len, loc_dtype, swa_dtype)."""
    return {kind: loc_shapes(wl) for kind, (wl, _, _) in per_kind.items()}


def _base_read_table(rq, seq_lens: torch.Tensor, window: int, full_to_swa: np.ndarray) -> ReadTable:
    """What the base ``Design.read_ids`` returns (the same values and dtypes), from the requests' slots:
    row i of ``req_to_token`` is request i's full slots up to its seq_len, so full layers read
    ``slots.full[:seq_len]`` and SWA layers ``full_to_swa[slots.full[start:seq_len]]`` with
    ``start = max(0, seq_len - extend_len + 1 - window)``."""
    seq = rq.seq_lens.astype(np.int64, copy=False)
    start = np.maximum(seq - rq.extend_lens + 1 - window, 0).astype(np.int64, copy=False)
    slots = [s.full for s in rq.slots]
    spans = list(zip(slots, start.tolist(), seq.tolist()))

    def ids(lo: bool) -> tuple[torch.Tensor, np.ndarray]:
        lens = np.maximum(seq - start, 0) if lo else seq
        indptr = np.zeros(seq.shape[0] + 1, dtype=np.int64)
        np.cumsum(lens, out=indptr[1:])
        parts = [f[a:b] if lo else f[:b] for f, a, b in spans]
        flat = np.concatenate(parts).astype(np.int64, copy=False) if parts else np.zeros(0, dtype=np.int64)
        return torch.from_numpy(indptr), flat

    full_ptr, full_ids = ids(False)
    swa_ptr, swa_ids = ids(True)
    return ReadTable(full=ReadIds(full_ptr, torch.from_numpy(full_ids), torch.zeros_like(seq_lens)),
                     swa=ReadIds(swa_ptr, torch.from_numpy(full_to_swa[swa_ids]), torch.from_numpy(start)))


#: the hooks metadata init and the layers' write locations call, in the base forms that read only their tensors
#: and the context's pad values (never the backend, its spec or any state): results equal for equal inputs
_BLIND_HOOKS = {"translate": Design.translate, "fill_graph_loc_buffer": Design.fill_graph_loc_buffer,
                "fill_graph_swa_buffer": Design.fill_graph_swa_buffer}


def _base_read_ids(design) -> bool:
    """Whether a design keeps the base ``Design.read_ids`` (a function of its inputs and ``ctx.window`` alone)."""
    return type(design).read_ids is Design.read_ids and "read_ids" not in getattr(design, "__dict__", {})


def _twin_key(boundary) -> Optional[tuple]:
    """What a host boundary's metadata init depends on where its design's hooks are the backend-blind ones
    (:data:`_BLIND_HOOKS`, a layer-free ``make_write_loc``; none set on the instance, so no instance state is
    read): the design's class, its static SWA buffers' dtype and release (each backend has its own instance), the
    run's engine, the boundary's settings and its spec but for its name (and ``slices_swa_loc``, which only the
    write location reads, and ``window_graphs``, which metadata init reads only as whether the step's graph is
    in it: :meth:`GpuStepRunner._plans` adds that). Equal keys: equal metadata for equal inputs, static buffers
    included (the base fills rewrite them whole up to the padded length, so no earlier replay shows through, nor
    a step a backend took a twin's metadata and left its own buffers as they were). None: its own."""
    d = boundary.design
    if not boundary.layer_free_write_loc() or any(getattr(type(d), h, None) is not f or h in getattr(d, "__dict__", {})
                                                   for h, f in _BLIND_HOOKS.items()):
        return None
    sp = boundary.spec
    return (type(d), d.graph_swa_dtype, id(release_of(d)), id(boundary.engine), boundary.side, boundary.page_size,
            boundary.swa_pad, boundary.window, boundary.max_rows, boundary.padding, sp.static_buffers)


def _padded_expected(batch, truth: BatchTruth) -> Optional[np.ndarray]:
    """Under a graph runner (the step's tags fit its capture size n): the step's full slots then its SWA slots,
    each padded to n with -1 (which no check reads), int64 ``[2n]``; else None."""
    n = batch.padded_len
    if batch.graph not in STATIC_GRAPHS or truth.tags.size > n:
        return None
    out = np.full(2 * n, -1, dtype=np.int64)
    out[:truth.full_slots.shape[0]] = truth.full_slots
    out[n:n + truth.swa_slots.shape[0]] = truth.swa_slots
    return out


def _target_key(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), t.shape[0], t.stride(0), t.dtype)


class StepwiseExecutor:
    """Any executor with its whole steps run by :class:`GpuStepRunner` (the tests run it on the CPU too)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.runner = GpuStepRunner(inner)

    def run(self, s):
        return self.inner.run(s)

    def run_step(self, run, batch, truth):
        return self.runner(run, batch, truth)
