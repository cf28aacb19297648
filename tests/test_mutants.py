"""Small realistic buggy designs are caught by the shipped scenarios; the fixed design is clean there.

Each mutant of tests/mutant_designs.py is the fixed design (``kvwriteloc-strict``) with one mistake in one
hook. It runs, in-process and without report or trace, on the shipped scenario named for it, and must show a
finding of the class named for it there (the run stops at the first one); the fixed design must show none on the
same scenarios. A
mutant that no shipped scenario catches means the scenarios miss a path: improve them, don't drop the mutant.
"""
from __future__ import annotations

import pytest

from simulator.designs import Design
from simulator.scenario import BACKENDS
from slotscope.pipeline import RunOptions, run_scenario

from helpers import ROOT
from mutant_designs import CATCHER, MUTANTS, Fixed

MODULE = ROOT / "tests" / "mutant_designs.py"
HOOKS = ("translate", "fill_graph_loc_buffer", "fill_graph_swa_buffer", "make_write_loc", "size_draft_pools",
         "backend_spec")
SCENARIOS = sorted({sc for sc, _ in CATCHER.values()})


class Caught(Exception):
    """Raised by :class:`StopWhenCaught`; carries the finding of the expected class and the run's first finding."""


class StopWhenCaught:
    """A run observer that ends the run at the first finding of a class (a mutant needs one, not all).

    It keeps the run's first finding of any class too, so a mutant whose first sign is something else
    (a ``design_error``: the mistake crashed instead of writing wrong) is told apart.
    """

    def __init__(self, cls: str):
        self.cls = cls
        self.first = None

    def on_run_start(self, run) -> None:
        pass

    def on_step(self, step) -> None:
        pass

    def on_boundary(self, *args) -> None:
        pass

    def on_findings(self, findings) -> None:
        if findings and self.first is None:
            self.first = findings[0]
        hit = next((f for f in findings if f.cls == self.cls), None)
        if hit is not None:
            raise Caught(hit, self.first)

    def on_run_end(self) -> None:
        pass


def run(scenario: str, design: str, observers=()):
    return run_scenario(ROOT / "scenarios" / f"{scenario}.toml", None,
                        RunOptions(design=design, device="cpu", trace_level="off", report=False,
                                   extra_observers=tuple(observers)))


def test_the_mutant_set():
    assert len(MUTANTS) >= 15
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    by_hook = {}
    for m in MUTANTS:
        assert issubclass(m, Fixed) and issubclass(m, Design) and m is not Fixed
        assert m.__doc__ and len(m.__doc__.split()) >= 12, m.__name__     # says the mistake
        overridden = [h for h in HOOKS if h in vars(m)]
        assert len(overridden) == 1, (m.__name__, overridden)             # one hook, one mistake
        by_hook.setdefault(overridden[0], []).append(m.__name__)
        assert not (set(vars(m)) - {*HOOKS, "name", "__doc__", "__module__", "__qualname__", "__firstlineno__",
                                    "__static_attributes__"}), m.__name__
    assert set(by_hook) == set(HOOKS), by_hook                              # every hook has mutants


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_fixed_design_is_clean_where_the_mutants_run(scenario):
    res = run(scenario, f"{MODULE}:Fixed")
    assert res.result.steps and not any(s.total for s in res.result.backends.values()), {
        b: {c: n for c, n in s.findings.items() if n} for b, s in res.result.backends.items() if s.total}
    assert list(res.result.backends) == list(BACKENDS)


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.__name__)
def test_mutant_is_caught_by_a_shipped_scenario(mutant):
    """The mutant's mistake shows as the write-side class named for it (the run stops there)."""
    scenario, cls = CATCHER[mutant]
    stop = StopWhenCaught(cls)
    with pytest.raises(Caught) as caught:
        run(scenario, f"{MODULE}:{mutant.__name__}", [stop])
    finding, first = caught.value.args
    assert finding.cls == cls
    assert first.cls != "design_error", (mutant.__name__, first.to_json())
