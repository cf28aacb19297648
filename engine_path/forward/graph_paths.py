"""A boundary's graph paths: the release's graph runners it drives (engine_path/forward/graphs.py: decode and prefill;
engine_path/forward/draft_graphs.py: an EAGLE draft's draft-extend), made at its first forward, and why a path is
not driven (that path's forwards are the model's boundary's) or runs eagerly (named)."""
from __future__ import annotations

from .adapters import Piece
from .batch import pad_decode_rows
from .draft_graphs import DraftExtendGraphs
from .graphs import DecodeGraphs, Layer, PrefillGraphs, raised_text

#: what a path's metadata prep is called in a finding when the release's code raises there
GRAPH_PREP = {
    "eager": "init_forward_metadata",
    "decode_graph": "the decode-graph replay prep (CudaGraphBufferRegistry.fill_from, build_replay_fb_view, "
                    "init_forward_metadata_out_graph / _in_graph)",
    "piecewise": "the prefill-graph load (CudaGraphBufferRegistry.fill_from, KVLocPlan.bind_replay) and "
                 "init_forward_metadata",
}
#: why piecewise graphs without per-layer shrinkage stay the model's
NO_SHRINK = ("graph path piecewise with piecewise_shrink = false (0.5.23 narrows every prefill-graph layer: "
             "_eager_attention / padded_extend_real_tokens; no release path runs one unnarrowed): the model's "
             "boundary")


