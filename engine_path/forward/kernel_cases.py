"""The random launches :func:`engine_path.forward.kernels.self_check` runs each kernel model on: per model, a
generator of ``(name, arguments, grid)`` over page sizes, mappings, lengths (zero ones included) and grids."""
from __future__ import annotations

import torch

I64 = torch.int64
I32 = torch.int32


def _kv_indices_cases(g: torch.Generator):
    for eps in (1, 4):
        for start in (False, True):
            for mapping in (False, True):
                for blocks in (1, 2):
                    rows, width, bs = 6, 40, 5
                    table = torch.randint(0, 50, (rows, width), generator=g, dtype=I32)
                    lens = torch.randint(0, 30, (bs,), generator=g, dtype=I32)
                    lens[1] = 0
                    starts = torch.randint(0, 8, (bs,), generator=g, dtype=I32) if start else None
                    indptr = torch.zeros(bs + 1, dtype=I32)
                    indptr[1:] = torch.cumsum(lens, 0)
                    token_map = (torch.randint(-1, 100, (50 * eps + eps,), generator=g, dtype=I64)
                                 if mapping else None)
                    args = dict(req_to_token_ptr=table, req_pool_indices_ptr=torch.randint(0, rows, (bs,), generator=g),
                                page_kernel_lens_ptr=lens, kv_indptr=indptr, kv_start_idx=starts,
                                kv_indices_ptr=torch.full((int(indptr[-1]) + 7,), -7, dtype=I64),
                                req_to_token_ptr_stride=width, ENTRY_PAGE_SIZE=eps, TOKEN_BLOCK_PARALLEL=blocks > 1,
                                token_mapping=token_map)
                    yield f"eps={eps} start={start} mapping={mapping} blocks={blocks}", args, (bs, blocks)


