"""The release's own forward in the loop (engine_path/forward): its backends' metadata, write locations and read
tables on the eager path and through its CUDA-graph runners (decode graphs, prefill graphs), and a bug put into
that code is not clean."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slotscope.cli import main

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parent.parent
PATCHES = Path(__file__).resolve().parent / "engine_patches"
SPEC = "sglang==0.5.23"
BACKENDS = "triton,torch_native"

#: DP-padded eager extends: attention-TP size 2 aligns an odd token count up by one (0.5.23's SUM_LEN extend), and
#: without prefill graphs every extend runs eagerly, narrowed per layer by ``padded_extend_real_tokens``
DP_EAGER = """name = "dp-eager-extend"
description = "DP-padded eager extends (attention-TP alignment), no graphs."
seed = 29460
design = "sglang-post-29460"

[model]
preset = "gpt-oss-20b"
num_layers = 4

[pool]
full_size = 4096

[workload]
requests = 6
arrival = "all_at_once"
prompt_len = { dist = "uniform", min = 41, max = 301 }
output_len = { dist = "uniform", min = 2, max = 6 }

[engine]
chunked_prefill_size = 1024
dp_size = 2
attn_tp_size = 2
dp_other_tokens = { dist = "uniform", min = 200, max = 1500 }
cuda_graph = false
"""


def _scenario(tmp_path, name: str) -> Path:
    if name == "dp-eager":
        p = tmp_path / "dp-eager.toml"
        p.write_text(DP_EAGER)
        return p
    return ROOT / "scenarios" / f"{name}.toml"


def _outputs(out: Path) -> tuple[dict, dict, list]:
    summary = json.loads((out / "summary.json").read_text())
    pieces = json.loads((out / "run.json").read_text())["engine_pieces"]
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    return summary, pieces, steps


def _run(tmp_path, name: str) -> tuple[int, dict, dict, list]:
    """An unpatched run in this process (one release per process: 0.5.23 for every test here)."""
    out = tmp_path / name
    rc = main(["run", str(_scenario(tmp_path, name)), "--engine", SPEC, "--backends", BACKENDS, "--out", str(out),
               "--no-report", "-q"])
    return (rc, *_outputs(out))


#: ``warm(SPEC)`` of the session (tests/warm_engine.py), set by :func:`_warm_release`
_WARM = []


@pytest.fixture(autouse=True)
def _warm_release(warm):
    _WARM[:] = [warm(SPEC)]


def _patched(tmp_path, name: str, patch: str) -> tuple[int, dict, dict, list]:
    """A run with an engine patch, forked from the release's dependency server (its child imports the release and
    applies the patch, as a fresh process does; tests/warm_engine.py)."""
    out = tmp_path / "patched"
    p = _WARM[0].cli("run", str(_scenario(tmp_path, name)), "--engine", SPEC, "--backends", BACKENDS, "--out",
                     str(out), "--no-report", "-q", "--engine-patch", str(PATCHES / patch))
    return (p.returncode, *_outputs(out))


def _found(summary: dict) -> dict:
    return {b: {c: n for c, n in s["findings"].items() if n} for b, s in summary["backends"].items()}


#: torch_native on smoke, as released: its SDPA gathers an SWA layer's K/V at req_to_token's full-pool ids (no
#: translation: torch_native_backend.py's per_req_tokens), and from step 12 a full id reaches the SWA pool's size
#: (3277 rows): IndexError, five forwards write none of their 16 layers (464 of 544). The model's torch_native does
#: not crash; the same crash as W1's (tests/test_engine_overlap.py TORCH_NATIVE).
NATIVE_SMOKE = {"design_error": 5}
NATIVE_SMOKE_FIRST = {"step": 12, "layer": -1, "class": "design_error"}


def _native_crash(summary: dict) -> bool:
    b = summary["backends"]["torch_native"]
    return (_found(summary)["torch_native"] == NATIVE_SMOKE and b["first_finding"] == NATIVE_SMOKE_FIRST
            and b["writes"] == 464)


def _whose(pieces: dict, backend: str) -> dict:
    return {p["piece"]: p for p in pieces["backends"][f"{backend}/target"]["pieces"]}


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("fwd"), "smoke")


def test_the_releases_backends_run_every_path_of_smoke_and_say_so(clean):
    rc, summary, pieces, steps = clean
    assert rc == 1 and summary["findings_total"] == 5 and _native_crash(summary)
    assert _found(summary)["triton"] == {} and summary["backends"]["triton"]["writes"] == 544
    paths = {s["graph"] for s in steps}
    assert paths == {"eager", "piecewise", "decode_graph"}
    for b in ("triton/target", "torch_native/target"):
        got = pieces["backends"][b]
        whose = {p["piece"]: p["whose"] for p in got["pieces"]}
        assert whose["init_forward_metadata"] == "engine"
        assert whose["forward_extend / forward_decode up to set_kv_buffer (the write location)"] == "engine"
        assert sum(got["model_forwards"].values()) + got["release_forwards"] == summary["steps"]
    # triton: every forward of every path is the release's
    triton = pieces["backends"]["triton/target"]
    assert triton["model_forwards"] == {} and triton["release_forwards"] == summary["steps"]
    assert triton["release_paths"] == {g: sum(s["graph"] == g for s in steps) for g in paths}
    t = _whose(pieces, "triton")
    assert t["read tables"]["whose"] == "engine"
    # its entries are checked, and their span by its kernels' rule (ours: the kernels are stood in), said
    assert t["read tables' span"]["whose"] == "model"
    assert t["read tables' span"]["why"].startswith("held to its kernels' rule: its decode kernel reads the last W")
    assert t["attention arithmetic: decode_attention_fwd"]["whose"] == "model"
    assert any(p.startswith("decode graphs: init_cuda_graph_state") and v["whose"] == "engine" for p, v in t.items())
    assert any(p.startswith("decode-graph replay:") and v["whose"] == "engine" for p, v in t.items())
    assert any(p.startswith("prefill graphs (breakable)") and v["whose"] == "engine" for p, v in t.items())
    assert t["create_flashinfer_kv_indices_triton (the metadata's KV-index gather)"]["whose"] == "model"
    # torch_native: no CUDA-graph support in the release, so its decode graphs are the model's, and it says why
    native = pieces["backends"]["torch_native/target"]
    why = ("graph path decode_graph (the release's capture: get_cuda_graph_seq_len_fill_value "
           "(base_attn_backend.py:288) raised NotImplementedError): the model's boundary")
    assert native["model_forwards"] == {why: sum(s["graph"] == "decode_graph" for s in steps)}
    assert native["release_paths"]["piecewise"] == sum(s["graph"] == "piecewise" for s in steps)
    n = _whose(pieces, "torch_native")
    assert n["read tables"]["whose"] == "model" and "req_to_token" in n["read tables"]["why"]
    assert "read tables' span" not in n
    assert n["graph path decode_graph"] == {"piece": "graph path decode_graph", "whose": "model", "why": why}


def test_decode_graph_replays_of_the_release_are_clean_on_b2(tmp_path):
    """B2's decode-graph replays through the release's runner, clean; the layers of a capture size are captured
    at start-up for the largest size and at the first replay for the others, so exactly the sizes replayed and the
    largest have their layers' write locations taken."""
    rc, summary, pieces, steps = _run(tmp_path, "b2-decode-stale-tail")
    assert rc == 0 and summary["findings_total"] == 0
    graphs = sum(s["graph"] == "decode_graph" for s in steps)
    assert graphs > 0 and pieces["backends"]["triton/target"]["release_paths"]["decode_graph"] == graphs
    # B2's five capture sizes (1, 2, 4, 8, 12: clamped to its 12 request rows); size 1 is never replayed, so its
    # layers are never captured
    assert {s["padded_tokens"] for s in steps if s["graph"] == "decode_graph"} == {2, 4, 8, 12}
    own = _whose(pieces, "triton")
    capture = own[next(p for p in own if p.startswith("decode graphs:"))]
    assert capture["why"] == "layers captured at 4 of 5 capture sizes: the largest and the sizes replayed"


