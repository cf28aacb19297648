"""The release's CUDA-graph runners on the write path: decode graphs and prefill (piecewise) graphs.

Nothing is captured into a CUDA graph here (there is no GPU); what a graph fixes at capture and what its replay
refreshes are driven the way the release's runners drive them, with the release's own code:

* **Decode graphs** (:class:`DecodeGraphs`, the release's ``DecodeCudaGraphRunner``): the runner's static
  buffers are the release's ``build_decode_registry`` (its padding policies: ``out_cache_loc`` and
  ``req_pool_indices`` zero past the batch, ``seq_lens`` the backend's fill value). Before the first forward (the
  release captures at start-up) the backend's ``init_cuda_graph_state(max_bs, max_num_tokens)`` runs once, then
  per capture size, largest first: a batch over the static buffers bound with the translator's
  ``bind_runner_slots`` (``capture_prepare``), ``init_forward_metadata_out_graph(fb, in_capture=True)``, the
  in-graph prep, and every layer's forward, whose ``KVWriteLoc`` is kept: these are the tensors the captured
  store kernels read. At each replay: the registry's ``fill_from`` (``load_batch``), the runner's own
  ``build_replay_fb_view`` and the backend's replay metadata (``init_forward_metadata_out_graph(view)``), the
  in-graph prep again on the capture-time batch (the graph replays it), and then each layer's write location is
  what the capture-time tensors hold now. A buffer the replay metadata leaves stale (B2's class of bug) shows in
  the padded rows' targets. Under EAGLE the target's runner captures ``TARGET_VERIFY`` instead (``verify``:
  ``num_draft_tokens`` rows a request, its ``get_spec_info``'s ``EagleVerifyInput`` over the custom-mask buffer),
  and a round's verify replays it.
* **Prefill graphs** (:class:`PrefillGraphs`, the release's ``PrefillCudaGraphRunner`` with its CUDA default, the
  breakable backend): the batch's rows are copied into the runner's ``build_prefill_registry`` buffers padded to
  the capture size (``out_cache_loc`` zero past the batch), the static batch is bound to the iteration's plan
  (``bind_replay``), the metadata is the backend's ``init_forward_metadata`` of the live batch (what
  ``_prepare_forward_metadata_for_replay`` calls for a backend without captured metadata), and each layer runs
  inside the runner's scope (``set_forward_batch``, ``prefill_graph_scope``, ``forward_context``,
  ``enable_breakable_cuda_graph``) over the static batch: ``RadixAttention.forward`` takes its
  ``_eager_attention`` path, whose ``attention_input_scope`` narrows ``out_cache_loc`` to the real tokens (a
  breakable graph's replay calls that same body between its segments).

Per-backend code is the adapter's (engine_path/forward/adapters.py): the attribute where the backend keeps its
forward metadata (``Adapter.metadata_attr``), which the decode runner saves at capture and puts back for the
replay's in-graph prep and read tables, as the captured kernels would read it.
"""
from __future__ import annotations

import importlib
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Optional

import torch

DECODE_RUNNER = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"
REGISTRY = "sglang.srt.model_executor.cuda_graph_buffer_registry"
FORWARD_BATCH_INFO = "sglang.srt.model_executor.forward_batch_info"
FORWARD_CONTEXT = "sglang.srt.model_executor.forward_context"
PREFILL_GRAPH = "sglang.srt.model_executor.runner_utils.prefill_graph"
RUNNER_BATCH = "sglang.srt.model_executor.runner_utils.forward_batch"
BREAKABLE = "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph"
EAGLE_INFO = "sglang.srt.speculative.eagle_info"
SPEC_INFO = "sglang.srt.speculative.spec_info"

#: the slots of the decode runner's buffers its replay view reads (``DecodeInputBuffers``; no encoder, no mamba)
DECODE_VIEW_SLOTS = ("input_ids", "positions", "req_pool_indices", "seq_lens", "seq_lens_cpu")


class GraphUnavailable(Exception):
    """A graph runner this backend cannot be driven through here (that path stays the model's boundary)."""


def _eagle():
    return importlib.import_module(SPEC_INFO).SpeculativeAlgorithm.from_string("EAGLE")


