"""The pools under test of a model run: cuda_path's ``TaggedKVPool`` for the target model and the draft.

An engine run's target pool is the release's (engine_path.runtime); its draft pools stay these.
"""
from __future__ import annotations

from typing import Optional

import torch

from simulator.scenario import Scenario

def make_draft_pool_factory(device: torch.device, geometry: str, store: str, layout: Optional[str] = None):
    """Pools under test for any model (the draft's own layers and geometry, or the target's). ``layout``:
    cuda_path/pool.py's ``split`` or ``paired``; None: paired for real geometry on CUDA, else split."""
    from cuda_path.pool import TaggedKVPool

    def make(model, full_rows: int, swa_rows: int, skip_index):
        return TaggedKVPool(model, full_rows, swa_rows, device=device, geometry=geometry, store_impl=store,
                            skip_index=skip_index, layout=layout)

    return make


def make_pool_factory(scenario: Scenario, device: torch.device, geometry: str, store: str,
                      layout: Optional[str] = None):
    """Pools under test for the scenario's (target) model (``layout``: as :func:`make_draft_pool_factory`)."""
    make = make_draft_pool_factory(device, geometry, store, layout)
    return lambda full_rows, swa_rows, skip_index: make(scenario.model, full_rows, swa_rows, skip_index)

