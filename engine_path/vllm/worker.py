"""The worker side of a vLLM step: the release's own ``BlockTables`` (model runner V2), driven as its model runner
drives it.

Per step, as ``vllm/v1/worker/gpu/model_runner.py`` does: finished and preempted requests give their state row back
(``finish_requests``); a new or resumed request gets a row and its scheduler output's ``block_ids`` with
``append_block_ids(overwrite=True)``; a running one gets its ``new_block_ids`` with ``overwrite=False`` (freed
sliding-window ids stay in the row); ``apply_staged_writes`` (its Triton write kernels); then ``prepare_attn``'s two
calls: ``gather_block_tables`` (the forward's tables, a sliding-window group's entries wholly below the window nulled)
and ``compute_slot_mappings`` (each token's slot per group, padded tokens ``PAD_SLOT_ID`` -1). The kernels are the
release's: native on CUDA; on a CPU computed by torch where their source is the one checked equal to them
(engine_path/vllm/kernels.py), else (a patched kernel, another release) run by Triton's interpreter.

What stands in: the state-row allocator (``RequestState``'s free list: a list of indices, popped from the end, as it
does) and ``UvaBuffer`` (a device view of pinned host memory, which needs CUDA: on a CPU the host tensor is the
view; engine_path/vllm/release.py installs it). The table's arguments are made as the model runner makes them, from
the release's own specs (``max_num_blocks_per_req``, ``get_block_table_width``, ``num_retained_tokens``).
"""
from __future__ import annotations

import importlib

import numpy as np
import torch

from . import kernels


