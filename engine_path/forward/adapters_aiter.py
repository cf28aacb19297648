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
for the table). An EAGLE round: the unified verify's block tables (``seqused_k = seq_lens + nd``), the unified
draft extend's (``_build_unified_page_table_from_spec`` of the metadata's ids, once more for the table), a draft
step's child's (built from the step's CSR ids, ``seq_lens + step + 1`` keys, while its ``forward_decode`` hands
the kernel ``seqused_k = forward_batch.seq_lens``: the step reads the committed keys only, not the draft chain's,
docs/ENGINE.md "aiter's EAGLE draft steps").
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import types
from dataclasses import dataclass
from typing import Optional

import torch

from simulator.designs.types import KVWriteLoc

from .adapters_base import SPAN_UNIFIED, Adapter, attention_output, lens_of, no_op, page_table_reads
from .runner import Capture

AITER_MOD = "sglang.srt.layers.attention.aiter_backend"

#: (layer id, the capture pool's calls, the forward batch) of the layer forward running now
_WRITING: contextvars.ContextVar = contextvars.ContextVar("slotscope_aiter_write", default=None)


def record_write(key, value, key_cache, value_cache, slot_mapping, swa_slot_mapping=None, k_scale=None,
                 v_scale=None) -> None:
    """Stands in for ``launch_reshape_and_cache_flash``: records the slots its kernel would write (see the module
    docstring) and writes nothing."""
    at = _WRITING.get()
    if at is None:
        raise RuntimeError("launch_reshape_and_cache_flash called outside a forward the aiter adapter probes")
    layer_id, calls, _ = at
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
def writing(layer_id: int, calls: list, fb=None):
    """While the block runs, :func:`record_write` records layer ``layer_id``'s writes into ``calls`` (and
    :func:`handed_unified_attention` its kernel call as forward ``fb``'s)."""
    token = _WRITING.set((layer_id, calls, fb))
    try:
        yield
    finally:
        _WRITING.reset(token)


def _probe(method, calls):
    @functools.wraps(method)
    def forward(q, k, v, layer, forward_batch, *args, **kwargs):
        with writing(int(layer.layer_id), calls, forward_batch):
            return method(q, k, v, layer, forward_batch, *args, **kwargs)
    return forward


#: (the forward batch, the block table, seqused_k) of unified_attention's last call
_HANDED: list = [None]


def handed_unified_attention(*args, block_table=None, seqused_k=None, **kwargs) -> None:
    """Stands in for ``unified_attention``: writes nothing into the output it is handed (the attention arithmetic)
    and keeps the block table and ``seqused_k`` it was handed, with the forward batch of the layer that called it,
    which a read table reads (:func:`aiter_reads`)."""
    at = _WRITING.get()
    _HANDED[0] = (None if at is None else at[2], block_table, seqused_k)


def handed_keys(fb, *tables) -> Optional[torch.Tensor]:
    """The ``seqused_k`` unified_attention was handed by a layer of forward ``fb`` with one of ``tables`` (the
    metadata's own) for its block table: the last call, where this forward ran its kernel (an eager forward's
    first layer runs before its reads are asked; a graph replay runs none here). None: it did not."""
    got = _HANDED[0]
    if got is None or got[0] is not fb or got[1] is None or not any(got[1] is t for t in tables if t is not None):
        return None
    return got[2]


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
    "unified_attention": (handed_unified_attention, _INTO + "; the block table and key counts it is handed kept "
                                                    "for the read table"),
    "paged_attention_ragged": (no_op, _INTO),
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
    mode = fb.forward_mode
    if m is None:
        return None
    if mode.is_target_verify():
        # the unified verify (topk 1): the metadata's block tables over seq + nd keys, nd queries a request
        if not backend._use_unified_verify or m.kv_indices is None or m.kv_indices.dim() != 2:
            return None
        full, swa = m.kv_indices, m.swa_page_table
        handed = handed_keys(fb, full, swa)      # the kernel's seqused_k where this forward ran it
        q_lens = lens_of(m.qo_indptr, bs)
        kv_lens = fb.seq_lens[:bs] + int(m.max_q_len) if handed is None else handed[:bs]
    elif mode.is_draft_extend_v2():
        # the unified draft extend: block tables the forward builds per layer from the metadata's CSR ids
        # (_build_unified_page_table_from_spec, called once more for the table), seqused_k from its indptr
        if not backend._use_unified_verify or not importlib.import_module(AITER_MOD).envs. \
                SGLANG_AITER_UNIFIED_DRAFT_EXTEND.get() or m.kv_indptr is None:
            return None
        full, swa = backend._build_unified_page_table_from_spec(m, bs)
        q_lens, kv_lens = lens_of(m.qo_indptr, bs), lens_of(m.kv_indptr, bs)
    elif mode.is_decode_or_idle():
        # a decode, or a draft step (its child's block table built from the step's CSR ids: seq_lens + step + 1
        # keys): as many keys of it as the kernel was handed (forward_decode's seqused_k, forward_batch.seq_lens in
        # 0.5.23) where this forward's first layer ran it (an eager forward), else seq_lens
        if m.kv_indices is None or m.kv_indices.dim() != 2:
            return None
        handed = handed_keys(fb, m.kv_indices, m.swa_page_table)
        full, swa, q_lens = m.kv_indices, m.swa_page_table, lens_of(m.qo_indptr, bs)
        kv_lens = fb.seq_lens[:bs] if handed is None else handed[:bs]
    else:
        max_kv_len = int(fb.seq_lens_cpu.max().item())
        full, swa = backend._build_extend_unified_page_table(bs, fb.seq_lens, fb.req_pool_indices, max_kv_len)
        q_lens, kv_lens = fb.extend_seq_lens[:bs], fb.seq_lens[:bs]
    return page_table_reads(full[:bs], None if swa is None else swa[:bs], kv_lens, q_lens, backend.page_size, left)


AITER = AiterAdapter(
    "aiter", multistep=f"{AITER_MOD}:AiterMultiStepDraftBackend", round_reads=True,
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
