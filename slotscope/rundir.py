"""A run's output directory: one run at a time, nothing of an earlier run left beside new results, nothing
written or removed outside it, and nothing touched by a run that is refused.

``RunDir.open(path)`` (used as a context manager) checks ``--out`` and takes the lock; ``RunDir.begin()``, called
once the run is about to take its first step, clears the previous run's files:

* ``--out`` that is empty, a file (or a FIFO, a socket, ...), cannot be created or is not writable is bad input
  (``UsageError``); so is a run directory where a name slotscope writes (``RUN_FILES``) is taken by a directory
  or anything but a file or a link. :func:`check_out` makes these checks without touching anything.
* The lock is ``DIR/.slotscope.lock``, created with ``O_CREAT | O_EXCL`` and holding the PID of its
  run. A second run into the directory is refused while that PID is alive (the message names it);
  a lock whose PID is dead (a run killed with SIGKILL), or is this process's own PID (a killed run in
  a container that gave it the same PID), is taken over.
* A directory that already holds files must be a slotscope run directory (the lock, or a summary.json,
  run.json, steps.jsonl or findings.jsonl that looks like slotscope's); then every file slotscope
  writes there (``RUN_FILES``, and their ``.tmp`` leftovers) is removed when the run begins (summary.json
  first: what is left of an interrupted clearing never claims a verdict). Other files are never touched; a
  link is removed, never followed; a non-empty directory that is not a run directory is refused.
* A run refused before it begins (a bad ``--inject``, a design whose ``backend_spec`` raises, a request no pool
  can hold, ...) leaves the previous run's files exactly as they were, and removes the directories it created.
* ``begin`` also keeps back :data:`RESERVE_BYTES` in ``DIR/.slotscope.reserve`` where it can: when a write
  fails (a full disk), :meth:`RunDir.free_reserve` gives that room back so that summary.json and run.json can
  still say the run is incomplete. A normal end removes it.

A name that builds an output path (a scenario's ``name``: ``out/<name>``) goes through :func:`confined`: one
directory name, inside its base even through links. ``write_atomic`` writes a file under a temporary name
(created afresh, never through a link left there) and renames it into place, so a reader (or a kill) never sees
half a file; a failed write raises :class:`OutputError`.
"""
from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Optional


LOCK_FILE = ".slotscope.lock"


class UsageError(ValueError):
    """A command-line choice that cannot be honoured here (exit 2); re-exported by slotscope.pipeline."""


class OutputError(OSError):
    """Writing an output file failed (a full disk, a file size limit, an I/O error): the run failed (exit 3);
    ``filename`` is the file, ``strerror`` the reason."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


def output_error(e: OSError, path: os.PathLike[str] | str) -> OutputError:
    return e if isinstance(e, OutputError) else OutputError(e.errno, e.strerror or str(e), str(path))


#: Every file `slotscope run` (and the commands that derive files from a run: export, minimize) writes
#: into a run directory; summary.json first, the file that claims a verdict.
RUN_FILES = ("summary.json", "findings.jsonl", "steps.jsonl", "shapes.jsonl", "scenario.toml", "run.json",
             "trace.otlp.jsonl", "report.html", "faults.jsonl", "trace.chrome.json", "minimal.toml",
             "minimize-error.toml")
#: room kept back while a run writes, so that a full disk still leaves summary.json and run.json saying incomplete
RESERVE_FILE, RESERVE_BYTES = ".slotscope.reserve", 256 * 1024
_CLEARED = RUN_FILES + (RESERVE_FILE,)


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through ``path.tmp`` and a rename; the temporary file never stays. The temporary
    file is created afresh (``O_EXCL``), so a link left under its name is replaced, never written through. An
    OSError becomes :class:`OutputError` naming ``path``."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        if isinstance(e, OSError):
            raise output_error(e, path) from e
        raise
    return path


def write_json_atomic(path: Path, data: object) -> Path:
    return write_atomic(path, json.dumps(data, indent=2) + "\n")


def describe(path: Path) -> str:
    """What is at ``path``, in words: "a file", "a directory", "a FIFO", "a link to X", "nothing", ..."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "nothing"
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"a link to {os.readlink(path)}"
        except OSError:
            return "a link"
    for test, what in ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(st.st_mode):
            return what
    return "not a file"


def run_dir_problem(path: os.PathLike[str] | str) -> Optional[str]:
    """Why ``path`` cannot be a run directory to read (report, compare, minimize), or None."""
    p = Path(path)
    if str(path) == "":
        return "the run directory must not be empty (give the --out directory of `slotscope run`)"
    if not p.exists():
        return f"{p}: no such run directory" + ("" if not p.is_symlink() else f" ({describe(p)}, which is missing)")
    if not p.is_dir():
        return f"{p}: is {describe(p)}, not a directory (give a run directory: the --out of `slotscope run`)"
    try:
        next(iter(p.iterdir()), None)
    except OSError as e:
        return f"{p}: cannot list the run directory ({e.strerror})"
    return None


