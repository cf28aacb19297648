"""An example user design: slice swa_loc to len(loc) in *both* directions, and refuse a shorter one.

Run it:  slotscope run scenarios/gap-swa-shorter.toml --design examples/designs/my_fix.py:StrictSlice
"""
from simulator.designs import Design, KVWriteLoc


class StrictSlice(Design):
    name = "strict-slice"
    description = "post-#29460 slicing, plus padding a shorter swa_loc with the reserved slot 0"

    def make_write_loc(self, loc, swa_loc, ctx):
        if swa_loc is not None and swa_loc.shape[0] > loc.shape[0]:
            swa_loc = swa_loc[: loc.shape[0]]
        elif swa_loc is not None and swa_loc.shape[0] < loc.shape[0]:
            # the missing rows are padding rows (token order is the same): send them to slot 0
            pad = loc.new_zeros(loc.shape[0] - swa_loc.shape[0]).to(swa_loc.dtype)
            swa_loc = __import__("torch").cat([swa_loc, pad])
        return KVWriteLoc(loc, swa_loc)
