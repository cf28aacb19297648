"""The ``slotscope`` command.

Exit codes (``EXIT_CODES`` below; README, docs/GUIDE.md and ``--help`` list the same): 0 clean (a
complete run, no findings), 1 findings (or a failed expectation), 2 bad input, 3 the run failed
(partial outputs kept), 4 no findings but the live OTLP export failed, 5 no findings in a run cut short
by --max-steps (not a clean verdict), 130 interrupted (SIGINT, ^C), 143 terminated (SIGTERM).
"""
from __future__ import annotations

import argparse
import faulthandler
import io
import signal
import sys
from pathlib import Path
from typing import Optional, Sequence

from engine_path.errors import EngineError, ReleaseBroke
from simulator.designs.catalogue import BUILTIN_DESIGNS
from simulator.designs.types import DesignError
from simulator.scenario import MAX_SEED, ScenarioError

from . import __version__
from .options import (add_allow_design_files, add_engine_option, add_engine_patch, backend_list, positive_int,
                      use_engine_patches)
from .partial import RunStopped, stop_on_signals
from .rundir import OutputError, UsageError, confined, run_dir_problem

EXIT_CLEAN, EXIT_FINDINGS, EXIT_BAD_INPUT, EXIT_CRASH = 0, 1, 2, 3
EXIT_LIVE_EXPORT, EXIT_CUT = 4, 5
EXIT_SIGINT, EXIT_SIGTERM = 128 + signal.SIGINT, 128 + signal.SIGTERM     # 130, 143

_EPILOG = """\
examples:
  slotscope run scenarios/b1-pcg-dp-padding.toml --out out/b1
  slotscope run scenarios/b1-pcg-dp-padding.toml --design sglang-post-29460 --out out/b1-fixed
  slotscope run scenarios/smoke.toml --design my_fix.py:MyDesign --backends flashinfer,trtllm_mha
  slotscope run scenarios/b1-pcg-dp-padding.toml --engine sglang==0.5.14 --out out/b1-0514
  slotscope bisect scenarios/b1-pcg-dp-padding.toml --engine sglang --versions 0.5.14..0.5.23
  slotscope compare out/b1 out/b1-fixed -o out/b1-compare.html
  slotscope analyze out/b1/trace.otlp.jsonl
  slotscope bugs                     # every known bug reproduces, every fix is clean
  slotscope minimize out/b1          # the smallest scenario that still fails the same way

exit codes:
  0    clean: the run finished and no write diverged
  1    findings
  2    bad input (the message names the file and field, or the flag; for --engine: the release,
       the registry or the import that failed)
  3    the run failed (partial outputs kept, summary.json says "incomplete")
  4    no findings, but the live export (--otlp-endpoint) failed; the run's own files are complete
  5    no findings in a run cut short by --max-steps: not a clean verdict
  130  interrupted (^C, SIGINT); partial outputs kept, marked incomplete
  143  terminated (SIGTERM); partial outputs kept, marked incomplete

a command that seems stuck: kill -USR1 PID prints every thread's Python stack on its stderr and it goes on
"""


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2^63), got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2^63), got {value}")
    return value


