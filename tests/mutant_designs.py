"""Small realistic buggy designs ("mutants"): each is the fixed design with one mistake in one hook.

The fixed design here is ``kvwriteloc-strict`` (:class:`Fixed`): SGLang after every known fix (#24743,
#29460, #17630, #29858) plus the strict ``KVWriteLoc`` that also pads a shorter ``swa_loc`` with the
padding slot (the post-#29460 gap). It is clean on every shipped scenario. Every mutant below subclasses
it and overrides exactly one hook with the kind of mistake an engine developer writes; its docstring
says the mistake. tests/test_mutants.py asserts that a shipped scenario catches each one.

``MUTANTS`` lists them all; ``CATCHER`` names, for each, the shipped scenario that catches it most
cheaply (the smallest one that exercises its path) and the class of the first finding it shows there.
Several are caught only by one kind of scenario: the page-size mistakes by the paged ones, the narrow
index types by the deployment-size pool, the draft-pool sizes by pools that fill to their last page,
the shorter-``swa_loc`` padding by unshrunk piecewise layers.
"""
from __future__ import annotations

import dataclasses

import torch

from simulator.designs import KVWriteLoc, load_design

#: the fixed design every mutant starts from
Fixed = type(load_design("kvwriteloc-strict"))

#: the page size the paged shipped scenarios use (scenarios/paths-paged.toml, paths-spec-paged.toml)
PAGE = 16

# ------------------------------------------------------------------------------------ make_write_loc


def _strict(loc: torch.Tensor, swa_loc: torch.Tensor) -> torch.Tensor:
    """The fixed design's shorter-swa_loc padding (used by mutants whose mistake is elsewhere)."""
    if swa_loc.shape[0] < loc.shape[0]:
        swa_loc = torch.cat([swa_loc, loc[swa_loc.shape[0]:].clamp(max=0).to(swa_loc.dtype)])
    return swa_loc


class SliceOffByOne(Fixed):
    """Slices a longer ``swa_loc`` to ``len(loc) - 1`` (an off-by-one in the bound): the SWA store's
    index is one row short of K/V, a length mismatch wherever DP padding meets piecewise graphs."""

    name = "mutant-slice-off-by-one"

    def make_write_loc(self, loc, swa_loc, ctx):
        if swa_loc is not None and swa_loc.shape[0] > loc.shape[0]:
            swa_loc = swa_loc[: loc.shape[0] - 1]
        elif swa_loc is not None:
            swa_loc = _strict(loc, swa_loc)
        return KVWriteLoc(loc, swa_loc)


class SliceWrongEnd(Fixed):
    """Keeps the *last* ``len(loc)`` entries of a longer ``swa_loc`` (``swa_loc[-len(loc):]``): the
    tail holds the DP-padding rows' slot 0, so real tokens' SWA rows go to the reserved slot or to
    another token's slot."""

    name = "mutant-slice-wrong-end"

    def make_write_loc(self, loc, swa_loc, ctx):
        if swa_loc is not None and swa_loc.shape[0] > loc.shape[0]:
            swa_loc = swa_loc[-loc.shape[0]:]
        elif swa_loc is not None:
            swa_loc = _strict(loc, swa_loc)
        return KVWriteLoc(loc, swa_loc)


class SliceSkipsFirst(Fixed):
    """Slices ``swa_loc[1:len(loc) + 1]``, as if entry 0 were the reserved slot's: every real token's
    SWA row lands in its successor's slot (and the last in a padding row's)."""

    name = "mutant-slice-skips-first"

    def make_write_loc(self, loc, swa_loc, ctx):
        if swa_loc is not None and swa_loc.shape[0] > loc.shape[0]:
            swa_loc = swa_loc[1: loc.shape[0] + 1]
        elif swa_loc is not None:
            swa_loc = _strict(loc, swa_loc)
        return KVWriteLoc(loc, swa_loc)


class SliceExtendOnly(Fixed):
    """Slices a longer ``swa_loc`` only when ``ctx.mode == "extend"``: MIXED batches, which piecewise
    graphs serve like EXTEND ones, still hand a longer ``swa_loc`` to the store."""

    name = "mutant-slice-extend-only"

    def make_write_loc(self, loc, swa_loc, ctx):
        if ctx.mode == "extend":
            return super().make_write_loc(loc, swa_loc, ctx)
        if swa_loc is not None and swa_loc.shape[0] < loc.shape[0]:
            swa_loc = _strict(loc, swa_loc)
        return KVWriteLoc(loc, swa_loc)


