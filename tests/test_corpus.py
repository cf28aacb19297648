"""The known-bug corpus (`slotscope bugs`): its definition, its verdict logic, and the whole corpus run."""
from __future__ import annotations

import copy
import re
from pathlib import Path

import markupsafe
import pytest

from simulator.records import FINDING_CLASSES
from simulator.scenario import BACKENDS, ScenarioError
from slotscope.cli import main
from slotscope.corpus import CORPUS, Outcome, load_corpus

from helpers import ROOT, simulate, tiny

GOOD = """
[[case]]
id = "B1"
title = "t"
scenario = "{scenario}"
buggy = "sglang-pre-29460"
fixed = "sglang-post-29460"
expect = {{ "*" = "length_mismatch", trtllm_mha = "length_mismatch" }}
{extra}
"""


def write_corpus(tmp_path, extra: str = "", scenario: str = str(ROOT / "scenarios/b1-pcg-dp-padding.toml")):
    p = tmp_path / "corpus.toml"
    p.write_text(GOOD.format(scenario=scenario, extra=extra))
    return p


def test_the_shipped_corpus_covers_every_known_bug():
    cases = load_corpus()
    ids = [c.id for c in cases]
    assert {"B1", "B2", "B3", "B4", "gap", "B2/skip-1", "B2/dummy", "B1/p16", "B2/p16"} <= set(ids)
    # issue 12's bugs, each under the state that had it (A1 and A2 on the PD decode node of May 2026)
    assert {"R2", "R3", "R7", "R8", "A1", "A2", "U1", "U2", "P7"} <= set(ids)
    assert {c.id: c.load().engine.pd_decode for c in cases if c.id in ("A1", "A2", "R8")} == {
        "A1": True, "A2": True, "R8": False}
    assert len(ids) == len(set(ids))
    paged = [c for c in cases if c.overrides.get("pool.page_size", 1) > 1]
    assert {c.id.split("/")[0] for c in paged} >= {"B1", "B2"}
    assert all(c.load().pool.page_size == 16 for c in paged)


@pytest.mark.parametrize("extra,needle", [
    ('also = ["bogus"]', "case[0] (B1).also: must list finding classes"),
    ("set = 3", "case[0] (B1).set: must be a table"),
    ("colour = 1", "case[0].colour: unknown key"),
])
def test_bad_corpus_fields_are_named(tmp_path, extra, needle):
    with pytest.raises(ScenarioError) as e:
        load_corpus(write_corpus(tmp_path, extra))
    assert needle in str(e.value) and str(tmp_path) in str(e.value)


def test_bad_expectations_designs_and_files_are_named(tmp_path):
    p = write_corpus(tmp_path)
    text = p.read_text()
    for bad, needle in [
        (text.replace('trtllm_mha = "length_mismatch"', 'trtllm = "length_mismatch"'),
         "case[0] (B1).expect.trtllm: not a backend"),
        (text.replace('"length_mismatch"', '"crash"'), "case[0] (B1).expect.*: 'crash' is not a class"),
        (text.replace('"sglang-pre-29460"', '"nope"'), "case[0] (B1).buggy: 'nope' is not a built-in design"),
        (text.replace("b1-pcg-dp-padding.toml", "missing.toml"), "case[0] (B1).scenario: "),
        (text.replace('id = "B1"\n', ""), "case[0].id: is required"),
    ]:
        p.write_text(bad)
        with pytest.raises(ScenarioError) as e:
            load_corpus(p)
        assert needle in str(e.value)


def test_verdict_logic_expected_class_also_and_clean():
    case = next(c for c in load_corpus() if c.id == "B4")
    counts = dict.fromkeys(FINDING_CLASSES, 0)
    summary = {"backends": {b: {"findings": dict(counts), "first_finding": None} for b in ("triton", "xpu")}}
    o = Outcome(case, "buggy", case.buggy, case.load(), summary, {}, 0.0)
    assert not o.holds_on("triton") and o.holds_on("xpu")          # triton must show out_of_range
    summary["backends"]["triton"]["findings"].update(out_of_range=3, clobbered=1)
    assert o.holds and o.observed_cell("triton") == "oor+1" and o.expected_text() == "clean; triton oor"
    summary["backends"]["triton"]["findings"]["length_mismatch"] = 1  # a class the case does not allow
    assert not o.holds_on("triton")
    summary2 = copy.deepcopy(summary)
    summary2["backends"]["xpu"]["findings"]["missed"] = 1
    assert not Outcome(case, "fixed", case.fixed, case.load(), summary2, {}, 0.0).holds_on("xpu")


