"""The shape of the package code (docs/ARCHITECTURE.md, "Shape"): the simulator's subpackages import only those
below them, no module graph cycle (a lazy import counts; one under ``if TYPE_CHECKING:`` does not), no module
imports another's private names, and no file, class or function past its size.

Read from the source with ``ast``; nothing is imported.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("simulator", "cuda_path", "engine_path", "tracing", "reports", "slotscope")
#: the simulator's subpackages (and top modules) from the bottom up: each imports only those before it
SIMULATOR_ORDER = ("records", "scenario", "engine_model", "memory", "scheduling", "designs", "oracle", "core",
                   "plugins", "run")
MAX_FILE_LINES, MAX_CLASS_LINES, MAX_FUNCTION_LINES = 600, 400, 60


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            rel = p.relative_to(ROOT).with_suffix("")
            out[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = p
    return out


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and getattr(n.test, "id", getattr(n.test, "attr", "")) == "TYPE_CHECKING":
            lines |= {m.lineno for m in ast.walk(n) if hasattr(m, "lineno")}
    return lines


def _imports(name: str, path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, names) of every run-time import of a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_lines(tree)
    is_pkg = path.name == "__init__.py"
    out = []
    for n in ast.walk(tree):
        if getattr(n, "lineno", None) in skip:
            continue
        if isinstance(n, ast.Import):
            out += [(n.lineno, a.name, []) for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - (n.level - 1)]
                mod = ".".join(base + ([n.module] if n.module else []))
            else:
                mod = n.module
            out.append((n.lineno, mod, [a.name for a in n.names]))
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for _, mod, names in _imports(m, p):
            for target in [f"{mod}.{x}" for x in names if f"{mod}.{x}" in mods] or [mod]:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != m:
                    edges[m].add(target)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack, on, out = [], set(), []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycle():
    found = _cycles(_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_scan_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_simulator_subpackages_import_only_those_below_them():
    rank = {n: i for i, n in enumerate(SIMULATOR_ORDER)}
    bad = []
    for m, p in _modules().items():
        parts = m.split(".")
        if parts[0] != "simulator" or len(parts) < 2:
            continue
        for line, mod, _ in _imports(m, p):
            other = mod.split(".")
            if other[0] == "simulator" and len(other) > 1 and rank[other[1]] > rank[parts[1]]:
                bad.append(f"{p.relative_to(ROOT)}:{line}: {parts[1]} imports {mod}")
    assert not bad, "\n".join(bad)


def test_no_module_imports_another_modules_private_names():
    mods = _modules()
    bad = []
    for m, p in mods.items():
        for line, mod, names in _imports(m, p):
            if mod in mods and mod != m:
                priv = [x for x in names if x.startswith("_") and not x.startswith("__")]
                if priv:
                    bad.append(f"{p.relative_to(ROOT)}:{line}: from {mod} import {', '.join(priv)}")
    assert not bad, "\n".join(bad)


def _too_big() -> list[str]:
    out = []
    for path in _modules().values():
        src = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT)
        lines = src.count("\n")
        if lines > MAX_FILE_LINES:
            out.append(f"{rel}: {lines} lines (at most {MAX_FILE_LINES})")
        for n in ast.walk(ast.parse(src)):
            size = getattr(n, "end_lineno", 0) - getattr(n, "lineno", 0) + 1
            if isinstance(n, ast.ClassDef) and size > MAX_CLASS_LINES:
                out.append(f"{rel}:{n.lineno}: class {n.name} {size} lines (at most {MAX_CLASS_LINES})")
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and size > MAX_FUNCTION_LINES:
                out.append(f"{rel}:{n.lineno}: {n.name} {size} lines (at most {MAX_FUNCTION_LINES})")
    return out


def test_no_file_class_or_function_past_its_size():
    found = _too_big()
    assert not found, "\n".join(found)


@pytest.mark.parametrize("source, names", [
    ("from simulator.core.reads import _Hidden\n", ["_Hidden"]),
    ("if TYPE_CHECKING:\n    from simulator.core.reads import _Hidden\n", []),
])
def test_the_import_scan_skips_type_checking_only(tmp_path, source, names):
    p = tmp_path / "m.py"
    p.write_text(source)
    got = [x for _, _, ns in _imports("m", p) for x in ns]
    assert got == names
