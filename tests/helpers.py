"""Helpers shared by the tests: run a scenario in-process with the CPU pool, or the CLI in a subprocess."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from simulator.designs import load_design
from simulator.run import RunResult, run_simulation
from simulator.scenario import Scenario, load_scenario, parse_scenario

ROOT = Path(__file__).resolve().parent.parent


def slotscope_cli(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """``python -m slotscope ARGS`` from the repository root, its output captured (``env``: added variables)."""
    return subprocess.run([sys.executable, "-m", "slotscope", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})))


def scenario(name: str) -> Scenario:
    return load_scenario(ROOT / "scenarios" / f"{name}.toml")


def simulate(sc: Scenario | str, design: str | None = None, *, store: str = "torch", geometry: str = "compact",
             device: str = "cpu", backends=None) -> RunResult:
    from cuda_path.pool import TaggedKVPool

    if isinstance(sc, str):
        sc = scenario(sc)
    sc = sc.with_overrides(design=design, backends=backends)
    d = load_design(sc.design)

    def make(full_rows, swa_rows, skip):
        return TaggedKVPool(sc.model, full_rows, swa_rows, device=device, geometry=geometry, store_impl=store,
                            skip_index=skip)

    return run_simulation(sc, d, make, device=device)


def tiny(text: str) -> Scenario:
    return parse_scenario(text, "tiny.toml")
