"""The checker: compare the pool under test with the reference after each step, and explain.

Per (step, backend, sub-pool) it reads back, in one gather over every layer of the kind, the tags at
the slots that matter this step: the slots the reference expects written, and the slots the writes
actually targeted. Equal everywhere is the fast path. Findings come from three places:

* a failed write (the store raised a length mismatch, or the design's hook failed): one finding per
  write, from ``LayerWrite.error_class``; its layer is left out of the comparison;
* the store's out-of-range count: one ``out_of_range`` finding per offending index;
* per-token consistency: every layer of a kind must write a token at the same slot. When the layers'
  targets differ for a token (a design that re-translates per layer from a mapping that changed mid-
  forward: W5), one ``torn_write`` per (token, kind) names the layer groups and their slots and the
  slot the token owns; the layers that missed that slot are reported by the slot rules as well;
* a slot whose tag differs: classified by :data:`SLOT_RULES`, the first rule that matches.

Reads are checked apart from writes (:meth:`Checker.check_reads`): the slots a forward's attention reads,
from the read table the backend built at metadata init, against the reference's ownership at the time of
the read: the table must read exactly what a correct one reads (the whole prefix; for SWA layers each new
token's window, to the position: :mod:`simulator.oracle.read_rules`), and every entry must be live and hold
the expected content key of its (request, position). A difference (an entry outside that span, a position of
it left out, a slot not holding its key) is a ``stale_read``, its reason from :data:`READ_RULES`. Layers of a
kind that read through one table are checked once for all of them (per-layer contents are the write check's
concern).

A new finding class is a name in ``records.FINDING_CLASSES`` plus, for a slot class, a rule here.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from simulator.scheduling.batch import BatchRequests, BatchTruth, ContentKeys
from simulator.designs.types import ReadIds
from simulator.memory.pool import PoolWriter
from simulator.records import FINDING_CLASSES, PAD_TAG, Finding, Owner
from simulator.oracle.reference import ReferencePool
# (the read rules live in read_rules; their names are the checker's too)
from simulator.oracle.read_rules import (READ_RULES, ReadFacts, ReadSpan, TableCheck, prefix_span,  # noqa: F401
                                         read_reason, window_span)


@dataclass(slots=True)
class LayerWrite:
    """One layer's store call at a backend boundary, as the checker needs it."""

    layer: int
    kind: str
    index: int                       # layer index inside its sub-pool
    target: Optional[torch.Tensor]   # the indices handed to the store (None if nothing was stored)
    error: Optional[str]             # why nothing was stored: the store's or the design hook's error text
    error_class: str = "length_mismatch"   # the finding class of ``error``: length_mismatch | design_error


@dataclass(frozen=True, slots=True)
class SlotFacts:
    """What the checker knows about one differing slot of one layer, for the rules below."""

    live: bool                       # the reference holds a live token there
    evicted: bool                    # freed by out-of-window eviction (SWA), not by a finish
    expected: bool                   # a real token of this step should have been written there
    went: Optional[int]              # where that token's row was sent (None: not written or not expected)
    slot: int
    pad_slots: tuple[int, ...]


#: Slot classification: (class, message or None when the rule does not apply); the first match wins.
SLOT_RULES: tuple[tuple[str, Callable[[SlotFacts], Optional[str]]], ...] = (
    ("evicted_slot", lambda f: None if f.live else f"write into a {'evicted' if f.evicted else 'freed'} slot"),
    ("clobbered", lambda f: None if f.expected else "a live slot was overwritten"),
    ("clobbered", lambda f: "the row was written here, then overwritten" if f.went == f.slot else None),
    ("padding_slot", lambda f: f"the token's row was sent to padding slot {f.went}" if f.went in f.pad_slots
     else None),
    ("missed", lambda f: "the token's row was not written" if f.went is None else f"the token's row went to slot {f.went}"),
)


def classify_slot(facts: SlotFacts) -> tuple[str, str]:
    for cls, rule in SLOT_RULES:
        msg = rule(facts)
        if msg is not None:
            return cls, msg
    raise AssertionError("SLOT_RULES end with a rule that always matches")


def _span(layers: list[int]) -> str:
    return f"layer {layers[0]}" if len(layers) == 1 else "layers " + ", ".join(map(str, layers))


