"""The values a design's hooks take and return: write locations, read tables, the boundary context."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from simulator.engine_model.backends import BackendSpec
from simulator.engine_model.padding_convention import PaddingConvention


class DesignError(RuntimeError):
    """A design cannot be loaded or set up (bad file, class, padding convention, pool sizes); names the design."""


@dataclass(frozen=True, slots=True)
class KVWriteLoc:
    """What a layer hands to the pool: full-pool locations and, for hybrid models, SWA locations."""

    loc: torch.Tensor
    swa_loc: Optional[torch.Tensor] = None


@dataclass(frozen=True, slots=True)
class ReadIds:
    """What one kind of layer reads in one forward: per request a run of consecutive positions (CSR).

    Request i (batch order) reads positions ``start[i] .. start[i] + n_i - 1`` at the slots
    ``indices[indptr[i]:indptr[i + 1]]`` (``n_i = indptr[i + 1] - indptr[i]``), like the kv_indptr /
    kv_indices page tables a backend builds at metadata init.
    """

    indptr: torch.Tensor    # int64, [num_requests + 1], indptr[0] == 0
    indices: torch.Tensor   # int32 / int64 slot ids in the kind's sub-pool, [indptr[-1]]
    start: torch.Tensor     # int64, [num_requests]: the position of each request's first entry


@dataclass(frozen=True, slots=True)
class ReadTable:
    """The forward's read ids per layer kind: full layers read ``full`` in the full pool, SWA layers ``swa``
    in the SWA pool. None: not built (nothing of that kind is checked). ``spans``: per kind the positions a
    correct table of this one's kernels holds (simulator.oracle.read_rules.ReadSpan), where that is the kernels'
    own rule and not the oracle's (a real engine's backend); None: the oracle's rule."""

    full: Optional[ReadIds]
    swa: Optional[ReadIds]
    spans: Optional[dict] = None

    def of(self, kind: str) -> Optional[ReadIds]:
        return self.full if kind == "full" else self.swa


#: Graph runners a forward can run in (``BoundaryContext.runner``).
GRAPH_RUNNERS: tuple[str, ...] = ("decode", "target_verify", "draft_decode", "draft_extend", "piecewise", "eager")


def graph_runner(mode: str, graph: str) -> str:
    """The graph runner of a forward, from its mode and graph path (TARGET_VERIFY replays the decode runner)."""
    if graph == "decode_graph":
        return "target_verify" if mode == "target_verify" else "decode"
    return {"draft_graph": "draft_decode", "draft_extend_graph": "draft_extend"}.get(graph, graph)


@dataclass(frozen=True, slots=True)
class BoundaryContext:
    """Where a hook is called: one forward of one backend of one model side; a layer for per-layer hooks."""

    step: int
    backend: str
    side: str                      # "target" | "draft": which model's pools this forward writes
    mode: str                      # extend | decode | mixed | target_verify | draft_decode | draft_extend
    graph: str                     # graph path: eager | decode_graph | piecewise | draft_graph | draft_extend_graph
    runner: str                    # one of GRAPH_RUNNERS
    page_size: int
    num_token_non_padded: int      # real tokens
    dp_padded_len: int             # len(out_cache_loc) at metadata init (after DP-attention padding)
    padded_len: int                # rows the forward runs: the capture size under a graph, else dp_padded_len
    spec: "BackendSpec"            # the backend as the engine model runs it (after Design.backend_spec)
    padding: PaddingConvention
    loc_pad: int                   # what a padded row of loc (and a static loc buffer's tail) holds
    swa_pad: int                   # what a static SWA buffer's tail gets under the convention
    layer: Optional[int] = None    # global layer id (per-layer hooks only)
    kind: Optional[str] = None     # "full" | "swa" (per-layer hooks only)
    window: int = 0                # the SWA layers' attention window (positions each token reads)
    #: the allocator's *live* full -> SWA mapping (int64, read only): at a per-layer hook, the mapping as
    #: it is when that layer runs (an overlap timeline may change it between layers); the hooks that
    #: receive ``full_to_swa`` as an argument get this same tensor
    full_to_swa: Optional[torch.Tensor] = field(default=None, compare=False, repr=False)

    def at_layer(self, layer: int, kind: str) -> "BoundaryContext":
        """This forward's context at one layer (built field by field: twice as fast as dataclasses.replace)."""
        return BoundaryContext(self.step, self.backend, self.side, self.mode, self.graph, self.runner, self.page_size,
                               self.num_token_non_padded, self.dp_padded_len, self.padded_len, self.spec,
                               self.padding, self.loc_pad, self.swa_pad, layer, kind, self.window, self.full_to_swa)
