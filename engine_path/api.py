"""The release's write-path API, as the adapters use it, and what it has (found by probing, not by version).

:func:`load` imports the handful of SGLang modules the adapters drive and checks that the names they
need exist; an installed sglang whose API differs gets one :class:`EngineError` naming what is missing.
:class:`Features` records what this release has, each found by probing the module (a field of a
dataclass, a parameter of a function, a behaviour on a two-element input, a call in a backend's
source file), so an unreleased checkout is described by what it does, not by its version string.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

from .errors import EngineError
from .releases import EngineInfo, EngineSpec, activate

#: (module, attribute) pairs every adapter needs
REQUIRED = (
    ("sglang.srt.mem_cache.memory_pool", "KVWriteLoc"),
    ("sglang.srt.mem_cache.memory_pool", "MHATokenToKVPool"),
    ("sglang.srt.mem_cache.swa_memory_pool", "SWAKVPool"),
    ("sglang.srt.mem_cache.allocator.swa", "SWATokenToKVPoolAllocator"),
    ("sglang.srt.mem_cache.common", "free_swa_out_of_window_slots"),
)

#: the eight modelled backends -> their module files inside the package (musa inherits fa3's metadata)
BACKEND_FILES = {
    "flashinfer": ("srt/layers/attention/flashinfer_backend.py",),
    "triton": ("srt/layers/attention/triton_backend.py",),
    "flashattention": ("srt/layers/attention/flashattention_backend.py",),
    "trtllm_mha": ("srt/layers/attention/trtllm_mha_backend.py",),
    "aiter": ("srt/layers/attention/aiter_backend.py",),
    "xpu": ("srt/layers/attention/xpu_backend.py",),
    "torch_native": ("srt/layers/attention/torch_native_backend.py",),
    "musa": ("srt/hardware_backend/musa/attention/flashattention_backend.py",
             "srt/layers/attention/flashattention_backend.py"),
}


@dataclass(frozen=True)
class Features:
    """What a release's write path has."""

    #: KVWriteLoc cuts a longer swa_loc to len(loc) in __post_init__ (#29460; 0.5.15+)
    has_post_init_slice: bool
    #: KVWriteLoc's fields (loc, swa_loc [, full_loc [, physical]])
    write_loc_fields: tuple[str, ...]
    #: KVIndexTranslator / KVLocPlan exist (plan write ids; 0.5.22+)
    has_plan_ids: bool
    #: backends whose metadata init takes SWA ids from the plan (the rest call translate_loc_from_full_to_swa)
    plan_backends: frozenset[str]
    #: SWAKVPool.__init__ takes enable_kvcache_transpose (0.5.14)
    pool_takes_transpose_flag: bool
    #: the eviction rule's request interface: "kv" (it reads req.kv, a ReqKvInfo) or "req" (fields on the request)
    eviction_api: str
    #: parameters of free_swa_out_of_window_slots beyond the common ones
    eviction_params: tuple[str, ...]
    #: the paged allocator has a CPU (non-Triton) path; without it alloc_extend needs TRITON_INTERPRET=1 on CPU
    paged_alloc_has_cpu_path: bool
    #: the SWA allocator has free_swa_segment (the eviction rule's free) and free_full
    has_free_swa_segment: bool
    has_free_full: bool

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["plan_backends"] = sorted(self.plan_backends)
        d["write_loc_fields"] = list(self.write_loc_fields)
        d["eviction_params"] = list(self.eviction_params)
        return d


@dataclass
class ReleaseAPI:
    """The imported release: its modules, classes and features."""

    info: EngineInfo
    features: Features
    KVWriteLoc: type
    MHATokenToKVPool: type
    SWAKVPool: type
    SWATokenToKVPoolAllocator: type
    free_swa_out_of_window_slots: Any
    modules: dict[str, ModuleType] = field(default_factory=dict)
    KVIndexTranslator: Optional[type] = None
    IdSpaceKind: Any = None
    ReqKvInfo: Optional[type] = None
    ComponentType: Any = None

    @property
    def package_dir(self) -> Path:
        return Path(self.info.path)


def _import(name: str, info: EngineInfo) -> ModuleType:
    from . import shims
    from .releases import stub_note

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (e.name == name or name.startswith(e.name + ".")) and e.name.startswith("sglang"):
            raise EngineError(f"sglang {info.version} at {info.path}: the adapter does not know this API: "
                              f"module {name} is missing (known releases: 0.5.14 .. 0.5.23)") from None
        raise EngineError(f"importing {name} from sglang {info.version} at {info.path} failed: module "
                          f"{e.name!r} is missing; install the engine's dependencies with "
                          f"pip install -e '.[sglang]'{stub_note(shims.installed())}") from None
    except Exception as e:
        raise EngineError(f"importing {name} from sglang {info.version} at {info.path} failed: "
                          f"{type(e).__name__}: {e}{stub_note(shims.installed())}") from None


def _optional(name: str) -> Optional[ModuleType]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return importlib.import_module(name)
    except Exception:
        return None


def probe_post_init_slice(kv_write_loc: type) -> bool:
    """Build a KVWriteLoc with a longer swa_loc and see whether it comes back cut."""
    import torch

    wl = kv_write_loc(torch.arange(2), torch.arange(3))
    return int(wl.swa_loc.shape[0]) == 2


def _source_calls(package_dir: Path, files: tuple[str, ...], needle: str) -> bool:
    for rel in files:
        p = package_dir / rel
        try:
            if needle in p.read_text(encoding="utf-8", errors="replace"):
                return True
        except OSError:
            continue
    return False


