"""The release's EAGLE draft-extend CUDA-graph runner on the write path (``EAGLEDraftExtendCudaGraphRunner``).

A round's ``DRAFT_EXTEND_V2`` (engine_path/forward/speculative.py) on the graph path ``draft_extend_graph`` replays
a graph the draft's runner captured at start-up. The runner's own code runs here: its ``capture_one_shape`` for
every capture size, largest first, and its ``execute`` for every replay (the padding of the static buffers past the
batch, their refill, the replay view, the backend's ``init_forward_metadata_out_graph`` of that view, the read-done
publication). Its constructor cannot run here (it needs the draft worker, the draft model and the graph memory
pool), so the instance is made bare and given what the constructor gives it, in the constructor's order: the
backend's ``init_cuda_graph_state(max_bs, max_bs * width)``, the release's seq-len fill value
(``resolve_draft_extend_seq_len_fill_value``) and the static buffers (``EagleDraftExtendInputBuffers``: out_cache_loc
ones, seq_lens at the fill value, the accept counts and extend lengths at the capture width, select_index the last
row of each request). Its buffers are not shared with other runners' (``share_buffers``): each backend here is a
separate engine.

Nothing is captured into a CUDA graph. The runner's graph backend here (:class:`_GraphBackend`) runs a capture's
``run_once`` once (the in-graph metadata prep and the model's forward, whose layers are deferred) and, at a replay,
the in-graph prep again on the capture-time batch with the capture's metadata installed (the graph replays it).
Each layer's write location is taken on the capture-time batch with its metadata installed, for a size at its first
replay (as for the decode graphs, engine_path/forward/graphs.py): the tensors its store took at capture, which a
replay reads as they are then. A refill that leaves a static buffer stale, or a backend's draft-extend graph
metadata that builds the wrong table, shows in the replay's writes and read tables.
"""
from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Callable

import torch

from .graphs import Captured, CapturedRunner, GraphUnavailable, Layer

DRAFT_EXTEND_RUNNER = "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner"
RUNNER_PKG = "sglang.srt.model_executor.runner"
FORWARD_BATCH_INFO = "sglang.srt.model_executor.forward_batch_info"
SPEC_INFO = "sglang.srt.speculative.spec_info"


class _Model(torch.nn.Module):
    """The draft model a capture runs: its forward is deferred (the layers' writes are taken at a size's first
    replay); ``shared_experts_config`` as a dense model's, no quantized modules."""

    shared_experts_config = None

    def forward(self, input_ids, positions, forward_batch):
        return None


class _GraphBackend:
    """The runner's graph backend (``resolve_decode_backend``'s CUDA graph backend) as run here: see the module
    docstring."""

    def __init__(self, owner: "DraftExtendGraphs"):
        self.owner = owner
        self.captured_fb = None      # the batch the last capture's ``run_once`` closes over

    def capture_one(self, shape_key, run_once, capture_inputs=None, post_warmup_hook=None):
        self.captured_fb = _closed_batch(run_once)
        run_once()
        if post_warmup_hook is not None:
            post_warmup_hook()

    def replay(self, shape_key, forward_batch):
        bs = int(shape_key.size)
        got = self.owner.captured[bs]
        with torch.no_grad(), self.owner.installed(got), self.owner._ctx(got.fb):
            self.owner.backend.init_forward_metadata_in_graph(got.fb)
        return SimpleNamespace(next_token_logits=torch.zeros(bs, 1), hidden_states=torch.zeros(bs, 1))


