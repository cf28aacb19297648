#!/usr/bin/env python3
"""The scale scenario on a CUDA device: run time, host synchronisations per step, and the same findings
as the CPU path.

Each run is ``slotscope run SCENARIO --device cuda --trace-level off --no-report`` in this process
(``slotscope.pipeline.run_scenario`` without an output directory: real K/V geometry, the Triton store,
CUDA graphs, the GPU step runner of cuda_path/step.py). Three runs:

  cold      the first run in the process (Triton compiles its kernels, graphs are captured)
  warm      the same run again, --warm times (default 3; the figure the issue's target is about is their median:
            the run, not the compiler; the lent machine's host is noisy, warm runs of one process spread by 30%)
  counted   the same run once more under ``torch.cuda.set_sync_debug_mode("warn")``: each host
            synchronisation torch detects (a device-to-host copy, ``.item()``, a stream or device
            synchronize, ``nonzero``, a blocking host-to-device copy; torch calls the mode a prototype
            that does not yet detect all) raises a warning, counted per step (captures excluded)

Steady state is every decode-graph step after the run's first 100 steps (by then each capture size
has been captured). With ``--compare-cpu`` the summary and findings are compared with a CPU run of the
same scenario (compact geometry, torch store; several minutes on a laptop-class CPU).
Ends with one line holding a JSON object of the figures.

``--phases-on-cpu N`` needs no CUDA: the GPU step runner takes the steps of a CPU run (around the eager executor,
metadata on host copies as on a GPU), its host phases timed over N runs beside the run's own CPU step, their
findings checked equal. Its scheduler, truth and plan phases are the host code a CUDA run runs (scale, 2026-12-07:
plan 710, truth 245, scheduler 344 us a step on the 2-core CPU machine, 855, 212 and 265 on an H100's host); its
write and verdict phases take the CPU branches and say nothing of a GPU.

    python bench/gpu_step.py                      # scenarios/scale.toml
    python bench/gpu_step.py --quick              # 200 requests
    python bench/gpu_step.py --phases-on-cpu 2    # the host phases, on a machine without CUDA
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.scenario import load_scenario  # noqa: E402
from slotscope.pipeline import RunOptions, run_scenario  # noqa: E402

#: issue 30: warm run seconds by the scenario's request count (the shipped 1,000 and the 10,000 variant), host
#: synchronisations per steady decode step
RUN_S_TARGET = {1000: 1.0, 10000: 5.0}
TARGETS = {"run_s": 1.0, "steady_syncs_per_step": 1}
STEADY_AFTER = 100


#: seconds in the garbage collector during the last one_run (gc.callbacks)
GC = {"s": 0.0, "t0": 0.0}


def _gc_timer(phase, info):
    if phase == "start":
        GC["t0"] = time.perf_counter()
    else:
        GC["s"] += time.perf_counter() - GC["t0"]


#: the last one_run's own CPU seconds (the process's, all threads) and the machine's steal seconds (time its
#: CPUs were runnable but given to another guest, /proc/stat; summed over all CPUs)
HOST = {"cpu_s": 0.0, "steal_s": 0.0}


def _steal_s() -> float:
    """The machine's steal time so far, seconds over all CPUs (/proc/stat's 8th field; 0 where not there)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0
    except (OSError, ValueError):
        return 0.0


def one_run(sc, device: str, progress=None):
    opts = RunOptions(device=device, trace_level="off", report=False, progress=progress)
    GC["s"] = 0.0
    gc.callbacks.append(_gc_timer)
    steal0, cpu0 = _steal_s(), time.process_time()
    t0 = time.perf_counter()
    try:
        out = run_scenario(sc, None, opts)
    finally:
        gc.callbacks.remove(_gc_timer)
    secs = time.perf_counter() - t0
    HOST["cpu_s"], HOST["steal_s"] = time.process_time() - cpu0, _steal_s() - steal0
    return out, secs


