"""The design interface (issue 9, B1-B5 and A6): hook contexts, one instance per (backend, side),
padding conventions as values, backend specs, and design errors reported as findings."""
from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch

from cuda_path.pool import TaggedKVPool
from simulator.engine_model.backends import BACKEND_SPECS, BackendSpec
from simulator.designs import GRAPH_RUNNERS, Design, DesignError, KVWriteLoc, graph_runner, load_design
from simulator.designs.sglang import SGLangPost29460, SGLangPre24743
from simulator.engine_model.padding_convention import DUMMY, PADDING_CONVENTIONS, SKIP_MINUS_1, SLOT0, SLOT0_ABSORB
from simulator.records import FINDING_CLASSES
from simulator.run import RunResult, run_simulation

from helpers import ROOT, scenario, tiny

MIXED = """
seed = 5
backends = ["flashinfer", "aiter"]
[model]
preset = "gpt-oss-20b"
num_layers = 4
[pool]
full_size = 4096
[workload]
requests = 6
prompt_len = { dist = "uniform", min = 40, max = 400 }
output_len = { dist = "uniform", min = 4, max = 16 }
[engine]
chunked_prefill_size = 128
mixed_chunk = true
dp_size = 2
dp_other_tokens = { dist = "uniform", min = 0, max = 64 }
piecewise_cuda_graph = true
cuda_graph_max_bs = 8
"""

SPEC = """
seed = 7
backends = ["triton", "aiter"]
[model]
layers = "SFSF"
window = 32
[pool]
full_size = 2048
page_size = 4
[workload]
requests = 5
prompt_len = { dist = "uniform", min = 60, max = 200 }
output_len = { dist = "uniform", min = 8, max = 20 }
[engine]
chunked_prefill_size = 64
piecewise_cuda_graph = true
[engine.speculative]
algorithm = "eagle"
num_draft_tokens = 4
draft_layers = "FS"
"""


def run(sc, design: Design) -> RunResult:
    def make(full_rows, swa_rows, skip):
        return TaggedKVPool(sc.model, full_rows, swa_rows, geometry="compact", skip_index=skip)

    return run_simulation(sc, design, make)


def counts(r: RunResult) -> dict[str, dict[str, int]]:
    return {b: {c: n for c, n in st.findings.items() if n} for b, st in r.backends.items()}


def test_design_error_is_a_finding_class_after_length_mismatch():
    assert FINDING_CLASSES[-2:] == ("length_mismatch", "design_error")


# ------------------------------------------------------------------------------ A6: design errors

class RaiseOnMixed(Design):
    name = "raise-on-mixed"

    def translate(self, out_cache_loc, full_to_swa, ctx):
        if ctx.mode == "mixed" and ctx.backend == "aiter":
            raise IndexError("my fix indexes past the batch")
        return super().translate(out_cache_loc, full_to_swa, ctx)


def test_translate_raising_on_mixed_batches_is_one_finding_per_forward_and_the_run_goes_on():
    sc = tiny(MIXED)
    clean = run(sc, Design())
    r = run(sc, RaiseOnMixed())
    mixed = [s.step for s in r.steps if s.mode == "mixed"]
    assert len(mixed) == 9
    assert len(r.steps) == len(clean.steps) == 22              # the run finished
    assert counts(clean) == {"flashinfer": {}, "aiter": {}}
    assert counts(r) == {"flashinfer": {}, "aiter": {"design_error": 9}}
    assert [(f.step, f.backend, f.layer, f.slot) for f in r.findings] == [(s, "aiter", -1, -1) for s in mixed]
    f = r.findings[0]
    assert f.cls == "design_error" and f.kind == "swa"
    assert f.message.startswith(f"design raise-on-mixed: translate raised IndexError: my fix indexes past the batch "
                                f"at step {mixed[0]} on aiter (target, layer -1, mode mixed")
    # a skipped forward stores nothing: 9 forwards x 4 layers fewer writes on aiter
    assert (clean.backends["aiter"].writes, r.backends["aiter"].writes) == (88, 88 - 9 * 4)
    assert r.backends["aiter"].first_finding.cls == "design_error"


