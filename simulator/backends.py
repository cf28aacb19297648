"""The attention-backend boundary: where ``loc`` and ``swa_loc`` are made for each layer's write.

Every modelled backend does what SGLANG_FACTS section 3 describes: at metadata init it translates
the ``out_cache_loc`` it sees into ``swa_out_cache_loc`` once per forward (under a decode CUDA graph,
into a static buffer that the design refreshes); each layer then builds its write location from the
``loc`` *it* sees (narrowed to the real token count under piecewise graphs) and the metadata's
``swa_loc``. Backends differed historically in one way that matters here: trtllm_mha sliced its own
``swa_loc`` to ``len(loc)`` before the generic fix (#29457). With speculative decoding each backend
also has a draft-model instance (its own metadata and graph runners' static buffers); triton's
EAGLE draft-extend CUDA-graph path builds no window (SWA) indices (#29858, open).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .batch import ForwardBatch
from .designs import BoundaryContext, Design, KVWriteLoc
from .scenario import BACKENDS, EngineConfig
from .records import STATIC_GRAPHS


@dataclass(frozen=True, slots=True)
class BackendSpec:
    name: str
    slices_swa_loc: bool = False   # sliced swa_loc itself before KVWriteLoc existed as a fix
    # builds window (SWA) indices in the EAGLE draft-extend CUDA-graph path; triton's does not (#29858)
    draft_extend_graph_window: bool = True


BACKEND_SPECS: dict[str, BackendSpec] = {
    name: BackendSpec(name, slices_swa_loc=(name == "trtllm_mha"), draft_extend_graph_window=(name != "triton"))
    for name in BACKENDS
}


@dataclass(slots=True)
class ForwardMetadata:
    """What a backend keeps for one forward: the locations layers will see."""

    layer_loc: torch.Tensor            # out_cache_loc as a layer sees it (narrowed under PCG)
    swa_loc: torch.Tensor              # metadata.swa_out_cache_loc (padding included)
    rows: int                          # rows of K and V a layer produces (= len(layer_loc))


class BackendBoundary:
    """One backend's forward-metadata state across a run (its decode-graph static buffers persist)."""

    def __init__(self, spec: BackendSpec, design: Design, engine: EngineConfig, device: torch.device):
        self.spec = spec
        self.design = design
        self.engine = engine
        self.device = device
        max_bs = max(engine.cuda_graph_bs) if engine.cuda_graph_bs else 1
        spec = engine.speculative
        # rows of a graph: one per request, or num_draft_tokens per request for TARGET_VERIFY / DRAFT_EXTEND
        self.max_rows = max_bs * (spec.num_draft_tokens if spec.enabled else 1)
        # decode-graph static buffers, allocated once like the graph runner's, reused every replay
        self.graph_loc = torch.zeros(self.max_rows, dtype=torch.int64, device=device)
        self.graph_swa_loc = torch.zeros(self.max_rows, dtype=design.graph_swa_dtype, device=device)
        # each graph runner has its own static buffers (the draft runners only with speculative decoding)
        self._static: dict[str, tuple[torch.Tensor, torch.Tensor]] = {"decode_graph": (self.graph_loc,
                                                                                        self.graph_swa_loc)}

    @property
    def name(self) -> str:
        return self.spec.name

    def init_metadata(self, batch: ForwardBatch, out_cache_loc: torch.Tensor,
                      full_to_swa: torch.Tensor) -> ForwardMetadata:
        real = batch.num_token_non_padded
        if batch.graph in STATIC_GRAPHS:
            graph_loc, graph_swa_loc = self.static_buffers(batch.graph)
            padded = batch.padded_len
            n = out_cache_loc.shape[0]
            graph_loc[:n].copy_(out_cache_loc)
            graph_loc[n:padded].fill_(batch.pad_value)
            translated = self.design.translate(out_cache_loc, full_to_swa)
            self.design.fill_graph_swa_buffer(graph_swa_loc, translated, padded)
            loc = graph_loc[:padded]
            return ForwardMetadata(layer_loc=loc, swa_loc=graph_swa_loc[:padded], rows=padded)
        swa = self.design.translate(out_cache_loc, full_to_swa)
        if batch.graph == "piecewise":
            if self.engine.piecewise_shrink:
                # each attention layer narrows out_cache_loc (and Q/K/V) to the real token count
                loc = out_cache_loc[:real]
            else:
                # no narrowing: the layer runs on the piece's static buffer, padded to the capture size
                loc = torch.full((batch.padded_len,), batch.pad_value, dtype=out_cache_loc.dtype, device=self.device)
                loc[:real] = out_cache_loc[:real]
            return ForwardMetadata(layer_loc=loc, swa_loc=swa, rows=int(loc.shape[0]))
        return ForwardMetadata(layer_loc=out_cache_loc, swa_loc=swa, rows=int(out_cache_loc.shape[0]))

    def static_buffers(self, graph: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(loc, swa_loc) static buffers of a graph runner, allocated at its first replay, then reused."""
        bufs = self._static.get(graph)
        if bufs is None:
            bufs = self._static[graph] = (
                torch.zeros(self.max_rows, dtype=torch.int64, device=self.device),
                torch.zeros(self.max_rows, dtype=self.design.graph_swa_dtype, device=self.device))
        return bufs

    def write_loc(self, meta: ForwardMetadata, batch: ForwardBatch, layer: int, kind: str) -> KVWriteLoc:
        swa: Optional[torch.Tensor] = meta.swa_loc
        loc = meta.layer_loc
        if self.spec.slices_swa_loc and swa.shape[0] > loc.shape[0]:
            swa = swa[: loc.shape[0]]
        ctx = BoundaryContext(backend=self.spec.name, backend_slices_swa_loc=self.spec.slices_swa_loc,
                              layer=layer, kind=kind, mode=batch.mode, graph=batch.graph,
                              num_token_non_padded=batch.num_token_non_padded,
                              backend_draft_extend_graph_window=self.spec.draft_extend_graph_window)
        return self.design.make_write_loc(loc, swa, ctx)
