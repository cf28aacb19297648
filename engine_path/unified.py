"""The release's unified allocator (``--enable-unified-memory``) behind the run loop's unified-pool interface.

:class:`UnifiedEngineAllocator` drives SGLang 0.5.23's ``UnifiedSWATokenToKVPoolAllocator`` (built by the
release's own ``init_unified_swa_pools`` on the CPU, with the scenario model's full and SWA layer geometry,
so the byte budget splits as the engine's would) at the scenario's page size, with the interface
``simulator/plugins/unified.py`` expects of :class:`simulator.memory.unified_pool.UnifiedPool`:

* ``extend`` -> at page size 1 ``alloc(n)``; at page size > 1 ``alloc_decode`` for one token past a non-empty
  prefix, else ``alloc_extend`` (a batch of one request; ``last_loc`` -1 for an empty prefix), as engine_path's
  static :class:`~engine_path.allocator.EngineAllocator` drives the paged static allocator. Their Triton kernels
  (the tail-page-reuse walk over the free virtual ids) run on CPU tensors under ``TRITON_INTERPRET=1``, which
  ``engine_path.shims.install`` sets before Triton is imported on a CPU; the bind, unbind and translate kernels
  have pure-torch CPU paths in the release (``kernels/ops/memory/virtual_slot.py``);
* ``evict_swa`` -> ``free_swa`` over whole pages (the SWA tombstone path: ``swa.v2p = -1``, the full side kept);
* ``free`` / ``truncate`` -> ``free`` (the composite filters tombstoned pages itself; a truncation frees the
  pages past the kept one only), inside the release's ``free_group_begin`` / ``free_group_end`` when the
  scheduler groups frees;
* ``translate_kv_loc(loc, "full" | "swa")`` -> the release's ``translate_kv_loc`` /
  ``translate_loc_from_full_to_swa`` (its clamping to the sink);
* ``set_inflight_forward`` -> the release's, with a CPU stand-in for the forward-done event (not done until
  the next forward is planned); ``flush_opportunistic`` -> the release's lazy compaction (on, as in a server).

A tensor index past its table inside any of these calls (torch's ``IndexError`` "index I is out of bounds for
dimension D with size N") is, on a GPU, the device-side index assert that kills the engine: the adapter raises it
as :class:`~simulator.memory.unified_pool.IndexOutOfRange`, naming the release's function, so the run loop's guard
ends the run with an ``out_of_range`` finding on every backend, as it does for the model (U1, #37560 reverted).
Any other exception of the release propagates as it is.

Ownership events (bind, unbind, tombstone, move) are read off the release's own page tables: after every call
the adapter compares each sub-pool's ``virtual_to_physical`` with its copy from before, so what the oracle
learns is what the engine did, compaction moves included (page tables are per page: each changed entry is
``page_size`` token slots).
"""
from __future__ import annotations

import functools
import inspect
import re
import sys
from contextlib import contextmanager
from typing import Iterator, Optional

import numpy as np
import torch

from simulator.memory.allocator import OutOfSlots, RequestSlots
from simulator.memory.events import SlotEvent
from simulator.memory.unified_pool import BIND, MOVE, TOMBSTONE, UNBIND, IndexOutOfRange, OutOfRange

from .errors import EngineError, ReleaseLacks

_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8_e4m3": torch.float8_e4m3fn}


#: torch's message for a tensor index past a dimension (the CPU twin of a device-side index assert)
_TORCH_INDEX = re.compile(r"index (-?\d+) is out of bounds for dimension \d+ with size (\d+)")


def _release_frame(tb) -> str:
    """The innermost frame of the traceback inside the sglang package: ``module.function`` (or "")."""
    where = ""
    while tb is not None:
        code = tb.tb_frame.f_code
        mod = tb.tb_frame.f_globals.get("__name__", "")
        if mod.startswith("sglang."):
            where = f"{mod.rsplit('.', 1)[-1]}.{code.co_name}"
        tb = tb.tb_next
    return where


