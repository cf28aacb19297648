"""The attention-backend boundary: where ``loc`` and ``swa_loc`` are made for each layer's write.

:class:`BackendSpec` models what an engine's backend does (the engine, not the fix under test);
:class:`BackendBoundary` runs it. At metadata init a backend translates the ``out_cache_loc`` it
sees into ``swa_out_cache_loc`` once per forward (under a graph runner, into static buffers it
refreshes at every replay); each layer then builds its write location from the ``loc`` *it* sees
(narrowed to the real token count under piecewise graphs) and the metadata's ``swa_loc``. Where a
backend's graph path builds no window (SWA) indices, its SWA layers address the SWA pool with the
full-pool ``loc`` (triton's EAGLE draft-extend graph, B4, #29858), and read it through the full-pool
prefix. The read ids (:meth:`BackendBoundary.read_table`) are built at metadata init too, by the
design's ``read_ids`` hook. With speculative decoding each
backend has a second boundary for the draft model (its own metadata and static buffers).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from simulator.records import GRAPH_PATHS
from simulator.scenario import BACKENDS

#: Static buffers a graph runner's replay can refresh: the full-pool loc and the SWA locations.
STATIC_BUFFERS: tuple[str, ...] = ("loc", "swa_loc")


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """One backend of the engine, in the ways that matter to the write path."""

    name: str
    #: slices its own swa_loc to len(loc) before KVWriteLoc. No release's backend does: 0.5.14's trtllm_mha hands
    #: ``forward_metadata.swa_out_cache_loc`` to ``KVWriteLoc`` as it is (its #29457 slicing, if it ever existed,
    #: was a main-branch state); the field stays for a design that models such a backend
    slices_swa_loc: bool = False
    #: where its SWA ids come from in SGLang 0.5.23: "plan" (the per-iteration KVLocPlan) or "translate"
    #: (its own metadata init); the model calls Design.translate for both
    swa_ids: str = "plan"
    #: graph paths whose metadata builds window (SWA) indices; elsewhere SWA layers get the full loc
    window_graphs: frozenset[str] = frozenset(GRAPH_PATHS)
    #: the static buffers its graph runners refresh at every replay (the rest keep the previous replay's)
    static_buffers: tuple[str, ...] = STATIC_BUFFERS
    #: the SWA ids of an EAGLE draft step in a round over one window (SGLang 0.5.23's draft columns): "step", the
    #: step's own column translated; "window", the round's whole draft window translated (columns
    #: ``0 .. num_steps - 1``, request after request), which KVWriteLoc cuts to the step's length: the first
    #: requests' first columns, the wrong slots for every step but the first request's first (0.5.23's xpu: each
    #: child of its multi-step draft backend translates the ``out_cache_loc`` its metadata init sees, the window)
    draft_step_swa: str = "step"
    #: under piecewise graphs, attention (and its store) runs eagerly over the whole padded location, as the batch
    #: carries it (vLLM: the padded rows' slot mapping is what its kernel left there, -1 when right); False: each
    #: attention layer narrows to the real rows, or runs on the piece's static buffer (SGLang, engine.piecewise_shrink)
    piecewise_padded_rows: bool = False

    def with_window_graph(self, graph: str) -> "BackendSpec":
        return dataclasses.replace(self, window_graphs=self.window_graphs | {graph})


#: The engine as modelled: SGLang today.
BACKEND_SPECS: dict[str, BackendSpec] = {
    name: BackendSpec(
        name,
        swa_ids="translate" if name in ("aiter", "xpu", "torch_native") else "plan",
        # triton's draft-extend graph runner builds no window indices (#29858, open)
        window_graphs=frozenset(GRAPH_PATHS) - ({"draft_extend_graph"} if name == "triton" else set()),
        draft_step_swa="window" if name == "xpu" else "step",
    )
    for name in BACKENDS
}


