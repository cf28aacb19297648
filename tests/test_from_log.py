"""slotscope scenario from-log / from-trace: SGLang's records (fixtures its own logger and tracing wrote,
tests/fixtures/sglang/, scripts/make-sglang-fixtures) to a validated replay scenario, and the replay end to end."""
from __future__ import annotations

import gzip
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from simulator.scenario import load_scenario, parse_scenario
from slotscope.cli import main
from tracing.otlp_read import TraceFormatError
from tracing.sglang_records import read_engine_trace, read_request_log

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "sglang"
RELEASES = ("0.5.14", "0.5.23")
BASE = ROOT / "scenarios" / "smoke.toml"
#: the fixture workload (engine_path/sglang_drive.py WORKLOAD): rid -> (prompt, completion, cached)
EXPECTED = {f"req-{i:04d}": v for i, v in enumerate(((40, 6, 0), (52, 4, 32), (36, 8, 32), (64, 5, 0),
                                                        (44, 3, 32), (30, 7, 0)))}
ARRIVAL_MS = (0.0, 3.0, 4.0, 30.0, 31.0, 55.0)
#: the replays' prefix hits: req-0004 finds the 32 cached tokens (req-0001 and req-0002 arrive together, before
#: either is cached); with the conversation, turn 2 also finds turn 1's 46 tokens with K/V (40 + 6: the scenario's
#: output_len counts decodes, each writing one token's K/V, and a finished request inserts them all)
PLAIN_HITS, CONV_HITS = 32, 32 + 46


def _numbers(reqs):
    return {r.rid: (r.prompt_tokens, r.completion_tokens, r.cached_tokens) for r in reqs}


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("fmt", ("json", "text"))
def test_request_log_numbers_as_sglang_wrote_them(release, fmt):
    reqs, st = read_request_log([FIX / release / f"requests.{fmt}.log"])
    assert _numbers(reqs) == EXPECTED
    assert st.events == {"request.received": 6, "request.finished": 6}
    assert st.unknown == {} and st.bad_lines == 0 and st.unmatched_received == 0
    arrivals = {r.rid: round((r.arrival - 1_780_000_000.0) * 1e3, 3) for r in reqs}
    assert [arrivals[f"req-{i:04d}"] for i in range(6)] == list(ARRIVAL_MS)
    assert {r.arrival_from for r in reqs} == {"request_received_ts"}


@pytest.mark.parametrize("release", RELEASES)
def test_trace_requests_stages_and_batches(release):
    et = read_engine_trace([FIX / release / "trace.otlp.jsonl"])
    assert _numbers(et.requests) == EXPECTED
    assert et.stats.unknown == {}
    assert {"tokenize", "request_process", "prefill_waiting", "prefill_forward", "decode_loop"} <= set(et.stages)
    assert et.stages["prefill_forward"].count == 6
    modes = list(et.batch_mode)
    assert modes.count(0) == 6 and modes.count(1) == len(modes) - 6
    # a prefill batch's tokens: its requests' uncached prompt tokens; all prefill tokens add up
    assert sum(t for t, m in zip(et.batch_tokens, modes) if m == 0) == sum(p - c for p, _, c in EXPECTED.values())
    assert list(et.batch_ts) == sorted(et.batch_ts)


def test_arrival_falls_back_to_the_received_event_then_to_finish_minus_e2e(tmp_path):
    src = (FIX / "0.5.23" / "requests.json.log").read_text().splitlines()
    out = []
    for line in src:
        d = json.loads(line[line.index("{"):])
        if d["event"] == "request.finished":
            meta = d["out"]["meta_info"]
            del meta["request_received_ts"]
            if d["rid"] == "req-0003":
                pass                                   # its received event stays: arrival from it
        elif d["rid"] != "req-0003":
            continue                                   # the others: finish timestamp - e2e_latency
        out.append(line[:line.index("{")] + json.dumps(d))
    p = tmp_path / "log"
    p.write_text("\n".join(out) + "\n")
    reqs, st = read_request_log([p])
    src_of = {r.rid: r.arrival_from for r in reqs}
    assert src_of.pop("req-0003") == "received_event"
    assert set(src_of.values()) == {"finish_minus_e2e"}


