"""``EngineDesign``: a design whose hooks call the release's own code.

Against the design interface of ``simulator.designs.Design`` (each hook takes the call's
``BoundaryContext``):

==========================  =============================================================  =========
hook                        what runs                                                      whose
==========================  =============================================================  =========
``translate``               the plan's write ids (plan backends of the release) or the     engine
                            hybrid pool's ``translate_loc_from_full_to_swa``
``fill_graph_loc_buffer``   decode / target_verify graphs: the release's                  engine
                            ``CudaGraphBufferRegistry.fill_from`` with its
                            ``build_decode_registry`` ``out_cache_loc`` slot (ZERO tail);
                            draft / draft-extend graphs (inline in the EAGLE runners):     ours
                            the model's refresh
``fill_graph_swa_buffer``   triton: the release's ``TritonAttnBackend.                     engine
                            _fill_cuda_graph_swa_out_cache_loc`` on our buffer; the other
                            backends (inline in their CUDA-graph metadata init): the       ours
                            model's refresh (engine_path/graphbuf.py)
``make_write_loc``          the release's ``KVWriteLoc(loc, swa_loc)`` with its            engine
                            ``__post_init__``, handed on as the simulator's KVWriteLoc
``size_draft_pools``        the base design's (#17630 fixed in every known release)         ours
``backend_spec``            the model's spec, with ``swa_ids`` set from the release        ours + probe
==========================  =============================================================  =========

The run deep-copies a design per (backend, side); the engine objects (release API, translator) are
shared by every copy (``__deepcopy__``), so all copies read the one live mapping.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from simulator.designs.base import Design
from simulator.designs.types import KVWriteLoc

from .api import ReleaseAPI
from .graphbuf import GraphBufferCode
from .writeloc import Translator, make_write_loc


class EngineDesign(Design):
    """The write-location logic of a real SGLang release."""

    name = "engine"
    description = "SGLang's own translation and KVWriteLoc, imported from the release under test"
    graph_swa_dtype = torch.int64

    def __init__(self, api: ReleaseAPI, translator: Optional[Translator] = None, model: Optional[Design] = None):
        self.api = api
        self.translator = translator
        #: our model of this release (e.g. the design ``sglang-0.5.23``): the backend metadata that stays
        #: ours (window graphs, own slicing) and the release behaviour the boundary asks (eager
        #: narrowing) come from it; None: the base spec, the engine "as it is" (B4 open), mid-2026
        self.model = model
        if model is not None:
            self.release = model.release
        self.name = f"sglang-{api.info.version}"
        #: the release's graph static-buffer refresh, where it runs on a CPU (shared by every copy)
        self.graph_code = GraphBufferCode()
        f = api.features
        self.description = (f"SGLang {api.info.version} ({api.info.path}): KVWriteLoc"
                            f"{' with' if f.has_post_init_slice else ' without'} the __post_init__ slice; SWA ids "
                            + (f"from the plan on {', '.join(sorted(f.plan_backends))}, translated elsewhere"
                               if f.plan_backends else "from translate_loc_from_full_to_swa on every backend"))

    def __deepcopy__(self, memo: dict) -> "EngineDesign":
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)      # shares api and translator: one live mapping
        return twin

    def bind(self, translator: Translator) -> None:
        """Give the design the run's translator (the hybrid pool and allocator it translates through)."""
        self.translator = translator

    # --- hooks ---------------------------------------------------------------------------------
    def translate(self, out_cache_loc: torch.Tensor, full_to_swa: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        if self.translator is None:
            raise RuntimeError("EngineDesign has no translator: bind() it to the run's engine pool first")
        backend = getattr(ctx, "backend", "torch_native")
        real = getattr(ctx, "num_token_non_padded", None)
        return self.translator.translate(out_cache_loc, backend, full_to_swa=full_to_swa, num_token_non_padded=real)

    def fill_graph_loc_buffer(self, buffer: torch.Tensor, loc: torch.Tensor, padded: int, ctx: Any) -> None:
        if self.graph_code.fills_loc(getattr(ctx, "runner", ""), buffer):
            self.graph_code.fill_loc(buffer, loc, padded)
            return None
        return (self.model or super()).fill_graph_loc_buffer(buffer, loc, padded, ctx)

    def fill_graph_swa_buffer(self, buffer: torch.Tensor, swa_loc: torch.Tensor, padded: int, ctx: Any) -> None:
        if self.graph_code.fills_swa(getattr(ctx, "backend", ""), buffer):
            self.graph_code.fill_swa(buffer, swa_loc)
            return None
        return (self.model or super()).fill_graph_swa_buffer(buffer, swa_loc, padded, ctx)

    def make_write_loc(self, loc: torch.Tensor, swa_loc: Optional[torch.Tensor], ctx: Any = None) -> KVWriteLoc:
        wl = make_write_loc(self.api, loc, swa_loc)
        return KVWriteLoc(wl.loc, wl.swa_loc)

    def backend_spec(self, spec):
        """The modelled backend, with where its SWA ids come from in this release."""
        if self.model is not None:
            spec = self.model.backend_spec(spec)
        if self.translator is not None and hasattr(spec, "swa_ids"):
            return dataclasses.replace(spec, swa_ids=self.translator.source(spec.name))
        return spec

    def describe(self) -> dict:
        """Which pieces are the engine's, for run.json / the report."""
        graph = self.graph_code.describe()
        return {
            "engine": self.api.info.to_json(),
            "features": self.api.features.to_json(),
            "graph_buffer_refreshes": graph["calls"],
            "engine_pieces": [p for p in (
                "SWATokenToKVPoolAllocator", "free_swa_out_of_window_slots",
                "KVIndexTranslator.write_ids" if self.api.features.has_plan_ids else "",
                "SWAKVPool.translate_loc_from_full_to_swa",
                "KVWriteLoc.__post_init__" if self.api.features.has_post_init_slice else "KVWriteLoc",
                "SWAKVPool.set_kv_buffer", *graph["engine"]) if p],
            "model_pieces": ["scheduler", "workload", "DP ranks", "graph capture sizes (bucket choice)",
                             *graph["model"], "backend metadata beyond the SWA ids", "per-layer narrowing"],
        }
