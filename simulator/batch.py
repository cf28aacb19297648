"""What one forward step hands to the attention backends, and what the oracle knows about it.

:class:`ForwardBatch` is the engine's view: only what SGLang's ``ForwardBatch`` carries that matters
for the KV write. :class:`BatchTruth` is the oracle's view of the same step (which token owns which
slot, which slots were freed before it); backends and designs never see it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    step: int
    mode: str                     # extend | decode | mixed | draft_decode | target_verify | draft_extend
    graph: str                    # eager | decode_graph | piecewise | draft_graph | draft_extend_graph
    out_cache_loc: np.ndarray     # int64, as seen at metadata init: real rows then DP padding
    num_token_non_padded: int     # real tokens, recorded before DP padding
    padded_len: int               # rows the graph runs: capture size, or len(out_cache_loc) when eager
    pad_value: int                # what padded rows of out_cache_loc hold (0 in SGLang)
    num_requests: int

    @property
    def dp_padded_len(self) -> int:
        return int(self.out_cache_loc.shape[0])


@dataclass(frozen=True, slots=True)
class BatchTruth:
    tags: np.ndarray              # int64 per real token, in batch order
    full_slots: np.ndarray        # the token's full slot (equals out_cache_loc[:real])
    swa_slots: np.ndarray         # the token's SWA slot, as the allocator gave it
    freed_full: np.ndarray        # full slots freed since the previous step (finished requests)
    freed_swa: np.ndarray         # SWA slots freed since the previous step (finished or evicted)
    evicted_swa: np.ndarray       # the subset of freed_swa freed by out-of-window eviction
    mapping_changed: np.ndarray   # full slots whose full_to_swa entry changed since the previous step
