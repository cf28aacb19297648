"""The release's hybrid pool as the pool under test: ``SWAKVPool`` routing and ``set_kv_buffer``.

:class:`EnginePool` implements the simulator's ``PoolWriter`` protocol over a real ``SWAKVPool``
of the release: every store goes through the release's ``SWAKVPool.set_kv_buffer`` (its layer
routing: full layers at ``loc``, SWA layers assert ``swa_loc`` and write there) and the sub-pool's
own store (on a CPU the torch fallback ``k_cache[loc] = k``), and the checker reads the tags back
from the pool's own K/V buffers. Rows are the simulator's tagged rows (simulator.oracle.kvrows), made in
the pool's dtype so the release's store never casts or scales them.

On CUDA (``--device cuda``) the sub-pools' buffers are CUDA tensors and the store is the release's
CUDA path of ``_set_kv_buffer_impl``: its JIT ``store_cache`` kernel where the release can build it
there (``can_use_store_cache``: tvm-ffi and nvcc), else torch's index put on the CUDA tensors.
:func:`release_store` finds out which, and whether the store skips slot 0 (the JIT kernel's
``reserved_skip_index``), by a probe write on a scratch pool of the release. An index out of range is
not handed to the store there (the kernel's bound check is a device assert that ends the process):
the layer writes nothing and the indices are counted, as the CPU's ``IndexError`` does.

Differences from cuda_path's ``TaggedKVPool`` (which models the CUDA kernel's contract) are the
engine's, and the checker sees them as they are: the CPU fallback writes slot 0 (``skip_index`` is
None: padded rows land in the reserved slot), reads a negative index from the end, raises torch's
own shape error on a length mismatch (reported as ``KVLengthMismatch``) and ``IndexError`` on an
index past the buffer (nothing of that layer is written; counted as out of range).
"""
from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Optional, Sequence

import torch

from simulator.oracle.kvrows import TAG_LANES, decode_tags, encode_rows, set_layer_lane, tag_lanes
from simulator.memory.pool import KVLengthMismatch

from .api import ReleaseAPI
from .errors import AdapterLacks, EngineError

COMPACT_WIDTH = 16
#: (id(api), device) -> release_store's answer (one probe per release and device)
_STORES: dict = {}
NO_POSITION = 2**62          # as cuda_path.store: no out-of-range index seen
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def build_swa_pool(api: ReleaseAPI, *, size: int, size_swa: int, page_size: int, full_layers: Sequence[int],
                   swa_layers: Sequence[int], head_num: int = 1, head_dim: int = COMPACT_WIDTH,
                   v_head_dim: Optional[int] = None, swa_head_num: Optional[int] = None,
                   swa_head_dim: Optional[int] = None, swa_v_head_dim: Optional[int] = None,
                   dtype: torch.dtype = torch.bfloat16, device: str = "cpu"):
    """A real ``SWAKVPool`` of the release (MHA sub-pools), on ``device``."""
    kwargs = dict(size=size, size_swa=size_swa, page_size=page_size, dtype=dtype, head_num=head_num,
                  head_dim=head_dim, swa_attention_layer_ids=list(swa_layers),
                  full_attention_layer_ids=list(full_layers), device=device)
    if api.features.pool_takes_transpose_flag:
        kwargs["enable_kvcache_transpose"] = False
    extra = {"v_head_dim": v_head_dim, "swa_head_num": swa_head_num, "swa_head_dim": swa_head_dim,
             "swa_v_head_dim": swa_v_head_dim}
    sub_params = inspect.signature(api.MHATokenToKVPool.__init__).parameters
    for k, v in extra.items():
        if v is None:
            continue
        if k not in sub_params:
            raise EngineError(f"sglang {api.info.version}: MHATokenToKVPool takes no {k} (the adapter cannot "
                              f"build this geometry; use the compact geometry)")
        kwargs[k] = v
    try:
        return api.SWAKVPool(**kwargs)
    except Exception as e:
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if "layer" not in k)
        raise EngineError(f"sglang {api.info.version}: SWAKVPool({args}) failed on {device}: "
                          f"{type(e).__name__}: {e}") from None