_ASSIGNS_SWA_LOC = re.compile(r"swa_out_cache_loc\s*=[^=]")


def _assigns_swa_loc(package_dir: Path, rel: str) -> bool:
    try:
        return bool(_ASSIGNS_SWA_LOC.search((package_dir / rel).read_text(encoding="utf-8", errors="replace")))
    except OSError:
        return False


def probe_plan_backends(package_dir: Path, has_plan_ids: bool) -> frozenset[str]:
    """Backends whose metadata init takes SWA ids from the plan (``write_ids(``), read in the release's files.

    A backend's SWA ids come from the first of its files that sets ``swa_out_cache_loc`` (musa's own
    file only reads it: its metadata is fa3's); that file calling ``write_ids(`` means the plan.
    """
    if not has_plan_ids:
        return frozenset()
    out = set()
    for name, files in BACKEND_FILES.items():
        owner = next((rel for rel in files if _assigns_swa_loc(package_dir, rel)), files[-1])
        if _source_calls(package_dir, (owner,), "write_ids("):
            out.add(name)
    return frozenset(out)


def _has_cpu_paged_path(paged_mod: Optional[ModuleType]) -> bool:
    if paged_mod is None:
        return False
    try:
        src = inspect.getsource(paged_mod.PagedTokenToKVPoolAllocator.alloc_extend)
    except (OSError, TypeError, AttributeError):
        return False
    return "naive" in src


def load(spec: EngineSpec | str | None = None, *, device: str = "cpu") -> ReleaseAPI:
    """Activate the release (fetching it if needed), import the write-path modules, probe the features."""
    info = activate(spec if spec is not None else EngineSpec(), device=device)
    got: dict[str, Any] = {}
    modules: dict[str, ModuleType] = {}
    for mod_name, attr in REQUIRED:
        mod = modules.get(mod_name) or _import(mod_name, info)
        modules[mod_name] = mod
        if not hasattr(mod, attr):
            raise EngineError(f"sglang {info.version} at {info.path}: the adapter does not know this API: "
                              f"{mod_name}.{attr} is missing (known releases: 0.5.14 .. 0.5.23)")
        got[attr] = getattr(mod, attr)
    kvl = got["KVWriteLoc"]
    if not dataclasses.is_dataclass(kvl) or "loc" not in {f.name for f in dataclasses.fields(kvl)}:
        raise EngineError(f"sglang {info.version} at {info.path}: KVWriteLoc is not the dataclass with a loc field "
                          f"that the adapter knows")
    translator_mod = _optional("sglang.srt.mem_cache.kv_index_translator")
    plan_mod = _optional("sglang.srt.mem_cache.kv_loc_plan")
    has_plan = bool(translator_mod is not None and hasattr(translator_mod, "KVIndexTranslator")
                    and plan_mod is not None and hasattr(plan_mod, "IdSpaceKind"))
    rule = got["free_swa_out_of_window_slots"]
    params = tuple(inspect.signature(rule).parameters)
    common = {"req", "pre_len", "sliding_window_size", "page_size", "req_to_token_pool", "token_to_kv_pool_allocator"}
    if not common.issubset(params):
        raise EngineError(f"sglang {info.version} at {info.path}: free_swa_out_of_window_slots{params} is not an "
                          f"eviction rule the adapter knows")
    # whether the rule reads req.kv, from its byte code's names (0.5.14 and 0.5.15 read none, 0.5.23 reads req.kv):
    # not its source, which a function recompiled by --engine-patch does not have (inspect then reads other lines)
    code = getattr(rule, "__code__", None)
    uses_req_kv = bool(code is not None and "kv" in code.co_names)
    sched = _optional("sglang.srt.managers.schedule_batch") if uses_req_kv else None
    comp = None
    if "component_type" in params:
        comp_mod = _optional("sglang.srt.mem_cache.unified_cache.component_type")
        comp = getattr(comp_mod, "ComponentType", None)
    alloc_cls = got["SWATokenToKVPoolAllocator"]
    features = Features(
        has_post_init_slice=probe_post_init_slice(kvl),
        write_loc_fields=tuple(f.name for f in dataclasses.fields(kvl)),
        has_plan_ids=has_plan,
        plan_backends=probe_plan_backends(Path(info.path), has_plan),
        pool_takes_transpose_flag="enable_kvcache_transpose" in inspect.signature(got["SWAKVPool"].__init__).parameters,
        eviction_api="kv" if uses_req_kv else "req",
        eviction_params=tuple(p for p in params if p not in common),
        paged_alloc_has_cpu_path=_has_cpu_paged_path(_optional("sglang.srt.mem_cache.allocator.paged")),
        has_free_swa_segment=hasattr(alloc_cls, "free_swa_segment"),
        has_free_full=hasattr(alloc_cls, "free_full"),
    )
    return ReleaseAPI(
        info=info, features=features, modules=modules,
        KVWriteLoc=kvl, MHATokenToKVPool=got["MHATokenToKVPool"], SWAKVPool=got["SWAKVPool"],
        SWATokenToKVPoolAllocator=alloc_cls, free_swa_out_of_window_slots=rule,
        KVIndexTranslator=getattr(translator_mod, "KVIndexTranslator", None) if has_plan else None,
        IdSpaceKind=getattr(plan_mod, "IdSpaceKind", None) if has_plan else None,
        ReqKvInfo=getattr(sched, "ReqKvInfo", None) if sched is not None else None,
        ComponentType=comp,
    )
