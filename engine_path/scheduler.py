"""The release's own scheduler on a CPU: its ``Scheduler`` decides every batch of a scenario's workload.

The release's ``Scheduler`` is built by its own ``__init__`` (every ``init_*`` step it orchestrates), with the steps
that need a server replaced: no model is loaded, no socket opened, no thread started. What stands in, and why, is
:data:`STAND_INS` (every run that uses this module says it). What is the release's own: the request objects
(``TokenizedGenerateReqInput`` through ``handle_generate_request``: its ``Req``), the scheduling policy and prefill
adder, ``ScheduleBatch`` and its preparation for extend and decode, the allocation they call
(sglang/srt/mem_cache/allocation.py) over the release's ``SWATokenToKVPoolAllocator``, the tree cache its
``build_kv_cache`` configures for the scenario (``SWAChunkCache`` or the radix caches), decode-time SWA eviction,
retraction, chunked prefill, ``process_batch_result`` with its ``cache_finished_req`` / ``cache_unfinished_req``, and
the event loop itself (``event_loop_normal``). The forward is a stand-in: it records what the release handed it (a
:class:`Decision` per forward) and samples each request's next token from the workload's content (so the release's
tree holds a request's output as the workload's later turns read it; ``ignore_eos``: a request ends at its
``max_new_tokens``: the scenario's ``output_len`` counts a request's decode forwards, each writing one token's KV,
while the release's prefill samples the first new token, so the release is asked for ``output_len + 1``).

Arrivals follow the model's clock (simulator/scheduling/scheduler.py): a request of ``arrival_step`` s is handed to
the release before the loop iteration that runs forward s (the forwards run so far), and an idle release jumps to the
next arrival; a conversation's turn k > 1 is handed over once turn k - 1 has finished, ``think_time`` steps later (not
before its own arrival), as the model's radix scheduler holds it. Not driven yet (each refused with its reason): the overlap loop, speculative decoding, DP attention, a
PD decode node, the unified pool.
"""
from __future__ import annotations

import importlib
import importlib.util
from array import array
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any, Optional

import numpy as np
import torch

from .api import ReleaseAPI
from .errors import EngineError, SchedulerStalled

SCHEDULER = "sglang.srt.managers.scheduler"
IPC = "sglang.srt.managers.scheduler_components.ipc_channels"
SENDER = "sglang.srt.managers.scheduler_components.output_sender"
IO = "sglang.srt.managers.io_struct"
SAMPLING = "sglang.srt.sampling.sampling_params"
RESULT = "sglang.srt.managers.utils"
TP_WORKER = "sglang.srt.managers.tp_worker"
NGRAM = "sglang.srt.model_executor.model_runner_components.ngram_embedding_manager"
MODEL_CONFIG = "sglang.srt.configs.model_config"
RUNTIME_CONTEXT = "sglang.srt.runtime_context"
ENVIRON = "sglang.srt.environ"

#: the packages the release's scheduler module imports that its memory modules do not (the ``sglang`` extra has them)
SCHEDULER_DEPS = ("fastapi", "uvicorn", "setproctitle", "zmq")

#: passes of the release's loop without a forward, while requests wait, before the run is called stalled
STALL_PASSES = 64

#: what of the release's scheduler start-up stands in for a server's, and why
STAND_INS = {
    "init_tp_model_worker": "no model is loaded: the worker is the release's BaseTpWorker over the run's release "
                            "pools (engine_path.forward.runner); its forward records the batch and samples the "
                            "workload's next token",
    "maybe_init_draft_worker": "no speculative decoding yet: no draft worker",
    "init_memory_pools, init_all_attention_backends, init_all_cuda_graphs": "the pools are built before the "
                                                                           "scheduler; no forward runs here",
    "init_model_config": "the scenario model's compact config (engine_path.forward.runner.model_config)",
    "init_ipc_channels": "no tokenizer, detokenizer or ZMQ: the release's SchedulerIpcChannels with no sockets "
                        "(outputs dropped, as on a rank that sends none)",
    "bootstrap.init_parallel_runtime, init_layer_runtime": "one rank: the release's runtime_context parallel "
                                                           "overrides (ranks 0, groups of one) instead",
    "init_soft_watchdog, init_startup_timing_summary": "a server's watchdog thread and start-up log",
}

