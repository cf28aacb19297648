"""Requests to serve: generated from the scenario's distributions, or given explicitly."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from simulator.scenario import ONE_TURN, RequestSpec, WorkloadConfig


def make_requests(cfg: WorkloadConfig, rng: np.random.Generator) -> list[RequestSpec]:
    """The workload's requests, sorted by arrival step (stable, so ids follow the file's order).

    Each request's ``uid`` is its index before sorting (the identity of its own tokens). Sharing fields
    draw from ``rng`` only after the lengths, and only when set, so a workload without them draws (and
    gets) exactly what it did before they existed.
    """
    if cfg.explicit:
        specs = [r if r.uid >= 0 else replace(r, uid=i) for i, r in enumerate(cfg.explicit)]
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
        specs = _with_sharing(cfg, rng, specs)
        specs = [replace(r, uid=i) for i, r in enumerate(specs)]
    return sorted(specs, key=lambda r: r.arrival_step)


def _with_sharing(cfg: WorkloadConfig, rng: np.random.Generator, specs: list[RequestSpec]) -> list[RequestSpec]:
    """System prompts (the generated prompt length is the user's part, after the system prompt) and
    conversations (each generated request is a turn 1; turn k's prompt is turn k-1's prompt and output
    and a new message of ``prompt_len`` tokens; it arrives ``think_time`` steps after turn k-1 finished,
    and not before turn 1's arrival step)."""
    n = len(specs)
    if cfg.system_prompts:
        lens = cfg.system_prompt_len.sample(rng, cfg.system_prompts)
        uses = rng.random(n) < cfg.share
        which = rng.integers(0, cfg.system_prompts, size=n)
        specs = [replace(r, prompt_len=r.prompt_len + int(lens[j]), prefix_group=f"system{j}",
                         prefix_len=int(lens[j])) if use else r
                 for r, use, j in zip(specs, uses, which)]
    if cfg.turns == ONE_TURN:
        return specs
    turns = cfg.turns.sample(rng, n)
    extra = int(np.sum(turns - 1))
    users = cfg.prompt_len.sample(rng, extra)
    outs = cfg.output_len.sample(rng, extra)
    thinks = cfg.think_time.sample(rng, extra)
    out: list[RequestSpec] = []
    k = 0
    for i, (r, t) in enumerate(zip(specs, turns)):
        if t == 1:
            out.append(r)
            continue
        prev = replace(r, conversation=f"c{i}", turn=1)
        out.append(prev)
        for turn in range(2, int(t) + 1):
            prev = replace(prev, prompt_len=prev.total_len + int(users[k]), output_len=int(outs[k]), turn=turn,
                           think_time=int(thinks[k]))
            out.append(prev)
            k += 1
    return out
