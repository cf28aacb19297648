"""The design interface: the hooks a design overrides, and what a hook declares about itself.

A design models the fix (or the bug) under test; the engine it runs in is the engine model: each
backend's behaviour (:mod:`simulator.engine_model.backends`) and the release (:class:`Release`, the one
value a design declares about its engine). Its hooks, each called with a :class:`BoundaryContext`:

==========================  ====================================================  ===========================
hook                        when                                                  SGLang history it models
==========================  ====================================================  ===========================
``translate``               metadata init: once per forward per backend           ``full_to_swa[out_cache_loc]``
``fill_graph_loc_buffer``   graph replay: the static full-pool ``loc`` buffer      its tail (B2's twin)
``fill_graph_swa_buffer``   graph replay: the static SWA-location buffer           B2, #24743: stale tail
``read_ids``                metadata init: once per forward per backend           the page tables / kv indices
``make_write_loc``          every layer of every backend, every forward           B1, #29460: ``KVWriteLoc``
``size_draft_pools``        once per run, with speculative decoding                B3, #17630: draft pool size
``backend_spec``            once per boundary at set-up                            an engine fix (#29858)
==========================  ====================================================  ===========================

and three declared values: ``padding`` (the :class:`~simulator.engine_model.padding_convention.PaddingConvention`
it pads with), ``graph_swa_dtype`` and ``release``. What a hook returns is checked as a kernel would check it
(an index must be a 1-D int32 / int64 tensor on the run's device); a wrong type, or an exception raised by a
hook, becomes a ``design_error`` finding at that boundary and the run goes on. ``KeyboardInterrupt`` and
``SystemExit`` propagate.

**Declarations.** The run takes faster paths where a hook says it may (:func:`declare`): a
``make_write_loc`` declared ``"layer_free"`` (its result for a layer is its kind's: it reads ``loc``,
``swa_loc`` and the forward's context, not the layer) is asked once per kind and forward; a
``translate``, ``fill_graph_*`` or ``read_ids`` declared ``"pure"`` (it reads its tensors and the
context's per-forward values alone: no backend name, no state) gives backends of equal inputs one result;
a ``read_ids`` declared ``"base_reads"`` computes the base formula, which the GPU step runner builds
incrementally. The base hooks carry these declarations; an override carries none unless it declares them
(an undeclared override is always right, only slower). run.json's ``sources`` says which paths each run took.

The run makes one instance of the design per (backend, model side), a deep copy of the one it was
given, so per-backend state set in ``__init__`` or by a hook needs no keying by backend. The catalogue of
built-in designs is :mod:`simulator.designs.catalogue`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from simulator.designs.tables import gather, prefix_reads, read_ranges
from simulator.designs.types import BoundaryContext, DesignError, KVWriteLoc, ReadIds, ReadTable
from simulator.engine_model.padding_convention import SLOT0, PaddingConvention, padding_convention
from simulator.engine_model.release import MID_2026_RELEASE, Release
from simulator.engine_model.release_model import ReleaseBehaviour

if TYPE_CHECKING:
    from simulator.engine_model.backends import BackendSpec

#: what a hook may declare about itself (see the module docstring)
DECLARATIONS = {
    "layer_free": "make_write_loc: a layer's result is its kind's (one call per kind and forward)",
    "pure": ("translate / fill_graph_* / read_ids: its result depends on its tensor arguments and the forward's "
             "context alone (no backend name, no state; a fill rewrites buffer[:padded] whole)"),
    "base_reads": "read_ids: the base formula (the whole prefix; the window of every new token)",
}


def declare(*facts: str) -> Callable[[Callable], Callable]:
    """Mark a hook with what it declares about itself (names of :data:`DECLARATIONS`)."""
    bad = [f for f in facts if f not in DECLARATIONS]
    if bad:
        raise DesignError(f"declare: unknown declaration(s) {', '.join(map(repr, bad))} "
                          f"(one of {', '.join(DECLARATIONS)})")

    def mark(fn: Callable) -> Callable:
        fn.__slotscope_declares__ = frozenset(facts) | getattr(fn, "__slotscope_declares__", frozenset())
        return fn
    return mark


def declared(hook: Any, fact: str) -> bool:
    """Whether a hook (a bound method, or a function set on the instance) declares ``fact``."""
    fn = getattr(hook, "__func__", hook)
    return fact in getattr(fn, "__slotscope_declares__", ())


class Design:
    """Base design: SGLang after the corpus's fixes (#24743, #29460, #17630, and the open #29858).

    Override what your design changes. Every hook gets the ``ctx`` of its call. Tensors handed to a
    hook are on the run's device; ``out_cache_loc`` and ``full_to_swa`` are int64. Hooks must not
    mutate their tensor arguments, except the ``buffer`` of the ``fill_graph_*`` hooks.

    Per forward of each backend, in order: ``fill_graph_loc_buffer`` (graph runners only), then
    ``translate``, then ``fill_graph_swa_buffer`` (graph runners only), then ``read_ids`` (when the run
    checks reads), then ``make_write_loc`` once per layer. A per-forward hook that fails skips that backend's forward (one ``design_error``,
    layer -1); a failing ``make_write_loc`` skips that layer's write. The instance a hook runs on
    belongs to one (backend, model side) for the whole run.
    """

    name: str = "design"
    description: str = ""
    #: the padding convention (a value of simulator.engine_model.padding_convention, or its name)
    padding: PaddingConvention = SLOT0
    #: dtype of the graph runners' static SWA-location buffers
    graph_swa_dtype: torch.dtype = torch.int32
    #: the engine release it runs in (engine_model.release.Release; a ReleaseBehaviour alone is taken as that
    #: release's behaviour, the rest inherited)
    release: Release = MID_2026_RELEASE

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if isinstance(cls.__dict__.get("padding"), str):
            try:
                cls.padding = padding_convention(cls.padding)
            except ValueError as e:
                raise DesignError(f"design {cls.__name__}: padding: {e}") from None
        rel = cls.__dict__.get("release")
        if isinstance(rel, ReleaseBehaviour):
            parent = next(c.__dict__["release"] for c in cls.__mro__[1:] if "release" in c.__dict__)
            cls.release = parent.but(behaviour=rel)
        elif rel is not None and not isinstance(rel, Release):
            raise DesignError(f"design {cls.__name__}: release must be a Release (simulator.engine_model.release) "
                              f"or a ReleaseBehaviour, not {type(rel).__name__}")
        for legacy in ("sharing", "unified"):
            if legacy in cls.__dict__:
                raise DesignError(f"design {cls.__name__}: {legacy} is a fact of the release: declare it as "
                                  f"release = Release(..., {legacy}=...) (simulator.engine_model.release)")

    @declare("pure")
    def translate(self, out_cache_loc: torch.Tensor, full_to_swa: torch.Tensor, ctx: BoundaryContext) -> torch.Tensor:
        """Metadata init, once per forward per backend: ``out_cache_loc`` (padding included) -> SWA slots.

        ``full_to_swa`` is the allocator's live int64 mapping (read only). Return a new 1-D int32 or
        int64 tensor, normally of ``len(out_cache_loc)``. ``ctx.spec.swa_ids`` says whether the
        backend takes these ids from the per-iteration plan ("plan") or translates itself ("translate").
        """
        return gather(full_to_swa, out_cache_loc)

    @declare("pure")
    def fill_graph_loc_buffer(self, buffer: torch.Tensor, loc: torch.Tensor, padded: int, ctx: BoundaryContext) -> None:
        """Graph replay: refresh the static full-pool ``loc`` buffer (int64) in place, return None.

        ``buffer[:len(loc)]`` gets ``loc``; the tail ``buffer[len(loc):padded]`` gets the padding
        convention's pad value (``ctx.loc_pad``). Layers then see ``buffer[:padded]``.
        """
        n = loc.shape[0]
        buffer[:n].copy_(loc)
        buffer[n:padded].fill_(ctx.loc_pad)

    @declare("pure")
    def fill_graph_swa_buffer(self, buffer: torch.Tensor, swa_loc: torch.Tensor, padded: int,
                              ctx: BoundaryContext) -> None:
        """Graph replay: refresh the static SWA-location buffer (``graph_swa_dtype``) in place, return None.

        ``swa_loc`` is ``translate``'s result. ``buffer[:n]`` gets it, ``buffer[n:padded]`` the
        convention's tail value (``ctx.swa_pad``: 0 for SGLang since #24743, -1 for vLLM).
        """
        n = swa_loc.shape[0]
        buffer[:n].copy_(swa_loc)
        buffer[n:padded].fill_(ctx.swa_pad)

    @declare("pure", "base_reads")
    def read_ids(self, req_to_token: torch.Tensor, seq_lens: torch.Tensor, extend_lens: torch.Tensor,
                 full_to_swa: torch.Tensor, ctx: BoundaryContext) -> ReadTable:
        """Metadata init, once per forward per backend: the slots the forward's attention reads.

        ``req_to_token`` is ``[num_requests, max(seq_lens)]`` int64 (row i: request i's full slots by
        position, zeros past its ``seq_len``), ``seq_lens`` the tokens with K/V once this forward has
        written, ``extend_lens`` its new tokens per request (int64, batch order, real requests only).
        Full layers read the whole prefix, ``req_to_token[i, :seq_len]``; SWA layers read the window of
        every new token, ``full_to_swa[req_to_token[i, max(0, seq_len - extend_len + 1 - ctx.window):seq_len]]``
        (in decode the last ``window`` positions). Where the backend's graph path builds no window
        indices (``ctx.graph not in ctx.spec.window_graphs``, B4) the run reads SWA layers through
        ``full`` instead, as it writes them. Return a :class:`ReadTable` (``read_ranges`` builds one).
        """
        full = prefix_reads(req_to_token, seq_lens)
        start = (seq_lens - extend_lens + 1 - ctx.window).clamp(min=0)
        window = read_ranges(req_to_token, start, seq_lens)
        return ReadTable(full=full, swa=ReadIds(window.indptr, gather(full_to_swa, window.indices), window.start))

    @declare("layer_free")
    def make_write_loc(self, loc: torch.Tensor, swa_loc: Optional[torch.Tensor], ctx: BoundaryContext) -> KVWriteLoc:
        """Every layer: the ``KVWriteLoc`` the pool gets. The post-#29460 one keeps ``swa_loc[:len(loc)]``.

        ``loc`` is ``out_cache_loc`` as the layer sees it (narrowed to the real tokens under piecewise
        graphs), ``swa_loc`` the metadata's (after the backend's own slicing, if ``ctx.spec`` says it
        slices). Full layers write at ``loc``, SWA layers at ``swa_loc``: its length must equal the
        layer's K/V rows (``len(loc)``), or the store raises a length mismatch. Under real CUDA graphs
        (cuda_path) a replayed decode graph calls it only while capturing, as the engine's graphs do.
        ``ctx.full_to_swa`` is the live mapping at this layer (for a design that re-translates per layer).
        """
        if swa_loc is not None and swa_loc.shape[0] != loc.shape[0]:
            swa_loc = swa_loc[: loc.shape[0]]
        return KVWriteLoc(loc, swa_loc)

    def size_draft_pools(self, target_full: int, target_swa: int, draft_full: int, draft_swa: int) -> tuple[int, int]:
        """Speculative decoding, once per run: slots of the draft's (full, SWA) pools.

        The draft shares the target's allocator, so it writes at the target's indices: since #17630
        its pools are at least as large as the target's.
        """
        return max(draft_full, target_full), max(draft_swa, target_swa)

    def backend_spec(self, spec: "BackendSpec") -> "BackendSpec":
        """Once per boundary at set-up: the backend as the engine runs it under this design.

        A design that fixes the engine (not the write location) returns a changed spec. The base
        applies the open #29858: triton's EAGLE draft-extend graph builds window (SWA) indices.
        """
        return spec.with_window_graph("draft_extend_graph")






