"""slotscope fuzz keeps searching (issue 29 point 8): by default against the design's own release, so a failure
the release shares does not end the search; an internal error of slotscope on a draw is recorded, written with
its scenario and counted, and the search goes on; ``--seed`` and ``--budget`` are validated as ``run``'s are."""
from __future__ import annotations

import json
from collections import Counter

import pytest

import slotscope.fuzz_search as fs
from engine_path.releases import EngineSpec
from simulator.designs.types import DesignError
from simulator.engine_model.release import MID_2026_RELEASE, SGLANG_0_5_23_RELEASE
from simulator.scenario import parse_scenario
from slotscope.cli import main
from slotscope.fuzz_coverage import combos
from slotscope.fuzz_search import fuzz, own_release_design, release_designs, resolve_against
from slotscope.fuzz_space import RECIPES, Generator, draw_scenario, fix_up

from helpers import ROOT

FIXED = f"{ROOT / 'examples' / 'sweeps' / 'fixed_everywhere.py'}:FixedEverywhere"


def test_the_release_designs():
    assert [(rel, cls.name) for rel, cls in release_designs()] == [
        (MID_2026_RELEASE, "sglang-post-33587"), (SGLANG_0_5_23_RELEASE, "sglang-0.5.23")]


def test_each_design_s_own_release():
    """The first modelled release a design's class declares or inherits; none for the release itself."""
    mid, new = "sglang-post-33587", "sglang-0.5.23"
    expect = {"sglang-0.5.23": None, "sglang-post-33587": None,
              "sglang-post-29460": mid, "sglang-pre-24743": mid, "kvwriteloc-strict": mid, "sglang-pr-29858": mid,
              "sglang-pre-26380": mid, "sglang-pre-33587": mid, "pd-decode-pre-25805": mid, "dots-eagle-preplan": mid,
              "mini-sglang-dummy-pre-24743": mid,
              "sglang-0.5.23-war-barrier": new, "radix-fixed": new, "radix-r2": new, "radix-r8": new,
              "sglang-0.5.23-unified": new, "sglang-unified-pre-35933": new,
              f"{ROOT / 'tests' / 'mutant_designs.py'}:SliceOffByOne": mid, FIXED: mid,
              f"{ROOT / 'tests' / 'coverage_designs.py'}:RadixReadMemo": new,
              f"{ROOT / 'tests' / 'coverage_designs.py'}:DecodeGraphLiveSwa": mid}
    assert {d: own_release_design(d) for d in expect} == expect


def test_resolve_against():
    assert resolve_against("radix-r2", "release", None) == "sglang-0.5.23"
    assert resolve_against("radix-r2", "release", EngineSpec("sglang", "0.5.23")) is None   # the release runs
    assert resolve_against("radix-r2", "none", None) is None and resolve_against("radix-r2", None, None) is None
    assert resolve_against("radix-r2", "radix-fixed", None) == "radix-fixed"
    with pytest.raises(DesignError):
        resolve_against("radix-r2", "no-such-design", None)


def test_a_failure_the_release_shares_does_not_end_the_search():
    """sglang-pre-26380 (W1): without a reference the search stops at its 14th scenario, on the post-#29460 gap
    (length_mismatch), which its release (sglang-post-33587) has too; against the release it goes on to W1's own
    padding_slot at the 18th."""
    alone = fuzz("sglang-pre-26380", seed=0, budget_s=600, max_scenarios=40, against=None)
    assert (alone.status, alone.tried, alone.shared, alone.against, alone.finding.cls) == (
        "found", 14, 0, None, "length_mismatch")
    res = fuzz("sglang-pre-26380", seed=0, budget_s=600, max_scenarios=40)
    assert (res.status, res.tried, res.shared, res.against) == ("found", 18, 1, "sglang-post-33587")
    assert (res.finding.cls, res.finding.backend, res.finding.step) == ("padding_slot", "flashinfer", 23)
    assert res.hashes[:14] == alone.hashes                 # the same draws; the 14th did not end the search


