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

import importlib
import os
from typing import Optional

import torch

from simulator.designs.types import ReadTable

from .adapters_aiter import AITER
from .adapters_base import SPAN_TRITON, Adapter, Piece, csr, csr_ending_at
from .adapters_fa import FLASHATTENTION, MUSA, XPU
from .adapters_flashinfer import FLASHINFER, TRTLLM_MHA

__all__ = ["ADAPTERS", "Adapter", "Piece", "triton_reads"]


#: torch_native's own SDPA loops, which gather each request's K/V at ``req_to_token[row, start:end]``
SDPA_GATHERS = ("_run_sdpa_forward_extend", "_run_sdpa_forward_decode")

GATHER_GUARD_WHY = ("on a GPU its K/V gathers (k_cache[req_to_token[row, :seq_len]]) are bounds-checked on the host "
                    "before the release's own SDPA runs: a gather past the buffer raises the IndexError a CPU run "
                    "raises (this backend's design_error) instead of a device-side assert, which would end every "
                    "backend's run in the process")


TORCH_NATIVE = "sglang.srt.layers.attention.torch_native_backend"
#: set to 1 to run torch_native's SDPA and its window mask as released on a CPU too
RELEASE_SDPA_ENV = "SLOTSCOPE_TORCH_NATIVE_SDPA"
SDPA_WHY = ("torch's scaled_dot_product_attention over each request's whole sequence with the release's dense "
            "seq x seq window mask, per layer: 17.4 s of a 38.1 s engine run of 120 requests of the scale scenario on "
            "a CPU, its output feeding nothing on the write path; stood in by the checks SDPA makes of its "
            "arguments' shapes (query, key, value, mask), returning zeros. The K/V gathers before it run as released; "
            f"{RELEASE_SDPA_ENV}=1 runs both as released")


class WindowMask:
    """Stands in for the dense mask of ``_make_sliding_window_mask``: its shape and window, no elements."""

    def __init__(self, *, q_len, kv_len, sliding_window_size, device=None, query_offset=0):
        self.shape = torch.Size((int(q_len), int(kv_len)))
        self.window, self.query_offset = int(sliding_window_size), int(query_offset)


def sdpa_shapes_only(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                     enable_gqa=False):
    """torch's ``scaled_dot_product_attention`` without the arithmetic: its shape checks (a mismatch raises
    RuntimeError, as SDPA does), then zeros of the output's shape ``(..., L, Ev)``."""
    q, k, v = query.shape, key.shape, value.shape
    problems = []
    if not (query.dim() == key.dim() == value.dim() >= 2):
        problems.append(f"query, key and value of {query.dim()}, {key.dim()} and {value.dim()} dimensions")
    elif q[-1] != k[-1]:
        problems.append(f"query {tuple(q)} and key {tuple(k)}: head sizes differ")
    elif query.dim() >= 3 and q[-3] != k[-3] and not (enable_gqa and q[-3] % k[-3] == 0):
        problems.append(f"{q[-3]} query heads over {k[-3]} key heads (enable_gqa={enable_gqa})")
    if attn_mask is not None and not problems:
        want = (q[-2], k[-2])
        got = tuple(attn_mask.shape[-2:])
        if any(g not in (w, 1) for g, w in zip(got, want)):
            problems.append(f"a mask of {tuple(attn_mask.shape)} for {want[0]} queries over {want[1]} keys")
    if problems:
        raise RuntimeError(f"scaled_dot_product_attention: {problems[0]}")
    return torch.zeros((*q[:-1], v[-1]), dtype=query.dtype, device=query.device)