def _loc_dtype() -> torch.dtype:
    """The decode runner's ``_cache_loc_dtype()`` (int64 in every known release)."""
    runner = getattr(importlib.import_module(DECODE_RUNNER), "DecodeCudaGraphRunner", None)
    try:
        return runner._cache_loc_dtype(None)
    except Exception:
        return torch.int64


@dataclass
class Captured:
    """One capture size of the decode runner: what its graph fixed at capture."""

    size: int
    fb: Any                  # the capture-time ForwardBatch over the runner's static buffers
    metadata: Any            # the backend's forward metadata the capture left (the captured kernels read its tensors)
    writes: dict = field(default_factory=dict)     # layer id -> the release's KVWriteLoc its store took at capture
    rows: int = 0            # the token rows its layers write (0: ``size``, one a request)
    owner: Any = None        # the runner that captured it (its ``installed(captured)`` for the read tables)

    def __post_init__(self):
        self.rows = self.rows or self.size


@contextmanager
def installed_metadata(backend, attr: str, metadata) -> Iterator[None]:
    """``metadata`` in ``backend.<attr>`` (what a graph's kernels read), the Python state restored after (a replay
    changes no Python object)."""
    saved = getattr(backend, attr, None)
    setattr(backend, attr, metadata)
    try:
        yield
    finally:
        setattr(backend, attr, saved)


@dataclass
class Layer:
    """What a graph runner needs of one layer: its id, kind, and how to run its forward on a batch."""

    layer: int
    kind: str
    #: ``(fb, rows, scope) -> the release's KVWriteLoc`` (the boundary's layer call: engine_path/forward/boundary.py)
    write: Callable


def _storages(*objs) -> set[int]:
    """The storages of every tensor held by ``objs``' attributes (or items, for a ``dict``), directly or in a list,
    tuple or ``dict`` they hold (xpu keeps its decode graphs' buffers in ``decode_cuda_graph_metadata``)."""
    out: set[int] = set()

    def add(v, nested: bool) -> None:
        if isinstance(v, torch.Tensor):
            out.add(v.untyped_storage().data_ptr())
        elif isinstance(v, (list, tuple)) or (nested and isinstance(v, dict)):
            for t in (v.values() if isinstance(v, dict) else v):
                add(t, False)

    for obj in objs:
        for v in (obj.values() if isinstance(obj, dict) else vars(obj).values()):
            add(v, True)
    return out


def check_static(got: Captured, layers: list[Layer], *keepers) -> None:
    """Every write location ``got``'s layers took at capture must be a view of a buffer ``keepers`` (the runner's
    buffers, the backend) keep: what a replay refreshes; a tensor made at capture would be a copy the graph
    recomputes, not readable here (GraphUnavailable)."""
    static = _storages(*keepers)
    for li in layers:
        wl = got.writes[li.layer]
        # a kernel that maps each slot itself reads the mapping at replay (aiter: KernelMappedWrite)
        for name in ("loc",) if getattr(wl, "mapping", None) is not None else ("loc", "swa_loc"):
            t = getattr(wl, name, None)
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in static:
                raise GraphUnavailable(
                    f"the {name} the store of layer {li.layer} took at capture (size {got.size}) is not a view "
                    f"of a static buffer of the runner or the backend: its replay value is not readable")


