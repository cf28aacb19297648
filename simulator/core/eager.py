"""The eager layer executor: one backend's layers written from Python, one after another.

The step pipeline hands a backend's forward to a layer executor (simulator/core/pipeline.py, the
per-forward grain). :class:`EagerExecutor` runs every layer in Python, as an engine without CUDA graphs
would; cuda_path's ``CudaGraphExecutor`` captures and replays the same writes in real CUDA graphs. Both
report the same :class:`~simulator.oracle.checker.LayerWrite` log and the same boundary observations, so
the checker and the tracer cannot tell them apart. On the CPU it offers the shared-pool step
(:class:`~simulator.core.shared.SharedStep`) for whole steps.
"""
from __future__ import annotations

from simulator.core.shared import SharedStep
from simulator.core.writes import BackendStep, prepare_write, rows_for, store_layer
from simulator.oracle.checker import LayerWrite


class EagerExecutor:
    """Every layer's write location built and stored from Python, one layer after another."""

    def __init__(self, shared: bool = True) -> None:
        #: the whole-step executor of the CPU's shared pools (the pipeline asks it first at every step); None with
        #: ``shared`` False: every step per forward, each backend on its own pool
        self.stepwise = SharedStep() if shared else None

    def run(self, s: BackendStep) -> list[LayerWrite]:
        writes: list[LayerWrite] = []
        before = s.before_layer
        for layer in s.layers:
            if before is not None:
                before(layer)
            w = prepare_write(s, layer)
            if isinstance(w, LayerWrite):
                writes.append(w)        # the design failed: nothing stored for this layer
                continue
            wl, target = w
            k, v = rows_for(s, layer)
            store = store_layer if s.write_fault is None else s.write_fault
            writes.append(store(s, layer, wl, target, k, v))
        return writes