def _add_run(sub) -> None:
    p = sub.add_parser(
        "run", help="run a scenario through every backend and check the pools",
        description="Run SCENARIO: the scheduler makes padded batches, each crosses every backend boundary, "
                    "the design builds the write locations, the pool under test and the reference pool are "
                    "compared after every step. Prints a design x backend table; writes summary.json, "
                    "findings.jsonl, steps.jsonl, shapes.jsonl, trace.otlp.jsonl, report.html to --out.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", help="scenario TOML file (see scenarios/ and docs/SCENARIOS.md)")
    p.add_argument("--design", help=f"design to test: one of {', '.join(sorted(BUILTIN_DESIGNS))}, or "
                                    f"path/to/file.py:ClassName (default: the scenario's)")
    add_engine_option(
        p, engines=("sglang", "vllm"),
        help="put a real engine release in the loop instead of a modelled design: 'sglang' (the installed one, an "
             "editable checkout included), 'sglang==VERSION' or 'vllm==VERSION' ('vllm': 0.34.0), fetched once into "
             "slotscope's cache ($SLOTSCOPE_CACHE or ~/.cache/slotscope). SGLang: its scheduler, tree cache, "
             "allocator, backends' forward, KVWriteLoc and pool run (docs/ENGINE.md). vLLM: its Scheduler, hybrid "
             "KVCacheManager and block pool decide every batch and block; the worker's block tables are modelled "
             "(docs/VLLM.md). Needs pip install -e '.[sglang]' or '.[vllm]' (default: the scenario's engine_release, "
             "if any)")
    add_engine_patch(p)
    p.add_argument("--backends", type=backend_list, help="comma-separated backends (default: the scenario's; 'all')")
    p.add_argument("--out", default=None,
                   help="output directory (default: out/<scenario name>): an empty one, or a run directory, whose "
                        "earlier run's files are removed first; one run at a time (DIR/.slotscope.lock)")
    p.add_argument("--seed", type=_seed, help="override the scenario's seed (an integer in [0, 2^63))")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where the pool under test lives (default: cuda if available)")
    p.add_argument("--geometry", choices=("real", "compact"),
                   help="K/V row geometry of the pool under test (default: real on cuda, compact on cpu)")
    p.add_argument("--store", choices=("torch", "triton"),
                   help="store implementation (default: triton on cuda, torch on cpu)")
    p.add_argument("--no-cuda-graphs", action="store_true",
                   help="on cuda, run every batch eagerly instead of replaying decode / piecewise CUDA graphs")
    p.add_argument("--trace-level", default="anomaly", choices=("off", "step", "boundary", "anomaly"),
                   help="span detail in trace.otlp.jsonl (default: anomaly)")
    p.add_argument("--otlp-endpoint", help="also export spans live to this OTLP/HTTP collector "
                                           "(OTEL_EXPORTER_OTLP_* variables are honoured)")
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    p.add_argument("--max-steps", type=positive_int, metavar="N",
                   help="stop after N forward steps (N >= 1); a run cut there is marked incomplete, never clean")
    p.add_argument("--inject", action="append", default=[], metavar="KIND[:PROB]",
                   help="inject faults of KIND with probability PROB per step (default 0.05), logged in "
                        "faults.jsonl with what detected them; repeatable (simulator/plugins/faults.py FAULT_KINDS)")
    p.add_argument("--scheduler", default="auto", choices=("auto", "model", "release"),
                   help="with --engine: who makes the batches. release: the release's own Scheduler, tree cache and "
                        "event loop (sglang 0.5.23; not yet: overlap, speculative, DP attention, PD decode, the "
                        "unified pool, a cache linker); model: our scheduler over the release's allocator; auto "
                        "(default): the release's wherever it can run, on the CPU, else the model's, the reason "
                        "in run.json engine_pieces.scheduler_choice (docs/ENGINE.md)")
    add_allow_design_files(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress, no table")
    p.set_defaults(func=cmd_run)


def cmd_run(args) -> int:
    from .pipeline import RunOptions, run_scenario
    from .progress import Progress
    from .run_setup import check_design_file
    from simulator.scenario import load_scenario

    scenario = load_scenario(args.scenario)
    check_design_file(scenario, args.design, args.allow_design_files)
    use_engine_patches(args, args.engine or scenario.engine_release)
    out = str(args.out if args.out is not None else confined(Path("out"), scenario.name,
                                                               f"{scenario.source}: name"))
    progress = None if args.quiet else Progress(scenario.name)
    try:
        res = run_scenario(scenario, out, RunOptions(
            design=args.design, backends=args.backends, seed=args.seed, device=args.device,
            geometry=args.geometry, store=args.store, trace_level=args.trace_level,
            otlp_endpoint=args.otlp_endpoint, report=not args.no_report, cuda_graphs=not args.no_cuda_graphs,
            max_steps=args.max_steps, progress=progress, engine=args.engine, inject=tuple(args.inject),
            scheduler=args.scheduler, allow_design_files=True))         # checked above, where the scenario file is known
    except BaseException as exc:
        if progress is not None:
            progress.close()
        marker = getattr(exc, "partial_outputs", None)
        if marker is not None:
            exc.partial_message = _stopped_line(marker, out, getattr(exc, "partial_summary", True))  # type: ignore
        elif getattr(exc, "outputs_untouched", False):
            what = "stopped by SIGTERM" if isinstance(exc, RunStopped) else "interrupted"
            exc.partial_message = (f"{what} before the run began; nothing in {out}/ was "  # type: ignore
                                   f"touched")
        raise
    if progress is not None:
        progress.close()
    if res.incomplete is not None:
        print(f"slotscope: INCOMPLETE after {res.incomplete['steps_done']} steps ({res.incomplete['message']}): "
              "the counts cover those steps only, not a clean verdict", file=sys.stderr)
    if not args.quiet:
        _print_run(res, out)
    if res.live_export_error is not None:
        code = EXIT_FINDINGS if res.result.total_findings else EXIT_LIVE_EXPORT
        print(f"slotscope: {res.live_export_error}; the run's own outputs are complete in {out}/ "
              f"(exit {code})", file=sys.stderr)
    if res.result.total_findings:
        return EXIT_FINDINGS
    if res.live_export_error is not None:
        return EXIT_LIVE_EXPORT
    return EXIT_CUT if res.incomplete is not None else EXIT_CLEAN


def _print_run(res, out: str) -> None:
    """The run's table and what follows it on stdout: counts, the engine and its patches, the verdict's subject."""
    from .outputs import format_table

    print(format_table(res.summary))
    r = res.result
    print(f"\n{len(r.steps)} steps, {r.crossings} boundary crossings in {r.wall_s:.1f}s "
          f"({r.crossings / max(r.wall_s, 1e-9):,.0f}/s); outputs in {out}/")
    eng = res.summary.get("engine")
    if eng:
        print(f"engine: {eng['name']} {eng['version']} from {eng['path']} (which pieces ran: run.json "
              f"engine_pieces, the report, docs/ENGINE.md)")
        for pt in eng.get("patches", ()):
            print(f"engine patch: {pt['path']} (sha256 {pt['sha256'][:16]}, applied by {pt['applied_by']})")
        print(_engine_verdict_line(eng, res.result.total_findings, res.incomplete is not None))
    if (Path(out) / "report.html").exists():
        print(f"report: {Path(out) / 'report.html'}")


def _engine_verdict_line(eng: dict, findings: int, cut: bool) -> str:
    """The verdict of an engine run, naming the release (and patches) it is about, the design it replaced, and whose
    scheduler made the batches (engine_pieces.scheduler_choice)."""
    pats = eng.get("patches") or ()
    about = f"{eng['name']} {eng['version']}" + (" patched with " + ", ".join(p["path"] for p in pats) if pats else "")
    how = (f"{findings:,} finding(s)" if findings else "no findings") + (" in the steps that ran (incomplete)"
                                                                         if cut else "")
    from reports.explain import batches_clause

    replaced = eng.get("replaces_design")
    return (f"verdict: {how}, about {about}'s own code"
            + (f" (run instead of the scenario's design {replaced})" if replaced else "") + batches_clause(eng))


def _stopped_line(marker: dict, out: str, summary_written: Optional[bool] = True) -> str:
    """``summary_written``: True, False (it could not be: run.json and the report say the run did not finish) or
    None (the run stopped before it had a result: run.json says so)."""
    says = {True: "summary.json says incomplete", None: "run.json says incomplete",
            False: "summary.json could not be written: the report says the run did not finish"}[summary_written]
    return f"{marker['message']} after {marker['steps_done']} steps; partial outputs in {out}/ ({says})"


def _add_trace_commands(sub) -> None:
    """tracing's ``analyze`` and ``export``; ``analyze --report`` renders with reports/. The composition
    of the two is the application layer's: tracing imports nothing of reports/ (docs/ARCHITECTURE.md)."""
    from tracing.commands import register

    register(sub, engine_report=_write_engine_report)


def _write_engine_report(engine, output: str, sources: Sequence[str]) -> Path:
    from reports.engine_trace import write_engine_report     # when asked: --help does not pay for matplotlib

    return write_engine_report(engine, output, sources=sources)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slotscope",
        description="Reference simulator with instrumented tracing for the KV-cache write path of hybrid "
                    "sliding-window models (full pool loc, SWA pool swa_loc), across eight attention backends.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"slotscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_run(sub)
    _add_trace_commands(sub)
    for module in ("reports.commands", "slotscope.corpus_cmd", "slotscope.minimize",
                   "slotscope.bisect", "slotscope.conform", "slotscope.fuzz", "slotscope.sweep",
                   "slotscope.scenario_cmd"):
        try:
            mod = __import__(module, fromlist=["register"])
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue
        mod.register(sub)
    return parser


#: the commands whose positional arguments are run directories to read (attribute -> one or a list)
RUN_DIR_ARGS = {"report": "run_dir", "compare": "run_dirs", "minimize": "run_dir"}
#: path options that an empty string would silently turn into a default or the current directory
PATH_OPTIONS = {"out": "--out", "output": "-o/--output", "run": "--run", "corpus": "--corpus"}


def check_paths(args) -> None:
    """The checks every command shares: no empty path option, and a run directory argument that is one (a
    file given there is named as a file). UsageError (exit 2) otherwise."""
    for attr, flag in PATH_OPTIONS.items():
        if getattr(args, attr, None) == "":
            raise UsageError(f"{flag}: must not be empty (give a path)")
    attr = RUN_DIR_ARGS.get(args.command)
    if attr is not None:
        value = getattr(args, attr, None)
        for d in value if isinstance(value, list) else [value]:
            problem = run_dir_problem(d)
            if problem is not None:
                raise UsageError(problem)


def _stacks_on_sigusr1() -> None:
    """kill -USR1 PID prints every thread's Python stack on the process's stderr (a command that seems stuck; the
    epilog). Not where stderr is no file (a test capturing it)."""
    try:
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    except (AttributeError, ValueError, OSError, RuntimeError, io.UnsupportedOperation):
        pass


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    _stacks_on_sigusr1()
    try:
        with stop_on_signals():   # SIGTERM like ^C: every command stops cleanly (a run keeps partial outputs)
            check_paths(args)
            return int(args.func(args))
    except (ScenarioError, DesignError, UsageError, EngineError) as e:
        print(f"slotscope: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OutputError as e:      # a full disk, a file size limit: one line, the partial outputs marked
        print(f"slotscope: error: {getattr(e, 'partial_message', str(e))} (exit 3)", file=sys.stderr)
        return EXIT_CRASH
    except ReleaseBroke as e:     # the release broke an invariant of its own: one line, the partial outputs marked
        print(f"slotscope: error: {getattr(e, 'partial_message', str(e))} (exit 3)", file=sys.stderr)
        return EXIT_CRASH
    except RunStopped as e:
        print(f"slotscope: {getattr(e, 'partial_message', 'terminated (' + str(e) + ')')}", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt as e:
        print(f"slotscope: {getattr(e, 'partial_message', 'interrupted')}", file=sys.stderr)
        return EXIT_SIGINT
    except SystemExit as e:  # raised inside the run (a design calling sys.exit): a failure, never a verdict
        print(f"slotscope: error: SystemExit({e.code!r}) raised inside the command; "
              + getattr(e, "partial_message", "no outputs were written") + " (exit 3)", file=sys.stderr)
        return EXIT_CRASH
    except Exception as e:  # a crash (a user design that raises, a bug): say so, keep the traceback
        import traceback

        traceback.print_exc()
        print("slotscope: error: the run failed (exit 3); "
              + getattr(e, "partial_message", "partial outputs, if any, are in the output directory"),
              file=sys.stderr)
        return EXIT_CRASH


if __name__ == "__main__":
    raise SystemExit(main())
