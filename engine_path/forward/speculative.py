"""The release's EAGLE forwards of a decode round (spec v2, chain drafting: topk 1), built as its worker builds them.

SGLang 0.5.23's ``EAGLEWorkerV2`` runs one round per decode iteration over one write window of
``num_draft_tokens`` (``nd``) slots per request, planned once by the target's ``KVIndexTranslator.plan``
(``prepare_for_draft``: ``write_virtual`` the window, ``read_extent`` nd) and bound by each of its forwards:

* the draft's decode steps: one ``DECODE`` batch bound to the window's columns ``0 .. S - 1`` (``S`` =
  ``speculative_num_steps``), the multi-step draft backend's ``init_forward_metadata`` once, then step ``i``'s forward
  (``i < S - 1``) with ``out_cache_loc`` column ``i`` (``per_step_draft_out_cache_loc``) under that backend's child
  ``i`` (``draft_forward``);
* ``TARGET_VERIFY``: the whole window in the target's pools, an ``EagleVerifyInput`` (chain tree: the full mask of
  ``seq + nd`` columns per draft row), ``seq_lens`` the committed lengths (``eagle_prepare_for_verify``);
* ``DRAFT_EXTEND_V2``: the whole window again, in the draft's pools, accepted or not, an ``EagleDraftExtendInput``
  with the accept counts, ``seq_lens`` the committed lengths plus nd (``prepare_for_draft_extend``).

The worker's own code cannot run here (its tree builder and window kernels are CUDA-only:
``build_tree_kernel_efficient``, ``assign_draft_cache_locs_contiguous``, ``prepare_draft_extend_inputs``), so the
spec inputs and the window are built here in torch, as those kernels build them for a chain; the batches, the plan,
the metadata and each layer's write are the release's. The simulator's round (simulator/scheduling/speculative.py,
0.5.23's ``draft_columns``) gives the window: a request's slots ``[committed, committed + nd)``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .batch import FORWARD_BATCH_INFO

EAGLE_INFO = "sglang.srt.speculative.eagle_info"
EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"
SPEC_INFO = "sglang.srt.speculative.spec_info"

@dataclass
class Round:
    """One decode round of a backend: the window, the plan its forwards bind, and the draft's batch of its steps."""

    key: tuple
    committed: np.ndarray         # int64 per request: the committed length, where the window starts
    window: torch.Tensor          # int64 [bs * nd]: each request's window slots, request after request
    plan: object                  # the release's KVLocPlan of the round (made by the target's translator)
    draft_fb: object = None       # the draft decode's batch (made and its metadata initialised at step 0)
    draft_loc: object = None      # that batch's out_cache_loc as bound: every step's column, [bs * steps]


def round_key(batch, nd: int) -> tuple:
    """A round's identity from any of its batches: its requests and where their windows start."""
    return tuple(batch.requests.rids.tolist()), tuple(batch.window_starts().tolist()), nd


class Rounds:
    """The rounds of one backend (its target's verify and its draft's forwards share them), the last kept."""

    def __init__(self):
        self.current: Optional[Round] = None

    def of(self, batch, nd: int, planner, device) -> Round:
        key = round_key(batch, nd)
        if self.current is None or self.current.key != key:
            rq = batch.requests
            committed = np.asarray(key[1], dtype=np.int64)
            window = torch.from_numpy(np.concatenate(
                [s.full[c:c + nd] for s, c in zip(rq.slots, committed.tolist())]).astype(np.int64)).to(device)
            bs = len(rq.slots)
            seq = torch.from_numpy(committed.astype(np.int32)).to(device)
            plan = planner.plan(req_pool_indices=torch.arange(bs, dtype=torch.int64, device=device), seq_lens=seq,
                                seq_lens_cpu=seq.cpu(), write_virtual=window, read_extent=nd)
            self.current = Round(key, committed, window, plan)
        return self.current


def write_window_rows(req_to_token: torch.Tensor, rq, rnd: Round, nd: int) -> None:
    """Row i of the release's ``req_to_token``: request i's slots through its window (the round's reads reach
    ``read_extent`` = nd past the committed length)."""
    for i, (s, c) in enumerate(zip(rq.slots, rnd.committed.tolist())):
        req_to_token[i, :c + nd] = torch.from_numpy(s.full[:c + nd])


def _chain_mask(committed: np.ndarray, nd: int, device) -> torch.Tensor:
    """The verify tree's full mask of a chain (``TreeMaskMode.FULL_MASK``): per request nd rows of ``seq + nd``
    columns, the prefix visible to every draft row and each draft row seeing the rows before it and itself."""
    parts = []
    tri = torch.tril(torch.ones(nd, nd, dtype=torch.bool))
    for c in committed.tolist():
        parts.append(torch.cat([torch.ones(nd, c, dtype=torch.bool), tri], dim=1).reshape(-1))
    return torch.cat(parts).to(device)


def _base(fbi, mode: str, bs: int, tokens: int, seq: torch.Tensor, positions: torch.Tensor, spec_info, device):
    return fbi.ForwardBatch(
        forward_mode=getattr(fbi.ForwardMode, mode), batch_size=bs,
        input_ids=torch.zeros(tokens, dtype=torch.int64, device=device),
        req_pool_indices=torch.arange(bs, dtype=torch.int64, device=device), seq_lens=seq, seq_lens_cpu=seq.cpu(),
        out_cache_loc=None, seq_lens_sum=int(seq.sum()), positions=positions, spec_info=spec_info,
        spec_algorithm=_eagle(), capture_hidden_mode=_capture_full())


