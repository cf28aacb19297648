"""A synthetic run driven through the RunObserver protocol, with the answer key.

Tests and benchmarks need traces whose divergence counts are known in advance, without the
simulator (which tracing must not depend on beyond its records and protocol). This plays a run
loop: per step, every backend crosses every layer; some steps show B1 (swa_loc longer than loc,
the store raises a length mismatch on SWA layers) and some a shorter swa_loc with clobbered
slots. It returns the counts an analyser must find.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from simulator.records import Finding, LayerInfo, Owner, RunInfo, StepRecord

BACKENDS = ("flashinfer", "triton", "fa3", "trtllm_mha")


def hybrid_layers(n: int, full_every: int = 4) -> tuple[LayerInfo, ...]:
    """Every ``full_every``-th layer full, the rest SWA, each numbered inside its sub-pool."""
    out, nf, ns = [], 0, 0
    for i in range(n):
        if i % full_every == 0:
            out.append(LayerInfo(i, "full", nf))
            nf += 1
        else:
            out.append(LayerInfo(i, "swa", ns))
            ns += 1
    return tuple(out)


def run_info(backends: Sequence[str] = BACKENDS, n_layers: int = 8, *, scenario: str = "synthetic",
             design: str = "prefix", seed: int = 0) -> RunInfo:
    return RunInfo(scenario=scenario, scenario_path=f"scenarios/{scenario}.toml",
                   scenario_hash="0" * 16, design=design, seed=seed, backends=tuple(backends),
                   layers=hybrid_layers(n_layers), device="cpu", version="0.1.0")


@dataclass
class Expected:
    """The answer key: counts as the analyser reports them."""

    boundaries: int = 0
    longer: int = 0
    shorter: int = 0
    tables: dict[str, dict[str, list[int]]] = field(
        default_factory=lambda: {d: {} for d in ("backend", "layer_kind", "mode", "graph_path")})
    findings: dict[str, dict[str, int]] = field(default_factory=dict)
    first: Optional[dict[str, Any]] = None
    errors: int = 0
    anomalous: int = 0            # boundaries that get a span at level "anomaly"
    steps: int = 0
    backend_steps: int = 0

    def count(self, dims: dict[str, str], longer: int, shorter: int) -> None:
        for dim, key in dims.items():
            row = self.tables[dim].setdefault(key, [0, 0, 0])
            row[0] += 1
            row[1] += longer
            row[2] += shorter

    def crossing(self, s: int, b: str, li: LayerInfo, mode: str, graph: str, loc: int, swa: int,
                 err: Optional[str], first_swa: bool) -> list[Finding]:
        """Count one crossing as the analyser must; returns the findings the run loop reports for it (a
        length mismatch where the store raised; a shorter swa_loc clobbers on the first SWA layer)."""
        diverge = li.kind == "swa" and swa != loc
        lo = int(diverge and swa > loc)
        sh = int(diverge and swa < loc)
        self.boundaries += 1
        self.longer += lo
        self.shorter += sh
        self.count({"backend": b, "layer_kind": li.kind, "mode": mode, "graph_path": graph}, lo, sh)
        found = []
        if err is not None:
            self.errors += 1
            found.append(Finding(s, b, li.layer, li.kind, "length_mismatch", -1, None, None, err))
        if sh and first_swa:
            found.append(Finding(s, b, li.layer, li.kind, "clobbered", 3, Owner(7, 1, 2), Owner(-1)))
            found.append(Finding(s, b, li.layer, li.kind, "missed", 4, Owner(8, 1, 3), Owner(0)))
        if diverge or found:
            self.anomalous += 1
        if diverge and self.first is None:
            self.first = {"step": s, "backend": b, "layer": li.layer, "direction": "longer" if lo else "shorter"}
        return found


_SCHEDULE = (("extend", "piecewise"), ("decode", "decode_graph"), ("mixed", "eager"),
             ("decode", "eager"))


def drive(observer: Any, run: RunInfo, steps: int, *, seed: int = 0, b1_every: int = 5,
          short_every: int = 7, t0_ns: int = 1_000_000, layer_ns: int = 2_000) -> Expected:
    """Call the observer as the run loop would; return what it should have recorded."""
    rnd = random.Random(seed)
    exp = Expected()
    observer.on_run_start(run)
    t = t0_ns
    swa_first = next((li.layer for li in run.layers if li.kind == "swa"), None)
    for s in range(steps):
        mode, graph = _SCHEDULE[s % len(_SCHEDULE)]
        real = rnd.randint(1, 64)
        padded = real + (rnd.randint(1, 8) if graph != "eager" else 0)
        b1 = graph == "piecewise" and s % b1_every == 1
        short = mode == "decode" and s % short_every == 3
        step_t0 = t
        for b in run.backends:
            found: list[Finding] = []
            exp.backend_steps += 1
            for li in run.layers:
                loc = real
                swa = real
                if b1 and b != "trtllm_mha":       # trtllm_mha sliced swa_loc itself
                    swa = padded
                if short and b == run.backends[0]:
                    swa = real - 1 if real > 1 else 0
                err = None
                if li.kind == "swa" and swa != loc and swa > loc:
                    err = f"RuntimeError: Size mismatch: expected {loc} but got {swa}"
                observer.on_boundary(s, b, li.layer, loc, swa, "torch.int64", "torch.int64",
                                     t, t + layer_ns // 2, err)
                t += layer_ns
                found += exp.crossing(s, b, li, mode, graph, loc, swa, err, li.layer == swa_first)
            for f in found:
                per = exp.findings.setdefault(f.backend, {})
                per[f.cls] = per.get(f.cls, 0) + 1
            observer.on_findings(found)
        exp.steps += 1
        observer.on_step(StepRecord(step=s, mode=mode, graph=graph, num_requests=max(1, real // 8),
                                    real_tokens=real, dp_padded_tokens=padded,
                                    padded_tokens=padded, full_used=100 + s, swa_used=80 + s,
                                    full_size=4096, swa_size=3276, t_start_ns=step_t0, t_end_ns=t))
    observer.on_run_end()
    return exp
