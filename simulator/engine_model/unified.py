"""The unified pool as one release has it: one switch per modelled bug (U1, U2; docs/SHARING.md, "The unified pool")."""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class UnifiedBehaviour:
    """How the unified pool behaves; each bug is one switch. The defaults are SGLang 0.5.23's code."""

    name: str = "sglang-0.5.23"
    #: U1 (#37560): the SWA side's v2p has the SWA side's own page count of entries, but is indexed by the
    #: FULL side's virtual page ids. 0.5.23 sizes it by ``full.num_virtual_ids``.
    swa_table_own_size: bool = False
    #: U2 (#35933): translation returns the raw lookup: a tombstoned ``-1`` becomes slot ``-1`` (page size
    #: 1) or ``-ps .. -1``. 0.5.23's ``translate_kv_loc`` clamps to the sink 0.
    unclamped_translate: bool = False


UNIFIED_0_5_23 = UnifiedBehaviour()


#: bug id -> (field, value that has the bug)
UNIFIED_BUG_SWITCHES: dict[str, tuple[str, bool]] = {
    "U1": ("swa_table_own_size", True),
    "U2": ("unclamped_translate", True),
}


def with_unified_bug(bug: str, base: UnifiedBehaviour = UNIFIED_0_5_23) -> UnifiedBehaviour:
    if bug not in UNIFIED_BUG_SWITCHES:
        raise KeyError(f"no unified-pool switch for {bug!r} (known: {', '.join(UNIFIED_BUG_SWITCHES)})")
    name, value = UNIFIED_BUG_SWITCHES[bug]
    return replace(base, name=f"{base.name}+{bug}", **{name: value})


def unified_bugs_of(b: UnifiedBehaviour) -> tuple[str, ...]:
    return tuple(bug for bug, (name, value) in UNIFIED_BUG_SWITCHES.items() if getattr(b, name) == value)
