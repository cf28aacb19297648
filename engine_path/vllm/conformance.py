"""``slotscope conform SCENARIO --engine vllm==V``: slotscope's model of vLLM's worker tables against the release's.

The worker side of a vLLM step (model runner V2's ``BlockTables``: the rows the scheduler's block ids build, the
forward's gathered block tables and its slot mappings) is release code in a vLLM run, its Triton kernels run by
Triton's interpreter (~50 ms a step on a CPU). :class:`WorkerModel` is slotscope's model of it in numpy, the
``vllm-0.34`` worker model:

* a new or resumed request's row is its scheduler output's block ids, whole; a running request's row grows by its
  new block ids (ids the sliding-window manager freed stay in the row); a finished or preempted request's row goes;
* the forward's table of a group is each request's row, its first ``max(first - reach, 0) // block_size`` entries
  nulled (0) for a sliding-window group (``reach`` = ``num_retained_tokens``: the window less one, plus retained
  extras), where ``first`` is the request's first scheduled position; entries past the row are not compared (the
  release leaves an earlier batch's there, and no kernel reads them);
* each scheduled token's slot in a group is ``row[pos // block_size] * block_size + pos % block_size``; every slot
  past the real tokens is -1 (``PAD_SLOT_ID``: what a CUDA graph's padded rows take).

:func:`conform` drives the release's scheduler (engine_path/vllm/scheduler.py: every batch and block is vLLM's, as in
a run) and gives each step's scheduler output to both sides, then compares them field by field.
"""
from __future__ import annotations

import time
from typing import Optional

import numpy as np

#: what the comparison looks at, per KV-cache group
FIELDS = ("slot_mapping", "padding", "block_table")


class WorkerModel:
    """slotscope's model of model runner V2's ``BlockTables`` (the same ``apply`` / ``prepare`` as
    :class:`~engine_path.vllm.worker.WorkerTables`)."""

    def __init__(self, driver):
        kci = __import__("vllm.v1.kv_cache_interface", fromlist=["SlidingWindowSpec"])
        self.block_sizes, self.reach = [], []
        for group in driver.kv_groups:
            spec = group.kv_cache_spec
            self.block_sizes.append(spec.block_size)
            self.reach.append(spec.num_retained_tokens if isinstance(spec, kci.SlidingWindowSpec) else 0)
        self.max_tokens = driver.vllm_config.scheduler_config.max_num_batched_tokens
        self.rows: dict[str, list[list[int]]] = {}

    def apply(self, new_rows: dict, appended: dict, finished: set) -> None:
        for rid in finished:
            self.rows.pop(rid, None)
        for rid, blocks in new_rows.items():
            self.rows[rid] = [list(b) for b in blocks]
        for rid, blocks in appended.items():
            for row, more in zip(self.rows[rid], blocks):
                row.extend(more)

    def prepare(self, req_ids: list, starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        groups = len(self.block_sizes)
        slots = np.full((groups, self.max_tokens), -1, dtype=np.int64)
        width = max((len(r) for rid in req_ids for r in self.rows[rid]), default=0)
        tables = [np.zeros((len(req_ids), width), dtype=np.int64) for _ in range(groups)]
        at = 0
        for i, (rid, first, n) in enumerate(zip(req_ids, starts.tolist(), counts.tolist())):
            pos = np.arange(first, first + n, dtype=np.int64)
            for g, (bs, reach) in enumerate(zip(self.block_sizes, self.reach)):
                row = np.asarray(self.rows[rid][g], dtype=np.int64)
                slots[g, at:at + n] = row[pos // bs] * bs + pos % bs
                nulled = max(first - reach, 0) // bs if reach > 0 else 0
                tables[g][i, :row.size] = row
                tables[g][i, :nulled] = 0
            at += n
        return slots, tables


def conform(scenario, *, max_steps: Optional[int] = None) -> dict:
    """Both worker sides over the release's schedule of ``scenario``: per field and group, steps equal and
    differing, the first divergence (step, field, group, request or token index, model value, engine value)."""
    from simulator.scheduling.content_tags import ContentTags
    from simulator.scheduling.workload import make_requests

    from . import kernels
    from .scheduler import VllmScheduler
    from .worker import WorkerTables

    specs = make_requests(scenario.workload, np.random.default_rng(scenario.seed))
    content = ContentTags()
    driver = VllmScheduler(scenario, specs, lambda i: content.row(i, specs), max_steps=max_steps)
    # the release's own kernels, interpreted: a stand-in would compare slotscope's torch with slotscope's numpy
    release, model = WorkerTables(driver, stand_ins=False), WorkerModel(driver)
    kinds = driver.groups
    rows = {f"{f} [{k}]": [0, 0] for f in FIELDS for k in kinds}
    first: Optional[dict] = None
    t_release = t_model = 0.0
    steps = 0
    with kernels.interpreted():      # once for the run: every step's release tables by its own kernels
        while (step := driver.next_step()) is not None:
            t0 = time.perf_counter()
            release.apply(step.new_rows, step.appended, step.gone)
            e_slots, e_tables = release.prepare(step.req_ids, step.starts, step.counts)
            t1 = time.perf_counter()
            model.apply(step.new_rows, step.appended, step.gone)
            m_slots, m_tables = model.prepare(step.req_ids, step.starts, step.counts)
            t_release, t_model = t_release + t1 - t0, t_model + time.perf_counter() - t1
            real = int(step.counts.sum())
            for g, kind in enumerate(kinds):
                got = {"slot_mapping": _first_diff(m_slots[g, :real], e_slots[g, :real], "token"),
                       "padding": _first_diff(m_slots[g, real:], e_slots[g, real:], "token", offset=real),
                       "block_table": _table_diff(m_tables[g], e_tables[g], step.req_ids,
                                                   [len(model.rows[r][g]) for r in step.req_ids])}
                for field, d in got.items():
                    rows[f"{field} [{kind}]"][1 if d else 0] += 1
                    if d and first is None:
                        first = {"step": steps, "field": f"{field} [{kind}]", "detail": d}
            driver.finish_step(step)
            steps += 1
    return {"steps_compared": steps, "fields": rows, "first": first, "groups": kinds,
            "release_s": round(t_release, 2), "model_s": round(t_model, 3),
            "did": driver.describe()["did"]}


def _first_diff(model: np.ndarray, engine: np.ndarray, what: str, offset: int = 0) -> Optional[str]:
    bad = np.flatnonzero(model != engine)
    if not bad.size:
        return None
    i = int(bad[0])
    return (f"{what} {offset + i}: model {int(model[i])}, engine {int(engine[i])} "
            f"({bad.size} {what}{'s' if bad.size > 1 else ''} differ{'' if bad.size > 1 else 's'})")


def _table_diff(model: np.ndarray, engine: np.ndarray, req_ids: list, lengths: list) -> Optional[str]:
    """The first request whose gathered row differs over its own length (past it the release keeps what an earlier
    batch left, which no kernel reads)."""
    for i, (rid, n) in enumerate(zip(req_ids, lengths)):
        if engine.shape[1] < n:
            return f"request {rid}: the engine's table has {engine.shape[1]} entries, the model's row {n}"
        d = _first_diff(model[i, :n], engine[i, :n], "entry")
        if d:
            return f"request {rid}, {d}"
    return None


__all__ = ["FIELDS", "WorkerModel", "conform"]
