"""Plug-ins of the step pipeline: what sits around a step's phases without being one of them.

A plug-in subclasses :class:`StepPlugin` and overrides the hooks it needs; every default does nothing
harmful (as OpenTelemetry's ``SpanProcessor``), so a plug-in reads as the list of places it acts. The
run's plug-ins are called in the order they were installed. The shipped ones (simulator/plugins/):
the overlap timeline (scheduler writes landing between a forward's layers), the unified pool's plan
(virtual to physical ids), fault injection (``--inject``) and a forward observer's view (bench/vs_kv_canary.py).

Where the hooks fall in one step (docs/ARCHITECTURE.md, "One step"):

==================  ===============================================================================
hook                when
==================  ===============================================================================
``source``          once per run: wraps the scheduler's (batch, truth) stream
``bind``            a step begins: may replace the step's batch and truth (the unified pool's ids)
``before_truth``    before the oracle learns the step
``read_inputs``     after the truth phase: may change ``ctx.read_in`` and the mapping the backends read
``before_forward``  per backend, before its metadata init (per-forward steps only)
``interleaves``     per backend: whether scheduler writes land between its layers (then ``before_layer``)
``before_layer``    per layer, before its write location is built (only where ``interleaves``)
``store``           per backend: a store of its own for every layer (None: the executor's)
``after_writes``    per backend, after its write check
``after_forward``   per backend, before its findings are counted: may add findings
``end_step``        the step's backends are done (also on an error)
``end_run``         after the last step
``summary``         the run's result is made: what goes into run.json's ``extra``
==================  ===============================================================================

A plug-in that acts between a step's backends (``before_forward`` and later hooks) runs the step one
backend after another: the stepwise executors (the CPU's shared pools, the GPU step runner) take a step
only when every installed plug-in declares ``stepwise = True``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator, Optional

if TYPE_CHECKING:
    from simulator.core.context import Forward, StepContext
    from simulator.core.run import Run
    from simulator.records import Finding, LayerInfo


class StepPlugin:
    """Base plug-in: every hook does nothing."""

    #: its name in run.json's ``plugins``
    name: str = "plugin"
    #: the stepwise executors can run a step it is installed in (it acts at no per-backend hook)
    stepwise: bool = False
    #: it keeps the mapping the backends read (the truth phase leaves ``run.mapping`` to it)
    owns_mapping: bool = False

    def source(self, run: "Run", steps: Iterator) -> Iterator:
        return steps

    def bind(self, ctx: "StepContext") -> None:
        pass

    def before_truth(self, ctx: "StepContext") -> None:
        pass

    def read_inputs(self, ctx: "StepContext") -> None:
        pass

    def before_forward(self, ctx: "StepContext", f: "Forward") -> None:
        pass

    def interleaves(self, ctx: "StepContext", f: "Forward") -> bool:
        return False

    def before_layer(self, ctx: "StepContext", f: "Forward", layer: "LayerInfo") -> None:
        pass

    def store(self, ctx: "StepContext", f: "Forward") -> Optional[Callable]:
        return None

    def after_writes(self, ctx: "StepContext", f: "Forward") -> None:
        pass

    def after_forward(self, ctx: "StepContext", f: "Forward", found: list["Finding"],
                      counts: dict[str, int]) -> tuple[list["Finding"], dict[str, int]]:
        return found, counts

    def end_step(self, ctx: "StepContext") -> None:
        pass

    def end_run(self, run: "Run") -> None:
        pass

    def run_extra(self, run: "Run") -> Optional[dict]:
        return None


class Plugins:
    """A run's plug-ins in order, called as one."""

    __slots__ = ("items", "stepwise", "owns_mapping")

    def __init__(self, items=()) -> None:
        self.items: list[StepPlugin] = []
        self.stepwise = True
        self.owns_mapping = False
        for p in items:
            self.add(p)

    def add(self, plugin: StepPlugin) -> None:
        self.items.append(plugin)
        self.stepwise = self.stepwise and plugin.stepwise
        self.owns_mapping = self.owns_mapping or plugin.owns_mapping

    def of(self, kind: type) -> Optional[StepPlugin]:
        """The installed plug-in of a class, or None."""
        return next((p for p in self.items if isinstance(p, kind)), None)

    def __bool__(self) -> bool:
        return bool(self.items)

    def __iter__(self):
        return iter(self.items)
