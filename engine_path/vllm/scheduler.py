"""The release's own scheduler on a CPU: vLLM's ``Scheduler`` and its hybrid ``KVCacheManager`` decide every batch.

:class:`VllmScheduler` builds the release's ``Scheduler`` for a scenario and drives it one step at a time, as vLLM's
engine core does (``schedule()``, the model's forward, ``update_from_output``), without a model, a tokenizer, a
worker process or a GPU. What is the release's own: the scheduling loop (admission, chunked prefill, preemption and
resumption), the ``Request`` objects and their block hashes, the KV-cache groups of the scenario's layers
(``get_kv_cache_groups``: vLLM's own grouping), the ``HybridKVCacheCoordinator`` with its full-attention and
sliding-window managers, the one shared ``BlockPool`` and its null block, prefix caching. What stands in, and why,
is :data:`STAND_INS` (run.json says it).

The scenario maps onto vLLM as follows: the pool's ``full_size`` slots are ``full_size / page_size`` blocks of
``page_size`` tokens, plus the null block (block 0), shared by every group (the scenario's ``swa_size`` has no
counterpart: vLLM has one pool); ``chunked_prefill_size`` is the token budget of a step (``max_num_batched_tokens``);
``max_running_requests`` is ``max_num_seqs`` (at most the token budget, as vLLM asks); ``engine.overlap`` is the
engine core's async scheduling (its ``AsyncScheduler`` and batch queue of two: each schedule runs before the output
of the forward before it is processed; off, the engine core steps synchronously, one batch in flight, which also
sizes the sliding-window group's admission cap); the radix cache is vLLM's
prefix caching; the model's window ``W`` is each sliding-window layer's
``sliding_window``. A request asks for ``output_len + 1`` tokens with ``ignore_eos``: its prefill samples the first,
each of its ``output_len`` decodes writes the token before it (the scenario's count of decode forwards). Token ids are
the oracle's content tags (small integers, equal for equal content), so vLLM's block hashes see the workload's
sharing.
Arrivals follow the simulator's clock (the forwards run so far, as for SGLang's scheduler: engine_path/scheduler.py);
an idle release jumps to the next arrival; a conversation's later turn is handed over ``think_time`` forwards after
the turn before finished.
"""
from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Optional

import numpy as np

from ..errors import AdapterLacks, EngineError, ReleaseBroke, raised_in
from . import connector
from .engine_core import EngineCoreLoop, Step

#: what stands in for the parts of vLLM a scheduler-only run has not, and why (run.json's engine_pieces)
STAND_INS = {
    "ModelConfig": "a namespace of the fields the scheduler reads (no HF model is loaded: max_model_len from the "
                   "workload, text-only, generate runner, no mrope)",
    "the platform": "CUDA's choice of the hybrid KV-cache manager (on a CPU platform vLLM turns it off; a GPU "
                    "deployment of these models runs it: disable_hybrid_kv_cache_manager = False)",
    "the workers' KV-cache layouts": "one worker reporting flash attention's (LBNHC, the legacy NHD); the engine "
                                     "core's resolve_kv_cache_layout picks from it",
    "the model's forward": "samples each request's next token from the workload's content (so prefix hashes "
                           "match what later turns send), nothing is computed",
    "the worker's state rows": "a free list of row indices popped from the end, as RequestState's (the block "
                               "tables, their writes, gathers and slot mappings are the release's BlockTables)",
    "UvaBuffer": "on a CPU the host tensor itself (a device view of pinned host memory needs CUDA); on CUDA the "
                 "release's own NonUvaBuffer (explicit host-to-device copies: the view needs vllm._C, not used), "
                 "on the platform vLLM resolves without its compiled extensions, its device type set to cuda",
    "SpeculativeConfig": "engine.speculative: the release's own class for an EAGLE-3 drafter (or, with algorithm "
                         "extract_hidden_states, that speculator: one speculative token, one aux hidden state), its "
                         "checkpoint-reading __post_init__ left out (no draft model is loaded); the drafter's layers "
                         "join the KV-cache groups by the release's own get_global_kv_cache_groups",
    "the drafter's forwards": "its prefill writes at the target forward's own slot mappings (its padded rows "
                              "too); its decode steps, over "
                              "every request of the batch, at the position after its last valid token and on, "
                              "clamped to max_model_len - 1 (as the speculator's input kernels set them), their "
                              "slots the release's compute_slot_mappings; drafts are the workload's next tokens, the "
                              "target accepting each with engine.speculative.accept_rate until the first it "
                              "rejects; eager",
    "vllm.triton_utils' driver check": "Triton reports an active driver while vLLM imports, so its kernels are real "
                                       "Triton, run by Triton's interpreter on a CPU (on CUDA the driver is real)",
}

