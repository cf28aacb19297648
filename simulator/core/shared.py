"""Whole steps on the CPU's shared pools: one write per class of backends whose pools hold the same contents."""
from __future__ import annotations
import dataclasses
from dataclasses import dataclass, field
from typing import Optional
import torch
from simulator.scheduling.batch import ForwardBatch
from simulator.oracle.checker import LayerWrite
from simulator.designs.checks import HookFailure
from simulator.oracle.kvrows import pad_tags
from simulator.memory.pool import KVLengthMismatch, PoolClasses, PoolWriter, check_lengths
from simulator.records import DRAFT_MODES, StepRecord
from simulator.core.eager import dtype_name, prepare_write_at


@dataclass(slots=True)
class _Forward:
    """One backend's forward of a step between its layers (phase 1) and its findings (phase 3)."""

    name: str
    writes: Optional[list[LayerWrite]] = None
    failure: Optional[tuple] = None            # (HookFailure, boundary): a per-forward hook failed
    reads: object = None                       # run._ReadCheck, or None
    calls: object = field(default_factory=list)   # the boundary observations (_observations), with the findings
    signature: tuple = ()
    #: a pool whose store checks lengths itself (``store_checks_lengths``): the rows each layer's store gets
    rows: Optional[int] = None


class SharedStep:
    """A step on the CPU as the run's own step makes it, with the same findings, counts and observations in
    the same order, but each write made once for every backend whose pool holds the same contents:

    1. per backend in order: metadata init and read ids (the design's hooks), then per layer the read check
       and the write location (a design whose ``make_write_loc`` looks at no layer is asked once per kind,
       :data:`~simulator.core.boundary.LAYER_FREE_WRITE_LOC`); the store's length check; nothing is stored yet;
    2. the backends of each pool class (:class:`~simulator.memory.pool.PoolClasses`) with the same writes (the same
       targets by value, the same failures) form a group; a class whose members differ splits (copy on
       divergence); each group's pool takes its writes once, the layers of a kind that write one target
       in one store (``store_layers``); a pool whose store checks lengths itself (``store_checks_lengths``, a
       release's own pool: engine_path.pool.EnginePool) gets no length check of ours in phase 1 and each layer's
       store once per group, with the forward's own rows, its error (its own text) every member's
       (:func:`_store_checked`);
    3. per backend in order: its observations, then its findings: the first of a group runs the checker, the
       others take its findings under their own name (same pool, same writes: the same findings).

    Steps it does not model return None (the run's own step): another device, fault injection, an overlap
    timeline, the unified pool, a forward observer."""

    def __init__(self) -> None:
        self._classes: dict[int, tuple[object, PoolClasses]] = {}
        self.canon = _Canonical()
        self._writes: dict[tuple, list[LayerWrite]] = {}    # a step's by-kind writes, by signature

    def classes(self, side) -> PoolClasses:
        got = self._classes.get(id(side))
        if got is None or got[0] is not side:
            got = self._classes[id(side)] = (side, PoolClasses(side.pools))
        return got[1]

    def __call__(self, run, batch: ForwardBatch, truth) -> Optional[StepRecord]:
        if (run.device.type != "cpu" or run.faults is not None or run.before_layer is not None
                or getattr(run, "unified", None) is not None or getattr(run, "forward_observer", None) is not None
                or any(not getattr(p, "shared_writes", True) for p in run.target.pools.values())):
            return None     # (a pool with shared_writes False stores per backend)
        t_start = run.now()
        self.canon.reset()
        self._writes.clear()
        side = run.draft if run.draft is not None and batch.mode in DRAFT_MODES else run.target
        run._apply_truth(side, truth)
        loc = torch.from_numpy(batch.out_cache_loc)
        tags = torch.from_numpy(truth.tags)
        read_in = run._read_inputs(batch.requests) if run.read_check and batch.requests is not None else None
        tables: dict = {}
        forwards = [self._forward(run, side, name, batch, truth, loc, read_in, tables) for name in side.boundaries]
        classes = self.classes(side)
        groups = classes.partition([(d.name, d.signature) for d in forwards])
        by_name = {d.name: d for d in forwards}
        rows_cache: dict = {}
        for names in groups:
            lead = by_name[names[0]]
            if lead.rows is not None:
                _store_checked(side.pools[names[0]], [by_name[n] for n in names], tags, rows_cache, run.now)
            elif lead.writes is not None:
                _store_writes(side.pools[names[0]], side.layers, lead.writes, tags, rows_cache, self.canon)
        leader = {n: names[0] for names in groups for n in names}
        raw: dict[str, list] = {}
        for d in forwards:
            self._deliver(run, side, batch, truth, d, leader[d.name], raw)
        return run._record_step(batch, t_start)

    def _forward(self, run, side, name, batch, truth, loc, read_in, tables: dict) -> _Forward:
        from simulator.core.reads import _ReadCheck

        boundary, pool = side.boundaries[name], side.pools[name]
        d = _Forward(name)
        try:
            meta = boundary.init_metadata(batch, loc, run.mapping)
            table = None if read_in is None else boundary.read_table(meta, *read_in, run.mapping, tables)
        except HookFailure as f:
            d.failure, d.signature = (f, boundary), ("failed", name)
            return d
        if table is not None:
            d.reads = _ReadCheck(side, name, batch, truth, table, pool)
        checked = getattr(pool, "store_checks_lengths", False)      # the store's own length check, no host one
        per_kind = (_plan_by_kind(run, boundary, meta, side.layers, d)
                    if not checked and boundary.layer_free_write_loc() else None)
        if per_kind is not None:
            # every layer of a kind writes its kind's target: the signature and the writes follow from the kinds
            d.signature = sig = ("by_kind",) + tuple((k, None if w[1] else self.canon.id(w[0]), w[1])
                                                     for k, w in per_kind.items())
            d.writes = self._writes.get(sig)
            if d.writes is None:
                d.writes = self._writes[sig] = _writes_by_kind(side.layers, per_kind)
            n_writes = len(d.writes)
        else:
            d.writes = _plan_layers(run, boundary, meta, side.layers, d, batch.step, check=not checked)
            d.signature = _signature(d.writes, self.canon)
            if checked:
                d.rows = meta.rows
                d.signature = (("rows", meta.rows),) + d.signature
            n_writes = sum(1 for w in d.writes if w.error_class != "design_error" or w.error is None)
        run.crossings += len(side.layers)
        run.stats[name].writes += n_writes
        return d

    @staticmethod
    def _deliver(run, side, batch, truth, d: _Forward, lead: str, raw: dict) -> None:
        name = d.name
        on_boundary = run.obs.on_boundary
        for args in _observations(batch.step, name, d.calls):
            on_boundary(*args)
        if d.failure is not None:
            f, boundary = d.failure
            text = f.describe(boundary.design.name, boundary.context(batch), -1)
            kind = f.kind or ("full" if f.hook in ("fill_graph_loc_buffer", "read_ids") else "swa")
            run._count(side, name, *side.checker.design_error(batch.step, name, kind, text))
            return
        if lead == name:
            raw[name] = side.checker.collect(batch.step, name, side.pools[name], truth, d.writes, run.pad_slots)
            mine = raw[name]
        else:
            mine = [dataclasses.replace(f, backend=name) for f in raw[lead]]
        found, counts = side.checker.emit_all(mine)
        if d.reads is not None:
            d.reads.finish()
            if d.reads.found:
                more, more_counts = side.checker.emit_all(d.reads.found)
                found = found + more
                counts = {c: n + more_counts[c] for c, n in counts.items()}
        run._count(side, name, found, counts)


