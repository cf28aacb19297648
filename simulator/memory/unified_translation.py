"""The unified pool's write door: virtual ids translated to each side's physical ids, and marked so.

The scheduler and the design hooks see virtual token ids; a store must only ever see physical ones, since a
virtual id written as physical lands in another token's slot without any error. So translation lives here
with the :class:`PhysicalLoc` mark that a sub-pool checks (:func:`check_physical_write_loc`), and every index
the device would assert on becomes an :class:`OutOfRange` record instead of a crash of the model.

:class:`VirtualToPhysical` is :class:`~simulator.memory.unified_pool.UnifiedPool`'s translation half: it reads
the pool's two page tables (``full.v2p``, ``swa.v2p``) and never changes them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.engine_model.unified import UnifiedBehaviour
from simulator.memory.unified_pages import BufferEnd


@dataclass(frozen=True, slots=True)
class OutOfRange:
    """An index past a table or buffer (the device-side index assert): where, the index, the table's length,
    and the virtual token id that produced it."""

    where: str        # "swa.v2p.bind" | "swa.v2p.translate" | "full.write" | "swa.write" | ...
    index: int
    length: int
    token: int

    def __str__(self) -> str:
        return (f"out_of_range{' (negative)' if self.index < 0 else ''}: {self.where} index {self.index} "
                f"of a table of {self.length} (virtual token {self.token})")


class IndexOutOfRange(IndexError):
    """Raised where the GPU would raise a device-side index assert; carries the :class:`OutOfRange`."""

    def __init__(self, finding: OutOfRange):
        super().__init__(str(finding))
        self.finding = finding


class UnmarkedWriteLoc(TypeError):
    """A write location not marked physical reached a unified pool (0.5.23 ``_check_physical_write_loc``)."""


@dataclass(frozen=True, slots=True)
class PhysicalLoc:
    """Write ids of one sub-pool, marked physical (0.5.23 ``KVWriteLoc.physical``)."""

    pool: str               # "full" | "swa"
    ids: np.ndarray         # physical token ids in that sub-pool
    virtual: np.ndarray     # the virtual ids they were translated from


def check_physical_write_loc(loc, pool: str) -> np.ndarray:
    """The write door: the ids a store may write at, or :class:`UnmarkedWriteLoc`."""
    if not isinstance(loc, PhysicalLoc):
        raise UnmarkedWriteLoc(f"the {pool} sub-pool of a unified pool takes physical write locations only; got an "
                               f"unmarked {type(loc).__name__} (virtual ids written as physical land in the wrong slot)")
    if loc.pool != pool:
        raise UnmarkedWriteLoc(f"a {loc.pool} physical write location handed to the {pool} sub-pool")
    return loc.ids


class VirtualToPhysical:
    """Translation and the write door over a unified pool's page tables (mixed into ``UnifiedPool``, which
    sets the attributes below)."""

    full: BufferEnd
    swa: BufferEnd
    page_size: int
    behaviour: UnifiedBehaviour
    num_virtual_ids: int
    findings: list[OutOfRange]              # out_of_range records (bind, translate, write door)
    full_rows: int
    swa_rows: int

    def _table(self, pool: str) -> np.ndarray:
        return (self.full if pool == "full" else self.swa).v2p

    def translate_kv_loc(self, loc: np.ndarray, pool: str = "full") -> np.ndarray:
        """Virtual token ids -> physical token ids of ``pool``: ``max(v2p[t // ps] * ps + t % ps, 0)``; negative
        ids and pages past the table go to 0, the sink. With U2 the raw lookup escapes (-1 -> -ps .. -1),
        and with U1 an SWA index past the table is recorded and raised."""
        loc = np.asarray(loc, dtype=np.int64)
        p, table = self.page_size, self._table(pool)
        page, off = np.floor_divide(loc, p), np.mod(loc, p)
        if self.behaviour.swa_table_own_size and pool == "swa" and bool((page >= table.shape[0]).any()):
            bad = int(np.flatnonzero(page >= table.shape[0])[0])
            finding = OutOfRange("swa.v2p.translate", int(page[bad]), table.shape[0], int(loc[bad]))
            self.findings.append(finding)
            raise IndexOutOfRange(finding)
        inside = (page >= 0) & (page < table.shape[0])
        raw = table[np.where(inside, page, 0)] * p + off
        if self.behaviour.unclamped_translate:
            return np.where(inside, raw, 0)
        return np.where(inside & (loc >= 0), np.maximum(raw, 0), 0)

    def physical_full_to_swa(self) -> np.ndarray:
        """Per *physical* full slot, the SWA physical slot of the same virtual token (0: none; the last
        entry the -1 sentinel): the static pool's ``full_to_swa`` in physical terms, what the design hooks
        of a forward whose ``out_cache_loc`` was bound physical translate through (the plan's SWA ids)."""
        p = self.page_size
        out = np.zeros(self.full_rows + 1, dtype=np.int64)
        out[-1] = -1
        bound = np.flatnonzero(self.full.v2p[1:] > 0) + 1
        if self.behaviour.swa_table_own_size:
            bound = bound[bound < self.swa.v2p.shape[0]]
        if bound.size:
            offs = np.arange(p, dtype=np.int64)
            virt = (bound[:, None] * p + offs).ravel()
            phys = (self.full.v2p[bound][:, None] * p + offs).ravel()
            out[phys] = self.translate_kv_loc(virt, "swa")
        return out

    @property
    def full_to_swa(self) -> np.ndarray:
        """A view like HybridAllocator's mapping: per virtual token id, its SWA physical slot (0: none)."""
        ids = np.arange(self.num_virtual_ids * self.page_size, dtype=np.int64)
        if self.behaviour.swa_table_own_size:
            ids = ids[: self.swa.v2p.shape[0] * self.page_size]
        out = self.translate_kv_loc(ids, "swa")
        return np.concatenate([out, np.asarray([-1], dtype=np.int64)])

    def write_loc(self, virtual_loc: np.ndarray, pool: str) -> PhysicalLoc:
        """The forward's write ids for ``pool``, marked physical; a negative or past-the-buffer id is
        recorded as an :class:`OutOfRange` finding (the store would index out of bounds)."""
        virtual_loc = np.asarray(virtual_loc, dtype=np.int64)
        ids = self.translate_kv_loc(virtual_loc, pool)
        rows = self.full_rows if pool == "full" else self.swa_rows
        bad = np.flatnonzero((ids < 0) | (ids >= rows))
        if bad.size:
            self.findings.append(OutOfRange(f"{pool}.write", int(ids[bad[0]]), rows, int(virtual_loc[bad[0]])))
        return PhysicalLoc(pool, ids, virtual_loc.copy())
