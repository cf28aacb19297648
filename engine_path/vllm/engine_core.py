"""vLLM's engine core loop over the release's scheduler: one schedule and one output at a time, or async scheduling.

:class:`EngineCoreLoop` is the part of :class:`~engine_path.vllm.scheduler.VllmScheduler` that orders the release's
``schedule()`` and ``update_from_output`` calls as vLLM's engine core does: stepping synchronously (``step``: a
schedule, its forward, its output), or under async scheduling (``engine.overlap``; ``step_with_batch_queue`` with a
queue of two: the next schedule before the output of the forward before it). A forward is a :class:`Step`; a
schedule that runs none is an :class:`Idle`; both carry the offload tier's async loads they issued, reported done
in their output. The host class provides the scheduler, the arrivals and the accounting the methods name.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..errors import SchedulerStalled


def _mod(name: str):
    return importlib.import_module(name)


@dataclass
class Step:
    """One forward as the release scheduled it: per request (batch order) its id, first position and new tokens,
    and the blocks the scheduler's output handed the worker."""

    output: object                              # the release's SchedulerOutput
    req_ids: list[str]
    starts: np.ndarray                          # int64: num_computed_tokens before the forward
    counts: np.ndarray                          # int64: tokens scheduled
    new_rows: dict = field(default_factory=dict)        # req_id -> per group block ids (a new or resumed request)
    appended: dict = field(default_factory=dict)        # req_id -> per group block ids appended
    dummy: bool = False                                 # a DP rank's dummy forward (no request of this rank)
    samples: list = field(default_factory=list)         # per request: the forward samples its next token
    recving: set = field(default_factory=set)           # the offload tier's async loads this schedule issued
    carried: set = field(default_factory=set)           # gone in the empty schedules since the previous forward
    drafts: Optional[np.ndarray] = None                 # EAGLE: per request the draft tokens scheduled (verified)
    accepted: Optional[np.ndarray] = None               # EAGLE: per request the leading drafts the target accepts

    def sample_at(self) -> np.ndarray:
        """Per request, the position of the first token its forward samples: after its last input, or after a
        verify's input token (its drafts are checked, not taken as input)."""
        return self.starts + self.counts - (0 if self.drafts is None else self.drafts)

    def kept(self) -> np.ndarray:
        """Per request, the drafts the target accepts (0 without EAGLE)."""
        return np.zeros(len(self.req_ids), dtype=np.int64) if self.accepted is None else self.accepted

    @property
    def gone(self) -> set:
        """Requests whose worker row goes before this forward: finished, or preempted by this schedule or by an
        empty one since the previous forward (whose output the model runner applies without running a forward)."""
        if self.output is None:
            return set(self.carried)
        return (set(self.output.finished_req_ids) | set(getattr(self.output, "preempted_req_ids", None) or ())
                | self.carried)


@dataclass
class Idle:
    """An empty schedule's output (no forward runs), kept until the engine core processes it."""

    output: object
    recving: set = field(default_factory=set)


def _content(row: np.ndarray, first: int, n: int) -> list[int]:
    """``n`` tokens of a request's content from position ``first`` (0 past its end: a token never sampled)."""
    return [int(row[p]) if p < row.shape[0] else 0 for p in range(first, first + n)]