def device_asserts(call: str):
    """Decorator for a method that calls the release: a torch tensor-index ``IndexError`` raised inside the
    release becomes :class:`IndexOutOfRange` (``where``: the release's call and function; the token is the
    page's first virtual token where the index is a page)."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(self, *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except IndexOutOfRange:
                raise                       # already the assert (a nested call of the release)
            except IndexError as e:
                m = _TORCH_INDEX.search(str(e))
                frame = _release_frame(sys.exc_info()[2])
                if m is None or not frame:
                    raise
                index, size = int(m.group(1)), int(m.group(2))
                finding = OutOfRange(f"release {call}: {frame}", index, size, index * self.page_size)
                raise IndexOutOfRange(finding) from e
        return inner
    return wrap


class _PendingForward:
    """A CPU stand-in for the forward-done CUDA event: in flight until :meth:`done`."""

    def __init__(self):
        self._done = False

    def query(self) -> bool:
        return self._done

    def done(self) -> None:
        self._done = True


def build_unified(model, budget_bytes: int, page_size: int = 1, lazy_compaction: bool = True):
    """The release's SWA-hybrid unified pool stack for ``model`` (its layers and geometry) over ``budget_bytes``."""
    try:
        from sglang.srt.mem_cache.unified_memory_pool import init_unified_swa_pools
    except ImportError as e:
        raise ReleaseLacks(f"this release has no unified memory pool (init_unified_swa_pools): {e}") from None
    layers = model.layers()
    full, swa = model.geometry("full"), model.geometry("swa")
    kwargs = dict(
        device="cpu", kv_cache_dtype=_TORCH_DTYPES.get(model.kv_dtype, torch.bfloat16),
        head_num=full.heads, head_dim=full.head_dim, v_head_dim=full.v_head_dim,
        swa_head_num=swa.heads, swa_head_dim=swa.head_dim, swa_v_head_dim=swa.v_head_dim,
        page_size=page_size, start_layer=0, end_layer=len(layers),
        swa_attention_layer_ids=[li.layer for li in layers if li.kind == "swa"],
        full_attention_layer_ids=[li.layer for li in layers if li.kind == "full"],
        total_bytes=budget_bytes, enable_memory_saver=False, need_sort=False, lazy_compaction=lazy_compaction)
    try:
        inspect.signature(init_unified_swa_pools).bind(**kwargs)
    except TypeError as e:         # an older unified pool (0.5.15 .. 0.5.20 take other parameters)
        raise ReleaseLacks(f"this release's unified memory pool is not one slotscope drives (init_unified_swa_pools: "
                           f"{e}; slotscope calls it with the parameters of 0.5.21 and later)") from None
    return init_unified_swa_pools(**kwargs)


