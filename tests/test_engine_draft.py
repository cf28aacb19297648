"""An EAGLE draft's own forwards as release code (engine_path/forward/runner.py's draft stand-in,
engine_path/forward/speculative.py's round): the draft's extend after each prefill, its decode steps (the release's
multi-step draft backend) and its DRAFT_EXTEND_V2 after each verify run through the release's backends over the
draft's own pool (a hybrid ``SWAKVPool`` for a draft with SWA layers, the plain ``MHATokenToKVPool`` for one of full
layers), its layers numbered from 0 as the release numbers them, and the target's TARGET_VERIFY through the target's;
where the release has no multi-step draft backend the draft's decode steps are the model's, with the reason; a bug put
into a backend's draft-only code is found on that backend's draft side only."""
from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.scenario.parse import load_scenario

ROOT = Path(__file__).resolve().parent.parent
PATCHES = Path(__file__).resolve().parent / "engine_patches"
BACKENDS = ("flashinfer", "triton", "flashattention", "trtllm_mha", "aiter", "xpu", "torch_native", "musa")


#: ``warm("sglang==0.5.23")`` of the session (tests/warm_engine.py), set by :func:`_warm_release`
_WARM = []


@pytest.fixture(autouse=True)
def _warm_release(warm):
    _WARM[:] = [warm("sglang==0.5.23")]


def _run(scenario: str, out: Path, *patches: str) -> tuple[int, dict, dict, list[dict]]:
    """A run forked from the session's warm servers: from the release's import, or (patched) from its dependencies'
    (the child imports the release and applies the patches, as a fresh process does)."""
    cmd = ["run", str(ROOT / "scenarios" / f"{scenario}.toml"), "--engine", "sglang==0.5.23", "--out", str(out),
           "--no-report", "-q"]
    for p in patches:
        cmd += ["--engine-patch", str(PATCHES / p)]
    p = _WARM[0].cli(*cmd)
    findings = [json.loads(x) for x in (out / "findings.jsonl").read_text().splitlines() if x]
    return (p.returncode, json.loads((out / "summary.json").read_text()), json.loads((out / "run.json").read_text()),
            findings)


def _by_side(findings: list[dict], scenario: str) -> collections.Counter:
    """Findings by (backend, class, model side): a design error names its side, the draft's layers are numbered
    after the target's."""
    n = load_scenario(ROOT / "scenarios" / f"{scenario}.toml").model.num_layers
    return collections.Counter((f["backend"], f["class"], "draft" if "(draft, " in f["message"] or f["layer"] >= n
                                else "target") for f in findings)


def _graph_paths(backend: str, side: dict, path: str, failed: str, piece: str, counts: tuple, why: str) -> None:
    """A side's forwards on ``path``: ``counts`` = (replays of the release's runner, DP-padded ones run eagerly);
    torch_native (no CUDA graphs) runs all of them eagerly, its capture's failure named under ``failed``."""
    paths = side["release_paths"]
    graphed, padded = counts
    if backend == "torch_native":
        assert path not in paths and paths[f"{path}, run eagerly"] == graphed + padded
        assert why in next(p["why"] for p in side["pieces"] if p["piece"] == f"graph path {failed}, run eagerly")
    else:
        assert paths[path] == graphed and paths.get(f"{path}, run eagerly", 0) == padded, backend
        runner = [p for p in side["pieces"] if p["piece"].startswith(piece)]
        assert [p["whose"] for p in runner] == ["engine"] and f"{graphed} replays" in runner[0]["why"], backend


def _run_in_process(scenario: str, out: Path) -> tuple[int, dict, dict, list[dict]]:
    from slotscope.cli import main

    rc = main(["run", str(ROOT / "scenarios" / f"{scenario}.toml"), "--engine", "sglang==0.5.23", "--out", str(out),
               "--no-report", "-q"])
    findings = [json.loads(x) for x in (out / "findings.jsonl").read_text().splitlines() if x]
    return rc, json.loads((out / "summary.json").read_text()), json.loads((out / "run.json").read_text()), findings