class DraftExtendGraphs(CapturedRunner):
    """One draft backend's ``EAGLEDraftExtendCudaGraphRunner``: see the module docstring."""

    def __init__(self, runner, backend, adapter, sizes, width: int, steps: int, device: str,
                 forward_context: Callable):
        super().__init__(runner, backend, adapter, sizes, device, forward_context)
        self.width = int(width)
        mod = importlib.import_module(DRAFT_EXTEND_RUNNER)
        fbi = importlib.import_module(FORWARD_BATCH_INFO)
        self._graph = _GraphBackend(self)
        self.release = r = object.__new__(mod.EAGLEDraftExtendCudaGraphRunner)
        eagle = importlib.import_module(SPEC_INFO).SpeculativeAlgorithm.from_string("EAGLE")
        r.eagle_worker = SimpleNamespace(speculative_algorithm=eagle, hot_token_id=None,
                                         seed_dsa_topk_from_draft_extend=False)
        # the draft's model-runner stand-in (its backends' constructors read it), with the draft model and what
        # the runner reads of a model runner besides
        r.model_runner = SimpleNamespace(**{
            **vars(runner.bag), "model": _Model(), "spec_algorithm": eagle, "is_draft_worker": True,
            "device_timer": None, "shared_read_done_event": None, "_flashinfer_spec_draft_autotuned_phases": None})
        r.forward_mode = fbi.ForwardMode.DRAFT_EXTEND_V2
        r.device = self.device
        r.device_module = torch.get_device_module(self.device)
        r.attn_dp_size, r.pp_size = 1, 1
        r.enable_torch_compile = r.disable_padding = False
        r.require_gathered_buffer = r.require_mlp_tp_gather = r.require_mlp_sync = False
        r.require_attn_tp_gather = r.enable_profile_cuda_graph = False
        r.speculative_num_steps = int(steps)
        r.draft_extend_attn_backend = r.attn_backend = backend
        r.compile_bs, r.enable_pdmux, r.record_nolora_graph = [], False, False
        r.attention_graph_variants, r.is_dllm = None, False
        r.deepep_adapter = importlib.import_module(RUNNER_PKG).DeepEPCudaGraphRunnerAdapter()
        r.capture_forward_mode = r.forward_mode
        r.capture_hidden_mode = fbi.CaptureHiddenMode.LAST
        r.capture_bs = list(self.sizes)
        r.captured_req_width = self.width
        r.max_bs = self.sizes[-1]
        r.max_num_token = r.max_bs * self.width
        with self._ctx():
            backend.init_cuda_graph_state(r.max_bs, r.max_num_token)
        r.seq_len_fill_value = mod.resolve_draft_extend_seq_len_fill_value(backend, self.width)
        r.extend_seq_lens_cpu = [self.width] * r.max_bs
        r.buffers = self._buffers(mod, r)
        r.backend = self._graph

    def _buffers(self, mod, r):
        """The runner's static buffers as its constructor makes them (no hidden states, DP gather or mrope here)."""
        n, bs, dev, w = r.max_num_token, r.max_bs, self.device, self.width
        return mod.EagleDraftExtendInputBuffers(
            input_ids=torch.zeros(n, dtype=torch.int64, device=dev),
            req_pool_indices=torch.zeros(bs, dtype=torch.int64, device=dev), mamba_track_indices=None,
            out_cache_loc=torch.ones(n, dtype=r._cache_loc_dtype(), device=dev),
            positions=torch.zeros(n, dtype=torch.int64, device=dev),
            mrope_positions=torch.zeros((3, n), dtype=torch.int64, device=dev), hidden_states=None,
            seq_lens=torch.full((bs,), r.seq_len_fill_value, dtype=torch.int64, device=dev),
            seq_lens_cpu=torch.full((bs,), r.seq_len_fill_value, dtype=torch.int64),
            extend_seq_lens=torch.full((bs,), w, dtype=torch.int32, device=dev),
            num_correct_drafts=torch.full((bs,), w, dtype=torch.int32, device=dev),
            num_accept_tokens=torch.full((bs,), w, dtype=torch.int32, device=dev),
            select_index=torch.arange(bs, dtype=torch.int64, device=dev) * w + w - 1,
            next_token_logits_buffer=torch.zeros((bs, 1), dtype=torch.float32, device=dev),
            global_num_tokens_gpu=None, global_num_tokens_for_logprob_gpu=None)

    # ------------------------------------------------------------------ capture (before the first forward)

    def capture(self, layers: list[Layer]) -> None:
        """The runner's ``capture_one_shape`` per capture size, largest first; the largest size's layers now."""
        self.layers = layers
        for bs in reversed(self.sizes):
            with torch.no_grad():
                fb = self._capture_one(bs)
            meta = getattr(self.backend, self.adapter.metadata_attr, None)
            self.captured[bs] = Captured(bs, fb, meta, rows=bs * self.width, owner=self)
            if bs == self.sizes[-1]:
                self._take_writes(self.captured[bs])

    def _capture_one(self, bs: int):
        """``capture_one_shape(bs)``; returns its batch (the one its ``run_once`` closes over)."""
        self._graph.captured_fb = None
        self.release.capture_one_shape(bs, forward=None)
        fb = self._graph.captured_fb
        if fb is None:
            raise GraphUnavailable("the draft-extend runner's capture made no batch readable here")
        return fb

    def static_buffers(self):
        return self.release.buffers

    # ------------------------------------------------------------------ replay

    def replay(self, fb, bs: int) -> Captured:
        """The runner's ``execute`` of ``fb`` (a ``DRAFT_EXTEND_V2`` batch of a round) at capture size ``bs``."""
        got = self.writes_of(bs)
        acc = fb.spec_info.num_accept_tokens.to(torch.int64)
        select = torch.arange(int(fb.batch_size), dtype=torch.int64, device=acc.device) * self.width + acc - 1
        with torch.no_grad(), self._ctx(fb):
            self.release.execute(fb, select)
        if self.release.bs != bs:
            raise GraphUnavailable(f"the runner padded a batch of {fb.batch_size} to {self.release.bs}, the run "
                                   f"to {bs}")
        self.replays += 1
        return got


def _closed_batch(run_once):
    """The ``ForwardBatch`` a capture's ``run_once`` closes over (its one free variable of that type)."""
    cls = importlib.import_module(FORWARD_BATCH_INFO).ForwardBatch
    for cell in run_once.__closure__ or ():
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        if isinstance(v, cls):
            return v
    return None
