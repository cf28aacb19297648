"""Padding conventions: what a padded row of a batch carries, and what the store does with it.

Engines pad batches (DP attention, CUDA-graph capture sizes) and disagree on what the padded rows
point at. One :class:`PaddingConvention` value holds everything the run asks about it: the pad value
of ``out_cache_loc``, the index the store skips, whether the batch is padded with a dummy request,
and what a static graph buffer's tail past the real batch is filled with. A design holds one
(``Design.padding``); the run loop, the scheduler and the store read it instead of comparing names.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True, slots=True)
class PaddingConvention:
    name: str
    description: str
    #: what padded rows of ``out_cache_loc`` hold; None: the slot of a dummy request allocated at start
    pad_value: Optional[int]
    #: the index the store skips outright; None: every index is written (slot 0 absorbs padded rows)
    skip_index: Optional[int]
    #: the batch itself is padded with the dummy request up to a static graph's capture size, so the
    #: graph's static buffers are written in full at every replay and have no tail
    dummy_request: bool = False
    #: what a static graph buffer's entries past the real batch get at replay (in both sub-pools);
    #: None: the dummy request's slot in that sub-pool
    tail_value: Optional[int] = 0
    #: how a read finding names a slot of the reserved page
    reserved_words: str = "the sink / padding slot"
    #: the reserved page is a null block that no write may reach (vLLM's block 0: never allocated, read through
    #: masked table entries): its slots are compared like any other, so a write there is a finding; False: the
    #: page is a sink whose contents are never compared
    null_block: bool = False

    def resolve(self, dummy_full: Optional[int], dummy_swa: Optional[int]) -> tuple[int, int]:
        """(out_cache_loc pad value, static SWA buffer tail value) of a run, given its dummy request's slots."""
        if self.dummy_request and (dummy_full is None or dummy_swa is None):
            raise ValueError(f"padding convention {self.name!r} needs a dummy request's slots")
        pad = self.pad_value if self.pad_value is not None else dummy_full
        swa_tail = self.tail_value if self.tail_value is not None else dummy_swa
        return int(pad), int(swa_tail)

    def __str__(self) -> str:
        return self.name


SLOT0 = PaddingConvention(
    "slot0", "padded rows get location 0, the reserved slot; the store skips index 0 (SGLang)",
    pad_value=0, skip_index=0, tail_value=0)
SLOT0_ABSORB = PaddingConvention(
    "slot0-absorb", "padded rows get location 0; the store writes them into the reserved slot (older kernels)",
    pad_value=0, skip_index=None, tail_value=0)
SKIP_MINUS_1 = PaddingConvention(
    "skip-1", "padded rows get location -1 and the store skips -1 (vLLM, nano-vllm)",
    pad_value=-1, skip_index=-1, tail_value=-1, reserved_words="in the reserved page 0 (vLLM's null block)")
VLLM_NULL_BLOCK = PaddingConvention(
    "skip-1-null-block", "padded rows get PAD_SLOT_ID -1 and the store skips it; block 0 is the null block, which "
    "nothing may write (vLLM)", pad_value=-1, skip_index=-1, tail_value=-1,
    reserved_words="in vLLM's null block (block 0)", null_block=True)
DUMMY = PaddingConvention(
    "dummy", "padded rows get the slots of a dummy request allocated at start (mini-sglang)",
    pad_value=None, skip_index=None, dummy_request=True, tail_value=None)

#: The conventions by name, in the order help texts list them.
PADDING_CONVENTIONS: dict[str, PaddingConvention] = {c.name: c for c in (SLOT0, SLOT0_ABSORB, SKIP_MINUS_1,
                                                                         VLLM_NULL_BLOCK, DUMMY)}


def padding_convention(value: "PaddingConvention | str") -> PaddingConvention:
    """A convention given as a value or by name; ValueError names the allowed ones."""
    if isinstance(value, PaddingConvention):
        return value
    conv = PADDING_CONVENTIONS.get(value) if isinstance(value, str) else None
    if conv is None:
        raise ValueError(f"unknown padding convention {value!r} (allowed: {', '.join(PADDING_CONVENTIONS)})")
    return conv