class UnifiedEngineAllocator:
    """The run loop's unified-pool interface (simulator.memory.protocols.UnifiedAllocator) over the release's
    ``UnifiedSWATokenToKVPoolAllocator``."""

    free_order = "engine"
    #: whose code this is (run.json's ``sources.allocator``; its runtime names the release)
    source = "engine"

    def __init__(self, model, pool_cfg, budget_bytes: int, kernel_device: Optional[str] = None):
        """``kernel_device``: on a GPU run, where the paged alloc kernels run over copies of the host tensors
        (engine_path.host_kernels); None or "cpu": interpreted on the CPU."""
        self.page_size = p = pool_cfg.page_size
        if p > 1 and kernel_device in (None, "cpu"):
            import os
            if os.environ.get("TRITON_INTERPRET") != "1":
                raise EngineError(f"pool.page_size {p} with pool.unified and --engine: the release's paged unified "
                                  f"alloc_extend / alloc_decode run a Triton kernel; on a CPU set TRITON_INTERPRET=1 "
                                  f"before Triton is imported (engine_path.shims.install does)")
        self.bundle = build_unified(model, budget_bytes, page_size=p)
        if p > 1 and kernel_device not in (None, "cpu"):
            from . import host_kernels
            host_kernels.install(kernel_device)
        self.engine = self.bundle.token_to_kv_pool_allocator
        self.fa, self.sa = self.engine.full_attn_allocator, self.engine.swa_attn_allocator
        self.split = (pool_cfg.full_size, pool_cfg.swa_size)
        self.budget_bytes = budget_bytes
        self.num_virtual_ids = int(self.fa.num_virtual_ids)
        self._tables = {"full": self._v2p("full"), "swa": self._v2p("swa")}
        self.events: list[SlotEvent] = []
        self.group_end_hooks: list = []
        self._in_group = False
        self._forward: Optional[_PendingForward] = None
        names = ("alloc",) if p == 1 else ("alloc_extend", "alloc_decode")
        self.calls = dict.fromkeys(names + ("free", "free_swa", "flush_opportunistic", "set_inflight_forward"), 0)

    # ---- page tables -> events

    def _side(self, pool: str):
        return self.fa if pool == "full" else self.sa

    def _v2p(self, pool: str) -> np.ndarray:
        return self._side(pool).virtual_to_physical.numpy().copy()

    def _tokens(self, pages: np.ndarray) -> np.ndarray:
        p = self.page_size
        return pages if p == 1 else (pages[:, None] * p + np.arange(p, dtype=np.int64)).ravel()

    def _diff(self, cause: str, swa_unbind: str = UNBIND) -> None:
        """Events from the change of both page tables since the last call (moves first, then binds, unbinds), in
        token slots (each page ``page_size`` of them)."""
        t = self._tokens
        for pool in ("full", "swa"):
            old, new = self._tables[pool], self._v2p(pool)
            ch = np.flatnonzero(old != new)
            self._tables[pool] = new
            if ch.size == 0:
                continue
            o, n = old[ch], new[ch]
            moved, bound, gone = (o > 0) & (n > 0), (o <= 0) & (n > 0), (o > 0) & (n <= 0)
            if moved.any():
                self.events.append(SlotEvent(MOVE, pool, t(o[moved]), None, t(n[moved]), "compact"))
            if bound.any():
                self.events.append(SlotEvent(BIND, pool, t(n[bound]), None, t(ch[bound]), cause))
            if gone.any():
                kind = swa_unbind if pool == "swa" else UNBIND
                self.events.append(SlotEvent(kind, pool, t(o[gone]), None, t(ch[gone]), cause))

    def drain_events(self) -> list[SlotEvent]:
        out, self.events = self.events, []
        return out

    # ---- sizes and counts (HybridAllocator's, in tokens)

    @property
    def full_size(self) -> int:
        return self.split[0]

    @property
    def swa_size(self) -> int:
        return self.split[1]

    @property
    def full_rows(self) -> int:
        return int(self.fa.max_slots)

    @property
    def swa_rows(self) -> int:
        return int(self.sa.max_slots)

    @property
    def full_used(self) -> int:
        return int(self.fa.allocated_count())

    @property
    def swa_used(self) -> int:
        return int(self.sa.allocated_count())

    @property
    def full_free(self) -> int:
        return int(self.engine.full_available_size())

    @property
    def swa_free(self) -> int:
        return int(self.engine.swa_available_size())

    def pages_needed(self, slots: RequestSlots, n: int) -> int:
        p = self.page_size
        return -(-max(0, n - (-slots.length) % p) // p)

    def set_free_order(self, order: str) -> None:
        if order not in ("lifo", "fifo", "head"):
            raise ValueError(f"free order must be 'lifo', 'fifo' or 'head', got {order!r}")

    # ---- allocation and frees

    @device_asserts("alloc")
    def _alloc(self, slots: RequestSlots, n: int):
        """The release's call for n more tokens of one request (see the module docstring)."""
        start, p = slots.length, self.page_size
        if p == 1:
            self.calls["alloc"] += 1
            return self.engine.alloc(n)
        last = torch.tensor([int(slots.full[start - 1]) if start > 0 else -1], dtype=torch.int64)
        if start > 0 and n == 1:
            self.calls["alloc_decode"] += 1
            seq = torch.tensor([start + 1], dtype=torch.int64)
            return self.engine.alloc_decode(seq, seq, last)
        self.calls["alloc_extend"] += 1
        pre, seq = torch.tensor([start], dtype=torch.int64), torch.tensor([start + n], dtype=torch.int64)
        return self.engine.alloc_extend(pre, pre, seq, seq, last, n)

    def extend(self, slots: RequestSlots, n: int) -> np.ndarray:
        if n <= 0:
            return np.zeros(0, dtype=np.int64)
        if slots.length + n > slots.capacity:
            raise ValueError(f"request grows to {slots.length + n} tokens, past its capacity {slots.capacity}")
        v = self._alloc(slots, n)
        self._diff("extend")
        if v is None:
            raise OutOfSlots(f"the release's unified allocator refused {n} tokens "
                             f"(joint available {self.engine.available_size()})")
        ids = v.numpy().astype(np.int64)
        if ids.shape[0] != n:
            raise EngineError(f"the release's unified allocator returned {ids.shape[0]} ids for {n} tokens")
        start = slots.length
        slots.full[start:start + n] = ids
        slots.swa[start:start + n] = ids
        slots.length = start + n
        return ids.copy()

    @device_asserts("free_swa")
    def evict_swa(self, slots: RequestSlots, end: int) -> int:
        """The SWA side of positions [swa_evicted, end) tombstoned, end rounded down to a page."""
        end = min(end, slots.length)
        end -= end % self.page_size
        begin = slots.swa_evicted
        if end <= begin:
            return 0
        self.calls["free_swa"] += 1
        self.engine.free_swa(torch.from_numpy(slots.full[begin:end].copy()))
        self._diff("out_of_window", TOMBSTONE)
        slots.swa[begin:end] = 0
        slots.swa_evicted = end
        return end - begin

    @device_asserts("free")
    def _free(self, ids: np.ndarray, cause: str) -> None:
        if ids.size:
            self.calls["free"] += 1
            self.engine.free(torch.from_numpy(ids.copy()))
            if not self._in_group:
                self._diff(cause)

    def truncate(self, slots: RequestSlots, length: int) -> int:
        kept_end = slots.kept_end(length, self.page_size)     # the pages past the kept one
        if kept_end is None:
            return 0
        self._free(slots.full[kept_end:slots.length], "truncate")
        return slots.cut(length)

    def free(self, slots: RequestSlots) -> None:
        n = slots.length
        if n == 0:
            return
        self._free(slots.full[:n], "release")
        slots.swa[:n] = 0
        slots.length = 0
        slots.swa_evicted = 0

    @property
    def in_free_group(self) -> bool:
        return self._in_group

    @contextmanager
    def free_group(self, enabled: bool = True) -> Iterator[None]:
        """The release's ``free_group_begin`` / ``free_group_end`` around the frees made inside."""
        if not enabled or self._in_group:
            yield
            return
        self.engine.free_group_begin()
        self._in_group = True
        try:
            yield
        finally:
            for hook in self.group_end_hooks:
                hook()
            self._in_group = False
            self._group_end()

    @device_asserts("free_group_end")
    def _group_end(self) -> None:
        self.engine.free_group_end()
        self._diff("flush")

    # ---- the plan's side: translation, the in-flight window, compaction

    @device_asserts("translate")
    def translate_kv_loc(self, loc, pool: str = "full") -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(np.asarray(loc, dtype=np.int64)))
        out = self.engine.translate_kv_loc(t) if pool == "full" else self.engine.translate_loc_from_full_to_swa(t)
        return out.numpy().astype(np.int64)

    def physical_full_to_swa(self) -> np.ndarray:
        """Per physical full slot, the SWA physical slot of the same virtual token (0: none; last entry -1)."""
        out = np.zeros(self.full_rows + 1, dtype=np.int64)
        out[-1] = -1
        v2p = self._tables["full"]
        bound = np.flatnonzero(v2p[1:] > 0) + 1
        if bound.size:
            out[self._tokens(v2p[bound])] = self.translate_kv_loc(self._tokens(bound), "swa")
        return out

    @device_asserts("set_inflight_forward")
    def set_inflight_forward(self, virtual_loc) -> None:
        """The previous forward is done; the new one (``virtual_loc``; None: none) is in flight."""
        if self._forward is not None:
            self._forward.done()
            self._forward = None
        self.calls["set_inflight_forward"] += 1
        if virtual_loc is None or len(virtual_loc) == 0:
            self.engine.set_inflight_forward(_PendingForward(), None)
            return
        self._forward = _PendingForward()
        self.engine.set_inflight_forward(self._forward, torch.from_numpy(np.asarray(virtual_loc, dtype=np.int64).copy()))

    @device_asserts("flush_opportunistic")
    def flush_opportunistic(self) -> int:
        self.calls["flush_opportunistic"] += 1
        moved = int(self.engine.flush_opportunistic())
        self._diff("flush")
        return moved

    def describe(self) -> dict:
        return {"allocator": f"{type(self.engine).__module__}.{type(self.engine).__name__}",
                "page_size": self.page_size,
                "budget_bytes": self.budget_bytes, "num_virtual_ids": self.num_virtual_ids,
                "full_rows": self.full_rows, "swa_rows": self.swa_rows, "swa_v2p_len": int(self.sa.virtual_to_physical.shape[0]),
                "calls": dict(self.calls)}


