"""A forward's CUDA graph and DP padding as vLLM's model runner V2 chooses them: the release's own code.

Per forward, as ``GPUModelRunner.execute_model`` does before ``prepare_inputs``: whether the batch is a uniform
decode (``get_uniform_decode_token_count``, with the runner's rule for a prefill's last token: one new prompt token
over computed context runs as a decode), then ``dispatch_cg_and_sync_dp``: the release's ``CudaGraphManager``
picks the graph (a FULL decode graph of the smallest captured request count that holds the batch, or none: eager)
and, with DP (``engine.dp_size > 1``), the ranks agree on it (``sync_cudagraph_and_dp_padding``): every rank pads
to the graph of the largest rank's tokens, and where any rank runs eager all run eager, unpadded. The padded count
is what the worker's ``compute_slot_mappings`` pads to (its rows past the real tokens -1).

The scenario maps onto the release's compilation config: ``engine.cuda_graph`` and ``engine.piecewise_cuda_graph``
pick ``cudagraph_mode`` (both: ``FULL_AND_PIECEWISE``, vLLM's default; decode graphs only: ``FULL_DECODE_ONLY``;
piecewise only: ``PIECEWISE``), ``engine.cuda_graph_bs`` the decode graphs' request counts (at most
``max_num_seqs``: ``decode_cudagraph_capture_shapes`` caps them), ``engine.piecewise_capture_sizes`` within the token
budget the piecewise graphs' token counts. A piecewise forward runs attention eagerly over the padded slot mapping
(its rows past the real tokens what the kernel left there), so the batch keeps every padded row
(``BackendSpec.piecewise_padded_rows``).

What stands in (:data:`STAND_INS`): a CPU run captures no graph, so the manager's descriptors are taken as captured;
one pipeline-parallel rank; the other DP ranks' batches are drawn from ``engine.dp_other_tokens`` (as slotscope's
SGLang model draws them: decoding when this rank decodes, each at most the largest decode graph) and reach the
release through its DP group's all-reduce.
"""
from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

import numpy as np
import torch

#: what stands in for the pieces of the graph choice a CPU run has not (run.json's scheduler stand-ins)
STAND_INS = {
    "graph capture": "no graph is captured: the CudaGraphManager's descriptors (its _init_candidates, from the "
                     "compilation config) are taken as captured, so dispatch picks among them as after capture",
    "the pipeline-parallel group": "one rank (first and last)",
    "the other DP ranks": "their batches drawn from engine.dp_other_tokens (uniform decodes of that many requests "
                          "when this rank decodes, at most the largest decode graph; a prefill otherwise), each "
                          "dispatched by the same CudaGraphManager, their votes handed in through the DP group's "
                          "cpu_all_reduce_",
}


def _mod(name: str):
    return importlib.import_module(name)


@dataclass(frozen=True)
class Dispatch:
    """The release's choice for one forward: the graph path (``decode_graph``, ``piecewise`` or ``eager``), the rows the
    forward runs (padded) and, with DP, every rank's token count before padding (this rank first)."""

    graph: str
    tokens: int
    ranks: tuple[int, ...] = ()


