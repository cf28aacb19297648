"""Buggy designs for the paths the coverage scenarios exercise (issue 29 point 7), test-only.

Each is a clean design of the path with one plausible mistake in one hook, the kind an engine developer
writes when changing that path: the overlap scheduler with MIXED batches, DP padding, piecewise graphs and
paged pools (``sglang-0.5.23``); retraction under the overlap scheduler (``sglang-post-33587``); DP attention
with ``attn_tp_size`` > 1 and eagerly run DP-padded prefills (``sglang-0.5.23``); the radix cache at page size
16 (``radix-fixed``); the unified pool with DP, piecewise graphs and MIXED batches (``sglang-0.5.23-unified``).
The docstring of each says the mistake. tests/test_coverage_scenarios.py runs each on the shipped scenario named
for it in ``CATCHER`` and requires a finding of the class named there (and none under the clean design).
"""
from __future__ import annotations

import torch

from simulator.designs import KVWriteLoc, ReadIds, ReadTable, load_design, prefix_reads, read_ranges

#: the clean designs of the paths
Release0523 = type(load_design("sglang-0.5.23"))
Post33587 = type(load_design("sglang-post-33587"))
RadixFixed = type(load_design("radix-fixed"))
Unified0523 = type(load_design("sglang-0.5.23-unified"))


def _cut(loc: torch.Tensor, swa_loc):
    """The fixed designs' cut of a longer ``swa_loc`` (#29460)."""
    if swa_loc is not None and swa_loc.shape[0] > loc.shape[0]:
        swa_loc = swa_loc[: loc.shape[0]]
    return swa_loc


# ------------------------------------------------------------------ (a) overlap, MIXED, DP, piecewise, paged


class MixedLiveSwa(Release0523):
    """Re-plans a MIXED batch's SWA write ids at every layer from the live ``full_to_swa`` (the mixed path's
    fused layer kernel translating again instead of using the metadata-init snapshot): under the overlap
    scheduler a free landing between layers sends a finished request's last token to the padding slot."""

    name = "cover-mixed-live-swa"

    def make_write_loc(self, loc, swa_loc, ctx):
        if ctx.kind == "swa" and ctx.mode == "mixed" and ctx.full_to_swa is not None:
            swa_loc = ctx.full_to_swa[loc]
        return KVWriteLoc(loc, _cut(loc, swa_loc))