BAD_INDEX = {
    "float32": (lambda t: t.float(), "of dtype float32"),
    "bool": (lambda t: t > 0, "of dtype bool"),
    "int16": (lambda t: t.to(torch.int16), "of dtype int16"),
    "uint8": (lambda t: t.to(torch.uint8), "of dtype uint8"),
    "list": (lambda t: t.tolist(), "of type list"),
    "tuple": (lambda t: tuple(t.tolist()), "of type tuple"),
    "meta device": (lambda t: torch.empty(t.shape[0], dtype=t.dtype, device="meta"), "on device meta"),
    "2-D": (lambda t: t[:, None], "of shape ("),
}


@pytest.mark.parametrize("bad", list(BAD_INDEX))
def test_a_bad_swa_loc_from_make_write_loc_is_a_design_error_at_each_swa_layer(bad):
    spoil, words = BAD_INDEX[bad]

    class BadSwaLoc(Design):
        name = "bad-swa-loc"

        def make_write_loc(self, loc, swa_loc, ctx):
            wl = super().make_write_loc(loc, swa_loc, ctx)
            return KVWriteLoc(wl.loc, spoil(wl.swa_loc)) if ctx.kind == "swa" else wl

    sc = tiny(MIXED)
    r = run(sc, BadSwaLoc())
    n_steps, swa_layers = len(r.steps), sum(1 for li in sc.model.layers() if li.kind == "swa")
    assert (n_steps, swa_layers) == (22, 2)
    assert counts(r) == {"flashinfer": {"design_error": 44}, "aiter": {"design_error": 44}}
    assert {(f.kind, f.layer) for f in r.findings} == {("swa", 0), ("swa", 2)}
    assert all(f"make_write_loc returned swa_loc {words}" in f.message for f in r.findings), r.findings[0].message
    # the full layers still stored: 22 steps x 2 full layers per backend
    assert r.backends["aiter"].writes == 44


@pytest.mark.parametrize("what,words", [
    ("not a KVWriteLoc", "returned tuple, not a KVWriteLoc"),
    ("no swa_loc", "without swa_loc for an SWA layer"),
    ("float loc", "returned loc of dtype float32"),
])
def test_other_bad_write_locs(what, words):
    class Bad(Design):
        name = "bad"

        def make_write_loc(self, loc, swa_loc, ctx):
            if ctx.kind != "swa":
                return super().make_write_loc(loc, swa_loc, ctx)
            if what == "not a KVWriteLoc":
                return loc, swa_loc
            if what == "no swa_loc":
                return KVWriteLoc(loc)
            return KVWriteLoc(loc.float(), swa_loc[: loc.shape[0]])

    r = run(tiny(MIXED), Bad())
    assert counts(r) == {"flashinfer": {"design_error": 44}, "aiter": {"design_error": 44}}
    assert words in r.findings[0].message


def test_translate_returning_a_float_index_and_a_raising_fill_hook():
    class FloatTranslate(Design):
        name = "float-translate"

        def translate(self, out_cache_loc, full_to_swa, ctx):
            return full_to_swa[out_cache_loc].double()

    class RaisingFill(Design):
        name = "raising-fill"

        def fill_graph_loc_buffer(self, buffer, loc, padded, ctx):
            raise ValueError("no room")

    sc = tiny(MIXED)
    r = run(sc, FloatTranslate())
    assert counts(r) == {"flashinfer": {"design_error": 22}, "aiter": {"design_error": 22}}
    assert "translate returned swa_loc of dtype float64" in r.findings[0].message
    r = run(sc, RaisingFill())
    decode_graph = sum(1 for s in r.steps if s.graph == "decode_graph")
    assert decode_graph == 10
    assert counts(r) == {"flashinfer": {"design_error": 10}, "aiter": {"design_error": 10}}
    assert {(f.kind, f.layer) for f in r.findings} == {("full", -1)}
    assert "fill_graph_loc_buffer raised ValueError: no room" in r.findings[0].message


@pytest.mark.parametrize("hook", ["translate", "fill_graph_loc_buffer", "fill_graph_swa_buffer", "make_write_loc"])
@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_keyboard_interrupt_and_system_exit_in_a_hook_propagate(hook, exc):
    def boom(self, *args):
        raise exc(0) if exc is SystemExit else exc()

    design = type("Boom", (Design,), {"name": "boom", hook: boom})()
    with pytest.raises(exc) as e:
        run(tiny(MIXED), design)
    assert e.value.partial_result.total_findings == 0     # never turned into findings


# ------------------------------------------------------------------------------ B1: contexts and instances