def build_full_pool(api: ReleaseAPI, *, size: int, page_size: int, layers: Sequence[int], head_num: int = 1,
                    head_dim: int = COMPACT_WIDTH, dtype: torch.dtype = torch.bfloat16, device: str = "cpu"):
    """A real ``MHATokenToKVPool`` of the release over consecutive layer ids (a model side with no SWA layer: an
    EAGLE draft of full-attention layers gets the plain pool, not the hybrid one)."""
    ids = sorted(layers)
    if ids != list(range(ids[0], ids[0] + len(ids))):
        raise EngineError(f"a plain MHATokenToKVPool covers consecutive layers; got {ids}")
    try:
        return api.MHATokenToKVPool(size=size, page_size=page_size, dtype=dtype, head_num=head_num,
                                    head_dim=head_dim, layer_num=len(ids), device=device, enable_memory_saver=False,
                                    start_layer=ids[0], end_layer=ids[-1])
    except Exception as e:
        raise EngineError(f"sglang {api.info.version}: MHATokenToKVPool(size={size}, layers {ids}) failed on "
                          f"{device}: {type(e).__name__}: {e}") from None


def release_store(api: ReleaseAPI, device: torch.device, *, dtype: torch.dtype = torch.bfloat16,
                  head_num: int = 1, head_dim: int = COMPACT_WIDTH) -> dict:
    """Which store the release's MHA sub-pool runs on ``device`` for these rows, and the index it skips.

    ``{"store": ..., "skip_index": 0 | None, "is_cuda": bool}``; an EngineError where the release's
    store for that device cannot run here (the reason named)."""
    mp = api.modules.get("sglang.srt.mem_cache.memory_pool")
    is_cuda = bool(getattr(mp, "_is_cuda", False))
    v = api.info.version
    if device.type == "cpu":
        if is_cuda:
            raise EngineError(f"sglang {v} was imported where CUDA is available (its is_cuda() is True), so its "
                              f"KV store takes the CUDA path; CPU tensors cannot go through it: run with "
                              f"--device cuda")
        return {"store": "CPU fallback k_cache[loc] = k", "skip_index": None, "is_cuda": False}
    if device.type != "cuda":
        raise EngineError(f"--device {device.type} with --engine: the adapter knows the release's CPU and CUDA "
                          f"stores only")
    if not is_cuda:
        raise EngineError(f"sglang {v}: --device cuda, but the release's is_cuda() was False at import "
                          f"(torch.cuda.is_available() {torch.cuda.is_available()}, torch.version.cuda "
                          f"{torch.version.cuda}): its store would be the CPU path")
    jit, why = _jit_store(mp, head_num * head_dim * torch.empty((), dtype=dtype).element_size())
    skip = _probe_skip(api, device, dtype, head_num, head_dim)
    store = ("JIT store_cache kernel" if jit else f"torch index_put on CUDA (JIT store_cache unavailable: {why})")
    return {"store": store, "skip_index": skip, "is_cuda": True}


def _jit_store(mp, row_bytes: int) -> tuple[bool, str]:
    """The release's own answer (``can_use_store_cache``) and, when it says no, why (its JIT build's error)."""
    can = getattr(mp, "can_use_store_cache", None)
    if can is None:
        return False, "the release has no can_use_store_cache"
    if can(row_bytes):
        return True, ""
    import sys as _sys

    build = getattr(_sys.modules.get(getattr(can, "__module__", "") or ""), "_jit_kvcache_module", None)
    try:
        if build is not None:
            build(row_bytes, row_bytes, 0)
    except Exception as e:
        return False, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return False, "can_use_store_cache said no"


