"""Designs that model an engine release as a whole, not one fix: SGLang 0.5.23 (2026-10-30).

A release design's write-location hooks are the base :class:`~simulator.designs.Design`'s (SGLang
after #24743, #29460, #17630 and #29858: in 0.5.23 ``KVWriteLoc.__post_init__`` cuts ``swa_loc`` to
``len(loc)``, every backend zeroes its graph SWA buffer past the batch, and triton's draft-extend graph
builds window indices); what makes it a release is its ``release``
(:class:`~simulator.engine_model.release_model.ReleaseBehaviour`), which the allocator and the scheduler ask:
free-list order, the SWA eviction cadence, the DP padding modes, the multi-step draft's columns.
docs/RELEASE_MODEL.md maps each behaviour to SGLang's source.
"""
from __future__ import annotations

from dataclasses import replace as _replace

import torch

from simulator.designs.base import Design
from simulator.engine_model.release import SGLANG_0_5_23_RELEASE
from simulator.engine_model.release_model import MID_2026, SGLANG_0_5_23


class SGLang0523(Design):
    name = "sglang-0.5.23"
    description = ("SGLang release 0.5.23 (2026-10-30): FIFO free lists at page_size 1, grouped frees; SWA "
                   "eviction once interval tokens slid out of max(window, draft window), after the first decode "
                   "batch, chunked-prefill eviction of the overlap scheduler; DP padding SUM_LEN / MAX_LEN "
                   "aligned to attn_tp_size; the multi-step draft's window allocated once, a column per step; "
                   "int64 graph SWA buffers zeroed past the batch; KVWriteLoc cuts a longer swa_loc; flashinfer's "
                   "EAGLE verify SWA tables gathered from position 0 (F1, sglang#39287); aiter's draft steps read the "
                   "committed keys only (F2).")
    #: 0.5.23's graph SWA buffers are int64 again (the #24743 tail zeroing stays)
    graph_swa_dtype = torch.int64
    #: 0.5.23's behaviour, and its radix cache's free paths (engine.radix_cache): R8's unfiltered SWA free
    release = SGLANG_0_5_23_RELEASE


# ---------------------------------------------------------------------------- the overlap scheduler's barrier
# (the W-series, SGLANG_BUGS_2026 section 2; docs/OVERLAP.md). Each state is the base design (SGLang mid-2026
# after the corpus's fixes) with one barrier; they matter only under engine.overlap = true.


class SGLangPost33587(Design):
    name = "sglang-post-33587"
    description = ("The overlap scheduler's WAR barrier after every fix of the W-series: applied right after each "
                   "launch (#31687), on a read-done event published after every metadata read (#33587), the whole "
                   "forward where none is published; trtllm_mha's SWA layers write through the metadata-init "
                   "snapshot. CUDA; ROCm runs without the barrier (the is_cuda() gate, W7).")
    release = MID_2026


class SGLangPre26380(Design):
    name = "sglang-pre-26380"
    description = ("W1 (#26380): no WAR barrier. The scheduler's writes of the next iteration (free_swa, retract, "
                   "alloc) and the previous result's (finished frees) can reach the mapping before the in-flight "
                   "forward's metadata init reads it.")
    release = _replace(MID_2026, name="mid-2026, no WAR barrier (pre-#26380)",
                       war_barriers=(("cuda", "none"), ("rocm", "none")))


class SGLangPre31687(Design):
    name = "sglang-pre-31687"
    description = ("W2 (#31687): the #26380 barrier at the loop top only. It orders the next iteration's scheduling "
                   "writes after the previous forward, but the result processing that follows a launch in the same "
                   "iteration (finished requests' frees) can clear mapping entries before that forward's metadata "
                   "init.")
    release = _replace(MID_2026, name="mid-2026, loop-top WAR barrier (#26380, pre-#31687)",
                       war_barriers=(("cuda", "loop_top"), ("rocm", "none")))


class SGLangPre33587(Design):
    name = "sglang-pre-33587"
    description = ("W5 (#32460): the barrier releases at a read-done recorded right after metadata init (#28363), and "
                   "trtllm_mha's SWA layers translate out_cache_loc through the live full_to_swa mapping again at "
                   "every layer, ignoring the metadata-init snapshot: a mapping write landing between layers sends "
                   "one token's late SWA layers to another slot than its early ones (torn write).")
    release = _replace(MID_2026, name="mid-2026, read-done after metadata init (#28363, pre-#33587)",
                       war_barriers=(("cuda", "read_done_after_metadata"), ("rocm", "none")))

    def make_write_loc(self, loc, swa_loc, ctx):
        if ctx.kind == "swa" and ctx.spec.name == "trtllm_mha" and ctx.full_to_swa is not None:
            swa_loc = ctx.full_to_swa[loc]       # the live mapping at this layer, not the snapshot
        return super().make_write_loc(loc, swa_loc, ctx)


class SGLang0523WarBarrier(SGLang0523):
    name = "sglang-0.5.23-war-barrier"
    description = ("SGLang 0.5.23 with the WAR barrier on off CUDA too (SGLANG_ENABLE_WAR_BARRIER=1, or the open "
                   "#36054 / #38258): after_launch on ROCm as on CUDA. W7's fix.")
    release = _replace(SGLANG_0_5_23, name="sglang-0.5.23, SGLANG_ENABLE_WAR_BARRIER=1",
                       war_barriers=(("cuda", "after_launch"), ("rocm", "after_launch")))


class SGLang0523RoundSwaStart(SGLang0523):
    name = "sglang-0.5.23-round-swa-start"
    description = ("SGLang 0.5.23 with F1 fixed in flashinfer (sglang#39287's fix, examples/engine-patches/"
                   "fix-39287-flashinfer-eagle-swa-start.yaml): an EAGLE round's target verify and draft extend "
                   "plan their SWA wrapper from each request's window start (generate_attn_arg_prefill gets the "
                   "kv_start_idx every other forward's table has), not from position 0.")
    release = _replace(SGLANG_0_5_23, name="sglang-0.5.23, sglang#39287's fix", round_swa_from_zero=frozenset())


class SGLang0523DraftStepKeys(SGLang0523):
    name = "sglang-0.5.23-draft-step-keys"
    description = ("SGLang 0.5.23 with F2 fixed in aiter (the proposed fix, examples/engine-patches/"
                   "fix-f2-aiter-draft-step-keys.yaml): a multi-step draft's step hands unified_attention the key "
                   "count of its own block table (seq_lens + step + 1), not the round's committed seq_lens.")
    release = _replace(SGLANG_0_5_23, name="sglang-0.5.23, aiter's draft steps reading their own keys",
                       draft_step_reads_committed=frozenset())


class SGLang0523DraftStepSwa(SGLang0523):
    name = "sglang-0.5.23-draft-step-swa"
    description = ("SGLang 0.5.23 with P6 fixed in xpu (the proposed fix, examples/engine-patches/"
                   "fix-p6-xpu-draft-step-swa.yaml): each child of its multi-step draft backend translates its own "
                   "step's column of the round's window, as flashattention's and triton's do, instead of the whole "
                   "window that KVWriteLoc then cuts to the first requests' first columns.")

    def backend_spec(self, spec):
        return _replace(super().backend_spec(spec), draft_step_swa="step")
