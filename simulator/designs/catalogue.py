"""The catalogue of built-in designs, listed explicitly: ``--design NAME`` looks a name up here.

Each module of this package defines designs and imports only the base; this module alone imports them all,
so the catalogue is one list with no registration at import time (and no import circle). The order is the
order ``slotscope`` lists them in.
"""
from __future__ import annotations

from .base import Design
from .corpus import (MiniSglangDummy, MiniSglangDummyPre24743, SGLangPR29858, SGLangPre17630, StrictKVWriteLoc,
                     SkipMinus1, SkipMinus1Pre24743)
from .eagle_preplan import DotsEaglePreplan, DotsEaglePreplanRebuild
from .radix import (PDDecodePost25805, PDDecodePost27779, PDDecodePre25805, PDDecodePre25805Post27779, Radix0523,
                    RadixA1, RadixA2, RadixFixed, RadixR2, RadixR3, RadixR7, RadixR8)
from .releases import (SGLang0523, SGLang0523DraftStepKeys, SGLang0523DraftStepSwa, SGLang0523RoundSwaStart,
                       SGLang0523WarBarrier, SGLangPost33587, SGLangPre26380, SGLangPre31687, SGLangPre33587)
from .sglang import SGLangPost29460, SGLangPre24743, SGLangPre29460
from .unified import Unified0523, UnifiedPre35933, UnifiedPre37560

#: every built-in design class, in listing order
CATALOGUE: tuple[type[Design], ...] = (
    # SGLang's write-location states of the corpus's first fixes
    SGLangPost29460, SGLangPre29460, SGLangPre24743,
    # the corpus's other states: B3, B4, the strict KVWriteLoc, the other padding conventions
    SGLangPre17630, SGLangPR29858, StrictKVWriteLoc, SkipMinus1, SkipMinus1Pre24743, MiniSglangDummy,
    MiniSglangDummyPre24743,
    # releases as a whole and the overlap scheduler's WAR-barrier states (the W-series)
    SGLang0523, SGLangPost33587, SGLangPre26380, SGLangPre31687, SGLangPre33587, SGLang0523WarBarrier,
    # the radix cache's and the PD decode node's states (the R- and A-series)
    RadixFixed, Radix0523, RadixR2, RadixR3, RadixR7, RadixA1, RadixA2, RadixR8, PDDecodePre25805, PDDecodePost25805,
    PDDecodePre25805Post27779, PDDecodePost27779,
    # the unified pool's states (the U-series)
    Unified0523, UnifiedPre37560, UnifiedPre35933,
    # P7: EAGLE's pre-planned metadata under DP padding; P6: xpu's multi-step draft's SWA ids, fixed; F1:
    # flashinfer's round SWA tables from their window, fixed; F2: aiter's draft steps reading their own keys
    DotsEaglePreplan, DotsEaglePreplanRebuild, SGLang0523DraftStepSwa, SGLang0523RoundSwaStart,
    SGLang0523DraftStepKeys,
)

#: name -> design class
BUILTIN_DESIGNS: dict[str, type[Design]] = {d.name: d for d in CATALOGUE}
assert len(BUILTIN_DESIGNS) == len(CATALOGUE), "two built-in designs share a name"
