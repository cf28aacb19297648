"""Test-only designs whose SWA read table is one position off at the sliding window's edge (issue 29 point 6):
one too wide (it reads the position before the window's first) and one too narrow (it leaves the window's first
position out), each at one place: the window's start everywhere, the start when it falls on a page boundary
(page size > 1: eviction is page-floored, so the slot before such a window is usually still mapped and holds
its token), and under speculative verify only (TARGET_VERIFY: several draft tokens per request, each with its
own window). Each is the base design with one changed ``start``; tests/test_window_edge.py runs them."""
from __future__ import annotations

import torch

from simulator.designs import Design, ReadIds, ReadTable, read_ranges


class _WindowOff(Design):
    """The base table, its SWA window's first position moved by ``shift`` where :meth:`here` says."""

    shift = 0

    def here(self, start: torch.Tensor, seq_lens: torch.Tensor, ctx) -> torch.Tensor:
        """Per request: is the window's start (``start``, the base one) where this design is off?"""
        return torch.ones_like(start, dtype=torch.bool)

    def read_ids(self, req_to_token, seq_lens, extend_lens, full_to_swa, ctx):
        base = super().read_ids(req_to_token, seq_lens, extend_lens, full_to_swa, ctx)
        start = (seq_lens - extend_lens + 1 - ctx.window).clamp(min=0)
        # (a narrow table moves a start only where the window is not the request's whole prefix)
        moved = (start + self.shift).clamp(min=0, max=None)
        moved = torch.where(self.here(start, seq_lens, ctx) & (moved < seq_lens), moved, start)
        w = read_ranges(req_to_token, moved, seq_lens)
        return ReadTable(full=base.full, swa=ReadIds(w.indptr, full_to_swa[w.indices], w.start))


class WindowStartWide(_WindowOff):
    """``seq_len - extend_len - window``: the +1 forgotten, every window reads one position before its first."""

    name = "test-window-start-wide"
    shift = -1


class WindowStartNarrow(_WindowOff):
    """``seq_len - extend_len + 2 - window``: every window (once past the prefix's start) leaves its first out."""

    name = "test-window-start-narrow"
    shift = 1

    def here(self, start, seq_lens, ctx):
        return start > 0


class _AtPageEdge(_WindowOff):
    def here(self, start, seq_lens, ctx):
        return (start > 0) & (start % ctx.page_size == 0)


class PageEdgeWide(_AtPageEdge):
    """A window starting at a page's first position also reads the previous page's last."""

    name = "test-page-edge-wide"
    shift = -1


class PageEdgeNarrow(_AtPageEdge):
    """A window starting at a page's first position leaves it out (the table starts one into the page)."""

    name = "test-page-edge-narrow"
    shift = 1


class _InVerify(_WindowOff):
    def here(self, start, seq_lens, ctx):
        on = ctx.mode == "target_verify"
        return torch.full_like(start, on, dtype=torch.bool) & (start > 0)


class VerifyWide(_InVerify):
    """Under TARGET_VERIFY the first draft token's window reads one position more."""

    name = "test-verify-wide"
    shift = -1


class VerifyNarrow(_InVerify):
    """Under TARGET_VERIFY the table starts at the second draft token's window: the first's first is left out."""

    name = "test-verify-narrow"
    shift = 1


DESIGNS = (WindowStartWide, WindowStartNarrow, PageEdgeWide, PageEdgeNarrow, VerifyWide, VerifyNarrow)
