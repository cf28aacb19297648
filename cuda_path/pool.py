"""The pool under test: per sub-pool and layer, K and V buffers written through the real store.

Geometry is real by default (``[rows, heads, head_dim]`` per layer, V with its own head_dim) or
compact (one head of ``compact_width`` lanes), which keeps a CPU run of a large pool within memory
while exercising the same store code. Buffers of one kind are one allocation ``[layers, rows, ...]``
so that the checker reads the tag lanes of every layer at a set of slots in one gather.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from simulator.kvrows import MIN_ROW_WIDTH, TAG_LANES, decode_tags, encode_rows, row_dtype, set_layer_lane, tag_lanes
from simulator.models import Model

from .store import STORE_IMPLS, new_error_buffer, store_kv, store_kv_layers_torch

GEOMETRIES = ("real", "compact")
COMPACT_WIDTH = 16

_STORAGE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8_e4m3": torch.uint8}


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed buffer. On the CPU, numpy's calloc maps zero pages lazily, so a large pool costs
    nothing until slots are written (torch.zeros would touch every page up front)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    width = torch.empty((), dtype=dtype).element_size()
    raw = np.zeros(shape, dtype={1: np.uint8, 2: np.int16, 4: np.int32}[width])
    return torch.from_numpy(raw).view(dtype)


def row_shape(model: Model, kind: str, geometry: str) -> tuple[int, int, int]:
    """(heads, K head_dim, V head_dim) of one row of ``kind`` in the pool under test (as TaggedKVPool lays it out)."""
    if geometry == "compact":
        return 1, COMPACT_WIDTH, COMPACT_WIDTH
    g = model.geometry(kind)
    return g.heads, g.head_dim, g.v_head_dim


def row_bytes(model: Model, kind: str, geometry: str) -> int:
    """Bytes of one slot's K and V row of ``kind`` in one layer of the pool under test."""
    heads, kd, vd = row_shape(model, kind, geometry)
    width = torch.empty((), dtype=_STORAGE[model.kv_dtype]).element_size()
    return heads * (kd + vd) * width


def estimate_bytes(model: Model, full_rows: int, swa_rows: int, geometry: str = "real", pools: int = 1) -> int:
    """Bytes that ``pools`` TaggedKVPools of this model and size hold (K and V buffers, every layer),
    computed without allocating anything: what a run needs when every slot has been written."""
    rows = {"full": full_rows, "swa": swa_rows}
    return pools * sum(model.count(kind) * rows[kind] * row_bytes(model, kind, geometry) for kind in ("full", "swa"))