def confined(base: Path, name: str, what: str) -> Path:
    """``base / name`` for a name that builds an output path (``what``: where it comes from, e.g. the scenario
    file's ``name``): one directory name, and inside ``base`` even where a link in the way points elsewhere."""
    from simulator.scenario import path_name_problem

    problem = path_name_problem(name)
    if problem is not None:
        raise UsageError(f"{what} {name!r:.80}: {problem}; it cannot name a directory in {base}/ "
                         f"(give --out DIR, or fix the name)")
    path = base / name
    if os.path.lexists(path):
        inside, target = base.resolve(), path.resolve()
        if target != inside and inside not in target.parents:
            raise UsageError(f"{path}: is {describe(path)}, outside {base}/ ({what} {name!r}); a name writes only "
                             f"inside {base}/: give --out {target} to write there")
    return path


def check_out(out: os.PathLike[str] | str, flag: str = "--out") -> Path:
    """The checks of an output directory that touch nothing: ``UsageError`` naming ``flag`` when it cannot be one."""
    if str(out) == "":
        raise UsageError(f"{flag}: must not be empty (give a directory)")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path}: is {describe(path)}, not a directory")
    if not path.is_dir():
        if path.is_symlink():
            raise UsageError(f"{flag} {path}: is {describe(path)}, which does not exist")
        return path
    try:
        entries = sorted(p.name for p in path.iterdir())
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot list it ({e.strerror})") from None
    if entries and not is_run_dir(path):
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise UsageError(f"{flag} {path}: a non-empty directory that is not a slotscope run directory "
                         f"(it holds {shown}); choose an empty or new directory")
    for name in _CLEARED + (LOCK_FILE,):
        for p in (path / name, path / (name + ".tmp")):
            if os.path.lexists(p) and not (p.is_symlink() or stat.S_ISREG(os.lstat(p).st_mode)):
                raise UsageError(f"{flag} {path}: {p.name} is {describe(p)}; slotscope writes a file of that name "
                                 f"there: move it away, or choose another directory")
    return path


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
    """The locked output directory of one run. Use ``with RunDir.open(path) as rd:``, and ``rd.begin()`` when the
    run is about to start (before that, nothing of an earlier run is touched)."""

    def __init__(self, path: Path, lock: Path, created: tuple[Path, ...] = ()):
        self.path = path
        self.lock = lock
        self.pid = os.getpid()
        self.created = created          # the directories open() made (deepest last), removed if the run never begins
        self.begun = False

    # ------------------------------------------------------------------------------ opening
    @classmethod
    def open(cls, out: os.PathLike[str] | str) -> "RunDir":
        path = check_out(out)
        missing = [d for d in (path, *path.parents) if not d.exists()][::-1]
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--out {path}: cannot create the directory ({e.strerror or e})") from None
        rd = cls(path, path / LOCK_FILE, tuple(missing))
        try:
            rd._acquire()
        except BaseException:
            rd._remove_created()
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

    # ------------------------------------------------------------------------------ the run begins
    def begin(self) -> None:
        """The run starts: the previous run's files go (summary.json first), and the reserve is written."""
        if self.begun:
            return
        self.begun = True
        for name in _CLEARED:
            for p in (self.path / name, self.path / (name + ".tmp")):
                try:
                    if p.is_file() or p.is_symlink():
                        p.unlink()
                except OSError as e:
                    raise UsageError(f"--out {self.path}: cannot remove {p.name} of the previous run "
                                     f"({e.strerror})") from None
        try:                             # a cushion only: where it cannot be kept (a file size limit), none
            fd = os.open(self.path / RESERVE_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                _write_fd(fd, bytes(RESERVE_BYTES))
            finally:
                os.close(fd)
        except OSError:
            self.free_reserve()

    def free_reserve(self) -> None:
        """Give the kept-back room to the files that must still be written (or that are done)."""
        try:
            (self.path / RESERVE_FILE).unlink()
        except OSError:
            pass

    # ------------------------------------------------------------------------------ closing
    def _remove_created(self) -> None:
        for d in reversed(self.created):
            try:
                d.rmdir()
            except OSError:
                return

    def release(self) -> None:
        if self.begun:
            self.free_reserve()
        if _read_pid(self.lock) == self.pid:
            try:
                self.lock.unlink()
            except OSError:
                pass
        if not self.begun:
            self._remove_created()           # a run refused before it began leaves no new directory

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
