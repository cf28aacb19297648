"""One import of a release, many runs: a process that imports it once and forks a child per request.

Importing a release is most of a short engine run's time (vLLM 0.34.0's modules: 4-6 s of a ~7 s run on two cores;
an SGLang release with torch and transformers: 8-10 CPU seconds). ``python -m slotscope.forkserver SPEC SOCKET``
does what ``engine_path.isolate``'s child does before it calls anything (one torch thread, the release imported),
then serves requests on a Unix socket, each in a child forked from that state (a fresh copy of the process as the
import left it: what one request changes, the next never sees). The server is a process of its own, single-threaded
when it forks (never a fork of a caller that runs threads):

* ``call``: ``engine_path.isolate._main([SPEC, TARGET])`` itself, the arguments on its stdin, its reply line
  read back as :func:`engine_path.isolate.call` reads it (:meth:`Warm.call` returns or raises the same);
* ``main``: ``python -m slotscope ARGV`` (or ``python SCRIPT ARGV``) as ``runpy`` runs it (cwd, ``sys.path[0]``
  and environment as a fresh process would have them, stdout and stderr to files, the exit status as the
  interpreter makes it, atexit handlers run), for :meth:`Warm.cli` and :meth:`Warm.script`, which return a
  ``subprocess.CompletedProcess``. Not for a run of an SGLang release with an ``--engine-patch``: the
  release's activation applies it (``engine_path.releases.activate``), which the server did already, so such
  runs go to the release's dependency server instead (below). A vLLM server (``vllm==V``, the CPU only) imports
  the release's modules but leaves it unactivated: each child's run activates it, applying its own patches.

``SPEC`` ``deps:sglang==V`` (the CPU only) is an SGLang release's dependency server: it imports what the release
imports from outside itself (torch, transformers, triton, ...: ~90% of an SGLang import's time), listed by a child
that imported the release once, and never the release: each child's run activates the release as a fresh process
does, its ``--engine-patch`` files applied right after the import. :meth:`Warm.cli` of an SGLang server sends a
patched run there by itself (from :class:`Servers`; a patched CUDA run to a process of its own).

``SPEC`` ``none`` imports no release (``--engine`` left out: a warm ``python -m slotscope`` of the model alone).
A request's ``route`` names other servers' sockets (``{spec: socket}``): the child then sends its own
``engine_path.isolate.call`` for those releases to them.

:class:`Servers` starts one server per spec on first use and stops them all (``slotscope bugs --engine vllm``'s
runs: slotscope/corpus_engine.py; the test session's: tests/warm_engine.py).
"""
from __future__ import annotations

import importlib
import io
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent     # the repository: a run's default cwd
READY = "@@warm-engine-ready@@"
#: an SGLang patch is applied at the release's activation (engine_path.releases.activate), which its server did already
PATCHED = "a run with an engine patch needs a fresh import of the release: run it in a subprocess of its own"
#: a dependency server's spec prefix: the release's dependencies imported, the release itself not
DEPS = "deps:"
#: this repository's packages (a dependency server imports none but slotscope.cli: some import the release)
OURS = ("slotscope", "simulator", "engine_path", "tracing", "cuda_path", "reports")
#: a vLLM or dependency server imported for the CPU (the kernels interpreted): a CUDA run imports afresh
CPU_ONLY = ("a vLLM or dependency server's import is the CPU's (Triton's interpreter): run --device cuda in a "
            "subprocess of its own")


# --------------------------------------------------------------------------- the wire: one JSON value each way

def _send(sock: socket.socket, obj: Any) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(len(data).to_bytes(8, "big") + data)