def counted_run(sc):
    """A run with every host synchronisation counted, per step (progress is called after each step)."""
    per_step: list[tuple[int, int]] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        last = [0]

        def progress(step, done, total):
            per_step.append((step, len(caught) - last[0]))
            last[0] = len(caught)

        torch.cuda.set_sync_debug_mode("warn")
        try:
            out, secs = one_run(sc, "cuda", progress)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        where: dict[str, int] = {}
        for w in caught:
            key = str(w.message).split("\n")[0][:80]
            where[key] = where.get(key, 0) + 1
    return out, secs, per_step, where


def host_cpu() -> str:
    """The host's CPU model (/proc/cpuinfo): warm runs on different machine starts spread by 50%, and the host
    is what they differ in."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def findings_of(out) -> list:
    return [f.to_json() for f in out.result.findings]


def verdict_digest(out) -> str:
    """sha256 of the findings, in order, and the per-backend counts: equal digests, equal verdicts (a CPU run
    elsewhere, ``--cpu-digest``, compares by it)."""
    import hashlib

    body = json.dumps({"findings": findings_of(out), "backends": out.summary["backends"]}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def _sync_figures(r, per_step: list, where: dict) -> dict:
    """Host synchronisations per step (the counted run's, by the warm run's graph paths): all steps, the steady
    decode steps (decode graphs after STEADY_AFTER), per graph path, and their sources."""
    modes = {s.step: s.graph for s in r.steps}
    steady = [n for step, n in per_step[STEADY_AFTER:] if modes.get(step) == "decode_graph"]
    all_n = [n for _, n in per_step]
    by_graph: dict[str, list[int]] = {}
    for step, n in per_step:
        by_graph.setdefault(modes.get(step, "?"), []).append(n)
    return {
        "syncs_total": sum(all_n), "syncs_per_step_mean": round(sum(all_n) / max(1, len(all_n)), 2),
        "steady_decode_steps": len(steady),
        "steady_syncs_per_step_max": max(steady) if steady else None,
        "steady_syncs_per_step_median": statistics.median(steady) if steady else None,
        "syncs_per_step_by_graph": {g: {"steps": len(v), "mean": round(sum(v) / len(v), 2), "max": max(v)}
                                    for g, v in by_graph.items()},
        "sync_sources": dict(sorted(where.items(), key=lambda kv: -kv[1])[:8]),
    }


def _print_table(sc, figures: dict, r) -> None:
    """The short table printed before the JSON line."""
    cold_s, warm_s, n_warm = figures["run_s_cold"], figures["run_s_warm"], len(figures["run_s_warm_all"])
    steady_n = figures["steady_decode_steps"]
    print(f"\n# {sc.name} on {figures['device']} (host: {figures['host_cpu']}): {len(r.steps)} steps, "
          f"{r.crossings} crossings, "
          f"{r.total_findings} findings")
    print(f"run (cold, first in process) {cold_s:8.2f} s")
    targets = figures["targets"]
    print(f"run (warm, median of {n_warm})       {warm_s:8.2f} s   target <= {targets['run_s']:g} s   "
          f"{r.crossings / warm_s:,.0f} crossings/s, {figures['gc_s_warm']:.2f} s in the garbage collector, "
          f"{figures['torch_threads']} torch threads")
    print(f"host syncs per step          mean {figures['syncs_per_step_mean']}, steady decode max "
          f"{figures['steady_syncs_per_step_max']} median {figures['steady_syncs_per_step_median']} "
          f"over {steady_n} steps (target <= {targets['steady_syncs_per_step']})")
    for g, v in figures["syncs_per_step_by_graph"].items():
        print(f"  {g:14s} {v['steps']:6d} steps  mean {v['mean']:6.2f}  max {v['max']}")
    print(f"physical pools at the end    {figures['physical_pools']} (pool.full_size {figures['pool_full_size']:,})")
    print(f"host time by phase (one timed warm run, {figures['phase_split_run_s']:.2f} s):")
    for name, secs in figures["phase_split_s"].items():
        print(f"  {name:36s} {secs:7.3f} s  {1e6 * secs / max(1, len(r.steps)):7.0f} us/step")


def _profile(sc, top: int, out) -> int:
    """One warm-up run, then one under cProfile: the top functions by own and by cumulative time."""
    import cProfile
    import pstats

    one_run(sc, "cuda")
    prof = cProfile.Profile()
    prof.enable()
    _, secs = one_run(sc, "cuda")
    prof.disable()
    print(f"profiled run: {secs:.2f} s")
    if out:
        prof.dump_stats(out)
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    # who calls the torch methods that cost most (a .to, .cpu or copy_ is a launch, a copy or a wait)
    stats.sort_stats("tottime").print_callers(r"method '(to|cpu|copy_|pin_memory|fill_|zero_)' of 'torch")
    return 0


#: (module, class, method): the host phases --phases times (inclusive: a phase's time holds the phases it calls)
PHASES = [("cuda_path.step", "GpuStepRunner", m) for m in (
    "truth", "plan", "write", "verdict", "_groups", "_plans", "_read_table", "_stage", "_device_meta",
    "_forward", "_calls", "_findings")] + [("cuda_path.verdicts", "DeviceVerdicts", m) for m in (
    "mirror", "begin", "launch", "read", "verdict")] + [
    ("cuda_path.read_cache", "IncrementalReads", "note_step"), ("cuda_path.read_cache", "IncrementalReads", "table"),
    ("cuda_path.graphs", "CudaGraphExecutor", "_run_decode"), ("cuda_path.graphs", "CudaGraphExecutor", "_run_piecewise"),
    ("cuda_path.graphs", "CudaGraphExecutor", "_run_grouped"), ("simulator.oracle.reference", "ReferencePool", "apply_writes"),
    ("simulator.oracle.reference", "ReferencePool", "apply_frees"), ("cuda_path.staging", "Staging", "put"),
    ("simulator.core.delivery", None, "deliver"), ("simulator.core.run", "Run", "record_step"),
    ("simulator.core.boundary", "BackendBoundary", "init_metadata")] + [
    ("cuda_path.step", None, f) for f in ("host_tag_words", "copy_all", "put_rows", "plan_by_kind", "observations_of",
                                          "padded_expected")] + [
    ("cuda_path.staging", None, f) for f in ("stage_views", "stage_pack")]


def _timed(fn, acc: list):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[0] += time.perf_counter() - t0
            acc[1] += 1
    return wrapper


def _timed_steps(fn, acc: list):
    """The scheduler's generator, each of its steps timed (the time to produce the next batch)."""
    def wrapper(*args, **kwargs):
        it = fn(*args, **kwargs)
        while True:
            t0 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                return
            finally:
                acc[0] += time.perf_counter() - t0
                acc[1] += 1
            yield item
    return wrapper


