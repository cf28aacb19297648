"""The release's own graph static-buffer refresh, where that code runs on a CPU.

At a CUDA-graph replay the engine refreshes two static buffers before ``graph.replay()``: the full-pool
``out_cache_loc`` buffer of the runner and each backend's SWA write-target buffer. What of that code a
CPU can call, read from the releases 0.5.14 .. 0.5.23:

==========================================  ==============================================================
buffer (runner / backend)                   the release's code
==========================================  ==============================================================
``out_cache_loc``, decode runner (decode,   ``cuda_graph_buffer_registry``: ``build_decode_registry``'s
target_verify replays)                      ``out_cache_loc`` slot (int64, padding policy ZERO: the tail
                                            ``[raw:padded]`` reset to 0) and ``CudaGraphBufferRegistry
                                            .fill_from`` (every release; the decode runner's
                                            ``replay_prepare`` calls it)
``out_cache_loc``, EAGLE draft and draft-   inline in the runners' ``replay`` (``buffers.out_cache_loc
extend runners                              .zero_()`` then a copy): not callable alone -> the model's
swa write-target buffer, triton             ``TritonAttnBackend._fill_cuda_graph_swa_out_cache_loc``
                                            (every release: zero ``[n:]``, copy ids into ``[:n]``, the
                                            size guard), called on a stand-in backend holding our buffer
swa write-target buffer, other backends     inline in each backend's ``init_forward_metadata_*_cuda_graph``
                                            (flashinfer, fa3, trtllm_mha, aiter, xpu) -> the model's
==========================================  ==============================================================

The ids the triton method copies are the ones the design's ``translate`` hook got from the release for
this forward (plan write ids or ``translate_loc_from_full_to_swa``): the stand-in answers the method's
own id call (``translate_loc_from_full_to_swa`` in 0.5.14 .. 0.5.18, ``sliding_window_write_loc_for``
in 0.5.19 .. 0.5.21, ``write_ids`` from 0.5.22) with them, so the translation is not run twice.
Each piece is probed (the module and the name), never assumed from the version string. On a GPU run
(buffers on CUDA) both refreshes stay the model's: the registry's CUDA copy path (its grouped
``_foreach_copy_`` / ``small_copy`` kernels) is not wired, and ``calls`` counts them as the model's.
"""
from __future__ import annotations

import dataclasses
import importlib
import warnings
import weakref
from types import SimpleNamespace
from typing import Any, Callable, Optional

import torch

REGISTRY_MODULE = "sglang.srt.model_executor.cuda_graph_buffer_registry"
DECODE_RUNNER_MODULE = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"
TRITON_MODULE = "sglang.srt.layers.attention.triton_backend"

#: graph runners (simulator.designs.types.graph_runner) whose out_cache_loc refresh is the registry's
REGISTRY_RUNNERS = ("decode", "target_verify")
#: what the engine-pieces list says for each refresh the release runs
#: (no quotes or angle brackets: the report prints them as they are, HTML-escaped)
LOC_PIECE = "CudaGraphBufferRegistry.fill_from (the out_cache_loc slot of build_decode_registry: decode/verify graphs)"
SWA_PIECE = "TritonAttnBackend._fill_cuda_graph_swa_out_cache_loc (the graph SWA buffer of triton)"
#: and for the ones that stay the model's
LOC_FALLBACK = "graph out_cache_loc buffer of the EAGLE draft / draft-extend runners (inline in their replay)"
SWA_FALLBACK = ("graph SWA buffer of flashinfer, flashattention, trtllm_mha, aiter, xpu, musa (inline in "
                "the CUDA-graph metadata init of each backend)")


def _optional(name: str):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return importlib.import_module(name)
    except Exception:
        return None


class _Ids:
    """Answers the triton method's id call with the ids the translate hook already got from the release."""

    def __init__(self, ids: torch.Tensor):
        self.ids = ids

    def translate_loc_from_full_to_swa(self, _loc):              # 0.5.14 .. 0.5.18 (token_to_kv_pool)
        return self.ids

    def sliding_window_write_loc_for(self, _loc):                # 0.5.19 .. 0.5.21 (kv_index_translator)
        return self.ids

    def write_ids(self, _batch, _kind):                          # 0.5.22+ (kv_index_translator)
        return self.ids


