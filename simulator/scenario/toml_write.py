"""A small TOML writer for scenario files (the standard library reads TOML but cannot write it).

It covers what scenario files hold: tables and sub-tables, arrays of tables (``[[workload.request]]``),
strings, integers, floats, booleans, lists of scalars, and inline tables for length distributions
(``prompt_len = { dist = "uniform", min = 1, max = 9 }``). ``tomllib.loads(dumps(d)) == d`` for any
such ``d``; tests check it, and that ``parse_scenario`` reads the result back to the same scenario.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable, Optional

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _key(k: str) -> str:
    if not isinstance(k, str):
        raise TypeError(f"TOML keys are strings, got {type(k).__name__} {k!r}")
    return k if _BARE.match(k) else _string(k)


def _string(s: str) -> str:
    if "\n" in s and not any((ord(c) < 0x20 and c not in "\n\t") or ord(c) == 0x7F for c in s):
        # a multi-line basic string (the newline right after the opening quotes is not part of the value)
        body = s.replace("\\", "\\\\").replace('"', '\\"')
        return '"""\n' + body + '"""'
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        r = repr(v)
        return r if any(c in r for c in ".eE") else r + ".0"
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} {v!r} as TOML")


def _value(v: Any) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }" if v else "{}"
    return _scalar(v)


def _is_table_array(v: Any) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(isinstance(x, dict) for x in v)


def default_inline(path: tuple[str, ...], table: dict) -> bool:
    """Inline a table when it is a length distribution (it has a ``dist`` key)."""
    return "dist" in table


def dumps(data: dict, inline: Optional[Callable[[tuple[str, ...], dict], bool]] = None) -> str:
    """TOML text for ``data``: scalars of a table first, then its sub-tables, then its arrays of tables."""
    inline = inline or default_inline
    lines: list[str] = []

    def emit(table: dict, path: tuple[str, ...], header: Optional[str], always: bool = False) -> None:
        scalars, tables, arrays = [], [], []
        for k, v in table.items():
            if isinstance(v, dict) and not inline(path + (k,), v):
                tables.append((k, v))
            elif _is_table_array(v):
                arrays.append((k, v))
            else:
                scalars.append((k, v))
        if header is not None and (always or scalars or not (tables or arrays)):
            if lines:
                lines.append("")
            lines.append(header)
        for k, v in scalars:
            lines.append(f"{_key(k)} = {_value(v)}")
        for k, v in tables:
            p = path + (k,)
            emit(v, p, "[" + ".".join(_key(x) for x in p) + "]")
        for k, items in arrays:
            p = path + (k,)
            for item in items:
                emit(item, p, "[[" + ".".join(_key(x) for x in p) + "]]", always=True)

    emit(data, (), None)
    return "\n".join(lines) + "\n"
