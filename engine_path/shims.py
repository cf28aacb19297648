"""What a CPU-only machine needs before it can import SGLang's memory modules.

None of this touches SGLang's files; it arranges the interpreter so that the parts of a release that
run on a CPU (allocators, pools, ``KVWriteLoc``, the index translator) import there:

* ``sglang.srt.configs`` eagerly imports about ninety model configs in its ``__init__``, some of
  which need torchvision. :class:`LazyPackageFinder` loads that package without running its
  ``__init__``: the package's submodules import as usual, and a name the ``__init__`` would have
  re-exported is resolved on first use, from the submodule the ``__init__``'s own ``from ... import``
  lines name (read with :mod:`ast`, never executed).
* Some releases import ``torchvision`` at the top of ``srt/utils/common.py``. A stub module stands in
  for it; transformers must not mistake the stub for an installed torchvision (its availability
  probe would then fail to parse the stub's version), so transformers is asked once, before the
  stub exists, whether torchvision is available, and caches the answer False.
* Releases up to 0.5.14 allocate pages with a Triton kernel even on a CPU; ``TRITON_INTERPRET=1``
  (set before Triton is imported) runs those kernels on CPU tensors. Not for a ``--device cuda`` run
  (``install(triton_interpret=False)``): there Triton runs on the GPU.
* On a machine where CUDA is available the release's modules take their CUDA branches at import
  (``_is_cuda = is_cuda()``) and import native packages there: ``sgl_kernel``, ``flashinfer`` and
  the like, which a GPU machine without SGLang's kernels lacks. :class:`NativeStubFinder` serves a
  stub for each of :data:`NATIVE_STUBS` that is not installed (any submodule too); calling anything of
  a stub raises. The write path never calls them: the store is ``_set_kv_buffer_impl`` (the JIT
  ``store_cache`` kernel or torch's index put). Which ones were stubbed is in :class:`ShimReport`.
* Some attention backends import a platform package at module level or in their constructor
  (flashattention and xpu: ``sgl_kernel``; musa: ``flash_attn_interface``). :class:`ScopedStubFinder`
  serves stubs for the packages :data:`IMPORT_STUBS` names, where not installed, while one of those
  backend modules is imported (by whoever imports it first: a backend adapter, or a patch naming a
  target there); :func:`stubbed_imports` does the same for a block (a backend's constructor,
  engine_path/forward/adapters_*.py). Afterwards the stubs are taken away again: no later import
  anywhere sees one (the backend's module keeps the names it bound).

:func:`install` applies all of them and is idempotent; it must run before the first ``import sglang``.
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

#: Packages whose ``__init__`` is not run; their re-exports resolve lazily.
LAZY_PACKAGES = ("sglang.srt.configs",)

#: Modules replaced by stubs (the memory modules never call into them on a CPU).
STUB_MODULES = ("torchvision", "torchvision.io", "torchvision.transforms", "torchvision.transforms.functional")

_STUB_MARK = "__slotscope_stub__"

#: native packages a release imports in its CUDA branches; stubbed only where absent and CUDA is available
#: (what the releases' module-level ``if _is_cuda:`` blocks import; optional packages tried in a
#: ``try: import ... except ImportError`` are not stubbed, so the release sees them absent)
NATIVE_STUBS = ("sgl_kernel", "flashinfer", "deep_gemm")


def reexports(init_file: Path, package: str) -> dict[str, str]:
    """``name -> submodule`` for every ``from <package>.<sub> import name`` (or relative) in an __init__."""
    tree = ast.parse(init_file.read_text(encoding="utf-8"), filename=str(init_file))
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 0 and node.module and node.module.startswith(package + "."):
            sub = node.module
        elif node.level == 1 and node.module:
            sub = f"{package}.{node.module}"
        else:
            continue
        for alias in node.names:
            if alias.name != "*":
                out[alias.asname or alias.name] = sub
    return out


class _LazyInitLoader(importlib.abc.Loader):
    """Makes the package module without executing its ``__init__``; attributes resolve on demand."""

    def __init__(self, origin: str):
        self.origin = origin

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        table = reexports(Path(self.origin), name)
        module.__dict__["__slotscope_lazy__"] = table

        def __getattr__(attr: str):
            sub = table.get(attr)
            if sub is None:
                raise AttributeError(f"module {name!r} has no attribute {attr!r}")
            value = getattr(importlib.import_module(sub), attr)
            setattr(module, attr, value)
            return value

        module.__getattr__ = __getattr__  # type: ignore[attr-defined]
        module.__all__ = sorted(table)  # type: ignore[attr-defined]


class LazyPackageFinder(importlib.abc.MetaPathFinder):
    """A meta-path finder that hands out lazy versions of the named packages."""

    def __init__(self, names: Sequence[str]):
        self.names = frozenset(names)

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.names:
            return None
        real = importlib.machinery.PathFinder.find_spec(fullname, path)
        if real is None or real.origin is None or real.submodule_search_locations is None:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, _LazyInitLoader(real.origin), origin=real.origin,
                                              is_package=True)
        spec.submodule_search_locations = list(real.submodule_search_locations)
        spec.has_location = True
        return spec


def _stub_module(name: str, missing: str = "torchvision") -> types.ModuleType:
    mod = types.ModuleType(name, f"slotscope stub: {missing} is not installed")
    setattr(mod, _STUB_MARK, True)
    mod.__version__ = "0.0.0+slotscope.stub"  # type: ignore[attr-defined]
    mod.__path__ = []  # type: ignore[attr-defined]  (a package, so stubbed submodules attach)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)

    def __getattr__(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{name}.{attr}", missing)

    mod.__getattr__ = __getattr__  # type: ignore[attr-defined]
    return mod


def is_stub(obj) -> bool:
    """Whether ``obj`` is one of slotscope's native-package stubs (a stub module or a name taken from one)."""
    return isinstance(obj, _Unavailable) or bool(getattr(obj, _STUB_MARK, False) if isinstance(obj, types.ModuleType)
                                                  else False)


