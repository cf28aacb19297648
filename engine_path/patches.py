"""Source patches on a release (``--engine-patch FILE.yaml``), in SGLang's own patch format.

The format (the one SGLang's ``debug_utils/source_patcher`` reads)::

    patches:
      - target: sglang.srt.mem_cache.memory_pool.KVWriteLoc.__post_init__   # a dotted function or method
        edits:
          - match: |            # a block of lines, compared line by line with leading/trailing blanks ignored
              ...
            replacement: |      # or prepend: / append: (one of the three; an empty replacement deletes)
              ...

How a patch is applied, right after the release is imported (:func:`apply_env`, called by
``releases.activate``):

* every patch is first checked here, against ``inspect.getsource`` of its target: an unknown target, an
  edit whose ``match`` is not found or is found more than once is an :class:`EngineError` naming the
  target and the edit (index and first line of its ``match``), before anything is changed;
* then, where the release has it (``sglang.srt.debug_utils.source_patcher.apply_patches_from_config``), the
  release's own patcher applies the file (``applied_by: "sglang"``); otherwise ours does
  (``applied_by: "slotscope"``): the edited source is compiled and executed in the target's module
  namespace and the new function replaces the old one on its class or module. A file with a staticmethod or
  classmethod target is ours too (the release's patcher reads the attribute's ``__code__``, which a
  staticmethod lacks), the record saying why (``"why"``).

The patches to apply travel in the environment (``SLOTSCOPE_ENGINE_PATCHES``, absolute paths joined by
``os.pathsep``), so ``engine_path.isolate``'s children (bisect, conform) apply them too. What was applied is
:func:`applied` (``[{"path", "sha256", "applied_by"}]``), which ``EngineInfo.to_json`` carries.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import linecache
import os
import sys
import textwrap
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from .errors import EngineError

ENV = "SLOTSCOPE_ENGINE_PATCHES"
_MODES = ("replacement", "prepend", "append")

_APPLIED: list[dict] = []


@dataclass
class Edit:
    match: str
    mode: str = "replacement"        # replacement | prepend | append
    text: str = ""

    def first_line(self) -> str:
        for line in self.match.splitlines():
            if line.strip():
                return line.strip()
        return ""


@dataclass
class Patch:
    target: str
    edits: list[Edit] = field(default_factory=list)
    preamble: str = ""


def _where(target: str, i: int, edit: Edit) -> str:
    return f"target {target}, edit {i} (match {edit.first_line()!r})"


def sha256_of(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def parse(text: str, source: str = "<patch>") -> list[Patch]:
    """The YAML text -> patches; EngineError naming ``source`` and the field when it is not the format."""
    import yaml

    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise EngineError(f"{source}: not YAML: {e}") from None
    if not isinstance(raw, dict) or set(raw) != {"patches"} or not isinstance(raw["patches"], list):
        raise EngineError(f"{source}: a patch file is a mapping with one key, 'patches', a list of "
                          f"{{target, edits}}")
    out = []
    for k, p in enumerate(raw["patches"]):
        if not isinstance(p, dict) or not isinstance(p.get("target"), str) or not isinstance(p.get("edits"), list):
            raise EngineError(f"{source}: patches[{k}] needs 'target' (a dotted name) and 'edits' (a list)")
        extra = set(p) - {"target", "edits", "preamble"}
        if extra:
            raise EngineError(f"{source}: patches[{k}] ({p['target']}): unknown keys {sorted(extra)}")
        edits = []
        for i, e in enumerate(p["edits"]):
            if not isinstance(e, dict) or not isinstance(e.get("match"), str):
                raise EngineError(f"{source}: target {p['target']}, edit {i}: needs 'match' (a code block)")
            bad = set(e) - {"match", *_MODES}
            if bad:
                raise EngineError(f"{source}: target {p['target']}, edit {i}: unknown keys {sorted(bad)} (an edit has "
                                  f"'match' and one of {', '.join(_MODES)})")
            modes = [m for m in _MODES if str(e.get(m) or "").strip()]
            if len(modes) > 1:
                raise EngineError(f"{source}: target {p['target']}, edit {i}: only one of replacement, prepend, "
                                  f"append may be set (got {', '.join(modes)})")
            mode = modes[0] if modes else "replacement"
            edits.append(Edit(e["match"], mode, str(e.get(mode) or "")))
        out.append(Patch(p["target"], edits, str(p.get("preamble") or "")))
    return out


def resolve(target: str) -> tuple[Any, str, Callable]:
    """``pkg.mod.Class.method`` -> (owner, attribute name, function); EngineError when unknown."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        owner = obj
        try:
            for name in parts[cut:]:
                owner, obj = obj, getattr(obj, name) if not isinstance(obj, type) else obj.__dict__[name]
        except (AttributeError, KeyError):
            break
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if not isinstance(obj, types.FunctionType) and not _is_kernel(obj):
            raise EngineError(f"target {target}: not a function or method ({type(obj).__name__})")
        return owner, parts[-1], obj
    raise EngineError(f"target {target}: unknown target (no such module, class or function)")


