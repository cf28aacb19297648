"""The attention-backend boundary: where each backend's metadata, static buffers and per-layer write location
are made, and the seam where the source of a backend's behaviour plugs in.

A :class:`BackendSource` makes one :class:`Boundary` per (backend, model side): the model's
(:class:`ModelBackends`: each backend's :class:`~simulator.engine_model.backends.BackendSpec` run by a
:class:`BackendBoundary`) or, in engine mode, a release's own backends. The executors call a boundary only
through :class:`Boundary`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

import numpy as np
import torch

from simulator.designs.base import Design, declared
from simulator.designs.checks import call_hook, check_index, check_read_table, check_write_loc
from simulator.designs.loading import design_padding
from simulator.designs.tables import from_position_zero
from simulator.designs.types import BoundaryContext, DesignError, KVWriteLoc, ReadTable, graph_runner
from simulator.engine_model.backends import BACKEND_SPECS, BackendSpec
from simulator.engine_model.release_model import release_of
from simulator.records import STATIC_GRAPHS
from simulator.scenario import EngineConfig
from simulator.scheduling.batch import ForwardBatch


@dataclass(slots=True)
class ForwardMetadata:
    """What a backend keeps for one forward: the locations layers will see."""

    layer_loc: torch.Tensor            # out_cache_loc as a layer sees it (narrowed under PCG)
    swa_loc: torch.Tensor              # metadata.swa_out_cache_loc (padding included)
    rows: int                          # rows of K and V a layer produces (= len(layer_loc))
    ctx: BoundaryContext               # the forward's context (layer None)
    window: bool = True                # window (SWA) indices were built: else SWA layers get loc as swa_loc
    in_round: bool = False             # a forward of a speculative decode round (ForwardBatch.in_round)
    draft_step: Optional[int] = None   # a multi-step draft's step within its round (ForwardBatch.draft_step)


class BackendBoundary:
    """One backend of one model side across a run: its design instance, spec and static buffers."""

    def __init__(self, spec: BackendSpec, design: Design, engine: EngineConfig, device: torch.device, *,
                 side: str = "target", page_size: int = 1, swa_pad: int = 0):
        self.design = design
        try:
            self.spec = design.backend_spec(spec)
        except Exception as e:
            raise DesignError(f"design {design.name}: backend_spec({spec.name}) raised {type(e).__name__}: {e}") from e
        if not isinstance(self.spec, BackendSpec):
            raise DesignError(f"design {design.name}: backend_spec({spec.name}) returned "
                              f"{type(self.spec).__name__}, not a BackendSpec")
        self.padding = design_padding(design)
        self.release = release_of(design)
        self.engine = engine
        self.device = device
        self.side = side
        self.page_size = page_size
        self.swa_pad = swa_pad
        self.window = 0          # the model side's SWA window (set by the run)
        self.swa_layers = True   # whether the model side has SWA layers (set by the run)
        #: whether the run's mapping can change between this forward's layers (set by the overlap timeline)
        self.mapping_moves = False
        max_bs = max(engine.cuda_graph_bs) if engine.cuda_graph_bs else 1
        sp = engine.speculative
        # rows of a graph: one per request, or num_draft_tokens per request for TARGET_VERIFY / DRAFT_EXTEND
        self.max_rows = max_bs * (sp.num_draft_tokens if sp.enabled else 1)
        # each graph runner's static buffers, allocated at its first replay and reused like the engine's
        self._static: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def context(self, batch: ForwardBatch, full_to_swa: Optional[torch.Tensor] = None) -> BoundaryContext:
        return BoundaryContext(
            step=batch.step, backend=self.spec.name, side=self.side, mode=batch.mode, graph=batch.graph,
            runner=graph_runner(batch.mode, batch.graph), page_size=self.page_size,
            num_token_non_padded=batch.num_token_non_padded, dp_padded_len=batch.dp_padded_len,
            padded_len=batch.padded_len, spec=self.spec, padding=self.padding, loc_pad=batch.pad_value,
            swa_pad=self.swa_pad, window=self.window, full_to_swa=full_to_swa)

    def init_metadata(self, batch: ForwardBatch, out_cache_loc: torch.Tensor,
                      full_to_swa: torch.Tensor) -> ForwardMetadata:
        """Metadata init of one forward; raises HookFailure when a design hook fails (the forward is skipped).

        ``full_to_swa`` is the live mapping tensor: per-layer hooks see it as ``ctx.full_to_swa``."""
        ctx = self.context(batch, full_to_swa)
        if batch.graph in STATIC_GRAPHS:
            return self._replay_metadata(batch, out_cache_loc, full_to_swa, ctx)
        real = batch.num_token_non_padded
        swa = self._swa_ids(self._translated(batch, out_cache_loc), full_to_swa, ctx)
        window = batch.graph in self.spec.window_graphs
        if batch.graph == "piecewise":
            if self.spec.piecewise_padded_rows:
                # attention runs eagerly over the padded location as the batch carries it (vLLM)
                loc = out_cache_loc
            elif self.engine.piecewise_shrink:
                # each attention layer narrows out_cache_loc (and Q/K/V) to the real token count
                loc = out_cache_loc[:real]
            else:
                # no narrowing: the layer runs on the piece's static buffer, padded to the capture size
                loc = torch.full((batch.padded_len,), batch.pad_value, dtype=out_cache_loc.dtype, device=self.device)
                loc[:real] = out_cache_loc[:real]
            return ForwardMetadata(layer_loc=loc, swa_loc=swa, rows=int(loc.shape[0]), ctx=ctx, window=window,
                                   in_round=batch.in_round, draft_step=batch.draft_step)
        # eager DP-padded extends are narrowed per layer too where the release does it (0.5.23)
        rows = self.release.eager_layer_rows(batch.mode, batch.graph, real, batch.dp_padded_len)
        loc = out_cache_loc if rows is None else out_cache_loc[:rows]
        return ForwardMetadata(layer_loc=loc, swa_loc=swa, rows=int(loc.shape[0]), ctx=ctx, window=window,
                               in_round=batch.in_round, draft_step=batch.draft_step)

    def _translated(self, batch: ForwardBatch, out_cache_loc: torch.Tensor) -> torch.Tensor:
        """The full-pool ids the backend translates at metadata init: ``out_cache_loc``, or for a draft step of a
        round the round's whole draft window where the backend translates that (``BackendSpec.draft_step_swa``)."""
        if batch.draft_step is None or self.spec.draft_step_swa != "window" or batch.requests is None:
            return out_cache_loc
        steps = self.engine.speculative.num_steps
        starts = batch.window_starts().tolist()
        cols = np.concatenate([s.full[c:c + steps] for s, c in zip(batch.requests.slots, starts)])
        return torch.from_numpy(cols.astype(np.int64)).to(out_cache_loc.device)

    def _swa_ids(self, out_cache_loc: torch.Tensor, full_to_swa: torch.Tensor, ctx: BoundaryContext) -> torch.Tensor:
        swa = call_hook("translate", self.design.translate, out_cache_loc, full_to_swa, ctx)
        return check_index(swa, self.device, "translate", "swa_loc")

    def _replay_metadata(self, batch: ForwardBatch, out_cache_loc: torch.Tensor, full_to_swa: torch.Tensor,
                         ctx: BoundaryContext) -> ForwardMetadata:
        """A graph runner's replay: the static buffers the backend refreshes, then views of them."""
        loc_buf, swa_buf = self.static_buffers(batch.graph)
        padded = batch.padded_len
        refreshed = self.spec.static_buffers
        if "loc" in refreshed:
            call_hook("fill_graph_loc_buffer", self.design.fill_graph_loc_buffer, loc_buf, out_cache_loc, padded, ctx)
        if "swa_loc" in refreshed:
            translated = self._swa_ids(self._translated(batch, out_cache_loc), full_to_swa, ctx)
            call_hook("fill_graph_swa_buffer", self.design.fill_graph_swa_buffer, swa_buf, translated, padded, ctx)
        return ForwardMetadata(layer_loc=loc_buf[:padded], swa_loc=swa_buf[:padded], rows=padded, ctx=ctx,
                               window=batch.graph in self.spec.window_graphs, in_round=batch.in_round,
                               draft_step=batch.draft_step)

    def read_table(self, meta: ForwardMetadata, req_to_token: torch.Tensor, seq_lens: torch.Tensor,
                   extend_lens: torch.Tensor, full_to_swa: torch.Tensor,
                   shared: Optional[dict] = None) -> ReadTable:
        """The forward's read ids (metadata init, after the write locations); raises HookFailure when
        ``read_ids`` fails. ``shared``: a step's tables by window, for a design whose ``read_ids`` is declared
        ``pure`` (computed by the first backend of the step that asks, the same object for the others). The
        design's table as this backend's kernels read it: :meth:`kernel_read_lens` before, :meth:`as_kernels_read`
        after (the GPU step runner asks both around its own table, cuda_path/step.py)."""
        seq_lens, own = self.kernel_read_lens(meta, seq_lens)
        pure = shared is not None and not own and declared(self.design.read_ids, "pure")
        table = shared.get(self.window) if pure else None
        if table is None:
            table = call_hook("read_ids", self.design.read_ids, req_to_token, seq_lens, extend_lens, full_to_swa,
                              meta.ctx)
            table = check_read_table(table, int(seq_lens.shape[0]), self.device)
            if pure:
                shared[self.window] = table
        return self.as_kernels_read(meta, table, req_to_token, full_to_swa)

    def kernel_read_lens(self, meta: ForwardMetadata, seq_lens: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """(the key counts this backend's kernels read, whether they are not the forward's own): a draft step of a
        backend that reads only the committed keys (``ReleaseBehaviour.draft_step_reads_committed``, F2) reads its
        table as of the round's start, on a side with SWA layers (the others keep a plain pool and another
        kernel)."""
        if meta.draft_step is not None and self.swa_layers and \
                self.spec.name in self.release.draft_step_reads_committed:
            return seq_lens - (meta.draft_step + 1), True
        return seq_lens, False

    def as_kernels_read(self, meta: ForwardMetadata, table: ReadTable, req_to_token: Optional[torch.Tensor],
                        full_to_swa: torch.Tensor) -> ReadTable:
        """The design's table as this backend's kernels read it: without window indices (B4) SWA layers read the
        full-pool prefix ids; a backend whose round SWA tables gather from position 0 under the release
        (``ReleaseBehaviour.round_swa_from_zero``, F1, sglang#39287) does so for its verify's and its draft-extend
        graph's (``req_to_token`` is read then: never None for such a backend, whose table is not the base
        one)."""
        if not meta.window and table.full is not None:
            return ReadTable(full=table.full, swa=table.full)
        if meta.in_round and self.spec.name in self.release.round_swa_from_zero and table.swa is not None and \
                (meta.ctx.mode == "target_verify" or meta.ctx.graph == "draft_extend_graph"):
            return ReadTable(full=table.full, swa=from_position_zero(table.swa, req_to_token, full_to_swa))
        return table

    def static_buffers(self, graph: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(loc, swa_loc) static buffers of a graph runner, allocated zeroed at its first replay, then reused."""
        bufs = self._static.get(graph)
        if bufs is None:
            bufs = self._static[graph] = (
                torch.zeros(self.max_rows, dtype=torch.int64, device=self.device),
                torch.zeros(self.max_rows, dtype=self.design.graph_swa_dtype, device=self.device))
        return bufs

    def layer_free_write_loc(self) -> bool:
        """The design's ``make_write_loc`` is declared ``layer_free`` (a layer's result is its kind's)."""
        return declared(self.design.make_write_loc, "layer_free")

    def base_reads(self) -> bool:
        """The read table is the base formula (the design's ``read_ids`` declared ``base_reads``): the GPU runner
        may build it from the requests' slots instead of asking :meth:`read_table`."""
        rel = self.release
        return declared(self.design.read_ids, "base_reads") and \
            self.spec.name not in rel.round_swa_from_zero | rel.draft_step_reads_committed

    def span_checked(self) -> bool:
        """The read table is held to its span (simulator/oracle/read_rules.py): every table but the base
        formula's, which is exact by construction."""
        return not self.base_reads()

    def write_loc(self, meta: ForwardMetadata, layer: int, kind: str) -> KVWriteLoc:
        """One layer's write location; raises HookFailure when make_write_loc fails or returns a bad index."""
        loc = meta.layer_loc
        # without window indices (B4) an SWA layer addresses the SWA pool with the full-pool loc
        swa: Optional[torch.Tensor] = meta.swa_loc if meta.window or kind != "swa" else loc
        if self.spec.slices_swa_loc and swa is not None and swa.shape[0] > loc.shape[0]:
            swa = swa[: loc.shape[0]]
        if self.spec.name in self.release.kernel_write_backends:
            # its store kernel maps every slot of the layer's loc itself when the layer runs: no SWA ids on a full
            # layer, and an SWA layer's are the mapping of its loc then: live where a mapping write can land between
            # layers (the overlap timeline's); elsewhere the metadata's translation where it covers the same rows
            if kind == "full":
                swa = None
            elif meta.window and meta.ctx.full_to_swa is not None and (
                    self.mapping_moves or swa is None or swa.shape[0] != loc.shape[0]):
                swa = meta.ctx.full_to_swa[loc.to(torch.int64)]
        wl = call_hook("make_write_loc", self.design.make_write_loc, loc, swa, meta.ctx.at_layer(layer, kind))
        return check_write_loc(wl, kind, self.device)


class Boundary(Protocol):
    """What the executors ask of one backend of one model side across a run (:class:`BackendBoundary` is the
    model's)."""

    design: Design           # its own instance of the run's design
    spec: BackendSpec        # the backend as the engine runs it (after the design's ``backend_spec``)
    window: int              # the side's SWA window (set by the run)
    swa_layers: bool         # the side has SWA layers (set by the run: an EAGLE draft may have full layers only)
    mapping_moves: bool      # the run's mapping can change between a forward's layers (set by the overlap timeline)

    def context(self, batch: ForwardBatch, full_to_swa: Optional[torch.Tensor] = None) -> BoundaryContext: ...

    def init_metadata(self, batch: ForwardBatch, out_cache_loc: torch.Tensor,
                      full_to_swa: torch.Tensor) -> ForwardMetadata: ...

    def read_table(self, meta: ForwardMetadata, req_to_token: torch.Tensor, seq_lens: torch.Tensor,
                   extend_lens: torch.Tensor, full_to_swa: torch.Tensor,
                   shared: Optional[dict] = None) -> ReadTable: ...

    def write_loc(self, meta: ForwardMetadata, layer: int, kind: str) -> KVWriteLoc: ...

    def static_buffers(self, graph: str) -> tuple[torch.Tensor, torch.Tensor]: ...

    def layer_free_write_loc(self) -> bool: ...

    def base_reads(self) -> bool: ...

    def span_checked(self) -> bool: ...


class BackendSource(Protocol):
    """Where each backend's behaviour comes from; ``name`` is run.json's ``sources.backends``."""

    name: str

    def boundary(self, backend: str, design: Design, engine: EngineConfig, device: torch.device, *, side: str,
                 page_size: int, swa_pad: int) -> Boundary: ...


class ModelBackends:
    """The model's backends: each one's :data:`~simulator.engine_model.backends.BACKEND_SPECS` entry."""

    name = "model"

    def __init__(self, specs: Optional[dict[str, BackendSpec]] = None):
        self.specs = BACKEND_SPECS if specs is None else specs

    def boundary(self, backend: str, design: Design, engine: EngineConfig, device: torch.device, *, side: str,
                 page_size: int, swa_pad: int) -> BackendBoundary:
        return BackendBoundary(self.specs[backend], design, engine, device, side=side, page_size=page_size,
                               swa_pad=swa_pad)
