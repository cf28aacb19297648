"""The options the commands share (slotscope/options.py), above all ``--engine``: one parser, one typed value
(``engine_path.releases.EngineSpec``) for run, bisect, conform, fuzz and sweep, and the version rule of each.
Nothing here imports or fetches a release: the spec is only read."""
from __future__ import annotations

import argparse

import pytest

from engine_path.releases import EngineSpec, EngineSpecError
from simulator.scenario import BACKENDS
from slotscope.cli import build_parser, main
from slotscope.options import backend_list, engine_release_spec, positive_int

from helpers import ROOT

B1 = str(ROOT / "scenarios" / "b1-pcg-dp-padding.toml")
#: each command's arguments besides --engine
COMMANDS = {
    "run": ["run", B1],
    "bisect": ["bisect", B1, "--versions", "0.5.14,0.5.15"],
    "conform": ["conform", B1],
    "fuzz": ["fuzz", "--design", "sglang-0.5.23"],
    "sweep": ["sweep", "grid.toml"],
}


def _parse(argv):
    return build_parser().parse_args(argv)


def _refused(capsys, argv) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("spec, needle", [("trtllm", "unknown engine 'trtllm' (known: sglang, vllm)"),
                                          ("sglang>=0.5", "use 'sglang' or 'sglang==VERSION' (only '=='"),
                                          ("sglang==latest", "'latest' is not a release version")])
def test_every_command_reads_engine_the_same_way(capsys, command, spec, needle):
    err = _refused(capsys, COMMANDS[command] + ["--engine", spec])
    assert f"slotscope {command}: error: argument --engine: {spec!r}: {needle}" in err


@pytest.mark.parametrize("command", ("run", "fuzz", "sweep"))
def test_version_optional(command):
    assert _parse(COMMANDS[command] + ["--engine", "sglang"]).engine == EngineSpec("sglang")
    assert _parse(COMMANDS[command] + ["--engine", " SGLang==0.5.23 "]).engine == EngineSpec("sglang", "0.5.23")
    assert _parse(COMMANDS[command]).engine is None


def test_bisect_takes_the_name_only(capsys):
    assert _parse(COMMANDS["bisect"]).engine == EngineSpec("sglang")           # the default
    assert _parse(COMMANDS["bisect"] + ["--engine", "sglang"]).engine == EngineSpec("sglang")
    err = _refused(capsys, COMMANDS["bisect"] + ["--engine", "sglang==0.5.14"])
    assert "argument --engine: 'sglang==0.5.14': bisect takes the engine's name" in err


def test_conform_needs_a_version(capsys):
    assert _parse(COMMANDS["conform"] + ["--engine", "sglang==0.5.23"]).engine == EngineSpec("sglang", "0.5.23")
    err = _refused(capsys, COMMANDS["conform"] + ["--engine", "sglang"])
    assert "argument --engine: 'sglang': conform needs a release version" in err
    assert "the following arguments are required: --engine" in _refused(capsys, COMMANDS["conform"])


@pytest.mark.parametrize("command, says", [("run", "sglang==VERSION"), ("bisect", "by name only"),
                                           ("conform", "a version is needed"), ("fuzz", "every scenario drawn"),
                                           ("sweep", "every point runs with this engine")])
def test_help_says_what_each_command_needs(capsys, command, says):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert says in " ".join(capsys.readouterr().out.split())


def test_a_spec_names_a_known_engine_however_it_is_made():
    with pytest.raises(EngineSpecError, match="unknown engine 'trtllm'"):
        EngineSpec("trtllm")
    assert str(EngineSpec("vllm", "0.34.0")) == "vllm==0.34.0"
    with pytest.raises(EngineSpecError, match="not a release version"):
        EngineSpec("sglang", "latest")
    assert str(EngineSpec("sglang", "0.5.23")) == "sglang==0.5.23" and str(EngineSpec()) == "sglang"


def test_a_spec_from_a_file_names_the_field():
    assert engine_release_spec("sglang==0.5.23", "s.toml: engine_release") == EngineSpec("sglang", "0.5.23")
    with pytest.raises(Exception) as e:
        engine_release_spec("sglang~=0.5", "s.toml: engine_release")
    assert str(e.value).startswith("s.toml: engine_release: 'sglang~=0.5': use 'sglang' or 'sglang==VERSION'")


def test_backends_and_positive():
    assert backend_list("all") == BACKENDS and backend_list(" triton, musa ") == ("triton", "musa")
    for bad in ("cuda", " , "):
        with pytest.raises(argparse.ArgumentTypeError):
            backend_list(bad)
    assert positive_int("3") == 3
    for bad in ("0", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_int(bad)
