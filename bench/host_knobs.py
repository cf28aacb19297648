#!/usr/bin/env python3
"""The host's settings against the scale run's time on a CUDA device, side by side in one process.

The run on the H200 is bound by host work (Python and small torch ops, one synchronisation per step), and the
lent host is noisy: warm runs of one process spread by 30%. This bench asks which of the process's own settings
move it, alternating them run by run (A B C ... A B C ...) so that the host's drift falls on all alike:

  base      as ``slotscope run --device cuda`` runs it
  pin       the main thread pinned to one CPU (``os.sched_setaffinity`` of the calling thread only; threads made
            before it, CUDA's and torch's, keep the whole set)
  nogc      the cyclic garbage collector off during the run (``gc.disable``; what it costs at most)
  threads1  torch's intra-op threads set to 1 (the host's tiny ops never split, but the pool is there)
  all       the three together

Prints per setting the median run time and its ratio to ``base`` (each round's ratio to the same round's base,
then their median), the machine's kernel (``uname -r``: the lent machines run under gVisor or Firecracker) and
CPU, and ends with one line holding a JSON object of the figures.

    python bench/host_knobs.py                      # scenarios/scale.toml, 4 rounds
    python bench/host_knobs.py --rounds 6 --quick   # 200 requests
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_step import cuda_scenario, host_cpu, one_run, scenario_arguments  # noqa: E402


@contextmanager
def _setting(name: str, cpu: int):
    allowed = os.sched_getaffinity(0)
    threads = torch.get_num_threads()
    was_gc = gc.isenabled()
    try:
        if name in ("pin", "all"):
            os.sched_setaffinity(0, {cpu})
        if name in ("nogc", "all"):
            gc.collect()
            gc.disable()
        if name in ("threads1", "all"):
            torch.set_num_threads(1)
        yield
    finally:
        os.sched_setaffinity(0, allowed)
        torch.set_num_threads(threads)
        if was_gc:
            gc.enable()


SETTINGS = ("base", "pin", "nogc", "threads1", "all")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    scenario_arguments(ap)
    ap.add_argument("--rounds", type=int, default=4, metavar="N", help="rounds of every setting (default 4)")
    ap.add_argument("--cpu", type=int, default=None, metavar="K",
                    help="the CPU 'pin' uses (default: the highest the process may run on)")
    args = ap.parse_args()
    sc = cuda_scenario(args, "bench/host_knobs.py")
    if sc is None:
        return 2
    cpu = max(os.sched_getaffinity(0)) if args.cpu is None else args.cpu
    one_run(sc, "cuda")     # cold: compiles and captures
    times: dict[str, list[float]] = {s: [] for s in SETTINGS}
    for r in range(args.rounds):
        for s in SETTINGS:
            with _setting(s, cpu):
                _, secs = one_run(sc, "cuda")
            times[s].append(secs)
        print(f"round {r + 1}/{args.rounds}: " + "  ".join(f"{s} {times[s][-1]:.2f}" for s in SETTINGS), flush=True)
    base = times["base"]
    figures = {"bench": "host_knobs", "scenario": sc.name, "kernel": platform.release(), "host_cpu": host_cpu(),
               "cpus": len(os.sched_getaffinity(0)), "pin_cpu": cpu, "rounds": args.rounds,
               "run_s": {s: [round(t, 3) for t in v] for s, v in times.items()},
               "median_s": {s: round(statistics.median(v), 3) for s, v in times.items()},
               "ratio_to_base": {s: round(statistics.median(t / b for t, b in zip(v, base)), 3)
                                 for s, v in times.items()}}
    print(f"\n# {sc.name} on {torch.cuda.get_device_name()}, kernel {figures['kernel']}, {figures['host_cpu']}, "
          f"{figures['cpus']} CPUs")
    for s in SETTINGS:
        print(f"{s:9s} median {figures['median_s'][s]:6.2f} s   ratio to base {figures['ratio_to_base'][s]:.3f}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