def time_phases(sc, runs: int, run=None) -> tuple[list, dict, dict]:
    """``runs`` warm runs with the host phases timed by perf_counter wrappers (a few hundred ns each, unlike
    cProfile's per-call cost, which inflates Python-heavy code): the runs' seconds, per phase its (seconds,
    calls) per run, and the last run's steps by graph path (seconds, steps). ``run``: one run, returning (its
    output, seconds); default a CUDA run. The caller has warmed up."""
    import importlib

    from simulator.core.pipeline import StepPipeline
    from simulator.scheduling.scheduler import Scheduler

    accs = {}
    saved = []
    for mod, cls, name in PHASES:       # (cls None: a module's function, called through its global name)
        owner = importlib.import_module(mod) if cls is None else getattr(importlib.import_module(mod), cls, None)
        fn = None if owner is None else owner.__dict__.get(name)
        if fn is None:                  # (a phase the code no longer has: not timed, not printed)
            continue
        accs[f"{cls or mod}.{name}"] = acc = [0.0, 0]
        saved.append((owner, name, fn))
        setattr(owner, name, _timed(fn, acc))
    by_graph: dict[str, list] = {}          # a step's time (the pipeline's) by the batch's graph path
    call = StepPipeline.__dict__["step"]

    def per_graph(self, batch, truth):
        t0 = time.perf_counter()
        try:
            return call(self, batch, truth)
        finally:
            acc = by_graph.setdefault(batch.graph, [0.0, 0])
            acc[0] += time.perf_counter() - t0
            acc[1] += 1
    saved.append((StepPipeline, "step", call))
    StepPipeline.step = per_graph
    accs["Scheduler.steps (each next)"] = sacc = [0.0, 0]
    saved.append((Scheduler, "steps", Scheduler.__dict__["steps"]))
    Scheduler.steps = _timed_steps(Scheduler.__dict__["steps"], sacc)
    per: dict[str, list] = {k: [] for k in accs}
    totals = []
    try:
        for _ in range(runs):
            for acc in accs.values():
                acc[0], acc[1] = 0.0, 0
            by_graph.clear()
            _, secs = one_run(sc, "cuda") if run is None else run()
            totals.append(secs)
            for k, acc in accs.items():
                per[k].append((acc[0], acc[1]))
    finally:
        for owner, name, fn in reversed(saved):     # (the last wrapped first)
            setattr(owner, name, fn)
    return totals, per, dict(by_graph)


