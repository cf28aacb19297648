"""The release's metadata kernels a CPU run does not interpret: each computed by torch, checked equal.

The backends' metadata (eager and CUDA-graph, capture and replay) builds its read tables with the release's Triton
kernels, launched with one program per request row (a graph's rows: its capture size), sometimes per column
block of a page table too. Under ``TRITON_INTERPRET=1`` each program costs milliseconds, so a run with decode
graphs spent nearly all its time there: flashattention's capture and replay of B1 spent 139 of 160 s in
``_fused_decode_metadata_kernel`` (docs/ENGINE.md, "Cost").

A :class:`KernelModel` is what one kernel stores, as vectorised torch ops over the same pointers and strides the
kernel is handed (``grid``, the bound arguments): :func:`kv_indices` (``create_flashinfer_kv_indices_triton``, a
CSR gather of token-table rows) and :func:`decode_metadata` (``_fused_decode_metadata_kernel``, the lengths,
their prefix sum and the full and SWA page tables of a decode batch), trtllm_mha's graph metadata, and the
page-table scatters of aiter and trtllm_mha (:func:`_page_scatter`), and the EAGLE draft's decode-step KV indices
(engine_path/forward/draft_kernels.py). :class:`StandIn` takes a kernel's
launches on CPU tensors; it hands a launch back to the kernel itself when an argument is on another device, the
grid is not a tuple, or an access the kernel would make falls outside its tensor (the kernel's behaviour there
is the memory's, not a value to model).

A model stands in only for the source it was checked against: the sha256 of the kernel's source and of the
``@triton.jit`` helpers it calls must be one in :attr:`KernelModel.checked` (0.5.23's). A release whose kernel
differs, or a kernel an ``--engine-patch`` edited, is interpreted, and engine_pieces says which ran.
:func:`self_check` compares each model with the interpreted kernel on random launches
(tests/test_engine_forward.py); ``SLOTSCOPE_INTERPRET_KERNELS=1`` interprets every kernel.
"""
from __future__ import annotations

import importlib
from typing import Any

import torch

from ..stand_in_kernels import I64, KernelModel, StandIn, StandInSet, Stores, load_at, runs, tdiv
from .draft_kernels import draft_decode_kv_indices, draft_decode_window_kv_indices, draft_extend_metadata

I32 = torch.int32


# --------------------------------------------------------------------------- create_flashinfer_kv_indices_triton

def kv_indices(store: Stores, grid: tuple, *, req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr,
               kv_indptr, kv_start_idx, kv_indices_ptr, req_to_token_ptr_stride, ENTRY_PAGE_SIZE=1,
               TOKEN_BLOCK_PARALLEL=False, token_mapping=None) -> None:
    """For each program ``p`` of the grid, row ``req_pool_indices[p]`` of the token table from
    ``kv_start_idx[p]`` (0 without it) for ``page_kernel_lens[p]`` entries goes to ``kv_indices[kv_indptr[p]:]``;
    a page-granular table (``ENTRY_PAGE_SIZE`` > 1) rebuilds token ids from page ids; ``token_mapping`` remaps
    every id >= 0 (its token-block split changes nothing stored)."""
    programs = int(grid[0])
    if programs <= 0:
        return
    p = torch.arange(programs)
    lens = load_at(page_kernel_lens_ptr, p).to(I64).clamp(min=0)
    total = int(lens.sum())
    if total == 0:
        return
    prog, within = runs(lens)
    start = load_at(kv_start_idx, p).to(I64)[prog] if kv_start_idx is not None else 0
    pos = start + within
    eps = int(ENTRY_PAGE_SIZE)
    col = pos if eps == 1 else tdiv(pos, eps)
    rows = load_at(req_pool_indices_ptr, p).to(I64)[prog]
    data = load_at(req_to_token_ptr, rows * int(req_to_token_ptr_stride) + col)
    if eps != 1:
        data = data.to(I64) * eps + torch.fmod(pos, eps)
    if token_mapping is not None:                 # -1 (no slot) stays -1; the rest read the mapping
        live = data >= 0
        mapped = torch.full(data.shape, -1, dtype=token_mapping.dtype)
        mapped[live] = load_at(token_mapping, data[live].to(I64))
        data = mapped
    store(kv_indices_ptr, load_at(kv_indptr, p).to(I64)[prog] + within, data)


# --------------------------------------------------------------------------- _fused_decode_metadata_kernel