class _Rows:
    """Stand-in for the rows of a layer in the store's length check (only their count matters there)."""

    __slots__ = ("shape",)

    def __init__(self, n: int):
        self.shape = (n,)


def _plan_layers(run, boundary, meta, layers, d: _Forward, step: int, check: bool = True) -> list[LayerWrite]:
    """Phase 1 of a backend: per layer the read check, the write location and the store's length check (not
    with ``check`` False: the store makes its own), and the observation the store would make; nothing is
    stored."""
    writes: list[LayerWrite] = []
    rows = _Rows(meta.rows)
    reads = d.reads
    obs = d.calls = []
    seen = set()
    for layer in layers:
        kind = layer.kind
        if reads is not None and kind not in seen:
            # no ownership moves inside the forward here: a kind's reads are checked at its first layer
            # (where the run's own step checks them; its later layers find the epoch unchanged)
            seen.add(kind)
            reads.at_layer(layer)
        w = _write_of(boundary, meta, layer, rows, check)
        if isinstance(w, LayerWrite):
            writes.append(w)
            continue
        target, err, seen_obs = w
        t = run.now()
        obs.append((step, d.name, layer.layer, *seen_obs, t, t, err))
        writes.append(LayerWrite(layer.layer, kind, layer.index, None if err else target, err))
    return writes


def _write_of(boundary, meta, layer, rows, check: bool = True) -> tuple | LayerWrite:
    """A layer's target, the store's length-check error (None: it passes, or ``check`` is False) and what the
    store observes of the write location; the failed write where the design's hook failed."""
    w = prepare_write_at(boundary, meta, layer)
    if isinstance(w, LayerWrite):
        return w
    wl, target = w
    err = None
    if check:
        try:
            check_lengths(target, rows, rows)
        except KVLengthMismatch as e:
            err = str(e)
    swa = wl.swa_loc
    return target, err, (int(wl.loc.shape[0]), -1 if swa is None else int(swa.shape[0]), dtype_name(wl.loc.dtype),
                         "" if swa is None else dtype_name(swa.dtype))


def _plan_by_kind(run, boundary, meta, layers, d: _Forward) -> Optional[dict[str, tuple]]:
    """:func:`_plan_layers` for a layer-free ``make_write_loc``: asked at the first layer of each kind, its
    result (:func:`_write_of`) is every layer's of that kind. None when it failed there (then every layer is
    asked, as usual: the read checks already made are not made again)."""
    rows = _Rows(meta.rows)
    per_kind: dict[str, tuple] = {}
    for layer in layers:
        if layer.kind in per_kind:
            continue
        if d.reads is not None:
            d.reads.at_layer(layer)
        w = _write_of(boundary, meta, layer, rows)
        if isinstance(w, LayerWrite):
            return None
        per_kind[layer.kind] = w
    d.calls = (per_kind, layers, run.now())
    return per_kind


