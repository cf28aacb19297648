"""One draw of a fuzz search, run: in-process on the CPU, no outputs, stopped at its first finding.

Shared by the search (fuzz_search.py) and the worker that runs the release as released (fuzz_release_ref.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from engine_path.errors import AdapterLacks, ReleaseBroke, ReleaseLacks, SchedulerStalled
from engine_path.releases import EngineSpec
from simulator.scenario import Scenario, ScenarioError

from .minimize import stalled
from .rundir import UsageError


class FirstFinding(Exception):
    """Raised by :class:`StopAtFirst`: the run's first finding (``finding``)."""

    def __init__(self, finding):
        super().__init__(finding)
        self.finding = finding


class StopAtFirst:
    """A run observer that ends the run at its first finding (the fuzzer needs one; so do tests)."""

    def on_run_start(self, run) -> None: pass
    def on_step(self, step) -> None: pass
    def on_boundary(self, *args) -> None: pass
    def on_run_end(self) -> None: pass

    def on_findings(self, findings) -> None:
        if findings:
            raise FirstFinding(findings[0])


@dataclass
class Outcome:
    status: str                                   # "clean" | "found" | "raised" | "rejected"
    finding: Any = None
    steps: list = field(default_factory=list)
    radix: Optional[dict] = None
    error: Optional[str] = None                   # "raised": the release's own exception, where (ReleaseBroke)


def run_one(sc: Scenario, engine: Optional[EngineSpec]) -> Outcome:
    """One scenario in-process on the CPU, no outputs; stopped at the first finding, or at an exception the release's
    own code raised ("raised": a release's crash is its failure, not slotscope's)."""
    from .pipeline import RunOptions, run_scenario

    opts = RunOptions(device="cpu", trace_level="off", report=False, engine=engine, quiet_engine=True,
                      extra_observers=(StopAtFirst(),))
    try:
        out = run_scenario(sc, None, opts)
    except FirstFinding as f:
        return Outcome("found", f.finding)
    except ReleaseBroke as e:       # the release raised inside its own code (a crash a server would have)
        return Outcome("raised", error=str(e))
    except (ScenarioError, UsageError, ReleaseLacks, AdapterLacks, SchedulerStalled):
        return Outcome("rejected")      # a draw the release, slotscope's adapter of it or its pools cannot run
    except RuntimeError as e:
        if stalled(e):     # pools too small for any request (a dummy request's page): a draw that cannot run
            return Outcome("rejected")
        raise
    return Outcome("clean", None, out.result.steps, out.result.radix)
