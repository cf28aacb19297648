"""The release's out-of-window eviction rule (``free_swa_out_of_window_slots``), driven for one request.

The rule reads a request's state and frees, through the allocator, the SWA slots of the positions
that fell out of the window. What it reads changed across releases, so the request handed to it is
a minimal stand-in of the kind the release expects:

* ``"req"`` releases (0.5.14, 0.5.15): fields on the request itself, ``req_pool_idx``,
  ``cache_protected_len``, ``swa_evicted_seqlen`` (and ``swa_evict_floor``, read if present);
* ``"kv"`` releases (0.5.23): ``req.kv``, the release's own ``ReqKvInfo`` (``holds_kv``,
  ``cache_protected_len``, ``get/set_evicted_seqlen``, ``swa_dead_lo``).

The request's row of ``req_to_token`` is the request's ``RequestSlots.full`` (a zero-copy view), so
the slots the rule frees are the ones the allocator handed out. The stand-in's evicted length is
kept in ``RequestSlots.swa_evicted`` between calls; after the rule runs, the positions it freed get
``swa = 0`` there, as the model's ``evict_swa`` does.

When the rule runs (its cadence: which step, which request, ``pre_len``) stays the scheduler's
decision; this module answers "what does the release free when asked now".
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch

from simulator.allocator import RequestSlots

from .allocator import EngineAllocator
from .errors import EngineError


class _ReqToTokenView:
    """``req_to_token_pool`` as the rule reads it: row 0 is the request's full slots."""

    def __init__(self, slots: RequestSlots):
        self.req_to_token = torch.from_numpy(slots.full).view(1, -1)


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
        if self.kind == "kv" and (self.api.ReqKvInfo is None or self.api.ComponentType is None):
            raise EngineError(f"sglang {self.api.info.version}: the eviction rule reads req.kv but ReqKvInfo / "
                              f"ComponentType were not found")

    def _request(self, slots: RequestSlots, protected_len: int):
        if self.kind == "kv":
            kv = self.api.ReqKvInfo(req_pool_idx=0, cache_protected_len=protected_len)
            kv.set_evicted_seqlen(self.api.ComponentType.SWA, slots.swa_evicted)
            return SimpleNamespace(kv=kv)
        return SimpleNamespace(req_pool_idx=0, cache_protected_len=protected_len,
                               swa_evicted_seqlen=slots.swa_evicted, swa_evict_floor=0)

    def _evicted(self, req) -> int:
        if self.kind == "kv":
            return int(req.kv.get_evicted_seqlen(self.api.ComponentType.SWA))
        return int(req.swa_evicted_seqlen)

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
