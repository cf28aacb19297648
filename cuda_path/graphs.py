"""Real CUDA graphs for the write path, as serving engines run it.

* **Decode graphs.** For each (backend, decode capture size) the whole per-layer write step (every
  layer's write location from the design, the layer stamp of the K/V rows, the Triton store) is
  captured once into a ``torch.cuda.CUDAGraph`` and replayed for every later batch of that padded
  size. The graph reads the backend's static ``out_cache_loc`` and SWA-location buffers, which the
  backend's metadata init refreshes before each replay exactly as the design says: so the
  ``sglang-pre-24743`` stale tail corrupts live slots on the real GPU.
* **Piecewise graphs.** For each token capture size a small non-attention piece (the K/V
  projection: tags -> K/V rows, with the layer id as a static input) is captured; per layer it is
  replayed and the write then runs eagerly, between pieces, on the locations the layer sees
  (narrowed to the real token count). So B1 runs through real piecewise graphs.

The first batch of a new capture size runs eagerly (that is the warm-up: Triton kernels compile,
nothing is captured while the pool is written); the graph is captured right after it. A step whose
writes raise at capture (a length mismatch) is never captured and always runs eagerly, so its error
is still recorded at every layer.

Boundary observations of a replayed graph carry the replay's start and end time, divided evenly
between its layers (a graph replay has no per-layer host timestamps).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from simulator.checker import LayerWrite
from simulator.execute import BackendStep, EagerExecutor, observe, prepare_write, store_layer
from simulator.kvrows import TAG_LANES, encode_rows, pad_tags
from simulator.pool import KVLengthMismatch


class _NotCaptured(Exception):
    """A design hook failed while the step was being captured: the step stays eager."""


@dataclass
class _DecodeGraph:
    graph: torch.cuda.CUDAGraph
    write_locs: list            # KVWriteLoc per layer, captured views of the static buffers
    targets: list               # the tensors each layer's store reads at replay
    rows: dict                  # kind -> (k, v) static row buffers, [padded, heads, dim]


@dataclass
class _Piece:
    graph: torch.cuda.CUDAGraph
    tags: torch.Tensor          # static input [capture]
    layer: torch.Tensor         # static input: layer id (float32 scalar)
    k: torch.Tensor             # static outputs [capture, heads, dim]
    v: torch.Tensor


def _step_rows(s: BackendStep, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """This step's K/V rows for a layer kind, stamped for its first layer (the graph re-stamps the rest)."""
    first = next(l for l in s.layers if l.kind == kind)
    return s.pool.make_rows(pad_tags(s.tags, s.meta.rows), first.layer, kind)


class CudaGraphExecutor:
    """A :class:`simulator.execute.LayerExecutor` that runs decode and piecewise batches in CUDA graphs."""

    def __init__(self) -> None:
        self.eager = EagerExecutor()
        self._decode: dict[tuple[str, int], Optional[_DecodeGraph]] = {}
        self._pieces: dict[tuple[int, str, int], _Piece] = {}
        self.replays = 0
        self.captures = 0
        self.piece_replays = 0

    def run(self, s: BackendStep) -> list[LayerWrite]:
        pool = s.pool
        if pool.device.type != "cuda" or getattr(pool, "store_impl", None) != "triton" or s.interleaved:
            return self.eager.run(s)     # no graph: not the Triton store on cuda, or writes land between layers
        if s.batch.graph == "decode_graph":
            return self._run_decode(s)
        if s.batch.graph == "piecewise":
            return self._run_piecewise(s)
        return self.eager.run(s)

    # ------------------------------------------------------------------ decode graphs

    def _run_decode(self, s: BackendStep) -> list[LayerWrite]:
        key = (s.backend, s.batch.padded_len)
        if key not in self._decode:
            writes = self.eager.run(s)      # warm-up on real data; nothing captured yet
            self._decode[key] = None if any(w.error for w in writes) else self._capture_decode(s)
            return writes
        g = self._decode[key]
        if g is None:
            return self.eager.run(s)
        for kind, (k, v) in g.rows.items():
            k0, v0 = _step_rows(s, kind)
            k.copy_(k0)
            if v is not k:
                v.copy_(v0)
        t0 = s.now()
        g.graph.replay()
        torch.cuda.current_stream().synchronize()
        t1 = s.now()
        self.replays += 1
        per = (t1 - t0) // max(len(s.layers), 1)
        writes = []
        for i, (layer, wl, target) in enumerate(zip(s.layers, g.write_locs, g.targets)):
            observe(s, layer, wl, t0 + i * per, t0 + (i + 1) * per, None)
            writes.append(LayerWrite(layer.layer, layer.kind, layer.index, target, None))
        return writes

    def _capture_decode(self, s: BackendStep) -> Optional[_DecodeGraph]:
        n = s.meta.rows
        rows = {}
        for kind in {l.kind for l in s.layers}:
            k, v = _step_rows(s, kind)
            kc = k.clone()
            rows[kind] = (kc, kc if v is k else v.clone())
        write_locs, targets = [], []
        # shapes first: a step whose stores would raise, or whose design fails, is not captured
        for layer in s.layers:
            w = prepare_write(s, layer)
            if isinstance(w, LayerWrite) or w[1].shape[0] != n:
                return None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=stream):
                for layer in s.layers:
                    w = prepare_write(s, layer)
                    if isinstance(w, LayerWrite):
                        raise _NotCaptured(w.error)
                    wl, target = w
                    k, v = rows[layer.kind]
                    s.pool.restamp(k, v, layer.layer)
                    s.pool.store(layer.kind, layer.index, target, k, v)
                    write_locs.append(wl)
                    targets.append(target)
        except (KVLengthMismatch, _NotCaptured):
            return None
        torch.cuda.current_stream().wait_stream(stream)
        self.captures += 1
        return _DecodeGraph(graph, write_locs, targets, rows)

    # ------------------------------------------------------------------ piecewise graphs

    def _piece(self, s: BackendStep, kind: str) -> _Piece:
        cap = s.batch.padded_len
        pool = s.pool
        key = (cap, kind, id(pool))
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
        with torch.cuda.graph(graph, stream=stream):
            project()
        torch.cuda.current_stream().wait_stream(stream)
        self.captures += 1
        piece = self._pieces[key] = _Piece(graph, tags, layer, k_out, v_out)
        return piece

    def _run_piecewise(self, s: BackendStep) -> list[LayerWrite]:
        n = s.meta.rows               # rows the layer produces: narrowed to the real tokens under shrinkage
        writes = []
        filled: set[str] = set()
        for layer in s.layers:
            piece = self._piece(s, layer.kind)
            if layer.kind not in filled:
                piece.tags.copy_(pad_tags(s.tags, piece.tags.shape[0]))
                filled.add(layer.kind)
            piece.layer.fill_(float(layer.layer))
            piece.graph.replay()          # the captured piece: K/V projection for this layer
            self.piece_replays += 1
            k, v = piece.k[:n], piece.v[:n]
            w = prepare_write(s, layer)
            if isinstance(w, LayerWrite):
                writes.append(w)          # the design failed: nothing stored for this layer
                continue
            wl, target = w
            writes.append(store_layer(s, layer, wl, target, k, v))     # eager, between pieces
        return writes

