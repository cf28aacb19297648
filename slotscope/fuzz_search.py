"""The search loop of ``slotscope fuzz``: draw, run, keep what reached something new, until a failure.

Small first, growing: the size level grows with the number of scenarios drawn. Half the draws mutate an
interesting scenario (recent ones preferred), the others are fresh. Each valid draw runs in-process on the
CPU without outputs and stops at its first finding; a draw the validator, the scheduler or the resource check
refuses is counted as rejected. Everything depends only on the seed and the runs' deterministic results.
"""
from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from engine_path.releases import EngineSpec
from simulator.scenario import MAX_SEED, Scenario, ScenarioError

from .fuzz_coverage import features
from .fuzz_space import Generator, draw_scenario, fix_up
from .minimize import stalled
from .rundir import UsageError

MAX_LEVEL = 6


class _Found(Exception):
    def __init__(self, finding):
        self.finding = finding


class _StopAtFirst:
    """A run observer that ends the run at its first finding (the fuzzer needs one)."""

    def on_run_start(self, run) -> None: pass
    def on_step(self, step) -> None: pass
    def on_boundary(self, *args) -> None: pass
    def on_run_end(self) -> None: pass

    def on_findings(self, findings) -> None:
        if findings:
            raise _Found(findings[0])


@dataclass
class Outcome:
    status: str                                   # "clean" | "found" | "rejected"
    finding: Any = None
    steps: list = field(default_factory=list)
    radix: Optional[dict] = None


def run_one(sc: Scenario, engine: Optional[EngineSpec]) -> Outcome:
    """One scenario in-process on the CPU, no outputs; stopped at the first finding."""
    from .pipeline import RunOptions, run_scenario

    opts = RunOptions(device="cpu", trace_level="off", report=False, engine=engine, quiet_engine=True,
                      extra_observers=(_StopAtFirst(),))
    try:
        out = run_scenario(sc, None, opts)
    except _Found as f:
        return Outcome("found", f.finding)
    except (ScenarioError, UsageError):
        return Outcome("rejected")
    except RuntimeError as e:
        if stalled(e):     # pools too small for any request (a dummy request's page): a draw that cannot run
            return Outcome("rejected")
        raise
    return Outcome("clean", None, out.result.steps, out.result.radix)


@dataclass
class FuzzResult:
    status: str                                   # "clean" | "found" | "internal"
    tried: int
    rejected: int
    elapsed_s: float
    coverage: int
    hashes: list[str]
    scenario: Optional[Scenario] = None           # the failing one, as drawn
    finding: Any = None
    error: Optional[str] = None
    shared: int = 0                               # --against: failures the reference design showed too


class Fuzzer:
    def __init__(self, design: str, seed: int, engine: Optional[EngineSpec] = None,
                 log: Callable[[str], None] = lambda s: None, progress_s: float = 5.0, against: Optional[str] = None):
        self.design, self.seed, self.engine, self.log, self.progress_s = design, seed, engine, log, progress_s
        self.against = against              # a reference design: a failure counts only where it is clean
        self.shared = 0                     # failures the reference design shows too (not the design's own)
        self.gen = Generator(seed)
        self.seen: set[tuple] = set()
        self.interesting: list[dict] = []
        self.tried = self.rejected = 0
        self.hashes: list[str] = []

    def level(self) -> int:
        """1 for the first 8 draws, then one more each time the count doubles, up to MAX_LEVEL."""
        return min(MAX_LEVEL, 1 + (self.tried + self.rejected + 8).bit_length() - 4)

    def next_data(self) -> dict:
        i, level = self.tried + self.rejected, self.level()
        if self.interesting and self.gen.chance(0.5):
            # prefer recent finds (they reached the newest combinations)
            k = len(self.interesting) - 1 - min(int(self.gen.rng.expovariate(0.3)), len(self.interesting) - 1)
            return fix_up(self.gen.mutate(self.interesting[k], level, i), level)
        return fix_up(self.gen.fresh(level, i), level)

    def run(self, budget_s: float, max_scenarios: Optional[int] = None) -> FuzzResult:
        t0 = last = time.perf_counter()
        while time.perf_counter() - t0 < budget_s and (max_scenarios is None or self.tried < max_scenarios):
            data = self.next_data()
            sc = draw_scenario(data, self.design)
            if sc is None:
                self.rejected += 1
                continue
            try:
                out = run_one(sc, self.engine)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:     # slotscope itself failed on a valid scenario
                err = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                return self._result("internal", t0, sc, error=err)
            if out.status == "rejected":
                self.rejected += 1
                continue
            self.tried += 1
            self.hashes.append(sc.hash)
            if out.status == "found" and not self.shared_failure(sc):
                return self._result("found", t0, sc, out.finding)
            new = features(sc, out.steps, out.radix) - self.seen
            if new:
                self.seen |= new
                self.interesting.append(data)
            if time.perf_counter() - last >= self.progress_s:
                last = time.perf_counter()
                self.log(self.progress_line(last - t0))
        return self._result("clean", t0)

    def shared_failure(self, sc: Scenario) -> bool:
        """With --against: whether the reference design fails the same scenario (then it is not this design's)."""
        if self.against is None:
            return False
        if run_one(replace(sc, design=self.against), None).status != "found":
            return False
        self.shared += 1
        return True

    def progress_line(self, elapsed: float) -> str:
        paths = sorted({f"{f[1]}/{f[2]}" for f in self.seen if f[0] == "path"})
        return (f"fuzz: {self.tried} scenarios in {elapsed:.0f}s ({self.tried / max(elapsed, 1e-9):.2f}/s), "
                f"{self.rejected} rejected, " + (f"{self.shared} failing under {self.against} too, " if self.against else "")
                + f"level {self.level()}, coverage {len(self.seen)} combinations; "
                f"mode/graph: {', '.join(paths)}")

    def _result(self, status: str, t0: float, sc: Optional[Scenario] = None, finding=None,
                error: Optional[str] = None) -> FuzzResult:
        return FuzzResult(status, self.tried, self.rejected, time.perf_counter() - t0, len(self.seen),
                          list(self.hashes), sc, finding, error, self.shared)


def check_search(seed: Any, budget_s: Any) -> None:
    """The search's seed and budget as ``slotscope fuzz`` takes them; a ValueError names the option."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"--seed must be an integer in [0, 2^63), got {seed!r}")
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not math.isfinite(budget_s) \
            or budget_s <= 0:
        raise ValueError(f"--budget must be a finite number of seconds > 0, got {budget_s!r}")


def fuzz(design: str, *, seed: int = 0, budget_s: float = 600.0, engine: Optional[EngineSpec] = None,
         max_scenarios: Optional[int] = None, log: Callable[[str], None] = lambda s: None,
         progress_s: float = 5.0, against: Optional[str] = None) -> FuzzResult:
    """Search until the first failing scenario or the end of the budget (no outputs written)."""
    import torch

    from simulator.designs.loading import load_design

    check_search(seed, budget_s)
    torch.set_num_threads(1)
    load_design(design)                  # a bad --design is bad input before anything runs
    if against is not None:
        load_design(against)
    return Fuzzer(design, seed, engine, log, progress_s, against).run(budget_s, max_scenarios)
