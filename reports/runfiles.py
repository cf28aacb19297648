"""A run directory's JSON files read as untrusted input: every failure a RunDirError naming the file and line.

Why apart from data.py: the report, the overlap timeline (timeline.py) and anything else that reads a run's
files need the same guards (a line or a file past its size cap, JSON nested too deeply, numbers that are not
finite or not 64-bit, a last line cut off by a kill), and none of them needs data.py's types for it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator, Optional

#: Longest line read from a JSON-lines file (a finding line is ~300 bytes) and largest JSON file.
MAX_LINE_BYTES = 16 * 2**20
MAX_JSON_BYTES = 64 * 2**20

_INT64 = 2**63


class RunDirError(ValueError):
    """A run directory that cannot be reported on; the message names the file (and line)."""


def int_field(value: Any, where: str) -> int:
    """A required number of a record as an int; RunDirError (naming ``where``) when it is none or cannot be one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RunDirError(f"{where}: expected a number, got {value!r}"[:300])
    if isinstance(value, float) and not math.isfinite(value):
        raise RunDirError(f"{where}: expected a finite number, got {value!r}")
    if not -_INT64 < value < _INT64:
        raise RunDirError(f"{where}: number out of range (beyond 64 bits)")
    return int(value)


def opt_float(value: Any) -> Optional[float]:
    """An optional finite number, else None (a missing or odd value is not worth failing the report for)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def opt_int(value: Any) -> Optional[int]:
    """An optional 64-bit int (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int) or not -_INT64 < value < _INT64:
        return None
    return value


def parse_json(text: str, where: str) -> Any:
    """json.loads with every failure as RunDirError naming ``where`` (the file and line)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise RunDirError(f"{where}: not a JSON line ({e.msg}, column {e.colno})") from None
    except RecursionError:
        raise RunDirError(f"{where}: JSON nested too deeply") from None
    except ValueError as e:       # e.g. an integer with more digits than Python converts
        raise RunDirError(f"{where}: not readable JSON ({str(e)[:200]})") from None


class _Lines:
    """The JSON objects of a JSON-lines file, one line at a time, lines capped at MAX_LINE_BYTES.

    ``cut`` is set when the last line has no newline and is not JSON (a kill mid-write): it is left out."""

    def __init__(self, path: Path):
        self.path = path
        self.cut = False

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        path = self.path
        with open(path, "rb") as f:
            lineno = 0
            while True:
                raw = f.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    return
                lineno += 1
                if len(raw) > MAX_LINE_BYTES:
                    raise RunDirError(f"{path}:{lineno}: line longer than {MAX_LINE_BYTES // 2**20} MiB "
                                      "(not a slotscope line)")
                text = raw.decode("utf-8", errors="replace")
                if not text.strip():
                    continue
                try:
                    row = parse_json(text, f"{path}:{lineno}")
                except RunDirError:
                    if not raw.endswith(b"\n") and not f.read(1):
                        self.cut = True       # the last line, cut off by a kill: leave it out
                        return
                    raise
                if not isinstance(row, dict):
                    raise RunDirError(f"{path}:{lineno}: expected a JSON object")
                yield lineno, row


def json_lines(path: Path, notes: Optional[list[str]] = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) per line of a JSON-lines file; a last line cut off by a kill is left out, and
    said so in ``notes`` when given."""
    lines = _Lines(path)
    yield from lines
    if lines.cut and notes is not None:
        notes.append(f"{path.name}: its last line was cut off (the run was killed while writing it) and is "
                     "left out.")


def read_json_file(path: Path) -> Any:
    """A whole JSON file (summary.json, run.json), size-capped; RunDirError naming it otherwise."""
    try:
        size = path.stat().st_size
    except OSError as e:
        raise RunDirError(f"{path}: cannot read ({e.strerror})") from None
    if size > MAX_JSON_BYTES:
        raise RunDirError(f"{path}: {size / 2**20:,.0f} MiB, larger than {MAX_JSON_BYTES // 2**20} MiB "
                          "(not a slotscope file)")
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise RunDirError(f"{path}: cannot read ({e.strerror})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise RunDirError(f"{path}:{e.lineno}: not JSON ({e.msg})") from None
    except RecursionError:
        raise RunDirError(f"{path}:1: JSON nested too deeply") from None
    except ValueError as e:
        raise RunDirError(f"{path}: not readable JSON ({str(e)[:200]})") from None
