"""The release's attention backend as a run's boundary (simulator/core/boundary.py's ``Boundary``).

:class:`ReleaseBackends` is the run's ``BackendSource`` in engine mode: per (backend, model side) a
:class:`ReleaseBoundary` over the release's own backend (engine_path/forward/adapters.py) and, for what the
release's forward does not cover here yet, the model's boundary it wraps. Per forward:

* ``init_metadata``: the release's ``ForwardBatch`` (engine_path/forward/batch.py), the metadata as the release's
  runner of the forward's graph path makes it (engine_path/forward/graph_paths.py: eager ``init_forward_metadata``, a
  decode-graph replay, a prefill-graph load), then layer 0's write (its rows are the forward's K/V rows after
  the release's narrowing);
* ``write_loc``: each layer's forward at its own time (so a scheduler write landing between layers is seen as the
  engine sees it), the ``KVWriteLoc`` the backend handed to ``set_kv_buffer`` as the simulator's; in a
  decode-graph replay, what the tensors that layer's store took at capture hold now;
* ``read_table``: the tables the backend built for this forward, where its adapter knows them.

A step the release's forward does not run here (a speculative mode, a graph path the backend's release code cannot
be driven through) goes through the model's boundary, counted per reason in :meth:`ReleaseBoundary.describe` (run.json's ``engine_pieces``). An
exception in the release's code is a ``design_error`` finding naming the release, the forward and the layer.
"""
from __future__ import annotations

import importlib
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Optional

import torch

from simulator.core.boundary import BackendBoundary, ForwardMetadata, ModelBackends
from simulator.designs.checks import HookFailure, check_read_table, check_write_loc
from simulator.designs.types import KVWriteLoc, ReadTable

from ..release_log import printed_as_log
from . import kernels
from .adapters import ADAPTERS, Adapter, Piece
from .batch import mode_supported, release_batch
from .graph_paths import GRAPH_PREP, GraphPaths
from .graphs import raised_text
from .runner import COMPACT_WIDTH, Capture, Runner
from .speculative import Rounds, draft_decode_batch, draft_extend_batch, draft_step, verify_batch, write_window_rows

#: why an EAGLE round's reads are the model's although the release made the forward's metadata
SPEC_READS = ("a forward of an EAGLE round: this backend's tables of a verify, a draft step and a draft extend not "
              "read yet (Adapter.round_reads)")
#: what of an EAGLE round is the release's, and what is not (engine_path/forward/speculative.py)
ROUND_PIECES = (
    Piece("EAGLE round: the plan (KVIndexTranslator.plan of the window), ForwardBatch of target_verify / the draft's "
          "decode steps / DRAFT_EXTEND_V2, KVLocPlan.bind, init_forward_metadata (the multi-step draft backend's for "
          "the steps), per_step_draft_out_cache_loc, each layer's write", "engine"),
    Piece("EAGLE round: the spec inputs (EagleVerifyInput's chain tree and mask, EagleDraftInput, "
          "EagleDraftExtendInput) and the window", "model",
          "built in torch as the worker's CUDA-only kernels build them for a chain (build_tree_kernel_efficient, "
          "assign_draft_cache_locs_contiguous, prepare_draft_extend_inputs cannot run here)"),
    Piece("EAGLE round on a graph path (the draft's decode steps on draft_graph) or padded for DP attention", "model",
          "its real rows run eagerly through the release's backend: the release's graph runner for the draft's steps "
          "(EAGLEDraftCudaGraphRunner, which runs the worker's draft_forward) and the dummy requests of "
          "prepare_mlp_sync_batch are not driven yet, so a stale static buffer of theirs, or a padded row's write, "
          "is not seen (a verify on decode_graph and a draft extend on draft_extend_graph replay the release's "
          "runners: the verify graphs' and draft-extend graphs' pieces)"),
)
#: why a forward's reads are the model's although the release made its metadata
LOOKAHEAD = ("req_to_token rows changed after the batch was made (the overlap scheduler ran ahead): the release's "
             "tables were built on later rows")