#: scenario features this module cannot drive yet, and why (checked before anything is built)
NOT_YET = (
    (lambda sc: sc.engine.overlap, "engine.overlap: the release's overlap loop is not driven yet"),
    (lambda sc: sc.engine.cache_linker, "engine.cache_linker: the external cache linker is the model's (the "
                                        "release's tree runs without one)"),
    (lambda sc: sc.engine.speculative.enabled, "engine.speculative: no draft worker yet"),
    (lambda sc: sc.engine.dp_size > 1, "engine.dp_size > 1: DP attention's batch sync is not driven yet"),
    (lambda sc: sc.engine.pd_decode, "engine.pd_decode: the PD decode node's loop is not driven yet"),
    (lambda sc: sc.engine.kv_offload, "engine.kv_offload: an offload tier is driven as vLLM's KV connector only "
                                      "(--engine vllm)"),
    (lambda sc: sc.pool.unified, "pool.unified: the unified pool's allocator is not built here yet"),
)


@dataclass(frozen=True)
class Decision:
    """One forward a scheduler made: its mode, requests (the workload's uids, in batch order), each request's
    new tokens and length after the forward, the slots it writes (real rows), the free slots left in each pool and
    the tree's state: (Full tokens evictable, Full tokens locked, live SWA tokens evictable, live SWA tokens locked),
    all 0 without the radix cache."""

    step: int
    mode: str
    rids: tuple
    extend_lens: tuple
    seq_lens: tuple
    out_cache_loc: tuple
    full_free: int
    swa_free: int
    tree: tuple = (0, 0, 0, 0)

    def to_json(self) -> dict:
        return asdict(self)


def server_fields(sc) -> dict:
    """The release's server args that make its scheduler the scenario's (no tokenizer, no grammar, the normal loop)."""
    e = sc.engine
    return dict(grammar_backend="none", skip_tokenizer_init=True, disable_overlap_schedule=True,
                disable_radix_cache=not e.radix_cache, enable_mixed_chunk=e.mixed_chunk,
                chunked_prefill_size=e.chunked_prefill_size or -1, max_running_requests=e.max_running_requests)


#: what the release's scheduler keeps of a row's context length from a prompt: ``get_worker_info`` serves
#: ``max_req_input_len = min(context_len, kv_capacity) - 1 - 5`` and refuses a prompt of that length or more
INPUT_MARGIN = 6


def scheduler_context_len(sc) -> int:
    """The stand-in's context length for the release's scheduler: the forward's (engine_path.forward.runner's
    ``context_len``) plus the release's input margin, so the scenario's longest prompt is served, not refused."""
    from .forward.runner import context_len

    return context_len(sc) + INPUT_MARGIN


def unsupported(sc) -> Optional[str]:
    """Why the release's scheduler cannot run ``sc`` here yet (None: it can)."""
    return next((why for test, why in NOT_YET if test(sc)), None)


#: the releases whose ``Scheduler`` this module drives (its ``__init__`` steps and stand-ins are 0.5.23's)
RELEASES = ("0.5.23",)


def release_unsupported(version: str) -> Optional[str]:
    """Why the scheduler of release ``version`` is not driven here (None: it is)."""
    if version in RELEASES:
        return None
    return (f"sglang {version}'s Scheduler is not driven here (its start-up steps are stood in for "
            f"{', '.join(RELEASES)} only)")


def check_deps() -> None:
    missing = [m for m in SCHEDULER_DEPS if importlib.util.find_spec(m) is None]
    if missing:
        raise EngineError(f"the release's scheduler module imports {', '.join(missing)}, not installed here: "
                          f"pip install -e '.[sglang]' (the sglang extra has them)")


