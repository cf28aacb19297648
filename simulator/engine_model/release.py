"""The engine release a design runs in, as one declared value: :class:`Release`.

A release's facts are kept apart from a design's fix hooks: its policies (free-list order, eviction cadence,
DP padding: :class:`~simulator.engine_model.release_model.ReleaseBehaviour`), the free paths of its radix
cache and decode node (:class:`~simulator.engine_model.sharing.SharingBehaviour`) and its unified pool
(:class:`~simulator.engine_model.unified.UnifiedBehaviour`). A design declares the release it models as
``release = Release(...)`` (the base :class:`~simulator.designs.Design` declares mid-2026's); the run reads
it once, at set-up, and hands each part to what asks it (allocator, scheduler, tree cache, unified pool,
backend boundary). docs/RELEASE_MODEL.md maps each behaviour to SGLang's source.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from simulator.engine_model.release_model import MID_2026, SGLANG_0_5_23, ReleaseBehaviour
from simulator.engine_model.sharing import FIXED, SharingBehaviour
from simulator.engine_model.sharing import SGLANG_0_5_23 as SHARING_0_5_23
from simulator.engine_model.unified import UNIFIED_0_5_23, UnifiedBehaviour


@dataclass(frozen=True, slots=True)
class Release:
    """One engine release's facts (see the module docstring)."""

    #: its policies around the write path
    behaviour: ReleaseBehaviour = MID_2026
    #: its radix cache's and decode node's free paths; None: every sharing fix (``engine_model.sharing.FIXED``)
    sharing: Optional[SharingBehaviour] = None
    #: its unified pool (``pool.unified``); None: 0.5.23's
    unified: Optional[UnifiedBehaviour] = None

    @property
    def name(self) -> str:
        return self.behaviour.name

    @property
    def cache_paths(self) -> SharingBehaviour:
        """The free paths the tree cache and the decode node run."""
        return self.sharing if self.sharing is not None else FIXED

    @property
    def unified_pool(self) -> UnifiedBehaviour:
        """The unified pool this release builds."""
        return self.unified if self.unified is not None else UNIFIED_0_5_23

    def but(self, **changes) -> "Release":
        """This release with some facts changed (``behaviour``, ``sharing``, ``unified``)."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        return {"behaviour": self.behaviour.name, "sharing": None if self.sharing is None else self.sharing.name,
                "unified": None if self.unified is None else self.unified.name}


#: the release of the base design: SGLang mid-2026, after the corpus's fixes
MID_2026_RELEASE = Release()
#: SGLang 0.5.23 (2026-10-30) as modelled: its behaviour and its radix cache's free paths (R8's unfiltered SWA free)
SGLANG_0_5_23_RELEASE = Release(SGLANG_0_5_23, sharing=SHARING_0_5_23)
