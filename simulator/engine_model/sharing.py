"""The radix cache's and the decode node's free paths as one release has them: one switch per modelled bug (R2, R3, R7, R8, A1, A2; docs/SHARING.md, "Bug switches")."""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class SharingBehaviour:
    """How the cache and the SGLang-modelled free paths behave; each bug is one switch.

    The defaults are SGLang 0.5.23's code, which includes R8's unfiltered SWA free (live there).
    """

    name: str = "sglang-0.5.23"
    #: R2 (#29352): a recovery over a tombstone whose Full is locked by a running request frees and
    #: replaces that Full (as if unlocked) instead of keeping it and re-pointing its mapping.
    free_locked_full_on_recovery: bool = False
    #: R3 (#27586): SWA eviction frees the node's SWA slots but leaves its full ids' mapping (stale),
    #: and an unlocked recovery frees the old full ids through ``free()``, whose SWA half reads it.
    stale_tombstone_mapping: bool = False
    #: R7 (#36135 / #36646): inside a free group, SWA frees keep the full ids and translate them through
    #: the mapping at the flush, not at enqueue.
    resolve_swa_at_flush: bool = False
    #: R8 (#38519): skip page representatives with no SWA peer (mapping 0) in the SWA frees. False in
    #: 0.5.23 (``_free_swa_pages`` frees ``mapping[rep] // page`` for every representative).
    filter_unmapped_swa_frees: bool = False
    #: R8's trigger (a caller-contract fault, #38519's external cache linker): evicting a leaf frees
    #: its SWA side through ``free_swa_segment`` even when the leaf is a tombstone.
    linker_frees_tombstones: bool = False
    #: A1 (#27779): paged ``free_swa`` clears the mapping of the tokens passed only, not of their pages.
    clear_freed_tokens_only: bool = False
    #: A2 (#25805): SWA-tail allocation leaves recycled full pages' old mappings on the non-tail ids.
    keep_stale_tail_mapping: bool = False
    #: ``SchedulePolicy._touch_waiting_prefixes`` (FCFS, LRU eviction): on every this-many-th prefill pass with
    #: requests waiting (the first included), the prefixes of up to 128 waiting requests are matched, the
    #: queue's head last, so the tree keeps them warm (0: never). Not a bug: it orders the tree's eviction.
    waiting_prefix_refresh_interval: int = 32


SGLANG_0_5_23 = SharingBehaviour()


FIXED = replace(SGLANG_0_5_23, name="fixed", filter_unmapped_swa_frees=True)


#: bug id -> (field, value that has the bug); the fixed value is the other one
BUG_SWITCHES: dict[str, tuple[str, bool]] = {
    "R2": ("free_locked_full_on_recovery", True),
    "R3": ("stale_tombstone_mapping", True),
    "R7": ("resolve_swa_at_flush", True),
    "R8": ("filter_unmapped_swa_frees", False),
    "A1": ("clear_freed_tokens_only", True),
    "A2": ("keep_stale_tail_mapping", True),
}


def with_bug(bug: str, base: SharingBehaviour = FIXED) -> SharingBehaviour:
    """``base`` with one bug's switch set to the buggy value (R8 also turns its trigger on)."""
    if bug not in BUG_SWITCHES:
        raise KeyError(f"no sharing switch for {bug!r} (known: {', '.join(BUG_SWITCHES)})")
    name, value = BUG_SWITCHES[bug]
    out = replace(base, name=f"{base.name}+{bug}", **{name: value})
    return replace(out, linker_frees_tombstones=True) if bug == "R8" else out


def bugs_of(b: SharingBehaviour) -> tuple[str, ...]:
    """The bug ids whose switch is in the buggy position."""
    return tuple(bug for bug, (name, value) in BUG_SWITCHES.items() if getattr(b, name) == value)
