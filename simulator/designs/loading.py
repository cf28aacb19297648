"""Loading a design: by name from the catalogue, or a user's file.py:ClassName; one instance per backend."""
from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from typing import Optional

from simulator.designs.base import Design
from simulator.designs.catalogue import BUILTIN_DESIGNS
from simulator.designs.types import DesignError
from simulator.engine_model.padding_convention import PaddingConvention, padding_convention
from simulator.scenario import design_file_spec


#: built-in designs renamed, old name -> new (the old name is refused naming the new one)
RENAMED = {"vllm-skip-1": "sglang-skip-minus-1", "vllm-skip-1-pre-24743": "sglang-skip-minus-1-pre-24743"}


def design_instance(design: Design) -> Design:
    """A fresh instance of a design for one (backend, model side): a deep copy of the given one."""
    try:
        return copy.deepcopy(design)
    except Exception as e:
        raise DesignError(f"design {design.name}: the run makes one copy per backend and model side, and "
                          f"copy.deepcopy failed: {type(e).__name__}: {e}") from e


def load_design(spec: str) -> Design:
    """A design by name, or ``path/to/file.py:ClassName`` for a user's own (imported: its code runs)."""
    if not isinstance(spec, str):
        raise DesignError(f"a design is a name or path/to/file.py:ClassName (a string), got {spec!r}")
    if spec in BUILTIN_DESIGNS:
        return BUILTIN_DESIGNS[spec]()
    if spec in RENAMED:
        raise DesignError(f"design {spec!r} is now {RENAMED[spec]!r}: it is SGLang's design under vLLM's -1 padding "
                          f"convention, not a model of vLLM (vLLM itself runs as --engine vllm)")
    file_spec = design_file_spec(spec)
    if file_spec is None:
        raise DesignError(f"unknown design {spec!r}: use one of {', '.join(sorted(BUILTIN_DESIGNS))} "
                          f"or path/to/file.py:ClassName")
    path, cls_name = Path(file_spec[0]), file_spec[1]
    where = f"{path}:{cls_name}"
    cls = getattr(_import_file(path), cls_name, None)
    if cls is None:
        raise DesignError(f"design file {path} has no class {cls_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Design)):
        raise DesignError(f"{where} must subclass simulator.designs.Design")
    try:
        design = cls()
    except (Exception, SystemExit) as e:
        raise DesignError(f"{where}() raised {type(e).__name__}: {e}") from e
    design_padding(design, where)
    name = getattr(design, "name", None)
    if name == Design.name:
        design.name = f"{path.name}:{cls_name}"      # no name of its own: the file and class name it
    else:
        _check_name(name, f"{where}.name")
    return design


def _import_file(path: Path):
    """The module of a user's design file (its top-level code runs); DesignError naming the file on any failure."""
    if not path.exists():
        raise DesignError(f"design file {path} does not exist")
    if not path.is_file():
        raise DesignError(f"design file {path} is {'a directory' if path.is_dir() else 'not a regular file'}, "
                          f"not a Python file")
    mod_name = f"slotscope_user_design_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(mod_name, path)
    if module_spec is None or module_spec.loader is None:
        raise DesignError(f"design file {path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[mod_name] = module
    try:
        module_spec.loader.exec_module(module)
    except DesignError as e:
        del sys.modules[mod_name]
        raise DesignError(f"design file {path}: {e}") from e
    except (Exception, SystemExit) as e:  # the user's file (sys.exit at import too): report, no traceback
        del sys.modules[mod_name]
        raise DesignError(f"design file {path} failed to import: {type(e).__name__}: {e}") from e
    return module


def _check_name(name: object, where: str) -> None:
    """A design's name is shown in every table, summary and span: a non-empty string of one line."""
    if not isinstance(name, str):
        raise DesignError(f"{where}: must be a string, got {type(name).__name__} {name!r}"[:300])
    if not name.strip():
        raise DesignError(f"{where}: must not be empty (leave it out and the file and class name the design)")
    bad = next((c for c in name if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise DesignError(f"{where}: must not contain a control character ({bad!r})")


def design_padding(design: Design, where: Optional[str] = None) -> PaddingConvention:
    """The design's padding convention as a value (a name is looked up); DesignError on an unknown one."""
    try:
        return padding_convention(design.padding)
    except ValueError as e:
        raise DesignError(f"{where or design.name}.padding: {e}") from None
