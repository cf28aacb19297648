"""A run's output directory: one run at a time, nothing of an earlier run left beside new results.

``RunDir.open(path)`` (used as a context manager) checks ``--out``, takes the lock and clears the
previous run's files:

* ``--out`` that is a file, cannot be created or is not writable is bad input (``UsageError``).
* The lock is ``DIR/.slotscope.lock``, created with ``O_CREAT | O_EXCL`` and holding the PID of its
  run. A second run into the directory is refused while that PID is alive (the message names it);
  a lock whose PID is dead (a run killed with SIGKILL), or is this process's own PID (a killed run in
  a container that gave it the same PID), is taken over.
* A directory that already holds files must be a slotscope run directory (the lock, or a summary.json,
  run.json, steps.jsonl or findings.jsonl that looks like slotscope's); then every file slotscope
  writes there (``RUN_FILES``, and their ``.tmp`` leftovers) is removed before the run starts.
  Other files are never touched; a non-empty directory that is not a run directory is refused.

``write_atomic`` writes a file under a temporary name and renames it into place, so a reader (or a
kill) never sees half a file.
"""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Optional


LOCK_FILE = ".slotscope.lock"


class UsageError(ValueError):
    """A command-line choice that cannot be honoured here (exit 2); re-exported by slotscope.pipeline."""


#: Every file `slotscope run` (and the commands that derive files from a run: export, minimize) writes
#: into a run directory.
RUN_FILES = ("summary.json", "findings.jsonl", "steps.jsonl", "shapes.jsonl", "scenario.toml", "run.json",
             "trace.otlp.jsonl", "report.html", "trace.chrome.json", "minimal.toml")



def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through ``path.tmp`` and a rename; the temporary file never stays."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    return path


def write_json_atomic(path: Path, data: object) -> Path:
    return write_atomic(path, json.dumps(data, indent=2) + "\n")


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # alive, owned by someone else
        return True
    except OSError:
        return False
    return True


def _read_pid(lock: Path) -> Optional[int]:
    try:
        text = lock.read_text(encoding="utf-8", errors="replace").split()
        return int(text[0]) if text else None
    except (OSError, ValueError):
        return None


def _json_head(path: Path, limit: int = 1 << 20) -> object:
    """The JSON of a small file, or of the first line of a JSON-lines file; None if it is not JSON."""
    try:
        with open(path, "rb") as f:
            text = f.read(limit) if path.suffix == ".json" else f.readline(limit)
        return json.loads(text)
    except (OSError, ValueError, RecursionError):
        return None


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds a slotscope run: its lock, or a marker file that looks like ours (so a user's
    own run.json or summary.json does not make their directory one, and get it cleared)."""
    if (path / LOCK_FILE).is_file():
        return True
    summary = _json_head(path / "summary.json") if (path / "summary.json").is_file() else None
    if isinstance(summary, dict) and isinstance(summary.get("backends"), dict) and "design" in summary:
        return True
    run = _json_head(path / "run.json") if (path / "run.json").is_file() else None
    if isinstance(run, dict) and (run.get("tool") == "slotscope" or {"version", "scenario_hash"} <= run.keys()):
        return True
    for name in ("steps.jsonl", "findings.jsonl"):
        p = path / name
        if p.is_file():
            if p.stat().st_size == 0:
                return True          # a run stopped before its first step or finding
            head = _json_head(p)
            if isinstance(head, dict) and "step" in head:
                return True
    return False


class RunDir:
    """The locked output directory of one run. Use ``with RunDir.open(path) as rd:``."""

    def __init__(self, path: Path, lock: Path):
        self.path = path
        self.lock = lock
        self.pid = os.getpid()

    # ------------------------------------------------------------------------------ opening
    @classmethod
    def open(cls, out: str | os.PathLike[str]) -> "RunDir":
        path = Path(out)
        if path.exists() and not path.is_dir():
            raise UsageError(f"--out {path}: is a file, not a directory")
        if path.is_dir():
            try:
                entries = [p.name for p in path.iterdir()]
            except OSError as e:
                raise UsageError(f"--out {path}: cannot list it ({e.strerror})") from None
            if entries and not is_run_dir(path):
                shown = ", ".join(sorted(entries)[:3]) + (", ..." if len(entries) > 3 else "")
                raise UsageError(f"--out {path}: a non-empty directory that is not a slotscope run directory "
                                 f"(it holds {shown}); choose an empty or new directory")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--out {path}: cannot create the directory ({e.strerror or e})") from None
        rd = cls(path, path / LOCK_FILE)
        rd._acquire()
        try:
            rd._clear_previous_run()
        except BaseException:
            rd.release()
            raise
        return rd

    def _acquire(self) -> None:
        for _ in range(3):
            try:
                fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = _read_pid(self.lock)
                # our own PID in the lock is a dead run's (a container's process often has the same PID
                # every time): no run of ours holds it yet
                if holder is not None and holder != self.pid and pid_alive(holder):
                    raise UsageError(f"--out {self.path}: another slotscope run (PID {holder}) is writing there "
                                     f"(lock {self.lock}); wait for it, or choose another directory") from None
                try:                 # stale: its run is gone (killed); take it over
                    self.lock.unlink()
                except FileNotFoundError:
                    pass
                except OSError as e:
                    raise UsageError(f"--out {self.path}: cannot remove the stale lock {self.lock} "
                                     f"({e.strerror})") from None
                continue
            except OSError as e:
                why = "not writable" if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else "cannot write there"
                raise UsageError(f"--out {self.path}: {why} ({e.strerror or e})") from None
            try:
                os.write(fd, f"{self.pid}\n".encode())
            finally:
                os.close(fd)
            if _read_pid(self.lock) == self.pid:
                return
        raise UsageError(f"--out {self.path}: could not take the lock {self.lock} (another run keeps taking it)")

    def _clear_previous_run(self) -> None:
        for name in RUN_FILES:
            for p in (self.path / name, self.path / (name + ".tmp")):
                try:
                    if p.is_file() or p.is_symlink():
                        p.unlink()
                except OSError as e:
                    raise UsageError(f"--out {self.path}: cannot remove {p.name} of the previous run "
                                     f"({e.strerror})") from None

    # ------------------------------------------------------------------------------ closing
    def release(self) -> None:
        if _read_pid(self.lock) == self.pid:
            try:
                self.lock.unlink()
            except OSError:
                pass

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
