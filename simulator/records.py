"""Records that leave the simulator: findings, per-step facts and boundary crossings.

These are the only types the other packages (tracing, reports, slotscope) need from a run. They
are plain frozen dataclasses so that they serialise the same way everywhere (``to_json``) and so
that a record, once made, cannot be changed by whoever observes it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

#: The finding classes, in the order tables and reports list them.
FINDING_CLASSES: tuple[str, ...] = (
    "missed",           # a real token's row is not in its slot (the slot kept older contents)
    "clobbered",        # a live slot holds another token's row, or a padding row
    "padding_slot",     # a real token's row went to the reserved/padding slot instead of its own
    "evicted_slot",     # a row landed in a slot that holds no live token (evicted or freed)
    "torn_write",       # one token's layers of a kind wrote different slots (a mapping read per layer changed)
    "stale_read",       # attention read a slot that does not hold the token it reads there (freed, evicted,
                        # reassigned, the sink, or out of range), by the backend's read table
    "out_of_range",     # an index outside [0, rows) reached the store; caught before the write
    "length_mismatch",  # K, V and index lengths disagree: the store raised, nothing was written
    "design_error",     # a design hook raised, or returned an index no kernel takes; that write was skipped
)

#: Layer kinds. Full layers write at ``loc`` in the full pool, SWA layers at ``swa_loc``.
LAYER_KINDS: tuple[str, ...] = ("full", "swa")

#: Forward modes a ForwardBatch can have.
FORWARD_MODES: tuple[str, ...] = ("extend", "decode", "mixed", "draft_extend", "draft_decode", "target_verify")

#: Graph paths: how a batch runs (eagerly, replaying a decode CUDA graph, or piecewise graphs; with
#: speculative decoding also the draft model's own graph runners for DRAFT_DECODE and DRAFT_EXTEND;
#: TARGET_VERIFY replays the decode graph runner).
GRAPH_PATHS: tuple[str, ...] = ("eager", "decode_graph", "piecewise", "draft_graph", "draft_extend_graph")

#: Forward modes run by the speculative draft model (its own layers and pools).
DRAFT_MODES: tuple[str, ...] = ("draft_extend", "draft_decode")

#: Graph paths that replay a graph over static location buffers, refreshed at metadata init.
STATIC_GRAPHS: tuple[str, ...] = ("decode_graph", "draft_graph", "draft_extend_graph")


@dataclass(frozen=True, slots=True)
class Owner:
    """Who a slot's row belongs to: a real token (request, position), padding, or nobody."""

    tag: int
    request: Optional[int] = None
    position: Optional[int] = None

    @property
    def label(self) -> str:
        if self.tag == 0:
            return "empty"
        if self.tag == PAD_TAG:
            return "padding"
        if self.request is None:
            return f"tag {self.tag}"
        return f"req {self.request} pos {self.position}"

    def to_json(self) -> dict[str, Any]:
        return {"tag": self.tag, "request": self.request, "position": self.position, "label": self.label}


#: Tag carried by padding rows. Real tags are >= 1; 0 is an untouched (zeroed) row.
PAD_TAG: int = -1


@dataclass(frozen=True, slots=True)
class Finding:
    """One difference between the pool under test and the reference, explained."""

    step: int
    backend: str
    layer: int           # global layer id (-1 for a per-forward design hook: translate, fill_graph_*)
    kind: str            # "full" | "swa": the sub-pool written
    cls: str             # one of FINDING_CLASSES
    slot: int            # slot in that sub-pool (-1 when the finding has no slot: length_mismatch, design_error)
    expected: Optional[Owner]
    observed: Optional[Owner]
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "backend": self.backend,
            "layer": self.layer,
            "kind": self.kind,
            "subpool": self.kind,
            "class": self.cls,
            "slot": self.slot,
            "expected": self.expected.to_json() if self.expected else None,
            "observed": self.observed.to_json() if self.observed else None,
            "message": self.message,
        }


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one forward step was, as the scheduler made it (one per step, shared by all backends)."""

    step: int
    mode: str
    graph: str
    num_requests: int
    real_tokens: int          # num_token_non_padded
    dp_padded_tokens: int     # out_cache_loc length at metadata init (after DP-attention padding)
    padded_tokens: int        # graph-padded length (capture size) or dp_padded_tokens when eager
    full_used: int            # live slots in the full pool after allocation for this step
    swa_used: int             # live slots in the SWA pool after allocation for this step
    full_size: int
    swa_size: int
    t_start_ns: int = 0
    t_end_ns: int = 0
    #: engine.overlap: the forward's timeline (barrier, layers, [kind, request, landing point, entries] per
    #: scheduler write: simulator.scheduling.timeline.Landing.record); None (and left out of steps.jsonl) otherwise
    timeline: Optional[dict] = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        if d["timeline"] is None:
            del d["timeline"]
        return d


@dataclass(frozen=True, slots=True)
class LayerInfo:
    """Static facts about one global layer of the model."""

    layer: int
    kind: str        # "full" | "swa"
    index: int       # index inside its sub-pool
    draft: bool = False   # a layer of the speculative draft model (its own pools); ids follow the target's


@dataclass(frozen=True, slots=True)
class RunInfo:
    """Facts fixed for a whole run, for resource attributes and provenance."""

    scenario: str
    scenario_path: str
    scenario_hash: str
    design: str
    seed: int
    backends: tuple[str, ...]
    layers: tuple[LayerInfo, ...]
    device: str
    version: str
    extra: dict[str, Any] = field(default_factory=dict)
