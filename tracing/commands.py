"""The ``analyze`` and ``export`` subcommands, registered into the slotscope CLI.

The CLI proper lives in slotscope/ (the application layer); tracing only contributes its two
subcommands here, so the tracing package can be tested and used without the application. Tracing
renders no HTML: ``analyze --report`` exists when the caller passes ``engine_report`` (slotscope's CLI
passes reports/engine_trace.py's writer), so tracing imports nothing of reports/ or slotscope/.
Exit codes: 0 ok, 2 bad input (the message names the file and the line, or what is missing).
Input is read with bounded memory: a line (JSON lines) or a document (pretty-printed) longer than
``--max-line-mb`` is reported by its line number, never read whole.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .analyze import analyze_files
from .chrome import default_output, export_chrome
from .otlp_read import MAX_LINE_BYTES, TraceFormatError, missing_trace

EXIT_OK = 0
EXIT_BAD_INPUT = 2


#: writes the HTML report of an engine trace analysis: (analysis, OUT.html, source files) -> the path written
EngineReport = Callable[[Any, str, Sequence[str]], Any]


def register(subparsers: Any, engine_report: Optional[EngineReport] = None) -> None:
    """Add ``analyze`` and ``export`` to an ``argparse`` subparsers object; ``analyze --report`` only with
    ``engine_report`` (the renderer lives in reports/, composed by the application layer)."""
    p = subparsers.add_parser(
        "analyze", help="tables of loc/swa_loc divergence and findings from OTLP JSON traces",
        description="Read OTLP JSON trace files (JSON lines or one document, from slotscope or "
                    "any other producer) and print divergence tables for slotscope runs and a "
                    "span summary for other traces.")
    p.add_argument("files", nargs="+", metavar="FILE", help="OTLP JSON file(s)")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip malformed lines and count them instead of failing")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    if engine_report is not None:
        p.add_argument("--report", metavar="OUT.html",
                       help="engine traces (SGLang's request spans): write an HTML report (stage latencies, batch "
                            "size and token timelines; with --run, the engine's batches beside the simulator's "
                            "steps)")
    p.add_argument("--run", metavar="DIR", help="a slotscope run of the replayed scenario to set beside the engine's "
                                                "batches (docs/REPLAY.md)")
    _add_max_line(p)
    p.set_defaults(func=cmd_analyze, engine_report=engine_report)

    e = subparsers.add_parser(
        "export", help="convert a run's trace.otlp.jsonl to another format",
        description="Convert DIR/trace.otlp.jsonl (or an OTLP JSON FILE) for other viewers.")
    e.add_argument("source", metavar="DIR_OR_FILE", help="run output directory or OTLP JSON file")
    e.add_argument("--chrome", action="store_true",
                   help="Chrome/Perfetto JSON trace (pid = backend, tid = layer)")
    e.add_argument("-o", "--output", metavar="OUT",
                   help="output file (default: DIR/trace.chrome.json)")
    e.add_argument("--skip-bad", action="store_true",
                   help="leave malformed lines out (counted) instead of failing")
    _add_max_line(e)
    e.set_defaults(func=cmd_export)


def _add_max_line(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-line-mb", type=_positive_mb, default=MAX_LINE_BYTES // 2**20, metavar="MB",
                   help=f"longest line (or pretty-printed document) read, in MiB; longer ones are bad lines "
                        f"(default {MAX_LINE_BYTES // 2**20})")


def _positive_mb(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of MiB, got {text!r}") from None
    if not 1 <= value <= 1 << 20:
        raise argparse.ArgumentTypeError(f"must be between 1 and {1 << 20} MiB, got {value}")
    return value


def _fail(message: str) -> int:
    print(f"slotscope: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def cmd_analyze(args: argparse.Namespace) -> int:
    try:
        result = analyze_files(args.files, skip_bad=args.skip_bad, max_line_bytes=args.max_line_mb * 2**20)
    except TraceFormatError as exc:
        return _fail(str(exc))
    from .engine_analysis import engine_part

    try:
        engine = engine_part(args, result)        # SGLang's request spans: stage table, --report, --run
    except (TraceFormatError, OSError) as exc:
        return _fail(str(exc))
    if args.json:
        doc = result.to_json()
        if engine is not None:
            doc["engine"] = engine.to_json()
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        for r in result.slotscope_runs:            # the text output has them inline
            for w in r.get("warnings", ()):
                print(f"slotscope: warning: {r['run'][:200]}: {w}", file=sys.stderr)
    else:
        sys.stdout.write(result.render_text())
        if engine is not None:
            sys.stdout.write(engine.render_text())
    report = getattr(args, "report", None)
    if engine is not None and report:
        print(f"engine trace report: {args.engine_report(engine, report, args.files)}", file=sys.stderr)
    if result.bad_lines:
        print(f"slotscope: warning: {result.bad_lines} bad line(s) skipped (--skip-bad)", file=sys.stderr)
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    if not args.chrome:
        return _fail("export needs a format: --chrome")
    source = Path(args.source)
    if not source.exists():
        return _fail(f"{source}: no such run directory or trace file")
    src, out = default_output(source)
    if args.output:
        out = Path(args.output)
    if source.is_dir() and not src.is_file():
        return _fail(f"{source}: {missing_trace(source)}")
    if not src.is_file():
        return _fail(f"{src}: not a trace file")
    if out.is_dir():
        return _fail(f"-o {out}: is a directory; give the file to write (e.g. {out / 'trace.chrome.json'})")
    try:
        figures = export_chrome(src, out, skip_bad=args.skip_bad, max_line_bytes=args.max_line_mb * 2**20)
    except TraceFormatError as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"{out}: cannot write: {exc.strerror or exc}")
    print(f"wrote {out} ({figures['spans']} spans, {figures['events']} events)")
    if figures["bad_lines"]:
        for line, reason in figures["bad"]:
            print(f"slotscope: warning: skipped {src}:{line}: {reason}", file=sys.stderr)
        print(f"slotscope: warning: {figures['bad_lines']} bad line(s) of {src} left out (--skip-bad)",
              file=sys.stderr)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m tracing.commands``) until the slotscope CLI exists."""
    parser = argparse.ArgumentParser(prog="slotscope")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
