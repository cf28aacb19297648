"""Designs that model an engine release as a whole, not one fix: SGLang 0.5.23 (2026-10-30).

A release design's write-location hooks are the base :class:`~simulator.designs.Design`'s (SGLang
after #24743, #29460, #17630 and #29858: in 0.5.23 ``KVWriteLoc.__post_init__`` cuts ``swa_loc`` to
``len(loc)``, every backend zeroes its graph SWA buffer past the batch, and triton's draft-extend graph
builds window indices); what makes it a release is its ``release``
(:class:`~simulator.release_model.ReleaseBehaviour`), which the allocator and the scheduler ask:
free-list order, the SWA eviction cadence, the DP padding modes, the multi-step draft's columns.
docs/RELEASE_MODEL.md maps each behaviour to SGLang's source.
"""
from __future__ import annotations

import torch

from .designs import Design, register
from .release_model import SGLANG_0_5_23


@register
class SGLang0523(Design):
    name = "sglang-0.5.23"
    description = ("SGLang release 0.5.23 (2026-10-30): FIFO free lists at page_size 1, grouped frees; SWA "
                   "eviction once interval tokens slid out of max(window, draft window), after the first decode "
                   "batch, chunked-prefill eviction of the overlap scheduler; DP padding SUM_LEN / MAX_LEN "
                   "aligned to attn_tp_size; the multi-step draft's window allocated once, a column per step; "
                   "int64 graph SWA buffers zeroed past the batch; KVWriteLoc cuts a longer swa_loc.")
    #: 0.5.23's graph SWA buffers are int64 again (the #24743 tail zeroing stays)
    graph_swa_dtype = torch.int64
    release = SGLANG_0_5_23