#: the step's phases as the split in the default report names them (each the inclusive time of its wrappers)
SPLIT = {"scheduler (next batch)": "Scheduler.steps (each next)", "truth (oracle)": "GpuStepRunner.truth",
         "plan (metadata, read tables)": "GpuStepRunner.plan", "write (stage, graphs)": "GpuStepRunner.write",
         "verdict (device check, findings)": "GpuStepRunner.verdict", "record": "Run.record_step"}


def phase_split(totals: list, per: dict) -> dict:
    """The host time per phase of the step (:data:`SPLIT`), and what is left (the run loop, observers)."""
    total = statistics.median(totals)
    out = {name: round(statistics.median(x[0] for x in per[key]), 4) for name, key in SPLIT.items() if key in per}
    out["other (loop, delivery, observers)"] = round(max(0.0, total - sum(out.values())), 4)
    return out


def _phases(sc, runs: int) -> int:
    """Warm-up, then ``runs`` runs with the host phases timed: per phase its median over the runs."""
    one_run(sc, "cuda")
    totals, per, by_graph = time_phases(sc, runs)
    total = statistics.median(totals)
    print("# the pipeline's steps by graph path (the last run): " + ", ".join(
        f"{g} {n} steps {1e6 * t / max(n, 1):.0f} us each ({t:.3f} s)" for g, (t, n) in by_graph.items()))
    print(f"# host phases, median of {runs} timed runs (runs {', '.join(f'{t:.2f}' for t in totals)} s)")
    for k, v in per.items():
        secs = statistics.median(x[0] for x in v)
        runs_s = " ".join(f"{x[0]:.3f}" for x in v)
        print(f"{k:42s} {secs:7.3f} s  {100 * secs / total:5.1f}%  {v[0][1]:7d} calls   (runs {runs_s})")
    print(json.dumps({"bench": "gpu_step_phases", "run_s": round(total, 3),
                      "phases_s": {k: round(statistics.median(x[0] for x in v), 4) for k, v in per.items()}}))
    return 0


def stepwise_cpu_run(sc):
    """One run of ``sc`` on this CPU with the GPU step runner taking its steps (cuda_path.step.StepwiseExecutor around
    the eager executor, metadata on host copies as on a GPU; compact CPU pools): (its result, seconds)."""
    from cuda_path.pool import TaggedKVPool
    from cuda_path.step import StepwiseExecutor
    from simulator.core.eager import EagerExecutor
    from simulator.designs import load_design
    from simulator.run import run_simulation

    ex = StepwiseExecutor(EagerExecutor())
    ex.runner.host_metadata = True
    t0 = time.perf_counter()
    res = run_simulation(sc, load_design(sc.design), lambda f, sw, skip: TaggedKVPool(
        sc.model, f, sw, geometry="compact", skip_index=skip), executor=ex)
    return res, time.perf_counter() - t0