class SlicePlanBackendsOnly(Fixed):
    """Slices only on the backends that take SWA ids from SGLang's plan (flashinfer, triton,
    flashattention, trtllm_mha, musa), forgetting the three that translate themselves (aiter, xpu,
    torch_native): those keep B1."""

    name = "mutant-slice-plan-backends-only"

    def make_write_loc(self, loc, swa_loc, ctx):
        if ctx.backend in ("aiter", "xpu", "torch_native"):
            return KVWriteLoc(loc, swa_loc)
        return super().make_write_loc(loc, swa_loc, ctx)


class SliceToRealTokens(Fixed):
    """Cuts ``swa_loc`` to ``ctx.num_token_non_padded`` instead of to ``len(loc)``: right under
    piecewise graphs, but wherever ``loc`` keeps its padding (eager DP-padded batches, graph
    replays) the SWA index is now shorter than K/V."""

    name = "mutant-slice-to-real-tokens"

    def make_write_loc(self, loc, swa_loc, ctx):
        if swa_loc is not None:
            swa_loc = swa_loc[: ctx.num_token_non_padded]
        return KVWriteLoc(loc, swa_loc)


class FallBackToLoc(Fixed):
    """When the lengths differ, uses ``loc`` as the SWA location ("same tokens, same order"): SWA
    layers address the smaller SWA pool with full-pool indices."""

    name = "mutant-fall-back-to-loc"

    def make_write_loc(self, loc, swa_loc, ctx):
        if swa_loc is not None and swa_loc.shape[0] != loc.shape[0]:
            swa_loc = loc
        return KVWriteLoc(loc, swa_loc)


class PadShortWithLastLive(Fixed):
    """Pads a shorter ``swa_loc`` by repeating its last entry (a live slot) instead of the padding
    slot: the padding rows of an unshrunk piecewise batch overwrite the last real token's SWA row."""

    name = "mutant-pad-short-with-last-live"

    def make_write_loc(self, loc, swa_loc, ctx):
        if swa_loc is not None and swa_loc.shape[0] > loc.shape[0]:
            swa_loc = swa_loc[: loc.shape[0]]
        elif swa_loc is not None and 0 < swa_loc.shape[0] < loc.shape[0]:
            swa_loc = torch.cat([swa_loc, swa_loc[-1:].expand(loc.shape[0] - swa_loc.shape[0])])
        return KVWriteLoc(loc, swa_loc)


class PadShortWithMinus1(Fixed):
    """Pads a shorter ``swa_loc`` with -1 (vLLM's habit) under SGLang's store, which skips only slot 0:
    -1 is an out-of-range index (a device assert on the GPU)."""

    name = "mutant-pad-short-with-minus-1"

    def make_write_loc(self, loc, swa_loc, ctx):
        if swa_loc is not None and swa_loc.shape[0] > loc.shape[0]:
            swa_loc = swa_loc[: loc.shape[0]]
        elif swa_loc is not None and swa_loc.shape[0] < loc.shape[0]:
            pad = torch.full((loc.shape[0] - swa_loc.shape[0],), -1, dtype=swa_loc.dtype, device=swa_loc.device)
            swa_loc = torch.cat([swa_loc, pad])
        return KVWriteLoc(loc, swa_loc)


class DraftSwaAtFullLoc(Fixed):
    """Assumes a draft model has no SWA layers: on the draft side every layer writes at ``loc``, so the
    draft's SWA layer addresses its SWA pool with full-pool indices on every path (B4 everywhere)."""

    name = "mutant-draft-swa-at-full-loc"

    def make_write_loc(self, loc, swa_loc, ctx):
        if ctx.mode in ("draft_extend", "draft_decode"):
            return KVWriteLoc(loc, loc)
        return super().make_write_loc(loc, swa_loc, ctx)


class Int16Loc(Fixed):
    """Packs the full-pool locations into an int16 field (a compact per-layer metadata struct): fine
    for small test pools, but indices past 32,767 wrap negative in a deployment-size pool."""

    name = "mutant-int16-loc"

    def make_write_loc(self, loc, swa_loc, ctx):
        wl = super().make_write_loc(loc, swa_loc, ctx)
        return KVWriteLoc(wl.loc.to(torch.int16).to(wl.loc.dtype), wl.swa_loc)


