"""The backend adapters' device rules, without a release: what stands in where a platform package is missing on
a GPU image, the module globals set only where the release bound a stub, the flashinfer probe's override scoped
to the constructor, and the attention stand-in's output for each calling convention."""
from __future__ import annotations

import os
import sys
import types

import torch

from engine_path import shims
from engine_path.forward.adapters_base import Adapter, attention_output
from engine_path.forward.adapters_flashinfer import TENSOR_CORE_ENV, FlashInferAdapter


def test_a_missing_platform_package_stands_the_backend_in_on_a_gpu_too():
    assert Adapter("a").stand_ins("cpu") and not Adapter("a").stand_ins("cuda")
    assert Adapter("a", needs=("slotscope_no_such_package",)).stand_ins("cuda")
    assert not Adapter("a", needs=("torch",)).stand_ins("cuda")          # installed: the release's kernels run


def test_platform_globals_are_set_only_where_the_release_bound_a_stub(monkeypatch):
    mod = types.ModuleType("slotscope_fake_backend")
    mod.stubbed = shims._Unavailable("sgl_kernel.utils.is_arch_support_pdl", "sgl_kernel")
    mod.real = len
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    off = lambda: False  # noqa: E731
    a = Adapter("a", platform={f"{mod.__name__}:stubbed": (off, "why s"), f"{mod.__name__}:real": (off, "why r"),
                               f"{mod.__name__}:absent": (off, "why a")})
    assert a._set_platform_globals() == [f"{mod.__name__}:stubbed"]
    assert mod.stubbed is off and mod.real is len and not hasattr(mod, "absent")
    a.platform_set = [f"{mod.__name__}:stubbed"]
    named = [p for p in a.pieces("cuda") if p.piece == f"module global {mod.__name__}:stubbed"]
    assert len(named) == 1 and named[0].whose == "model" and "why s" in named[0].why


class _Recorder:
    seen: list = []

    def __init__(self, bag):
        _Recorder.seen.append(os.environ.get(TENSOR_CORE_ENV))


def test_flashinfers_probe_answers_through_the_release_override_only_where_flashinfer_is_a_stub(monkeypatch):
    mod = types.ModuleType("slotscope_fake_fi")
    mod.Recorder = _Recorder
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.delenv(TENSOR_CORE_ENV, raising=False)
    a = FlashInferAdapter("flashinfer", factory=f"{mod.__name__}:Recorder", needs=("flashinfer",))
    _Recorder.seen = []
    a.construct(None)                                   # flashinfer absent, no stub: the probe's ImportError path
    with shims.stubbed_imports(("flashinfer",)):        # a GPU image: slotscope's stub answers for flashinfer
        a.construct(None)
    monkeypatch.setenv(TENSOR_CORE_ENV, "true")         # the user's own setting is kept
    with shims.stubbed_imports(("flashinfer",)):
        a.construct(None)
    assert _Recorder.seen == [None, "false", "true"]
    assert os.environ[TENSOR_CORE_ENV] == "true"
    monkeypatch.delenv(TENSOR_CORE_ENV)
    with shims.stubbed_imports(("flashinfer",)):
        a.construct(None)
    assert TENSOR_CORE_ENV not in os.environ           # set for the constructor only


def test_the_attention_stand_in_is_shaped_like_the_query_in_every_calling_convention():
    q = torch.ones(5, 4, 8, dtype=torch.bfloat16)
    for got in (attention_output(q), attention_output(q=q), attention_output(query=q),
                attention_output((q, torch.zeros(3, 2))),      # trtllm's fmha_v2 prefill: (q, kv_cache)
                attention_output(q, out_dtype=torch.bfloat16)):
        assert got.shape == q.shape and got.dtype == q.dtype and not got.any()
    out = torch.ones(5, 4, 8)
    assert attention_output(q, out=out) is out
    o, lse, _ = attention_output(q, return_lse=True)
    assert o.shape == q.shape and lse.shape == (5, 4) and lse.dtype == torch.float32


