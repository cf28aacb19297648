"""Whole steps on the CPU's shared pools: one write per class of backends whose pools hold the same contents."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

import torch

from simulator.core.context import Forward, StepContext
from simulator.core.delivery import count_writes
from simulator.core.pipeline import plan_forward, truth_phase
from simulator.core.writes import dtype_name, prepare_write_at
from simulator.memory.pool import KVLengthMismatch, PoolClasses, PoolWriter, check_lengths
from simulator.oracle.checker import LayerWrite
from simulator.oracle.kvrows import pad_tags


@dataclass(slots=True)
class _Plan:
    """What the shared step keeps of one backend's forward between its plan and its verdict."""

    signature: tuple = ()
    #: a pool whose store checks lengths itself (``store_checks_lengths``): the rows each layer's store gets
    rows: Optional[int] = None
    #: its boundary observations (a list, or (per kind, layers, time) where every layer of a kind is alike)
    calls: object = field(default_factory=list)
    #: its group's first backend (the one that writes and runs the checker)
    lead: str = ""


class SharedStep:
    """A step on the CPU as the per-forward grain makes it, with the same findings, counts and observations in
    the same order, but each write made once for every backend whose pool holds the same contents:

    * plan: per backend in order, metadata init and read ids (the design's hooks), then per layer the read
      check and the write location (a ``make_write_loc`` declared ``layer_free`` is asked once per kind); the
      store's length check; nothing is stored yet;
    * write: the backends of each pool class (:class:`~simulator.memory.pool.PoolClasses`) with the same writes
      (the same targets by value, the same failures) form a group; a class whose members differ splits (copy on
      divergence); each group's pool takes its writes once, the layers of a kind that write one target in one
      store (``store_layers``); a pool whose store checks lengths itself (``store_checks_lengths``, a release's
      own pool: engine_path.pool.EnginePool) gets no length check of ours in the plan and each layer's store
      once per group, with the forward's own rows, its error (its own text) every member's
      (:func:`_store_checked`);
    * verdict: the first of a group runs the checker, the others take its findings under their own name (same
      pool, same writes: the same findings); the pipeline delivers them, backend by backend.

    It takes a step only on the CPU, where every plug-in is stepwise and every pool shares writes."""

    def __init__(self) -> None:
        self._classes: dict[int, tuple[object, PoolClasses]] = {}
        self.canon = _Canonical()
        self._writes: dict[tuple, list[LayerWrite]] = {}    # a step's by-kind writes, by signature
        self._plans: dict[str, _Plan] = {}

    def classes(self, side) -> PoolClasses:
        got = self._classes.get(id(side))
        if got is None or got[0] is not side:
            got = self._classes[id(side)] = (side, PoolClasses(side.pools))
        return got[1]

    # ------------------------------------------------------------------ the phases

    def shares(self, run) -> bool:
        # (a pool with shared_writes False stores per backend)
        return (run.device.type == "cpu" and run.plugins.stepwise
                and all(getattr(p, "shared_writes", True) for p in run.target.pools.values()))

    def takes(self, ctx: StepContext) -> bool:
        return self.shares(ctx.run)

    def truth(self, ctx: StepContext) -> None:
        truth_phase(ctx)

    def plan(self, ctx: StepContext) -> None:
        self.canon.reset()
        self._writes.clear()
        self._plans = {}
        tables: dict = {}
        for name in ctx.side.boundaries:
            ctx.forwards.append(self._forward(ctx, name, tables))

    def write(self, ctx: StepContext) -> None:
        side, plans = ctx.side, self._plans
        groups = self.classes(side).partition([(f.name, plans[f.name].signature) for f in ctx.forwards])
        by_name = {f.name: f for f in ctx.forwards}
        for f in ctx.forwards:          # (a class that split gave its new members a pool of their own)
            f.pool = side.pools[f.name]
            if f.reads is not None:
                f.reads.pool = f.pool
        for names in groups:
            lead = by_name[names[0]]
            if plans[lead.name].rows is not None:
                _store_checked(side.pools[names[0]], [(by_name[n], plans[n]) for n in names], ctx.tags,
                               ctx.rows_cache, ctx.run.now)
            elif lead.writes is not None:
                _store_writes(side.pools[names[0]], side.layers, lead.writes, ctx.tags, ctx.rows_cache, self.canon)
            for n in names:
                plans[n].lead = names[0]

    def verdict(self, ctx: StepContext) -> None:
        run, side, step = ctx.run, ctx.side, ctx.batch.step
        raw: dict[str, list] = {}
        for f in ctx.forwards:
            plan = self._plans[f.name]
            f.observations = _observations(step, f.name, plan.calls)
            if f.failure is not None:
                continue
            if plan.lead == f.name:
                f.raw = raw[f.name] = side.checker.collect(step, f.name, f.pool, ctx.truth, f.writes, run.pad_slots)
            else:
                f.raw = [dataclasses.replace(x, backend=f.name) for x in raw[plan.lead]]

    # ------------------------------------------------------------------ one backend's plan

    def _forward(self, ctx: StepContext, name: str, tables: dict) -> Forward:
        run, side, batch = ctx.run, ctx.side, ctx.batch
        boundary, pool = side.boundaries[name], side.pools[name]
        f = Forward(name, boundary, pool)
        plan = self._plans[name] = _Plan()
        if not plan_forward(ctx, f, tables):
            plan.signature = ("failed", name)
            return f
        checked = getattr(pool, "store_checks_lengths", False)      # the store's own length check, no host one
        per_kind = (_plan_by_kind(run, boundary, f, side.layers, plan)
                    if not checked and boundary.layer_free_write_loc() else None)
        if per_kind is not None:
            # every layer of a kind writes its kind's target: the signature and the writes follow from the kinds
            plan.signature = sig = ("by_kind",) + tuple((k, None if w[1] else self.canon.id(w[0]), w[1])
                                                        for k, w in per_kind.items())
            f.writes = self._writes.get(sig)
            if f.writes is None:
                f.writes = self._writes[sig] = _writes_by_kind(side.layers, per_kind)
            n_writes = len(f.writes)
        else:
            f.writes = _plan_layers(run, boundary, f, side.layers, plan, batch.step, check=not checked)
            plan.signature = _signature(f.writes, self.canon)
            if checked:
                plan.rows = f.meta.rows
                plan.signature = (("rows", f.meta.rows),) + plan.signature
            n_writes = count_writes(f.writes)
        run.crossings += len(side.layers)
        run.stats[name].writes += n_writes
        return f