def test_the_release_itself_has_no_reference():
    res = fuzz("sglang-0.5.23", seed=0, budget_s=600, max_scenarios=40)
    # the first draw (EAGLE, a request past its window): flashinfer's verify reads the window at the request's first
    # SWA slots (F1, sglang#39287, live in the release; before the model had it, the third draw's ROCm overlap
    # scenario found aiter's torn write first: W5's class in the release's aiter, its barrier off there, W7)
    assert (res.status, res.against, res.shared, res.tried) == ("found", None, 0, 1)
    assert (res.finding.backend, res.finding.cls) == ("flashinfer", "stale_read")
    assert "reassigned to another token (req 0 pos 0)" in res.finding.message


class Injected(RuntimeError):
    pass


def failing_runs(monkeypatch, fail):
    """run_one raising Injected (an internal error of slotscope) where ``fail(call_index, scenario)`` says so."""
    real, calls = fs.run_one, []

    def run_one(sc, engine):
        calls.append(sc)
        if fail(len(calls) - 1, sc):
            raise Injected(f"injected internal error in call {len(calls) - 1}")
        return real(sc, engine)
    monkeypatch.setattr(fs, "run_one", run_one)
    return calls


def test_an_internal_error_is_recorded_and_the_search_goes_on(monkeypatch):
    calls = failing_runs(monkeypatch, lambda i, sc: i in (1, 3))
    res = fuzz(FIXED, seed=3, budget_s=600, max_scenarios=5, against=None)
    assert res.status == "clean" and res.tried == 5
    assert len(res.internal) == 2 and {f.during for f in res.internal} == {"run"}
    assert all("Injected: injected internal error" in f.error for f in res.internal)
    assert [f.scenario.hash for f in res.internal] == [calls[1].hash, calls[3].hash]
    assert {calls[1].hash, calls[3].hash} <= set(res.hashes)           # counted as run


def test_an_internal_error_of_the_reference_counts_the_failure_as_the_design_s(monkeypatch):
    failing_runs(monkeypatch, lambda i, sc: sc.design == "sglang-post-33587")
    res = fuzz("sglang-pre-24743", seed=0, budget_s=600, max_scenarios=40)
    assert res.status == "found" and res.shared == 0
    assert [f.during for f in res.internal] == ["against"]
    assert res.internal[0].scenario.design == "sglang-post-33587"