def test_paged_run_is_clean_under_the_fixed_design():
    sc = tiny("""
    [model]
    preset = "gpt-oss-20b"
    num_layers = 6
    [pool]
    full_size = 4096
    page_size = 16
    [workload]
    requests = 10
    arrival = "poisson"
    rate = 2.0
    prompt_len = { dist = "uniform", min = 16, max = 600 }
    output_len = { dist = "uniform", min = 4, max = 200 }
    [engine]
    chunked_prefill_size = 256
    piecewise_cuda_graph = true
    """)
    r = simulate(sc, "sglang-post-29460")
    assert r.total_findings == 0
    assert max(s.swa_used for s in r.steps) < max(s.full_used for s in r.steps)   # SWA pages were evicted
    assert {s.graph for s in r.steps} >= {"piecewise", "decode_graph"}


@pytest.mark.slow
def test_slotscope_bugs_every_verdict_holds_and_writes_the_report(tmp_path, capsys):
    report = tmp_path / "corpus.html"
    assert main(["bugs", "-q", "--report", str(report)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    head = re.split(r"\s{2,}", lines[0])
    assert head[:5] == ["bug", "issue", "design", "role", "expected"] and head[-1] == "verdict"
    assert list(BACKENDS) == head[5:-1]
    rows = [re.split(r"\s{2,}", l) for l in lines[2:] if re.match(r"^(B\d|gap|W\d|R\d|A\d|U\d|P\d|F\d)", l)]
    cases = load_corpus(CORPUS)
    assert len(rows) == 2 * len(cases)
    assert all(r[-1] == "holds" for r in rows)
    by = {(r[0], r[3]): r for r in rows}
    assert by[("B1", "buggy")][5:-1] == ["len_mism"] * 8
    # the draft's reads past its undersized pools are stale_read too (the "+1")
    assert by[("B3", "buggy")][5:-1] == ["oor+1"] * 8
    assert by[("B4", "buggy")][5:-1][1].startswith("oor") and by[("B4", "buggy")][5:-1].count("clean") == 7
    assert by[("B2/dummy", "buggy")][5:-1] == ["clean"] * 8
    # the radix cache's bugs are the allocator's and the tree's: every backend; R8 under the 0.5.23 default
    for bug in ("R2", "R3", "R7", "R8"):
        assert by[(bug, "buggy")][5:-1] == ["stale_rd"] * 8, bug
    assert by[("R8", "buggy")][2] == "sglang-0.5.23"
    assert by[("P7", "buggy")][5:-1] == ["len_mism"] * 8
    # F1, F2 and P6 are live in 0.5.23 side by side (flashinfer's verify SWA tables, aiter's draft steps' keys, xpu's
    # draft steps' SWA ids): each case's fix leaves the others where its scenario reaches them
    col = {b: 5 + i for i, b in enumerate(BACKENDS)}
    live = {"F1": ("flashinfer", {"xpu", "aiter"}), "F2": ("aiter", {"xpu"}), "P6": ("xpu", {"flashinfer", "aiter"})}
    for cid, (own, others) in live.items():
        for case in (cid, f"{cid}/p16"):
            buggy, fixed = by[(case, "buggy")], by[(case, "fixed")]
            assert buggy[col[own]] != "clean" and fixed[col[own]] == "clean", case
            assert all(buggy[col[b]] != "clean" and fixed[col[b]] != "clean" for b in others), case
            assert fixed[5:-1].count("clean") == 8 - len(others), case
    assert all(r[5:-1] == ["clean"] * 8 for (cid, role), r in by.items()
               if role == "fixed" and cid.split("/")[0] not in live)
    assert f"{2 * len(cases)} of {2 * len(cases)} verdicts hold" in out
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>") and "default-src 'none'" in page
    assert f"{2 * len(cases)} of {2 * len(cases)} verdicts hold" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page
    for c in cases:
        assert str(markupsafe.escape(c.title)) in page     # autoescaped


def test_bugs_only_unknown_case_is_bad_input(capsys):
    assert main(["bugs", "-q", "--only", "B9"]) == 2
    assert "no case 'B9'" in capsys.readouterr().err


def test_an_engine_run_that_did_not_finish_says_why_on_one_line():
    """The corpus's engine table says why a run stopped: the summary's incomplete message whole (a multi-line
    exception message on one line, its type first), else stderr's last line."""
    from slotscope.corpus_engine import _failure

    run = {"summary": {"incomplete": {"message": "the run failed: AssertionError: pages\n  [3, 4] freed twice"}},
           "stderr": "slotscope: ...\n  [3, 4] freed twice after 39 steps; partial outputs in out/ (...)\n"}
    assert _failure(run) == "the run failed: AssertionError: pages [3, 4] freed twice"
    assert _failure({"summary": None, "stderr": "a\nexit 3: no summary\n"}) == "exit 3: no summary"
    assert _failure({"summary": {}, "stderr": ""}) == "(no message)"


def test_a_case_whose_mechanism_is_the_releases_scheduler_runs_on_the_cpu_on_a_gpu(monkeypatch):
    """R2's mechanism is the release's own scheduler, which engine runs drive on the CPU only: on a CUDA machine its
    runs go to the CPU (said in the row's why), so its verdict is about the release; B2's (a backend's graph replay)
    stays on the device."""
    import torch

    from slotscope.corpus_engine import engine_of, on_cpu_here

    cases = {c.id: c for c in load_corpus(CORPUS)}
    r2, b2 = engine_of(cases["R2"]), engine_of(cases["B2"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert on_cpu_here(r2) and not on_cpu_here(b2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not on_cpu_here(r2)


def test_sglang_cases_fork_their_cpu_runs_from_the_releases_dependency_server(monkeypatch, tmp_path):
    """bugs --engine sglang: on the CPU each run (patched or not) forks from its release's dependency server
    (slotscope/forkserver.py's ``deps:sglang==V``: the child imports the release and applies the run's patches); a
    run on CUDA is a process of its own, and so is every run with SLOTSCOPE_FORK_SERVER=0."""
    import subprocess

    import torch

    from slotscope import corpus_engine

    class Servers:                               # stands in for slotscope.forkserver.Servers: no release started
        def get(self, spec, timeout):
            return ("warm", spec)

        def stop(self):
            pass

    monkeypatch.setattr("slotscope.forkserver.Servers", Servers)
    launched = []
    monkeypatch.setattr(corpus_engine, "_launch", lambda argv, w=None: launched.append((argv, w))
                        or subprocess.CompletedProcess(argv, 3, "", ""))
    case = next(c for c in load_corpus(CORPUS) if c.id == "B2")       # 0.5.23 + a revert, and 0.5.23
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    corpus_engine.run_engine_corpus([case], tmp_path, ("triton",))
    assert [w for _, w in launched] == [("warm", "deps:sglang==0.5.23")] * 2
    # (the two runs go two at a time: in either order) the buggy run's patch, none on the fixed run
    patched = {Path(argv[1]).stem: "--engine-patch" in argv for argv, _ in launched}
    assert patched == {"B2-buggy": True, "B2-fixed": False}
    launched.clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)     # B2 runs on the device there
    corpus_engine.run_engine_corpus([case], tmp_path, ("triton",))
    assert [w for _, w in launched] == [None, None]
    launched.clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("SLOTSCOPE_FORK_SERVER", "0")
    corpus_engine.run_engine_corpus([case], tmp_path, ("triton",))
    assert [w for _, w in launched] == [None, None]


def test_a_failing_engine_verdict_says_per_backend_what_was_expected_and_seen():
    """bugs --engine: a verdict that fails on a finished run names, per backend where it fails, the expected class,
    the findings seen and how many of the backend's forwards went through the release's code (a piece that fell
    back to the model shows there); --json carries the same lines under ``differs``."""
    from slotscope.corpus_engine import EngineVerdict, engine_of, format_differences

    case = next(c for c in load_corpus(CORPUS) if c.id == "B4")
    eng = engine_of(case)
    counts = dict.fromkeys(FINDING_CLASSES, 0)

    def summary(**triton):
        s = {"backends": {b: {"findings": dict(counts)} for b in ("triton", "xpu")}}
        s["backends"]["triton"]["findings"].update(triton)
        return s

    fixed = Outcome(case, "fixed", eng.spec("fixed"), case.load(), summary(stale_read=384, design_error=5), {}, 0.0)
    buggy = Outcome(case, "buggy", eng.spec("buggy"), case.load(), summary(out_of_range=2), {}, 0.0)
    sides = {"triton/target": {"release_forwards": 70, "model_forwards": 36},
             "triton/draft": {"release_forwards": 10, "model_forwards": 0}}
    runs = {"buggy": {"out": "/o/B4-buggy", "pieces": {}},
            "fixed": {"out": "/o/B4-fixed",
                      "pieces": {"backends": sides, "store": {"store": "JIT store_cache kernel"}}}}
    v = EngineVerdict(case, eng, "", {"buggy": buggy, "fixed": fixed}, runs)
    assert buggy.holds and not fixed.holds and not v.holds
    line = ("triton: expected clean, saw 384 stale_read, 5 design_error; 80 forwards through the release's code, "
            "36 through the model's")
    assert v.differences() == {"fixed": [line]} and v.to_json()["differs"] == {"fixed": [line]}
    text = format_differences([v])
    assert text.splitlines() == [f"B4 fixed run ({eng.spec('fixed')}, outputs in /o/B4-fixed; the store: JIT "
                                 f"store_cache kernel): the verdict fails",
                                 f"  {line}"]
    runs["fixed"]["pieces"] = {}
    assert v.differences()["fixed"][0].endswith("; no engine pieces for it")
