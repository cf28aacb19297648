"""vLLM's worker kernels computed by torch on a CPU, for the kernel sources they were checked against.

A vLLM step runs three of the release's Triton kernels on the worker side (model runner V2's ``BlockTables``):
``_apply_write_kernel`` (the staged block-table row writes), ``_gather_block_tables_kernel`` (the forward's tables,
a sliding-window group's entries below the window nulled) and ``_compute_slot_mappings_kernel`` (each token's slot
per group, ``PAD_SLOT_ID`` past the real tokens). Under Triton's interpreter they cost ~50 ms a step, nine tenths of
a CPU run. Each model here is what its kernel stores, as torch ops over the same pointers and strides
(engine_path/stand_in_kernels.py: a stand-in only for the source it was checked against, every other launch
interpreted). The kernels address the block tables through tables of data pointers (``uint64``); a pointer
resolves to a tensor :func:`register` was told of (the worker's ``BlockTables`` tensors), any other hands the
launch to the kernel. A launch whose result would depend on the order of its programs (overlapping rows, a
non-monotonic ``query_start_loc``, a row written twice) goes to the kernel too, as does context parallelism
(``CP_SIZE`` > 1: not modelled).

:func:`self_check` runs the release's ``BlockTables`` twice on the same random steps, kernels interpreted and stood
in, and compares every table and slot mapping (tests/test_vllm_kernels.py). A kernel an ``--engine-patch`` edits
(V1's revert, the pad loop one row late) is interpreted: its source is not the checked one. ``slotscope conform
--engine vllm`` always interprets (it compares the release's code with slotscope's model of it).
"""
from __future__ import annotations

import contextlib
import importlib
import sys
import weakref
from typing import Any

import torch

from ..stand_in_kernels import I64, KernelModel, OutOfBounds, StandIn, StandInSet, Stores, load_at, runs, tdiv

BLOCK_TABLE = "vllm.v1.worker.gpu.block_table"
BUFFER_UTILS = "vllm.v1.worker.gpu.buffer_utils"
INT32 = (-(1 << 31), (1 << 31) - 1)

#: data pointer -> the tensor it is the start of (weakly held), for the kernels' tables of pointers
_TENSORS: dict[int, weakref.ref] = {}


def register(*tensors: torch.Tensor) -> None:
    """Tensors whose data pointers a kernel may be handed in a pointer table (the worker's block tables)."""
    for t in tensors:
        _TENSORS[t.data_ptr()] = weakref.ref(t)


def _resolve(ptrs: torch.Tensor, i: int) -> torch.Tensor:
    """The int32 tensor whose data starts at ``ptrs[i]`` (OutOfBounds: not one :func:`register` knows)."""
    addr = int(load_at(ptrs, torch.tensor([i]))[0])
    ref = _TENSORS.get(addr)
    t = None if ref is None else ref()
    if t is None or t.data_ptr() != addr or t.dtype != torch.int32 or t.device.type != "cpu":
        raise OutOfBounds
    return t


def _dims(grid: tuple, n: int) -> list[int]:
    return [int(x) for x in grid] + [1] * (n - len(grid))


# --------------------------------------------------------------------------- _apply_write_kernel

def apply_write(store: Stores, grid: tuple, *, output_ptr, output_stride, write_indices_ptr, write_starts_ptr,
                write_contents_ptr, write_cu_lens_ptr, write_group_ids_ptr, BLOCK_SIZE, MULTI_GROUP) -> None:
    """Write ``p`` (of the grid's first axis) puts ``contents[cu_lens[p - 1]:cu_lens[p]]`` (at most the grid's
    chunks of ``BLOCK_SIZE``) at row ``indices[p]`` from column ``starts[p]`` of its output: one tensor, or with
    ``MULTI_GROUP`` the tensor of group ``group_ids[p]`` through the pointer table, at that group's row stride."""
    n, chunks = _dims(grid, 2)[:2]
    if n <= 0 or chunks <= 0:
        return
    p = torch.arange(n)
    rows = load_at(write_indices_ptr, p).to(I64)
    starts = load_at(write_starts_ptr, p).to(I64)
    ends = load_at(write_cu_lens_ptr, p).to(I64)
    firsts = torch.cat([torch.zeros(1, dtype=I64), ends[:-1]])
    lens = (ends - firsts).clamp(min=0, max=chunks * int(BLOCK_SIZE))
    if MULTI_GROUP:
        groups = load_at(write_group_ids_ptr, p).to(I64)
        outs = {int(g): (_resolve(output_ptr, int(g)), int(load_at(output_stride, torch.tensor([int(g)]))[0]))
                for g in torch.unique(groups).tolist()}
    else:
        groups = torch.zeros(n, dtype=I64)
        outs = {0: (output_ptr, int(output_stride))}
    if len({t.data_ptr() for t, _ in outs.values()}) != len(outs):
        raise OutOfBounds                        # two groups' writes into one tensor: their order would matter
    for g, (out, stride) in outs.items():
        mine = groups == g
        k = lens[mine]
        if not int(k.sum()):
            continue
        _, within = runs(k)
        at = torch.repeat_interleave(rows[mine] * stride + starts[mine], k) + within
        if torch.unique(at).numel() != at.numel():
            raise OutOfBounds                    # an entry written twice: the programs' order decides
        store(out, at, load_at(write_contents_ptr, torch.repeat_interleave(firsts[mine], k) + within))


