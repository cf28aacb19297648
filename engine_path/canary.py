"""SGLang's own KV checker (kv_canary) driven from our run, through its CPU torch references.

The canary keeps a 32-byte shadow record per slot (token, position, a hash chained from the predecessor
slot, optionally a fingerprint of the slot's real bytes) per pool kind; before each forward it verifies the
slots the batch reads (FULL: ``[0, prefix)``; SWA: ``[prefix - window, prefix)`` through ``req_to_token``
and ``full_to_swa``) and after it verifies them again and stamps the slots the batch wrote (``out_cache_loc``, translated for
SWA): its HEAD and TAIL launches. Here both act on one shadow per pool kind (the engine keeps one per
stage; the HEAD buffer's own stamps, taken before the forward wrote the bytes, are not modelled).
:class:`CanaryDriver` does exactly that with the release's own plan, verify and write references
(``launch_canary_plan_kernels_torch_reference``, ``launch_canary_verify_kernel_torch_reference``,
``launch_canary_write_kernel_torch_reference``), over the same ``req_to_token``, ``full_to_swa`` and pool
rows the run's backends use: one shadow per (backend, model side, pool kind), K only, layer 0 of each kind.
It implements ``simulator.core.observe.ForwardObserver``; nothing here models the canary, it is the release's
code. Its sweep of radix-held slots and its token oracle are not driven.

The references live in ``sglang.kernels.ops.kv_canary`` (0.5.22 and later, where the launchers fall back to
them off CUDA) or ``sglang.jit_kernel.kv_canary`` (earlier releases, where they back the kernels' tests and
the launchers have no CPU fallback). A release with neither raises :class:`CanaryAbsent` (one line).
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .errors import EngineError

#: where a release keeps the canary's kernels and their torch references, newest layout first
ROOTS = ("sglang.kernels.ops.kv_canary", "sglang.jit_kernel.kv_canary")
MODES = ("none", "partial", "all")           # RealKvHashMode: default (metadata only), 16 bytes, the whole row
RING = 4096


class CanaryAbsent(EngineError):
    """The active release has no canary torch references to drive."""


@dataclass(frozen=True)
class CanaryRefs:
    """The release's canary modules and references, as found by import."""

    root: str
    version: str
    consts: Any
    verify: Any                  # module: VerifyOrWriteContext, VerifyPlan, RealKvSource, CanaryLaunchTag
    write: Any                   # module: WritePlan
    plan_ref: Any
    verify_ref: Any
    write_ref: Any
    engine_fallback: bool        # the release's own launchers run these references off CUDA (_dispatch)

    def describe(self) -> str:
        how = "the launchers' CPU fallback" if self.engine_fallback else "test references; no CPU fallback in the engine"
        return f"{self.root} ({how})"


def load_references(version: str = "?") -> CanaryRefs:
    """Import the active release's canary references; :class:`CanaryAbsent` naming what was tried."""
    tried = []
    for root in ROOTS:
        try:
            mods = {n: importlib.import_module(f"{root}.{n}") for n in
                    ("consts", "verify", "write", "plan_ref", "verify_ref", "write_ref")}
        except ModuleNotFoundError as e:
            tried.append(f"{root} ({e.name} missing)")
            continue
        try:
            fallback = importlib.util.find_spec(f"{root}._dispatch") is not None
        except ModuleNotFoundError:
            fallback = False
        return CanaryRefs(root, version, mods["consts"], mods["verify"], mods["write"],
                          mods["plan_ref"].launch_canary_plan_kernels_torch_reference,
                          mods["verify_ref"].launch_canary_verify_kernel_torch_reference,
                          mods["write_ref"].launch_canary_write_kernel_torch_reference, fallback)
    raise CanaryAbsent(f"sglang {version}: the canary's torch references are absent (tried "
                       f"{'; '.join(tried)}); the canary cannot be driven in this release")


@dataclass
class Violation:
    step: int
    backend: str
    side: str
    kind: str                    # "full" | "swa"
    stage: str                   # "head" (verify before the forward) | "tail" (write after it)
    slot: int
    position: int
    reasons: tuple[str, ...]

    def to_json(self) -> dict:
        return {"step": self.step, "backend": self.backend, "side": self.side, "kind": self.kind,
                "stage": self.stage, "slot": self.slot, "position": self.position, "reasons": list(self.reasons)}


