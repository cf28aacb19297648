"""Requests to serve: generated from the scenario's distributions, or given explicitly."""
from __future__ import annotations

import numpy as np

from .scenario import RequestSpec, WorkloadConfig


def make_requests(cfg: WorkloadConfig, rng: np.random.Generator) -> list[RequestSpec]:
    """The workload's requests, sorted by arrival step (stable, so ids follow the file's order)."""
    if cfg.explicit:
        specs = list(cfg.explicit)
    else:
        n = cfg.requests
        if cfg.arrival == "all_at_once":
            arrivals = np.zeros(n, dtype=np.int64)
        else:
            gaps = rng.exponential(1.0 / cfg.rate, size=n)
            arrivals = np.floor(np.cumsum(gaps)).astype(np.int64)
        prompts = cfg.prompt_len.sample(rng, n)
        outputs = cfg.output_len.sample(rng, n)
        specs = [RequestSpec(int(a), int(p), int(o)) for a, p, o in zip(arrivals, prompts, outputs)]
    return sorted(specs, key=lambda r: r.arrival_step)
