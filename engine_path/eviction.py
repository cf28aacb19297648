"""The release's out-of-window eviction rule (``free_swa_out_of_window_slots``), driven for one request.

The rule reads a request's state and frees, through the allocator, the SWA slots of the positions
that fell out of the window. What it reads changed across releases, so the request handed to it is
a minimal stand-in of the kind the release expects:

* ``"req"`` releases (0.5.14, 0.5.15): fields on the request itself, ``req_pool_idx``,
  ``cache_protected_len``, ``swa_evicted_seqlen`` (and ``swa_evict_floor``, read if present);
* ``"kv"`` releases: ``req.kv``, the release's own ``ReqKvInfo`` where it can be made from the fields
  the adapter knows: 0.5.16-0.5.18 keep ``swa_evicted_seqlen`` there (the rest on the request), 0.5.20
  adds ``holds_kv``, 0.5.22+ keep everything there (``cache_protected_len``,
  ``get/set_evicted_seqlen`` per component, ``swa_dead_lo``).

One stand-in serves every interface: the request carries the fields the older rules read and a
``kv`` (the release's class, else :class:`_KvStandIn`); the evicted length is written to all the
places a rule may read it and read back from the one that moved.

The request's row of ``req_to_token`` is the request's ``RequestSlots.full`` (a zero-copy view), so
the slots the rule frees are the ones the allocator handed out. The stand-in's evicted length is
kept in ``RequestSlots.swa_evicted`` between calls; after the rule runs, the positions it freed get
``swa = 0`` there, as the model's ``evict_swa`` does.

When the rule runs (its cadence: which step, which request, ``pre_len``) stays the scheduler's
decision; this module answers "what does the release free when asked now".
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import TYPE_CHECKING, Optional

import torch

from simulator.memory.allocator import RequestSlots

from .errors import EngineError

if TYPE_CHECKING:
    from .allocator import EngineAllocator


class _ReqToTokenView:
    """``req_to_token_pool`` as the rule reads it: row 0 is the request's full slots."""

    def __init__(self, slots: RequestSlots):
        self.req_to_token = torch.from_numpy(slots.full).view(1, -1)


class _KvStandIn:
    """``req.kv`` for a release whose ``ReqKvInfo`` cannot be made from the fields the adapter knows."""

    def __init__(self, req_pool_idx: int, cache_protected_len: int, evicted: int, length: int):
        self.req_pool_idx = req_pool_idx
        self.cache_protected_len = cache_protected_len
        self.swa_evicted_seqlen = evicted
        self.swa_evict_floor = 0
        self.kv_allocated_len = length

    @property
    def holds_kv(self) -> bool:
        return self.req_pool_idx is not None

    def get_evicted_seqlen(self, component) -> int:
        return self.swa_evicted_seqlen

    def set_evicted_seqlen(self, component, length: int) -> None:
        self.swa_evicted_seqlen = length

    def swa_dead_lo(self, page_size: int) -> int:
        lo = max(self.cache_protected_len, self.swa_evict_floor)
        if page_size > 1 and lo > self.cache_protected_len:
            lo = -(-lo // page_size) * page_size
        return lo


class EvictionRule:
    """``free_swa_out_of_window_slots`` of the release, for requests of an :class:`EngineAllocator`."""

    def __init__(self, allocator: EngineAllocator, window: int, *, prefix_sharing: bool = False,
                 eviction_interval: Optional[int] = None):
        self.alloc = allocator
        self.api = allocator.api
        self.window = window
        self.prefix_sharing = prefix_sharing
        self.eviction_interval = eviction_interval
        self.kind = self.api.features.eviction_api
        self._component = getattr(self.api.ComponentType, "SWA", None) if self.api.ComponentType else None
        if "component_type" in self.api.features.eviction_params and self._component is None:
            raise EngineError(f"sglang {self.api.info.version}: the eviction rule takes a component_type but "
                              f"ComponentType was not found")

    @property
    def found(self) -> dict:
        """What this adapter found in the release: the rule's request interface and its extra parameters."""
        return {"eviction_api": self.kind, "eviction_params": list(self.api.features.eviction_params),
                "options_passed": self._options(),
                "req_kv": type(self._kv(RequestSlots(1), 0)).__name__ if self.kind == "kv" else None}

    def _kv(self, slots: RequestSlots, protected_len: int):
        values = {"req_pool_idx": 0, "cache_protected_len": protected_len, "swa_evicted_seqlen": slots.swa_evicted,
                  "kv_allocated_len": slots.length}
        cls = self.api.ReqKvInfo
        kv = None
        if cls is not None and dataclasses.is_dataclass(cls):
            fields = {f.name: f for f in dataclasses.fields(cls)}
            required = {n for n, f in fields.items() if f.default is dataclasses.MISSING
                        and f.default_factory is dataclasses.MISSING}
            if required <= set(values):
                kv = cls(**{k: v for k, v in values.items() if k in fields})
        if kv is None:
            kv = _KvStandIn(0, protected_len, slots.swa_evicted, slots.length)
        if self._component is not None and hasattr(kv, "set_evicted_seqlen"):
            kv.set_evicted_seqlen(self._component, slots.swa_evicted)
        return kv

    def _request(self, slots: RequestSlots, protected_len: int):
        req = SimpleNamespace(req_pool_idx=0, cache_protected_len=protected_len, swa_evicted_seqlen=slots.swa_evicted,
                              swa_evict_floor=0)
        if self.kind == "kv":
            req.kv = self._kv(slots, protected_len)
        return req

    def _evicted(self, req) -> int:
        seen = [req.swa_evicted_seqlen]
        kv = getattr(req, "kv", None)
        if kv is not None:
            if hasattr(kv, "swa_evicted_seqlen"):
                seen.append(kv.swa_evicted_seqlen)
            if self._component is not None and hasattr(kv, "get_evicted_seqlen"):
                seen.append(kv.get_evicted_seqlen(self._component))
        return int(max(seen))       # every place started at the same value; the rule moved one of them

    def _options(self) -> dict:
        params = self.api.features.eviction_params
        opts = {}
        if "supports_prefix_sharing" in params:
            opts["supports_prefix_sharing"] = self.prefix_sharing
        if "is_chunk_cache" in params:
            opts["is_chunk_cache"] = not self.prefix_sharing
        if "drop_page_margin" in params:
            opts["drop_page_margin"] = not self.prefix_sharing
        if "eviction_interval" in params and self.eviction_interval is not None:
            opts["eviction_interval"] = self.eviction_interval
        return opts

    def evict(self, slots: RequestSlots, pre_len: int, *, protected_len: int = 0) -> int:
        """Run the release's rule for a request whose committed length is ``pre_len``; returns how many
        positions lost their SWA slot."""
        before = slots.swa_evicted
        req = self._request(slots, protected_len)
        self.api.free_swa_out_of_window_slots(
            req, pre_len, sliding_window_size=self.window, page_size=self.alloc.page_size,
            req_to_token_pool=_ReqToTokenView(slots), token_to_kv_pool_allocator=self.alloc.engine,
            **self._options())
        after = self._evicted(req)
        # the stand-in's floor may move the evicted length up past positions that were never freed
        # (protected prefix); only [before, after) positions with a now-clear mapping were freed here
        if after > before:
            seg = slots.full[before:after]
            cleared = self.alloc.full_to_swa[seg] == 0
            slots.swa[before:after][cleared] = 0
            slots.swa_evicted = after
        return max(0, after - before)