class ReleaseScheduler:
    """The release's ``Scheduler`` over one scenario's workload, on the run's release pools (built first)."""

    def __init__(self, api: ReleaseAPI, scenario, *, runner, allocator, requests, on_forward=None,
                 server_args=None):
        """``on_forward(batch)``: called with the release's ``ScheduleBatch`` at each forward, after its decision is
        recorded and before the stand-in samples (a run source hands the batch to the step pipeline there).
        ``server_args``: the release's server args already published with :func:`server_fields` (a run publishes
        one set for its backends and its scheduler); None: published here."""
        why = unsupported(scenario)
        if why:
            raise EngineError(f"the release's scheduler: {why}")
        check_deps()
        self.api, self.sc, self.runner, self.allocator = api, scenario, runner, allocator
        #: (the workload's index, RequestSpec) not yet handed to the release, by arrival
        self.pending = [(i, r) for i, r in enumerate(requests) if r.turn <= 1]
        self.specs = list(requests)
        #: a conversation's later turns, held back until the turn before finishes (plus its think time), as the
        #: model's radix scheduler holds them (simulator/scheduling/sharing.py)
        self._later = {(r.conversation, r.turn): (i, r) for i, r in enumerate(requests) if r.turn > 1}
        self._ready: list = []                 # (step, uid, index, spec): a later turn due at step
        self._turns: dict = {}                 # index -> the release's Req of a turn whose next turn waits
        self._live: list = []                  # the release's Req of every request handed over, until it finishes
        self.handed = 0                        # requests handed over
        self.on_forward = on_forward
        self.decisions: list[Decision] = []
        self._undo: list = []
        self._clock_skip = 0                   # steps an idle release jumped (the model's clock does too)
        self._max_steps: Optional[int] = None
        try:
            self._publish(server_args)
            self.scheduler = self._build()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ set-up

    def _publish(self, server_args) -> None:
        """The server args and one-rank parallel config the release's scheduler reads, through its own overrides."""
        rc = importlib.import_module(RUNTIME_CONTEXT)
        one = SimpleNamespace(rank_in_group=0, world_size=1, cpu_group=None, device_group=None, ranks=[0],
                              first_rank=0, last_rank=0, is_first_rank=True, is_last_rank=True)
        par = rc.get_parallel().override(tp_rank=0, pp_rank=0, attn_tp_rank=0, attn_dp_rank=0, attn_cp_rank=0,
                                         moe_ep_rank=0, dp_rank=None, tp_group=one, pp_group=one, attn_tp_group=one,
                                         attn_cp_group=one, moe_ep_group=one, world_group=one)
        par.__enter__()
        self._undo.append(lambda: par.__exit__(None, None, None))
        # the scenario's SWA eviction cadence, as a server reads it (the release's env, through its own override)
        interval = importlib.import_module(ENVIRON).envs.SGLANG_SWA_EVICTION_INTERVAL.override(
            self.sc.engine.swa_eviction_interval)
        interval.__enter__()
        self._undo.append(lambda: interval.__exit__(None, None, None))
        if server_args is not None:
            self.server_args = server_args
            return
        over = rc.get_context().override_server_args(
            attention_backend="triton", page_size=self.sc.pool.page_size, dp_size=1, tp_size=1, pp_size=1,
            speculative_algorithm=None, is_embedding=False, **server_fields(self.sc))
        self.server_args = over.install()
        self._undo.append(over.restore)

    def _build(self):
        mod = importlib.import_module(SCHEDULER)
        mc = _scheduler_model_config(self.runner.bag.model_config)
        worker = _worker_class(self.api)(self, mc)
        owner = self

        def ingest_requests(sched) -> None:
            owner._ingest(sched)

        overrides = {
            "init_soft_watchdog": lambda s: None,
            "init_startup_timing_summary": lambda s: None,
            "init_model_config": lambda s: setattr(s, "model_config", mc),
            "init_ipc_channels": _no_ipc,
            "init_tp_model_worker": lambda s: setattr(s, "tp_worker", worker),
            "maybe_init_draft_worker": lambda s: setattr(s, "draft_worker", None),
            "init_memory_pools": lambda s: None,
            "init_all_attention_backends": lambda s: None,
            "init_all_cuda_graphs": lambda s: None,
            "ingest_requests": ingest_requests,
        }
        cls = type("SlotscopeScheduler", (mod.Scheduler,), overrides)
        real_bootstrap = mod.bootstrap
        mod.bootstrap = SimpleNamespace(init_parallel_runtime=lambda **kw: None, init_layer_runtime=lambda **kw: None)
        try:
            return cls(self.server_args, SimpleNamespace(nccl_port=0))
        finally:
            mod.bootstrap = real_bootstrap

    # ------------------------------------------------------------------ the loop

    def run(self, max_steps: Optional[int] = None) -> list[Decision]:
        """Run the release's own ``event_loop_normal`` until the workload is served (or ``max_steps`` forwards)."""
        self._max_steps = max_steps
        self._idle = self._stall = 0
        self._last_ct = -1
        self.scheduler.event_loop_normal()
        # the loop checks its exit flag at its top: the pass that set it may have run one forward more
        return self.decisions if max_steps is None else self.decisions[:max_steps]

    def _clock(self, sched) -> int:
        return sched.forward_ct + self._clock_skip

    def unfinished(self) -> int:
        """Requests handed over that have not finished (waiting, prefilling, decoding, or in the batch just run,
        which the release merges into its running batch only at its next ``get_next_batch_to_run``)."""
        self._live = [r for r in self._live if not r.finished()]
        return len(self._live)

    @property
    def finished_count(self) -> int:
        """Requests handed over that have finished."""
        return self.handed - self.unfinished()

    def _busy(self, sched) -> bool:
        return self.unfinished() > 0 or bool(sched.waiting_queue)

    def _next_arrival(self) -> Optional[int]:
        due = [self.pending[0][1].arrival_step] if self.pending else []
        return min(due + [r[0] for r in self._ready]) if due or self._ready else None

    def _finish_turns(self, clock: int) -> None:
        """A finished turn's next turn becomes due ``think_time`` steps later (not before its own arrival)."""
        for index, req in list(self._turns.items()):
            if req.finished():
                del self._turns[index]
                spec = self.specs[index]
                nxt = self._later.pop((spec.conversation, spec.turn + 1), None)
                if nxt is not None:
                    self._ready.append((max(nxt[1].arrival_step, clock + nxt[1].think_time), nxt[1].uid, *nxt))
        self._ready.sort(key=lambda x: (x[0], x[1]))

    def _ingest(self, sched) -> None:
        """The release's ``ingest_requests``: the requests due by the model's clock, then the loop's end."""
        self._finish_turns(self._clock(sched))
        busy = self._busy(sched)
        due = self._next_arrival()
        if due is not None and not busy and due > self._clock(sched):
            self._clock_skip += due - self._clock(sched)
        while self.pending and self.pending[0][1].arrival_step <= self._clock(sched):
            self._submit(sched, *self.pending.pop(0))
        while self._ready and self._ready[0][0] <= self._clock(sched):
            self._submit(sched, *self._ready.pop(0)[2:])
        if self._max_steps is not None and sched.forward_ct >= self._max_steps:
            sched.gracefully_exit = True
        elif not self.pending and not self._ready and not self._later and not self._busy(sched):
            self._idle += 1
            sched.gracefully_exit = self._idle > 1     # one idle pass first: the release's on_idle self-check
        else:
            self._stall = self._stall + 1 if sched.forward_ct == self._last_ct else 0
            self._last_ct = sched.forward_ct
            if self._stall > STALL_PASSES:
                raise SchedulerStalled(f"the release's scheduler stalled: {STALL_PASSES} passes of its loop without a "
                                  f"forward, {len(sched.waiting_queue)} requests waiting")

    def _submit(self, sched, index: int, spec) -> None:
        io = importlib.import_module(IO)
        # the scenario's output_len is the request's decode forwards (each writes one token's KV, as the model
        # counts them); the release's prefill samples the first new token, so it is asked for one more
        sp = importlib.import_module(SAMPLING).SamplingParams(max_new_tokens=spec.output_len + 1, ignore_eos=True)
        sp.normalize(None)
        sp.verify(sched.model_config.vocab_size)
        rid = str(index)
        ids = [int(t) for t in spec.tokens(0, spec.prompt_len)]
        req = io.TokenizedGenerateReqInput(
            rid=rid, input_text=None, input_ids=array("q", ids), input_embeds=None, mm_inputs=None,
            token_type_ids=None, sampling_params=sp, return_logprob=False, logprob_start_len=-1, top_logprobs_num=0,
            token_ids_logprob=None, stream=False)
        sched.handle_generate_request(req)
        made = next((r for r in reversed(sched.waiting_queue) if r.rid == rid), None)
        if made is None:
            raise EngineError(f"the release did not queue workload request {index} (handle_generate_request)")
        self._live.append(made)
        self.handed += 1
        if (spec.conversation, spec.turn + 1) in self._later:
            self._turns[index] = made

    def forward(self, batch) -> Any:
        """The stand-in forward: records the release's batch, samples each request's next workload token."""
        mode = batch.forward_mode.name.lower()
        n = len(batch.reqs)
        seq = [int(x) for x in batch.seq_lens.tolist()]
        if batch.forward_mode.is_decode():
            ext = [1] * n
        else:
            ext = [int(x) for x in batch.extend_lens]
        loc = [int(x) for x in batch.out_cache_loc.tolist()]
        self.decisions.append(Decision(
            step=len(self.decisions), mode=mode, rids=tuple(self.specs[int(r.rid)].uid for r in batch.reqs),
            extend_lens=tuple(ext), seq_lens=tuple(seq), out_cache_loc=tuple(loc), full_free=int(self.allocator.full_free),
            swa_free=int(self.allocator.swa_free), tree=self._tree_state()))
        if self.on_forward is not None:
            self.on_forward(batch)
        result = importlib.import_module(RESULT).GenerationBatchResult
        return result(next_token_ids=torch.tensor([self._next_token(int(r.rid), s) for r, s in zip(batch.reqs, seq)],
                                                  dtype=torch.int64))

    def _tree_state(self) -> tuple:
        """The release's tree as a Decision counts it (its own size accessors; 0s where the cache is disabled)."""
        t = self.scheduler.tree_cache
        if getattr(t, "disable", True):
            return (0, 0, 0, 0)
        return (int(t.full_evictable_size()), int(t.full_protected_size()), int(t.swa_evictable_size()),
                int(t.swa_protected_size()))

    def _next_token(self, index: int, seq_len: int) -> int:
        """The token sampled after a forward that leaves request ``index`` at ``seq_len``: the workload's content
        at that position (so the release's tree caches a request's output as the workload's later turns read it)."""
        spec = self.specs[index]
        return int(spec.tokens(seq_len, seq_len + 1)[0]) if seq_len < spec.total_len else 1

    def close(self) -> None:
        while self._undo:
            self._undo.pop()()

    def describe(self) -> dict:
        return {"scheduler": f"sglang {self.api.info.version} Scheduler (its own __init__ and event_loop_normal)",
                "tree_cache": type(self.scheduler.tree_cache).__name__, "stand_ins": dict(STAND_INS)}


