"""Kernel stand-ins: a release's Triton kernel computed by vectorised torch on CPU tensors, only for the source it was
checked against.

An engine's metadata and worker kernels launch one program per request row (sometimes per column block too); under
Triton's interpreter (``TRITON_INTERPRET=1``, a CPU run) each program costs milliseconds. A :class:`KernelModel` is
what one kernel stores, as torch ops over the same pointers and strides the kernel is handed (``grid``, the bound
arguments); :class:`StandIn` takes the kernel's launches on CPU tensors and hands a launch back to the kernel itself
when an argument is on another device, the grid is not a tuple, or the model raises :class:`OutOfBounds` (an access
outside a tensor, or a launch whose result the model cannot be sure of: the kernel's behaviour there is the
memory's). A :class:`StandInSet` installs the stand-ins of one engine's models in the engine's modules, each only
where the sha256 of the kernel's source (and of the ``@triton.jit`` helpers it calls) is one its model was checked
against: a kernel an ``--engine-patch`` edited, or another release's, is interpreted, and ``pieces()`` says which
ran. ``SLOTSCOPE_INTERPRET_KERNELS=1`` interprets every kernel.

The models: SGLang's metadata kernels (engine_path/forward/kernels.py), vLLM's worker kernels
(engine_path/vllm/kernels.py); each module's ``self_check`` compares its models with the interpreted kernels.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import sys
from dataclasses import dataclass
from typing import Callable, Optional

import torch

I64 = torch.int64


class OutOfBounds(Exception):
    """An access the kernel would make lies outside its tensor: the launch goes to the kernel itself."""


def tdiv(a: torch.Tensor, b) -> torch.Tensor:
    """Triton's integer ``//``: truncation toward zero (``sdiv``), not Python's floor."""
    return torch.div(a, b, rounding_mode="trunc")


def runs(lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For runs of ``lens`` (at least 0) entries laid one after another: each entry's run and its index within it
    (what a kernel's per-row loops over ``lens[i]`` entries visit, flattened)."""
    run = torch.repeat_interleave(torch.arange(lens.numel()), lens)
    return run, torch.arange(run.numel(), dtype=I64) - (torch.cumsum(lens, 0) - lens)[run]


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``t``'s storage from its first element to the storage's end, as a 1-D tensor (what a pointer reaches)."""
    n = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    return t.as_strided((max(n, 0),), (1,))


def _at(t: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the flat view of ``t``, ``offsets`` as int64) once every offset is inside it; OutOfBounds otherwise."""
    flat = _flat(t)
    offsets = offsets.to(I64)
    if offsets.numel() and (int(offsets.min()) < 0 or int(offsets.max()) >= flat.numel()):
        raise OutOfBounds
    return flat, offsets


def load_at(t: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``t``'s storage at ``offsets`` (from its first element, as a pointer reaches it); OutOfBounds outside it."""
    flat, offsets = _at(t, offsets)
    return flat[offsets]


class Stores:
    """A launch's stores, each checked in bounds when it is made and written only by :meth:`apply`, after every
    load: a launch that meets an access out of bounds has changed nothing when it goes to the kernel."""

    def __init__(self):
        self.pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def __call__(self, t: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor) -> None:
        flat, offsets = _at(t, offsets)
        self.pending.append((flat, offsets, values.to(flat.dtype)))

    def fill_block(self, t: torch.Tensor, rows: torch.Tensor, cols: int, s0: int, s1: int, value) -> None:
        """``value`` at ``r * s0 + c * s1`` for each r of ``rows`` and c < ``cols``: a strided view when the rows
        are consecutive and the block is one that strides can hold without overlap, else as offsets."""
        if not rows.numel() or cols <= 0:
            return
        flat = _flat(t)
        first, n = int(rows[0]), rows.numel()
        consecutive = int(rows[-1]) - first == n - 1
        if consecutive and s1 > 0 and s0 >= cols * s1:
            if first < 0 or (first + n - 1) * s0 + (cols - 1) * s1 >= flat.numel():
                raise OutOfBounds
            view = flat[first * s0:].as_strided((n, cols), (s0, s1))
            self.pending.append((view, None, value))
            return
        offsets = (rows[:, None] * s0 + torch.arange(cols, dtype=I64)[None, :] * s1).reshape(-1)
        self(t, offsets, torch.full(offsets.shape, value, dtype=flat.dtype))

    def apply(self) -> None:
        for flat, offsets, values in self.pending:
            if offsets is None:
                flat.fill_(values)          # a block (fill_block)
            else:
                flat[offsets] = values



@dataclass(frozen=True)
class KernelModel:
    """One release kernel computed by torch: where it lives, the ``@triton.jit`` helpers it calls, the sha256 of
    the sources (kernel then helpers) the model was checked against, and what it computes."""

    module: str
    name: str
    helpers: tuple[str, ...]
    checked: frozenset[str]
    compute: Callable[..., None]
    what: str

    def fingerprint(self) -> Optional[str]:
        """The sha256 of the release's kernel and helpers as loaded now; None when a source cannot be read
        (an edited kernel compiled from a string) or a name is missing."""
        try:
            mod = importlib.import_module(self.module)
            text = "".join(inspect.getsource(_jit_fn(getattr(mod, n))) for n in (self.name, *self.helpers))
        except (ImportError, AttributeError, OSError, TypeError):
            return None
        return hashlib.sha256(text.encode()).hexdigest()


def _jit_fn(obj):
    obj = obj.kernel if isinstance(obj, StandIn) else obj
    return getattr(obj, "fn", obj)

class StandIn:
    """``kernel[grid](...)`` of a :class:`KernelModel`'s kernel, on CPU tensors computed by torch."""

    def __init__(self, kernel, model: KernelModel):
        self.kernel, self.model = kernel, model
        params = inspect.signature(kernel.fn).parameters.values()
        if any(p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params):
            raise TypeError(f"{model.name}: a kernel with variadic or positional-only parameters")
        #: the kernel's parameters in order and their defaults: a launch's arguments bound as Signature.bind binds
        #: them (a tenth of its cost; launches are per forward and per capture size)
        self.names = tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)
        self.known = frozenset(p.name for p in params)
        self.defaults = {p.name: p.default for p in params if p.default is not p.empty}
        self.launches = 0          # computed by the model
        self.handed_back = 0       # run by the kernel (another device, an access out of bounds)

    def bind(self, args: tuple, kwargs: dict) -> dict:
        """The launch's arguments by name, defaults filled; the kernel's launch options (``num_warps``...) left
        out. TypeError as ``Signature.bind`` raises it for too many positional arguments or one given twice."""
        if len(args) > len(self.names):
            raise TypeError(f"{self.model.name}: {len(args)} positional arguments, {len(self.names)} parameters")
        a = dict(self.defaults)
        a.update(zip(self.names, args))
        for k, v in kwargs.items():
            if k in self.known:
                if k in self.names[:len(args)]:
                    raise TypeError(f"{self.model.name}: multiple values for argument {k!r}")
                a[k] = v
        return a

    def __getitem__(self, grid):
        if not isinstance(grid, tuple):
            return self.kernel[grid]

        def launch(*args, **kwargs):
            a = self.bind(args, kwargs)
            if any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in a.values()):
                self.handed_back += 1
                return self.kernel[grid](*args, **kwargs)
            store = Stores()
            try:
                self.model.compute(store, grid, **a)
            except OutOfBounds:
                self.handed_back += 1
                return self.kernel[grid](*args, **kwargs)
            store.apply()
            self.launches += 1
        return launch


