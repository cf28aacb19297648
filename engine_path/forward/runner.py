"""The model-runner stand-in a release's attention backend is built over, for one run and model side.

A backend's constructor reads a ``ModelRunner``'s attributes (docs: ../shared/BACKENDS_ON_CPU.md lists them per
backend): the device and dtypes, the request-to-token pool, the hybrid KV pool, the allocator, the KV index
translator, the model config (heads, head dim, window, layer count), the page size, the backend names. This
module builds those from the release's own classes: its ``ReqToTokenPool``, a ``SWAKVPool`` over the scenario
model's layers (compact rows: one head of 16 lanes; the pool the backends hold and write to is a capture pool,
:class:`CapturePool`, that records each ``set_kv_buffer`` call and writes nothing), the run's allocator (the
release's ``SWATokenToKVPoolAllocator``: its live ``full_to_swa`` mapping) and a ``KVIndexTranslator`` over them.
The release's runtime config (server args, the attention-parallel group) is published for the run's duration
through the release's own override hooks and restored by :meth:`RunnerContext.close`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Optional

import torch

from simulator.scenario.capture import smallest_capture

from ..api import ReleaseAPI
from ..errors import EngineError
from ..pool import COMPACT_WIDTH, build_full_pool, build_swa_pool

RUNTIME_CONTEXT = "sglang.srt.runtime_context"
GRAPH_CONFIG = "sglang.srt.model_executor.cuda_graph_config"
SPEC_INFO = "sglang.srt.speculative.spec_info"
SPEC_UTILS = "sglang.srt.speculative.spec_utils"


@dataclass
class Capture:
    """One ``set_kv_buffer`` call a backend made: the layer, the write location as handed over, the K rows."""

    layer_id: int
    loc: Any                     # the release's KVWriteLoc (or a plain index tensor)
    rows: int


class CapturePool:
    """The release's hybrid pool as the backends see it, but writing nothing: each ``set_kv_buffer`` call is
    recorded (:attr:`calls`). It is an instance of the pool's own class (a subclass made here) sharing the real
    pool's attributes, so the backends' type checks (``isinstance(pool, SWAKVPool)``), layer routing,
    translation, buffers and mapping are the real pool's, and their metadata behaves as in the engine."""

    @staticmethod
    def over(pool) -> "CapturePool":
        cls = type(f"Capture{type(pool).__name__}", (type(pool),), {
            "set_kv_buffer": CapturePool.set_kv_buffer, "__doc__": CapturePool.__doc__})
        cap = object.__new__(cls)
        cap.__dict__ = pool.__dict__        # one set of attributes: the real pool's
        cap.__dict__["calls"] = []
        return cap

    def set_kv_buffer(self, layer, loc, cache_k, cache_v, *args, **kwargs) -> None:
        self.calls.append(Capture(int(layer.layer_id), loc, int(cache_k.shape[0])))


def model_config(api: ReleaseAPI, model, context_len: int, layers=None, hybrid: bool = True):
    """The release's view of a model side (compact geometry: one KV head of ``COMPACT_WIDTH`` lanes); ``layers``
    default the scenario model's, ``hybrid``: whether the side has SWA layers (a window)."""
    arch = importlib.import_module("sglang.srt.configs.model_config").AttentionArch.MHA
    layers = model.layers() if layers is None else layers
    hf = SimpleNamespace(architectures=["SlotscopeForCausalLM"], hidden_size=COMPACT_WIDTH, num_attention_heads=1,
                         num_key_value_heads=1, head_dim=COMPACT_WIDTH, num_hidden_layers=len(layers))
    hf.get_text_config = lambda: hf
    cfg = SimpleNamespace(
        attention_arch=arch, context_len=context_len, hidden_size=COMPACT_WIDTH, num_attention_heads=1,
        num_key_value_heads=1, head_dim=COMPACT_WIDTH, v_head_dim=COMPACT_WIDTH, swa_v_head_dim=COMPACT_WIDTH,
        is_encoder_decoder=False, is_multimodal=False, model_is_mrope=False, is_generation=True, quantization=None,
        is_hybrid_swa=hybrid, is_local_attention_model=hybrid, attention_chunk_size=None,
        sliding_window_size=model.window if hybrid else None, num_hidden_layers=len(layers),
        linear_attn_registry_result=None,
        first_k_dense_replace=0, full_attention_interval=None, hf_config=hf, hf_text_config=hf)
    cfg.get_num_attention_heads = lambda tp_size=1: 1
    cfg.get_max_num_attention_heads = lambda: 1
    cfg.get_num_kv_heads = lambda tp_size=1, dcp_size=1: 1
    return cfg


