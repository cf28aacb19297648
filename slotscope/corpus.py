"""The known-bug corpus: ``slotscope bugs``.

Every case of ``scenarios/corpus.toml`` (one data structure: bug id, issue, title, scenario file,
overrides, the design that had the bug, the design that fixed it, the outcome expected per backend)
runs twice, buggy and fixed, on all eight backends, through the same in-process pipeline as
``slotscope run``. A verdict holds when every backend shows what the case expects: the expected
finding class (and nothing but the classes the case allows beside it), or no finding at all.
Exit codes: 0 every verdict holds, 1 some does not, 2 bad input.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from simulator.designs.catalogue import BUILTIN_DESIGNS
from simulator.records import FINDING_CLASSES
from simulator.scenario import BACKENDS, Scenario, ScenarioError, load_scenario, parse_scenario, tomllib
from simulator.scenario.toml_write import dumps

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "scenarios" / "corpus.toml"
#: the vLLM cases (V1, V2, ...): release code only, ``slotscope bugs --engine vllm``
CORPUS_VLLM = ROOT / "scenarios" / "corpus-vllm.toml"
CLEAN = "clean"
ROLES = ("buggy", "fixed")
SHORT = {"missed": "missed", "clobbered": "clobber", "padding_slot": "pad_slot", "evicted_slot": "evicted",
         "torn_write": "torn", "stale_read": "stale_rd", "out_of_range": "oor", "length_mismatch": "len_mism",
         "design_error": "des_err", CLEAN: "clean"}
EXIT_HOLDS, EXIT_FAILS, EXIT_BAD_INPUT = 0, 1, 2


@dataclass(frozen=True)
class Case:
    id: str
    issue: str
    title: str
    scenario: Path
    buggy: str
    fixed: str
    expect: dict[str, str]                    # backend or "*" -> class | "clean", for the buggy design
    expect_fixed: dict[str, str]
    also: tuple[str, ...] = ()
    overrides: dict[str, Any] = field(default_factory=dict)
    #: how the case runs as release code (``slotscope bugs --engine``; slotscope/corpus_engine.py): a table, a
    #: "model-only: why" string, or None (not said yet)
    engine: Any = None

    @property
    def engine_only(self) -> bool:
        """A case with no model design (a vLLM case: slotscope has no model of vLLM yet): it runs as release code
        only, with ``slotscope bugs --engine``."""
        return not self.buggy

    def design(self, role: str) -> str:
        return self.buggy if role == "buggy" else self.fixed

    def expected(self, role: str, backend: str) -> str:
        table = self.expect if role == "buggy" else self.expect_fixed
        return table.get(backend, table.get("*", CLEAN))

    def load(self) -> Scenario:
        """The case's scenario with its overrides applied (through the TOML writer, so they are validated)."""
        if not self.overrides:
            return load_scenario(self.scenario)
        data = tomllib.loads(self.scenario.read_text())
        for dotted, value in self.overrides.items():
            *parents, leaf = dotted.split(".")
            table = data
            for p in parents:
                table = table.setdefault(p, {})
            table[leaf] = value
        suffix = ",".join(f"{k}={v}" for k, v in self.overrides.items())
        data["name"] = f"{data.get('name', self.scenario.stem)}[{suffix}]"
        return parse_scenario(dumps(data), f"{self.scenario} (corpus case {self.id}: set {suffix})")


# ---------------------------------------------------------------------------------------- loading

def _fail(source: str, where: str, msg: str) -> ScenarioError:
    return ScenarioError(f"{source}: {where}: {msg}")