class _Shadow:
    """One canary buffer (a pool kind of one backend's pool) with its ring and counters."""

    def __init__(self, refs: CanaryRefs, kind: str, rows: int, mode: str, real: Optional[torch.Tensor]):
        c, v = refs.consts, refs.verify
        self.refs, self.kind = refs, kind
        self.buf = torch.zeros((rows, c.CANARY_FIELDS_PER_SLOT * 8), dtype=torch.uint8)
        self.ring = torch.zeros((RING, c.VIOLATION_FIELDS), dtype=torch.int64)
        self.index = torch.zeros(1, dtype=torch.int32)
        hash_mode = c.RealKvHashMode[mode.upper()]
        sources: tuple = ()
        if hash_mode != c.RealKvHashMode.NONE and real is not None:
            width = real.shape[1] * real.element_size()
            sources = (v.RealKvSource(tensor=real, page_size=1, num_bytes_per_token=width, read_bytes=width),)
        tag = "FULL" if kind == "full" else "SWA"
        self.ctx = {stage: v.VerifyOrWriteContext(
            canary_buf=self.buf, kernel_kind=getattr(v.CanaryLaunchTag, f"{stage.upper()}_K_{tag}"),
            violation_ring=self.ring, violation_write_index=self.index,
            slot_run_counter=torch.zeros(1, dtype=torch.int64), kernel_run_counter=torch.zeros(1, dtype=torch.int64),
            real_kv_sources=sources, real_kv_hash_mode=hash_mode,
            enable_chain_position_assert=torch.ones(1, dtype=torch.int32)) for stage in ("head", "tail")}

    def take(self) -> list[tuple[int, int, int]]:
        """(slot, position, reason bits) of the violations since the last call; empties the ring."""
        c = self.refs.consts
        n = min(int(self.index[0]), RING)
        rows = self.ring[:n].tolist()
        self.index.zero_()
        return [(r[c.VIOLATION_FIELD_SLOT_IDX], r[c.VIOLATION_FIELD_POSITION], r[c.VIOLATION_FIELD_FAIL_REASON_BITS])
                for r in rows]


def _raise(e: BaseException) -> None:
    raise e


def _layer0_k(pool: Any, kind: str) -> Optional[torch.Tensor]:
    """Layer 0 of ``kind``'s K buffer as ``[rows, bytes-per-slot]`` (a view of the live pool), if the pool has one."""
    k = getattr(pool, "k", None)
    if not isinstance(k, dict) or kind not in k:
        return None
    t = k[kind][0]
    return t.reshape(t.shape[0], -1)


@dataclass
class _Batch:
    """What the canary's plan and write launches take, built once per (step, side) from the run's view."""

    req_pool_indices: torch.Tensor
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor
    req_to_token: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    verify_total: int


def _batch_inputs(view: Any) -> Optional[_Batch]:
    rq = view.batch.requests
    if rq is None or len(rq.rids) == 0:
        return None
    if view.read_in is not None:
        r2t, seq, ext = (t.detach().cpu().to(torch.int64) for t in view.read_in)
    else:
        r2t = torch.from_numpy(rq.req_to_token())
        seq, ext = torch.from_numpy(rq.seq_lens), torch.from_numpy(rq.extend_lens)
    bs = int(seq.shape[0])
    # req_pool_idx 0 is the engine's padding row: the batch's rows are 1..bs of a table with a zero row first
    table = torch.zeros((bs + 1, max(int(r2t.shape[1]), 1)), dtype=torch.int64)
    table[1:, : r2t.shape[1]] = r2t
    prefix = seq - ext
    tags = torch.from_numpy(view.truth.tags).to(torch.int64)
    if int(ext.sum()) != int(tags.shape[0]):
        return None                  # a batch whose tokens are not the requests' extends in order (not driven)
    positions = torch.cat([torch.arange(int(p), int(s), dtype=torch.int64) for p, s in zip(prefix, seq)])
    loc = torch.from_numpy(view.batch.out_cache_loc[: tags.shape[0]]).to(torch.int64)
    return _Batch(torch.arange(1, bs + 1, dtype=torch.int64), prefix, ext, table, tags, positions, loc,
                  int(prefix.sum()))