FORWARD_CONTEXT = "sglang.srt.model_executor.forward_context"
RADIX_ATTENTION = "sglang.srt.layers.radix_attention"


class RunSet:
    """An attribute the run sets on every boundary (the Boundary protocol's), kept on the model's boundary the
    release's wraps: one value for both."""

    def __init__(self, what: str):
        self.__doc__ = what

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(obj.model, self.name)

    def __set__(self, obj, value) -> None:
        setattr(obj.model, self.name, value)


@dataclass(slots=True)
class ReleaseMetadata(ForwardMetadata):
    """A forward's metadata as the release's backend made it: its batch and each layer's write, as they come."""

    fb: object = None            # the release's batch of the forward (its metadata init, its read tables)
    layer_fb: object = None      # the batch the layers run on (a prefill graph's static batch; else ``fb``)
    scope: object = None         # a context-manager factory around each layer's forward
    spec: bool = False           # a forward of an EAGLE round (engine_path/forward/speculative.py)
    backend: object = None       # the backend this forward ran on (a draft step's child; None: the boundary's)
    graph: object = None         # a decode-graph replay: the capture it replays (graphs.Captured)
    writes: dict = field(default_factory=dict)     # layer id -> the release's KVWriteLoc


class ReleaseBoundary:
    """One backend of one model side, run by the release (see the module docstring)."""

    def __init__(self, model: BackendBoundary, adapter: Adapter, runner: Runner, backend, api, device: str,
                 side: str = "target", rounds: Optional[Rounds] = None):
        self.model, self.adapter, self.runner, self.backend, self.api = model, adapter, runner, backend, api
        self.side = side             # the model side: "target", or "draft" (an EAGLE draft's own backend)
        #: this backend's EAGLE rounds, shared by its target's and its draft's boundaries; the draft's multi-step
        #: backend (built at its first decode step) or why there is none
        self.rounds = rounds if rounds is not None else Rounds()
        self.multistep = None
        self.multistep_why: Optional[str] = None
        self.release_modes: Counter = Counter()
        self.design, self.spec, self.device = model.design, model.spec, model.device
        self._layers: dict[int, object] = {}
        self._inputs: dict[tuple, tuple] = {}      # (rows, device) -> a layer's Q, K, V (_qkv)
        self._ctx = importlib.import_module(FORWARD_CONTEXT)
        self._radix = importlib.import_module(RADIX_ATTENTION)
        #: forwards run by the release, and those the model's boundary ran, by reason
        self.release_forwards = 0
        self.release_paths: Counter = Counter()
        self.model_forwards: Counter = Counter()
        self.model_reads: Counter = Counter()
        #: the release's graph runners (made at the first forward: the release captures at start-up), and why a
        #: graph path of the scenario is not driven (that path's forwards are the model's boundary's)
        self.graphs: Optional[GraphPaths] = None
        #: the pool's mapping as this backend last saw it (at construction: what its constructor could keep)
        self._mapping = getattr(runner.capture, "full_to_swa_index_mapping", None)    # none in a plain pool
        self._followed: set[str] = set()     # the backend's attributes moved with it (follow_mapping)

    # what the run sets on every boundary, kept on the model's (which the release's falls back to)
    window = RunSet("the side's SWA window")
    mapping_moves = RunSet("whether the run's mapping moves between layers (the overlap timeline)")
    swa_layers = RunSet("whether the side has SWA layers")

    def context(self, batch, full_to_swa=None):
        return self.model.context(batch, full_to_swa)

    def static_buffers(self, graph: str):
        return self.model.static_buffers(graph)

    def layer_free_write_loc(self) -> bool:
        return False          # every layer's write location is the release's own layer forward's

    def base_reads(self) -> bool:
        # the release's tables are its backend's own (asked on every executor); the model's without an adapter
        return self.adapter.reads is None and self.model.base_reads()

    def span_checked(self) -> bool:
        # the release's tables state their span by their kernels' rule (ReadTable.spans; adapters_base.TableSpan)
        return self.adapter.reads is None and self.model.span_checked()

    # ------------------------------------------------------------------ per forward

    def init_metadata(self, batch, out_cache_loc: torch.Tensor, full_to_swa: torch.Tensor) -> ForwardMetadata:
        self._read_mapping(full_to_swa)        # before the first capture: a graph reads the run's mapping
        if self.graphs is None:
            self.graphs = GraphPaths.start(self)
        self.graphs.ready(batch)
        why = mode_supported(batch) or self.graphs.unavailable.get(batch.graph)
        if why is not None:
            self.model_forwards[why] += 1
            return self.model.init_metadata(batch, out_cache_loc, full_to_swa)
        ctx = self.context(batch, full_to_swa)
        if batch.in_round:
            meta = self._round_forward(batch, out_cache_loc, ctx)
            if meta is None:
                return self.model.init_metadata(batch, out_cache_loc, full_to_swa)
        else:
            fb = release_batch(self.runner, batch, out_cache_loc)
            meta = ReleaseMetadata(layer_loc=out_cache_loc, swa_loc=out_cache_loc, rows=0, ctx=ctx, fb=fb,
                                   layer_fb=fb, scope=self.forward_scope)
            try:
                self.graphs.prepare(meta, batch)
            except Exception as e:     # the release's code: a finding at this boundary, the run goes on
                what = GRAPH_PREP.get(batch.graph, "init_forward_metadata")
                raise HookFailure(f"{what} (the release's)", f"raised {type(e).__name__}: {e}") from e
            self.release_paths[batch.graph] += 1
        self.release_forwards += 1
        self.release_modes[batch.mode] += 1
        first = next(iter(self.model_layers()), None)
        if first is not None:
            wl = self.write_loc(meta, first.layer, first.kind)
            meta.layer_loc, meta.swa_loc = wl.loc, wl.swa_loc if wl.swa_loc is not None else wl.loc
        return meta

    def _round_forward(self, batch, out_cache_loc: torch.Tensor, ctx) -> Optional[ReleaseMetadata]:
        """A forward of an EAGLE round as the release's worker runs it (engine_path/forward/speculative.py): its
        batch, bound to the round's plan, and its metadata; None where the release has no backend for it here (the
        reason counted: the model's boundary runs it)."""
        spec = self.model.engine.speculative
        nd, steps = spec.num_draft_tokens, spec.num_steps
        dev = out_cache_loc.device
        backend = self.backend
        if batch.mode == "draft_decode":
            backend = self._multistep(steps)
            if backend is None:
                self.model_forwards[self.multistep_why] += 1
                return None
        rnd = self.rounds.of(batch, nd, self.runner.planner, dev)
        write_window_rows(self.runner.req_to_token_pool.req_to_token, batch.requests, rnd, nd)
        what = "init_forward_metadata"
        graph = None
        try:
            if batch.mode == "target_verify":
                fb = verify_batch(self.runner, rnd, nd, steps, dev)
                if self._round_graph("verify", "decode_graph", batch, nd):
                    what = "the verify graph replay (DecodeCudaGraphRunner in TARGET_VERIFY mode)"
                    graph = self.graphs.verify.replay(fb, batch.padded_len // nd)
            elif batch.mode == "draft_extend":
                fb = draft_extend_batch(self.runner, rnd, batch.accepted, nd, dev)
                if self._round_graph("draft_extend", "draft_extend_graph", batch, nd):
                    what = "the draft-extend graph replay (EAGLEDraftExtendCudaGraphRunner.execute)"
                    graph = self.graphs.draft_extend.replay(fb, batch.padded_len // nd)
            else:
                if rnd.draft_fb is None:                # the round's first step: the whole draft's metadata once
                    rnd.draft_fb = draft_decode_batch(self.runner, rnd, steps, dev)
                    what = "init_forward_metadata (the multi-step draft backend's)"
                    backend.init_forward_metadata(rnd.draft_fb)
                fb = rnd.draft_fb
                draft_step(fb, rnd, batch.draft_step, steps)
                backend = backend.attn_backends[batch.draft_step]
            if batch.mode != "draft_decode" and graph is None:
                with self.forward_scope(None, backend):
                    backend.init_forward_metadata(fb)
        except Exception as e:
            raise HookFailure(f"{what} (the release's, {batch.mode})", f"raised {type(e).__name__}: {e}") from e
        self.release_paths[batch.graph if batch.graph == "eager" or graph is not None
                           else f"{batch.graph}, run eagerly"] += 1
        return ReleaseMetadata(layer_loc=out_cache_loc, swa_loc=out_cache_loc, rows=0, ctx=ctx, fb=fb, layer_fb=fb,
                               scope=lambda fb=None: self.forward_scope(fb, backend), spec=True, backend=backend,
                               graph=graph)

    def _round_graph(self, runner: str, path: str, batch, nd: int) -> bool:
        """Whether a round's forward on graph path ``path`` replays the release's runner ``runner`` (a
        GraphPaths attribute: ``verify``, ``draft_extend``); its size's layers are taken now if this is its first
        replay, and a capture the release cannot run there makes that path eager from this forward on, named."""
        g = self.graphs
        got = getattr(g, runner)
        if batch.graph != path or got is None:
            return False
        size, rest = divmod(int(batch.padded_len), nd)
        if rest or size not in got.captured:
            g.eager.setdefault(path, f"a batch padded to {batch.padded_len} rows is no capture size of {nd} rows a "
                                     f"request (sizes {list(got.sizes)})")
            return False
        if next((s for s in got.sizes if s >= batch.num_requests), None) != size:
            g.eager.setdefault(f"{path} padded for DP attention",
                               "the run pads it past its own capture size to the other ranks' tokens: the runner's "
                               "DP gather (require_mlp_tp_gather, global_num_tokens) is not driven here")
            return False
        try:
            got.writes_of(size)
        except Exception as e:
            g.eager[path] = f"the release's {runner} graph capture at size {size}: {raised_text(e)}"
            setattr(g, runner, None)
            return False
        return True

    def _multistep(self, steps: int):
        """The draft's multi-step backend of ``steps`` draft steps, built at the first decode step (None: why in
        :attr:`multistep_why`)."""
        if self.multistep is None and self.multistep_why is None:
            if not self.adapter.multistep:
                self.multistep_why = ("mode draft_decode (the release has no multi-step draft backend for this "
                                      "backend: DraftBackendFactory maps none; the model's boundary)")
            elif steps < 2:
                self.multistep_why = "mode draft_decode with one draft step (the release runs no draft forward)"
            else:
                try:
                    with printed_as_log(f"{self.adapter.name}'s multi-step draft backend"):
                        self.multistep = self.adapter.build(self.runner.bag, self.device.type, steps)
                    if self.device.type == "cpu":
                        kernels.install()
                except Exception as e:
                    self.multistep_why = (f"mode draft_decode (the release's multi-step draft backend failed to "
                                          f"build here: {raised_text(e)}; the model's boundary)")
        return self.multistep

    def write_loc(self, meta: ForwardMetadata, layer: int, kind: str) -> KVWriteLoc:
        if not isinstance(meta, ReleaseMetadata):
            return self.model.write_loc(meta, layer, kind)
        wl = meta.writes.get(layer)
        if wl is None:
            wl = self._replayed(meta, layer) if meta.graph is not None else self._run_layer(meta, layer, kind)
        swa = wl.swa_loc if getattr(wl, "mapping", None) is None else self._kernel_mapped(wl)
        return check_write_loc(KVWriteLoc(wl.loc, swa), kind, self.device)

    def _kernel_mapped(self, wl) -> torch.Tensor:
        """The SWA slots of a store kernel that maps each slot itself (aiter's), as it maps them when this layer
        runs: the mapping it was handed, of its loc. A graph replays what the capture handed it: a view of the
        pool's mapping reads that view of the mapping registered now (the engine has one device mapping)."""
        m = wl.mapping
        cur = getattr(self.runner.capture, "full_to_swa_index_mapping", None)
        if wl.pool_view and cur is not None and m.untyped_storage().data_ptr() != cur.untyped_storage().data_ptr():
            m = cur.as_strided(m.size(), m.stride(), m.storage_offset())
        return m[wl.loc.to(torch.int64)]

    def read_table(self, meta: ForwardMetadata, req_to_token, seq_lens, extend_lens, full_to_swa,
                   shared: Optional[dict] = None) -> ReadTable:
        if not isinstance(meta, ReleaseMetadata) or self.adapter.reads is None or \
                (meta.spec and not self.adapter.round_reads):
            why = ("model boundary" if not isinstance(meta, ReleaseMetadata) else "no adapter"
                   if self.adapter.reads is None else SPEC_READS)
            self.model_reads[why] += 1
            return self.model.read_table(meta, req_to_token, seq_lens, extend_lens, full_to_swa, shared)
        bs = int(seq_lens.shape[0])
        if not self._rows_as_read(req_to_token, seq_lens):
            self.model_reads[LOOKAHEAD] += 1
            return self.model.read_table(meta, req_to_token, seq_lens, extend_lens, full_to_swa, shared)
        backend = meta.backend if meta.backend is not None else self.backend
        # in a graph replay, the tables (and the metadata a span rule asks) are what the graph's kernels read
        with meta.graph.owner.installed(meta.graph) if meta.graph is not None else nullcontext():
            table = self.adapter.reads(backend, meta.fb, bs)
            spans = None if table is None or self.adapter.span is None else self.adapter.span.spans(
                backend, seq_lens.cpu().numpy(), extend_lens.cpu().numpy(), self.window,
                meta.fb.forward_mode.is_decode_or_idle())
        if table is None:
            self.model_reads["no table in this forward's metadata"] += 1
            return self.model.read_table(meta, req_to_token, seq_lens, extend_lens, full_to_swa, shared)
        table = check_read_table(table, bs, torch.device("cpu"))
        return table if spans is None else ReadTable(table.full, table.swa, spans)

    def _rows_as_read(self, req_to_token: torch.Tensor, seq_lens: torch.Tensor) -> bool:
        """Whether the ``req_to_token`` rows the release's metadata was built on (the requests' slots when the
        boundary made the batch) are the ones the run says this forward reads (taken when the batch was made: under
        the overlap scheduler, before the scheduler ran ahead)."""
        bs, width = req_to_token.shape
        lens = seq_lens.to(torch.int64).cpu().clamp(min=0, max=width)
        # each request's live entries only (a row is as wide as the context)
        row = torch.repeat_interleave(torch.arange(bs), lens)
        col = torch.arange(int(lens.sum())) - torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)
        mine = self.runner.req_to_token_pool.req_to_token
        theirs = req_to_token[row.to(req_to_token.device), col.to(req_to_token.device)]
        return torch.equal(mine[row.to(mine.device), col.to(mine.device)].to(torch.int64),
                           theirs.to(device=mine.device, dtype=torch.int64))

    def _read_mapping(self, full_to_swa: torch.Tensor) -> None:
        """The release's pool translates through the mapping the run's backends read (the allocator's own array,
        or a plug-in's device copy: the overlap timeline's, where the host's writes land as it plans them):
        registered with the pool's own ``register_mapping`` (every backend and the translator read it there)."""
        pool = self.runner.capture
        if not hasattr(pool, "register_mapping"):
            return                           # a plain pool (a draft of full layers): no SWA ids to read
        cur = pool.full_to_swa_index_mapping
        # (on CUDA the release's allocator runs on the host and its mapping is a host tensor: the forward's
        # backends read the run's device mapping, as the engine's read its one device mapping)
        if full_to_swa is not None and cur is not None and cur is not full_to_swa \
                and cur.shape == full_to_swa.shape and full_to_swa.device.type == self.device.type:
            pool.register_mapping(full_to_swa)
        # the pool is shared by a side's backends: another boundary may have registered it first
        now = pool.full_to_swa_index_mapping
        if self._mapping is not now:
            self._followed.update(follow_mapping(self.backend, self._mapping, now))
            self._mapping = now

    # ------------------------------------------------------------------ one layer of the release

    def model_layers(self):
        return self.runner.layers

    def forward_scope(self, fb=None, backend=None):
        return self._ctx.forward_context(self._ctx.ForwardContext(attn_backend=backend or self.backend),
                                         forward_batch=fb)

    def _attention(self, layer: int, kind: str):
        got = self._layers.get(layer)
        if got is None:
            window = self.window if kind == "swa" else -1
            got = self._layers[layer] = self._radix.RadixAttention(
                num_heads=1, head_dim=COMPACT_WIDTH, scaling=COMPACT_WIDTH ** -0.5, num_kv_heads=1,
                layer_id=layer - self.runner.layer_base,
                sliding_window_size=window)
        return got

    def layer_call(self, layer: int, kind: str, fb, rows: int, scope) -> Capture:
        """The release's layer forward on ``rows`` token rows of ``fb`` inside ``scope()`` (attention no-op'd where
        it cannot run): the one pool write it made. Raises HookFailure."""
        q, k, v = self._qkv(rows, fb.out_cache_loc.device)
        calls = self.runner.capture.calls
        calls.clear()
        try:
            with torch.no_grad(), scope():
                self._attention(layer, kind).forward(q, k, v, fb)
        except Exception as e:
            raise HookFailure("RadixAttention.forward (the release's)", f"raised {type(e).__name__}: {e}",
                              kind) from e
        if len(calls) != 1 or calls[0].layer_id != layer - self.runner.layer_base:
            raise HookFailure("RadixAttention.forward (the release's)",
                              f"made {len(calls)} pool writes for layer {layer} (one expected)", kind)
        return calls[0]

    def _qkv(self, rows: int, dev: torch.device) -> tuple:
        """A layer's Q, K and V of ``rows`` token rows (compact width; their values are never read: the capture
        pool records where a layer writes, not what), made once per row count and device."""
        key = (rows, dev)
        got = self._inputs.get(key)
        if got is None:
            dt = torch.bfloat16
            got = self._inputs[key] = (torch.zeros(rows, COMPACT_WIDTH, dtype=dt, device=dev),
                                       torch.zeros(rows, 1, COMPACT_WIDTH, dtype=dt, device=dev),
                                       torch.zeros(rows, 1, COMPACT_WIDTH, dtype=dt, device=dev))
        return got

    def _run_layer(self, meta: ReleaseMetadata, layer: int, kind: str):
        """An eager or prefill-graph layer: its forward now, recording its pool write."""
        fb = meta.layer_fb
        cap = self.layer_call(layer, kind, fb, int(fb.out_cache_loc.shape[0]), meta.scope)
        wl = cap.loc
        meta.writes[layer] = got = (wl if getattr(wl, "mapping", None) is not None else
                                    KVWriteLoc(getattr(wl, "loc", wl), getattr(wl, "swa_loc", None)))
        if not meta.rows:
            meta.rows = cap.rows
        return got

    def _replayed(self, meta: ReleaseMetadata, layer: int):
        """A decode-graph layer: what the tensors its store took at capture hold after this replay's prep (a store
        kernel that maps each slot itself: the pool's mapping now, of what its ``loc`` holds)."""
        wl = meta.graph.writes[layer]
        swa = getattr(wl, "swa_loc", None)
        if getattr(wl, "mapping", None) is not None:      # mapped at the layer's own time (write_loc)
            meta.writes[layer] = got = replace(wl, loc=wl.loc.clone())
        else:
            meta.writes[layer] = got = KVWriteLoc(wl.loc.clone(), None if swa is None else swa.clone())
        meta.rows = meta.graph.rows
        return got

    def describe(self) -> dict:
        """This backend's pieces (whose code ran each) and how many forwards each side ran."""
        pieces = [p.__dict__ for p in self.adapter.pieces(str(self.device))]
        if self.graphs is not None:
            pieces += [p.__dict__ for p in self.graphs.pieces()]
        if self._followed:
            pieces.append(Piece(f"backend's kept mapping: {', '.join(sorted(self._followed))}", "model",
                                "moved to the mapping the run registers with the pool per forward (in the engine "
                                "one device mapping is registered before the backends are built)").__dict__)
        if self.device.type == "cpu":
            pieces += [Piece(*p).__dict__ for p in kernels.pieces()]
        if self.release_modes.keys() & {"target_verify", "draft_decode", "draft_extend"}:
            pieces += [p.__dict__ for p in ROUND_PIECES]
        return {"pieces": pieces, "release_forwards": self.release_forwards,
                "release_paths": dict(self.release_paths), "release_modes": dict(self.release_modes),
                "model_forwards": dict(self.model_forwards), "model_reads": dict(self.model_reads)}


def follow_mapping(backend, old: torch.Tensor, new: torch.Tensor) -> list[str]:
    """The backend's own references to the pool's mapping moved to the one now registered (returns their names).

    A backend may keep the tensor the pool held at its construction (0.5.23's trtllm_mha:
    ``_swa_full_to_swa_mapping``, read by its in-graph metadata kernel). In the engine that is the one device
    mapping, registered before any backend is built; here the run registers the mapping its backends read per
    forward (the overlap timeline's device copy), so a kept reference would read the host's array instead,
    ahead of the timeline (a finished request's entries cleared before the forward that still writes them)."""
    moved = [name for name, value in vars(backend).items() if value is old]
    for name in moved:
        setattr(backend, name, new)
    return moved


class ReleaseBackends:
    """The run's backend source in engine mode: the release's backends where an adapter covers them, else the
    model's (named in :meth:`describe`)."""

    name = "engine"

    def __init__(self, api, runner_for, unavailable: Optional[str] = None):
        """``runner_for(side) -> Runner``: the model-runner stand-in of a model side (made once, on first use);
        ``unavailable``: why this release's backends cannot be driven at all (every boundary is the model's)."""
        self.api = api
        self.runner_for = runner_for
        self.unavailable = unavailable
        self.model = ModelBackends()
        self.boundaries: list[tuple[str, str, object, str]] = []       # (backend, side, boundary or None, why)
        self.rounds: dict[str, Rounds] = {}     # per backend: its EAGLE rounds, shared by its target and its draft

    def boundary(self, backend: str, design, engine, device: torch.device, *, side: str, page_size: int,
                 swa_pad: int):
        model = self.model.boundary(backend, design, engine, device, side=side, page_size=page_size, swa_pad=swa_pad)
        adapter = ADAPTERS.get(backend)
        why = self.unavailable or ("no adapter of this backend yet" if adapter is None else "")
        if why:
            self.boundaries.append((backend, side, None, why))
            return model
        runner = self.runner_for(side)
        rounds = self.rounds.setdefault(backend, Rounds())
        try:
            with printed_as_log(f"{backend}'s module or constructor"):
                built = adapter.build(runner.bag, device.type)
        except Exception as e:          # the release's constructor over the stand-in: say why, run the model's
            self.boundaries.append((backend, side, None, f"its constructor failed here: {raised_text(e)}"))
            return model
        if device.type == "cpu":
            kernels.install()            # the modules the constructor imported hold the kernel by name too
        got = ReleaseBoundary(model, adapter, runner, built, self.api, device, side=side, rounds=rounds)
        self.boundaries.append((backend, side, got, ""))
        return got

    def describe(self) -> dict:
        out = {}
        for backend, side, b, why in self.boundaries:
            out[f"{backend}/{side}"] = (b.describe() if b is not None else
                                        {"pieces": [{"piece": "the whole forward", "whose": "model", "why": why}]})
        return out
