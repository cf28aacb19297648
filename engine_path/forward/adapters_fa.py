"""flashattention (FA3), musa (its MUSA subclass) and xpu (an FA-shaped backend of its own): the release's
backends, with the flash-attention kernels replaced.

* **Imports.** flashattention_backend.py imports ``sgl_kernel`` at module level (``merge_state_v2``) and its
  constructor ``sgl_kernel.flash_attn``; xpu_backend.py ``sgl_kernel`` and ``sgl_kernel.flash_attn``; musa's
  module ``flash_attn_interface``. They get stubs for the backend's import and construction only
  (engine_path.shims.stubbed_imports); a stub raises if called.
* **Construction.** The registry's ``fa3`` factory asserts the GPU's compute capability (SM80/SM90, or a MUSA
  device for musa), and xpu registers as ``intel_xpu``: each class is constructed directly.
* **Kernels.** The module globals ``flash_attn_with_kvcache`` / ``flash_attn_varlen_func`` (FA:
  sglang.kernels.ops.attention.flash_attention's dispatch into the FA3/FA4 kernels; xpu: sgl_kernel's; musa: the
  ``mate_`` kernel under its own scheduler-metadata wrapper, which runs, and ``get_scheduler_metadata``) and the
  backend attributes bound from them return zeros shaped like the query; FA3's scheduler-metadata precompute
  (``_get_scheduler_metadata``, a kernel) is None, as on the platforms without it.
* **Stand-in.** ``model_config.is_local_attention_model`` is False: the release derives it from the
  architecture (Llama4's chunked attention only); the run's stand-in says True, which would ask FA for an
  ``attention_chunk_size`` the model has not got.

Read tables (:func:`fa_reads`): the metadata's ``page_table`` (full layers) and ``swa_page_table`` (SWA layers,
translated to SWA ids), page ids at page > 1, bounded per request by ``cache_seqlens_int32``; queries start at
``cache_seqlens - q_len`` (``cu_seqlens_q``), and an SWA layer's ``window_size = (sliding_window_size, 0)``
reads ``sliding_window_size`` positions before the first query.
"""
from __future__ import annotations

import importlib
import types

from .adapters_base import SPAN_FA, Adapter, attention_output, lens_of, page_table_reads

FA = "sglang.srt.layers.attention.flashattention_backend"
XPU_MOD = "sglang.srt.layers.attention.xpu_backend"
MUSA_MOD = "sglang.srt.hardware_backend.musa.attention.flashattention_backend"

_KERNEL = "a flash-attention kernel (the attention arithmetic; needs CUDA / the platform): zeros like the query"
_SCHED = "FA3's scheduler-metadata precompute (a kernel): None, the kernel's own path"
_LOCAL = ("False, as the release derives it for a non-Llama4 architecture (the run's stand-in says True: FA would "
          "build chunked local attention)")


def no_scheduler_metadata(*args, **kwargs):
    """Stands in for a kernel that precomputes FA's split scheduling: none (the kernel plans its own)."""
    return None


class FlashAttentionAdapter(Adapter):
    #: the kernels bound as module globals: module -> names
    kernels: dict = {}

    def install(self, bag) -> None:
        for mod, names in self.kernels.items():
            m = importlib.import_module(mod)
            for name, fn in names.items():
                setattr(m, name, fn)

    def kernel(self, attr: str):
        return no_scheduler_metadata if attr == "_get_scheduler_metadata" else attention_output

    def view(self, bag):
        got = types.SimpleNamespace(**vars(bag))
        got.model_config = types.SimpleNamespace(**vars(bag.model_config))
        got.model_config.is_local_attention_model = False
        return got


def fa_reads(backend, fb, bs: int):
    """The FA metadata's page tables; see the module docstring."""
    m = backend.forward_metadata
    if m is None or m.page_table is None or m.cache_seqlens_int32 is None or m.cu_seqlens_q is None:
        return None
    swa = m.swa_page_table[:bs] if m.swa_page_table is not None else None
    return page_table_reads(m.page_table[:bs], swa, m.cache_seqlens_int32[:bs], lens_of(m.cu_seqlens_q, bs),
                            backend.page_size, backend.sliding_window_size)


_FA_KERNELS = {FA: {"flash_attn_with_kvcache": attention_output, "flash_attn_varlen_func": attention_output}}


def _adapter(name: str, factory: str, why: str, kernels: dict, stubs: dict, replaced: dict,
             multistep: str) -> FlashAttentionAdapter:
    a = FlashAttentionAdapter(
        name, replaced=replaced, reads=fa_reads, span=SPAN_FA, factory=factory, factory_why=why,
        multistep=multistep, round_reads=True,
        shims={f"{mod}:{n}": (_SCHED if n == "get_scheduler_metadata" else _KERNEL)
               for mod, names in kernels.items() for n in names},
        stubs=stubs, stand_in={"model_config.is_local_attention_model": _LOCAL})
    a.kernels = kernels
    return a


_SGL = {"sgl_kernel": "flash-attention and merge-state kernels (CUDA wheels; they cannot load here)"}
_FA_REPLACED = {"flash_attn_with_kvcache": _KERNEL, "flash_attn_varlen_func": _KERNEL,
                "_get_scheduler_metadata": _SCHED}

FLASHATTENTION = _adapter(
    "flashattention", f"{FA}:FlashAttentionBackend", "the registry's fa3 factory asserts an SM80/SM90 GPU",
    _FA_KERNELS, _SGL, _FA_REPLACED, f"{FA}:FlashAttentionMultiStepBackend")

MUSA = _adapter(
    "musa", "sglang.srt.hardware_backend.musa.attention:MusaFlashAttentionBackend",
    "the registry's fa3 factory picks it on a MUSA device only",
    {**_FA_KERNELS, MUSA_MOD: {"mate_flash_attn_with_kvcache": attention_output,
                               "flash_attn_varlen_func": attention_output,
                               "get_scheduler_metadata": no_scheduler_metadata}},
    {**_SGL, "flash_attn_interface": "MUSA's flash-attention kernels (mate)"}, _FA_REPLACED,
    f"{MUSA_MOD}:MusaFlashAttentionMultiStepBackend")
MUSA.stand_in["parallel pp_group"] = ("a one-rank group, published with the run's parallel config "
                                      "(engine_path/forward/runner.py publish_config): musa's scheduler-metadata "
                                      "wrapper reads its rank and width")

XPU = _adapter(
    "xpu", f"{XPU_MOD}:XPUAttentionBackend", "registered as intel_xpu",
    {XPU_MOD: {"flash_attn_with_kvcache": attention_output, "flash_attn_varlen_func": attention_output}},
    _SGL, {}, f"{XPU_MOD}:XPUMultiStepDraftBackend")
