"""Scenario files: TOML in, a validated, frozen :class:`Scenario` out.

Every bad input is reported as :class:`ScenarioError` naming the file, the dotted field and, where
the field takes a closed set of values, the values allowed. Unknown keys are errors too, since a
misspelt key silently ignored would run a different experiment than the one the user wrote.

The modules: ``config`` (the frozen dataclasses, the values their fields allow, the defaults), ``fields``
(typed reads of one TOML table, naming the field), ``parse`` (TOML -> ``Scenario``; ``config``'s
``scenario_data`` writes a ``Scenario`` back to TOML data) and ``toml_write`` (that data as text); ``models`` (model presets) and
``capture`` (graph capture sizes). Import the names below from the package, not from its modules.
"""
from __future__ import annotations

from simulator.scenario.config import (ARRIVALS, BACKENDS, CUSTOM_MODEL, DEFAULT_DESIGN, DEFAULT_DP_OTHER_TOKENS,
                                       DEFAULT_OUTPUT_LEN, DEFAULT_PROMPT_LEN, DEFAULT_SYSTEM_PROMPT_LEN,
                                       DISTRIBUTIONS, MAX_SEED, NO_SPECULATIVE, NO_THINK_TIME, ONE_TURN, PLATFORMS,
                                       RESERVES, SPEC_ALGORITHMS, WAR_BARRIERS, Distribution, EngineConfig,
                                       PoolConfig, RequestSpec, Scenario, ScenarioError, SpeculativeConfig,
                                       WorkloadConfig, content_ids, scenario_data)
from simulator.scenario.fields import MAX_INT, MAX_NAME_BYTES, design_file_spec, path_name_problem
from simulator.scenario.parse import MAX_FILE_BYTES, load_scenario, parse_scenario, tomllib

__all__ = [
    # the scenario and its parts
    "Scenario", "ScenarioError", "PoolConfig", "WorkloadConfig", "EngineConfig", "SpeculativeConfig",
    "RequestSpec", "Distribution", "content_ids",
    # the values fields allow, and the defaults
    "BACKENDS", "ARRIVALS", "SPEC_ALGORITHMS", "DISTRIBUTIONS", "WAR_BARRIERS", "PLATFORMS", "RESERVES",
    "DEFAULT_DESIGN", "CUSTOM_MODEL", "DEFAULT_PROMPT_LEN", "DEFAULT_OUTPUT_LEN", "DEFAULT_DP_OTHER_TOKENS",
    "DEFAULT_SYSTEM_PROMPT_LEN", "ONE_TURN", "NO_THINK_TIME", "NO_SPECULATIVE", "MAX_SEED", "MAX_INT",
    "MAX_FILE_BYTES", "MAX_NAME_BYTES",
    # what a name that becomes a directory, and a design spec that names a file, must be
    "path_name_problem", "design_file_spec",
    # reading and writing back
    "parse_scenario", "load_scenario", "scenario_data",
    # the TOML reader of this Python (tomllib, or tomli before 3.11), which corpus files are read with too
    "tomllib",
]