def expect_table(raw: Any, source: str, where: str) -> dict[str, str]:
    allowed = (*FINDING_CLASSES, CLEAN)
    table = {"*": raw} if isinstance(raw, str) else raw
    if not isinstance(table, dict):
        raise _fail(source, where, f"must be a finding class, \"clean\", or a table backend -> class, got {raw!r}")
    for backend, cls in table.items():
        if backend != "*" and backend not in BACKENDS:
            raise _fail(source, f"{where}.{backend}", f"not a backend (allowed: {', '.join(BACKENDS)}, or \"*\")")
        if cls not in allowed:
            raise _fail(source, f"{where}.{backend}", f"{cls!r} is not a class (allowed: {', '.join(allowed)})")
    return dict(table)


def load_corpus(path: str | Path = CORPUS) -> list[Case]:
    """The corpus's cases, validated: every error names the file and the case field."""
    path = Path(path)
    source = str(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise ScenarioError(f"{source}: cannot read the corpus: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{source}: not valid TOML: {e}") from None
    raw_cases = data.get("case")
    if not isinstance(raw_cases, list) or not raw_cases:
        raise _fail(source, "case", "the corpus needs at least one [[case]] table")
    known = {"id", "issue", "title", "scenario", "buggy", "fixed", "expect", "expect_fixed", "also", "set", "engine"}
    cases, seen = [], set()
    for i, c in enumerate(raw_cases):
        where = f"case[{i}]"
        if not isinstance(c, dict):
            raise _fail(source, where, "must be a table")
        unknown = sorted(set(c) - known)
        if unknown:
            raise _fail(source, f"{where}.{unknown[0]}", f"unknown key (known: {', '.join(sorted(known))})")
        # a case with an engine table and no designs runs as release code only (a vLLM case)
        engine_only = isinstance(c.get("engine"), dict) and "buggy" not in c and "fixed" not in c
        for key in ("id", "title", "scenario", "expect") + (() if engine_only else ("buggy", "fixed")):
            if key not in c:
                raise _fail(source, f"{where}.{key}", "is required")
        for key in ("id", "issue", "title", "scenario", "buggy", "fixed"):
            if key in c and not isinstance(c[key], str):
                raise _fail(source, f"{where}.{key}", f"must be a string, got {c[key]!r}")
        where = f"case[{i}] ({c['id']})"
        if c["id"] in seen:
            raise _fail(source, f"{where}.id", "names a case twice")
        seen.add(c["id"])
        for role in () if engine_only else ROLES:
            if c[role] not in BUILTIN_DESIGNS:
                raise _fail(source, f"{where}.{role}", f"{c[role]!r} is not a built-in design "
                                                       f"(known: {', '.join(sorted(BUILTIN_DESIGNS))})")
        scenario = (path.parent / c["scenario"]).resolve()
        if not scenario.is_file():
            raise _fail(source, f"{where}.scenario", f"{c['scenario']} does not exist next to the corpus")
        also = c.get("also", [])
        if not isinstance(also, list) or any(a not in FINDING_CLASSES for a in also):
            raise _fail(source, f"{where}.also", f"must list finding classes (allowed: {', '.join(FINDING_CLASSES)})")
        overrides = c.get("set", {})
        if not isinstance(overrides, dict):
            raise _fail(source, f"{where}.set", "must be a table of dotted field -> value")
        cases.append(Case(
            id=c["id"], issue=c.get("issue", ""), title=c["title"], scenario=scenario, buggy=c.get("buggy", ""),
            fixed=c.get("fixed", ""), expect=expect_table(c["expect"], source, f"{where}.expect"),
            expect_fixed=expect_table(c.get("expect_fixed", CLEAN), source, f"{where}.expect_fixed"),
            also=tuple(also), overrides=dict(overrides), engine=c.get("engine")))
    return cases


# ---------------------------------------------------------------------------------------- running

@dataclass
class Outcome:
    """One case under one of its designs: expected and observed per backend, and the verdicts."""

    case: Case
    role: str
    design: str
    scenario: Scenario
    summary: dict[str, Any]
    messages: dict[str, str]                 # backend -> message of its first finding
    wall_s: float
    out_dir: Optional[Path] = None

    def expected(self, backend: str) -> str:
        return self.case.expected(self.role, backend)

    def counts(self, backend: str) -> dict[str, int]:
        return {c: n for c, n in self.summary["backends"][backend]["findings"].items() if n}

    def holds_on(self, backend: str) -> bool:
        counts = self.counts(backend)
        want = self.expected(backend)
        if want == CLEAN:
            return not counts
        return counts.get(want, 0) > 0 and set(counts) <= {want, *self.case.also}

    @property
    def backends(self) -> list[str]:
        return list(self.summary["backends"])

    @property
    def holds(self) -> bool:
        return all(self.holds_on(b) for b in self.backends)

    def differences(self) -> dict[str, str]:
        """Per backend where the verdict fails: what the case expects there and what the run saw."""
        out = {}
        for b in self.backends:
            if self.holds_on(b):
                continue
            want = self.expected(b)
            also = f" (also allowed: {', '.join(self.case.also)})" if want != CLEAN and self.case.also else ""
            seen = ", ".join(f"{n} {c}" for c, n in self.counts(b).items()) or CLEAN
            out[b] = f"expected {want}{also}, saw {seen}"
        return out

    def observed_cell(self, backend: str) -> str:
        """The class the case looks for if present (else the most frequent), ``+k`` for k other classes."""
        counts = self.counts(backend)
        if not counts:
            return CLEAN
        want = self.expected(backend)
        main = want if want in counts else max(counts, key=lambda c: (counts[c], -FINDING_CLASSES.index(c)))
        return SHORT[main] + (f"+{len(counts) - 1}" if len(counts) > 1 else "")

    def expected_text(self) -> str:
        per = {b: self.expected(b) for b in self.backends}
        table = self.case.expect if self.role == "buggy" else self.case.expect_fixed
        values = list(per.values())
        common = table.get("*") or max(sorted(set(values)), key=values.count)
        text = SHORT[common]
        others = [f"{b} {SHORT[v]}" for b, v in per.items() if v != common]
        return text + ("; " + ", ".join(others) if others else "")


def run_case(case: Case, role: str, backends: Sequence[str] = BACKENDS, out_dir: Optional[Path] = None,
             device: str = "cpu") -> Outcome:
    from .pipeline import RunOptions, run_scenario

    scenario = case.load()
    design = case.design(role)
    t0 = time.perf_counter()
    res = run_scenario(scenario, out_dir, RunOptions(design=design, backends=tuple(backends), device=device,
                                                     trace_level="off", report=False))
    messages: dict[str, str] = {}
    for f in res.result.findings:
        first = res.result.backends[f.backend].first_finding
        if f.backend not in messages and first is not None and (f.step, f.layer, f.cls) == (
                first.step, first.layer, first.cls):
            messages[f.backend] = f.message
    return Outcome(case, role, design, scenario, res.summary, messages, time.perf_counter() - t0, out_dir)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


def run_corpus(cases: Sequence[Case], backends: Sequence[str] = BACKENDS, out_dir: Optional[Path] = None,
               progress: Optional[Callable[[Outcome], None]] = None, device: str = "cpu") -> list[Outcome]:
    outcomes = []
    for case in cases:
        for role in ROLES:
            d = None if out_dir is None else out_dir / f"{slug(case.id)}-{role}"
            o = run_case(case, role, backends, d, device)
            outcomes.append(o)
            if progress is not None:
                progress(o)
    return outcomes


def format_corpus_table(outcomes: Sequence[Outcome]) -> str:
    if not outcomes:
        return "(no cases)"
    backends = outcomes[0].backends
    head = ["bug", "issue", "design", "role", "expected", *backends, "verdict"]
    rows = []
    for o in outcomes:
        cells = [o.observed_cell(b) + ("" if o.holds_on(b) else " !") for b in backends]
        rows.append([o.case.id, o.case.issue, o.design, o.role, o.expected_text(), *cells,
                     "holds" if o.holds else "FAILS"])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- the command


