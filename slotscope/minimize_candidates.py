"""The candidates of ``slotscope minimize``: the smaller scenarios its passes propose, in order.

Each pass (:class:`Candidates`) makes candidates with ``dataclasses.replace`` on the scenario and its parts
(``PoolConfig``, ``WorkloadConfig``, ``EngineConfig``, ``SpeculativeConfig``, ``Model``) and hands each to
``attempt``, which the search (:class:`slotscope.minimize.Minimizer`) implements: run it, keep it when it
still shows the target finding. A pass goes on from what was kept: one failing backend; the workload as an
explicit request list, requests dropped (greedy delta debugging, :func:`shrink_list`), pools and prompts
halved together, layers dropped (at least one of the failing kind stays), prompt / output lengths shrunk;
engine knobs back to their defaults or halved, fewer decode capture sizes; smaller pools, pages and window.
"""
from __future__ import annotations

from dataclasses import fields, replace
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from simulator.scenario import EngineConfig, Scenario, SpeculativeConfig
from simulator.scenario.capture import default_decode_capture_sizes, speculative_decode_capture_sizes
from simulator.scenario.models import format_pattern
from simulator.scheduling.workload import make_requests

if TYPE_CHECKING:
    from .minimize import Target


class Candidates:
    """The passes over ``self.sc``; ``attempt(what, candidate)`` says whether a candidate was kept."""

    sc: Scenario
    target: "Target"

    def attempt(self, what: str, cand: Scenario) -> bool:
        raise NotImplementedError

    # edits of the parts, each a validated-object replace
    def with_workload(self, **kw) -> Scenario:
        return replace(self.sc, workload=replace(self.sc.workload, **kw))

    def with_engine(self, **kw) -> Scenario:
        return replace(self.sc, engine=replace(self.sc.engine, **kw))

    def with_spec(self, **kw) -> Scenario:
        return self.with_engine(speculative=replace(self.sc.engine.speculative, **kw))

    def with_pool(self, **kw) -> Scenario:
        return replace(self.sc, pool=replace(self.sc.pool, **kw))

    def with_model(self, **kw) -> Scenario:
        return replace(self.sc, model=replace(self.sc.model, **kw))

    def with_requests(self, specs: Sequence) -> Scenario:
        return self.with_workload(explicit=tuple(specs), requests=len(specs))

    # ------------------------------------------------------------------ passes

    def pass_backend(self) -> None:
        self.attempt(f"backends -> {self.target.backend}", replace(self.sc, backends=(self.target.backend,)))

    def pass_explicit_requests(self) -> None:
        w = self.sc.workload
        if w.explicit:
            return
        specs = make_requests(w, np.random.default_rng(self.sc.seed))
        from simulator.scenario import WorkloadConfig

        cand = replace(self.sc, workload=WorkloadConfig(requests=len(specs), explicit=tuple(specs)))
        if not self.attempt(f"workload -> {len(specs)} explicit requests", cand):
            # the generated workload stays: fewer of them, then
            n = w.requests
            while n > 1:
                if not self.attempt(f"requests {n} -> {n // 2}", self.with_workload(requests=n // 2)):
                    break
                n //= 2

    def pass_requests(self) -> None:
        reqs = list(self.sc.workload.explicit)
        if not reqs:
            return
        shrink_list(reqs, lambda items: self.attempt(f"requests {len(reqs)} -> {len(items)}",
                                                      self.with_requests(items)),
                     lambda items: len(items) >= 1)

    def pass_layers(self) -> None:
        """Drop layers: the target's (at least one of the failing kind stays), then the draft's."""
        kinds = list(self.sc.model.layer_kinds)
        keep = None if self.target.draft else self.target.kind

        def ok(items: list) -> bool:
            return self.attempt(f"model.layers {format_pattern(kinds)} -> {format_pattern(items)}",
                                self.with_model(layer_kinds=tuple(items)))

        shrink_list(kinds, ok, lambda items: keep is None or keep in items)
        spec = self.sc.engine.speculative
        if spec.enabled and self.target.draft is not False:
            dkinds = list(spec.draft_layers)
            dkeep = self.target.kind if self.target.draft else None

            def ok_draft(items: list) -> bool:
                return self.attempt(f"engine.speculative.draft_layers {format_pattern(dkinds)} -> "
                                    f"{format_pattern(items)}", self.with_spec(draft_layers=tuple(items)))

            shrink_list(dkinds, ok_draft, lambda items: dkeep is None or dkeep in items)

    def pass_scale(self) -> None:
        """Halve the pools and every prompt together: bugs about index ranges need both to shrink at once."""
        while True:
            sc = self.sc
            page = sc.pool.page_size
            reqs = sc.workload.explicit
            half = sc.pool.full_size // 2
            half -= half % page
            if not reqs or half < 2 * page:
                return
            spec = sc.engine.speculative
            cand = self.with_pool(full_size=half)
            if spec.draft_full_size is not None:
                d = spec.draft_full_size // 2
                d = max(2 * page, d - d % page)
                cand = replace(cand, engine=replace(cand.engine, speculative=replace(spec, draft_full_size=d)))
            cand = replace(cand, workload=replace(cand.workload, explicit=tuple(
                replace(r, prompt_len=max(1, r.prompt_len // 2)) for r in reqs)))
            if not self.attempt(f"pool.full_size and every prompt_len halved (full_size {half})", cand):
                return

    def pass_lengths(self) -> None:
        if not self.sc.workload.explicit:
            return
        for i in range(len(self.sc.workload.explicit)):
            for field, floor in (("output_len", 0), ("prompt_len", 1)):
                while True:
                    cur = getattr(self.sc.workload.explicit[i], field)
                    if cur <= floor:
                        break
                    shrunk = False
                    for new in dict.fromkeys((floor, max(floor, cur // 2), cur - cur // 4, cur - cur // 8)):
                        if new >= cur:
                            continue
                        if self.attempt(f"request {i} {field} {cur} -> {new}", self._set_request(i, **{field: new})):
                            shrunk = True
                            break
                    if not shrunk:
                        break
            if self.sc.workload.explicit[i].arrival_step:
                self.attempt(f"request {i} arrives at step 0", self._set_request(i, arrival_step=0))

    def _set_request(self, i: int, **kw) -> Scenario:
        reqs = list(self.sc.workload.explicit)
        reqs[i] = replace(reqs[i], **kw)
        return self.with_requests(reqs)

    def pass_engine(self) -> None:
        base = EngineConfig()
        halved = ("dp_size", "max_running_requests")
        # knobs back to their defaults, one at a time (the speculative table and capture sizes stay;
        # a knob the halving below already made smaller than its default stays smaller)
        for f in fields(EngineConfig):
            if f.name in ("speculative", "cuda_graph_bs"):
                continue
            default = getattr(base, f.name)
            cur = getattr(self.sc.engine, f.name)
            if f.name in halved and cur < default:
                continue
            if cur != default:
                self.attempt(f"engine.{f.name} -> default", self.with_engine(**{f.name: default}))
        # (a smaller chunked_prefill_size would only add steps: it goes back to the default or stays)
        for key, floor in zip(halved, (1, 1)):
            self._halve(f"engine.{key}", lambda: getattr(self.sc.engine, key),
                        lambda v, key=key: self.with_engine(**{key: v}), floor)
        spec = self.sc.engine.speculative
        if spec.enabled:
            page = self.sc.pool.page_size
            self._halve("engine.speculative.num_draft_tokens", lambda: self.sc.engine.speculative.num_draft_tokens,
                        lambda v: self.with_spec(num_draft_tokens=v), 2)
            self._halve("engine.speculative.draft_full_size", lambda: self.sc.engine.speculative.draft_full_size,
                        lambda v: self.with_spec(draft_full_size=v), 2 * page, multiple=page)
            default_rate = SpeculativeConfig().accept_rate
            if self.sc.engine.speculative.accept_rate != default_rate:
                self.attempt("engine.speculative.accept_rate -> default", self.with_spec(accept_rate=default_rate))
        # fewer decode capture sizes
        eng = self.sc.engine
        if eng.cuda_graph:
            sizes = list(eng.cuda_graph_bs)

            def ok(items: list) -> bool:
                return self.attempt(f"engine.cuda_graph_bs {_sizes(sizes)} -> {_sizes(items)}",
                                    self.with_engine(cuda_graph_bs=tuple(items)))

            if len(sizes) > 1 or tuple(sizes) != _default_bs(eng.speculative):
                shrink_list(sizes, ok, lambda items: len(items) >= 1)

    def pass_pool(self) -> None:
        page = self.sc.pool.page_size
        if page > 1 and self.attempt(f"pool.page_size {page} -> 1", self.with_pool(page_size=1)):
            page = 1
        self._halve("pool.full_size", lambda: self.sc.pool.full_size, lambda v: self.with_pool(full_size=v),
                    2 * page, multiple=page)

    def pass_model(self) -> None:
        w = self.sc.model.window
        while w > 1:
            if not self.attempt(f"model.window {w} -> {w // 2}", self.with_model(window=w // 2)):
                break
            w //= 2

    def pass_last(self) -> None:
        """Once the rounds are done: the capture sizes back to the default when the finding does not need a
        shorter list, and no step limit."""
        eng = self.sc.engine
        default_bs = _default_bs(eng.speculative)
        if eng.cuda_graph_bs != default_bs:
            self.attempt("engine.cuda_graph_bs -> default", self.with_engine(cuda_graph_bs=default_bs))
        if self.sc.max_steps is not None:
            self.attempt(f"max_steps {self.sc.max_steps} -> none", replace(self.sc, max_steps=None))

    # ------------------------------------------------------------------ helpers

    def _halve(self, where: str, get: Callable[[], Optional[int]], make: Callable[[int], Scenario], floor: int,
               multiple: int = 1) -> None:
        while True:
            cur = get()
            if cur is None or cur <= floor:
                return
            new = max(floor, cur // 2)
            new -= new % multiple
            if new >= cur or new < floor:
                return
            if not self.attempt(f"{where} {cur} -> {new}", make(new)):
                return

def _default_bs(spec: SpeculativeConfig) -> tuple[int, ...]:
    return (speculative_decode_capture_sizes if spec.enabled else default_decode_capture_sizes)()


def shrink_list(items: list, ok: Callable[[list], bool], valid: Callable[[list], bool]) -> list:
    """Greedy delta debugging: drop chunks (halves, quarters, ... single items) while ``ok`` holds."""
    items = list(items)
    n = 2
    while items:
        chunk = max(1, -(-len(items) // n))
        for start in range(0, len(items), chunk):
            cand = items[:start] + items[start + chunk:]
            if cand and valid(cand) and ok(cand):
                items = cand
                n = max(n - 1, 2)
                break
        else:
            if chunk == 1:
                break
            n = min(n * 2, len(items))
    return items


def _sizes(sizes: list) -> str:
    return str(sizes) if len(sizes) <= 6 else f"[{sizes[0]}, {sizes[1]}, ... {sizes[-1]}] ({len(sizes)})"
