"""`slotscope bisect`: the versions of a range, the search (ends first, bisection when monotonic, every
release otherwise), the cache per (release, scenario hash), and B1 over 0.5.14..0.5.15 in the real code."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine_path.errors import EngineError
from slotscope.bisect import Bisection, resolve_versions

ROOT = Path(__file__).resolve().parent.parent
B1 = str(ROOT / "scenarios" / "b1-pcg-dp-padding.toml")
REGISTRY = ["0.5.13", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17rc1", "0.5.17", "0.5.18"]


def test_range_is_inclusive_and_final_releases_only():
    assert resolve_versions("0.5.14..0.5.17", lambda: REGISTRY) == ["0.5.14", "0.5.15", "0.5.16", "0.5.17"]
    assert resolve_versions("0.5.14..0.5.14", lambda: REGISTRY) == ["0.5.14"]
    assert resolve_versions("0.5.15.post1..0.5.16", lambda: REGISTRY) == ["0.5.15.post1", "0.5.16"]


def test_comma_list(monkeypatch, tmp_path):
    monkeypatch.setenv("SLOTSCOPE_CACHE", str(tmp_path))     # nothing cached: the list is checked on the registry
    assert resolve_versions("0.5.16, 0.5.14", lambda: REGISTRY) == ["0.5.14", "0.5.16"]
    with pytest.raises(EngineError, match=r"unknown version: sglang==0.5.99 is not on the package registry"):
        resolve_versions("0.5.14,0.5.99", lambda: REGISTRY)


@pytest.mark.parametrize("text, match", [
    ("0.5.18..0.5.14", "the range is empty"),
    ("0.5.14..latest", "is not a release version"),
    ("0.5.14..0.5.99", "unknown version: sglang==0.5.99"),
    ("0.5.14,0.5.14", "names a release twice"),
    (",", "name a range"),
])
def test_bad_versions(text, match):
    with pytest.raises(EngineError, match=match):
        resolve_versions(text, lambda: REGISTRY)


def _fake(verdicts: dict[str, dict], calls: list[str]):
    def run(version, path, backends):
        calls.append(version)
        f = verdicts[version]
        if f is LACKS:                    # what _run_isolated returns for a ReleaseLacks in the child
            return {"lacks": "this release has no unified memory pool (init_unified_swa_pools): No module named x"}
        # whose scheduler made the batches, as summary.json's engine says: the release's own for 0.5.23 only
        engine = {"name": "sglang", "version": version, "scheduler": "release" if version == "0.5.23" else "model"}
        return {"findings": f, "backends": {"triton": f}, "steps": 3, "engine": engine}
    return run


LACKS = {"lacks": True}


BAD, OK = {"length_mismatch": 144}, {}
VS = [f"0.5.{i}" for i in range(14, 24)]


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("SLOTSCOPE_CACHE", str(tmp_path))
    return tmp_path


def test_bisection_runs_ends_then_halves(cache):
    calls: list[str] = []
    b = Bisection(B1, VS, runner=_fake({v: (BAD if v == "0.5.14" else OK) for v in VS}, calls), log=lambda s: None)
    out = b.search()
    assert out["mode"] == "bisect" and [c["release"] for c in out["changes"]] == ["0.5.15"]
    assert calls == ["0.5.14", "0.5.23", "0.5.18", "0.5.16", "0.5.15"]
    assert "not run" in b.table() and "0.5.17" in b.table()
    # whose scheduler made each release's batches: a verdict that changes where the scheduler does is seen as such
    lines = b.table().splitlines()
    col = lines[0].index("batches")
    batches = {line.split()[0]: line[col:].split()[0] for line in lines[2:] if "not run" not in line}
    assert batches == {"0.5.14": "model", "0.5.15": "model", "0.5.16": "model", "0.5.18": "model",
                       "0.5.23": "release"}
    # a rerun runs nothing: every verdict it needs is cached per (release, scenario hash)
    calls2: list[str] = []
    b2 = Bisection(B1, VS, runner=_fake({}, calls2), log=lambda s: None)
    assert b2.search()["changes"] == out["changes"] and calls2 == []
    assert {r["source"] for r in b2.results.values()} == {"cached"}
    # other code: still used (the key is release and scenario hash), and said so
    calls3: list[str] = []
    b3 = Bisection(B1, VS, runner=_fake({}, calls3), log=lambda s: None)
    b3.code = "0" * 16
    assert b3.search()["changes"] == out["changes"] and calls3 == []
    assert {r["source"] for r in b3.results.values()} == {"cached (other code)"}
    assert len(list((cache / "bisect").glob("sglang-0.5.*_*.json"))) == 5


def test_equal_ends_stop_the_search(cache):
    calls: list[str] = []
    b = Bisection(B1, VS, runner=_fake({v: OK for v in VS}, calls), log=lambda s: None)
    assert b.search() == {"mode": "ends", "changes": [], "runnable": VS} and calls == ["0.5.14", "0.5.23"]


def test_a_third_verdict_runs_every_release(cache):
    third = {"missed": 4}
    verdicts = {v: (BAD if v == "0.5.14" else third if v == "0.5.18" else OK) for v in VS}
    calls: list[str] = []
    b = Bisection(B1, VS, runner=_fake(verdicts, calls), log=lambda s: None)
    out = b.search()
    assert out["mode"] == "all (not monotonic)" and sorted(calls) == sorted(VS)
    assert [c["release"] for c in out["changes"]] == ["0.5.15", "0.5.18", "0.5.19"]


def test_all_runs_each_and_names_every_change(cache):
    verdicts = {v: (BAD if v in ("0.5.14", "0.5.20") else OK) for v in VS}
    calls: list[str] = []
    out = Bisection(B1, VS, runner=_fake(verdicts, calls), log=lambda s: None).search(run_all=True, jobs=2)
    assert sorted(calls) == sorted(VS) and out["mode"] == "all (not monotonic)"
    assert [c["release"] for c in out["changes"]] == ["0.5.15", "0.5.20", "0.5.21"]


def _unified_history(v: str) -> dict:
    """Releases before 0.5.20 have no unified pool; 0.5.20 and 0.5.21 have the bug; 0.5.22 fixed it."""
    return LACKS if v < "0.5.20" else BAD if v < "0.5.22" else OK


def test_releases_without_the_scenarios_piece_cannot_run_and_the_change_is_looked_for_among_the_rest(cache):
    calls: list[str] = []
    logged: list[str] = []
    b = Bisection(B1, VS, runner=_fake({v: _unified_history(v) for v in VS}, calls), log=logged.append)
    out = b.search()
    # the ends, then the first release that can run (bisected), then the change among 0.5.20..0.5.23
    assert calls == ["0.5.14", "0.5.23", "0.5.18", "0.5.20", "0.5.19", "0.5.21", "0.5.22"]
    assert out["runnable"] == VS[6:] and [c["release"] for c in out["changes"]] == ["0.5.22"]
    assert out["changes"][0]["from"] == "findings: length_mismatch 144" and out["changes"][0]["to"] == "clean"
    assert [r["verdict"] for v, r in b.results.items() if not b.can_run(v)] == [
        "cannot run: this release has no unified memory pool (init_unified_swa_pools): No module named x"] * 3
    assert any("cannot run b1-pcg-dp-padding: 0.5.14, 0.5.18, 0.5.19" in line for line in logged)
    assert "cannot run: this release has no unified memory pool" in b.table()
    again: list[str] = []           # a release that cannot run is cached as such too
    assert Bisection(B1, VS, runner=_fake({}, again), log=lambda s: None).search()["changes"] == out["changes"]
    assert again == []


def test_all_looks_for_changes_among_the_releases_that_can_run(cache):
    calls: list[str] = []
    verdicts = {v: _unified_history(v) for v in VS}
    verdicts["0.5.21"] = LACKS                     # a gap inside the range is not a change
    out = Bisection(B1, VS, runner=_fake(verdicts, calls), log=lambda s: None).search(run_all=True)
    assert sorted(calls) == VS and out["runnable"] == ["0.5.20", "0.5.22", "0.5.23"]
    assert [(c["before"], c["release"]) for c in out["changes"]] == [("0.5.20", "0.5.22")]


def test_a_range_no_release_of_which_can_run_the_scenario_is_refused(cache):
    calls: list[str] = []
    with pytest.raises(EngineError, match=r"no release of --versions can run b1-pcg-dp-padding: this release has no "
                                          r"unified memory pool .* \(sglang==0.5.14\)"):
        Bisection(B1, VS, runner=_fake({v: LACKS for v in VS}, calls), log=lambda s: None).search()
    assert sorted(calls) == VS                     # neither end could: every release was tried


def test_cache_key_follows_the_backends(cache):
    a = Bisection(B1, VS, runner=_fake({}, []), log=lambda s: None)
    b = Bisection(B1, VS, backends=("triton",), runner=_fake({}, []), log=lambda s: None)
    assert a.scenario_hash != b.scenario_hash


# ------------------------------------------------------------------------- the real releases

def _bisect(*args, env):
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "slotscope", "bisect", B1, "--engine", "sglang", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900, env=dict(os.environ, **env))
    return proc, time.perf_counter() - t0


def _warm_bisect(warm, *args, env, route=None):
    t0 = time.perf_counter()
    proc = warm("none").cli("bisect", B1, "--engine", "sglang", *args, cwd=ROOT, timeout=900, env=env, route=route)
    return proc, time.perf_counter() - t0


@pytest.mark.slow
@pytest.mark.engine
def test_bisect_b1_names_0515_and_a_rerun_runs_nothing(warm, tmp_path):
    """Both commands in children of the session's warm CLI process (tests/warm_engine.py): 0.5.15's verdict in a
    fresh ``engine_path.isolate`` subprocess, 0.5.14's in a child forked from the session's one import of it."""
    from engine_path.releases import EngineSpec, engines_dir, fetch

    fetch(EngineSpec("sglang", "0.5.15"))
    (tmp_path / "engines").symlink_to(engines_dir())        # the releases shared, the bisect results fresh
    env = {"SLOTSCOPE_CACHE": str(tmp_path)}
    proc, _ = _warm_bisect(warm, "--versions", "0.5.14..0.5.15", "--jobs", "2", "--json", env=env,
                           route={"sglang==0.5.14": warm.socket("sglang==0.5.14")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "first release where the verdict changed: 0.5.15" in proc.stdout
    lines = proc.stdout.splitlines()
    assert any(l.split()[:4] == ["0.5.14", "findings:", "length_mismatch", "144"] for l in lines), proc.stdout
    assert any(l.split()[:2] == ["0.5.15", "clean"] for l in lines), proc.stdout
    assert "[bisect] sglang==0.5.14: findings: length_mismatch 144" in proc.stderr
    result = json.loads(lines[-1])
    assert result["changes"][0]["release"] == "0.5.15"
    assert {v: r["source"] for v, r in result["results"].items()} == {"0.5.14": "run", "0.5.15": "run"}

    again, seconds = _warm_bisect(warm, "--versions", "0.5.14..0.5.15", "--json", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = json.loads(again.stdout.splitlines()[-1])
    # "cached", or "cached (other code)" when simulator/ or engine_path/ changed between the two runs
    assert {r["source"].split()[0] for r in rerun["results"].values()} == {"cached"}
    assert "2 of 2 releases, 0 run, 2 cached" in again.stdout
    assert rerun["changes"] == result["changes"]
    assert seconds < 60                                       # no release imported


@pytest.mark.engine
def test_bisect_bad_input_exits_2(tmp_path):
    for args, needle in ((["--versions", "0.5.23..0.5.14"], "the range is empty"),
                         (["--versions", "0.5.14..0.5.15", "--engine", "sglang==0.5.14"], "bisect takes the engine's name")):
        proc, _ = _bisect(*args, env={"SLOTSCOPE_CACHE": str(tmp_path)})
        assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_the_same_failure_is_the_same_verdict_in_every_release(cache):
    from slotscope.bisect import error_label

    msg = "slotscope.bisect:verdict under sglang==0.5.{} raised TypeError: f() got an unexpected keyword argument 'x'\ntb"
    assert error_label(msg.format(16)) == error_label(msg.format(17)) == \
        "TypeError: f() got an unexpected keyword argument 'x'"

    def run(version, path, backends):
        return {"error": msg.format(version.rsplit(".", 1)[1])} if version < "0.5.20" else \
            {"findings": {}, "backends": {"triton": {}}, "steps": 3, "engine": None}
    out = Bisection(B1, VS, runner=run, log=lambda s: None).search()
    assert [c["release"] for c in out["changes"]] == ["0.5.20"]