@pytest.mark.parametrize("source,name", (("from-log", "requests.json.log"), ("from-log", "requests.text.log"),
                                          ("from-trace", "trace.otlp.jsonl")))
def test_from_records_writes_a_scenario_that_reads_back(tmp_path, source, name, capsys):
    out = tmp_path / "replay.toml"
    assert main(["scenario", source, str(FIX / "0.5.23" / name), "--base", str(BASE), "-o", str(out)]) == 0
    sc = load_scenario(out)
    base = load_scenario(BASE)
    # cached tokens are present: the replay turns the radix cache on, everything else is the base's
    assert not base.engine.radix_cache and sc.engine.radix_cache
    assert (sc.model, sc.pool, replace(sc.engine, radix_cache=False), sc.design, sc.backends, sc.seed) == \
           (base.model, base.pool, base.engine, base.design, base.backends, base.seed)
    reqs = sc.workload.explicit
    assert [(r.prompt_len, r.output_len) for r in reqs] == [(p, o) for p, o, _ in EXPECTED.values()]
    assert [(r.prefix_group, r.prefix_len) for r in reqs] == [("cached", c) if c else (None, 0)
                                                              for _, _, c in EXPECTED.values()]
    steps = [r.arrival_step for r in reqs]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] > steps[1]
    assert parse_scenario(sc.to_toml(), "again") == sc
    err = capsys.readouterr().err
    assert "radix cache on" in err and "6 requests" in err


def test_flags_instead_of_a_base_and_step_ms(tmp_path):
    out = tmp_path / "r.toml"
    assert main(["scenario", "from-log", str(FIX / "0.5.14" / "requests.json.log"), "--preset", "gpt-oss-20b",
                 "--full-size", "2048", "--num-layers", "4", "--step-ms", "1", "--design", "sglang-pre-29460",
                 "--backends", "flashinfer,triton", "-o", str(out), "-q"]) == 0
    sc = load_scenario(out)
    assert sc.pool.full_size == 2048 and len(sc.model.layer_kinds) == 4 and sc.design == "sglang-pre-29460"
    assert sc.backends == ("flashinfer", "triton")
    assert [r.arrival_step for r in sc.workload.explicit] == [int(round(a)) for a in ARRIVAL_MS]


@pytest.mark.parametrize("window,limit,expect", (
    ("1..4", None, ["req-0001", "req-0002", "req-0003"]),
    ("..2", None, ["req-0000", "req-0001"]),
    ("3..", 2, ["req-0003", "req-0004"]),
    ("1780000000.029..1780000000.040", None, ["req-0003", "req-0004"]),
    (None, 1, ["req-0000"]),
))
def test_window_and_limit(tmp_path, window, limit, expect):
    out = tmp_path / "r.toml"
    argv = ["scenario", "from-log", str(FIX / "0.5.23" / "requests.json.log"), "--base", str(BASE), "--step-ms", "1",
            "-o", str(out), "-q"]
    if window:
        argv += ["--window", window]
    if limit:
        argv += ["--limit", str(limit)]
    assert main(argv) == 0
    got = [(r.prompt_len, r.output_len) for r in load_scenario(out).workload.explicit]
    assert got == [EXPECTED[rid][:2] for rid in expect]
    assert load_scenario(out).workload.explicit[0].arrival_step == 0


def test_iso_window(tmp_path):
    from datetime import datetime

    lo = datetime.fromtimestamp(1_780_000_000.029).isoformat()
    out = tmp_path / "r.toml"
    assert main(["scenario", "from-log", str(FIX / "0.5.23" / "requests.text.log"), "--base", str(BASE),
                 "--window", f"{lo}..", "-o", str(out), "-q"]) == 0
    assert len(load_scenario(out).workload.explicit) == 3