#: the pipeline group the run publishes: one rank (``pp_size`` 1)
ONE_RANK = SimpleNamespace(rank_in_group=0, world_size=1)


@dataclass
class RunnerContext:
    """The release's runtime config published for one run (restored by :meth:`close`)."""

    server_args: Any = None
    _undo: list = field(default_factory=list)

    def close(self) -> None:
        while self._undo:
            self._undo.pop()()


def publish_config(api: ReleaseAPI, *, backend: str, page_size: int, device: str,
                   spec: Optional[tuple[int, int]] = None, extra: Optional[dict] = None) -> RunnerContext:
    """Publish the server args and the attention-parallel group a backend reads, through the release's own
    override hooks (0.5.22+: ``runtime_context``); an EngineError for a release without them. ``spec``: EAGLE's
    ``(num_draft_tokens, num_steps)`` (topk 1), which backends read at construction; ``extra``: more server args (the
    release's scheduler's, when it schedules the run: engine_path.scheduler.server_fields)."""
    try:
        rc = importlib.import_module(RUNTIME_CONTEXT)
        gc = importlib.import_module(GRAPH_CONFIG)
        rc.get_context().override_server_args
    except (ImportError, AttributeError):
        raise EngineError(f"sglang {api.info.version}: its runtime config is not the runtime_context of 0.5.22+; "
                          f"the adapter of its backends is not written yet") from None
    ctx = RunnerContext()
    try:
        try:
            # a one-rank pipeline group too: musa's scheduler-metadata wrapper reads its rank and width (no other
            # 0.5.23 backend reads it); releases without the field take the override without it
            par = rc.get_parallel().override(attn_tp_size=1, attn_dcp_rank=0, pp_group=ONE_RANK)
            par.__enter__()
        except ValueError:
            par = rc.get_parallel().override(attn_tp_size=1, attn_dcp_rank=0)
            par.__enter__()
    except (TypeError, ValueError, AttributeError) as e:
        raise EngineError(f"sglang {api.info.version}: its attention-parallel config takes no attn_tp_size / "
                          f"attn_dcp_rank override ({e}); the adapter of its backends is not written yet") from None
    ctx._undo.append(lambda: par.__exit__(None, None, None))
    off = gc.PhaseConfig(backend=gc.Backend.DISABLED)
    try:
        fields = dict(
            attention_backend=backend, chunked_prefill_size=-1, page_size=page_size,
            cuda_graph_config=gc.CudaGraphConfig(decode=off, prefill=off), disable_radix_cache=True, dp_size=1,
            tp_size=1, pp_size=1, kv_cache_dtype="auto", is_embedding=False,
            **(dict(speculative_algorithm="EAGLE", speculative_num_draft_tokens=spec[0], speculative_num_steps=spec[1],
                    speculative_eagle_topk=1) if spec else
               dict(speculative_algorithm=None, speculative_num_draft_tokens=0, speculative_num_steps=0,
                    speculative_eagle_topk=0)),
            enable_deterministic_inference=False, triton_attention_num_kv_splits=8,
            triton_attention_split_tile_size=None, max_running_requests=None, revision=None, dllm_algorithm=None,
            dllm_algorithm_config=None, enable_mis=False)
        over = rc.get_context().override_server_args(**{**fields, **(extra or {})})
    except (TypeError, ValueError, AttributeError) as e:
        ctx.close()
        raise EngineError(f"sglang {api.info.version}: its server args take other fields ({e}); the adapter of "
                          f"its backends is not written yet") from None
    ctx.server_args = over.install()
    ctx._undo.append(over.restore)
    return ctx