# ------------------------------------------------------------------------------------ size_draft_pools


class DraftSwaPoolNotEnlarged(Fixed):
    """Enlarges the draft's full pool to the target's (#17630) but keeps its SWA pool as configured:
    the draft's SWA layer writes at the target's SWA indices, past its smaller pool."""

    name = "mutant-draft-swa-pool-not-enlarged"

    def size_draft_pools(self, target_full, target_swa, draft_full, draft_swa):
        return max(draft_full, target_full), draft_swa


class DraftPoolsSwapped(Fixed):
    """Swaps the target's sizes: the draft's full pool gets at least the target's SWA size and its SWA
    pool the target's full size, so the draft's full pool is too small."""

    name = "mutant-draft-pools-swapped"

    def size_draft_pools(self, target_full, target_swa, draft_full, draft_swa):
        return max(draft_full, target_swa), max(draft_swa, target_full)


class DraftFullPoolPageShort(Fixed):
    """Takes one page (16 slots) off the draft's full pool for the reserved page, which the pool adds
    itself: the last page of the target's full pool has no rows in the draft's."""

    name = "mutant-draft-full-pool-page-short"

    def size_draft_pools(self, target_full, target_swa, draft_full, draft_swa):
        return max(draft_full, target_full) - PAGE, max(draft_swa, target_swa)


class DraftSwaPoolPageShort(Fixed):
    """Takes one page (16 slots) off the draft's SWA pool for the reserved page, which the pool adds
    itself: the last page of the target's SWA pool has no rows in the draft's."""

    name = "mutant-draft-swa-pool-page-short"

    def size_draft_pools(self, target_full, target_swa, draft_full, draft_swa):
        return max(draft_full, target_full), max(draft_swa, target_swa) - PAGE


class DraftSwaPoolSlotShort(Fixed):
    """Takes one slot off the draft's SWA pool for the reserved slot 0, which the pool's extra page holds
    already: the SWA pool's very last slot has no row in the draft's."""

    name = "mutant-draft-swa-pool-slot-short"

    def size_draft_pools(self, target_full, target_swa, draft_full, draft_swa):
        return max(draft_full, target_full), max(draft_swa, target_swa) - 1


class DraftPoolsFromRatio(Fixed):
    """Sizes the draft's SWA pool from the draft's configured ratio applied to the enlarged full pool
    (``full * draft_swa / draft_full``) instead of taking the target's SWA size."""

    name = "mutant-draft-pools-from-ratio"

    def size_draft_pools(self, target_full, target_swa, draft_full, draft_swa):
        full = max(draft_full, target_full)
        return full, full * draft_swa // draft_full


# ------------------------------------------------------------------------------------ translate


class TranslateStaleSnapshot(Fixed):
    """Takes a copy of ``full_to_swa`` at its first forward (as if it were a constant captured with a
    graph) and translates through that copy ever after: slots allocated, freed or evicted since then
    translate to what they were."""

    name = "mutant-translate-stale-snapshot"

    def translate(self, out_cache_loc, full_to_swa, ctx):
        if not hasattr(self, "_table"):
            self._table = full_to_swa.clone()
        return self._table[out_cache_loc]


class TranslateMemoByLength(Fixed):
    """Memoises the translation by batch length (a shape-keyed cache, like graph capture): a forward of
    the same length as an earlier one reuses that forward's SWA slots."""

    name = "mutant-translate-memo-by-length"

    def translate(self, out_cache_loc, full_to_swa, ctx):
        memo = self.__dict__.setdefault("_memo", {})
        n = int(out_cache_loc.shape[0])
        if n not in memo:
            memo[n] = full_to_swa[out_cache_loc]
        return memo[n]


class TranslatePageBase(Fixed):
    """Translates per page, ``full_to_swa[loc - loc % page]``, and forgets to add the offset inside the
    page back: every token of a page writes the page's first SWA slot. Right at page size 1."""

    name = "mutant-translate-page-base"

    def translate(self, out_cache_loc, full_to_swa, ctx):
        return full_to_swa[out_cache_loc - out_cache_loc % ctx.page_size]


