"""Designs of the unified pool's bugs (docs/SHARING.md, "The unified pool"): U1 and U2, and their fix.

Each is SGLang 0.5.23's design (:class:`~simulator.designs.releases.SGLang0523`) whose release declares its
unified pool (``Release.unified``: the :class:`~simulator.engine_model.unified.UnifiedBehaviour` a
``pool.unified = true`` run builds its pool with, simulator/plugins/unified.py). On a static pool it is not read.
"""
from __future__ import annotations

from simulator.designs.releases import SGLang0523
from simulator.engine_model.unified import UNIFIED_0_5_23, with_unified_bug


class Unified0523(SGLang0523):
    name = "sglang-0.5.23-unified"
    description = ("SGLang 0.5.23 on its unified memory pool (--enable-unified-memory): the SWA page table spans the "
                   "full side's virtual id space (#37560) and translation clamps unmapped, negative and out-of-range "
                   "ids to the sink (#35933).")
    release = SGLang0523.release.but(unified=UNIFIED_0_5_23)


class UnifiedPre37560(Unified0523):
    name = "sglang-unified-pre-37560"
    description = ("U1 (#37560): the SWA side's v2p page table is sized by the SWA side's own page count but indexed "
                   "by the virtual page ids the full side mints; the first virtual page past it is a device-side "
                   "index assert and the engine dies mid-serving.")
    release = Unified0523.release.but(unified=with_unified_bug("U1"))


class UnifiedPre35933(Unified0523):
    name = "sglang-unified-pre-35933"
    description = ("U2 (#35933): translate_loc_from_full_to_swa returns the raw v2p lookup, so a tombstoned page "
                   "(-1) becomes a negative slot in the SWA page table of backends that translate whole rows "
                   "(flashattention, musa): an illegal address under captured-graph replay.")
    release = Unified0523.release.but(unified=with_unified_bug("U2"))
