"""vLLM's scheduler as a run's source of batches: its steps, its blocks, our oracle.

:class:`VllmStepSource` is a scheduler source of the step pipeline (``steps()`` yields a
:class:`~simulator.scheduling.batch.ForwardBatch` and its :class:`~simulator.scheduling.batch.BatchTruth` per forward),
like SGLang's (engine_path/schedule_source.py), over :class:`~engine_path.vllm.scheduler.VllmScheduler`.

vLLM's two KV-cache groups map onto the simulator's two pools: the full-attention group's slots index the full pool,
the sliding-window group's the SWA pool (both ``num_blocks * block_size`` rows: one block id is one group's at a
time). Per forward, where each piece comes from:

* **what a layer writes at**: the slot mapping the release's worker computed (engine_path/vllm/worker.py: its
  ``BlockTables``' kernels) of the full group is the batch's ``out_cache_loc`` (padded rows -1, skipped by the
  store); the SWA group's slot of each token reaches the SWA layers through the run's translation table
  (``full_to_swa[full slot]``), set here for the step's tokens;
* **what the oracle expects**: the blocks the release's *manager* holds for each request at each position
  (``req_to_blocks`` of the full and sliding-window managers), independent of the worker's tables: a worker row that
  lost or kept the wrong block writes elsewhere than the manager allocated, and the checker says where;
* **reads**: each request's full row as the forward's gathered block table gives it (``req_to_token``), and its
  sliding-window positions ``[first - W + 1, first)`` through the SWA group's gathered table (the translation table
  again; the step's own tokens through its slot mapping);
* **frees**: a block the oracle holds is freed when the release's pool has it back unreferenced and uncached
  (``ref_cnt == 0`` and no block hash: a prefix-cached block keeps its contents for a later hit), or when the
  manager hands it to the other group; an SWA block freed while the token's full slot stays held is an eviction
  (out of the window).

A request's tags are its tokens' *content* (simulator/scheduling/content_tags.py), so a prefix hit reads what its
first writer wrote. The graph and the DP padding are the release's choice (engine_path/vllm/graphs.py: its
``CudaGraphManager`` and ``dispatch_cg_and_sync_dp``); a graph's padded rows take what the release's slot-mapping
kernel left past the real tokens.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np

from simulator.oracle.reference import last_writes
from simulator.records import Owner
from simulator.scheduling.batch import BatchRequests, BatchTruth, ForwardBatch, Transfer
from simulator.scheduling.batch_making import BatchMaking
from simulator.scheduling.content_tags import ContentTags
from simulator.scheduling.workload import make_requests

from ..errors import AdapterLacks, raised_in
from . import hidden_states
from .graphs import Dispatch, ReleaseGraphs
from .scheduler import VllmScheduler
from .worker import WorkerTables, slots_of


@dataclass
class _Parts:
    """A forward's per-request parts as :meth:`VllmStepSource._request_part` gathers them (in batch order)."""

    tags: list = dataclasses.field(default_factory=list)
    locs: list = dataclasses.field(default_factory=list)
    swas: list = dataclasses.field(default_factory=list)
    truth_full: list = dataclasses.field(default_factory=list)
    rows: list = dataclasses.field(default_factory=list)

    def __iter__(self):
        return iter((self.tags, self.locs, self.swas, self.truth_full, self.rows))


@dataclass
class _Row:
    """A request's full row as the forward reads it (``RequestSlots``'s ``full``)."""

    full: np.ndarray


