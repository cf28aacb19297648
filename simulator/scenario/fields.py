"""Typed reads of one TOML table that name the field they read.

Every check of a scenario file goes through :class:`TomlTable`, so every message has the same shape
(``FILE: dotted.field: what is wrong``) and a key nobody read is an error when the table is done. A length
distribution (a bare integer or a ``{ dist = ... }`` table) is read here too: [workload] and [engine] share it.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from simulator.scenario.config import DISTRIBUTIONS, Distribution, ScenarioError

MAX_INT = 2**31 - 1    # the largest value of any integer field without its own limit
#: the longest name that becomes a directory (a file name's limit on common file systems)
MAX_NAME_BYTES = 255


def path_name_problem(name: Any) -> Optional[str]:
    """What keeps ``name`` from being one directory name (``out/<name>``), or None when it can be one.

    A scenario's ``name`` (and a sweep grid's) becomes the default output directory, so it must stay one path
    component inside ``out/``: a string, not empty, no path separator, no ``.`` or ``..``, no NUL or other
    control character, at most :data:`MAX_NAME_BYTES` bytes."""
    if not isinstance(name, str):
        return f"must be a string, got {type(name).__name__} {short_repr(name)}"
    if not name:
        return "must not be empty"
    for i, c in enumerate(name):
        if c == "\0":
            return f"must not contain a NUL character (at {i})"
        if ord(c) < 32 or ord(c) == 127:
            return f"must not contain a control character ({c!r} at {i})"
        if c in "/\\":
            return f"must not contain a path separator ({c!r} at {i}): it names the output directory out/<name>"
    if name in (".", ".."):
        return f"must not be {name!r}: it names the output directory out/<name>"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"must be at most {MAX_NAME_BYTES} bytes (it names the output directory out/<name>), got {len(name)}"
    return None


def design_file_spec(spec: str) -> Optional[tuple[str, str]]:
    """``(path, class name)`` when a design spec names a Python file (``path/to/file.py:ClassName``), else None
    (a built-in design's name)."""
    if not isinstance(spec, str) or ":" not in spec:
        return None
    path, cls = spec.rsplit(":", 1)
    return (path, cls) if path.endswith(".py") else None


class TomlTable:
    """A TOML table being validated: typed reads that name the field, and a check for unknown keys."""

    def __init__(self, data: dict[str, Any], path: str, source: str):
        if not isinstance(data, dict):
            raise ScenarioError(f"{source}: [{path}] must be a table, got {type(data).__name__}")
        self.data, self.path, self.source = data, path, source
        self.seen: set[str] = set()

    def where(self, key: str) -> str:
        return f"{self.source}: {self.path + '.' if self.path else ''}{key}"

    def fail(self, key: str, msg: str) -> ScenarioError:
        return ScenarioError(f"{self.where(key)}: {msg}")

    def has(self, key: str) -> bool:
        return key in self.data

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ..., *, allowed=None,
            minimum=None, maximum=None) -> Any:
        self.seen.add(key)
        if key not in self.data:
            if default is ...:
                raise self.fail(key, "is required" + (f" (allowed: {', '.join(map(str, allowed))})" if allowed else ""))
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            try:
                value = float(value)
            except OverflowError:
                raise self.fail(key, f"must be a finite number, got an integer of {value.bit_length()} bits") from None
        if isinstance(value, bool) and bool not in kinds:
            raise self.fail(key, f"must be {_kind_names(kinds)}, got a boolean")
        if not isinstance(value, kinds):
            raise self.fail(key, f"must be {_kind_names(kinds)}, got {type(value).__name__} {short_repr(value)}")
        _check_number(value, maximum, lambda msg: self.fail(key, msg))
        if allowed is not None and value not in allowed:
            raise self.fail(key, f"{value!r} is not allowed (allowed: {', '.join(map(str, allowed))})")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value!r}")
        if maximum is not None and value > maximum:
            raise self.fail(key, f"must be <= {maximum}, got {value!r}")
        return value

    def table(self, key: str, required: bool = False) -> Optional["TomlTable"]:
        self.seen.add(key)
        if key not in self.data:
            if required:
                raise self.fail(key, "table is required")
            return None
        return TomlTable(self.data[key], f"{self.path + '.' if self.path else ''}{key}", self.source)

    def int_list(self, key: str, default: Any = ..., minimum: int = 0) -> tuple[int, ...]:
        value = self.get(key, list, default)
        if value is default and default is not ...:
            return default
        out = []
        for i, v in enumerate(value):
            if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
                raise self.fail(f"{key}[{i}]", f"must be an integer >= {minimum}, got {short_repr(v)}")
            _check_number(v, None, lambda msg: self.fail(f"{key}[{i}]", msg))
            out.append(v)
        return tuple(out)

    def float_list(self, key: str, default: Any = ..., minimum: float = 0.0) -> tuple[float, ...]:
        value = self.get(key, list, default)
        if value is default and default is not ...:
            return tuple(default)
        out = []
        for i, v in enumerate(value):
            if isinstance(v, int) and not isinstance(v, bool):
                try:
                    v = float(v)
                except OverflowError:
                    raise self.fail(f"{key}[{i}]", "must be a finite number, got a huge integer") from None
            if not isinstance(v, float):
                raise self.fail(f"{key}[{i}]", f"must be a number, got {type(v).__name__} {short_repr(v)}")
            _check_number(v, None, lambda msg: self.fail(f"{key}[{i}]", msg))
            if v < minimum:
                raise self.fail(f"{key}[{i}]", f"must be >= {minimum}, got {v!r}")
            out.append(v)
        return tuple(out)

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.seen)
        if unknown:
            raise self.fail(unknown[0], f"unknown key (known keys here: {', '.join(sorted(self.seen))})")