class SliceToWholePages(Release0523):
    """Cuts a longer ``swa_loc`` to ``len(loc)`` rounded up to a whole page ("the plan is kept in pages"):
    right at page size 1, but on a paged pool a DP-padded piecewise batch hands the store up to a page more
    SWA ids than K/V rows."""

    name = "cover-slice-to-whole-pages"

    def make_write_loc(self, loc, swa_loc, ctx):
        if swa_loc is not None and swa_loc.shape[0] > loc.shape[0]:
            page = ctx.page_size
            swa_loc = swa_loc[: -(-loc.shape[0] // page) * page]
        return KVWriteLoc(loc, swa_loc)


# ------------------------------------------------------------------ (b) retraction under the overlap scheduler


class DecodeGraphLiveSwa(Post33587):
    """Rebuilds a decode-graph replay's SWA write ids from the live mapping at every layer (an in-graph
    metadata kernel, as trtllm_mha's #29843, on every backend): a retraction's or a free's mapping clear that
    lands after read-done, between layers, tears the in-flight token's SWA writes."""

    name = "cover-decode-graph-live-swa"

    def make_write_loc(self, loc, swa_loc, ctx):
        if ctx.kind == "swa" and ctx.graph == "decode_graph" and ctx.full_to_swa is not None:
            swa_loc = ctx.full_to_swa[loc]
        return KVWriteLoc(loc, _cut(loc, swa_loc))


# ------------------------------------------------------------------ (c) DP attention, attn_tp_size > 1, eager


class EagerCutToDpLength(Release0523):
    """On eager batches cuts ``swa_loc`` to the DP-gathered length (``ctx.dp_padded_len``) instead of to
    ``len(loc)``: right before 0.5.23 narrowed eager DP-padded extends to the real rows, but with the
    attn-TP alignment the narrowed layers get more SWA ids than K/V rows."""

    name = "cover-eager-cut-to-dp-length"

    def make_write_loc(self, loc, swa_loc, ctx):
        if ctx.graph == "eager" and swa_loc is not None and swa_loc.shape[0] > loc.shape[0]:
            return KVWriteLoc(loc, swa_loc[: ctx.dp_padded_len])
        return KVWriteLoc(loc, _cut(loc, swa_loc))


class EagerSliceFromEnd(Release0523):
    """On eager batches keeps the *last* ``len(loc)`` SWA ids (the alignment padding taken to be in front, as
    a left-padded gather has it): a narrowed, attn-TP-aligned extend shifts its real tokens' SWA rows by the
    padding and sends the last ones to the padding slot."""

    name = "cover-eager-slice-from-end"

    def make_write_loc(self, loc, swa_loc, ctx):
        if ctx.graph == "eager" and swa_loc is not None and swa_loc.shape[0] > loc.shape[0]:
            swa_loc = swa_loc[swa_loc.shape[0] - loc.shape[0]:]
        return KVWriteLoc(loc, _cut(loc, swa_loc))


# ------------------------------------------------------------------ (d) the radix cache at page size > 1


class ReadIdsPageEarly(RadixFixed):
    """Starts every SWA read window at a page boundary one page early (``page_floor(start) - page``, "the page
    table is built in whole pages, and one more for the partial one"): at page size 16 a request reads up to a
    page and more before its window, positions tombstoned in the tree, freed, or left there (a stale read either
    way: attention would read them)."""

    name = "cover-read-ids-page-early"

    def read_ids(self, req_to_token, seq_lens, extend_lens, full_to_swa, ctx):
        page = ctx.page_size
        start = (seq_lens - extend_lens + 1 - ctx.window).clamp(min=0)
        if page > 1:
            start = (start - start % page - page).clamp(min=0)
        window = read_ranges(req_to_token, start, seq_lens)
        return ReadTable(full=prefix_reads(req_to_token, seq_lens),
                         swa=ReadIds(window.indptr, full_to_swa[window.indices], window.start))


class RadixReadMemo(RadixFixed):
    """Caches each full slot's SWA read translation until the slot is written again ("a slot's SWA peer
    changes only when it is reallocated"): a tombstone recovery over a Full a running request locks re-points
    the kept full ids to the incoming SWA slots, and the reader keeps reading the old ones; on the unified
    pool a compaction moves a live page's SWA side between forwards, with the same effect."""

    name = "cover-radix-read-memo"

    def read_ids(self, req_to_token, seq_lens, extend_lens, full_to_swa, ctx):
        memo = self.__dict__.get("_memo")
        if memo is None or memo.shape[0] != full_to_swa.shape[0]:
            memo = self.__dict__["_memo"] = torch.full_like(full_to_swa, -1)
        memo[read_ranges(req_to_token, seq_lens - extend_lens, seq_lens).indices] = -1    # written now: dropped
        start = (seq_lens - extend_lens + 1 - ctx.window).clamp(min=0)
        window = read_ranges(req_to_token, start, seq_lens)
        cached = memo[window.indices]
        swa = torch.where(cached >= 0, cached, full_to_swa[window.indices])
        memo[window.indices] = swa
        return ReadTable(full=prefix_reads(req_to_token, seq_lens), swa=ReadIds(window.indptr, swa, window.start))


# ------------------------------------------------------------------ (e) the unified pool, DP, piecewise, MIXED


class MixedPlanLagsOneForward(Unified0523):
    """Takes a MIXED batch's SWA write ids from a plan built one forward earlier (the chunk's plan made while
    the previous batch ran), through the page tables as they were then: the rows allocated since, and the
    pages the pool moved since, translate to what their slots held before."""

    name = "cover-mixed-plan-lags-one-forward"

    def translate(self, out_cache_loc, full_to_swa, ctx):
        table = self.__dict__.get("_previous")
        self.__dict__["_previous"] = full_to_swa.clone()
        if ctx.mode == "mixed" and table is not None and table.shape == full_to_swa.shape:
            return table[out_cache_loc]
        return full_to_swa[out_cache_loc]


class MixedPlanReusesMappedRows(Unified0523):
    """Reuses, in a MIXED batch, the previous forward's SWA ids for every row whose slot was already mapped then
    ("those are the running requests' slots: their plan is unchanged"), translating only rows that were unmapped:
    a slot the pool gave a new token since (a compaction moved another page into it, or a free and a new
    allocation reused it) keeps the SWA id of the token that held it before."""

    name = "cover-mixed-plan-reuses-mapped-rows"

    def translate(self, out_cache_loc, full_to_swa, ctx):
        table = self.__dict__.get("_previous")
        self.__dict__["_previous"] = full_to_swa.clone()
        if ctx.mode == "mixed" and table is not None and table.shape == full_to_swa.shape:
            old = table[out_cache_loc]
            return torch.where(old != 0, old, full_to_swa[out_cache_loc])
        return full_to_swa[out_cache_loc]
