"""Designs of the bug corpus beyond SGLang's own named states (docs/CORPUS.md).

* the states around the speculative-decoding bugs B3 (#17630) and B4 (#29858);
* a KVWriteLoc that closes the post-#29460 gap (a ``swa_loc`` shorter than ``loc``);
* the other engines' padding conventions, each with and without the decode graph's stale SWA tail
  of B2 (#24743): vLLM / nano-vllm pad with -1 and the store skips it; mini-sglang pads the batch
  with a dummy request.

Each is the base :class:`~simulator.designs.Design` (SGLang after every fix) with one thing changed,
so a corpus row isolates one bug.
"""
from __future__ import annotations

import torch

from simulator.designs.base import Design
from simulator.designs.types import KVWriteLoc
from simulator.engine_model.padding_convention import DUMMY, SKIP_MINUS_1


class SGLangPre17630(Design):
    name = "sglang-pre-17630"
    description = ("B3 (#17630): the draft model's pools are sized from the token count before the SWA "
                   "adjustment (the scenario's draft sizes, as configured), smaller than the target's full pool, "
                   "while the draft writes at the target's indices: out of bounds.")

    def size_draft_pools(self, target_full, target_swa, draft_full, draft_swa):
        return draft_full, draft_swa


class SGLangPR29858(Design):
    name = "sglang-pr-29858"
    description = ("SGLang today with the open #29858 applied: triton's EAGLE draft-extend CUDA-graph path "
                   "builds window (SWA) indices like the decode and verify paths, so the draft's SWA layers "
                   "write through full_to_swa.")
    # Design.backend_spec applies #29858 already: this is the base design under the fix's name


class StrictKVWriteLoc(Design):
    name = "kvwriteloc-strict"
    description = ("KVWriteLoc makes swa_loc exactly len(loc) long: keeps the first len(loc) entries of a longer "
                   "one (#29460) and pads a shorter one with the padding slot, closing the post-#29460 gap.")

    def make_write_loc(self, loc, swa_loc, ctx):
        if swa_loc is not None and swa_loc.shape[0] > loc.shape[0]:
            swa_loc = swa_loc[: loc.shape[0]]
        elif swa_loc is not None and swa_loc.shape[0] < loc.shape[0]:
            # token order is the same: the missing rows are padding rows, sent where loc sends them
            swa_loc = torch.cat([swa_loc, loc[swa_loc.shape[0]:].clamp(max=0).to(swa_loc.dtype)])
        return KVWriteLoc(loc, swa_loc)


class _StaleTail:
    """Mixin: the decode graph's static SWA buffer is int64 and never cleared past the real batch (B2)."""

    graph_swa_dtype = torch.int64

    def fill_graph_swa_buffer(self, buffer, swa_loc, padded, ctx):
        buffer[: swa_loc.shape[0]].copy_(swa_loc)


class SkipMinus1(Design):
    name = "sglang-skip-minus-1"
    description = ("SGLang's design under vLLM / nano-vllm's padding convention: padded rows get location -1 and the "
                   "store skips it; the graph's persistent slot-mapping buffer is filled with -1 past the real batch "
                   "(not a model of vLLM: --engine vllm runs vLLM itself).")
    padding = SKIP_MINUS_1     # its tail value -1 is what the base fill_graph_*_buffer writes past the batch


class SkipMinus1Pre24743(_StaleTail, Design):
    name = "sglang-skip-minus-1-pre-24743"
    description = ("-1 padding with skip, but the graph's SWA-location buffer keeps the previous replay's entries "
                   "past the real batch (B2's stale tail): padded rows carry -1 in loc and stale live indices in "
                   "swa_loc, so SWA layers still clobber.")
    padding = SKIP_MINUS_1


class MiniSglangDummy(Design):
    name = "mini-sglang-dummy"
    description = ("mini-sglang padding: the batch is padded with a dummy request whose slots (allocated at start) "
                   "absorb padded rows; the graph's buffers are written in full at every replay.")
    padding = DUMMY


class MiniSglangDummyPre24743(_StaleTail, Design):
    name = "mini-sglang-dummy-pre-24743"
    description = ("Dummy-request padding with B2's never-cleared SWA buffer: the padded rows are the dummy "
                   "request's, translated with the batch, so no stale tail exists to leak: clean.")
    padding = DUMMY
