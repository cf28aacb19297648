"""The GPU step's verdicts: one device count per group of backends that is zero exactly when the checker would
find nothing, read back in one copy per step; and the oracle's device mirrors they compare against.

:class:`DeviceVerdicts` keeps per (reference, kind, storage dtype) the expected tag-lane words of every slot (a
mirror of the oracle, updated from host words in the step's staged copy), the reserved-slot masks, the static
verdict slots (decode graphs add into theirs at replay) and the static expected slots of each capture size.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from simulator.core.writes import BackendStep
from simulator.oracle.checker import LayerWrite
from simulator.oracle.kvrows import tag_lanes
from simulator.scheduling.batch import BatchTruth

from .check_kernel import verdict
from .plans import target_key
from .staging import Staging, put_rows


class DeviceVerdicts:
    """A runner's verdict slots and oracle mirrors (see the module docstring); ``reads`` counts verdict reads."""

    def __init__(self, staging: Staging) -> None:
        self.staging = staging
        self._exp: dict[tuple, torch.Tensor] = {}        # (id(reference), kind, storage) -> [rows, words]
        self._reserved: dict[tuple, torch.Tensor] = {}   # (id(checker), kind, rows) -> bool [rows]
        self._layers: dict[tuple, torch.Tensor] = {}     # indices of written layers -> device tensor
        self._out: Optional[torch.Tensor] = None         # static verdict slots (decode graphs add into theirs)
        self._zeros: Optional[torch.Tensor] = None       # as many zeros (the slots' zeroing is one of the copies)
        self._slot: dict[tuple, int] = {}                # (side, backend) -> its slot in _out
        self._exp_slots: dict[int, torch.Tensor] = {}    # capture size -> static expected slots (both kinds)
        self._scratch: Optional[torch.Tensor] = None
        #: the mirrors must be made again from the oracle (a step the runner did not make moved it)
        self.stale = False
        #: this step's static expected slots per kind (a graph runner's step), or None
        self.expected: Optional[dict] = None
        #: the step's model side and the run's sides (set at each step's truth phase)
        self.side = None
        self.run_sides = None
        self.reads = 0

    # ------------------------------------------------------------------ the oracle's device mirrors

    def mirror_storages(self, ref) -> list:
        """The storage dtypes of the reference's mirror tables (the words a step's tags need), in table order."""
        rid = id(ref)
        return list(dict.fromkeys(storage for (r, _, storage) in self._exp if r == rid))

    def mirror(self, side, truth: BatchTruth, words: dict, slots: dict) -> None:
        """The expected tag-lane words of the slots this step writes (``words``: per storage dtype, made on
        the host from its tags and staged; empty without tags), in every mirror of its reference."""
        ref = side.reference
        if self.stale:               # in place: decode graphs captured the tables' addresses
            for (rid, kind, storage), table in self._exp.items():
                refs = [m.reference for m in (self.run_sides or ()) if id(m.reference) == rid]
                if refs:
                    table.copy_(tag_lanes(refs[0].expected_on[kind], storage).contiguous().view(torch.int64))
            self.stale = False
        if not truth.tags.size:
            return
        for (rid, kind, storage), table in self._exp.items():
            if rid == id(ref):
                put_rows(table, slots[kind], words[storage])

    def exp_words(self, ref, kind: str, storage: torch.dtype) -> torch.Tensor:
        key = (id(ref), kind, storage)
        t = self._exp.get(key)
        if t is None:     # first use (or after a step of the run's own): from the oracle's device copy
            t = self._exp[key] = tag_lanes(ref.expected_on[kind], storage).contiguous().view(torch.int64)
        return t

    def reserved_mask(self, checker, kind: str, rows: int, dev: torch.device) -> torch.Tensor:
        key = (id(checker), kind, rows)
        t = self._reserved.get(key)
        if t is None:
            r = checker.reserved
            mask = np.zeros(rows, dtype=bool)
            mask[r[(r >= 0) & (r < rows)]] = True
            t = self._reserved[key] = torch.from_numpy(mask).to(dev)
        return t

    def layer_tensor(self, idx: tuple, dev: torch.device) -> torch.Tensor:
        t = self._layers.get(idx)
        if t is None:
            t = self._layers[idx] = torch.tensor(idx, dtype=torch.int64, device=dev)
        return t

    # ------------------------------------------------------------------ the verdicts

    def begin(self, batch, staged: Optional[torch.Tensor], dev) -> list[tuple]:
        """The copies (``(buffer, source)`` pairs, for :func:`_copy_all`: one launch with the step's other int64
        copies) that zero the static verdict slots and, under a graph runner (``staged``:
        :func:`_padded_expected`'s array as staged), put this step's expected slots into the static buffer of
        its capture size."""
        if self._out is None:
            self._out = torch.zeros(256, dtype=torch.int64, device=dev)
            self._zeros = torch.zeros(256, dtype=torch.int64, device=dev)
            self._scratch = torch.zeros(1, dtype=torch.int64, device=dev)
        self.expected = None
        copies = [(self._out, self._zeros)]
        if staged is not None:
            n = batch.padded_len
            buf = self.static_expected(n, dev)
            self.expected = {"full": buf[:n], "swa": buf[n:]}
            copies.append((buf, staged))
        return copies

    def static_expected(self, n: int, dev) -> torch.Tensor:
        """The static expected slots of capture size ``n``: full then SWA, ``n`` each (graphs read their addresses)."""
        buf = self._exp_slots.get(n)
        if buf is None:
            buf = self._exp_slots[n] = torch.full((2 * n,), -1, dtype=torch.int64, device=dev)
        return buf

    def out_slot(self, side, name: str) -> torch.Tensor:
        key = (id(side), name)
        i = self._slot.get(key)
        if i is None:
            i = self._slot[key] = len(self._slot)
            if i >= self._out.shape[0]:
                raise RuntimeError("more (side, backend) pairs than verdict slots")
        return self._out[i:i + 1]

    def graph_verdict(self, s: BackendStep, writes: list[LayerWrite], warm: bool = False) -> bool:
        """Called by a decode graph's capture: the backend's verdict, captured with its writes (it reads the
        static expected slots of the capture size and the graph's targets). ``warm``: the same launch just
        before the capture, into a scratch slot (it makes the tables and compiles the kernel outside the
        capture). False: not captured (the runner launches it, or the checker runs)."""
        if self.side is None or self.expected is None or s.pool is not self.side.pools.get(s.backend):
            return False
        out = self._scratch if warm else self.out_slot(self.side, s.backend)
        return self.verdict(self.side, s.pool, writes, self.expected, out, s.pool.device)

    def launch(self, side, step_slots: dict, leads: list, dev) -> dict[str, bool]:
        """Per group (its first backend's name) whether its verdict decides (its launches made where no decode
        graph made them); False: the exact checker must run."""
        plain: dict[str, bool] = {}
        expected = self.expected
        for p in leads:
            writes = p.writes
            ok = writes is not None and all(w.error is None for w in writes)
            if ok and not p.in_graph:
                if expected is None:
                    expected = step_slots
                ok = self.verdict(side, side.pools[p.name], writes, expected, self.out_slot(side, p.name), dev)
            plain[p.name] = ok
        return plain

    def read(self, side, plain: dict[str, bool]) -> dict[str, Optional[int]]:
        """Per group: None (the exact checker must run) or its verdict; all of them in one read (the step's
        host synchronisation)."""
        if not any(plain.values()):
            return dict.fromkeys(plain)
        host = self._out[:len(self._slot)].cpu().tolist()
        self.staging.synced()          # (the read waited for the step's staged copy too: same stream)
        self.reads += 1
        return {n: host[self._slot[(id(side), n)]] if ok else None for n, ok in plain.items()}

    def verdict(self, side, pool, writes: list[LayerWrite], expected, out, dev) -> bool:
        """Launch the backend's verdict per kind into ``out``; False where only the checker can decide
        (the layers of a kind wrote different targets: its torn-write path)."""
        for kind in ("full", "swa"):
            kw = [w for w in writes if w.kind == kind]
            if not kw:
                continue
            t0 = kw[0].target
            if not all(w.target is t0 for w in kw) and len({target_key(w.target) for w in kw}) != 1:
                return False
            k, v = pool.k[kind], pool.v[kind]
            layers = self.layer_tensor(tuple(w.index for w in kw), dev)
            verdict(k, v, layers, expected[kind], kw[0].target,
                    self.exp_words(side.reference, kind, k.dtype),
                    self.reserved_mask(side.checker, kind, pool.rows(kind), dev), pool.err[kind], out)
        return True
