"""Models of the release's EAGLE metadata kernels, for the stand-ins of engine_path/forward/kernels.py: the draft
decode steps' read tables (sglang/kernels/ops/speculative/cache_locs.py) and flashattention's in-graph draft-extend
metadata (sglang/kernels/ops/attention/metadata.py, :func:`draft_extend_metadata`).

An EAGLE round's draft-decode metadata (flashinfer, triton, aiter; eager and graph) builds, for every draft step, each
branch's KV indices: the committed prefix (for a draft window, its sink then its most recent tokens) and the draft
chain's own slots after it, plus the step's indptr; triton's window rail builds a sliding-window layer's tail of the
same. Each launch is one program per (step, request, branch) and, interpreted, costs about 0.4 s: an A1 run of 100
forwards spent 28 of its 33 s in these two kernels. The functions below compute what the kernels store, by torch
over the same pointers and strides (``stand_in_kernels.load_at`` / ``Stores``: an access outside a tensor hands the
launch back to the kernel).
"""
from __future__ import annotations

import torch

from ..stand_in_kernels import I64, OutOfBounds, Stores, load_at, runs, tdiv


def _token_ids(req_to_token, row_base: torch.Tensor, pos: torch.Tensor, v2p, page_size: int, eps: int,
               translate: bool) -> torch.Tensor:
    """Token ids at ``pos`` of the rows starting at ``row_base``: the entries themselves (``eps`` 1), a page entry's
    token (``entry * eps + pos % eps``); with ``translate`` virtual ids through the page table ``v2p`` (a negative
    id is the page-0 sink)."""
    if eps == 1:
        ids = load_at(req_to_token, row_base + pos)
    else:
        ids = load_at(req_to_token, row_base + tdiv(pos, eps)).to(I64) * eps + torch.fmod(pos, eps)
    if not translate:
        return ids
    ids = ids.to(I64)
    neg = ids < 0
    phys = load_at(v2p, torch.where(neg, 0, tdiv(ids, page_size)))
    return torch.where(neg, 0, (phys.to(I64) * page_size + torch.fmod(ids, page_size)).clamp(min=0))


def _grid(grid: tuple, num_steps_param: int) -> tuple[int, int, int]:
    """(draft steps, requests, branches) of a launch; a token-block split (``NUM_STEPS``) changes nothing stored."""
    if len(grid) != 3:
        raise OutOfBounds
    g0, nb, topk = (int(x) for x in grid)
    if num_steps_param:
        if g0 % num_steps_param or g0 < num_steps_param:
            raise OutOfBounds            # (a grid the launches never use: left to the kernel)
        g0 = num_steps_param
    return g0, nb, topk


def _chain_pos(seq: torch.Tensor, t: torch.Tensor, step: torch.Tensor, steps: int, page_size: int,
               topk: int) -> torch.Tensor:
    """The token-table position of draft-chain step ``step`` of branch ``t`` after a prefix of ``seq`` tokens: right
    after the prefix per branch, or (pages, several branches) on each branch's own pages after the last partial one."""
    if page_size == 1 or topk == 1:
        return seq + t * steps + step
    last = torch.fmod(seq, page_size)
    pages_each = tdiv(last + steps + page_size - 1, page_size)
    return tdiv(seq, page_size) * page_size + t * pages_each * page_size + last + step


