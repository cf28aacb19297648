"""Fault injection (issue 15 point 2): ``slotscope run SCENARIO --inject KIND[:PROB]``.

The canary's self-test kinds (``repoint_req_to_token``, ``corrupt_live_slot``, ``corrupt_idle_cached_slot``,
``corrupt_after_write``) and the kinds it has not (``drop_write``, ``shift_loc``, ``stale_graph_tail``,
``clear_swa_mapping``, ``repoint_swa_mapping``, ``misroute_layer``, ``corrupt_v_only``, ``write_slot0``,
``write_out_of_range``). One small function per kind, registered in :data:`FAULT_KINDS` with the seam of
the run loop it runs at:

* ``forward`` (before metadata init, once per step for every backend): the read inputs and the mapping the
  backends see this step (copies: the allocator and the oracle are untouched);
* ``pool`` (before one backend's forward): a row of the pool under test, written at rest;
* ``write`` (one layer's store of one backend): the indices handed to the store, or the row stored;
* ``after`` (after one backend's forward and its write check): a just-written row.

Faults draw from a seeded stream of their own (the scenario's seed), so the same seed gives the same faults;
each enabled kind draws the same numbers every step whether or not it can apply, at most one fault per kind
per step. A fault names the slots (and the request / position) it touches; it counts as detected by the first
finding at its step or later, of its backend, touching one of them (:meth:`FaultInjector.detect`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch

from simulator.core.plugins import StepPlugin
from simulator.core.writes import store_layer
from simulator.records import FINDING_CLASSES, STATIC_GRAPHS, Finding

DEFAULT_PROB = 0.05
BOGUS_TAG = (1 << 31) - 7        # a tag no token has: a corrupted row reads as "tag N", never a real owner


@dataclass
class Fault:
    step: int
    backend: str                 # a backend, or "all"
    layer: int                   # global layer id, -1 when the fault is not one layer's
    kind: str                    # the fault kind
    subpool: str                 # "full" | "swa" | ""
    slot: int
    detail: str
    slots: tuple[tuple[str, int], ...] = ()          # (subpool, slot) pairs a detecting finding may touch
    owner: Optional[tuple[int, int]] = None          # (request, position) a read-side finding may name
    detected: Optional[dict] = None

    def record(self) -> dict[str, Any]:
        return {"step": self.step, "backend": self.backend, "layer": self.layer, "subpool": self.subpool,
                "slot": self.slot, "kind": self.kind, "detail": self.detail}


@dataclass
class _Plan:
    """One step's draws for one kind (made whether or not the fault can apply)."""

    fire: bool
    backend: int
    layer: int
    u: float
    w: float


@dataclass(frozen=True)
class FaultKind:
    name: str
    seam: str                    # forward | pool | write | after
    apply: Callable


# ----------------------------------------------------------------------------- helpers

def _pick(arr, u: float):
    return arr[min(int(u * len(arr)), len(arr) - 1)]


def _owner(run, kind: str, slot: int) -> tuple[int, int] | None:
    o = run.scheduler.owner_of(int(run_side(run).reference.expected[kind][slot]))
    return None if o.request is None else (int(o.request), int(o.position))


def run_side(run):
    return run.side


def _corrupt_row(pool, kind: str, layer, slot: int, v_only: bool = False, tag: Optional[int] = None) -> None:
    """Overwrite one slot's row of one layer with a bogus tag (K and V, or V only keeping K's good tag)."""
    dev = pool.device
    loc = torch.tensor([slot], dtype=torch.int64, device=dev)
    kb, vb = pool.make_rows(torch.tensor([BOGUS_TAG], dtype=torch.int64, device=dev), layer.layer, kind)
    if v_only:
        kg, _ = pool.make_rows(torch.tensor([tag], dtype=torch.int64, device=dev), layer.layer, kind)
        pool.store(kind, layer.index, loc, kg.clone(), vb.clone())
    else:
        pool.store(kind, layer.index, loc, kb.clone(), vb.clone())


def _layers_of(run, kind: Optional[str] = None):
    return [li for li in run_side(run).layers if kind is None or li.kind == kind]


def _batch_rids(batch) -> set[int]:
    return set() if batch.requests is None else {int(r) for r in batch.requests.rids}


