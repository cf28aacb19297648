"""`slotscope minimize` and the TOML writer it relies on."""
from __future__ import annotations

import dataclasses
import json

import pytest

from simulator.scenario import load_scenario, parse_scenario, tomllib
from simulator.scenario.toml_write import dumps
from slotscope.cli import main

from helpers import ROOT

SCENARIOS = sorted((ROOT / "scenarios").glob("*.toml"))


def _same(a, b) -> bool:
    strip = dict(raw="", source="")
    return dataclasses.replace(a, **strip) == dataclasses.replace(b, **strip)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_toml_writer_round_trips_every_shipped_file(path):
    data = tomllib.loads(path.read_text())
    text = dumps(data)
    assert tomllib.loads(text) == data
    if not path.stem.startswith("corpus"):      # corpus files are cases, not scenarios
        assert _same(parse_scenario(text, "x.toml"), load_scenario(path))


def test_toml_writer_strings_keys_and_tables():
    data = {"name": 'a "quoted"\\ name', "description": "two\nlines with \"\"\" and \\ and \t",
            "odd key": 1, "ctrl": "bell\x07", "x": {"y": {"z": [1.5, 2.0, -3e-09, True]}},
            "workload": {"prompt_len": {"dist": "uniform", "min": 1, "max": 9},
                         "request": [{"prompt_len": 3, "output_len": 0}, {"prompt_len": 4, "output_len": 1}]}}
    text = dumps(data)
    assert tomllib.loads(text) == data
    assert 'prompt_len = { dist = "uniform", min = 1, max = 9 }' in text
    assert text.count("[[workload.request]]") == 2


def _run(scenario: str, out, *extra) -> int:
    return main(["run", scenario, "--out", str(out), "-q", "--no-report", "--trace-level", "off", *extra])


def _minimal(tmp_path, capsys, scenario: str, *extra):
    run_dir = tmp_path / "run"
    assert _run(scenario, run_dir, *extra) == 1
    capsys.readouterr()
    assert main(["minimize", str(run_dir)]) == 0
    captured = capsys.readouterr()
    text = (run_dir / "minimal.toml").read_text()
    assert captured.out == text                      # the minimal scenario is printed ...
    assert "minimize: keeping" in captured.err and "minimize: done" in captured.err   # ... progress on stderr
    return run_dir, parse_scenario(text, "minimal.toml")


def _first(run_dir) -> dict:
    s = json.loads((run_dir / "summary.json").read_text())
    return next(b["first_finding"] for b in s["backends"].values() if b["first_finding"])


def test_b1_shrinks_to_at_most_two_requests_and_one_swa_layer(tmp_path, capsys):
    run_dir, sc = _minimal(tmp_path, capsys, str(ROOT / "scenarios/b1-pcg-dp-padding.toml"))
    reqs = sc.workload.explicit or ()
    assert 1 <= len(reqs) <= 2 and sc.workload.requests == len(reqs)
    assert sc.model.layer_kinds.count("swa") == 1 and sc.model.num_layers <= 2
    assert len(sc.backends) == 1 and sc.design == "sglang-pre-29460"
    again = tmp_path / "again"
    assert _run(str(run_dir / "minimal.toml"), again) == 1
    first = _first(again)
    kinds = dict(map(tuple, json.loads((again / "run.json").read_text())["layers"]))
    assert first["class"] == "length_mismatch" and kinds[first["layer"]] == "swa"


def test_b2_shrinks_and_still_clobbers_an_swa_layer(tmp_path, capsys):
    run_dir, sc = _minimal(tmp_path, capsys, str(ROOT / "scenarios/b2-decode-stale-tail.toml"), "--backends",
                           "xpu,musa")
    assert len(sc.workload.explicit) <= 4 and sc.model.layer_kinds == ("swa",)
    assert sc.backends == ("xpu",)
    again = tmp_path / "again"
    assert _run(str(run_dir / "minimal.toml"), again) == 1
    assert _first(again)["class"] == "clobbered"


