#!/usr/bin/env python3
"""Two versions of cuda_path/read_cache.py on the same inputs, call by call: the GPU step runner's read tables.

The scale scenario runs once through the step runner on the CPU (StepwiseExecutor, host metadata as on a GPU;
the pool stores and the verdicts stubbed out: only the host work of the read tables is of interest here) with
both versions' ``IncrementalReads`` side by side: each step's ``note_step`` and ``table`` go to both (in turn
first), each timed in thread CPU time, and every table is compared (indptr, indices, start, and whether it was
found all clean): the run stops at the first difference. Machines here are shared and noisy; the ratio within
one run is the figure (both see the same load).

    python bench/read_cache_ab.py OLD.py                 # OLD against the tree's own read_cache.py
    python bench/read_cache_ab.py OLD.py NEW.py --requests 300 --runs 2
    git show REF:cuda_path/read_cache.py > /tmp/old.py   # (a committed version as OLD)
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cuda_path.pool as pool_mod  # noqa: E402
import cuda_path.step as step_mod  # noqa: E402
from cuda_path.pool import TaggedKVPool  # noqa: E402
from cuda_path.step import StepwiseExecutor  # noqa: E402
from simulator.designs import load_design  # noqa: E402
from simulator.core.eager import EagerExecutor  # noqa: E402
from simulator.run import run_simulation  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Pair:
    """The runner's ``_reads``: both versions, timed, every table compared."""

    def __init__(self, a, b):
        self.v = {"old": a.IncrementalReads(), "new": b.IncrementalReads()}
        self.t = {f"{n}_{f}": 0.0 for n in self.v for f in ("table", "note_step")}
        self.k = 0

    def _order(self):
        return list(self.v.items())[:: 1 if self.k % 2 else -1]

    def reset(self):
        for r in self.v.values():
            r.reset()

    def note_step(self, *args):
        for n, r in self._order():
            t = time.thread_time()
            r.note_step(*args)
            self.t[f"{n}_note_step"] += time.thread_time() - t

    def known_clean(self, table):
        return self.v["old"].known_clean(table)

    def table(self, *args):
        self.k += 1
        got = {}
        for n, r in self._order():
            t = time.thread_time()
            got[n] = r.table(*args)
            self.t[f"{n}_table"] += time.thread_time() - t
        for kind in ("full", "swa"):
            for f in ("indptr", "indices", "start"):
                a, b = getattr(got["old"].of(kind), f), getattr(got["new"].of(kind), f)
                if a.dtype != b.dtype or not torch.equal(a, b):
                    raise SystemExit(f"table {self.k}: {kind}.{f} differs")
        if self.v["old"].known_clean(got["old"]) != self.v["new"].known_clean(got["new"]):
            raise SystemExit(f"table {self.k}: known_clean differs")
        return got["old"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old")
    ap.add_argument("new", nargs="?", default=str(ROOT / "cuda_path" / "read_cache.py"))
    ap.add_argument("--requests", type=int, default=1000, help="the scale scenario's requests (0: as shipped)")
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    a, b = _load(args.old, "read_cache_old"), _load(args.new, "read_cache_new")
    pool_mod.TaggedKVPool.store = lambda *x, **k: None      # (the host work of the tables only)
    step_mod.verdict = lambda *x, **k: None
    sc = load_scenario(ROOT / "scenarios" / "scale.toml")
    if args.requests:
        sc = dataclasses.replace(sc, workload=dataclasses.replace(sc.workload, requests=args.requests))
    make = lambda f, s, skip: TaggedKVPool(sc.model, f, s, geometry="compact", skip_index=skip)  # noqa: E731
    for _ in range(args.runs):
        ex = StepwiseExecutor(EagerExecutor())
        ex.runner.host_metadata = True
        pair = ex.runner._reads = _Pair(a, b)
        r = run_simulation(sc, load_design(sc.design), make, executor=ex)
        t = pair.t
        old, new = t["old_table"] + t["old_note_step"], t["new_table"] + t["new_note_step"]
        print(f"{len(r.steps)} steps, {pair.k} tables equal: old table {t['old_table']:.3f} s note_step "
              f"{t['old_note_step']:.3f} s | new table {t['new_table']:.3f} s note_step {t['new_note_step']:.3f} s"
              f" | new/old {new / old:.3f}", flush=True)


if __name__ == "__main__":
    main()
