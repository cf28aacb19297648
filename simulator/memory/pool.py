"""The pool under test, as the simulator sees it: a small protocol that cuda_path implements.

The run loop writes through :class:`PoolWriter` and the checker reads tags back through it. Keeping
the protocol here keeps the dependency one-way (cuda_path imports the simulator, never the reverse).
"""
from __future__ import annotations

import copy
from typing import Callable, Optional, Protocol

import torch


class KVLengthMismatch(ValueError):
    """Raised by a store before launch when K, V and the index tensor disagree in length."""


def check_lengths(loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """The host-side check of the real store kernel, with its kind of message (every store runs it first)."""
    n = k.shape[0]
    if v.shape[0] != n:
        raise KVLengthMismatch(f"Size mismatch: expected value rows {n} but got {v.shape[0]}")
    if loc.shape[0] != n:
        raise KVLengthMismatch(
            f"Size mismatch: expected out_loc of length {n} (rows of key) but got {loc.shape[0]}"
        )


class PoolWriter(Protocol):
    device: torch.device
    skip_index: int | None          # the index the store skips (0, -1) or None (absorbs slot 0)

    def rows(self, kind: str) -> int:
        """Rows of each K/V buffer of a sub-pool ("full" | "swa")."""

    def make_rows(self, tags: torch.Tensor, layer: int, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V rows carrying ``tags`` for a layer of this kind, in the model's dtype and geometry."""

    def restamp(self, k: torch.Tensor, v: torch.Tensor, layer: int) -> None:
        """Re-stamp rows from :meth:`make_rows` for another layer of the same kind."""

    def store(self, kind: str, index: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write rows at ``loc`` in layer ``index`` of sub-pool ``kind``; raises KVLengthMismatch."""

    def mismatches(self, kind: str, slots: torch.Tensor, expected: torch.Tensor,
                   layers: list[int] | None = None) -> torch.Tensor:
        """``[layers, len(slots)]`` bool, True where the K or V row at a slot does not carry the expected
        tag (0 expects a zeroed row). The fast path of the checker: no decoding, no host transfer."""

    def read_tags(self, kind: str, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tags ``[layers_of_kind, len(slots)]`` read back from the K and the V buffers."""

    def take_out_of_range(self, kind: str) -> torch.Tensor:
        """Per layer of this kind, (count, first position) of skipped out-of-range indices since the
        last call, as an int64 ``[layers, 2]`` host tensor; resets the counters."""


# ---------------------------------------------------------------------------- pools shared by backends

#: what two pools must agree on to hold the same contents after the same writes
_LAYOUT = ("skip_index", "geometry", "store_impl", "k_scale", "v_scale", "fp8")
_BUFFERS = ("k", "v", "err")


class PoolSplitError(MemoryError):
    """A pool class's split (copy on divergence) found no memory for the copy: the backends' writes
    differ, and the device holds fewer pools than the classes they now form."""


def can_copy(pool: PoolWriter) -> bool:
    """Whether :func:`clone_pool` can copy ``pool`` (so backends may share it until their writes differ)."""
    return getattr(pool, "clone", None) is not None or all(isinstance(getattr(pool, a, None), dict)
                                                           for a in _BUFFERS)


def backend_pools(names, make: Callable[[], PoolWriter]) -> dict[str, PoolWriter]:
    """The pools under test of a side's backends: one pool for them all where it can be copied on divergence
    (:class:`PoolClasses`), else one each. Either way every backend's pool starts zeroed."""
    names = list(names)
    first = make()
    if can_copy(first):
        return {n: first for n in names}
    return {n: first if i == 0 else make() for i, n in enumerate(names)}


def own_pools(pools: dict[str, PoolWriter], make: Callable[[], PoolWriter]) -> None:
    """Before any write: every backend a pool of its own (a fresh one where it shared), for a run whose
    steps write backend after backend (a plug-in acts between them)."""
    seen: set[int] = set()
    for n, p in pools.items():
        if id(p) in seen:
            pools[n] = make()
        seen.add(id(pools[n]))


def clone_pool(pool: PoolWriter) -> Optional[PoolWriter]:
    """A copy of ``pool`` that shares nothing written later: its own ``clone()`` where it has one, else a
    shallow copy with its K, V and error buffers (dicts of tensors by kind) copied; None when it has neither."""
    fn = getattr(pool, "clone", None)
    if fn is not None:
        return fn()
    if not all(isinstance(getattr(pool, a, None), dict) for a in _BUFFERS):
        return None
    new = copy.copy(pool)
    for a in _BUFFERS:
        setattr(new, a, {kind: t.clone() for kind, t in getattr(pool, a).items()})
    return new


def _same_layout(a: PoolWriter, b: PoolWriter) -> bool:
    return (type(a) is type(b) and a.device == b.device and all(a.rows(k) == b.rows(k) for k in ("full", "swa"))
            and all(getattr(a, x, None) == getattr(b, x, None) for x in _LAYOUT))


class PoolClasses:
    """The backends of one model side whose pools under test hold the same contents, each class on one
    physical pool (the run's ``pools[backend]`` is its class's). At the start every backend's pool is a fresh
    zeroed pool of one layout, so all are one class; a class splits the moment its members' writes of a step
    differ: the members whose writes are not the first member's get a copy of the pool as it was before the
    step (copy on divergence), then each class takes its own writes once. Pools that cannot be copied stay
    one class per backend."""

    def __init__(self, pools: dict[str, PoolWriter]):
        self.pools = pools
        names = list(pools)
        first = pools[names[0]]
        share = all(pools[n] is first or _same_layout(first, pools[n]) for n in names) and can_copy(first)
        self.of: dict[str, int] = {n: 0 if share else i for i, n in enumerate(names)}
        if share:
            for n in names:
                pools[n] = first
        self._next = len(names)
        self.splits = 0

    def partition(self, signatures: list[tuple[str, tuple]]) -> list[list[str]]:
        """This step's groups, backends in order: members of one class with the same write ``signature``.
        A class whose members' signatures differ splits: every group but its first gets a copy of the pool."""
        by_class: dict[int, dict[tuple, list[str]]] = {}
        for name, sig in signatures:
            by_class.setdefault(self.of[name], {}).setdefault(sig, []).append(name)
        out: list[list[str]] = []
        for cid, groups in by_class.items():
            parts = list(groups.values())
            for names in parts[1:]:
                pool = self._copy(self.pools[names[0]], len(set(self.of.values())) + 1)
                self.splits += 1
                for n in names:
                    self.of[n] = self._next
                    self.pools[n] = pool
                self._next += 1
            out.extend(parts)
        return out

    @staticmethod
    def _copy(pool: PoolWriter, classes: int) -> Optional[PoolWriter]:
        try:
            return clone_pool(pool)
        except (torch.OutOfMemoryError, MemoryError) as e:
            raise PoolSplitError(
                f"the backends' writes diverged into {classes} pool classes, but the copy of the pool for the "
                f"new class does not fit in memory ({type(e).__name__}); lower pool.full_size, or run fewer "
                f"backends, so that one pool per diverging class fits") from e
