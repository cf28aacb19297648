"""Designs for runs with the radix cache on (``engine.radix_cache``): the post-#29460 write path with a
:class:`~simulator.prefix_cache.SharingBehaviour` as its ``sharing`` attribute, which the scheduler's
:class:`~simulator.prefix_cache.PrefixCache` uses (docs/SHARING.md, "Bug switches").

Not registered (the built-in list is the write-path designs'); use them as
``--design simulator/radix_designs.py:RadixR8`` or pass an instance to ``run_simulation``. Each bug's
design is the fixed one plus one switch (``with_bug``); R8's is 0.5.23's default (the unfiltered SWA free)
plus its trigger (a leaf eviction that frees a tombstone's SWA side).
"""
from __future__ import annotations

from dataclasses import replace

from simulator.designs import SGLangPost29460
from simulator.prefix_cache import FIXED, SGLANG_0_5_23, with_bug


class RadixFixed(SGLangPost29460):
    name = "radix-fixed"
    description = "post-#29460 write path; the radix cache with every sharing fix"
    sharing = FIXED


class Radix0523(SGLangPost29460):
    name = "radix-0.5.23"
    description = "post-#29460 write path; the radix cache as 0.5.23 has it (R8's unfiltered free, no trigger)"
    sharing = SGLANG_0_5_23


def _bug(bug: str, base=FIXED) -> type:
    return type(f"Radix{bug}", (SGLangPost29460,), {
        "name": f"radix-{bug.lower()}", "sharing": with_bug(bug, base),
        "description": f"post-#29460 write path; the radix cache with {bug}'s switch in its buggy position",
        "__module__": __name__})


RadixR2 = _bug("R2")
RadixR3 = _bug("R3")
RadixR7 = _bug("R7")
RadixA1 = _bug("A1")


class RadixR8(SGLangPost29460):
    name = "radix-r8"
    description = ("post-#29460 write path; the radix cache as 0.5.23 has it plus R8's trigger (a leaf eviction "
                   "frees a tombstone's SWA side, #38519's linker): the sink page enters the SWA free list")
    sharing = replace(SGLANG_0_5_23, name="sglang-0.5.23+R8-trigger", linker_frees_tombstones=True)

