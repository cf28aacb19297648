"""engine_path without a release: the import shims on their own, the spec, the cache, and each bad input's
one clear error. Nothing here imports sglang in the test process (what needs an interpreter of its own
runs in a subprocess)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine_path import shims
from engine_path.errors import EngineError
from engine_path.releases import (EngineSpec, _classify_pip_failure, engines_dir, fetch, is_cached, parse_spec,
                                  release_dir)

ROOT = Path(__file__).resolve().parent.parent
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def _python(code: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=dict(os.environ, **(env or {})))


# --- spec and cache ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, version", [("sglang", None), ("sglang==0.5.23", "0.5.23"),
                                           (" SGLang==0.5.15.post1 ", "0.5.15.post1"),
                                           ("sglang==0.5.0rc2", "0.5.0rc2")])
def test_parse_spec(text, version):
    assert parse_spec(text) == EngineSpec("sglang", version)


@pytest.mark.parametrize("text, says", [("trtllm", "unknown engine 'trtllm'"), ("sglang>=0.5", "only '=='"),
                                        ("sglang==latest", "not a release version"),
                                        ("sglang==", "not a release version"), ("", "unknown engine")])
def test_bad_spec_is_one_clear_error(text, says):
    with pytest.raises(EngineError, match=says):
        parse_spec(text)


def test_cache_is_slotscopes_own(tmp_path, monkeypatch):
    monkeypatch.setenv("SLOTSCOPE_CACHE", str(tmp_path))
    assert engines_dir() == tmp_path / "engines"
    assert release_dir("0.5.23") == tmp_path / "engines" / "sglang-0.5.23"
    assert not is_cached("0.5.23")
    d = release_dir("0.5.23")
    (d / "sglang").mkdir(parents=True)
    (d / "sglang" / "__init__.py").write_text("")
    assert not is_cached("0.5.23")              # a package without its dist-info is a half install
    (d / "sglang-0.5.23.dist-info").mkdir()
    assert is_cached("0.5.23")
    assert fetch(EngineSpec("sglang", "0.5.23")) == d        # cached: no pip
    monkeypatch.delenv("SLOTSCOPE_CACHE")
    assert engines_dir() == Path.home() / ".cache" / "slotscope" / "engines"


def test_pip_failures_are_classified():
    spec = EngineSpec("sglang", "0.0.999")
    unknown = _classify_pip_failure(spec, "ERROR: Could not find a version that satisfies the requirement "
                                          "sglang==0.0.999 (from versions: 0.5.14, 0.5.15, 0.5.23)\n"
                                          "ERROR: No matching distribution found for sglang==0.0.999")
    assert "unknown version" in str(unknown) and "0.5.23" in str(unknown)
    net = _classify_pip_failure(spec, "WARNING: Retrying (Retry(total=0)) after connection broken by "
                                      "'NewConnectionError(...)'\nERROR: No matching distribution found")
    assert "cannot be reached" in str(net)
    none = _classify_pip_failure(spec, "ERROR: Could not find a version that satisfies the requirement "
                                       "sglang==0.0.999 (from versions: none)")
    assert "cannot be reached" in str(none)


@pytest.mark.engine
def test_unknown_version_names_what_was_tried(tmp_path, monkeypatch):
    monkeypatch.setenv("SLOTSCOPE_CACHE", str(tmp_path))
    with pytest.raises(EngineError, match=r"unknown version: sglang==0\.0\.999 is not on the package registry"):
        fetch(EngineSpec("sglang", "0.0.999"))
    assert not any((tmp_path / "engines").glob("*sglang*"))         # nothing half-installed left behind


@pytest.mark.engine
def test_unreachable_registry_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SLOTSCOPE_CACHE", str(tmp_path))
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    for k, v in {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple/",
                 "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": str(empty), "PIP_RETRIES": "0",
                 "PIP_TIMEOUT": "2"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(EngineError, match="the package registry cannot be reached"):
        fetch(EngineSpec("sglang", "0.5.23"))


def _fake_release(cache: Path, version: str, init: str, files: dict[str, str] | None = None) -> None:
    d = cache / "engines" / f"sglang-{version}"
    (d / "sglang").mkdir(parents=True)
    (d / "sglang" / "__init__.py").write_text(init)
    (d / f"sglang-{version}.dist-info").mkdir()
    for rel, text in (files or {}).items():
        p = d / "sglang" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="the shims ask transformers first: pip install -e '.[sglang]'")
def test_failed_import_and_unknown_api_are_one_clear_error(tmp_path):
    _fake_release(tmp_path, "9.9.1", "import not_a_module_slotscope_tests\n")
    _fake_release(tmp_path, "9.9.2", "", {"srt/__init__.py": "", "srt/mem_cache/__init__.py": "",
                                          "srt/mem_cache/memory_pool.py": "class KVWriteLoc: pass\n"})
    r = _python("""
        from engine_path.errors import EngineError
        from engine_path import api
        for v in ("9.9.1", "9.9.2"):
            try:
                api.load("sglang==" + v)
            except EngineError as e:
                print("ENGINE_ERROR", e)
    """, env={"SLOTSCOPE_CACHE": str(tmp_path)})
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("ENGINE_ERROR")]
    assert len(lines) == 2, r.stdout + r.stderr
    assert "importing sglang==9.9.1" in lines[0] and "'not_a_module_slotscope_tests' is missing" in lines[0]
    assert "sglang 9.9.2" in lines[1] and "does not know this API" in lines[1]
    assert "Traceback" not in r.stdout + r.stderr


def test_no_installed_sglang_is_one_clear_error():
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("an sglang is installed in this environment")
    from engine_path.releases import activate

    with pytest.raises(EngineError, match="no sglang is installed"):
        activate("sglang")


# --- the shims on their own --------------------------------------------------------------------------

def test_reexports_are_read_not_run(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text("raise RuntimeError('never executed')\nfrom pkgx.a import A, B as BB\nfrom .b import C\n"
                    "import os\nfrom elsewhere import D\n")
    assert shims.reexports(init, "pkgx") == {"A": "pkgx.a", "BB": "pkgx.a", "C": "pkgx.b"}


def test_lazy_package_skips_its_init_and_resolves_names_on_use(tmp_path, monkeypatch):
    pkg = tmp_path / "slotscope_lazy_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('the eager __init__ ran')\n"
                                     "from slotscope_lazy_pkg.heavy import Heavy\nfrom .light import Light\n")
    (pkg / "light.py").write_text("Light = 'light'\n")
    (pkg / "heavy.py").write_text("import slotscope_lazy_pkg.light\nHeavy = 'heavy'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    finder = shims.LazyPackageFinder(["slotscope_lazy_pkg"])
    sys.meta_path.insert(0, finder)
    try:
        import slotscope_lazy_pkg as lazy
        import slotscope_lazy_pkg.light as light

        assert light.Light == "light"
        assert "slotscope_lazy_pkg.heavy" not in sys.modules
        assert lazy.Heavy == "heavy"                 # resolved on first use, from the submodule the init names
        assert "slotscope_lazy_pkg.heavy" in sys.modules
        with pytest.raises(AttributeError):
            lazy.Missing
    finally:
        sys.meta_path.remove(finder)
        for name in [m for m in sys.modules if m.startswith("slotscope_lazy_pkg")]:
            del sys.modules[name]


def test_torchvision_stub_stands_in_without_fooling_transformers():
    """Fresh interpreter: transformers is asked first (answer cached False), then the stub serves imports."""
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("a real torchvision is installed: no stub is needed")
    if not HAS_TRANSFORMERS:
        pytest.skip("transformers not installed: pip install -e '.[sglang]'")
    r = _python("""
        from engine_path import shims
        rep = shims.install(triton_interpret=False)
        assert rep.torchvision_stubbed and rep.transformers_says_torchvision is False, rep
        from transformers.utils import import_utils as iu
        assert not iu.is_torchvision_available()
        assert not iu.is_torchvision_greater_or_equal("0.27")
        from torchvision.io import decode_jpeg
        try:
            decode_jpeg(b"")
        except RuntimeError as e:
            assert "slotscope stub" in str(e)
        assert shims.install() is rep                    # idempotent
        print("SHIMS_OK")
    """)
    assert "SHIMS_OK" in r.stdout, r.stdout + r.stderr


def test_the_stub_before_transformers_is_what_fails():
    """Why the order matters: a stub loaded before transformers' probe makes it parse the stub's version."""
    if importlib.util.find_spec("torchvision") is not None or not HAS_TRANSFORMERS:
        pytest.skip("needs transformers and no real torchvision")
    r = _python("""
        from engine_path import shims
        shims.stub_torchvision()
        from transformers.utils import import_utils as iu
        print("AVAILABLE", iu.is_torchvision_available())
    """)
    assert "AVAILABLE True" in r.stdout, r.stdout + r.stderr     # fooled: the stub looks installed


def test_native_stubs_serve_only_absent_packages_and_raise_when_called():
    """On a CUDA machine the release's CUDA branches import sgl_kernel / flashinfer: absent ones are stubbed
    (submodules too), an installed package is never shadowed, and calling a stub raises naming it."""
    import importlib
    import sys

    from engine_path.shims import NativeStubFinder

    finder = NativeStubFinder(("slotscope_absent_native", "json"))
    assert finder.roots == ("slotscope_absent_native",)          # json is installed: left to the real finder
    sys.meta_path.append(finder)
    try:
        mod = importlib.import_module("slotscope_absent_native.quantization")
        from slotscope_absent_native import gelu_and_mul          # what `if _is_cuda:` blocks do
        with pytest.raises(RuntimeError, match="slotscope_absent_native.gelu_and_mul is a slotscope stub: "
                                               "slotscope_absent_native is not installed"):
            gelu_and_mul(1)
        assert mod.__name__ == "slotscope_absent_native.quantization"
        # module-level code that only names a stub's attributes (0.5.23's quantization tables:
        # `{4: scalar_types.uint4b8}`) imports; calling one raises with its whole name
        from slotscope_absent_native import scalar_types
        table = {4: scalar_types.uint4b8, 8: scalar_types["uint8b128"]}
        with pytest.raises(RuntimeError, match=r"slotscope_absent_native\.scalar_types\.uint4b8 is a slotscope stub"):
            table[4]()
        assert finder.used == {"slotscope_absent_native"}
        assert importlib.import_module("json").dumps([1]) == "[1]"
    finally:
        sys.meta_path.remove(finder)
        for name in [m for m in sys.modules if m.startswith("slotscope_absent_native")]:
            del sys.modules[name]
