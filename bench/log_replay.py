"""What replaying an SGLang request log costs: converting it, and running the replay.

    python bench/log_replay.py [--requests 10000] [--no-run] [--keep DIR]

1. Generates a request log of N requests (``--log-requests-format json``) line by line from the
   lines SGLang 0.5.23's own RequestLogger wrote for tests/fixtures/sglang/0.5.23/requests.json.log
   (scripts/make-sglang-fixtures): the same line shape, with rid, timestamps and numbers replaced.
   Traffic: Poisson arrivals at 100 requests/s, prompts lognormal around 600 tokens (16..4000), outputs
   lognormal around 100 (1..600), a third of the requests with a 256-token cached prefix, e2e latency
   ~ 10 ms per output token.
2. Converts it (``slotscope scenario from-log``) in a fresh process: wall time and peak memory, and the
   same for the reader alone (tracing.sglang_records.read_request_log); then both for a 10x longer log
   (10 N requests): the memory growth must stay <= 100 MB for the streamed reader.
3. Runs the replay (``slotscope run``) with a small base scenario (gpt-oss-20b, 2 layers, flashinfer,
   full pool 131,072 slots, tracing at anomaly, report on; from-log turns the radix cache on, the cached
   prefixes being present): wall time, steps, the radix cache's prefix-hit tokens.

Prints the figures side by side and ends with one JSON line.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "sglang" / "0.5.23" / "requests.json.log"
T0 = 1_780_000_000.0

BASE = """name = "replay-base"
seed = 1
design = "sglang-post-29460"
backends = ["flashinfer"]

[model]
preset = "gpt-oss-20b"
num_layers = 2

[pool]
full_size = 131072

[workload]
requests = 1

[engine]
chunked_prefill_size = 8192
max_running_requests = 256
"""


def _templates() -> tuple[dict, dict]:
    recv = fin = None
    for line in FIXTURE.read_text(encoding="utf-8").splitlines():
        body = json.loads(line[line.index("{"):])
        if body["event"] == "request.received" and recv is None:
            recv = body
        if body["event"] == "request.finished" and fin is None:
            fin = body
    assert recv and fin, f"{FIXTURE}: no received/finished lines (run scripts/make-sglang-fixtures)"
    return recv, fin


def generate(path: Path, n: int, seed: int = 0) -> dict:
    """A JSON request log of n requests in SGLang's line shape; returns what was generated."""
    rng = random.Random(seed)
    recv_t, fin_t = _templates()
    events = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(100.0)
        prompt = max(16, min(4000, int(rng.lognormvariate(math.log(600), 0.8))))
        out = max(1, min(600, int(rng.lognormvariate(math.log(100), 0.7))))
        cached = 256 if rng.random() < 1 / 3 and prompt > 256 else 0
        e2e = 0.02 + 0.010 * out * rng.uniform(0.9, 1.1)
        events.append((t, 0, i, prompt, out, cached, e2e))
        events.append((t + e2e, 1, i, prompt, out, cached, e2e))
    events.sort(key=lambda e: (e[0], e[1]))
    with open(path, "w", encoding="utf-8") as f:
        for ts, kind, i, prompt, out, cached, e2e in events:
            when = datetime.fromtimestamp(T0 + ts)
            rid = f"{i:032x}"
            d = dict(recv_t if kind == 0 else fin_t)
            d["timestamp"] = when.isoformat()
            d["rid"] = rid
            obj = dict(d["obj"])
            obj["rid"] = rid
            obj["sampling_params"] = {"max_new_tokens": out, "temperature": 0}
            d["obj"] = obj
            if kind == 1:
                meta = dict(d["out"]["meta_info"])
                meta.update(id=rid, prompt_tokens=prompt, completion_tokens=out, cached_tokens=cached,
                            e2e_latency=e2e, request_received_ts=T0 + ts - e2e, request_finished_ts=T0 + ts,
                            finish_reason={"type": "length", "length": out})
                d["out"] = {"meta_info": meta}
            f.write(f"[{when.strftime('%Y-%m-%d %H:%M:%S')}] {json.dumps(d, ensure_ascii=False)}\n")
    return {"requests": n, "lines": 2 * n, "bytes": path.stat().st_size}