def _writes_by_kind(layers, per_kind: dict[str, tuple]) -> list[LayerWrite]:
    tgt = {k: None if w[1] else w[0] for k, w in per_kind.items()}
    return [LayerWrite(li.layer, li.kind, li.index, tgt[li.kind], per_kind[li.kind][1]) for li in layers]


def _observations(step: int, name: str, calls) -> list[tuple]:
    """The boundary observations of a backend's forward, in layer order."""
    if isinstance(calls, list):
        return calls
    per_kind, layers, t = calls
    return [(step, name, li.layer, *per_kind[li.kind][2], t, t, per_kind[li.kind][1]) for li in layers]


def _target_key(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), t.shape[0], t.stride(0), t.dtype)


def _signature(writes: list[LayerWrite], canon: "_Canonical") -> tuple:
    """What decides a step's effect on a pool and its findings: per layer its target (by value: tensors
    equal in dtype and values get one id, :class:`_Canonical`) or its failure."""
    ids: dict[int, int] = {}
    out = []
    for w in writes:
        t = w.target
        i = None
        if t is not None:
            i = ids.get(id(t))
            if i is None:
                i = ids[id(t)] = canon.id(t)
        out.append((w.index, w.kind, i, w.error, w.error_class))
    return tuple(out)


class _Canonical:
    """Ids of target tensors by value within a step: the same tensor (data, length, stride, dtype) at once,
    another tensor through ``torch.equal`` with the ones seen so far of its dtype and length."""

    def __init__(self) -> None:
        self.by_key: dict[tuple, int] = {}
        self.seen: list[tuple[torch.Tensor, int]] = []
        self.keep: list[torch.Tensor] = []

    def reset(self) -> None:
        self.by_key.clear()
        self.seen.clear()
        self.keep.clear()

    def id(self, t: torch.Tensor) -> int:
        key = _target_key(t)
        got = self.by_key.get(key)
        if got is None:
            for other, i in self.seen:
                if other.dtype == t.dtype and other.shape == t.shape and torch.equal(other, t):
                    got = i
                    break
            else:
                got = len(self.seen)
                self.seen.append((t, got))
            self.by_key[key] = got
            self.keep.append(t)       # keeps the data alive: no other tensor takes its address this step
        return got


def _store_writes(pool: PoolWriter, layers, writes: list[LayerWrite], tags: torch.Tensor, rows_cache: dict,
                  canon: "_Canonical") -> None:
    """A group's writes into its pool: the layers of a kind with one target in one ``store_layers`` call."""
    first = {}
    for li in layers:
        first.setdefault(li.kind, li.layer)
    groups: dict[tuple, list] = {}
    for w in writes:
        if w.target is not None:
            g = groups.setdefault((w.kind, canon.id(w.target)), [w.target, [], []])
            g[1].append(w.index)
            g[2].append(w.layer)
    store_layers = getattr(pool, "store_layers", None)
    for (kind, _), (target, indices, layer_ids) in groups.items():
        n = int(target.shape[0])
        kv = rows_cache.get((kind, n))
        if kv is None:
            kv = rows_cache[(kind, n)] = pool.make_rows(pad_tags(tags, n), first[kind], kind)
        k, v = kv
        if store_layers is not None:
            store_layers(kind, tuple(indices), tuple(layer_ids), target, k, v)
            continue
        for index, layer in zip(indices, layer_ids):
            pool.restamp(k, v, layer)
            pool.store(kind, index, target, k, v)


def _store_checked(pool: PoolWriter, members: list[_Forward], tags: torch.Tensor, rows_cache: dict, now) -> None:
    """A group's writes into a pool whose store checks lengths itself: each layer's ``store`` once for the
    group, with rows of the forward's own length (as the run's own step makes them, :func:`rows_for`); where
    the store raises its length error, that error (its own text) becomes every member's write and observation
    of the layer, as each member's own store would have raised it (same pool contents, same call)."""
    lead = members[0]
    n = lead.rows
    done: dict[int, tuple] = {}          # layer -> (t0, t1, error)
    for w in lead.writes:
        if w.target is None:
            continue                     # the design failed there: nothing to store
        kv = rows_cache.get((w.kind, n))
        if kv is None:
            kv = rows_cache[(w.kind, n)] = pool.make_rows(pad_tags(tags, n), w.layer, w.kind)
        else:
            pool.restamp(kv[0], kv[1], w.layer)
        t0 = now()
        try:
            pool.store(w.kind, w.index, w.target, kv[0], kv[1])
            err = None
        except KVLengthMismatch as e:
            err = str(e)
        done[w.layer] = (t0, now(), err)
    for d in members:
        d.writes = [w if w.target is None or done[w.layer][2] is None else
                    LayerWrite(w.layer, w.kind, w.index, None, done[w.layer][2]) for w in d.writes]
        d.calls = [c[:-3] + done[c[2]] if c[2] in done else c for c in d.calls]