class Recorder(Design):
    name = "recorder"
    calls: list = []

    def translate(self, out_cache_loc, full_to_swa, ctx):
        Recorder.calls.append(("translate", id(self), ctx))
        return super().translate(out_cache_loc, full_to_swa, ctx)

    def fill_graph_loc_buffer(self, buffer, loc, padded, ctx):
        Recorder.calls.append(("fill_graph_loc_buffer", id(self), ctx))
        super().fill_graph_loc_buffer(buffer, loc, padded, ctx)

    def fill_graph_swa_buffer(self, buffer, swa_loc, padded, ctx):
        Recorder.calls.append(("fill_graph_swa_buffer", id(self), ctx))
        super().fill_graph_swa_buffer(buffer, swa_loc, padded, ctx)

    def make_write_loc(self, loc, swa_loc, ctx):
        Recorder.calls.append(("make_write_loc", id(self), ctx))
        return super().make_write_loc(loc, swa_loc, ctx)


@pytest.fixture(scope="module")
def recorded():
    """Calls of every hook with their contexts: the speculative scenario, then the plain one (decode graphs)."""
    out = {}
    for name, text in (("spec", SPEC), ("plain", MIXED)):
        Recorder.calls = []
        r = run(tiny(text), Recorder())
        out[name] = (r, list(Recorder.calls))
    return out


def test_every_graph_runner_is_seen_with_the_right_context(recorded):
    runners = {ctx.runner for r, calls in recorded.values() for hook, _, ctx in calls if hook == "translate"}
    assert runners == set(GRAPH_RUNNERS)
    for name, (r, calls) in recorded.items():
        check_contexts(r, calls, page=4 if name == "spec" else 1)
    # make_write_loc: every layer of its side (target SFSF: 0..3; the draft FS: 4, 5)
    r, calls = recorded["spec"]
    layers = Counter((ctx.side, ctx.layer, ctx.kind) for hook, _, ctx in calls if hook == "make_write_loc")
    assert set(layers) == {("target", 0, "swa"), ("target", 1, "full"), ("target", 2, "swa"), ("target", 3, "full"),
                           ("draft", 4, "full"), ("draft", 5, "swa")}


def check_contexts(r, calls, page):
    steps = defaultdict(list)
    for s in r.steps:
        steps[s.step].append(s)
    expect = {("decode", "decode_graph", "decode"), ("target_verify", "decode_graph", "target_verify"),
              ("draft_decode", "draft_graph", "draft_decode"), ("draft_extend", "draft_extend_graph", "draft_extend"),
              ("extend", "piecewise", "piecewise"), ("mixed", "piecewise", "piecewise"),
              ("extend", "eager", "eager"), ("draft_extend", "eager", "eager")}
    seen = {(ctx.mode, ctx.graph, ctx.runner) for _, _, ctx in calls}
    assert seen <= expect
    for hook, _, ctx in calls:
        assert graph_runner(ctx.mode, ctx.graph) == ctx.runner
        assert ctx.side == ("draft" if ctx.mode.startswith("draft") else "target")
        assert ctx.page_size == page and ctx.padding is SLOT0 and (ctx.loc_pad, ctx.swa_pad) == (0, 0)
        assert ctx.spec.name == ctx.backend and isinstance(ctx.spec, BackendSpec)
        rec = next(s for s in steps[ctx.step] if s.mode == ctx.mode)
        assert (ctx.num_token_non_padded, ctx.dp_padded_len, ctx.padded_len) == (
            rec.real_tokens, rec.dp_padded_tokens, rec.padded_tokens)
        if hook == "make_write_loc":
            assert ctx.layer is not None and ctx.kind in ("full", "swa")
        else:
            assert ctx.layer is None and ctx.kind is None
        if hook.startswith("fill_graph"):
            assert ctx.runner in ("decode", "target_verify", "draft_decode", "draft_extend")


def test_a_layer_context_is_the_forward_context_plus_the_layer(recorded):
    import dataclasses

    _, calls = recorded["spec"]
    ctx = next(c for hook, _, c in calls if hook == "translate")
    assert ctx.at_layer(5, "swa") == dataclasses.replace(ctx, layer=5, kind="swa")


def test_one_design_instance_per_backend_and_side(recorded):
    _, calls = recorded["spec"]
    ids = defaultdict(set)
    for _, ident, ctx in calls:
        ids[(ctx.backend, ctx.side)].add(ident)
    assert set(ids) == {("triton", "target"), ("triton", "draft"), ("aiter", "target"), ("aiter", "draft")}
    assert all(len(v) == 1 for v in ids.values())
    assert len(set().union(*ids.values())) == 4


