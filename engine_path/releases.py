"""Which SGLang runs: the installed one, or a release fetched by version into slotscope's own cache.

``--engine sglang`` uses whatever ``import sglang`` finds (a user's editable checkout included);
``--engine sglang==VERSION`` installs that release alone (``pip install --no-deps --target``) into
``<cache>/sglang-VERSION`` and imports it from there. The cache is ``$SLOTSCOPE_CACHE/engines`` when
``SLOTSCOPE_CACHE`` is set, else ``~/.cache/slotscope/engines``; one directory per version, and the
releases' dependencies are the ones installed in the environment (the ``sglang`` extra).

One release per process: a Python process can hold one ``sglang`` package, so :func:`activate`
refuses a second, different release. Commands that need several releases (bisection) run one
subprocess per release (:mod:`engine_path.isolate`).
"""
from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from .errors import EngineError

#: the engines a spec may name; each gets its own ``NAME`` / ``NAME==VERSION`` (vLLM: engine_path/vllm/)
ENGINE_NAMES = ("sglang", "vllm")
_VERSION_RE = re.compile(r"^\d+(\.\d+){1,3}((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")
FETCH_TIMEOUT_S = 900

_NET_ERRORS = ("NewConnectionError", "Failed to establish a new connection", "Network is unreachable",
               "Temporary failure in name resolution", "Name or service not known", "Max retries exceeded",
               "ConnectionError", "ConnectTimeout", "ReadTimeout", "Could not fetch URL", "SSLError",
               "No route to host", "Connection refused")


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """Which engine runs: its name and, optionally, a release. ``version`` None means the installed package.

    Made by :func:`parse_spec` from ``NAME`` or ``NAME==VERSION``; a spec built directly is checked the same
    way, so no command ever holds one that names an engine slotscope cannot drive."""

    name: str = "sglang"
    version: Optional[str] = None

    def __post_init__(self) -> None:
        problem = _problem(self.name, self.version)
        if problem is not None:
            raise EngineSpecError(str(self), problem)

    def __str__(self) -> str:
        return self.name if self.version is None else f"{self.name}=={self.version}"


class EngineSpecError(EngineError):
    """A spec that names no engine slotscope drives, or no release. ``problem`` says what is wrong without
    saying where the spec came from (an option, a scenario field, a grid entry): :meth:`at` adds that."""

    def __init__(self, text: str, problem: str):
        self.text, self.problem = text, problem
        super().__init__(f"--engine {text!r}: {problem}")

    def at(self, where: str) -> EngineError:
        """The same error, naming ``where`` the spec was read (e.g. ``FILE: engine_release``)."""
        return EngineError(f"{where}: {self.text!r}: {self.problem}")


def _forms(name: str) -> str:
    return f"{name!r} or '{name}==VERSION'"


def _problem(name: str, version: Optional[str]) -> Optional[str]:
    """What is wrong with an engine name and version, in words (None: nothing)."""
    if name not in ENGINE_NAMES:
        return (f"unknown engine {name!r} (known: {', '.join(ENGINE_NAMES)}); use "
                f"{' or '.join(_forms(n) for n in ENGINE_NAMES)}, e.g. sglang==0.5.23")
    if version is not None and not _VERSION_RE.match(version):
        return f"{version!r} is not a release version (e.g. 0.5.23, 0.5.15.post1)"
    return None


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """The engine a run used (summary.json's ``"engine"``)."""

    name: str
    version: str
    path: str

    def to_json(self) -> dict:
        from .patches import applied

        d = asdict(self)
        if applied():
            d["patches"] = applied()      # --engine-patch: [{"path", "sha256", "applied_by"}]
        return d


