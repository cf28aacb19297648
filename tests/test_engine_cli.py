"""`slotscope run SCENARIO --engine sglang==X` through the real CLI: B1 in the real code of 0.5.14 (no
`__post_init__` slice), none in 0.5.15 and 0.5.23, the post-fix gap (swa_loc shorter than loc) still failing
in 0.5.23; what the outputs say of the engine; bad input (exit 2, one line, never a traceback).

The four engine runs are started two at a time: 0.5.15's a subprocess of its own (it imports the release:
10-30 s), the others ``python -m slotscope run`` in a child forked from the session's one import of their
release (tests/warm_engine.py); the tests read their output directories. Counts follow from the scenarios
(docs/ENGINE.md, "B1 and its gap in the real code"): B1 has 18 SWA-layer writes whose swa_loc is 3 longer
than loc per backend; no backend slices its own swa_loc, so all 8 mismatch in 0.5.14.
"""
from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import slotscope_cli

ROOT = Path(__file__).resolve().parent.parent
B1 = "scenarios/b1-pcg-dp-padding.toml"
GAP = "scenarios/gap-swa-shorter.toml"
ALL = ("flashinfer", "triton", "flashattention", "trtllm_mha", "aiter", "xpu", "torch_native", "musa")

#: (scenario, release) -> exact findings per backend and class
PINNED = {
    ("b1", "0.5.14"): {b: {"length_mismatch": 18} for b in ALL},
    ("b1", "0.5.15"): {b: {} for b in ALL},
    ("b1", "0.5.23"): {b: {} for b in ALL},
    # aiter's store kernel maps each slot of the whole loc itself (no KVWriteLoc on a hybrid pool): no gap there
    ("gap", "0.5.23"): {b: {} if b == "aiter" else {"length_mismatch": 12} for b in ALL},
}
EXIT = {("b1", "0.5.14"): 1, ("b1", "0.5.15"): 0, ("b1", "0.5.23"): 0, ("gap", "0.5.23"): 1}


