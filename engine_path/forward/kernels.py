"""The one release kernel of the backends' metadata a CPU run does not interpret: the KV-index gather.

The backends' metadata (eager and CUDA-graph, capture and replay) builds its read tables with the release's Triton
kernel ``create_flashinfer_kv_indices_triton`` (sglang/kernels/ops/attention/kv_indices.py), launched with one
program per request row (a graph's rows: its capture size). Under ``TRITON_INTERPRET=1`` each program costs a few
milliseconds, so a run with decode graphs of size 256 spent most of its time there (docs/ENGINE.md, "Cost").

:class:`KVIndicesGather` stands in for the kernel's launches on CPU tensors: what the kernel computes, a CSR
gather, written here as vectorised torch ops: for each program ``p`` of the grid, the row
``req_pool_indices[p]`` of the token table from ``kv_start_idx[p]`` (0 without it) for ``page_kernel_lens[p]``
entries goes to ``kv_indices[kv_indptr[p]:]``; a page-granular table (``ENTRY_PAGE_SIZE`` > 1) rebuilds token ids
from page ids; ``token_mapping`` remaps every id >= 0. It is checked equal to the interpreted kernel
(:func:`self_check`, tests/test_engine_forward.py). Launches on CUDA tensors, or with a grid that is not a
tuple, go to the kernel itself; ``SLOTSCOPE_INTERPRET_KERNELS=1`` keeps the interpreted kernel everywhere.
Every module of the release that imported the kernel by name gets the stand-in (:func:`install`), and run.json's
``engine_pieces`` names it.
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any, Optional

import torch

KV_INDICES = "sglang.kernels.ops.attention.kv_indices"
KERNEL = "create_flashinfer_kv_indices_triton"
#: what engine_pieces says of it
PIECE = f"{KERNEL} (the metadata's KV-index gather)"
WHY = ("a vectorised torch gather of the same CSR on CPU tensors (interpreted, the kernel costs milliseconds a "
       "program: one program per request row, a graph's capture size); equal to the interpreted kernel "
       "(engine_path/forward/kernels.py self_check); SLOTSCOPE_INTERPRET_KERNELS=1 interprets it")


class KVIndicesGather:
    """``kernel[grid](...)`` of :data:`KERNEL`, on CPU tensors computed by torch (see the module docstring)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.signature = inspect.signature(kernel.fn)
        self.launches = 0

    def __getitem__(self, grid):
        if not isinstance(grid, tuple):
            return self.kernel[grid]

        def launch(*args, **kwargs):
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            if any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in a.values()):
                return self.kernel[grid](*args, **kwargs)
            self.launches += 1
            return gather(int(grid[0]), **a)
        return launch


def gather(programs: int, *, req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr,
           kv_start_idx, kv_indices_ptr, req_to_token_ptr_stride, ENTRY_PAGE_SIZE=1, TOKEN_BLOCK_PARALLEL=False,
           token_mapping=None) -> None:
    """The kernel's stores for programs ``0 .. programs - 1`` (its token-block split changes nothing stored)."""
    if programs <= 0:
        return
    i64 = torch.int64
    lens = page_kernel_lens_ptr[:programs].to(i64).clamp(min=0)
    total = int(lens.sum())
    if total == 0:
        return
    prog = torch.repeat_interleave(torch.arange(programs), lens)
    within = torch.arange(total, dtype=i64) - torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)
    start = kv_start_idx[:programs].to(i64)[prog] if kv_start_idx is not None else 0
    pos = start + within
    eps = int(ENTRY_PAGE_SIZE)
    col = pos if eps == 1 else torch.div(pos, eps, rounding_mode="floor")
    idx = req_pool_indices_ptr[:programs].to(i64)[prog] * int(req_to_token_ptr_stride) + col
    table = req_to_token_ptr.as_strided((int(idx.max()) + 1,), (1,))
    data = table[idx]
    if eps != 1:
        data = data.to(i64) * eps + pos % eps
    if token_mapping is not None:
        live = data >= 0
        flat = token_mapping.as_strided((int(data.max()) + 1 if bool(live.any()) else 1,), (1,))
        data = torch.where(live, flat[data.clamp(min=0).to(i64)].to(data.dtype), torch.full_like(data, -1))
    dst = kv_indptr[:programs].to(i64)[prog] + within
    out = kv_indices_ptr.as_strided((int(dst.max()) + 1,), (1,))
    out[dst] = data.to(out.dtype)