class WorkerTables:
    """The release's ``BlockTables`` for the run's KV-cache groups, one state row per live request."""

    def __init__(self, driver, device: str = "cpu", stand_ins: bool = True):
        """``stand_ins``: on a CPU, the kernels of the checked source computed by torch (engine_path/vllm/kernels.py;
        off: every kernel interpreted, as ``slotscope conform`` runs the release)."""
        kci = importlib.import_module("vllm.v1.kv_cache_interface")
        bt_mod = importlib.import_module("vllm.v1.worker.gpu.block_table")
        vc = driver.vllm_config
        max_len = vc.model_config.max_model_len
        sizes, widths, enabled, sharded, reach = [], [], [], [], []
        for group in driver.kv_groups:
            spec = group.kv_cache_spec
            sizes.append(spec.block_size)
            enabled.append(spec.uses_slot_mapping)
            sharded.append(spec.dcp_sharded)
            reach.append(spec.num_retained_tokens if isinstance(spec, kci.SlidingWindowSpec) else 0)
            widths.append(kci.get_block_table_width(spec.max_num_blocks_per_req(vc, max_len), spec.block_size,
                                                    token_alignment=spec.block_table_token_alignment))
        self.max_reqs = vc.scheduler_config.max_num_seqs
        self.max_tokens = vc.scheduler_config.max_num_batched_tokens
        self.block_sizes = sizes
        self.tables = bt_mod.BlockTables(block_sizes=sizes, max_num_reqs=self.max_reqs,
                                         max_num_batched_tokens=self.max_tokens, max_num_blocks_per_group=widths,
                                         device=torch.device(device), slot_mapping_enabled=enabled,
                                         dcp_sharded=sharded, sliding_window_reach=reach)
        if stand_ins and torch.device(device).type == "cpu":
            kernels.register(*(b.gpu for b in self.tables.block_tables), *self.tables.input_block_tables)
            kernels.VLLM.install()
        self.free_rows = list(range(self.max_reqs))
        self.row_of: dict[str, int] = {}
        self.device = torch.device(device)
        self.num_computed = torch.zeros(self.max_reqs, dtype=torch.int32, device=self.device)

    def apply(self, new_rows: dict, appended: dict, finished: set) -> None:
        """A scheduler output's changes, in the model runner's order: rows of finished and preempted requests freed
        (sorted, as it frees them), new and resumed rows written whole, running rows appended, then staged."""
        for rid in sorted(finished):
            row = self.row_of.pop(rid, None)
            if row is not None:
                self.free_rows.append(row)
        for rid, blocks in new_rows.items():
            old = self.row_of.pop(rid, None)
            if old is not None:
                self.free_rows.append(old)
            row = self.row_of[rid] = self.free_rows.pop()
            self.tables.append_block_ids(row, tuple(blocks), overwrite=True)
        for rid, blocks in appended.items():
            self.tables.append_block_ids(self.row_of[rid], tuple(blocks), overwrite=False)
        self.tables.apply_staged_writes()

    def prepare(self, req_ids: list, starts: np.ndarray, counts: np.ndarray,
                num_tokens_padded: int | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
        """``prepare_attn`` of a step: per group each token's slot (``[groups, max_num_batched_tokens]``, int64: the
        real tokens', then what the kernel left in the rest, which a graph's padded rows take) and the forward's
        block tables (per group ``[requests, width]``, int64), the release's kernels' output. ``num_tokens_padded``:
        the rows the forward runs (the graph's, engine_path/vllm/graphs.py; default the token budget)."""
        dev = self.device
        rows = torch.tensor([self.row_of[r] for r in req_ids], dtype=torch.int32, device=dev)
        self.num_computed[rows.long()] = torch.from_numpy(starts.astype(np.int32)).to(dev)
        qsl = torch.zeros(len(req_ids) + 1, dtype=torch.int32)
        qsl[1:] = torch.from_numpy(np.cumsum(counts).astype(np.int32))
        positions = torch.from_numpy(np.concatenate([np.arange(c, c + n, dtype=np.int64)
                                                     for c, n in zip(starts.tolist(), counts.tolist())]))
        tables = self.tables.gather_block_tables(rows, num_reqs_padded=len(req_ids),
                                                 num_computed_tokens=self.num_computed)
        slots = self.tables.compute_slot_mappings(rows, qsl.to(dev), positions.to(dev),
                                                  num_tokens_padded=num_tokens_padded or self.max_tokens)
        return slots.cpu().numpy().copy(), [t.cpu().numpy().astype(np.int64) for t in tables]

    def draft_slots(self, req_ids: list, positions: np.ndarray) -> np.ndarray:
        """An EAGLE draft step's slot mappings (``[groups, requests]`` int64): one token per request at ``positions``,
        through the requests' persistent rows, as the speculator's decode steps call ``compute_slot_mappings``."""
        dev, n = self.device, len(req_ids)
        rows = torch.tensor([self.row_of[r] for r in req_ids], dtype=torch.int32, device=dev)
        qsl = torch.arange(n + 1, dtype=torch.int32, device=dev)
        pos = torch.from_numpy(positions.astype(np.int64)).to(dev)
        slots = self.tables.compute_slot_mappings(rows, qsl, pos, num_tokens_padded=n)
        return slots[:, :n].cpu().numpy().astype(np.int64)

    def dummy_slot_mappings(self, num_tokens: int) -> np.ndarray:
        """A dummy forward's slot mappings (``get_dummy_slot_mappings``: the release fills its whole persistent
        buffer, as a capture or a DP rank's dummy run does), ``[groups, num_tokens]`` int64."""
        return self.tables.get_dummy_slot_mappings(num_tokens).cpu().numpy().astype(np.int64)


def slots_of(table_row: np.ndarray, block_size: int, lo: int, hi: int) -> np.ndarray:
    """The slots of positions ``[lo, hi)`` through one block-table row (as the attention kernels read it)."""
    pos = np.arange(lo, hi, dtype=np.int64)
    idx = pos // block_size
    if idx.size and int(idx[-1]) >= table_row.shape[0]:
        raise IndexError(f"a block-table row of {table_row.shape[0]} blocks read at position {hi - 1}")
    return table_row[idx] * block_size + pos % block_size