def decode_metadata(store: Stores, grid: tuple, *, seq_lens, seq_lens_stride_0, req_to_token,
                    req_to_token_stride_0, req_to_token_stride_1, req_pool_indices, req_pool_indices_stride_0,
                    cache_seqlens_int32, cache_seqlens_int32_stride_0, cu_seqlens_k, cu_seqlens_k_stride_0,
                    page_table, page_table_stride_0, page_table_stride_1, swa_page_table, swa_page_table_stride_0,
                    swa_page_table_stride_1, full_to_swa_index_mapping, full_to_swa_mapping_stride_0, full_v2p,
                    full_v2p_stride_0, swa_v2p, swa_v2p_stride_0, B, max_seq_pages, PAGE_SIZE, SEQ_LEN_DELTA,
                    BLOCK_COLS, SKIP_PAGE_TABLE, ZERO_TAIL) -> None:
    """Program (0, 0): ``cache_seqlens[i] = seq_lens[i] + delta`` (int32) and their exclusive prefix sum with the
    total in ``cu_seqlens_k``. Every program (b, c) unless the page tables are skipped: columns
    ``c * BLOCK_COLS ..`` of row b, live below ``min(cdiv(seq_len + delta, PAGE_SIZE), max_seq_pages)``: the
    full page of the token at column * PAGE_SIZE of the request's token-table row (through ``full_v2p``), the SWA
    page of its SWA slot (``full_to_swa_index_mapping``, or the page through ``swa_v2p``); with ``ZERO_TAIL`` the
    columns past the live ones up to ``max_seq_pages`` get 0, else they are left as they are (a program whose
    column block starts past its row's live pages returns before it loads anything)."""
    gb, gc = (tuple(int(g) for g in grid) + (1, 1))[:2]
    page, delta, n = int(PAGE_SIZE), int(SEQ_LEN_DELTA), int(B)
    if gb <= 0 or gc <= 0:
        return
    i = torch.arange(n, dtype=I64)
    val = (load_at(seq_lens, i * int(seq_lens_stride_0)) + delta).to(I32)
    store(cache_seqlens_int32, i * int(cache_seqlens_int32_stride_0), val)
    store(cu_seqlens_k, torch.arange(n + 1, dtype=I64) * int(cu_seqlens_k_stride_0),
          torch.cat([torch.zeros(1, dtype=I64), torch.cumsum(val.to(I64), 0)]))
    if SKIP_PAGE_TABLE or int(max_seq_pages) == 0:
        return
    # the live entries only (row-major, as lists), never the grid's whole rows x columns: at page 1 a row is as
    # wide as the context (a dense matrix of them was most of this kernel's time)
    width = gc * int(BLOCK_COLS)
    b = torch.arange(gb, dtype=I64)
    seq_len = load_at(seq_lens, b * int(seq_lens_stride_0)).to(I32).to(I64)
    num_live = torch.clamp(tdiv(seq_len + delta + page - 1, page), max=int(max_seq_pages))
    filled = torch.ones(gb, dtype=torch.bool) if ZERO_TAIL else num_live > 0
    rb = b[filled]
    if not rb.numel():
        return
    row = load_at(req_pool_indices, rb * int(req_pool_indices_stride_0)).to(I64)
    lens = num_live[filled].clamp(min=0, max=width)
    at_row, col = runs(lens)
    token = load_at(req_to_token, row[at_row] * int(req_to_token_stride_0) + col * page * int(req_to_token_stride_1))
    tables = [(page_table, page_table_stride_0, page_table_stride_1, _pages(token, page, full_v2p, full_v2p_stride_0))]
    if swa_page_table is not None:
        tables.append((swa_page_table, swa_page_table_stride_0, swa_page_table_stride_1,
                       _pages(token, page, swa_v2p, swa_v2p_stride_0, full_to_swa_index_mapping,
                              full_to_swa_mapping_stride_0)))
    for table, s0, s1, pages in tables:
        if ZERO_TAIL:       # every column below max_seq_pages: 0 (what a masked-off lane loads), then the live ones
            store.fill_block(table, rb, min(width, int(max_seq_pages)), int(s0), int(s1), 0)
        store(table, rb[at_row] * int(s0) + col * int(s1), pages)


def _pages(token: torch.Tensor, page: int, page_mapping, page_stride, token_mapping=None,
           token_stride=0) -> torch.Tensor:
    """``_resolve_metadata_page_ids`` of live lanes: a token slot (through ``token_mapping``) to its page (through
    ``page_mapping``, at least 0)."""
    if token_mapping is not None:
        token = load_at(token_mapping, token.to(I64) * int(token_stride))
    pages = tdiv(token, page)
    if page_mapping is not None:
        pages = load_at(page_mapping, pages.to(I64).clamp(min=0) * int(page_stride)).clamp(min=0)
    return pages