def test_a_stale_swa_tail_in_tritons_graph_refill_clobbers_live_slots(tmp_path):
    """B2's class of bug in the release's own replay: the padded rows write at the SWA ids a larger replay left."""
    rc, summary, pieces, _ = _patched(tmp_path, "b2-decode-stale-tail", "triton-graph-swa-stale-tail.yaml")
    found = _found(summary)
    assert rc == 1 and found["torch_native"] == {}
    assert found["triton"].get("clobbered", 0) > 0
    assert pieces["backends"]["triton/target"]["model_forwards"] == {}


def test_a_replay_that_does_not_refill_the_swa_buffer_writes_where_the_capture_left_it(tmp_path):
    """The layers of a replay write at the capture-time tensors: without the replay's refill, at the zeros the
    capture left there (the sink), whatever the Python metadata of the last eager forward said."""
    rc, summary, _, steps = _patched(tmp_path, "smoke", "triton-graph-no-swa-refill.yaml")
    found = _found(summary)
    assert rc == 1 and _native_crash(summary)
    assert set(found["triton"]) == {"padding_slot"}
    graph_steps = {s["step"] for s in steps if s["graph"] == "decode_graph"}
    out = tmp_path / "patched"
    hit = {f["step"] for f in map(json.loads, (out / "findings.jsonl").read_text().splitlines())
           if f["backend"] == "triton"}
    assert hit and hit <= graph_steps