def _check_number(value: Any, maximum: Any, fail) -> None:
    """Floats must be finite; integers without an explicit maximum must stay <= MAX_INT."""
    if isinstance(value, float) and not math.isfinite(value):
        raise fail(f"must be a finite number, got {value!r}")
    if isinstance(value, int) and not isinstance(value, bool) and maximum is None and abs(value) > MAX_INT:
        raise fail(f"must be <= {MAX_INT}, got {short_repr(value)}")


def short_repr(value: Any, limit: int = 60) -> str:
    """repr of a value for a message, cut to ``limit`` characters (a huge list or integer stays readable)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    r = repr(value)
    return r if len(r) <= limit else r[:limit - 3] + "..."


def _kind_names(kinds: tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
             list: "a list", dict: "a table"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def read_distribution(t: TomlTable, key: str, default: Distribution, minimum: int = 0) -> Distribution:
    """A length field: a bare integer is a fixed length, a table names its ``dist`` and that one's keys."""
    if not t.has(key):
        t.seen.add(key)
        return default
    raw = t.data[key]
    if isinstance(raw, int) and not isinstance(raw, bool):
        t.seen.add(key)
        if raw < minimum:
            raise t.fail(key, f"must be >= {minimum}, got {short_repr(raw)}")
        _check_number(raw, None, lambda msg: t.fail(key, msg))
        return Distribution("fixed", value=raw)
    d = t.table(key)
    assert d is not None
    kind = d.get("dist", str, allowed=DISTRIBUTIONS)
    if kind == "fixed":
        out = Distribution("fixed", value=d.get("value", int, minimum=minimum))
    elif kind == "uniform":
        lo = d.get("min", int, minimum=minimum)
        hi = d.get("max", int, minimum=lo)
        out = Distribution("uniform", min=lo, max=hi)
    elif kind == "lognormal":
        lo = d.get("min", int, minimum, minimum=minimum)
        hi = d.get("max", int, minimum=max(lo, 1))
        out = Distribution("lognormal", mean=d.get("mean", float), sigma=d.get("sigma", float, minimum=0.0),
                           min=lo, max=hi)
    else:
        values = d.int_list("values", minimum=minimum)
        if not values:
            raise d.fail("values", "must not be empty")
        weights = d.float_list("weights", ())
        if weights and len(weights) != len(values):
            raise d.fail("weights", f"must have one weight per value ({len(values)}), got {len(weights)}")
        if weights and (min(weights) < 0 or sum(weights) <= 0):
            raise d.fail("weights", "must be non-negative with a positive sum")
        out = Distribution("choice", values=values, weights=weights)
    d.done()
    return out
