"""The release's own scheduler as a run's scheduler: its batches, its slots, our oracle (``run --scheduler release``).

:class:`ReleaseStepSource` is a scheduler source of the step pipeline (``steps()`` yields a
:class:`~simulator.scheduling.batch.ForwardBatch` and its :class:`~simulator.scheduling.batch.BatchTruth` per
forward). The release's ``Scheduler`` (engine_path/scheduler.py: its own ``__init__`` and ``event_loop_normal``) runs in
a thread of its own; at each forward its stand-in worker hands the release's ``ScheduleBatch`` over and waits until the
step pipeline has run that step (strict alternation: one side runs at a time, so what the pipeline reads of the
release's tables is what the forward would have read).

What the oracle learns, and from where (never from the release's own bookkeeping of who owns what):

* **writes**: each request's new positions (its length before and after the forward) in the slots of the batch's
  ``out_cache_loc``, and the SWA slot of each from the release's ``full_to_swa_index_mapping`` right after the
  allocation; the tag of a position is its token's *content* (simulator/scheduling/content_tags.py), so a request
  that matched a prefix in the release's tree reads what its first writer wrote;
* **frees**: a slot the oracle holds live that is back on the release allocator's free lists (``free_pages`` and
  ``release_pages`` of its full and SWA sub-allocators) at the next forward, whichever path freed it (a finish, a
  retraction, decode-time SWA eviction, the tree's eviction or tombstoning). An SWA slot freed while its full slot
  stays held is an eviction (out of the window, or a tombstone);
* **reads**: each request's row of the release's ``req_to_token`` up to its length, as the forward's metadata reads
  it (``BatchRequests``), checked against ownership by content.

A slot freed and handed out again between two forwards is seen as its new owner's write (its free is not recorded
separately); a request that still reads it then reads another's KV, which the read check reports. Graph choice and
padding of the batch are the model's (simulator/scheduling/batch_making.py), as they are for the model's scheduler.
"""
from __future__ import annotations

import contextvars
import queue
import threading
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np
import torch

from simulator.records import Owner
from simulator.scheduling.batch import BatchRequests, BatchTruth, ForwardBatch
from simulator.scheduling.batch_making import BatchMaking
from simulator.scheduling.content_tags import ContentTags
from simulator.scheduling.workload import make_requests

from .errors import EngineError
from .scheduler import ReleaseScheduler

#: the release's forward modes this source hands to the pipeline, by the step's mode name
MODES = {"EXTEND": "extend", "DECODE": "decode", "MIXED": "mixed"}


@dataclass
class _Row:
    """A request's ``req_to_token`` row as the forward reads it (``RequestSlots``'s ``full``)."""

    full: np.ndarray


class _Stop(BaseException):
    """Raised inside the release's thread when the run stops consuming steps (an error or ^C in the pipeline)."""