class CapturedRunner:
    """What each graph runner driven here keeps: its captures by size, the layers, and each size's layer write
    locations, taken at its first replay (:meth:`writes_of`) with the capture-time batch and metadata installed. A
    runner gives :meth:`static_buffers`: the buffers (besides the backend's) a captured write may be a view of."""

    def __init__(self, runner, backend, adapter, sizes, device: str, forward_context: Callable):
        self.runner, self.backend, self.adapter = runner, backend, adapter
        self.sizes = tuple(sorted(set(int(s) for s in sizes)))
        self.max_bs = self.sizes[-1]
        self.device = torch.device(device)
        self._ctx = forward_context
        self.captured: dict[int, Captured] = {}
        self.layers: list[Layer] = []
        self.replays = 0
        self.layer_captures = 0         # capture sizes whose layers' write locations were taken

    def static_buffers(self):
        raise NotImplementedError

    def _take_writes(self, got: Captured) -> None:
        """Each layer's write location for capture ``got``, its batch and metadata installed; checked static."""
        pool = getattr(self.runner.capture, "full_to_swa_index_mapping", None)
        with self.installed(got):
            for li in self.layers:
                wl = li.write(got.fb, got.rows, lambda fb=got.fb: self._ctx(fb))
                if getattr(wl, "mapping", None) is not None and pool is not None:
                    # a kernel-mapped write: whether what it was handed is a view of the pool's mapping
                    wl = replace(wl, pool_view=wl.mapping.untyped_storage().data_ptr()
                                 == pool.untyped_storage().data_ptr())
                got.writes[li.layer] = wl
        check_static(got, self.layers, self.static_buffers(), self.backend)
        self.layer_captures += 1

    def writes_of(self, size: int) -> Captured:
        """Capture ``size`` with its layers' write locations (taken now if this is its first replay)."""
        if size not in self.captured:
            raise GraphUnavailable(f"capture size {size} was not captured (sizes {list(self.sizes)})")
        got = self.captured[size]
        if not got.writes:
            self._take_writes(got)
        return got

    def installed(self, got: Captured):
        """The capture-time metadata in the backend (what the graph's kernels read): :func:`installed_metadata`."""
        return installed_metadata(self.backend, self.adapter.metadata_attr, got.metadata)


