"""What one forward step hands to the attention backends, and what the oracle knows about it.

:class:`ForwardBatch` is the engine's view: only what SGLang's ``ForwardBatch`` carries that matters
for the KV write. :class:`BatchTruth` is the oracle's view of the same step (which token owns which
slot, which slots were freed before it); backends and designs never see it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Protocol

import numpy as np

if TYPE_CHECKING:
    from simulator.memory.allocator import RequestSlots


#: the modes of a speculative decode round's forwards
ROUND_MODES = frozenset({"target_verify", "draft_decode", "draft_extend"})


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    step: int
    mode: str                     # extend | decode | mixed | draft_decode | target_verify | draft_extend
    graph: str                    # eager | decode_graph | piecewise | draft_graph | draft_extend_graph
    out_cache_loc: np.ndarray     # int64, as seen at metadata init: real rows then DP padding
    num_token_non_padded: int     # real tokens, recorded before DP padding
    padded_len: int               # rows the graph runs: capture size, or len(out_cache_loc) when eager
    pad_value: int                # what padded rows of out_cache_loc hold (0 in SGLang)
    num_requests: int
    #: the batch's requests as metadata init reads them (req_to_token rows, seq_lens); None: not known
    #: (a batch built by hand), and then nothing is read-checked
    requests: Optional["BatchRequests"] = None
    #: a draft forward over its prefill's own batch and slots (the draft model's extend after each prefill: an
    #: EXTEND of the draft in SGLang 0.5.23, where the one after a verify is a DRAFT_EXTEND_V2)
    of_prefill: bool = False
    #: a multi-step draft's step within its round (DRAFT_DECODE under SGLang 0.5.23's window: it writes column
    #: ``draft_step`` of the round's window); None elsewhere
    draft_step: Optional[int] = None
    #: a DRAFT_EXTEND after a verify over the round's whole window: per request the tokens the target accepted
    #: (the bonus token included); None elsewhere
    accepted: Optional[np.ndarray] = None

    @property
    def dp_padded_len(self) -> int:
        return int(self.out_cache_loc.shape[0])

    @property
    def in_round(self) -> bool:
        """A forward of a speculative decode round (its draft steps, target verify or draft extend), not the
        draft's extend after a prefill."""
        return self.mode in ROUND_MODES and not self.of_prefill

    def window_starts(self) -> np.ndarray:
        """A forward of a speculative round over one window (SGLang 0.5.23's draft columns): each request's
        committed length, where the round's window starts (a draft step writes column ``draft_step`` of it; the
        verify and the draft extend the whole window). Needs the batch's requests."""
        rq = self.requests
        return rq.seq_lens - (self.draft_step + 1 if self.mode == "draft_decode" else rq.extend_lens)


@dataclass(frozen=True, slots=True)
class BatchTruth:
    tags: np.ndarray              # int64 per real token, in batch order
    full_slots: np.ndarray        # the token's full slot (equals out_cache_loc[:real])
    swa_slots: np.ndarray         # the token's SWA slot, as the allocator gave it
    freed_full: np.ndarray        # full slots freed since the previous step (finished requests)
    freed_swa: np.ndarray         # SWA slots freed since the previous step (finished or evicted)
    evicted_swa: np.ndarray       # the subset of freed_swa freed by out-of-window eviction
    mapping_changed: np.ndarray   # full slots whose full_to_swa entry changed since the previous step
    #: what the slot read for (request row, position) must hold; None: each request's own tags
    #: (``BatchRequests.tag_bases[row] + position``). A scheduler that shares prefixes supplies its own
    #: (a tree node's token read by several requests has one key)
    content_keys: Optional["ContentKeys"] = None
    #: KV that arrived outside the attention backends since the previous step (a PD decode node's
    #: transfer, simulator/scheduling/pd_decode.py): the slots its owners now hold, with their tags; the oracle
    #: takes their ownership (after the frees) and the run writes their rows into the pools outside the
    #: backends (``Run.write_transfer``): no backend write, nothing counted or write-checked there
    transferred: Optional["Transfer"] = None


@dataclass(frozen=True, slots=True)
class Transfer:
    """Slots that received their K/V by a KV transfer: full and SWA slot ids, each with its token's tag."""

    full_slots: np.ndarray
    full_tags: np.ndarray
    swa_slots: np.ndarray
    swa_tags: np.ndarray
    #: the rows written into the pools when they differ from the slots owned (full slots, tags, SWA slots, tags):
    #: an engine whose groups share memory (vLLM) writes a block's rows in every group's view, while only the
    #: group that holds it owns them. None: the owned rows
    written: Optional[tuple] = None
    #: the rows land in the target's pools only (what the target's own forward left there, e.g. a verify's K/V of
    #: drafts the target rejected), not in a draft model's
    target_only: bool = False
    #: which references take the rows: every side's (the default: also where they land in the target's pools only,
    #: a verify's rejected drafts being speculative K/V in the drafter's layers too until recomputed), or, with
    #: ``target_reference_only``, the target's alone (the draft side holds its own writes there: what vLLM's
    #: extract_hidden_states store leaves in the target groups' views)
    target_reference_only: bool = False


@dataclass(frozen=True, slots=True)
class BatchRequests:
    """The real requests of a forward, in batch order, as SGLang's metadata init sees them.

    ``slots[i].full[:seq_lens[i]]`` is request i's ``req_to_token`` row (live views of the scheduler's
    :class:`~simulator.memory.allocator.RequestSlots`: read them at metadata init, before the scheduler runs
    again). ``tag_bases`` is the oracle's half: the tag of request i's position p is ``tag_bases[i] + p``.
    """

    rids: np.ndarray              # int64 request id per request (SGLang's req_pool_indices)
    seq_lens: np.ndarray          # int64 positions with K/V once this forward has written: [0, seq_len)
    extend_lens: np.ndarray       # int64 this forward's new tokens per request (1 in decode)
    slots: tuple["RequestSlots", ...]
    tag_bases: np.ndarray         # int64 per request

    @staticmethod
    def from_tags(tags: list[np.ndarray], tag_bases, slots_of) -> "BatchRequests":
        """From a batch's per-request tag arrays (consecutive positions each), the scheduler's sorted tag
        bases (one per request id) and ``slots_of(rid)``."""
        bases_all = np.asarray(tag_bases, dtype=np.int64)
        last = np.fromiter((t[-1] for t in tags), dtype=np.int64, count=len(tags))
        n = np.fromiter((t.shape[0] for t in tags), dtype=np.int64, count=len(tags))
        rids = np.searchsorted(bases_all, last, side="right") - 1
        bases = bases_all[rids]
        return BatchRequests(rids=rids, seq_lens=last - bases + 1, extend_lens=n,
                             slots=tuple(slots_of(int(r)) for r in rids), tag_bases=bases)

    def req_to_token(self) -> np.ndarray:
        """``[num_requests, max(seq_lens)]`` int64: row i holds request i's full slots, zeros past its seq_len."""
        bs = len(self.slots)
        width = int(self.seq_lens.max()) if bs else 0
        out = np.zeros((bs, width), dtype=np.int64)
        for i, (s, n) in enumerate(zip(self.slots, self.seq_lens.tolist())):
            out[i, :n] = s.full[:n]
        return out


class ContentKeys(Protocol):
    """The expected content key (a tag) of each read: ``rows`` index the batch's requests."""

    def __call__(self, requests: BatchRequests, rows: np.ndarray, positions: np.ndarray) -> np.ndarray: ...


def own_tags(requests: BatchRequests, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The default content key: every request reads its own tokens."""
    return requests.tag_bases[rows] + positions
