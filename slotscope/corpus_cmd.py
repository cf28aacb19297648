"""``slotscope bugs``: run the known-bug corpus (slotscope/corpus.py), print its table, write its page (slotscope/corpus_report.py)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from .corpus import (CORPUS, CORPUS_VLLM, EXIT_BAD_INPUT, EXIT_FAILS, EXIT_HOLDS, Outcome, format_corpus_table,
                     load_corpus, run_corpus)
from .corpus_report import write_corpus_report


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bugs", help="run the known-bug corpus: every buggy design reproduces, every fix is clean",
        description="Run every case of the known-bug corpus (scenarios/corpus.toml: SGLang's B1-B4, the post-"
                    "#29460 gap, B2 under the other engines' padding conventions, paged pools, and the 2026 "
                    "bugs W1, W2, W5, W7, R2, R3, R7, R8, A1, A2, P7, U1, U2) under the design "
                    "that had the bug and the design that fixed it, on every backend, and print bug, design, "
                    "expected and observed outcome per backend, and verdict. Exit 0 when every verdict holds. "
                    "With --engine vllm: the vLLM cases V1, V2, ... (scenarios/corpus-vllm.toml), each on a vLLM "
                    "release with the bug (or its fix reverted by a shipped patch) and on the release with the fix "
                    "(a bug live in the release: as released, and with a fix patch of slotscope's).",
        epilog="exit codes: 0 every verdict holds, 1 some verdict fails, 2 bad input\n"
               "cells: the finding class seen (oor = out_of_range, len_mism = length_mismatch, ...), +k when k "
               "other classes were seen too, ' !' where the expectation does not hold. docs/CORPUS.md explains "
               "each case.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", help="corpus file (default: scenarios/corpus.toml; with --engine vllm "
                                    "scenarios/corpus-vllm.toml)")
    p.add_argument("--only", help="comma-separated case ids to run (e.g. B1,B3)")
    p.add_argument("--report", nargs="?", const="", metavar="OUT",
                   help="write the corpus as one self-contained HTML report (default: out/corpus/report.html)")
    p.add_argument("--out", metavar="DIR", help="also write each run's outputs to DIR/<case>-<buggy|fixed>/")
    p.add_argument("--device", default="cpu", choices=("auto", "cpu", "cuda"),
                   help="pool under test (default cpu); with --engine vllm where vLLM's cases run (cuda: its worker "
                        "kernels native); --engine sglang picks per case (a case of the release's scheduler on the "
                        "CPU)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--engine", choices=("sglang", "vllm"), metavar="{sglang,vllm}",
                   help="run every case as release code where it can be: its buggy run on a release that had the "
                        "bug (or today's with its fix reverted by a shipped engine patch), its fixed run on the "
                        "release with the fix; the table says per case real or model-only, and why "
                        "(slotscope/corpus_engine.py, docs/CORPUS.md). vllm: the vLLM cases (V1, V2, ...), "
                        "which have no model design and run only so")
    p.add_argument("--json", metavar="FILE", help="with --engine: write the verdicts as a JSON list of {case, pr, real, "
                                                   "buggy, fixed, holds, why, mechanism, missing}")
    p.set_defaults(func=cmd_bugs)


def cmd_bugs(args) -> int:
    args.corpus = args.corpus or str(CORPUS_VLLM if args.engine == "vllm" else CORPUS)
    cases = load_corpus(args.corpus)
    if args.only:
        wanted = [x.strip() for x in args.only.split(",") if x.strip()]
        ids = {c.id for c in cases}
        missing = [w for w in wanted if w not in ids]
        if missing:
            print(f"slotscope: error: --only: no case {missing[0]!r} (cases: {', '.join(c.id for c in cases)})",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
        cases = [c for c in cases if c.id in wanted]

    def progress(o: Outcome) -> None:
        if not args.quiet:
            print(f"bugs: {o.case.id:<10} {o.design:<28} {'holds' if o.holds else 'FAILS'}  ({o.wall_s:.1f}s)",
                  file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    out_dir = Path(args.out) if args.out else None
    if args.engine:
        return _bugs_engine(args, cases, out_dir, t0)
    if args.json:
        print("slotscope: error: --json goes with --engine", file=sys.stderr)
        return EXIT_BAD_INPUT
    only = [c for c in cases if c.engine_only]
    if only:
        from .corpus_engine import engine_of

        print(f"slotscope: error: {args.corpus}: case {only[0].id} has no model design (it runs as release code "
              f"only): run it with --engine {engine_of(only[0], args.corpus).engine}", file=sys.stderr)
        return EXIT_BAD_INPUT
    outcomes = run_corpus(cases, out_dir=out_dir, progress=progress, device=args.device)
    print(format_corpus_table(outcomes))
    held = sum(o.holds for o in outcomes)
    print(f"\n{held} of {len(outcomes)} verdicts hold ({len(cases)} cases x buggy/fixed, "
          f"{len(outcomes[0].backends) if outcomes else 0} backends) in {time.perf_counter() - t0:.1f}s")
    if args.report is not None:
        path = Path(args.report) if args.report else Path("out") / "corpus" / "report.html"
        write_corpus_report(outcomes, path)
        print(f"report: {path}")
    return EXIT_HOLDS if held == len(outcomes) else EXIT_FAILS


def _vllm_device(asked: str) -> str:
    """Where vLLM's cases run: the CPU (their verdicts there) unless --device asks for CUDA (or auto finds it)."""
    if asked == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return asked


def _bugs_engine(args, cases, out_dir, t0: float) -> int:
    """``bugs --engine sglang``: every case as release code where it can be (slotscope/corpus_engine.py)."""
    from simulator.scenario import BACKENDS

    from .corpus_engine import engine_of, format_differences, format_engine_table, run_engine_corpus, write_json

    for c in cases:
        eng = engine_of(c, args.corpus)    # bad engine entries: exit 2 before any run
        if not isinstance(eng, str) and eng.engine != args.engine:
            print(f"slotscope: error: {args.corpus}: case {c.id} runs on {eng.engine}, not {args.engine} "
                  f"(--engine {eng.engine})", file=sys.stderr)
            return EXIT_BAD_INPUT

    def progress(v) -> None:
        if not args.quiet:
            print(f"bugs --engine: {v.case.id:<10} {'real' if v.real else 'model':<6} "
                  f"{'holds' if v.holds else '-' if v.engine is None else 'FAILS'}", file=sys.stderr, flush=True)

    verdicts = run_engine_corpus(cases, out_dir, BACKENDS, progress, vllm_device=_vllm_device(args.device))
    print(format_engine_table(verdicts))
    differs = format_differences(verdicts)
    if differs:
        print("\n" + differs)
    real = sum(v.real for v in verdicts)
    ran = [v for v in verdicts if v.engine is not None]
    held = sum(v.holds for v in ran)
    print(f"\n{real} of {len(verdicts)} cases real; {held} of {len(ran)} engine verdicts hold "
          f"({time.perf_counter() - t0:.0f} s)")
    if args.json:
        write_json(verdicts, Path(args.json))
        print(f"json: {args.json}")
    return EXIT_HOLDS if held == len(ran) else EXIT_FAILS
