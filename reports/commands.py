"""The ``report`` and ``compare`` subcommands, registered into the slotscope CLI.

The CLI proper lives in slotscope/; reports only contributes its subcommands, so the package can be
used and tested without the application. Rendering modules are imported when a command runs, so
``slotscope --help`` does not pay for matplotlib. Exit codes: 0 written, 2 bad input (the message
names the run directory and the file and line, or the output path). A run that did not finish is
still reported (in red, saying why); one killed before its summary is built from its streamed files.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_BAD_INPUT = 2


def register(subparsers: Any) -> None:
    """Add ``report`` and ``compare`` to an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "report", help="write the self-contained HTML report of a run directory",
        description="Render DIR (a slotscope run output: summary.json, findings.jsonl, steps.jsonl, "
                    "shapes.jsonl, run.json) into one HTML file that works offline.")
    p.add_argument("run_dir", metavar="DIR", help="run output directory")
    p.add_argument("-o", "--output", metavar="OUT", help="output file (default: DIR/report.html)")
    p.set_defaults(func=cmd_report)

    c = subparsers.add_parser(
        "compare", help="write one HTML report comparing several runs side by side",
        description="Render several run directories side by side, e.g. one scenario under two designs.")
    c.add_argument("run_dirs", nargs="+", metavar="DIR", help="run output directories (two or more)")
    c.add_argument("-o", "--output", metavar="OUT", default="compare.html",
                   help="output file (default: ./compare.html)")
    c.set_defaults(func=cmd_compare)


def _fail(message: str) -> int:
    print(f"slotscope: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _check_dir(run_dir: str) -> str | None:
    """A clear message for a directory that is not a run, before any rendering starts."""
    from .data import is_run_dir

    path = Path(run_dir)
    if not path.is_dir():
        return f"{run_dir}: no such run directory"
    if not is_run_dir(path):
        return (f"{run_dir}: not a slotscope run directory (no summary.json, run.json, steps.jsonl or "
                "findings.jsonl here)")
    return None


def _check_output(output: str | None) -> str | None:
    if output is not None and Path(output).is_dir():
        return f"-o {output}: is a directory; name the output file (e.g. {Path(output) / 'report.html'})"
    return None


def _write(build) -> int:
    """Run a report writer, say what it wrote (size, time), or fail with the run dir's problem."""
    from .data import RunDirError
    from .html import OutputError

    t0 = time.perf_counter()
    try:
        out = build()
    except RunDirError as e:
        return _fail(str(e))
    except OutputError as e:
        return _fail(str(e))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB in {time.perf_counter() - t0:.2f}s)")
    return EXIT_OK


def _say_incomplete(run_dirs) -> None:
    """One line on stderr per run that did not finish: the page says it first, so does the command."""
    from .data import RunDirError, load_run

    for d in run_dirs:
        try:
            run = load_run(d, detail_cap=0)
        except RunDirError:
            continue
        if run.incomplete is not None:
            done = "" if run.incomplete.steps_done is None else f"; {run.incomplete.steps_done:,} steps done"
            print(f"slotscope: note: {d}: {run.incomplete.message}{done}: not a clean verdict", file=sys.stderr)


def cmd_report(args: argparse.Namespace) -> int:
    problem = _check_dir(args.run_dir) or _check_output(args.output)
    if problem:
        return _fail(problem)
    from .html import write_report

    rc = _write(lambda: write_report(args.run_dir, args.output))
    if rc == EXIT_OK:
        _say_incomplete([args.run_dir])
    return rc


def cmd_compare(args: argparse.Namespace) -> int:
    if len(args.run_dirs) < 2:
        return _fail("compare needs at least two run directories")
    for d in args.run_dirs:
        problem = _check_dir(d)
        if problem:
            return _fail(problem)
    problem = _check_output(args.output)
    if problem:
        return _fail(problem)
    from .html import write_comparison

    rc = _write(lambda: write_comparison(args.run_dirs, args.output))
    if rc == EXIT_OK:
        _say_incomplete(args.run_dirs)
    return rc