class VllmStepSource(BatchMaking):
    """vLLM's scheduler behind the run's scheduler interface (``steps``, ``owner_of``, counts)."""

    journal = None
    #: engine.overlap is vLLM's async scheduling, driven by the release's scheduler here (not SGLang's timeline)
    owns_overlap = True

    def __init__(self, scenario, alloc, release, rng: np.random.Generator, version: str, pad_value: int = -1,
                 device: str = "cpu"):
        """``release``: the behaviour the model's batch making reads (DP padding); ``version``: vLLM's."""
        self.sc, self.alloc, self.rng, self.release, self.release_version = scenario, alloc, rng, release, version
        # a captured graph's padded rows take what the release's slot-mapping kernel wrote there (-1: PAD_SLOT_ID)
        self.pad_value, self.pad_to_capture = pad_value, True
        self.specs = make_requests(scenario.workload, rng)
        self.total_requests = len(self.specs)
        spec = scenario.engine.speculative
        # EAGLE's verifies and drafter steps write ahead of a request's last token: a verify's drafts (num_steps past
        # it; the scheduler does not cap them at max_tokens), then drafter steps past the accepted ones
        self.content = ContentTags(room=2 * spec.num_steps + 2 if spec.enabled else 0)
        self.driver = VllmScheduler(scenario, self.specs, self._tag_row, max_steps=scenario.max_steps)
        self.g_full, self.g_swa = self.driver.groups.index("full"), self.driver.groups.index("swa")
        self.bs = self.driver.block_size
        #: extract_hidden_states: its cache-only layer's group (written after each target forward), else None
        self.g_hidden = self.driver.groups.index("hidden") if self.driver.hidden_states else None
        if self.g_hidden is not None and self.driver.kv_groups[self.g_hidden].kv_cache_spec.block_size != self.bs:
            raise AdapterLacks("vLLM gave the hidden-state layer's group another block size than the attention "
                               "groups'; slotscope drives one block size")
        self.window = scenario.model.window
        self.worker = WorkerTables(self.driver, device)
        self.graphs = ReleaseGraphs(self.driver, scenario, rng)
        self._prompt_lens = np.asarray([s.prompt_len for s in self.specs], dtype=np.int64)
        self._dispatch = Dispatch("eager", 0)
        self._content_keys = self.content.keys
        self._freed_full: list[np.ndarray] = []
        self._freed_swa: list[np.ndarray] = []
        self._evicted_swa: list[np.ndarray] = []
        self._mapping_changed: list[np.ndarray] = []
        n = self.driver.num_blocks
        self._block_group = np.full(n, -1, dtype=np.int64)      # the group the oracle holds each block in
        self._full_of_swa = np.zeros(n * self.bs, dtype=np.int64)
        self._held_full = np.zeros(n * self.bs, dtype=bool)
        self._requests: Optional[BatchRequests] = None
        self._rejected: list = []           # EAGLE: the last verify's rejected drafts (request, positions)
        self.counts = {"extend": 0, "decode": 0, "mixed": 0, "freed_full_slots": 0, "freed_swa_slots": 0,
                       "evicted_swa_slots": 0}
        if scenario.engine.kv_offload:
            self.counts["offload_loaded_slots"] = 0
        if self.g_hidden is not None:
            self.counts["freed_hidden_slots"] = 0

    @property
    def source(self) -> str:
        return f"vllm {self.release_version} Scheduler"

    @property
    def tree_cache_source(self) -> Optional[str]:
        return (f"vllm {self.release_version} prefix caching (BlockPool)" if self.sc.engine.radix_cache else None)

    @property
    def finished_count(self) -> int:
        return self.driver.finished

    def used(self, kind: str) -> int:
        """Slots of the blocks the oracle holds in the ``kind`` ("full" or "swa") group."""
        g = self.g_full if kind == "full" else self.g_swa
        return int(np.count_nonzero(self._block_group == g)) * self.bs

    def owner_of(self, tag: int) -> Owner:
        return self.content.owner_of(tag)

    def describe(self) -> dict:
        d = self.driver.describe()
        d["did"].update(self.counts, retractions=self.driver.preemptions)
        d["graphs"] = self.graphs.describe()
        return d

    # ------------------------------------------------------------------ the steps

    def steps(self) -> Iterator[tuple[ForwardBatch, BatchTruth]]:
        k = 0
        while True:
            step = self.driver.next_step()
            if step is None:
                return
            if step.dummy:
                yield self._dummy_batch(k)
                k += 1
                continue
            raised_in("vllm", f"vLLM {self.release_version}'s worker (BlockTables)", self.worker.apply,
                      step.new_rows, step.appended, step.gone)
            self._learn_frees(step)
            batch, truth = self._batch_of(k, step)
            loads = self._take_loads(step)
            # async scheduling: the next schedule is made while this forward runs; the offload tier's async loads
            # it issues land beside this forward (unordered with its reads), its sync loads before the next one
            self.driver.schedule_ahead()
            loads += self._take_loads(None)
            rejected = self._rejected_drafts(step)      # (EAGLE beside an offload tier is refused: never both)
            tr = self._loaded(loads) if loads else rejected
            yield batch, (truth if tr is None else dataclasses.replace(truth, transferred=tr))
            k += 1
            if step.drafts is not None:           # the speculator's forwards, before the output is processed
                drafts = [self._hidden_state_write(k, step)] if self.g_hidden is not None else \
                    self._draft_forwards(k, step)
                for draft in drafts:
                    yield draft
                    k += 1
                self._rejected = self._rejected_of(step)
            self.driver.finish_step(step)

    def _learn_frees(self, step) -> None:
        """Blocks the oracle holds that the release's pool has back (unreferenced, uncached) or gave the other
        group in this step's output."""
        blocks = self.driver.pool.blocks
        given = np.full(self._block_group.shape[0], -1, dtype=np.int64)      # the group this output gave a block
        for rows in (step.new_rows, step.appended):
            for per_group in rows.values():
                for g, ids in enumerate(per_group):
                    given[ids] = g
        held = np.flatnonzero(self._block_group >= 0)
        moved = (given[held] >= 0) & (given[held] != self._block_group[held])
        back = np.fromiter((blocks[b].ref_cnt == 0 and blocks[b].block_hash is None for b in held.tolist()),
                           dtype=bool, count=held.size)
        freed = held[moved | back]
        if not freed.size:
            return
        groups = self._block_group[freed]
        self._block_group[freed] = -1
        hidden = ((self.g_hidden, self._freed_full, "freed_hidden_slots"),) if self.g_hidden is not None else ()
        for g, out, key in ((self.g_full, self._freed_full, "freed_full_slots"),
                            (self.g_swa, self._freed_swa, "freed_swa_slots"), *hidden):
            b = freed[groups == g]
            if not b.size:
                continue
            slots = (b[:, None] * self.bs + np.arange(self.bs)).ravel()
            out.append(slots)
            self.counts[key] += int(slots.size)
            if g == self.g_full:
                self._held_full[slots] = False
            elif g == self.g_swa:
                evicted = slots[self._held_full[self._full_of_swa[slots]]]
                if evicted.size:
                    self._evicted_swa.append(evicted)
                    self.counts["evicted_swa_slots"] += int(evicted.size)

    def _batch_of(self, k: int, step) -> tuple[ForwardBatch, BatchTruth]:
        d = self._dispatched(step.starts, step.counts, self._prompt_lens[[int(r) for r in step.req_ids]])
        slot_map, tables = raised_in("vllm", f"vLLM {self.release_version}'s worker (BlockTables)",
                                     self.worker.prepare, step.req_ids, step.starts, step.counts, d.tokens)
        parts = _Parts()
        seq, ext = [], []
        decoding = q = 0
        verified = step.drafts if step.drafts is not None else np.zeros(len(step.req_ids), dtype=np.int64)
        for i, (rid, c, n) in enumerate(zip(step.req_ids, step.starts.tolist(), step.counts.tolist())):
            self._request_part(parts, rid, tables, i, c, c + n, slot_map[:, q:q + n])
            q += n
            seq.append(c + n)
            ext.append(n)
            decoding += n == 1 + int(verified[i]) and c >= self.specs[int(rid)].prompt_len
        tags, locs, swas, truth_full, rows = parts
        nreq = len(step.req_ids)
        # a FULL decode graph runs a uniform decode, a prefill's last token over computed context included
        mode = ("decode" if decoding == nreq or d.graph == "decode_graph"
                else ("extend" if decoding == 0 else "mixed"))
        self.counts[mode] += 1
        self._requests = BatchRequests(rids=np.asarray([int(r) for r in step.req_ids], dtype=np.int64),
                                       seq_lens=np.asarray(seq, dtype=np.int64),
                                       extend_lens=np.asarray(ext, dtype=np.int64), slots=tuple(rows),
                                       tag_bases=np.zeros(nreq, dtype=np.int64))
        batch, truth = self._make_batch(k, mode, nreq, tags, locs, swas)
        batch = self._padded_by_release(batch, slot_map, q)
        self._written = (tags, locs, swas, truth_full, tables)
        self._ran = (slot_map, q, d.tokens)          # the slot mappings and the rows the forward ran (real, padded)
        return batch, dataclasses.replace(truth, full_slots=np.concatenate(truth_full))

    def _request_part(self, parts: "_Parts", rid: str, tables: list, i: int, c: int, end: int,
                      written: np.ndarray) -> None:
        """One request's part of a forward that writes its positions ``[c, end)`` at ``written`` (the release's slot
        mapping of those tokens, per group): the SWA group's slots, read (its table row ``i``) and written, set in
        the translation table; the blocks the release's manager holds there, the oracle's truth (and held by it);
        the tags; its full row as the forward reads it."""
        full_row = slots_of(tables[self.g_full][i], self.bs, 0, end)
        lo = max(0, c - self.window + 1)
        loc = written[self.g_full]
        self._map(np.concatenate([full_row[lo:c], loc]),
                  np.concatenate([slots_of(tables[self.g_swa][i], self.bs, lo, c), written[self.g_swa]]))
        held = self.driver.manager_blocks(rid)
        f, s = slots_of(held[self.g_full], self.bs, c, end), slots_of(held[self.g_swa], self.bs, c, end)
        self._block_group[f // self.bs] = self.g_full
        self._block_group[s // self.bs] = self.g_swa
        self._held_full[f] = True
        self._full_of_swa[s] = f
        parts.tags.append(self._tag_row(int(rid))[c:end])
        parts.locs.append(loc)
        parts.swas.append(s)
        parts.truth_full.append(f)
        parts.rows.append(_Row(full_row))

    # ------------------------------------------------------------------ EAGLE's drafter

    def _draft_forwards(self, k: int, step) -> Iterator[tuple[ForwardBatch, BatchTruth]]:
        """The drafter's forwards after a target forward (its layers in the target's KV-cache groups, each writing
        its group's slots; eager): its prefill over every row the target's forward ran (the target's own slot
        mappings, a verify's rejected drafts and a graph's padded rows included), then ``num_speculative_tokens - 1``
        decode steps over every request of the batch (as the speculator runs them), step ``j`` at position ``last
        valid + j`` (after a verify its last accepted token, after a prefill chunk its last token; clamped to
        ``max_model_len - 1``, as ``_prepare_decode_inputs`` and ``update_draft_inputs`` set them), through its
        persistent block-table row (``compute_slot_mappings``). Past a request's last token its tags are its own."""
        tags, locs, swas, truth_full, tables = self._written
        slot_map, real, rows = self._ran
        self._dispatch = Dispatch("eager", max(rows, real))      # on the target's batch, its padded rows included
        batch, truth = self._make_batch(k, "draft_extend", len(step.req_ids), tags, locs, swas)
        batch = self._padded_by_release(batch, slot_map, real)
        yield batch, dataclasses.replace(truth, full_slots=np.concatenate(truth_full))
        last = step.sample_at() + step.kept() - 1                 # per request: its last position with valid KV
        limit = self.driver.vllm_config.model_config.max_model_len - 1
        # every request of the batch, a prefill chunk's too (its drafts are dropped by the scheduler; its K/V lands
        # in its lookahead blocks)
        for j in range(1, self.driver.vllm_config.num_speculative_tokens):
            yield self._draft_step(k + j, list(step.req_ids), np.minimum(last + j, limit), tables)

    def _rejected_of(self, step) -> list:
        """A verify's rejected drafts: per request, the positions whose K/V it wrote for drafts the target
        rejected."""
        return [(rid, np.arange(base + a, base + d, dtype=np.int64))
                for rid, base, d, a in zip(step.req_ids, step.sample_at().tolist(), step.drafts.tolist(),
                                           step.kept().tolist()) if d > a]

    def _rejected_drafts(self, step) -> Optional[Transfer]:
        """What the last verify wrote for the drafts the target rejected: not the content those positions will
        hold. Landed in the target's pools with the next forward (its drafter rewrote its own layer there), as rows
        of tags of their own, owned by the request, in the blocks it still holds (a request this step's schedule
        preempted or finished has none): a read of such a position before a forward writes it again (a computed
        count not rolled back) is stale."""
        pending, self._rejected = self._rejected, []
        full, ftags, swa, stags = [], [], [], []
        for rid, pos in pending:
            if rid in step.gone:
                continue
            held = self.driver.manager_blocks(rid)
            tags = self.content.fresh(int(rid), pos)
            for g, slots_out, tags_out in ((self.g_full, full, ftags), (self.g_swa, swa, stags)):
                slots, real = self._slots_in(held[g], pos)
                slots_out.append(slots)
                tags_out.append(tags[real])
        if not full:
            return None
        return Transfer(*(np.concatenate(x) for x in (full, ftags, swa, stags)), target_only=True)

    def _slots_in(self, blocks: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The slots of positions ``pos`` in a group's blocks (a request's, in order), and which positions have
        one: a block the group holds there, not the null block."""
        idx = pos // self.bs
        b = np.zeros(pos.shape[0], dtype=np.int64)
        inside = idx < blocks.shape[0]
        b[inside] = blocks[idx[inside]]
        real = b > 0
        return b[real] * self.bs + pos[real] % self.bs, real

    def _draft_step(self, k: int, rids: list, pos: np.ndarray, tables: list):
        """One draft decode step: one token per request (the forward's batch, in order) at ``pos``, its slots the
        release's; it reads its prefix through the forward's gathered tables."""
        slot_map = raised_in("vllm", f"vLLM {self.release_version}'s worker (compute_slot_mappings, draft step)",
                             self.worker.draft_slots, rids, pos)
        parts = _Parts()
        for i, (rid, p) in enumerate(zip(rids, pos.tolist())):
            self._request_part(parts, rid, tables, i, p, p + 1, slot_map[:, i:i + 1])
        tags, locs, swas, truth_full, req_rows = parts
        n = len(rids)
        self._requests = BatchRequests(rids=np.asarray([int(r) for r in rids], dtype=np.int64),
                                       seq_lens=pos + 1, extend_lens=np.ones(n, dtype=np.int64),
                                       slots=tuple(req_rows), tag_bases=np.zeros(n, dtype=np.int64))
        self._dispatch = Dispatch("eager", n)
        batch, truth = self._make_batch(k, "draft_decode", n, tags, locs, swas)
        return batch, dataclasses.replace(truth, full_slots=np.concatenate(truth_full))

    # ------------------------------------------------------------------ extract_hidden_states

    def _hidden_state_write(self, k: int, step) -> tuple[ForwardBatch, BatchTruth]:
        """extract_hidden_states after a target forward: its cache-only layer (the draft side's one layer, eager)
        stores one hidden state per row the forward ran, at its group's slot mapping (padded rows -1), where the
        release's ``basic_cache`` puts each (hidden_states.py); the real rows' tags the target's, owned where the
        release's manager holds the request's hidden-state blocks. It reads nothing."""
        tags = self._written[0]
        slot_map, real, rows = self._ran
        loc = raised_in("vllm", f"vLLM {self.release_version}'s extract_hidden_states store (basic_cache)",
                        hidden_states.stored_at, slot_map[self.g_hidden, :max(rows, real)], self.driver.num_blocks,
                        self.bs)
        owned = [slots_of(self.driver.manager_blocks(rid)[self.g_hidden], self.bs, c, c + n)
                 for rid, c, n in zip(step.req_ids, step.starts.tolist(), step.counts.tolist())]
        held = np.concatenate(owned)
        self._block_group[held // self.bs] = self.g_hidden
        empty = np.zeros(0, dtype=np.int64)
        self._requests = BatchRequests(rids=empty, seq_lens=empty, extend_lens=empty, slots=(), tag_bases=empty)
        self._dispatch = Dispatch("eager", loc.shape[0])
        batch, truth = self._make_batch(k, "draft_extend", 0, tags, [loc[:real]], [loc[:real]])
        batch = dataclasses.replace(batch, out_cache_loc=loc)         # the padded rows where basic_cache put them
        return batch, dataclasses.replace(truth, full_slots=held, swa_slots=held,
                                          transferred=hidden_states.in_target_views(self.content, loc, real, step))

    def _take_loads(self, step) -> list:
        """The offload tier's loads that land by ``step``'s forward (engine.kv_offload; ``step`` None: the async
        loads alone), each with the blocks the release's manager gave the request in the schedule that issued it
        (the driver takes them then)."""
        tier = self.driver.tier
        return tier.take_loads(step.req_ids if step is not None else ()) if tier is not None else []

    def _loaded(self, loads: list) -> Optional[Transfer]:
        """The loads (:meth:`_take_loads`, in the order they were issued) as the forward's transfer: each loaded
        token's tag into the block its position has in each group (an SWA position whose block is the null block
        is not loaded), owned there. An async load lands beside the forward in flight when it was issued
        (unordered with its reads), or the next one. vLLM's groups share memory (each KV tensor serves one layer
        of each group), so a load into a block writes that block's rows in the other group's view too (not owned
        there): a block the release freed while a forward still reads it, or gave two groups, shows at the reads
        of its other owner. A later load into the same slot wins."""
        if not loads:
            return None
        own = {self.g_full: ([], []), self.g_swa: ([], [])}
        written = {self.g_full: ([], []), self.g_swa: ([], [])}
        full_of = []                                   # per SWA slot loaded, its token's full slot
        for load in loads:
            pos = np.arange(load.first, load.first + load.count, dtype=np.int64)
            row_tags = self._tag_row(int(load.req_id))[pos]
            full_slots = load.blocks[self.g_full][pos // self.bs] * self.bs + pos % self.bs
            for g, blocks in enumerate(load.blocks):
                slots, real = self._slots_in(blocks, pos)
                tags = row_tags[real]
                own[g][0].append(slots)
                own[g][1].append(tags)
                for view in (self.g_full, self.g_swa):      # the block's rows in every group's view
                    written[view][0].append(slots)
                    written[view][1].append(tags)
                if g == self.g_swa:
                    full_of.append(full_slots[real])
        (f, ft), (w, wt) = (last_writes(*own[g]) for g in (self.g_full, self.g_swa))
        rows = tuple(x for g in (self.g_full, self.g_swa) for x in last_writes(*written[g]))
        self._block_group[f // self.bs] = self.g_full
        self._block_group[w // self.bs] = self.g_swa
        self._held_full[f] = True
        self._full_of_swa[np.concatenate(own[self.g_swa][0])] = np.concatenate(full_of)
        self.counts["offload_loaded_slots"] += int(np.concatenate(own[self.g_full][0]).size)
        return Transfer(f, ft, w, wt, written=rows)

    def _dummy_batch(self, k: int) -> tuple[ForwardBatch, BatchTruth]:
        """A DP rank's dummy forward (``_dummy_run`` of one uniform decode token): its graph and rows agreed with
        the other ranks like any forward's, its slot mappings ``get_dummy_slot_mappings``' (the release's: every
        row ``PAD_SLOT_ID``, which the store skips); no request, nothing to read."""
        one = np.ones(1, dtype=np.int64)
        d = self._dispatched(one, one, np.zeros(1, dtype=np.int64))
        slot_map = raised_in("vllm", f"vLLM {self.release_version}'s worker (get_dummy_slot_mappings)",
                             self.worker.dummy_slot_mappings, d.tokens)
        empty = np.zeros(0, dtype=np.int64)
        self._requests = BatchRequests(rids=empty, seq_lens=empty, extend_lens=empty, slots=(), tag_bases=empty)
        batch, truth = self._make_batch(k, "decode", 0, [empty], [empty], [empty])
        return self._padded_by_release(batch, slot_map, 0), truth

    def _dispatched(self, starts: np.ndarray, counts: np.ndarray, prompts: np.ndarray):
        """The release's graph and rows for a forward (engine_path/vllm/graphs.py), kept for the batch making."""
        self._dispatch = raised_in("vllm", f"vLLM {self.release_version}'s graph dispatch", self.graphs.dispatch,
                                   starts, counts, prompts)
        return self._dispatch

    def _dp_padding(self, mode: str, real: int, per_request: int, graph_kind) -> tuple[int, int, bool]:
        """The rows the release agreed for this forward (engine_path/vllm/graphs.py), not the model's DP plan."""
        return self._dispatch.tokens, self._dispatch.tokens, False

    def _graph_of(self, mode: str, basis: int, prefill_graph: bool, num_requests: int, per_request: int,
                  graph_kind, dp_len: int) -> tuple[str, int]:
        """The release's graph (its ``CudaGraphManager.dispatch``), not the model's choice."""
        return self._dispatch.graph, self._dispatch.tokens

    def _padded_by_release(self, batch: ForwardBatch, slot_map: np.ndarray, real: int) -> ForwardBatch:
        """A graph's padded rows as vLLM pads them: what ``compute_slot_mappings`` left past the real tokens (its
        last program fills them with -1); their SWA slots through the translation table, as the real rows'."""
        n = batch.out_cache_loc.shape[0]
        if n <= real:
            return batch
        if n > slot_map.shape[1]:
            raise IndexError(f"a batch padded to {n} rows past the release's slot mappings ({slot_map.shape[1]})")
        tail = slot_map[self.g_full, real:n]
        self._map(tail, slot_map[self.g_swa, real:n])
        return dataclasses.replace(batch, out_cache_loc=np.concatenate([batch.out_cache_loc[:real], tail]))

    def _map(self, full: np.ndarray, swa: np.ndarray) -> None:
        """Set the translation table's entries of the full slots ``full`` (-1 rows left out) to ``swa``, recording
        the entries that changed (the truth's ``mapping_changed``)."""
        live = full >= 0
        keys, vals = full[live], swa[live]
        table = self.alloc.full_to_swa
        moved = keys[table[keys] != vals]
        if moved.size:
            self._mapping_changed.append(moved)
        table[keys] = vals

    def _batch_requests(self, tags: list) -> BatchRequests:
        return self._requests

    def _tag_row(self, index: int) -> np.ndarray:
        return self.content.row(index, self.specs)

