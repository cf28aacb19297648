#!/usr/bin/env python3
"""vLLM runs on a CPU: the worker's kernels stood in by torch (engine_path/vllm/kernels.py) against interpreted.

Why: under Triton's interpreter the worker's three kernels cost ~50 ms a step, most of a `slotscope run --engine
vllm==V` on a CPU. Each run here is ``slotscope run SCENARIO --engine vllm==0.34.0 --no-report --trace-level off``
in a process of its own (a process imports one release, and the stand-ins stay installed once made): the default
(stood in) and ``SLOTSCOPE_INTERPRET_KERNELS=1`` (every kernel interpreted), alternating, best of ``--repeat``.
The run time is the simulation's (run.json's ``timings.run_s``: the import excluded); the findings and step counts
of both modes must be equal (``same``). Ends with one line holding a JSON object of the figures.

    python bench/vllm_kernels.py                         # scenarios/sched-evict-retract.toml, 2 repeats
    python bench/vllm_kernels.py --scenario scenarios/vllm-cover-paged.toml --repeat 1
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one(scenario: str, interpret: bool, out: Path) -> dict:
    env = dict(os.environ)
    env.pop("SLOTSCOPE_INTERPRET_KERNELS", None)
    if interpret:
        env["SLOTSCOPE_INTERPRET_KERNELS"] = "1"
    proc = subprocess.run([sys.executable, "-m", "slotscope", "run", scenario, "--engine", "vllm==0.34.0", "--out",
                           str(out), "--no-report", "--trace-level", "off", "-q"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        sys.exit(f"{scenario} ({'interpreted' if interpret else 'stood in'}) exit {proc.returncode}:\n"
                 f"{proc.stderr[-2000:]}")
    run = json.loads((out / "run.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    return {"run_s": run["timings"]["run_s"], "steps": summary["steps"], "findings": summary["findings_total"],
            "findings_text": (out / "findings.jsonl").read_text()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="scenarios/sched-evict-retract.toml")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    best: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            for mode in ("stood in", "interpreted"):
                got = one(args.scenario, mode == "interpreted", Path(tmp) / f"{mode.replace(' ', '-')}-{r}")
                print(f"  {mode:<12} run {got['run_s']:7.2f} s  {got['steps']} steps, {got['findings']} findings",
                      flush=True)
                if mode not in best or got["run_s"] < best[mode]["run_s"]:
                    best[mode] = got
    stood, interp = best["stood in"], best["interpreted"]
    same = all(stood[k] == interp[k] for k in ("steps", "findings", "findings_text"))
    ratio = interp["run_s"] / stood["run_s"]
    print(f"{args.scenario}: stood in {stood['run_s']:.2f} s, interpreted {interp['run_s']:.2f} s: "
          f"{ratio:.1f}x faster; same steps and findings: {same}")
    print(json.dumps({"scenario": args.scenario, "steps": stood["steps"], "stood_in_run_s": round(stood["run_s"], 3),
                      "interpreted_run_s": round(interp["run_s"], 3), "speedup": round(ratio, 2), "same": same}))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