class TorchNativeAdapter(Adapter):
    """torch_native: its forward as released, the K/V gathers included; on a CPU its SDPA arithmetic and dense
    window mask are stood in (:data:`SDPA_WHY`). On a GPU its SDPA runs as released, and a gather past the K/V
    buffer (an SWA layer gathered at full-pool ids: the release's own bug on a hybrid pool) would be a device-side
    assert that poisons the CUDA context of the whole run; each gather's ids are checked on the host first, so the
    backend gets the finding the CPU run gives and the other backends run on."""

    def stand_ins(self, device: str) -> bool:
        return super().stand_ins(device) and os.environ.get(RELEASE_SDPA_ENV) != "1"

    def install(self, bag) -> None:
        self._sdpa(sdpa_shapes_only)

    @staticmethod
    def _sdpa(fn=None) -> None:
        """Set the module's SDPA to ``fn`` (None: back to the one the release bound at import)."""
        m = importlib.import_module(TORCH_NATIVE)
        released = getattr(m, "_slotscope_released_sdpa", None)
        if released is None:
            released = m._slotscope_released_sdpa = m.scaled_dot_product_attention
        m.scaled_dot_product_attention = fn or released

    def kernel(self, attr: str):
        return WindowMask

    def build(self, bag, device: str, steps=None):
        if not self.stand_ins(device):
            self._sdpa()                # a stand-in set by an earlier build in this process is undone
        backend = super().build(bag, device, steps)
        if device != "cpu":
            for name in SDPA_GATHERS:
                fn = getattr(backend, name, None)
                if fn is not None:
                    setattr(backend, name, _gather_checked(fn))
        return backend

    def pieces(self, device: str = "cpu") -> list[Piece]:
        out = super().pieces(device)
        if device != "cpu":
            out.append(Piece("K/V gather bounds (before its SDPA)", "model", GATHER_GUARD_WHY))
        return out


def _gather_checked(fn):
    """``fn`` (a bound ``_run_sdpa_forward_*``) after a host check of the ids each request's gather takes."""
    import inspect

    sig = inspect.signature(fn)

    def checked(*args, **kwargs):
        a = sig.bind(*args, **kwargs).arguments
        k_cache, table = a["k_cache"], a["req_to_token"]
        rows, lens = a["req_pool_indices"].tolist(), a["seq_lens"].tolist()
        enc = a.get("encoder_lens")
        enc = enc.tolist() if enc is not None else None
        n = int(k_cache.shape[0])
        for i, (row, length) in enumerate(zip(rows, lens)):
            if enc is not None:
                start, end = (0, enc[i]) if a.get("is_cross_attn") else (enc[i], enc[i] + length)
            else:
                start, end = 0, length
            ids = table[row, start:end]
            if ids.numel():
                lo, hi = int(ids.min()), int(ids.max())
                bad = hi if hi >= n else lo if lo < -n else None
                if bad is not None:
                    raise IndexError(f"index {bad} is out of bounds for dimension 0 with size {n} (the K/V gather "
                                     f"of request row {row}, checked before the launch: on a GPU a device-side "
                                     f"assert)")
        return fn(*args, **kwargs)
    return checked


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
        # a decode's window ends at its token (an EAGLE draft step's too: its position), an extend's before its
        # first new token (a verify's prefix: its seq_lens, which exclude the window it writes)
        if fb.forward_mode.is_decode():
            end = fb.positions[:bs].to(torch.int64) + 1
        else:
            end = fb.extend_prefix_lens if fb.extend_prefix_lens is not None else fb.seq_lens
        swa = csr_ending_at(m.window_kv_indptr, m.window_kv_indices, end, bs)
    return ReadTable(full=full, swa=swa)


def pdl_unsupported() -> bool:
    """Stands in for sgl_kernel's ``is_arch_support_pdl`` where sgl_kernel is not installed: no PDL launches."""
    return False


#: the adapters written so far, by backend
ADAPTERS: dict[str, Adapter] = {
    "torch_native": TorchNativeAdapter(
        "torch_native",
        replaced={"_make_sliding_window_mask": "its dense seq x seq window mask, an input of SDPA only: " + SDPA_WHY},
        shims={f"{TORCH_NATIVE}:scaled_dot_product_attention": SDPA_WHY},
        # its SDPA runs as released: on the hybrid pool it gathers an SWA layer's K/V at req_to_token's full-pool
        # ids, an IndexError once a full slot passes the SWA pool's size (the run records the release's crash)
        reads_why="torch_native builds no read table: its forward indexes req_to_token itself"),
    "triton": Adapter(
        "triton", multistep="sglang.srt.layers.attention.triton_backend:TritonMultiStepDraftBackend", round_reads=True,
        replaced={"extend_attention_fwd": "a Triton kernel (interpreted on a CPU: too slow for a run)",
                  "extend_attention_fwd_unified": "a Triton kernel", "decode_attention_fwd": "a Triton kernel"},
        reads=triton_reads, span=SPAN_TRITON,
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
