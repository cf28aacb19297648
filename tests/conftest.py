"""Shared fixtures: small runs of shipped scenarios, CPU by default, and the GPU marker's skip."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # CI has no GPU: the Triton kernels run under the interpreter, which must be chosen before any
    # test module imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"

torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def scenario_path():
    return lambda name: SCENARIOS / f"{name}.toml"
