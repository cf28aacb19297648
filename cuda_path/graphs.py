"""Real CUDA graphs for the write path, as serving engines run it.

* **Decode graphs.** For each (backend, decode capture size) the whole write step (every layer's write
  location from the design, the layer stamp of the K/V rows, the Triton store) is captured once into a
  ``torch.cuda.CUDAGraph`` and replayed for every later batch of that padded size. The layers of a kind
  that got the same target are one grouped store in the graph (each row stamped for its layer: the bytes
  a store per layer leaves), so a replay launches a few dozen nodes, not one store per layer. The graph reads the backend's static ``out_cache_loc`` and SWA-location buffers, which the
  backend's metadata init refreshes before each replay exactly as the design says (the step runner runs
  it on host copies and copies the buffers over before the replay): so the ``sglang-pre-24743`` stale
  tail corrupts live slots on the real GPU.
* **Piecewise graphs.** For each token capture size a small non-attention piece (the K/V
  projection: tags -> K/V rows, with the layer id as a static input) is captured; per layer it is
  replayed and the write then runs eagerly, between pieces, on the locations the layer sees
  (narrowed to the real token count). So B1 runs through real piecewise graphs.

The first batch of a new capture size runs eagerly, with the stores the graph will hold (that is the
warm-up: Triton kernels compile, nothing is captured while the pool is written); the graph is captured right after it. A step whose
writes raise at capture (a length mismatch) is never captured and always runs eagerly, so its error
is still recorded at every layer.

Boundary observations of a replayed graph carry the replay's start and end time, divided evenly
between its layers (a graph replay has no per-layer host timestamps).
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Optional

import torch

from simulator.core.eager import EagerExecutor
from simulator.core.observe import BackendRows, EvenlyTimed, boundary_sink
from simulator.core.writes import BackendStep, loc_shapes, prepare_write, rows_for
from simulator.designs.base import declared
from simulator.memory.pool import KVLengthMismatch
from simulator.oracle.checker import LayerWrite
from simulator.oracle.kvrows import TAG_LANES, encode_rows
from simulator.records import PAD_TAG

from .pool import TaggedKVPool
from .step import GpuStepRunner


def _layer_free(design) -> bool:
    """The design's ``make_write_loc`` is declared ``layer_free`` (simulator.designs.base.declare)."""
    return declared(design.make_write_loc, "layer_free")


@contextlib.contextmanager
def _capturing():
    """Around a capture: torch's sync debug mode off (a capture is a one-off; bench/gpu_step.py counts the
    steps' synchronisations, not the captures')."""
    mode = torch.cuda.get_sync_debug_mode()
    if mode:
        torch.cuda.set_sync_debug_mode(0)
    try:
        yield
    finally:
        if mode:
            torch.cuda.set_sync_debug_mode(mode)


@contextlib.contextmanager
def _graph_capture(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream):
    """``torch.cuda.graph(graph, stream=stream, capture_error_mode="relaxed")`` without the flushes of the
    device's and the pinned host memory's caches it makes before every capture: a run captures a graph per
    backend class and capture size (14 on the scale run), and the flushes cost it about 30 ms on the H200
    (cudaFree now, cudaMalloc again at the next steps' allocations). Like it: synchronise, then capture on
    ``stream`` into the graph's own memory pool, ended also where the body raises."""
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="relaxed")
        try:
            yield graph
        finally:
            graph.capture_end()


class _NotCaptured(Exception):
    """A design hook failed while the step was being captured: the step stays eager."""


@dataclass
class _DecodeGraph:
    graph: torch.cuda.CUDAGraph
    write_locs: list            # KVWriteLoc per layer, captured views of the static buffers
    targets: list               # the tensors each layer's store reads at replay
    rows: dict                  # kind -> (k, v) row buffers made in the graph from the static tags
    writes: tuple               # the LayerWrite log of a replay (the same every replay)
    observed: tuple             # per layer the boundary observation's (layer, loc_len, swa_len, dtypes)
    verdict: bool               # the step runner's verdict is in the graph
    pool: object                # the pool its stores write (held: its id is part of the graph's key)


class _StaticTags:
    """A static tags buffer graphs read, filled as ``buf.copy_(pad_tags(tags, len(buf)))`` leaves it: the step's
    tags, then PAD_TAG. One copy where the rows past the step's tags hold PAD_TAG from the last fill already
    (``real``: the rows of tags the last fill wrote; None: the rest unknown)."""

    __slots__ = ("buf", "real")

    def __init__(self, buf: torch.Tensor):
        self.buf, self.real = buf, None

    def fill(self, tags: torch.Tensor) -> None:
        n = self.buf.shape[0]
        m = min(n, tags.shape[0])
        if m:
            self.buf[:m].copy_(tags[:m])
        if self.real is None:
            self.buf[m:].fill_(PAD_TAG)
        elif self.real > m:
            self.buf[m:self.real].fill_(PAD_TAG)
        self.real = m