class _Unavailable:
    """What a stub module's attribute is: raises when called; its own attributes are more of the same, so
    import-time code that only names them (``scalar_types.uint4b8`` in a table, a decorator) still imports."""

    def __init__(self, qualname: str, missing: str):
        self._qualname, self._missing = qualname, missing

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._qualname} is a slotscope stub: {self._missing} is not installed")

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self._qualname}.{attr}", self._missing)

    def __getitem__(self, key):
        return _Unavailable(f"{self._qualname}[{key!r}]", self._missing)

    def __repr__(self) -> str:
        return f"<slotscope stub {self._qualname}>"

    def __mro_entries__(self, bases):
        # a release class deriving from a stubbed one (``class _Fixed(TorchDistBackend)`` under a ``try`` that
        # expects ImportError on CUDA builds): the class is made, and making an instance of it raises
        qualname, missing = self._qualname, self._missing

        def __init__(self, *args, **kwargs):
            raise RuntimeError(f"{qualname} is a slotscope stub: {missing} is not installed")

        return (type(qualname.rsplit(".", 1)[-1], (), {"__init__": __init__, "__module__": "slotscope.stub"}),)


class _StubLoader(importlib.abc.Loader):
    def __init__(self, root: str):
        self.root = root

    def create_module(self, spec):
        return _stub_module(spec.name, self.root)

    def exec_module(self, module) -> None:
        return None


class NativeStubFinder(importlib.abc.MetaPathFinder):
    """Stubs for the native packages of :data:`NATIVE_STUBS` that are not installed (and their submodules)."""

    def __init__(self, roots: Sequence[str] = NATIVE_STUBS):
        self.roots = tuple(r for r in roots if importlib.machinery.PathFinder.find_spec(r) is None)
        #: the roots a module actually asked for (what the report names)
        self.used: set[str] = set()

    def find_spec(self, fullname, path, target=None):
        root = fullname.partition(".")[0]
        if root not in self.roots:
            return None
        self.used.add(root)
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(root), is_package=True)


@contextlib.contextmanager
def stubbed_imports(roots: Sequence[str]):
    """Stubs of the native packages ``roots`` that are not installed, for the imports made inside the block (a
    backend's module and its constructor's imports); afterwards the finder is removed and the stub modules leave
    ``sys.modules``, so a later ``import`` of the package raises ImportError as before. Yields the set of roots
    an import asked for."""
    finder = NativeStubFinder(roots)
    if not finder.roots:
        yield finder.used
        return
    sys.meta_path.append(finder)
    try:
        yield finder.used
    finally:
        sys.meta_path.remove(finder)
        for name in [m for m in sys.modules if m.partition(".")[0] in finder.roots]:
            if getattr(sys.modules[name], _STUB_MARK, False):
                del sys.modules[name]


#: release modules importing a platform package a CPU lacks, and the packages stubbed while each is imported
IMPORT_STUBS: dict[str, tuple[str, ...]] = {
    "sglang.srt.layers.attention.flashattention_backend": ("sgl_kernel",),
    "sglang.srt.layers.attention.xpu_backend": ("sgl_kernel",),
    "sglang.srt.hardware_backend.musa.attention.flashattention_backend": ("flash_attn_interface",),
}