@dataclass
class Runner:
    """One model side's model-runner stand-in (the attributes a backend constructor reads) and its pools."""

    bag: Any                     # the SimpleNamespace handed to backend constructors
    capture: Any                 # the pool the backends hold (CapturePool.over: records writes)
    req_to_token_pool: Any       # the release's ReqToTokenPool (rows rewritten per forward)
    translator: Any              # the release's KVIndexTranslator (None before 0.5.22)
    layers: tuple                # the model side's layers (simulator LayerInfo)
    #: the side's first layer id: the release numbers a side's layers from 0 in its own pool (SWAKVPool's
    #: ``start_layer`` is 0), the run numbers a draft's after the target's
    layer_base: int = 0
    #: the translator an EAGLE round is planned with (the target's: ``prepare_for_draft`` plans the draft's and the
    #: verify's window with it), this side's own for the target
    planner: Any = None


def build_runner(api: ReleaseAPI, *, model, allocator, max_requests: int, context_len: int, device: str,
                 server_args: Any, backend: str = "triton", layers=None, pool_sizes=None,
                 draft: bool = False, spec_algorithm: Optional[str] = None, planner=None) -> Runner:
    """The stand-in over the run's allocator (engine_path.allocator.EngineAllocator: the release's own).

    ``layers`` (simulator LayerInfo; default the model's) and ``pool_sizes`` ((full, swa) tokens; default the
    allocator's) make another model side over the same allocator: an EAGLE draft shares the target's allocator and
    ``req_to_token`` ids, writes at the target's indices into pools of its own, and a draft of full-attention layers
    only gets the release's plain ``MHATokenToKVPool`` (no SWA pool, no sliding window in its backends); ``draft``:
    the stand-in is a draft worker's (``is_draft_worker``); ``spec_algorithm``: the run's speculative algorithm
    (the release's ``SpeculativeAlgorithm`` of that name on the stand-in; NONE without); ``planner``: the translator
    an EAGLE round is planned with (default this side's own)."""
    mp = api.modules["sglang.srt.mem_cache.memory_pool"]
    layers = tuple(model.layers()) if layers is None else tuple(layers)
    full_size, swa_size = (allocator.full_size, allocator.swa_size) if pool_sizes is None else pool_sizes
    page = allocator.page_size
    base = min(li.layer for li in layers)
    full_ids = [li.layer - base for li in layers if li.kind == "full"]
    swa_ids = [li.layer - base for li in layers if li.kind == "swa"]
    if swa_ids:
        pool = build_swa_pool(api, size=full_size, size_swa=swa_size, page_size=page, full_layers=full_ids,
                              swa_layers=swa_ids, device=device)
        pool.register_mapping(allocator.mapping)           # the run's live full -> SWA mapping
    else:
        pool = build_full_pool(api, size=full_size, page_size=page, layers=full_ids, device=device)
    capture = CapturePool.over(pool)
    r2t = mp.ReqToTokenPool(size=max_requests, max_context_len=context_len, device=device, enable_memory_saver=False)
    translator = None
    if api.KVIndexTranslator is not None:
        translator = api.KVIndexTranslator(req_to_token=r2t.req_to_token, token_to_kv_pool_allocator=allocator.engine,
                                           token_to_kv_pool=pool, page_size=page, device=device)
    dtype = torch.bfloat16
    bag = SimpleNamespace(
        device=device, dtype=dtype, kv_cache_dtype=dtype, kv_cache_dtype_str="auto", gpu_id=0, page_size=page,
        prefill_attention_backend_str=backend, decode_attention_backend_str=backend, draft_attention_backend=None,
        model_config=model_config(api, model, context_len, layers, hybrid=bool(swa_ids)), is_draft_worker=draft,
        max_running_requests=max_requests,
        model=torch.nn.Module(), req_to_token_pool=r2t, token_to_kv_pool=capture,
        token_to_kv_pool_allocator=allocator.engine, kv_index_translator=translator,
        sliding_window_size=model.window if swa_ids else None, is_hybrid_swa=bool(swa_ids), attention_chunk_size=None,
        server_args=server_args,
        use_mla_backend=False, hybrid_gdn_config=None, mambaish_config=None, spec_algorithm=_algorithm(spec_algorithm),
        canary_manager=None, hisparse_coordinator=None, init_new_workspace=False)
    bag.decode_num_tokens_per_req = _tokens_per_req(bag)
    return Runner(bag, capture, r2t, translator, layers, base, planner if planner is not None else translator)


