"""The packages' dependencies point one way (docs/ARCHITECTURE.md): ``simulator`` <- ``cuda_path``,
``engine_path``, ``tracing`` <- ``reports`` <- ``slotscope``, and only engine_path imports SGLang.

Read from the source with ``ast``: every ``import`` / ``from ... import`` anywhere in a module (a lazy
import inside a function counts the same), and ``__import__`` / ``importlib.import_module`` of a literal
name. Nothing is imported, so the test needs none of the optional extras.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("simulator", "cuda_path", "engine_path", "tracing", "reports", "slotscope")

#: package -> the packages it must not import
FORBIDDEN = {
    "simulator": {"cuda_path", "engine_path", "tracing", "reports", "slotscope"},
    "cuda_path": {"engine_path", "tracing", "reports", "slotscope"},
    "engine_path": {"cuda_path", "tracing", "reports", "slotscope"},
    "tracing": {"cuda_path", "engine_path", "reports", "slotscope"},
    "reports": {"slotscope"},
    "slotscope": set(),
}
#: third-party packages only one package may import
ONLY_IN = {"sglang": "engine_path"}


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a module; relative imports stay in the package."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in ("__import__", "import_module"):
                found.append((node.lineno, node.args[0].value))
    return found


def violations() -> list[str]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT)
            for line, module in _imported(ast.parse(path.read_text(encoding="utf-8"), str(rel))):
                top = module.split(".")[0]
                if top in FORBIDDEN[pkg]:
                    out.append(f"{rel}:{line}: {pkg} imports {module}")
                elif top in ONLY_IN and ONLY_IN[top] != pkg:
                    out.append(f"{rel}:{line}: {pkg} imports {module} (only {ONLY_IN[top]}/ may)")
    return out


def test_the_packages_are_there():
    for pkg in PACKAGES:
        assert (ROOT / pkg / "__init__.py").is_file(), pkg


def test_dependencies_point_one_way():
    found = violations()
    assert not found, "layering violations (docs/ARCHITECTURE.md):\n" + "\n".join(found)


@pytest.mark.parametrize("source, expected", [
    ("def f():\n    from reports.html import x\n", [(2, "reports.html")]),
    ("import sglang.srt.utils as u\n", [(1, "sglang.srt.utils")]),
    ("import importlib\nimportlib.import_module('slotscope.cli')\n", [(1, "importlib"), (2, "slotscope.cli")]),
    ("from . import x\nfrom .y import z\n", []),
])
def test_the_scan_sees_lazy_and_literal_imports(source, expected):
    assert sorted(_imported(ast.parse(source))) == expected
