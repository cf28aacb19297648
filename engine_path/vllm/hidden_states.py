"""extract_hidden_states' store: where the release's own ``basic_cache`` puts each row of a forward.

vLLM's ``extract_hidden_states`` speculator caches the target's hidden states in one cache-only layer
(``CacheOnlyAttentionLayer``, a KV-cache group of its own: ``HiddenStateCacheSpec``). After each target forward its
``propose`` stores one hidden state per row the forward ran (the padded count under a CUDA graph) at that group's
slot mapping sliced to the same count, so a graph's padded rows come with ``PAD_SLOT_ID`` (-1). The store is
``vllm.model_executor.models.extract_hidden_states.basic_cache``, plain torch indexing: 0.34.0 clamps -1 to 0 (slot 0
of the null block, block 0); before #43869 a -1 indexed from the end (the cache's last slot).

:func:`stored_at` runs that function itself (patched, where an ``--engine-patch`` edits it) on a probe cache of row
numbers, so the write locations the oracle checks are the release's, whatever it does with a padded row.
"""
from __future__ import annotations

import importlib
from typing import Optional

import numpy as np
import torch

from simulator.oracle.reference import last_writes
from simulator.records import PAD_TAG
from simulator.scheduling.batch import Transfer

#: the module that holds the store
MODULE = "vllm.model_executor.models.extract_hidden_states"
#: run.json's engine_pieces and model_pieces of a run with extract_hidden_states
ENGINE_PIECE = ("extract_hidden_states' store (basic_cache: where each row of a forward goes, a padded row's -1 "
                "included) and its cache-only layer's KV-cache group (HiddenStateCacheSpec, its blocks and slot "
                "mapping the release's)")
MODEL_PIECE = ("extract_hidden_states' forward after each target forward: one row per row the target ran (its padded "
               "count), the hidden states as tags of their own; the cache-only layer's geometry (one head of 32: a "
               "block of the attention groups' size); what its store leaves in the target groups' views (vLLM's "
               "groups share each KV tensor: the same block's rows, with the store's own step)")


def stored_at(slot_mapping: np.ndarray, num_blocks: int, block_size: int) -> np.ndarray:
    """Per row of ``slot_mapping`` the slot the release's ``basic_cache`` stores it at (int64, ``block * block_size +
    offset``), or -1 where it stores it nowhere. The store is elementwise, so rows with one slot-mapping value go to
    one place: each distinct value is stored once, on a probe cache of value numbers; values that land on one slot
    (-1 where a real row has the cache's last slot, before #43869) are told apart by storing the rest again."""
    values, inverse = np.unique(np.asarray(slot_mapping, dtype=np.int64), return_inverse=True)
    store = importlib.import_module(MODULE).basic_cache
    placed = np.full(values.shape[0], -1, dtype=np.int64)
    todo = np.arange(values.shape[0])
    while todo.size:
        cache = torch.full((num_blocks, 1, block_size, 1), -1, dtype=torch.int64)
        store(torch.from_numpy(todo).view(-1, 1, 1), cache, torch.from_numpy(values[todo]))
        flat = cache.view(-1).numpy()
        slots = np.flatnonzero(flat >= 0)
        if not slots.size:              # what is left is stored nowhere
            break
        placed[flat[slots]] = slots
        todo = todo[placed[todo] < 0]
    return placed[inverse]


def in_target_views(content, loc: np.ndarray, real: int, step) -> Optional[Transfer]:
    """What a store of one forward's rows at ``loc`` (its first ``real`` rows ``step``'s tokens, in batch order)
    leaves in the target's views: vLLM's groups share memory (each KV tensor serves one layer of each group), so a
    block the store wrote holds hidden states, not K/V, in every group's view (the same rows here). Owned by no one
    there: a row it wrote into a block a target request holds is what that request's reads find (a real row's as a
    tag of its own, from ``content``, a padded row's as padding). The store's own step's transfer, into the target's
    pools and the target's reference only; None where it stored nothing."""
    tags = np.full(loc.shape[0], PAD_TAG, dtype=np.int64)
    if real:
        tags[:real] = np.concatenate([content.fresh(int(r), np.arange(c, c + n, dtype=np.int64))
                                      for r, c, n in zip(step.req_ids, step.starts.tolist(), step.counts.tolist())])
    stored = loc >= 0
    if not stored.any():
        return None
    slots, got = last_writes([loc[stored]], [tags[stored]])
    empty = np.zeros(0, dtype=np.int64)
    return Transfer(empty, empty, empty, empty, written=(slots, got, slots, got), target_only=True,
                    target_reference_only=True)
