"""Which vLLM runs: a release fetched by version into slotscope's cache (``--engine vllm==VERSION``), or the default.

The wheel is installed alone (``pip install --no-deps --target``, about 240 MB) into ``<cache>/vllm-VERSION``, as
SGLang's releases are (engine_path/releases.py); its pure-Python dependencies come from the ``vllm`` extra. The
wheel's compiled extensions are CUDA builds: on a CPU they fail to load and vLLM says so once ("Failed to import
from vllm._C"); nothing that runs here needs them. The worker's Triton kernels run under Triton's interpreter
(``TRITON_INTERPRET=1``); two stand-ins make that possible, each said in run.json: Triton reports an active driver
while vLLM imports (``vllm.triton_utils`` would otherwise hand out a placeholder), and ``UvaBuffer`` is the host
tensor itself. One release per process, as for SGLang.
"""
from __future__ import annotations

import importlib
import logging
import os
import sys
import warnings
from contextlib import contextmanager, nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

from .. import interpreter_fit
from ..errors import EngineError
from ..releases import EngineInfo, EngineSpec, fetch, is_cached

#: the release ``--engine vllm`` takes when no version is named: the newest on the registry when this was written
DEFAULT_VERSION = "0.34.0"
#: modules the scheduler side imports that the ``vllm`` extra provides (name -> the package to install)
DEPS = {"cachetools": "cachetools", "cbor2": "cbor2", "cloudpickle": "cloudpickle", "cpuinfo": "py-cpuinfo",
        "prometheus_client": "prometheus_client", "msgspec": "msgspec", "pydantic": "pydantic",
        "transformers": "transformers", "llguidance": "llguidance", "uvloop": "uvloop"}

_ACTIVE: Optional[EngineInfo] = None


def active() -> Optional[EngineInfo]:
    """The vLLM release this process imported, if any."""
    return _ACTIVE


def resolved(spec: EngineSpec) -> EngineSpec:
    """``vllm`` alone means the default release (no installed vLLM is looked for: a GPU build drags CUDA along)."""
    return spec if spec.version is not None else EngineSpec("vllm", DEFAULT_VERSION)


def missing_deps() -> list[str]:
    return [pkg for mod, pkg in DEPS.items() if importlib.util.find_spec(mod) is None]


def activate(spec: EngineSpec, device: str = "cpu") -> EngineInfo:
    """Import the release ``spec`` names (fetching it first if needed); EngineError on any failure. ``device``:
    "cpu" runs the worker's Triton kernels under Triton's interpreter (the host tensor as ``UvaBuffer``'s view);
    "cuda" natively, ``UvaBuffer`` being the release's own explicit-copy ``NonUvaBuffer`` (the device view of
    pinned memory needs ``vllm._C``, which slotscope does not use)."""
    global _ACTIVE
    spec = resolved(spec)
    if _ACTIVE is not None:
        if _ACTIVE.version == spec.version:
            return _ACTIVE
        raise EngineError(f"this process already imported vllm {_ACTIVE.version}; one release per process: run "
                          f"{spec} in its own process")
    if "sglang" in sys.modules:
        raise EngineError(f"{spec}: this process already imported sglang; one engine per process")
    lacking = missing_deps()
    if lacking:
        raise EngineError(f"--engine {spec} needs {', '.join(lacking)} (the vllm extra): pip install -e '.[vllm]'")
    fresh = not is_cached(spec.version, "vllm")
    if fresh:
        print(f"slotscope: fetching {spec} into slotscope's cache (the wheel, ~240 MB, once) ...", file=sys.stderr,
              flush=True)
    root = fetch(spec)
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    # quiet, CPU-agnostic import: vLLM's logger at warnings only, no usage reporting, its own CPU checks untouched
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
    mod = _import(spec, root, device == "cuda")
    # its loggers at that level even where vLLM left logging unconfigured (Python's last-resort handler would print
    # every warning bare, e.g. SchedulerConfig's on a small max_model_len)
    logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"])
    pkg = Path(mod.__file__).parent
    version = next((d.name[len("vllm-"):-len(".dist-info")] for d in root.glob("vllm-*.dist-info")), "unknown")
    if version != spec.version:
        raise EngineError(f"asked for {spec} but {root} holds vllm {version}")
    from .. import patches

    patches.apply_env()          # --engine-patch: right after the import, before anything uses the release
    _ACTIVE = EngineInfo("vllm", version, str(pkg))
    return _ACTIVE


