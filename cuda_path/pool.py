"""The pool under test: per sub-pool and layer, K and V buffers written through the real store.

Geometry is real by default (``[rows, heads, head_dim]`` per layer, V with its own head_dim) or
compact (one head of ``compact_width`` lanes), which keeps a CPU run of a large pool within memory
while exercising the same store code. Buffers of one kind are one allocation ``[layers, rows, ...]``
so that the checker reads the tag lanes of every layer at a set of slots in one gather.

Two layouts (``layout=``): ``split`` gives K and V an allocation each, ``[layers, rows, heads, dim]`` (SGLang's
layout); ``paired`` gives each kind ONE allocation ``[layers, rows, S]``, a slot's K row at byte ``o`` and its
V row right after it, ``o`` chosen so that the K/V boundary falls at byte 16 of a 32-byte sector and ``S`` a
multiple of 32 bytes. Rows that wide carry the tag at both ends (simulator/oracle/kvrows.py), so K's tail tag and
V's head tag (16 bytes each in bf16/fp16, 8 in fp8) lie in one aligned 32-byte sector: the GPU checker
(cuda_path/check_kernel.py) reads one sector per slot instead of two. ``k[kind]``/``v[kind]`` are
``[layers, rows, heads, dim]`` views either way (strided in ``paired``). The default: ``paired`` for real
geometry on CUDA, ``split`` otherwise.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from simulator.oracle.kvrows import (MIN_ROW_WIDTH, TAG_LANES, TAIL_TAG_MIN_WIDTH, decode_tags, encode_rows,
                                     row_dtype, set_layer_lane, tag_lanes)
from simulator.scenario.models import Model

from .store import STORE_IMPLS, new_error_buffer, store_kv_layers_torch, store_kv_torch

GEOMETRIES = ("real", "compact")
LAYOUTS = ("split", "paired")
COMPACT_WIDTH = 16
SECTOR = 32              # bytes of one DRAM sector: K's tail tag and V's head tag share one in ``paired``

_STORAGE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8_e4m3": torch.uint8}


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed buffer. On the CPU, numpy's calloc maps zero pages lazily, so a large pool costs
    nothing until slots are written (torch.zeros would touch every page up front)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    width = torch.empty((), dtype=dtype).element_size()
    raw = np.zeros(shape, dtype={1: np.uint8, 2: np.int16, 4: np.int32}[width])
    return torch.from_numpy(raw).view(dtype)


def _aligned_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """:func:`_zeros` with its first byte on a SECTOR boundary (CUDA allocations are; a CPU one is made so)."""
    if device.type != "cpu":
        return _zeros(shape, dtype, device)
    width = torch.empty((), dtype=dtype).element_size()
    n = int(np.prod(shape))
    flat = _zeros((n + SECTOR // width,), dtype, device)
    skip = (-flat.data_ptr() % SECTOR) // width
    return flat[skip:skip + n].view(shape)


def paired_offsets(k_bytes: int, v_bytes: int) -> tuple[int, int]:
    """(K row's byte offset, slot bytes S) of the ``paired`` layout: the K/V boundary at byte SECTOR/2 of
    a sector (so the tag bytes either side of it, 16 or 8 each, share that sector), S a multiple of SECTOR."""
    o = (SECTOR // 2 - k_bytes) % SECTOR
    return o, -(-(o + k_bytes + v_bytes) // SECTOR) * SECTOR


def paired_views(buf: torch.Tensor, heads: int, kd: int, vd: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V ``[layers, rows, heads, dim]`` views into a paired allocation ``buf`` (``[layers, rows, S]``,
    S from :func:`paired_offsets`, its first byte on a sector boundary), marked for the checker's one-load
    check (cuda_path/check_kernel.py reads K's tail tag and V's head tag together). Only for rows that carry
    their tag at both ends (simulator/oracle/kvrows.py, width >= TAIL_TAG_MIN_WIDTH)."""
    from .check_kernel import mark_paired

    width = buf.element_size()
    o, s = paired_offsets(heads * kd * width, heads * vd * width)
    if (buf.dim() != 3 or buf.shape[2] * width != s or buf.stride(2) != 1 or buf.stride(1) != buf.shape[2]
            or buf.data_ptr() % SECTOR or heads * kd < TAIL_TAG_MIN_WIDTH):   # (the kernels rely on all of it)
        raise ValueError(f"not a paired allocation for {heads} heads x {kd}/{vd} lanes: shape {tuple(buf.shape)}")
    at = o // width
    k = buf[:, :, at:at + heads * kd].unflatten(2, (heads, kd))
    v = buf[:, :, at + heads * kd:at + heads * (kd + vd)].unflatten(2, (heads, vd))
    tag = TAG_LANES * width                        # bytes of one row's tag lanes
    first = (o + heads * kd * width - tag) // 8    # K's tail tag, then V's head tag: 2 * tag bytes
    mark_paired(k, v, buf.view(torch.int64)[:, :, first:first + 2 * tag // 8])
    return k, v


def default_layout(device: torch.device | str, geometry: str) -> str:
    """``paired`` for real geometry on CUDA (the checker reads one sector per slot), else ``split``
    (TaggedKVPool also falls back to ``split`` for rows too narrow to carry the tail tag)."""
    return "paired" if torch.device(device).type == "cuda" and geometry == "real" else "split"


def pool_layout(model: Model, device, geometry: str, layout: Optional[str] = None) -> str:
    """The layout a TaggedKVPool of ``model`` takes: the one asked for, checked; None: :func:`default_layout`,
    ``split`` where a kind's K rows are too narrow to carry the tail tag."""
    if layout is None:
        layout = default_layout(device, geometry)
        shapes = [row_shape(model, kind, geometry) for kind in ("full", "swa") if model.count(kind)]
        if layout == "paired" and any(heads * kd < TAIL_TAG_MIN_WIDTH for heads, kd, _ in shapes):
            layout = "split"
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} (allowed: {', '.join(LAYOUTS)})")
    return layout


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


def slot_bytes(model: Model, kind: str, geometry: str, layout: str = "split") -> int:
    """Bytes one slot of ``kind`` takes in one layer: K and V rows, plus the ``paired`` layout's padding."""
    if layout == "split":
        return row_bytes(model, kind, geometry)
    heads, kd, vd = row_shape(model, kind, geometry)
    width = torch.empty((), dtype=_STORAGE[model.kv_dtype]).element_size()
    return paired_offsets(heads * kd * width, heads * vd * width)[1]


def estimate_bytes(model: Model, full_rows: int, swa_rows: int, geometry: str = "real", pools: int = 1,
                   layout: str = "split") -> int:
    """Bytes that ``pools`` TaggedKVPools of this model and size hold (K and V buffers, every layer),
    computed without allocating anything: what a run needs when every slot has been written."""
    rows = {"full": full_rows, "swa": swa_rows}
    return pools * sum(model.count(kind) * rows[kind] * slot_bytes(model, kind, geometry, layout)
                       for kind in ("full", "swa"))


def store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    skip_index: Optional[int],
    err: torch.Tensor,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
    impl: str = "torch",
) -> None:
    """One layer's store through the chosen implementation (``torch``, cuda_path/store.py; or ``triton``,
    cuda_path/triton_store.py, imported on first use)."""
    if impl == "torch":
        store_kv_torch(k_cache, v_cache, loc, k, v, skip_index=skip_index, err=err,
                       k_scale=k_scale, v_scale=v_scale)
    elif impl == "triton":
        from .triton_store import store_kv_triton

        store_kv_triton(k_cache, v_cache, loc, k, v, skip_index=skip_index, err=err,
                        k_scale=k_scale, v_scale=v_scale)
    else:
        raise ValueError(f"unknown store impl {impl!r}; choose one of {', '.join(STORE_IMPLS)}")


class TaggedKVPool:
    """Implements :class:`simulator.memory.pool.PoolWriter` with torch tensors on any device."""

    def __init__(self, model: Model, full_rows: int, swa_rows: int, *, device: torch.device | str = "cpu",
                 geometry: str = "real", store_impl: str = "torch", skip_index: Optional[int] = 0,
                 k_scale: float = 1.0, v_scale: float = 1.0, layout: Optional[str] = None):
        if geometry not in GEOMETRIES:
            raise ValueError(f"geometry {geometry!r} (allowed: {', '.join(GEOMETRIES)})")
        layout = pool_layout(model, device, geometry, layout)
        if store_impl not in STORE_IMPLS:
            raise ValueError(f"store_impl {store_impl!r} (allowed: {', '.join(STORE_IMPLS)})")
        self.device = torch.device(device)
        self.model = model
        self.geometry = geometry
        self.layout = layout
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
        self.kv: dict[str, torch.Tensor] = {}      # paired: the one allocation of a kind, [layers, rows, S]
        self._groups: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}   # store_layers' tables
        for kind in ("full", "swa"):
            self._allocate(kind, model.count(kind), storage)

    def _allocate(self, kind: str, layers: int, storage: torch.dtype) -> None:
        heads, kd, vd = row_shape(self.model, kind, self.geometry)
        if heads * min(kd, vd) < MIN_ROW_WIDTH:
            raise ValueError(f"{kind} rows of {heads}x{min(kd, vd)} lanes cannot carry a tag "
                             f"(need {MIN_ROW_WIDTH}); use geometry='compact'")
        if self.layout == "paired" and heads * kd < TAIL_TAG_MIN_WIDTH:
            raise ValueError(f"layout 'paired' needs K rows of at least {TAIL_TAG_MIN_WIDTH} lanes (the tag at "
                             f"both ends); {kind} rows of geometry {self.geometry!r} are {heads} heads x {kd} "
                             f"lanes: use layout='split'")
        self.shape[kind] = (heads, kd, vd)
        rows = self._rows[kind]
        if self.layout == "paired":
            width = torch.empty((), dtype=storage).element_size()
            _, s = paired_offsets(heads * kd * width, heads * vd * width)
            self.kv[kind] = _aligned_zeros((layers, rows, s // width), storage, self.device)
            self._pair_views(kind)
        else:
            self.k[kind] = _zeros((layers, rows, heads, kd), storage, self.device)
            self.v[kind] = _zeros((layers, rows, heads, vd), storage, self.device)
        self.err[kind] = new_error_buffer(self.device, max(layers, 1))

    def _pair_views(self, kind: str) -> None:
        """``k[kind]``/``v[kind]`` as ``[layers, rows, heads, dim]`` views into the paired allocation, marked
        for the checker (cuda_path/check_kernel.py reads K's tail and V's head tag in one load)."""
        self.k[kind], self.v[kind] = paired_views(self.kv[kind], *self.shape[kind])

    def clone(self) -> "TaggedKVPool":
        """A copy that shares nothing written later (simulator.memory.pool.PoolClasses' copy on divergence): K, V and
        error buffers copied; a paired pool's one allocation per kind copied whole, its views made anew."""
        import copy

        new = copy.copy(self)
        new.err = {kind: t.clone() for kind, t in self.err.items()}
        if self.layout == "paired":
            new.kv, new.k, new.v = {}, {}, {}
            for kind, buf in self.kv.items():
                if buf.device.type == "cpu":          # (a CPU copy is placed on a sector boundary like the first)
                    new.kv[kind] = _aligned_zeros(tuple(buf.shape), buf.dtype, buf.device)
                    new.kv[kind].copy_(buf)
                else:                                 # CUDA allocations start on 512-byte boundaries
                    new.kv[kind] = buf.clone(memory_format=torch.contiguous_format)
                new._pair_views(kind)
        else:
            new.k = {kind: t.clone() for kind, t in self.k.items()}
            new.v = {kind: t.clone() for kind, t in self.v.items()}
        return new

    def rows(self, kind: str) -> int:
        return self._rows[kind]

    def bytes(self) -> int:
        bufs = self.kv.values() if self.layout == "paired" else [t for d in (self.k, self.v) for t in d.values()]
        return sum(t.numel() * t.element_size() for t in bufs)

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
        Either layout (a paired pool's K and V are strided views: only the small result is made contiguous).
        """
        n_layers, rows = buf.shape[0], self._rows[kind]
        # gather the slots' rows first (index_select touches only those rows), then keep the tag lanes and
        # the layers asked for, on the small result
        flat = buf.view(n_layers, rows, -1)
        contiguous = buf.is_contiguous()
        picked = (flat.view(torch.int64) if contiguous else flat).index_select(1, slots.to(torch.int64))
        if layers is not None:
            picked = picked[torch.tensor(layers, dtype=torch.int64, device=buf.device)]
        if contiguous:
            return picked[:, :, :TAG_LANES * buf.element_size() // 8]
        return picked[:, :, :TAG_LANES].contiguous().view(torch.int64)

    def mismatches(self, kind: str, slots: torch.Tensor, expected: torch.Tensor,
                   layers: Optional[list[int]] = None) -> torch.Tensor:
        """``[layers, len(slots)]`` bool: where K or V tag lanes differ from the expected tags' bits.

        Compares raw bits as int64 words (16 lane bytes -> two words), never decoding rows. A paired pool
        compares K's tail tag and V's head tag, read together (cuda_path/check_kernel.py says why that is exact).
        """
        want = tag_lanes(expected, self.k[kind].dtype).contiguous().view(torch.int64)
        k, v = self.k[kind], self.v[kind]
        if self.device.type == "cuda":
            from .check_kernel import tag_mismatches

            lay = torch.arange(k.shape[0], device=self.device) if layers is None else \
                torch.tensor(layers, dtype=torch.int64, device=self.device)
            return tag_mismatches(k, v, self._rows[kind], slots.to(torch.int64), want, lay)
        from .check_kernel import pair_words

        pair = pair_words(k, v)
        if pair is not None:
            picked = pair.index_select(1, slots.to(torch.int64))
            if layers is not None:
                picked = picked[torch.tensor(layers, dtype=torch.int64, device=self.device)]
            return (picked != torch.cat([want, want], dim=-1)).any(dim=-1)
        diff = (self._tag_words(k, kind, slots, layers) != want).any(dim=-1)
        diff |= (self._tag_words(v, kind, slots, layers) != want).any(dim=-1)
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