def _tokens_per_req(bag):
    """``ModelRunner.decode_num_tokens_per_req`` of the stand-in (triton's constructor reads it: a verify's width),
    as the release derives it (its module imports the HTTP server, which is not installed here): under a speculative
    algorithm the release's ``resolve_num_tokens_per_req`` of the target-verify phase, else 1 (no diffusion LM)."""
    try:
        resolve = importlib.import_module(SPEC_UTILS).resolve_num_tokens_per_req
    except (ImportError, AttributeError):
        return lambda **kw: 1

    def tokens(*, num_draft_tokens=None) -> int:
        alg = bag.spec_algorithm
        if alg is None or not alg.is_speculative():
            return 1
        return resolve(phase="target_verify", spec_algorithm=alg, is_draft_worker=bag.is_draft_worker,
                       num_draft_tokens=num_draft_tokens)
    return tokens


def _algorithm(name: Optional[str]):
    """The release's ``SpeculativeAlgorithm`` of ``name`` (None before the enum has ``from_string``)."""
    try:
        return importlib.import_module(SPEC_INFO).SpeculativeAlgorithm.from_string(name)
    except (ImportError, AttributeError):
        return None


def request_rows(scenario) -> int:
    """Rows of the stand-in's ``ReqToTokenPool``: one per request that can run at once (a conversation's every
    turn counted), plus one, and at least the largest decode capture size the run can replay (the release
    captures no batch size past its pool's rows: ``get_batch_sizes_to_capture``; under DP attention another
    rank's batch can choose the largest)."""
    e, w = scenario.engine, scenario.workload
    # a conversation's later turns are requests of their own; without the radix cache (whose scheduler holds a
    # turn back until the previous one finished) they all arrive with the first
    requests = max(w.requests * max(int(w.turns.upper), 1), len(w.explicit), 1)
    rows = min(e.max_running_requests, requests) + 1
    if e.cuda_graph and e.cuda_graph_bs:
        sizes = e.cuda_graph_bs
        rows = max(rows, sizes[-1] if e.dp_size > 1 else (smallest_capture(sizes, rows) or sizes[-1]))
    return rows


def context_len(scenario) -> int:
    """Room per request row of ``req_to_token`` (the release's ``max_context_len``): no request holds more tokens
    than the full pool has slots, nor more than the workload's longest request (its prompt, system prompt and
    output at their upper bounds, the draft's tokens, a page of slack) where that is known: single-turn requests.
    The bound matters on a CPU: a backend's decode-graph capture launches its metadata kernel over every page of
    a row (flashattention's ``normal_decode_set_metadata``, interpreted: seconds per capture size)."""
    pool, w = scenario.pool, scenario.workload
    room = pool.full_size + pool.page_size
    if w.explicit:
        longest = max(r.prompt_len + r.output_len for r in w.explicit)
    elif w.turns.upper <= 1:
        longest = w.prompt_len.upper + w.output_len.upper + (w.system_prompt_len.upper if w.system_prompts else 0)
    else:
        return room
    spec = scenario.engine.speculative
    longest += 2 * (spec.num_draft_tokens + 1) if spec.enabled else 0
    need = -(-(longest + 2 * pool.page_size) // pool.page_size) * pool.page_size
    return min(room, need)