def _is_kernel(obj: Any) -> bool:
    """A Triton kernel (``@triton.jit``: a JITFunction, or an InterpretedFunction under ``TRITON_INTERPRET``): its
    Python function is ``.fn``, and it is launched as ``kernel[grid](...)``."""
    return isinstance(getattr(obj, "fn", None), types.FunctionType) and hasattr(obj, "__getitem__")


def _find(lines: list[str], match: list[str]) -> list[int]:
    want = [m.strip() for m in match]
    n = len(want)
    have = [l.strip() for l in lines]
    return [i for i in range(len(lines) - n + 1) if have[i:i + n] == want]


def _indent(text: str, spaces: int) -> list[str]:
    body = textwrap.dedent(text).splitlines()
    return [(" " * spaces + l) if l.strip() else "" for l in body]


def edit_source(source: str, target: str, edits: list[Edit]) -> str:
    """Apply ``edits`` to ``source`` one after another; EngineError naming the edit that does not apply."""
    lines = source.splitlines()
    for i, e in enumerate(edits):
        match = [l for l in textwrap.dedent(e.match).strip("\n").splitlines()]
        if not any(l.strip() for l in match):
            raise EngineError(f"{_where(target, i, e)}: the match is empty")
        hits = _find(lines, match)
        if not hits:
            raise EngineError(f"{_where(target, i, e)}: no match in the target's source")
        if len(hits) > 1:
            raise EngineError(f"{_where(target, i, e)}: ambiguous match ({len(hits)} places, lines "
                              f"{', '.join(str(h + 1) for h in hits)} of the target's source)")
        at, n = hits[0], len(match)
        spaces = len(lines[at]) - len(lines[at].lstrip())
        new = _indent(e.text, spaces) if e.text.strip() else []
        if e.mode == "replacement":
            lines[at:at + n] = new
        elif e.mode == "prepend":
            lines[at:at] = new
        else:
            lines[at + n:at + n] = new
    return "\n".join(lines) + "\n"


def _with_preamble(source: str, preamble: str) -> str:
    """Put ``preamble`` lines first in the function's body (after its signature)."""
    if not preamble.strip():
        return source
    tree_lines = source.splitlines()
    import ast

    fn = ast.parse(source).body[0]
    first = fn.body[0]
    at = first.lineno - 1
    spaces = len(tree_lines[at]) - len(tree_lines[at].lstrip())
    tree_lines[at:at] = _indent(preamble, spaces)
    return "\n".join(tree_lines) + "\n"


