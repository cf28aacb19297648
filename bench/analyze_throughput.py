"""Throughput and memory of the offline analyser on a synthetic slotscope trace.

Why these two figures: the analyser must keep up with plain JSON parsing (its floor: every line
has to be parsed anyway), and it must stream, so a trace ten times larger may not need ten
times the memory.

1. Writes a boundary-level trace through our own recorder, span emitter and OTLP JSON exporter
   (default 200k boundary spans).
2. Times ``json.loads`` of every line against the full analysis of the same file, alternating,
   best of ``--repeat``; ratio = analyser throughput / json.loads throughput (target >= 0.5).
3. Runs the analyser in fresh subprocesses on the file and on a file ``--scale`` times as large
   (its lines repeated) and compares peak RSS (target growth <= 100 MB).

Ends with one line holding a JSON object of the figures.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tracing import synthetic as S  # noqa: E402
from tracing.analyze import analyze_files  # noqa: E402
from tracing.session import TraceSession  # noqa: E402

# Peak RSS from /proc/self/status VmHWM: unlike ru_maxrss, it belongs to the new address space
# after exec, so the child does not inherit the parent's (large) high-water mark.
_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])

def hwm_kb():
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

from tracing.analyze import analyze_files
base = hwm_kb()
t = time.perf_counter()
res = analyze_files([sys.argv[2]])
dt = time.perf_counter() - t
print(json.dumps({"spans": res.spans, "seconds": dt, "base_kb": base, "peak_kb": hwm_kb()}))
"""


def generate(out_dir: Path, boundaries: int, layers: int) -> tuple[Path, int, float]:
    run = S.run_info(n_layers=layers, scenario="bench", design="prefix")
    steps = -(-boundaries // (layers * len(run.backends)))
    session = TraceSession(out_dir, "boundary")
    t = time.perf_counter()
    S.drive(session.observer, run, steps)
    fig = session.finish()
    return Path(fig["file"]), fig["spans"], time.perf_counter() - t


def time_json(path: Path) -> float:
    loads = json.loads
    t = time.perf_counter()
    with open(path, "rb") as fh:
        for line in fh:
            loads(line)
    return time.perf_counter() - t


def time_analyze(path: Path) -> float:
    t = time.perf_counter()
    analyze_files([path])
    return time.perf_counter() - t


def child_peak(path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT), str(path)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--boundaries", type=int, default=200_000)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed after)")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        path, spans, gen_s = generate(work / "run", args.boundaries, args.layers)
        size_mb = path.stat().st_size / 1e6
        print(f"generated {spans} spans ({size_mb:.1f} MB) in {gen_s:.1f} s "
              f"({gen_s / spans * 1e6:.0f} us per span emitted and exported)")

        json_s, an_s = [], []
        for _ in range(args.repeat):             # alternate so both see the same cache state
            json_s.append(time_json(path))
            an_s.append(time_analyze(path))
        j, a = min(json_s), min(an_s)
        ratio = j / a
        print(f"json.loads of every line: {j:.2f} s ({size_mb / j:.0f} MB/s, {spans / j:,.0f} spans/s)")
        print(f"analyser:                 {a:.2f} s ({size_mb / a:.0f} MB/s, {spans / a:,.0f} spans/s)")
        print(f"throughput ratio analyser/json.loads: {ratio:.2f} (target >= 0.5)")

        big = work / "big.otlp.jsonl"
        with open(path, "rb") as src, open(big, "wb") as dst:
            data = src.read()
            for _ in range(args.scale):
                dst.write(data)
        del data
        small = child_peak(path)
        large = child_peak(big)
        growth_mb = (large["peak_kb"] - small["peak_kb"]) / 1024
        print(f"peak RSS analysing 1x: {small['peak_kb'] / 1024:.1f} MB "
              f"({small['spans']} spans, {small['seconds']:.1f} s); {args.scale}x: "
              f"{large['peak_kb'] / 1024:.1f} MB ({large['spans']} spans, {large['seconds']:.1f} s)")
        print(f"peak memory growth {args.scale}x vs 1x: {growth_mb:.1f} MB (target <= 100 MB)")

    figures = {
        "bench": "analyze_throughput",
        "spans": spans, "file_mb": round(size_mb, 1), "emit_us_per_span": round(gen_s / spans * 1e6, 1),
        "json_loads_s": round(j, 3), "analyze_s": round(a, 3), "throughput_ratio": round(ratio, 3),
        "analyze_spans_per_s": round(spans / a), "scale": args.scale,
        "peak_rss_1x_mb": round(small["peak_kb"] / 1024, 1),
        "peak_rss_scaled_mb": round(large["peak_kb"] / 1024, 1),
        "memory_growth_mb": round(growth_mb, 1),
        "ok": ratio >= 0.5 and growth_mb <= 100,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
