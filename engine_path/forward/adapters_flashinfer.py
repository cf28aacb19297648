"""flashinfer and trtllm_mha (its subclass): the release's own backends, with flashinfer's library replaced.

On a CPU the release never imports flashinfer (``is_flashinfer_available()`` needs CUDA), so the names its
backend module binds from it do not exist there; they are set in the module's namespace
(``sglang.srt.layers.attention.flashinfer_backend``):

* the wrappers (``BatchPrefillWithRaggedKVCacheWrapper``, ``BatchPrefillWithPagedKVCacheWrapper``,
  ``BatchDecodeWithPagedKVCacheWrapper``) are :class:`PlannedWrapper` s: ``plan`` / ``begin_forward`` records what
  the backend's indices updaters hand it (the read table), ``run`` / ``forward`` returns zeros;
* ``_safe_merge_state`` (the ragged + paged merge) returns the ragged part; ``fast_decode_plan`` and
  ``fast_prefill_plan`` (the decode and draft-extend graphs' replay plans) record as the wrappers' plan does;
* the module's ``torch`` makes a tensor asked for on ``"cuda"`` on the CPU (the decode updater allocates
  ``kv_indices`` with ``device="cuda"``).

trtllm_mha's kernels come from ``flashinfer.decode`` / ``flashinfer.prefill``: its module's ``flashinfer`` is a
namespace of zero-output stand-ins, and its multi-CTA KV counter (sized by flashinfer's device utilities) a
one-byte buffer.

Read tables (:func:`flashinfer_reads`): wrapper 0 serves the SWA layers, wrapper 1 the full ones
(``_get_wrapper_idx``); each planned ``kv_indptr`` / ``kv_indices`` (token ids, page size 1; the SWA wrapper's
already translated to SWA ids) holds per request the positions that end at the paged part's end: the
prefix's end in a ragged extend (the new tokens are read from K/V directly), the sequence's in a paged-only
extend and in an EAGLE draft extend (its window included), the token's in a decode (a draft step's: its
position), the committed length plus the window in a verify. (0.5.23's verify and draft-extend-graph SWA tables
gather from position 0, not the window: F1, sglang#39287, open; docs/ENGINE.md.) trtllm_mha
(:func:`trtllm_reads`) reads its page tables (``page_table`` / ``swa_page_table``, page ids) with
``cache_seqlens`` and ``window_left = sliding_window_size``.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import types

import torch

from simulator.designs.types import ReadTable

from .adapters_base import (SPAN_FA, SPAN_RAGGED, Adapter, Piece, attention_output, csr_ending_at, lens_of,
                            page_table_reads)

FI = "sglang.srt.layers.attention.flashinfer_backend"
TRTLLM = "sglang.srt.layers.attention.trtllm_mha_backend"


class PlannedWrapper:
    """Stands in for a flashinfer attention wrapper: :meth:`plan` records the KV table it was handed,
    :meth:`run` returns zeros shaped like the query (with a zero LSE for ``*_return_lse``)."""

    #: where ``kv_indptr`` / ``kv_indices`` sit among plan's positional arguments
    KV_ARGS = (1, 2)
    is_cuda_graph_enabled = False
    _custom_mask_buf = None

    def __init__(self, *args, **kwargs):
        self.kv_indptr = self.kv_indices = None
        self.window_left = -1

    def plan(self, *args, **kwargs) -> None:
        ip, ix = self.KV_ARGS
        self.kv_indptr = args[ip].clone()       # flashinfer's plan copies indptr to the host at plan time
        self.kv_indices = args[ix]              # the kernel reads kv_indices when it runs
        self.window_left = kwargs.get("window_left", -1)

    begin_forward = plan

    def run(self, q, *args, **kwargs):
        return attention_output(q)

    forward = run

    def run_return_lse(self, q, *args, **kwargs):
        return attention_output(q, return_lse=True)[:2]

    forward_return_lse = run_return_lse

    def end_forward(self) -> None:
        return None


class PlannedDecodeWrapper(PlannedWrapper):
    KV_ARGS = (0, 1)        # decode plan: (kv_indptr, kv_indices, kv_last_page_len, ...)


def merge_state_first(v_a, s_a, v_b, s_b):
    """Stands in for ``_safe_merge_state``: the merged output is not on the write path."""
    return v_a, s_a


def fast_decode_plan(wrapper, *args, **kwargs) -> None:
    """Stands in for flashinfer's ``fast_decode_plan``, the decode wrappers' plan once a decode graph is captured
    (the release binds ``partial(fast_decode_plan, wrapper)`` as ``begin_forward`` at capture): what it is handed
    is recorded as :meth:`PlannedDecodeWrapper.plan` records it (flashinfer's own plan without its host checks;
    the KV table it is handed is the one the replayed kernels read)."""
    wrapper.plan(*args, **kwargs)


def fast_prefill_plan(wrapper, *args, **kwargs) -> None:
    """Stands in for the release's ``fast_prefill_plan``, the draft-extend (and verify) graph wrappers' sync-free
    plan once captured (bound as ``begin_forward`` at capture, like :func:`fast_decode_plan`): it calls flashinfer's
    compiled planner with host-known lengths, so here it records what it is handed as the prefill wrapper's plan
    does (``(qo_indptr, paged_kv_indptr, paged_kv_indices, ...)``: the same positions)."""
    wrapper.plan(*args, **kwargs)


def _host(device):
    return "cpu" if device is not None and str(device).startswith("cuda") else device


def _on_host(fn):
    def make(*args, device=None, **kwargs):
        return fn(*args, device=_host(device), **kwargs)
    make.__name__ = fn.__name__
    return make


class TorchOnHost(types.ModuleType):
    """``torch`` for a module that hard-codes ``device="cuda"``: torch itself, except that its factories make a
    tensor asked for on "cuda" on the CPU."""

    def __init__(self):
        super().__init__("torch", "torch, with factories' device='cuda' made on the CPU (slotscope)")
        for name in ("empty", "zeros", "ones", "full", "arange", "tensor"):
            setattr(self, name, _on_host(getattr(torch, name)))

    def __getattr__(self, name):
        return getattr(torch, name)


def counter_buffer(device, **kwargs) -> torch.Tensor:
    """Stands in for ``make_persistent_multi_ctas_kv_counter_buffer`` (sized through flashinfer's CUDA device
    utilities; only trtllm-gen's decode kernel, replaced here, uses it)."""
    return torch.zeros(1, dtype=torch.uint8, device=device)


#: flashinfer's kernels as trtllm_mha calls them
TRTLLM_FLASHINFER = types.SimpleNamespace(
    decode=types.SimpleNamespace(trtllm_batch_decode_with_kv_cache=attention_output),
    prefill=types.SimpleNamespace(trtllm_batch_context_with_kv_cache=attention_output,
                                  trtllm_fmha_v2_prefill=attention_output))

FI_SHIMS = {
    f"{FI}:BatchPrefillWithRaggedKVCacheWrapper": "flashinfer's ragged prefill wrapper (its run is the attention "
                                                  "arithmetic; flashinfer needs CUDA): zeros",
    f"{FI}:BatchPrefillWithPagedKVCacheWrapper": "flashinfer's paged prefill wrapper: plan records the KV table it "
                                                 "is handed (the read table), run returns zeros",
    f"{FI}:BatchDecodeWithPagedKVCacheWrapper": "flashinfer's decode wrapper: plan records the KV table, run "
                                                "returns zeros",
    f"{FI}:_safe_merge_state": "flashinfer's merge of the ragged and paged outputs (arithmetic): the first",
    f"{FI}:fast_decode_plan": "flashinfer's decode-graph replay plan (bound as begin_forward at capture): records "
                              "the KV table it is handed, as the decode wrapper's plan",
    f"{FI}:fast_prefill_plan": "the release's sync-free prefill plan of a captured draft-extend graph (it calls "
                               "flashinfer's compiled planner): records the KV table it is handed, as the prefill "
                               "wrapper's plan",
    f"{FI}:torch": "torch with device='cuda' factories made on the CPU (the decode updater's kv_indices)",
}


class FlashInferAdapter(Adapter):
    def install(self, bag) -> None:
        fi = importlib.import_module(FI)
        fi.BatchPrefillWithRaggedKVCacheWrapper = PlannedWrapper
        fi.BatchPrefillWithPagedKVCacheWrapper = PlannedWrapper
        fi.BatchDecodeWithPagedKVCacheWrapper = PlannedDecodeWrapper
        fi._safe_merge_state = merge_state_first
        fi.fast_decode_plan = fast_decode_plan
        fi.fast_prefill_plan = fast_prefill_plan
        if str(bag.device) == "cpu" and not isinstance(fi.torch, TorchOnHost):
            fi.torch = TorchOnHost()
        elif str(bag.device) != "cpu" and isinstance(fi.torch, TorchOnHost):
            fi.torch = torch
        if self.name == "trtllm_mha":
            tm = importlib.import_module(TRTLLM)
            tm.flashinfer = TRTLLM_FLASHINFER
            tm.make_persistent_multi_ctas_kv_counter_buffer = counter_buffer

    def view(self, bag):
        got = types.SimpleNamespace(**vars(bag))
        got.prefill_attention_backend_str = got.decode_attention_backend_str = self.name
        if str(bag.device) == "cpu" and bag.spec_algorithm is not None and bag.spec_algorithm.is_eagle():
            got.plan_stream_for_flashinfer = HOST_STREAM
        return got

    def construct(self, bag, steps=None):
        """The release's constructor; where flashinfer is a slotscope stub (a GPU image without it), its
        tensor-core probe (``should_use_tensor_core`` calls flashinfer's compiled-kernel query) answers from
        the release's own environment override, for the constructor only (:data:`TENSOR_CORE_WHY`)."""
        if importlib.util.find_spec("flashinfer") is None or \
                importlib.machinery.PathFinder.find_spec("flashinfer") is not None or TENSOR_CORE_ENV in os.environ:
            return super().construct(bag, steps)
        os.environ[TENSOR_CORE_ENV] = "false"
        try:
            return super().construct(bag, steps)
        finally:
            os.environ.pop(TENSOR_CORE_ENV, None)

    def pieces(self, device: str = "cpu"):
        out = super().pieces(device)
        if device != "cpu" and self.stand_ins(device):
            out.append(Piece(f"environment {TENSOR_CORE_ENV}=false during the constructor", "model", TENSOR_CORE_WHY))
        return out


#: what the registry's flashinfer factory keeps as the runner's plan stream under EAGLE, on a CPU (it makes a
#: ``torch.cuda.Stream``; no 0.5.23 code reads it)
HOST_STREAM = types.SimpleNamespace(name="slotscope's stand-in for the flashinfer plan stream (no CUDA here)")
PLAN_STREAM_WHY = ("plan_stream_for_flashinfer: a placeholder on a CPU under EAGLE (the registry's factory makes a "
                   "torch.cuda.Stream there, which no 0.5.23 code reads)")

TENSOR_CORE_ENV = "SGLANG_FLASHINFER_USE_TENSOR_CORE"
TENSOR_CORE_WHY = ("flashinfer is not installed here and its compiled-kernel probe is a stub; the flag picks only "
                   "the decode wrapper's kernel, which is replaced")


def flashinfer_reads(backend, fb, bs: int):
    """The planned tables of wrapper 0 (SWA) and 1 (full), or of the one wrapper of a backend without a window (an
    EAGLE draft of full layers); see the module docstring."""
    m = backend.forward_metadata
    decode = fb.forward_mode.is_decode_or_idle()
    wrappers = m.decode_wrappers if decode else m.prefill_wrappers
    if any(w.kv_indptr is None for w in wrappers[:2]):
        return None
    if decode:       # a decode's table ends at its token (an EAGLE draft step's too: its position)
        end = fb.positions[:bs].to(torch.int64) + 1
    elif fb.forward_mode.is_target_verify():         # seq_lens are the committed lengths; it reads its window too
        end = fb.seq_lens[:bs] + fb.spec_info.draft_token_num
    else:
        end = fb.extend_prefix_lens if m.use_ragged else fb.seq_lens
    tables = [csr_ending_at(w.kv_indptr, w.kv_indices, end, bs) for w in wrappers[:2]]
    if len(tables) == 1:
        return ReadTable(full=tables[0], swa=None)
    return ReadTable(full=tables[1], swa=tables[0])


def trtllm_reads(backend, fb, bs: int):
    """trtllm_mha's page tables, positions bounded by ``cache_seqlens`` and its kernels' ``window_left``."""
    m = backend.forward_metadata
    if m is None or m.page_table is None:
        return None
    left = backend.indices_updater_decode.sliding_window_size
    return page_table_reads(m.page_table[:bs], None if m.swa_page_table is None else m.swa_page_table[:bs],
                            m.cache_seqlens_int32[:bs], lens_of(m.cu_seqlens_q, bs), backend.page_size, left)


_PLANNED = "the flashinfer wrappers' plan (PlannedWrapper records kv_indptr / kv_indices)"

FLASHINFER = FlashInferAdapter(
    "flashinfer", multistep=f"{FI}:FlashInferMultiStepDraftBackend", reads=flashinfer_reads, span=SPAN_RAGGED,
    round_reads=True,
    shims=dict(FI_SHIMS), needs=("flashinfer",),
    stand_in={"prefill/decode_attention_backend_str": "the backend's own name (the run's stand-in says triton)",
              "plan_stream_for_flashinfer (under EAGLE, on a CPU)": PLAN_STREAM_WHY})

TRTLLM_MHA = FlashInferAdapter(
    "trtllm_mha", multistep=f"{TRTLLM}:TRTLLMHAAttnMultiStepDraftBackend", reads=trtllm_reads, span=SPAN_FA,
    round_reads=True,
    needs=("flashinfer",),
    shims={**FI_SHIMS,
           f"{TRTLLM}:flashinfer": "flashinfer's trtllm-gen kernels (trtllm_batch_decode_with_kv_cache, "
                                  "trtllm_batch_context_with_kv_cache, trtllm_fmha_v2_prefill: the attention "
                                  "arithmetic): zero outputs",
           f"{TRTLLM}:make_persistent_multi_ctas_kv_counter_buffer": "sized by flashinfer's CUDA device utilities, "
                                                                     "used by the replaced decode kernel: 1 byte"},
    stand_in={"prefill/decode_attention_backend_str": "the backend's own name (the run's stand-in says triton)"})
