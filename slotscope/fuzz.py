"""``slotscope fuzz --design D``: search the scenario space for a failing scenario, no scenario given.

Scenarios are drawn from a seed (:class:`Generator`, a ``random.Random`` of its own) over the whole
space: presets and explicit layer patterns, pool sizes, SWA ratios and page sizes (deployment-size
pools whose indices pass 32,767 and 65,535 too), chunked prefill, MIXED batches, DP attention sizes
and their padding (``dp_other_tokens``, ``attn_tp_size``), piecewise graphs (capture sizes, shrink or
not) and decode graphs (capture sizes), speculative decoding (draft tokens, draft layers, draft pool
sizes and ratio), the overlap timeline (WAR barrier, platform), the radix prefix cache with shared
system prompts and multi-turn conversations, and retraction (``engine.reserve = "none"``); fill loads
whose pools are sized to take every page of the full or the SWA pool (:func:`fit_fill`), and knobs of
different groups coupled where they only act together (:meth:`Generator.couple`). Each draw
is TOML data written with :mod:`simulator.scenario.toml_write` and read back by ``parse_scenario``: the
scenario validator decides what is a scenario, and a draw it refuses (or that the scheduler or the
resource check refuses before the first step) is counted as rejected and never run.

Small first, growing: the size level (layers, requests, lengths, pool, steps) grows with the number
of scenarios drawn. Coverage-guided: each run's steps and summary give its *features* (forward mode x
graph runner x backend group, DP / graph padding, SWA eviction, pools taken to their last page with
the draft's geometry, prefix hits, the id range reached, the knobs that shape the write path); a scenario that reached a feature not seen before joins the
pool of interesting scenarios, and half the draws mutate one of them (a few knob groups redrawn), the
others are fresh. Everything depends only on the seed and the runs' deterministic results, so the
same seed gives the same sequence of scenarios (``--max-scenarios`` bounds it for a test).

A failure counts only where the reference runs the same scenario clean: by default the design's own
release (``--against release``: ``sglang-0.5.23`` for a design of 0.5.23, ``sglang-post-33587`` for one of
mid-2026; none for a design that is the release, or with ``--engine``; with ``--engine-patch``, the release
without the patches, fuzz_release_ref.py), ``--against DESIGN`` another, ``--against none`` no reference. On the first failing scenario (any finding on any backend) the search stops,
minimizes it with :class:`slotscope.minimize.Minimizer` and writes into ``--out``: ``found.toml`` (the
scenario as drawn), ``minimal.toml``, ``run/`` (the minimal scenario's run: summary, findings, report.html)
and ``fuzz.json`` (seed, counts, the finding, timings). An internal error of slotscope on a draw (an exception,
not a finding) is slotscope's own bug: the draw is written to ``--out/internal-errors/`` with its traceback,
counted, and the search goes on. Exit 1 when a failing scenario was found; else 3 when an internal error
was recorded; else 0 (the budget ran out clean).

Where each part lives: the draws (``Generator``, ``fix_up``, ``fit_fill``, ``draw_scenario``) in
fuzz_space.py, the features in fuzz_coverage.py, the search loop (``Fuzzer``, ``fuzz``, ``run_one``) in
fuzz_search.py; this module writes a failure (minimized) and is the command.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

from engine_path.errors import ReleaseBroke
from engine_path.releases import EngineSpec
from simulator.scenario import MAX_SEED, Scenario, parse_scenario

from .fuzz_search import OWN_RELEASE, FuzzResult, fuzz, run_one

EXIT_CLEAN, EXIT_FOUND, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
#: internal errors written to --out/internal-errors/ at most (every one is counted)
MAX_INTERNAL_WRITTEN = 20


def parse_budget(text: str) -> float:
    """'10m', '90s', '1h', '1.5m' or plain seconds -> seconds."""
    t = text.strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600}.get(t[-1:], None)
    num = t[:-1] if scale else t
    try:
        value = float(num) * (scale or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--budget {text!r}: give seconds or a number with s, m or h "
                                         f"(e.g. 90s, 10m)") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"--budget {text!r}: must be a finite time (seconds, or with s, m, h)")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--budget {text!r}: must be positive")
    return value


def parse_seed(text: str) -> int:
    """The search's seed: an integer in [0, 2^63), as ``slotscope run --seed`` takes it."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seed {text!r}: must be an integer in [0, 2^63)") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"--seed {value}: must be an integer in [0, 2^63)")
    return value


