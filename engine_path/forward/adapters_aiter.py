"""aiter (AMD): the release's backend, with aiter's kernels replaced and its KV write recorded in its own kernel.

* **Imports.** aiter_backend.py binds its kernels in ``try: from aiter import ... except ImportError``; on a CPU
  the names stay unbound. They are set in the module's namespace: the kernels the eager non-MLA paths call
  (``unified_attention``, ``mha_batch_prefill_func``, ``flash_attn_varlen_func``, ``paged_attention_ragged``, the
  3D-MTP decode) as zero-output stand-ins, ``reset_verify_attn_plan_cache`` (a cache of the verify kernel's plans)
  as a no-op, the MLA-only ones as stubs that raise.
* **The write.** With a hybrid SWA pool aiter never calls ``set_kv_buffer``: ``forward_extend`` /
  ``forward_decode`` hand ``launch_reshape_and_cache_flash`` (sglang/kernels/ops/kvcache/cache_ops.py) the
  layer's K/V, its cache buffers, ``out_cache_loc`` and, on an SWA layer, the whole ``full_to_swa`` mapping,
  which the kernel applies itself: token t goes to ``mapping[slot_mapping[t]]`` (``slot_mapping[t]`` on a full
  layer) for ``t < len(key)``, a negative slot skipped. :func:`record_write` stands in for it (module global
  ``launch_reshape_and_cache_flash``) and records those slots as the layer's write location, a
  ``KVWriteLoc(loc=slot_mapping[:len(key)], swa_loc=mapping[loc])`` (``swa_loc`` None on a full layer), in the
  capture pool's calls, as if ``set_kv_buffer`` had been called. It learns the layer from a probe around the
  backend's ``forward_extend`` / ``forward_decode`` (an instance attribute calling the release's method).

Read tables (:func:`aiter_reads`): unified_attention's block tables (page ids at page > 1; SWA layers' translated
to SWA ids) bounded by ``seqused_k = seq_lens``, the queries ``cu_seqlens_q`` long, window ``(sliding_window_size
- 1, 0)``: in decode the metadata's ``kv_indices`` / ``swa_page_table``, in extend the tables
``_forward_extend_unified`` builds per layer (the release's ``_build_extend_unified_page_table``, called once more
for the table).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import types
from dataclasses import dataclass

import torch

from simulator.designs.types import KVWriteLoc

from .adapters_base import SPAN_UNIFIED, Adapter, attention_output, lens_of, no_op, page_table_reads
from .runner import Capture

AITER_MOD = "sglang.srt.layers.attention.aiter_backend"

#: (layer id, the capture pool's calls) of the forward running now
_WRITING: contextvars.ContextVar = contextvars.ContextVar("slotscope_aiter_write", default=None)


def record_write(key, value, key_cache, value_cache, slot_mapping, swa_slot_mapping=None, k_scale=None,
                 v_scale=None) -> None:
    """Stands in for ``launch_reshape_and_cache_flash``: records the slots its kernel would write (see the module
    docstring) and writes nothing."""
    at = _WRITING.get()
    if at is None:
        raise RuntimeError("launch_reshape_and_cache_flash called outside a forward the aiter adapter probes")
    layer_id, calls = at
    n = int(key.shape[0])
    loc = slot_mapping[:n]
    if swa_slot_mapping is None:
        calls.append(Capture(layer_id, KVWriteLoc(loc, None), n))
    else:
        calls.append(Capture(layer_id, KernelMappedWrite(loc, swa_slot_mapping[loc.to(torch.int64)],
                                                         swa_slot_mapping), n))


@dataclass(frozen=True)
class KernelMappedWrite:
    """A write whose kernel maps each slot through the pool's mapping itself (``swa_loc`` is ``mapping[loc]`` when
    it ran): a captured graph replays the kernel, so its SWA slots are the mapping at the replay of what ``loc``
    (a view of the runner's static buffer) holds then (engine_path/forward/boundary.py ``_replayed``)."""

    loc: torch.Tensor
    swa_loc: torch.Tensor
    mapping: torch.Tensor        # the mapping the kernel was handed (a view of the pool's, or a patch's own)
    #: ``mapping`` is a view of the pool's mapping (set at a graph's capture): a replay reads the same view of the
    #: mapping registered then (in the engine one device mapping lives for the whole run)
    pool_view: bool = False


@contextlib.contextmanager
def writing(layer_id: int, calls: list):
    """While the block runs, :func:`record_write` records layer ``layer_id``'s writes into ``calls``."""
    token = _WRITING.set((layer_id, calls))
    try:
        yield
    finally:
        _WRITING.reset(token)


def _probe(method, calls):
    @functools.wraps(method)
    def forward(q, k, v, layer, forward_batch, *args, **kwargs):
        with writing(int(layer.layer_id), calls):
            return method(q, k, v, layer, forward_batch, *args, **kwargs)
    return forward


def unavailable(name: str):
    def stub(*args, **kwargs):
        raise RuntimeError(f"aiter's {name} is not available here (slotscope stub: an MLA / ROCm-only path)")
    stub.__name__ = name
    return stub


_OUTPUT = "an aiter kernel (the attention arithmetic; ROCm only): zeros like the query"
_INTO = "an aiter kernel writing into the output it is handed (ROCm only): a no-op"
_MLA = "an aiter MLA / planning kernel (not on this model's paths): raises"
#: the names aiter_backend.py's try-block binds, with their stand-ins
KERNELS = {
    "unified_attention": (no_op, _INTO), "paged_attention_ragged": (no_op, _INTO),
    "mha_batch_prefill_func": (attention_output, _OUTPUT), "flash_attn_varlen_func": (attention_output, _OUTPUT),
    "flash_attn_varlen_fp8_pertensor_func": (attention_output, _OUTPUT),
    "unified_attention_3d_mtp_decode_func": (no_op, "the gfx95 3D-MTP decode kernel (not reached on a CPU)"),
    "unified_attention_3d_mtp_func": (no_op, _INTO), "unified_attention_3d_mtp_ragged_func": (no_op, _INTO),
    "asm_verify_attn_enabled": (lambda *a, **k: False, "whether aiter's asm verify kernel serves: no"),
    "reset_verify_attn_plan_cache": (no_op, "clears a cache of the verify kernel's plans: nothing cached here"),
    **{n: (unavailable(n), _MLA) for n in ("get_mla_metadata_info_v1", "get_mla_metadata_v1", "get_ps_metadata_info_v1",
                                           "get_ps_metadata_v1", "mla_prefill_ps_asm_fwd", "mla_reduce_v1",
                                           "mla_decode_fwd", "mla_prefill_fwd")},
}


class AiterAdapter(Adapter):
    def view(self, bag):
        got = types.SimpleNamespace(**vars(bag))
        got.model_config = types.SimpleNamespace(**vars(bag.model_config), dtype=bag.dtype)
        return got

    def install(self, bag) -> None:
        m = importlib.import_module(AITER_MOD)
        for name, (fn, _) in KERNELS.items():
            setattr(m, name, fn)
        m.launch_reshape_and_cache_flash = record_write

    def finish(self, backend, bag) -> None:
        calls = bag.token_to_kv_pool.calls
        backend.forward_extend = _probe(backend.forward_extend, calls)
        backend.forward_decode = _probe(backend.forward_decode, calls)
        #: the layers' sliding_window_size (the backend keeps none of its own; its kernels' left window is it - 1)
        backend.slotscope_sliding_window_size = bag.sliding_window_size


def aiter_reads(backend, fb, bs: int):
    """unified_attention's block tables; see the module docstring."""
    m = backend.forward_metadata
    window = backend.slotscope_sliding_window_size
    left = window - 1 if window is not None else 0      # no window: an EAGLE draft of full layers
    if fb.forward_mode.is_decode_or_idle():
        if m is None or m.kv_indices is None or m.kv_indices.dim() != 2:
            return None
        full, swa, q_lens = m.kv_indices, m.swa_page_table, lens_of(m.qo_indptr, bs)
    else:
        max_kv_len = int(fb.seq_lens_cpu.max().item())
        full, swa = backend._build_extend_unified_page_table(bs, fb.seq_lens, fb.req_pool_indices, max_kv_len)
        q_lens = fb.extend_seq_lens[:bs]
    return page_table_reads(full[:bs], None if swa is None else swa[:bs], fb.seq_lens[:bs], q_lens,
                            backend.page_size, left)


AITER = AiterAdapter(
    "aiter", multistep=f"{AITER_MOD}:AiterMultiStepDraftBackend",
    replaced={"extend_attention_fwd": "a Triton kernel (target_verify / draft_extend; interpreted on a "
                                      "CPU: too slow for a run)"},
    reads=aiter_reads, span=SPAN_UNIFIED, needs=("aiter",),
    stand_in={"model_config.dtype": "the model's dtype (aiter reads it there; the run's stand-in has it on the runner "
                                    "only)"},
    shims={**{f"{AITER_MOD}:{n}": why for n, (_, why) in KERNELS.items()},
           f"{AITER_MOD}:launch_reshape_and_cache_flash": "the KV write kernel (a Triton kernel writing the K/V rows at "
                                                      "mapping[loc] itself): records the slots it would write as the "
                                                      "layer's KVWriteLoc, writes nothing",
           "backend.forward_extend / forward_decode": "a probe calling the release's method, telling the write "
                                                      "recorder which layer writes"})
