"""The test session's warm engine servers: slotscope/forkserver.py, started once a session (tests/conftest.py's
``warm`` and ``warm_vllm`` fixtures), and :class:`Fresh`, the same calls in fresh processes where a warm import
would not be the run's (a vLLM server's is the CPU's, and on a GPU machine a run's ``--device auto`` is CUDA)."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

from slotscope.forkserver import ROOT, Servers, Warm  # noqa: F401  (the fixtures' names)


class Fresh:
    """:class:`Warm`'s ``cli`` and ``script``, each in a fresh process: where a warm import would not be the run's (a
    vLLM server's is the CPU's, and on a GPU machine a run's ``--device auto`` is CUDA)."""

    def cli(self, *argv: str, env: Optional[dict] = None, cwd: Optional[str] = None, timeout: float = 900,
            route: Optional[dict] = None) -> subprocess.CompletedProcess:
        return self._run(["-m", "slotscope", *argv], env, cwd, timeout)

    def script(self, path: str, *argv: str, env: Optional[dict] = None, cwd: Optional[str] = None,
               timeout: float = 900, route: Optional[dict] = None) -> subprocess.CompletedProcess:
        return self._run([str(path), *argv], env, cwd, timeout)

    @staticmethod
    def _run(args, env, cwd, timeout) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], cwd=cwd or ROOT, capture_output=True, text=True,
                              timeout=timeout, env=dict(os.environ, **(env or {})))
