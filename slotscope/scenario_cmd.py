"""``slotscope scenario from-log FILE`` / ``from-trace FILE``: a scenario that replays an engine's traffic.

One explicit ``[[workload.request]]`` per finished request of the records (SGLang's request log, or its
request traces), in arrival order: ``arrival_step`` from the arrival time at a step rate derived from the
records (or ``--step-ms``), ``prompt_len`` / ``output_len`` from ``prompt_tokens`` / ``completion_tokens``,
and the request's ``cached_tokens`` as a shared prefix (``prefix_group`` / ``prefix_len``: one group for
the common cached prefix, one per ``extra_key`` where the records carry SGLang's cache namespace). Requests
of one conversation (the logged request's ``conversation_id``, ``session_id`` or ``session_params`` id)
become its turns, in arrival order, where each prompt holds the whole previous turn. Model, pool and
engine come from ``--base SCENARIO`` or the flags, so the same traffic replays under any preset, pool size
or design; with any shared prefix or later turn the replay turns the radix cache on
(``engine.radix_cache = true``; ``--no-radix-cache`` keeps the base's setting), so the prefixes share
(docs/REPLAY.md).

Exit codes: 0 written, 2 bad input (a file, a line, a flag, or no request with the numbers needed).
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

from simulator.scenario.models import PRESETS
from simulator.scenario import RequestSpec, ScenarioError, load_scenario, parse_scenario, scenario_data

from .rundir import UsageError, describe, write_atomic

DEFAULT_STEP_MS = 10.0
CACHED_GROUP = "cached"
_LIST = 20                      # requests listed by name on stderr (the rest counted)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "scenario", help="make scenarios from an engine's records (SGLang request logs, request traces)",
        description="Write a validated scenario TOML that replays the requests an engine recorded.")
    sub = p.add_subparsers(dest="scenario_command", metavar="SUBCOMMAND")
    for name, what in (("from-log", "SGLang request log(s): --log-requests, json or text format"),
                       ("from-trace", "SGLang request traces: OTLP JSON (Collector file exporter or any form "
                                      "`slotscope analyze` reads)")):
        s = sub.add_parser(
            name, help=f"a scenario from {what}",
            description=f"A scenario from {what}: one request per finished request, in arrival order; model, "
                        "pool and engine from --base or the flags. The cached tokens become a shared prefix "
                        "(prefix_group 'cached'), a conversation's requests its turns; either turns the radix cache "
                        "on (engine.radix_cache = true) unless --no-radix-cache.",
            epilog="--window FROM..TO: request indices (0-based, in arrival order, TO excluded) when both are "
                   "integers below 10^9; otherwise times: Unix seconds (e.g. 1780000000.5) or ISO 8601 "
                   "(2026-05-28T20:26:40, local time unless it has an offset), TO excluded; either side may be "
                   "left out (..500, 2026-05-28T20:00..). --limit N then keeps the first N.\n"
                   "examples:\n"
                   "  slotscope scenario from-log server.log --base scenarios/smoke.toml -o replay.toml\n"
                   "  slotscope scenario from-trace traces.jsonl --preset gpt-oss-20b --full-size 65536 -o r.toml\n"
                   "exit codes: 0 written, 2 bad input",
            formatter_class=argparse.RawDescriptionHelpFormatter)
        s.add_argument("files", nargs="+", metavar="FILE", help="record file(s); .gz is read transparently")
        s.add_argument("-o", "--output", metavar="OUT.toml", help="where to write (default, or -: stdout)")
        s.add_argument("--base", metavar="SCENARIO",
                       help="scenario whose model, pool, engine, design, backends and seed the replay takes")
        s.add_argument("--preset", choices=sorted(PRESETS), help="model preset (instead of, or over, the base's)")
        s.add_argument("--num-layers", type=int, metavar="N", help="keep the first N layers of the model")
        s.add_argument("--full-size", type=int, metavar="SLOTS", help="pool.full_size")
        s.add_argument("--page-size", type=int, metavar="N", help="pool.page_size")
        s.add_argument("--swa-ratio", type=float, metavar="R", help="pool.swa_ratio")
        s.add_argument("--design", help="design to write into the scenario")
        s.add_argument("--backends", help="comma-separated backends to write into the scenario")
        s.add_argument("--name", help="scenario name (default: replay-<first file's stem>)")
        s.add_argument("--step-ms", type=float, metavar="MS",
                       help="milliseconds per simulator step (default: derived from the records: the median "
                            "time between batches of a trace, or the median e2e_latency / completion_tokens)")
        s.add_argument("--limit", type=int, metavar="N", help="keep the first N requests (after --window)")
        s.add_argument("--window", metavar="FROM..TO", help="a cut of the records (see below)")
        s.add_argument("--no-radix-cache", action="store_true",
                       help="keep the base's engine.radix_cache (default: on when the replay shares anything)")
        s.add_argument("--skip-bad", action="store_true", help="skip malformed lines (counted) instead of failing")
        s.add_argument("--max-line-mb", type=int, default=64, metavar="MB", help="longest line read (default 64)")
        s.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")
        s.set_defaults(func=cmd_from_records, source=name)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


# -- the base scenario -----------------------------------------------------------------------------
def base_data(args) -> dict[str, Any]:
    """The scenario data (as scenario_data gives it) the replay starts from, flags applied."""
    if args.base:
        data = scenario_data(load_scenario(args.base), defaults=False)
    elif args.preset and args.full_size:
        data = {"model": {"preset": args.preset}, "pool": {"full_size": args.full_size}}
    else:
        raise UsageError("give a base scenario (--base SCENARIO) or at least --preset and --full-size")
    if args.preset and args.base:
        data["model"] = {"preset": args.preset}
    if args.num_layers is not None:
        data["model"]["num_layers"] = args.num_layers
    for key, flag in (("full_size", "full_size"), ("page_size", "page_size"), ("swa_ratio", "swa_ratio")):
        value = getattr(args, flag)
        if value is not None:
            data.setdefault("pool", {})[key] = value
    if args.design:
        data["design"] = args.design
    if args.backends:
        data["backends"] = [b.strip() for b in args.backends.split(",") if b.strip()]
    data.pop("max_steps", None)
    return data


# -- windows ----------------------------------------------------------------------------------------
def parse_window(text: str) -> tuple[str, Optional[float], Optional[float]]:
    """('index', lo, hi) or ('time', lo, hi) in Unix seconds; hi excluded; None: open."""
    if ".." not in text:
        raise UsageError(f"--window {text!r}: give FROM..TO (either side may be empty)")
    lo_s, hi_s = text.split("..", 1)
    lo_s, hi_s = lo_s.strip(), hi_s.strip()

    def as_int(s: str) -> Optional[int]:
        try:
            v = int(s)
        except ValueError:
            return None
        return v if 0 <= v < 10**9 else None

    if all(s == "" or as_int(s) is not None for s in (lo_s, hi_s)) and (lo_s or hi_s):
        return "index", (as_int(lo_s) if lo_s else None), (as_int(hi_s) if hi_s else None)

    def as_time(s: str) -> Optional[float]:
        if not s:
            return None
        try:
            v = float(s)
            if math.isfinite(v):
                return v
        except ValueError:
            pass
        from datetime import datetime

        try:
            return datetime.fromisoformat(s).timestamp()
        except ValueError:
            raise UsageError(f"--window {text!r}: {s!r} is neither a request index, Unix seconds nor an ISO "
                             f"8601 time") from None

    lo, hi = as_time(lo_s), as_time(hi_s)
    if lo is None and hi is None:
        raise UsageError(f"--window {text!r}: give at least one side")
    return "time", lo, hi


# -- the replay ------------------------------------------------------------------------------------
def derive_step_s(requests, batch_ts=None) -> tuple[float, str]:
    """Seconds per simulator step from the records, and how it was derived."""
    if batch_ts is not None and len(batch_ts) >= 3:
        gaps = [b - a for a, b in zip(batch_ts, batch_ts[1:]) if b > a]
        if gaps:
            return statistics.median(gaps) / 1e9, f"median time between the trace's {len(batch_ts)} batches"
    per = [r.e2e_latency / r.completion_tokens for r in requests
           if r.e2e_latency and r.e2e_latency > 0 and r.completion_tokens and r.completion_tokens > 0]
    if per:
        return statistics.median(per), f"median e2e_latency / completion_tokens of {len(per)} requests"
    return DEFAULT_STEP_MS / 1e3, f"no latencies in the records: the default {DEFAULT_STEP_MS:g} ms"


def build_replay(requests, base: dict[str, Any], *, step_s: float, name: str, description: str,
                 window=None, limit: Optional[int] = None, radix: bool = True):
    """(Scenario, report): the usable requests, windowed, limited and fitted to the pool, as a scenario."""
    usable_reqs, lacking, oversize = _select(requests, int(base["pool"]["full_size"]), window, limit)
    t0 = usable_reqs[0].arrival
    specs, groups, turns = _request_specs(usable_reqs, t0, step_s)
    data = dict(base)
    sharing = bool(groups) or turns.later > 0
    if sharing and radix:
        data["engine"] = {**data.get("engine", {}), "radix_cache": True}
    data["name"] = name
    data["description"] = description
    data["workload"] = {"request": [_request_table(s) for s in specs]}
    from simulator.scenario.toml_write import dumps

    draft = parse_scenario(dumps(data), f"<replay {name}>")
    text = draft.to_toml(defaults=False)
    sc = parse_scenario(text, f"<replay {name}>")
    if sc != draft:                                   # to_toml and parse_scenario agree on the replay
        raise AssertionError("the replayed scenario does not read back equal")
    report = {"read": len(requests), "lacking": lacking, "oversize": oversize, "replayed": len(specs),
              "steps": specs[-1].arrival_step + 1, "groups": groups, "t0": t0,
              "conversations": turns.conversations, "later_turns": turns.later, "restarts": turns.restarts,
              "radix_cache": bool(sc.engine.radix_cache),
              "span_s": usable_reqs[-1].arrival - t0,
              "arrival_from": _tally(r.arrival_from for r in usable_reqs)}
    return sc, text, report


def _select(requests, full: int, window, limit: Optional[int]) -> tuple[list, list, list]:
    """(the requests to replay in arrival order, those lacking numbers with what they lack, those longer than
    the pool of ``full`` slots); a UsageError saying why when none is left."""
    usable, lacking = [], []
    for r in requests:
        missing = r.lacking()
        (lacking if missing else usable).append((r, missing))
    usable_reqs = sorted((r for r, _ in usable), key=lambda r: r.arrival)      # stable: file order on ties
    if window is not None:
        kind, lo, hi = window
        if kind == "index":
            usable_reqs = usable_reqs[(lo or 0):(hi if hi is not None else None)]
        else:
            usable_reqs = [r for r in usable_reqs if (lo is None or r.arrival >= lo) and (hi is None or r.arrival < hi)]
    if limit is not None:
        usable_reqs = usable_reqs[:limit]
    oversize = [r for r in usable_reqs if r.prompt_tokens + r.completion_tokens > full]
    if oversize:
        usable_reqs = [r for r in usable_reqs if r.prompt_tokens + r.completion_tokens <= full]
    if not usable_reqs:
        raise UsageError("no request to replay: " + (
            f"{len(lacking)} lack the numbers needed, " if lacking else "") + (
            f"{len(oversize)} do not fit the pool ({full} slots), " if oversize else "") +
            f"{len(requests)} finished requests read (after --window / --limit: none left)")
    return usable_reqs, lacking, oversize


def _request_specs(usable_reqs, t0: float, step_s: float) -> tuple[list[RequestSpec], dict[str, int], "_Turns"]:
    """One RequestSpec per request (its step from its arrival, its cached prefix as a group, its turn), the
    prefix groups' sizes, and the conversations placed."""
    specs = []
    groups: dict[str, int] = {}
    turns = _Turns()
    for i, r in enumerate(usable_reqs):
        step = int(round((r.arrival - t0) / step_s)) if step_s > 0 else 0
        conv, turn = turns.place(r)
        cached = min(r.cached_tokens or 0, r.prompt_tokens)
        group = None
        if cached > 0 and turn <= 1:          # a later turn inherits turn 1's prefix; its history is shared
            group = CACHED_GROUP if not r.extra_key else f"{CACHED_GROUP}/{r.extra_key[:100]}"
            groups[group] = groups.get(group, 0) + 1
        specs.append(RequestSpec(arrival_step=max(0, min(step, 2**31 - 1)), prompt_len=r.prompt_tokens,
                                 output_len=r.completion_tokens, prefix_group=group,
                                 prefix_len=cached if group else 0, conversation=conv, turn=turn, uid=i))
    return specs, groups, turns