def _no_ipc(sched, port_args=None) -> None:
    """The release's channels with no sockets: nothing received, outputs dropped."""
    sender = importlib.import_module(SENDER).SenderWrapper
    sched.ipc_channels = importlib.import_module(IPC).SchedulerIpcChannels(
        recv_from_tokenizer=None, recv_from_rpc=None, send_to_tokenizer=sender(None), send_to_detokenizer=sender(None),
        send_metrics_from_scheduler=None)
    sched.load_snapshot_writer = None
    sched.recv_from_tokenizer = None


def _scheduler_model_config(cfg):
    """The runner's model config with what the scheduler reads besides (a model without reasoning or n-gram
    parts), resolved to SGLang's own model implementation."""
    mc = SimpleNamespace(**vars(cfg))
    mc._resolved_model_impl = importlib.import_module(MODEL_CONFIG).ModelImpl.SGLANG
    mc._resolved_model_arch = cfg.hf_config.architectures[0]
    # token ids are the workload's 63-bit content ids (the release ends a request that samples one past its vocab)
    mc.vocab_size = 2 ** 63 - 1
    mc.hf_eos_token_id = None
    mc.think_end_ids = mc.self_opened_think_start_ids = mc.request_selectable_think_end_id_sequences = None
    mc.use_ngram_embedding = mc.use_engram = False
    mc.ngram_embedding_n = None
    return mc