# -- bad input ------------------------------------------------------------------------------------
def _lines(release="0.5.23", fmt="json"):
    return (FIX / release / f"requests.{fmt}.log").read_text().splitlines()


def test_truncated_line_is_named_by_file_and_line(tmp_path, capsys):
    lines = _lines()
    lines[4] = lines[4][: len(lines[4]) // 2]
    p = tmp_path / "cut.log"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError, match=rf"{p.name}:5: invalid JSON"):
        read_request_log([p])
    assert main(["scenario", "from-log", str(p), "--base", str(BASE), "-o", str(tmp_path / "x.toml")]) == 2
    assert f"{p}:5:" in capsys.readouterr().err
    assert not (tmp_path / "x.toml").exists()
    assert main(["scenario", "from-log", str(p), "--base", str(BASE), "--skip-bad", "-o", str(tmp_path / "x.toml")]) == 0
    err = capsys.readouterr().err
    assert f"skipped {p}:5:" in err and "1 bad line(s) skipped" in err


def test_truncated_text_finish_line(tmp_path):
    lines = _lines(fmt="text")
    i = next(i for i, l in enumerate(lines) if "Finish:" in l)
    lines[i] = lines[i][: lines[i].index(", out={") + 20]
    p = tmp_path / "cut.log"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError, match=rf":{i + 1}: a 'Finish:' line without its out="):
        read_request_log([p])
    reqs, st = read_request_log([p], skip_bad=True)
    assert len(reqs) == 5 and st.bad_lines == 1


def test_unknown_events_and_other_lines_are_skipped_and_counted(tmp_path):
    lines = _lines()
    lines.insert(0, "[2026-05-28 20:26:40] some other server message")
    lines.insert(1, json.dumps({"timestamp": "2026-05-28T20:26:40", "event": "request.received.openai", "obj": {}}))
    lines.insert(2, json.dumps({"timestamp": "2026-05-28T20:26:40", "event": "request.aborted", "rid": "x"}))
    lines.insert(3, "")
    p = tmp_path / "mixed.log"
    p.write_text("\n".join(lines) + "\n")
    reqs, st = read_request_log([p])
    assert len(reqs) == 6
    assert st.unknown == {"request.received.openai": 1, "request.aborted": 1}
    assert st.other_lines == 1


def test_requests_lacking_numbers_are_listed(tmp_path, capsys):
    lines = _lines()
    out = []
    for line in lines:
        d = json.loads(line[line.index("{"):])
        if d["event"] == "request.finished" and d["rid"] in ("req-0001", "req-0004"):
            del d["out"]["meta_info"]["completion_tokens" if d["rid"] == "req-0001" else "prompt_tokens"]
        out.append(line[:line.index("{")] + json.dumps(d))
    p = tmp_path / "lacking.log"
    p.write_text("\n".join(out) + "\n")
    o = tmp_path / "r.toml"
    assert main(["scenario", "from-log", str(p), "--base", str(BASE), "-o", str(o)]) == 0
    err = capsys.readouterr().err
    assert "2 finished request(s) lack the numbers needed" in err
    assert "req-0001" in err and "no completion_tokens" in err and "req-0004" in err and "no prompt_tokens" in err
    assert len(load_scenario(o).workload.explicit) == 4


def test_nothing_usable_is_bad_input(tmp_path, capsys):
    p = tmp_path / "empty.log"
    p.write_text("[2026-05-28 20:26:40] hello\n")
    assert main(["scenario", "from-log", str(p), "--base", str(BASE)]) == 2
    assert "no request to replay" in capsys.readouterr().err
    assert main(["scenario", "from-log", str(tmp_path / "missing.log"), "--base", str(BASE)]) == 2
    assert main(["scenario", "from-log", str(FIX / "0.5.23" / "requests.json.log")]) == 2     # no base
    assert "--base" in capsys.readouterr().err
    assert main(["scenario", "from-log", str(FIX / "0.5.23" / "requests.json.log"), "--base", str(BASE),
                 "--window", "nonsense..x"]) == 2


