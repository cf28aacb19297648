"""The deliver phase: one backend's observations, then its findings, in the run's order (every executor's).

A backend's findings are its writes' (the checker's, made in the verdict phase and emitted here), then its
reads' (the read check), then what a plug-in adds (fault injection's content check); a backend whose
per-forward hook failed has one ``design_error`` instead. Emission order matters: the checker keeps the
details of the first findings it emits (its cap), and the observers see them in this order.
"""
from __future__ import annotations

from simulator.core.context import Forward, StepContext
from simulator.designs.checks import HookFailure
from simulator.oracle.checker import LayerWrite
from simulator.scheduling.batch import ForwardBatch


def design_error(failure: HookFailure, boundary, batch: ForwardBatch) -> tuple[str, str]:
    """(sub-pool kind, message) of the ``design_error`` a failed per-forward hook is: read ids and the loc buffer
    are the full pool's unless the hook named its kind."""
    text = failure.describe(boundary.design.name, boundary.context(batch), -1)
    kind = failure.kind or ("full" if failure.hook in ("fill_graph_loc_buffer", "read_ids") else "swa")
    return kind, text


def count_writes(writes: list[LayerWrite]) -> int:
    """The writes a backend's stats count: every layer's store, but not a layer whose design hook failed."""
    return sum(1 for w in writes if w.error_class != "design_error" or w.error is None)


def deliver(ctx: StepContext, f: Forward) -> None:
    """One backend's delivery: its observations, then its findings, counted (see the module docstring)."""
    run, side, step = ctx.run, ctx.side, ctx.batch.step
    if f.observations:
        run.sink(f.observations)
    checker = side.checker
    if f.failure is not None:
        run.count(side, f.name, *checker.design_error(step, f.name, *design_error(f.failure, f.boundary, ctx.batch)))
        return
    found, counts = checker.emit_all(f.raw or ())
    reads = f.reads
    if reads is not None:
        reads.finish()
        if reads.found:
            # after the writes' findings: a layer writes before its attention reads
            more, more_counts = checker.emit_all(reads.found)
            found = found + more
            counts = {c: n + more_counts[c] for c, n in counts.items()}
    for p in run.plugins:
        found, counts = p.after_forward(ctx, f, found, counts)
    run.count(side, f.name, found, counts)
