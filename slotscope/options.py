"""Command-line options that several commands share, each parsed once into a typed value.

``--engine`` is the one that matters most: run, bisect, conform, fuzz and sweep all take it, and each
gets the same :class:`engine_path.releases.EngineSpec` from :func:`add_engine_option` (an argparse
``type=``), so a bad spec is refused while the command line is read, by argparse, with exit 2 and a
message naming the option and the value. What differs between the commands is only whether a release
version is optional (run, fuzz, sweep), required (conform: the model design is chosen by it) or not
allowed (bisect: the releases come from ``--versions``); each command says so in its help.

The scenario's own ``engine_release`` field and a grid's ``engines`` entries are read with the same
parser (:func:`engine_path.releases.parse_spec`), their errors naming the file and the field.
"""
from __future__ import annotations

import argparse
from typing import Callable, Optional

from engine_path.releases import EngineSpec, EngineSpecError, parse_spec
from simulator.scenario import BACKENDS

#: whether an --engine spec may, must, or must not name a release version
VERSION_OPTIONAL, VERSION_REQUIRED, VERSION_FORBIDDEN = "optional", "required", "forbidden"


def backend_list(text: str) -> tuple[str, ...]:
    """``--backends a,b`` (or ``all``) -> the backend names, each one checked."""
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    if names == ("all",):
        return BACKENDS
    for n in names:
        if n == "all":
            raise argparse.ArgumentTypeError(f"'all' stands alone (got {text!r}): give all, or a list of backends")
        if n not in BACKENDS:
            raise argparse.ArgumentTypeError(f"unknown backend {n!r} (allowed: {', '.join(BACKENDS)}, or all)")
    if not names:
        raise argparse.ArgumentTypeError("name at least one backend")
    return names


def positive_int(text: str) -> int:
    """An integer >= 1 (``--max-steps``, ``--jobs``, ``--page-size``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def engine_spec_type(version: str = VERSION_OPTIONAL, why: str = "",
                     engines: tuple[str, ...] = ("sglang",)) -> Callable[[str], EngineSpec]:
    """An argparse ``type=`` that reads an engine spec. ``version``: whether the command needs a release
    version (:data:`VERSION_REQUIRED`) or takes the engine's name only (:data:`VERSION_FORBIDDEN`); ``why``:
    the command's reason, said when a spec breaks that rule; ``engines``: the engines the command drives."""
    if version not in (VERSION_OPTIONAL, VERSION_REQUIRED, VERSION_FORBIDDEN):
        raise ValueError(f"version={version!r}: one of optional, required, forbidden")

    def engine_spec(text: str) -> EngineSpec:
        try:
            spec = parse_spec(text)
        except EngineSpecError as e:      # argparse prefixes "argument --engine: "
            raise argparse.ArgumentTypeError(f"{text!r}: {e.problem}") from None
        if spec.name not in engines:
            raise argparse.ArgumentTypeError(f"{text!r}: this command drives {' or '.join(engines)} only so far "
                                             f"(vLLM: run, bugs, conform, fuzz and sweep take --engine vllm==VERSION)")
        if (version == VERSION_REQUIRED and spec.version is None) or \
                (version == VERSION_FORBIDDEN and spec.version is not None):
            raise argparse.ArgumentTypeError(f"{text!r}: {why}")
        return spec

    return engine_spec


def add_engine_option(parser: argparse.ArgumentParser, *, help: str, required: bool = False,
                      default: Optional[EngineSpec] = None, version: str = VERSION_OPTIONAL, why: str = "",
                      metavar: str = "SPEC", engines: tuple[str, ...] = ("sglang",)) -> None:
    """``--engine NAME | NAME==VERSION`` as an :class:`EngineSpec` in ``args.engine`` (``default`` when it is
    not given). ``help`` says what the command does with the engine and which form it needs."""
    parser.add_argument("--engine", type=engine_spec_type(version, why, engines), required=required, default=default,
                        metavar=metavar, help=help)


def engine_release_spec(text: str, where: str) -> EngineSpec:
    """A spec read from a file (a scenario's ``engine_release``, a grid's ``engines[i]``); its error names
    ``where`` instead of the option."""
    try:
        return parse_spec(text)
    except EngineSpecError as e:
        raise e.at(where) from None


def add_allow_design_files(parser: argparse.ArgumentParser, what: str = "the scenario file") -> None:
    """``--allow-design-files``: a Python design file that ``what`` names (design = "path.py:Class") may run."""
    parser.add_argument("--allow-design-files", action="store_true",
                        help=f"run a Python design file that {what} names (design = \"path.py:Class\"); without it "
                             f"such a file is refused (exit 2): a scenario is data you may have from someone else, "
                             f"and importing a design file runs its code. A design given with --design needs no flag")


def add_engine_patch(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine-patch", action="append", default=[], metavar="FILE.yaml",
                        help="apply a source patch to the engine right after its import, in SGLang's patch format "
                             "(patches: [{target, edits: [{match, replacement|prepend|append}]}]), through the "
                             "release's own patcher where it has one; repeatable; needs --engine "
                             "(examples/engine-patches/, docs/ENGINE.md 'Patches')")


def use_engine_patches(args, engine) -> list[str]:
    """Check --engine-patch (readable, with an engine) and ask for it to be applied at the release's import."""
    from engine_path import patches

    from .rundir import UsageError

    paths = list(getattr(args, "engine_patch", None) or [])
    if paths and not engine:
        raise UsageError("--engine-patch needs --engine (it patches a real SGLang release)")
    patches.hashes(paths)
    patches.set_env(paths)
    return paths