@pytest.fixture(scope="module")
def runs(tmp_path_factory, engine_releases):
    d = tmp_path_factory.mktemp("draft")
    return {name: _run_in_process(name, d / name) for name in ("paths-spec", "b3-draft-pool-size")}


#: (draft extends after a prefill, draft decodes, draft extends after a verify, target verifies) per scenario
FORWARDS = {"paths-spec": (11, 46, 23, 23), "b3-draft-pool-size": (23, 24, 12, 12)}
#: verifies replaying the target's decode runner in TARGET_VERIFY mode, and those DP-padded past their own capture
#: size (run eagerly), per scenario
VERIFY_GRAPH = {"paths-spec": (6, 12), "b3-draft-pool-size": (12, 0)}
#: draft extends after a verify replaying the release's draft-extend graph runner, and those DP-padded past their own
#: capture size (run eagerly: the runner's DP gather is not driven), per scenario
DRAFT_EXTEND_GRAPH = {"paths-spec": (9, 9), "b3-draft-pool-size": (12, 0)}
#: draft backends without a multi-step draft backend of the release, and why (the draft's decode steps are the
#: model's there): torch_native has none (DraftBackendFactory maps none); flashinfer's and trtllm_mha's assert one
#: wrapper per child, which a draft with an SWA layer (paths-spec's "FS") has not got
NO_MULTISTEP = {"paths-spec": {"torch_native": "has no multi-step draft backend",
                               "flashinfer": "__init__ (flashinfer_backend.py:482) raised AssertionError",
                               "trtllm_mha": "__init__ (flashinfer_backend.py:482) raised AssertionError"},
                "b3-draft-pool-size": {"torch_native": "has no multi-step draft backend"}}


@pytest.mark.engine
@pytest.mark.parametrize("name", sorted(FORWARDS))
def test_every_forward_of_an_eagle_round_is_the_releases_on_every_backend(runs, name):
    rc, summary, run, findings = runs[name]
    pieces = run["engine_pieces"]["backends"]
    assert sorted(pieces) == sorted(f"{b}/{side}" for b in BACKENDS for side in ("target", "draft"))
    extends, decodes, after_verify, verifies = FORWARDS[name]
    for b in BACKENDS:
        draft, target = pieces[f"{b}/draft"], pieces[f"{b}/target"]
        assert [p for p in draft["pieces"] if p["piece"] == "the whole forward"] == [], b   # its constructor ran
        assert target["model_forwards"] == {} and target["release_modes"]["target_verify"] == verifies, b
        modes = draft["release_modes"]
        assert modes["draft_extend"] == extends + after_verify, b
        why = NO_MULTISTEP[name].get(b)
        if why is None:
            assert draft["model_forwards"] == {} and modes["draft_decode"] == decodes, b
        else:
            assert "draft_decode" not in modes and list(draft["model_forwards"].values()) == [decodes], b
            assert why in next(iter(draft["model_forwards"])), b
        assert target["release_forwards"] + draft["release_forwards"] + (decodes if why else 0) == summary["steps"]
        named = {p["piece"]: p["whose"] for p in draft["pieces"] + target["pieces"]}
        assert any(k.startswith("EAGLE round: the plan") and v == "engine" for k, v in named.items()), b
        assert any(k.startswith("EAGLE round on a graph path") and v == "model" for k, v in named.items()), b
        # the draft extends after a verify on the graph path: the release's EAGLEDraftExtendCudaGraphRunner replays
        # (its capture sizes all captured at start-up); DP-padded ones and torch_native's (no CUDA graphs) eagerly
        _graph_paths(b, target, "decode_graph", "decode_graph (verify)", "verify graphs: the target's decode runner",
                     VERIFY_GRAPH[name], "get_cuda_graph_seq_len_fill_value (base_attn_backend.py:288)")
        _graph_paths(b, draft, "draft_extend_graph", "draft_extend_graph", "draft-extend graphs: EAGLEDraftExtend",
                     DRAFT_EXTEND_GRAPH[name], "init_cuda_graph_state (base_attn_backend.py:258) raised")
    got = _by_side(findings, name)
    # torch_native: the release's SDPA gathers an SWA layer at full-pool ids (IndexError: the target's hybrid extends,
    # the hybrid draft's extends) and cannot verify (its forward_extend reads the extend lengths a TARGET_VERIFY batch
    # has not got: AttributeError); xpu: P6 on the hybrid draft's SWA layer (the round's whole window's SWA ids)
    # flashinfer: 0.5.23's EAGLE verify and draft-extend SWA tables start at position 0, not at the window
    # (EagleVerifyInput / EagleDraftExtendInput.generate_attn_arg_prefill take no kv_start_idx): stale_read at every
    # verify and draft extend of a request longer than the window (docs/ENGINE.md, "flashinfer's EAGLE SWA tables");
    # aiter: 0.5.23's draft steps over a hybrid draft pool read the committed keys only (F2: paths-spec's "FS" draft;
    # b3's draft of full layers keeps a plain pool and aiter's ragged kernel, whose ids carry the step's keys)
    want = {"paths-spec": {("torch_native", "design_error", "target"): 28,
                           ("torch_native", "design_error", "draft"): 27,
                           ("xpu", "missed", "draft"): 99, ("xpu", "clobbered", "draft"): 28,
                           ("xpu", "evicted_slot", "draft"): 40,
                           ("flashinfer", "stale_read", "target"): 2016, ("flashinfer", "stale_read", "draft"): 684,
                           ("aiter", "stale_read", "draft"): 534},
            "b3-draft-pool-size": {("torch_native", "design_error", "target"): 19,
                                   ("flashinfer", "stale_read", "target"): 1332}}[name]
    assert got == want and rc == 1
    raised = collections.Counter((f["message"].split(" raised ")[1].split(":")[0], f["message"].split("mode ")[1]
                                  .split(",")[0]) for f in findings if f["class"] == "design_error")
    assert raised == {"paths-spec": {("IndexError", "extend"): 5, ("AttributeError", "target_verify"): 23,
                                     ("IndexError", "draft_extend"): 27},
                      "b3-draft-pool-size": {("IndexError", "extend"): 7, ("AttributeError", "target_verify"): 12}
                      }[name]


