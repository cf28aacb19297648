"""cuda_path.step.GpuStepRunner (every backend first, one verdict read per step, the exact checker only
where a verdict is not zero) gives the run's own findings, counts and observations, in the same order.
On the CPU it runs around the eager executor; tests/test_gpu.py runs it on CUDA through the graphs."""
from __future__ import annotations

import pytest

from cuda_path.pool import TaggedKVPool
from cuda_path.step import StepwiseExecutor
from simulator.designs import load_design
from simulator.execute import EagerExecutor
from simulator.observe import NullObserver
from simulator.run import run_simulation

from helpers import scenario


class _Recorder(NullObserver):
    def __init__(self):
        self.events = []

    def on_boundary(self, step, backend, layer, loc_len, swa_len, loc_dtype, swa_dtype, t0, t1, err):
        self.events.append(("boundary", step, backend, layer, loc_len, swa_len, loc_dtype, swa_dtype, err))

    def on_findings(self, findings):
        self.events.append(("findings", tuple((f.backend, f.layer, f.cls, f.slot) for f in findings)))

    def on_step(self, step):
        self.events.append(("step", step.step))


def _run(name, design, stepwise, max_steps=None):
    sc = scenario(name).with_overrides(design=design)
    make = lambda f, s, skip: TaggedKVPool(sc.model, f, s, geometry="compact", skip_index=skip)  # noqa: E731
    ex = StepwiseExecutor(EagerExecutor()) if stepwise else EagerExecutor()
    obs = _Recorder()
    r = run_simulation(sc, load_design(sc.design), make, executor=ex, observer=obs, max_steps=max_steps)
    return r, obs.events, ex


@pytest.mark.parametrize("name, design, max_steps", [
    ("b1-pcg-dp-padding", "sglang-pre-29460", None),      # length mismatches: failed writes
    ("b2-decode-stale-tail", "sglang-pre-24743", 12),     # clobbered live slots: verdicts not zero
    ("gap-swa-shorter", None, None),                      # the fix's gap: missed writes on some backends
    ("r7-grouped-free-flush", "radix-fixed", None),       # clean (its fix), with read checks
])
def test_step_runner_gives_the_runs_own_findings_and_observations(name, design, max_steps):
    own, own_events, _ = _run(name, design, False, max_steps)
    fast, fast_events, ex = _run(name, design, True, max_steps)
    assert [f.to_json() for f in fast.findings] == [f.to_json() for f in own.findings]
    assert {b: s.to_json() for b, s in fast.backends.items()} == {b: s.to_json() for b, s in own.backends.items()}
    assert fast.crossings == own.crossings and len(fast.steps) == len(own.steps)
    assert fast_events == own_events
    runner = ex.runner
    assert runner.fast_checks > 0
    if own.total_findings:
        # at most one verdict read per step (none where every backend's writes failed); the findings come
        # from the exact checker only
        assert runner.verdict_reads <= len(own.steps) and runner.exact_checks > 0
    else:
        assert runner.verdict_reads == len(own.steps) and runner.exact_checks == 0


def test_step_runner_leaves_fault_injection_to_the_runs_own_step():
    ex = StepwiseExecutor(EagerExecutor())

    class _Run:
        faults = object()
        before_layer = None

    assert ex.run_step(_Run(), None, None) is None


class _GroupedOnCpu:
    """cuda_path's grouped writes (graphs.CudaGraphExecutor._run_grouped) on a CPU pool: every layer's write
    location (once per kind where the design's make_write_loc is layer-free), the layers sharing a target in
    one store_layers call, observations in layer order."""

    def __init__(self):
        from cuda_path.graphs import CudaGraphExecutor

        self.graphs = CudaGraphExecutor()

    def run(self, s):
        if s.interleaved or s.write_fault is not None:
            return EagerExecutor().run(s)
        return self.graphs._run_grouped(s, {})


@pytest.mark.parametrize("name, design", [("b1-pcg-dp-padding", "sglang-pre-29460"),
                                          ("gap-swa-shorter", None), ("b1-pcg-dp-padding", "sglang-post-29460")])
def test_grouped_writes_give_the_runs_own_findings(name, design):
    sc = scenario(name).with_overrides(design=design)
    make = lambda f, s, skip: TaggedKVPool(sc.model, f, s, geometry="compact", skip_index=skip)  # noqa: E731
    own_obs, fast_obs = _Recorder(), _Recorder()
    own = run_simulation(sc, load_design(sc.design), make, observer=own_obs)
    fast = run_simulation(sc, load_design(sc.design), make, observer=fast_obs,
                          executor=StepwiseExecutor(_GroupedOnCpu()))
    assert [f.to_json() for f in fast.findings] == [f.to_json() for f in own.findings]
    assert {b: s.to_json() for b, s in fast.backends.items()} == {b: s.to_json() for b, s in own.backends.items()}
    assert fast_obs.events == own_obs.events
