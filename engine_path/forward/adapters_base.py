"""What every backend adapter shares: :class:`Adapter` (how one backend of the release is built and driven here),
:class:`Piece` (whose code ran a piece of its forward), the kernel stand-ins, and the read-table builders that
turn a backend's own metadata into the simulator's :class:`~simulator.designs.types.ReadTable`.

An adapter replaces only the attention arithmetic (the kernels: their outputs feed nothing on the write path) and
the platform pieces a CPU lacks; each replacement is named, with why, in :meth:`Adapter.pieces` (run.json's
``engine_pieces``). Where a replaced piece is a module global of the release (a kernel bound at import, a
platform library's class) it is set in that module's namespace, never by editing the release's source.

Read tables (per request a run of consecutive positions from ``start``, ``ReadIds``) come from the tables the
backend built for this forward, with the positions its kernels read: a page-table backend reads, for a request
of ``cache_seqlens`` tokens whose queries start at ``P0 = cache_seqlens - q_len``, positions ``0 ..
cache_seqlens - 1`` on full layers and ``max(0, P0 - left) .. cache_seqlens - 1`` on SWA layers, ``left`` being
its kernels' left window (:func:`page_table_reads`).
"""
from __future__ import annotations

import importlib
import importlib.machinery
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from simulator.designs.types import ReadIds, ReadTable
from simulator.oracle.read_rules import ReadSpan

from .. import shims

REGISTRY = "sglang.srt.layers.attention.attention_registry"
@dataclass(frozen=True)
class TableSpan:
    """The positions a backend's read tables hold per request, as its kernels read them, where the release is
    given ``sliding_window_size = W`` (the scenario's window; SGLang's models give ``W - 1``, a radius,
    sglang#32087). For a request of ``seq`` positions whose new tokens start at ``P0 = seq - extend_len``: full
    layers ``[0, end)``, SWA layers ``[max(0, P0 - left), end)``, ``left = W + decode_left`` in a decode and
    ``W + extend_left`` otherwise; ``end`` is ``seq``, or ``P0`` in an extend whose kernels read the new tokens
    from the forward's own K/V (``prefix_only``: the tables hold the prefix). ``why`` names the kernels' rule."""

    decode_left: int
    extend_left: int
    prefix_only: object          # bool, or ``(backend) -> bool`` where the backend decides per forward
    why: str

    def spans(self, backend, seq_lens, extend_lens, window: int, decode: bool) -> dict:
        """``{"full": ReadSpan, "swa": ReadSpan}`` for one forward's requests (numpy int64 arrays)."""
        seq = np.asarray(seq_lens, dtype=np.int64)
        first = seq - np.asarray(extend_lens, dtype=np.int64)
        prefix = not decode and (self.prefix_only(backend) if callable(self.prefix_only) else self.prefix_only)
        end = first if prefix else seq
        left = window + (self.decode_left if decode else self.extend_left)
        return {"full": ReadSpan(np.zeros_like(seq), end, "prefix"),
                "swa": ReadSpan(np.maximum(first - left, 0), end, "window", int(left) + 1)}


#: the spans of the release's tables, per kernel family (each adapter names its own)
SPAN_FA = TableSpan(0, 0, False, "window_size = (W, 0): W + 1 keys ending at each query, over the whole sequence")
SPAN_UNIFIED = TableSpan(-1, -1, False, "unified_attention's window (W - 1, 0): W keys ending at each query")
SPAN_RAGGED = TableSpan(0, 0, lambda backend: bool(backend.forward_metadata.use_ragged),
                   "window_left = W: W + 1 keys; a ragged extend's new tokens come from the forward's K/V, its paged "
                   "tables hold the prefix")
SPAN_TRITON = TableSpan(-1, 0, True, "its decode kernel reads the last W keys (one fewer than the FA-shaped kernels: "
                                "sglang#32087), its extend W before the first new token; an extend's new tokens "
                                "come from the forward's K/V, the tables hold the prefix")


@dataclass(frozen=True)
class Piece:
    """One piece of a backend's forward and whose code ran it: "engine" (the release's) or "model" (ours)."""

    piece: str
    whose: str
    why: str = ""


