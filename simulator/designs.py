"""Designs: the write-location logic under test, and the protocol its hooks follow.

A design models the fix (or the bug) under test; the engine it runs in is modelled by the backend
specs (:mod:`simulator.backends`). Its hooks, each called with a :class:`BoundaryContext`:

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

and ``padding``, the :class:`~simulator.padding_convention.PaddingConvention` it pads with. What a
hook returns is checked as a kernel would check it (an index must be a 1-D int32 / int64 tensor on
the run's device); a wrong type, or an exception raised by a hook, becomes a ``design_error``
finding at that boundary and the run goes on. ``KeyboardInterrupt`` and ``SystemExit`` propagate.

The run makes one instance of the design per (backend, model side), a deep copy of the one it was
given, so per-backend state set in ``__init__`` or by a hook needs no keying by backend. The bug
corpus's designs beyond SGLang's own states live in :mod:`simulator.corpus_designs`.
"""
from __future__ import annotations

import copy
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np
import torch

from .padding_convention import PADDING_CONVENTIONS, SLOT0, PaddingConvention, padding_convention

if TYPE_CHECKING:
    from .backends import BackendSpec

__all__ = ["BoundaryContext", "Design", "DesignError", "HookFailure", "KVWriteLoc", "GRAPH_RUNNERS", "graph_runner",
           "ReadIds", "ReadTable", "read_ranges", "prefix_reads", "load_design", "BUILTIN_DESIGNS", "PaddingConvention", "PADDING_CONVENTIONS"]


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
    in the SWA pool. None: not built (nothing of that kind is checked)."""

    full: Optional[ReadIds]
    swa: Optional[ReadIds]

    def of(self, kind: str) -> Optional[ReadIds]:
        return self.full if kind == "full" else self.swa


def read_ranges(req_to_token: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> ReadIds:
    """Request i's slots ``req_to_token[i, start[i]:end[i]]`` as :class:`ReadIds` (all requests at once, no
    loop: one flat gather)."""
    if req_to_token.device.type == "cpu" and start.device.type == "cpu" and end.device.type == "cpu":
        got = _read_ranges_np(req_to_token, start, end)
        if got is not None:
            return got
    lens = (end - start).clamp(min=0)
    bs, dev = lens.shape[0], lens.device
    indptr = torch.zeros(bs + 1, dtype=torch.int64, device=dev)
    torch.cumsum(lens, 0, out=indptr[1:])
    total = int(indptr[-1])
    # entry j of request r is req_to_token[r, start[r] + j - indptr[r]]: one flat gather
    width = req_to_token.shape[1]
    offset = torch.arange(bs, device=dev) * width + start - indptr[:-1]
    flat = torch.arange(total, device=dev) + torch.repeat_interleave(offset, lens, output_size=total)
    return ReadIds(indptr, req_to_token.reshape(-1)[flat], start)


def _read_ranges_np(req_to_token: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> Optional[ReadIds]:
    """:func:`read_ranges` on CPU tensors, in numpy (the same values and dtypes; numpy's repeat and take are
    several times faster than torch's on the CPU). None where an entry would fall outside the table (the
    torch path raises its own error there)."""
    st = start.numpy()
    lens = np.maximum(end.numpy() - st, 0)
    bs = lens.shape[0]
    width = req_to_token.shape[1]
    nz = lens > 0
    if nz.any():
        lo = (np.arange(bs, dtype=np.int64) * width + st)[nz]
        if int(lo.min()) < 0 or int((lo + lens[nz]).max()) > bs * width:
            return None
    indptr = np.zeros(bs + 1, dtype=np.int64)
    np.cumsum(lens, out=indptr[1:])
    total = int(indptr[-1])
    offset = np.arange(bs, dtype=np.int64) * width + st - indptr[:-1]
    flat = np.repeat(offset, lens) + np.arange(total, dtype=np.int64)
    table = req_to_token.contiguous().numpy().reshape(-1)
    return ReadIds(torch.from_numpy(indptr), torch.from_numpy(table.take(flat)), start)


_PREFIX_CACHE: list = [None]     # (req_to_token, seq_lens, ReadIds) of the last call


def prefix_reads(req_to_token: torch.Tensor, seq_lens: torch.Tensor) -> ReadIds:
    """Every request's whole prefix, ``req_to_token[i, :seq_len[i]]`` (what full layers read). The same
    input tensors (the same objects: a step's backends get the same ones, and hooks do not mutate them)
    give the same table object, so the backends of a step share it and its read check."""
    last = _PREFIX_CACHE[0]
    if last is not None and last[0] is req_to_token and last[1] is seq_lens:
        return last[2]
    ids = read_ranges(req_to_token, torch.zeros_like(seq_lens), seq_lens)
    _PREFIX_CACHE[0] = (req_to_token, seq_lens, ids)
    return ids


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
    #: the padding convention (a value of simulator.padding_convention, or its name)
    padding: PaddingConvention = SLOT0
    #: dtype of the graph runners' static SWA-location buffers
    graph_swa_dtype: torch.dtype = torch.int32

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if isinstance(cls.__dict__.get("padding"), str):
            try:
                cls.padding = padding_convention(cls.padding)
            except ValueError as e:
                raise DesignError(f"design {cls.__name__}: padding: {e}") from None

    def translate(self, out_cache_loc: torch.Tensor, full_to_swa: torch.Tensor, ctx: BoundaryContext) -> torch.Tensor:
        """Metadata init, once per forward per backend: ``out_cache_loc`` (padding included) -> SWA slots.

        ``full_to_swa`` is the allocator's live int64 mapping (read only). Return a new 1-D int32 or
        int64 tensor, normally of ``len(out_cache_loc)``. ``ctx.spec.swa_ids`` says whether the
        backend takes these ids from the per-iteration plan ("plan") or translates itself ("translate").
        """
        return gather(full_to_swa, out_cache_loc)

    def fill_graph_loc_buffer(self, buffer: torch.Tensor, loc: torch.Tensor, padded: int, ctx: BoundaryContext) -> None:
        """Graph replay: refresh the static full-pool ``loc`` buffer (int64) in place, return None.

        ``buffer[:len(loc)]`` gets ``loc``; the tail ``buffer[len(loc):padded]`` gets the padding
        convention's pad value (``ctx.loc_pad``). Layers then see ``buffer[:padded]``.
        """
        n = loc.shape[0]
        buffer[:n].copy_(loc)
        buffer[n:padded].fill_(ctx.loc_pad)

    def fill_graph_swa_buffer(self, buffer: torch.Tensor, swa_loc: torch.Tensor, padded: int,
                              ctx: BoundaryContext) -> None:
        """Graph replay: refresh the static SWA-location buffer (``graph_swa_dtype``) in place, return None.

        ``swa_loc`` is ``translate``'s result. ``buffer[:n]`` gets it, ``buffer[n:padded]`` the
        convention's tail value (``ctx.swa_pad``: 0 for SGLang since #24743, -1 for vLLM).
        """
        n = swa_loc.shape[0]
        buffer[:n].copy_(swa_loc)
        buffer[n:padded].fill_(ctx.swa_pad)

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


class SGLangPost29460(Design):
    name = "sglang-post-29460"
    description = ("KVWriteLoc.__post_init__ keeps the first len(loc) entries of swa_loc when lengths differ "
                   "(#29460); decode graph SWA buffer zeroed past the real batch (#24743). A shorter swa_loc "
                   "passes through unchanged: the fix's gap. With speculative decoding on a hybrid SWA draft, "
                   "triton's EAGLE draft-extend CUDA graph has no window indices (B4, #29858 open).")

    def backend_spec(self, spec):
        return spec      # the engine as it is: B4 open


class SGLangPre29460(Design):
    name = "sglang-pre-29460"
    description = ("No slicing of swa_loc in KVWriteLoc; only trtllm_mha sliced its own swa_loc (#29457). "
                   "B1: swa_loc longer than loc under piecewise graphs with DP-attention padding.")

    def make_write_loc(self, loc, swa_loc, ctx):
        return KVWriteLoc(loc, swa_loc)


class SGLangPre24743(Design):
    name = "sglang-pre-24743"
    description = ("The decode graph's static SWA-location buffer is int64 and not zeroed past the real batch: "
                   "padded rows reuse SWA indices of the previous replay (B2, #24743).")
    graph_swa_dtype = torch.int64

    def fill_graph_swa_buffer(self, buffer, swa_loc, padded, ctx):
        buffer[: swa_loc.shape[0]].copy_(swa_loc)


BUILTIN_DESIGNS: dict[str, type[Design]] = {
    d.name: d for d in (SGLangPost29460, SGLangPre29460, SGLangPre24743)
}


def register(cls: type[Design]) -> type[Design]:
    """Add a design class to the built-in table (used by the corpus of extra designs)."""
    BUILTIN_DESIGNS[cls.name] = cls
    return cls


from . import corpus_designs as _corpus_designs  # noqa: E402,F401  (registers the corpus's designs)
from . import release_designs as _release_designs  # noqa: E402,F401  (registers the release designs)
from . import sharing_designs as _sharing_designs  # noqa: E402,F401  (registers the sharing issue's designs: P7)


# ---------------------------------------------------------------------------- the run's side of the protocol

class HookFailure(Exception):
    """A design hook raised, or returned what no kernel would take; becomes a ``design_error`` finding."""

    def __init__(self, hook: str, message: str, kind: Optional[str] = None):
        super().__init__(f"{hook}: {message}")
        self.hook = hook
        self.message = message
        self.kind = kind

    def describe(self, design: str, ctx: "BoundaryContext", layer: int) -> str:
        """The finding's message: the hook, what went wrong, and where (step, backend, side, layer, mode)."""
        return (f"design {design}: {self.hook} {self.message} at step {ctx.step} on {ctx.backend} "
                f"({ctx.side}, layer {layer}, mode {ctx.mode}, runner {ctx.runner})")


def call_hook(hook: str, fn: Callable, *args: Any) -> Any:
    """Call a design hook; an ``Exception`` it raises becomes a :class:`HookFailure` (BaseExceptions propagate)."""
    try:
        return fn(*args)
    except Exception as e:  # the design's code: reported as a finding, the run goes on
        raise HookFailure(hook, f"raised {type(e).__name__}: {e}") from e


def gather(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` for a 1-D table and integer index: on host tensors through numpy (a few us instead of
    torch's indexing, tens of us per call), the same values and dtype; an index out of range raises torch's own
    error (the text a design's failure reports), as ``table[index]`` does."""
    if table.device.type == "cpu" and index.device.type == "cpu" and table.dim() == 1 and index.dim() == 1 \
            and index.dtype in (torch.int32, torch.int64):
        try:
            return torch.from_numpy(table.numpy()[index.numpy()])
        except (IndexError, TypeError, RuntimeError):
            pass
    return table[index]


def _same_device(dev: torch.device, want: torch.device) -> bool:
    return dev.type == want.type and (want.index is None or dev.index is None or dev.index == want.index)


def check_index(value: Any, device: torch.device, hook: str, what: str) -> torch.Tensor:
    """What a store kernel accepts as an index: a 1-D int32 / int64 tensor on the run's device."""
    if not isinstance(value, torch.Tensor):
        raise HookFailure(hook, f"returned {what} of type {type(value).__name__}, not a torch.Tensor")
    if value.dtype not in (torch.int32, torch.int64):
        raise HookFailure(hook, f"returned {what} of dtype {str(value.dtype).replace('torch.', '')} "
                                f"(an index must be int32 or int64)")
    if not _same_device(value.device, device):
        raise HookFailure(hook, f"returned {what} on device {value.device}, the run is on {device}")
    if value.dim() != 1:
        raise HookFailure(hook, f"returned {what} of shape {tuple(value.shape)} (an index must be 1-D)")
    return value


def check_write_loc(wl: Any, kind: str, device: torch.device) -> KVWriteLoc:
    """A ``make_write_loc`` result as the hybrid pool takes it: SWA layers assert that ``swa_loc`` is present."""
    hook = "make_write_loc"
    if not isinstance(wl, KVWriteLoc):
        raise HookFailure(hook, f"returned {type(wl).__name__}, not a KVWriteLoc", kind)
    try:
        check_index(wl.loc, device, hook, "loc")
        if wl.swa_loc is not None:
            check_index(wl.swa_loc, device, hook, "swa_loc")
        elif kind == "swa":
            raise HookFailure(hook, "returned a KVWriteLoc without swa_loc for an SWA layer (the hybrid pool "
                                    "asserts it)")
    except HookFailure as f:
        f.kind = kind
        raise
    return wl


def check_read_table(table: Any, num_requests: int, device: torch.device) -> ReadTable:
    """A ``read_ids`` result as the attention kernels take it: per kind None or consistent CSR tensors."""
    hook = "read_ids"
    if not isinstance(table, ReadTable):
        raise HookFailure(hook, f"returned {type(table).__name__}, not a ReadTable", "full")
    for kind in ("full", "swa"):
        ids = table.of(kind)
        if ids is None:
            continue
        try:
            if not isinstance(ids, ReadIds):
                raise HookFailure(hook, f"returned {kind} of type {type(ids).__name__}, not ReadIds")
            check_index(ids.indices, device, hook, f"{kind}.indices")
            for what, t, n in (("indptr", ids.indptr, num_requests + 1), ("start", ids.start, num_requests)):
                check_index(t, device, hook, f"{kind}.{what}")
                if t.dtype != torch.int64 or t.shape[0] != n:
                    raise HookFailure(hook, f"returned {kind}.{what} of dtype {str(t.dtype).replace('torch.', '')} "
                                            f"and length {t.shape[0]} (int64 of length {n} expected)")
            if int(ids.indptr[0]) != 0 or int(ids.indptr[-1]) != ids.indices.shape[0] or \
                    bool((ids.indptr[1:] < ids.indptr[:-1]).any()):
                raise HookFailure(hook, f"returned {kind}.indptr that does not delimit its {ids.indices.shape[0]} "
                                        f"indices (must start at 0, not decrease, end at len(indices))")
        except HookFailure as f:
            f.kind = kind
            raise
    return table


def design_instance(design: Design) -> Design:
    """A fresh instance of a design for one (backend, model side): a deep copy of the given one."""
    try:
        return copy.deepcopy(design)
    except Exception as e:
        raise DesignError(f"design {design.name}: the run makes one copy per backend and model side, and "
                          f"copy.deepcopy failed: {type(e).__name__}: {e}") from e


def load_design(spec: str) -> Design:
    """A design by name, or ``path/to/file.py:ClassName`` for a user's own."""
    if spec in BUILTIN_DESIGNS:
        return BUILTIN_DESIGNS[spec]()
    if ":" not in spec or not spec.split(":", 1)[0].endswith(".py"):
        raise DesignError(f"unknown design {spec!r}: use one of {', '.join(sorted(BUILTIN_DESIGNS))} "
                          f"or path/to/file.py:ClassName")
    path_s, cls_name = spec.rsplit(":", 1)
    path = Path(path_s)
    if not path.is_file():
        raise DesignError(f"design file {path} does not exist")
    mod_name = f"slotscope_user_design_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(mod_name, path)
    assert module_spec and module_spec.loader
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[mod_name] = module
    try:
        module_spec.loader.exec_module(module)
    except DesignError as e:
        raise DesignError(f"design file {path}: {e}") from e
    except Exception as e:  # the user's file: report, don't crash with a traceback
        raise DesignError(f"design file {path} failed to import: {type(e).__name__}: {e}") from e
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise DesignError(f"design file {path} has no class {cls_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Design)):
        raise DesignError(f"{path}:{cls_name} must subclass simulator.designs.Design")
    try:
        design = cls()
    except Exception as e:
        raise DesignError(f"{path}:{cls_name}() raised {type(e).__name__}: {e}") from e
    design_padding(design, f"{path}:{cls_name}")
    if not getattr(cls, "name", None) or cls.name == "design":
        design.name = f"{path.name}:{cls_name}"
    return design


def design_padding(design: Design, where: Optional[str] = None) -> PaddingConvention:
    """The design's padding convention as a value (a name is looked up); DesignError on an unknown one."""
    try:
        return padding_convention(design.padding)
    except ValueError as e:
        raise DesignError(f"{where or design.name}.padding: {e}") from None
