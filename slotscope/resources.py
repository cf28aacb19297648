"""Will the run fit? The memory a scenario needs, estimated before anything is allocated.

A scenario's sizes are validated one by one when it is read; whether they fit together depends on
where the run goes: the pools under test (every layer, ``rows x bytes per row`` of the geometry in use:
compact on the CPU, real on CUDA; one per backend, or one shared by the backends where the run's step
executor keeps one physical pool per class of backends whose writes agree, :func:`pools_shared`), the speculative draft's pools, the reference
pools and the allocator's map, the generated workload. :func:`check_resources` compares the estimate
to the memory available (``MemAvailable`` of /proc/meminfo on the host, ``torch.cuda.mem_get_info``
on a GPU) and raises :class:`ScenarioError` naming the field that drives the size and the estimate
in GiB, instead of a MemoryError (or a CUDA out-of-memory error) after the run has started.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

import torch

from cuda_path.pool import estimate_bytes, pool_layout, row_shape, slot_bytes
from simulator.oracle.kvrows import MIN_ROW_WIDTH
from simulator.scenario.models import Model
from simulator.scenario import Scenario, ScenarioError
from simulator.core.sides import draft_model

GIB = 2**30
#: set to 1 to skip the comparison with available memory (a VM whose memory grows as it is used, swap)
SKIP_ENV = "SLOTSCOPE_SKIP_MEMORY_CHECK"
#: host bytes per generated request (its spec, the arrays it is sampled from, the sorted list): measured ~213
REQUEST_BYTES = 256
#: host bytes per row of a reference pool: expected tag int64 + live bool (+ evicted bool per SWA row)
REFERENCE_FULL_BYTES, REFERENCE_SWA_BYTES = 9, 10
#: device bytes per row of a reference pool's mirror on a GPU (expected tags, int64)
REFERENCE_DEVICE_BYTES = 8


@dataclass
class Part:
    what: str           # in words, for the message
    field: str          # the scenario field that drives it
    nbytes: int
    on_device: bool     # in the GPU's memory (False: host memory)


@dataclass
class Estimate:
    parts: list[Part] = field(default_factory=list)

    def total(self, on_device: bool) -> int:
        return sum(p.nbytes for p in self.parts if p.on_device == on_device)

    def largest(self, on_device: bool) -> Optional[Part]:
        parts = [p for p in self.parts if p.on_device == on_device]
        return max(parts, key=lambda p: p.nbytes) if parts else None


def _gib(n: float) -> str:
    g = n / GIB
    return f"{g:,.1f} GiB" if g >= 0.1 else f"{n / 2**20:,.1f} MiB"


def _pools_what(model: Model, full_rows: int, swa_rows: int, geometry: str, pools: int, who: str,
                layout: str = "split", shared: bool = False) -> str:
    kinds = [f"{model.count(k)} {'full' if k == 'full' else 'SWA'} layers x {rows:,} rows x "
             f"{slot_bytes(model, k, geometry, layout)} B"
             for k, rows in (("full", full_rows), ("swa", swa_rows)) if model.count(k)]
    if shared:
        how = (f"1 pool shared by {pools} backends, copied only where a backend's writes diverge" if pools > 1
               else "1 backend")
        return f"{who} ({how}: {' + '.join(kinds)}, {geometry} geometry)"
    return f"{who} ({pools} backend{'s' if pools != 1 else ''} x ({' + '.join(kinds)}), {geometry} geometry)"


def pools_shared(scenario: Scenario, device: torch.device | str, *, cuda_graphs: bool = False,
                 plugins: bool = False, timeline: Optional[bool] = None) -> bool:
    """Whether the run's backends start on one shared pool per side (simulator/memory/pool.py's
    ``PoolClasses``): a whole-step executor takes its steps (the CPU's shared step; on CUDA the graph
    executor's step runner, ``cuda_graphs``) and no plug-in that acts per backend is installed: the unified
    pool's plan, the overlap timeline, ``plugins`` (--inject, a forward observer). This mirrors
    ``StepPipeline.settle_pools``; a run whose writes diverge copies the pool then (a copy that cannot fit
    stops the run with ``PoolSplitError`` naming the step). ``timeline``: whether the run goes on SGLang's overlap
    timeline (slotscope/run_setup.py's ``overlap_timeline``; None: whenever engine.overlap is on)."""
    gpu = torch.device(device).type == "cuda"
    if timeline is None:
        timeline = bool(scenario.engine.overlap)
    if plugins or scenario.pool.unified or timeline:
        return False
    return cuda_graphs if gpu else True


def _draft_sizes(scenario: Scenario, design, full_size: int, swa_size: int) -> tuple[int, int]:
    cfg = scenario.engine.speculative.draft_pool(scenario.pool)
    try:
        full, swa = design.size_draft_pools(full_size, swa_size, cfg.full_size, cfg.swa_size)
        return int(full), int(swa)
    except Exception:       # the design's own error surfaces in the run; estimate with the fixed sizing
        return max(cfg.full_size, full_size), max(cfg.swa_size, swa_size)


def estimate(scenario: Scenario, design, device: torch.device | str, geometry: str,
             shared: bool = False) -> Estimate:
    """What the run of ``scenario`` under ``design`` holds in memory at the start, part by part (``shared``:
    one pool per side for all backends, :func:`pools_shared`)."""
    device = torch.device(device)
    gpu = device.type == "cuda"
    pool, model, n = scenario.pool, scenario.model, len(scenario.backends)
    held = 1 if shared else n
    page = pool.page_size
    full_rows, swa_rows = pool.full_size + page, pool.swa_size + page
    est = Estimate()
    layout = pool_layout(model, device, geometry)       # the layout the pools take (cuda_path/pool.py)
    est.parts.append(Part(_pools_what(model, full_rows, swa_rows, geometry, n, "the pools under test", layout,
                                      shared),
                          "pool.full_size", estimate_bytes(model, full_rows, swa_rows, geometry, pools=held,
                                                           layout=layout), gpu))
    ref_rows = [(full_rows, swa_rows)]
    spec = scenario.engine.speculative
    if spec.enabled:
        draft = draft_model(model, scenario)
        d_full, d_swa = _draft_sizes(scenario, design, pool.full_size, pool.swa_size)
        d_full_rows, d_swa_rows = d_full + page, d_swa + page
        key = "engine.speculative.draft_full_size" if spec.draft_full_size is not None else "pool.full_size"
        d_layout = pool_layout(draft, device, geometry)     # (the draft's rows decide its own)
        est.parts.append(Part(_pools_what(draft, d_full_rows, d_swa_rows, geometry, n, "the draft's pools", d_layout,
                                          shared),
                              key, estimate_bytes(draft, d_full_rows, d_swa_rows, geometry, pools=held,
                                                  layout=d_layout), gpu))
        ref_rows.append((max(full_rows, d_full_rows), max(swa_rows, d_swa_rows)))
    ref = sum(REFERENCE_FULL_BYTES * f + REFERENCE_SWA_BYTES * s for f, s in ref_rows)
    alloc = 8 * (full_rows + 1) + 2 * 9 * (pool.full_size // page + 1)   # full_to_swa, two page stacks
    est.parts.append(Part("the reference pools and the allocator", "pool.full_size", ref + alloc, False))
    if gpu:
        est.parts.append(Part("the reference pools' GPU mirror", "pool.full_size",
                              sum(REFERENCE_DEVICE_BYTES * (f + s) for f, s in ref_rows), True))
    if not scenario.workload.explicit:
        est.parts.append(Part(f"{scenario.workload.requests:,} generated requests", "workload.requests",
                              REQUEST_BYTES * scenario.workload.requests, False))
    return est


def host_available() -> Optional[int]:
    """MemAvailable of /proc/meminfo in bytes; None where there is none (the check is then skipped)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def device_available(device: torch.device) -> Optional[int]:
    try:
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    except Exception:    # no CUDA here, or a driver that cannot say: skip the device check
        return None


def check_rows_carry_tags(scenario: Scenario, geometry: str) -> None:
    """In real geometry every row must have room for the tag lanes (the pool would refuse it later)."""
    if geometry != "real":
        return
    kinds = set(scenario.model.layer_kinds)
    if scenario.engine.speculative.enabled:
        kinds |= set(scenario.engine.speculative.draft_layers)
    for kind in sorted(kinds):
        heads, kd, vd = row_shape(scenario.model, kind, geometry)
        if heads * min(kd, vd) < MIN_ROW_WIDTH:
            key = "head_dim" if kd <= vd else "v_head_dim"
            raise ScenarioError(
                f"{scenario.source}: model.{kind}.{key}: rows of {heads} head(s) x {min(kd, vd)} lanes cannot carry "
                f"a slot tag in real geometry (need heads x head_dim >= {MIN_ROW_WIDTH}); use --geometry compact "
                f"or a larger geometry")


def check_resources(scenario: Scenario, design, device: torch.device | str, geometry: str, *,
                    shared: bool = False, host_bytes: Optional[int] = None,
                    device_bytes: Optional[int] = None) -> Estimate:
    """Raise :class:`ScenarioError` when the run cannot fit; return the estimate otherwise.

    ``shared``: the backends start on shared pools (:func:`pools_shared`). ``host_bytes`` /
    ``device_bytes`` replace the measured available memory (tests).
    """
    device = torch.device(device)
    check_rows_carry_tags(scenario, geometry)
    est = estimate(scenario, design, device, geometry, shared)
    if os.environ.get(SKIP_ENV, "") not in ("", "0") and host_bytes is None and device_bytes is None:
        return est
    checks = [(False, host_bytes if host_bytes is not None else host_available(), "host memory (MemAvailable)")]
    if device.type == "cuda":
        checks.append((True, device_bytes if device_bytes is not None else device_available(device),
                       f"free memory on {device} (torch.cuda.mem_get_info)"))
    for on_device, available, where in checks:
        need = est.total(on_device)
        if available is None or need <= available:
            continue
        top = est.largest(on_device)
        assert top is not None
        value = _field_value(scenario, top.field)
        others = need - top.nbytes
        raise ScenarioError(
            f"{scenario.source}: {top.field} = {value:,}: the run would not fit in memory: {top.what} need about "
            f"{_gib(top.nbytes)}" + (f", the rest {_gib(others)}" if others else "")
            + f"; {_gib(need)} in all, but only {_gib(available)} of {where} is available. "
              f"Lower {top.field}" + (" or the number of layers" if "shared by" in top.what else
                                      " or the number of layers or backends" if "pools" in top.what else "")
            + (" or use --geometry compact" if on_device and geometry == "real" else "")
            + f" (or set {SKIP_ENV}=1 to run anyway)")
    return est


def _field_value(scenario: Scenario, key: str) -> int:
    if key == "workload.requests":
        return scenario.workload.requests
    if key == "engine.speculative.draft_full_size":
        return int(scenario.engine.speculative.draft_full_size or 0)
    return scenario.pool.full_size