def parse_spec(text: str) -> EngineSpec:
    """``sglang`` or ``sglang==VERSION`` (e.g. ``sglang==0.5.23``); anything else is an EngineSpecError."""
    raw = text.strip()
    m = re.match(r"^([A-Za-z0-9_-]*)\s*(.*)$", raw)
    name, rest = (m.group(1).lower(), m.group(2).strip()) if m else (raw.lower(), "")
    version = None
    if rest and name in ENGINE_NAMES:
        if not rest.startswith("==") or rest.startswith("==="):
            raise EngineSpecError(text, f"use {_forms(name)} (only '==' is supported)")
        version = rest[2:].strip()
    problem = _problem(name, version)
    if problem is not None:
        raise EngineSpecError(text, problem)
    return EngineSpec(name, version)


def engines_dir() -> Path:
    root = os.environ.get("SLOTSCOPE_CACHE")
    return (Path(root).expanduser() / "engines") if root else Path.home() / ".cache" / "slotscope" / "engines"


def release_dir(version: str, name: str = "sglang") -> Path:
    return engines_dir() / f"{name}-{version}"


def is_cached(version: str, name: str = "sglang") -> bool:
    d = release_dir(version, name)
    return (d / name / "__init__.py").is_file() and any(d.glob(f"{name}-{version}.dist-info"))


def _classify_pip_failure(spec: EngineSpec, out: str) -> EngineError:
    tail = "\n".join(line for line in out.strip().splitlines()[-6:])
    if any(s in out for s in _NET_ERRORS) or "(from versions: none)" in out:
        return EngineError(f"could not fetch {spec}: the package registry cannot be reached (pip install "
                           f"--no-deps {spec} found no release of {spec.name} at all, or failed with a network "
                           f"error). Last lines:\n{tail}")
    if "No matching distribution" in out or "Could not find a version" in out:
        m = re.search(r"\(from versions: ([^)]*)\)", out)
        known = ""
        if m:
            versions = [v.strip() for v in m.group(1).split(",") if v.strip()]
            known = f" The newest releases on the registry: {', '.join(versions[-12:])}"
        return EngineError(f"unknown version: {spec} is not on the package registry (as a wheel: slotscope "
                           f"imports a release from its wheel, never builds one).{known}")
    return EngineError(f"could not fetch {spec} (pip install --no-deps --only-binary=:all: --target "
                       f"{release_dir(spec.version, spec.name)} {spec} failed). Last lines:\n{tail}")


