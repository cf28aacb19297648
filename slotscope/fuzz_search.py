"""The search loop of ``slotscope fuzz``: draw, run, keep what reached something new, until a failure.

Small first, growing: the size level grows with the number of scenarios drawn. Half the draws mutate an
interesting scenario (recent ones preferred), the others are fresh. Each valid draw runs in-process on the
CPU without outputs and stops at its first finding; a draw the validator, the scheduler or the resource check
refuses is counted as rejected. Everything depends only on the seed and the runs' deterministic results.

A failure counts only where the reference runs the same scenario clean: by default the design's own release
(:func:`own_release_design`), so a failure the release shares (W7 on ROCm, R8 with a cache linker) does not end
the search; a release patched with --engine-patch is searched against the release as released
(fuzz_release_ref.py). A draw the release or slotscope's adapter of it cannot run is rejected, as one the
validator refuses (fuzz_run.py). An exception inside slotscope on a valid draw (not a finding) is slotscope's own bug: it is
recorded (:class:`InternalFailure`) and the search goes on.
"""
from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from engine_path.releases import EngineSpec
from simulator.designs.base import Design
from simulator.designs.catalogue import CATALOGUE
from simulator.designs.loading import load_design
from simulator.engine_model.release import MID_2026_RELEASE, SGLANG_0_5_23_RELEASE
from simulator.scenario import MAX_SEED, Scenario

from .fuzz_coverage import features
from .fuzz_run import FirstFinding, Outcome, StopAtFirst, run_one  # noqa: F401 (the search's names)
from .fuzz_space import Generator, draw_scenario, fix_up, for_engine

MAX_LEVEL = 6

#: ``against``: the design's own release (the default), or no reference design
OWN_RELEASE, NO_REFERENCE = "release", "none"
#: the releases modelled as a whole (simulator/engine_model/release.py)
RELEASES = (MID_2026_RELEASE, SGLANG_0_5_23_RELEASE)
#: the hooks through which a design changes the write path (a release's own design overrides none)
HOOKS = ("translate", "fill_graph_loc_buffer", "fill_graph_swa_buffer", "read_ids", "make_write_loc",
         "size_draft_pools", "backend_spec")


# --------------------------------------------------------------------------- the reference design


def _is_release_design(cls: type[Design], rel) -> bool:
    """Whether a built-in design is the release ``rel`` as a whole: it declares that release in its own class
    and changes nothing else (no hook of the base design overridden, the base padding)."""
    if vars(cls).get("release") != rel or cls.padding != Design.padding:
        return False
    return not any(h in vars(k) for k in cls.__mro__ if issubclass(k, Design) and k is not Design for h in HOOKS)


def release_designs() -> list[tuple[Any, type[Design]]]:
    """(release, its design) for each modelled release, in RELEASES order: mid-2026's ``sglang-post-33587``
    (the base design), 0.5.23's ``sglang-0.5.23``."""
    out = []
    for rel in RELEASES:
        cls = next((c for c in CATALOGUE if _is_release_design(c, rel)), None)
        if cls is not None:
            out.append((rel, cls))
    return out


def own_release_design(design: str) -> Optional[str]:
    """The design's own release, as the name of the design that is that release: the first modelled release its
    class declares or inherits (a design that declares a variant of one, with another WAR barrier, other cache
    free paths or another unified pool, inherits the release it varies). None for a design that is the release
    itself (nothing to compare against) or whose classes declare no modelled release."""
    cls = type(load_design(design))
    table = release_designs()
    for k in cls.__mro__:
        rel = vars(k).get("release")
        match = next((rd for r, rd in table if rel is not None and rel == r), None)
        if match is not None:
            return None if match is cls else match.name
    return None


def resolve_against(design: str, against: Optional[str], engine: Optional[EngineSpec]) -> Optional[str]:
    """``against`` as a design name, or None for no reference design: ``"release"`` the design's own release (none
    with an engine: the scenarios then run the release's own code; a patched one has the release as released,
    :func:`reference`), ``"none"`` or None none, else the design named."""
    if against is None or against == NO_REFERENCE:
        return None
    if against == OWN_RELEASE:
        return None if engine is not None else own_release_design(design)
    load_design(against)                 # a bad --against is bad input before anything runs
    return against