@dataclass
class Adapter:
    """How one backend of the release is driven here.

    The first four fields are the original interface (an adapter made with them alone behaves as it always did:
    the registry's factory over the stand-in, the named backend attributes no-op'd on a CPU). The others are
    optional, each a name -> why table shown in :meth:`pieces`; a family's subclass supplies their values through
    the hooks :meth:`view`, :meth:`install`, :meth:`kernel` and :meth:`finish`, run by :meth:`build` on a CPU only.
    """

    name: str
    #: the attention arithmetic replaced where it cannot run here (attribute name on the backend -> why)
    replaced: dict[str, str] = field(default_factory=dict)
    #: its read tables from the backend's forward metadata (None: the model's tables, ``reads_why`` says why);
    #: ``reads(backend, fb, bs)`` reads the metadata from ``backend.<metadata_attr>``: in a decode-graph replay
    #: that attribute holds the capture-time metadata (engine_path/forward/graphs.py), as the graph's kernels read it
    reads: Optional[Callable] = None
    reads_why: str = ""
    #: whether ``reads`` also reads an EAGLE round's tables (a verify's, a draft step's child's, a draft extend's)
    round_reads: bool = False
    #: the positions those tables hold, by the backend's kernels' rule (None: their span is not checked)
    span: Optional[TableSpan] = None
    #: module globals of the release set on a CPU ("module:name" -> why): kernels bound at import, platform fakes
    shims: dict[str, str] = field(default_factory=dict)
    #: native packages stubbed for the backend's import and construction (root -> why); a stub raises if called
    stubs: dict[str, str] = field(default_factory=dict)
    #: model-runner stand-in attributes this backend sees changed (dotted name -> why); see :meth:`view`
    stand_in: dict[str, str] = field(default_factory=dict)
    #: "module:Class" constructed directly instead of the registry's factory ("": the factory), and why
    factory: str = ""
    factory_why: str = ""
    #: graph paths: the backend attribute holding its forward metadata (every 0.5.23 backend: ``forward_metadata``).
    #: The decode-graph runner keeps the object a capture leaves there per capture size and puts it back for the
    #: replay's in-graph prep (``init_forward_metadata_in_graph``) and for ``reads``. The rest of a graph path is
    #: the release's generic API (``init_cuda_graph_state``, ``init_forward_metadata_out_graph``,
    #: ``get_cuda_graph_seq_len_fill_value``); a backend that raises there runs that path as the model's (named)
    metadata_attr: str = "forward_metadata"
    #: the release's multi-step draft backend, "module:Class" built ``(runner, topk, speculative_num_steps)`` as its
    #: ``DraftBackendFactory`` builds it: an EAGLE draft's decode steps, one child backend a step ("": none)
    multistep: str = ""
    #: platform packages the backend's kernels come from that are not stubbed for its import (flashinfer: its
    #: module imports them only where CUDA is): where one is not installed, the kernels are replaced here too
    needs: tuple[str, ...] = ()
    #: module globals bound from a platform package that the constructor calls ("module:name" -> (value, why)):
    #: set on any device where the global is a slotscope stub (the package is not installed), else left alone
    platform: dict[str, tuple] = field(default_factory=dict)

    def stand_ins(self, device: str) -> bool:
        """Whether this backend's kernels are replaced here: on a CPU, and on a GPU whose image lacks a platform
        package the backend's kernels come from (xpu's sgl_kernel on an H200): there the release's own
        kernels run."""
        # (the real finders only: on CUDA slotscope's own native-package stubs answer for sgl_kernel, flashinfer)
        return device == "cpu" or any(importlib.machinery.PathFinder.find_spec(root) is None
                                      for root in (*self.stubs, *self.needs))

    def build(self, bag, device: str, steps: Optional[int] = None):
        """The release's backend over the stand-in; its attention arithmetic replaced where it cannot run
        (:meth:`stand_ins`). ``steps``: the multi-step draft backend of ``steps`` draft steps instead (its
        children, one a step but the last, replaced alike)."""
        stand = self.stand_ins(device)
        bag = self.view(bag)           # the run's runner stand-in corrected for this backend, on every device
        with shims.stubbed_imports(tuple(self.stubs) if stand else ()):
            self.platform_set = self._set_platform_globals()
            if stand:
                self.install(bag)
            backend = self.construct(bag, steps)
        if stand:
            for one in (backend.attn_backends if steps is not None else (backend,)):
                for attr in self.replaced:
                    setattr(one, attr, self.kernel(attr))
                self.finish(one, bag)
        return backend

    def _set_platform_globals(self) -> list[str]:
        """Set the :attr:`platform` globals whose module holds a slotscope stub there; the names set."""
        done = []
        for target, (value, _) in self.platform.items():
            mod, _, name = target.partition(":")
            m = importlib.import_module(mod)
            if shims.is_stub(getattr(m, name, None)):
                setattr(m, name, value)
                done.append(target)
        return done

    def construct(self, bag, steps: Optional[int] = None):
        if steps is not None:
            mod, _, cls = self.multistep.partition(":")
            return getattr(importlib.import_module(mod), cls)(bag, 1, steps)       # topk 1: chain drafting
        if self.factory:
            mod, _, cls = self.factory.partition(":")
            return getattr(importlib.import_module(mod), cls)(bag)
        return importlib.import_module(REGISTRY).ATTENTION_BACKENDS[self.name](bag)

    # hooks of a family (the base does nothing)
    def view(self, bag):
        """The stand-in as this backend sees it (:attr:`stand_in` names what changes); the base: unchanged."""
        return bag

    def install(self, bag) -> None:
        """Set the module globals :attr:`shims` names (imports the backend's module, under its stubs)."""

    def kernel(self, attr: str) -> Callable:
        """The stand-in for the replaced backend attribute ``attr``: a no-op unless the family says otherwise."""
        return no_op

    def finish(self, backend, bag) -> None:
        """After construction (a family's probes on the backend instance)."""

    def pieces(self, device: str = "cpu") -> list[Piece]:
        cpu, stand = device == "cpu", self.stand_ins(device)
        where = "on the CPU" if cpu else "here (a platform package is not installed)"
        how = f"built by {self.factory} ({self.factory_why})" if self.factory else ""
        out = [Piece("backend constructor", "engine", how), Piece("init_forward_metadata", "engine"),
               Piece("RadixAttention.forward (per-layer narrowing)", "engine"),
               Piece("forward_extend / forward_decode up to set_kv_buffer (the write location)", "engine")]
        out += [Piece(f"attention arithmetic: {attr}", "model", f"replaced by a no-op {where}: {why}")
                if stand else Piece(f"attention arithmetic: {attr}", "engine") for attr, why in self.replaced.items()]
        if stand:
            out += [Piece(f"module global {name}", "model", f"set {where}: {why}") for name, why in self.shims.items()]
            out += [Piece(f"import stub: {root}", "model", f"stubbed where not installed (calling it raises): {why}")
                    for root, why in self.stubs.items()]
        out += [Piece(f"module global {name}", "model", f"set here (its platform package is not installed): "
                      f"{self.platform[name][1]}") for name in getattr(self, "platform_set", ())]
        out += [Piece(f"model-runner stand-in: {name}", "model", why) for name, why in self.stand_in.items()]
        if self.reads is None:
            out.append(Piece("read tables", "model", self.reads_why))
        else:
            out.append(Piece("read tables", "engine"))
            out.append(Piece("read tables' span", "model", f"held to its kernels' rule: {self.span.why}")
                       if self.span is not None else Piece("read tables' span", "model", "not checked"))
        return out


