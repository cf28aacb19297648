"""``slotscope bisect``: the first SGLang release where a scenario's verdict changed.

``slotscope bisect SCENARIO --engine sglang --versions 0.5.14..0.5.23`` runs SCENARIO with each release in
the write path (as ``slotscope run SCENARIO --engine sglang==VERSION`` does), one subprocess per release
(``engine_path.isolate``: one release per process), and prints a table of verdicts per release and the
first release whose verdict differs from the one before.

* ``--versions A..B``: the final releases (``X.Y.Z``, no pre, dev or post releases) from A to B, both
  included, as the package registry lists them (``pip index versions sglang``); ``A,B,C``: exactly those.
* The search: the two ends first; equal verdicts there end it (no change: exit 1; the releases between
  are not run, ``--all`` runs them); different ones are bisected, which assumes the verdict changes once
  (monotonic). A release whose verdict is neither end's shows it is not, and then every release in the
  range is run. ``--all`` runs every release from the start.
* A release that has not got a piece the scenario needs (``engine_path.errors.ReleaseLacks``: 0.5.14 has no
  unified memory pool) is listed as ``cannot run: ...``, and the change is looked for among the releases that can;
  where an end of the range cannot, the first (or last) release that can is bisected for first.
* A verdict is ``clean`` or the findings per class (counts summed over the backends).
* Results are cached in ``<cache>/bisect/`` (``$SLOTSCOPE_CACHE`` or ``~/.cache/slotscope``), one file per
  (release, scenario hash), the scenario hash taken over the scenario as run (backends applied, the
  ``engine_release`` key left out), under slotscope's version: a rerun of the same bisection runs
  nothing. Each entry records the git commit and a fingerprint of the code that decided it (simulator/,
  engine_path/, slotscope's pipeline); an entry whose fingerprint differs from the working tree's is
  still used, and its source says ``cached (other code)``. After changing that code, ``--no-cache``
  runs again (and refreshes the cache).

Exit codes: 0 a change was found, 1 no change in the range, 2 bad input (a bad range, an unknown version,
the registry unreachable, a release the adapter cannot import), 130 / 143 interrupted / terminated.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from engine_path.errors import EngineError, ReleaseLacks

EXIT_CHANGED, EXIT_NO_CHANGE, EXIT_BAD_INPUT = 0, 1, 2
#: why --engine takes no version here
NAME_ONLY = "bisect takes the engine's name (--engine sglang) and the releases from --versions"
_FINAL = re.compile(r"^\d+(\.\d+)*$")
_ANY_VERSION = re.compile(r"^\d+(\.\d+){1,3}((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")
LIST_TIMEOUT_S = 120
_ROOT = Path(__file__).resolve().parent.parent
#: the code whose source decides a verdict (part of the cache key)
_CODE = ("simulator", "engine_path", "slotscope/pipeline.py", "slotscope/run_setup.py", "slotscope/pools.py",
         "slotscope/outputs.py", "slotscope/partial.py", "slotscope/engine_run.py", "cuda_path")


def _vkey(v: str) -> tuple:
    m = re.match(r"^(\d+(?:\.\d+)*)(.*)$", v)
    nums = tuple(int(x) for x in m.group(1).split(".")) if m else ()
    return nums + (0,) * (4 - len(nums)) + (m.group(2) if m else v,)


def cache_root() -> Path:
    root = os.environ.get("SLOTSCOPE_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "slotscope"


def registry_versions(name: str = "sglang") -> list[str]:
    """Every version of ``name`` the package registry lists (``pip index versions``), oldest first."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", name, "--disable-pip-version-check", "--no-input"]
    what = " ".join(["pip"] + cmd[3:])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LIST_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise EngineError(f"could not list the releases of {name}: `{what}` did not answer in {LIST_TIMEOUT_S} s "
                          f"(the package registry cannot be reached?)") from None
    except OSError as e:
        raise EngineError(f"could not list the releases of {name}: cannot run pip ({e})") from None
    out = proc.stdout + proc.stderr
    m = re.search(r"Available versions:\s*(.+)", out)
    if proc.returncode != 0 or not m:
        tail = "\n".join(out.strip().splitlines()[-4:])
        if "No matching distribution" in out:
            raise EngineError(f"could not list the releases of {name}: the package registry has none "
                              f"(`{what}`), or it cannot be reached. Last lines:\n{tail}")
        raise EngineError(f"could not list the releases of {name}: the package registry cannot be reached "
                          f"(`{what}` failed, exit {proc.returncode}). Last lines:\n{tail}")
    return sorted({v.strip() for v in m.group(1).split(",") if v.strip()}, key=_vkey)