def _probe_skip(api: ReleaseAPI, device: torch.device, dtype: torch.dtype, head_num: int, head_dim: int):
    """Write ones at slots 0 and 1 of a scratch pool through the release's store: 0 if slot 0 stayed zero."""
    pool = build_swa_pool(api, size=8, size_swa=8, page_size=1, full_layers=[0], swa_layers=[1], head_num=head_num,
                          head_dim=head_dim, dtype=dtype, device=str(device))
    rows = torch.ones((2, head_num, head_dim), dtype=dtype, device=device)
    pool.set_kv_buffer(_layer(0), api.KVWriteLoc(torch.tensor([0, 1], dtype=torch.int64, device=device)), rows, rows)
    k = pool.full_kv_pool.k_buffer[0].reshape(pool.full_kv_pool.k_buffer[0].shape[0], -1)
    wrote0, wrote1 = bool((k[0] != 0).any()), bool((k[1] != 0).any())
    if not wrote1:
        raise EngineError(f"sglang {api.info.version}: the release's store on {device} wrote nothing in a probe "
                          f"(slot 1 stayed zero)")
    return None if wrote0 else 0


def _layer(layer_id: int):
    """The part of a RadixAttention layer the pool reads: its global id."""
    return SimpleNamespace(layer_id=layer_id, is_cross_attention=False)


def _is_shape_error(e: BaseException) -> bool:
    msg = str(e)
    return "shape mismatch" in msg or "cannot be broadcast" in msg or "must match the size" in msg \
        or "Size mismatch" in msg