class UnifiedEngineRuntime:
    """An engine run of a ``pool.unified`` scenario: the release's unified allocator in the loop; the design
    (the scenario's modelled one), the backends' metadata and the pools under test stay slotscope's."""

    unified = True

    def __init__(self, api, design, scenario, device: str = "cpu"):
        self.api = api
        self.design = design
        self.scenario = scenario
        self.device = device
        self.allocator: Optional[UnifiedEngineAllocator] = None

    def allocator_factory(self, cfg) -> UnifiedEngineAllocator:
        """The run loop's seam: the scenario's pool config -> the release's allocator over the model's budget."""
        from simulator.plugins.unified import model_unified_pool

        budget = model_unified_pool(self.scenario, self.design.release.unified_pool).budget_bytes
        self.allocator = UnifiedEngineAllocator(self.scenario.model, cfg, budget, kernel_device=self.device)
        self.allocator.source = f"{self.api.info.name} {self.api.info.version}"
        return self.allocator

    def describe(self) -> dict:
        d = {"engine": self.api.info.to_json(),
             "engine_pieces": ["UnifiedSWATokenToKVPoolAllocator (alloc / alloc_extend / alloc_decode, free, free_swa, "
                               "free groups, translate_kv_loc, "
                               "translate_loc_from_full_to_swa, set_inflight_forward, flush_opportunistic: virtual ids, "
                               "page tables, lazy compaction)"],
             "model_pieces": [f"design {self.design.name} (write locations, read ids)", "backend metadata",
                              "pools under test", "scheduler"]}
        if self.allocator is not None:
            from . import host_kernels
            d["allocator"] = self.allocator.describe()
            d["engine_pieces"] += host_kernels.pieces()
        return d