# --------------------------------------------------------------------------- on a failure

def target_of(sc: Scenario, finding):
    """The minimizer's target: the finding's class, layer kind and model side, on its backend."""
    from .minimize import Target

    if finding.layer < 0:
        return Target(finding.cls, None, None, finding.backend)
    return Target(finding.cls, finding.kind, finding.layer >= sc.model.num_layers, finding.backend)


def minimize_found(sc: Scenario, finding, log: Callable[[str], None],
                   engine: Optional[EngineSpec] = None) -> tuple[Scenario, int]:
    """The smallest scenario that still shows the finding (slotscope/minimize.py's search); ``engine``: each
    candidate through that release as this process imported it (its patches too)."""
    from simulator.designs.loading import load_design

    from .minimize import Minimizer

    m = Minimizer(sc, None if engine else load_design(sc.design), target_of(sc, finding), log,   # a stall: rejected
                  engine=engine)
    out = m.run()
    return replace(out, name=f"{sc.name}-minimal",
                   description=f"Found by slotscope fuzz and minimized: {m.target.describe()} under "
                               f"{m.under} ({m.runs} candidate runs)."), m.runs


def write_found(res: FuzzResult, out_dir: Path, engine: Optional[EngineSpec], log: Callable[[str], None],
                against: Optional[str] = None, engine_patches: tuple = (), ref=None) -> dict:
    """found.toml, minimal.toml, run/ (the minimal scenario's run and report) and fuzz.json (``against``: the
    reference design, default the result's; ``engine_patches``: the --engine-patch files the release ran with;
    ``ref``: the reference to run the minimal scenario on, fuzz_search.reference's, when it is not a design)."""
    against = res.against if against is None else against
    from .pipeline import RunOptions, run_scenario

    out_dir.mkdir(parents=True, exist_ok=True)
    sc, f = res.scenario, res.finding
    (out_dir / "found.toml").write_text(sc.to_toml(defaults=False))
    t0 = time.perf_counter()
    minimal, runs = minimize_found(sc, f, log, engine)
    (out_dir / "minimal.toml").write_text(minimal.to_toml(defaults=False))
    back = parse_scenario(minimal.to_toml(defaults=False), str(out_dir / "minimal.toml"))
    run = run_scenario(back, out_dir / "run", RunOptions(device="cpu", engine=engine, quiet_engine=True))
    info = {"status": "found", "design": sc.design, "engine": None if engine is None else str(engine),
            "engine_patches": list(engine_patches), "tried": res.tried, "rejected": res.rejected,
            "found_after_s": round(res.elapsed_s, 2), "minimize_s": round(time.perf_counter() - t0, 2),
            "minimize_runs": runs, "coverage": res.coverage, "scenario_hash": sc.hash,
            "finding": {"class": f.cls, "backend": f.backend, "step": f.step, "layer": f.layer, "kind": f.kind,
                        "message": f.message},
            "minimal_findings_total": run.summary["findings_total"]}
    info["against"] = against
    if against is not None:
        info["shared_with_against"] = res.shared
        if minimal is sc:                 # not minimized: the reference's outcome on this very draw
            info["against_on_minimal"] = res.against_on_found
        else:
            try:
                info["against_on_minimal"] = (ref.run(ref.scenario(back)).status if ref is not None else
                                              run_one(replace(back, design=against), None).status)
            except Exception as exc:      # slotscope's own bug on the reference: said, not raised
                info["against_on_minimal"] = f"internal error: {type(exc).__name__}: {str(exc)[:200]}"
    info.update(write_internal(res, out_dir))
    (out_dir / "fuzz.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def write_raised(res: FuzzResult, out_dir: Path, engine: EngineSpec, engine_patches: tuple = ()) -> dict:
    """A release that raised inside its own code (no finding to keep, so nothing to minimize): found.toml, run/ (the
    draw's run again, its partial outputs marked with the release's exception) and fuzz.json."""
    from .pipeline import RunOptions, run_scenario

    out_dir.mkdir(parents=True, exist_ok=True)
    sc = res.scenario
    (out_dir / "found.toml").write_text(sc.to_toml(defaults=False))
    again = None
    try:
        run_scenario(sc, out_dir / "run", RunOptions(device="cpu", engine=engine, quiet_engine=True))
    except ReleaseBroke as e:
        again = str(e)
    info = {"status": "found", "design": sc.design, "engine": str(engine), "engine_patches": list(engine_patches),
            "tried": res.tried, "rejected": res.rejected, "found_after_s": round(res.elapsed_s, 2),
            "coverage": res.coverage, "scenario_hash": sc.hash, "finding": None, "raised": res.error,
            "raised_again": again, "minimized": False, "against": res.against,
            "against_on_found": res.against_on_found}
    info.update(write_internal(res, out_dir))
    (out_dir / "fuzz.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def _found_raised(res: FuzzResult, out_dir: Path, engine: EngineSpec, engine_patches: tuple, ref,
                  log: Callable[[str], None]) -> int:
    """The command's end when the release raised on the failing draw: written unminimized, said in one line."""
    if ref is not None:
        ref.close()
    write_raised(res, out_dir, engine, engine_patches)
    log(f"fuzz: FOUND after {res.elapsed_s:.1f}s ({res.tried} scenarios): {res.error}"
        + (f"; {res.against} on it: {res.against_on_found}" if res.against else "")
        + f"; wrote {out_dir}/found.toml, run/, fuzz.json (not minimized: no finding to keep)")
    print((out_dir / "found.toml").read_text(), end="")
    return EXIT_FOUND


def write_internal(res: FuzzResult, out_dir: Path) -> dict:
    """Each recorded internal error's draw (``internal-errors/NNN.toml``, the design that raised as its design)
    and traceback (``NNN.txt``), the first MAX_INTERNAL_WRITTEN of them; fuzz.json's counts."""
    if not res.internal:
        return {"internal_errors": 0}
    d = out_dir / "internal-errors"
    d.mkdir(parents=True, exist_ok=True)
    files = []
    for i, f in enumerate(res.internal[:MAX_INTERNAL_WRITTEN]):
        (d / f"{i:03d}.toml").write_text(f.scenario.to_toml(defaults=False))
        (d / f"{i:03d}.txt").write_text(f"during: {f.during} (design {f.scenario.design})\n\n{f.error}")
        files.append(f"internal-errors/{i:03d}.toml")
    return {"internal_errors": len(res.internal), "internal_error_files": files}


def write_clean(res: FuzzResult, out_dir: Path, design: str, seed: int) -> dict:
    """fuzz.json (and the internal errors) of a search that found no failure but recorded internal errors."""
    out_dir.mkdir(parents=True, exist_ok=True)
    info = {"status": "clean", "design": design, "seed": seed, "tried": res.tried, "rejected": res.rejected,
            "elapsed_s": round(res.elapsed_s, 2), "coverage": res.coverage, "against": res.against,
            "shared_with_against": res.shared}
    info.update(write_internal(res, out_dir))
    (out_dir / "fuzz.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def register(subparsers: Any) -> None:
    from .options import add_engine_option, add_engine_patch, positive_int

    p = subparsers.add_parser(
        "fuzz", help="search the scenario space for a scenario that makes a design fail",
        description="Draw scenarios from a seed over the whole space (models, pools, pages, every forward mode, DP "
                    "padding, piecewise and decode graphs, speculative decoding, the overlap timeline, prefix "
                    "sharing, retraction), small first and growing, preferring those that reach combinations not "
                    "seen yet. On the first failure: minimize it and write found.toml, minimal.toml, run/ (its run "
                    "and report.html) and fuzz.json into --out. Progress on stderr.",
        epilog="exit codes: 0 the budget ran out clean, 1 a failing scenario was found, 2 bad input,\n"
               "            3 no failure found, but slotscope failed on a draw (an internal error: each is\n"
               "              written to --out/internal-errors/ and the search went on)\n"
               "example: slotscope fuzz --design sglang-pre-24743 --budget 2m --seed 1 --out out/fuzz-b2",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--design", required=True, help="a built-in design or path/to/file.py:ClassName")
    add_engine_option(p, engines=("sglang", "vllm"),
                      help="sglang or sglang==VERSION: the real release in the write path of every scenario drawn "
                           "(default: none, the design's model); vllm==VERSION: vLLM's scheduler, block pool and "
                           "worker tables make every batch and slot (draws vLLM does not run yet are rejected)")
    add_engine_patch(p)
    p.add_argument("--budget", type=parse_budget, default=600.0, metavar="TIME",
                   help="how long to search: 90s, 10m, 1h (a finite time > 0; default 10m)")
    p.add_argument("--seed", type=parse_seed, default=0,
                   help="the search's seed, an integer in [0, 2^63) (same seed, same scenarios; default 0)")
    p.add_argument("--out", metavar="DIR", help="where a failure goes (default out/fuzz-<design>)")
    p.add_argument("--against", metavar="DESIGN", default=OWN_RELEASE,
                   help="a reference design: count a failure only where it runs clean. 'release' (the default): "
                        "the design's own release (sglang-0.5.23 for a design of 0.5.23, sglang-post-33587 for one of "
                        "mid-2026; none for the release itself or with --engine; with --engine-patch the release "
                        "without the patches, in a worker process), so a bug the release has, like W7 on ROCm or F1 "
                        "in 0.5.23, does not end the search; a design name or path.py:Class; 'none': no reference")
    p.add_argument("--max-scenarios", type=positive_int, metavar="N", help="stop after N scenarios run (N >= 1)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_fuzz)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(text.split(":")[-1]).name)


def cmd_fuzz(args) -> int:
    def log(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    from .options import use_engine_patches

    engine = args.engine
    engine_patches = tuple(use_engine_patches(args, engine))
    out_dir = Path(args.out or f"out/fuzz-{_slug(args.design)}")
    from .fuzz_search import reference

    ref = reference(args.design, args.against, engine, patched=bool(engine_patches))
    against = None if ref is None else ref.name
    why = "" if args.against != OWN_RELEASE or ref is None else (
        " (the release without the patches)" if engine else " (the design's own release)")
    patched = f" + {', '.join(Path(x).name for x in engine_patches)}" if engine_patches else ""
    log(f"fuzz: design {args.design}{f', engine {engine}{patched}' if engine else ''}, seed {args.seed}, budget "
        f"{args.budget:.0f}s, against {against or 'nothing'}{why}")
    res = fuzz(args.design, seed=args.seed, budget_s=args.budget, engine=engine, max_scenarios=args.max_scenarios,
               log=log, against=args.against)
    internal = f", {len(res.internal)} internal errors of slotscope" if res.internal else ""
    log(f"fuzz: {res.status}: {res.tried} scenarios run, {res.rejected} rejected, {res.elapsed_s:.1f}s, "
        f"coverage {res.coverage} combinations" + (f", {res.shared} failing under {against} too" if against else "")
        + internal)
    if res.status == "clean":
        if not res.internal:
            return EXIT_CLEAN
        write_clean(res, out_dir, args.design, args.seed)
        log(f"slotscope: error: {len(res.internal)} internal errors of slotscope on valid draws (slotscope's own "
            f"bugs): {out_dir / 'internal-errors'} (rerun one: slotscope run {out_dir / 'internal-errors' / '000.toml'})")
        return EXIT_INTERNAL
    f = res.finding
    if f is None:                     # the release raised inside its own code: its crash, written unminimized
        return _found_raised(res, out_dir, engine, engine_patches, ref, log)
    log(f"fuzz: FOUND after {res.elapsed_s:.1f}s ({res.tried} scenarios): {f.cls} on {f.backend} at step {f.step}, "
        f"layer {f.layer} ({f.kind}); minimizing")
    from .minimize import InternalError

    try:
        info = write_found(res, out_dir, engine, log, engine_patches=engine_patches, ref=ref)
    except InternalError as e:
        write_internal(res, out_dir)
        (out_dir / "minimize-error.toml").write_text(e.candidate.to_toml(defaults=False))
        sys.stderr.write(e.trace)
        log(f"slotscope: error: internal error of slotscope while minimizing: {e}; the failing scenario is in "
            f"{out_dir / 'found.toml'}, the candidate that triggered the error in {out_dir / 'minimize-error.toml'}")
        return EXIT_INTERNAL
    finally:
        if ref is not None:
            ref.close()          # a release-as-released worker, if the minimal scenario started one
    log(f"fuzz: wrote {out_dir}/found.toml, minimal.toml, run/report.html, fuzz.json "
        f"(minimized in {info['minimize_s']}s)" + (f"; {len(res.internal)} internal errors in "
                                                   f"{out_dir / 'internal-errors'}" if res.internal else ""))
    print((out_dir / "minimal.toml").read_text(), end="")
    return EXIT_FOUND