# --------------------------------------------------------------------------- update_trtllm_mha_graph_metadata_kernel

def trtllm_graph_metadata(store: Stores, grid: tuple, *, req_pool_indices_ptr, seq_lens_ptr, req_to_token_ptr,
                          swa_mapping_ptr, out_cache_loc_ptr, qlens_ptr, cache_seqlens_ptr, cu_seqlens_k_ptr,
                          cu_seqlens_q_ptr, page_table_ptr, swa_page_table_ptr, swa_out_cache_loc_ptr, bs,
                          seqlen_offset, max_seq_pages, q_stride, num_out_tokens, swa_out_len, req_to_token_stride,
                          page_table_stride, swa_page_table_stride, PAGE_SIZE, HAS_SWA, HAS_SWA_OUT, Q_MODE,
                          PAGE_BLOCK, BS_BLOCK, SKIP_PAGE_TABLE=0) -> None:
    """Programs ``0 .. bs - 1``, one per row: ``cache_seqlens = seq_lens + seqlen_offset`` (int32) and, unless the
    page tables are skipped, its live pages (``min(cdiv(cache_seqlen, PAGE_SIZE), max_seq_pages)``): the page of
    the token at page * PAGE_SIZE of the request's token-table row, and (``HAS_SWA``) the SWA page of its SWA
    slot, -1 where the token or its SWA slot is negative; the rest of each row is left as it is. Program ``bs``:
    ``cu_seqlens_k[1:]`` the prefix sum of the lengths (``cu_seqlens_k[0]`` untouched), ``cu_seqlens_q[1:]``
    per ``Q_MODE``. The programs after: ``swa_out_cache_loc[j]`` for ``j < swa_out_len`` (the graph's SWA write
    locations) = the SWA slot of ``out_cache_loc[j]`` for ``j < num_out_tokens`` (-1 for a negative one, 0 where
    the mapping is skipped), 0 past them."""
    programs, n, page = int(grid[0]), int(bs), int(PAGE_SIZE)
    rows = torch.arange(min(programs, n), dtype=I64)
    if rows.numel():
        seqlen = (load_at(seq_lens_ptr, rows) + int(seqlen_offset)).to(I32)
        store(cache_seqlens_ptr, rows, seqlen)
        if not SKIP_PAGE_TABLE:
            live = torch.clamp(tdiv(seqlen.to(I64) + page - 1, page), max=int(max_seq_pages)).clamp(min=0)
            if int(live.sum()):
                i, col = runs(live)
                r = rows[i]
                req = load_at(req_pool_indices_ptr, rows).to(I64)[r]
                token = load_at(req_to_token_ptr, req * int(req_to_token_stride) + col * page)
                store(page_table_ptr, r * int(page_table_stride) + col, tdiv(token, page))
                if HAS_SWA:
                    token64 = token.to(I64)
                    swa = torch.full(token64.shape, -1, dtype=swa_mapping_ptr.dtype)
                    ok = token64 >= 0
                    swa[ok] = load_at(swa_mapping_ptr, token64[ok])
                    swa_page = torch.where(swa < 0, -1, tdiv(swa, page)).to(I32)
                    store(swa_page_table_ptr, r * int(swa_page_table_stride) + col, swa_page)
    if programs > n:
        i = torch.arange(n, dtype=I64)
        lens = (load_at(seq_lens_ptr, i).to(I32) + int(seqlen_offset)).to(I32)
        store(cu_seqlens_k_ptr, 1 + i, torch.cumsum(lens.to(I64), 0))
        if int(Q_MODE) == 1:
            store(cu_seqlens_q_ptr, 1 + i, torch.cumsum(load_at(qlens_ptr, i).to(I32).to(I64), 0))
        elif int(Q_MODE) == 2:
            store(cu_seqlens_q_ptr, 1 + i, (i + 1) * int(q_stride))
    if HAS_SWA_OUT and programs > n + 1:
        j = torch.arange((programs - n - 1) * int(PAGE_BLOCK), dtype=I64)
        j = j[j < int(swa_out_len)]
        real = j < int(num_out_tokens)
        loc = torch.zeros(j.shape, dtype=out_cache_loc_ptr.dtype)
        loc[real] = load_at(out_cache_loc_ptr, j[real])
        got = torch.zeros(j.shape, dtype=swa_mapping_ptr.dtype)
        mapped = real & (loc >= 0)
        got[mapped] = load_at(swa_mapping_ptr, loc[mapped].to(I64))
        got[real & (loc < 0)] = -1
        store(swa_out_cache_loc_ptr, j, got)


