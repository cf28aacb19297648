"""Designs: the write-location logic under test.

A design decides three things that SGLang's history changed, and that a proposed fix changes:

* ``fill_graph_swa_buffer``: how a decode CUDA graph's static SWA-location buffer is refreshed on
  replay (bug B2, #24743: the tail past the real batch was left stale);
* ``make_write_loc``: how a layer's ``KVWriteLoc`` is built from the ``loc`` the layer sees and the
  backend metadata's ``swa_loc`` (bug B1, #29460: nothing sliced a longer ``swa_loc``);
* ``padding``: the padding convention (SGLang's reserved slot 0; vLLM's -1 with skip; a dummy
  request's slots as in mini-sglang);
* ``size_draft_pools``: with speculative decoding, how many slots the draft model's pools get (bug B3,
  #17630: sized from the token count before the SWA adjustment, smaller than the target's full pool).

The draft model's layers cross the same ``make_write_loc`` (``ctx.mode`` is ``draft_extend`` or
``draft_decode`` there). The designs of the bug corpus beyond SGLang's own states live in
:mod:`simulator.corpus_designs` and are registered here.

Users write their own by subclassing :class:`Design` in a Python file and passing
``--design path/to/file.py:ClassName`` (see README, "Writing a design").
"""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

#: Padding conventions: name -> (pad value of out_cache_loc, store skip index)
PADDING_CONVENTIONS = {
    "slot0": "padded rows get location 0, the reserved slot; the store skips index 0",
    "slot0-absorb": "padded rows get location 0; the store writes them into the reserved slot (older kernels)",
    "skip-1": "padded rows get location -1 and the store skips -1 (vLLM, nano-vllm)",
    "dummy": "padded rows get the slots of a dummy request allocated at start (mini-sglang)",
}


class DesignError(RuntimeError):
    """A design broke the interface (e.g. an SWA layer got no swa_loc); names the design."""


@dataclass(frozen=True, slots=True)
class KVWriteLoc:
    """What a layer hands to the pool: full-pool locations and, for hybrid models, SWA locations."""

    loc: torch.Tensor
    swa_loc: Optional[torch.Tensor] = None


@dataclass(frozen=True, slots=True)
class BoundaryContext:
    """What a design may look at when building a write location."""

    backend: str
    backend_slices_swa_loc: bool   # the backend sliced swa_loc itself before KVWriteLoc (trtllm_mha, pre-fix)
    layer: int
    kind: str                      # "full" | "swa"
    mode: str
    graph: str
    num_token_non_padded: int
    # the backend builds window (SWA) indices in the EAGLE draft-extend CUDA-graph path (triton: no, #29858)
    backend_draft_extend_graph_window: bool = True


class Design:
    """Base design: SGLang after the corpus's fixes (#24743, #29460, #17630, and the open #29858).

    Override what your design changes.
    """

    name: str = "design"
    description: str = ""
    padding: str = "slot0"
    #: dtype of the decode graph's static SWA buffer
    graph_swa_dtype: torch.dtype = torch.int32

    def translate(self, out_cache_loc: torch.Tensor, full_to_swa: torch.Tensor) -> torch.Tensor:
        """Metadata init: ``swa_out_cache_loc = full_to_swa[out_cache_loc]``, once per forward."""
        return full_to_swa[out_cache_loc]

    def fill_graph_swa_buffer(self, buffer: torch.Tensor, swa_loc: torch.Tensor, padded: int) -> None:
        """Decode graph replay: ``buffer[:n]`` gets the translated locations, ``buffer[n:padded]`` zero."""
        n = swa_loc.shape[0]
        buffer[:n].copy_(swa_loc)
        buffer[n:padded].zero_()

    def make_write_loc(self, loc: torch.Tensor, swa_loc: Optional[torch.Tensor], ctx: BoundaryContext) -> KVWriteLoc:
        """Per layer: the post-#29460 KVWriteLoc keeps the first len(loc) entries of a longer swa_loc."""
        if swa_loc is not None and swa_loc.shape[0] != loc.shape[0]:
            swa_loc = swa_loc[: loc.shape[0]]
        return KVWriteLoc(loc, swa_loc)

    def size_draft_pools(self, target_full: int, target_swa: int, draft_full: int, draft_swa: int) -> tuple[int, int]:
        """Speculative decoding: slots of the draft's (full, SWA) pools, given the target's and the configured.

        The draft shares the target's allocator, so it writes at the target's indices: since #17630
        its pools are at least as large as the target's.
        """
        return max(draft_full, target_full), max(draft_swa, target_swa)


class SGLangPost29460(Design):
    name = "sglang-post-29460"
    description = ("KVWriteLoc.__post_init__ keeps the first len(loc) entries of swa_loc when lengths differ "
                   "(#29460); decode graph SWA buffer zeroed past the real batch (#24743). A shorter swa_loc "
                   "passes through unchanged: the fix's gap. With speculative decoding on a hybrid SWA draft, "
                   "triton's EAGLE draft-extend CUDA graph has no window indices (B4, #29858 open).")

    def make_write_loc(self, loc, swa_loc, ctx):
        if (ctx.kind == "swa" and ctx.mode == "draft_extend" and ctx.graph == "draft_extend_graph"
                and not ctx.backend_draft_extend_graph_window):
            # B4: no window indices were built for this graph; the draft's SWA layers address the SWA pool
            # with full-pool indices (slotscope sees at the write what the real kernels read)
            return KVWriteLoc(loc, loc)
        return super().make_write_loc(loc, swa_loc, ctx)


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

    def fill_graph_swa_buffer(self, buffer, swa_loc, padded):
        buffer[: swa_loc.shape[0]].copy_(swa_loc)


BUILTIN_DESIGNS: dict[str, type[Design]] = {
    d.name: d for d in (SGLangPost29460, SGLangPre29460, SGLangPre24743)
}


def register(cls: type[Design]) -> type[Design]:
    """Add a design class to the built-in table (used by the corpus of extra designs)."""
    BUILTIN_DESIGNS[cls.name] = cls
    return cls


from . import corpus_designs as _corpus_designs  # noqa: E402  (registers the corpus's designs)


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
    except Exception as e:  # the user's file: report, don't crash with a traceback
        raise DesignError(f"design file {path} failed to import: {type(e).__name__}: {e}") from e
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise DesignError(f"design file {path} has no class {cls_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Design)):
        raise DesignError(f"{path}:{cls_name} must subclass simulator.designs.Design")
    design = cls()
    if design.padding not in PADDING_CONVENTIONS:
        raise DesignError(f"{path}:{cls_name}.padding is {design.padding!r} "
                          f"(allowed: {', '.join(PADDING_CONVENTIONS)})")
    if not getattr(cls, "name", None) or cls.name == "design":
        design.name = f"{path.name}:{cls_name}"
    return design