class _SDPA:
    """The shape of torch_native's _run_sdpa_forward_decode: gathers k_cache[req_to_token[row, start:end]]."""

    def __init__(self):
        self.ran = 0

    def _run_sdpa_forward_decode(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                                 encoder_lens=None, scaling=None, enable_gqa=False, causal=False, is_cross_attn=False,
                                 sliding_window_size=None):
        self.ran += 1
        for row, n in zip(req_pool_indices.tolist(), seq_lens.tolist()):
            k_cache[req_to_token[row, :n]]


def test_torch_natives_gathers_are_bounds_checked_before_its_sdpa_on_a_gpu():
    """On a GPU a gather past the K/V buffer is a device-side assert that ends every backend's run; the adapter
    checks each request's gather on the host first and raises the IndexError a CPU run raises (the backend's
    design_error), naming the index and the buffer's size; ids inside the buffer run the release's SDPA as is."""
    import pytest

    from engine_path.forward.adapters import ADAPTERS, _gather_checked

    sdpa = _SDPA()
    run = _gather_checked(sdpa._run_sdpa_forward_decode)
    k = torch.zeros(10, 2)
    table = torch.tensor([[1, 2, 3, 0], [4, 9, 12, 0]])
    q = torch.zeros(2, 1)
    run(q, q, k, k, table, torch.tensor([0]), torch.tensor([3]))
    run(q, q, k, k, table, torch.tensor([1]), torch.tensor([2]))     # 12 is past the row's length: not gathered
    assert sdpa.ran == 2
    with pytest.raises(IndexError, match=r"index 12 is out of bounds for dimension 0 with size 10"):
        run(q, q, k, k, table, torch.tensor([0, 1]), torch.tensor([3, 3]))
    with pytest.raises(IndexError, match=r"index -11 is out of bounds"):
        run(q, q, k, k, torch.tensor([[-11, 1]]), torch.tensor([0]), torch.tensor([2]))
    assert sdpa.ran == 2                                            # the release's SDPA never saw a bad gather
    tn = ADAPTERS["torch_native"]
    named = [p for p in tn.pieces("cuda") if p.piece.startswith("K/V gather bounds")]
    assert len(named) == 1 and named[0].whose == "model"
    assert not [p for p in tn.pieces("cpu") if p.piece.startswith("K/V gather bounds")]


def test_torch_natives_sdpa_stand_in_checks_what_torchs_sdpa_checks_and_returns_its_output_shape():
    """On a CPU torch_native's SDPA (and its dense window mask, an input of SDPA only) is stood in: the output
    has the shape and dtype of torch's own for every argument layout the release passes (GQA, masks of the
    extend and decode loops), and a mismatch torch's SDPA refuses raises here too."""
    import pytest

    from engine_path.forward.adapters import WindowMask, sdpa_shapes_only
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    def mask(q_len, kv_len, offset=0):
        q_pos = torch.arange(offset, offset + q_len)[:, None]
        k_pos = torch.arange(kv_len)[None, :]
        return (k_pos <= q_pos) & (k_pos >= q_pos - 3)

    g = torch.Generator().manual_seed(0)
    for hq, hk, gqa, L, S, dv, offset in ((1, 1, False, 5, 5, 16, 0), (4, 2, True, 7, 7, 8, 0),
                                          (2, 2, False, 1, 9, 16, 8), (6, 3, True, 1, 4, 4, 3)):
        q = torch.randn(1, hq, L, 16, generator=g, dtype=torch.bfloat16)
        k = torch.randn(1, hk, S, 16, generator=g, dtype=torch.bfloat16)
        v = torch.randn(1, hk, S, dv, generator=g, dtype=torch.bfloat16)
        want = sdpa(q, k, v, attn_mask=mask(L, S, offset), enable_gqa=gqa, is_causal=False)
        got = sdpa_shapes_only(q, k, v, attn_mask=WindowMask(q_len=torch.tensor(L), kv_len=S, sliding_window_size=3,
                                                             device="cpu", query_offset=offset), enable_gqa=gqa)
        assert (got.shape, got.dtype) == (want.shape, want.dtype) and not got.any()
    q, k = torch.zeros(1, 4, 5, 16), torch.zeros(1, 3, 5, 16)
    bad = [dict(query=q, key=k, value=k),                                                  # 4 heads over 3
           dict(query=q[..., :8], key=k[:, :1], value=k[:, :1]),                           # head sizes
           dict(query=q, key=k[:, :1], value=k[:, :1], attn_mask=torch.ones(5, 6, dtype=torch.bool))]
    for kw in bad:
        with pytest.raises(RuntimeError):
            sdpa(**kw, enable_gqa=True)
        with pytest.raises(RuntimeError, match="scaled_dot_product_attention"):
            sdpa_shapes_only(**kw, enable_gqa=True)