class DecodeGraphs(CapturedRunner):
    """One backend's decode CUDA-graph runner: see the module docstring. ``verify``: ``(num_draft_tokens,
    speculative_num_steps)`` for the target's runner under EAGLE, which captures ``TARGET_VERIFY`` batches of
    ``num_draft_tokens`` rows a request (``captured_req_width``) with the runner's ``EagleVerifyInput`` over its
    static custom-mask buffer (``get_spec_info``); None for plain decode."""

    def __init__(self, runner, backend, adapter, sizes, device: str, forward_context: Callable,
                 verify: Optional[tuple[int, int]] = None):
        super().__init__(runner, backend, adapter, sizes, device, forward_context)
        self._fbi = importlib.import_module(FORWARD_BATCH_INFO)
        self._view = importlib.import_module(DECODE_RUNNER).build_replay_fb_view
        self.verify = verify
        self.width = 1 if verify is None else int(verify[0])
        self.mode = self._fbi.ForwardMode.DECODE if verify is None else self._fbi.ForwardMode.TARGET_VERIFY
        self.fill = backend.get_cuda_graph_seq_len_fill_value()
        self.max_num_token = self.max_bs * self.width
        self.registry = importlib.import_module(REGISTRY).build_decode_registry(
            device=self.device, max_bs=self.max_bs, max_num_token=self.max_num_token, seq_len_fill_value=self.fill,
            cache_loc_dtype=_loc_dtype(), share_pool=False)
        #: the runner's custom-mask buffer (its base runner's size), the capture's verify input's mask
        self.custom_mask = None if verify is None else torch.ones(
            (self.max_bs * self.fill + self.max_num_token) * self.width, dtype=torch.bool, device=self.device)
        #: the replay view's ``buffers`` (the release's ``DecodeInputBuffers`` shares these slots' storage)
        self.buffers = type("DecodeBuffers", (), {})()
        for name in DECODE_VIEW_SLOTS:
            setattr(self.buffers, name, self.registry.get_slot(name).buffer)
        self.buffers.encoder_lens = self.buffers.mamba_track_indices = None

    # ------------------------------------------------------------------ capture (once, before the first forward)

    def capture(self, layers: list[Layer]) -> None:
        """``init_cuda_graph_state`` once, then every capture size, largest first (``_capture_one_stream``): its
        batch and metadata. The layers' write locations are taken for the largest size now (a capture the release
        cannot run for this backend fails here, before the first forward, as at start-up) and for each other size
        at its first replay (:meth:`writes_of`), with that size's capture-time batch and metadata: a layer's
        write location at capture is views of the static buffers (checked), fixed by the size alone, and a replay
        reads what they hold then; most sizes are never replayed (B1: one of 36), and each capture's layers were
        most of an engine run's time on a CPU."""
        be = self.backend
        self.layers = layers
        with self._ctx():
            be.init_cuda_graph_state(self.max_bs, self.max_num_token)
        for bs in reversed(self.sizes):
            fb = self._capture_batch(bs)
            with torch.no_grad(), self._ctx(fb):
                be.init_forward_metadata_out_graph(fb, in_capture=True)
                be.init_forward_metadata_in_graph(fb)
            self.captured[bs] = Captured(bs, fb, getattr(be, self.adapter.metadata_attr, None),
                                         rows=bs * self.width, owner=self)
            if bs == self.max_bs:
                self._take_writes(self.captured[bs])

    def _slot(self, name: str, bs: int, num_tokens: Optional[int] = None) -> torch.Tensor:
        return self.registry.get_slot(name).slice_for(bs, bs if num_tokens is None else num_tokens)

    def _verify_input(self):
        """``get_spec_info`` of the target's runner under EAGLE: an ``EagleVerifyInput`` over the custom-mask
        buffer, nothing else known at capture."""
        nd, steps = self.verify
        return importlib.import_module(EAGLE_INFO).EagleVerifyInput(
            draft_token=None, custom_mask=self.custom_mask, positions=None, retrieve_index=None,
            retrieve_next_token=None, retrieve_next_sibling=None, retrieve_cum_len=None, spec_steps=steps, topk=1,
            draft_token_num=nd, capture_hidden_mode=self._fbi.CaptureHiddenMode.FULL, seq_lens_sum=None,
            seq_lens_cpu=None)

    def _capture_batch(self, bs: int):
        """``capture_prepare``'s batch of ``bs`` over the static buffers, bound with ``bind_runner_slots``."""
        mode, n = self.mode, bs * self.width
        seq_lens = self._slot("seq_lens", bs)
        extra = {} if self.verify is None else {"spec_info": self._verify_input(), "spec_algorithm": _eagle(),
                                                "capture_hidden_mode": self._fbi.CaptureHiddenMode.FULL}
        fb = self._fbi.ForwardBatch(
            forward_mode=mode, batch_size=bs, input_ids=self._slot("input_ids", bs, n),
            req_pool_indices=self._slot("req_pool_indices", bs), seq_lens=seq_lens,
            seq_lens_cpu=self._slot("seq_lens_cpu", bs), orig_seq_lens=seq_lens,
            out_cache_loc=self._slot("out_cache_loc", bs, n), seq_lens_sum=int(seq_lens.sum().item()),
            positions=self._slot("positions", bs, n), return_logprob=False, can_run_decode_cuda_graph=True,
            global_forward_mode=mode, **extra)
        if self.runner.translator is not None:
            self.runner.translator.bind_runner_slots(fb)
        return fb

    def static_buffers(self):
        return {n: self.registry.get_slot(n).buffer for n in self.registry.slot_names()}

    # ------------------------------------------------------------------ replay

    def replay(self, fb, size: int) -> Captured:
        """The replay prep of ``fb`` at capture size ``size``: ``load_batch``'s fill, the replay view and the
        backend's replay metadata, the in-graph prep (on the capture-time batch). Returns the capture."""
        got = self.writes_of(size)
        raw_bs = int(fb.batch_size)
        raw_n = int(fb.out_cache_loc.shape[0])
        n = size * self.width
        self.registry.fill_from(fb, raw_bs=raw_bs, padded_bs=size, raw_num_tokens=raw_n, padded_num_tokens=n)
        view = self._view(forward_batch=fb, buffers=self.buffers, bs=size, raw_bs=raw_bs, num_tokens=n,
                          global_num_tokens_cpu=None, seq_len_fill_value=self.fill,
                          capture_forward_mode=self.mode, is_encoder_decoder=False)
        with torch.no_grad():
            with self._ctx():
                self.backend.init_forward_metadata_out_graph(view)
            with self.installed(got), self._ctx(got.fb):
                self.backend.init_forward_metadata_in_graph(got.fb)
        self.replays += 1
        return got

