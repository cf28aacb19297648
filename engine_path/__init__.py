"""The real engine as the system under test: SGLang's own write path behind the simulator's protocols.

Every ``import sglang`` of slotscope lives in this package; the simulator never imports it. Modules:

* :mod:`.releases`: which engine and release (``EngineSpec``: ``sglang`` / ``sglang==VERSION``), the
  release cache, one release per process; :mod:`.isolate`: a function under a release in a subprocess of its own.
* :mod:`.shims`: what a CPU needs before the import (lazy ``sglang.srt.configs``, torchvision stub).
* :mod:`.api`: the release's write-path classes and the :class:`~.api.Features` found by probing.
* :mod:`.allocator`, :mod:`.eviction`, :mod:`.writeloc`, :mod:`.pool`: adapters per concern (the SWA
  allocator, the out-of-window eviction rule, translation and ``KVWriteLoc``, the hybrid pool).
* :mod:`.design`: ``EngineDesign``, the design whose hooks call the release's code.
* :mod:`.checks`: small end-to-end checks (B1 in the real code, allocator invariants).

docs/ENGINE.md says which pieces are the engine's and which are ours.
"""
from .errors import EngineError
from .releases import EngineInfo, EngineSpec, EngineSpecError, parse_spec

__all__ = ["EngineError", "EngineInfo", "EngineSpec", "EngineSpecError", "parse_spec"]