@pytest.mark.slow
@pytest.mark.engine
def test_a_bug_in_a_backends_draft_pool_resolution_is_found_on_that_draft_only(tmp_path, engine_releases):
    rc, summary, run, findings = _run("paths-spec", tmp_path / "patched", "flashinfer-draft-drops-its-swa-pool.yaml")
    assert rc == 1
    rec = summary["engine"]["patches"]
    assert [x["applied_by"] for x in rec] == ["slotscope"] and "static or class method" in rec[0]["why"]
    got = _by_side(findings, "paths-spec")
    # the draft's flashinfer never translates: its SWA layer hands the pool no swa_loc (the hybrid pool asserts one)
    # at every one of its extends (11 after a prefill, 23 after a verify), and its SWA table reads the SWA pool at
    # full-pool ids (stale reads at the extends after a prefill; the rest its draft extends after a verify,
    # which read from position 0 unpatched too); the target's verifies as unpatched
    assert {k: n for k, n in got.items() if k[0] == "flashinfer"} == {
        ("flashinfer", "stale_read", "draft"): 1420, ("flashinfer", "design_error", "draft"): 34,
        ("flashinfer", "stale_read", "target"): 2016}
    assert {k: n for k, n in got.items() if k[0] != "flashinfer"} == {
        ("torch_native", "design_error", "target"): 28, ("torch_native", "design_error", "draft"): 27,
        ("xpu", "missed", "draft"): 99, ("xpu", "clobbered", "draft"): 28, ("xpu", "evicted_slot", "draft"): 40,
        ("aiter", "stale_read", "draft"): 534}