def resolve_versions(text: str, listing: Optional[Callable[[], list[str]]] = None) -> list[str]:
    """``A..B`` (the registry's final releases from A to B, inclusive) or ``A,B,C`` -> versions, oldest first."""
    listing = listing or registry_versions
    text = text.strip()
    if ".." in text:
        lo, _, hi = text.partition("..")
        lo, hi = lo.strip(), hi.strip()
        for v in (lo, hi):
            if not _ANY_VERSION.match(v):
                raise EngineError(f"--versions {text!r}: {v!r} is not a release version (e.g. 0.5.14..0.5.23)")
        if _vkey(lo) > _vkey(hi):
            raise EngineError(f"--versions {text!r}: the range is empty ({lo} comes after {hi}); write OLDEST..NEWEST")
        known = listing()
        for v in (lo, hi):
            if v not in known:
                raise EngineError(f"unknown version: sglang=={v} is not on the package registry "
                                  f"(--versions {text}). The newest releases on the registry: "
                                  f"{', '.join(known[-12:])}")
        picked = [v for v in known if _FINAL.match(v) and _vkey(lo) <= _vkey(v) <= _vkey(hi)]
        for v in (lo, hi):           # an end named explicitly is taken even when it is a post release
            if v not in picked:
                picked.append(v)
        return sorted(picked, key=_vkey)
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise EngineError("--versions: name a range A..B or a list A,B,C (e.g. 0.5.14..0.5.23)")
    for v in items:
        if not _ANY_VERSION.match(v):
            raise EngineError(f"--versions {text!r}: {v!r} is not a release version (e.g. 0.5.14,0.5.15)")
    if len(set(items)) != len(items):
        raise EngineError(f"--versions {text!r}: names a release twice")
    from engine_path.releases import is_cached

    if not all(is_cached(v) for v in items):          # the registry only when something must be fetched
        known = listing()
        for v in items:
            if v not in known:
                raise EngineError(f"unknown version: sglang=={v} is not on the package registry "
                                  f"(--versions {text}). The newest releases on the registry: "
                                  f"{', '.join(known[-12:])}")
    return sorted(items, key=_vkey)


