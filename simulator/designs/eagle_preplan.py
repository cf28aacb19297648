"""Designs of the sharing issue's write-path bug (docs/SHARING.md): P7.

P7 (the dots hybrid backend, 0.5.23 ``dots_hybrid_backend.py``): EAGLE plans a speculative forward's
metadata *before* DP-attention / MLP padding adds the dummy request rows. The planned SWA write ids
cover the real tokens only, so ``swa_loc`` is shorter than the padded ``out_cache_loc``. #29460's
``KVWriteLoc`` slice only trims a *longer* ``swa_loc``: the shorter one reaches the store, a
``length_mismatch``. 0.5.23 detects the mismatch (``_metadata_mismatches_dp_padded_batch``) and rebuilds
the metadata eagerly over the padded batch (``_maybe_rebuild_dots_metadata``); slicing or zero-padding
was declared insufficient there.

Both states are the base :class:`~simulator.designs.Design` (post-#29460) with ``translate`` changed;
the engine's backends are not told apart (the dots backend is not one of ours), so the state applies to
every backend's speculative forwards.
"""
from __future__ import annotations

import torch

from simulator.designs.base import Design

#: the forwards EAGLE pre-plans (their metadata is built before the DP padding)
EAGLE_PREPLANNED_MODES = frozenset({"target_verify", "draft_extend", "draft_decode"})


def preplanned(ctx) -> bool:
    """Whether this forward's metadata was planned before DP padding added rows."""
    return ctx.mode in EAGLE_PREPLANNED_MODES and ctx.dp_padded_len > ctx.num_token_non_padded


class DotsEaglePreplan(Design):
    name = "dots-eagle-preplan"
    description = ("P7 (dots hybrid backend): EAGLE pre-plans speculative forwards before DP padding, so the SWA "
                   "write ids cover the real tokens only; swa_loc is shorter than the padded loc and #29460's "
                   "slice (longer only) lets it through: length_mismatch at the store.")

    def translate(self, out_cache_loc: torch.Tensor, full_to_swa: torch.Tensor, ctx) -> torch.Tensor:
        if preplanned(ctx):
            return full_to_swa[out_cache_loc[: ctx.num_token_non_padded]]
        return full_to_swa[out_cache_loc]


class DotsEaglePreplanRebuild(DotsEaglePreplan):
    name = "dots-eagle-preplan-rebuild"
    description = ("P7 fixed as in 0.5.23: a pre-planned forward whose metadata mismatches the DP-padded batch is "
                   "re-planned over the padded out_cache_loc, so swa_loc is len(loc) long.")

    def translate(self, out_cache_loc, full_to_swa, ctx):
        planned = super().translate(out_cache_loc, full_to_swa, ctx)
        if planned.shape[0] != out_cache_loc.shape[0]:       # _metadata_mismatches_dp_padded_batch
            return full_to_swa[out_cache_loc]                  # rebuilt eagerly over the padded batch
        return planned