class PrefillGraphs:
    """The release's prefill (piecewise) graph runner on the write path: see the module docstring."""

    def __init__(self, runner, backend, sizes, device: str, max_requests: int, forward_context: Callable):
        self.runner, self.backend = runner, backend
        self.sizes = tuple(sorted(set(int(s) for s in sizes)))
        self._ctx = forward_context
        self._fbi = importlib.import_module(FORWARD_BATCH_INFO)
        self._prefill = importlib.import_module(PREFILL_GRAPH)
        self._batch = importlib.import_module(RUNNER_BATCH)
        self._breakable = importlib.import_module(BREAKABLE).enable_breakable_cuda_graph
        self.registry = importlib.import_module(REGISTRY).build_prefill_registry(
            device=torch.device(device), max_bs=max_requests, max_num_token=self.sizes[-1],
            cache_loc_dtype=_loc_dtype(), share_pool=False)
        self.replays = 0

    def load(self, fb, size: int):
        """``load_batch``: ``fb``'s token rows into the static buffers padded to ``size`` (the registry's
        policies), and the static batch the layers run on, bound to ``fb``'s plan over the static loc buffer."""
        if size not in self.sizes:
            raise GraphUnavailable(f"prefill capture size {size} is not one of {list(self.sizes)}")
        n = int(fb.input_ids.shape[0])
        bs = int(fb.batch_size)
        self.registry.fill_from(fb, raw_bs=bs, padded_bs=bs, raw_num_tokens=n, padded_num_tokens=size)

        def slot(name):
            return self.registry.get_slot(name).slice_for(bs, size)

        mode = self._fbi.ForwardMode
        pcg_mode = mode.EXTEND if fb.forward_mode == mode.MIXED else fb.forward_mode
        out_cache_loc = slot("out_cache_loc")
        static = self._fbi.ForwardBatch(
            forward_mode=pcg_mode, batch_size=bs, input_ids=slot("input_ids"),
            req_pool_indices=fb.req_pool_indices, seq_lens=fb.seq_lens, orig_seq_lens=fb.orig_seq_lens,
            seq_lens_cpu=fb.seq_lens_cpu, out_cache_loc=out_cache_loc, seq_lens_sum=fb.seq_lens_sum,
            return_logprob=False, extend_seq_lens=fb.extend_seq_lens, extend_prefix_lens=fb.extend_prefix_lens,
            extend_start_loc=fb.extend_start_loc, extend_prefix_lens_cpu=fb.extend_prefix_lens_cpu,
            extend_seq_lens_cpu=fb.extend_seq_lens_cpu, extend_num_tokens=fb.extend_num_tokens,
            positions=slot("positions"), global_num_token_non_padded_cpu=fb.global_num_token_non_padded_cpu,
            global_forward_mode=pcg_mode)
        if fb.kv_loc_plan is not None:
            fb.kv_loc_plan.bind_replay(static, self.runner.translator, slots=out_cache_loc)
        self.replays += 1
        return static

    def metadata(self, fb) -> None:
        """``_prepare_forward_metadata_for_replay`` for a backend without captured metadata: its
        ``init_forward_metadata`` of the live batch, inside the runner's ``replay_session``."""
        with self._breakable(), self._ctx():
            self.backend.init_forward_metadata(fb)

    def scope(self, static, raw_num_tokens: int) -> Callable:
        """The runner's scope around a layer of ``static`` (``_prefill_forward_context`` inside
        ``replay_session``), as a context-manager factory."""

        @contextmanager
        def entered() -> Iterator[None]:
            with ExitStack() as stack:
                stack.enter_context(self._breakable())
                stack.enter_context(self._batch.set_forward_batch(static))
                stack.enter_context(self._prefill.prefill_graph_scope(full_graph=False,
                                                                      raw_num_tokens=raw_num_tokens))
                stack.enter_context(self._ctx(static))
                yield
        return entered


def raised_text(e: BaseException) -> str:
    """``where (file:line) raised Type: message`` (the innermost frame: a release function, or ours)."""
    import os
    import traceback
    tb = traceback.extract_tb(e.__traceback__)
    where = f"{tb[-1].name} ({os.path.basename(tb[-1].filename)}:{tb[-1].lineno}) " if tb else ""
    text = str(e)
    return f"{where}raised {type(e).__name__}{': ' + text if text else ''}"
