"""The vLLM corpus: `slotscope bugs --engine vllm` (scenarios/corpus-vllm.toml, slotscope/corpus_engine.py).

Each V-case runs twice as vLLM's own code (its scheduler, KV-cache manager and worker tables): on 0.34.0 with the
fix reverted by a shipped patch (examples/engine-patches/vllm/), and on 0.34.0 as released. V1 (#36580: a graph's
padded rows keep earlier slots) writes over live slots; V2 (#39734: the admission gate budgets the SWA group for the
whole sequence) never admits a prompt that fits, so the run stops; V3 (#17398: EAGLE's hit one block short of the
window) reads the null block inside the window; V4 (#35219, fixed by #44490: the block ids recorded for zeroing
taken only where blocks are zeroed) ends the run with the managers' list undrained; V5 (#33775, fixed by #44409: the
groups' blocks for a KV connector's tokens taken before every group's hit is touched) reads a system prompt the
offload tier's load overwrote; V6 (#47282, fixed by #47728: sliding-window frees on the optimistic count under async
scheduling) reads a block an async load was given while the forward still read it; V7 (#32802: EAGLE's block
dropped on every pass of the hybrid hit search) writes and reads nothing wrong but hits no prefix token where the
release as released hits 720; V8 (#43810, fixed by #43869: extract_hidden_states' store took a padded row's -1
as a Python index) writes the pool's last slot, read by the request holding it, where 0.34.0 writes the null block
(still a finding: live, V9: V8's minimal scenario on 0.34.0 as released, clean with a fix patch of slotscope's
that skips padded rows). The corpus file's validation runs without vLLM.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from helpers import slotscope_cli
from simulator.scenario import ScenarioError
from slotscope.corpus import CORPUS_VLLM, load_corpus
from slotscope.corpus_engine import engine_of

ROOT = Path(__file__).resolve().parent.parent


def test_every_vllm_case_runs_on_vllm_as_release_code_only():
    cases = load_corpus(CORPUS_VLLM)
    assert [c.id for c in cases] == ["V1", "V2", "V3", "V4", "V5", "V6", "V7", "V8", "V9"]
    for c in cases:
        assert c.engine_only and not c.buggy and not c.fixed
        eng = engine_of(c, str(CORPUS_VLLM))
        assert eng.engine == "vllm" and eng.buggy == eng.fixed == "vllm==0.34.0"
        # a fix reverted on the buggy run, or (a bug live in 0.34.0) a fix of slotscope's on the fixed run
        assert bool(eng.buggy_patches) != bool(eng.fixed_patches), c.id
        assert all(p.is_file() for p in eng.buggy_patches + eng.fixed_patches)
        assert c.issue.startswith("vllm#")


def _corpus(tmp_path: Path, engine: str) -> Path:
    path = tmp_path / "corpus.toml"
    path.write_text(f'[[case]]\nid = "X"\ntitle = "t"\nscenario = "{ROOT}/scenarios/vllm-long-prompt.toml"\n'
                    f'expect = "clean"\nengine = {engine}\n')
    return path


@pytest.mark.parametrize("engine,field", [
    ('{ buggy = "vllm==0.34.0", fixed = "sglang==0.5.23" }', "case X.engine.fixed"),
    ('{ buggy = "trtllm==1.0", fixed = "vllm==0.34.0" }', "case X.engine.buggy"),
    ('{ buggy = "vllm==0.34.0", fixed = "vllm==0.34.0", stops = 3 }', "case X.engine.stops"),
    ('{ buggy = "vllm==0.34.0", fixed = "vllm==0.34.0", hits = "fewer" }', "case X.engine.hits"),
])
def test_bad_engine_entries_name_their_field(tmp_path, engine, field):
    case = load_corpus(_corpus(tmp_path, engine))[0]
    with pytest.raises(ScenarioError, match=field.replace(".", r"\.")):
        engine_of(case, "c")


def test_a_case_without_designs_needs_an_engine_table(tmp_path):
    with pytest.raises(ScenarioError, match=r"case\[0\]\.buggy: is required"):
        load_corpus(_corpus(tmp_path, '"model-only: no"'))


def test_vllm_cases_are_refused_without_or_with_the_other_engine(tmp_path):
    r = slotscope_cli("bugs", "--corpus", str(CORPUS_VLLM), "-q")
    assert r.returncode == 2 and "case V1 has no model design" in r.stderr and "--engine vllm" in r.stderr
    r = slotscope_cli("bugs", "--engine", "sglang", "--corpus", str(CORPUS_VLLM), "-q")
    assert r.returncode == 2 and "case V1 runs on vllm, not sglang" in r.stderr


@pytest.mark.parametrize("asked, device, warm", [("cpu", "cpu", True), ("cuda", "cuda", False)])
def test_vllm_cases_run_where_device_asks(monkeypatch, tmp_path, asked, device, warm):
    """bugs --engine vllm runs its cases on the CPU unless --device asks for CUDA (gpu-check's vLLM stage); on the CPU
    each run forks from one warm import of the release (slotscope/forkserver.py), on CUDA it is a process of its
    own; SLOTSCOPE_FORK_SERVER=0 makes the CPU's runs processes of their own too."""
    from slotscope import corpus_cmd, corpus_engine

    class Servers:                               # stands in for slotscope.forkserver.Servers: no release started
        stopped = False

        def get(self, spec, timeout):
            return ("warm", spec)

        def stop(self):
            Servers.stopped = True

    monkeypatch.setattr("slotscope.forkserver.Servers", Servers)
    launched = []
    monkeypatch.setattr(corpus_engine, "_launch", lambda argv, w=None: launched.append((argv, w))
                        or subprocess.CompletedProcess(argv, 3, "", ""))
    case = next(c for c in load_corpus(CORPUS_VLLM) if c.id == "V2")
    corpus_engine.run_engine_corpus([case], tmp_path, (), vllm_device=corpus_cmd._vllm_device(asked))
    assert len(launched) == 2 and all(a[a.index("--device") + 1] == device for a, _ in launched)
    assert all(w == (("warm", "vllm==0.34.0") if warm else None) for _, w in launched)
    assert Servers.stopped == warm
    monkeypatch.setenv("SLOTSCOPE_FORK_SERVER", "0")
    launched.clear()
    corpus_engine.run_engine_corpus([case], tmp_path, (), vllm_device="cpu")
    assert [w for _, w in launched] == [None, None]


def test_the_vllm_corpus_reproduces_every_case_as_release_code(vllm_release, tmp_path):
    out = tmp_path / "v.json"
    r = slotscope_cli("bugs", "--engine", "vllm", "--json", str(out), "--out", str(tmp_path / "runs"), "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    got = {v["case"]: v for v in json.loads(out.read_text())}
    cases = ("V1", "V2", "V3", "V4", "V5", "V6", "V7", "V8", "V9")
    assert {k: (v["real"], v["holds"]) for k, v in got.items()} == {c: (True, True) for c in cases}
    assert got["V1"]["buggy"] == "vllm==0.34.0 + revert-36580-pad-from-padded-count.yaml"
    assert got["V3"]["buggy"] == "vllm==0.34.0 + revert-17398-eagle-swa-hit.yaml"
    assert got["V3"]["fixed"] == "vllm==0.34.0"
    assert "SchedulerStalled" in got["V2"]["why"] and "384 prompt tokens" in got["V2"]["why"]
    # V4: one id per full-attention block the run allocated (195, counted apart by wrapping the full manager's
    # allocate_new_blocks), all left in the list, which grew at every schedule that allocated
    assert ("195 in the full group's manager; the list grew at 14 of the run's 15 schedules and shrank at 0"
            in got["V4"]["why"])

    def findings(case, role):
        s = json.loads((tmp_path / "runs" / case / f"{case}-{role}" / "summary.json").read_text())
        return {k: n for k, n in s["backends"]["vllm"]["findings"].items() if n}

    assert findings("V1", "buggy") == {"clobbered": 4}
    assert findings("V3", "buggy") == {"stale_read": 150}       # the target's SWA layers and the drafter's
    assert findings("V5", "buggy") == {"stale_read": 32}
    assert findings("V6", "buggy") == {"stale_read": 10}
    assert all(findings(c, "fixed") == {} for c in cases if c != "V8")
    # V8: each of the 9 padded verifies stores its padded rows' hidden states; as released (#43869's clamp) in the
    # null block's slot 0 (on the cache-only layer, 4), reverted in the pool's last slot (25 blocks of 16), whose
    # block a request holds: its sliding-window reads find them
    assert findings("V8", "fixed") == {"evicted_slot": 9}
    assert findings("V8", "buggy") == {"evicted_slot": 9, "stale_read": 16}

    def where(case, role, cls):
        rows = (tmp_path / "runs" / case / f"{case}-{role}" / "findings.jsonl").read_text().splitlines()
        return {(f["layer"], f["slot"]) for f in map(json.loads, rows) if f["class"] == cls}

    assert where("V8", "fixed", "evicted_slot") == {(4, 0)} and where("V8", "buggy", "evicted_slot") == {(4, 399)}
    assert {slot for _, slot in where("V8", "buggy", "stale_read")} == {399}
    # V9: live in 0.34.0, V8's minimal scenario: one padded verify, one write in the null block; the store skipping
    # padded rows (slotscope's fix patch) runs clean
    assert got["V9"]["buggy"] == "vllm==0.34.0" and got["V9"]["fixed"].endswith("fix-43869-skip-padded-rows.yaml")
    assert findings("V9", "buggy") == {"evicted_slot": 1} and where("V9", "buggy", "evicted_slot") == {(2, 0)}
    # V7: nothing written or read wrong; the hits the fixed release takes on the same workload, lost
    assert findings("V7", "buggy") == {} and got["V7"]["prefix_hit_tokens"] == {"buggy": 0, "fixed": 720}
    assert "prefix-hit tokens: 0 buggy against 720 fixed" in got["V7"]["why"]


def test_a_stop_the_buggy_run_does_not_make_fails_the_verdict(vllm_release, tmp_path):
    # V2's expectation with the fix in place: the release admits the prompt, so the run does not stop
    path = _corpus(tmp_path, '{ buggy = "vllm==0.34.0", fixed = "vllm==0.34.0", mechanism = ["KVCacheManager"], '
                             'stops = "scheduled nothing" }')
    r = slotscope_cli("bugs", "--engine", "vllm", "--corpus", str(path), "-q")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the buggy run should stop with 'scheduled nothing'; it finished" in r.stdout


@pytest.mark.parametrize("buggy, fixed, holds, said", [
    (0, 720, True, "prefix-hit tokens: 0 buggy against 720 fixed"),
    (720, 720, False, "prefix-hit tokens: 720 buggy against 720 fixed, no hits lost"),
    (None, 720, False, "the runs count no prefix-hit tokens, so lost hits cannot be told"),
])
def test_a_lost_hits_case_holds_only_where_the_buggy_run_hit_fewer_tokens(buggy, fixed, holds, said):
    """V7's kind of case (hits = "lost"): clean on both runs, it holds only where the buggy run's prefix-hit tokens
    (vLLM's scheduler's count in run.json) are fewer than the fixed run's; the table marks the buggy verdict."""
    from slotscope.corpus import Outcome
    from slotscope.corpus_engine import EngineVerdict, format_engine_table, lost_hits

    case = next(c for c in load_corpus(CORPUS_VLLM) if c.id == "V7")
    eng = engine_of(case, str(CORPUS_VLLM))
    assert eng.hits == "lost"
    clean = {"backends": {"vllm": {"findings": {"stale_read": 0}}}}
    outcomes = {r: Outcome(case, r, eng.spec(r), case.load(), clean, {}, 0.0) for r in ("buggy", "fixed")}
    did = {"buggy": buggy, "fixed": fixed}
    runs = {r: {"out": f"/o/{r}", "pieces": {"scheduler": {"did": {} if n is None else {"prefix_hit_tokens": n}}}}
            for r, n in did.items()}
    ok, text = lost_hits(runs)
    assert (ok, text) == (holds, said)
    v = EngineVerdict(case, eng, text, outcomes, runs, ok)
    assert all(o.holds for o in outcomes.values()) and v.holds == holds
    assert v.to_json()["prefix_hit_tokens"] == did
    head, row = (re.split(r"\s{2,}", line) for line in format_engine_table([v]).splitlines())
    assert head[5:7] == ["buggy verdict", "fixed verdict"]
    assert row[5:7] == ["holds" if holds else "FAILS", "holds"]


def test_fuzz_on_a_patched_vllm_finds_its_bug_against_vllm_as_released(warm_vllm, tmp_path):
    """`slotscope fuzz --engine vllm==0.34.0 --engine-patch P`: every draw on the patched release (draws vLLM does not
    run yet are rejected), a failure counted only where vLLM as released (a worker process) runs clean. V1's revert
    (a graph's padded rows keep earlier slots) is found on the first draw vLLM runs with seed 1, and minimized
    through the patched release."""
    out = tmp_path / "fz"
    r = warm_vllm.cli("fuzz", "--design", "sglang-0.5.23", "--engine", "vllm==0.34.0", "--engine-patch",
                      "examples/engine-patches/vllm/revert-36580-pad-from-padded-count.yaml", "--budget", "4m",
                      "--seed", "1", "--out", str(out), "-q")
    assert r.returncode == 1, r.stdout + r.stderr
    info = json.loads((out / "fuzz.json").read_text())
    assert info["finding"]["class"] == "clobbered" and info["finding"]["backend"] == "vllm"
    assert (info["tried"], info["against"], info["against_on_minimal"], info["internal_errors"]) == (
        1, "vllm==0.34.0 as released", "clean", 0)
    # minimized through the patched release (each candidate a vLLM run): one request left, still clobbering there,
    # clean on vLLM as released
    minimal = (out / "minimal.toml").read_text()
    assert info["minimize_runs"] > 10 and info["minimal_findings_total"] > 0
    assert minimal.count("[[workload.request]]") == 1 and "under vllm==0.34.0 + revert-36580" in minimal


@pytest.mark.vllm
def test_minimize_shrinks_a_vllm_run_through_the_release_and_its_patch(warm_vllm, tmp_path):
    """`slotscope minimize DIR` of an engine run reruns each candidate through the release and the patches run.json
    names (each still the file that ran); the minimal scenario reproduces with the patch and is clean without it.
    A patch changed since the run is refused, naming it."""
    run = tmp_path / "v1"
    patch = "examples/engine-patches/vllm/revert-36580-pad-from-padded-count.yaml"
    r = warm_vllm.cli("run", "scenarios/vllm-graph-pad.toml", "--engine", "vllm==0.34.0", "--engine-patch", patch,
                      "--out", str(run), "-q", "--no-report", "--trace-level", "off")
    assert r.returncode == 1, r.stderr
    r = warm_vllm.cli("minimize", str(run))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "keeping clobbered at a swa layer on vllm under vllm==0.34.0 + revert-36580" in r.stderr
    minimal = (run / "minimal.toml").read_text()
    assert minimal.count("[[workload.request]]") == 1
    # (the search's last kept candidate was a run with the patch that clobbered); as released it is clean
    r = warm_vllm.cli("run", str(run / "minimal.toml"), "--out", str(tmp_path / "again"), "-q", "--no-report",
                      "--trace-level", "off")
    assert r.returncode == 0 and "findings_total\": 0" in (tmp_path / "again" / "summary.json").read_text(), \
        r.stderr[-2000:]
    meta = json.loads((run / "run.json").read_text())
    meta["engine"]["patches"][0]["sha256"] = "0" * 64
    (run / "run.json").write_text(json.dumps(meta))
    r = warm_vllm.cli("minimize", str(run))
    assert r.returncode == 2 and "engine.patches[0]" in r.stderr and "changed since the run" in r.stderr


@pytest.mark.vllm
def test_fuzz_counts_the_release_raising_in_its_own_code_as_its_failure(warm_vllm, tmp_path):
    """A patched vLLM that raises inside its block pool (a crash, no finding): the search stops at the first draw
    that raises where vLLM as released runs clean, writes found.toml, run/ (stopped with the release's words) and
    fuzz.json naming the exception and where; nothing to minimize, and no internal error of slotscope."""
    out = tmp_path / "fz"
    r = warm_vllm.cli("fuzz", "--design", "sglang-0.5.23", "--engine", "vllm==0.34.0", "--engine-patch",
                      "tests/engine_patches/vllm/pool-cannot-get-blocks.yaml", "--budget", "2m", "--seed", "1",
                      "--out", str(out), "-q")
    assert r.returncode == 1, r.stdout + r.stderr
    info = json.loads((out / "fuzz.json").read_text())
    said = "vLLM 0.34.0's scheduler (schedule) raised ValueError: Cannot get "
    assert info["raised"].startswith(said) and info["raised_again"] == info["raised"]
    assert (info["finding"], info["minimized"], info["against_on_found"], info["internal_errors"]) == (
        None, False, "clean", 0)
    assert json.loads((out / "run" / "summary.json").read_text())["incomplete"]["error"].startswith(
        "ReleaseBroke: " + said)
