"""A forward observer's view of each backend forward (core.observe.ForwardObserver; bench/vs_kv_canary.py's
canary): called before a backend's metadata init and after its write check, with the batch, its truth, the
pool, ``req_to_token`` as read and the mapping."""
from __future__ import annotations

from simulator.core import observe
from simulator.core.plugins import StepPlugin


class ForwardView(StepPlugin):
    name = "forward_observer"

    def __init__(self, observer: observe.ForwardObserver):
        self.observer = observer
        self._view = None

    def before_forward(self, ctx, f) -> None:
        run, side = ctx.run, ctx.side
        self._view = observe.ForwardView(ctx.batch.step, f.name, "draft" if side is run.draft else "target", ctx.batch,
                                         ctx.truth, f.pool, side.layers, f.boundary.window, ctx.read_in, run.mapping)
        self.observer.before_forward(self._view)

    def after_writes(self, ctx, f) -> None:
        self.observer.after_forward(self._view)