@dataclass
class _Piece:
    graph: torch.cuda.CUDAGraph
    tags: _StaticTags           # static input [capture]
    layer: torch.Tensor         # static input: layer id (float32 scalar)
    k: torch.Tensor             # static outputs [capture, heads, dim]
    v: torch.Tensor


#: the piecewise pieces of a process (see CudaGraphExecutor._pieces)
_PIECES: dict[tuple, _Piece] = {}


class CudaGraphExecutor:
    """A :class:`simulator.core.eager.LayerExecutor` that runs decode and piecewise batches in CUDA graphs."""

    def __init__(self) -> None:
        self.eager = EagerExecutor()
        self._decode: dict[tuple[str, int, int], Optional[_DecodeGraph]] = {}
        # (capture size, kind, geometry): shared by backends, and by the runs of a process (a piece reads
        # and writes only its own static buffers, like an engine's graphs captured once at start-up)
        self._pieces: dict[tuple, _Piece] = _PIECES
        self.replays = 0
        self.captures = 0
        self.piece_replays = 0
        self.grouped_stores = 0
        self.steps = None               # the GpuStepRunner, made at the first CUDA step
        self.verdict_in_graph = False   # the last decode replay added the backend's verdict
        self._tags: dict[int, _StaticTags] = {}    # capture size -> static tags of the decode graphs

    def run(self, s: BackendStep) -> list[LayerWrite]:
        pool = s.pool
        if pool.device.type != "cuda" or getattr(pool, "store_impl", None) != "triton" or s.interleaved:
            return self.eager.run(s)     # no graph: not the Triton store on cuda, or writes land between layers
        if s.write_fault is not None:
            return self.eager.run(s)     # --inject: each layer's store goes through the injector (a replay cannot)
        if s.batch.graph == "decode_graph":
            return self._run_decode(s)
        if s.batch.graph == "piecewise":
            return self._run_piecewise(s)
        return self._run_grouped(s, {})

    @property
    def stepwise(self):
        """The whole-step executor (cuda_path.step.GpuStepRunner) of CUDA runs on Triton-store pools, made on first
        use; the pipeline asks it to take each step."""
        if self.steps is None:
            # a proxy: no reference cycle, so a finished run's graphs are freed at once, never by a
            # garbage collection that could fall inside a later capture
            self.steps = GpuStepRunner(weakref.proxy(self), require_cuda=True, pool_type=TaggedKVPool)
        return self.steps

    # ------------------------------------------------------------------ decode graphs

    def _run_decode(self, s: BackendStep) -> list[LayerWrite]:
        self.verdict_in_graph = False
        # the pool too: a backend whose class split (cuda_path/step.py) writes another pool from then on
        key = (s.backend, s.batch.padded_len, id(s.pool))
        if key not in self._decode:
            # warm-up on real data, with the launches the graph will capture (their kernels compile, the
            # grouped stores' tables are made); nothing captured yet
            writes = self._run_grouped(s, {})
            self._decode[key] = None if any(w.error for w in writes) else self._capture_decode(s)
            return writes
        g = self._decode[key]
        if g is None or g.pool is not s.pool:
            return self.eager.run(s)
        self._fill_tags(s)
        t0 = s.now()
        g.graph.replay()                 # no host sync: the step's verdict read waits for it
        t1 = s.now()
        self.replays += 1
        self.verdict_in_graph = g.verdict
        per = (t1 - t0) // max(len(s.layers), 1)
        # (each row made when read: an observer that reads only some of them makes only those)
        boundary_sink(s.observer)(BackendRows((s.batch.step, s.backend), EvenlyTimed(g.observed, t0, per)))
        return list(g.writes)

    def _tags_buffer(self, s: BackendStep) -> _StaticTags:
        """The static tags of a capture size: every backend's decode graph of that size reads them."""
        return self._tags_of(s.meta.rows, s.pool.device)

    def _tags_of(self, n: int, device: torch.device) -> _StaticTags:
        got = self._tags.get(n)
        if got is None:
            got = self._tags[n] = _StaticTags(torch.full((n,), PAD_TAG, dtype=torch.int64, device=device))
        return got

    def _fill_tags(self, s: BackendStep) -> None:
        """This step's tags into the static buffer, once per step (the first backend's replay; none where the
        step runner's copy filled them: :meth:`decode_tags_copy`)."""
        key = ("decode-tags", s.meta.rows)
        if key not in s.rows_cache:
            s.rows_cache[key] = True
            self._tags_buffer(s).fill(s.tags)

    def decode_tags_copy(self, n: int, m: int, padded: torch.Tensor, rows_cache: dict) -> list[tuple]:
        """For the step runner's one copy launch (cuda_path/step.py): the copy that fills the static tags of
        capture size ``n`` as :meth:`_StaticTags.fill` leaves them (``padded``: the step's ``m`` tags then
        PAD_TAG, on the device), as a (buffer, source) pair; this step's replays of that size then fill nothing."""
        static = self._tags_of(n, padded.device)
        static.real = m
        rows_cache[("decode-tags", n)] = True
        return [(static.buf, padded)]

    def _capture_decode(self, s: BackendStep) -> Optional[_DecodeGraph]:
        """The whole write step of one backend at one capture size: K/V rows from the static tags (the
        projection), per layer the design's write location, the layer stamp and the Triton store; then, with
        the step runner, the backend's verdict (cuda_path/step.py) into its static slot."""
        n = s.meta.rows
        write_locs, targets = [], []
        # shapes first: a step whose stores would raise, or whose design fails, is not captured
        planned = []
        for layer in s.layers:
            w = prepare_write(s, layer)
            if isinstance(w, LayerWrite) or w[1].shape[0] != n:
                return None
            planned.append(LayerWrite(layer.layer, layer.kind, layer.index, w[1], None))
        if self.steps is not None:
            self.steps.graph_verdict(s, planned, warm=True)     # its tables and kernel, outside the capture
        static = self._tags_buffer(s)
        static.fill(s.tags)
        tags = static.buf
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        verdict = False
        try:
            with _capturing(), _graph_capture(graph, stream):
                rows = {kind: s.pool.make_rows(tags, next(l.layer for l in s.layers if l.kind == kind), kind)
                        for kind in dict.fromkeys(l.kind for l in s.layers)}
                prepared, groups = _prepare_layers(s)
                for w in prepared:
                    if isinstance(w, LayerWrite):
                        raise _NotCaptured(w.error)
                for (kind, *_), members in groups.items():     # the layers that share a target: one store
                    _store_group(s, kind, members, prepared[members[0]][1], *rows[kind])
                writes = []
                for layer, (wl, target) in zip(s.layers, prepared):
                    write_locs.append(wl)
                    targets.append(target)
                    writes.append(LayerWrite(layer.layer, layer.kind, layer.index, target, None))
                if self.steps is not None:
                    verdict = self.steps.graph_verdict(s, writes)
        except (KVLengthMismatch, _NotCaptured):
            return None
        torch.cuda.current_stream().wait_stream(stream)
        self.captures += 1
        observed = [(layer.layer, *loc_shapes(wl)) for layer, wl in zip(s.layers, write_locs)]
        return _DecodeGraph(graph, write_locs, targets, rows, tuple(writes), tuple(observed), verdict, s.pool)

    # ------------------------------------------------------------------ piecewise graphs

    def _piece(self, s: BackendStep, kind: str) -> _Piece:
        cap = s.batch.padded_len
        pool = s.pool
        # (and the inference mode its buffers were made in: a run's are changed in place only in that mode)
        key = (cap, kind, pool.shape[kind], pool.row_dtype, pool.k_scale, pool.v_scale, pool.device,
               torch.is_inference_mode_enabled())
        piece = self._pieces.get(key)
        if piece is not None:
            return piece
        heads, kd, vd = pool.shape[kind]
        dev = pool.device
        tags = torch.full((cap,), -1, dtype=torch.int64, device=dev)
        layer = torch.zeros((), dtype=torch.float32, device=dev)
        k_out = torch.empty((cap, heads, kd), dtype=pool.row_dtype, device=dev)
        v_out = torch.empty((cap, heads, vd), dtype=pool.row_dtype, device=dev)

        def project() -> None:
            for out, dim, scale in ((k_out, kd, pool.k_scale), (v_out, vd, pool.v_scale)):
                rows = encode_rows(tags, 0, heads, dim, pool.row_dtype, scale)
                rows.view(cap, -1)[:, TAG_LANES] = ((layer + 1.0) * scale).to(pool.row_dtype)
                out.copy_(rows)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            project()                       # warm-up outside capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with _capturing(), _graph_capture(graph, stream):
            project()
        torch.cuda.current_stream().wait_stream(stream)
        self.captures += 1
        piece = self._pieces[key] = _Piece(graph, _StaticTags(tags), layer, k_out, v_out)
        return piece

    def _run_piecewise(self, s: BackendStep) -> list[LayerWrite]:
        n = s.meta.rows               # rows the layer produces: narrowed to the real tokens under shrinkage
        rows = {}
        for kind in dict.fromkeys(l.kind for l in s.layers):
            piece = self._piece(s, kind)
            piece.tags.fill(s.tags)
            piece.layer.fill_(float(next(l.layer for l in s.layers if l.kind == kind)))
            piece.graph.replay()          # the captured piece: K/V projection (each layer's stamp at its store)
            self.piece_replays += 1
            rows[kind] = (piece.k[:n], piece.v[:n])
        return self._run_grouped(s, rows)

    def _run_grouped(self, s: BackendStep, rows: dict) -> list[LayerWrite]:
        """Every layer's write location from the design, in layer order (as the eager executor builds them);
        then the layers of a kind that got the same target write it in one launch (``pool.store_layers``,
        each row stamped for its layer), any other layer alone; observations in layer order."""
        prepared, groups = _prepare_layers(s)
        done: dict[int, tuple[int, int, Optional[str]]] = {}
        for (kind, *_), members in groups.items():
            k, v = rows.get(kind) or rows_for(s, s.layers[members[0]])
            target = prepared[members[0]][1]
            t0 = s.now()
            try:
                self.grouped_stores += _store_group(s, kind, members, target, k, v)
                err = None
            except KVLengthMismatch as e:
                err = str(e)
            t1 = s.now()
            per = (t1 - t0) // len(members)
            for j, i in enumerate(members):
                done[i] = (t0 + j * per, t0 + (j + 1) * per, err)
        writes, rows, shapes = [], [], {}
        step, backend = s.batch.step, s.backend
        for i, (layer, w) in enumerate(zip(s.layers, prepared)):
            if isinstance(w, LayerWrite):
                writes.append(w)          # the design failed: nothing stored for this layer
                continue
            wl, target = w
            t0, t1, err = done[i]
            shape = shapes.get(id(wl))    # (a layer-free design: one write location per kind)
            if shape is None:
                shape = shapes[id(wl)] = loc_shapes(wl)
            rows.append((step, backend, layer.layer, *shape, t0, t1, err))
            writes.append(LayerWrite(layer.layer, layer.kind, layer.index, None if err else target, err))
        boundary_sink(s.observer)(rows)   # (the observations in layer order, as observe() per layer gives them)
        return writes