class _Rows:
    """Stand-in for the rows of a layer in the store's length check (only their count matters there)."""

    __slots__ = ("shape",)

    def __init__(self, n: int):
        self.shape = (n,)


def _plan_layers(run, boundary, f: Forward, layers, plan: _Plan, step: int, check: bool = True) -> list[LayerWrite]:
    """Phase 1 of a backend: per layer the read check, the write location and the store's length check (not
    with ``check`` False: the store makes its own), and the observation the store would make; nothing is
    stored."""
    writes: list[LayerWrite] = []
    meta = f.meta
    rows = _Rows(meta.rows)
    reads = f.reads
    obs = plan.calls = []
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
        obs.append((step, f.name, layer.layer, *seen_obs, t, t, err))
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


def _plan_by_kind(run, boundary, f: Forward, layers, plan: _Plan) -> Optional[dict[str, tuple]]:
    """:func:`_plan_layers` for a layer-free ``make_write_loc``: asked at the first layer of each kind, its
    result (:func:`_write_of`) is every layer's of that kind. None when it failed there (then every layer is
    asked, as usual: the read checks already made are not made again)."""
    meta = f.meta
    rows = _Rows(meta.rows)
    per_kind: dict[str, tuple] = {}
    for layer in layers:
        if layer.kind in per_kind:
            continue
        if f.reads is not None:
            f.reads.at_layer(layer)
        w = _write_of(boundary, meta, layer, rows)
        if isinstance(w, LayerWrite):
            return None
        per_kind[layer.kind] = w
    plan.calls = (per_kind, layers, run.now())
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


def _store_checked(pool: PoolWriter, members: list[tuple[Forward, _Plan]], tags: torch.Tensor, rows_cache: dict,
                   now) -> None:
    """A group's writes into a pool whose store checks lengths itself: each layer's ``store`` once for the
    group, with rows of the forward's own length (as the run's own step makes them, :func:`rows_for`); where
    the store raises its length error, that error (its own text) becomes every member's write and observation
    of the layer, as each member's own store would have raised it (same pool contents, same call)."""
    lead, lead_plan = members[0]
    n = lead_plan.rows
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
    for f, plan in members:
        f.writes = [w if w.target is None or done[w.layer][2] is None else
                    LayerWrite(w.layer, w.kind, w.index, None, done[w.layer][2]) for w in f.writes]
        plan.calls = [c[:-3] + done[c[2]] if c[2] in done else c for c in plan.calls]