def _worker_class(api: ReleaseAPI):
    """A subclass of the release's ``BaseTpWorker`` (its pool getters are the release's) whose forward is
    :meth:`ReleaseScheduler.forward`; ``get_worker_info`` is the release's ``TpModelWorker``'s."""
    tpw = importlib.import_module(TP_WORKER)

    class StandInWorker(tpw.BaseTpWorker):
        get_worker_info = tpw.TpModelWorker.get_worker_info

        def __init__(self, owner: ReleaseScheduler, mc):
            self.owner = owner
            bag, alloc = owner.runner.bag, owner.allocator
            self.model_config = mc
            self.random_seed, self.device, self.dllm_algorithm = owner.sc.seed, "cpu", None
            ngram = importlib.import_module(NGRAM).NgramEmbeddingManager.from_model(
                model=bag.model, model_config=mc, req_to_token_pool=bag.req_to_token_pool,
                max_running_requests=bag.max_running_requests, device="cpu")
            self._runner = SimpleNamespace(
                **vars(bag), mtp_draft_device_pools=(), mtp_draft_mamba_pools=(), forward_stream=None,
                attn_backend=None, ngram_embedding_manager=ngram, prefill_aware_swa=False,
                prewarm_sampling=lambda: None, full_max_total_num_tokens=alloc.full_size,
                swa_max_total_num_tokens=alloc.swa_size, logical_max_total_num_tokens=alloc.full_size,
                effective_logical_max_total_num_tokens=alloc.full_size)

        @property
        def model_runner(self):
            return self._runner

        def forward_batch_generation(self, batch, *args, **kwargs):
            return self.owner.forward(batch)

    return StandInWorker