def _live_slots(run, kind: str, batch, in_batch: bool, exclude=()) -> np.ndarray:
    ref = run_side(run).reference
    live = ref.live[kind].copy()
    live[run_side(run).checker.reserved[run_side(run).checker.reserved < live.shape[0]]] = False
    if len(exclude):
        live[np.asarray(exclude, dtype=np.int64)] = False
    slots = np.flatnonzero(live)
    rids = _batch_rids(batch)
    keep = [s for s in slots.tolist() if (_owner(run, kind, s) or (-1,))[0] in rids] if in_batch else \
        [s for s in slots.tolist() if (_owner(run, kind, s) or (-1,))[0] not in rids]
    return np.asarray(keep, dtype=np.int64)


# ----------------------------------------------------------------------------- forward seam

def repoint_req_to_token(inj, run, batch, truth, plan, ctx) -> Optional[Fault]:
    """One req_to_token entry of an active request repointed to another active request's slot."""
    rq = batch.requests
    if rq is None or ctx["read_in"] is None or len(rq.rids) < 2:
        return None
    r2t = ctx["read_in"][0].clone()
    a = min(int(plan.u * len(rq.rids)), len(rq.rids) - 1)
    b = (a + 1 + min(int(plan.w * (len(rq.rids) - 1)), len(rq.rids) - 2)) % len(rq.rids)
    la, lb = int(rq.seq_lens[a]), int(rq.seq_lens[b])
    win = next(iter(run_side(run).boundaries.values())).window or la
    pa = max(0, la - 1 - int(plan.w * min(la, win)))     # an in-window position
    pb = lb - 1
    old, new = int(r2t[a, pa]), int(r2t[b, pb])
    if old == new:
        return None
    r2t[a, pa] = new
    ctx["read_in"] = (r2t,) + tuple(ctx["read_in"][1:])
    rid = int(rq.rids[a])
    return Fault(batch.step, "all", -1, "repoint_req_to_token", "full", new,
                 f"req {rid} pos {pa}: req_to_token {old} -> {new} (req {int(rq.rids[b])} pos {pb})",
                 slots=(("full", new),), owner=(rid, pa))


def _mapping_entry(run, batch, truth, plan):
    """A full slot of a request in the batch at a position its SWA layers read (in the window, written
    before this forward) whose SWA entry is live."""
    rq = batch.requests
    if rq is None or len(rq.rids) == 0:
        return None
    m = run.alloc.full_to_swa
    live_swa = run_side(run).reference.live["swa"]
    win = next(iter(run_side(run).boundaries.values())).window
    cands = []
    for r in range(len(rq.rids)):
        seq, ext = int(rq.seq_lens[r]), int(rq.extend_lens[r])
        lo = max(0, seq - ext + 1 - win) if win else 0
        for pos in range(lo, seq - ext):
            f = int(rq.slots[r].full[pos])
            if 0 < m[f] < live_swa.shape[0] and live_swa[m[f]]:
                cands.append(f)
    return None if not cands else int(_pick(cands, plan.u))


def _swap_mapping(run, ctx, f: int, value: int) -> int:
    mp = ctx["mapping"].clone()
    old = int(mp[f])
    mp[f] = value
    ctx["mapping"] = mp
    return old


def clear_swa_mapping(inj, run, batch, truth, plan, ctx) -> Optional[Fault]:
    """An in-window SWA mapping entry cleared (0) before metadata init, for this step's forwards."""
    f = _mapping_entry(run, batch, truth, plan)
    if f is None:
        return None
    old = _swap_mapping(run, ctx, f, 0)
    return Fault(batch.step, "all", -1, "clear_swa_mapping", "swa", old, f"full_to_swa[{f}] {old} -> 0",
                 slots=(("swa", old), ("full", f)), owner=_owner(run, "full", f))


def repoint_swa_mapping(inj, run, batch, truth, plan, ctx) -> Optional[Fault]:
    """An in-window SWA mapping entry repointed to another live SWA slot, before metadata init."""
    f = _mapping_entry(run, batch, truth, plan)
    if f is None:
        return None
    live = np.flatnonzero(run_side(run).reference.live["swa"])
    live = live[live != int(run.alloc.full_to_swa[f])]
    if live.size == 0:
        return None
    g = int(_pick(live, plan.w))
    old = _swap_mapping(run, ctx, f, g)
    return Fault(batch.step, "all", -1, "repoint_swa_mapping", "swa", g, f"full_to_swa[{f}] {old} -> {g}",
                 slots=(("swa", g), ("swa", old), ("full", f)), owner=_owner(run, "full", f))


# ----------------------------------------------------------------------------- pool seam (at rest)

