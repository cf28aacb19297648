#!/usr/bin/env python3
"""Where a decode graph replay's host time goes: the replays of a 300-request scale run on CUDA timed one by
one (each graph's first replay apart: it uploads the graph), then graphs of one kind of op each, replayed in a
loop (host time per replay() without and with a synchronisation). Ends with one line holding a JSON object.

    python bench/graph_replay.py        # needs a CUDA device

(docs/BENCHMARKS.md: torch.profiler put cudaGraphLaunch at 98 us a call; timed without the profiler a
replay costs 17 us of host time.)
"""
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch
from simulator.scenario import load_scenario
from slotscope.pipeline import RunOptions, run_scenario

sc = load_scenario(str(Path(__file__).resolve().parent.parent / "scenarios/scale.toml"))
sc = dataclasses.replace(sc, workload=dataclasses.replace(sc.workload, requests=300))
opts = RunOptions(device="cuda", trace_level="off", report=False)
run_scenario(sc, None, opts)
durs, seen = [], {}
orig = torch.cuda.CUDAGraph.replay
def timed(self):
    t0 = time.perf_counter(); orig(self); dt = time.perf_counter() - t0
    durs.append((dt, id(self) in seen)); seen[id(self)] = True
torch.cuda.CUDAGraph.replay = timed
t = time.perf_counter(); run_scenario(sc, None, opts); total = time.perf_counter() - t
torch.cuda.CUDAGraph.replay = orig
again = [d for d, s in durs if s]
FIG = {"bench": "graph_replay", "replays": len(durs), "repeat_median_us": round(statistics.median(again) * 1e6, 1)}
print(f"run {total:.2f} s: {len(durs)} replays, {sum(d for d, _ in durs):.3f} s; repeats median "
      f"{statistics.median(again) * 1e6:.1f} us p90 {sorted(again)[int(0.9 * len(again))] * 1e6:.1f} us; first "
      f"replays {sum(d for d, s in durs if not s) * 1e3:.1f} ms over {sum(1 for _, s in durs if not s)}")

def bench(name, body):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(g, capture_error_mode="relaxed"):
        body()
    for _ in range(20): g.replay()
    torch.cuda.synchronize()
    k = 300; t = time.perf_counter()
    for _ in range(k):
        g.replay()
    host = (time.perf_counter() - t) / k * 1e6
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(k):
        g.replay(); torch.cuda.synchronize()
    FIG[name] = {"replay_host_us": round(host, 1)}
    print(f"{name:28s} replay() host {host:7.1f} us   replay+sync {(time.perf_counter() - t) / k * 1e6:7.1f} us", flush=True)

from cuda_path.pool import TaggedKVPool
from simulator.oracle.kvrows import encode_rows
m = sc.model
pool = TaggedKVPool(m, 65536, 52429, device="cuda", geometry="real", store_impl="triton")
kinds = list(pool.shape)
n = 256
tags = torch.arange(n, device="cuda") + 5
loc = torch.arange(n, device="cuda") + 100
x = torch.zeros(1024, device="cuda")
bench("40 adds", lambda: [x.add_(1.0) for _ in range(40)])
heads, kd, vd = pool.shape[kinds[0]]
bench("encode_rows", lambda: encode_rows(tags, 3, heads, kd, pool.row_dtype))
bench("make_rows (both kinds)", lambda: [pool.make_rows(tags, 1, k) for k in kinds])
kv = pool.make_rows(tags, 1, kinds[0])
idx = tuple(range(0, 18))
bench("store_layers (triton)", lambda: pool.store_layers(kinds[0], idx, idx, loc, *kv))
bench("store (triton, one layer)", lambda: pool.store(kinds[0], 0, loc, *kv))
big = torch.zeros(65536, dtype=torch.int64, device="cuda")
bench("index ops", lambda: (big.index_select(0, loc), big.index_copy_(0, loc, loc)))
print(json.dumps(FIG))
