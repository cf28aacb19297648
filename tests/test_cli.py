"""The `slotscope run` command: outputs, summary shape, determinism, exit codes, bad input."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.records import FINDING_CLASSES
from slotscope.cli import main

from helpers import ROOT

B1 = str(ROOT / "scenarios/b1-pcg-dp-padding.toml")
B4 = str(ROOT / "scenarios/b4-draft-extend-window.toml")
SMOKE = str(ROOT / "scenarios/smoke.toml")


def run(*args) -> int:
    return main(["run", *args, "-q", "--no-report", "--trace-level", "off"])


def test_summary_has_the_shape_other_tools_rely_on(tmp_path):
    assert run(B4, "--out", str(tmp_path), "--backends", "flashinfer,triton") == 1
    s = json.loads((tmp_path / "summary.json").read_text())
    assert isinstance(s["scenario"], str) and isinstance(s["design"], str) and isinstance(s["seed"], int)
    assert set(s["backends"]) == {"flashinfer", "triton"}
    for b in s["backends"].values():
        assert isinstance(b["writes"], int) and b["writes"] > 0
        assert list(b["findings"]) == list(FINDING_CLASSES)
        assert b["first_finding"] is None or set(b["first_finding"]) == {"step", "layer", "class"}
    assert s["backends"]["flashinfer"]["first_finding"] is None
    assert s["backends"]["triton"]["first_finding"] == {"step": 58, "layer": 5, "class": "out_of_range"}
    lines = (tmp_path / "findings.jsonl").read_text().splitlines()
    assert len(lines) == sum(sum(b["findings"].values()) for b in s["backends"].values())
    f = json.loads(lines[0])
    assert {"step", "backend", "layer", "subpool", "slot", "class", "expected", "observed"} <= set(f)


def test_exit_zero_when_clean(tmp_path):
    assert run(B1, "--design", "sglang-post-29460", "--out", str(tmp_path), "--backends", "triton") == 0


def test_same_seed_same_outputs_byte_for_byte(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        run(str(ROOT / "scenarios/b2-decode-stale-tail.toml"), "--out", str(d), "--backends", "xpu,musa")
    for name in ("summary.json", "findings.jsonl", "steps.jsonl", "shapes.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    c = tmp_path / "c"
    run(str(ROOT / "scenarios/b2-decode-stale-tail.toml"), "--out", str(c), "--backends", "xpu,musa", "--seed", "5")
    assert (a / "steps.jsonl").read_bytes() != (c / "steps.jsonl").read_bytes()


def test_user_design_from_file(tmp_path):
    design = str(ROOT / "examples/designs/my_fix.py") + ":StrictSlice"
    assert run(str(ROOT / "scenarios/gap-swa-shorter.toml"), "--design", design, "--out", str(tmp_path)) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["design"] == "strict-slice"


@pytest.mark.parametrize("design, needle", [
    ("nope", "unknown design 'nope'"),
    ("vllm-skip-1", "design 'vllm-skip-1' is now 'sglang-skip-minus-1'"),
    ("missing.py:X", "does not exist"),
    ("examples/designs/my_fix.py:Nope", "has no class 'Nope'"),
])
def test_bad_design_exit_2(tmp_path, capsys, design, needle):
    if design.startswith("examples"):
        design = str(ROOT / design)
    assert run(SMOKE, "--design", design, "--out", str(tmp_path)) == 2
    assert needle in capsys.readouterr().err


BAD = [
    ("[pool]\nfull_size = 64\n[workload]\nrequests = 1\n", "model: table is required"),
    ('[model]\npreset = "gpt-5"\n[pool]\nfull_size = 64\n[workload]\nrequests = 1\n',
     "model.preset: 'gpt-5' is not allowed (allowed: gpt-oss-120b, gpt-oss-20b, llama4, mimo-v2-flash, gemma4-31b)"),
    ('[model]\npreset = "llama4"\nkv_dtype = "int4"\n[pool]\nfull_size = 64\n[workload]\nrequests = 1\n',
     "model.kv_dtype: 'int4' is not allowed (allowed: bf16, fp16, fp8_e4m3)"),
    ('[model]\npreset = "llama4"\n[pool]\nfull_size = "big"\n[workload]\nrequests = 1\n',
     "pool.full_size: must be an integer"),
    ('[model]\npreset = "llama4"\n[pool]\nfull_size = 64\nswa_ratio = 2.0\n[workload]\nrequests = 1\n',
     "pool.swa_ratio: must be <= 1.0"),
    ('[model]\npreset = "llama4"\n[pool]\nfull_size = 64\n[workload]\nrequests = 1\narival = "poisson"\n',
     "workload.arival: unknown key"),
    ('[model]\npreset = "llama4"\n[pool]\nfull_size = 64\n[workload]\nrequests = 1\n'
     'prompt_len = { dist = "zipf" }\n', "workload.prompt_len.dist: 'zipf' is not allowed (allowed: fixed, uniform"),
    ('backends = ["flashinfer", "cudnn"]\n[model]\npreset = "llama4"\n[pool]\nfull_size = 64\n[workload]\nrequests = 1\n',
     "backends[1]: 'cudnn' is not a modelled backend (allowed: flashinfer"),
    ('[model]\npreset = "llama4"\n[pool]\nfull_size = 64\n[workload]\nrequests = 1\n[engine]\ncuda_graph_bs = [8, 4]\n',
     "engine.cuda_graph_bs: must be strictly increasing"),
    ('[model]\nlayers = "SFX"\nwindow = 4\n[pool]\nfull_size = 64\n[workload]\nrequests = 1\n',
     "model.layers: layer pattern may hold only 'S' (swa) and 'F' (full), found 'X'"),
    ('[model\npreset = 1', "not valid TOML"),
    ('[model]\npreset = "gpt-oss-20b"\n[pool]\nfull_size = 64\n[workload]\nrequests = 1\nprompt_len = 500\n',
     "workload request 0 needs 516 tokens but pool.full_size is 64"),
]


@pytest.mark.parametrize("text, needle", BAD)
def test_bad_scenario_exit_2_names_the_field(tmp_path, capsys, text, needle):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    assert run(str(p), "--out", str(tmp_path / "o")) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert str(p) in err


def test_missing_file_exit_2(tmp_path, capsys):
    assert run(str(tmp_path / "nope.toml")) == 2
    assert "cannot read scenario file" in capsys.readouterr().err


def test_console_script_runs_and_prints_table(tmp_path):
    exe = Path(sys.executable).with_name("slotscope")
    out = subprocess.run([str(exe), "run", B1, "--out", str(tmp_path), "--backends", "trtllm_mha,musa",
                          "--no-report", "--trace-level", "off"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr
    assert "trtllm_mha" in out.stdout and "len_mism" in out.stdout and "1/0/length_mismatch" in out.stdout
    assert (tmp_path / "summary.json").exists() and (tmp_path / "findings.jsonl").exists()


def test_help_answers_questions(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for word in ("--design", "--backends", "--out", "--seed", "--device", "exit codes"):
        assert word in text


def test_crash_keeps_partial_outputs(tmp_path, capsys, monkeypatch):
    """slotscope itself failing mid-run (a design's exception is a design_error finding, not a crash)."""
    from slotscope import outputs

    on_step = outputs.StreamingOutputs.on_step

    def failing(self, step):
        if step.step >= 20:
            raise RuntimeError("boom inside slotscope")
        on_step(self, step)

    monkeypatch.setattr(outputs.StreamingOutputs, "on_step", failing)
    out = tmp_path / "o"
    rc = run(str(ROOT / "scenarios/b2-decode-stale-tail.toml"), "--out", str(out))
    assert rc == 3
    err = capsys.readouterr().err
    assert "boom inside slotscope" in err and "partial outputs" in err
    s = json.loads((out / "summary.json").read_text())
    assert s["incomplete"]["error"].startswith("RuntimeError") and s["incomplete"]["steps_done"] > 0
    # the findings and steps up to the crash were streamed to disk
    monkeypatch.setattr(outputs.StreamingOutputs, "on_step", on_step)
    steps = (out / "steps.jsonl").read_text().splitlines()
    findings = (out / "findings.jsonl").read_text().splitlines()
    assert len(steps) == s["incomplete"]["steps_done"]
    assert len(findings) == sum(sum(b["findings"].values()) for b in s["backends"].values()) > 0


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_that_lands_as_a_step_line_is_written_leaves_each_step_once(tmp_path, capsys, monkeypatch, sig, code):
    """The race CI once hit (937 lines for 936 steps): a signal right after a step's line reached the file but
    before it was counted made the partial outputs write that step again."""
    from slotscope import outputs

    write_all, lines = outputs._write_all, []

    def signalled(fd, data):
        write_all(fd, data)
        if b'"mode"' in data:                     # a steps.jsonl line
            lines.append(data)
            if len(lines) == 5:
                os.kill(os.getpid(), sig)         # the handler runs at the next bytecode it can

    monkeypatch.setattr(outputs, "_write_all", signalled)
    out = tmp_path / "o"
    rc = run(str(ROOT / "scenarios/b2-decode-stale-tail.toml"), "--out", str(out))
    monkeypatch.setattr(outputs, "_write_all", write_all)
    assert rc == code
    s = json.loads((out / "summary.json").read_text())
    steps = [json.loads(l)["step"] for l in (out / "steps.jsonl").read_text().splitlines()]
    assert steps == list(range(len(steps))) and len(steps) == s["incomplete"]["steps_done"] == s["steps"] >= 5


def test_an_engine_verdict_line_names_the_release_its_patches_and_the_design_it_replaced():
    from slotscope.cli import _engine_verdict_line

    eng = {"name": "sglang", "version": "0.5.23", "replaces_design": "sglang-pre-29460",
           "patches": [{"path": "examples/engine-patches/revert-29460.yaml", "sha256": "ab" * 32, "applied_by": "x"}]}
    assert _engine_verdict_line(eng, 144, False) == (
        "verdict: 144 finding(s), about sglang 0.5.23 patched with examples/engine-patches/revert-29460.yaml's own "
        "code (run instead of the scenario's design sglang-pre-29460)")
    assert _engine_verdict_line({"name": "sglang", "version": "0.5.14"}, 0, True) == (
        "verdict: no findings in the steps that ran (incomplete), about sglang 0.5.14's own code")
    # whose scheduler made the batches: the release's own, or slotscope's model of it (never claimed more)
    assert _engine_verdict_line({"name": "sglang", "version": "0.5.23", "scheduler": "release"}, 0, False) == (
        "verdict: no findings, about sglang 0.5.23's own code; its own scheduler made the batches")
    assert _engine_verdict_line({"name": "sglang", "version": "0.5.14", "scheduler": "model"}, 3, False) == (
        "verdict: 3 finding(s), about sglang 0.5.14's own code; slotscope's model of its scheduler made the batches")
