"""cuda_path.step.GpuStepRunner (every backend first, one verdict read per step, the exact checker only
where a verdict is not zero) gives the run's own findings, counts and observations, in the same order.
On the CPU it runs around the eager executor; tests/test_gpu.py runs it on CUDA through the graphs."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from cuda_path.pool import TaggedKVPool
from cuda_path.step import StepwiseExecutor
from simulator.designs import load_design
from simulator.core.eager import EagerExecutor
from simulator.core.observe import NullObserver
from simulator.run import run_simulation

from helpers import ROOT, scenario


class _Recorder(NullObserver):
    def __init__(self):
        self.events = []

    def on_boundary(self, step, backend, layer, loc_len, swa_len, loc_dtype, swa_dtype, t0, t1, err):
        self.events.append(("boundary", step, backend, layer, loc_len, swa_len, loc_dtype, swa_dtype, err))

    def on_findings(self, findings):
        self.events.append(("findings", tuple((f.backend, f.layer, f.cls, f.slot) for f in findings)))

    def on_step(self, step):
        self.events.append(("step", step.step))


def _run(name, design, stepwise, max_steps=None, host=None):
    sc = scenario(name).with_overrides(design=design)
    make = lambda f, s, skip: TaggedKVPool(sc.model, f, s, geometry="compact", skip_index=skip)  # noqa: E731
    ex = StepwiseExecutor(EagerExecutor()) if stepwise else EagerExecutor()
    if stepwise:
        ex.runner.host_metadata = host
    obs = _Recorder()
    r = run_simulation(sc, load_design(sc.design), make, executor=ex, observer=obs, max_steps=max_steps)
    return r, obs.events, ex


#: the physical pools each side holds at the end: B1's failed writes, B2's stale tails, the gap's missed writes,
#: R7 and A2 (target and draft) are the same on every backend; only triton's draft (B4) leaves its twins
PHYSICAL = {"b1-pcg-dp-padding": {"target": 1}, "b2-decode-stale-tail": {"target": 1},
            "gap-swa-shorter": {"target": 1}, "r7-grouped-free-flush": {"target": 1},
            "a2-pd-decode-swa-tail": {"target": 1, "draft": 1},
            "b4-draft-extend-window": {"target": 1, "draft": 2}}


@pytest.mark.parametrize("host", [None, True])          # True: metadata on host copies, as on a GPU
@pytest.mark.parametrize("name, design, max_steps", [
    ("b1-pcg-dp-padding", "sglang-pre-29460", None),      # length mismatches: failed writes
    ("b2-decode-stale-tail", "sglang-pre-24743", 12),     # clobbered live slots: verdicts not zero
    ("gap-swa-shorter", None, None),                      # the fix's gap: missed writes on some backends
    ("r7-grouped-free-flush", "radix-fixed", None),       # clean (its fix), with read checks
    ("a2-pd-decode-swa-tail", "pd-decode-pre-25805", None),   # a PD decode node: KV transfers, stale reads
    # triton's draft-extend graph builds no window indices (B4): there it is no other backend's twin, elsewhere
    # it is (its spec's window graphs differ from theirs only there)
    ("b4-draft-extend-window", None, None),
])
def test_step_runner_gives_the_runs_own_findings_and_observations(name, design, max_steps, host):
    own, own_events, _ = _run(name, design, False, max_steps)
    fast, fast_events, ex = _run(name, design, True, max_steps, host)
    assert [f.to_json() for f in fast.findings] == [f.to_json() for f in own.findings]
    assert {b: s.to_json() for b, s in fast.backends.items()} == {b: s.to_json() for b, s in own.backends.items()}
    assert fast.crossings == own.crossings and len(fast.steps) == len(own.steps)
    assert fast_events == own_events
    # one physical pool per class of backends whose writes agreed (copy on divergence), as the CPU's shared step
    assert fast.physical_pools == own.physical_pools == PHYSICAL[name]
    runner = ex.runner
    assert runner.fast_checks > 0
    # the base read tables are incremental (cuda_path/read_cache.py) except under the radix cache's content keys
    assert (runner._reads.entries_skipped > 0) == (name != "r7-grouped-free-flush")
    # and a table whose every entry was found clean there is not checked again (no read check made for it)
    assert (runner._reads.clean_tables > 0) == (name != "r7-grouped-free-flush")
    # host metadata: backends whose designs run the base, backend-blind hooks take an earlier backend's metadata
    assert (runner.twin_plans > 0) == (bool(host) and name in ("b1-pcg-dp-padding", "gap-swa-shorter",
                                                                 "a2-pd-decode-swa-tail", "b4-draft-extend-window"))
    assert all(on == bool(host) for _, on in runner._host.values())     # (every design here is layer-free)
    if any(f.cls != "stale_read" for f in own.findings):
        # at most one verdict read per step (none where every backend's writes failed); the write findings
        # come from the exact checker only (stale reads from the read check, which runs on the host anyway)
        assert runner.verdict_reads <= len(own.steps) and runner.exact_checks > 0
    else:
        assert runner.verdict_reads == len(own.steps) and runner.exact_checks == 0


@pytest.mark.parametrize("host", [None, True])
@pytest.mark.parametrize("name", ["f1-flashinfer-round-swa-reads", "f2-aiter-draft-step-keys"])
def test_step_runner_reads_as_a_backends_kernels_read(name, host):
    """A backend whose kernels read otherwise than the design's table (0.5.23's flashinfer round SWA tables from
    position 0, F1; aiter's draft steps the committed keys only, F2) is read so by the step runner too (the GPU's),
    not by the design's table alone: the run's own findings."""
    own, own_events, _ = _run(name, None, False)
    fast, fast_events, ex = _run(name, None, True, host=host)
    assert [f.to_json() for f in fast.findings] == [f.to_json() for f in own.findings]
    assert {b: s.to_json() for b, s in fast.backends.items()} == {b: s.to_json() for b, s in own.backends.items()}
    stale = {b: s.findings.get("stale_read", 0) for b, s in own.backends.items()}
    assert stale == {**{b: 0 for b in stale}, **({"flashinfer": 1330, "aiter": 342} if name.startswith("f1")
                                                  else {"aiter": 162})}
    assert fast_events == own_events and ex.runner.fast_checks > 0


@pytest.mark.parametrize("name", ["smoke", "b2-decode-stale-tail"])
def test_a_store_kernel_that_maps_its_slots_is_no_other_backends_twin(name):
    """With host metadata, 0.5.23's aiter (its store kernel maps each slot itself: a full layer's write carries no
    SWA ids) takes no other backend's write locations: its boundary observations are the per-forward grain's."""
    own, own_events, _ = _run(name, "sglang-0.5.23", False, 10)
    fast, fast_events, ex = _run(name, "sglang-0.5.23", True, 10, True)
    assert [f.to_json() for f in fast.findings] == [f.to_json() for f in own.findings]
    assert fast_events == own_events and ex.runner.twin_plans > 0
    assert any(e[2] == "aiter" and e[5] == -1 for e in own_events if e[0] == "boundary")


def test_step_runner_leaves_fault_injection_to_the_per_forward_grain():
    """A plug-in that acts between backends (fault injection) is not stepwise: the runner declines its steps."""
    from simulator.plugins.faults import FaultInjector
    from simulator.run import make_run

    sc = scenario("smoke")
    make = lambda f, s, skip: TaggedKVPool(sc.model, f, s, geometry="compact", skip_index=skip)  # noqa: E731
    ex = StepwiseExecutor(EagerExecutor())
    for faults, takes in ((None, True), (FaultInjector({"drop_write": 1.0}, sc.seed), False)):
        run = make_run(sc, load_design(sc.design), make, executor=ex, faults=faults)
        assert run.pipeline.stepwise is ex.runner
        batch, truth = next(run.stream())
        assert ex.runner.takes(run.pipeline.begin(batch, truth)) is takes


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


class _Counting:
    """The eager executor, counting the forwards it writes (one per group of backends with one pool)."""

    def __init__(self):
        self.inner, self.runs = EagerExecutor(), 0

    def run(self, s):
        self.runs += 1
        return self.inner.run(s)


def _classes(runner) -> list[list[str]]:
    (_, pc), = runner._classes.values()
    out: dict[int, list[str]] = {}
    for name, cid in pc.of.items():
        out.setdefault(cid, []).append(name)
    return sorted(out.values())


def _own_and_shared(design, name="smoke", host=True):
    sc = scenario(name)
    make = lambda f, s, skip: TaggedKVPool(sc.model, f, s, geometry="compact", skip_index=skip)  # noqa: E731

    own_obs, fast_obs = _Recorder(), _Recorder()
    # per forward: every backend on its own pool
    own = run_simulation(sc, design, make, executor=EagerExecutor(shared=False), observer=own_obs)
    inner = _Counting()
    ex = StepwiseExecutor(inner)
    ex.runner.host_metadata = host          # metadata on host copies, as on a GPU
    fast = run_simulation(sc, design, make, executor=ex, observer=fast_obs)
    assert [f.to_json() for f in fast.findings] == [f.to_json() for f in own.findings]
    assert {b: s.to_json() for b, s in fast.backends.items()} == {b: s.to_json() for b, s in own.backends.items()}
    assert fast_obs.events == own_obs.events and fast.crossings == own.crossings
    return fast, ex.runner, inner.runs


def test_step_runner_writes_once_per_class_of_backends():
    """A clean run: the eight backends stay one class on one pool; each step is written once (one forward
    of the executor, one verdict), not once per backend."""
    from simulator.designs.sglang import SGLangPost29460

    r, runner, runs = _own_and_shared(SGLangPost29460())
    assert r.total_findings == 0
    assert [sorted(g) for g in _classes(runner)] == [sorted(r.backends)]
    assert runs == len(r.steps) and runner.verdict_reads == len(r.steps)


def test_step_runner_reports_a_bug_on_one_backend_there_alone():
    from test_speed_exactness import TritonTranslateBug

    r, runner, runs = _own_and_shared(TritonTranslateBug())
    per_backend = {b: s.total for b, s in r.backends.items()}
    assert per_backend["triton"] > 0 and {b for b, n in per_backend.items() if n} == {"triton"}
    assert {f.backend for f in r.findings} == {"triton"}
    assert sorted(len(g) for g in _classes(runner)) == [1, 7] and ["triton"] in _classes(runner)
    assert len(r.steps) < runs <= 2 * len(r.steps)


def test_step_runner_reports_a_bug_on_one_layer_of_one_backend_there_alone():
    """A design whose make_write_loc looks at the layer: every backend writes its own pool (exactly)."""
    from test_speed_exactness import Layer3BugOnFlashinfer

    r, runner, runs = _own_and_shared(Layer3BugOnFlashinfer())
    assert r.total_findings > 0
    assert {(f.backend, f.layer) for f in r.findings} == {("flashinfer", 3)}
    assert len(_classes(runner)) == 8 and runs == 8 * len(r.steps)


@pytest.mark.parametrize("name", ["smoke", "b1-pcg-dp-padding"])
def test_base_read_table_from_slots_is_the_base_hooks(name):
    """cuda_path.plans.base_read_table (no dense req_to_token) gives Design.read_ids' table: same values, dtypes."""
    import dataclasses

    import torch

    from cuda_path.plans import base_read_table as _base_read_table
    from simulator.designs import Design
    from simulator.designs.checks import check_read_table
    from simulator.run import make_run

    sc = scenario(name)
    make = lambda f, s, skip: TaggedKVPool(sc.model, f, s, geometry="compact", skip_index=skip)  # noqa: E731
    run = make_run(sc, load_design(sc.design), make, executor=EagerExecutor())
    boundary = next(iter(run.target.boundaries.values()))
    checked = 0
    for batch, truth in run.scheduler.steps():
        rq = batch.requests
        mapping = torch.from_numpy(run.alloc.full_to_swa)
        for window in ({0, 1, sc.model.window} if rq is not None else ()):
            ctx = dataclasses.replace(boundary.context(batch, mapping), window=window)
            want = Design().read_ids(torch.from_numpy(rq.req_to_token()), torch.from_numpy(rq.seq_lens),
                                     torch.from_numpy(rq.extend_lens), mapping, ctx)
            got = _base_read_table(rq, torch.from_numpy(rq.seq_lens), window, run.alloc.full_to_swa)
            assert check_read_table(got, len(rq.seq_lens), torch.device("cpu")) is got   # (the runner does not ask)
            for kind in ("full", "swa"):
                for f in ("indptr", "indices", "start"):
                    a, b = getattr(want.of(kind), f), getattr(got.of(kind), f)
                    assert a.dtype == b.dtype and torch.equal(a, b), (batch.step, window, kind, f)
            checked += 1
        run.step(batch, truth)
    assert checked > 10