class _ScopedStubLoader(importlib.abc.Loader):
    """A module's own loader, executing the module under :func:`stubbed_imports` of its packages."""

    def __init__(self, real, roots: tuple[str, ...], used: set):
        self.real, self.roots, self.used = real, roots, used

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module) -> None:
        with stubbed_imports(self.roots) as used:
            self.real.exec_module(module)
        self.used.update(used)

    def __getattr__(self, name):           # get_source, get_filename, ...: the real loader's
        return getattr(self.real, name)


class ScopedStubFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of ``table`` as the path finder does, with a loader that imports each under stubs of
    its packages (``used``: the packages a stub was served for)."""

    def __init__(self, table: dict[str, tuple[str, ...]] = IMPORT_STUBS):
        self.table = dict(table)
        self.used: set[str] = set()

    def find_spec(self, fullname, path, target=None):
        roots = self.table.get(fullname)
        if roots is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ScopedStubLoader(spec.loader, roots, self.used)
        return spec


def install_scoped_stubs() -> ScopedStubFinder:
    for finder in sys.meta_path:
        if isinstance(finder, ScopedStubFinder):
            return finder
    finder = ScopedStubFinder()
    sys.meta_path.insert(0, finder)
    return finder


def install_native_stubs() -> Optional[NativeStubFinder]:
    """The native-package stubs, on a machine where CUDA is available (None elsewhere: nothing to stub)."""
    for finder in sys.meta_path:
        if isinstance(finder, NativeStubFinder):
            return finder
    try:
        import torch

        if not torch.cuda.is_available():
            return None
    except Exception:
        return None
    finder = NativeStubFinder()
    sys.meta_path.append(finder)      # after the real finders: an installed package always wins
    return finder


def ask_transformers_first() -> Optional[bool]:
    """Ask transformers whether torchvision is available before any stub exists (caches the answer).

    Returns the answer, or None when transformers is not installed."""
    try:
        from transformers.utils import import_utils
    except ImportError:
        return None
    answer = bool(import_utils.is_torchvision_available())
    for probe in ("is_torchvision_v2_available",):
        fn = getattr(import_utils, probe, None)
        if fn is not None:
            fn()
    return answer


def stub_torchvision() -> bool:
    """Install the torchvision stubs unless the real package is importable; True if stubs were installed."""
    if "torchvision" in sys.modules and not getattr(sys.modules["torchvision"], _STUB_MARK, False):
        return False
    if "torchvision" not in sys.modules and importlib.machinery.PathFinder.find_spec("torchvision") is not None:
        return False
    for name in STUB_MODULES:
        if name not in sys.modules:
            sys.modules[name] = _stub_module(name)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, sys.modules[name])
    return True


def install_lazy_packages(names: Sequence[str] = LAZY_PACKAGES) -> LazyPackageFinder:
    for finder in sys.meta_path:
        if isinstance(finder, LazyPackageFinder) and finder.names == frozenset(names):
            return finder
    finder = LazyPackageFinder(names)
    sys.meta_path.insert(0, finder)
    return finder


@dataclass(frozen=True)
class ShimReport:
    torchvision_stubbed: bool
    transformers_says_torchvision: Optional[bool]
    lazy_packages: tuple[str, ...]
    triton_interpret: bool
    #: the finder of native-package stubs (CUDA machines only; its ``used`` names what was stubbed)
    native_stubs: Optional[NativeStubFinder] = None
    #: the finder of the backend modules' import-time stubs (:data:`IMPORT_STUBS`; ``used`` names what was served)
    import_stubs: Optional[ScopedStubFinder] = None

    @property
    def stubbed(self) -> list[str]:
        return sorted(self.native_stubs.used) if self.native_stubs is not None else []


_INSTALLED: Optional[ShimReport] = None


def installed() -> Optional[ShimReport]:
    """The shims this process installed (None: not yet)."""
    return _INSTALLED


def install(*, triton_interpret: bool = True) -> ShimReport:
    """Apply every shim (idempotent). Must run before the first ``import sglang`` in the process."""
    global _INSTALLED
    if _INSTALLED is not None:
        return _INSTALLED
    if triton_interpret and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    answer = ask_transformers_first()
    stubbed = stub_torchvision()
    install_lazy_packages()
    _INSTALLED = ShimReport(torchvision_stubbed=stubbed, transformers_says_torchvision=answer,
                            lazy_packages=LAZY_PACKAGES,
                            triton_interpret=os.environ.get("TRITON_INTERPRET") == "1",
                            native_stubs=install_native_stubs(), import_stubs=install_scoped_stubs())
    return _INSTALLED