def _phases_on_cpu(sc, runs: int) -> int:
    """The GPU step runner's host phases on this CPU (no CUDA needed): a warm-up, then ``runs`` timed runs, beside
    the run's own CPU step (SharedStep) on the same scenario; their findings must agree. The truth, plan and
    scheduler phases are the host code a CUDA run runs (staging and the verdict take their CPU branches)."""
    res, _ = stepwise_cpu_run(sc)
    own, own_s = one_run(sc, "cpu")
    if res.total_findings != own.result.total_findings or len(res.steps) != len(own.result.steps):
        print(f"the step runner's run differs from the run's own step: {res.total_findings} against "
              f"{own.result.total_findings} findings, {len(res.steps)} against {len(own.result.steps)} steps",
              file=sys.stderr)
        return 1
    totals, per, _ = time_phases(sc, runs, run=lambda: stepwise_cpu_run(sc))
    total, steps = statistics.median(totals), len(res.steps)
    split = phase_split(totals, per)
    print(f"# {sc.name}: {steps} steps, {res.total_findings} findings; the GPU step runner on this CPU "
          f"{total:.2f} s (median of {runs}), the run's own CPU step {own_s:.2f} s: ratio {total / own_s:.2f}")
    for name, secs in split.items():
        print(f"{name:36s} {secs:7.3f} s  {1e6 * secs / steps:7.0f} us a step")
    print(json.dumps({"bench": "gpu_step_host_on_cpu", "scenario": sc.name, "steps": steps,
                      "findings": res.total_findings, "runner_run_s": round(total, 3),
                      "own_step_run_s": round(own_s, 3), "ratio": round(total / own_s, 3),
                      "host_us_per_step": {k: round(1e6 * v / steps) for k, v in split.items()}}))
    return 0


def _sample(sc, top: int, interval_s: float = 0.0002) -> int:
    """One warm-up run, then one with the main thread's stack sampled from a second thread (the interpreter's
    switch interval shortened to ``interval_s`` so the sampler gets the lock often): each sample weighs the time
    since the last, given to the innermost line of this repository's code (self) and once to every function of
    this repository on the stack (inclusive). A torch op holding the lock is seen just after it returns, so its
    time lands on its own line or the next. Prints the top lines and functions by share of the run."""
    import threading
    from collections import Counter

    one_run(sc, "cuda")
    main_id = threading.main_thread().ident
    root = str(ROOT)
    lines: Counter = Counter()
    funcs: Counter = Counter()
    stop = threading.Event()
    lost = [0.0]

    def sampler() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(interval_s)
            now = time.perf_counter()
            w, last = now - last, now
            seen, inner = set(), None
            try:
                f = sys._current_frames().get(main_id)
                while f is not None:
                    code = f.f_code
                    if code.co_filename.startswith(root) and "/bench/" not in code.co_filename \
                            and "/.venv/" not in code.co_filename:
                        key = (code.co_filename[len(root) + 1:], code.co_qualname)
                        if inner is None:
                            inner = (key[0], f.f_lineno, key[1])
                        if key not in seen:
                            seen.add(key)
                            funcs[key] += w
                    f = f.f_back
            except AttributeError:      # (a frame torn while walked: seen on CPython 3.11; the sample is dropped)
                lost[0] += w
                continue
            if inner is not None:
                lines[inner] += w

    old = sys.getswitchinterval()
    sys.setswitchinterval(interval_s)
    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    try:
        _, secs = one_run(sc, "cuda")
    finally:
        stop.set()
        th.join()
        sys.setswitchinterval(old)
    total = sum(lines.values()) or 1.0
    print(f"# sampled run: {secs:.2f} s (sampled {total:.2f} s in this repository's code, {lost[0]:.2f} s of "
          f"samples dropped)")
    print("## lines by self share")
    for (path, line, fn), w in lines.most_common(top):
        print(f"{100 * w / secs:5.1f}%  {w:6.3f} s  {path}:{line}  {fn}")
    print("## functions by inclusive share")
    for (path, fn), w in funcs.most_common(top):
        print(f"{100 * w / secs:5.1f}%  {w:6.3f} s  {path}  {fn}")
    print(json.dumps({"bench": "gpu_step_sample", "run_s": round(secs, 3),
                      "lines": [[f"{p}:{ln}", fn, round(w, 4)] for (p, ln, fn), w in lines.most_common(top)]}))
    return 0


