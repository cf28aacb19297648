"""The release's ``KVWriteLoc`` and the SWA translation each backend uses in that release.

* :func:`make_write_loc` builds the release's own ``KVWriteLoc(loc, swa_loc)``, so its
  ``__post_init__`` runs as it does in the engine (absent in 0.5.14: a longer ``swa_loc`` stays
  longer; 0.5.15+: cut to ``len(loc)``; a shorter one passes unchanged in every release).
* :class:`Translator` gives a backend's ``swa_out_cache_loc`` for a forward: the plan's write ids
  (``KVIndexTranslator.write_ids(batch, SLIDING_WINDOW)``, the plan bound to the real rows and the
  batch's ``out_cache_loc`` then padded, as DP padding does after ``ForwardBatch.init_new``) for the
  backends whose metadata takes them in this release, ``translate_loc_from_full_to_swa`` of the
  hybrid pool for the others and for releases without a plan.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch

from .api import ReleaseAPI


def make_write_loc(api: ReleaseAPI, loc: torch.Tensor, swa_loc: Optional[torch.Tensor]):
    """The release's ``KVWriteLoc(loc, swa_loc)`` (its ``__post_init__`` included)."""
    return api.KVWriteLoc(loc, swa_loc)


class Translator:
    """One backend group's SWA translation in the release, over a hybrid pool and its allocator."""

    def __init__(self, api: ReleaseAPI, pool, allocator_engine, page_size: int, device: str = "cpu"):
        self.api = api
        self.pool = pool
        self.page_size = page_size
        self.device = device
        self._plan = None
        self._host_map: Optional[torch.Tensor] = None     # GPU runs: the host copy of the run's mapping
        if api.features.has_plan_ids and api.KVIndexTranslator is not None:
            self._plan = api.KVIndexTranslator(
                req_to_token=torch.zeros((1, 1), dtype=torch.int32, device=device),
                token_to_kv_pool_allocator=allocator_engine, token_to_kv_pool=pool, page_size=page_size,
                device=device)

    @property
    def found(self) -> dict:
        """What this adapter found in the release: the plan and the backends that take its ids; the
        release's KVWriteLoc and whether its __post_init__ slices."""
        f = self.api.features
        return {"has_plan_ids": f.has_plan_ids, "plan_backends": sorted(f.plan_backends),
                "write_loc_fields": list(f.write_loc_fields), "has_post_init_slice": f.has_post_init_slice}

    def source(self, backend: str) -> str:
        """"plan" or "translate": where this release's backend takes its SWA ids from."""
        return "plan" if self._plan is not None and backend in self.api.features.plan_backends else "translate"

    def _register(self, full_to_swa: Optional[torch.Tensor]) -> None:
        if full_to_swa is not None and self.pool.full_to_swa_index_mapping is not full_to_swa:
            self.pool.register_mapping(full_to_swa)

    def translate(self, out_cache_loc: torch.Tensor, backend: str, *, full_to_swa: Optional[torch.Tensor] = None,
                  num_token_non_padded: Optional[int] = None) -> torch.Tensor:
        """``swa_out_cache_loc`` of one forward for ``backend`` (length of ``out_cache_loc``).

        On a GPU run (``out_cache_loc`` on CUDA) the release's translation runs on host copies of the
        batch's ids and of the run's mapping (the same torch ops; this translator's pool is a host pool
        of its own, so the allocator's registered mapping is never replaced by a copy); the ids go back
        to the device."""
        dev = out_cache_loc.device
        if dev.type == "cpu":
            return self._translate(out_cache_loc, backend, full_to_swa, num_token_non_padded)
        host_map = None
        if full_to_swa is not None:
            if self._host_map is None or self._host_map.shape != full_to_swa.shape:
                self._host_map = torch.empty(full_to_swa.shape, dtype=full_to_swa.dtype)
            host_map = self._host_map
            host_map.copy_(full_to_swa)
        return self._translate(out_cache_loc.cpu(), backend, host_map, num_token_non_padded).to(dev)

    def _translate(self, out_cache_loc: torch.Tensor, backend: str, full_to_swa: Optional[torch.Tensor],
                   num_token_non_padded: Optional[int]) -> torch.Tensor:
        self._register(full_to_swa)
        if self.source(backend) == "translate":
            return self.pool.translate_loc_from_full_to_swa(out_cache_loc)
        real = out_cache_loc.shape[0] if num_token_non_padded is None else min(num_token_non_padded,
                                                                                 out_cache_loc.shape[0])
        batch = SimpleNamespace(out_cache_loc=out_cache_loc[:real], seq_lens=None, seq_lens_cpu=None,
                                req_pool_indices=None, forward_mode=None, spec_info=None, batch_size=0,
                                encoder_lens=None)
        self._plan.bind_own_plan(batch)
        batch.out_cache_loc = out_cache_loc          # DP padding after the plan was bound
        return self._plan.write_ids(batch, self.api.IdSpaceKind.SLIDING_WINDOW)