class _Turns:
    """Requests of one recorded conversation as its turns, in arrival order. A request whose prompt does not
    hold the whole previous turn (prompt + output) starts the conversation anew (``ID#2``, ...): the scenario's
    turns share every earlier position, which only such prompts do."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[str, int, int]] = {}      # recorded id -> (scenario id, turn, total length)
        self.segments: dict[str, int] = {}
        self.conversations = self.later = self.restarts = 0

    def place(self, r) -> tuple[Optional[str], int]:
        cid = getattr(r, "conversation", None)
        if not cid:
            return None, 0
        prev = self.last.get(cid)
        if prev is not None and r.prompt_tokens > prev[2]:
            name, turn = prev[0], prev[1] + 1
            self.later += 1
        else:
            seg = self.segments[cid] = self.segments.get(cid, 0) + 1
            name, turn = (cid[:100] if seg == 1 else f"{cid[:100]}#{seg}"), 1
            self.conversations += 1
            self.restarts += prev is not None
        self.last[cid] = (name, turn, r.prompt_tokens + r.completion_tokens)
        return name, turn


def _request_table(s: RequestSpec) -> dict[str, Any]:
    d: dict[str, Any] = {"arrival_step": s.arrival_step, "prompt_len": s.prompt_len, "output_len": s.output_len}
    if s.prefix_group is not None:
        d["prefix_group"], d["prefix_len"] = s.prefix_group, s.prefix_len
    if s.conversation is not None:
        d["conversation"], d["turn"] = s.conversation, s.turn
    return d


def _tally(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def cmd_from_records(args) -> int:
    def log(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr)

    window, out = _checked_args(args)
    base = base_data(args)
    t_read = time.perf_counter()
    requests, stats, batch_ts = _read_records(args)
    read_s = time.perf_counter() - t_read
    if args.step_ms is not None:
        step_s, how = args.step_ms / 1e3, "--step-ms"
    else:
        step_s, how = derive_step_s(requests, batch_ts)
    name = args.name or f"replay-{Path(args.files[0]).name.split('.')[0]}"
    description = (f"Replay of {', '.join(Path(f).name for f in args.files)[:300]} ({args.source}): one request "
                   f"per finished request in arrival order, {step_s * 1e3:.3g} ms per step ({how}). Cached "
                   f"tokens are the shared prefix group '{CACHED_GROUP}', a conversation's requests its turns; "
                   f"with either the radix cache is on (unless --no-radix-cache).")
    try:
        sc, text, rep = build_replay(requests, base, step_s=step_s, name=name, description=description,
                                     window=window, limit=args.limit, radix=not args.no_radix_cache)
    except ScenarioError as exc:
        raise UsageError(f"the replayed scenario is not valid: {exc}") from None
    if out is None:
        sys.stdout.write(text)
    else:
        try:
            write_atomic(out, text)       # a fresh temporary file, renamed: a link at OUT is replaced, not followed
        except OSError as e:
            raise UsageError(f"-o {out}: cannot write the scenario ({e.strerror or e})") from None
    _log_reading(log, stats, read_s)
    _log_replay(log, stats, rep, base, out, step_s, how)
    return 0


def _checked_args(args) -> tuple[Optional[tuple], Optional[Path]]:
    """The flags checked before anything is read: (the --window cut, the output file or None for stdout)."""
    for f in args.files:
        if not Path(f).is_file():
            what = describe(Path(f))
            raise UsageError(f"{f}: no such file" if what == "nothing" else f"{f}: is {what}, not a record file")
    if args.step_ms is not None and not (math.isfinite(args.step_ms) and args.step_ms > 0):
        raise UsageError(f"--step-ms must be a positive number, got {args.step_ms}")
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be >= 1, got {args.limit}")
    if not 1 <= args.max_line_mb <= 1 << 20:
        raise UsageError(f"--max-line-mb must be between 1 and {1 << 20}, got {args.max_line_mb}")
    window = parse_window(args.window) if args.window else None
    out = Path(args.output) if args.output and args.output != "-" else None
    if out is not None and out.is_dir():
        raise UsageError(f"-o {out}: is a directory; give the file to write")
    if out is not None and not out.parent.is_dir():
        what = describe(out.parent)
        raise UsageError(f"-o {out}: its directory {out.parent} " + ("does not exist" if what == "nothing" else
                                                                       f"is {what}, not a directory"))
    return window, out


def _read_records(args):
    """(requests, read stats, the trace's batch times or None) of the files, a request log or traces."""
    from tracing.otlp_read import TraceFormatError
    from tracing.sglang_records import read_engine_trace, read_request_log

    try:
        if args.source == "from-log":
            requests, stats = read_request_log(args.files, skip_bad=args.skip_bad,
                                               max_line_bytes=args.max_line_mb * 2**20)
            return requests, stats, None
        et = read_engine_trace(args.files, skip_bad=args.skip_bad, max_line_bytes=args.max_line_mb * 2**20)
        return et.requests, et.stats, et.batch_ts
    except TraceFormatError as exc:
        raise UsageError(str(exc)) from None


def _log_reading(log, stats, read_s: float) -> None:
    """What the reading found and skipped."""
    ev = ", ".join(f"{n} {k}" for k, n in stats.events.items()) or "no request records"
    log(f"read {stats.lines} lines of {len(stats.files)} file(s) in {read_s:.2f}s: {ev}")
    if stats.unknown:
        log(f"  skipped unknown events/spans: " + ", ".join(f"{k} x{n}" for k, n in sorted(
            stats.unknown.items(), key=lambda kv: -kv[1])[:10]))
    if stats.other_lines:
        log(f"  skipped {stats.other_lines} other log lines (no request record)")
    if stats.bad_lines:
        for b in stats.bad:
            log(f"  skipped {b['file']}:{b['line']}: {b['reason']}")
        log(f"  {stats.bad_lines} bad line(s) skipped (--skip-bad)")


def _log_replay(log, stats, rep: dict, base: dict, out: Optional[Path], step_s: float, how: str) -> None:
    """Which requests were left out and why, and what was written."""
    if rep["lacking"]:
        log(f"  {len(rep['lacking'])} finished request(s) lack the numbers needed, left out:")
        for r, missing in rep["lacking"][:_LIST]:
            log(f"    {r.rid} ({r.where}): no {', '.join(missing)}")
        if len(rep["lacking"]) > _LIST:
            log(f"    ... and {len(rep['lacking']) - _LIST} more")
    if stats.cached_missing:
        log(f"  {stats.cached_missing} request(s) without cached_tokens: no shared prefix for them")
    if rep["oversize"]:
        need = max(r.prompt_tokens + r.completion_tokens for r in rep["oversize"])
        log(f"  {len(rep['oversize'])} request(s) longer than the pool ({base['pool']['full_size']} slots) left "
            f"out; --full-size {need} or more keeps them")
    groups = ", ".join(f"'{g}' x{n}" for g, n in rep["groups"].items()) or "none"
    convs = (f"; {rep['conversations']} conversations, {rep['later_turns']} later turns"
             + (f" ({rep['restarts']} restarted: a prompt without the whole previous turn)" if rep["restarts"] else "")
             if rep["conversations"] else "")
    log(f"wrote {out or 'stdout'}: {rep['replayed']} requests over {rep['steps']} steps "
        f"({rep['span_s']:.3f} s of arrivals at {step_s * 1e3:.3g} ms/step, {how}); prefix groups: {groups}{convs}; "
        f"radix cache {'on' if rep['radix_cache'] else 'off'}")