class DesignReference:
    """A reference design, run in-process as the model (:func:`run_one` without an engine)."""

    def __init__(self, design: str):
        self.name = design

    def scenario(self, sc: Scenario) -> Scenario:
        """The draw as the reference runs it (recorded as such if slotscope fails on it)."""
        return replace(sc, design=self.name)

    def run(self, sc: Scenario) -> Outcome:
        return run_one(sc, None)

    def close(self) -> None:
        pass


def reference(design: str, against: Optional[str], engine: Optional[EngineSpec], patched: bool = False):
    """What a failure is counted against (None: nothing). As :func:`resolve_against`, but ``"release"`` with an
    engine the --engine-patch files patch (``patched``) is that release as released, in a worker process of its
    own (slotscope/fuzz_release_ref.py), so the release's own bugs do not end a search for a patch's."""
    if against == OWN_RELEASE and engine is not None and patched:
        from .fuzz_release_ref import ReleaseReference

        return ReleaseReference(engine)
    name = resolve_against(design, against, engine)
    return None if name is None else DesignReference(name)


# --------------------------------------------------------------------------- the search


#: a run's outcomes that are a failure of what ran: a finding, or the release raising inside its own code
FAILED = ("found", "raised")


@dataclass
class InternalFailure:
    """slotscope's own bug: an exception inside slotscope (not a finding) on a valid draw."""

    scenario: Scenario                            # the draw, under the design that was run
    error: str                                    # the traceback
    during: str = "run"                           # "run": the design's run; "against": the reference's


@dataclass
class FuzzResult:
    status: str                                   # "clean" | "found"
    tried: int
    rejected: int
    elapsed_s: float
    coverage: int
    hashes: list[str]
    scenario: Optional[Scenario] = None           # the failing one, as drawn
    finding: Any = None
    error: Optional[str] = None                   # the release raised inside its own code (no finding): where
    shared: int = 0                               # failures the reference design showed too
    against: Optional[str] = None                 # the reference's name, if any
    internal: list = field(default_factory=list)  # an InternalFailure per draw slotscope failed on
    against_on_found: Optional[str] = None        # the reference's outcome on the failing draw