def test_prefill_graph_layers_are_narrowed_by_the_release_and_a_broken_narrowing_shows(tmp_path):
    rc, summary, pieces, steps = _run(tmp_path, "b1-pcg-dp-padding")
    assert rc == 0 and summary["findings_total"] == 0
    padded = [s for s in steps if s["graph"] == "piecewise" and s["dp_padded_tokens"] > s["real_tokens"]]
    assert padded                              # DP-padded piecewise forwards: the narrowing is exercised
    for b in ("triton", "torch_native"):
        assert pieces["backends"][f"{b}/target"]["release_paths"]["piecewise"] == sum(
            s["graph"] == "piecewise" for s in steps)
    rc, summary, _, _ = _patched(tmp_path, "b1-pcg-dp-padding", "graph-narrowing-keeps-padded-loc.yaml")
    found = _found(summary)
    assert rc == 1
    assert found["triton"].get("length_mismatch", 0) > 0 and found["torch_native"].get("length_mismatch", 0) > 0


def test_dp_padded_eager_extends_are_narrowed_by_the_release_and_a_broken_narrowing_shows(tmp_path):
    rc, summary, _, steps = _run(tmp_path, "dp-eager")
    assert rc == 0 and summary["findings_total"] == 0
    assert any(s["mode"] == "extend" and s["graph"] == "eager" and s["dp_padded_tokens"] > s["real_tokens"]
               for s in steps)
    rc, summary, _, _ = _patched(tmp_path, "dp-eager", "dp-extend-narrowing-keeps-padded-kv.yaml")
    found = _found(summary)
    assert rc == 1
    assert found["triton"].get("length_mismatch", 0) > 0 and found["torch_native"].get("length_mismatch", 0) > 0


def test_unshrunk_prefill_graphs_stay_the_models_and_the_fixs_gap_still_shows(tmp_path):
    """gap-swa-shorter: piecewise_shrink = false has no release path (0.5.23 narrows every prefill-graph layer), so
    those forwards are the model's boundary, named; the release's KVWriteLoc still lets the short swa_loc through."""
    rc, summary, pieces, _ = _run(tmp_path, "gap-swa-shorter")
    found = _found(summary)
    assert rc == 1 and set(found["triton"]) == {"length_mismatch"} and set(found["torch_native"]) == {"length_mismatch"}
    why = next(iter(pieces["backends"]["triton/target"]["model_forwards"]))
    assert why.startswith("graph path piecewise with piecewise_shrink = false")