@pytest.mark.slow
@pytest.mark.engine
def test_bugs_in_a_backends_draft_steps_are_found_on_that_backend_only(tmp_path, engine_releases):
    """Two plausible bugs in the release's EAGLE round, one run: triton's multi-step draft binds every step's SWA
    write ids to the window's first column (a draft write location), flashattention's draft-step metadata reads a
    table one position short (musa inherits it); each is found on its own backends' draft side only."""
    rc, summary, run, findings = _run("p6-draft-step-swa", tmp_path / "patched",
                                      "triton-draft-step-swa-column-zero.yaml", "fa-draft-step-reads-one-short.yaml")
    assert rc == 1
    rec = summary["engine"]["patches"]
    # triton's target is a contextmanager (a decorated function): our patcher applies it
    assert [x["applied_by"] for x in rec] == ["slotscope", "sglang"] and "decorated" in rec[0]["why"]
    assert _by_side(findings, "p6-draft-step-swa") == {
        ("triton", "missed", "draft"): 43, ("triton", "clobbered", "draft"): 43,          # steps 1.. at column 0
        ("flashattention", "stale_read", "draft"): 234, ("musa", "stale_read", "draft"): 234,
        # as unpatched: P6 live on xpu, torch_native cannot verify, flashinfer's verifies read SWA from position 0
        ("xpu", "missed", "draft"): 74, ("xpu", "clobbered", "draft"): 16, ("xpu", "evicted_slot", "draft"): 40,
        ("torch_native", "design_error", "target"): 12, ("flashinfer", "stale_read", "target"): 1080,
        ("aiter", "stale_read", "draft"): 355}                      # F2, live as unpatched