def no_op(*args, **kwargs) -> None:
    """Stands in for an attention kernel: the write path needs its inputs, not its output."""
    return None


def attention_output(*args, **kwargs):
    """Stands in for an attention kernel whose caller uses its output's shape: zeros shaped like the query (the
    first argument, or ``q`` / ``query``; a tuple's first, as trtllm's fmha_v2 prefill takes ``(q, kv_cache)``),
    written into ``out`` where the caller passes one; with ``return_softmax_lse`` / ``return_lse`` a zero LSE too."""
    q = kwargs.get("q", kwargs.get("query", args[0] if args else None))
    if isinstance(q, (tuple, list)):
        q = q[0]
    out = kwargs.get("out")
    if out is None:
        dtype = kwargs.get("out_dtype") or q.dtype
        out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    if kwargs.get("return_softmax_lse") or kwargs.get("return_lse"):
        lse = torch.zeros(q.shape[:-1], dtype=torch.float32, device=q.device)
        return out, lse, None
    return out


def csr(indptr: torch.Tensor, indices: torch.Tensor, start: torch.Tensor, bs: int) -> ReadIds:
    """A CSR read table (``indptr`` of ``bs + 1``) as ReadIds on the host, int64."""
    ptr = indptr[: bs + 1].to(torch.int64)
    n = int(ptr[-1])
    return ReadIds(ptr.cpu(), indices[:n].to(torch.int64).cpu(), start.to(torch.int64).cpu())