def _torch_profile(sc, top: int) -> int:
    """One warm-up run, then one under torch.profiler (host ops and CUDA runtime calls): the ops by own host
    time, and the runtime calls (kernel launches, graph launches, copies, synchronisations) per step."""
    from torch.profiler import ProfilerActivity, profile

    one_run(sc, "cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        out, secs = one_run(sc, "cuda")
    steps = max(1, len(out.result.steps))
    print(f"profiled run: {secs:.2f} s, {steps} steps")
    avg = prof.key_averages()
    print(avg.table(sort_by="self_cpu_time_total", row_limit=top))
    runtime = sorted(((e.key, e.count, e.self_cpu_time_total) for e in avg if e.key.startswith("cuda")),
                     key=lambda r: -r[1])
    print("# CUDA runtime calls per step")
    for key, count, self_us in runtime[:12]:
        print(f"{key:40s} {count / steps:8.2f} per step  {self_us / 1e6:7.3f} s host")
    return 0


def scenario_arguments(ap: argparse.ArgumentParser) -> None:
    """--scenario and --quick (bench/host_knobs.py takes them too: :func:`cuda_scenario`)."""
    ap.add_argument("--scenario", default=str(ROOT / "scenarios/scale.toml"))
    ap.add_argument("--quick", action="store_true", help="200 requests instead of the scenario's count")
    ap.add_argument("--requests", type=int, metavar="N", help="N requests instead of the scenario's (the same seed)")
    ap.add_argument("--full-size", type=int, metavar="ROWS",
                    help="pool.full_size instead of the scenario's (262144: a deployment's pool; swa_ratio kept)")


def cuda_scenario(args, bench: str, need_cuda: bool = True):
    """The scenario the arguments name (:func:`scenario_arguments`), or None with a message where there is no CUDA
    device."""
    if need_cuda and not torch.cuda.is_available():
        print(f"{bench} needs a CUDA device", file=sys.stderr)
        return None
    sc = load_scenario(args.scenario)
    requests = 200 if args.quick else getattr(args, "requests", None)
    if requests:
        sc = dataclasses.replace(sc, workload=dataclasses.replace(sc.workload, requests=requests))
    if getattr(args, "full_size", None):
        sc = dataclasses.replace(sc, pool=dataclasses.replace(sc.pool, full_size=args.full_size))
    return sc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    scenario_arguments(ap)
    ap.add_argument("--warm", type=int, default=3, metavar="N",
                    help="warm runs after the cold one (default 3): the figure is their median")
    ap.add_argument("--compare-cpu", action="store_true", help="also run on the CPU and compare the findings")
    ap.add_argument("--cpu-digest", action="store_true",
                    help="instead: one CPU run only (no CUDA needed); print its verdict digest, to compare with a "
                         "GPU run's verdict_digest from another machine")
    ap.add_argument("--profile", type=int, metavar="N", default=0,
                    help="instead: one warm-up run, then one under cProfile; print the top N functions")
    ap.add_argument("--profile-out", metavar="PATH", help="with --profile: also save the profile there (pstats)")
    ap.add_argument("--torch-profile", type=int, metavar="N", default=0,
                    help="instead: one warm-up run, then one under torch.profiler; print the top N ops by host "
                         "time and the CUDA runtime calls per step")
    ap.add_argument("--phases", type=int, metavar="N", default=0,
                    help="instead: one warm-up run, then N runs with the host phases timed (perf_counter "
                         "wrappers): each phase's median seconds and share of the run")
    ap.add_argument("--sample", type=int, metavar="N", default=0,
                    help="instead: one warm-up run, then one with the main thread's stack sampled every 0.2 ms; print "
                         "the top N lines (self) and functions (inclusive) of this repository by share of the run")
    ap.add_argument("--phases-on-cpu", type=int, metavar="N", default=0,
                    help="instead (no CUDA needed): the GPU step runner's host phases on this CPU, N timed runs "
                         "beside the run's own CPU step; each phase's seconds and microseconds a step")
    args = ap.parse_args()
    if args.phases_on_cpu:
        return _phases_on_cpu(cuda_scenario(args, "bench/gpu_step.py", need_cuda=False), args.phases_on_cpu)
    if args.cpu_digest:
        cpu_sc = cuda_scenario(args, "bench/gpu_step.py", need_cuda=False)
        out, secs = one_run(cpu_sc, "cpu")
        print(json.dumps({"bench": "gpu_step_cpu_digest", "scenario": cpu_sc.name, "requests": cpu_sc.workload.requests,
                          "pool_full_size": cpu_sc.pool.full_size, "steps": len(out.result.steps),
                          "findings": out.result.total_findings, "cpu_run_s": round(secs, 3),
                          "verdict_digest": verdict_digest(out)}))
        return 0
    sc = cuda_scenario(args, "bench/gpu_step.py")
    if sc is None:
        return 2
    if args.profile:
        return _profile(sc, args.profile, args.profile_out)
    if args.torch_profile:
        return _torch_profile(sc, args.torch_profile)
    if args.phases:
        return _phases(sc, args.phases)
    if args.sample:
        return _sample(sc, args.sample)
    cold, cold_s = one_run(sc, "cuda")
    warms = []
    for _ in range(max(1, args.warm)):      # the machine's host is noisy: the median of several warm runs
        out, secs = one_run(sc, "cuda")
        warms.append((secs, GC["s"], out, HOST["cpu_s"], HOST["steal_s"]))
    warm_s, warm_gc_s, warm = sorted(warms, key=lambda w: w[0])[len(warms) // 2][:3]
    targets = {**TARGETS, "run_s": RUN_S_TARGET.get(sc.workload.requests, TARGETS["run_s"])}
    split_totals, split_per, _ = time_phases(sc, 1)          # one more warm run, its host time split by phase
    try:
        counted, counted_s, per_step, where = counted_run(sc)
    except Exception as e:          # the figures of the other runs still print
        print(f"counted run failed: {type(e).__name__}: {e}", file=sys.stderr)
        counted, counted_s, per_step, where = warm, float("nan"), [], {"counted run failed": 1}
    r = warm.result
    syncs = _sync_figures(r, per_step, where)
    same_gpu = all(findings_of(cold) == findings_of(w[2]) and cold.summary["backends"] == w[2].summary["backends"]
                   for w in warms) and findings_of(cold) == findings_of(counted)
    figures = {
        "bench": "gpu_step", "scenario": sc.name, "requests": sc.workload.requests,
        "device": torch.cuda.get_device_name(), "host_cpu": host_cpu(),
        "kernel": platform.release(), "pool_full_size": sc.pool.full_size, "steps": len(r.steps),
        "crossings": r.crossings, "physical_pools": r.physical_pools,
        "findings": r.total_findings, "run_s_cold": round(cold_s, 3), "run_s_warm": round(warm_s, 3),
        "run_s_warm_all": [round(w[0], 3) for w in warms],
        "cpu_s_warm_all": [round(w[3], 3) for w in warms], "steal_s_warm_all": [round(w[4], 3) for w in warms],
        "run_loop_s_warm": round(r.wall_s, 3), "gc_s_warm": round(warm_gc_s, 3), "counted_run_s": round(counted_s, 3),
        "torch_threads": torch.get_num_threads(),
        "crossings_per_s_warm": round(r.crossings / warm_s, 1), **syncs,
        "same_findings_across_gpu_runs": same_gpu, "verdict_digest": verdict_digest(warm),
        "phase_split_run_s": round(split_totals[0], 3), "phase_split_s": phase_split(split_totals, split_per),
    }
    if args.compare_cpu:
        cpu, cpu_s = one_run(sc, "cpu")
        figures["cpu_run_s"] = round(cpu_s, 3)
        figures["same_as_cpu"] = (findings_of(cpu) == findings_of(warm)
                                  and cpu.summary["backends"] == warm.summary["backends"])
    figures["targets"] = targets
    figures["targets_met"] = {
        "run_s_warm": warm_s <= targets["run_s"],
        "steady_syncs_per_step": syncs["steady_syncs_per_step_max"] is not None
        and syncs["steady_syncs_per_step_max"] <= targets["steady_syncs_per_step"],
    }
    _print_table(sc, figures, r)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