def _recv(sock: socket.socket) -> Any:
    def exactly(n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("the warm engine's child closed the connection without an answer")
            buf += chunk
        return bytes(buf)
    return json.loads(exactly(int.from_bytes(exactly(8), "big")))


# --------------------------------------------------------------------------- the server (its own process)

def _route(routes: dict) -> None:
    """Send this process's ``engine_path.isolate.call`` for the routed releases to their warm servers."""
    if not routes:
        return
    from engine_path import isolate

    real = isolate.call

    def call(spec, target, *args, timeout=900, env=None):
        if str(spec) in routes:
            return Warm(routes[str(spec)], str(spec)).call(target, *args, timeout=timeout, env=env)
        return real(spec, target, *args, timeout=timeout, env=env)
    isolate.call = call


def _redirect(fd: int, path: str, mode: int) -> None:
    new = os.open(path, mode, 0o600)
    os.dup2(new, fd)
    os.close(new)


def _child(spec: str, req: dict, conn: socket.socket, added: dict) -> None:
    """In the forked child: run one request, send its answer, exit."""
    _send(conn, {"pid": os.getpid()})
    tmp = Path(req["tmp"])
    out, err = str(tmp / "stdout"), str(tmp / "stderr")
    # the requester's environment, and what the import added to one that lacked it (as in a fresh child)
    os.environ.clear()
    os.environ.update(req["env"])
    os.environ.update({k: v for k, v in added.items() if k not in req["env"]})
    os.chdir(req["cwd"])
    # sys.path as `python -m ...` (or `python SCRIPT`) there: its directory first, then PYTHONPATH's entries
    sys.path[0] = str(Path(req["main"][1]).resolve().parent) if req.get("main", ["module"])[0] == "path" \
        else req["cwd"]
    for p in reversed([p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]):
        if p not in sys.path:
            sys.path.insert(1, p)
    _route(req.get("route") or {})
    sys.stdout.flush()
    sys.stderr.flush()
    _redirect(0, os.devnull, os.O_RDONLY)
    _redirect(1, out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    _redirect(2, err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        rc = _serve_request(spec[len(DEPS):] if spec.startswith(DEPS) else spec, req)
    except BaseException:
        import traceback

        traceback.print_exc()
        rc = 1
    try:
        import atexit

        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        _send(conn, {"rc": rc})
        conn.close()
        os._exit(0)


def _serve_request(spec: str, req: dict) -> int:
    """A request in the child: ``isolate._main`` (``call``) or ``python -m``/``python SCRIPT`` (``main``); its exit
    status as the interpreter makes it."""
    if req["kind"] == "call":
        from engine_path import isolate

        sys.stdin = io.StringIO(json.dumps(req["args"]))
        return isolate._main([spec, req["target"]])
    import runpy

    how, name = req["main"]
    sys.argv = [name, *req["argv"]]
    try:
        if how == "module":
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(name, run_name="__main__")
    except SystemExit as e:          # what the interpreter makes of it
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    return 0


def is_vllm(spec: str) -> bool:
    return spec.split("==")[0] == "vllm"


def _sglang_release(spec: str) -> str:
    from engine_path.api import load

    return load(spec).info.version


def _release_deps(spec: str) -> list[str]:
    """The modules from outside release ``spec`` (and outside this repository's packages) that importing it for a
    run on the CPU imports, in the order they were imported: listed by a forked child that imports it (this process
    stays clean), once per release and Python (kept beside the cached releases: a list that has gone stale only
    leaves more for each child to import)."""
    from engine_path.releases import engines_dir

    kept = engines_dir() / ".deps" / f"{spec.replace('==', '-')}-py{sys.version_info[0]}{sys.version_info[1]}.json"
    try:
        return json.loads(kept.read_text())
    except (OSError, ValueError):
        pass
    names = _probe_deps(spec)
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        part = kept.with_suffix(f".{os.getpid()}.part")
        part.write_text(json.dumps(names))
        os.replace(part, kept)
    except OSError:
        pass
    return names


def _probe_deps(spec: str) -> list[str]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            from engine_path.api import load

            root = Path(load(spec, device="cpu").info.path).resolve().parent
            ours = tuple(str(ROOT / n) for n in OURS)
            names = [n for n, m in list(sys.modules.items())
                     if _outside(getattr(m, "__file__", None), (root, *map(Path, ours)))
                     and n.split(".")[0] not in OURS]
            data = json.dumps({"ok": True, "modules": names})
        except BaseException as e:                      # the server reports it (as a fresh child would)
            data = json.dumps({"ok": False, "message": f"{type(e).__name__}: {e}"})
        with os.fdopen(w, "w") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        got = json.loads(f.read() or '{"ok": false, "message": "the probe died"}')
    os.waitpid(pid, 0)
    if not got["ok"]:
        from engine_path.errors import EngineError

        raise EngineError(got["message"])
    return got["modules"]


def _outside(path: Optional[str], roots) -> bool:
    """Whether a module's file is a real one outside every root (a stub or namespace package has none)."""
    if not path:
        return False
    p = Path(path).resolve()
    return not any(p.is_relative_to(r) for r in roots)


def _sglang_deps(spec: str) -> str:
    """A dependency server's start (``deps:sglang==V``): slotscope's shims as the release's activation installs
    them (Triton's interpreter), then every module of :func:`_release_deps`, the release itself left to each child
    (its activation then imports it and applies the run's patches, as a fresh process). One that fails to import here
    is left to the child."""
    import slotscope.cli  # noqa: F401
    from engine_path import patches, shims
    from engine_path.releases import parse_spec

    if os.environ.get(patches.ENV):
        raise RuntimeError(f"the warm server of {spec} was started with engine patches in its environment")
    release = parse_spec(spec)
    shims.install(triton_interpret=True)
    for name in _release_deps(spec):
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:
                pass
    if any(n == "sglang" or n.startswith("sglang.") for n in sys.modules):
        raise RuntimeError(f"importing the dependencies of {spec} imported sglang itself")
    return str(release.version)


def _vllm_modules(spec: str) -> str:
    """vLLM's modules imported (the slow part of a vLLM run's start), the release left unactivated: a child's own
    ``activate`` then finds them imported and applies its ``--engine-patch`` files on them, right after, as a fresh
    process would (engine_path/vllm/release.py). The CPU only: the worker's kernels interpreted."""
    import slotscope.cli  # noqa: F401
    from engine_path import patches
    from engine_path.releases import parse_spec
    from engine_path.vllm import release

    if os.environ.get(patches.ENV):
        raise RuntimeError(f"the warm server of {spec} was started with engine patches in its environment")
    info = release.activate(parse_spec(spec), device="cpu")
    for mod in ("scheduler", "worker", "graphs", "kernels", "runtime"):
        importlib.import_module(f"engine_path.vllm.{mod}")
    release._ACTIVE = None           # activated again (with the child's patches) by the child's run
    return info.version


def serve(spec: str, path: str) -> int:
    import signal

    import torch

    # as engine_path.isolate's child, before it imports the release
    torch.set_num_threads(int(os.environ.get("SLOTSCOPE_TORCH_THREADS", "1")))
    sys.path[0] = os.getcwd()        # as `python -m engine_path.isolate` in the repository (not tests/)
    loaded: dict = {"ok": True}
    before = dict(os.environ)
    if spec != "none":
        from engine_path.errors import EngineError

        try:
            loaded["version"] = (_sglang_deps(spec[len(DEPS):]) if spec.startswith(DEPS) else
                                 _vllm_modules(spec) if is_vllm(spec) else _sglang_release(spec))
        except EngineError as e:     # every call answers it, as a fresh child would
            loaded = {"ok": False, "kind": "EngineError", "message": str(e)}
    else:
        import slotscope.cli  # noqa: F401  (what `python -m slotscope` imports first)
    added = {k: v for k, v in os.environ.items() if before.get(k) != v}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print(READY + json.dumps(loaded), flush=True)
    os.dup2(2, 1)                    # nothing more for the pipe the session reads the ready line from
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [], 1.0)
        while True:                  # reap the children that ended
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
            return 0                 # the session ended (or died): so do we
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        req = _recv(conn)
        if not loaded["ok"]:
            _send(conn, {"pid": None})
            _send(conn, {"loaded": loaded})
            conn.close()
            continue
        if os.fork() == 0:
            try:
                signal.signal(signal.SIGINT, signal.default_int_handler)
                listener.close()
                _child(spec, req, conn, added)
            finally:
                os._exit(1)          # never back into this loop
        conn.close()


# --------------------------------------------------------------------------- the client

class Warm:
    """A client of one server: ``call`` as ``engine_path.isolate.call``, ``cli`` as ``python -m slotscope``."""

    def __init__(self, path: str, spec: str, servers: Optional["Servers"] = None):
        self.path, self.spec, self.servers = path, spec, servers
        # an SGLang server imported its release already (patches apply at activation); a vLLM one left it unactivated,
        # and a dependency server never imports it
        self.fresh_for_patches = spec != "none" and not is_vllm(spec) and not spec.startswith(DEPS)

    def _patched(self, main, argv, env, cwd, timeout, route) -> subprocess.CompletedProcess:
        """A patched run of an SGLang server's release: forked from its dependency server (from the servers that
        started this one) where it runs on the CPU, else (a CUDA run, a client without servers) a process of its
        own."""
        if self.servers is not None and on_cpu(argv):
            return self.servers.get(DEPS + self.spec)._main(main, argv, env, cwd, timeout, route)
        args = [sys.executable, *(["-m", main[1]] if main[0] == "module" else [main[1]]), *argv]
        return subprocess.run(args, cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, **(env or {})))

    def _request(self, req: dict, timeout: float) -> tuple[dict, str, str]:
        """Send one request; its answer and the child's stdout and stderr."""
        import shutil

        from engine_path.patches import ENV

        env = dict(os.environ, **(req.get("env") or {}))
        if self.fresh_for_patches and env.get(ENV):
            raise ValueError(PATCHED)
        tmp = tempfile.mkdtemp(prefix="warm-")
        req = dict(req, tmp=tmp, env=env, cwd=req.get("cwd") or os.getcwd())
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(self.path)
                _send(s, req)
                s.settimeout(timeout)
                pid = _recv(s)["pid"]
                try:
                    reply = _recv(s)
                except socket.timeout:
                    if pid:
                        os.kill(pid, 9)
                    raise subprocess.TimeoutExpired(req.get("argv") or req.get("target"), timeout) from None
            out = [(Path(tmp) / n).read_text(errors="replace") if (Path(tmp) / n).exists() else ""
                   for n in ("stdout", "stderr")]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return reply, out[0], out[1]

    def _loaded_error(self, reply: dict) -> None:
        from engine_path.errors import EngineError

        if "loaded" in reply:
            raise EngineError(reply["loaded"]["message"])

    def call(self, target: str, *args: Any, timeout: float = 900, env: Optional[dict] = None) -> Any:
        """``engine_path.isolate.call(self.spec, target, *args)``, the release imported once."""
        from engine_path.isolate import MARK, IsolatedFailure

        try:
            reply, stdout, stderr = self._request({"kind": "call", "target": target, "args": list(args), "env": env},
                                                  timeout)
        except subprocess.TimeoutExpired:
            raise IsolatedFailure(f"{target} under {self.spec} did not finish in {timeout:.0f} s") from None
        self._loaded_error(reply)
        for line in reversed(stdout.splitlines()):          # from here on as engine_path.isolate.call
            if line.startswith(MARK):
                answer = json.loads(line[len(MARK):])
                break
        else:
            raise IsolatedFailure(f"{target} under {self.spec} gave no answer (exit {reply['rc']}):\n{stderr[-4000:]}")
        if answer["ok"]:
            return answer["result"]
        if answer["kind"] == "EngineError":
            from engine_path.errors import EngineError

            raise EngineError(answer["message"])
        raise IsolatedFailure(f"{target} under {self.spec} raised {answer['kind']}: {answer['message']}\n"
                              f"{answer['traceback']}")

    def cli(self, *argv: str, env: Optional[dict] = None, cwd: Optional[str] = None, timeout: float = 900,
            route: Optional[dict] = None) -> subprocess.CompletedProcess:
        """``python -m slotscope *argv`` with the release imported once (what subprocess.run would return)."""
        return self._main(("module", "slotscope"), argv, env, cwd, timeout, route)

    def script(self, path: str, *argv: str, env: Optional[dict] = None, cwd: Optional[str] = None,
               timeout: float = 900, route: Optional[dict] = None) -> subprocess.CompletedProcess:
        """``python PATH *argv`` with the release imported once."""
        return self._main(("path", str(path)), argv, env, cwd, timeout, route)

    def _main(self, main, argv, env, cwd, timeout, route) -> subprocess.CompletedProcess:
        if self.fresh_for_patches and "--engine-patch" in argv:
            return self._patched(main, argv, env, cwd, timeout, route)
        if (is_vllm(self.spec) or self.spec.startswith(DEPS)) and _asks_cuda(argv):
            raise ValueError(CPU_ONLY)
        reply, stdout, stderr = self._request({"kind": "main", "main": list(main), "argv": list(argv), "env": env,
                                               "cwd": str(cwd or ROOT), "route": route}, timeout)
        self._loaded_error(reply)
        args = [sys.executable, *(["-m", main[1]] if main[0] == "module" else [main[1]]), *argv]
        return subprocess.CompletedProcess(args, reply["rc"], stdout, stderr)


def _server_env() -> dict:
    """The server's environment: the caller's, without engine patches (a vLLM child applies its own run's) and with
    the repository first on the path."""
    from engine_path.patches import ENV

    env = {k: v for k, v in os.environ.items() if k != ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _asks_cuda(argv) -> bool:
    argv = list(argv)
    return "--device=cuda" in argv or any(a == "--device" and b == "cuda" for a, b in zip(argv, argv[1:]))


def on_cpu(argv) -> bool:
    """Whether a run of ``argv`` goes to the CPU: its --device cpu, or no --device and no CUDA here."""
    argv = list(argv)
    if "--device=cpu" in argv or any(a == "--device" and b == "cpu" for a, b in zip(argv, argv[1:])):
        return True
    if _asks_cuda(argv) or any(a.startswith("--device") for a in argv):
        return False
    import torch

    return not torch.cuda.is_available()


class Servers:
    """A caller's servers, one per spec, each started on first use (or ahead of it: :meth:`start`); :meth:`stop`
    ends them (each also ends when its caller does: its stdin closes)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="warm-engine-")
        self.procs: dict[str, subprocess.Popen] = {}
        self.paths: dict[str, str] = {}
        self.ready: dict[str, threading.Event] = {}
        self.seen: dict[str, bool] = {}
        self.lock = threading.Lock()

    def start(self, spec: str) -> None:
        with self.lock:
            if spec in self.procs:
                return
            path = os.path.join(self.dir, f"{len(self.procs)}.sock")
            log = open(os.path.join(self.dir, f"{len(self.procs)}.log"), "w")
            self.procs[spec] = subprocess.Popen([sys.executable, "-m", "slotscope.forkserver", spec, path],
                                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                                cwd=ROOT, env=_server_env())
            self.ready[spec] = threading.Event()
            self.paths[spec] = path
            threading.Thread(target=self._wait_ready, args=(spec,), daemon=True).start()

    def _wait_ready(self, spec: str) -> None:
        proc = self.procs[spec]
        self.seen[spec] = False
        for line in proc.stdout:
            if line.startswith(READY):
                self.seen[spec] = True
                break
        self.ready[spec].set()

    def get(self, spec: str, timeout: float = 900) -> Warm:
        self.start(spec)
        t0 = time.monotonic()
        if not self.ready[spec].wait(timeout):
            raise TimeoutError(f"the warm server of {spec} did not start in {timeout:.0f} s")
        if not self.seen[spec] or self.procs[spec].poll() is not None:
            try:
                rc = self.procs[spec].wait(10)
            except subprocess.TimeoutExpired:
                rc = None
            log = Path(self.dir) / f"{list(self.procs).index(spec)}.log"
            raise RuntimeError(f"the warm server of {spec} exited ({rc}) after {time.monotonic() - t0:.0f} s:\n"
                               f"{log.read_text()[-4000:]}")
        return Warm(self.paths[spec], spec, self)

    __call__ = get

    def socket(self, spec: str) -> str:
        self.get(spec)
        return self.paths[spec]

    def stop(self) -> None:
        for proc in self.procs.values():
            try:
                proc.stdin.close()
            except OSError:
                pass
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(serve(sys.argv[1], sys.argv[2]))