class Fuzzer:
    def __init__(self, design: str, seed: int, engine: Optional[EngineSpec] = None,
                 log: Callable[[str], None] = lambda s: None, progress_s: float = 5.0, against=None):
        self.design, self.seed, self.engine, self.log, self.progress_s = design, seed, engine, log, progress_s
        self.reference = against            # a failure counts only where it runs clean (None: no reference)
        self.against = None if against is None else against.name
        self.shared = 0                     # failures the reference shows too (not the design's own)
        self.against_on_found: Optional[str] = None
        self.gen = Generator(seed)
        self.seen: set[tuple] = set()
        self.interesting: list[dict] = []
        self.tried = self.rejected = 0
        self.hashes: list[str] = []
        self.internal: list[InternalFailure] = []

    def level(self) -> int:
        """1 for the first 8 draws, then one more each time the count doubles, up to MAX_LEVEL."""
        return min(MAX_LEVEL, 1 + (self.tried + self.rejected + 8).bit_length() - 4)

    def next_data(self) -> dict:
        i, level = self.tried + self.rejected, self.level()
        if self.interesting and self.gen.chance(0.5):
            # prefer recent finds (they reached the newest combinations)
            k = len(self.interesting) - 1 - min(int(self.gen.rng.expovariate(0.3)), len(self.interesting) - 1)
            data = fix_up(self.gen.mutate(self.interesting[k], level, i), level)
        else:
            data = fix_up(self.gen.fresh(level, i), level)
        return data if self.engine is None else for_engine(data, self.engine.name)

    def run(self, budget_s: float, max_scenarios: Optional[int] = None) -> FuzzResult:
        t0 = last = time.perf_counter()
        while time.perf_counter() - t0 < budget_s and (max_scenarios is None or self.tried < max_scenarios):
            data = self.next_data()
            sc = draw_scenario(data, self.design)
            if sc is None:
                self.rejected += 1
                continue
            out = self.guarded(sc, lambda x: run_one(x, self.engine), "run")
            if out is not None and out.status == "rejected":
                self.rejected += 1
                continue
            self.tried += 1
            self.hashes.append(sc.hash)
            if out is None:                  # slotscope failed on it: recorded, the search goes on
                continue
            if out.status in FAILED and not self.shared_failure(sc):
                return self._result("found", t0, sc, out.finding, out.error)
            new = features(sc, out.steps, out.radix) - self.seen
            if new:
                self.seen |= new
                self.interesting.append(data)
            if time.perf_counter() - last >= self.progress_s:
                last = time.perf_counter()
                self.log(self.progress_line(last - t0))
        return self._result("clean", t0)

    def guarded(self, sc: Scenario, run: Callable[[Scenario], Outcome], during: str) -> Optional[Outcome]:
        """One run; None when slotscope itself raised (recorded as an internal failure). ^C and exits pass."""
        try:
            return run(sc)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:         # slotscope itself failed on a valid scenario
            err = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            self.internal.append(InternalFailure(sc, err, during))
            self.log(f"fuzz: internal error of slotscope on {sc.name} ({during}, design {sc.design}): "
                     f"{type(exc).__name__}: {str(exc)[:200]}; recorded, the search goes on")
            return None

    def shared_failure(self, sc: Scenario) -> bool:
        """With a reference: whether it fails the same scenario too (then the failure is not this design's). A
        reference run slotscope fails on is recorded; the design's failure then counts as its own."""
        if self.reference is None:
            return False
        out = self.guarded(self.reference.scenario(sc), self.reference.run, "against")
        if out is None or out.status not in FAILED:
            self.against_on_found = "internal error" if out is None else out.status
            return False
        self.shared += 1
        return True

    def progress_line(self, elapsed: float) -> str:
        paths = sorted({f"{f[1]}/{f[2]}" for f in self.seen if f[0] == "path"})
        return (f"fuzz: {self.tried} scenarios in {elapsed:.0f}s ({self.tried / max(elapsed, 1e-9):.2f}/s), "
                f"{self.rejected} rejected, " + (f"{self.shared} failing under {self.against} too, " if self.against else "")
                + (f"{len(self.internal)} internal errors, " if self.internal else "")
                + f"level {self.level()}, coverage {len(self.seen)} combinations; "
                f"mode/graph: {', '.join(paths)}")

    def _result(self, status: str, t0: float, sc: Optional[Scenario] = None, finding=None,
                error: Optional[str] = None) -> FuzzResult:
        return FuzzResult(status, self.tried, self.rejected, time.perf_counter() - t0, len(self.seen),
                          list(self.hashes), sc, finding, error, self.shared, self.against, list(self.internal),
                          self.against_on_found if status == "found" else None)


def check_search(seed: Any, budget_s: Any) -> None:
    """The search's seed and budget as ``slotscope fuzz`` takes them; a ValueError names the option."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"--seed must be an integer in [0, 2^63), got {seed!r}")
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not math.isfinite(budget_s) \
            or budget_s <= 0:
        raise ValueError(f"--budget must be a finite number of seconds > 0, got {budget_s!r}")


def fuzz(design: str, *, seed: int = 0, budget_s: float = 600.0, engine: Optional[EngineSpec] = None,
         max_scenarios: Optional[int] = None, log: Callable[[str], None] = lambda s: None,
         progress_s: float = 5.0, against: Optional[str] = OWN_RELEASE) -> FuzzResult:
    """Search until the first failing scenario or the end of the budget (no outputs written). ``against``: the
    reference, by default the design's own release (:func:`reference`: a patched engine's is the release as
    released; None or "none": no reference)."""
    import torch

    from engine_path.patches import env_paths

    check_search(seed, budget_s)
    torch.set_num_threads(1)
    load_design(design)                  # a bad --design is bad input before anything runs
    ref = reference(design, against, engine, patched=bool(env_paths()))
    try:
        return Fuzzer(design, seed, engine, log, progress_s, ref).run(budget_s, max_scenarios)
    finally:
        if ref is not None:
            ref.close()
