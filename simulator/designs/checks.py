"""The run's side of the hook protocol: a hook's failure, and the checks on what it returns (as a kernel would check it)."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from simulator.designs.types import BoundaryContext, KVWriteLoc, ReadIds, ReadTable


class HookFailure(Exception):
    """A design hook raised, or returned what no kernel would take; becomes a ``design_error`` finding."""

    def __init__(self, hook: str, message: str, kind: Optional[str] = None):
        super().__init__(f"{hook}: {message}")
        self.hook = hook
        self.message = message
        self.kind = kind

    def describe(self, design: str, ctx: "BoundaryContext", layer: int) -> str:
        """The finding's message: the hook, what went wrong, and where (step, backend, side, layer, mode)."""
        return (f"design {design}: {self.hook} {self.message} at step {ctx.step} on {ctx.backend} "
                f"({ctx.side}, layer {layer}, mode {ctx.mode}, runner {ctx.runner})")


def call_hook(hook: str, fn: Callable, *args: Any) -> Any:
    """Call a design hook; an ``Exception`` it raises becomes a :class:`HookFailure` (BaseExceptions propagate)."""
    try:
        return fn(*args)
    except Exception as e:  # the design's code: reported as a finding, the run goes on
        raise HookFailure(hook, f"raised {type(e).__name__}: {e}") from e


def _same_device(dev: torch.device, want: torch.device) -> bool:
    return dev.type == want.type and (want.index is None or dev.index is None or dev.index == want.index)


def check_index(value: Any, device: torch.device, hook: str, what: str) -> torch.Tensor:
    """What a store kernel accepts as an index: a 1-D int32 / int64 tensor on the run's device."""
    if not isinstance(value, torch.Tensor):
        raise HookFailure(hook, f"returned {what} of type {type(value).__name__}, not a torch.Tensor")
    if value.dtype not in (torch.int32, torch.int64):
        raise HookFailure(hook, f"returned {what} of dtype {str(value.dtype).replace('torch.', '')} "
                                f"(an index must be int32 or int64)")
    if not _same_device(value.device, device):
        raise HookFailure(hook, f"returned {what} on device {value.device}, the run is on {device}")
    if value.dim() != 1:
        raise HookFailure(hook, f"returned {what} of shape {tuple(value.shape)} (an index must be 1-D)")
    return value


def check_write_loc(wl: Any, kind: str, device: torch.device) -> KVWriteLoc:
    """A ``make_write_loc`` result as the hybrid pool takes it: SWA layers assert that ``swa_loc`` is present."""
    hook = "make_write_loc"
    if not isinstance(wl, KVWriteLoc):
        raise HookFailure(hook, f"returned {type(wl).__name__}, not a KVWriteLoc", kind)
    try:
        check_index(wl.loc, device, hook, "loc")
        if wl.swa_loc is not None:
            check_index(wl.swa_loc, device, hook, "swa_loc")
        elif kind == "swa":
            raise HookFailure(hook, "returned a KVWriteLoc without swa_loc for an SWA layer (the hybrid pool "
                                    "asserts it)")
    except HookFailure as f:
        f.kind = kind
        raise
    return wl


def check_read_table(table: Any, num_requests: int, device: torch.device) -> ReadTable:
    """A ``read_ids`` result as the attention kernels take it: per kind None or consistent CSR tensors. The
    table's ``spans`` are dropped: a design's tables are held to the oracle's rule, whatever they say."""
    hook = "read_ids"
    if not isinstance(table, ReadTable):
        raise HookFailure(hook, f"returned {type(table).__name__}, not a ReadTable", "full")
    for kind in ("full", "swa"):
        ids = table.of(kind)
        if ids is None:
            continue
        try:
            if not isinstance(ids, ReadIds):
                raise HookFailure(hook, f"returned {kind} of type {type(ids).__name__}, not ReadIds")
            check_index(ids.indices, device, hook, f"{kind}.indices")
            for what, t, n in (("indptr", ids.indptr, num_requests + 1), ("start", ids.start, num_requests)):
                check_index(t, device, hook, f"{kind}.{what}")
                if t.dtype != torch.int64 or t.shape[0] != n:
                    raise HookFailure(hook, f"returned {kind}.{what} of dtype {str(t.dtype).replace('torch.', '')} "
                                            f"and length {t.shape[0]} (int64 of length {n} expected)")
            if int(ids.indptr[0]) != 0 or int(ids.indptr[-1]) != ids.indices.shape[0] or \
                    bool((ids.indptr[1:] < ids.indptr[:-1]).any()):
                raise HookFailure(hook, f"returned {kind}.indptr that does not delimit its {ids.indices.shape[0]} "
                                        f"indices (must start at 0, not decrease, end at len(indices))")
        except HookFailure as f:
            f.kind = kind
            raise
    return table if table.spans is None else ReadTable(table.full, table.swa)