def _corrupt_at_rest(kind_name: str, in_batch: bool):
    def apply(inj, run, batch, truth, plan, backend, pool) -> Optional[Fault]:
        slots = _live_slots(run, "swa", batch, in_batch, exclude=truth.swa_slots)
        if slots.size == 0:
            return None
        slot = int(_pick(slots, plan.u))
        layer = _pick(_layers_of(run, "swa"), plan.w)
        _corrupt_row(pool, "swa", layer, slot)
        return Fault(batch.step, backend, layer.layer, kind_name, "swa", slot,
                     f"swa slot {slot} layer {layer.layer}: row overwritten with tag {BOGUS_TAG}",
                     slots=(("swa", slot),))
    apply.__name__ = kind_name
    apply.__doc__ = ("Flip a live in-window slot's row (a request in the batch)" if in_batch else
                     "Flip an idle slot's row (a live request not in the batch; the prefix cache's when it has one)")
    return apply


corrupt_live_slot = _corrupt_at_rest("corrupt_live_slot", True)
corrupt_idle_cached_slot = _corrupt_at_rest("corrupt_idle_cached_slot", False)


# ----------------------------------------------------------------------------- after seam

def corrupt_after_write(inj, run, batch, truth, plan, backend, pool) -> Optional[Fault]:
    """A just-written slot's row flipped after the forward (and after its write check)."""
    n = truth.swa_slots.shape[0]
    if n == 0:
        return None
    i = min(int(plan.u * n), n - 1)
    slot = int(truth.swa_slots[i])
    if not run_side(run).reference.live["swa"][slot]:
        return None
    layer = _pick(_layers_of(run, "swa"), plan.w)
    _corrupt_row(pool, "swa", layer, slot)
    return Fault(batch.step, backend, layer.layer, "corrupt_after_write", "swa", slot,
                 f"swa slot {slot} layer {layer.layer} (token {i}) flipped after the forward", slots=(("swa", slot),))


# ----------------------------------------------------------------------------- write seam

def _real_token(plan, truth, target) -> Optional[int]:
    n = min(truth.tags.shape[0], int(target.shape[0]))
    return None if n == 0 else min(int(plan.u * n), n - 1)


def drop_write(inj, s, layer, wl, target, k, v, plan, store):
    """One layer's write of one token skipped (the checker still sees the designed target)."""
    truth = inj.truth
    i = _real_token(plan, truth, target)
    if i is None:
        return None
    slot = int(target[i])
    keep = torch.ones(target.shape[0], dtype=torch.bool, device=target.device)
    keep[i] = False
    w = store(s, layer, wl, target[keep], k[keep.to(k.device)], v[keep.to(v.device)])
    w.target = target
    return w, Fault(s.batch.step, s.backend, layer.layer, "drop_write", layer.kind, slot,
                    f"token {i}'s write at {layer.kind} slot {slot} skipped", slots=((layer.kind, slot),))


def _retarget(name: str, make: Callable):
    def apply(inj, s, layer, wl, target, k, v, plan, store):
        i = _real_token(plan, inj.truth, target)
        if i is None:
            return None
        got = make(s, layer, wl, target, i)
        if got is None:
            return None
        new, slots, detail = got
        return store(s, layer, wl, new, k, v), Fault(s.batch.step, s.backend, layer.layer, name, layer.kind,
                                                       slots[0][1], detail, slots=slots)
    apply.__name__ = name
    return apply


def _shift(s, layer, wl, target, i):
    n = min(s.batch.num_token_non_padded, target.shape[0])
    new = target.clone()
    new[:n] = new[:n] + 1
    slot = int(target[0])
    return new, ((layer.kind, slot), (layer.kind, slot + 1)), f"{layer.kind} loc shifted by one (token 0: {slot} -> {slot + 1})"


def _misroute(s, layer, wl, target, i):
    other = wl.swa_loc if layer.kind == "full" else wl.loc
    if other is None or other.shape[0] != target.shape[0]:
        return None
    diff = torch.nonzero(other.to(torch.int64)[: target.shape[0]] != target.to(torch.int64)).flatten()
    if diff.numel() == 0:
        return None
    j = int(diff[0])
    slot = int(target[j])
    o = "swa_loc" if layer.kind == "full" else "loc"
    return other.to(target.dtype).clone(), ((layer.kind, slot), (layer.kind, int(other[j]))), \
        f"{layer.kind} layer {layer.layer} wrote at {o} (token {j}: {slot} -> {int(other[j])})"