def trace_schedule(path: str, options: Optional[dict] = None) -> dict:
    """The release's decisions for a scenario file (run under a release: ``engine_path.isolate.call``)."""
    from engine_path.allocator import EngineAllocator
    from engine_path.api import load
    from engine_path.forward.runner import build_runner, publish_config, request_rows
    from simulator.scenario import load_scenario
    from simulator.scheduling.workload import make_requests

    o = dict(options or {})
    sc = load_scenario(path)
    why = unsupported(sc)
    if why:
        raise EngineError(f"the release's scheduler: {why}")
    api = load()
    pc = sc.pool
    alloc = EngineAllocator(api, pc.full_size, pc.swa_size, pc.page_size, device="cpu")
    ctx = publish_config(api, backend="triton", page_size=pc.page_size, device="cpu")
    try:
        runner = build_runner(api, model=sc.model, allocator=alloc, max_requests=request_rows(sc),
                              context_len=scheduler_context_len(sc), device="cpu", server_args=ctx.server_args)
        specs = make_requests(sc.workload, np.random.default_rng(sc.seed))
        rs = ReleaseScheduler(api, sc, runner=runner, allocator=alloc, requests=specs)
        try:
            decisions = rs.run(o.get("max_steps"))
            info = rs.describe()
        finally:
            rs.close()
    finally:
        ctx.close()
    return {"info": dict(info, scenario=sc.name, release=api.info.version),
            "steps": [d.to_json() for d in decisions]}
