"""The release's ``SWATokenToKVPoolAllocator`` behind the simulator's allocator interface.

:class:`EngineAllocator` has the methods and properties of ``simulator.memory.allocator.HybridAllocator``
(``extend``, ``evict_swa``, ``truncate``, ``free``, ``full_to_swa``, sizes and counts), so the
scheduler runs on it unchanged, and the oracle learns ownership from the real allocator: every slot
in ``RequestSlots.full`` is what the release's allocator returned, every slot in ``RequestSlots.swa``
is read from the release's own ``full_to_swa_index_mapping`` right after the allocation.

How each call maps onto the release (ours: which call, with which arguments; the engine's: what it
hands out and what it frees):

* ``extend`` at page size 1: ``alloc(n)``; at page size > 1: ``alloc_decode`` for one token past a
  non-empty prefix, else ``alloc_extend`` (batch of one request; ``last_loc`` -1 for an empty prefix).
* ``evict_swa``: ``free_swa_segment`` where the release has it (the eviction rule's own free), else
  ``free_swa``, over the full slots of positions ``[swa_evicted, end)``.
* ``free``: the release's ``free_kv_row_segments`` where it has it (0.5.23: the row free of
  ``release_kv_cache``, page ids in position order); else the evicted prefix's full slots with ``free_full`` (where the release asserts their mapping
  is already clear), the rest with ``free``; releases without ``free_full`` free everything with ``free``.
* ``truncate``: whole pages past the kept page with ``free``; the kept page's tail entries cleared in the
  mapping (``clear_full_to_swa_mapping`` where the release has it).
* ``extend_swa_tail`` (a PD decode node's pre-allocation of a transferred prompt, page size > 1):
  ``alloc_extend_swa_tail`` (full slots for the prompt, SWA slots for the window's pages, the non-tail
  mapping cleared by the release), as 0.5.23's ``disaggregation/decode.py`` calls it for a request with
  no prefix. The decode node's finish is ``free`` above (the release's ``free_kv_row_segments``, as
  ``release_kv_cache`` frees a row).

``full_to_swa`` is a numpy view of the release's mapping tensor (shared memory on a CPU), so the run
loop's ``torch.from_numpy(alloc.full_to_swa)`` sees the engine's mapping live.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import numpy as np
import torch

from simulator.memory.allocator import HybridAllocator, OutOfSlots, OverFree, RequestSlots

from .api import ReleaseAPI
from .errors import EngineError
from .pool import build_swa_pool


class EngineAllocator:
    """``HybridAllocator``'s interface (simulator.memory.protocols.SlotAllocator) over the release's SWA allocator."""

    @property
    def source(self) -> str:
        """Whose code this is (run.json's ``sources.allocator``): the release's."""
        return f"{self.api.info.name} {self.api.info.version}"

    def __init__(self, api: ReleaseAPI, full_size: int, swa_size: int, page_size: int = 1, *,
                 need_sort: bool = False, device: str = "cpu", kvcache=None, kernel_device: Optional[str] = None):
        """``kernel_device``: on a GPU run, the device the paged allocator's Triton kernels run on over copies of
        these host tensors (engine_path.host_kernels); None or "cpu": interpreted on the CPU."""
        if full_size % page_size or swa_size % page_size:
            raise ValueError("pool sizes must be multiples of page_size")
        if page_size > 1 and device == "cpu" and kernel_device not in (None, "cpu"):
            # a GPU platform: the release takes its Triton path (use_triton_kernels) on these host tensors
            from . import host_kernels
            host_kernels.install(kernel_device)
        elif page_size > 1 and not api.features.paged_alloc_has_cpu_path and device == "cpu":
            import os
            if os.environ.get("TRITON_INTERPRET") != "1":
                raise EngineError(f"sglang {api.info.version}: its paged allocator runs a Triton kernel; on a CPU "
                                  f"set TRITON_INTERPRET=1 before Triton is imported (engine_path.shims.install does)")
        self.api = api
        self.full_size, self.swa_size, self.page_size = full_size, swa_size, page_size
        self.device = device
        # the allocator needs a hybrid pool to hang its mapping on; a small one when the run has none yet
        self.kvcache = kvcache if kvcache is not None else build_swa_pool(
            api, size=full_size, size_swa=swa_size, page_size=page_size, full_layers=[1], swa_layers=[0],
            head_num=1, head_dim=16, device=device)
        try:
            self.engine = api.SWATokenToKVPoolAllocator(full_size, swa_size, page_size, torch.int64, device,
                                                        self.kvcache, need_sort)
        except TypeError:
            # releases whose __init__ takes keywords only past the pool
            self.engine = api.SWATokenToKVPoolAllocator(size=full_size, size_swa=swa_size, page_size=page_size,
                                                        dtype=torch.int64, device=device, kvcache=self.kvcache,
                                                        need_sort=need_sort)
        self.mapping: torch.Tensor = self.engine.full_to_swa_index_mapping
        if self.mapping.dtype != torch.int64 or self.mapping.device.type != "cpu":
            raise EngineError(f"sglang {api.info.version}: full_to_swa_index_mapping is {self.mapping.dtype} on "
                              f"{self.mapping.device}; the adapter expects int64 on the CPU")
        self.full_to_swa: np.ndarray = self.mapping.numpy()      # shares memory with the engine's mapping
        self.free_order = "engine"          # the release's own free lists decide the order
        self.requested_free_order: Optional[str] = None
        self._in_group = False
        self._rules: dict = {}
        #: the radix cache's hooks at a free group's end (simulator/scheduling/prefix_cache.py), as HybridAllocator's
        self.group_end_hooks: list = []
        self._row_frees = 0             # rows freed through the release's free_kv_row_segments
        #: calls made into the release, by kind (what a run's report can say the engine did)
        self.calls = dict.fromkeys(("alloc", "alloc_extend", "alloc_decode", "free", "free_full", "free_swa",
                                    "eviction_rule"), 0)

    def set_free_order(self, order: str) -> None:
        """The model's knob; the release's free lists keep their own order (recorded, not applied)."""
        if order not in ("lifo", "fifo", "head"):
            raise ValueError(f"free order must be 'lifo', 'fifo' or 'head', got {order!r}")
        self.requested_free_order = order

    @contextmanager
    def free_group(self, enabled: bool = True) -> Iterator[None]:
        """The release's ``free_group_begin`` / ``free_group_end`` around the frees made inside."""
        begin = getattr(self.engine, "free_group_begin", None)
        end = getattr(self.engine, "free_group_end", None)
        if not enabled or self._in_group or begin is None or end is None:
            yield
            return
        begin()
        self._in_group = True
        try:
            yield
        finally:
            for hook in self.group_end_hooks:
                hook()
            self._in_group = False
            with _capacity_assert(self.api, "free_group_end"):
                end()

    # --- sizes and counts, as HybridAllocator --------------------------------------------------
    @property
    def full_rows(self) -> int:
        return self.full_size + self.page_size

    @property
    def swa_rows(self) -> int:
        return self.swa_size + self.page_size

    @property
    def full_free(self) -> int:
        return int(self.engine.full_available_size())

    @property
    def swa_free(self) -> int:
        return int(self.engine.swa_available_size())

    @property
    def full_used(self) -> int:
        return self.full_size - self.full_free

    @property
    def swa_used(self) -> int:
        return self.swa_size - self.swa_free

    def pages_needed(self, slots: RequestSlots, n: int) -> int:
        """New pages (in each pool) that extending by n tokens takes (the same count the release computes)."""
        p = self.page_size
        room = (-slots.length) % p
        return -(-max(0, n - room) // p)

    # --- the calls -----------------------------------------------------------------------------
    def _t(self, values) -> torch.Tensor:
        return torch.as_tensor(np.asarray(values, dtype=np.int64), device=self.device)

    def extend(self, slots: RequestSlots, n: int) -> np.ndarray:
        """Allocate n more tokens for a request through the release; returns their full slots."""
        if n <= 0:
            return np.zeros(0, dtype=np.int64)
        if slots.length + n > slots.capacity:
            raise ValueError(f"request grows to {slots.length + n} tokens, past its capacity {slots.capacity}")
        start, p = slots.length, self.page_size
        if p == 1:
            out = self.engine.alloc(n)
            self.calls["alloc"] += 1
        else:
            last = int(slots.full[start - 1]) if start > 0 else -1
            if start > 0 and n == 1:
                seq = torch.tensor([start + 1], dtype=torch.int64)
                out = self.engine.alloc_decode(seq.to(self.device), seq, self._t([last]))
                self.calls["alloc_decode"] += 1
            else:
                pre = torch.tensor([start], dtype=torch.int64)
                seq = torch.tensor([start + n], dtype=torch.int64)
                out = self.engine.alloc_extend(pre.to(self.device), pre, seq.to(self.device), seq, self._t([last]), n)
                self.calls["alloc_extend"] += 1
        if out is None:
            raise OutOfSlots(f"the engine's allocator refused {n} tokens; full pool has {self.full_free} free slots, "
                             f"SWA pool {self.swa_free}")
        full = out.to("cpu", torch.int64).numpy()
        if full.shape[0] != n:
            raise EngineError(f"sglang {self.api.info.version}: the allocator returned {full.shape[0]} slots for {n}")
        slots.full[start:start + n] = full
        slots.swa[start:start + n] = self.full_to_swa[full]
        slots.length = start + n
        return full.copy()

    def extend_swa_tail(self, slots: RequestSlots, n: int, tail: int, *, clear_stale: bool = True) -> np.ndarray:
        """A PD decode node's pre-allocation of a transferred prompt through the release's
        ``alloc_extend_swa_tail`` (page size > 1, an empty request: full slots for n tokens, SWA slots for
        the last ``tail``; the release clears the non-tail ids' mapping, #25805). ``clear_stale`` is the
        model's A2 switch: the release has no such choice, so False is refused."""
        p = self.page_size
        if not clear_stale:
            raise EngineError(f"sglang {self.api.info.version}: alloc_extend_swa_tail clears the non-tail "
                              f"mapping (#25805); A2's stale mapping is the model's switch only")
        if p < 2 or slots.length or not 0 <= tail <= n or (n - tail) % p:
            raise ValueError(f"SWA-tail allocation needs page_size > 1, an empty request and a page-aligned "
                             f"tail start (n={n}, tail={tail}, page_size={p})")
        if n > slots.capacity:
            raise ValueError(f"request grows to {n} tokens, past its capacity {slots.capacity}")
        zero, seq = torch.tensor([0], dtype=torch.int64), torch.tensor([n], dtype=torch.int64)
        out = self.engine.alloc_extend_swa_tail(zero.to(self.device), zero, seq.to(self.device), seq,
                                                self._t([-1]), n, tail)
        self.calls["alloc_extend_swa_tail"] = self.calls.get("alloc_extend_swa_tail", 0) + 1
        if out is None:
            raise OutOfSlots(f"the engine's allocator refused an SWA-tail allocation of {n} tokens ({tail} SWA); "
                             f"full pool has {self.full_free} free slots, SWA pool {self.swa_free}")
        full = out.to("cpu", torch.int64).numpy()
        if full.shape[0] != n:
            raise EngineError(f"sglang {self.api.info.version}: alloc_extend_swa_tail returned {full.shape[0]} "
                              f"slots for {n}")
        slots.full[:n] = full
        slots.swa[:n] = self.full_to_swa[full]
        slots.length, slots.swa_evicted = n, n - tail
        return full.copy()

    def evict_swa(self, slots: RequestSlots, end: int) -> int:
        """Free the SWA slots of positions [swa_evicted, end), end rounded down to a page; returns count."""
        p = self.page_size
        end = min(end, slots.length)
        end -= end % p
        begin = slots.swa_evicted
        if end <= begin:
            return 0
        idx = self._t(slots.full[begin:end])
        if self.api.features.has_free_swa_segment:
            self.engine.free_swa_segment(idx, start_pos=begin)
        else:
            self.engine.free_swa(idx)
        self.calls["free_swa"] += 1
        slots.swa[begin:end] = 0
        slots.swa_evicted = end
        return end - begin

    def evict_out_of_window(self, slots: RequestSlots, prefix_len: int, window: int, *,
                            protected_len: int = 0) -> int:
        """The release's own eviction rule decides how far to free (``free_swa_out_of_window_slots``, no
        prefix sharing, interval 1: when to ask stays the scheduler's); returns the new ``swa_evicted``."""
        from .eviction import EvictionRule

        rule = self._rules.get(window)
        if rule is None:
            rule = self._rules[window] = EvictionRule(self, window, eviction_interval=1)
        rule.evict(slots, prefix_len, protected_len=protected_len)
        self.calls["eviction_rule"] += 1
        return slots.swa_evicted

    def truncate(self, slots: RequestSlots, length: int) -> int:
        """Give back the slots of positions [length, slots.length); the kept page's tail stays with the request."""
        n = slots.length
        kept_end = slots.kept_end(length, self.page_size)
        if kept_end is None:
            return 0
        if kept_end < n:
            self.engine.free(self._t(slots.full[kept_end:n]))
            self.calls["free"] += 1
        if length < kept_end:
            tail = self._t(slots.full[length:kept_end])
            clear = getattr(self.engine, "clear_full_to_swa_mapping", None)
            if clear is not None:
                clear(tail)
            else:
                self.mapping[tail] = 0
        return slots.cut(length)

    def free(self, slots: RequestSlots) -> None:
        """Free every slot of a finished request, in both pools, through the release."""
        n = slots.length
        if n == 0:
            return
        lo = slots.swa_evicted - slots.swa_evicted % self.page_size
        row_free = _free_kv_row_segments()
        if row_free is not None:
            # the release's own way to free a request's kv row (release_kv_cache): the evicted prefix
            # full side only (free_full_segments), the rest both sides (free_segments): page ids in
            # position order (free_page_ids), not the slot free's sorted pages
            row_free(self.engine, [(self._t(slots.full[:n]), 0)], swa_evicted_seqlen=lo)
            self.calls["free_full" if lo >= n else "free"] += 1
            self._row_frees += 1
        elif self.api.features.has_free_full and lo > 0:
            self.engine.free_full(self._t(slots.full[:lo]))
            self.calls["free_full"] += 1
            if n > lo:
                self.engine.free(self._t(slots.full[lo:n]))
                self.calls["free"] += 1
        else:
            self.engine.free(self._t(slots.full[:n]))
            self.calls["free"] += 1
        slots.full[:n] = 0
        slots.swa[:n] = 0
        slots.length = 0
        slots.swa_evicted = 0

    # --- the radix cache's free paths (simulator/scheduling/prefix_cache.py runs these through the release) ----------
    #: PrefixCache delegates its frees to the release's free paths (free_swa_segment, free_swa, free_full,
    #: free) instead of pushing pages itself; what they free is read from the mapping before each call
    release_frees = True

    @property
    def in_free_group(self) -> bool:
        return self._in_group

    def set_mapping(self, full: np.ndarray, swa: np.ndarray) -> None:
        self.engine.set_full_to_swa_mapping(self._t(full), self._t(swa))

    def clear_mapping(self, full: np.ndarray) -> None:
        self.engine.clear_full_to_swa_mapping(self._t(full))

    def _freeing(self, call: str, fn, *args, **kw) -> None:
        self.calls[call] = self.calls.get(call, 0) + 1
        with _capacity_assert(self.api, call):
            fn(*args, **kw)

    def release_free_swa_segment(self, full: np.ndarray) -> None:
        """The release's ``free_swa_segment`` over whole pages of full ids (page-aligned, start 0): it frees
        ``mapping[rep] // page`` for each page's representative, as the release decides (0.5.23: no filter)."""
        self._freeing("free_swa_segment", self.engine.free_swa_segment, self._t(full), start_pos=0)

    def release_free_swa(self, full: np.ndarray) -> None:
        self._freeing("free_swa", self.engine.free_swa, self._t(full))

    def release_free_full(self, full: np.ndarray) -> None:
        self._freeing("free_full", self.engine.free_full, self._t(full))

    @property
    def swa_free_list(self) -> np.ndarray:
        """The release's SWA free list as page ids (where it keeps one as ``free_pages``), for checks."""
        return _free_list_of(self.engine.swa_attn_allocator)

    def free_pages(self) -> tuple[np.ndarray, np.ndarray]:
        """The release's free full and SWA pages, each in hand-out order (``free_pages`` then what waits
        behind it: ``release_pages`` at page 1, ``staged_pages`` of a sorting paged list), as
        ``HybridAllocator.free_pages``."""
        return _free_list_of(self.engine.full_attn_allocator), _free_list_of(self.engine.swa_attn_allocator)

    @property
    def found(self) -> dict:
        """What this adapter found in the release (probed, not by version)."""
        f = self.api.features
        return {"paged_alloc_has_cpu_path": f.paged_alloc_has_cpu_path, "has_free_full": f.has_free_full,
                "has_free_swa_segment": f.has_free_swa_segment,
                "has_free_groups": hasattr(self.engine, "free_group_begin"),
                "has_clear_full_to_swa_mapping": hasattr(self.engine, "clear_full_to_swa_mapping")}

    def check_invariants(self, requests: list[RequestSlots]) -> None:
        """The model's invariants, asserted against the engine's state (tests)."""
        HybridAllocator.check_invariants(self, requests)  # type: ignore[arg-type]

    def pieces_ran(self) -> list[str]:
        """The release's functions beyond the allocator's own calls that ran (run.json ``engine_pieces``)."""
        out = []
        if self.calls.get("alloc_extend_swa_tail"):
            out.append("SWATokenToKVPoolAllocator.alloc_extend_swa_tail (a PD decode node's pre-allocation of each "
                       "transferred prompt)")
        if self._row_frees:
            out.append("free_kv_row_segments (a finished request's kv row, as release_kv_cache frees it)")
        from . import host_kernels
        return out + host_kernels.pieces()

    def describe(self) -> dict:
        return {"allocator": f"{type(self.engine).__module__}.{type(self.engine).__name__}",
                "page_size": self.page_size, "engine": self.api.info.to_json()}


@contextmanager
def _capacity_assert(api: ReleaseAPI, where: str):
    """The release's ``available_size() <= size`` assert (an over-free) as the simulator's OverFree."""
    try:
        yield
    except AssertionError as e:
        raise OverFree(f"sglang {api.info.version} {where}: available_size() <= size failed"
                       + (f" ({e})" if str(e) else "")) from e


def _free_list_of(a) -> np.ndarray:
    """One sub-allocator's free list as page ids (slot ids at page 1), in hand-out order."""
    pages = getattr(a, "free_pages", None)
    if pages is None:
        return np.zeros(0, np.int64)
    parts = [pages]
    for name in ("release_pages", "staged_pages"):
        more = getattr(a, name, None)
        if isinstance(more, torch.Tensor):
            parts.append(more)
        elif isinstance(more, (list, tuple)):
            parts.extend(t for t in more if isinstance(t, torch.Tensor))
    return torch.cat([t.to("cpu", torch.int64).reshape(-1) for t in parts]).numpy()


def _free_kv_row_segments():
    """``sglang.srt.mem_cache.common.free_kv_row_segments`` where the release has it (0.5.23), else None."""
    import importlib

    try:
        return getattr(importlib.import_module("sglang.srt.mem_cache.common"), "free_kv_row_segments", None)
    except ImportError:
        return None


def allocator_factory(api: ReleaseAPI, **kw):
    """``(full_size, swa_size, page_size) -> EngineAllocator``: the seam ``run_simulation`` would take."""

    def make(full_size: int, swa_size: int, page_size: int = 1) -> EngineAllocator:
        return EngineAllocator(api, full_size, swa_size, page_size, **kw)

    return make
