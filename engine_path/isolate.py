"""One release per process: run a function under a given release in a subprocess of its own.

``call("sglang==0.5.14", "engine_path.checks:b1_write", 3)`` starts ``python -m engine_path.isolate``,
which activates the release, imports the target and calls it with the JSON arguments; the result
comes back as JSON. An :class:`EngineError` in the child is raised again in the parent with its
message (a :class:`ReleaseLacks` as itself) (so the caller's user sees one clear line); any other failure raises ``IsolatedFailure``
with the child's traceback. Bisection across releases uses this: one subprocess per release.
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import traceback
from typing import Any, Optional

from .errors import AdapterLacks, EngineError, ReleaseLacks, SchedulerStalled

MARK = "@@slotscope-isolate@@"
#: the engine errors raised again in the parent as themselves
ERRORS = {e.__name__: e for e in (EngineError, ReleaseLacks, AdapterLacks, SchedulerStalled)}


class IsolatedFailure(RuntimeError):
    """The function failed in the child with something other than an EngineError."""


def fits_this_process(spec: str) -> bool:
    """Whether release ``spec`` can run in this process: nothing of either engine imported yet, or this same release
    (a process imports one release of one engine, once)."""
    from .releases import active, parse_spec
    from .vllm import release as vllm_release

    s = parse_spec(spec)
    sglang, vllm = active(), vllm_release.active()
    if s.name == "vllm":
        want = vllm_release.resolved(s).version
        return vllm.version == want if vllm is not None else "sglang" not in sys.modules
    if sglang is not None:
        return s.version is None or s.version == sglang.version
    return "sglang" not in sys.modules and "vllm" not in sys.modules


def call(spec: str, target: str, *args: Any, timeout: Optional[float] = 900, env: Optional[dict] = None,
         device: str = "cpu") -> Any:
    """Run ``module:function(*args)`` under release ``spec`` in a fresh interpreter; returns its JSON result
    (``timeout`` None: no limit; ``device``: where the release's objects will live, "cuda" leaving its Triton
    kernels native)."""
    cmd = [sys.executable, "-m", "engine_path.isolate", spec, target, device]
    full_env = dict(os.environ, **(env or {}))
    try:
        proc = subprocess.run(cmd, input=json.dumps(list(args)), capture_output=True, text=True, timeout=timeout,
                              env=full_env)
    except subprocess.TimeoutExpired:
        raise IsolatedFailure(f"{target} under {spec} did not finish in {timeout:.0f} s") from None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARK):
            reply = json.loads(line[len(MARK):])
            break
    else:
        raise IsolatedFailure(f"{target} under {spec} gave no answer (exit {proc.returncode}):\n"
                              f"{proc.stderr[-4000:]}")
    if reply["ok"]:
        return reply["result"]
    if reply["kind"] in ERRORS:
        raise ERRORS[reply["kind"]](reply["message"])
    raise IsolatedFailure(f"{target} under {spec} raised {reply['kind']}: {reply['message']}\n{reply['traceback']}")


def _main(argv: list[str]) -> int:
    spec, target = argv[0], argv[1]
    device = argv[2] if len(argv) > 2 else "cpu"
    args = json.loads(sys.stdin.read() or "[]")
    try:
        import torch

        # one thread, as slotscope run: on a busy CPU torch's thread pool spins and a CPU-fallback store
        # (index assignment of a few hundred rows) costs milliseconds instead of microseconds
        torch.set_num_threads(int(os.environ.get("SLOTSCOPE_TORCH_THREADS", "1")))
        if spec.startswith("vllm"):
            from .releases import parse_spec
            from .vllm.release import activate

            activate(parse_spec(spec), device=device)
        else:
            from .api import load

            load(spec, device=device)
        mod_name, _, fn_name = target.partition(":")
        fn = getattr(importlib.import_module(mod_name), fn_name)
        reply = {"ok": True, "result": fn(*args)}
    except EngineError as e:
        reply = {"ok": False, "kind": type(e).__name__ if type(e).__name__ in ERRORS else "EngineError",
                 "message": str(e)}
    except Exception as e:  # reported to the parent with the child's traceback
        reply = {"ok": False, "kind": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()}
    sys.stdout.write("\n" + MARK + json.dumps(reply) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
