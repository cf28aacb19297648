"""The release's ``ForwardBatch`` of one step, built the way the release builds it for its backends.

From the step's batch (simulator.scheduling.batch.ForwardBatch with its BatchRequests): the forward mode, one
``req_to_token`` row per request (rewritten for this forward: row i holds request i's full slots), ``seq_lens``,
``positions``, the extend lengths, and ``out_cache_loc``. The translator's plan is bound to the real rows and
only then is ``out_cache_loc`` padded (DP-attention padding comes after ``ForwardBatch.init_new``), with
``global_num_token_non_padded_cpu`` the real count, which the release's per-layer narrowing reads
(``padded_extend_real_tokens``).
"""
from __future__ import annotations

import importlib
from typing import Optional

import numpy as np
import torch

FORWARD_BATCH_INFO = "sglang.srt.model_executor.forward_batch_info"

#: the step modes this builder makes a release batch for (the others stay the model's: named per run)
MODES = {"extend": "EXTEND", "decode": "DECODE", "mixed": "MIXED"}
#: the graph paths a release batch is made for, and the modes each runs (engine_path/forward/graphs.py)
GRAPH_MODES = {"eager": frozenset(MODES), "decode_graph": frozenset({"decode"}),
               "piecewise": frozenset({"extend", "mixed"})}
def release_mode(batch) -> str:
    """The release's ``ForwardMode`` name of a step the builder covers: the draft's extend after a prefill is an
    EXTEND of the draft model over the prefill's batch (0.5.23's ``_draft_extend_for_prefill``)."""
    if batch.mode == "draft_extend" and batch.of_prefill:
        return "EXTEND"
    return MODES[batch.mode]


def mode_supported(batch) -> Optional[str]:
    """Why a step's batch gets no release batch (None: it does)."""
    if batch.mode == "draft_extend" and batch.of_prefill:
        if batch.graph != "eager":
            return f"graph path {batch.graph} of the draft's extend after a prefill: the model's boundary"
        return None if batch.requests is not None else "a batch without its requests"
    if batch.in_round:
        if batch.requests is None:
            return "a batch without its requests"
        if batch.mode == "draft_decode" and batch.draft_step is None or \
                batch.mode == "draft_extend" and batch.accepted is None:
            return (f"mode {batch.mode} outside a round over one window (the release's spec v2 round: the model's "
                    f"round is another release's)")
        return None
    if batch.mode not in MODES:
        return f"mode {batch.mode} (speculative forwards: the model's boundary)"
    if batch.mode not in GRAPH_MODES.get(batch.graph, ()):
        return f"graph path {batch.graph} (graph metadata: the model's boundary)"
    if batch.requests is None:
        return "a batch without its requests"
    return None


def write_rows(req_to_token: torch.Tensor, requests) -> None:
    """Row i of the release's ``req_to_token``: request i's full slots up to its seq_len (this forward's view)."""
    for i, (s, n) in enumerate(zip(requests.slots, requests.seq_lens.tolist())):
        req_to_token[i, :n] = torch.from_numpy(s.full[:n])


def positions_of(seq_lens: np.ndarray, extend_lens: np.ndarray) -> np.ndarray:
    """Every new token's position, request after request."""
    starts = seq_lens - extend_lens
    total = int(extend_lens.sum())
    offset = np.repeat(starts - np.concatenate([[0], np.cumsum(extend_lens)[:-1]]), extend_lens)
    return offset + np.arange(total, dtype=np.int64)


def release_batch(runner, batch, out_cache_loc: torch.Tensor):
    """The release's ForwardBatch of ``batch`` over ``runner``'s pools (runner: engine_path.forward.runner.Runner)."""
    fbi = importlib.import_module(FORWARD_BATCH_INFO)
    rq = batch.requests
    dev = out_cache_loc.device
    bs = len(rq.slots)
    write_rows(runner.req_to_token_pool.req_to_token, rq)
    seq = rq.seq_lens.astype(np.int64)
    ext = rq.extend_lens.astype(np.int64)
    real = batch.num_token_non_padded
    mode = getattr(fbi.ForwardMode, release_mode(batch))
    seq_t = torch.from_numpy(seq.astype(np.int32)).to(dev)
    fb = fbi.ForwardBatch(
        forward_mode=mode, batch_size=bs, input_ids=torch.zeros(out_cache_loc.shape[0], dtype=torch.int64, device=dev),
        req_pool_indices=torch.arange(bs, dtype=torch.int64, device=dev), seq_lens=seq_t,
        seq_lens_cpu=seq_t.cpu(), out_cache_loc=out_cache_loc[:real], seq_lens_sum=int(seq.sum()),
        positions=torch.from_numpy(positions_of(seq, ext)).to(dev))
    if runner.translator is not None:
        runner.translator.bind_own_plan(fb)     # the plan, on the real rows (ForwardBatch.init_new)
    if mode.name != "DECODE":
        prefix = (seq - ext).astype(np.int32)
        fb.extend_prefix_lens = torch.from_numpy(prefix).to(dev)
        fb.extend_prefix_lens_cpu = prefix.tolist()
        fb.extend_seq_lens = torch.from_numpy(ext.astype(np.int32)).to(dev)
        fb.extend_seq_lens_cpu = ext.tolist()
        fb.extend_num_tokens = int(ext.sum())
    fb.out_cache_loc = out_cache_loc                 # DP padding, after the plan
    fb.global_num_token_non_padded_cpu = real
    n = int(out_cache_loc.shape[0])
    if mode.name != "DECODE" and n > real:
        # the token axis padded as the release's prepare_mlp_sync_batch pads an extend (_pad_inputs_to_size)
        fb.positions = _padded(fb.positions, n, 0)
        fb.extend_num_tokens = n
    return fb


def _padded(t: torch.Tensor, n: int, value: int) -> torch.Tensor:
    return torch.cat([t, t.new_full((n - t.shape[0], *t.shape[1:]), value)]) if t.shape[0] < n else t


def pad_decode_rows(fb, fill: int):
    """A DP-padded decode batch with one request row per token, as the release's ``prepare_mlp_sync_batch`` pads
    a decode batch to the DP token count (``batch_size = num_tokens``; ``_pad_inputs_to_size``: request 0, the
    backend's seq-len fill value, position 0). A graph replay needs it: its buffers' request axis is copied whole."""
    n, bs = int(fb.out_cache_loc.shape[0]), int(fb.batch_size)
    if n <= bs:
        return fb
    fb.req_pool_indices = _padded(fb.req_pool_indices, n, 0)
    fb.seq_lens = _padded(fb.seq_lens, n, fill)
    fb.seq_lens_cpu = _padded(fb.seq_lens_cpu, n, fill)
    fb.seq_lens_sum = int(fb.seq_lens_sum) + fill * (n - bs)
    fb.positions = _padded(fb.positions, n, 0)
    fb.batch_size = n
    return fb