def test_cli_writes_internal_errors_and_exits_3(tmp_path, capsys, monkeypatch):
    failing_runs(monkeypatch, lambda i, sc: i in (0, 2))
    out = tmp_path / "fz"
    rc = main(["fuzz", "--design", FIXED, "--seed", "3", "--budget", "10m", "--max-scenarios", "4",
               "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 3, err[-2000:]
    assert "2 internal errors of slotscope" in err and "recorded, the search goes on" in err
    info = json.loads((out / "fuzz.json").read_text())
    assert (info["status"], info["tried"], info["internal_errors"], info["against"]) == (
        "clean", 4, 2, "sglang-post-33587")
    assert info["internal_error_files"] == ["internal-errors/000.toml", "internal-errors/001.toml"]
    sc = parse_scenario((out / "internal-errors" / "000.toml").read_text(), "000.toml")
    assert sc.design.endswith("FixedEverywhere")
    assert "Injected: injected internal error in call 0" in (out / "internal-errors" / "000.txt").read_text()


def test_cli_found_with_internal_errors_exits_1_and_counts_them(tmp_path, capsys, monkeypatch):
    failing_runs(monkeypatch, lambda i, sc: i == 0)
    out = tmp_path / "fz"
    rc = main(["fuzz", "--design", "sglang-pre-24743", "--seed", "0", "--budget", "10m", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1, err[-2000:]
    info = json.loads((out / "fuzz.json").read_text())
    assert info["status"] == "found" and info["internal_errors"] == 1
    assert info["against"] == "sglang-post-33587" and info["against_on_minimal"] == "clean"
    assert (out / "internal-errors" / "000.toml").exists()


def test_cli_against_none(tmp_path, capsys):
    rc = main(["fuzz", "--design", "sglang-pre-24743", "--seed", "0", "--budget", "10m", "--against", "none",
               "--out", str(tmp_path / "fz")])
    cap = capsys.readouterr()
    assert rc == 1 and "against nothing" in cap.err
    assert json.loads((tmp_path / "fz" / "fuzz.json").read_text())["against"] is None


@pytest.mark.parametrize("args, option", [
    (["--seed", "-1"], "--seed"), (["--seed", str(2 ** 63)], "--seed"), (["--seed", "1.5"], "--seed"),
    (["--seed", "ten"], "--seed"),
    (["--budget", "inf"], "--budget"), (["--budget", "nan"], "--budget"), (["--budget", "-inf"], "--budget"),
    (["--budget", "1e400"], "--budget"), (["--budget", "0"], "--budget"), (["--budget", "-5m"], "--budget"),
    (["--budget", "infs"], "--budget"), (["--max-scenarios", "0"], "--max-scenarios")])
def test_bad_seed_and_budget_are_bad_input(args, option, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["fuzz", "--design", "kvwriteloc-strict", *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err and "Traceback" not in err, err


def test_seed_and_budget_checked_by_the_api():
    for kw, option in (({"seed": -1}, "--seed"), ({"seed": 2 ** 63}, "--seed"), ({"budget_s": float("inf")}, "--budget"),
                       ({"budget_s": float("nan")}, "--budget"), ({"budget_s": 0}, "--budget")):
        with pytest.raises(ValueError, match=option):
            fuzz("kvwriteloc-strict", **kw)
    assert fuzz("kvwriteloc-strict", seed=2 ** 63 - 1, budget_s=600, max_scenarios=1).tried == 1


def test_recipes_draw_each_path():
    """A fifth of the fresh draws take one of RECIPES, the paths of issue 29 point 7 (knobs of several groups
    together): each is drawn, valid, with its knobs."""
    gen, seen = Generator(3), Counter()
    for i in range(300):
        sc = draw_scenario(fix_up(gen.fresh(1 + i % 6, i), 1 + i % 6), "sglang-0.5.23")
        if sc is None:
            continue
        e, p = sc.engine, sc.pool
        seen["overlap-mixed-dp-pcg-paged"] += e.overlap and e.mixed_chunk and e.dp_size > 1 and \
            e.piecewise_cuda_graph and p.page_size > 1
        seen["overlap-retract"] += e.overlap and e.reserve == "none"
        seen["dp-attn-tp-eager"] += e.dp_size > 1 and e.attn_tp_size > 1 and not e.piecewise_cuda_graph
        seen["radix-paged"] += e.radix_cache and p.page_size > 1
        seen["unified-dp-pcg-mixed"] += p.unified and e.dp_size > 1 and e.piecewise_cuda_graph and e.mixed_chunk
    assert set(RECIPES) == set(seen) and min(seen.values()) >= 5, seen


def test_combos_of_a_run():
    """fuzz_coverage.combos names the paths a run reached (on a retraction under the overlap scheduler here)."""
    from slotscope.fuzz_search import run_one

    gen = Generator(0)
    for i in range(200):
        data = fix_up(gen.fresh(2, i), 2)
        e = data.get("engine", {})
        if not (e.get("overlap") and e.get("reserve") == "none"):
            continue
        sc = draw_scenario(data, "sglang-post-33587")
        out = sc and run_one(sc, None)
        if out is not None and out.status == "clean" and "overlap-retract-landing" in combos(sc, out.steps, out.radix):
            return
    pytest.fail("no drawn retraction landed inside a forward")