class TranslateDraftIdentity(Fixed):
    """Skips the translation on the draft side ("the draft's pools are indexed like the allocator"):
    the draft's SWA layer addresses its SWA pool with full-pool indices on every path."""

    name = "mutant-translate-draft-identity"

    def translate(self, out_cache_loc, full_to_swa, ctx):
        if ctx.side == "draft":
            return out_cache_loc.clone()
        return full_to_swa[out_cache_loc]


class TranslateClampsPadding(Fixed):
    """Clamps ``out_cache_loc`` to ``>= 1`` before the lookup ("never index the reserved slot"): padded
    rows translate to the SWA slot of full slot 1, a live token's, instead of 0."""

    name = "mutant-translate-clamps-padding"

    def translate(self, out_cache_loc, full_to_swa, ctx):
        return full_to_swa[out_cache_loc.clamp(min=1)]


class TranslateRealThenReplicate(Fixed):
    """Translates only the real tokens and pads back to ``len(out_cache_loc)`` by repeating the last
    one (replicate padding): DP-padding rows write padding K/V into a live SWA slot."""

    name = "mutant-translate-real-then-replicate"

    def translate(self, out_cache_loc, full_to_swa, ctx):
        n = ctx.num_token_non_padded
        swa = full_to_swa[out_cache_loc[:n]]
        extra = out_cache_loc.shape[0] - n
        if extra > 0 and n > 0:
            swa = torch.cat([swa, swa[-1:].expand(extra)])
        return swa


class TranslateIdentity(Fixed):
    """Skips the translation altogether ("full and SWA slots share one numbering"): SWA layers address
    the smaller SWA pool with full-pool indices."""

    name = "mutant-translate-identity"

    def translate(self, out_cache_loc, full_to_swa, ctx):
        return out_cache_loc.clone()


class TranslatePlanIdsTwice(Fixed):
    """On the backends that take SWA ids from SGLang's plan (``ctx.spec.swa_ids == "plan"``) translates
    those ids again, as the self-translating backends do: ``full_to_swa[full_to_swa[loc]]``."""

    name = "mutant-translate-plan-ids-twice"

    def translate(self, out_cache_loc, full_to_swa, ctx):
        swa = full_to_swa[out_cache_loc]
        return full_to_swa[swa] if ctx.spec.swa_ids == "plan" else swa


class TranslateLagsOneForward(Fixed):
    """Translates through the mapping as it was at the previous forward (a copy refreshed after use, as
    an overlapped scheduler's stale read would see it): this forward's new tokens are still unmapped."""

    name = "mutant-translate-lags-one-forward"

    def translate(self, out_cache_loc, full_to_swa, ctx):
        table = self.__dict__.get("_previous", full_to_swa)
        swa = table[out_cache_loc]
        self._previous = full_to_swa.clone()
        return swa


class TranslateUint16(Fixed):
    """Keeps the translated SWA ids in a uint16 staging buffer (ample for a test pool): in a deployment-size
    pool SWA slots past 65,535 wrap to other tokens' slots."""

    name = "mutant-translate-uint16"

    def translate(self, out_cache_loc, full_to_swa, ctx):
        return full_to_swa[out_cache_loc] % 65536


# ------------------------------------------------------------------------------------ fill_graph_swa_buffer


class SwaBufferUpToNMinus1(Fixed):
    """Refreshes the static SWA buffer only up to ``n - 1`` (``buffer[:n-1]``) and pads from there: the
    batch's last token writes its SWA row to the padding slot."""

    name = "mutant-swa-buffer-up-to-n-minus-1"

    def fill_graph_swa_buffer(self, buffer, swa_loc, padded, ctx):
        n = swa_loc.shape[0]
        buffer[: n - 1].copy_(swa_loc[: n - 1])
        buffer[n - 1:padded].fill_(ctx.swa_pad)


class SwaTailOffByOne(Fixed):
    """Pads the static SWA buffer's tail from ``n + 1`` (``buffer[n+1:padded]``): one row past the batch
    keeps the previous replay's SWA slot (B2 with one stale row)."""

    name = "mutant-swa-tail-off-by-one"

    def fill_graph_swa_buffer(self, buffer, swa_loc, padded, ctx):
        n = swa_loc.shape[0]
        buffer[:n].copy_(swa_loc)
        buffer[n + 1:padded].fill_(ctx.swa_pad)


