"""Per backend of the release: how it is built over the runner stand-in, what of it cannot run here and is
replaced (named in ``engine_pieces``), and where its forward keeps the tables its attention reads.

An :class:`Adapter` is the only backend-specific code of the engine forward: the metadata, the write locations
and the narrowing are the release's own for every backend it covers. A backend without an adapter stays the
model's boundary in engine mode, and the run says so (``engine_pieces``, per backend and piece).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from simulator.designs.types import ReadIds, ReadTable

REGISTRY = "sglang.srt.layers.attention.attention_registry"


@dataclass(frozen=True)
class Piece:
    """One piece of a backend's forward and whose code ran it: "engine" (the release's) or "model" (ours)."""

    piece: str
    whose: str
    why: str = ""


@dataclass
class Adapter:
    """How one backend of the release is driven here."""

    name: str
    #: the attention arithmetic replaced where it cannot run here (attribute name on the backend -> why)
    replaced: dict[str, str] = field(default_factory=dict)
    #: its read tables from the backend's forward metadata (None: the model's tables, ``reads_why`` says why);
    #: ``reads(backend, fb, bs)`` reads the metadata from ``backend.<metadata_attr>``: in a decode-graph replay
    #: that attribute holds the capture-time metadata (engine_path/forward/graphs.py), as the graph's kernels read it
    reads: Optional[Callable] = None
    reads_why: str = ""
    #: graph paths: the backend attribute holding its forward metadata (every 0.5.23 backend: ``forward_metadata``).
    #: The decode-graph runner keeps the object a capture leaves there per capture size and puts it back for the
    #: replay's in-graph prep (``init_forward_metadata_in_graph``) and for ``reads``. The rest of a graph path is
    #: the release's generic API (``init_cuda_graph_state``, ``init_forward_metadata_out_graph``,
    #: ``get_cuda_graph_seq_len_fill_value``); a backend that raises there runs that path as the model's (named)
    metadata_attr: str = "forward_metadata"

    def build(self, bag, device: str):
        """The release's backend over the stand-in; its attention arithmetic replaced on a CPU only (on a GPU
        the release's own kernels run)."""
        backend = importlib.import_module(REGISTRY).ATTENTION_BACKENDS[self.name](bag)
        if device == "cpu":
            for attr in self.replaced:
                setattr(backend, attr, _no_op)
        return backend

    def pieces(self, device: str = "cpu") -> list[Piece]:
        out = [Piece("backend constructor", "engine"), Piece("init_forward_metadata", "engine"),
               Piece("RadixAttention.forward (per-layer narrowing)", "engine"),
               Piece("forward_extend / forward_decode up to set_kv_buffer (the write location)", "engine")]
        out += [Piece(f"attention arithmetic: {attr}", "model", f"replaced by a no-op on the CPU: {why}")
                if device == "cpu" else Piece(f"attention arithmetic: {attr}", "engine") for attr, why in self.replaced.items()]
        out.append(Piece("read tables", "engine") if self.reads is not None else
                   Piece("read tables", "model", self.reads_why))
        return out


def _no_op(*args, **kwargs) -> None:
    """Stands in for an attention kernel: the write path needs its inputs, not its output."""
    return None


def _csr(indptr: torch.Tensor, indices: torch.Tensor, start: torch.Tensor, bs: int) -> ReadIds:
    ptr = indptr[: bs + 1].to(torch.int64)
    n = int(ptr[-1])
    return ReadIds(ptr.cpu(), indices[:n].to(torch.int64).cpu(), start.to(torch.int64).cpu())


def triton_reads(backend, fb, bs: int) -> Optional[ReadTable]:
    """triton's tables: ``kv_indptr`` / ``kv_indices`` (full layers: the prefix in extend, the whole sequence in
    decode, from position 0) and ``window_kv_indptr`` / ``window_kv_indices`` (SWA layers, already SWA ids: the
    last entries before the window's end, which is the prefix's end in extend and the sequence's in decode)."""
    m = backend.forward_metadata
    if m is None or m.kv_indptr is None:
        return None
    full = _csr(m.kv_indptr, m.kv_indices, torch.zeros(bs, dtype=torch.int64), bs)
    swa = None
    if m.window_kv_indptr is not None and m.window_kv_indices is not None:
        end = fb.seq_lens if fb.forward_mode.is_decode() else fb.extend_prefix_lens
        ptr = m.window_kv_indptr[: bs + 1].to(torch.int64)
        start = end[:bs].to(torch.int64) - (ptr[1:] - ptr[:-1])
        swa = _csr(ptr, m.window_kv_indices, start, bs)
    return ReadTable(full=full, swa=swa)


#: why torch_native's attention arithmetic is replaced on a CPU (its store runs before it, unreplaced)
_NATIVE_SDPA = ("torch SDPA over req_to_token rows: on the hybrid pool it reads an SWA layer's K/V at full-pool ids "
                "(IndexError once a full slot passes the SWA pool's size)")


#: the adapters written so far, by backend
ADAPTERS: dict[str, Adapter] = {
    "torch_native": Adapter(
        "torch_native",
        replaced={"_run_sdpa_forward_extend": _NATIVE_SDPA, "_run_sdpa_forward_decode": _NATIVE_SDPA},
        reads_why="torch_native builds no read table: its forward indexes req_to_token itself"),
    "triton": Adapter(
        "triton",
        replaced={"extend_attention_fwd": "a Triton kernel (interpreted on a CPU: too slow for a run)",
                  "extend_attention_fwd_unified": "a Triton kernel", "decode_attention_fwd": "a Triton kernel"},
        reads=triton_reads),
}
