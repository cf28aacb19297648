"""A design with every fix the corpus knows: ``kvwriteloc-strict`` (SGLang after #24743, #29460, #17630, #29858
and a KVWriteLoc that pads a shorter ``swa_loc``) with the overlap scheduler's WAR barrier on ROCm too (W7's
fix). `slotscope fuzz` must find nothing in it (tests/test_fuzz.py: no false positives); sweeps can put it
beside the designs under test: ``designs = ["fixed_everywhere.py:FixedEverywhere", ...]``."""
from __future__ import annotations

from dataclasses import replace

from simulator.designs import load_design
from simulator.engine_model.release_model import MID_2026

Strict = type(load_design("kvwriteloc-strict"))


class FixedEverywhere(Strict):
    name = "fixed-everywhere"
    description = "kvwriteloc-strict with the WAR barrier after each launch on every platform (ROCm too)"
    release = replace(MID_2026, name="mid-2026, WAR barrier on every platform",
                      war_barriers=(("cuda", "after_launch"), ("rocm", "after_launch")))