_installed: Optional[KVIndicesGather] = None


def install() -> Optional[KVIndicesGather]:
    """The stand-in in every imported module of the release holding the kernel by name (idempotent; None when
    ``SLOTSCOPE_INTERPRET_KERNELS=1`` or the release has no such kernel)."""
    global _installed
    if os.environ.get("SLOTSCOPE_INTERPRET_KERNELS") == "1":
        return None
    if _installed is None:
        try:
            kernel = getattr(importlib.import_module(KV_INDICES), KERNEL)
        except (ImportError, AttributeError):
            return None
        if isinstance(kernel, KVIndicesGather) or not callable(getattr(kernel, "fn", None)):
            return None
        _installed = KVIndicesGather(kernel)
    for name, mod in list(sys.modules.items()):
        if name.startswith("sglang") and getattr(mod, KERNEL, None) is _installed.kernel:
            setattr(mod, KERNEL, _installed)
    return _installed


def installed() -> Optional[KVIndicesGather]:
    return _installed


def self_check(seed: int = 0) -> dict[str, Any]:
    """The stand-in against the interpreted kernel on random launches (token and page tables, a start offset,
    a token mapping, a 2-D grid): ``{"cases": n, "differ": [case names]}`` (run in a release's process:
    ``engine_path.isolate.call(spec, "engine_path.forward.kernels:self_check")``)."""
    kernel = getattr(importlib.import_module(KV_INDICES), KERNEL)
    kernel = kernel.kernel if isinstance(kernel, KVIndicesGather) else kernel
    g = torch.Generator().manual_seed(seed)
    differ, cases, stored = [], 0, 0
    for eps in (1, 4):
        for start in (False, True):
            for mapping in (False, True):
                for blocks in (1, 2):
                    cases += 1
                    args, grid = _case(g, eps, start, mapping, blocks)
                    want, got = args["kv_indices_ptr"].clone(), args["kv_indices_ptr"].clone()
                    kernel[grid](**{**args, "kv_indices_ptr": want})
                    gather(grid[0], **{**args, "kv_indices_ptr": got})
                    name = f"eps={eps} start={start} mapping={mapping} blocks={blocks}"
                    if not torch.equal(want, got):
                        differ.append(name)
                    stored += int((want != args["kv_indices_ptr"]).sum())
    return {"cases": cases, "differ": differ, "stored": stored}


def _case(g: torch.Generator, eps: int, start: bool, mapping: bool, blocks: int):
    rows, width, bs = 6, 40, 5
    table = torch.randint(0, 50, (rows, width), generator=g, dtype=torch.int32)
    lens = torch.randint(0, 30, (bs,), generator=g, dtype=torch.int32)
    lens[1] = 0
    starts = torch.randint(0, 8, (bs,), generator=g, dtype=torch.int32) if start else None
    indptr = torch.zeros(bs + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(lens, 0)
    token_map = None
    if mapping:
        token_map = torch.randint(-1, 100, (50 * eps + eps,), generator=g, dtype=torch.int64)
    args = dict(req_to_token_ptr=table, req_pool_indices_ptr=torch.randint(0, rows, (bs,), generator=g),
                page_kernel_lens_ptr=lens, kv_indptr=indptr, kv_start_idx=starts,
                kv_indices_ptr=torch.full((int(indptr[-1]) + 7,), -7, dtype=torch.int64),
                req_to_token_ptr_stride=width, ENTRY_PAGE_SIZE=eps, TOKEN_BLOCK_PARALLEL=blocks > 1,
                token_mapping=token_map)
    return args, (bs, blocks)