@pytest.mark.parametrize("host", [None, True])
def test_step_runner_pools_hold_the_runs_own_contents_with_kv_transfers(host):
    """A PD decode node's KV transfers are written into the pools (Run.write_transfer) through the runner
    too: the first backend's pool ends bit-identical to the run's own step's."""
    sc = scenario("a2-pd-decode-swa-tail").with_overrides(design="pd-decode-post-25805")
    made = {False: [], True: []}

    def factory(stepwise):
        def make(f, s, skip):
            pool = TaggedKVPool(sc.model, f, s, geometry="compact", skip_index=skip)
            made[stepwise].append(pool)
            return pool
        return make

    for stepwise in (False, True):
        ex = StepwiseExecutor(EagerExecutor()) if stepwise else EagerExecutor(shared=False)
        if stepwise:
            ex.runner.host_metadata = host
        run_simulation(sc, load_design(sc.design), factory(stepwise), executor=ex)
    own, fast = made[False][0], made[True][0]
    for kind in ("full", "swa"):
        assert torch.equal(own.k[kind], fast.k[kind]) and torch.equal(own.v[kind], fast.v[kind]), kind
        assert int(own.k[kind].view(torch.int16).abs().sum()) > 0


@pytest.mark.parametrize("name", ["a1-spec-partial-page-free", "b4-draft-extend-window"])
def test_incremental_read_tables_give_the_runs_own_stale_reads(name):
    """Speculative rounds truncate and refill requests (a1 at page 16, b4's draft-extend window): the read tables
    that skip entries known clean give the run's own stale reads, in order, with the same messages."""
    own, own_events, _ = _run(name, None, False)
    fast, fast_events, ex = _run(name, None, True, None, True)
    stale = [f.to_json() for f in own.findings if f.cls == "stale_read"]
    assert len(stale) > 1000
    assert [f.to_json() for f in fast.findings] == [f.to_json() for f in own.findings] and fast_events == own_events
    assert ex.runner._reads.entries_skipped > len(stale)
    # tables whose every entry was found clean are not read-checked again (the stale reads above still are)
    assert ex.runner._reads.clean_tables > 0