class StandInSet:
    """One engine's kernel models and their installed stand-ins (``prefix``: the engine's top-level package, whose
    imported modules hold the kernels by name)."""

    def __init__(self, models: tuple[KernelModel, ...], prefix: str, why: str):
        self.models, self.prefix, self.why = models, prefix, why
        self._installed: dict[str, StandIn] = {}
        self._refused: dict[str, str] = {}
        self._passed: tuple[int, int] = (-1, -1)   # (modules, stand-ins) at the last pass over the engine's modules

    def install(self) -> dict[str, StandIn]:
        """Each model's stand-in in every imported module of the engine holding its kernel by name (idempotent); a
        kernel whose source is not one its model was checked against is left to the interpreter (:meth:`refused`
        says why). Nothing is stood in under ``SLOTSCOPE_INTERPRET_KERNELS=1``."""
        if os.environ.get("SLOTSCOPE_INTERPRET_KERNELS") == "1":
            return {}
        for m in self.models:
            if m.name not in self._installed and m.name not in self._refused:
                try:
                    kernel = getattr(importlib.import_module(m.module), m.name)
                except (ImportError, AttributeError):
                    continue
                if isinstance(kernel, StandIn) or not callable(getattr(kernel, "fn", None)):
                    continue
                got = m.fingerprint()
                if got not in m.checked:
                    self._refused[m.name] = ("interpreted: its source (sha256 " + (got[:12] if got else "unreadable")
                                             + ") is not the one the stand-in was checked against")
                    continue
                self._installed[m.name] = StandIn(kernel, m)
        # one pass over the engine's modules for every stand-in (~7 ms with a release imported), none while no module
        # was imported and no stand-in made since the last (a pass missed leaves a kernel interpreted: slower, as
        # exact)
        key = (len(sys.modules), len(self._installed))
        if key == self._passed:
            return dict(self._installed)
        self._passed = key
        stand_ins = list(self._installed.items())
        mods = [mod for name, mod in list(sys.modules.items()) if name.startswith(self.prefix) and mod is not None]
        for mod in mods:
            d = getattr(mod, "__dict__", None)
            if d is None:
                continue
            for name, s in stand_ins:
                if d.get(name) is s.kernel:
                    setattr(mod, name, s)
        return dict(self._installed)

    def installed(self) -> dict[str, StandIn]:
        return dict(self._installed)

    def refused(self) -> dict[str, str]:
        """Kernels with a model whose release source differs from the checked one (interpreted), and why."""
        return dict(self._refused)

    def pieces(self) -> list[tuple[str, str, str]]:
        """``(piece, whose, why)`` of every modelled kernel of the release: stood in ("model") or interpreted."""
        out = [(f"{name} ({s.model.what})", "model", self.why) for name, s in self._installed.items()]
        out += [(f"{name}", "engine", why) for name, why in self._refused.items()]
        return out