def test_translate_is_called_once_per_forward_per_backend(recorded):
    r, calls = recorded["spec"]
    per = Counter((ctx.step, ctx.mode, ctx.backend) for hook, _, ctx in calls if hook == "translate")
    assert set(per.values()) == {1}
    assert len(per) == 2 * len(r.steps)


# ------------------------------------------------------------------------------ B2: padding conventions

def test_padding_conventions_are_values_and_names_resolve():
    assert [c.name for c in PADDING_CONVENTIONS.values()] == ["slot0", "slot0-absorb", "skip-1", "skip-1-null-block",
                                                                "dummy"]
    assert (SLOT0.pad_value, SLOT0.skip_index, SLOT0.dummy_request) == (0, 0, False)
    assert (SLOT0_ABSORB.pad_value, SLOT0_ABSORB.skip_index) == (0, None)
    assert (SKIP_MINUS_1.pad_value, SKIP_MINUS_1.skip_index, SKIP_MINUS_1.tail_value) == (-1, -1, -1)
    assert (DUMMY.pad_value, DUMMY.skip_index, DUMMY.dummy_request) == (None, None, True)

    class ByName(Design):
        padding = "skip-1"

    assert ByName.padding is SKIP_MINUS_1
    assert load_design("mini-sglang-dummy").padding is DUMMY


def test_an_unknown_padding_name_in_a_user_design_is_a_clear_design_error(tmp_path):
    f = tmp_path / "bad.py"
    f.write_text("from simulator.designs import Design\nclass Bad(Design):\n    padding = 'slot1'\n")
    with pytest.raises(DesignError, match=r"bad.py.*padding.*'slot1'.*allowed: slot0, slot0-absorb, skip-1, skip-1-null-block, dummy"):
        load_design(f"{f}:Bad")


# ------------------------------------------------------------------------------ B3: backend specs

def test_backend_specs_model_the_engine():
    assert [b for b, s in BACKEND_SPECS.items() if s.slices_swa_loc] == []       # no release's backend slices
    assert sorted(b for b, s in BACKEND_SPECS.items() if s.swa_ids == "translate") == ["aiter", "torch_native", "xpu"]
    assert [b for b, s in BACKEND_SPECS.items() if "draft_extend_graph" not in s.window_graphs] == ["triton"]
    assert all(s.static_buffers == ("loc", "swa_loc") for s in BACKEND_SPECS.values())


class EngineFix(SGLangPost29460):
    """SGLang today with triton's draft-extend graph building window indices: #29858 as a spec change."""
    name = "engine-fix"

    def backend_spec(self, spec):
        return spec.with_window_graph("draft_extend_graph")


def test_b4_comes_from_the_engine_model_and_a_spec_change_fixes_it():
    sc = scenario("b4-draft-extend-window").with_overrides(backends=("triton", "flashinfer"))
    buggy = run(sc, SGLangPost29460())
    # without window indices the draft-extend graph's SWA layer also reads the full-pool prefix ids
    assert counts(buggy) == {"triton": {"missed": 12, "clobbered": 2, "evicted_slot": 10, "stale_read": 9790,
                                        "out_of_range": 49},
                             "flashinfer": {}}
    assert "make_write_loc" not in SGLangPost29460.__dict__     # not a design's doing
    assert run(sc, EngineFix()).total_findings == 0


# ------------------------------------------------------------------------------ B2's twin: a stale full-loc tail

class StaleLocTail(Design):
    """The decode graph's static full-pool loc buffer is not refreshed past the real batch."""
    name = "stale-loc-tail"

    def fill_graph_loc_buffer(self, buffer, loc, padded, ctx):
        buffer[: loc.shape[0]].copy_(loc)


def test_a_stale_full_loc_tail_is_caught_by_the_b2_scenario():
    sc = scenario("b2-decode-stale-tail").with_overrides(backends=("flashinfer",))
    r = run(sc, StaleLocTail())
    # padded rows keep the previous replay's full-pool locations: full layers write padding over live slots
    assert counts(r) == {"flashinfer": {"clobbered": 360, "evicted_slot": 264}}
    assert Counter(f.kind for f in r.findings) == {"full": 624}
    first = r.backends["flashinfer"].first_finding
    assert (first.step, first.layer, first.kind, first.cls, first.observed.tag) == (7, 1, "full", "clobbered", -1)
    assert run(sc, load_design("sglang-post-29460")).total_findings == 0


