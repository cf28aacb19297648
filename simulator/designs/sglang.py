"""SGLang's write-location states around the corpus's first fixes: #29460 (B1) and #24743 (B2)."""
from __future__ import annotations

import torch

from simulator.designs.base import Design, declare
from simulator.designs.types import KVWriteLoc


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
    description = ("No slicing of swa_loc in KVWriteLoc (SGLang 0.5.14's, which no backend slices either: "
                   "trtllm_mha too hands its metadata's swa_loc as it is). B1: swa_loc longer than loc under "
                   "piecewise graphs with DP-attention padding.")

    @declare("layer_free")
    def make_write_loc(self, loc, swa_loc, ctx):
        return KVWriteLoc(loc, swa_loc)


class SGLangPre24743(Design):
    name = "sglang-pre-24743"
    description = ("The decode graph's static SWA-location buffer is int64 and not zeroed past the real batch: "
                   "padded rows reuse SWA indices of the previous replay (B2, #24743).")
    graph_swa_dtype = torch.int64

    def fill_graph_swa_buffer(self, buffer, swa_loc, padded, ctx):
        buffer[: swa_loc.shape[0]].copy_(swa_loc)
