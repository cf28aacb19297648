"""Trace levels: how many spans a run emits from the recorded boundaries.

``anomaly`` is the default because it keeps one span per (step, backend) with the per-layer shapes
as arrays, which is enough for every table of the analyser, and adds boundary spans only where a
human will want to click: a shape disagreement, a finding or an error.
"""
from __future__ import annotations

OFF = "off"
STEP = "step"
BOUNDARY = "boundary"
ANOMALY = "anomaly"
LEVELS: tuple[str, ...] = (OFF, STEP, BOUNDARY, ANOMALY)
DEFAULT_LEVEL = ANOMALY


def parse_level(level: str) -> str:
    """Validate a level name; the error names the allowed values."""
    name = (level or "").strip().lower()
    if name not in LEVELS:
        raise ValueError(f"trace level {level!r} is not one of {', '.join(LEVELS)}")
    return name