def test_the_example_design_closes_the_gap():
    from simulator.designs import load_design as load

    d = load(str(ROOT / "examples/designs/my_fix.py") + ":StrictSlice")
    sc = scenario("gap-swa-shorter")
    assert run(sc, d).total_findings == 0
    assert run(sc, load_design("sglang-post-29460")).total_findings > 0


def test_sglang_pre_24743_still_has_b2():
    sc = scenario("b2-decode-stale-tail").with_overrides(backends=("aiter",))
    assert counts(run(sc, SGLangPre24743())) == {"aiter": {"clobbered": 360, "evicted_slot": 264}}


# ------------------------------------------------------------------------------ on a GPU, through real CUDA graphs

class RaiseOnSwaLayers(Design):
    name = "raise-on-swa-layers"

    def make_write_loc(self, loc, swa_loc, ctx):
        if ctx.kind == "swa" and ctx.mode in ("mixed", "decode"):
            raise IndexError("past the batch")
        return super().make_write_loc(loc, swa_loc, ctx)


@pytest.mark.gpu
@pytest.mark.parametrize("design", [RaiseOnSwaLayers, RaiseOnMixed, StaleLocTail])
def test_design_errors_and_stale_loc_tails_agree_between_gpu_graphs_and_cpu(design):
    from cuda_path.graphs import CudaGraphExecutor

    sc = tiny(MIXED)

    def make(full_rows, swa_rows, skip):
        return TaggedKVPool(sc.model, full_rows, swa_rows, device="cuda", geometry="real", store_impl="triton",
                            skip_index=skip)

    ex = CudaGraphExecutor()
    gpu = run_simulation(sc, design(), make, device="cuda", executor=ex)
    cpu = run(sc, design())
    assert counts(gpu) == counts(cpu)
    assert [(f.step, f.backend, f.layer, f.cls, f.slot) for f in gpu.findings] == \
        [(f.step, f.backend, f.layer, f.cls, f.slot) for f in cpu.findings]
    if design is RaiseOnSwaLayers:
        assert counts(cpu)["aiter"] == {"design_error": 38}
    assert ex.replays + ex.piece_replays > 0


class NoLocRefresh(Design):
    """An engine whose graph runners never refresh the static full-pool loc buffer (only the SWA one)."""
    name = "no-loc-refresh"

    def backend_spec(self, spec):
        return dataclasses.replace(super().backend_spec(spec), static_buffers=("swa_loc",))


def test_a_static_buffer_the_backend_does_not_refresh_keeps_its_contents():
    sc = tiny(MIXED)
    r = run(sc, NoLocRefresh())
    decode_tokens = sum(s.real_tokens for s in r.steps if s.graph == "decode_graph")
    assert decode_tokens == 26
    # the never-written loc buffer holds zeros: every real decode token's full-layer row goes to slot 0
    assert counts(r) == {"flashinfer": {"padding_slot": 2 * decode_tokens}, "aiter": {"padding_slot": 2 * decode_tokens}}
    assert {f.kind for f in r.findings} == {"full"}


def test_gather_is_torch_indexing_exactly():
    """designs.gather (the base translate's and read_ids' gather): numpy on host tensors, the same values,
    dtypes and out-of-range error text as ``table[index]``."""
    from simulator.designs import gather

    rng = np.random.default_rng(3)
    for dtype in (torch.int32, torch.int64):
        table = torch.from_numpy(rng.integers(-5, 1 << 20, 1000)).to(dtype)
        for idx_dtype in (torch.int32, torch.int64):
            idx = torch.from_numpy(rng.integers(-1000, 1000, 257)).to(idx_dtype)
            got, want = gather(table, idx), table[idx]
            assert got.dtype == want.dtype and torch.equal(got, want)
        assert torch.equal(gather(table, torch.zeros(0, dtype=torch.int64)), table[torch.zeros(0, dtype=torch.int64)])
    for bad in (1000, -1001):
        with pytest.raises(IndexError) as mine:
            gather(table, torch.tensor([0, bad]))
        with pytest.raises(IndexError) as theirs:
            table[torch.tensor([0, bad])]
        assert str(mine.value) == str(theirs.value)
