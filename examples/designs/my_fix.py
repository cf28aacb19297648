"""An example user design: make swa_loc exactly len(loc) long, whichever way the lengths differ.

SGLang's post-#29460 KVWriteLoc keeps the first len(loc) entries of a longer swa_loc but passes a
shorter one through, so the SWA layer's store raises a length mismatch (scenarios/gap-swa-shorter.toml).
This design closes that gap. Run it:

    slotscope run scenarios/gap-swa-shorter.toml --design examples/designs/my_fix.py:StrictSlice

Every hook and declared value of simulator.designs.Design is shown (docs/GUIDE.md, "The design interface");
the hooks this fix does not change call the base. A hook may declare what it reads (``@declare``): the run
then takes faster paths, with the same findings; an undeclared override is always right, only slower.
"""
import torch

from simulator.designs import Design, KVWriteLoc, declare
from simulator.engine_model.padding_convention import SLOT0
from simulator.engine_model.release import MID_2026_RELEASE


class StrictSlice(Design):
    name = "strict-slice"
    description = "post-#29460 slicing of a longer swa_loc, plus padding a shorter one with the pad slot"
    padding = SLOT0                       # SGLang: padded rows go to slot 0, which the store skips
    graph_swa_dtype = torch.int32         # the graph runners' static SWA-location buffers (#24743's int32)
    release = MID_2026_RELEASE            # the engine release it runs in (its policies, free paths, unified pool)

    @declare("pure")
    def translate(self, out_cache_loc, full_to_swa, ctx):
        # once per forward per backend: unchanged, full_to_swa[out_cache_loc] (padded rows map to slot 0)
        return super().translate(out_cache_loc, full_to_swa, ctx)

    @declare("pure")
    def fill_graph_loc_buffer(self, buffer, loc, padded, ctx):
        # graph replay: unchanged, loc into buffer[:len(loc)] and ctx.loc_pad (0) into the tail up to padded
        super().fill_graph_loc_buffer(buffer, loc, padded, ctx)

    @declare("pure")
    def fill_graph_swa_buffer(self, buffer, swa_loc, padded, ctx):
        # graph replay: unchanged, swa_loc into buffer[:len(swa_loc)] and ctx.swa_pad (0) into the tail
        super().fill_graph_swa_buffer(buffer, swa_loc, padded, ctx)

    @declare("pure", "base_reads")
    def read_ids(self, req_to_token, seq_lens, extend_lens, full_to_swa, ctx):
        # once per forward per backend: unchanged, the whole prefix for full layers, each new token's window
        # (ctx.window positions) for SWA layers
        return super().read_ids(req_to_token, seq_lens, extend_lens, full_to_swa, ctx)

    @declare("layer_free")
    def make_write_loc(self, loc, swa_loc, ctx):
        # every layer of every backend: the fix under test (it reads loc, swa_loc and ctx.loc_pad only, never the
        # layer: declared layer_free, so it is asked once per kind and forward)
        if swa_loc is not None and swa_loc.shape[0] > loc.shape[0]:
            # longer (DP padding under piecewise graphs): keep the first len(loc) entries, as #29460 does
            swa_loc = swa_loc[: loc.shape[0]]
        elif swa_loc is not None and swa_loc.shape[0] < loc.shape[0]:
            # shorter: token order is the same, so the missing rows are padding rows; send them to the
            # convention's pad slot (ctx.loc_pad, 0 here) in swa_loc's dtype
            pad = torch.full((loc.shape[0] - swa_loc.shape[0],), ctx.loc_pad, dtype=swa_loc.dtype,
                             device=swa_loc.device)
            swa_loc = torch.cat([swa_loc, pad])
        return KVWriteLoc(loc, swa_loc)

    def size_draft_pools(self, target_full, target_swa, draft_full, draft_swa):
        # once per run with speculative decoding: unchanged, the draft's pools at least the target's (#17630)
        return super().size_draft_pools(target_full, target_swa, draft_full, draft_swa)

    def backend_spec(self, spec):
        # once per boundary at set-up: unchanged, the engine after #29858 (triton's draft-extend graph has
        # window indices)
        return super().backend_spec(spec)