@pytest.mark.slow
@pytest.mark.engine
def test_bugs_in_a_rounds_graph_runners_are_found(tmp_path, engine_releases):
    """Two plausible bugs, one run: the release's EAGLEDraftExtendCudaGraphRunner.execute with out_cache_loc left
    out of its refill (every replay writes at the previous replay's slots), found on the seven backends whose
    draft-extend graph is the release's runner; triton's verify-graph window built one short, found on triton's
    verifies. torch_native (no CUDA graphs) and xpu (P6, live) as without the patches. Then B4 is real:
    0.5.23 with #29858's window indices removed from triton's draft-extend graph metadata reads stale windows."""
    rc, summary, run, findings = _run("b4-draft-extend-window", tmp_path / "patched",
                                      "draft-extend-graph-keeps-old-loc.yaml",
                                      "triton-verify-graph-window-one-short.yaml")
    assert rc == 1
    got = collections.Counter((f["backend"], f["class"]) for f in findings)
    stale = {"missed": 72, "clobbered": 4, "evicted_slot": 9}
    # full pool: the first replay of a size writes at the buffer's initial ones (slot 1), later ones at the previous
    # replay's slots; SWA pool: flashattention, trtllm_mha, aiter and musa translate the static (stale) loc, whose
    # slot 1 has no SWA peer (padding slot 0), while flashinfer's and triton's SWA write ids stay right
    want = {(b, c): n for b in ("flashinfer", "triton", "flashattention", "trtllm_mha", "aiter", "musa")
            for c, n in stale.items()}
    want.update({(b, "padding_slot"): 72 for b in ("flashattention", "trtllm_mha", "aiter", "musa")})
    # triton's verify graphs' window one position short: its target's verifies read one before the window
    want[("triton", "stale_read")] = 1152
    # as unpatched: flashinfer's verifies and draft extends read SWA from position 0 (F1), aiter's draft steps the
    # committed keys only (F2)
    want[("flashinfer", "stale_read")] = 2592
    want[("aiter", "stale_read")] = 324
    want.update({("xpu", "missed"): 131, ("xpu", "clobbered"): 22, ("xpu", "evicted_slot"): 32,
                 ("xpu", "padding_slot"): 144, ("torch_native", "design_error"): 48})
    assert got == want
    out = tmp_path / "bugs.json"
    p = subprocess.run([sys.executable, "-m", "slotscope", "bugs", "--engine", "sglang", "--only", "B4",
                        "--json", str(out), "-q"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    (b4,) = json.loads(out.read_text())
    assert (b4["real"], b4["holds"], b4["buggy"], b4["fixed"]) == (
        True, True, "sglang==0.5.23 + revert-29858-draft-extend-window.yaml", "sglang==0.5.23")


@pytest.mark.slow
@pytest.mark.engine
def test_f1_flashinfers_verify_swa_tables_are_the_releases(tmp_path, engine_releases):
    """F1 (sglang#39287, live in 0.5.23) through the release's own read tables: flashinfer's eager TARGET_VERIFY
    packs each request's SWA ids from position 0, so its target's SWA layers read the window at the request's
    first slots; the shipped fix (the window start handed through) makes flashinfer clean and changes nothing
    else; `bugs --engine` counts F1 real."""
    fix = ROOT / "examples" / "engine-patches" / "fix-39287-flashinfer-eagle-swa-start.yaml"
    rc, _, run, buggy = _run("f1-flashinfer-round-swa-reads", tmp_path / "buggy")
    assert rc == 1
    fi = [f for f in buggy if f["backend"] == "flashinfer"]
    # one per position of the kernels' window span (36) per (verify, request past its window): 38 of them; the
    # draft extend is eager here, planned as a plain extend (from the window), so only the target's SWA layers
    assert collections.Counter((f["class"], f["layer"]) for f in fi) == {("stale_read", 0): 1368}
    assert "the slot was reassigned to another token (req 0 pos 0)" in fi[0]["message"]
    assert run["engine_pieces"]["backends"]["flashinfer/target"]["release_modes"]["target_verify"] == 10
    rc, _, _, fixed = _run("f1-flashinfer-round-swa-reads", tmp_path / "fixed", str(fix))
    assert rc == 1                           # xpu's P6 and torch_native's missing verify stay
    rest = collections.Counter((f["backend"], f["class"]) for f in buggy if f["backend"] != "flashinfer")
    assert collections.Counter((f["backend"], f["class"]) for f in fixed) == rest
    assert rest == {("xpu", "missed"): 66, ("xpu", "clobbered"): 15, ("xpu", "evicted_slot"): 32,
                    ("torch_native", "design_error"): 10, ("aiter", "stale_read"): 342}      # P6 and F2, live


@pytest.mark.slow
@pytest.mark.engine
def test_f2_aiters_draft_steps_read_the_keys_its_kernel_is_handed(tmp_path, engine_releases):
    """F2 (live in 0.5.23): aiter's multi-step draft over a hybrid draft pool hands unified_attention the round's
    committed seq_lens for a block table of the step's seq_lens + step + 1 keys; its read tables take the key count
    the kernel was handed, so the release's findings are the model twin's, finding for finding, and the shipped
    fix (the step's key counts handed through) makes aiter clean and changes nothing else."""
    from slotscope.cli import main

    fix = ROOT / "examples" / "engine-patches" / "fix-f2-aiter-draft-step-keys.yaml"
    rc, _, _, buggy = _run("f2-aiter-draft-step-keys", tmp_path / "buggy")
    assert rc == 1
    model = tmp_path / "model"
    assert main(["run", str(ROOT / "scenarios" / "f2-aiter-draft-step-keys.toml"), "--backends", "aiter", "--out",
                 str(model), "--no-report", "-q"]) == 1
    twin = [json.loads(x) for x in (model / "findings.jsonl").read_text().splitlines() if x]
    mine = [f for f in buggy if f["backend"] == "aiter"]
    assert len(mine) == 162 and mine == twin
    assert {(f["layer"], f["kind"]) for f in mine} == {(4, "full"), (5, "swa")}       # the draft's two layers
    rc, _, _, fixed = _run("f2-aiter-draft-step-keys", tmp_path / "fixed", str(fix))
    assert rc == 1                           # xpu's P6 and torch_native's missing verify stay
    rest = collections.Counter((f["backend"], f["class"]) for f in buggy if f["backend"] != "aiter")
    assert collections.Counter((f["backend"], f["class"]) for f in fixed) == rest
    assert rest == {("xpu", "missed"): 47, ("xpu", "clobbered"): 12, ("xpu", "evicted_slot"): 20,
                    ("torch_native", "design_error"): 7}