def fetch(spec: EngineSpec, *, quiet: bool = True) -> Path:
    """The release's directory in the cache, installing it there first if it is absent."""
    if spec.version is None:
        raise EngineError("fetch needs a version (sglang==VERSION)")
    final = release_dir(spec.version, spec.name)
    if is_cached(spec.version, spec.name):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-input", "--disable-pip-version-check",
           "--only-binary=:all:", "--target", str(tmp), str(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        shutil.rmtree(tmp, ignore_errors=True)
        raise EngineError(f"could not fetch {spec}: pip did not finish in {FETCH_TIMEOUT_S} s "
                          f"(is the package registry reachable?)") from None
    except OSError as e:
        raise EngineError(f"could not fetch {spec}: cannot run pip ({e})") from None
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _classify_pip_failure(spec, proc.stdout + proc.stderr)
    if not quiet:
        sys.stderr.write(proc.stdout[-2000:])
    try:
        os.replace(tmp, final)     # atomic: a half-installed release is never seen as cached
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not is_cached(spec.version, spec.name):   # not another process that won the race
            raise EngineError(f"could not fetch {spec}: cannot move it into {final} (a broken directory is "
                              f"there: remove it)") from None
    return final


_ACTIVE: Optional[EngineInfo] = None


def active() -> Optional[EngineInfo]:
    """The release this process imported, if any."""
    return _ACTIVE


def _installed_version(pkg_dir: Path) -> str:
    for dist in pkg_dir.parent.glob("sglang-*.dist-info"):
        return dist.name[len("sglang-"):-len(".dist-info")]
    mod = sys.modules.get("sglang")
    v = getattr(mod, "__version__", None)
    if v:
        return str(v)
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _same(info: EngineInfo, spec: EngineSpec) -> bool:
    return spec.version is None or spec.version == info.version


def activate(spec: EngineSpec | str, *, fetch_missing: bool = True, device: str = "cpu") -> EngineInfo:
    """Import the release ``spec`` names (fetching it first if needed) and return what was imported.

    ``device``: where its objects will live; "cuda" leaves Triton alone (no ``TRITON_INTERPRET``)."""
    global _ACTIVE
    if isinstance(spec, str):
        spec = parse_spec(spec)
    if _ACTIVE is not None:
        if _same(_ACTIVE, spec):
            return _ACTIVE
        raise EngineError(f"this process already imported sglang {_ACTIVE.version} from {_ACTIVE.path}; "
                          f"one release per process: run {spec} in its own process (engine_path.isolate)")
    if "sglang" in sys.modules:
        pkg = Path(getattr(sys.modules["sglang"], "__file__", "") or ".").parent
        info = EngineInfo("sglang", _installed_version(pkg), str(pkg))
        if not _same(info, spec):
            raise EngineError(f"sglang {info.version} from {info.path} is already imported in this process; "
                              f"{spec} needs a process of its own")
        _ACTIVE = info
        return info
    where = "the installed sglang"
    if spec.version is not None:
        if not is_cached(spec.version) and not fetch_missing:
            raise EngineError(f"{spec} is not in the cache {engines_dir()} (fetching disabled)")
        root = fetch(spec)
        where = f"{spec} from {root}"
        sys.path.insert(0, str(root))
        importlib.invalidate_caches()
    elif importlib.util.find_spec("sglang") is None:
        raise EngineError("--engine sglang: no sglang is installed in this environment; install it "
                          "(pip install sglang, or pip install -e YOUR_CHECKOUT/python) or ask for a release, "
                          "e.g. --engine sglang==0.5.23")
    from . import shims

    rep = shims.install(triton_interpret=device == "cpu")
    try:
        with warnings.catch_warnings():
            # import-time notices of a CPU-only machine ("Only CUDA ... support AWQ", "Triton is not supported")
            warnings.simplefilter("ignore", UserWarning)
            mod = importlib.import_module("sglang")
    except ModuleNotFoundError as e:
        _forget(spec)
        raise EngineError(f"importing {where} failed: module {e.name!r} is missing; install the engine's "
                          f"dependencies with pip install -e '.[sglang]'{stub_note(rep)}") from None
    except Exception as e:  # an import error of any kind is the user's to see, not a traceback
        _forget(spec)
        raise EngineError(f"importing {where} failed: {type(e).__name__}: {e}{stub_note(rep)}") from None
    if rep.triton_interpret:
        from . import interpreter_fit

        interpreter_fit.fit()           # a Triton <= 3.6 interpreter under NumPy 2.4
    pkg = Path(mod.__file__).parent
    info = EngineInfo("sglang", _installed_version(pkg), str(pkg))
    if spec.version is not None and info.version != spec.version:
        raise EngineError(f"asked for {spec} but imported sglang {info.version} from {info.path}")
    from . import patches

    patches.apply_env()          # --engine-patch: right after the import, before anything uses the release
    _ACTIVE = info
    return info


def stub_note(rep) -> str:
    """What the import ran on, where CUDA made the release take its CUDA branches."""
    if getattr(rep, "native_stubs", None) is None:
        return ""
    used = rep.stubbed
    return (f" (CUDA is available here, so the release imported its CUDA branches; absent native packages "
            f"stubbed by slotscope: {', '.join(used) if used else 'none asked for'})")


def _forget(spec: EngineSpec) -> None:
    """Drop a half-imported sglang so the error is the only trace it leaves."""
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]
    if spec.version is not None:
        root = str(release_dir(spec.version, spec.name))
        while root in sys.path:
            sys.path.remove(root)
