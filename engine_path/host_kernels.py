"""The host allocator's Triton kernels on a GPU run: the release's own kernels, natively, over device copies.

Engine mode keeps the release's allocators as host bookkeeping (their free lists and ``full_to_swa`` mapping on
the CPU, where the run loop and the oracle read them). At page size > 1 the release's paged ``alloc_extend`` /
``alloc_decode`` (``PagedTokenToKVPoolAllocator``, and the unified allocator's sub-pools) launch the Triton kernels
``alloc_extend_kernel`` / ``alloc_decode_kernel``, which take GPU tensors only where Triton runs natively. On a CPU
engine_path.shims sets ``TRITON_INTERPRET=1`` and the interpreter runs them on the host tensors; on a GPU run
:func:`install` puts a :class:`DeviceBridge` in the release's modules in their place: each launch copies its
tensor arguments to the device, runs the release's kernel there with the same grid and scalars, and copies every
tensor argument back into the host tensor it came from (the kernel's outputs are written in place). So the code
that decides which slots a paged allocation hands out is the release's kernel, compiled for the GPU, and nothing
else of the host bookkeeping moves.

A launch whose tensors are already on the device goes to the kernel as it is. ``launches`` counts the bridged ones
(run.json's ``engine_pieces`` rows say which kernels were bridged and how often: :func:`pieces`).
"""
from __future__ import annotations

import sys

import torch

#: the release's allocator kernels that take device tensors only, by module global name
KERNELS = ("alloc_extend_kernel", "alloc_decode_kernel")


class DeviceBridge:
    """``kernel[grid](...)`` with host tensors: the kernel on ``device``, over copies, the results copied back."""

    def __init__(self, kernel, device: str):
        self.kernel, self.device = kernel, torch.device(device)
        self.launches = 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            host = [a for a in list(args) + list(kwargs.values())
                    if isinstance(a, torch.Tensor) and a.device != self.device]
            if not host:
                return self.kernel[grid](*args, **kwargs)
            moved = {id(t): t.to(self.device) for t in host}
            out = self.kernel[grid](*[moved.get(id(a), a) if isinstance(a, torch.Tensor) else a for a in args],
                                    **{k: moved.get(id(v), v) if isinstance(v, torch.Tensor) else v
                                       for k, v in kwargs.items()})
            for t in host:
                t.copy_(moved[id(t)])           # a synchronising copy: the host bookkeeping reads it next
            self.launches += 1
            return out
        return launch


_bridges: dict[str, DeviceBridge] = {}


def install(device: str, names=KERNELS) -> dict[str, DeviceBridge]:
    """A bridge for each named kernel in every imported module of the release that holds it (idempotent)."""
    for name, mod in list(sys.modules.items()):
        if not name.startswith("sglang") or mod is None:
            continue
        for k in names:
            kernel = getattr(mod, k, None)
            if kernel is None or isinstance(kernel, DeviceBridge):
                continue
            bridge = _bridges.get(k)
            if bridge is None or bridge.kernel is not kernel or bridge.device != torch.device(device):
                bridge = _bridges[k] = DeviceBridge(kernel, device)
            setattr(mod, k, bridge)
    return dict(_bridges)


def pieces() -> list[str]:
    """run.json's ``engine_pieces`` rows for the bridged kernels (none where nothing was bridged)."""
    return [f"{name} (the release's Triton kernel on {b.device}, over device copies of the host allocator's tensors: "
            f"{b.launches} launches)" for name, b in _bridges.items()]
