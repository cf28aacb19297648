"""The test session's warm engine servers: slotscope/forkserver.py, started once a session (tests/conftest.py's
``warm`` and ``warm_vllm`` fixtures), and :class:`Fresh`, the same calls in fresh processes where a warm import
would not be the run's (a vLLM server's is the CPU's, and on a GPU machine a run's ``--device auto`` is CUDA).

Under pytest-xdist the session's controller holds the servers (:class:`Broker`) and every worker is a client of the
same ones (:class:`Shared`): each release is imported once a session, not once a worker (a server's import is 2 to
8 s of a core; with two workers on two cores each worker's own imports ran beside the other's tests)."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from slotscope.forkserver import ROOT, Servers, Warm  # noqa: F401  (the fixtures' names)

#: the broker's directory, set by the controller for its workers
SHARED_ENV = "SLOTSCOPE_TEST_SERVERS"


def _name(spec: str) -> str:
    return hashlib.sha1(spec.encode()).hexdigest()[:12]


class Broker:
    """The controller's servers: a worker asks for one with a file ``NAME.want`` (the spec) in :attr:`dir`; the
    broker starts it once and answers ``NAME.ready`` (its socket's path) when it listens, or ``NAME.failed`` (why)
    when it exited first. :meth:`stop` ends them all, at the session's end."""

    def __init__(self):
        self.servers = Servers()
        self.dir = Path(self.servers.dir)
        self._done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._done.wait(0.05):
            for want in self.dir.glob("*.want"):
                spec = want.read_text()
                want.unlink(missing_ok=True)
                self.start(spec)

    def start(self, spec: str) -> None:
        """Server ``spec`` started (once), its answer published when it listens or has exited."""
        if spec not in self.servers.procs:
            self.servers.start(spec)
            threading.Thread(target=self._answer, args=(spec,), daemon=True).start()

    def _answer(self, spec: str) -> None:
        try:
            self.servers.get(spec)
            _publish(self.dir / f"{_name(spec)}.ready", self.servers.paths[spec])
        except (RuntimeError, TimeoutError) as e:
            _publish(self.dir / f"{_name(spec)}.failed", str(e))

    def stop(self) -> None:
        self._done.set()
        self.servers.stop()


def _publish(path: Path, text: str) -> None:
    """``text`` in ``path``, whole when it appears (written aside, then renamed)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    tmp.rename(path)


class Shared:
    """A worker's servers: the controller's (:class:`Broker` in ``directory``), shared by every worker; the same
    calls as :class:`~slotscope.forkserver.Servers`."""

    def __init__(self, directory: str):
        self.dir = Path(directory)

    def start(self, spec: str) -> None:
        name = _name(spec)
        if not any((self.dir / f"{name}.{end}").exists() for end in ("ready", "failed")):
            _publish(self.dir / f"{name}.want", spec)

    def get(self, spec: str, timeout: float = 900) -> Warm:
        self.start(spec)
        name, t0 = _name(spec), time.monotonic()
        while True:
            if (self.dir / f"{name}.ready").exists():
                return Warm((self.dir / f"{name}.ready").read_text(), spec, self)
            if (self.dir / f"{name}.failed").exists():
                raise RuntimeError((self.dir / f"{name}.failed").read_text())
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"the warm server of {spec} did not start in {timeout:.0f} s")
            time.sleep(0.05)

    __call__ = get

    def socket(self, spec: str) -> str:
        return self.get(spec).path

    def stop(self) -> None:
        """Nothing: the controller stops the servers when the session ends."""


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