class ReleaseStepSource(BatchMaking):
    """The release's scheduler behind the run's scheduler interface (``steps``, ``owner_of``, counts)."""

    journal = None            # no overlap timeline (the release's overlap loop is not driven yet)

    def __init__(self, api, scenario, alloc, runner, release, rng: np.random.Generator, pad_value: int = 0,
                 pad_to_capture: bool = False, server_args=None):
        self.sc, self.alloc, self.rng = scenario, alloc, rng
        self.release = release
        self.pad_value, self.pad_to_capture = pad_value, pad_to_capture
        specs = make_requests(scenario.workload, rng)
        self.specs = specs
        self.total_requests = len(specs)
        self.retractions = 0
        self.content = ContentTags()
        self._content_keys = self.content.keys
        self._freed_full: list[np.ndarray] = []
        self._freed_swa: list[np.ndarray] = []
        self._evicted_swa: list[np.ndarray] = []
        self._mapping_changed: list[np.ndarray] = []
        page = alloc.page_size
        self._held = {"full": np.zeros(alloc.full_size + page, dtype=bool),
                      "swa": np.zeros(alloc.swa_size + page, dtype=bool)}
        self._full_of_swa = np.zeros(alloc.swa_size + page, dtype=np.int64)
        self._mapping_seen = alloc.full_to_swa.copy()
        self._seen: dict[int, int] = {}              # workload index -> the length its last forward left it at
        #: what the release did, as the oracle saw it (run.json's engine_pieces.scheduler.did)
        self.counts = {"extend": 0, "decode": 0, "mixed": 0, "freed_full_slots": 0, "freed_swa_slots": 0,
                       "evicted_swa_slots": 0}
        self._requests: Optional[BatchRequests] = None
        self._handoff: "queue.Queue[tuple[str, object]]" = queue.Queue()
        self._go = threading.Semaphore(0)
        self._stop = False
        self._thread: Optional[threading.Thread] = None
        self._step = 0
        self.scheduler = ReleaseScheduler(api, scenario, runner=runner, allocator=alloc, requests=specs,
                                          on_forward=self._on_forward, server_args=server_args)

    @property
    def source(self) -> str:
        return f"{self.scheduler.api.info.name} {self.scheduler.api.info.version} Scheduler"

    @property
    def tree_cache_source(self) -> str:
        """The tree cache the release configured for the scenario (run.json's ``sources.tree_cache``)."""
        return f"{self.source.rsplit(' ', 1)[0]} {type(self.scheduler.scheduler.tree_cache).__name__}"

    @property
    def finished_count(self) -> int:
        """Requests the release has finished (the run's progress line)."""
        return self.scheduler.finished_count

    def owner_of(self, tag: int) -> Owner:
        return self.content.owner_of(tag)

    def describe(self) -> dict:
        """The release's scheduler (its class, tree cache, stand-ins) and what it did in this run, as the oracle saw
        it: forwards by mode, retractions, slots freed and SWA slots evicted."""
        return dict(self.scheduler.describe(), did=dict(self.counts, retractions=self.retractions))

    # ------------------------------------------------------------------ the steps, one at a time

    def steps(self) -> Iterator[tuple[ForwardBatch, BatchTruth]]:
        ctx = contextvars.copy_context()
        grad = torch.is_inference_mode_enabled()
        self._thread = threading.Thread(target=ctx.run, args=(self._loop, grad), name="sglang-scheduler", daemon=True)
        self._thread.start()
        try:
            while True:
                kind, item = self._handoff.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise item             # type: ignore[misc]
                yield item                 # type: ignore[misc]
                self._step += 1
                self._go.release()
        finally:
            self._stop = True
            self._go.release()
            self._thread.join()
            self.close()

    def close(self) -> None:
        """Undo the release scheduler's overrides (idempotent)."""
        self.scheduler.close()

    def _loop(self, inference: bool) -> None:
        try:
            with torch.inference_mode(inference):
                self.scheduler.run()
        except _Stop:
            return
        except BaseException as e:          # the release's own failure reaches the run as it was raised
            self._handoff.put(("error", e))
            return
        self._handoff.put(("end", None))

    def _on_forward(self, batch) -> None:
        """In the release's thread, at its forward: the step, handed over; back when the pipeline ran it."""
        mode = MODES.get(batch.forward_mode.name)
        if mode is None:
            raise EngineError(f"the release's scheduler ran a {batch.forward_mode.name} forward: not a mode this "
                              f"run source hands to the pipeline ({', '.join(MODES)})")
        self.counts[mode] += 1
        self._handoff.put(("step", self._step_of(batch, mode)))
        self._go.acquire()
        if self._stop:
            raise _Stop()

    # ------------------------------------------------------------------ the oracle's view of one forward

    def _step_of(self, batch, mode: str) -> tuple[ForwardBatch, BatchTruth]:
        reqs = batch.reqs
        seq = batch.seq_lens.cpu().numpy().astype(np.int64)
        ext = np.ones(len(reqs), dtype=np.int64) if mode == "decode" else np.asarray(batch.extend_lens, np.int64)
        loc = batch.out_cache_loc.cpu().numpy().astype(np.int64)
        if int(ext.sum()) != loc.shape[0]:
            raise EngineError(f"the release's batch writes {loc.shape[0]} slots for {int(ext.sum())} new tokens")
        rids = np.fromiter((int(r.rid) for r in reqs), dtype=np.int64, count=len(reqs))
        self._learn_frees()
        swa = self.alloc.full_to_swa[loc].copy()
        tags = np.concatenate([self._tag_row(int(i))[s - e:s] for i, s, e in zip(rids.tolist(), seq.tolist(),
                                                                                ext.tolist())])
        r2t = self.scheduler.scheduler.req_to_token_pool.req_to_token
        idx = batch.req_pool_indices.cpu().tolist()
        rows = tuple(_Row(r2t[i, :s].cpu().numpy().astype(np.int64)) for i, s in zip(idx, seq.tolist()))
        self._requests = BatchRequests(rids=rids, seq_lens=seq, extend_lens=ext, slots=rows,
                                       tag_bases=np.zeros(len(reqs), dtype=np.int64))
        for i, s, e in zip(rids.tolist(), seq.tolist(), ext.tolist()):
            if s - e < self._seen.get(i, 0):
                self.retractions += 1        # prefilled again below the length it had reached: it was retracted
            self._seen[i] = s
        self._held["full"][loc] = True
        self._held["swa"][swa] = True
        self._full_of_swa[swa] = loc
        return self._make_batch(self._step, mode, len(reqs), [tags], [loc], [swa])

    def _batch_requests(self, tags: list) -> BatchRequests:
        return self._requests

    def _tag_row(self, index: int) -> np.ndarray:
        return self.content.row(index, self.specs)

    def _free_mask(self, sub) -> np.ndarray:
        """Which slots of a sub-allocator are on its free lists (``free_pages``, ``release_pages``: page ids)."""
        page = self.alloc.page_size
        n = (sub.size if hasattr(sub, "size") else 0) + page
        pages = np.zeros(n // page + 1, dtype=bool)
        for part in (sub.free_pages, getattr(sub, "release_pages", None)):
            if part is not None and part.numel():
                pages[part.cpu().numpy()] = True
        return np.repeat(pages, page)[:n] if page > 1 else pages[:n]

    def _learn_frees(self) -> None:
        """What went back to the release's free lists since the previous forward, and the mapping's changes."""
        eng = self.alloc.engine
        free_full = self._free_mask(eng.full_attn_allocator)
        free_swa = self._free_mask(eng.swa_attn_allocator)
        held_full, held_swa = self._held["full"], self._held["swa"]
        freed_full = np.flatnonzero(held_full[:free_full.shape[0]] & free_full[:held_full.shape[0]])
        freed_swa = np.flatnonzero(held_swa[:free_swa.shape[0]] & free_swa[:held_swa.shape[0]])
        held_full[freed_full] = False
        held_swa[freed_swa] = False
        c = self.counts
        if freed_full.size:
            self._freed_full.append(freed_full)
            c["freed_full_slots"] += int(freed_full.size)
        if freed_swa.size:
            self._freed_swa.append(freed_swa)
            c["freed_swa_slots"] += int(freed_swa.size)
            # an SWA slot whose full slot is still held was evicted (out of the window, or a tree tombstone)
            evicted = freed_swa[held_full[self._full_of_swa[freed_swa]]]
            if evicted.size:
                self._evicted_swa.append(evicted)
                c["evicted_swa_slots"] += int(evicted.size)
        cur = self.alloc.full_to_swa
        changed = np.flatnonzero(cur != self._mapping_seen)
        if changed.size:
            self._mapping_seen[changed] = cur[changed]
            self._mapping_changed.append(changed)