def test_oversize_requests_are_left_out_and_named(tmp_path, capsys):
    o = tmp_path / "r.toml"
    assert main(["scenario", "from-log", str(FIX / "0.5.23" / "requests.json.log"), "--preset", "gpt-oss-20b",
                 "--full-size", "48", "-o", str(o)]) == 0
    err = capsys.readouterr().err
    assert "longer than the pool (48 slots) left out; --full-size 69 or more keeps them" in err
    assert all(r.prompt_len + r.output_len <= 48 for r in load_scenario(o).workload.explicit)


def test_gzip_log_and_over_long_line(tmp_path):
    p = tmp_path / "log.gz"
    with gzip.open(p, "wt") as f:
        f.write("\n".join(_lines()) + "\n")
    assert len(read_request_log([p])[0]) == 6
    lines = _lines()
    lines.insert(2, "[2026-05-28 20:26:40] {" + "x" * (2 * 2**20))
    q = tmp_path / "long.log"
    q.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError, match=r":3: line longer than the 1 MiB limit"):
        read_request_log([q], max_line_bytes=2**20)
    reqs, st = read_request_log([q], max_line_bytes=2**20, skip_bad=True)
    assert len(reqs) == 6 and st.bad_lines == 1


def test_trace_bad_and_unknown_spans(tmp_path):
    lines = (FIX / "0.5.23" / "trace.otlp.jsonl").read_text().splitlines()
    doc = json.loads(lines[0])
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"].append(
        {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "my_custom_stage", "startTimeUnixNano": "1",
         "endTimeUnixNano": "2"})
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(doc) + "\n" + lines[1][:100] + "\n" + "\n".join(lines[1:]) + "\n")
    with pytest.raises(TraceFormatError, match=r"t.jsonl:2: invalid JSON"):
        read_engine_trace([p])
    et = read_engine_trace([p], skip_bad=True)
    assert et.stats.unknown == {"my_custom_stage": 1} and et.stats.bad_lines == 1
    assert len(et.requests) == 6


# -- sharing: cached prefixes and conversations under the radix cache -----------------------------
SMALL_BASE = ('name = "b"\nbackends = ["flashinfer"]\n[model]\npreset = "gpt-oss-20b"\nnum_layers = 2\n'
              '[pool]\nfull_size = 1024\n[workload]\nrequests = 1\n')
#: fixture requests given a conversation id: req-0003 holds the whole of req-0000 (40 + 6 < 64), req-0005
#: does not hold req-0003 (30 <= 64 + 5): it starts the conversation anew
CONVERSATION = {"req-0000": "chat-a", "req-0003": "chat-a", "req-0005": "chat-a"}


def _with_conversations(tmp_path: Path, fmt: str) -> Path:
    """The 0.5.23 fixture log (SGLang's own logger's lines) with conversation_id set on three requests."""
    out = []
    for line in (FIX / "0.5.23" / f"requests.{fmt}.log").read_text().splitlines():
        for rid, conv in CONVERSATION.items():
            if f'"rid": "{rid}"' in line:
                line = line.replace('"conversation_id": null', f'"conversation_id": "{conv}"')
            if f"rid='{rid}'" in line:
                line = line.replace("conversation_id=None", f"conversation_id='{conv}'")
        out.append(line)
    p = tmp_path / f"conv.{fmt}.log"
    p.write_text("\n".join(out) + "\n")
    return p


