"""Deliberately wrong models of SGLang 0.5.23 for tests/test_conform.py (loaded as
``tests/conform_designs.py:ClassName``, in this process and in the release's)."""
from dataclasses import replace

from simulator.designs.releases import SGLang0523
from simulator.engine_model.release_model import SGLANG_0_5_23, FreeLists


class LifoAtPage1(SGLang0523):
    """0.5.23 with LIFO free lists at page_size 1 (the release's token allocator is FIFO)."""

    name = "sglang-0.5.23-lifo-at-page-1"
    release = replace(SGLANG_0_5_23, name="sglang-0.5.23, LIFO at page 1",
                      free_lists=FreeLists(token="lifo", paged="head", grouped=True))


class SortedEvictions(SGLang0523):
    """0.5.23 with the mid-2026 paged free list (LIFO stack in position order) at page_size > 1."""

    name = "sglang-0.5.23-paged-lifo"
    release = replace(SGLANG_0_5_23, name="sglang-0.5.23, paged LIFO",
                      free_lists=FreeLists(token="fifo", paged="lifo", grouped=True))