def _import(spec: EngineSpec, root: Path, cuda: bool):
    """The release's modules a run uses, imported (the worker's kernels interpreted unless ``cuda``); EngineError
    naming what failed (a missing module: the package to install)."""
    if not cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # the worker's Triton kernels, run by Triton's interpreter on a CPU
    try:
        with warnings.catch_warnings(), (nullcontext() if cuda else _triton_driver_reported()):
            warnings.simplefilter("ignore")
            mod = importlib.import_module("vllm")
            importlib.import_module("vllm.triton_utils")
            importlib.import_module("vllm.v1.core.sched.scheduler")
            buffers = importlib.import_module("vllm.v1.worker.gpu.buffer_utils")
            if cuda:
                _cuda_device_type()
                buffers.UvaBuffer = buffers.NonUvaBuffer
            else:
                _host_uva(buffers)
            importlib.import_module("vllm.v1.worker.gpu.block_table")
            if not cuda:
                interpreter_fit.fit()   # a Triton <= 3.6 interpreter under NumPy 2.4 (engine_path/interpreter_fit.py)
            return mod
    except ModuleNotFoundError as e:
        _forget(root)
        extra = ("install the vllm extra: pip install -e '.[vllm]'" if spec.version == DEFAULT_VERSION else
                 f"the vllm extra covers what {DEFAULT_VERSION} imports; this release needs more: pip install "
                 f"{(e.name or '').split('.')[0].replace('_', '-')}")
        raise EngineError(f"importing {spec} from {root} failed: module {e.name!r} is missing; {extra}") from None
    except Exception as e:  # an import error of any kind is the user's to see, not a traceback
        _forget(root)
        raise EngineError(f"importing {spec} from {root} failed: {type(e).__name__}: {e}") from None


@contextmanager
def _triton_driver_reported():
    """While vLLM imports: Triton reports exactly one active driver, so ``vllm.triton_utils`` hands out the real
    Triton (whose interpreter runs the kernels here) instead of its placeholder: on a CPU machine it finds none, and
    one is reported; on a GPU machine (a ``--device cpu`` run there) the GPU's own is active already, and a second
    would make vLLM count two and fall back to its placeholder, whose kernels are plain functions."""
    import triton.backends as tb

    if sum(1 for name, b in tb.backends.items() if name != "cpu" and b.driver and _active(b.driver)) == 1:
        yield
        return

    class _Interpreter:
        @staticmethod
        def is_active() -> bool:
            return True

    key = "slotscope-interpreter"
    tb.backends[key] = SimpleNamespace(driver=_Interpreter, compiler=None)
    try:
        yield
    finally:
        tb.backends.pop(key, None)


def _active(driver) -> bool:
    try:
        return bool(driver.is_active())
    except Exception:        # a driver whose probe fails (no toolkit) is not active, as vLLM's own check takes it
        return False


def _cuda_device_type() -> None:
    """vLLM's CUDA platform imports its compiled extensions (``vllm._C_stable_libtorch``, built against the release's
    own torch), which slotscope neither carries nor uses; without them vLLM resolves an unspecified platform, whose
    empty ``device_type`` ``NonUvaBuffer`` would place its device tensors on. That platform says "cuda" instead
    (STAND_INS)."""
    plat = importlib.import_module("vllm.platforms").current_platform
    if not getattr(plat, "device_type", ""):
        plat.device_type = "cuda"


def _host_uva(buffer_utils) -> None:
    """``UvaBuffer`` is a device view of pinned host memory (CUDA only); on a CPU the host tensor is the view."""
    import torch

    class HostUvaBuffer:
        def __init__(self, size, dtype):
            self.cpu = torch.zeros(size, dtype=dtype)
            self.np = self.cpu.numpy()

        def uva(self, n=None):
            return self.cpu[:n] if n is not None else self.cpu

    buffer_utils.UvaBuffer = HostUvaBuffer


def _forget(root: Path) -> None:
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]
    while str(root) in sys.path:
        sys.path.remove(str(root))