def _prepare_layers(s: BackendStep) -> tuple[list, dict]:
    """Every layer's write location from the design, in layer order (as the eager executor builds them;
    ``before_layer`` first where set): per layer ``(KVWriteLoc, target)`` or the failed ``LayerWrite``; and the
    layers grouped by target (kind, address, length, stride, dtype), in order. A layer-free ``make_write_loc``
    is asked once per kind: every layer of the kind gets the same target."""
    before = s.before_layer
    prepared, groups = [], {}
    free = _layer_free(s.boundary.design)
    per_kind: dict[str, tuple] = {}     # kind -> (its write, its group's members)
    for i, layer in enumerate(s.layers):
        if before is not None:
            before(layer)
        got = per_kind.get(layer.kind) if free else None
        if got is not None:
            prepared.append(got[0])
            got[1].append(i)
            continue
        w = prepare_write(s, layer)
        prepared.append(w)
        if not isinstance(w, LayerWrite):     # (a failure is built per layer: its text names the layer)
            t = w[1]
            members = groups.setdefault((layer.kind, t.data_ptr(), t.shape[0], t.stride(0), t.dtype), [])
            members.append(i)
            if free:
                per_kind[layer.kind] = (w, members)
    return prepared, groups


def _store_group(s: BackendStep, kind: str, members: list[int], target, k, v) -> int:
    """The layers ``members`` (indices into ``s.layers``) of ``kind`` write ``k``/``v`` at ``target``: one
    store for one layer (its row stamped first), one grouped launch for several (each row stamped for its
    layer, ``pool.store_layers``: the same bytes). Returns 1 for a grouped launch, else 0. Raises
    KVLengthMismatch before writing anything."""
    if len(members) == 1:
        layer = s.layers[members[0]]
        s.pool.restamp(k, v, layer.layer)
        s.pool.store(kind, layer.index, target, k, v)
        return 0
    s.pool.store_layers(kind, tuple(s.layers[i].index for i in members),
                        tuple(s.layers[i].layer for i in members), target, k, v)
    return 1