def _eagle():
    return importlib.import_module(SPEC_INFO).SpeculativeAlgorithm.from_string("EAGLE")


def _capture_full():
    return importlib.import_module(FORWARD_BATCH_INFO).CaptureHiddenMode.FULL


def _window_positions(committed: np.ndarray, nd: int, device) -> torch.Tensor:
    return torch.from_numpy((committed[:, None] + np.arange(nd)).reshape(-1)).to(device)


def verify_batch(runner, rnd: Round, nd: int, steps: int, device):
    """TARGET_VERIFY over the round's window (``build_eagle_verify_input`` + ``eagle_prepare_for_verify``)."""
    fbi = importlib.import_module(FORWARD_BATCH_INFO)
    info = importlib.import_module(EAGLE_INFO)
    bs = len(rnd.committed)
    seq = torch.from_numpy(rnd.committed.astype(np.int32)).to(device)
    positions = _window_positions(rnd.committed, nd, device)
    chain = torch.arange(nd, dtype=torch.int64, device=device).repeat(bs, 1)
    nxt = torch.where(chain + 1 < nd, chain + 1, torch.full_like(chain, -1))
    spec = info.EagleVerifyInput(
        draft_token=torch.zeros(bs * nd, dtype=torch.int64, device=device),
        custom_mask=_chain_mask(rnd.committed, nd, device), positions=positions,
        retrieve_index=chain + torch.arange(bs, device=device)[:, None] * nd, retrieve_next_token=nxt,
        retrieve_next_sibling=torch.full_like(chain, -1), retrieve_cum_len=None, spec_steps=steps, topk=1,
        draft_token_num=nd, capture_hidden_mode=None, seq_lens_sum=int(seq.sum()), seq_lens_cpu=seq.cpu(),
        prepared_out_cache_loc=rnd.window, kv_loc_plan=rnd.plan)
    fb = _base(fbi, "TARGET_VERIFY", bs, bs * nd, seq, positions, spec, device)
    rnd.plan.bind(fb, runner.translator)          # the whole window (cols None)
    fb.global_num_token_non_padded_cpu = bs * nd
    return fb


def draft_decode_batch(runner, rnd: Round, steps: int, device):
    """The draft's DECODE batch of a round's steps, bound to the window's columns ``0 .. steps - 1``
    (``prepare_for_draft``), ``positions`` the committed lengths."""
    fbi = importlib.import_module(FORWARD_BATCH_INFO)
    info = importlib.import_module(EAGLE_INFO)
    bs = len(rnd.committed)
    seq = torch.from_numpy(rnd.committed.astype(np.int32)).to(device)
    positions = torch.from_numpy(rnd.committed.copy()).to(device)
    spec = info.EagleDraftInput(
        topk_p=torch.ones(bs, 1, dtype=torch.float32, device=device),
        topk_index=torch.zeros(bs, 1, dtype=torch.int64, device=device), hidden_states=None,
        num_tokens_per_req=1, num_tokens_for_logprob_per_req=1)
    spec.positions = positions
    fb = _base(fbi, "DECODE", bs, bs, seq, positions, spec, device)
    rnd.plan.bind(fb, runner.translator, cols=slice(0, steps))
    fb.global_num_token_non_padded_cpu = bs
    return fb


def draft_step(fb, rnd: Round, step: int, steps: int) -> None:
    """Step ``step`` of the draft's decode (``draft_forward``): its column of the window, its positions."""
    if rnd.draft_loc is None:
        rnd.draft_loc = fb.out_cache_loc
    loc = rnd.draft_loc
    per_step = importlib.import_module(EAGLE_UTILS).per_step_draft_out_cache_loc(loc, len(rnd.committed), 1, steps)
    fb.out_cache_loc = per_step[step]
    fb.positions = torch.from_numpy(rnd.committed + step).to(loc.device)


def draft_extend_batch(runner, rnd: Round, accepted: np.ndarray, nd: int, device):
    """DRAFT_EXTEND_V2 over the whole window in the draft's pools (``prepare_for_draft_extend``): ``seq_lens`` the
    committed lengths plus nd, the extend fields the window's."""
    fbi = importlib.import_module(FORWARD_BATCH_INFO)
    info = importlib.import_module(EAGLE_INFO)
    bs = len(rnd.committed)
    acc = torch.from_numpy(np.asarray(accepted, dtype=np.int32)).to(device)
    spec = info.EagleDraftExtendInput(
        hidden_states=None, num_correct_drafts=acc - 1, num_accept_tokens=acc,
        num_accept_tokens_cpu=acc.cpu().tolist(), num_tokens_per_req=nd, num_tokens_for_logprob_per_req=nd)
    prefix = torch.from_numpy(rnd.committed.astype(np.int32)).to(device)
    seq = prefix + nd
    fb = _base(fbi, "DRAFT_EXTEND_V2", bs, bs * nd, seq, _window_positions(rnd.committed, nd, device), spec, device)
    rnd.plan.bind(fb, runner.translator)
    fb.extend_prefix_lens, fb.extend_prefix_lens_cpu = prefix, prefix.cpu().tolist()
    fb.extend_seq_lens = torch.full((bs,), nd, dtype=torch.int32, device=device)
    fb.extend_seq_lens_cpu = [nd] * bs
    fb.extend_num_tokens = bs * nd
    fb.extend_start_loc = torch.arange(bs, dtype=torch.int32, device=device) * nd
    fb.global_num_token_non_padded_cpu = bs * nd
    return fb
