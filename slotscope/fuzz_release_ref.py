"""The release as released, as the reference of a fuzz search of a patched release.

``slotscope fuzz --engine sglang==V --engine-patch FILE.yaml`` runs every draw on the patched release. A failure
of the patched release counts only where the release *as released* (the same version, no patch) runs the same
draw clean: so a bug the release has of its own (F1, F2, P6 in 0.5.23) does not end a search for the bug the
patch puts back (R2's with examples/engine-patches/revert-29352-locked-full-recovery.yaml).

A process imports one release once, patched or not (``engine_path.patches`` applies the patches at the import),
so the unpatched release runs in a worker process of its own: ``python -m slotscope.fuzz_release_ref SPEC``,
started at the first failure, with no patch in its environment, kept for the rest of the search. Each draw goes
to it as scenario TOML on one line of JSON; its answer comes back as one line of JSON after a mark (the
release's own prints on stdout are skipped). A worker that dies or answers with an error is slotscope's own
failure: :class:`ReferenceFailed`, which the search records as an internal error of the reference's run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import traceback
from typing import Optional

from engine_path.patches import ENV as PATCHES_ENV
from engine_path.releases import EngineSpec
from simulator.scenario import Scenario

from .fuzz_run import Outcome, run_one

MARK = "@@slotscope-fuzz-reference@@"


class ReferenceFailed(RuntimeError):
    """The reference's worker died or raised on a draw (its traceback in the message)."""


class ReleaseReference:
    """The release ``engine`` without patches, in a worker process; :meth:`run` as ``fuzz_run.run_one``."""

    def __init__(self, engine: EngineSpec):
        self.engine = engine
        self.name = f"{engine} as released"
        self._proc: Optional[subprocess.Popen] = None
        self._stderr = None

    def _start(self) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if k != PATCHES_ENV}
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen([sys.executable, "-m", "slotscope.fuzz_release_ref", str(self.engine)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                      env=env)
        return self._proc

    def scenario(self, sc: Scenario) -> Scenario:
        return sc                        # the same draw; the worker runs it on the unpatched release

    def run(self, sc: Scenario):
        """The draw's outcome on the release as released (status and first finding, no steps)."""
        proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
        try:
            proc.stdin.write(json.dumps({"toml": sc.to_toml(defaults=False), "name": sc.name}) + "\n")
            proc.stdin.flush()
            for line in proc.stdout:
                if line.startswith(MARK):
                    reply = json.loads(line[len(MARK):])
                    break
            else:
                raise ReferenceFailed(f"the reference worker ({self.name}) exited {proc.wait()}:\n{self._tail()}")
        except BrokenPipeError:
            raise ReferenceFailed(f"the reference worker ({self.name}) exited {proc.wait()}:\n{self._tail()}") from None
        if "error" in reply:
            raise ReferenceFailed(f"{self.name} raised on {sc.name}:\n{reply['error']}")
        return Outcome(reply["status"], reply.get("finding"), error=reply.get("error_text"))

    def _tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-4000:]

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.stdin.close()
                try:
                    self._proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._stderr.close()
            self._proc = None


def _serve(spec: str) -> int:
    """The worker: one draw per line of stdin, its outcome after :data:`MARK` on stdout."""
    import torch

    from engine_path.releases import parse_spec
    from simulator.scenario import parse_scenario

    torch.set_num_threads(1)
    engine = parse_spec(spec)
    for line in sys.stdin:
        ask = json.loads(line)
        try:
            out = run_one(parse_scenario(ask["toml"], ask["name"]), engine)
            f = out.finding
            reply = {"status": out.status, "error_text": out.error,
                     "finding": None if f is None else {"class": f.cls, "backend": f.backend, "step": f.step}}
        except Exception:            # said to the parent, which records it as the reference's internal error
            reply = {"error": traceback.format_exc()}
        sys.stdout.write("\n" + MARK + json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(_serve(sys.argv[1]))