class TaggedKVPool:
    """Implements :class:`simulator.pool.PoolWriter` with torch tensors on any device."""

    def __init__(self, model: Model, full_rows: int, swa_rows: int, *, device: torch.device | str = "cpu",
                 geometry: str = "real", store_impl: str = "torch", skip_index: Optional[int] = 0,
                 k_scale: float = 1.0, v_scale: float = 1.0):
        if geometry not in GEOMETRIES:
            raise ValueError(f"geometry {geometry!r} (allowed: {', '.join(GEOMETRIES)})")
        if store_impl not in STORE_IMPLS:
            raise ValueError(f"store_impl {store_impl!r} (allowed: {', '.join(STORE_IMPLS)})")
        self.device = torch.device(device)
        self.model = model
        self.geometry = geometry
        self.store_impl = store_impl
        self.skip_index = skip_index
        self.fp8 = model.kv_dtype == "fp8_e4m3"
        self.k_scale = k_scale if self.fp8 else 1.0
        self.v_scale = v_scale if self.fp8 else 1.0
        self.row_dtype = row_dtype(model.kv_dtype)
        storage = _STORAGE[model.kv_dtype]
        self._rows = {"full": full_rows, "swa": swa_rows}
        self.k: dict[str, torch.Tensor] = {}
        self.v: dict[str, torch.Tensor] = {}
        self.err: dict[str, torch.Tensor] = {}
        self.shape: dict[str, tuple[int, int, int]] = {}
        self._groups: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}   # store_layers' tables
        for kind in ("full", "swa"):
            layers = model.count(kind)
            g = model.geometry(kind)
            if geometry == "compact":
                heads, kd, vd = 1, COMPACT_WIDTH, COMPACT_WIDTH
            else:
                heads, kd, vd = g.heads, g.head_dim, g.v_head_dim
            if heads * min(kd, vd) < MIN_ROW_WIDTH:
                raise ValueError(f"{kind} rows of {heads}x{min(kd, vd)} lanes cannot carry a tag "
                                 f"(need {MIN_ROW_WIDTH}); use geometry='compact'")
            self.shape[kind] = (heads, kd, vd)
            rows = self._rows[kind]
            self.k[kind] = _zeros((layers, rows, heads, kd), storage, self.device)
            self.v[kind] = _zeros((layers, rows, heads, vd), storage, self.device)
            self.err[kind] = new_error_buffer(self.device, max(layers, 1))

    def rows(self, kind: str) -> int:
        return self._rows[kind]

    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for d in (self.k, self.v) for t in d.values())

    def make_rows(self, tags: torch.Tensor, layer: int, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        heads, kd, vd = self.shape[kind]
        tags = tags.to(self.device)
        k = encode_rows(tags, layer, heads, kd, self.row_dtype, self.k_scale)
        v = k if vd == kd and self.k_scale == self.v_scale else encode_rows(tags, layer, heads, vd, self.row_dtype,
                                                                               self.v_scale)
        return k, v

    def restamp(self, k: torch.Tensor, v: torch.Tensor, layer: int) -> None:
        set_layer_lane(k, layer, self.k_scale)
        if v is not k:
            set_layer_lane(v, layer, self.v_scale)

    def store(self, kind: str, index: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        store_kv(self.k[kind][index], self.v[kind][index], loc, k, v, skip_index=self.skip_index,
                 err=self.err[kind][index], k_scale=self.k_scale if self.fp8 else None,
                 v_scale=self.v_scale if self.fp8 else None, impl=self.store_impl)

    def store_layers(self, kind: str, indices: tuple[int, ...], layer_ids: tuple[int, ...], loc: torch.Tensor,
                     k: torch.Tensor, v: torch.Tensor) -> None:
        """The layers ``indices`` of sub-pool ``kind`` (global ids ``layer_ids``) all write ``k``/``v`` at
        ``loc``, each row re-stamped for its layer: what :meth:`restamp` then :meth:`store` per layer leave,
        in one launch with the Triton store. Raises KVLengthMismatch before writing, like :meth:`store`."""
        if self.store_impl not in ("torch", "triton"):
            for index, layer in zip(indices, layer_ids):
                self.restamp(k, v, layer)
                self.store(kind, index, loc, k, v)
            return
        key = (kind, indices, layer_ids, k.dtype, v.dtype)
        group = self._groups.get(key)
        if group is None:
            ks = torch.empty(len(layer_ids), dtype=k.dtype)
            vs = torch.empty(len(layer_ids), dtype=v.dtype)
            for i, layer in enumerate(layer_ids):     # the values set_layer_lane writes, set the same way
                ks[i] = float(layer + 1) * self.k_scale
                vs[i] = float(layer + 1) * self.v_scale
            group = self._groups[key] = (torch.tensor(indices, dtype=torch.int64).to(self.device),
                                         ks.to(self.device), vs.to(self.device))
        if self.store_impl == "torch":      # the layers in one scatter per buffer (cuda_path/store.py)
            store_kv_layers_torch(self.k[kind], self.v[kind], group[0], group[1], group[2], loc, k, v,
                                  skip_index=self.skip_index, err=self.err[kind], stamp_lane=TAG_LANES,
                                  k_scale=self.k_scale if self.fp8 else None,
                                  v_scale=self.v_scale if self.fp8 else None)
            return
        from .triton_store import store_kv_layers_triton

        store_kv_layers_triton(self.k[kind], self.v[kind], group[0], group[1], group[2], loc, k, v,
                               skip_index=self.skip_index, err=self.err[kind], stamp_lane=TAG_LANES,
                               k_scale=self.k_scale if self.fp8 else None,
                               v_scale=self.v_scale if self.fp8 else None)

    def _tag_words(self, buf: torch.Tensor, kind: str, slots: torch.Tensor,
                   layers: Optional[list[int]]) -> torch.Tensor:
        """The tag lanes of ``slots`` in every (or the given) layer, as int64 words ``[L, n, words]``.

        One gather of the slots' rows: its cost depends on the slots asked for, never on the pool's
        size (indexing a strided view of the tag lanes would make torch touch every row on the CPU).
        """
        n_layers, rows = buf.shape[0], self._rows[kind]
        words = buf.view(n_layers, rows, -1).view(torch.int64)
        n_words = TAG_LANES * buf.element_size() // 8
        # gather the slots' rows first (index_select on the contiguous buffer touches only those rows),
        # then keep the tag words and the layers asked for, on the small result
        picked = words.index_select(1, slots.to(torch.int64))
        if layers is not None:
            picked = picked[torch.tensor(layers, dtype=torch.int64, device=buf.device)]
        return picked[:, :, :n_words]

    def mismatches(self, kind: str, slots: torch.Tensor, expected: torch.Tensor,
                   layers: Optional[list[int]] = None) -> torch.Tensor:
        """``[layers, len(slots)]`` bool: where K or V tag lanes differ from the expected tags' bits.

        Compares raw bits as int64 words (16 lane bytes -> two words), never decoding rows.
        """
        want = tag_lanes(expected, self.k[kind].dtype).contiguous().view(torch.int64)
        if self.device.type == "cuda":
            from .check_kernel import tag_mismatches

            lay = torch.arange(self.k[kind].shape[0], device=self.device) if layers is None else \
                torch.tensor(layers, dtype=torch.int64, device=self.device)
            return tag_mismatches(self.k[kind], self.v[kind], self._rows[kind], slots.to(torch.int64), want, lay)
        diff = (self._tag_words(self.k[kind], kind, slots, layers) != want).any(dim=-1)
        diff |= (self._tag_words(self.v[kind], kind, slots, layers) != want).any(dim=-1)
        return diff

    def read_tags(self, kind: str, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        storage = self.k[kind].dtype
        return tuple(decode_tags(self._tag_words(buf, kind, slots, None).view(storage), self.fp8)
                     for buf in (self.k[kind], self.v[kind]))

    def take_out_of_range(self, kind: str) -> torch.Tensor:
        err = self.err[kind]
        out = err.to("cpu", copy=True)
        if bool(out[:, 0].any()):
            err.copy_(new_error_buffer(self.device, err.shape[0]))
        return out