class _Targets:
    """The distinct index tensors of a step's writes (layers usually share one), copied to the host lazily."""

    def __init__(self, writes: list[LayerWrite]):
        self.distinct: dict[tuple, torch.Tensor] = {}
        self.key_of: dict[int, tuple] = {}
        self.host: dict[tuple, np.ndarray] = {}
        for w in writes:
            t = w.target
            key = (t.data_ptr(), t.shape[0], t.stride(0), t.dtype)
            self.distinct.setdefault(key, t)
            self.key_of[w.index] = key

    def on_host(self, index: int) -> np.ndarray:
        key = self.key_of[index]
        if key not in self.host:
            self.host[key] = self.distinct[key].to("cpu").numpy().astype(np.int64, copy=False)
        return self.host[key]


class Checker:
    def __init__(self, reference: ReferencePool, owner_of: Callable[[int], Owner], reserved: np.ndarray,
                 max_detail: int = 100_000, pool_layers: Optional[dict[str, int]] = None,
                 reserved_words: str = "the sink / padding slot", null_block: Optional[np.ndarray] = None):
        self.reference = reference
        # slots of a null block (vLLM's block 0): compared like any slot; a write there is named so
        self.null_block = null_block if null_block is not None and null_block.size else None
        self.reserved_words = reserved_words
        # layers per sub-pool of the pool under test, when it holds more than the layers written (a draft
        # model's pool laid out like the target's); None: every layer of a kind is written every step
        self.pool_layers = pool_layers
        self.owner_of = owner_of
        self.reserved = reserved            # slots of the reserved/padding page(s): never compared
        reference.reserve(reserved)         # (and never read: a read there is stale)
        self.max_detail = max_detail
        self.detailed = 0
        self.truncated = False
        self.first: dict[str, Finding] = {}   # per backend, the earliest (step, layer) finding
        self._reserved_dev: dict[torch.device, torch.Tensor] = {}
        self._last_read: dict[str, tuple] = {}    # per kind: (key, result) of the last read check
        self._tables = TableCheck(reference, reserved, owner_of, reserved_words)

    def check(self, step: int, backend: str, pool: PoolWriter, truth: BatchTruth, writes: list[LayerWrite],
              pad_slots: tuple[int, ...]) -> tuple[list[Finding], dict[str, int]]:
        """Findings of one (step, backend), and counts by class (complete even when details are capped)."""
        return self.emit_all(self.collect(step, backend, pool, truth, writes, pad_slots))

    def collect(self, step: int, backend: str, pool: PoolWriter, truth: BatchTruth, writes: list[LayerWrite],
                pad_slots: tuple[int, ...]) -> list[Finding]:
        """The findings :meth:`check` emits, in its order, not yet emitted: a backend whose pool and writes are
        another's (a shared pool) takes the same list with its own name (:meth:`emit_all`)."""
        found: list[Finding] = []
        for kind in ("full", "swa"):
            kw = [w for w in writes if w.kind == kind]
            if kw:
                self._check_kind(step, backend, kind, pool, truth, kw, pad_slots, found.append)
        return found

    def design_error(self, step: int, backend: str, kind: str, text: str) -> tuple[list[Finding], dict[str, int]]:
        """The one finding of a forward whose per-forward design hook failed (its writes were skipped)."""
        findings: list[Finding] = []
        counts = dict.fromkeys(FINDING_CLASSES, 0)
        self._emit(findings, counts, Finding(step, backend, -1, kind, "design_error", -1, None, None, text))
        return findings, counts

    def check_reads(self, step: int, backend: str, kind: str, ids: ReadIds, requests: BatchRequests,
                    content_keys: Optional[ContentKeys], rows: int, layer: int, n_layers: int,
                    skip: Optional[np.ndarray] = None,
                    span: Optional[ReadSpan] = None) -> tuple[list[Finding], np.ndarray]:
        """The stale reads of one kind's read table against the reference as it is now (not yet emitted:
        :meth:`emit_all`), and the flat entries found stale. ``layer`` is the first layer reading the table,
        ``n_layers`` how many layers read it; entries in ``skip`` were reported at an earlier check of the
        same table. ``span``: the positions a correct table reads (:func:`prefix_span`, :func:`window_span`),
        exactly: an entry outside it is stale whatever its slot holds, and at the table's first check (``skip``
        None) each position of it that the table leaves out is one stale read too (slot -1); None (a table of
        the base formula, or the part of one not known clean: exact by construction) holds the entries to the
        request's positions alone. An entry at a position the request does not have (past its seq_len) is stale
        and never asks the content keys. One vectorised pass over every request's entries; only differences
        reach Python. A table object checked last against the same ownership (another backend of the step
        sharing it) is not checked again: its findings are the earlier ones, for this backend."""
        sk = None if span is None else (span.name, span.window)
        key = (ids, content_keys, requests, (kind, self.reference.epoch, rows, layer, n_layers, sk))
        last = self._last_read.get(kind)
        if skip is None and last is not None and all(x is y for x, y in zip(last[0][:3], key[:3])) \
                and last[0][3] == key[3]:
            found, bad = last[1]
            return [dataclasses.replace(f, backend=backend) for f in found], bad
        found, bad = self._tables.check(step, backend, kind, ids, requests, content_keys, rows, layer, n_layers,
                                        skip, span)
        if skip is None:
            self._last_read[kind] = (key, (found, bad))
        return found, bad

    def check_contents(self, step: int, backend: str, kind: str, pool: PoolWriter, slots: np.ndarray, layers,
                       seen: set, sweep: bool = False, tags: Optional[np.ndarray] = None) -> list[Finding]:
        """The content check (under --inject): the pool under test's rows at ``slots`` (a forward's read set,
        or every live slot at the end-of-run sweep) against the reference, one gather over every layer of the
        kind. A live slot whose K or V does not carry its owner's tag is a ``stale_read`` (attention would read
        another row than the token's), one per (slot, owner), at the first differing layer; not live, reserved
        and out-of-range entries are the read check's."""
        rows = pool.rows(kind)
        live = self.reference.live[kind]
        freed = tags is not None
        if tags is None:      # the read set / the sweep: live slots against the reference
            slots = slots[(slots >= 0) & (slots < min(rows, live.shape[0]))]
            slots = slots[live[slots] & ~np.isin(slots, self.reserved)]
            tags = self.reference.expected[kind][slots]
        else:                 # slots freed since the last step, against their last owner (``tags``)
            keep = (tags != 0) & ~np.isin(slots, self.reserved)
            slots, tags = slots[keep], tags[keep]
        if slots.size == 0:
            return []
        st = torch.from_numpy(slots).to(pool.device)
        diff = pool.mismatches(kind, st, torch.from_numpy(np.ascontiguousarray(tags)).to(pool.device))
        if not bool(diff.any()):
            return []
        by_index = {li.index: li.layer for li in layers if li.kind == kind}
        li, ci = (x.cpu().numpy() for x in torch.nonzero(diff, as_tuple=True))
        out = []
        firsts: dict[int, int] = {}
        for l_i, c_i in zip(li.tolist(), ci.tolist()):
            firsts[c_i] = min(firsts.get(c_i, l_i), l_i)
        for c_i in sorted(firsts):
            slot, l_i = int(slots[c_i]), firsts[c_i]
            tag = int(tags[c_i])
            if (kind, slot, tag) in seen:
                continue
            seen.add((kind, slot, tag))
            ktags, vtags = pool.read_tags(kind, torch.tensor([slot], dtype=torch.int64, device=pool.device))
            kt, vt = int(ktags[l_i, 0]), int(vtags[l_i, 0])
            obs = kt if kt != tag else vt
            half = "K" if kt != tag else "V"
            layer = by_index.get(l_i, -1)
            where = "the end-of-run sweep" if sweep else "the read set" if not freed else "a freed slot"
            out.append(Finding(step, backend, layer, kind, "stale_read", slot, self._owner(tag), self._owner(obs),
                               f"content check ({where}): {kind} slot {slot} layer {layer} {half} holds "
                               f"{self._owner(obs).label}, not its owner's row"))
        return out

    def emit_all(self, found: list[Finding]) -> tuple[list[Finding], dict[str, int]]:
        """Emit findings made apart from :meth:`check` (reads); counts by class."""
        findings: list[Finding] = []
        counts = dict.fromkeys(FINDING_CLASSES, 0)
        for f in found:
            self._emit(findings, counts, f)
        return findings, counts

    # ------------------------------------------------------------------ internals

    def _emit(self, findings: list[Finding], counts: dict[str, int], f: Finding) -> None:
        counts[f.cls] += 1
        first = self.first.get(f.backend)
        if first is None or (f.step, f.layer) < (first.step, first.layer):
            self.first[f.backend] = f
        if self.detailed < self.max_detail:
            findings.append(f)
            self.detailed += 1
        else:
            self.truncated = True

    def _reserved_on(self, device: torch.device) -> torch.Tensor:
        t = self._reserved_dev.get(device)
        if t is None:
            t = self._reserved_dev[device] = torch.from_numpy(self.reserved).to(device)
        return t

    def _owner(self, tag: int) -> Owner:
        return self.owner_of(int(tag))

    def _check_kind(self, step, backend, kind, pool, truth, writes, pad_slots, emit) -> None:
        ok = self._failed_writes(step, backend, kind, writes, emit)
        oor = pool.take_out_of_range(kind)
        if not ok:
            return
        targets = _Targets(ok)
        self._out_of_range(step, backend, kind, pool, truth, ok, targets, oor, emit)
        if len(targets.distinct) > 1:
            self._torn(step, backend, kind, truth, ok, targets, emit)
        diff = self._differences(kind, pool, truth, ok, len(writes), targets)
        if diff is not None:
            self._explain(step, backend, kind, pool, truth, ok, targets, pad_slots, diff, emit)

    def _failed_writes(self, step, backend, kind, writes, emit) -> list[LayerWrite]:
        """One finding per write that stored nothing (its class from the write); the stored ones."""
        ok = []
        for w in writes:
            if w.error is None:
                ok.append(w)
            else:
                emit(Finding(step, backend, w.layer, kind, w.error_class, -1, None, None, w.error))
        return ok

    def _out_of_range(self, step, backend, kind, pool, truth, ok, targets, oor, emit) -> None:
        """The store skipped and counted out-of-range indices (device error buffer): name each position."""
        rows, skip, real = pool.rows(kind), pool.skip_index, truth.tags.shape[0]
        for w in ok:
            if int(oor[w.index, 0]) == 0:
                continue
            tgt = targets.on_host(w.index)
            bad = ((tgt < 0) | (tgt >= rows)) & (tgt != skip if skip is not None else True)
            n_bad = int(np.count_nonzero(bad))
            if n_bad != int(oor[w.index, 0]):
                raise RuntimeError(f"store error buffer counted {int(oor[w.index, 0])} out-of-range indices at "
                                   f"step {step} {backend} layer {w.layer}, the host sees {n_bad}")
            for pos in np.flatnonzero(bad):
                tag = int(truth.tags[pos]) if pos < real else PAD_TAG
                emit(Finding(step, backend, w.layer, kind, "out_of_range", int(tgt[pos]), self._owner(tag), None,
                             f"index {int(tgt[pos])} at position {int(pos)} is outside [0, {rows})"))

    def _torn(self, step, backend, kind, truth, ok, targets, emit) -> None:
        """Tokens whose layers of this kind wrote different slots: compared on the device across the distinct
        targets (layers usually share one, and then this is never called); only torn tokens reach Python."""
        real = truth.tags.shape[0]
        n = min(real, *(t.shape[0] for t in targets.distinct.values()))
        if n == 0:
            return
        keys = list(targets.distinct)
        stacked = torch.stack([targets.distinct[k][:n].to(torch.int64) for k in keys])
        torn = (stacked != stacked[:1]).any(dim=0)
        if not bool(torn.any()):
            return
        rows = torch.nonzero(torn).flatten().cpu().tolist()
        per_key = stacked[:, rows].cpu().numpy()
        col = {k: i for i, k in enumerate(keys)}
        owned = truth.full_slots if kind == "full" else truth.swa_slots
        for j, row in enumerate(rows):
            groups: dict[int, list[int]] = {}
            for w in ok:
                groups.setdefault(int(per_key[col[targets.key_of[w.index]], j]), []).append(w.layer)
            first_slot = int(per_key[col[targets.key_of[ok[0].index]], j])
            late = next(w for w in ok if int(per_key[col[targets.key_of[w.index]], j]) != first_slot)
            own = int(owned[row])
            parts = "; ".join(f"{_span(ls)} wrote slot {slot}" for slot, ls in groups.items())
            tag = int(truth.tags[row])
            msg = (f"torn write: the token's {kind} layers wrote different slots: {parts}; "
                   f"it owns slot {own}")
            emit(Finding(step, backend, late.layer, kind, "torn_write",
                         int(per_key[col[targets.key_of[late.index]], j]), self._owner(tag), None, msg))

    def _differences(self, kind, pool, truth, ok, n_writes, targets):
        """(layer rows, candidate slots, diff mask) where pool and reference differ, or None (the fast path)."""
        rows = pool.rows(kind)
        expected_slots = truth.full_slots if kind == "full" else truth.swa_slots
        dev = pool.device
        # the slots to compare, on the device: expected writes and in-range targets, minus reserved slots
        parts = [torch.from_numpy(expected_slots).to(dev)] + [t.to(torch.int64) for t in targets.distinct.values()]
        cand_t = torch.unique(torch.cat(parts))
        cand_t = cand_t[(cand_t >= 0) & (cand_t < rows) & ~torch.isin(cand_t, self._reserved_on(dev))]
        if cand_t.numel() == 0:
            return None
        idx = [w.index for w in ok]
        all_layers = (len(idx) == n_writes and idx == list(range(len(idx)))
                      and (self.pool_layers is None or self.pool_layers.get(kind) == len(idx)))
        diff = pool.mismatches(kind, cand_t, self.reference.expected_on[kind][cand_t], None if all_layers else idx)
        return (idx, cand_t, diff) if bool(diff.any()) else None

    def _explain(self, step, backend, kind, pool, truth, ok, targets, pad_slots, found, emit) -> None:
        """The slow path: only now do the differing entries (and the targets) cross to the host."""
        idx, cand_t, diff = found
        rows, skip = pool.rows(kind), pool.skip_index
        expected_slots = truth.full_slots if kind == "full" else truth.swa_slots
        li, ci = (x.cpu().numpy() for x in torch.nonzero(diff, as_tuple=True))
        cand = cand_t.cpu().numpy()
        observed = self._observed(kind, pool, cand, idx, li, ci)
        live = self.reference.live[kind]
        evicted = self.reference.evicted if kind == "swa" else None
        # row of each expected slot (unique within a step unless the scheduler handed one slot to two tokens)
        order = np.argsort(expected_slots, kind="stable")
        sorted_slots = expected_slots[order]
        for l_i, c_i, obs in zip(li.tolist(), ci.tolist(), observed.tolist()):
            w = ok[l_i]
            slot = int(cand[c_i])
            j = np.searchsorted(sorted_slots, slot)
            expected = bool(j < sorted_slots.size and sorted_slots[j] == slot)
            if expected and j + 1 < sorted_slots.size and sorted_slots[j + 1] == slot and \
                    obs in truth.tags[order[j:np.searchsorted(sorted_slots, slot, side="right")]]:
                # two tokens of this step own one slot (a double hand-out: R3's): one store's duplicate indices
                # land in either order on a GPU (the reference keeps the later); what the slot holds is one of
                # the step's writes to it, and the loss of the other shows at its reads (stale_read)
                continue
            went = None
            if expected and live[slot]:
                row, tgt = int(order[j]), targets.on_host(w.index)
                went = int(tgt[row]) if row < tgt.shape[0] else None
                if went is not None and (went < 0 or went >= rows) and went != skip:
                    continue  # reported as out_of_range
            facts = SlotFacts(live=bool(live[slot]), evicted=bool(evicted is not None and evicted[slot]),
                              expected=expected, went=went, slot=slot, pad_slots=pad_slots)
            cls, msg = classify_slot(facts)
            if self.null_block is not None and not facts.live and bool(np.isin(slot, self.null_block)):
                msg = f"write {self.reserved_words}, which nothing may write"
            expected_owner = self._owner(int(self.reference.expected[kind][slot])) if facts.live else None
            emit(Finding(step, backend, w.layer, kind, cls, slot, expected_owner, self._owner(obs), msg))

    def _observed(self, kind, pool, cand, idx, li, ci) -> np.ndarray:
        """The tag each differing (layer, slot) holds: K's where K differs from the reference, else V's."""
        cols = np.unique(ci)
        ktags, vtags = pool.read_tags(kind, torch.from_numpy(cand[cols]).to(pool.device))
        col_of = np.searchsorted(cols, ci)
        rows_i = np.asarray(idx)[li]
        kt = ktags.cpu().numpy()[rows_i, col_of]
        vt = vtags.cpu().numpy()[rows_i, col_of]
        exp_np = self.reference.expected[kind][cand]
        return np.where(kt != exp_np[ci], kt, vt)
