"""An offload tier behind vLLM's prefix cache (``engine.kv_offload``): a KV connector of slotscope's, scheduler side.

vLLM reaches KV held outside the device's block pool through a KV connector (LMCache, its own CPU offloading, NIXL
for PD). What the release's own code does with a connector's hit is what this drives: the scheduler asks the
connector how many tokens past the local prefix hit it holds (``get_num_new_matched_tokens``), the KV-cache manager
allocates blocks for them in every group (``allocate_new_computed_blocks``: the local hit's blocks touched, the
external tokens' blocks taken from the pool) and hands the connector the request's blocks
(``update_state_after_alloc``), and a finished request's blocks go to the connector before they are freed
(``request_finished_all_groups``).

:class:`OffloadTier` is the connector: what it holds is content, by vLLM's own block hashes (the request's
``block_hashes``, which hash the token ids: slotscope's content tags). A request that finishes saves the blocks it
computed, whole blocks only, before its blocks are freed (the save is taken as done at once: the connector asks no
delayed free). A later request whose prefix the tier holds past the device's local hit is told so, block-aligned and
one token short of its whole length (the scheduler computes at least one token). The load is synchronous (the
worker loads it before the forward that follows the schedule, as a connector answering ``load_kv_async = False``
does) or, with ``engine.kv_offload_load = "async"``, asynchronous: the scheduler parks the request in
``WAITING_FOR_REMOTE_KVS`` and the worker reports the load done (``finished_recving``) in the output of the
schedule that issued it (:meth:`OffloadTier.take_finished`, the driver's). The loads of each schedule
(:attr:`OffloadTier.loads`, with the blocks the driver records right after it) are what the step source turns into
a forward's ``Transfer``: the loaded tokens' tags into the blocks the release's manager gave them, in each group.

Not the release's: the tier itself (what it stores and when), and the copy (no worker-side connector runs: the
oracle takes the load as writes, as it takes a PD decode node's transfer). The worker-side methods raise if called.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

NAME = "SlotscopeOffloadTier"
#: what stands in, and why (run.json's engine_pieces)
STAND_IN = ("an offload tier (slotscope's KV connector, scheduler side: saves each finished request's computed "
            "blocks by vLLM's block hashes, answers get_num_new_matched_tokens from them, loads synchronously or, "
            "with engine.kv_offload_load = \"async\", asynchronously; the worker's copy is the oracle's transfer)")


@dataclass
class Load:
    """One request's load of a schedule: the external tokens ``[first, first + count)`` of request ``req_id``;
    ``blocks``: per group the block ids the release's manager gave the request (taken right after the schedule)."""

    req_id: str
    first: int
    count: int
    async_: bool = False
    blocks: tuple = ()


def register() -> None:
    """Make the connector known to the release's ``KVConnectorFactory`` (once a process)."""
    factory = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.factory").KVConnectorFactory
    if NAME not in factory._registry:
        factory.register_connector(NAME, __name__, "OffloadTier")


def transfer_config(load: str = "sync"):
    """The ``KVTransferConfig`` that selects the connector (both roles; only the scheduler's is built here), its
    loads ``load`` ("sync" or "async")."""
    register()
    cfg = importlib.import_module("vllm.config")
    return cfg.KVTransferConfig(kv_connector=NAME, kv_role="kv_both", kv_connector_extra_config={"load": load})


def _base():
    return importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.base")


class _Tier:
    """The tier (see the module docstring), the methods of :data:`OffloadTier`, which adds the release's connector
    bases (made once the release is importable). ``stored``: the block hashes it holds; ``loads``: this schedule's
    loads, taken by the step source after the schedule."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.block_size = vllm_config.cache_config.block_size
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        self.async_loads = extra.get("load") == "async"
        self.stored: set = set()
        self.loads: dict[str, Load] = {}
        self._asked: dict[str, int] = {}          # req_id -> the local hit its last lookup was told
        self.receiving: set = set()               # async loads issued, not yet reported finished
        self.saved_blocks = 0
        self.loaded_tokens = 0

    # ---------------------------------------------------------------- scheduler side

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        bs = self.block_size
        hashes = request.block_hashes
        k = num_computed_tokens // bs
        held = k
        while held < len(hashes) and hashes[held] in self.stored:
            held += 1
        # whole blocks only, and one token left for the forward to compute
        last = min(held * bs, ((request.num_tokens - 1) // bs) * bs)
        count = max(0, last - num_computed_tokens)
        self._asked[request.request_id] = num_computed_tokens
        return count, bool(count) and self.async_loads

    def may_load_async(self, request):
        return self.async_loads

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens > 0:
            rid = request.request_id
            self.loads[rid] = Load(rid, self._asked[rid], int(num_external_tokens), self.async_loads)
            self.loaded_tokens += int(num_external_tokens)
            if self.async_loads:
                self.receiving.add(rid)

    def take_finished(self) -> set:
        """The async loads issued so far, reported done in the output of the schedule that issued them (the
        worker's connector finishes a load within the step that carried it)."""
        out, self.receiving = self.receiving, set()
        return out

    def build_connector_meta(self, scheduler_output):
        return _base().KVConnectorMetadata()

    def take_loads(self, req_ids) -> list[Load]:
        """The loads that land by a forward of ``req_ids``, in the order they were issued: the sync loads of those
        requests and every async load issued so far (the rest wait for their own requests' forward)."""
        mine = set(req_ids)
        taken = [load for rid, load in self.loads.items() if load.async_ or rid in mine]
        for load in taken:
            del self.loads[load.req_id]
        return taken

    def request_finished_all_groups(self, request, block_ids):
        computed = request.num_computed_tokens // self.block_size
        for h in request.block_hashes[:computed]:
            if h not in self.stored:
                self.stored.add(h)
                self.saved_blocks += 1
        return False, None

    def request_finished(self, request, block_ids):
        return self.request_finished_all_groups(request, (block_ids,))

    # ---------------------------------------------------------------- worker side: never built here

    def _no_worker(self, *args, **kwargs):
        raise RuntimeError(f"{NAME}: slotscope's offload tier has no worker side (the oracle takes its loads)")

    start_load_kv = wait_for_layer_load = save_kv_layer = wait_for_save = _no_worker


def _connector_class():
    base = _base()
    return type("OffloadTier", (_Tier, base.KVConnectorBase_V1, base.SupportsHMA), {"__module__": __name__})


def __getattr__(name: str):
    # the class subclasses the release's connector base, so it is made once the release is importable
    if name == "OffloadTier":
        cls = _connector_class()
        globals()["OffloadTier"] = cls
        return cls
    raise AttributeError(name)