_CHILD = r"""
import json, resource, sys, time
def hwm_kb():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
mode, log, base, out = sys.argv[1:5]
import tracing.sglang_records, slotscope.scenario_cmd, simulator.scenario   # imports before the baseline
before = hwm_kb()
t = time.perf_counter()
if mode == "reader":
    reqs, stats = tracing.sglang_records.read_request_log([log])
    n = len(reqs)
else:
    from slotscope.cli import main
    rc = main(["scenario", "from-log", log, "--base", base, "-o", out, "-q"])
    assert rc == 0, rc
    n = None
print(json.dumps({"s": time.perf_counter() - t, "hwm_mb": hwm_kb() / 1024, "base_mb": before / 1024, "n": n}))
"""


def child(mode: str, log: Path, base: Path, out: Path) -> dict:
    res = subprocess.run([sys.executable, "-c", _CHILD, mode, str(log), str(base), str(out)], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--no-run", action="store_true", help="skip running the replay")
    ap.add_argument("--keep", help="keep the generated files in this directory")
    args = ap.parse_args()
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="slotscope-log-replay-"))
    tmp.mkdir(parents=True, exist_ok=True)
    base = tmp / "base.toml"
    base.write_text(BASE, encoding="utf-8")
    result: dict = {"requests": args.requests}
    try:
        logs = {}
        for scale in (1, 10):
            p = tmp / f"requests-x{scale}.json.log"
            t = time.perf_counter()
            g = generate(p, args.requests * scale, seed=scale)
            g["generate_s"] = time.perf_counter() - t
            logs[scale] = (p, g)
        rows = {}
        for scale, (p, g) in logs.items():
            reader = child("reader", p, base, tmp / "unused.toml")
            conv = child("convert", p, base, tmp / f"replay-x{scale}.toml")
            rows[scale] = {"log_mb": g["bytes"] / 2**20, "requests": g["requests"], "reader_s": reader["s"],
                           "reader_peak_mb": reader["hwm_mb"], "reader_growth_mb": reader["hwm_mb"] - reader["base_mb"],
                           "convert_s": conv["s"], "convert_peak_mb": conv["hwm_mb"],
                           "convert_growth_mb": conv["hwm_mb"] - conv["base_mb"],
                           "toml_mb": (tmp / f"replay-x{scale}.toml").stat().st_size / 2**20}
        print(f"{'':24}{'1x':>14}{'10x':>14}{'10x / 1x':>12}")
        for key, label in (("requests", "requests"), ("log_mb", "log MB"), ("reader_s", "reader s"),
                           ("reader_peak_mb", "reader peak MB"), ("convert_s", "from-log s"),
                           ("convert_peak_mb", "from-log peak MB"), ("toml_mb", "scenario MB")):
            a, b = rows[1][key], rows[10][key]
            print(f"{label:24}{a:>14,.2f}{b:>14,.2f}{(b / a if a else float('nan')):>12.2f}")
        growth_reader = rows[10]["reader_peak_mb"] - rows[1]["reader_peak_mb"]
        growth_convert = rows[10]["convert_peak_mb"] - rows[1]["convert_peak_mb"]
        print(f"peak memory growth 1x -> 10x: reader {growth_reader:+.1f} MB (target <= +100 MB), "
              f"from-log {growth_convert:+.1f} MB (the scenario itself holds one table per request)")
        result.update(x1=rows[1], x10=rows[10], reader_growth_mb=growth_reader, convert_growth_mb=growth_convert,
                      reader_ok=growth_reader <= 100)
        if not args.no_run:
            out_dir = tmp / "run"
            t = time.perf_counter()
            rc = subprocess.run([sys.executable, "-m", "slotscope", "run", str(tmp / "replay-x1.toml"), "--out",
                                 str(out_dir), "--device", "cpu", "-q"], cwd=ROOT).returncode
            run_s = time.perf_counter() - t
            steps = sum(1 for _ in open(out_dir / "steps.jsonl", "rb"))
            summary = json.loads((out_dir / "summary.json").read_text())
            findings = sum(sum(b["findings"].values()) for b in summary["backends"].values())
            radix = summary.get("radix") or {}
            run_json = json.loads((out_dir / "run.json").read_text())
            print(f"replay of {args.requests:,} requests (base: gpt-oss-20b, 2 layers, flashinfer, 131,072 slots; "
                  f"radix cache {'on' if radix else 'off'}): {run_s:.1f} s, {steps:,} steps, exit {rc}, {findings} "
                  f"findings, {radix.get('hit_tokens', 0):,} prefix-hit tokens")
            result.update(run_s=run_s, run_steps=steps, run_rc=rc, run_findings=findings,
                          run_hit_tokens=radix.get("hit_tokens"), run_timings=run_json.get("timings"))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