def test_the_kernel_stand_ins_equal_the_interpreted_kernels_of_the_source_they_were_checked_against():
    """Each torch model of a release kernel against the interpreted kernel on random launches (the KV-index
    gather: 16 launches; the decode metadata: 64, page sizes, SWA mappings, v2p, zero tail, lengths only, column-major tables;
    trtllm_mha's graph metadata: 72, with the graph's SWA write locations and each cu_seqlens_q mode; aiter's
    page-table scatters: 16 from the token table, with draft tokens, and 8 from ragged ids, SWA tables, grids
    shorter than the rows; trtllm_mha's eager page tables: 8, two 4096-token blocks, clamped SWA reads; the draft
    decode steps' KV indices: 16, page-granular entries, page tables, two branches, a draft window with sinks, a
    token-block split; their sliding-window rail: 8; flashattention's in-graph draft-extend metadata: 12, with SWA
    write locations, two column blocks, column-major tables), and the release's sources are the ones the models
    stand in for (a differing source is interpreted)."""
    from engine_path import isolate
    from engine_path.forward import kernels

    got = isolate.call(SPEC, "engine_path.forward.kernels:self_check")
    assert got["cases"] == 220 and got["differ"] == [] and got["stored"] > 0
    assert {m.name: got["fingerprints"][m.name] in m.checked for m in kernels.MODELS} == {
        "create_flashinfer_kv_indices_triton": True, "_fused_decode_metadata_kernel": True,
        "update_trtllm_mha_graph_metadata_kernel": True, "scatter_req_to_token_to_page_table_kernel": True,
        "scatter_ragged_to_page_table_kernel": True, "create_trtllm_mha_kv_indices_triton": True,
        "generate_draft_decode_kv_indices": True, "generate_draft_decode_window_kv_indices": True,
        "_draft_extend_metadata_kernel": True}


def test_a_kernel_launch_out_of_its_tensors_goes_to_the_kernel_and_a_changed_source_is_not_stood_in():
    """The stand-in hands a launch whose access would leave a tensor to the kernel itself, having stored
    nothing; a kernel whose source differs from the checked one (an --engine-patch, another release) is
    interpreted and named so."""
    import torch

    from engine_path.forward import kernels

    ran = []

    class Kernel:
        @staticmethod
        def fn(store_to, at):          # the signature the stand-in binds
            pass

        def __getitem__(self, grid):
            return lambda *a, **k: ran.append(grid)

    def compute(store, grid, *, store_to, at):
        store(store_to, torch.tensor([0]), torch.tensor([7]))
        store(store_to, torch.tensor([at]), torch.tensor([9]))

    model = kernels.KernelModel("m", "k", (), frozenset(), compute, "a test kernel")
    s = kernels.StandIn(Kernel(), model)
    t = torch.zeros(3, dtype=torch.int64)
    s[(1,)](store_to=t, at=2)
    assert t.tolist() == [7, 0, 9] and (s.launches, s.handed_back, ran) == (1, 0, [])
    t.zero_()
    s[(1,)](store_to=t, at=3)
    assert t.tolist() == [0, 0, 0] and (s.launches, s.handed_back, ran) == (1, 1, [(1,)])
    changed = kernels.StandInSet((kernels.KernelModel(
        "tests.test_engine_forward", "_a_jit_kernel", (), frozenset({"not its sha"}), compute, "x"),), "tests", "")
    assert changed.install() == {}
    assert list(changed.refused()) == ["_a_jit_kernel"] and "is not the one" in changed.refused()["_a_jit_kernel"]
    assert changed.pieces() == [("_a_jit_kernel", "engine", changed.refused()["_a_jit_kernel"])]


def test_a_stand_in_binds_a_launch_as_the_kernel_s_signature_does():
    """Positional and keyword arguments by the kernel's parameters, its defaults filled, launch options (num_warps)
    left out; too many positional arguments or one given twice refused as Signature.bind refuses them."""
    import inspect

    from engine_path.forward import kernels

    class Kernel:
        @staticmethod
        def fn(a, b, c=3, D=4):
            pass

    s = kernels.StandIn(Kernel(), kernels.KernelModel("m", "k", (), frozenset(), None, "a test kernel"))
    sig = inspect.signature(Kernel.fn)
    for args, kw in [((1, 2), {}), ((1,), {"b": 2, "num_warps": 4}), ((), {"a": 1, "b": 2, "D": 8}),
                     ((1, 2, 5), {"D": 6, "num_stages": 2})]:
        want = sig.bind(*args, **{k: v for k, v in kw.items() if k in sig.parameters})
        want.apply_defaults()
        assert s.bind(args, kw) == dict(want.arguments), (args, kw)
    with pytest.raises(TypeError, match="multiple values for argument 'a'"):
        s.bind((1,), {"a": 1, "b": 2})
    with pytest.raises(TypeError, match="5 positional arguments"):
        s.bind((1, 2, 3, 4, 5), {})