# --------------------------------------------------------------------------- _gather_block_tables_kernel

def gather_block_tables(store: Stores, grid: tuple, *, batch_idx_to_req_idx, src_block_table_ptrs,
                        dst_block_table_ptrs, block_table_strides, num_blocks_ptr, num_blocks_stride, num_reqs,
                        num_computed_tokens_ptr, sliding_window_reach_ptr, block_sizes_ptr, MASK_SLIDING_WINDOW,
                        BLOCK_SIZE) -> None:
    """Per group and batch row ``b``: a row past ``num_reqs`` zeroed across the table's width (its stride); else
    the first ``num_blocks[group, req]`` entries of source row ``req = batch_idx_to_req_idx[b]``, those below
    ``max(first - reach, 0) // block_size`` as 0 when the window is masked and the group has a reach."""
    groups, rows = _dims(grid, 2)[:2]
    b = torch.arange(max(rows, 0))
    real, pad = b[b < int(num_reqs)], b[b >= int(num_reqs)]
    dsts = [_resolve(dst_block_table_ptrs, g) for g in range(groups)]
    srcs = [_resolve(src_block_table_ptrs, g) for g in range(groups)]
    if len({t.data_ptr() for t in dsts}) != groups or {t.data_ptr() for t in dsts} & {t.data_ptr() for t in srcs}:
        raise OutOfBounds                        # tables shared or aliased: the programs' order would matter
    req = load_at(batch_idx_to_req_idx, real).to(I64)
    for g in range(groups):
        stride = int(load_at(block_table_strides, torch.tensor([g]))[0])
        if pad.numel():
            store.fill_block(dsts[g], pad, stride, stride, 1, 0)
        if not real.numel():
            continue
        nb = load_at(num_blocks_ptr, g * int(num_blocks_stride) + req).to(I64).clamp(min=0)
        if int(nb.max()) > stride:
            raise OutOfBounds                    # a row longer than the table's width runs into the next
        null = torch.zeros_like(nb)
        if MASK_SLIDING_WINDOW:
            reach = int(load_at(sliding_window_reach_ptr, torch.tensor([g]))[0])
            if reach > 0:
                first = load_at(num_computed_tokens_ptr, req).to(I64)
                size = int(load_at(block_sizes_ptr, torch.tensor([g]))[0])
                null = tdiv((first - reach).clamp(min=0), size)
        total = int(nb.sum())
        if not total:
            continue
        _, within = runs(nb)
        src_at = torch.repeat_interleave(req * stride, nb) + within
        keep = within >= torch.repeat_interleave(null, nb)
        vals = torch.zeros(total, dtype=srcs[g].dtype)
        vals[keep] = load_at(srcs[g], src_at[keep])
        store(dsts[g], torch.repeat_interleave(real * stride, nb) + within, vals)


# --------------------------------------------------------------------------- _compute_slot_mappings_kernel