class EnginePool:
    """``PoolWriter`` over the release's ``SWAKVPool``: real routing, real store, real buffers."""

    #: the release's store makes the length check (torch's own shape error): simulator.core.shared.SharedStep runs
    #: no check of ours in front of it and calls it per layer once for each class of backends whose pools hold
    #: the same contents (simulator.memory.pool.PoolClasses, through :meth:`clone`), the store's error every member's
    store_checks_lengths = True

    def __init__(self, api: ReleaseAPI, *, full_size: int, swa_size: int, page_size: int,
                 layers: Sequence[tuple[int, str, int]], mapping: Optional[torch.Tensor] = None,
                 kv_dtype: str = "bf16", device: str | torch.device = "cpu", heads: int = 1,
                 head_dim: int = COMPACT_WIDTH, build: bool = True):
        """``layers``: (global layer id, "full" | "swa", index in its sub-pool), in global order. ``build``
        False: the release's ``SWAKVPool`` is built when first used (:attr:`pool`), not here."""
        if kv_dtype not in _DTYPES:
            raise AdapterLacks(f"the engine pool adapter supports kv_dtype bf16 and fp16, not {kv_dtype!r}")
        self.api = api
        self.device = torch.device(device)
        self._args = dict(full_size=full_size, swa_size=swa_size, page_size=page_size, layers=list(layers),
                          mapping=mapping, kv_dtype=kv_dtype, device=device, heads=heads, head_dim=head_dim)
        #: the release's store on this device (release_store): the CPU fallback absorbs padded rows in
        #: slot 0 (skip_index None); the JIT kernel on CUDA skips slot 0 (skip_index 0)
        self.store_info = _STORES.get((id(api), str(self.device))) or release_store(api, self.device,
                                                                                      dtype=_DTYPES[kv_dtype],
                                                                                      head_num=heads,
                                                                                      head_dim=head_dim)
        _STORES[(id(api), str(self.device))] = self.store_info
        self.skip_index = self.store_info["skip_index"]
        self.page_size = page_size
        self.dtype = _DTYPES[kv_dtype]
        self.heads, self.head_dim = heads, head_dim
        self._global = {kind: {} for kind in ("full", "swa")}
        for g, kind, index in layers:
            self._global[kind][index] = g
        self._rows = {"full": full_size + page_size, "swa": swa_size + page_size}
        self._pool = None
        self._lane_views: dict = {}
        self._oor = {kind: torch.zeros((max(len(self._global[kind]), 1), 2), dtype=torch.int64)
                     for kind in ("full", "swa")}
        for kind in ("full", "swa"):
            self._oor[kind][:, 1] = NO_POSITION
        if build:
            self._build()

    def _build(self) -> None:
        a = self._args
        full_ids = [g for g, kind, _ in a["layers"] if kind == "full"]
        swa_ids = [g for g, kind, _ in a["layers"] if kind == "swa"]
        pool = build_swa_pool(self.api, size=a["full_size"], size_swa=a["swa_size"], page_size=a["page_size"],
                              full_layers=full_ids, swa_layers=swa_ids, head_num=self.heads, head_dim=self.head_dim,
                              dtype=self.dtype, device=str(self.device))
        if a["mapping"] is not None and self.device.type == "cpu":
            # the store never translates (SWA layers get swa_loc); on a GPU the host mapping is not registered
            pool.register_mapping(a["mapping"])
        self._sub_pools = {"full": pool.full_kv_pool, "swa": pool.swa_kv_pool}
        self._pool = pool

    @property
    def pool(self):
        """The release's ``SWAKVPool`` (built here on first use where the constructor was told not to)."""
        if self._pool is None:
            self._build()
        return self._pool

    @property
    def _sub(self) -> dict:
        if self._pool is None:
            self._build()
        return self._sub_pools

    def clone(self) -> "EnginePool":
        """A pool of the release built as this one was (its constructor, the mapping registered), holding
        this pool's K/V contents and out-of-range counters; nothing written later is shared."""
        twin = EnginePool(self.api, **self._args)
        for kind, sub in self._sub.items():
            for bufs, mine in ((twin._sub[kind].k_buffer, sub.k_buffer), (twin._sub[kind].v_buffer, sub.v_buffer)):
                for dst, src in zip(bufs, mine):
                    dst.copy_(src)
            twin._oor[kind].copy_(self._oor[kind])
        return twin

    # --- PoolWriter ---------------------------------------------------------------------------
    def rows(self, kind: str) -> int:
        return self._rows[kind]

    def make_rows(self, tags: torch.Tensor, layer: int, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        k = encode_rows(tags.to(self.device), layer, self.heads, self.head_dim, self.dtype)
        return k, k

    def restamp(self, k: torch.Tensor, v: torch.Tensor, layer: int) -> None:
        set_layer_lane(k, layer)
        if v is not k:
            set_layer_lane(v, layer)

    def store(self, kind: str, index: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write through the release's SWAKVPool.set_kv_buffer at the routed target ``loc``.

        The run loop routes before the store (full layers give ``loc``, SWA layers ``swa_loc``); the
        engine's KVWriteLoc carries the same tensor in both fields, so the pool's own routing picks it
        and the release's ``__post_init__`` has nothing to cut (it ran in the design's make_write_loc).
        """
        wl = self.api.KVWriteLoc(loc, loc) if kind == "swa" else self.api.KVWriteLoc(loc)
        self.set_kv_buffer(self._global[kind][index], wl, k, v, kind=kind, index=index)

    def set_kv_buffer(self, layer_id: int, write_loc, k: torch.Tensor, v: torch.Tensor, *,
                      kind: Optional[str] = None, index: Optional[int] = None) -> None:
        """The release's ``SWAKVPool.set_kv_buffer(layer, write_loc, k, v)``; errors as the protocol names them."""
        if kind is None or index is None:
            index, is_swa = self.pool.layers_mapping[layer_id]
            kind = "swa" if is_swa else "full"
        target = write_loc.swa_loc if kind == "swa" else write_loc.loc
        if target is not None:
            self._count_out_of_range(kind, index, target)
            if self.device.type != "cpu" and self._any_out_of_range(kind, target):
                return      # a device assert in the release's kernel would end the process: nothing written
        try:
            self.pool.set_kv_buffer(_layer(layer_id), write_loc, k, v)
        except IndexError:
            # torch's index_put raised before writing: the layer stores nothing; the checker sees the
            # out-of-range count and the real tokens' rows missing
            if target is None or not self._any_out_of_range(kind, target):
                raise
        except RuntimeError as e:
            if _is_shape_error(e):
                raise KVLengthMismatch(f"{type(e).__name__}: {e}") from None
            raise

    def _any_out_of_range(self, kind: str, target: torch.Tensor) -> bool:
        return bool(target.numel()) and (int(target.min()) < 0 or int(target.max()) >= self._rows[kind])

    def _count_out_of_range(self, kind: str, index: int, target: torch.Tensor) -> None:
        """Count indices outside ``[0, rows)`` as the checker does (the CPU fallback writes a negative
        in-range index at the buffer's end and raises on one past it; both are out of range)."""
        if not self._any_out_of_range(kind, target):
            return
        rows = self._rows[kind]
        bad = ((target < 0) | (target >= rows)).nonzero().flatten()
        cnt = self._oor[kind][index]
        if cnt[0] == 0:
            cnt[1] = int(bad[0])
        cnt[0] += int(bad.numel())

    def _lanes(self, kind: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per layer of ``kind``, the tag lanes of every row of its K and its V buffer (``[rows, TAG_LANES]``
        views of the release's buffers, made once; made again if the sub-pool's buffer lists change)."""
        sub = self._sub[kind]
        key = (id(sub.k_buffer), id(sub.v_buffer), len(sub.k_buffer))
        got = self._lane_views.get(kind)
        if got is None or got[0] != key:
            views = tuple([b.reshape(b.shape[0], -1)[:, :TAG_LANES] for b in bufs]
                          for bufs in (sub.k_buffer, sub.v_buffer))
            got = self._lane_views[kind] = (key, views)
        return got[1]

    def _words(self, kind: str, slots: torch.Tensor, layers: Optional[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The tag lanes of ``slots`` in each layer of ``kind`` (K and V), as int64 words ``[L, n, w]``."""
        idx = slots.to(torch.int64)
        n_words = TAG_LANES * torch.empty((), dtype=self.dtype).element_size() // 8
        out = []
        for views in self._lanes(kind):
            which = views if layers is None else [views[i] for i in layers]
            if not which:
                out.append(torch.zeros((0, idx.numel(), n_words), dtype=torch.int64))
                continue
            rows = torch.empty((len(which), idx.numel(), TAG_LANES), dtype=self.dtype, device=which[0].device)
            for i, view in enumerate(which):
                torch.index_select(view, 0, idx, out=rows[i])
            out.append(rows.view(torch.int64)[:, :, :n_words])
        return out[0], out[1]

    def mismatches(self, kind: str, slots: torch.Tensor, expected: torch.Tensor,
                   layers: Optional[list[int]] = None) -> torch.Tensor:
        want = tag_lanes(expected, self.dtype).contiguous().view(torch.int64)
        kw, vw = self._words(kind, slots, layers)
        return (kw != want).any(dim=-1) | (vw != want).any(dim=-1)

    def read_tags(self, kind: str, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kw, vw = self._words(kind, slots, None)
        return tuple(decode_tags(w.view(self.dtype)) for w in (kw, vw))

    def take_out_of_range(self, kind: str) -> torch.Tensor:
        out = self._oor[kind].clone()
        self._oor[kind][:, 0] = 0
        self._oor[kind][:, 1] = NO_POSITION
        return out

    @property
    def found(self) -> dict:
        """What this adapter found in the release's pool."""
        k0, v0 = self.pool.full_kv_pool.k_buffer[0], self.pool.full_kv_pool.v_buffer[0]
        return {"pool_takes_transpose_flag": self.api.features.pool_takes_transpose_flag,
                "kv_halves_of_one_allocation": k0.untyped_storage().data_ptr() == v0.untyped_storage().data_ptr(),
                "layout": getattr(self.pool.full_kv_pool, "kv_cache_layout", "nhd")}

    # --- what the report names -----------------------------------------------------------------
    def describe(self) -> dict:
        return {"pool": f"{type(self.pool).__module__}.{type(self.pool).__name__}", "found": self.found,
                "store": f"{type(self.pool.full_kv_pool).__name__}.set_kv_buffer ({self.store_info['store']})",
                "device": str(self.device), "skip_index": self.skip_index,
                "engine": self.api.info.to_json()}