class SwaTailRepeatsLast(Fixed):
    """Fills the static SWA buffer's tail with the last real entry (a live slot) instead of the pad value:
    the padded rows overwrite the batch's last token's SWA row."""

    name = "mutant-swa-tail-repeats-last"

    def fill_graph_swa_buffer(self, buffer, swa_loc, padded, ctx):
        n = swa_loc.shape[0]
        buffer[:n].copy_(swa_loc)
        if n:
            buffer[n:padded].fill_(int(swa_loc[-1]))


class SwaTailMinus1(Fixed):
    """Fills the static SWA buffer's tail with -1 (vLLM's convention) under SGLang's store, which skips
    only slot 0: every padded row is an out-of-range index."""

    name = "mutant-swa-tail-minus-1"

    def fill_graph_swa_buffer(self, buffer, swa_loc, padded, ctx):
        n = swa_loc.shape[0]
        buffer[:n].copy_(swa_loc)
        buffer[n:padded].fill_(-1)


class SwaTailTargetOnly(Fixed):
    """Has #24743's tail zeroing in the target's graph runners only; the draft model's runners
    (draft-decode, draft-extend) keep the previous replay's SWA slots past the batch."""

    name = "mutant-swa-tail-target-only"

    def fill_graph_swa_buffer(self, buffer, swa_loc, padded, ctx):
        if ctx.side == "target":
            return super().fill_graph_swa_buffer(buffer, swa_loc, padded, ctx)
        buffer[: swa_loc.shape[0]].copy_(swa_loc)


class SwaRefreshSkippedSameSize(Fixed):
    """Skips the refresh when the batch has as many rows as at the previous replay ("nothing changed"):
    the buffer keeps the previous forward's SWA slots."""

    name = "mutant-swa-refresh-skipped-same-size"

    def fill_graph_swa_buffer(self, buffer, swa_loc, padded, ctx):
        n = int(swa_loc.shape[0])
        last = self.__dict__.setdefault("_last", {})
        if last.get(ctx.graph) == (n, padded):
            return
        last[ctx.graph] = (n, padded)
        super().fill_graph_swa_buffer(buffer, swa_loc, padded, ctx)


# ------------------------------------------------------------------------------------ fill_graph_loc_buffer


class LocTailStale(Fixed):
    """Copies the real rows into the static full-pool ``loc`` buffer but leaves its tail as the previous
    replay left it (B2's twin): padded rows of full layers write into other requests' live slots."""

    name = "mutant-loc-tail-stale"

    def fill_graph_loc_buffer(self, buffer, loc, padded, ctx):
        buffer[: loc.shape[0]].copy_(loc)


class LocUpToNMinus1(Fixed):
    """Refreshes the static full-pool ``loc`` buffer only up to ``n - 1``: the batch's last token writes
    its full-layer rows to the padding slot."""

    name = "mutant-loc-up-to-n-minus-1"

    def fill_graph_loc_buffer(self, buffer, loc, padded, ctx):
        n = loc.shape[0]
        buffer[: n - 1].copy_(loc[: n - 1])
        buffer[n - 1:padded].fill_(ctx.loc_pad)


class LocTailMinus1(Fixed):
    """Pads the static full-pool ``loc`` buffer with -1 (vLLM's convention) under SGLang's store, which
    skips only slot 0: the padded rows of full layers are out-of-range indices."""

    name = "mutant-loc-tail-minus-1"

    def fill_graph_loc_buffer(self, buffer, loc, padded, ctx):
        buffer[: loc.shape[0]].copy_(loc)
        buffer[loc.shape[0]:padded].fill_(-1)


class LocBufferInt16(Fixed):
    """Stages the static ``loc`` buffer through an int16 copy (a narrow index type from a small test
    pool): graph replays of a deployment-size pool wrap indices past 32,767 negative."""

    name = "mutant-loc-buffer-int16"

    def fill_graph_loc_buffer(self, buffer, loc, padded, ctx):
        buffer[: loc.shape[0]].copy_(loc.to(torch.int16))
        buffer[loc.shape[0]:padded].fill_(ctx.loc_pad)


class LocTailRepeatsLast(Fixed):
    """Fills the static full-pool ``loc`` buffer's tail with the last real entry (a live slot) instead of
    the pad value: the padded rows overwrite the batch's last token's full-layer rows."""

    name = "mutant-loc-tail-repeats-last"

    def fill_graph_loc_buffer(self, buffer, loc, padded, ctx):
        n = loc.shape[0]
        buffer[:n].copy_(loc)
        if n:
            buffer[n:padded].fill_(int(loc[-1]))