def _programs(steps: int, nb: int, topk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every program's (step, request, branch), step-major."""
    it, b, t = torch.meshgrid(torch.arange(steps), torch.arange(nb), torch.arange(topk), indexing="ij")
    return it.reshape(-1), b.reshape(-1), t.reshape(-1)


def draft_decode_kv_indices(store: Stores, grid: tuple, *, req_pool_indices, req_to_token, paged_kernel_lens,
                            kv_indices, kv_indptr, positions, row_stride, kv_indices_stride, kv_indptr_stride,
                            bs_upper, iter_upper, num_tokens_upper, page_size, window_size=0, sink_size=0,
                            NUM_STEPS=0, ENTRY_PAGE_SIZE=1, v2p=None, TRANSLATE=False) -> None:
    """``generate_draft_decode_kv_indices``: for draft step ``s`` (row ``s`` of both outputs), request ``b`` and
    branch ``t``, the request's prefix (with a draft window: its first ``sink_size`` tokens then its last
    ``window_size``) then the ``s + 1`` chain slots, at the offset of the requests before it; ``kv_indptr[s][z]``
    (``z = b * topk + t``; the last entry for z = 0) is the sum of the branches' lengths before z (windowed) plus
    ``z * (s + 1)``."""
    steps, nb, topk = _grid(grid, int(NUM_STEPS))
    if steps <= 0 or nb <= 0 or topk <= 0:
        return
    page, eps = int(page_size), int(ENTRY_PAGE_SIZE)
    b_all = torch.arange(nb)
    seq = load_at(paged_kernel_lens, b_all).to(I64)
    cap = int(window_size) + int(sink_size)
    windowed = int(window_size) > 0
    seq_w = seq.clamp(max=cap) if windowed else seq
    s_eff = seq.clamp(max=int(sink_size)) if windowed else torch.zeros_like(seq)
    recent = seq - (seq_w - s_eff)
    before = torch.zeros(nb + 1, dtype=I64)
    torch.cumsum(seq_w, 0, out=before[1:])
    cum = before[b_all.clamp(max=int(bs_upper))]              # (the kernel sums at most bs_upper lengths)
    row_base = load_at(req_pool_indices, b_all).to(I64) * int(row_stride)

    it, b, t = _programs(steps, nb, topk)
    iters = it + 1
    kv_off = it * int(kv_indices_stride) + cum[b] * topk + b * iters * topk + t * (seq_w[b] + iters)

    # the prefix copy: the same entries for every step and branch of a request
    lens = seq_w.clamp(min=0)
    if int(lens.sum()):
        req, c = runs(lens)
        src = torch.where(c < s_eff[req], c, recent[req] + c - s_eff[req])
        data = _token_ids(req_to_token, row_base[req], src, v2p, page, eps, bool(TRANSLATE))
        prog, within = runs(lens[b])                 # per program its request's run of entries
        store(kv_indices, kv_off[prog] + within, data[(torch.cumsum(lens, 0) - lens)[b[prog]] + within])

    # the chain: min(s + 1, iter_upper) entries after the prefix
    prog, e = runs(iters.clamp(max=int(iter_upper)))
    pb = b[prog]
    data = _token_ids(req_to_token, row_base[pb], _chain_pos(seq[pb], t[prog], e, steps, page, topk), v2p, page,
                      eps, bool(TRANSLATE))
    store(kv_indices, kv_off[prog] + seq_w[pb] + e, data)
    z = _indptr_slot(b, t, nb, topk)
    before_z = _lengths_before(positions, z, int(num_tokens_upper), cap if windowed else None)
    store(kv_indptr, it * int(kv_indptr_stride) + z, before_z + z * iters)


def _indptr_slot(b: torch.Tensor, t: torch.Tensor, nb: int, topk: int) -> torch.Tensor:
    """The indptr entry a program stores: its branch's ``b * topk + t``, the last one for branch 0."""
    z = b * topk + t
    return torch.where(z == 0, nb * topk, z)


def _lengths_before(positions, z: torch.Tensor, upper: int, cap) -> torch.Tensor:
    """Per program, the sum of ``positions[o]`` (each at most ``cap``) over o < min(z, upper)."""
    k = int(z.max().clamp(max=upper))
    lens = load_at(positions, torch.arange(k)).to(I64) if k else torch.zeros(0, dtype=I64)
    if cap is not None:
        lens = lens.clamp(max=cap)
    csum = torch.zeros(k + 1, dtype=I64)
    torch.cumsum(lens, 0, out=csum[1:])
    return csum[z.clamp(max=upper)]


def draft_decode_window_kv_indices(store: Stores, grid: tuple, *, req_pool_indices, req_to_token, paged_kernel_lens,
                                   window_kv_indices, window_kv_indptr, positions, row_stride, kv_indices_stride,
                                   kv_indptr_stride, bs_upper, iter_upper, num_tokens_upper, page_size, window,
                                   ENTRY_PAGE_SIZE=1, v2p=None, TRANSLATE=False) -> None:
    """``generate_draft_decode_window_kv_indices``: for draft step ``s``, request ``b`` and branch ``t``, the last
    ``min(len + s + 1, window)`` of the prefix and chain (prefix ids first), at the sum of the branches before it
    (each ``min(positions[o] + s + 1, window)``); ``window_kv_indptr[s][z]`` that sum (the total for z = 0)."""
    steps, nb, topk = _grid(grid, 0)
    if steps <= 0 or nb <= 0 or topk <= 0:
        return
    page, eps, window = int(page_size), int(ENTRY_PAGE_SIZE), int(window)
    b_all = torch.arange(nb)
    seq_all = load_at(paged_kernel_lens, b_all).to(I64)
    row_all = load_at(req_pool_indices, b_all).to(I64) * int(row_stride)
    it, b, t = _programs(steps, nb, topk)
    iters = it + 1
    seq = seq_all[b]
    total = seq + iters
    start = total - total.clamp(max=window)
    z = b * topk + t                                 # (the data's offset counts branches before z itself)
    ntu = int(num_tokens_upper)
    k = min(nb * topk, ntu)
    prev = load_at(positions, torch.arange(k)).to(I64) if k else torch.zeros(0, dtype=I64)

    def base_at(zz: torch.Tensor) -> torch.Tensor:
        """Sum over o < min(zz, num_tokens_upper) of min(positions[o] + s + 1, window), per program."""
        if not k:
            return torch.zeros_like(zz)
        lens = (prev[None, :] + iters[:, None]).clamp(max=window)
        lens = torch.where(torch.arange(k)[None, :] < zz.clamp(max=ntu)[:, None], lens, 0)
        return lens.sum(1)

    out = it * int(kv_indices_stride) + base_at(z)
    prefix_start = torch.minimum(start, seq)
    prefix_len = (seq - prefix_start).clamp(min=0)
    if int(prefix_len.sum()):
        prog, c = runs(prefix_len)
        data = _token_ids(req_to_token, row_all[b[prog]], prefix_start[prog] + c, v2p, page, eps, bool(TRANSLATE))
        store(window_kv_indices, out[prog] + c, data)

    chain_start = (start - seq).clamp(min=0)
    e = torch.arange(int(iter_upper), dtype=I64)
    step = chain_start[:, None] + e[None, :]
    live = step < iters[:, None]
    prog, col = live.nonzero(as_tuple=True)
    if prog.numel():
        st = step[prog, col]
        pos = _chain_pos(seq[prog], t[prog], st, steps, page, topk)
        data = _token_ids(req_to_token, row_all[b[prog]], pos, v2p, page, eps, bool(TRANSLATE))
        store(window_kv_indices, out[prog] + prefix_len[prog] + e[col], data)

    zz = _indptr_slot(b, t, nb, topk)
    store(window_kv_indptr, it * int(kv_indptr_stride) + zz, base_at(zz))


def draft_extend_metadata(store: Stores, grid: tuple, *, seq_lens, seq_lens_stride_0, extend_seq_lens,
                          extend_seq_lens_stride_0, req_to_token, req_to_token_stride_0, req_to_token_stride_1,
                          req_pool_indices, req_pool_indices_stride_0, cache_seqlens_int32,
                          cache_seqlens_int32_stride_0, cu_seqlens_k, cu_seqlens_k_stride_0, cu_seqlens_q,
                          cu_seqlens_q_stride_0, page_table, page_table_stride_0, page_table_stride_1,
                          full_to_swa_index_mapping, swa_page_table, out_cache_loc, swa_out_cache_loc, B,
                          max_seq_pages, tokens_per_req, PAGE_SIZE_ONE, SHIFT, BLOCK_COLS, HAS_SWA,
                          OUT_BLOCK) -> None:
    """``_draft_extend_metadata_kernel`` (flashattention's in-graph DRAFT_EXTEND_V2 metadata): the first ``B``
    lengths as int32 and the exclusive prefix sums of them and of the extend lengths (totals last); per row its
    extend tokens' SWA write locations (``full_to_swa[out_cache_loc]``) and its live pages (at most
    ``max_seq_pages``, those of the grid's column blocks) of the token table, full and through the SWA mapping."""
    if len(grid) != 2:
        raise OutOfBounds
    rows_n, col_blocks = int(grid[0]), int(grid[1])
    if rows_n <= 0 or col_blocks <= 0:
        return
    n = int(B)
    if n > 0:                                   # program (0, 0)
        idx = torch.arange(n)
        seq = load_at(seq_lens, idx * int(seq_lens_stride_0)).to(torch.int32)
        ext = load_at(extend_seq_lens, idx * int(extend_seq_lens_stride_0)).to(torch.int32)
        store(cache_seqlens_int32, idx * int(cache_seqlens_int32_stride_0), seq)
        for out, lens, stride in ((cu_seqlens_k, seq, cu_seqlens_k_stride_0),
                                  (cu_seqlens_q, ext, cu_seqlens_q_stride_0)):
            csum = torch.zeros(n + 1, dtype=torch.int32)
            torch.cumsum(lens, 0, out=csum[1:])
            store(out, torch.arange(n + 1) * int(stride), csum)
    else:
        store(cu_seqlens_k, torch.zeros(1, dtype=I64), torch.zeros(1, dtype=torch.int32))
        store(cu_seqlens_q, torch.zeros(1, dtype=I64), torch.zeros(1, dtype=torch.int32))
    rows = torch.arange(rows_n)
    if HAS_SWA:
        tpr = min(int(tokens_per_req), int(OUT_BLOCK))
        if tpr > 0:
            offs = (rows[:, None] * int(tokens_per_req) + torch.arange(tpr)[None, :]).reshape(-1)
            full = load_at(out_cache_loc, offs).to(I64)
            store(swa_out_cache_loc, offs, load_at(full_to_swa_index_mapping, full))
    if int(max_seq_pages) == 0:
        return
    seq = load_at(seq_lens, rows * int(seq_lens_stride_0)).to(torch.int32).to(I64)
    pages = seq if PAGE_SIZE_ONE else torch.bitwise_right_shift(seq + (1 << int(SHIFT)) - 1, int(SHIFT))
    pages = pages.clamp(max=int(max_seq_pages)).clamp(min=0).clamp(max=col_blocks * int(BLOCK_COLS))
    if not int(pages.sum()):
        return
    r, col = runs(pages)
    row_base = load_at(req_pool_indices, rows * int(req_pool_indices_stride_0)).to(I64)[r] * int(req_to_token_stride_0)
    tok = col if PAGE_SIZE_ONE else torch.bitwise_left_shift(col, int(SHIFT))
    page_index = load_at(req_to_token, row_base + tok * int(req_to_token_stride_1)).to(I64)
    at = r * int(page_table_stride_0) + col * int(page_table_stride_1)
    store(page_table, at, page_index if PAGE_SIZE_ONE else torch.bitwise_right_shift(page_index, int(SHIFT)))
    if HAS_SWA:
        swa = load_at(full_to_swa_index_mapping, page_index).to(I64)
        swa_pages = swa if PAGE_SIZE_ONE else torch.bitwise_right_shift(swa, int(SHIFT))
        store(swa_page_table, at, swa_pages.to(torch.int32))