def slotscope(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return slotscope_cli(*args, env=env, timeout=timeout)


#: the run that stays a fresh process (its release's one import this session); the other three run in a child
#: forked from the session's one import of their release (tests/warm_engine.py)
FRESH = ("b1", "0.5.15")


@pytest.fixture(scope="module")
def engine_runs(warm, tmp_path_factory):
    """{(scenario, release): (CompletedProcess, out dir)} of the four CLI runs, run two at a time."""
    from engine_path.releases import EngineSpec, fetch

    fetch(EngineSpec("sglang", "0.5.15"))
    base = tmp_path_factory.mktemp("engine-runs")
    paths = {"b1": B1, "gap": GAP}

    def one(key):
        name, version = key
        out = base / f"{name}-{version}"
        argv = ("run", paths[name], "--engine", f"sglang=={version}", "--out", str(out))
        proc = slotscope(*argv) if key == FRESH else warm(f"sglang=={version}").cli(*argv, cwd=ROOT, timeout=600)
        return key, (proc, out)

    with ThreadPoolExecutor(2) as ex:
        return dict(ex.map(one, PINNED))


pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.mark.parametrize("key", list(PINNED), ids=lambda k: f"{k[0]}-{k[1]}")
def test_engine_run_pinned_counts(engine_runs, key):
    proc, out = engine_runs[key]
    assert proc.returncode == EXIT[key], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    if key == FRESH:           # the freeze of the release's objects is undone at exit: no teardown leak reports
        assert "leaked" not in proc.stderr, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    got = {b: {c: n for c, n in st["findings"].items() if n} for b, st in summary["backends"].items()}
    assert got == PINNED[key]
    assert summary["findings_total"] == sum(n for f in PINNED[key].values() for n in f.values())
    assert summary["engine"]["name"] == "sglang" and summary["engine"]["version"] == key[1]
    assert Path(summary["engine"]["path"]).name == "sglang" and Path(summary["engine"]["path"]).is_dir()
    assert f"engine sglang {key[1]} from" in proc.stderr


def test_b1_0514_the_findings_are_the_release_shape_error(engine_runs):
    _, out = engine_runs[("b1", "0.5.14")]
    first = json.loads((out / "findings.jsonl").read_text().splitlines()[0])
    assert (first["step"], first["backend"], first["layer"], first["kind"], first["class"]) == \
        (1, "flashinfer", 0, "swa", "length_mismatch")
    # torch's own error from the release's CPU fallback store (k_cache[swa_loc] = k): 51 real rows against
    # the 1,048 entries of the unsliced, DP-padded swa_loc
    assert first["message"] == ("RuntimeError: shape mismatch: value tensor of shape [51, 1, 16] cannot be "
                                "broadcast to indexing result of shape [1048, 1, 16]")


def test_the_verdict_names_the_release_it_is_about(engine_runs):
    """--engine replaces B1's own design (sglang-pre-29460): the table line, summary.json and the report's verdict
    say the verdict is about the release's code."""
    for version, findings, verdict in (("0.5.14", "144 finding(s)", "Not clean: 8 of 8"),
                                       ("0.5.23", "no findings", "Clean: on all 8")):
        proc, out = engine_runs[("b1", version)]
        assert json.loads((out / "summary.json").read_text())["engine"]["replaces_design"] == "sglang-pre-29460"
        assert (f"verdict: {findings}, about sglang {version}'s own code (run instead of the scenario's design "
                f"sglang-pre-29460)") in proc.stdout
        page = (out / "report.html").read_text()
        assert (f"About sglang {version}&#39;s own code, run instead of the scenario&#39;s design sglang-pre-29460; "
                f"slotscope&#39;s model of its scheduler made the batches. {verdict}") in page


def test_engine_outputs_name_the_release(engine_runs):
    proc, out = engine_runs[("b1", "0.5.14")]
    run = json.loads((out / "run.json").read_text())
    assert run["engine"]["version"] == "0.5.14" and run["engine_release"] == "sglang==0.5.14"
    assert run["device"] == "cpu" and run["design"] == "sglang-0.5.14"
    rows = run["engine_pieces"]["rows"]
    engine = [r["piece"] for r in rows if r["whose"] == "engine"]
    assert "SWATokenToKVPoolAllocator" in engine
    assert "SWAKVPool.set_kv_buffer (CPU fallback k_cache[loc] = k on cpu)" in engine      # the store that ran
    assert run["engine_pieces"]["device"] == "cpu" and run["engine_pieces"]["store"]["skip_index"] is None
    # the graph static-buffer refresh: the release's where a CPU can call it, counted per run. B1's decode
    # steps replay the decode graph 7 times per backend: every loc buffer is the release's registry slot
    # (7 x 8), the SWA buffer the release's on triton (7) and the model's on the other seven backends (49)
    assert any(p.startswith("CudaGraphBufferRegistry.fill_from") for p in engine)
    assert any(p.startswith("TritonAttnBackend._fill_cuda_graph_swa_out_cache_loc") for p in engine)
    assert run["engine_pieces"]["graph_buffer_refreshes"] == {"loc": {"engine": 56, "model": 0},
                                                              "swa": {"engine": 7, "model": 49}}
    assert "KVWriteLoc" in engine and "KVWriteLoc.__post_init__" not in engine      # 0.5.14 has no slice
    # the release's scheduler is driven for 0.5.23 only: the model's made the batches, and the run says why
    assert any(r["whose"] == "slotscope" and r["piece"].startswith("scheduler (sglang 0.5.14's Scheduler is not "
                                                                   "driven here") for r in rows)
    assert run["engine_pieces"]["scheduler_choice"]["scheduler"] == "model"
    assert run["engine_pieces"]["scheduler_choice"]["asked"] == "auto" and run["sources"]["scheduler"] == "model"
    assert run["engine_pieces"]["features"]["has_post_init_slice"] is False
    # the scenario as run records the engine, and reads back
    from simulator.scenario import load_scenario

    assert load_scenario(out / "scenario.toml").engine_release == "sglang==0.5.14"
    # the trace's resource attributes
    line = json.loads((out / "trace.otlp.jsonl").read_text().splitlines()[0])
    attrs = {a["key"]: a["value"] for a in line["resourceSpans"][0]["resource"]["attributes"]}
    assert attrs["slotscope.engine.name"] == {"stringValue": "sglang"}
    assert attrs["slotscope.engine.version"] == {"stringValue": "0.5.14"}
    assert attrs["slotscope.engine.path"]["stringValue"] == run["engine"]["path"]
    # the report: header and the pieces table, from run.json (engine_path's list)
    html = (out / "report.html").read_text()
    assert "engine sglang 0.5.14" in html and "Which pieces were the engine" in html
    for piece in engine:
        assert piece in html
    new = json.loads((engine_runs[("b1", "0.5.23")][1] / "run.json").read_text())
    assert "KVWriteLoc.__post_init__" in [r["piece"] for r in new["engine_pieces"]["rows"]]


def test_model_run_summary_has_engine_null(tmp_path):
    proc = slotscope("run", B1, "--backends", "triton", "--out", str(tmp_path / "m"), "--no-report",
                     "--trace-level", "off", "-q")
    assert proc.returncode == 1, proc.stderr
    assert json.loads((tmp_path / "m" / "summary.json").read_text())["engine"] is None
    assert json.loads((tmp_path / "m" / "run.json").read_text())["engine"] is None


# ------------------------------------------------------------------------------ bad input (exit 2)

def _one_line_error(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    err = [l for l in proc.stderr.splitlines() if l.startswith("slotscope: error:")]
    assert err, proc.stderr
    for n in needles:
        assert n in proc.stderr, (n, proc.stderr)


@pytest.mark.parametrize("spec, needle", [
    ("trtllm", "unknown engine 'trtllm'"),
    ("sglang>=0.5", "only '==' is supported"),
    ("sglang==latest", "is not a release version"),
])
def test_bad_engine_spec(tmp_path, spec, needle):
    """Refused while the command line is read (slotscope/options.py): argparse's usage error, naming the option."""
    proc = slotscope("run", B1, "--engine", spec, "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    err = [l for l in proc.stderr.splitlines() if l.startswith("slotscope run: error: argument --engine: ")]
    assert err and needle in err[0] and repr(spec) in err[0], proc.stderr
    assert not (tmp_path / "o").exists()


def test_engine_with_cuda_here_or_design_is_refused(tmp_path):
    """--device cuda composes with --engine (tests/test_gpu.py runs it on a GPU); here there is no CUDA."""
    import torch

    if not torch.cuda.is_available():
        _one_line_error(slotscope("run", B1, "--engine", "sglang==0.5.14", "--device", "cuda", "--out", str(tmp_path)),
                        "--device cuda: no CUDA device is available here")
    _one_line_error(slotscope("run", B1, "--engine", "sglang==0.5.14", "--geometry", "real", "--out", str(tmp_path)),
                    "--geometry real with --engine")
    _one_line_error(slotscope("run", B1, "--engine", "sglang==0.5.14", "--design", "sglang-post-29460",
                              "--out", str(tmp_path)), "--design sglang-post-29460 with --engine")


def test_scenario_engine_release_is_checked(tmp_path):
    sc = tmp_path / "s.toml"
    sc.write_text('engine_release = "sglang~=0.5"\n' + (ROOT / B1).read_text())
    _one_line_error(slotscope("run", str(sc), "--out", str(tmp_path / "o")), f"{sc}: engine_release")


def test_unknown_version(tmp_path):
    env = {"SLOTSCOPE_CACHE": str(tmp_path / "cache")}
    _one_line_error(slotscope("run", B1, "--engine", "sglang==0.0.99", "--out", str(tmp_path / "o"), env=env),
                    "unknown version: sglang==0.0.99 is not on the package registry")


def test_unreachable_registry(tmp_path):
    env = {"SLOTSCOPE_CACHE": str(tmp_path / "cache"), "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
           "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "", "PIP_NO_INDEX": "", "PIP_RETRIES": "0",
           "PIP_TIMEOUT": "2", "PIP_CONFIG_FILE": os.devnull}
    _one_line_error(slotscope("run", B1, "--engine", "sglang==0.5.14", "--out", str(tmp_path / "o"), env=env),
                    "could not fetch sglang==0.5.14", "cannot be reached")


def _fake_sglang(root: Path, init: str) -> dict:
    pkg = root / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(init)
    return {"PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_installed_sglang_whose_import_fails(tmp_path):
    env = _fake_sglang(tmp_path / "site", "raise ImportError('libfoo.so: cannot open shared object file')\n")
    _one_line_error(slotscope("run", B1, "--engine", "sglang", "--out", str(tmp_path / "o"), env=env),
                    "importing the installed sglang failed", "libfoo.so")


def test_installed_sglang_with_an_unknown_api(tmp_path):
    env = _fake_sglang(tmp_path / "site", "__version__ = '9.9.9'\n")
    _one_line_error(slotscope("run", B1, "--engine", "sglang", "--out", str(tmp_path / "o"), env=env),
                    "the adapter does not know this API", "sglang.srt")


def test_pd_decode_scenario_on_a_release_without_its_model_is_refused_before_the_import(tmp_path):
    """A PD decode node's scenario with --engine sglang==0.5.14: slotscope models the row free of 0.5.23's decode
    node only (the mid-2026 node's free paths are the model's A1 / A2 switches): refused before the release is
    fetched or imported (--engine sglang==0.5.23 runs it: tests/test_conform.py, tests/test_engine_pd.py)."""
    proc = slotscope("run", "scenarios/a2-pd-decode-swa-tail.toml", "--engine", "sglang==0.5.14", "--out",
                     str(tmp_path / "o"))
    _one_line_error(proc, "a2-pd-decode-swa-tail.toml: engine.pd_decode with --engine sglang==0.5.14: slotscope has "
                          "no model of that release's PD decode node")
    assert "importing" not in proc.stderr