#: fields of the ModelConfig stand-in (what vLLM 0.34's Scheduler and StructuredOutputManager read of it)
_MODEL_FIELDS = dict(uses_mrope=False, is_encoder_decoder=False, runner_type="generate", is_diffusion=False,
                     skip_tokenizer_init=True, multimodal_config=None, supports_multimodal_inputs=False,
                     return_sampling_mask=False, is_multimodal_model=False)

#: a scenario's engine settings vLLM has no counterpart of here, each refused with its reason
NOT_YET = (
    (lambda sc: sc.engine.speculative.enabled and sc.engine.overlap,
     "speculative decoding under async scheduling: the worker keeps the drafts and its own computed counts there, "
     "which are not driven yet (EAGLE runs synchronously)"),
    (lambda sc: sc.engine.pd_decode, "a PD decode node: a KV connector's asynchronous loads from a prefill node are "
                                     "not driven (engine.kv_offload's tier is)"),
    (lambda sc: sc.engine.overlap and sc.engine.dp_size > 1, "engine.overlap with engine.dp_size > 1: an idle DP "
                                                             "rank's dummy forwards under async scheduling are not "
                                                             "driven yet"),
    (lambda sc: sc.engine.speculative.enabled and (sc.engine.speculative.draft_full_size is not None
                                                   or sc.engine.speculative.draft_swa_ratio is not None),
     "engine.speculative.draft_full_size / draft_swa_ratio size SGLang's draft pools: vLLM's drafter layers are in "
     "the target's KV-cache groups, on its one block pool"),
    (lambda sc: sc.engine.speculative.enabled and sc.engine.kv_offload,
     "speculative decoding beside engine.kv_offload: a verify's rejected drafts and a tier's loads landing before "
     "one forward are not merged yet"),
    (lambda sc: sc.pool.unified, "pool.unified is SGLang's unified pool: vLLM's block pool is always one pool"),
)


def unsupported(scenario) -> Optional[str]:
    """Why the release's scheduler cannot run ``scenario`` yet (None: it can)."""
    return next((why for test, why in NOT_YET if test(scenario)), None)


def _mod(name: str):
    return importlib.import_module(name)


#: extract_hidden_states' cache-only layer (ExtractHiddenStatesModel names it after the target's layer count)
HIDDEN_LAYER = "draft.cache_only_layers.0"

#: with DP, the most dummy forwards one idle gap of this rank runs (the rest of a longer gap is jumped)
DUMMY_GAP = 8


