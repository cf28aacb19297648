"""Designs for runs with the radix cache on (``engine.radix_cache``): SGLang 0.5.23 (its write path and its
release model: FIFO free lists, grouped frees, its eviction cadence) whose release declares its
free paths (``Release.sharing``: a :class:`~simulator.engine_model.sharing.SharingBehaviour`, which the scheduler's
:class:`~simulator.scheduling.prefix_cache.PrefixCache` uses; docs/SHARING.md, "Bug switches").

In the catalogue (``--design radix-r2``; the corpus rows name them): ``radix-fixed`` is 0.5.23 plus #38519's
proposed filter (every sharing fix); each bug's design is ``radix-fixed`` plus one switch in its buggy
position (``with_bug``). R8 needs no design of its own: it is live in the default ``sglang-0.5.23`` (whose
release's ``sharing`` is 0.5.23's unfiltered SWA free) once its trigger is on (``engine.cache_linker = true``,
#38519's external linker); ``radix-r8`` is the same with the trigger built in. Loading this file by path
(``simulator/designs/radix.py:RadixR2``) still works.
"""
from __future__ import annotations

from dataclasses import replace

from simulator.designs.base import Design
from simulator.designs.releases import SGLang0523
from simulator.engine_model.release import MID_2026_RELEASE
from simulator.engine_model.sharing import FIXED, SGLANG_0_5_23, with_bug


class RadixFixed(SGLang0523):
    name = "radix-fixed"
    description = ("SGLang 0.5.23 with the radix cache and every sharing fix, #38519's proposed filter included "
                   "(SWA frees skip page representatives with no SWA peer): the fix of R8")
    release = SGLang0523.release.but(sharing=FIXED)


class Radix0523(SGLang0523):
    name = "radix-0.5.23"
    description = "SGLang 0.5.23 with the radix cache as 0.5.23 has it (R8's unfiltered SWA free; no trigger)"
    release = SGLang0523.release.but(sharing=SGLANG_0_5_23)


_ISSUES = {"R2": "#29352", "R3": "#27586", "R7": "#36135/#36646", "A1": "#27779", "A2": "#25805"}


def _bug(bug: str) -> type:
    return (type(f"Radix{bug}", (SGLang0523,), {
        "name": f"radix-{bug.lower()}", "release": SGLang0523.release.but(sharing=with_bug(bug, FIXED)),
        "description": f"radix-fixed with {bug}'s switch in its buggy position ({_ISSUES[bug]}; docs/SHARING.md)",
        "__module__": __name__}))


RadixR2 = _bug("R2")
RadixR3 = _bug("R3")
RadixR7 = _bug("R7")
RadixA1 = _bug("A1")
RadixA2 = _bug("A2")


class RadixR8(SGLang0523):
    name = "radix-r8"
    description = ("SGLang 0.5.23 with the radix cache as 0.5.23 has it plus R8's trigger built in (a leaf "
                   "eviction frees a tombstone's SWA side, #38519's linker): the sink page enters the SWA free list")
    release = SGLang0523.release.but(sharing=replace(SGLANG_0_5_23, name="sglang-0.5.23+R8-trigger",
                                                     linker_frees_tombstones=True))


# ---- the state that had A1 and A2: a PD decode node of mid-2026 (engine.pd_decode; simulator/scheduling/pd_decode.py). The
# base Design (the mid-2026 release model and write path) with the decode node's free paths switched per state:
# A2 (#25805) was fixed on 2026-05-19, A1 (#27779) on 2026-06-10.

_PD_BOTH = with_bug("A2", with_bug("A1", FIXED))


class PDDecodePre25805(Design):
    name = "pd-decode-pre-25805"
    description = ("A PD decode node before 2026-05-19: A1 (#27779, paged free_swa clears only the freed ids' "
                   "mapping) and A2 (#25805, SWA-tail allocation keeps recycled pages' mappings) both live")
    release = MID_2026_RELEASE.but(sharing=replace(_PD_BOTH, name="pd-decode-2026-05"))


class PDDecodePost25805(Design):
    name = "pd-decode-post-25805"
    description = ("A PD decode node from 2026-05-19 to 2026-06-10: A2 fixed (#25805 clears the non-tail mapping), "
                   "A1 still live")
    release = MID_2026_RELEASE.but(sharing=replace(with_bug("A1", FIXED), name="pd-decode-2026-05-19"))


class PDDecodePre25805Post27779(Design):
    name = "pd-decode-pre-25805-post-27779"
    description = ("pd-decode-pre-25805 with #27779 alone (free_swa expands to whole full pages): A2 still live, "
                   "A1 fixed (not a released state: A2's fix came first)")
    release = MID_2026_RELEASE.but(sharing=replace(with_bug("A2", FIXED), name="pd-decode-2026-05+27779"))


class PDDecodePost27779(Design):
    name = "pd-decode-post-27779"
    description = "A PD decode node from 2026-06-10: A1 and A2 both fixed"
    release = MID_2026_RELEASE.but(sharing=replace(FIXED, name="pd-decode-2026-06-10"))