def _slot0(s, layer, wl, target, i):
    slot = int(target[i])
    if slot == 0:
        return None
    new = target.clone()
    new[i] = 0
    return new, ((layer.kind, slot), (layer.kind, 0)), f"token {i}'s {layer.kind} index {slot} -> 0"


def _oor(s, layer, wl, target, i):
    rows = s.pool.rows(layer.kind)
    slot = int(target[i])
    new = target.clone()
    new[i] = rows
    return new, ((layer.kind, rows), (layer.kind, slot)), f"token {i}'s {layer.kind} index {slot} -> {rows} (rows)"


shift_loc = _retarget("shift_loc", _shift)
misroute_layer = _retarget("misroute_layer", _misroute)
write_slot0 = _retarget("write_slot0", _slot0)
write_out_of_range = _retarget("write_out_of_range", _oor)


def corrupt_v_only(inj, s, layer, wl, target, k, v, plan, store):
    """After one layer's store, one token's V row overwritten (K keeps its good tag)."""
    i = _real_token(plan, inj.truth, target)
    if i is None:
        return None
    w = store(s, layer, wl, target, k, v)
    slot = int(target[i])
    if w.error is not None or not (0 <= slot < s.pool.rows(layer.kind)):
        return None if w.error is None else (w, None)
    _corrupt_row(s.pool, layer.kind, layer, slot, v_only=True, tag=int(inj.truth.tags[i]))
    return w, Fault(s.batch.step, s.backend, layer.layer, "corrupt_v_only", layer.kind, slot,
                    f"V of {layer.kind} slot {slot} layer {layer.layer} overwritten, K kept", slots=((layer.kind, slot),))


def stale_graph_tail(inj, s, layer, wl, target, k, v, plan, store):
    """A decode graph replay leaves the previous replay's tail (its rows past this batch's real tokens)."""
    prev = inj.last_graph_target.get((s.backend, layer.kind))
    real = inj.truth.tags.shape[0]
    if s.batch.graph not in STATIC_GRAPHS or prev is None or target.shape[0] <= real:
        return None
    n = min(target.shape[0], prev.shape[0])
    if n <= real:
        return None
    new = target.clone()
    tail = prev[real:n].to(target.dtype)
    changed = torch.nonzero(tail != target[real:n]).flatten()
    rows = s.pool.rows(layer.kind)
    slots = [int(tail[j]) for j in changed.tolist() if 0 < int(tail[j]) < rows]
    if not slots:
        return None
    new[real:n] = tail
    return store(s, layer, wl, new, k, v), Fault(
        s.batch.step, s.backend, layer.layer, "stale_graph_tail", layer.kind, slots[0],
        f"{layer.kind} tail [{real}, {n}) kept the previous replay's slots {slots[:8]}",
        slots=tuple((layer.kind, x) for x in slots))


#: every kind, in the order its numbers are drawn each step
FAULT_KINDS: dict[str, FaultKind] = {k.name: k for k in (
    FaultKind("repoint_req_to_token", "forward", repoint_req_to_token),
    FaultKind("corrupt_live_slot", "pool", corrupt_live_slot),
    FaultKind("corrupt_idle_cached_slot", "pool", corrupt_idle_cached_slot),
    FaultKind("corrupt_after_write", "after", corrupt_after_write),
    FaultKind("drop_write", "write", drop_write),
    FaultKind("shift_loc", "write", shift_loc),
    FaultKind("stale_graph_tail", "write", stale_graph_tail),
    FaultKind("clear_swa_mapping", "forward", clear_swa_mapping),
    FaultKind("repoint_swa_mapping", "forward", repoint_swa_mapping),
    FaultKind("misroute_layer", "write", misroute_layer),
    FaultKind("corrupt_v_only", "write", corrupt_v_only),
    FaultKind("write_slot0", "write", write_slot0),
    FaultKind("write_out_of_range", "write", write_out_of_range),
)}


def parse_inject(specs) -> dict[str, float]:
    """``KIND[:PROB]`` strings -> {kind: prob}; ValueError naming the bad one."""
    out: dict[str, float] = {}
    for spec in specs or ():
        name, _, p = str(spec).partition(":")
        if name not in FAULT_KINDS:
            raise ValueError(f"--inject {spec}: unknown fault kind {name!r} (one of {', '.join(FAULT_KINDS)})")
        try:
            prob = DEFAULT_PROB if p == "" else float(p)
        except ValueError:
            raise ValueError(f"--inject {spec}: PROB must be a number in [0, 1]") from None
        if not 0.0 <= prob <= 1.0:
            raise ValueError(f"--inject {spec}: PROB must be a number in [0, 1]")
        out[name] = prob
    return out