class GraphBufferCode:
    """The release's graph-buffer refresh functions found in the imported release (None where absent)."""

    def __init__(self) -> None:
        reg = _optional(REGISTRY_MODULE)
        self._registry_cls = getattr(reg, "CudaGraphBufferRegistry", None)
        self._loc_slot = None
        builder = getattr(reg, "build_decode_registry", None)
        if builder is not None and self._registry_cls is not None:
            try:
                built = builder(device=torch.device("cpu"), max_bs=1, max_num_token=1, seq_len_fill_value=1,
                                cache_loc_dtype=self._cache_loc_dtype(), share_pool=False)
                self._loc_slot = built.get_slot("out_cache_loc")
            except Exception:
                self._loc_slot = None
        triton = _optional(TRITON_MODULE)
        cls = getattr(triton, "TritonAttnBackend", None)
        self._swa_fill: Optional[Callable] = getattr(cls, "_fill_cuda_graph_swa_out_cache_loc", None)
        #: id(buffer) -> (weak reference to the buffer, the one-slot registry bound to it)
        self._registries: dict[int, tuple[Any, Any]] = {}
        #: refreshes run so far, by whose code: {"loc": {"engine": n, "model": n}, "swa": {...}}
        self.calls = {"loc": {"engine": 0, "model": 0}, "swa": {"engine": 0, "model": 0}}

    @staticmethod
    def _cache_loc_dtype() -> torch.dtype:
        """The decode runner's ``_cache_loc_dtype()`` (int64 in every known release)."""
        runner = getattr(_optional(DECODE_RUNNER_MODULE), "DecodeCudaGraphRunner", None)
        try:
            return runner._cache_loc_dtype(None)
        except Exception:
            return torch.int64

    # --- what runs ---------------------------------------------------------------------------------
    def fills_loc(self, runner: str, buffer: torch.Tensor) -> bool:
        ok = (self._loc_slot is not None and runner in REGISTRY_RUNNERS and buffer.dtype == self._loc_slot.dtype
              and buffer.device.type == "cpu")
        self.calls["loc"]["engine" if ok else "model"] += 1
        return ok

    def fills_swa(self, backend: str, buffer: torch.Tensor) -> bool:
        ok = self._swa_fill is not None and backend == "triton" and buffer.device.type == "cpu"
        self.calls["swa"]["engine" if ok else "model"] += 1
        return ok

    def fill_loc(self, buffer: torch.Tensor, loc: torch.Tensor, padded: int) -> None:
        """``fill_from`` of a registry holding the release's ``out_cache_loc`` slot, bound to ``buffer``."""
        ref, reg = self._registries.get(id(buffer), (None, None))
        if ref is None or ref() is not buffer:
            n_max = int(buffer.shape[0])
            reg = self._registry_cls(device=buffer.device, max_bs=n_max, max_num_tokens=n_max, share_pool=False)
            reg.register_slot(dataclasses.replace(self._loc_slot, buffer=None), bind=buffer)
            self._registries[id(buffer)] = (weakref.ref(buffer), reg)
        n = int(loc.shape[0])
        # the slot's axis is "tokens": the request counts only gate Phase 1 and size "bs" slots (none here)
        reg.fill_from(SimpleNamespace(out_cache_loc=loc), raw_bs=n, padded_bs=padded, raw_num_tokens=n,
                      padded_num_tokens=padded)

    def fill_swa(self, buffer: torch.Tensor, swa_loc: torch.Tensor) -> None:
        """triton's refresh method on a stand-in backend whose SWA buffer is ``buffer``."""
        ids = _Ids(swa_loc)
        backend = SimpleNamespace(use_sliding_window_kv_pool=True, cuda_graph_swa_out_cache_loc=buffer,
                                  token_to_kv_pool=ids, kv_index_translator=ids)
        batch = SimpleNamespace(out_cache_loc=swa_loc, batch_size=int(swa_loc.shape[0]), forward_mode=None,
                                spec_info=None)
        self._swa_fill(backend, batch)

    def describe(self) -> dict:
        engine = [p for p, ok in ((LOC_PIECE, self._loc_slot is not None), (SWA_PIECE, self._swa_fill is not None))
                  if ok]
        model = [LOC_FALLBACK if self._loc_slot is not None else "graph out_cache_loc buffers (no registry found)",
                 SWA_FALLBACK if self._swa_fill is not None else "graph SWA buffers (no triton refresh found)"]
        return {"engine": engine, "model": model, "calls": {k: dict(v) for k, v in self.calls.items()}}