def test_output_path_and_draft_layer_findings(tmp_path, capsys):
    run_dir = tmp_path / "b3"
    assert _run(str(ROOT / "scenarios/b3-draft-pool-size.toml"), run_dir, "--backends", "aiter") == 1
    out = tmp_path / "sub" / "b3-min.toml"
    assert main(["minimize", str(run_dir), "-o", str(out), "-q"]) == 0
    sc = parse_scenario(out.read_text(), str(out))
    assert sc.engine.speculative.enabled and sc.engine.speculative.draft_layers == ("full",)
    assert sc.workload.requests == 1
    assert "out_of_range at a draft full layer" in sc.description


def test_bad_inputs_exit_2(tmp_path, capsys):
    assert main(["minimize", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    clean = tmp_path / "clean"
    assert _run(str(ROOT / "scenarios/gap-swa-shorter.toml"), clean, "--design", "kvwriteloc-strict",
                "--backends", "triton") == 0
    assert main(["minimize", str(clean)]) == 2
    assert "no findings: nothing to minimize" in capsys.readouterr().err
    user = tmp_path / "user"
    design = str(ROOT / "examples/designs/my_fix.py") + ":StrictSlice"
    assert _run(str(ROOT / "scenarios/b1-pcg-dp-padding.toml"), user, "--design", design,
                "--backends", "triton") in (0, 1)
    run = json.loads((user / "run.json").read_text())
    summary = json.loads((user / "summary.json").read_text())
    summary["backends"]["triton"]["first_finding"] = {"step": 0, "layer": 0, "class": "missed"}
    (user / "summary.json").write_text(json.dumps(summary))
    assert run["design"] == "strict-slice"
    # scenario.toml is the scenario as run: it names the user design by its spec, which minimize imports only
    # when asked (a run directory is data you may have got from someone else)
    assert main(["minimize", str(user)]) == 2
    err = capsys.readouterr().err
    assert f"{user / 'scenario.toml'}: design: names the Python file" in err and "--allow-design-files" in err
    assert main(["minimize", str(user), "--allow-design-files"]) == 2
    err = capsys.readouterr().err
    assert "under strict-slice" in err and "does not reproduce missed at a swa layer on triton" in err
    # an older run directory (scenario.toml as the user wrote it) records only the design's name
    (user / "scenario.toml").write_text((ROOT / "scenarios/b1-pcg-dp-padding.toml").read_text())
    assert main(["minimize", str(user)]) == 2
    assert "pass --design path/to/file.py:ClassName" in capsys.readouterr().err


@pytest.fixture
def b2_run(tmp_path, capsys):
    run_dir = tmp_path / "b2"
    assert _run(str(ROOT / "scenarios/b2-decode-stale-tail.toml"), run_dir, "--backends", "xpu") == 1
    capsys.readouterr()
    return run_dir


def test_internal_error_stops_the_search_and_is_reported(b2_run, capsys, monkeypatch):
    import simulator.run as run_mod

    real = run_mod.run_simulation
    calls = []

    def flaky(sc, *a, **kw):
        calls.append(sc)
        if len(calls) == 3:
            raise RuntimeError("boom in the scheduler")
        return real(sc, *a, **kw)

    monkeypatch.setattr(run_mod, "run_simulation", flaky)
    assert main(["minimize", str(b2_run)]) == 3
    err = capsys.readouterr().err
    assert "RuntimeError: boom in the scheduler" in err and "Traceback" in err
    assert "internal error of slotscope while minimizing" in err and "not a 'does not reproduce'" in err
    assert len(calls) == 3                                   # stopped at once, no more candidates
    saved = b2_run / "minimize-error.toml"
    assert f"the candidate that triggered it is in {saved}" in err
    assert parse_scenario(saved.read_text(), str(saved)) == calls[2]
    assert not (b2_run / "minimal.toml").exists()


def test_a_design_error_finding_or_a_refused_candidate_is_not_an_internal_error(b2_run, capsys, monkeypatch):
    import simulator.run as run_mod
    from simulator.scenario import ScenarioError

    real = run_mod.run_simulation
    calls = []

    def refusing(sc, *a, **kw):
        calls.append(sc)
        if len(calls) in (2, 3):
            raise ScenarioError("candidate.toml: workload request 0 needs 9 tokens but pool.full_size is 8")
        return real(sc, *a, **kw)

    monkeypatch.setattr(run_mod, "run_simulation", refusing)
    assert main(["minimize", str(b2_run), "-q"]) == 0
    assert len(calls) > 5 and parse_scenario((b2_run / "minimal.toml").read_text()).backends == ("xpu",)


def test_a_candidate_that_stalls_the_scheduler_does_not_reproduce(b2_run, capsys, monkeypatch):
    """The scheduler's stall (pools that can never admit a waiting request) is a candidate that cannot run, as in
    fuzz: not an internal error; a given scenario that stalls is bad input, said so (exit 2)."""
    import simulator.run as run_mod
    from slotscope.minimize import STALLED

    assert f'RuntimeError("{STALLED}:' in (ROOT / "simulator" / "scheduling" / "scheduler.py").read_text()   # the real words
    real = run_mod.run_simulation
    calls = []

    def stalling(sc, *a, **kw):
        calls.append(sc)
        if len(calls) in (2, 3):
            raise RuntimeError(f"{STALLED}: waiting requests can never be admitted")
        return real(sc, *a, **kw)

    monkeypatch.setattr(run_mod, "run_simulation", stalling)
    assert main(["minimize", str(b2_run), "-q"]) == 0
    assert len(calls) > 5 and parse_scenario((b2_run / "minimal.toml").read_text()).backends == ("xpu",)
    assert not (b2_run / "minimize-error.toml").exists()
    capsys.readouterr()

    def always(sc, *a, **kw):
        raise RuntimeError(f"{STALLED}: waiting requests can never be admitted")

    monkeypatch.setattr(run_mod, "run_simulation", always)
    assert main(["minimize", str(b2_run), "-o", str(b2_run / "m2.toml")]) == 2
    err = capsys.readouterr().err
    assert "the run's scenario cannot run in-process: the scheduler stalls" in err and "Traceback" not in err
    assert not (b2_run / "m2.toml").exists() and not (b2_run / "minimize-error.toml").exists()


def test_incomplete_run_directory(b2_run, capsys):
    (b2_run / "summary.json").unlink()
    # the streamed findings still name the first finding: minimize works from them
    assert main(["minimize", str(b2_run), "-q", "-o", str(b2_run / "m.toml")]) == 0
    assert parse_scenario((b2_run / "m.toml").read_text()).model.layer_kinds == ("swa",)
    assert "has no summary.json (the run did not finish): minimizing the first finding streamed" in \
        capsys.readouterr().err
    (b2_run / "findings.jsonl").write_text("")
    assert main(["minimize", str(b2_run)]) == 2
    err = capsys.readouterr().err
    assert (f"{b2_run}: the run is incomplete: no summary.json, and findings.jsonl is empty, so there is no "
            f"finding to keep (missing: summary.json)") in err
    (b2_run / "findings.jsonl").unlink()
    (b2_run / "run.json").unlink()
    assert main(["minimize", str(b2_run)]) == 2
    err = capsys.readouterr().err
    assert "no findings.jsonl either" in err and "(missing: summary.json, run.json, findings.jsonl)" in err
    (b2_run / "scenario.toml").unlink()
    assert main(["minimize", str(b2_run)]) == 2
    err = capsys.readouterr().err
    assert f"{b2_run / 'scenario.toml'}: missing; minimize needs the scenario as run" in err
    assert main(["minimize", str(b2_run / "steps.jsonl")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_output_that_is_a_directory(b2_run, capsys):
    assert main(["minimize", str(b2_run), "-o", str(b2_run)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_candidates_are_scenario_objects_written_by_to_toml(b2_run, monkeypatch):
    """Every candidate the minimizer runs is a validated Scenario that its own TOML reads back to."""
    import simulator.run as run_mod
    from simulator.scenario import Scenario

    real = run_mod.run_simulation
    seen = []

    def spy(sc, *a, **kw):
        assert isinstance(sc, Scenario)
        assert parse_scenario(sc.to_toml(), "x.toml") == sc
        seen.append(sc)
        return real(sc, *a, **kw)

    monkeypatch.setattr(run_mod, "run_simulation", spy)
    assert main(["minimize", str(b2_run), "-q"]) == 0
    assert len(seen) > 10 and len({s.workload for s in seen}) > 3