class FaultInjector(StepPlugin):
    """The run's faults: plans per step, applies them at the seams, logs them, matches detections. As a
    plug-in of the step pipeline it also runs the content check: the pool under test's rows at each
    forward's read set (and at freed slots, and every live slot at the run's end) against the oracle."""

    name = "faults"

    def __init__(self, kinds: dict[str, float], seed: int):
        self.kinds = {k: kinds[k] for k in FAULT_KINDS if k in kinds}
        self.rng = np.random.default_rng([int(seed), 0xFA017])
        self.faults: list[Fault] = []
        self.plans: dict[str, _Plan] = {}
        self.truth = None
        self.last_graph_target: dict[tuple[str, str], torch.Tensor] = {}
        self._next: dict[tuple[str, str], torch.Tensor] = {}
        self._seen: dict[str, set] = {}         # per backend: the (kind, slot, layer) the content check reported
        self._freed: dict = {}                  # this step's freed slots per kind, with their last owner's tag
        self._mapping = None                    # the run's mapping while a step reads a faulted copy

    # the pipeline's hooks ----------------------------------------------------------------------------
    def before_truth(self, ctx) -> None:
        # the content check's freed slots, with their last owner's tag (before the oracle forgets it)
        ref, truth = ctx.side.reference, ctx.truth
        self._freed = {k: (f, ref.expected[k][f].copy()) for k, f in (("full", truth.freed_full),
                                                                      ("swa", truth.freed_swa))}

    def read_inputs(self, ctx) -> None:
        run = ctx.run
        self._mapping = run.mapping
        ctx.read_in, run.mapping = self.begin_step(run, ctx.batch, ctx.truth, ctx.read_in)

    def end_step(self, ctx) -> None:
        if self._mapping is not None:
            ctx.run.mapping, self._mapping = self._mapping, None

    def before_forward(self, ctx, f) -> None:
        run, side = ctx.run, ctx.side
        self.pool_faults(run, ctx.batch, ctx.truth, f.name, f.pool)
        freed = [x for kind, (slots, ftags) in self._freed.items()
                 for x in side.checker.check_contents(ctx.batch.step, f.name, kind, f.pool, slots, side.layers,
                                                      self._seen.setdefault(f.name, set()), tags=ftags)]
        if freed:
            run.count(side, f.name, *side.checker.emit_all(freed))

    def store(self, ctx, f) -> Optional[Callable]:
        return self.write_hook(ctx.run, f.name, ctx.side.layers)

    def after_forward(self, ctx, f, found, counts):
        self.after_faults(ctx.run, ctx.batch, ctx.truth, f.name, f.pool)
        return self.content_check(ctx.side, f.name, ctx.batch.step, f.pool, f.table, found, counts)

    def end_run(self, run) -> None:
        """Every live slot of every pool checked once, then each fault matched with its first detection."""
        step = run.steps[-1].step if run.steps else 0
        for side in run.sides:
            for name in side.boundaries:
                run.count(side, name, *self.content_check(side, name, step, side.pools[name], None, [],
                                                          dict.fromkeys(FINDING_CLASSES, 0), sweep=True))
        self.detect(run.findings)

    def content_check(self, side, name, step, pool, table, found, counts, sweep: bool = False):
        """The pool under test's rows at the read set (every live slot at the final sweep) against the
        reference, after the forward; a difference is a stale_read (checker.check_contents)."""
        for kind in ("full", "swa"):
            if sweep:
                slots = np.flatnonzero(side.reference.live[kind])
            else:
                ids = None if table is None else table.of(kind)
                if ids is None:
                    continue
                slots = np.unique(ids.indices.cpu().numpy().astype(np.int64))
            more = side.checker.check_contents(step, name, kind, pool, slots, side.layers,
                                               self._seen.setdefault(name, set()), sweep)
            if more:
                m, mc = side.checker.emit_all(more)
                found = found + m
                counts = {c: n + mc[c] for c, n in counts.items()}
        return found, counts

    # seams -------------------------------------------------------------------------------------------
    def begin_step(self, run, batch, truth, read_in):
        """Draw the step's plans; apply the forward-seam kinds. Returns (read_in, mapping) for this step."""
        self.truth = truth
        self.last_graph_target.update(self._next)
        self._next = {}
        backends = list(run.stats)
        self.plans = {}
        for name, prob in self.kinds.items():
            d = self.rng.random(5)
            self.plans[name] = _Plan(bool(d[0] < prob), int(d[1] * len(backends)) % len(backends),
                                     int(d[2] * 1e6), float(d[3]), float(d[4]))
        ctx = {"read_in": read_in, "mapping": run.mapping}
        for name, kind in FAULT_KINDS.items():
            if kind.seam == "forward" and self._fires(name):
                self._log(kind.apply(self, run, batch, truth, self.plans[name], ctx))
        return ctx["read_in"], ctx["mapping"]

    def _fires(self, name: str) -> bool:
        p = self.plans.get(name)
        return p is not None and p.fire

    def _for_backend(self, run, name: str, backend: str) -> bool:
        return self._fires(name) and list(run.stats)[self.plans[name].backend] == backend

    def pool_faults(self, run, batch, truth, backend, pool):
        for name, kind in FAULT_KINDS.items():
            if kind.seam == "pool" and self._for_backend(run, name, backend):
                self._log(kind.apply(self, run, batch, truth, self.plans[name], backend, pool))

    def after_faults(self, run, batch, truth, backend, pool):
        for name, kind in FAULT_KINDS.items():
            if kind.seam == "after" and self._for_backend(run, name, backend):
                self._log(kind.apply(self, run, batch, truth, self.plans[name], backend, pool))

    def write_hook(self, run, backend: str, layers) -> Optional[Callable]:
        """The executor's per-layer store for one backend forward (None: nothing planned for it)."""
        names = [n for n, k in FAULT_KINDS.items() if k.seam == "write" and self._fires(n)
                 and list(run.stats)[self.plans[n].backend] == backend]
        graph_kinds = self.truth is not None
        if not names and not graph_kinds:
            return None
        chosen = {}
        for n in names:
            ls = list(layers)
            chosen[n] = ls[self.plans[n].layer % len(ls)].layer

        def write(s, layer, wl, target, k, v):
            if s.batch.graph in STATIC_GRAPHS and layer.layer == next(li.layer for li in layers
                                                                     if li.kind == layer.kind):
                self._next[(backend, layer.kind)] = target.clone()
            for n in names:
                if chosen[n] == layer.layer:
                    got = FAULT_KINDS[n].apply(self, s, layer, wl, target, k, v, self.plans[n], store_layer)
                    if got is not None:
                        w, fault = got
                        self._log(fault)
                        return w
            return store_layer(s, layer, wl, target, k, v)
        return write

    def _log(self, fault: Optional[Fault]) -> None:
        if fault is not None:
            self.faults.append(fault)

    # detection ---------------------------------------------------------------------------------------
    def detect(self, findings: list[Finding]) -> None:
        """Each fault's first finding at its step or later, of its backend, touching its slots or owner."""
        for f in self.faults:
            slots = set(f.slots)
            for x in findings:
                if x.step < f.step or (f.backend != "all" and x.backend != f.backend):
                    continue
                hit = (x.kind, x.slot) in slots
                if not hit and f.owner is not None and x.expected is not None and x.expected.request is not None:
                    hit = (int(x.expected.request), int(x.expected.position)) == f.owner
                if hit:
                    f.detected = {"class": x.cls, "step": x.step, "steps_after": x.step - f.step,
                                  "backend": x.backend, "layer": x.layer, "slot": x.slot}
                    break

    def summary(self) -> dict[str, Any]:
        by_kind: dict[str, dict[str, Any]] = {}
        for f in self.faults:
            d = by_kind.setdefault(f.kind, {"injected": 0, "detected": 0, "classes": {}, "max_steps_after": 0})
            d["injected"] += 1
            if f.detected is not None:
                d["detected"] += 1
                c = f.detected["class"]
                d["classes"][c] = d["classes"].get(c, 0) + 1
                d["max_steps_after"] = max(d["max_steps_after"], f.detected["steps_after"])
        return {"injected": len(self.faults), "detected": sum(1 for f in self.faults if f.detected is not None),
                "by_kind": by_kind}

    def jsonl(self) -> str:
        lines = []
        for f in self.faults:
            r = f.record()
            r["detected"] = f.detected
            lines.append(json.dumps(r, sort_keys=True))
        return "".join(x + "\n" for x in lines)