class GraphPaths:
    """One boundary's graph runners, made at its first forward (the release captures at start-up), and why a
    graph path of the scenario is not driven (its forwards are then the model's boundary's, counted by reason).

    ``boundary`` is engine_path/forward/boundary.py's ``ReleaseBoundary``: its runner, backend, adapter, layers,
    ``forward_scope(fb)`` and ``layer_call(layer, kind, fb, rows, scope)``."""

    def __init__(self, boundary):
        self.b = boundary
        self.decode: DecodeGraphs | None = None
        self.prefill: PrefillGraphs | None = None
        self.verify: DecodeGraphs | None = None      # the target's decode runner in TARGET_VERIFY mode (EAGLE)
        self.draft_extend = None         # an EAGLE draft's draft-extend runner (engine_path/forward/draft_graphs.py)
        self.unavailable: dict[str, str] = {}
        #: why a round's graph path runs eagerly through the release's backend (its runner not driven here)
        self.eager: dict[str, str] = {}

    @classmethod
    def start(cls, boundary) -> "GraphPaths":
        got = cls(boundary)
        eng = boundary.model.engine
        if boundary.side != "target":
            if eng.cuda_graph and eng.cuda_graph_bs and eng.speculative.enabled:
                got._start_draft_extend()
            return got
        if eng.cuda_graph and eng.cuda_graph_bs:
            spec = eng.speculative
            got._start_decode((spec.num_draft_tokens, spec.num_steps) if spec.enabled else None)
        if eng.piecewise_cuda_graph:
            got._start_prefill()
        return got

    def _start_decode(self, verify=None) -> None:
        """The target's decode runner: plain decode graphs, or under EAGLE (``verify``: ``(num_draft_tokens,
        num_steps)``) its ``TARGET_VERIFY`` graphs, which a round's verify replays."""
        b = self.b
        try:
            dg = DecodeGraphs(b.runner, b.backend, b.adapter, self._capture_sizes(), str(b.device), b.forward_scope,
                              verify=verify)
            dg.capture(self._layers())
        except Exception as e:       # the release's capture cannot run for this backend
            if verify is None:       # that path is the model's
                self.unavailable["decode_graph"] = (f"graph path decode_graph (the release's capture: "
                                                    f"{raised_text(e)}): the model's boundary")
            else:                    # a verify runs eagerly through the release's backend, named
                self.eager["decode_graph (verify)"] = (f"the release's DecodeCudaGraphRunner verify capture: "
                                                       f"{raised_text(e)}")
            return
        if verify is None:
            self.decode = dg
        else:
            self.verify = dg

    def _layers(self) -> list[Layer]:
        """The boundary's layers, each writing through the release's layer forward (``layer_call``)."""
        b = self.b

        def writer(li):
            return lambda fb, rows, scope: b.layer_call(li.layer, li.kind, fb, rows, scope).loc
        return [Layer(li.layer, li.kind, writer(li)) for li in b.model_layers()]

    def _capture_sizes(self) -> list[int]:
        """The scenario's capture sizes with the release's clamp (``get_batch_sizes_to_capture``): no size past
        the request pool's rows, which it adds."""
        b = self.b
        rows = int(b.runner.req_to_token_pool.size)
        sizes = [s for s in b.model.engine.cuda_graph_bs if s <= rows]
        return sizes + ([rows] if max(b.model.engine.cuda_graph_bs) > rows else [])

    def _start_draft_extend(self) -> None:
        b = self.b
        spec = b.model.engine.speculative
        try:
            dg = DraftExtendGraphs(b.runner, b.backend, b.adapter, self._capture_sizes(), spec.num_draft_tokens,
                                   spec.num_steps, str(b.device), b.forward_scope)
            dg.capture(self._layers())
        except Exception as e:       # the release's capture cannot run for this backend: run it eagerly, named
            self.eager["draft_extend_graph"] = (f"the release's EAGLEDraftExtendCudaGraphRunner capture: "
                                                f"{raised_text(e)}")
            return
        self.draft_extend = dg

    def _start_prefill(self) -> None:
        b = self.b
        eng = b.model.engine
        if not eng.piecewise_shrink:
            self.unavailable["piecewise"] = NO_SHRINK
            return
        try:
            rows = int(b.runner.req_to_token_pool.req_to_token.shape[0])
            self.prefill = PrefillGraphs(b.runner, b.backend, eng.piecewise_capture_sizes, str(b.device), rows,
                                         b.forward_scope)
        except Exception as e:
            self.unavailable["piecewise"] = (f"graph path piecewise (the release's prefill runner buffers: "
                                             f"{raised_text(e)}): the model's boundary")

    # ------------------------------------------------------------------ per forward

    def ready(self, batch) -> None:
        """Before a decode-graph forward: its capture size's layers captured (their first replay). A capture the
        release cannot run there makes the decode path the model's from this forward on, as a failure at
        start-up makes it for the whole run (the largest size's layers are captured at start-up)."""
        if batch.graph != "decode_graph" or self.decode is None or batch.padded_len not in self.decode.captured:
            return
        try:
            self.decode.writes_of(batch.padded_len)
        except Exception as e:
            self.unavailable["decode_graph"] = (f"graph path decode_graph (the release's capture at size "
                                                f"{batch.padded_len}: {raised_text(e)}): the model's boundary")
            self.decode = None

    def prepare(self, meta, batch) -> None:
        """The forward's metadata as the release's runner for ``batch.graph`` makes it, on ``meta`` (a
        ReleaseMetadata whose ``fb`` is the release's batch)."""
        b, fb = self.b, meta.fb
        if batch.graph == "decode_graph":
            pad_decode_rows(fb, self.decode.fill)
            meta.graph = self.decode.replay(fb, batch.padded_len)
            meta.rows = batch.padded_len
        elif batch.graph == "piecewise":
            static = self.prefill.load(fb, batch.padded_len)
            self.prefill.metadata(fb)
            meta.layer_fb = static
            meta.scope = self.prefill.scope(static, int(fb.input_ids.shape[0]))
        else:
            with b.forward_scope():
                b.backend.init_forward_metadata(fb)

    def pieces(self) -> list:
        """The graph paths' pieces (engine_path/forward/adapters.py's ``Piece``), whose code ran each."""
        out = []
        if self.decode is not None:
            out += [Piece("decode graphs: init_cuda_graph_state, capture per size (bind_runner_slots, "
                          "init_forward_metadata_out_graph in_capture, in-graph prep, each layer's write location: the "
                          "largest size's at start-up, each other's at its first replay)",
                          "engine", f"layers captured at {self.decode.layer_captures} of "
                          f"{len(self.decode.sizes)} capture sizes: the largest and the sizes replayed"),
                    Piece("decode-graph replay: CudaGraphBufferRegistry.fill_from, build_replay_fb_view, "
                          "init_forward_metadata_out_graph / _in_graph; layers write at the capture-time tensors",
                          "engine")]
        if self.prefill is not None:
            out.append(Piece("prefill graphs (breakable): CudaGraphBufferRegistry.fill_from, KVLocPlan.bind_replay, "
                             "init_forward_metadata, layers in prefill_graph_scope (_eager_attention narrowing)",
                             "engine"))
        if self.verify is not None:
            v = self.verify
            out.append(Piece("verify graphs: the target's decode runner in TARGET_VERIFY mode (build_decode_registry "
                             "of num_draft_tokens rows a request, get_spec_info's EagleVerifyInput over the custom-mask "
                             "buffer, capture per size, fill_from, build_replay_fb_view, "
                             "init_forward_metadata_out_graph / _in_graph); layers write at the capture-time tensors",
                             "engine", f"layers captured at {v.layer_captures} of {len(v.sizes)} capture sizes; "
                             f"{v.replays} replays"))
        if self.draft_extend is not None:
            de = self.draft_extend
            out.append(Piece("draft-extend graphs: EAGLEDraftExtendCudaGraphRunner.capture_one_shape per size and "
                             "execute per replay (the static buffers' padding and refill, the replay view, "
                             "init_forward_metadata_out_graph / _in_graph); layers write at the capture-time tensors",
                             "engine", f"layers captured at {de.layer_captures} of {len(de.sizes)} capture sizes; "
                             f"{de.replays} replays"))
            out.append(Piece("draft-extend graphs: the runner's set-up (its __init__: the static buffers, "
                             "init_cuda_graph_state, the seq-len fill value)", "model",
                             "made here as its constructor makes them (the constructor needs the draft worker, its "
                             "model and the graph memory pool)"))
        out += [Piece(f"graph path {path}", "model", why) for path, why in sorted(self.unavailable.items())]
        out += [Piece(f"graph path {path}, run eagerly", "model", why) for path, why in sorted(self.eager.items())]
        return out
