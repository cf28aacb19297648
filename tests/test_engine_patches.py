"""`--engine-patch FILE.yaml`: SGLang's patch format, our patcher on a toy module, and the shipped patches
(examples/engine-patches/) on sglang 0.5.23 through the real CLI.

* the parser and our patcher (engine_path/patches.py) on a toy module written to a temporary directory: no
  sglang needed; match + replacement / prepend / append, and each way a patch can fail (no match,
  ambiguous match, unknown target) is an EngineError naming the target and the edit;
* through the CLI (five 0.5.23 runs, two at a time, forked from the session's warm servers, tests/warm_engine.py:
  a patched one from the release's dependency server, whose child imports the release and applies the patch): B1 with the revert of #29460's slice gives exactly
  0.5.14's pinned counts (length_mismatch 18 on every backend: none slices swa_loc itself in a release;
  tests/test_engine_cli.py's PINNED), B1 without it is clean; the gap scenario is clean with the fix and
  fails without it; summary.json and run.json name the patches with their sha256 and who applied them
  (the release's patcher for the revert; ours for the fix, forced with SLOTSCOPE_ENGINE_PATCHER=slotscope); a
  patch whose match the release's source lacks is bad input (exit 2) naming the target and the edit.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from engine_path.errors import EngineError
from helpers import slotscope_cli

#: every test here runs the engine (b1 through the release's forward on eight backends): the slow tier
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PATCHES = ROOT / "examples" / "engine-patches"
REVERT = PATCHES / "revert-29460-slice.yaml"
FIX = PATCHES / "fix-gap-pad-short-swa-loc.yaml"
ALL = ("flashinfer", "triton", "flashattention", "trtllm_mha", "aiter", "xpu", "torch_native", "musa")
B1_0514 = {b: {"length_mismatch": 18} for b in ALL}
#: B1 with #29460's slice reverted on 0.5.23, every backend's forward the release's: aiter is clean. On a hybrid
#: SWA pool its forward never builds a KVWriteLoc: it hands launch_reshape_and_cache_flash the layer's K/V, its
#: cache_loc and the whole full_to_swa mapping, and that kernel writes token t < len(key) at
#: mapping[out_cache_loc[t]] (engine_path/forward/adapters_aiter.py), so a padded swa_loc cannot reach it. The
#: model's aiter (its boundary, before the adapters) went through KVWriteLoc and had B1's 18.
B1_REVERTED = {**B1_0514, "aiter": {}}

TOY = '''
SCALE = 10


def add(a, b):
    total = a + b
    return total


class Box:
    def __init__(self, n):
        self.n = n

    def grow(self, k):
        self.n += k
        self.n += k
        return self.n

    @staticmethod
    def twice(x):
        return 2 * x
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    import importlib

    name = f"slotscope_toy_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module(name)
    yield mod
    sys.modules.pop(name, None)


def _yaml(tmp_path, body: str) -> Path:
    p = tmp_path / "p.yaml"
    p.write_text(textwrap.dedent(body))
    return p


def _apply(path):
    from engine_path import patches

    return patches.apply_file(path, use_engine=False)


def test_parse_format():
    from engine_path import patches

    ps = patches.parse(textwrap.dedent("""
        patches:
          - target: a.b.f
            edits:
              - match: "x = 1"
                replacement: "x = 2"
              - match: "y"
                prepend: "z = 0"
              - match: "w"
                append: "v = 1"
              - match: "gone"
    """))
    assert [p.target for p in ps] == ["a.b.f"]
    assert [(e.mode, e.text) for e in ps[0].edits] == [("replacement", "x = 2"), ("prepend", "z = 0"),
                                                        ("append", "v = 1"), ("replacement", "")]
    with pytest.raises(EngineError, match="only one of"):
        patches.parse("patches:\n  - target: a.f\n    edits:\n      - {match: x, replacement: y, append: z}\n")
    with pytest.raises(EngineError, match="'patches'"):
        patches.parse("- target: a.f\n")
    with pytest.raises(EngineError, match=r"target a\.f, edit 0: unknown keys \['replace'\] \(an edit has 'match' "
                                          r"and one of replacement, prepend, append\)"):
        patches.parse("patches:\n  - target: a.f\n    edits:\n      - {match: x, replace: y}\n")


KERNEL_TOY = '''
import triton
import triton.language as tl


@triton.jit
def fill(out, n, VALUE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, VALUE, mask=offs < n)
'''


def test_our_patcher_edits_a_triton_kernel(tmp_path, monkeypatch):
    """A ``@triton.jit`` kernel is a target too (vLLM's slot-mapping kernel): its function's source is edited and
    jitted again, and the module's global (what launches look up) is the new kernel."""
    import importlib

    import torch

    name = f"slotscope_kernel_toy_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(KERNEL_TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module(name)
    try:
        rec = _apply(_yaml(tmp_path, f"""
            patches:
              - target: {name}.fill
                edits:
                  - match: "tl.store(out + offs, VALUE, mask=offs < n)"
                    replacement: "tl.store(out + offs, VALUE, mask=offs < n - 1)"
        """))
        assert rec["applied_by"] == "slotscope"
        out = torch.zeros(8, dtype=torch.int64)
        mod.fill[(1,)](out, 4, VALUE=7, BLOCK=8)
        assert out.tolist() == [7, 7, 7, 0, 0, 0, 0, 0]      # the patched mask: one row short
    finally:
        sys.modules.pop(name, None)


@pytest.mark.engine
def test_our_patcher_edits(toy, tmp_path):
    t = toy.__name__
    rec = _apply(_yaml(tmp_path, f"""
        patches:
          - target: {t}.add
            edits:
              - match: "total = a + b"
                replacement: "total = (a + b) * SCALE"
              - match: "return total"
                prepend: "total += 1"
          - target: {t}.Box.grow
            edits:
              - match: |
                  self.n += k
                  self.n += k
                append: |
                  self.n = -self.n
          - target: {t}.Box.twice
            edits:
              - match: "return 2 * x"
                replacement: "return 3 * x"
    """))
    assert toy.add(1, 2) == 31                     # replacement, the module's globals (SCALE), prepend
    toy.SCALE = 100
    assert toy.add(1, 2) == 301                    # the live module namespace, not a copy
    assert toy.Box(1).grow(2) == -5                # a method, a two-line match, append
    assert toy.Box.twice(2) == 6                   # a staticmethod stays one
    assert rec["applied_by"] == "slotscope"
    assert rec["sha256"] == hashlib.sha256(Path(rec["path"]).read_bytes()).hexdigest()


@pytest.mark.engine
@pytest.mark.parametrize("attr,ok_match,bad_match,why", [
    ("add", "return total", "total = a - b", "no match"),
    ("Box.grow", "return self.n", "self.n += k", "ambiguous match"),
])
def test_our_patcher_refuses(toy, tmp_path, attr, ok_match, bad_match, why):
    target = f"{toy.__name__}.{attr}"
    p = _yaml(tmp_path, f"""
        patches:
          - target: {target}
            edits:
              - match: "{ok_match}"
                prepend: "pass"
              - match: "{bad_match}"
                replacement: "pass"
    """)
    owner = toy.Box if "." in attr else toy
    before = owner.__dict__[attr.split(".")[-1]]
    with pytest.raises(EngineError) as e:
        _apply(p)
    msg = str(e.value)
    assert f"target {target}, edit 1 (match {bad_match!r})" in msg and why in msg, msg
    assert owner.__dict__[attr.split(".")[-1]] is before          # nothing was changed


@pytest.mark.engine
@pytest.mark.parametrize("signature,what", [
    ("def add(a, b, c=1):", "1 positional defaults where the release's function has 0"),
    ("def add(a, b, *, scale=2):", "keyword parameter(s) scale given a default"),
])
def test_a_patch_that_adds_a_default_is_refused(toy, tmp_path, signature, what):
    """Both patchers keep the release's defaults (they swap the code): a parameter a patch adds with a default is
    refused at check time, naming the target and the parameter, instead of a TypeError at the first call."""
    target = f"{toy.__name__}.add"
    p = _yaml(tmp_path, f"""
        patches:
          - target: {target}
            edits:
              - match: "def add(a, b):"
                replacement: "{signature}"
    """)
    with pytest.raises(EngineError) as e:
        _apply(p)
    assert f"target {target}: the patched signature has {what}" in str(e.value) and "**kwargs" in str(e.value)
    assert toy.add(1, 2) == 3                       # nothing was changed
    # a new argument through **kwargs applies
    _apply(_yaml(tmp_path, f"""
        patches:
          - target: {target}
            edits:
              - match: "def add(a, b):"
                replacement: "def add(a, b, **extra):"
              - match: "total = a + b"
                replacement: "total = a + b + extra.get('c', 0)"
    """))
    assert (toy.add(1, 2), toy.add(1, 2, c=4)) == (3, 7)


@pytest.mark.engine
def test_unknown_target(toy, tmp_path):
    for target in (f"{toy.__name__}.nope", f"{toy.__name__}.Box.nope", "no_such_pkg_xyz.mod.f"):
        with pytest.raises(EngineError, match=rf"target {target}: unknown target"):
            _apply(_yaml(tmp_path, f"""
                patches:
                  - target: {target}
                    edits:
                      - match: "x"
                        replacement: "y"
            """))


def slotscope(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return slotscope_cli(*args, env=env, timeout=timeout)


RUNS = {
    "b1+revert": ("scenarios/b1-pcg-dp-padding.toml", [REVERT], {}),
    "gap+fix": ("scenarios/gap-swa-shorter.toml", [FIX], {"SLOTSCOPE_ENGINE_PATCHER": "slotscope"}),
    "bad": ("scenarios/b1-pcg-dp-padding.toml", ["bad.yaml"], {}),
    "b1": ("scenarios/b1-pcg-dp-padding.toml", [], {}),
    "gap": ("scenarios/gap-swa-shorter.toml", [], {}),
}


def _bad_patch(base: Path) -> Path:
    """The revert with a match the release's source does not have."""
    bad = base / "bad.yaml"
    bad.write_text(REVERT.read_text().replace("self.swa_loc = self.swa_loc[: self.loc.shape[0]]",
                                              "self.swa_loc = self.swa_loc[:1]"))
    return bad


@pytest.fixture(scope="module")
def patched_runs(warm, tmp_path_factory):
    """The five runs, two at a time, each forked from a warm server of the session (tests/warm_engine.py): the two
    without a patch from its one import of 0.5.23, those with one from its import of the release's dependencies
    (the child imports the release and applies the patch, as a fresh process does)."""
    base = tmp_path_factory.mktemp("patched")
    bad = _bad_patch(base)

    def one(key):
        scenario, pats, env = RUNS[key]
        out = base / key.replace("+", "_")
        args = [scenario, "--engine", "sglang==0.5.23", "-q", "--no-report", "--trace-level", "off", "--out", str(out)]
        for p in pats:
            args += ["--engine-patch", str(bad if p == "bad.yaml" else p)]
        proc = warm("sglang==0.5.23").cli("run", *args, env=env)
        return key, proc, out

    with ThreadPoolExecutor(max_workers=2) as ex:
        return {k: (p, o) for k, p, o in ex.map(one, RUNS)}


def _findings(out: Path) -> dict:
    s = json.loads((out / "summary.json").read_text())
    return {b: {c: n for c, n in st["findings"].items() if n} for b, st in s["backends"].items()}


@pytest.mark.engine
def test_revert_reproduces_b1(patched_runs):
    proc, out = patched_runs["b1+revert"]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert _findings(out) == B1_REVERTED
    proc, out = patched_runs["b1"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _findings(out) == {b: {} for b in ALL}


@pytest.mark.engine
def test_fix_closes_gap(patched_runs):
    proc, out = patched_runs["gap+fix"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _findings(out) == {b: {} for b in ALL}
    proc, out = patched_runs["gap"]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert any(_findings(out).values())


@pytest.mark.engine
def test_outputs_name_patches(patched_runs):
    for key, by in (("b1+revert", "sglang"), ("gap+fix", "slotscope")):
        _, out = patched_runs[key]
        path = RUNS[key][1][0]
        want = [{"path": str(path.resolve()), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                 "applied_by": by}]
        assert json.loads((out / "summary.json").read_text())["engine"]["patches"] == want
        assert want[0]["sha256"] in (out / "run.json").read_text()
    _, out = patched_runs["b1"]
    assert "patches" not in json.loads((out / "summary.json").read_text())["engine"]


@pytest.mark.engine
def test_cli_bad_patch(patched_runs, tmp_path):
    proc, _ = patched_runs["bad"]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "KVWriteLoc.__post_init__, edit 0" in proc.stderr and "no match" in proc.stderr, proc.stderr
    proc = slotscope("run", "scenarios/b1-pcg-dp-padding.toml", "-q", "--no-report", "--out", str(tmp_path / "o2"),
                     "--engine-patch", str(REVERT))
    assert proc.returncode == 2 and "--engine-patch needs --engine" in proc.stderr, proc.stderr