def slot_mappings(store: Stores, grid: tuple, *, max_num_tokens, idx_mapping, query_start_loc, pos,
                  block_table_ptrs, block_table_strides, block_sizes, slot_mapping_enabled, dcp_sharded,
                  slot_mappings_ptr, slot_mappings_stride, cp_rank, CP_SIZE, CP_INTERLEAVE, PAD_ID,
                  TRITON_BLOCK_SIZE) -> None:
    """Per group: token ``t`` of request row ``b`` (``query_start_loc[b] <= t < query_start_loc[b + 1]``) gets
    ``table[idx_mapping[b], pos[t] // bs] * bs + pos[t] % bs``, or ``PAD_ID`` where the group maps no slots or the
    row is a dummy (``idx_mapping < 0``); the last program pads ``[query_start_loc[last], max_num_tokens)``."""
    if int(CP_SIZE) != 1:
        raise OutOfBounds                        # context parallelism: not modelled
    groups, programs = _dims(grid, 2)[:2]
    if programs <= 0 or groups <= 0:
        return
    last = programs - 1
    qsl = load_at(query_start_loc, torch.arange(programs)).to(I64)
    width, row_stride = int(max_num_tokens), int(slot_mappings_stride)
    if bool((qsl[1:] < qsl[:-1]).any()) or int(qsl[0]) < 0 or int(qsl[-1]) > width or \
            (groups > 1 and row_stride < width):
        raise OutOfBounds                        # overlapping programs: their order would decide
    counts = qsl[1:] - qsl[:-1]
    t = torch.arange(int(qsl[0]), int(qsl[-1]), dtype=I64)
    reqs = torch.repeat_interleave(load_at(idx_mapping, torch.arange(last)).to(I64), counts)
    positions = load_at(pos, t).to(I64) if t.numel() else t
    real = reqs >= 0
    for g in range(groups):
        gi = torch.tensor([g])
        table = _resolve(block_table_ptrs, g)
        stride = int(load_at(block_table_strides, gi)[0])
        size = int(load_at(block_sizes, gi)[0])
        enabled = bool(load_at(slot_mapping_enabled, gi)[0])
        slots = torch.full(t.shape, int(PAD_ID), dtype=I64)
        if enabled and bool(real.any()):
            p = positions[real]
            blocks = load_at(table, reqs[real] * stride + tdiv(p, size)).to(I64) * size
            if blocks.numel() and (int(blocks.min()) < INT32[0] or int(blocks.max()) > INT32[1]):
                raise OutOfBounds                # the kernel's int32 product would wrap
            slots[real] = blocks + torch.fmod(p, size)
        base = g * row_stride
        store(slot_mappings_ptr, base + t, slots)
        tail = torch.arange(int(qsl[last]), width, dtype=I64)
        store(slot_mappings_ptr, base + tail, torch.full(tail.shape, int(PAD_ID), dtype=I64))


# --------------------------------------------------------------------------- the models

#: the kernel sources (with ``_load_ptr``) each model was checked against: vLLM 0.34.0's
APPLY_WRITE_0_34_0 = "9f91d0a653bac2f539f22040d1f077c9e976f3e8b24bff0ec9ac03382bc315be"
GATHER_0_34_0 = "a579c223c2c355166d9479e06f98f3aee6ddb5160c3c45d2dc023eacd6c2efff"
SLOT_MAPPINGS_0_34_0 = "71e2f8ce757c54aa44508718efa7cb2a08ec81d2b8dfba46f26af7c66de10d74"

MODELS = (
    KernelModel(BUFFER_UTILS, "_apply_write_kernel", ("_load_ptr",), frozenset({APPLY_WRITE_0_34_0}), apply_write,
                "the block tables' staged row writes"),
    KernelModel(BLOCK_TABLE, "_gather_block_tables_kernel", ("_load_ptr",), frozenset({GATHER_0_34_0}),
                gather_block_tables, "the forward's block tables, sliding-window entries below the window nulled"),
    KernelModel(BLOCK_TABLE, "_compute_slot_mappings_kernel", ("_load_ptr",), frozenset({SLOT_MAPPINGS_0_34_0}),
                slot_mappings, "each token's slot per KV-cache group, PAD_SLOT_ID past the real tokens"),
)
WHY = ("vectorised torch over the same pointers and strides on CPU tensors (interpreted, the three worker kernels "
       "cost ~50 ms a step); checked equal to the interpreted kernels on random steps of the release's BlockTables "
       "(engine_path/vllm/kernels.py self_check) and used only for the kernel source it was checked against; "
       "SLOTSCOPE_INTERPRET_KERNELS=1 interprets them")
VLLM = StandInSet(MODELS, "vllm", WHY)