def test_torch_natives_sdpa_is_stood_in_on_a_cpu_only_and_named(monkeypatch):
    from engine_path.forward.adapters import ADAPTERS, RELEASE_SDPA_ENV

    tn = ADAPTERS["torch_native"]
    monkeypatch.delenv(RELEASE_SDPA_ENV, raising=False)
    assert tn.stand_ins("cpu") and not tn.stand_ins("cuda")
    named = {p.piece: p for p in tn.pieces("cpu")}
    assert named["attention arithmetic: _make_sliding_window_mask"].whose == "model"
    assert named["module global sglang.srt.layers.attention.torch_native_backend:scaled_dot_product_attention"
                 ].whose == "model"
    assert not [p for p in tn.pieces("cuda") if p.whose == "model" and "scaled_dot" in p.piece]
    monkeypatch.setenv(RELEASE_SDPA_ENV, "1")
    assert not tn.stand_ins("cpu")
    assert {p.whose for p in tn.pieces("cpu") if "_make_sliding_window_mask" in p.piece} == {"engine"}


def test_each_backends_table_span_is_its_kernels_rule():
    import numpy as np

    from engine_path.forward.adapters_base import SPAN_FA, SPAN_RAGGED, SPAN_TRITON, SPAN_UNIFIED

    seq, ext, w = np.array([10, 40, 3]), np.array([1, 8, 3]), 16     # new tokens from P0 = 9, 32, 0

    def got(span, decode, backend=None):
        s = span.spans(backend, seq, ext, w, decode)
        return {k: (v.lo.tolist(), v.hi.tolist(), v.name, v.window) for k, v in s.items()}

    # FA-shaped: window_size (W, 0) reads W + 1 keys ending at each query, the whole sequence
    assert got(SPAN_FA, False) == {"full": ([0, 0, 0], [10, 40, 3], "prefix", 0),
                                   "swa": ([0, 16, 0], [10, 40, 3], "window", 17)}
    assert got(SPAN_UNIFIED, True)["swa"] == ([0, 17, 0], [10, 40, 3], "window", 16)      # (W - 1, 0)
    # triton: its decode one key fewer (sglang#32087); its extend tables hold the prefix only
    assert got(SPAN_TRITON, True)["swa"] == ([0, 17, 0], [10, 40, 3], "window", 16)
    assert got(SPAN_TRITON, False) == {"full": ([0, 0, 0], [9, 32, 0], "prefix", 0),
                                       "swa": ([0, 16, 0], [9, 32, 0], "window", 17)}
    # flashinfer: the prefix only where its extend is ragged (the backend's metadata says, per forward)
    ragged = types.SimpleNamespace(forward_metadata=types.SimpleNamespace(use_ragged=True))
    paged = types.SimpleNamespace(forward_metadata=types.SimpleNamespace(use_ragged=False))
    assert got(SPAN_RAGGED, False, ragged)["full"][1] == [9, 32, 0]
    assert got(SPAN_RAGGED, False, paged)["full"][1] == [10, 40, 3]
    assert got(SPAN_RAGGED, True, types.SimpleNamespace())["swa"][1] == [10, 40, 3]   # a decode never asks


def test_a_designs_read_table_cannot_state_its_own_span():
    import numpy as np

    from simulator.designs.checks import check_read_table
    from simulator.designs.types import ReadIds, ReadTable
    from simulator.oracle.read_rules import prefix_span

    ids = ReadIds(torch.tensor([0, 2]), torch.tensor([5, 6]), torch.tensor([0]))
    table = ReadTable(ids, None, {"full": prefix_span(np.array([1]))})
    checked = check_read_table(table, 1, torch.device("cpu"))
    assert checked.spans is None and checked.full is ids