# ------------------------------------------------------------------------------------ backend_spec


class ForgetsWindowGraphFix(Fixed):
    """A fix that forgets #29858: the backend spec stays as the engine has it, so triton's EAGLE
    draft-extend graph still builds no window indices for the draft's SWA layer (B4)."""

    name = "mutant-forgets-window-graph-fix"

    def backend_spec(self, spec):
        return spec


class ReplayRefreshesSwaOnly(Fixed):
    """A faster replay that refreshes only the static SWA buffer and trusts the full-pool ``loc`` buffer
    to be current: its tail keeps the previous replay's slots."""

    name = "mutant-replay-refreshes-swa-only"

    def backend_spec(self, spec):
        return dataclasses.replace(super().backend_spec(spec), static_buffers=("swa_loc",))


#: every mutant -> (the shipped scenario that catches it most cheaply, the class of its first finding there)
CATCHER: dict[type, tuple[str, str]] = {
    SliceOffByOne: ("paths-spec", "length_mismatch"),
    SliceWrongEnd: ("paths-spec", "padding_slot"),
    SliceSkipsFirst: ("paths-spec", "missed"),
    SliceExtendOnly: ("paths-paged", "length_mismatch"),
    SlicePlanBackendsOnly: ("paths-noshrink", "length_mismatch"),
    SliceToRealTokens: ("paths-noshrink", "length_mismatch"),
    FallBackToLoc: ("paths-noshrink", "missed"),
    PadShortWithLastLive: ("paths-noshrink", "clobbered"),
    PadShortWithMinus1: ("paths-noshrink", "out_of_range"),
    DraftSwaAtFullLoc: ("paths-spec-paged", "missed"),
    Int16Loc: ("paths-big-pool", "out_of_range"),
    DraftSwaPoolNotEnlarged: ("paths-spec", "out_of_range"),
    DraftPoolsSwapped: ("paths-spec-paged", "out_of_range"),
    DraftFullPoolPageShort: ("paths-spec-paged", "out_of_range"),
    DraftSwaPoolPageShort: ("paths-spec-paged", "out_of_range"),
    DraftSwaPoolSlotShort: ("paths-spec-paged", "out_of_range"),
    DraftPoolsFromRatio: ("paths-spec", "out_of_range"),
    TranslateStaleSnapshot: ("paths-paged", "padding_slot"),
    TranslateMemoByLength: ("paths-spec-paged", "clobbered"),
    TranslatePageBase: ("paths-paged", "clobbered"),
    TranslateDraftIdentity: ("paths-spec-paged", "missed"),
    TranslateClampsPadding: ("paths-noshrink", "clobbered"),
    TranslateRealThenReplicate: ("paths-noshrink", "clobbered"),
    TranslateIdentity: ("paths-noshrink", "missed"),
    TranslatePlanIdsTwice: ("paths-noshrink", "padding_slot"),
    TranslateLagsOneForward: ("paths-noshrink", "padding_slot"),
    TranslateUint16: ("paths-big-pool", "clobbered"),
    SwaBufferUpToNMinus1: ("paths-noshrink", "padding_slot"),
    SwaTailOffByOne: ("paths-big-pool", "clobbered"),
    SwaTailRepeatsLast: ("paths-noshrink", "clobbered"),
    SwaTailMinus1: ("paths-noshrink", "out_of_range"),
    SwaTailTargetOnly: ("paths-spec-paged", "clobbered"),
    SwaRefreshSkippedSameSize: ("paths-noshrink", "clobbered"),
    LocTailStale: ("paths-big-pool", "clobbered"),
    LocUpToNMinus1: ("paths-noshrink", "padding_slot"),
    LocTailMinus1: ("paths-noshrink", "out_of_range"),
    LocBufferInt16: ("paths-big-pool", "clobbered"),
    LocTailRepeatsLast: ("paths-noshrink", "clobbered"),
    ForgetsWindowGraphFix: ("paths-spec-paged", "out_of_range"),
    ReplayRefreshesSwaOnly: ("paths-noshrink", "padding_slot"),
}

MUTANTS: tuple[type, ...] = tuple(CATCHER)