def patched_function(target: str, patch: Patch) -> tuple[Any, str, Callable, Callable]:
    """(owner, name, old function, new function) of ``patch``; nothing is changed yet."""
    owner, name, fn = resolve(target)
    kernel = _is_kernel(fn)
    if kernel:
        fn = fn.fn          # its source carries the @triton.jit decorator: the patched source is jitted again
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise EngineError(f"target {target}: its source is not available ({e})") from None
    new_src = _with_preamble(edit_source(src, target, patch.edits), patch.preamble)
    mod = inspect.getmodule(fn)
    ns = dict(vars(mod)) if mod is not None else {}
    if isinstance(owner, type):
        ns.setdefault("__class__", owner)
    filename = f"<patched {target}>"
    # its source readable through inspect (Triton's JIT compiles a kernel from its source lines; on a CPU the
    # interpreter did not need them)
    linecache.cache[filename] = (len(new_src), None, new_src.splitlines(True), filename)
    try:
        code = compile(new_src, filename, "exec")
        exec(code, ns)
    except Exception as e:
        raise EngineError(f"target {target}: the patched source does not compile or run: "
                          f"{type(e).__name__}: {e}") from None
    new = ns.get(fn.__name__)
    if kernel:
        if not _is_kernel(new):
            raise EngineError(f"target {target}: the patched source does not define the kernel {fn.__name__}")
        return owner, name, fn, new       # launched through its module's global: swapped there
    if isinstance(new, (staticmethod, classmethod)):     # its decorator came with the source; put back later
        new = new.__func__
    if not isinstance(new, types.FunctionType):
        raise EngineError(f"target {target}: the patched source does not define {fn.__name__}")
    _same_defaults(target, fn, new)
    # the module's globals, not the copy: the new function sees later changes to its module as the old did
    new = types.FunctionType(new.__code__, fn.__globals__, fn.__name__, fn.__defaults__, new.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__, new.__module__, new.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    return owner, name, fn, new


def _same_defaults(target: str, old, new) -> None:
    """EngineError where the patch changes which parameters have defaults: both patchers swap the function's code
    and keep the release's defaults (the release's source_patcher sets ``__code__``), so a parameter the patch adds
    with a default would have none and every call leaving it out would raise."""
    added = sorted(set(new.__kwdefaults__ or {}) - set(old.__kwdefaults__ or {}))
    n_old, n_new = len(old.__defaults__ or ()), len(new.__defaults__ or ())
    if added or n_new != n_old:
        what = (f"keyword parameter(s) {', '.join(added)} given a default" if added else
                f"{n_new} positional defaults where the release's function has {n_old}")
        raise EngineError(f"target {target}: the patched signature has {what}; a patched function keeps the "
                          f"release's defaults (its code is swapped), so take a new argument through **kwargs "
                          f"(examples/engine-patches/fix-39287-flashinfer-eagle-swa-start.yaml does)")


def check(patches: list[Patch]) -> None:
    """Every patch applies (target known, each match found exactly once); EngineError otherwise."""
    for p in patches:
        patched_function(p.target, p)


def apply_ours(patches: list[Patch]) -> None:
    """Our patcher: replace each target by its edited source, compiled in its module's namespace."""
    for p in patches:
        owner, name, _old, new = patched_function(p.target, p)
        raw = owner.__dict__.get(name) if isinstance(owner, type) else None
        if isinstance(raw, staticmethod):
            new = staticmethod(new)
        elif isinstance(raw, classmethod):
            new = classmethod(new)
        setattr(owner, name, new)


def _decorated(patches: list[Patch]) -> list[str]:
    """The targets that are a class's staticmethod or classmethod, or a decorator's wrapper of the function its
    source defines (``functools.wraps``: a ``contextlib.contextmanager``), whose code is not that source's."""
    out = []
    for p in patches:
        owner, name, fn = resolve(p.target)
        if (isinstance(owner, type) and isinstance(owner.__dict__.get(name), (staticmethod, classmethod))) or \
                hasattr(fn, "__wrapped__"):
            out.append(p.target)
    return out


def engine_patcher() -> Optional[Callable]:
    """The release's own ``apply_patches_from_config``, if it has one (SGLang's; a vLLM release has none)."""
    if "sglang" not in sys.modules:
        return None
    try:
        mod = importlib.import_module("sglang.srt.debug_utils.source_patcher")
    except Exception:
        return None
    fn = getattr(mod, "apply_patches_from_config", None)
    if fn is None:
        try:
            fn = getattr(importlib.import_module("sglang.srt.debug_utils.source_patcher.code_patcher"),
                         "apply_patches_from_config", None)
        except Exception:
            fn = None
    return fn if callable(fn) else None


def apply_file(path: str | Path, *, use_engine: bool = True) -> dict:
    """Check then apply one patch file; returns its ``{"path", "sha256", "applied_by"}``."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise EngineError(f"--engine-patch {path}: cannot read it ({e.strerror or e})") from None
    try:
        patches = parse(text, str(path))
        check(patches)
    except EngineError as e:
        msg = str(e)
        raise EngineError(msg if msg.startswith(str(path)) else f"--engine-patch {path}: {msg}") from None
    fn = engine_patcher() if use_engine else None
    why = ""
    if fn is not None and _decorated(patches):
        # the release's patcher takes the attribute's __code__: a staticmethod or classmethod has none
        fn, why = None, f"a static or class method or decorated target ({', '.join(_decorated(patches))}): the " \
                        f"release's patcher edits plain functions only"
    by = "slotscope"
    if fn is not None:
        try:
            fn(text)
            by = "sglang"
        except Exception as e:
            raise EngineError(f"--engine-patch {path}: the release's patcher refused it: "
                              f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    else:
        apply_ours(patches)
    rec = {"path": str(path), "sha256": sha256_of(path), "applied_by": by}
    if why:
        rec["why"] = why
    _APPLIED.append(rec)
    return rec


def applied() -> list[dict]:
    """The patches applied in this process, in order."""
    return [dict(r) for r in _APPLIED]


def env_paths() -> list[str]:
    v = os.environ.get(ENV, "")
    return [p for p in v.split(os.pathsep) if p]


def set_env(paths: list[str]) -> None:
    """Ask for ``paths`` to be applied when the release is activated (here and in isolate's children)."""
    if paths:
        os.environ[ENV] = os.pathsep.join(str(Path(p).resolve()) for p in paths)
    else:
        os.environ.pop(ENV, None)


def hashes(paths: list[str]) -> list[str]:
    """The patches' sha256, for cache keys (EngineError when one cannot be read)."""
    out = []
    for p in paths:
        try:
            out.append(sha256_of(p))
        except OSError as e:
            raise EngineError(f"--engine-patch {p}: cannot read it ({e.strerror or e})") from None
    return out


def apply_env() -> list[dict]:
    """Apply the patches the environment names (``releases.activate`` calls it right after the import)."""
    return [apply_file(p, use_engine=os.environ.get("SLOTSCOPE_ENGINE_PATCHER", "auto") != "slotscope")
            for p in env_paths()]