# --------------------------------------------------------------------------- aiter's unified page-table scatters

def _page_scatter(store: Stores, grid: tuple, first, kv_lens, gather, dest_ptr, dest_stride, sw_page_table_ptr,
                  swa_slot_mapping_ptr, PAGE_SIZE, BLOCK_SIZE, HAS_SWA, swa_index=None) -> None:
    """The body the page-table scatters share (aiter's two, trtllm_mha's): per program (p, b), the columns
    ``b * BLOCK_SIZE ..`` of row p below ``cdiv(kv_len[p], PAGE_SIZE)`` get the page (``// PAGE_SIZE``) of the
    token at column * PAGE_SIZE (``gather(start, token_offset)``, ``start`` the row's ``first``), and with
    ``HAS_SWA`` the SWA table the page of that token's SWA slot (the mapping read at ``swa_index(token)``, the
    token itself without it); a program whose block starts past its row's pages returns before it loads anything."""
    gp, gb = (tuple(int(g) for g in grid) + (1, 1))[:2]
    page, block = int(PAGE_SIZE), int(BLOCK_SIZE)
    if gp <= 0 or gb <= 0:
        return
    p = torch.arange(gp, dtype=I64)
    num_blocks = tdiv(kv_lens(p) + page - 1, page)
    live = torch.clamp(torch.minimum(num_blocks, torch.full_like(num_blocks, gb * block)), min=0)
    total = int(live.sum())
    if total == 0:
        return
    prog, col = runs(live)
    vals = gather(first(p)[prog], col * page)
    at = prog * int(dest_stride) + col
    store(dest_ptr, at, tdiv(vals, page))
    if HAS_SWA:
        idx = vals.to(I64) if swa_index is None else swa_index(vals.to(I64))
        store(sw_page_table_ptr, at, tdiv(load_at(swa_slot_mapping_ptr, idx), page))


def req_to_token_page_table(store: Stores, grid: tuple, *, req_to_token_ptr, req_pool_indices_ptr, seq_lens_ptr,
                            page_table_ptr, req_to_token_stride, page_table_stride, sw_page_table_ptr,
                            swa_slot_mapping_ptr, DRAFT_NUM, PAGE_SIZE, BLOCK_SIZE, HAS_SWA, swa_index=None) -> None:
    """``scatter_req_to_token_to_page_table_kernel``: row p's pages from the token table's row
    ``req_pool_indices[p]`` over ``seq_lens[p] + DRAFT_NUM`` tokens (``swa_index``: :func:`_page_scatter`'s)."""
    _page_scatter(
        store, grid,
        first=lambda p: load_at(req_pool_indices_ptr, p).to(I64),
        kv_lens=lambda p: load_at(seq_lens_ptr, p).to(I64) + int(DRAFT_NUM),
        gather=lambda row, off: load_at(req_to_token_ptr, row * int(req_to_token_stride) + off),
        dest_ptr=page_table_ptr, dest_stride=page_table_stride, sw_page_table_ptr=sw_page_table_ptr,
        swa_slot_mapping_ptr=swa_slot_mapping_ptr, PAGE_SIZE=PAGE_SIZE, BLOCK_SIZE=BLOCK_SIZE, HAS_SWA=HAS_SWA,
        swa_index=swa_index)


def ragged_page_table(store: Stores, grid: tuple, *, kv_flat_ptr, kv_indptr_ptr, dest_ptr, dest_stride,
                      sw_page_table_ptr, swa_slot_mapping_ptr, PAGE_SIZE, BLOCK_SIZE, HAS_SWA) -> None:
    """``scatter_ragged_to_page_table_kernel``: row p's pages from the ragged token ids
    ``kv_flat[kv_indptr[p]:kv_indptr[p + 1]]``."""
    _page_scatter(
        store, grid,
        first=lambda p: load_at(kv_indptr_ptr, p).to(I64),
        kv_lens=lambda p: load_at(kv_indptr_ptr, p + 1).to(I64) - load_at(kv_indptr_ptr, p).to(I64),
        gather=lambda start, off: load_at(kv_flat_ptr, start + off),
        dest_ptr=dest_ptr, dest_stride=dest_stride, sw_page_table_ptr=sw_page_table_ptr,
        swa_slot_mapping_ptr=swa_slot_mapping_ptr, PAGE_SIZE=PAGE_SIZE, BLOCK_SIZE=BLOCK_SIZE, HAS_SWA=HAS_SWA)


