"""The worker side of a vLLM step, as model runner V2 does it: per request and KV-cache group a block-table row, and
the slot mapping of the step's tokens. Ours (the release's ``BlockTables`` runs Triton kernels over UVA buffers, which
need CUDA); the rules modelled, from vLLM 0.34's ``vllm/v1/worker/gpu/``:

* a new or resumed request's row is its scheduler output's ``block_ids`` (``append_block_ids(overwrite=True)``); a
  running request's row only grows by the output's ``new_block_ids`` (``overwrite=False``): the ids of blocks the
  sliding-window manager freed stay in the row (vLLM's open #42273);
* the slot of position ``p`` in a group is ``row[p // block_size] * block_size + p % block_size``; padded rows of a
  batch get ``PAD_SLOT_ID`` (-1), which the store skips;
* a sliding-window group's table, as the step's attention reads it, nulls (block 0) every entry wholly below
  ``first_position - num_retained_tokens`` (``num_retained_tokens = sliding_window - 1``).
"""
from __future__ import annotations

import numpy as np

PAD_SLOT_ID = -1
NULL_BLOCK_ID = 0


class BlockTables:
    """Per request, one row of block ids per KV-cache group."""

    def __init__(self, block_size: int, num_groups: int):
        self.block_size = block_size
        self.num_groups = num_groups
        self.rows: dict[str, list[list[int]]] = {}

    def apply(self, new_rows: dict, appended: dict, finished: set) -> None:
        """A scheduler output's changes: finished requests dropped, new and resumed rows set, new blocks appended."""
        for rid in finished:
            self.rows.pop(rid, None)
        for rid, blocks in new_rows.items():
            self.rows[rid] = [list(b) for b in blocks]
        for rid, blocks in appended.items():
            row = self.rows.setdefault(rid, [[] for _ in range(self.num_groups)])
            for g, b in enumerate(blocks):
                row[g].extend(b)

    def slots(self, rid: str, group: int, lo: int, hi: int) -> np.ndarray:
        """The slots of positions ``[lo, hi)`` of a request in ``group``, by its row (int64)."""
        row = np.asarray(self.rows[rid][group], dtype=np.int64)
        pos = np.arange(lo, hi, dtype=np.int64)
        idx = pos // self.block_size
        if idx.size and int(idx[-1]) >= row.shape[0]:
            raise IndexError(f"request {rid}'s group-{group} row holds {row.shape[0]} blocks; position {hi - 1} "
                             f"needs block {int(idx[-1])}")
        return row[idx] * self.block_size + pos % self.block_size

    def read_slots(self, rid: str, group: int, first: int, hi: int, retained: int) -> np.ndarray:
        """The slots of positions ``[0, hi)`` as the step's attention reads them: a sliding-window group's entries
        wholly below ``first - retained`` nulled (``retained`` 0: none)."""
        row = np.asarray(self.rows[rid][group], dtype=np.int64)
        if retained:
            cut = max(first - retained, 0) // self.block_size
            row = row.copy()
            row[:cut] = NULL_BLOCK_ID
        pos = np.arange(0, hi, dtype=np.int64)
        return row[pos // self.block_size] * self.block_size + pos % self.block_size