@dataclass
class CanaryDriver:
    """The canary over a run, in one hash mode: a ``ForwardObserver`` collecting violations and its cost."""

    refs: CanaryRefs
    mode: str = "none"
    violations: list[Violation] = field(default_factory=list)
    seconds: float = 0.0
    entries_verified: int = 0
    entries_written: int = 0
    forwards: int = 0
    errors: list[str] = field(default_factory=list)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"canary mode {self.mode!r}: one of {', '.join(MODES)}")
        self._shadows: dict[tuple[str, str, str], _Shadow] = {}
        self._pending: Optional[tuple[int, str, _Batch, dict]] = None

    def _shadow(self, view: Any, kind: str) -> _Shadow:
        key = (view.backend, view.side, kind)
        sh = self._shadows.get(key)
        if sh is None:
            sh = self._shadows[key] = _Shadow(self.refs, kind, view.pool.rows(kind), self.mode,
                                              _layer0_k(view.pool, kind))
        return sh

    def _kinds(self, view: Any) -> list[str]:
        return sorted({li.kind for li in view.layers})

    def _plans(self, view: Any, kind: str, b: _Batch):
        v, w = self.refs.verify, self.refs.write
        vp = v.VerifyPlan.allocate(verify_capacity=max(b.verify_total, 1), device=torch.device("cpu"))
        bs = int(b.req_pool_indices.shape[0])
        wp = w.WritePlan(write_offsets=torch.zeros(bs + 1, dtype=torch.int64),
                         write_seed_slot_indices=torch.full((bs,), -1, dtype=torch.int64),
                         write_num_valid_reqs=torch.zeros(1, dtype=torch.int32))
        lut = view.mapping.detach().cpu().to(torch.int64) if kind == "swa" else None
        self.refs.plan_ref(verify_plan_out=vp, write_plan_out=wp, req_pool_indices=b.req_pool_indices,
                           prefix_lens=b.prefix_lens, extend_seq_lens=b.extend_lens, req_to_token=b.req_to_token,
                           swa_window_size=int(view.window or 0) if kind == "swa" else 0,
                           full_to_swa_index_mapping=lut, verify_capacity=max(b.verify_total, 1),
                           req_to_verify_expected_tokens=None, req_to_verify_expected_tokens_valid_lens=None,
                           kv_token_id_vs_position_offset=0)
        return vp, wp, lut

    def _launch(self, view: Any, sh: _Shadow, stage: str, fn, **kw) -> None:
        """One reference launch; what it raises (an index past the canary buffer: on a GPU a device assert)
        is the canary's outcome too, recorded as a violation whose reason names the exception."""
        try:
            fn(**kw)
        except Exception as e:  # the reference's own error is an outcome, never the run's end
            self.violations.append(Violation(view.step, view.backend, view.side, sh.kind, stage, -1, -1,
                                             (f"raised {type(e).__name__}",)))
            self.errors.append(f"step {view.step} {view.backend} {sh.kind} {stage}: {type(e).__name__}: {e}"[:300])
            sh.index.zero_()
            return
        self._collect(view, sh, stage)

    def _collect(self, view: Any, sh: _Shadow, stage: str) -> None:
        reasons = self.refs.consts.FailReason
        for slot, pos, bits in sh.take():
            names = tuple(r.name.lower() for r in reasons if bits & int(r))
            self.violations.append(Violation(view.step, view.backend, view.side, sh.kind, stage, slot, pos, names))

    def before_forward(self, view: Any) -> None:
        """HEAD: verify the slots this forward reads, per pool kind."""
        t0 = time.perf_counter()
        b = _batch_inputs(view)
        self._pending = None
        if b is not None:
            self.forwards += 1
            writes = {}
            for kind in self._kinds(view):
                sh = self._shadow(view, kind)
                try:
                    vp, wp, lut = self._plans(view, kind, b)
                except Exception as e:  # the plan reference refuses an index (an SWA slot past the mapping)
                    self._launch(view, sh, "head", _raise, e=e)
                    continue
                self._launch(view, sh, "head", self.refs.verify_ref, context=sh.ctx["head"], plan=vp,
                             check_verify_expected_token=False)
                self.entries_verified += int(vp.verify_num_valid[0]) if int(vp.enable[0]) else 0
                writes[kind] = (vp, wp, b.out_cache_loc if lut is None else lut[b.out_cache_loc])
            self._pending = (view.step, view.backend, b, writes)
        self.seconds += time.perf_counter() - t0

    def after_forward(self, view: Any) -> None:
        """TAIL: verify the read slots again (what the forward did to them), then stamp the slots it wrote
        (``out_cache_loc``, SWA-translated), their real bytes hashed."""
        if self._pending is None or self._pending[:2] != (view.step, view.backend):
            return
        t0 = time.perf_counter()
        _, _, b, writes = self._pending
        for kind, (vp, wp, loc) in writes.items():
            sh = self._shadow(view, kind)
            self._launch(view, sh, "tail", self.refs.verify_ref, context=sh.ctx["tail"], plan=vp,
                         check_verify_expected_token=False)
            self.entries_verified += int(vp.verify_num_valid[0]) if int(vp.enable[0]) else 0
            self._launch(view, sh, "tail", self.refs.write_ref, context=sh.ctx["tail"], plan=wp,
                         input_ids=b.input_ids, positions=b.positions, out_cache_loc=loc,
                         enable_write_input_assert=False, expected_input_tokens=None, expected_input_positions=None)
            self.entries_written += int(loc.shape[0])
        self.seconds += time.perf_counter() - t0

    def summary(self) -> dict:
        first = self.violations[0].to_json() if self.violations else None
        reasons: dict[str, int] = {}
        for x in self.violations:
            for r in x.reasons:
                reasons[r] = reasons.get(r, 0) + 1
        return {"mode": self.mode, "violations": len(self.violations), "reasons": reasons, "first": first,
                "seconds": round(self.seconds, 4), "forwards": self.forwards,
                "entries_verified": self.entries_verified, "entries_written": self.entries_written,
                "errors": self.errors[:5]}