class VllmScheduler(EngineCoreLoop):
    """The release's ``Scheduler`` over a scenario's workload, one forward per :meth:`next_step`."""

    def __init__(self, scenario, requests, tokens, *, max_steps: Optional[int] = None):
        """``tokens(index)``: the token ids of workload request ``index`` by position, prompt and output (int32: the
        step source's content tags, equal for equal content, so prefix hashes match as the workload shares)."""
        why = unsupported(scenario)
        if why:
            raise EngineError(f"vLLM's scheduler: {why}")
        self.sc, self.specs, self.tokens = scenario, list(requests), tokens
        self.version = getattr(_mod("vllm"), "__version__", "?")
        page = scenario.pool.page_size
        if scenario.pool.full_size % page:
            raise EngineError(f"pool.full_size {scenario.pool.full_size} is not a multiple of page_size {page}")
        self.block_size = page
        self.num_blocks = scenario.pool.full_size // page + 1       # + the null block, block 0
        self.max_steps = max_steps
        #: engine.speculative: EAGLE (the release's speculative config, a drafter's layers in the KV-cache groups)
        self.drafting = bool(scenario.engine.speculative.enabled)
        #: engine.speculative.algorithm = "extract_hidden_states": vLLM's speculator caching the target's hidden
        #: states in one cache-only layer, a KV-cache group of its own (HiddenStateCacheSpec)
        self.hidden_states = self.drafting and scenario.engine.speculative.algorithm == "extract_hidden_states"
        self.accept_rng = np.random.default_rng([scenario.seed, 0xEA61E])
        #: engine.overlap: the engine core's async scheduling (a batch queue of two: schedules run one ahead)
        self.async_ = bool(scenario.engine.overlap)
        self._queue: list = []                # async: scheduled outputs not yet processed, newest first
        self._made = None                     # async: the schedule made ahead (schedule_ahead), not yet taken
        self.ahead = 0                        # async: schedules made before the output of a forward run
        self.groups = self._groups()
        self.scheduler = self._build()
        self.pool = self.scheduler.kv_cache_manager.block_pool
        self.managers = self.scheduler.kv_cache_manager.coordinator.single_type_managers
        #: workload index -> the release's Request id; pending arrivals; later turns held back
        self.pending = [(i, r) for i, r in enumerate(self.specs) if r.turn <= 1]
        self._later = {(r.conversation, r.turn): (i, r) for i, r in enumerate(self.specs) if r.turn > 1}
        self._ready: list = []
        self._turns: dict[str, int] = {}
        self.clock = 0                        # forwards run, plus the steps an idle release jumped
        self.forwards = 0
        self.handed = 0
        self.finished = 0
        self.preemptions = 0
        self.hit_tokens = 0                   # tokens a (re)admitted request found in the prefix cache
        # with DP the other ranks are always working (graphs.py): an idle rank runs the engine core's dummy batches
        self.dp = scenario.engine.dp_size > 1
        self.dummies = 0
        self._gap = 0                         # dummy forwards of the current idle gap
        self._carried: set = set()            # requests gone in empty schedules, for the next forward's worker
        #: the managers' block ids recorded for zeroing and left after each schedule: (schedules, grew, shrank, last)
        self.undrained = [0, 0, 0, 0]

    # ------------------------------------------------------------------ set-up

    def _config(self):
        cfg = _mod("vllm.config")
        longest = max((s.total_len for s in self.specs), default=1)
        budget = max(self.sc.engine.chunked_prefill_size or max(longest, 8192), 1)
        # vLLM asks max_num_seqs <= max_num_batched_tokens (every running request may decode in one step)
        seqs = max(1, min(self.sc.engine.max_running_requests, budget))
        longest += self.sc.engine.speculative.num_steps if self.sc.engine.speculative.enabled else 0
        sched = cfg.SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=budget,
                                    max_model_len=longest + 2, is_encoder_decoder=False,
                                    enable_chunked_prefill=True, async_scheduling=self.async_)
        cache = cfg.CacheConfig(block_size=self.block_size, enable_prefix_caching=bool(self.sc.engine.radix_cache))
        cache.num_gpu_blocks = self.num_blocks
        # engine.kv_offload: slotscope's offload tier as the scheduler's KV connector (engine_path/vllm/connector.py)
        extra = ({"kv_transfer_config": connector.transfer_config(self.sc.engine.kv_offload_load)}
                 if self.sc.engine.kv_offload else {})
        vc = cfg.VllmConfig(scheduler_config=sched, cache_config=cache, device_config=cfg.DeviceConfig(device="cpu"),
                            **extra)
        # the platform: a CPU platform has no hybrid KV-cache manager; a GPU deployment's has (STAND_INS)
        vc.scheduler_config.disable_hybrid_kv_cache_manager = False
        # no HF model here: the fields the scheduler reads (STAND_INS)
        object.__setattr__(vc, "model_config", SimpleNamespace(max_model_len=longest + 2, **_MODEL_FIELDS))
        if self.sc.engine.speculative.enabled:
            self._speculative(vc)
        return vc

    def _speculative(self, vc) -> None:
        """engine.speculative: the release's own ``SpeculativeConfig`` of an EAGLE-3 drafter with ``num_steps``
        speculative tokens (its checkpoint-reading ``__post_init__`` left out: STAND_INS), and what ``VllmConfig``
        resolves from it (the lookahead block hashes, on by default: a block's hash covers the next token, which the
        drafter's KV of its last position depends on; ``engine.speculative.lookahead_block_hashes = false`` turns
        them off, and a hit then drops its last block: EAGLE's block drop)."""
        spec_mod = _mod("vllm.config.speculative")
        spec = object.__new__(spec_mod.SpeculativeConfig)
        method = "extract_hidden_states" if self.hidden_states else "eagle3"
        hf = SimpleNamespace(eagle_config={}, eagle_aux_hidden_state_layer_ids=[0])
        fields = dict(method=method, custom_method=None, num_speculative_tokens=self.sc.engine.speculative.num_steps,
                      num_speculative_tokens_per_batch_size=None, disable_eagle_block_drop=False,
                      disable_lookahead_block_hashes=not self.sc.engine.speculative.lookahead_block_hashes,
                      draft_model_config=SimpleNamespace(speculator_config_class=None, model=f"slotscope-{method}",
                                                         hf_config=hf))
        for k, v in fields.items():
            object.__setattr__(spec, k, v)
        object.__setattr__(vc, "speculative_config", spec)
        object.__setattr__(vc.model_config, "supports_kv_cache_grouping", False)
        object.__setattr__(vc, "num_hash_lookahead_tokens", vc._resolve_num_hash_lookahead_tokens())

    def _groups(self):
        """The scenario's layers as vLLM groups them (its own ``get_kv_cache_groups``): [(kind, layer names)]."""
        import torch

        kci = _mod("vllm.v1.kv_cache_interface")
        planning = _mod("vllm.v1.core.kv_cache_planning")
        self.vllm_config = self._config()
        spec = {}
        kw = dict(block_size=self.block_size, num_kv_heads=1, head_size=16, dtype=torch.float16)

        def layer_spec(kind: str, **extra):
            return (kci.SlidingWindowSpec(sliding_window=self.sc.model.window, **kw, **extra) if kind == "swa"
                    else kci.FullAttentionSpec(**kw, **extra))
        for layer in self.sc.model.layers():
            spec[f"layers.{layer.layer}"] = layer_spec(layer.kind)
        drafting = self.sc.engine.speculative.enabled
        if self.hidden_states:      # ExtractHiddenStatesModel's one cache-only layer (STAND_INS: its geometry)
            spec[HIDDEN_LAYER] = kci.HiddenStateCacheSpec(block_size=self.block_size, num_kv_heads=1, head_size=32,
                                                          dtype=torch.float16)
        elif drafting:    # the drafter's layers (is_draft: the speculator marks them), the target's K/V geometry
            for i, kind in enumerate(self.sc.engine.speculative.draft_layers):
                spec[f"draft.layers.{i}"] = layer_spec(kind, is_draft=True)
        # the engine core resolves one layout from what the workers' backends support (STAND_INS: flash attention's)
        _mod("vllm.v1.attention.backends.utils").resolve_kv_cache_layout(self.vllm_config, [["LBNHC"]],
                                                                         spec.values())
        groups = (planning.get_global_kv_cache_groups(self.vllm_config, [spec]) if drafting
                  else planning.get_kv_cache_groups(self.vllm_config, spec))
        kinds = [("hidden" if isinstance(g.kv_cache_spec, kci.HiddenStateCacheSpec) else
                  "swa" if isinstance(g.kv_cache_spec, kci.SlidingWindowSpec) else "full") for g in groups]
        if sorted(kinds) != sorted(["full", "swa"] + (["hidden"] if self.hidden_states else [])):
            raise AdapterLacks(f"vLLM groups this model's {len(spec)} layers into {len(groups)} KV-cache groups "
                              f"({', '.join(kinds)}); slotscope drives one full and one sliding-window group so far "
                              f"(a model whose full and SWA layers come in equal numbers, e.g. gpt-oss)")
        self.kv_groups = groups
        self.startup_check = self._startup_check(planning, spec, groups)
        return kinds

    def _startup_check(self, planning, spec: dict, groups) -> str:
        """vLLM's own check at engine start (``check_enough_kv_cache_memory``: can the pool hold one request of
        ``max_model_len``, its sliding-window groups at their admission cap?), on the scenario's pool: "passes", or
        its message. A scenario whose pool is smaller still runs (its scheduler copes by preempting), but a server
        would not have started: a stall in such a run is said to be the scenario's, not the release's."""
        available = self.num_blocks * planning._pool_bytes_per_block(self.vllm_config, groups)
        try:
            planning.check_enough_kv_cache_memory(self.vllm_config, dict(spec), available)
        except ValueError:
            vc = self.vllm_config
            length = vc.model_config.max_model_len
            need = sum(g.kv_cache_spec.max_memory_usage_bytes(vc) // g.kv_cache_spec.page_size_bytes for g in groups)
            return (f"vLLM would not start with this pool (check_enough_kv_cache_memory): one request of "
                    f"max_model_len {length} tokens may hold {need} blocks across its groups, the pool has "
                    f"{self.num_blocks - 1}")
        return "passes"

    def _build(self):
        kci = _mod("vllm.v1.kv_cache_interface")
        kcu = _mod("vllm.v1.core.kv_cache_utils")
        hashing = _mod("vllm.utils.hashing")
        so_mod = _mod("vllm.v1.structured_output")
        kc = kci.KVCacheConfig(num_blocks=self.num_blocks, kv_cache_tensors=[], kv_cache_groups=self.kv_groups)
        hash_fn = hashing.get_hash_fn_by_name(self.vllm_config.cache_config.prefix_caching_hash_algo)
        kcu.init_none_hash(hash_fn)
        self._hasher = kcu.get_request_block_hasher(self.block_size, hash_fn,
                                                    getattr(self.vllm_config, "num_hash_lookahead_tokens", 0))
        try:
            cls = self.vllm_config.scheduler_config.get_scheduler_cls()
            return cls(vllm_config=self.vllm_config, kv_cache_config=kc,
                       structured_output_manager=so_mod.StructuredOutputManager(self.vllm_config),
                       block_size=self.block_size, log_stats=False)
        except AttributeError as e:
            raise EngineError(f"vLLM's Scheduler read a field slotscope's ModelConfig stand-in lacks: {e}") from None

    def describe(self) -> dict:
        s = self.scheduler
        return {"class": f"{type(s).__module__}.{type(s).__name__}",
                "kv_cache_manager": type(s.kv_cache_manager.coordinator).__name__,
                "groups": [{"kind": k, "layers": len(g.layer_names), "spec": type(g.kv_cache_spec).__name__}
                           for k, g in zip(self.groups, self.kv_groups)],
                "num_blocks": self.num_blocks, "block_size": self.block_size,
                "prefix_caching": bool(self.vllm_config.cache_config.enable_prefix_caching),
                "stand_ins": {**STAND_INS, **({"the KV connector": connector.STAND_IN} if self.tier else {})},
                "startup_check": self.startup_check,
                **({"speculative": self._describe_drafting()} if self.drafting else {}),
                "did": {"forwards": self.forwards, "finished": self.finished, "preemptions": self.preemptions,
                        "prefix_hit_tokens": self.hit_tokens, "dp_dummy_forwards": self.dummies,
                        **({"schedules_ahead_of_output": self.ahead} if self.async_ else {}),
                        **({"offload_saved_blocks": self.tier.saved_blocks,
                            "offload_loaded_tokens": self.tier.loaded_tokens} if self.tier else {})}}

    def _describe_drafting(self) -> dict:
        vc = self.vllm_config
        return {"method": vc.speculative_config.method, "num_speculative_tokens": vc.num_speculative_tokens,
                "lookahead_block_hashes": vc.num_hash_lookahead_tokens,
                "eagle_block_drop": bool(self.scheduler.use_eagle_block_drop),
                "drafter_layers": {k: [n for n in g.layer_names if n.startswith("draft.")]
                                   for k, g in zip(self.groups, self.kv_groups)},
                "accept_rate": self.sc.engine.speculative.accept_rate}

    @property
    def tier(self):
        """The offload tier (engine.kv_offload: the scheduler's KV connector), or None."""
        return self.scheduler.connector if self.sc.engine.kv_offload else None

    # ------------------------------------------------------------------ arrivals

    def _submit(self, index: int, spec) -> None:
        req_mod, sp_mod = _mod("vllm.v1.request"), _mod("vllm.sampling_params")
        params = sp_mod.SamplingParams(max_tokens=spec.output_len + 1, ignore_eos=True)
        ids = self.tokens(index)[: spec.prompt_len].tolist()
        self._call("scheduler (add_request)", self.scheduler.add_request,
                   req_mod.Request(str(index), ids, params, None, block_hasher=self._hasher))
        self.handed += 1
        if (spec.conversation, spec.turn + 1) in self._later:
            self._turns[str(index)] = index

    def _arrivals(self) -> None:
        busy = self.scheduler.has_unfinished_requests()
        due = [self.pending[0][1].arrival_step] if self.pending else []
        due += [r[0] for r in self._ready]
        if due and not busy and min(due) > self.clock:
            self.clock = min(due)
        while self.pending and self.pending[0][1].arrival_step <= self.clock:
            self._submit(*self.pending.pop(0))
        while self._ready and self._ready[0][0] <= self.clock:
            self._submit(*self._ready.pop(0)[2:])

    def _finish_turn(self, req_id: str) -> None:
        index = self._turns.pop(req_id, None)
        if index is None:
            return
        spec = self.specs[index]
        nxt = self._later.pop((spec.conversation, spec.turn + 1), None)
        if nxt is not None:
            self._ready.append((max(nxt[1].arrival_step, self.clock + nxt[1].think_time), nxt[1].uid, *nxt))
            self._ready.sort(key=lambda x: (x[0], x[1]))

    def done(self) -> bool:
        return not (self.pending or self._ready or self._later or self.scheduler.has_unfinished_requests())

    # ------------------------------------------------------------------ one forward

    def _idle_rank(self) -> bool:
        """With DP: this rank holds no request and the next is due later, while the other ranks work: vLLM's DP
        engine core then runs a dummy batch each step (``execute_dummy_batch``), at most :data:`DUMMY_GAP` a gap."""
        if not self.dp or self._gap >= DUMMY_GAP or self.scheduler.has_unfinished_requests():
            return False
        due = [r[1].arrival_step for r in self.pending[:1]] + [r[0] for r in self._ready]
        return bool(due) and min(due) > self.clock

    def _dummy(self) -> Step:
        self._gap += 1
        self.clock += 1
        self.forwards += 1
        self.dummies += 1
        empty = np.zeros(0, dtype=np.int64)
        return Step(None, [], empty, empty, dummy=True)     # (rows gone meanwhile wait for the next real forward)

    def _call(self, what: str, fn, *args):
        """A call into the release's scheduler: its own exception ends the run as ReleaseBroke, saying where."""
        return raised_in("vllm", f"vLLM {self.version}'s {what}", fn, *args)

    def _check_returned(self) -> None:
        """Every request finished: the pool must have every block back (free, or cached with no reference), and no
        manager may hold blocks for a request (vLLM's own invariant; a leak shows nowhere else)."""
        held = [b.block_id for b in self.pool.blocks if not b.is_null and b.ref_cnt > 0]
        free = self.pool.get_num_free_blocks()
        rows = sorted({r for m in self.managers for r, blocks in m.req_to_blocks.items() if blocks})
        if held or free != self.num_blocks - 1 or rows:
            shown = ", ".join(map(str, held[:8])) + (" ..." if len(held) > 8 else "")
            raise ReleaseBroke(f"vLLM's block pool after every request finished: {free} of {self.num_blocks - 1} "
                               f"blocks free, {len(held)} still referenced ({shown or 'none'}), managers holding "
                               f"blocks for {len(rows)} requests{' (' + ', '.join(rows[:8]) + ')' if rows else ''}: "
                               f"blocks leaked")
        self._check_drained()

    def _note_undrained(self) -> None:
        """After a schedule: how many block ids recorded for zeroing no schedule has taken (0 in a release that
        drains them every step), and whether that grew or shrank."""
        n = sum(len(getattr(m, "new_block_ids", ())) for m in self.managers)
        u = self.undrained
        u[0] += 1
        u[1] += n > u[3]
        u[2] += n < u[3]
        u[3] = n

    def _check_drained(self) -> None:
        """Every request finished: the block ids the managers record for the worker's zeroing of new blocks
        (``new_block_ids``) must have been taken by the schedules that allocated them. An id left over is one the
        scheduler never takes: the list grows by one id per allocated block for as long as a server runs."""
        left = {i: len(m.new_block_ids) for i, m in enumerate(self.managers) if getattr(m, "new_block_ids", None)}
        if left:
            groups = ", ".join(f"{n} in the {self.groups[i]} group's manager" for i, n in left.items())
            schedules, grew, shrank, _ = self.undrained
            raise ReleaseBroke(f"vLLM's KV-cache managers after every request finished still hold block ids recorded "
                               f"for zeroing that no schedule took ({groups}; the list grew at {grew} of the run's "
                               f"{schedules} schedules and shrank at {shrank}): it is never drained, a host-memory "
                               f"leak that grows with every allocated block")

    def _stalled(self, idle: int) -> str:
        """Why the run stops: the release's scheduler admits nothing and runs nothing (a hang in a server)."""
        waiting = self.scheduler.get_num_unfinished_requests()
        head = next(iter(self.scheduler.waiting), None)
        which = "" if head is None else (f"; the head of its queue, request {head.request_id}, has "
                                         f"{head.num_prompt_tokens} prompt tokens")
        return (f"vLLM's scheduler scheduled nothing for {idle} steps with {waiting} requests unfinished "
                f"(a server would wait forever): {self.pool.get_num_free_blocks()} of "
                f"{self.num_blocks - 1} blocks of {self.block_size} tokens free{which}"
                + ("" if self.startup_check == "passes" else f" ({self.startup_check}: the pool is below the "
                                                              f"release's own minimum)"))

    def _step_of(self, out) -> Step:
        ids, starts, counts = [], [], []
        new_rows, appended = {}, {}
        for nr in out.scheduled_new_reqs:
            ids.append(nr.req_id)
            starts.append(nr.num_computed_tokens)
            self.hit_tokens += nr.num_computed_tokens
            new_rows[nr.req_id] = [list(b) for b in nr.block_ids]
        cr = out.scheduled_cached_reqs
        for rid, start, blocks in zip(cr.req_ids, cr.num_computed_tokens, cr.new_block_ids):
            ids.append(rid)
            starts.append(start)
            if blocks is not None:
                appended[rid] = [list(b) for b in blocks]
        # the batch as the model runner lays it out (its own sort_batch_req_ids: drafts and decodes first, then by
        # token count), which fixes each request's rows in the slot mapping and the block tables
        at = {r: i for i, r in enumerate(ids)}
        order = [at[r] for r in self._batch_order(out)]
        ids = [ids[i] for i in order]
        starts = [starts[i] for i in order]
        counts = [out.num_scheduled_tokens[r] for r in ids]
        reqs = self.scheduler.requests
        step = Step(out, ids, np.asarray(starts, dtype=np.int64), np.asarray(counts, dtype=np.int64),
                    new_rows, appended, samples=[r not in reqs or not reqs[r].is_prefill_chunk for r in ids])
        if self.drafting:
            spec = out.scheduled_spec_decode_tokens or {}
            step.drafts = np.asarray([len(spec.get(r, ())) for r in ids], dtype=np.int64)
            step.accepted = self._accepted(step.drafts)
        return step

    def _accepted(self, drafts: np.ndarray) -> np.ndarray:
        """Per request of a verify, the drafts the target accepts: each with chance ``accept_rate``, the run
        stopping at the first rejected one (the rejection sampler's chain)."""
        rate = self.sc.engine.speculative.accept_rate
        ok = self.accept_rng.random((drafts.shape[0], int(drafts.max(initial=0)))) < rate
        ok &= np.arange(ok.shape[1])[None, :] < drafts[:, None]
        return np.cumprod(ok, axis=1).sum(axis=1).astype(np.int64)

    def _batch_order(self, out) -> list[str]:
        runner = _mod("vllm.v1.worker.gpu.model_runner")
        return runner.sort_batch_req_ids(out.num_scheduled_tokens, out.scheduled_spec_decode_tokens or {},
                                         self.vllm_config.uniform_decode_query_len)

    def manager_blocks(self, req_id: str) -> list[np.ndarray]:
        """Per group, the block ids the release's manager holds for a request (int64; null blocks as 0)."""
        return [np.fromiter((b.block_id for b in m.req_to_blocks.get(req_id, ())), dtype=np.int64)
                for m in self.managers]