class _UnsharingStepwise(StepwiseExecutor):
    """Every backend its own pool class from step ``at`` on (as after a step of the run's own): twins then
    lead groups of their own, so their metadata is made from their twin's (GpuStepRunner._twin_metas)."""

    def __init__(self, inner, at: int):
        super().__init__(inner)
        self.at, self.made = at, 0
        made = self.runner._twin_metas

        def counted(leads, batch, full_to_swa):
            twins = [p for p in leads if p.twin is not None]
            made(leads, batch, full_to_swa)
            self.made += len(twins)
            # each its own context (its name and spec), on the twin's host metadata
            assert all(p.twin is None and p.meta.ctx.backend == p.name and p.meta.ctx.spec is p.boundary.spec
                       and p.meta.layer_loc.device.type == "cpu" for p in twins)
        self.runner._twin_metas = counted
        takes = self.runner.takes

        def unshared_at(ctx):
            if ctx.batch.step == self.at:
                self.runner._unshare(ctx.run)
            return takes(ctx)
        self.runner.takes = unshared_at


@pytest.mark.parametrize("name, design", [("b1-pcg-dp-padding", "sglang-pre-29460"), ("smoke", None)])
def test_twins_leading_their_own_groups_give_the_runs_own_outputs(name, design):
    own, own_events, _ = _run(name, design, False)
    sc = scenario(name).with_overrides(design=design)
    make = lambda f, s, skip: TaggedKVPool(sc.model, f, s, geometry="compact", skip_index=skip)  # noqa: E731
    ex = _UnsharingStepwise(EagerExecutor(), at=2)
    ex.runner.host_metadata = True
    obs = _Recorder()
    fast = run_simulation(sc, load_design(sc.design), make, executor=ex, observer=obs)
    assert [f.to_json() for f in fast.findings] == [f.to_json() for f in own.findings]
    assert {b: s.to_json() for b, s in fast.backends.items()} == {b: s.to_json() for b, s in own.backends.items()}
    assert obs.events == own_events
    assert ex.made > 0 and ex.runner.twin_plans > 0
    assert len(_classes(ex.runner)) == len(fast.backends)     # (no class merges back)


def test_the_gpu_benchs_host_phases_run_on_a_cpu():
    """bench/gpu_step.py --phases-on-cpu: the GPU step runner's host phases timed on a machine without CUDA, its run's
    findings checked equal to the run's own step (B2's 4,992 under its buggy design) before any figure prints."""
    r = subprocess.run([sys.executable, "bench/gpu_step.py", "--phases-on-cpu", "1", "--scenario",
                        "scenarios/b2-decode-stale-tail.toml"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert (got["bench"], got["steps"], got["findings"]) == ("gpu_step_host_on_cpu", 61, 4992)
    assert {"truth (oracle)", "plan (metadata, read tables)", "scheduler (next batch)"} <= set(got["host_us_per_step"])
    assert all(v >= 0 for v in got["host_us_per_step"].values()) and got["runner_run_s"] > 0
