"""Per backend of the release: how it is built over the runner stand-in, what of it cannot run here and is
replaced (named in ``engine_pieces``), and where its forward keeps the tables its attention reads.

An :class:`Adapter` (engine_path/forward/adapters_base.py) is the only backend-specific code of the engine
forward: the metadata, the write locations and the narrowing are the release's own for every backend it covers.
A backend without an adapter stays the model's boundary in engine mode, and the run says so (``engine_pieces``,
per backend and piece). The table :data:`ADAPTERS` covers all eight modelled backends:

=================  ==============================  ===========================================================
backend            module                          read tables
=================  ==============================  ===========================================================
triton             here                            ``kv_indices`` / ``window_kv_indices`` (:func:`triton_reads`)
torch_native       here                            none: its forward indexes ``req_to_token`` itself
flashinfer         adapters_flashinfer.py          the wrappers' planned ``kv_indptr`` / ``kv_indices``
trtllm_mha         adapters_flashinfer.py          ``page_table`` / ``swa_page_table`` + ``cache_seqlens``
flashattention     adapters_fa.py                  ``page_table`` / ``swa_page_table`` + ``cache_seqlens``
musa               adapters_fa.py                  FA's (it inherits ``init_forward_metadata``)
xpu                adapters_fa.py                  its FA-shaped ``page_table`` / ``swa_page_table``
aiter              adapters_aiter.py               unified_attention's block tables + ``seq_lens``; its KV write
                                                   recorded in ``launch_reshape_and_cache_flash``
=================  ==============================  ===========================================================
"""
from __future__ import annotations

from typing import Optional

import torch

from simulator.designs.types import ReadTable

from .adapters_aiter import AITER
from .adapters_base import Adapter, Piece, csr, csr_ending_at
from .adapters_fa import FLASHATTENTION, MUSA, XPU
from .adapters_flashinfer import FLASHINFER, TRTLLM_MHA

__all__ = ["ADAPTERS", "Adapter", "Piece", "triton_reads"]


def triton_reads(backend, fb, bs: int) -> Optional[ReadTable]:
    """triton's tables: ``kv_indptr`` / ``kv_indices`` (full layers: the prefix in extend, the whole sequence in
    decode, from position 0) and ``window_kv_indptr`` / ``window_kv_indices`` (SWA layers, already SWA ids: the
    last entries before the window's end, which is the prefix's end in extend and the sequence's in decode)."""
    m = backend.forward_metadata
    if m is None or m.kv_indptr is None:
        return None
    full = csr(m.kv_indptr, m.kv_indices, torch.zeros(bs, dtype=torch.int64), bs)
    swa = None
    if m.window_kv_indptr is not None and m.window_kv_indices is not None:
        end = fb.seq_lens if fb.forward_mode.is_decode() else fb.extend_prefix_lens
        swa = csr_ending_at(m.window_kv_indptr, m.window_kv_indices, end, bs)
    return ReadTable(full=full, swa=swa)


def pdl_unsupported() -> bool:
    """Stands in for sgl_kernel's ``is_arch_support_pdl`` where sgl_kernel is not installed: no PDL launches."""
    return False


#: the adapters written so far, by backend
ADAPTERS: dict[str, Adapter] = {
    "torch_native": Adapter(
        "torch_native",
        # its SDPA runs as released: on the hybrid pool it gathers an SWA layer's K/V at req_to_token's full-pool
        # ids, an IndexError once a full slot passes the SWA pool's size (the run records the release's crash)
        reads_why="torch_native builds no read table: its forward indexes req_to_token itself"),
    "triton": Adapter(
        "triton",
        replaced={"extend_attention_fwd": "a Triton kernel (interpreted on a CPU: too slow for a run)",
                  "extend_attention_fwd_unified": "a Triton kernel", "decode_attention_fwd": "a Triton kernel"},
        reads=triton_reads,
        platform={"sglang.srt.layers.attention.triton_backend:is_arch_support_pdl": (
            pdl_unsupported, "sgl_kernel's query whether the GPU supports programmatic dependent launch (a launch "
                             "option of the attention kernels): False, as where sgl_kernel is absent")}),
    "flashinfer": FLASHINFER,
    "trtllm_mha": TRTLLM_MHA,
    "flashattention": FLASHATTENTION,
    "musa": MUSA,
    "xpu": XPU,
    "aiter": AITER,
}