def _decode_metadata_cases(g: torch.Generator):
    rows, width, pool = 7, 48, 64
    for page in (1, 4):
        for swa in ("none", "tokens", "pages"):
            for v2p in (False, True):
                for zero_tail in (False, True):
                    for delta, skip in ((0, False), (1, False), (0, True)):
                        if swa == "pages" and not v2p:
                            continue
                        bs, block = 5, 4
                        max_pages = width // page - 1
                        seq = torch.randint(0, width - 2, (bs,), generator=g, dtype=I64)
                        seq[2] = 0
                        table = torch.randint(0, pool, (rows, width), generator=g, dtype=I32)
                        f2s = torch.randint(-1, pool // 2, (pool + 1,), generator=g, dtype=I64)
                        n_pages = pool // page + 1
                        fv = torch.randint(-1, n_pages, (n_pages,), generator=g, dtype=I64) if v2p else None
                        sv = torch.randint(-1, n_pages, (n_pages,), generator=g, dtype=I64) if swa == "pages" else None
                        if swa == "tokens":          # a token mapping: only ids the pool has (-1 maps to the sink 0)
                            f2s = f2s.clamp(min=0)
                        pt = torch.full((bs, max_pages + 3), -5, dtype=I32)
                        spt = torch.full((bs, max_pages + 3), -6, dtype=I32) if swa != "none" else None
                        args = dict(
                            seq_lens=seq, seq_lens_stride_0=1, req_to_token=table, req_to_token_stride_0=width,
                            req_to_token_stride_1=1,
                            req_pool_indices=torch.randint(0, rows, (bs,), generator=g, dtype=I64),
                            req_pool_indices_stride_0=1, cache_seqlens_int32=torch.full((bs,), -3, dtype=I32),
                            cache_seqlens_int32_stride_0=1, cu_seqlens_k=torch.full((bs + 1,), -4, dtype=I32),
                            cu_seqlens_k_stride_0=1, page_table=pt, page_table_stride_0=pt.stride(0),
                            page_table_stride_1=1, swa_page_table=spt,
                            swa_page_table_stride_0=spt.stride(0) if spt is not None else 0,
                            swa_page_table_stride_1=1 if spt is not None else 0,
                            full_to_swa_index_mapping=f2s if swa == "tokens" else None,
                            full_to_swa_mapping_stride_0=1 if swa == "tokens" else 0,
                            full_v2p=fv, full_v2p_stride_0=1 if fv is not None else 0,
                            swa_v2p=sv, swa_v2p_stride_0=1 if sv is not None else 0,
                            B=bs, max_seq_pages=max_pages, PAGE_SIZE=page, SEQ_LEN_DELTA=delta, BLOCK_COLS=block,
                            SKIP_PAGE_TABLE=skip, ZERO_TAIL=zero_tail)
                        grid = (1, 1) if skip else (bs, -(-max_pages // block))
                        yield (f"page={page} swa={swa} v2p={v2p} zero_tail={zero_tail} delta={delta} skip={skip}",
                               args, grid)
                        if swa == "tokens" and not v2p and delta == 0 and not skip:
                            yield (f"page={page} swa=tokens zero_tail={zero_tail}: column-major tables, a grid "
                                   f"of fewer column blocks than pages", _column_major(args), (bs, 2))


def _column_major(args: dict) -> dict:
    """The same launch over page tables laid out column by column (row stride 1, column stride the rows: a block
    that strides cannot hold as rows, so stored through offsets)."""
    out = dict(args)
    for name in ("page_table", "swa_page_table"):
        t = args[name]
        ct = t.t().contiguous().t()
        out[name], out[f"{name}_stride_0"], out[f"{name}_stride_1"] = ct, ct.stride(0), ct.stride(1)
    return out


def _trtllm_graph_metadata_cases(g: torch.Generator):
    rows, width, pool = 6, 40, 64
    for page in (1, 4):
        for swa in (False, True):
            for swa_out in (False, True):
                for q_mode in (0, 1, 2):
                    for skip, offset in ((0, 0), (0, 1), (1, 0)):
                        bs, block = 5, 4
                        max_pages = width // page - 2
                        seq = torch.randint(0, width - 1, (bs,), generator=g, dtype=I64)
                        seq[1] = 0
                        table = torch.randint(-1, pool, (rows, width), generator=g, dtype=I32)
                        mapping = torch.randint(-1, pool // 2, (pool + page + 1,), generator=g, dtype=I64)
                        n_out, out_len = 7, 10
                        out = torch.randint(-1, pool, (n_out,), generator=g, dtype=I64)
                        cu_q = torch.full((bs + 1,), -2, dtype=I32)
                        args = {
                            "req_pool_indices_ptr": torch.randint(0, rows, (bs,), generator=g, dtype=I64),
                            "seq_lens_ptr": seq, "req_to_token_ptr": table,
                            "swa_mapping_ptr": mapping if (swa or swa_out) else None,
                            "out_cache_loc_ptr": out if swa_out else None,
                            "qlens_ptr": torch.randint(1, 4, (bs,), generator=g, dtype=I32) if q_mode == 1 else None,
                            "cache_seqlens_ptr": torch.full((bs,), -3, dtype=I32),
                            "cu_seqlens_k_ptr": torch.full((bs + 1,), -4, dtype=I32),
                            "cu_seqlens_q_ptr": cu_q if q_mode else None,
                            "page_table_ptr": torch.full((bs, max_pages + 2), -5, dtype=I32),
                            "swa_page_table_ptr": torch.full((bs, max_pages + 2), -6, dtype=I32) if swa else None,
                            "swa_out_cache_loc_ptr": torch.full((out_len,), -7, dtype=I64) if swa_out else None,
                            "bs": bs, "seqlen_offset": offset, "max_seq_pages": max_pages, "q_stride": 3,
                            "num_out_tokens": n_out if swa_out else 0, "swa_out_len": out_len if swa_out else 0,
                            "req_to_token_stride": width, "page_table_stride": max_pages + 2,
                            "swa_page_table_stride": max_pages + 2 if swa else 0, "PAGE_SIZE": page,
                            "HAS_SWA": swa, "HAS_SWA_OUT": swa_out, "Q_MODE": q_mode, "PAGE_BLOCK": block,
                            "BS_BLOCK": 8, "SKIP_PAGE_TABLE": skip}
                        grid = (bs + 1 + (-(-out_len // block) if swa_out else 0),)
                        yield (f"page={page} swa={swa} swa_out={swa_out} q_mode={q_mode} skip={skip} "
                               f"offset={offset}", args, grid)


def _page_scatter_cases(g: torch.Generator, ragged: bool):
    rows, width, pool = 6, 48, 64
    for page in (1, 4):
        for swa in (False, True):
            for draft in ((0,) if ragged else (0, 3)):
                for short_grid in (False, True):
                    bs, block = 5, 4
                    seq = torch.randint(0, width - 4, (bs,), generator=g, dtype=I64)
                    seq[2] = 0
                    pages = -(-(seq + draft) // page)
                    blocks = max(1, -(-int(pages.max()) // block))
                    grid = (bs, max(1, blocks - 1) if short_grid else blocks)
                    dest_w = int(pages.max()) + 3
                    mapping = torch.randint(0, pool // 2, (pool + 1,), generator=g, dtype=I64) if swa else None
                    dest = torch.full((bs, dest_w), -5, dtype=I32)
                    sw = torch.full((bs, dest_w), -6, dtype=I32) if swa else None
                    if ragged:
                        indptr = torch.zeros(bs + 1, dtype=I32)
                        indptr[1:] = torch.cumsum(seq, 0)
                        args = dict(kv_flat_ptr=torch.randint(0, pool, (int(indptr[-1]) + 1,), generator=g, dtype=I32),
                                    kv_indptr_ptr=indptr, dest_ptr=dest, dest_stride=dest_w, sw_page_table_ptr=sw,
                                    swa_slot_mapping_ptr=mapping, PAGE_SIZE=page, BLOCK_SIZE=block, HAS_SWA=swa)
                    else:
                        args = dict(req_to_token_ptr=torch.randint(0, pool, (rows, width), generator=g, dtype=I32),
                                    req_pool_indices_ptr=torch.randint(0, rows, (bs,), generator=g, dtype=I64),
                                    seq_lens_ptr=seq, page_table_ptr=dest, req_to_token_stride=width,
                                    page_table_stride=dest_w, sw_page_table_ptr=sw, swa_slot_mapping_ptr=mapping,
                                    DRAFT_NUM=draft, PAGE_SIZE=page, BLOCK_SIZE=block, HAS_SWA=swa)
                    yield f"page={page} swa={swa} draft={draft} short_grid={short_grid}", args, grid


def _trtllm_page_table_cases(g: torch.Generator):
    """Page sizes 1 and 64 over rows of two 4096-token blocks and more, zero lengths, tokens of -1 and past the SWA
    mapping's end (the kernel clamps its index), grids one block short."""
    rows, width, bs, pool = 5, 2 * 4096 + 128, 4, 300
    for page in (1, 64):
        for swa in (False, True):
            for short_grid in (False, True):
                seq = torch.randint(0, width, (bs,), generator=g, dtype=I32)
                seq[1], seq[2] = 0, width - 1
                n_pages = -(-width // page) + 2
                blocks = -(-(-(-int(seq.max()) // page)) // (4096 // page))
                f2s = torch.randint(-1, pool, (pool - 40,), generator=g, dtype=I64) if swa else None
                args = dict(req_to_token_ptr=torch.randint(-1, pool, (rows, width), generator=g, dtype=I32),
                            req_pool_indices_ptr=torch.randint(0, rows, (bs,), generator=g, dtype=I64),
                            seq_lens_ptr=seq, full_to_swa_ptr=f2s,
                            page_table_ptr=torch.full((bs, n_pages), -5, dtype=I32),
                            swa_page_table_ptr=torch.full((bs, n_pages), -6, dtype=I32) if swa else None,
                            full_to_swa_numel=f2s.numel() if swa else 0, req_to_token_stride=width,
                            page_table_stride=n_pages, PAGE_SIZE=page, HAS_SWA=swa)
                grid = (bs, max(1, blocks - 1) if short_grid else blocks)
                yield f"page={page} swa={swa} short_grid={short_grid}", args, grid


def _draft_common(g: torch.Generator, page: int, eps: int, translate: bool, bs: int, topk: int, steps: int):
    """A draft launch's inputs: token-table rows (or page entries, ``eps`` > 1), lengths (a zero one), positions as
    the branches' lengths, and a page table for ``translate``."""
    rows, width, pool = 6, 64, 96
    seq = torch.randint(0, 40, (bs,), generator=g, dtype=I64)
    seq[1 % bs] = 0
    table = torch.randint(-1 if translate else 0, pool // eps, (rows, width), generator=g, dtype=I32)
    v2p = torch.randint(-1, pool // page + 1, (pool // page + 2,), generator=g, dtype=I64) if translate else None
    branches = seq.repeat_interleave(topk)
    npow = lambda n: 1 << max(0, (n - 1).bit_length())      # noqa: E731 (next_power_of_2)
    return dict(req_pool_indices=torch.randint(0, rows, (bs,), generator=g, dtype=I64), req_to_token=table,
                paged_kernel_lens=seq, positions=branches, row_stride=width, bs_upper=npow(bs),
                iter_upper=npow(steps), num_tokens_upper=npow(bs * topk), page_size=page, ENTRY_PAGE_SIZE=eps,
                v2p=v2p, TRANSLATE=translate)


def _draft_kv_indices_cases(g: torch.Generator):
    for page, eps, translate in ((1, 1, False), (4, 1, False), (4, 4, False), (4, 1, True)):
        for topk in (1, 2):
            for window, sink, split in ((0, 0, 0), (8, 2, 2)):        # (a window with sinks, a token-block split)
                bs, steps = 4, 3
                args = _draft_common(g, page, eps, translate, bs, topk, steps)
                width = bs * topk * (64 + steps) + 8
                args.update(kv_indices=torch.full((steps, width), -9, dtype=I64),
                            kv_indptr=torch.full((steps, bs * topk + 1), -8, dtype=I32),
                            kv_indices_stride=width, kv_indptr_stride=bs * topk + 1, window_size=window,
                            sink_size=sink, NUM_STEPS=steps if split else 0)
                grid = (steps * max(split, 1), bs, topk)
                yield (f"page={page} eps={eps} translate={translate} topk={topk} window={window} "
                       f"split={split}"), args, grid


def _draft_window_kv_indices_cases(g: torch.Generator):
    for page, eps, translate in ((1, 1, False), (4, 1, False), (4, 4, False), (4, 1, True)):
        for topk, window in ((1, 5), (2, 24)):
            bs, steps = 4, 3
            args = _draft_common(g, page, eps, translate, bs, topk, steps)
            width = bs * topk * window + 8
            args.update(window_kv_indices=torch.full((steps, width), -9, dtype=I64),
                        window_kv_indptr=torch.full((steps, bs * topk + 1), -8, dtype=I32),
                        kv_indices_stride=width, kv_indptr_stride=bs * topk + 1, window=window)
            yield f"page={page} eps={eps} translate={translate} topk={topk} window={window}", args, (steps, bs, topk)


def _draft_extend_metadata_cases(g: torch.Generator):
    """Page sizes 1 and 4, with and without the SWA mapping, a zero length, grids of one and two column blocks (a
    table wider than one block) and column-major tables."""
    rows, width, pool = 6, 48, 64
    for page in (1, 4):
        for swa in (False, True):
            for block_cols, column_major in ((256, False), (4, False), (4, True)):
                bs, tpr = 5, 3
                max_pages = width // page - 2
                seq = torch.randint(0, width - 1, (bs,), generator=g, dtype=I64)
                seq[2] = 0
                pt = torch.full((bs, max_pages), -5, dtype=I32)
                spt = torch.full((bs, max_pages), -6, dtype=I32) if swa else None
                if column_major:
                    pt = pt.t().contiguous().t()
                    spt = spt.t().contiguous().t() if swa else None
                args = dict(
                    seq_lens=seq, seq_lens_stride_0=1,
                    extend_seq_lens=torch.randint(0, 4, (bs,), generator=g, dtype=I32), extend_seq_lens_stride_0=1,
                    req_to_token=torch.randint(0, pool, (rows, width), generator=g, dtype=I32),
                    req_to_token_stride_0=width, req_to_token_stride_1=1,
                    req_pool_indices=torch.randint(0, rows, (bs,), generator=g, dtype=I64),
                    req_pool_indices_stride_0=1, cache_seqlens_int32=torch.full((bs,), -3, dtype=I32),
                    cache_seqlens_int32_stride_0=1, cu_seqlens_k=torch.full((bs + 1,), -4, dtype=I32),
                    cu_seqlens_k_stride_0=1, cu_seqlens_q=torch.full((bs + 1,), -2, dtype=I32),
                    cu_seqlens_q_stride_0=1, page_table=pt, page_table_stride_0=pt.stride(0),
                    page_table_stride_1=pt.stride(1),
                    full_to_swa_index_mapping=(torch.randint(0, pool // 2, (pool + 1,), generator=g, dtype=I64)
                                               if swa else None),
                    swa_page_table=spt, out_cache_loc=torch.randint(0, pool, (bs * tpr,), generator=g, dtype=I64)
                    if swa else None, swa_out_cache_loc=torch.full((bs * tpr,), -7, dtype=I64) if swa else None,
                    B=bs, max_seq_pages=max_pages, tokens_per_req=tpr if swa else 0, PAGE_SIZE_ONE=page == 1,
                    SHIFT=page.bit_length() - 1 if page > 1 else 0, BLOCK_COLS=block_cols, HAS_SWA=swa,
                    OUT_BLOCK=4 if swa else 1)
                grid = (bs, max(1, -(-max_pages // block_cols)))
                yield f"page={page} swa={swa} block_cols={block_cols} column_major={column_major}", args, grid


CASES = {"create_flashinfer_kv_indices_triton": _kv_indices_cases,
         "_fused_decode_metadata_kernel": _decode_metadata_cases,
         "update_trtllm_mha_graph_metadata_kernel": _trtllm_graph_metadata_cases,
         "scatter_req_to_token_to_page_table_kernel": lambda g: _page_scatter_cases(g, ragged=False),
         "scatter_ragged_to_page_table_kernel": lambda g: _page_scatter_cases(g, ragged=True),
         "create_trtllm_mha_kv_indices_triton": _trtllm_page_table_cases,
         "generate_draft_decode_kv_indices": _draft_kv_indices_cases,
         "generate_draft_decode_window_kv_indices": _draft_window_kv_indices_cases,
         "_draft_extend_metadata_kernel": _draft_extend_metadata_cases}