def code_fingerprint() -> str:
    h = hashlib.sha256()
    for rel in _CODE:
        p = _ROOT / rel
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        for f in files:
            try:
                h.update(str(f.relative_to(_ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
            except OSError:
                continue
    return h.hexdigest()[:16]


def scenario_key(path: str, backends: Optional[tuple[str, ...]]) -> tuple[Any, str]:
    """The scenario as each release runs it, and its hash (backends applied; engine_release left out)."""
    from simulator.scenario import load_scenario

    sc = load_scenario(path).with_overrides(backends=backends)
    text = dataclasses.replace(sc, engine_release=None).to_toml()
    return sc, hashlib.sha256(text.encode()).hexdigest()[:16]


def error_label(error: str) -> str:
    """An error verdict without the release's own name in it (the same failure is the same verdict in every release:
    ``slotscope.bisect:verdict under sglang==0.5.16 raised TypeError: ...`` -> ``TypeError: ...``)."""
    return re.sub(r"^\S+ under sglang==\S+ raised ", "", error.splitlines()[0])[:120]


def verdict_label(findings: dict[str, int]) -> str:
    if not findings:
        return "clean"
    return "findings: " + ", ".join(f"{c} {n}" for c, n in sorted(findings.items()))


class Bisection:
    """Verdicts per release, run on demand (cached, or one subprocess per release)."""

    def __init__(self, path: str, versions: list[str], *, backends: Optional[tuple[str, ...]] = None,
                 use_cache: bool = True, log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
                 runner: Optional[Callable[[str, str, Optional[list[str]]], dict]] = None):
        self.path = str(Path(path).resolve())
        self.versions = versions
        self.backends = backends
        self.use_cache = use_cache
        self.log = log
        self.runner = runner or _run_isolated
        self.scenario, self.scenario_hash = scenario_key(path, backends)
        from engine_path.patches import env_paths, hashes

        # --engine-patch: the patches' hashes are part of the cache key (a patched release is another engine)
        self.patch_hashes = hashes(env_paths())
        self.patch_key = ("" if not self.patch_hashes else
                          "_patches-" + hashlib.sha256("\n".join(self.patch_hashes).encode()).hexdigest()[:16])
        self.code = code_fingerprint()
        self.results: dict[str, dict] = {}

    def cache_file(self, version: str) -> Path:
        from . import __version__

        return cache_root() / "bisect" / f"sglang-{version}_{self.scenario_hash}{self.patch_key}_slotscope-{__version__}.json"

    def verdict(self, version: str) -> dict:
        if version in self.results:
            return self.results[version]
        f = self.cache_file(version)
        rec = None
        if self.use_cache and f.is_file():
            try:
                rec = json.loads(f.read_text(encoding="utf-8"))
                rec["source"] = "cached" if rec.get("code") == self.code else "cached (other code)"
            except (OSError, ValueError):
                rec = None
        if rec is None:
            t0 = time.perf_counter()
            res = self.runner(version, self.path, list(self.backends) if self.backends else None)
            from .run_setup import git_commit

            rec = {"release": version, "scenario": self.scenario.name, "scenario_hash": self.scenario_hash,
                   "patches": self.patch_hashes, "code": self.code, "commit": git_commit(),
                   "findings": res.get("findings", {}), "backends": res.get("backends", {}),
                   "steps": res.get("steps"), "engine": res.get("engine"), "error": res.get("error"),
                   "lacks": res.get("lacks"), "seconds": round(time.perf_counter() - t0, 1)}
            if rec["error"] is None and not res.get("incomplete"):
                f.parent.mkdir(parents=True, exist_ok=True)
                tmp = f.with_name(f.name + f".tmp-{os.getpid()}")
                tmp.write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
                os.replace(tmp, f)
            rec["source"] = "run"
        rec["verdict"] = ("error: " + error_label(rec["error"])) if rec.get("error") else \
            ("cannot run: " + rec["lacks"].splitlines()[0][:120]) if rec.get("lacks") else verdict_label(rec["findings"])
        self.results[version] = rec
        secs = f"{rec['seconds']:.1f} s" if rec["source"] == "run" else f"{rec['source']} (ran in {rec['seconds']:.1f} s)"
        self.log(f"[bisect] sglang=={version}: {rec['verdict']}  {secs}")
        return rec

    def prefetch(self, versions: list[str], jobs: int) -> None:
        """Verdicts of ``versions``, ``jobs`` subprocesses at a time (1: one after the other)."""
        todo = [v for v in versions if v not in self.results]
        if jobs <= 1 or len(todo) <= 1:
            for v in todo:
                self.verdict(v)
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(jobs, len(todo))) as ex:
            list(ex.map(self.verdict, todo))

    def can_run(self, version: str) -> bool:
        """Whether the release has what the scenario needs (its verdict is not "cannot run": ReleaseLacks)."""
        return self.verdict(version).get("lacks") is None

    def _runnable(self, run_all: bool, jobs: int) -> list[str]:
        """The releases the change is looked for among: those that can run the scenario. Where an end of the range
        cannot, the first (or last) release that can is bisected for, assuming a release keeps a piece once it has
        it; every release is run when neither end can. EngineError when none can."""
        vs = self.versions
        self.prefetch(vs if run_all else [vs[0], vs[-1]], jobs)
        if not run_all:
            first, last = self.can_run(vs[0]), self.can_run(vs[-1])
            if first and last:
                return list(vs)
            if first != last:
                lo, hi = 0, len(vs) - 1            # the one that cannot run, the one that can
                if first:
                    lo, hi = hi, lo
                while abs(hi - lo) > 1:
                    mid = (lo + hi) // 2
                    if self.can_run(vs[mid]):
                        hi = mid
                    else:
                        lo = mid
                return list(vs[hi:]) if last else list(vs[:hi + 1])
            self.log("[bisect] neither end of the range can run the scenario: running every release")
            self.prefetch(vs, jobs)
        ok = [x for x in vs if self.can_run(x)]
        if not ok:
            raise EngineError(f"no release of --versions can run {self.scenario.name}: "
                              f"{self.results[vs[0]]['lacks'].splitlines()[0]} (sglang=={vs[0]}); the releases "
                              f"that cannot are listed as such when some can")
        return ok

    def search(self, run_all: bool = False, jobs: int = 1) -> dict:
        """Run what the search needs; returns {"changes": [...], "mode", "runnable"}: the change is looked for
        among the releases that can run the scenario (:meth:`_runnable`)."""
        vs = self._runnable(run_all, jobs)
        lacking = [x for x in self.versions if x in self.results and not self.can_run(x)]
        if lacking:
            self.log(f"[bisect] cannot run {self.scenario.name}: {', '.join(lacking)} "
                     f"({self.results[lacking[0]]['lacks'].splitlines()[0]}); looking among {vs[0]}..{vs[-1]}")
        self._among = vs
        v = lambda i: self.verdict(vs[i])["verdict"]      # noqa: E731
        mode = "all" if run_all else "bisect"
        if not run_all and len(vs) > 1:
            lo, hi = 0, len(vs) - 1
            self.prefetch([vs[lo], vs[hi]], jobs)
            a, b = v(lo), v(hi)
            if a == b:
                return self._outcome("ends", [])
            while hi - lo > 1:
                mid = (lo + hi) // 2
                m = v(mid)
                if m == a:
                    lo = mid
                elif m == b:
                    hi = mid
                else:
                    self.log(f"[bisect] sglang=={vs[mid]} has a third verdict: not monotonic; running every release")
                    mode = "all (not monotonic)"
                    self.prefetch(vs, jobs)
                    break
            else:
                return self._outcome(mode, [(vs[lo], vs[hi])])
        for i in range(len(vs)):
            v(i)
        vs = self._among = [x for x in vs if self.can_run(x)]      # a gap inside the range is not a change
        changes = [(vs[i - 1], vs[i]) for i in range(1, len(vs)) if v(i) != v(i - 1)]
        if mode == "all" and len(changes) > 1:
            mode = "all (not monotonic)"
        return self._outcome(mode, changes)

    def _outcome(self, mode: str, changes: list[tuple[str, str]]) -> dict:
        return {"mode": mode, "runnable": list(self._among),
                "changes": [{"before": a, "release": b, "from": self.results[a]["verdict"],
                             "to": self.results[b]["verdict"]} for a, b in changes]}

    def table(self) -> str:
        # "batches": whose scheduler made the run's batches (the release's own where it is driven: 0.5.23; the
        # model's elsewhere), so a verdict that changes where the scheduler does is seen as such
        head = ["release", "verdict", "backends with findings", "batches", "source", "seconds"]
        rows = []
        for ver in self.versions:
            r = self.results.get(ver)
            if r is None:
                rows.append([ver, "-", "", "", "not run", ""])
                continue
            hit = sorted(b for b, f in (r.get("backends") or {}).items() if f)
            engine = r.get("engine") if isinstance(r.get("engine"), dict) else {}
            rows.append([ver, r["verdict"], f"{len(hit)} of {len(r.get('backends') or {})}" if r.get("backends") else "",
                         engine.get("scheduler", ""), r["source"], f"{r['seconds']:.1f}"])
        widths = [max(len(h), *(len(x[i]) for x in rows)) for i, h in enumerate(head)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
        lines += ["  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in rows]
        return "\n".join(lines)


def _run_isolated(version: str, path: str, backends: Optional[list[str]]) -> dict:
    from engine_path import isolate

    try:
        return isolate.call(f"sglang=={version}", "slotscope.bisect:verdict", path, backends)
    except isolate.IsolatedFailure as e:
        return {"error": str(e)}
    except ReleaseLacks as e:           # this release cannot run the scenario; others may
        return {"lacks": str(e)}


def cmd_bisect(args) -> int:
    from .options import use_engine_patches

    use_engine_patches(args, args.engine)
    versions = resolve_versions(args.versions)
    if not versions:
        raise EngineError(f"--versions {args.versions}: no final release of sglang in that range on the registry")
    b = Bisection(args.scenario, versions, backends=args.backends, use_cache=not args.no_cache)
    print(f"[bisect] {b.scenario.name} (scenario hash {b.scenario_hash}) over {len(versions)} releases: "
          f"{', '.join(versions)}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    out = b.search(run_all=args.all, jobs=args.jobs)
    print(b.table())
    ran = sum(1 for r in b.results.values() if r["source"] == "run")
    if any(r["source"] == "cached (other code)" for r in b.results.values()):
        print("[bisect] some verdicts are cached from other code (simulator/, engine_path/ or the pipeline changed "
              "since); --no-cache runs them again", file=sys.stderr)
    print()
    if out["changes"]:
        c = out["changes"][0]
        print(f"first release where the verdict changed: {c['release']} ({c['before']}: {c['from']} -> "
              f"{c['release']}: {c['to']})")
        for c in out["changes"][1:]:
            print(f"  changed again at {c['release']} ({c['from']} -> {c['to']})")
    elif out["mode"] == "ends":
        lo, hi = out["runnable"][0], out["runnable"][-1]
        print(f"no change: {lo} and {hi} agree ({b.results[lo]['verdict']}); the releases between were not run "
              f"(--all runs each)")
    else:
        print(f"no change: every release that can run it gives {b.results[out['runnable'][0]]['verdict']}")
    lacking = [v for v in versions if v in b.results and not b.can_run(v)]
    if lacking:
        print(f"cannot run the scenario: {', '.join(lacking)} ({b.results[lacking[0]]['lacks'].splitlines()[0]}); "
              f"the change was looked for among {out['runnable'][0]}..{out['runnable'][-1]}")
    print(f"search: {out['mode']}; {len(b.results)} of {len(versions)} releases, {ran} run, "
          f"{len(b.results) - ran} cached; {time.perf_counter() - t0:.1f} s")
    if args.json:
        print(json.dumps({"scenario": b.scenario.name, "scenario_hash": b.scenario_hash, "versions": versions,
                          "mode": out["mode"], "changes": out["changes"], "runnable": out["runnable"],
                          "results": {v: {k: r[k] for k in ("verdict", "findings", "source", "seconds")}
                                      for v, r in b.results.items()}}, separators=(",", ":")))
    return EXIT_CHANGED if out["changes"] else EXIT_NO_CHANGE


def register(sub) -> None:
    from engine_path.releases import EngineSpec

    from .options import VERSION_FORBIDDEN, add_engine_option, add_engine_patch, backend_list, positive_int

    p = sub.add_parser(
        "bisect", help="the first SGLang release where a scenario's verdict changed",
        description="Run SCENARIO with each SGLang release of --versions in the write path (one subprocess per "
                    "release, as `slotscope run SCENARIO --engine sglang==VERSION`), print a table of verdicts per "
                    "release and name the first release where the verdict changed. The two ends run first; if they "
                    "differ the range is bisected (the verdict is assumed to change once; a third verdict makes it "
                    "run every release). Results are cached per (release, scenario hash) in $SLOTSCOPE_CACHE/bisect "
                    "(default ~/.cache/slotscope/bisect). Progress on stderr.",
        epilog="examples:\n"
               "  slotscope bisect scenarios/b1-pcg-dp-padding.toml --engine sglang --versions 0.5.14..0.5.23\n"
               "  slotscope bisect scenarios/gap-swa-shorter.toml --engine sglang --versions 0.5.14,0.5.23 --all\n\n"
               "exit codes:\n"
               "  0    a change was found (the first release where the verdict changed is named)\n"
               "  1    no change in the range\n"
               "  2    bad input: a bad --versions, an unknown version, the registry unreachable, an import that\n"
               "       fails or an API the adapter does not know (one line naming what was tried)\n"
               "  130  interrupted (^C); 143 terminated (SIGTERM)\n",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", help="scenario TOML file")
    add_engine_option(p, default=EngineSpec("sglang"), version=VERSION_FORBIDDEN, why=NAME_ONLY, metavar="NAME",
                      help="the engine, by name only: sglang (the default, and the only one today); the releases "
                           "come from --versions")
    add_engine_patch(p)
    p.add_argument("--versions", required=True, metavar="A..B | A,B,C",
                   help="releases: A..B the registry's final releases from A to B inclusive (pip index versions "
                        "sglang), or a comma list")
    p.add_argument("--backends", type=backend_list, help="comma-separated backends (default: the scenario's; 'all')")
    p.add_argument("--all", action="store_true", help="run every release in the range (no bisection)")
    p.add_argument("--no-cache", action="store_true", help="run every release it needs even when cached")
    p.add_argument("--jobs", type=positive_int, default=1, metavar="N",
                   help="releases run at once (default 1; the two ends, or every release with --all, in parallel)")
    p.add_argument("--json", action="store_true", help="end with one JSON line: the verdicts and the change")
    p.set_defaults(func=cmd_bisect)


def verdict(path: str, backends: Optional[list[str]] = None) -> dict:
    """One release's verdict on a scenario (the release is already active: engine_path.isolate's child).

    Runs the scenario exactly as ``slotscope run SCENARIO --engine`` does, in memory, and returns the
    findings per backend and class."""
    from engine_path.releases import EngineSpec, active

    from .pipeline import RunOptions, run_scenario

    info = active()
    t0 = time.perf_counter()
    spec = EngineSpec(info.name, info.version) if info else EngineSpec()
    out = run_scenario(path, None, RunOptions(engine=spec,
                                              backends=tuple(backends) if backends else None, device="cpu",
                                              report=False, trace_level="off", quiet_engine=True))
    s = out.summary
    by_class: dict[str, int] = {}
    for st in s["backends"].values():
        for cls, n in st["findings"].items():
            if n:
                by_class[cls] = by_class.get(cls, 0) + n
    return {"engine": s["engine"], "steps": s["steps"], "findings_total": s["findings_total"],
            "findings": by_class, "incomplete": s.get("incomplete"),
            "backends": {b: {c: n for c, n in st["findings"].items() if n} for b, st in s["backends"].items()},
            "run_s": round(time.perf_counter() - t0, 3)}
