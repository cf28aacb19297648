"""Shared fixtures: small runs of shipped scenarios, CPU by default, and the GPU marker's skip."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # CI has no GPU: the Triton kernels run under the interpreter, which must be chosen before any
    # test module imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"

torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def scenario_path():
    return lambda name: SCENARIOS / f"{name}.toml"


#: the releases the engine tests drive (CI fetches them into slotscope's cache when missing)
ENGINE_RELEASES = ("0.5.14", "0.5.23")
ENGINE_DEPENDENCIES = ("transformers", "msgspec", "tvm_ffi", "pydantic", "zmq", "orjson")


@pytest.fixture(scope="session")
def engine_releases():
    """``{version: cache dir}`` of the engine tests' releases, fetched when missing; skips with the reason
    when the engine's dependencies are not installed or a release cannot be fetched."""
    import importlib.util

    from engine_path.errors import EngineError
    from engine_path.releases import EngineSpec, fetch

    missing = [m for m in ENGINE_DEPENDENCIES if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the engine's dependencies are not installed ({', '.join(missing)}): pip install -e '.[sglang]'")
    out = {}
    for version in ENGINE_RELEASES:
        try:
            out[version] = fetch(EngineSpec("sglang", version))
        except EngineError as e:
            pytest.skip(f"sglang=={version} is not in the cache and cannot be fetched: {e}")
    return out


@pytest.fixture(scope="session")
def vllm_release():
    """vLLM 0.34.0's cache dir, fetched when missing; skips with the reason when its dependencies (the vllm extra)
    are not installed or it cannot be fetched."""
    from engine_path.errors import EngineError
    from engine_path.releases import EngineSpec, fetch
    from engine_path.vllm.release import missing_deps

    lacking = missing_deps()
    if lacking:
        pytest.skip(f"vLLM's dependencies are not installed ({', '.join(lacking)}): pip install -e '.[vllm]'")
    try:
        return fetch(EngineSpec("vllm", "0.34.0"))
    except EngineError as e:
        pytest.skip(f"vllm==0.34.0 is not in the cache and cannot be fetched: {e}")


#: the releases the warm servers import ahead of their first use (tests/warm_engine.py)
WARM_AHEAD = ("none", "sglang==0.5.23", "sglang==0.5.14")
_SERVERS = None


def _servers():
    """This process's warm servers: under pytest-xdist the controller's, shared by every worker (tests/warm_engine.py's
    Broker), else its own."""
    global _SERVERS
    if _SERVERS is None:
        from warm_engine import SHARED_ENV, Servers, Shared

        _SERVERS = Shared(os.environ[SHARED_ENV]) if os.environ.get(SHARED_ENV) else Servers()
    return _SERVERS


def pytest_configure(config):
    """The controller of a pytest-xdist session holds the warm servers its workers share (tests/warm_engine.py): its
    directory goes to the workers, which it starts after this, in their environment."""
    global _SERVERS
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        from warm_engine import SHARED_ENV, Broker

        _SERVERS = Broker()
        os.environ[SHARED_ENV] = str(_SERVERS.dir)


def pytest_collection_finish(session):
    """Start the warm servers' imports while the tests before the first engine test run (the second core is
    idle then); only for releases already cached (a missing one is fetched by ``engine_releases`` first)."""
    import importlib.util

    if not any("engine" in item.keywords for item in session.items):
        return
    if any(importlib.util.find_spec(m) is None for m in ENGINE_DEPENDENCIES):
        return
    from engine_path.releases import is_cached

    for spec in WARM_AHEAD:
        if spec == "none" or is_cached(spec.split("==")[1]):
            _servers().start(spec)


def pytest_unconfigure(config):
    if _SERVERS is not None:
        _SERVERS.stop()


@pytest.fixture(scope="session")
def warm_vllm(vllm_release):
    """A warm server of vLLM 0.34.0 (tests/warm_engine.py): its modules imported once this session, each request a
    fork whose run activates the release, ``--engine-patch`` files included (the CPU only); ``.cli(*argv)`` as
    ``python -m slotscope *argv``, ``.call(target, *args)`` as ``engine_path.isolate.call``. On a machine with CUDA
    (where a run's ``--device auto`` means the GPU) every run is a fresh process instead (``cli`` and ``script``)."""
    import torch

    if torch.cuda.is_available():
        from warm_engine import Fresh

        return Fresh()
    return _servers().get("vllm==0.34.0")


@pytest.fixture(scope="session")
def warm(engine_releases):
    """``warm(spec)``: a server that imported release ``spec`` once this session and forks a child per request
    (tests/warm_engine.py): ``.call(target, *args)`` as ``engine_path.isolate.call(spec, target, *args)``,
    ``.cli(*argv)`` as ``python -m slotscope *argv``; ``warm("none")``: no release imported;
    ``warm.socket(spec)``: its socket, for a request's ``route``."""
    return _servers()