class interpreted:
    """Within the block, every vLLM module holds the release's kernels again (the stand-ins put back after)."""

    def __enter__(self):
        self._swapped = []
        names = {m.name for m in MODELS}
        for mod_name, mod in list(sys.modules.items()):
            if not mod_name.startswith("vllm") or mod is None:
                continue
            for name in names:
                s = getattr(mod, "__dict__", {}).get(name)
                if isinstance(s, StandIn):
                    setattr(mod, name, s.kernel)
                    self._swapped.append((mod, name, s))
        return self

    def __exit__(self, *exc):
        for mod, name, s in self._swapped:
            setattr(mod, name, s)


# --------------------------------------------------------------------------- checked against the kernels

def self_check(seed: int = 0, steps: int = 60) -> dict[str, Any]:
    """The release's ``BlockTables`` twice, on the same random steps (rows written whole and appended, padded
    gathers with the window masked, slot mappings with dummy rows), one with the kernels interpreted and one with the
    stand-ins: ``{"steps", "differ": [what differed, by step], "launches": stand-in launches, "handed_back",
    "fingerprints"}`` (run under the release: ``isolate.call("vllm==0.34.0", "engine_path.vllm.kernels:self_check")``
    with ``TRITON_INTERPRET=1``)."""
    import numpy as np

    bt_mod = importlib.import_module(BLOCK_TABLE)
    VLLM.install()
    rng = np.random.default_rng(seed)
    sizes, widths, reqs, tokens = [16, 16], [12, 12], 6, 96

    def make():
        t = bt_mod.BlockTables(block_sizes=sizes, max_num_reqs=reqs, max_num_batched_tokens=tokens,
                               max_num_blocks_per_group=widths, device=torch.device("cpu"),
                               slot_mapping_enabled=[True, True], dcp_sharded=[False, False],
                               sliding_window_reach=[0, 31])
        register(*(b.gpu for b in t.block_tables), *t.input_block_tables)
        return t

    tables = {"interpreted": make(), "stood in": make()}
    counts = np.zeros(reqs, dtype=np.int64)
    differ = []
    for k in range(steps):
        writes = []
        for r in rng.choice(reqs, size=int(rng.integers(1, reqs + 1)), replace=False).tolist():
            whole = bool(rng.integers(0, 2)) or counts[r] == 0
            n = int(rng.integers(0, 4 if not whole else widths[0] + 1))
            n = min(n, widths[0] - (0 if whole else int(counts[r])))
            counts[r] = n if whole else counts[r] + n
            writes.append((r, tuple(rng.integers(1, 500, size=n).tolist() for _ in sizes), whole))
        batch = rng.choice(reqs, size=int(rng.integers(1, reqs + 1)), replace=False)
        idx = torch.tensor(np.where(rng.random(batch.size) < 0.15, -1, batch), dtype=torch.int32)
        lens = rng.integers(0, 9, size=batch.size)
        qsl = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
        positions = torch.tensor(np.concatenate([rng.integers(0, 16 * 12, size=n) for n in lens] + [[]]),
                                 dtype=torch.int64)
        computed = torch.tensor(rng.integers(0, 190, size=reqs), dtype=torch.int32)
        pad_rows = int(batch.size + rng.integers(0, 3))
        got = {}
        for name, t in tables.items():
            ctx = interpreted() if name == "interpreted" else contextlib.nullcontext()
            with ctx:
                for r, blocks, whole in writes:
                    t.append_block_ids(r, blocks, overwrite=whole)
                t.apply_staged_writes()
                real = idx.clamp(min=0)
                gathered = t.gather_block_tables(real, num_reqs_padded=min(pad_rows, reqs), num_computed_tokens=computed)
                slots = t.compute_slot_mappings(idx, qsl, positions, num_tokens_padded=tokens)
            got[name] = [b.gpu.clone() for b in t.block_tables] + [g.clone() for g in gathered] + [slots.clone()]
        if any(not torch.equal(a, b) for a, b in zip(got["interpreted"], got["stood in"])):
            differ.append(k)
    return {"steps": steps, "differ": differ,
            "launches": {n: s.launches for n, s in VLLM.installed().items()},
            "handed_back": {n: s.handed_back for n, s in VLLM.installed().items()},
            "fingerprints": {m.name: m.fingerprint() for m in MODELS}}