class EngineCoreLoop:
    """The engine core's loop (see the module docstring); mixed into ``VllmScheduler``."""

    def next_step(self) -> Optional[Step]:
        """The release's next forward (None: the workload is done or ``max_steps`` reached)."""
        return self._next_async() if self.async_ else self._next_sync()

    def _next_sync(self) -> Optional[Step]:
        idle = 0
        while True:
            if self.max_steps is not None and self.forwards >= self.max_steps:
                return None
            if self._idle_rank():
                return self._dummy()
            self._arrivals()
            if self.done():
                self._check_returned()
                return None
            entry = self._schedule()
            if isinstance(entry, Step):
                return entry
            # nothing to run: let its bookkeeping settle (an empty step); the clock goes on (an idle engine core
            # still receives requests; _arrivals jumps it when no request is waiting)
            self._process(entry)
            idle += 1
            if not (self.pending or self._ready) and idle > 2:
                raise SchedulerStalled(self._stalled(idle))

    def _next_async(self) -> Optional[Step]:
        """The engine core's loop under async scheduling (``step_with_batch_queue``, a queue of two): schedule the
        next batch, and once the queue is full process its oldest output, so the scheduler runs one schedule ahead
        of the outputs it has seen (its requests' computed counts optimistic, their next tokens placeholders). A
        forward's output is processed after the next schedule; the forward itself runs before the next one, on
        one stream, as the source executes it. The next schedule may already have been made while the forward
        before it ran (:meth:`schedule_ahead`)."""
        idle = 0
        while True:
            if self.max_steps is not None and self.forwards >= self.max_steps:
                return None
            self._arrivals()
            if not self._queue and self._made is None and self.done():
                self._check_returned()
                return None
            step, entry = None, None
            if self._made is not None:
                entry, self._made = self._made, None
            elif self.scheduler.has_requests():
                entry = self._schedule_queued()
            if entry is not None:
                if isinstance(entry, Step):
                    step, idle = entry, 0
                else:
                    idle += not any(isinstance(q, Step) for q in self._queue)
                    if not (self.pending or self._ready) and idle > 2:
                        raise SchedulerStalled(self._stalled(idle))
                if len(self._queue) < 2 and (step is not None or self.scheduler.has_requests()):
                    if step is not None:
                        return step
                    continue
            elif not self._queue:
                if not (self.pending or self._ready):
                    raise SchedulerStalled(self._stalled(idle))
                continue
            self._process(self._queue.pop())
            if step is not None:
                return step

    def schedule_ahead(self) -> None:
        """Async scheduling: make the next schedule now, while the forward just built runs (the engine core
        schedules before that forward's output is back); :meth:`next_step` goes on from it. Sync: nothing."""
        if not self.async_ or self._made is not None:
            return
        if self.max_steps is not None and self.forwards >= self.max_steps:
            return
        self._arrivals()
        if self.scheduler.has_requests():
            self._made = self._schedule_queued()

    def _schedule_queued(self):
        self.ahead += any(isinstance(q, Step) for q in self._queue)
        entry = self._schedule()
        self._queue.insert(0, entry)
        return entry

    def _schedule(self):
        """One ``schedule()``: a :class:`Step` (a forward runs) or an :class:`Idle` (none), with the offload
        tier's async loads it issued."""
        out = self._call("scheduler (schedule)", self.scheduler.schedule)
        self._note_undrained()
        if out.total_num_scheduled_tokens > 0:
            entry = self._forward(out)
        else:
            self._empty(out)
            entry = Idle(out)
        tier = self.tier
        if tier is not None:
            entry.recving = tier.take_finished()
            for rid, load in tier.loads.items():       # the blocks each load of this schedule lands in
                if not load.blocks:
                    load.blocks = tuple(self.manager_blocks(rid))
        return entry

    def _forward(self, out) -> Step:
        self._gap = 0
        self.preemptions += len(getattr(out, "preempted_req_ids", None) or ())
        step = self._step_of(out)
        step.carried, self._carried = self._carried, set()
        return step

    def _empty(self, out) -> None:
        """An empty schedule: the model runner applies its output (finished and preempted rows go) without a
        forward, so the next forward's worker step frees them; the clock goes on."""
        self._carried |= Step(out, [], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)).gone
        self.preemptions += len(getattr(out, "preempted_req_ids", None) or ())
        self.clock += 1


    def finish_step(self, step: Step) -> None:
        """``step``'s forward has run. Its output reaches the scheduler now, or under async scheduling after the
        next schedule (:meth:`_next_async`)."""
        if not self.async_:
            self._process(step)

    def _process(self, entry) -> None:
        """``update_from_output`` of a scheduled output: an empty one's, or a forward's with the next token of
        each request whose chunk reached its end (the token at the position after it: the workload's content)."""
        outputs = _mod("vllm.v1.outputs")
        # the tier's async loads of this schedule, done by the worker within it
        kv = outputs.KVConnectorOutput(finished_recving=set(entry.recving)) if entry.recving else None
        if isinstance(entry, Idle):
            self._call("scheduler (update_from_output)", self.scheduler.update_from_output, entry.output,
                       outputs.ModelRunnerOutput(req_ids=[], kv_connector_output=kv))
            return
        step, reqs = entry, self.scheduler.requests
        sampled = []
        for rid, base, samples, a in zip(step.req_ids, step.sample_at().tolist(), step.samples, step.kept().tolist()):
            # the token after the request's last input (after a verify: its accepted drafts, then the bonus token)
            sampled.append(_content(self.tokens(int(rid)), base, 1 + a) if samples else [])
        out = outputs.ModelRunnerOutput(req_ids=list(step.req_ids), sampled_token_ids=sampled, kv_connector_output=kv)
        self._call("scheduler (update_from_output)", self.scheduler.update_from_output, step.output, out)
        self.forwards += 1
        self.clock += 1
        for rid in step.req_ids:
            if reqs.get(rid) is None or reqs[rid].is_finished():
                self.finished += 1
                self._finish_turn(rid)
        if step.drafts is not None:
            self._propose(step)

    def _propose(self, step: Step) -> None:
        """EAGLE: the drafter's proposals after the forward (``update_draft_token_ids``, as the engine core hands
        them over): for each request that sampled, the ``num_speculative_tokens`` tokens after its new last token,
        the workload's content (the target accepts a leading run of them: :meth:`Step.kept`)."""
        k, reqs = self.vllm_config.num_speculative_tokens, self.scheduler.requests
        ids, drafts = [], []
        for rid, base, samples, a in zip(step.req_ids, step.sample_at().tolist(), step.samples, step.kept().tolist()):
            if samples and reqs.get(rid) is not None and not reqs[rid].is_finished():
                ids.append(rid)
                drafts.append(_content(self.tokens(int(rid)), base + a + 1, k))
        if ids:
            self._call("scheduler (update_draft_token_ids)", self.scheduler.update_draft_token_ids,
                       _mod("vllm.v1.outputs").DraftTokenIds(req_ids=ids, draft_token_ids=drafts))