def csr_ending_at(indptr: torch.Tensor, indices: torch.Tensor, end: torch.Tensor, bs: int) -> ReadIds:
    """A CSR table whose request i's entries are the positions ending just before ``end[i]`` (its entries the
    last ``indptr[i + 1] - indptr[i]`` positions before it)."""
    ptr = indptr[: bs + 1].to(torch.int64).cpu()
    return csr(ptr, indices, end[:bs].to(torch.int64).cpu() - (ptr[1:] - ptr[:-1]), bs)


def page_reads(page_table: torch.Tensor, page_size: int, start: torch.Tensor, end: torch.Tensor) -> ReadIds:
    """Positions ``start[i] .. end[i] - 1`` of request i through row i of a page table: the slot of position p is
    ``page_table[i, p // page_size] * page_size + p % page_size`` (at page size 1 the table holds slots). A
    position past the table's width (a kernel would read beyond the row) reads slot -1, which is never live."""
    start = start.to(torch.int64).cpu().clamp(min=0)
    end = torch.maximum(end.to(torch.int64).cpu(), start)
    lens = end - start
    indptr = torch.zeros(lens.shape[0] + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(lens, 0)
    row = torch.repeat_interleave(torch.arange(lens.shape[0]), lens)
    pos = torch.arange(int(indptr[-1]), dtype=torch.int64) - indptr[:-1][row] + start[row]
    col = pos // page_size
    width = page_table.shape[1]
    if not width:
        return ReadIds(indptr, torch.full_like(pos, -1), start)
    # only the entries read are gathered (and widened): a table's rows are as wide as the context
    dev = page_table.device
    entry = page_table[row.to(dev), col.clamp(max=width - 1).to(dev)].to(torch.int64).cpu()
    slots = torch.where(col < width, entry * page_size + pos % page_size, torch.full_like(pos, -1))
    return ReadIds(indptr, slots, start)


def page_table_reads(full_table, swa_table, cache_seqlens: torch.Tensor, q_lens: torch.Tensor, page_size: int,
                     left: int) -> ReadTable:
    """The tables of a page-table backend (see the module docstring): full layers read every position before
    ``cache_seqlens``, SWA layers the window of every query, ``left`` positions before the first (a kernel's
    ``window_size = (left, 0)``). ``swa_table`` None: SWA layers read nothing of their own (not checked)."""
    seq = cache_seqlens.to(torch.int64).cpu()
    full = page_reads(full_table, page_size, torch.zeros_like(seq), seq) if full_table is not None else None
    swa = None
    if swa_table is not None:
        first = seq - q_lens.to(torch.int64).cpu()
        swa = page_reads(swa_table, page_size, first - left, seq)
    return ReadTable(full=full, swa=swa)


def lens_of(indptr: torch.Tensor, bs: int) -> torch.Tensor:
    """Per-request lengths of a cumulative (``cu_seqlens``-style) tensor of ``bs + 1`` entries."""
    ptr = indptr[: bs + 1].to(torch.int64).cpu()
    return ptr[1:] - ptr[:-1]
