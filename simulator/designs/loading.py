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


def design_instance(design: Design) -> Design:
    """A fresh instance of a design for one (backend, model side): a deep copy of the given one."""
    try:
        return copy.deepcopy(design)
    except Exception as e:
        raise DesignError(f"design {design.name}: the run makes one copy per backend and model side, and "
                          f"copy.deepcopy failed: {type(e).__name__}: {e}") from e


def load_design(spec: str) -> Design:
    """A design by name, or ``path/to/file.py:ClassName`` for a user's own."""
    if spec in BUILTIN_DESIGNS:
        return BUILTIN_DESIGNS[spec]()
    if ":" not in spec or not spec.split(":", 1)[0].endswith(".py"):
        raise DesignError(f"unknown design {spec!r}: use one of {', '.join(sorted(BUILTIN_DESIGNS))} "
                          f"or path/to/file.py:ClassName")
    path_s, cls_name = spec.rsplit(":", 1)
    path = Path(path_s)
    if not path.is_file():
        raise DesignError(f"design file {path} does not exist")
    mod_name = f"slotscope_user_design_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(mod_name, path)
    assert module_spec and module_spec.loader
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[mod_name] = module
    try:
        module_spec.loader.exec_module(module)
    except DesignError as e:
        raise DesignError(f"design file {path}: {e}") from e
    except Exception as e:  # the user's file: report, don't crash with a traceback
        raise DesignError(f"design file {path} failed to import: {type(e).__name__}: {e}") from e
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise DesignError(f"design file {path} has no class {cls_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Design)):
        raise DesignError(f"{path}:{cls_name} must subclass simulator.designs.Design")
    try:
        design = cls()
    except Exception as e:
        raise DesignError(f"{path}:{cls_name}() raised {type(e).__name__}: {e}") from e
    design_padding(design, f"{path}:{cls_name}")
    if not getattr(cls, "name", None) or cls.name == "design":
        design.name = f"{path.name}:{cls_name}"
    return design


def design_padding(design: Design, where: Optional[str] = None) -> PaddingConvention:
    """The design's padding convention as a value (a name is looked up); DesignError on an unknown one."""
    try:
        return padding_convention(design.padding)
    except ValueError as e:
        raise DesignError(f"{where or design.name}.padding: {e}") from None