@pytest.mark.parametrize("fmt", ("json", "text"))
def test_conversations_become_turns(tmp_path, fmt, capsys):
    log = _with_conversations(tmp_path, fmt)
    reqs, _ = read_request_log([log])
    assert {r.rid: r.conversation for r in reqs if r.conversation} == CONVERSATION
    base = tmp_path / "base.toml"
    base.write_text(SMALL_BASE)
    out = tmp_path / "r.toml"
    assert main(["scenario", "from-log", str(log), "--base", str(base), "-o", str(out)]) == 0
    sc = load_scenario(out)
    got = [(r.prompt_len, r.conversation, r.turn, r.prefix_group, r.prefix_len) for r in sc.workload.explicit]
    assert got == [(40, "chat-a", 1, None, 0), (52, None, 0, "cached", 32), (36, None, 0, "cached", 32),
                   (64, "chat-a", 2, None, 0), (44, None, 0, "cached", 32), (30, "chat-a#2", 1, None, 0)]
    assert sc.engine.radix_cache
    err = capsys.readouterr().err
    assert "2 conversations, 1 later turns (1 restarted" in err and "radix cache on" in err


def test_replay_shares_cached_prefixes_and_turns(tmp_path):
    """Cached tokens and a conversation's history are prefix hits of the radix cache in the replay's run."""
    base = tmp_path / "base.toml"
    base.write_text(SMALL_BASE)
    runs = {}
    for name, log, extra in (("plain", FIX / "0.5.23" / "requests.json.log", []),
                             ("conv", _with_conversations(tmp_path, "json"), []),
                             ("off", FIX / "0.5.23" / "requests.json.log", ["--no-radix-cache"])):
        out = tmp_path / f"{name}.toml"
        assert main(["scenario", "from-log", str(log), "--base", str(base), "-o", str(out), "-q", *extra]) == 0
        assert main(["run", str(out), "--out", str(tmp_path / name), "--device", "cpu", "-q", "--no-report",
                     "--trace-level", "off"]) == 0
        runs[name] = json.loads((tmp_path / name / "summary.json").read_text())
    assert "radix" not in runs["off"]
    assert runs["plain"]["radix"]["hit_tokens"] == PLAIN_HITS
    assert runs["conv"]["radix"]["hit_tokens"] == CONV_HITS
    assert runs["conv"]["radix"]["hit_tokens"] > runs["plain"]["radix"]["hit_tokens"]


# -- end to end -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_replay_end_to_end_run_report_minimize(tmp_path):
    """The README's three commands on a fixture, then minimize: a replay is a scenario like any other."""
    replay = tmp_path / "replay.toml"
    run_dir = tmp_path / "run"
    base = tmp_path / "base.toml"
    base.write_text('name = "b"\nbackends = ["flashinfer", "triton"]\ndesign = "sglang-pre-29460"\n'
                    '[model]\npreset = "gpt-oss-20b"\nnum_layers = 2\n[pool]\nfull_size = 1024\n'
                    '[workload]\nrequests = 1\n[engine]\npiecewise_cuda_graph = true\ndp_size = 2\n'
                    'dp_other_tokens = 300\n')
    assert main(["scenario", "from-log", str(FIX / "0.5.23" / "requests.json.log"), "--base", str(base),
                 "-o", str(replay), "-q"]) == 0
    rc = main(["run", str(replay), "--out", str(run_dir), "--device", "cpu", "-q"])
    assert rc == 1                                           # B1 under the pre-#29460 design: findings
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["scenario"] == "replay-requests"
    assert summary["backends"]["flashinfer"]["findings"].get("length_mismatch")
    assert main(["report", str(run_dir), "-o", str(tmp_path / "replay.html")]) == 0
    assert "replay-requests" in (tmp_path / "replay.html").read_text()
    assert main(["minimize", str(run_dir), "-o", str(tmp_path / "min.toml"), "-q"]) == 0
    assert len(load_scenario(tmp_path / "min.toml").workload.explicit) <= 6
    # the trace beside the run
    rep = tmp_path / "engine.html"
    assert main(["analyze", str(FIX / "0.5.23" / "trace.otlp.jsonl"), "--run", str(run_dir), "--report",
                 str(rep)]) == 0
    html = rep.read_text()
    assert "beside the simulator" in html and html.count("<figure") == 4
