"""The ``analyze`` and ``export`` subcommands, registered into the slotscope CLI.

The CLI proper lives in slotscope/ (the application layer); tracing only contributes its two
subcommands here, so the tracing package can be tested and used without the application.
Exit codes: 0 ok, 2 bad input (the message names the file and the line).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .analyze import analyze_files
from .chrome import default_output, export_chrome
from .otlp_read import TraceFormatError

EXIT_OK = 0
EXIT_BAD_INPUT = 2


def register(subparsers: Any) -> None:
    """Add ``analyze`` and ``export`` to an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "analyze", help="tables of loc/swa_loc divergence and findings from OTLP JSON traces",
        description="Read OTLP JSON trace files (JSON lines or one document, from slotscope or "
                    "any other producer) and print divergence tables for slotscope runs and a "
                    "span summary for other traces.")
    p.add_argument("files", nargs="+", metavar="FILE", help="OTLP JSON file(s)")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip malformed lines and count them instead of failing")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_analyze)

    e = subparsers.add_parser(
        "export", help="convert a run's trace.otlp.jsonl to another format",
        description="Convert DIR/trace.otlp.jsonl (or an OTLP JSON FILE) for other viewers.")
    e.add_argument("source", metavar="DIR_OR_FILE", help="run output directory or OTLP JSON file")
    e.add_argument("--chrome", action="store_true",
                   help="Chrome/Perfetto JSON trace (pid = backend, tid = layer)")
    e.add_argument("-o", "--output", metavar="OUT",
                   help="output file (default: DIR/trace.chrome.json)")
    e.set_defaults(func=cmd_export)


def _fail(message: str) -> int:
    print(f"slotscope: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def cmd_analyze(args: argparse.Namespace) -> int:
    try:
        result = analyze_files(args.files, skip_bad=args.skip_bad)
    except TraceFormatError as exc:
        return _fail(str(exc))
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(result.render_text())
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    if not args.chrome:
        return _fail("export needs a format: --chrome")
    src, out = default_output(args.source)
    if args.output:
        from pathlib import Path
        out = Path(args.output)
    if not src.is_file():
        return _fail(f"{src}: no such trace file")
    try:
        figures = export_chrome(src, out)
    except TraceFormatError as exc:
        return _fail(str(exc))
    print(f"wrote {out} ({figures['spans']} spans, {figures['events']} events)")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m tracing.commands``) until the slotscope CLI exists."""
    parser = argparse.ArgumentParser(prog="slotscope")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