class ReleaseGraphs:
    """The release's ``CudaGraphManager`` and DP agreement for a run."""

    def __init__(self, driver, scenario, rng: np.random.Generator):
        cfg, self._cgu, self._dpu = (_mod("vllm.config"), _mod("vllm.v1.worker.gpu.cudagraph_utils"),
                                     _mod("vllm.v1.worker.gpu.dp_utils"))
        self._uniform = _mod("vllm.v1.worker.utils").get_uniform_decode_token_count
        eng = scenario.engine
        self.rng, self.dp_size, self.others_dist = rng, eng.dp_size, eng.dp_other_tokens
        vc = driver.vllm_config
        self.max_reqs = vc.scheduler_config.max_num_seqs
        cc = vc.compilation_config
        modes = {(True, True): "FULL_AND_PIECEWISE", (True, False): "FULL_DECODE_ONLY", (False, True): "PIECEWISE",
                 (False, False): "NONE"}
        mode = cfg.CUDAGraphMode[modes[bool(eng.cuda_graph), bool(eng.piecewise_cuda_graph)]]
        budget = self.budget = vc.scheduler_config.max_num_batched_tokens
        # what a CUDA platform's config resolution sets (a CPU platform resolves no graphs)
        cc.cudagraph_mode = mode
        cc.decode_cudagraph_capture_request_sizes = sorted(eng.cuda_graph_bs) if eng.cuda_graph else []
        cc.prefill_cudagraph_capture_token_sizes = (sorted(s for s in eng.piecewise_capture_sizes if s <= budget)
                                                    if eng.piecewise_cuda_graph else [])
        self.mode = mode.name
        # the model runner's decode query lengths: a uniform decode is one new token per request and, with
        # speculative decoding, its drafts (a verify): its FULL decode graphs are captured at that length
        self.decode_query_len = 1 + vc.num_speculative_tokens
        lens = vc.get_decode_cudagraph_query_lens(self.decode_query_len)
        # the recorded max as the config's resolution makes it: the largest graph's tokens, a decode graph's (its
        # requests times their query length) within the token budget, by the release's own shapes
        shapes = _mod("vllm.config.compilation").decode_cudagraph_capture_shapes(
            cc.decode_cudagraph_capture_request_sizes, lens, budget)
        cc.max_cudagraph_capture_size = max([n * q for n, q in shapes] + cc.prefill_cudagraph_capture_token_sizes,
                                            default=0)
        with self._single_rank():
            self.manager = self._cgu.CudaGraphManager(vc, torch.device("cpu"), mode, lens)
        self.manager._graphs_captured = True        # STAND_INS: the descriptors as captured
        descs = self.manager._capture_descs
        # (a PIECEWISE decode mode's descriptors have no request count: no FULL decode graph holds requests)
        self.decode_requests = sorted({d.num_reqs for d in descs.get(mode.decode_mode(), ()) if d.num_reqs is not None})
        self.piecewise_tokens = sorted({d.num_tokens for d in descs.get(mode.mixed_mode(), ())
                                        if d.uniform_token_count is None})
        self.largest = max(self.decode_requests, default=0)

    def _single_rank(self):
        """The manager's constructor asks the pipeline-parallel group and the platform's graph pool: one rank, none."""
        return _module_attrs(self._cgu, get_pp_group=lambda: SimpleNamespace(is_first_rank=True, is_last_rank=True),
                             current_platform=SimpleNamespace(get_global_graph_pool=lambda: None))

    def describe(self) -> dict:
        return {"cudagraph_mode": self.mode, "decode_graph_requests": self.decode_requests,
                "piecewise_graph_tokens": self.piecewise_tokens, "dp_size": self.dp_size, "stand_ins": STAND_INS}

    def dispatch(self, starts: np.ndarray, counts: np.ndarray, prompt_lens: np.ndarray) -> Dispatch:
        """The graph and padded rows of a forward of ``counts`` tokens per request from ``starts``."""
        num_reqs, num_tokens = int(counts.size), int(counts.sum())
        max_q = int(counts.max())
        prefilling = starts < prompt_lens
        as_decode = prefilling & (counts == 1) & (starts > 0)
        eligible = bool((as_decode | ~prefilling).all())
        uniform = self._uniform(num_reqs, num_tokens, max_q, eligible)
        votes = None
        if self.dp_size > 1:
            votes = self._other_ranks(uniform is not None, num_tokens)
        with self._dp_group(votes):
            desc, _ = self._dpu.dispatch_cg_and_sync_dp(
                self.manager, num_reqs, num_tokens, uniform, self.dp_size, 0,
                max_query_len=max_q if eligible else None, uniform_decode=uniform == 1)
        graph = {"FULL": "decode_graph", "PIECEWISE": "piecewise"}.get(desc.cg_mode.name, "eager")
        ranks = () if votes is None else (num_tokens, *votes[0, 1:].tolist())
        return Dispatch(graph, int(desc.num_tokens), ranks)

    def _other_ranks(self, decoding: bool, ours: int) -> torch.Tensor:
        """The other ranks' columns of the DP all-reduce's tensor (rows as ``sync_cudagraph_and_dp_padding`` fills
        its own: tokens, desired graph mode, uniform count, max query length, ubatching, requests, skip drafts)."""
        t = torch.zeros(7, self.dp_size, dtype=torch.int32)
        drawn = self.others_dist.sample(self.rng, self.dp_size - 1)
        for r, n in enumerate(np.asarray(drawn, dtype=np.int64).tolist(), start=1):
            if decoding:
                q = self.decode_query_len             # a decode (of n requests, q tokens each, in the token budget)
                n = max(1, min(n, max(self.largest, ours // q), self.max_reqs, self.budget // q))  # idle rank's: 1
                desc = self.manager.dispatch(n, n * q, q, 0, max_query_len=q)
                t[:, r] = torch.tensor([n * q, desc.cg_mode.value, q, q, 0, n, 0], dtype=torch.int32)
            else:
                n = max(1, n)                   # a prefill of n tokens: a piecewise graph where one holds it
                desc = self.manager.dispatch(1, n, None, 0)
                t[:, r] = torch.tensor([n, desc.cg_mode.value, 0, -1, 0, 1, 0], dtype=torch.int32)
        return t

    def _dp_group(self, votes: Optional[torch.Tensor]):
        """The DP group's all-reduce: this rank's column is the release's own; the others' are ``votes``'."""
        if votes is None:
            return contextlib.nullcontext()

        def all_reduce(tensor: torch.Tensor) -> None:
            tensor[:, 1:] += votes[:, 1:]

        group = SimpleNamespace(cpu_all_reduce_=all_reduce, dead_dp_ranks=())
        return _module_attrs(self._dpu, get_dp_group=lambda: group)


@contextlib.contextmanager
def _module_attrs(module, **values):
    """Within the block, ``module``'s globals ``values`` (the release's own functions see them); put back after."""
    saved = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