def trtllm_page_table(store: Stores, grid: tuple, *, req_to_token_ptr, req_pool_indices_ptr, seq_lens_ptr,
                      full_to_swa_ptr, page_table_ptr, swa_page_table_ptr, full_to_swa_numel, req_to_token_stride,
                      page_table_stride, PAGE_SIZE, HAS_SWA) -> None:
    """``create_trtllm_mha_kv_indices_triton`` (trtllm_mha's eager page tables): aiter's token-table scatter
    without draft tokens, 4096 tokens a block; the SWA page of a token is read at the token clamped into
    ``[0, full_to_swa_numel - 1]``."""
    top = int(full_to_swa_numel) - 1
    req_to_token_page_table(
        store, grid, req_to_token_ptr=req_to_token_ptr, req_pool_indices_ptr=req_pool_indices_ptr,
        seq_lens_ptr=seq_lens_ptr, page_table_ptr=page_table_ptr, req_to_token_stride=req_to_token_stride,
        page_table_stride=page_table_stride, sw_page_table_ptr=swa_page_table_ptr, swa_slot_mapping_ptr=full_to_swa_ptr,
        DRAFT_NUM=0, PAGE_SIZE=PAGE_SIZE, BLOCK_SIZE=_trtllm_block_tokens() // int(PAGE_SIZE), HAS_SWA=HAS_SWA,
        swa_index=lambda t: torch.clamp(torch.clamp(t, min=0), max=top))


def _trtllm_block_tokens() -> int:
    """The tokens a program of trtllm_mha's page-table kernel covers: the release module's constant (4096 in
    0.5.23), read where the kernel reads it (a global, outside the kernel source the fingerprint covers)."""
    c = importlib.import_module(TRTLLM_PAGE_TABLE_MODULE)._MHA_KV_INDEX_BLOCK_TOKENS_TL
    return int(getattr(c, "value", c))


TRTLLM_PAGE_TABLE_MODULE = "sglang.kernels.ops.attention.trtllm_mha_page_table"


# --------------------------------------------------------------------------- the models and their stand-ins

#: the sources each model was checked against, by release
KV_INDICES_0_5_23 = "6314646407b950a925814db6e9880406cc5da5d490a8a7b7dd36745ab38ca5ff"
DECODE_METADATA_0_5_23 = "a51c8509bf96113863d4d354653be1ce4f76697444f4ece5025f2e6a38b52a78"
TRTLLM_GRAPH_METADATA_0_5_23 = "909dad236e6e3e49e611c3500d2f15fd144d4951da3af401170baa8e01935f29"
AITER_REQ_PAGE_TABLE_0_5_23 = "d46574154c1f8fe6cfaac227b564aa55186dfd938f6eabea903c2170271d49e2"
AITER_RAGGED_PAGE_TABLE_0_5_23 = "4b56cef723421b3385c63ab44102250aca23522d5680563d0cdf1f5c20645ffc"
TRTLLM_PAGE_TABLE_0_5_23 = "01e4f22cca6037275028cf35c4ef27076ec7f6bf8d6ee2e48be65214d7dd695b"
DRAFT_KV_INDICES_0_5_23 = "9bda5740b7b20edaa61223847d43b1280c2807c5a7e9f86d4f18a0aa74136e73"
DRAFT_WINDOW_KV_INDICES_0_5_23 = "390834b595e8cfee428945c8b1251f7c875b2ad96084fa9cd56198af7a989979"
DRAFT_EXTEND_METADATA_0_5_23 = "84b5f2da24728fae08d45553c9c0335e819d1584d3b1ba3cec008389ea436848"
DRAFT_MODULE = "sglang.kernels.ops.speculative.cache_locs"
DRAFT_HELPERS = ("_load_token_ids", "_translate_token_ids")