# --------------------------------------------------------------------------- the model against the release

_STATE = ("full.v2p", "swa.v2p", "full_used", "swa_used", "full_free", "swa_free", "events")


def _state(pool, eng: UnifiedEngineAllocator) -> tuple:
    """What must agree after every operation: both sides' page tables, counts, capacities, the events."""
    def ev(a):
        # (kind, pool, (slot, peer) pairs): the order within a call is not compared (the model emits per operation,
        # the adapter per page-table diff)
        return sorted((e.kind, e.pool, sorted(zip(e.slots.tolist(), e.peers.tolist()))) for e in a.drain_events())
    return ((pool.full.v2p.tolist(), pool.swa.v2p.tolist(), pool.full_used, pool.swa_used, pool.full_free,
             pool.swa_free, ev(pool)),
            (eng._tables["full"].tolist(), eng._tables["swa"].tolist(), eng.full_used, eng.swa_used, eng.full_free,
             eng.swa_free, ev(eng)))


def _op(rng, alloc, reqs: list, kind: int, pick: int, n: int) -> np.ndarray:
    """One operation on one side: admit, grow, evict, truncate, free (maybe grouped), flush; 6: the SWA side of
    all but a request's last token tombstoned."""
    if kind == 0:
        reqs.append(RequestSlots(512))
        return alloc.extend(reqs[-1], n)
    r = reqs[pick]
    if kind == 1:
        return alloc.extend(r, min(n, r.capacity - r.length))
    if kind == 2:
        alloc.evict_swa(r, r.length - int(rng.integers(1, 24)))
    elif kind == 3:
        alloc.truncate(r, max(r.swa_evicted, r.length - int(rng.integers(1, 24)), 1))
    elif kind == 4:
        with alloc.free_group(bool(rng.integers(2))):
            alloc.free(reqs.pop(pick))
            if reqs and rng.integers(2):
                alloc.free(reqs.pop(0))
    elif kind == 5:
        alloc.set_inflight_forward(r.full[max(0, r.length - 4):r.length] if rng.integers(2) else None)
        alloc.flush_opportunistic()
    else:
        alloc.evict_swa(r, r.length - 1)
    return np.zeros(0, dtype=np.int64)


