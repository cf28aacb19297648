"""One vLLM run's pieces, wired to the simulator's seams (as engine_path/runtime.py does for SGLang).

* ``allocator_factory(pool config)`` -> :class:`VllmSlots`: the run's slot bookkeeping (its translation table is
  what the step source sets per step; the release's ``BlockPool`` decides every block);
* ``design`` -> :class:`VllmDesign`: padded rows -1, skipped by the store (vLLM's ``PAD_SLOT_ID``); each layer
  writes at its group's slots;
* ``backends(scenario)``: one boundary, ``vllm``: every vLLM attention backend writes through
  ``reshape_and_cache_flash`` (or its Triton twin) with the layer group's slot mapping, so one boundary stands for
  them all;
* ``scheduler_factory``: :class:`~engine_path.vllm.source.VllmStepSource`, the release's scheduler.

The pools under test are the simulator's own (the store that skips -1, as vLLM's does).
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch

from simulator.core.boundary import ModelBackends
from simulator.designs.base import Design
from simulator.engine_model.backends import BackendSpec
from simulator.engine_model.padding_convention import VLLM_NULL_BLOCK
from simulator.memory.allocator import HybridAllocator

from ..errors import AdapterLacks
from ..releases import EngineInfo
from . import connector, hidden_states, kernels
from .release import DEFAULT_VERSION

#: the run's one backend boundary
BACKEND = "vllm"


class VllmDesign(Design):
    """vLLM's write path: the slot mapping of each layer's KV-cache group, padded rows -1 (the store skips them)."""

    name = "vllm"
    description = ("vLLM's write path: each layer writes at its KV-cache group's slot mapping (block table row * "
                   "block_size + offset); padded rows get PAD_SLOT_ID -1, which reshape_and_cache_flash skips; "
                   "nothing writes the null block (block 0).")
    padding = VLLM_NULL_BLOCK
    graph_swa_dtype = torch.int64


class VllmSlots(HybridAllocator):
    """The run's slots: both pools ``num_blocks * block_size`` rows (vLLM's one block pool backs both groups). The
    release's ``BlockPool`` decides every block (engine_path/vllm/scheduler.py); this object only carries the
    translation table the step source sets and the counts the run reports."""

    def __init__(self, full_size: int, page_size: int, version: str):
        super().__init__(full_size, full_size, page_size)
        self.source = f"vllm {version} BlockPool (KVCacheManager)"
        self.step_source = None       # the VllmStepSource, once made: its per-group occupancy

    @property
    def full_used(self) -> int:
        """Slots of the blocks the full-attention group holds (as the oracle saw the release hand them out)."""
        return 0 if self.step_source is None else self.step_source.used("full")

    @property
    def swa_used(self) -> int:
        """Slots of the blocks the sliding-window group holds: its frees show as the gap to ``full_used``."""
        return 0 if self.step_source is None else self.step_source.used("swa")


class VllmBackends(ModelBackends):
    name = "vllm (its attention backends write through reshape_and_cache_flash: one boundary)"

    def __init__(self):
        super().__init__({BACKEND: BackendSpec(BACKEND, swa_ids="translate", piecewise_padded_rows=True)})


class VllmRuntime:
    """The seams of a vLLM run (``slotscope run --engine vllm==V``)."""

    unified = False
    release_scheduler = True
    own_pools = True                   # the pools under test are the simulator's (slotscope's pool factory)

    def __init__(self, info: EngineInfo, *, device: str = "cpu"):
        self.api = SimpleNamespace(info=info)
        self.device = device
        self.design = VllmDesign()
        self.design.name = f"vllm-{info.version}"
        self.scheduler_choice = {"scheduler": "release", "asked": "auto",
                                 "why": "vLLM's own Scheduler and KVCacheManager make every batch of a vLLM run"}
        self.schedule_source = None
        self.import_s = 0.0

    @staticmethod
    def scenario_as_run(scenario):
        """The scenario as a vLLM run runs it: one backend boundary (``vllm``), both pools the block pool's size."""
        pool = dataclasses.replace(scenario.pool, swa_ratio=1.0)
        return dataclasses.replace(scenario, backends=(BACKEND,), pool=pool)

    def allocator_factory(self, cfg) -> VllmSlots:
        return VllmSlots(cfg.full_size, cfg.page_size, self.api.info.version)

    def backends(self, scenario) -> VllmBackends:
        return VllmBackends()

    def scheduler_factory(self, scenario, alloc, release, rng, pad_value: int = -1, pad_to_capture: bool = False):
        from .source import VllmStepSource

        # pad_to_capture is the source's own: a graph's padded rows are what the release's slot kernel left there
        try:
            src = VllmStepSource(scenario, alloc, release.behaviour, rng, self.api.info.version, pad_value,
                                 device=self.device)
        except (AttributeError, ImportError, TypeError) as e:
            if self.api.info.version == DEFAULT_VERSION:
                raise
            raise AdapterLacks(f"vllm {self.api.info.version}: slotscope's adapter of vLLM's scheduler and worker "
                               f"is written against {DEFAULT_VERSION}, and this release differs where it reaches "
                               f"in ({type(e).__name__}: {e})") from None
        alloc.step_source = src
        self.schedule_source = src
        return src

    def close(self) -> None:
        pass

    def _kernels_ran(self) -> str:
        """Where the worker's Triton kernels ran: natively on CUDA; on a CPU interpreted unless stood in."""
        if self.device == "cuda":
            return "its Triton kernels on the GPU"
        stood = kernels.VLLM.installed()
        if not stood:
            return "its Triton kernels under Triton's interpreter"
        interpreted = [f"{n} ({why})" for n, why in kernels.VLLM.refused().items()]
        return ("its Triton launch code; the kernels " + ", ".join(stood) + " computed by torch (model_pieces)"
                + (", the rest under Triton's interpreter: " + "; ".join(interpreted) if interpreted else ""))

    def describe(self) -> dict:
        v = self.api.info.version
        d = {"engine": self.api.info.to_json(), "device": self.device,
             "engine_pieces": ["Scheduler (admission, chunked prefill, preemption, resumption)",
                               "KVCacheManager, its coordinator (HybridKVCacheCoordinator with prefix caching), "
                               "FullAttentionManager, SlidingWindowManager",
                               "BlockPool (one pool for both groups, null block 0) and prefix caching",
                               "KV-cache grouping of the model's layers (get_kv_cache_groups)",
                               "Request objects and their block hashes",
                               "the worker's BlockTables (model runner V2): staged row writes, gather_block_tables "
                               "(SWA entries below the window nulled), compute_slot_mappings; " + self._kernels_ran(),
                               "the CUDA graph of each forward and its padded rows, DP padding included: the model "
                               "runner's uniform-decode rule, CudaGraphManager.dispatch (FULL decode graphs) and "
                               "dispatch_cg_and_sync_dp (the DP ranks' agreement)",
                               "a CUDA graph's padded rows (what compute_slot_mappings leaves past the real tokens)"],
             "model_pieces": ["graph capture (none on a CPU: the manager's descriptors taken as captured)",
                              "the other DP ranks' batches (drawn from engine.dp_other_tokens)",
                              "the store (reshape_and_cache_flash's rule: slot < 0 skipped) into slotscope's pools",
                              "attention arithmetic (none: the read check reads the tables)"]
                             + [f"the worker kernel {p}: {why}" for p, whose, why in kernels.VLLM.pieces()
                                if whose == "model" and self.device != "cuda"]}
        if self.schedule_source is not None and self.schedule_source.driver.tier is not None:
            d["model_pieces"].append(connector.STAND_IN)
        if self.schedule_source is not None and self.schedule_source.g_hidden is not None:
            d["engine_pieces"].append(hidden_states.ENGINE_PIECE)
            d["model_pieces"].append(hidden_states.MODEL_PIECE)
        if self.schedule_source is not None:
            d["scheduler"] = self.schedule_source.describe()
            d["scheduler"]["release"] = f"vllm {v}"
        return d