MODELS = (
    KernelModel("sglang.kernels.ops.attention.kv_indices", "create_flashinfer_kv_indices_triton", (),
                frozenset({KV_INDICES_0_5_23}), kv_indices, "the metadata's KV-index gather"),
    KernelModel("sglang.kernels.ops.attention.metadata", "_fused_decode_metadata_kernel",
                ("_resolve_metadata_page_ids",), frozenset({DECODE_METADATA_0_5_23}), decode_metadata,
                "the decode metadata's lengths and page tables"),
    KernelModel("sglang.kernels.ops.attention.trtllm_mha_graph_metadata", "update_trtllm_mha_graph_metadata_kernel",
                (), frozenset({TRTLLM_GRAPH_METADATA_0_5_23}), trtllm_graph_metadata,
                "trtllm_mha's graph metadata: lengths, page tables, the graph's SWA write locations"),
    KernelModel("sglang.kernels.ops.attention.aiter_unified_page_table", "scatter_req_to_token_to_page_table_kernel",
                (), frozenset({AITER_REQ_PAGE_TABLE_0_5_23}), req_to_token_page_table,
                "aiter's unified page tables from the token table"),
    KernelModel("sglang.kernels.ops.attention.aiter_unified_page_table", "scatter_ragged_to_page_table_kernel",
                (), frozenset({AITER_RAGGED_PAGE_TABLE_0_5_23}), ragged_page_table,
                "aiter's unified page tables from ragged token ids"),
    KernelModel(TRTLLM_PAGE_TABLE_MODULE, "create_trtllm_mha_kv_indices_triton", (),
                frozenset({TRTLLM_PAGE_TABLE_0_5_23}), trtllm_page_table, "trtllm_mha's eager page tables"),
    KernelModel(DRAFT_MODULE, "generate_draft_decode_kv_indices", DRAFT_HELPERS,
                frozenset({DRAFT_KV_INDICES_0_5_23}), draft_decode_kv_indices,
                "the draft decode steps' KV indices and indptr"),
    KernelModel(DRAFT_MODULE, "generate_draft_decode_window_kv_indices", DRAFT_HELPERS,
                frozenset({DRAFT_WINDOW_KV_INDICES_0_5_23}), draft_decode_window_kv_indices,
                "the draft decode steps' sliding-window KV indices (triton's window rail)"),
    KernelModel("sglang.kernels.ops.attention.metadata", "_draft_extend_metadata_kernel", (),
                frozenset({DRAFT_EXTEND_METADATA_0_5_23}), draft_extend_metadata,
                "flashattention's in-graph draft-extend metadata: lengths, page tables, SWA write locations"),
)
#: what engine_pieces says of the stand-ins
WHY = ("vectorised torch over the same pointers and strides on CPU tensors (interpreted, a kernel costs "
       "milliseconds a program: one program per request row, a graph's capture size); checked equal to the "
       "interpreted kernel (engine_path/forward/kernels.py self_check) and used only for the kernel source it "
       "was checked against; SLOTSCOPE_INTERPRET_KERNELS=1 interprets it")



#: SGLang's kernel stand-ins (boundary.py installs them as a backend's modules are imported)
SGLANG = StandInSet(MODELS, "sglang", WHY)
install, installed, refused, pieces = SGLANG.install, SGLANG.installed, SGLANG.refused, SGLANG.pieces


# --------------------------------------------------------------------------- checked against the kernels

def self_check(seed: int = 0) -> dict[str, Any]:
    """Each model against the interpreted kernel on random launches: ``{"cases": n, "differ": [case names],
    "stored": entries the kernels changed, "fingerprints": {kernel: sha256}}`` (run in a release's process:
    ``engine_path.isolate.call(spec, "engine_path.forward.kernels:self_check")``)."""
    from .kernel_cases import CASES

    g = torch.Generator().manual_seed(seed)
    differ, cases, stored = [], 0, 0
    for model in MODELS:
        mod = importlib.import_module(model.module)
        kernel = getattr(mod, model.name)
        kernel = kernel.kernel if isinstance(kernel, StandIn) else kernel
        for name, args, grid in CASES[model.name](g):
            cases += 1
            outs = [k for k, v in args.items() if isinstance(v, torch.Tensor)]
            want = {k: args[k].clone() for k in outs}
            got = {k: args[k].clone() for k in outs}
            kernel[grid](**{**args, **want})
            store = Stores()
            model.compute(store, grid, **{**args, **got})
            store.apply()
            if any(not torch.equal(want[k], got[k]) for k in outs):
                differ.append(f"{model.name}: {name}")
            stored += sum(int((want[k] != args[k]).sum()) for k in outs)
    return {"cases": cases, "differ": differ, "stored": stored,
            "fingerprints": {m.name: m.fingerprint() for m in MODELS}}
