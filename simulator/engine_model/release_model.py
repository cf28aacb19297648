"""What an engine release does around the write path, as one value a design holds.

A design models the fix under test; the *engine* it runs in changed between releases in ways that
move slots and lengths around: how freed slots come back, when out-of-window SWA slots are freed,
how DP attention pads a batch, how the speculative draft lays out its write window. A
:class:`ReleaseBehaviour` bundles those choices. Each choice is a small policy object with the
methods the allocator and the scheduler call, so no caller compares policy names, and each release's
rule lives in one place:

=====================  ==========================================  =========================================
policy                 mid-2026 (``MID_2026``, every design so far)  SGLang 0.5.23 (``SGLANG_0_5_23``)
=====================  ==========================================  =========================================
free lists             LIFO stacks at every page size               FIFO at page_size 1; freed pages ahead of
                                                                    the list at page_size > 1; frees of one
                                                                    scheduler phase released together
SWA eviction           decode when ``decoded % window == 1``;       accumulate: ``seqlen - 1 - W >= evicted
                       every chunk up to ``prefix - window``        + interval``, decode after the first
                                                                    decode batch, chunk rules of the overlap
                                                                    scheduler, W = max(window, draft window)
DP-attention padding   every rank pads to the largest count         SUM_LEN / MAX_LEN modes, counts aligned to
                                                                    ``attn_tp_size``, a common prefill bucket
multi-step draft       one allocation per draft step, given back    the round's window allocated once; step i
                       before verify                                writes column i of it
=====================  ==========================================  =========================================

docs/RELEASE_MODEL.md says where each 0.5.23 rule is in SGLang's source and what is not modelled.
A design selects a release with the class attribute ``release``; :func:`release_of` reads it (a design
without one behaves as mid-2026).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Sequence

from simulator.scenario.capture import smallest_capture

if TYPE_CHECKING:
    import numpy as np

# --------------------------------------------------------------------------- free lists

FREE_ORDERS = ("lifo", "fifo", "head")


@dataclass(frozen=True, slots=True)
class FreeLists:
    """How each sub-pool's free list hands slots back.

    ``lifo``: the pages of the latest free come out first, in the order they were freed (a stack
    pushed with the freed pages; SGLang's paged allocator prepends freed pages the same way).
    ``fifo``: freed pages join the tail and allocation takes from the head (SGLang 0.5.23's
    token allocator at page_size 1). ``head``: SGLang 0.5.23's paged allocator: freed pages go ahead of
    the list, a slot free's pages (a truncation) deduplicated and ascending (``torch.unique``), a
    finished request's row (``free_kv_row_segments``) and an eviction's page ids in position order; in
    a group the page-id frees are released before the slot frees.
    ``grouped``: the frees of one scheduler phase (the finished
    requests of a step, the evictions of a batch) are released as one batch at the phase's end, as
    SGLang's ``free_group_begin`` / ``free_group_end`` do; with ``lifo`` that keeps the phase's own
    order instead of reversing it call by call.
    """

    token: str = "lifo"        # page_size 1
    paged: str = "lifo"        # page_size > 1
    grouped: bool = False

    def __post_init__(self) -> None:
        for name in ("token", "paged"):
            if getattr(self, name) not in FREE_ORDERS:
                raise ValueError(f"FreeLists.{name} must be one of {FREE_ORDERS}, got {getattr(self, name)!r}")

    def order(self, page_size: int) -> str:
        return self.token if page_size == 1 else self.paged


# --------------------------------------------------------------------------- SWA eviction

@dataclass(frozen=True, slots=True)
class EvictionContext:
    """What the eviction rule of a release may read about the run (fixed for a run)."""

    window: int                    # the model's sliding window
    page_size: int
    chunked_prefill_size: int
    interval: int = 128            # SGLANG_SWA_EVICTION_INTERVAL (0.5.23)
    draft_window: int = 0          # the draft model's window when its layers read the SWA pool, else 0
    extra: int = 0                 # tokens a request may hold past its last one (speculative verify window)
    overlap: bool = False          # the run models the overlap scheduler (engine.overlap): the overlap guards


class MidYear2026Eviction:
    """SGLang before 0.5.23 (mid-2026): lazily per request; decode when ``decode_step % window == 1``, every
    prefill chunk up to ``prefix - window``; a speculative round once twice the window is held. Under the
    overlap scheduler (``ctx.overlap``, only when the run models it) a chunked prefill keeps the guard its
    ``maybe_evict_swa`` had then: no eviction for the first two extend batches, then against ``prefix_len -
    chunked_prefill_size``, because the previous chunk may still be running and reading those slots.

    The ``*_point`` methods return the prefix length to evict against (the scheduler frees the SWA
    slots of positions ``[evicted, point - retained window)``, page-aligned) or None for no eviction.
    """

    name = "mid-2026"
    #: all evictions of a batch before any of its allocations (else request by request, interleaved)
    batched = False

    def retain_window(self, ctx: EvictionContext) -> int:
        return ctx.window

    def decode_point(self, ctx: EvictionContext, *, length: int, evicted: int, decoded: int,
                     decode_batches: int) -> Optional[int]:
        return length if decoded % ctx.window == 1 else None

    def decode_candidates(self, ctx: EvictionContext, decoded: np.ndarray) -> np.ndarray:
        """Which of a decode batch's requests (their ``decoded`` counts) :meth:`decode_point` may evict for:
        a bool mask the scheduler asks :meth:`decode_point` under (only where the class that defines
        ``decode_point`` defines this too: a subclass overriding ``decode_point`` alone is asked per request)."""
        return decoded % ctx.window == 1

    def extend_point(self, ctx: EvictionContext, *, prefix_len: int, evicted: int, chunk: int) -> Optional[int]:
        if ctx.overlap:
            if chunk < 2:
                return None
            if ctx.chunked_prefill_size > 0:
                return prefix_len - ctx.chunked_prefill_size
        return prefix_len

    def speculative_point(self, ctx: EvictionContext, *, length: int, evicted: int,
                          decode_batches: int) -> Optional[int]:
        return length if length - evicted >= 2 * ctx.window else None

    def swa_hold_bound(self, ctx: EvictionContext) -> int:
        """Most SWA slots one request may hold at once (admission reserves this much); the overlap guard
        keeps one more chunk."""
        chunks = 2 * ctx.chunked_prefill_size if ctx.overlap else ctx.chunked_prefill_size
        return 2 * ctx.window + chunks + 2 * ctx.page_size + 2 * ctx.extra


@dataclass(frozen=True, slots=True)
class Sglang0523Eviction:
    """SGLang 0.5.23 without prefix sharing (``ScheduleBatch.maybe_evict_swa`` and
    ``free_swa_out_of_window_slots``).

    Decode: a request evicts once it has run one decode batch (``decode_batch_idx >= 1``, the overlap
    guard) and ``seqlen - 1 - W >= evicted + interval``; it then frees up to ``seqlen - 1 - W``,
    page-aligned down. ``W`` is the retained window ``max(window, draft window)``. ``seqlen`` counts
    the request's tokens as the scheduler knows them: under the overlap scheduler the previous
    forward's sampled token is not yet appended, so ``seqlen - 1`` is one less than the tokens with
    K/V (``overlap``). Chunked prefill (EXTEND, each request with ``extend_batch_idx`` earlier chunks):
    with the overlap scheduler a request evicts from its third chunk on, against ``prefix_len -
    chunked_prefill_size`` (the previous chunk may still run); without it, against ``prefix_len``; the
    interval does not apply there.
    """

    #: the overlap scheduler's guards on or off; None: the run's (``EvictionContext.overlap``)
    overlap: Optional[bool] = None
    name = "0.5.23"
    batched = True

    def retain_window(self, ctx: EvictionContext) -> int:
        return max(ctx.window, ctx.draft_window)

    def _overlapped(self, ctx: EvictionContext) -> bool:
        return ctx.overlap if self.overlap is None else self.overlap

    def _seqlen_minus_1(self, ctx: EvictionContext, length: int) -> int:
        return length - 1 if self._overlapped(ctx) else length

    def decode_point(self, ctx: EvictionContext, *, length: int, evicted: int, decoded: int,
                     decode_batches: int) -> Optional[int]:
        if decode_batches < 1:
            return None
        pre = self._seqlen_minus_1(ctx, length)
        if pre - self.retain_window(ctx) < evicted + max(1, ctx.interval):
            return None
        return pre

    def extend_point(self, ctx: EvictionContext, *, prefix_len: int, evicted: int, chunk: int) -> Optional[int]:
        pre = prefix_len
        if self._overlapped(ctx):
            if chunk < 2:
                return None
            if ctx.chunked_prefill_size > 0:
                pre = prefix_len - ctx.chunked_prefill_size
        if pre - self.retain_window(ctx) < evicted + 1:
            return None
        return pre

    def speculative_point(self, ctx: EvictionContext, *, length: int, evicted: int,
                          decode_batches: int) -> Optional[int]:
        # EAGLE's decode preparation runs the same maybe_evict_swa on the committed tokens
        return self.decode_point(ctx, length=length, evicted=evicted, decoded=0, decode_batches=decode_batches)

    def swa_hold_bound(self, ctx: EvictionContext) -> int:
        # decode: below the trigger a request holds < W + interval (+ the overlap lag, the token being
        # written, a partial page); prefill: two chunks past the window under overlap (one without)
        w, p = self.retain_window(ctx), ctx.page_size
        chunks = 2 * ctx.chunked_prefill_size if self._overlapped(ctx) else ctx.chunked_prefill_size
        return w + max(chunks, max(1, ctx.interval) + 2) + 2 * p + 2 * ctx.extra + 2


def eviction_end(point: int, retained: int, page_size: int) -> int:
    """The first position that keeps its SWA slot after evicting against ``point``: ``point - retained``,
    page-aligned down, never negative (both releases)."""
    end = max(point - retained, 0)
    return end - end % page_size


# --------------------------------------------------------------------------- DP-attention padding

def ceil_align(n: int, k: int) -> int:
    return -(-n // k) * k


@dataclass(frozen=True, slots=True)
class DpPlan:
    """What DP attention did to one rank's batch: its padded token count and the mode that chose it."""

    tokens: int
    mode: str                       # "max" (every rank to the largest), "max_len", "sum_len"
    bucket: Optional[int] = None    # MAX_LEN's common prefill-graph bucket
    #: the token count a graph runner picks its capture size from (None: ``tokens``)
    graph_tokens: Optional[int] = None
    #: False: no prefill (piecewise) graph may run this batch (the ranks cannot agree on a bucket)
    prefill_graph: bool = True

    @property
    def graph_basis(self) -> int:
        return self.tokens if self.graph_tokens is None else max(self.graph_tokens, self.tokens)


class MaxPadding:
    """Mid-2026 model: every DP rank pads to the largest token count over the ranks."""

    name = "max"

    def plan(self, *, real: int, others: Sequence[int], extend: bool, dp_size: int, attn_tp_size: int,
             prefill_graph_sizes: Optional[Sequence[int]]) -> DpPlan:
        return DpPlan(max(real, int(max(others))), "max")


class DpPaddingModes:
    """SGLang 0.5.23 (``ForwardBatch.prepare_mlp_sync_batch``, ``DpPaddingMode.get_dp_padding_mode``).

    Every rank's token count is first aligned up to ``attn_tp_size``. An extend batch over several
    ranks uses SUM_LEN (each rank keeps its own aligned count, no padding beyond the alignment);
    a decode batch takes the cheaper gather: MAX_LEN when ``2 * sum >= max * dp_size``, else
    SUM_LEN. An extend whose largest count fits a prefill (piecewise) graph is forced to MAX_LEN
    with every rank at the smallest captured size that holds the largest count; a larger one runs
    eagerly (the ranks' vote on the prefill graph fails). MAX_LEN pads every rank to the largest
    (aligned) count. A decode graph replays at the capture size that holds the largest raw request
    count over the ranks (``_max_dp_batch_size``), whatever the mode. The pad value is the
    convention's (0 in SGLang).
    """

    name = "modes"

    def plan(self, *, real: int, others: Sequence[int], extend: bool, dp_size: int, attn_tp_size: int,
             prefill_graph_sizes: Optional[Sequence[int]]) -> DpPlan:
        counts = [ceil_align(real, attn_tp_size)] + [ceil_align(int(o), attn_tp_size) for o in others]
        mx, total = max(counts), sum(counts)
        if extend:
            if prefill_graph_sizes:
                bucket = smallest_capture(tuple(prefill_graph_sizes), mx)
                if bucket is not None:
                    return DpPlan(bucket, "max_len", bucket)
            return DpPlan(counts[0], "sum_len", prefill_graph=False)
        raw_max = max([real] + [int(o) for o in others])
        if total * 2 >= mx * dp_size:
            return DpPlan(mx, "max_len", graph_tokens=raw_max)
        return DpPlan(counts[0], "sum_len", graph_tokens=raw_max)


# --------------------------------------------------------------------------- the release

#: backends whose SWA write ids come from the per-iteration plan in 0.5.23 (the others translate
#: out_cache_loc themselves); on the static pool both give full_to_swa[out_cache_loc]
PLAN_SWA_BACKENDS_0523 = frozenset({"flashinfer", "triton", "flashattention", "trtllm_mha", "musa"})


@dataclass(frozen=True, slots=True)
class ReleaseBehaviour:
    """One engine release's behaviour around the write path (see the module docstring)."""

    name: str
    free_lists: FreeLists = field(default_factory=FreeLists)
    eviction: object = field(default_factory=MidYear2026Eviction)
    dp_padding: object = field(default_factory=MaxPadding)
    #: the speculative multi-step draft allocates the round's whole window once; step i writes column i
    draft_columns: bool = False
    #: eager (not graph) extends padded by DP attention run each layer on the real rows only
    #: (0.5.23 ``padded_extend_real_tokens``); read by the backend boundary
    eager_extend_narrowing: bool = False
    #: backends whose hybrid-pool write is their kernel's own (0.5.23's aiter: ``launch_reshape_and_cache_flash``
    #: with the whole mapping, no ``KVWriteLoc``): a full layer's write carries no SWA ids, an SWA layer's are the
    #: mapping of its loc when that layer's kernel runs (not a metadata-init snapshot)
    kernel_write_backends: frozenset = frozenset()
    #: backends whose SWA read table of a speculative round's target verify (eager or graph) and draft-extend graph
    #: holds the slots of the request's first positions, not its window's (the window's length gathered from
    #: position 0: slots freed or reused once a request outgrows the window). sglang#39287, open: 0.5.23's
    #: flashinfer plans those SWA wrappers through ``Eagle{Verify,DraftExtend}Input.generate_attn_arg_prefill``,
    #: which take no ``kv_start_idx`` (its eager draft extend plans as a plain extend, from the window)
    round_swa_from_zero: frozenset = frozenset()
    #: backends whose EAGLE draft step reads only the committed keys, not the draft chain's, in a draft with SWA
    #: layers: its block table holds the step's ``seq_lens + step + 1`` keys, but the kernel is handed
    #: ``seqused_k = seq_lens`` (0.5.23's aiter: ``forward_decode``'s unified_attention on a multi-step child's
    #: table, the path a hybrid draft pool takes): the step's own key and the chain's are not read, and an SWA
    #: layer's window ends ``step + 1`` positions early
    draft_step_reads_committed: frozenset = frozenset()
    #: backends that take SWA ids from the per-iteration plan (the rest translate themselves)
    plan_swa_backends: frozenset = frozenset()
    #: the overlap scheduler's WAR barrier per platform (simulator.scheduling.timeline.BARRIERS), when the scenario
    #: leaves engine.war_barrier = "release": 0.5.23 gates it on is_cuda(), so ROCm runs without (W7)
    war_barriers: tuple = (("cuda", "after_launch"), ("rocm", "none"))
    #: a PD decode node (engine.pd_decode) frees a finished request's kv row by segments (0.5.23's
    #: ``release_kv_cache`` -> ``free_kv_row_segments``: whole pages); False: the token ``free()`` of
    #: mid-2026's chunk cache, whose free paths carry the A1 / A2 switches (simulator/scheduling/pd_decode.py)
    pd_row_free: bool = False
    #: with the radix cache off the scheduler is the one the radix cache runs, over its tree disabled (0.5.23's
    #: ``UnifiedRadixCache(disable=True)``: PrefillAdder's budget admits, ``check_decode_mem`` and its retraction
    #: before a decode, out-of-window SWA freed at extend); False: the plain scheduler's reservations (mid-2026)
    disabled_tree: bool = False

    def war_barrier(self, platform: str) -> str:
        table = dict(self.war_barriers)
        return table.get(platform, table.get("cuda", "after_launch"))

    def takes_plan_swa_ids(self, backend: str) -> bool:
        return backend in self.plan_swa_backends

    def eager_layer_rows(self, mode: str, graph: str, real: int, dp_padded: int) -> Optional[int]:
        """The rows an eager layer narrows to (None: no narrowing) under this release."""
        if (self.eager_extend_narrowing and graph == "eager" and mode in ("extend", "mixed", "draft_extend")
                and 0 < real < dp_padded):
            return real
        return None


MID_2026 = ReleaseBehaviour("mid-2026")

SGLANG_0_5_23 = ReleaseBehaviour(
    "sglang-0.5.23",
    free_lists=FreeLists(token="fifo", paged="head", grouped=True),
    eviction=Sglang0523Eviction(),
    dp_padding=DpPaddingModes(),
    draft_columns=True,
    eager_extend_narrowing=True,
    kernel_write_backends=frozenset({"aiter"}),
    round_swa_from_zero=frozenset({"flashinfer"}),
    draft_step_reads_committed=frozenset({"aiter"}),
    plan_swa_backends=PLAN_SWA_BACKENDS_0523,
    pd_row_free=True,
    disabled_tree=True,
)


def release_of(design: object) -> ReleaseBehaviour:
    """The release behaviour of a design's declared release (``design.release``: an
    :class:`~simulator.engine_model.release.Release`)."""
    rel = design.release
    behaviour = getattr(rel, "behaviour", None)
    if not isinstance(behaviour, ReleaseBehaviour):
        raise TypeError(f"design {getattr(design, 'name', design)!r}: release must be a Release, "
                        f"got {type(rel).__name__}")
    return behaviour