#: how often each random operation of :func:`_op` is drawn (kinds 0-5)
_OP_MIX = (0.2, 0.35, 0.25, 0.05, 0.1, 0.05)


def _ops(rng, page_size: int, ops: int):
    """(kind, pick or None: drawn at run time, n): the random phase, then a pressure phase that fills the pool
    until it refuses, tombstones every window but its last token (SWA holes past what one allocation takes),
    and grows each request by a page: the release's urgent flush (``ensure_capacity``) runs there."""
    for _ in range(ops):
        kind = int(rng.choice(6, p=_OP_MIX))
        yield kind, None, int(rng.integers(1, 4 * page_size + 40)) if kind == 0 else \
            (1 if rng.random() < 0.6 else int(rng.integers(2, 40)))
    for j in range(60):
        yield 0, None, 2 * page_size + 8
    for j in range(40):
        yield 6, j, 0
    for j in range(40):
        yield 1, j, page_size


def differential(page_size: int, seed: int = 0, ops: int = 400) -> dict:
    """The same operations (:func:`_ops`) on the model's :class:`~simulator.memory.unified_pool.UnifiedPool` and on the
    release's unified allocator (u1's Gemma-like model, whose unequal entries put the full side's first virtual
    id past the sink floor, on a tight budget): the first operation where the ids handed out, either side's page
    tables, the counts or the ownership events differ (None: identical throughout), and what the run went through."""
    import dataclasses
    from pathlib import Path

    from simulator.designs.loading import load_design
    from simulator.scenario import load_scenario
    from simulator.plugins.unified import model_unified_pool

    sc = load_scenario(Path(__file__).resolve().parent.parent / "scenarios" / "u1-unified-swa-table.toml")
    full = 640 if page_size == 1 else 96 * page_size                # tight: refusals and urgent flushes happen
    sc = dataclasses.replace(sc, pool=dataclasses.replace(sc.pool, full_size=full, page_size=page_size))
    pool = model_unified_pool(sc, load_design("sglang-0.5.23").release.unified_pool)
    eng = UnifiedEngineAllocator(sc.model, sc.pool, pool.budget_bytes)
    rng = np.random.default_rng(seed)
    sides: tuple[list, list] = ([], [])
    seen = {"moves": 0, "refused": 0, "urgent_flushes": 0, "ops": 0}
    for i, (kind, pick, n) in enumerate(_ops(np.random.default_rng(seed + 1000), page_size, ops)):
        if not sides[0] or not sides[1]:
            kind = 0
        pick = int(rng.integers(len(sides[0]))) if pick is None and sides[0] else (pick or 0) % max(1, len(sides[0]))
        state = rng.bit_generator.state
        outs = []
        for alloc, reqs in zip((pool, eng), sides):
            rng.bit_generator.state = state
            try:
                outs.append(_op(rng, alloc, reqs, kind, pick, n).tolist())
            except OutOfSlots:
                outs.append("refused")
                if kind == 0:
                    reqs.pop()
        model_state, engine_state = _state(pool, eng)
        seen["moves"] += sum(len(e[2]) for e in model_state[-1] if e[0] == MOVE) // page_size
        seen["refused"] += outs[0] == "refused"
        seen["urgent_flushes"], seen["ops"] = pool.urgent_flushes, i + 1
        if outs[0] != outs[1] or model_state != engine_state:
            what = [name for name, a, b in zip(_STATE, model_state, engine_state) if a != b]
            return {"first_difference": i, "op": kind, "n": n, "what": what or ["ids"], "outs": outs, **seen}
    return {"first_difference": None, **seen}


def differentials(seed: int = 0) -> dict:
    """:func:`differential` at page sizes 1 and 16."""
    return {f"page {p}": differential(p, seed) for p in (1, 16)}