class _AJit:
    def fn(self):
        return None


_a_jit_kernel = _AJit()


def test_a_shifted_swa_write_id_in_tritons_own_metadata_is_not_clean(tmp_path):
    rc, summary, _, _ = _patched(tmp_path, "smoke", "triton-swa-write-shift.yaml")
    found = _found(summary)
    assert rc == 1 and _native_crash(summary)
    assert found["triton"].get("missed", 0) > 0


@pytest.mark.slow
def test_bugs_engine_runs_cases_as_release_code_and_says_which(tmp_path):
    """`slotscope bugs --engine sglang --json`: B1 real on 0.5.14 / 0.5.15, the gap real on 0.5.23 (fixed by the
    shipped patch); a case without an engine entry is model-only, with why."""
    out = tmp_path / "bugs.json"
    p = subprocess.run([sys.executable, "-m", "slotscope", "bugs", "--engine", "sglang", "--only", "B1,gap,B3",
                        "--json", str(out), "--out", str(tmp_path / "runs"), "-q"], cwd=ROOT, capture_output=True,
                       text=True)
    got = {v["case"]: v for v in json.loads(out.read_text())}
    assert p.returncode == 0, p.stdout + p.stderr
    assert {k: (v["real"], v["holds"], v["buggy"], v["fixed"]) for k, v in got.items() if k != "B3"} == {
        "B1": (True, True, "sglang==0.5.14", "sglang==0.5.15"),
        "gap": (True, True, "sglang==0.5.23", "sglang==0.5.23 + fix-gap-pad-short-swa-loc.yaml")}
    assert got["B3"]["real"] is False and got["B3"]["buggy"] is None and got["B3"]["why"]
    assert set(got["B1"]) >= {"case", "pr", "real", "buggy", "fixed", "holds"}


@pytest.mark.slow
def test_bugs_engine_runs_fix_reverts_and_proposed_fixes_as_release_code(tmp_path):
    """B2 on 0.5.23 with #24743 reverted by a shipped patch (triton's own graph SWA refresh), R8 on 0.5.23 and with
    #38519's proposed fix as a patch: both real, both verdicts hold; W1 (the overlap scheduler's timeline) stays
    model-only, saying why."""
    out = tmp_path / "bugs.json"
    p = subprocess.run([sys.executable, "-m", "slotscope", "bugs", "--engine", "sglang", "--only", "B2,R8,W1",
                        "--json", str(out), "-q"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    got = {v["case"]: v for v in json.loads(out.read_text())}
    assert {k: (v["real"], v["holds"], v["buggy"], v["fixed"]) for k, v in got.items() if k != "W1"} == {
        "B2": (True, True, "sglang==0.5.23 + revert-24743-swa-graph-tail.yaml", "sglang==0.5.23"),
        "R8": (True, True, "sglang==0.5.23", "sglang==0.5.23 + fix-38519-filter-unmapped-swa-pages.yaml")}
    assert got["W1"]["real"] is False and "overlap scheduler" in got["W1"]["why"]
    assert "2 of 3 cases real; 2 of 2 engine verdicts hold" in p.stdout


def test_the_releases_tables_are_asked_on_every_executor(engine_releases):
    """A release boundary's table is its backend's own, never the base formula the GPU step runner may build
    from the requests' slots instead (cuda_path/plans.py ``base_read_ids``); torch_native, which builds none, is
    the model's base table, exact by construction."""
    from cuda_path.plans import base_read_ids
    from engine_path.forward.adapters import ADAPTERS
    from engine_path.forward.boundary import ReleaseBoundary

    model = type("ModelBoundary", (), {"base_reads": lambda self: True, "span_checked": lambda self: False})()
    for name, adapter in ADAPTERS.items():
        b = ReleaseBoundary.__new__(ReleaseBoundary)
        b.adapter, b.model = adapter, model
        own = adapter.reads is not None
        assert (base_read_ids(b), b.span_checked()) == ((False, False) if own else (True, False)), name
    assert sum(a.reads is not None for a in ADAPTERS.values()) == 7
