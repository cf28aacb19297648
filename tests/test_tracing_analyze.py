"""Offline analysis: round trips through our exporter, foreign and hand-written OTLP JSON in
every accepted form, malformed input, the CLI subcommands and the Chrome export."""
from __future__ import annotations

import argparse
import base64
import copy
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from tracing import analyze as analyze_mod
from tracing import attributes as A
from tracing import synthetic as S
from tracing.analyze import Durations, analyze_files
from tracing.chrome import STEPS_TID, export_chrome
from tracing.commands import register
from tracing.otlp_read import TraceFormatError
from tracing.session import TraceSession

MS = 1_000_000
BASE = 1_750_000_000_000_000_000


# -- helpers --------------------------------------------------------------------------------------
def traced_run(tmp_path: Path, level: str, steps: int = 30, design: str = "prefix",
               n_layers: int = 8, seed: int = 1) -> tuple[Path, S.Expected]:
    out = tmp_path / f"{design}-{level}"
    s = TraceSession(out, level, batch_size=50)
    exp = S.drive(s.observer, S.run_info(n_layers=n_layers, design=design, seed=seed), steps,
                  seed=seed)
    s.finish()
    return out / "trace.otlp.jsonl", exp


def expected_tables(exp: S.Expected) -> dict[str, dict[str, dict[str, int]]]:
    return {dim: {k: {"boundaries": n, "agree": n - lo - sh, "longer": lo, "shorter": sh}
                  for k, (n, lo, sh) in rows.items()}
            for dim, rows in exp.tables.items()}


def kv(key: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"key": key, "value": value}


def sglang_doc(req: int, *, upper: bool = False, int_numbers: bool = False,
               b64: bool = False) -> dict[str, Any]:
    """One request of an SGLang-like request trace: a root and three stage spans."""
    trace = f"{req:032x}"
    ids = [f"{req:08x}{i:08x}" for i in range(4)]

    def tid(h: str) -> str:
        if b64:
            return base64.b64encode(bytes.fromhex(h)).decode()
        return h.upper() if upper else h

    def ns(v: int) -> Any:
        return v if int_numbers else str(v)

    start = BASE + req * 1000 * MS
    stages = [("tokenize", (1 + req) * MS), ("prefill_forward", 10 * req * MS),
              ("decode_loop", 100 * req * MS)]
    spans = [{"traceId": tid(trace), "spanId": tid(ids[0]), "name": "request", "kind": 2,
              "startTimeUnixNano": ns(start), "endTimeUnixNano": ns(start + 500 * MS),
              "attributes": [kv("rid", {"stringValue": f"req-{req}"}),
                             kv("input_len", {"intValue": ns(17 * req)}),
                             kv("sampling", {"kvlistValue": {"values": [
                                 kv("temperature", {"doubleValue": 0.7}),
                                 kv("greedy", {"boolValue": False})]}}),
                             kv("token_ids", {"arrayValue": {"values": [
                                 {"intValue": ns(1)}, {"intValue": ns(2)}]}})],
              "status": {}}]
    t = start
    for i, (name, dur) in enumerate(stages, start=1):
        spans.append({"traceId": tid(trace), "spanId": tid(ids[i]), "parentSpanId": tid(ids[0]),
                      "name": name, "kind": 1, "startTimeUnixNano": ns(t),
                      "endTimeUnixNano": ns(t + dur),
                      "events": [{"timeUnixNano": ns(t), "name": "batch",
                                  "attributes": [kv("batch_id", {"intValue": ns(req)}),
                                                 kv("batch_size", {"intValue": ns(4)})]}],
                      "status": {"code": 2, "message": "oom"} if (req == 3 and i == 3) else {}})
        t += dur
    return {"resourceSpans": [{
        "resource": {"attributes": [kv("service.name", {"stringValue": "sglang"})]},
        "scopeSpans": [{"scope": {"name": "sglang.tracing"}, "spans": spans}]}]}


def check_sglang_summary(res, alone: bool = True) -> None:
    if alone:
        assert res.slotscope_runs == []
    fo = res.foreign
    assert fo["spans"] == 12 and fo["error_spans"] == 1
    names = {n["name"]: n for n in fo["names"]}
    assert set(names) == {"request", "tokenize", "prefill_forward", "decode_loop"}
    tok = names["tokenize"]
    assert tok["count"] == 3 and tok["total_ns"] == (2 + 3 + 4) * MS
    assert tok["mean_ns"] == 3 * MS and tok["p50_ns"] == 3 * MS and tok["max_ns"] == 4 * MS
    dec = names["decode_loop"]
    assert dec["total_ns"] == 600 * MS and dec["p50_ns"] == 200 * MS and dec["max_ns"] == 300 * MS
    assert names["request"]["count"] == 3 and names["request"]["mean_ns"] == 500 * MS
    assert fo["names"][0]["name"] == "request"           # ordered by total time


def write_jsonl(path: Path, docs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return path


# -- round trips ------------------------------------------------------------------------------------
@pytest.mark.parametrize("level", ["step", "anomaly", "boundary"])
def test_round_trip_gives_the_divergence_we_fed_in(tmp_path, level):
    path, exp = traced_run(tmp_path, level)
    assert exp.longer > 0 and exp.shorter > 0                 # the scenario exercises both
    res = analyze_files([path])
    run = res.run(design="prefix")
    assert run["source"] == "backend_spans"
    assert run["boundaries"] == exp.boundaries
    assert (run["longer"], run["shorter"]) == (exp.longer, exp.shorter)
    assert run["divergence"] == expected_tables(exp)
    assert run["findings"] == exp.findings
    fd = run["first_divergence"]
    assert {k: fd[k] for k in ("step", "backend", "layer", "direction")} == exp.first
    assert len(fd["trace_id"]) == 32
    fe = run["first_error"]
    assert fe["message"].startswith("RuntimeError: Size mismatch") or \
        fe["message"].startswith("Size mismatch")
    assert (res.bad_lines, res.foreign["spans"]) == (0, 0)
    assert run["scenario"] == "synthetic" and run["seed"] == 1
    assert json.loads(json.dumps(res.to_json()))["slotscope_runs"][0]["boundaries"] == exp.boundaries


def test_boundary_spans_alone_are_counted_when_backend_spans_are_missing(tmp_path):
    path, exp = traced_run(tmp_path, "boundary", steps=12)
    kept = []
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                ss["spans"] = [s for s in ss["spans"] if s["name"] == A.SPAN_BOUNDARY]
        kept.append(doc)
    trimmed = write_jsonl(tmp_path / "trimmed.jsonl", kept)
    run = analyze_files([trimmed]).run()
    assert run["source"] == "boundary_spans"
    assert run["divergence"] == expected_tables(exp)
    assert run["findings"] == exp.findings
    assert {k: run["first_divergence"][k] for k in ("step", "backend", "layer", "direction")} == exp.first


def test_two_designs_are_two_runs_and_foreign_spans_sit_beside_them(tmp_path):
    p1, e1 = traced_run(tmp_path, "anomaly", design="prefix")
    p2, e2 = traced_run(tmp_path, "step", design="post_init", seed=2)
    p3 = write_jsonl(tmp_path / "sglang.jsonl", [sglang_doc(r) for r in (1, 2, 3)])
    res = analyze_files([p1, p2, p3])
    assert [r["design"] for r in res.slotscope_runs] == ["post_init", "prefix"]
    assert res.run(design="post_init")["boundaries"] == e2.boundaries
    assert res.run(design="prefix")["longer"] == e1.longer
    check_sglang_summary(res, alone=False)
    text = res.render_text()
    for needle in ("shape divergence by backend", "shape divergence by layer kind",
                   "shape divergence by mode", "shape divergence by graph path",
                   "findings by class", "first divergence: step", "decode_loop", "p50 ms"):
        assert needle in text


# -- foreign traces in every accepted form -------------------------------------------------------------
def test_foreign_json_lines(tmp_path):
    check_sglang_summary(analyze_files([write_jsonl(tmp_path / "t.jsonl",
                                                    [sglang_doc(r) for r in (1, 2, 3)])]))


def test_foreign_one_pretty_printed_document(tmp_path):
    docs = [sglang_doc(r) for r in (1, 2, 3)]
    merged = {"resourceSpans": [rs for d in docs for rs in d["resourceSpans"]]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(merged, indent=2))
    assert path.read_text().count("\n") > 50
    res = analyze_files([path])
    check_sglang_summary(res)
    assert res.files[0]["documents"] == 1


def test_foreign_concatenated_pretty_documents(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("\n".join(json.dumps(sglang_doc(r), indent=4) for r in (1, 2, 3)))
    res = analyze_files([path])
    check_sglang_summary(res)
    assert res.files[0]["documents"] == 3


@pytest.mark.parametrize("variant", [dict(upper=True), dict(int_numbers=True), dict(b64=True),
                                     dict(upper=True, int_numbers=True)])
def test_foreign_id_and_integer_variants(tmp_path, variant):
    check_sglang_summary(analyze_files([write_jsonl(
        tmp_path / "t.jsonl", [sglang_doc(r, **variant) for r in (1, 2, 3)])]))


def test_gzip_compressed_json_lines(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        for r in (1, 2, 3):
            fh.write(json.dumps(sglang_doc(r)) + "\n")
    check_sglang_summary(analyze_files([path]))


def test_hand_written_slotscope_document_with_number_ints_and_upper_ids(tmp_path):
    """A slotscope-shaped trace from another producer: pretty-printed, ints as numbers."""
    def arr(vals, typ):
        return {"arrayValue": {"values": [{typ: v} for v in vals]}}
    backend_span = {
        "traceId": "AB" * 16, "spanId": "CD" * 8, "name": A.SPAN_BACKEND,
        "startTimeUnixNano": BASE, "endTimeUnixNano": BASE + 10,
        "attributes": [kv(A.STEP, {"intValue": 4}), kv(A.BACKEND, {"stringValue": "aiter"}),
                       kv(A.MODE, {"stringValue": "extend"}),
                       kv(A.GRAPH, {"stringValue": "piecewise"}),
                       kv(A.LAYER_IDS, arr([0, 1, 2, 3], "intValue")),
                       kv(A.LAYER_KINDS, arr(["full", "swa", "swa", "swa"], "stringValue")),
                       kv(A.LOC_LENS, arr([6, 6, 6, 6], "intValue")),
                       kv(A.SWA_LOC_LENS, arr(["9", "9", "6", "-1"], "intValue")),
                       kv(A.FINDINGS_PREFIX + "length_mismatch", {"intValue": 1})]}
    doc = {"resourceSpans": [{"resource": {"attributes": [
        kv("service.name", {"stringValue": "slotscope"}),
        kv(A.DESIGN, {"stringValue": "mine"})]},
        "scopeSpans": [{"scope": {"name": "x"}, "spans": [backend_span]}]}]}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(doc, indent=2))
    run = analyze_files([path]).run(design="mine")
    assert run["divergence"]["layer_kind"] == {
        "full": {"boundaries": 1, "agree": 1, "longer": 0, "shorter": 0},
        "swa": {"boundaries": 3, "agree": 2, "longer": 1, "shorter": 0}}
    assert run["findings"] == {"aiter": {"length_mismatch": 1}}
    fd = run["first_divergence"]
    assert (fd["step"], fd["layer"], fd["swa_loc_len"], fd["trace_id"]) == (4, 1, 9, "ab" * 16)


def test_empty_file_and_other_signals(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    metrics = write_jsonl(tmp_path / "m.jsonl", [{"resourceMetrics": []}, sglang_doc(1), {}])
    res = analyze_files([empty, metrics])
    assert res.spans == 4 and res.files[1]["other_signals"] == 1 and res.bad_lines == 0
    assert "no spans found" in analyze_files([empty]).render_text()


# -- malformed input --------------------------------------------------------------------------------------
def test_bad_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(sglang_doc(1)) + "\n\n" + '{"resourceSpans": [\n'
                    + json.dumps(sglang_doc(2)) + "\n")
    with pytest.raises(TraceFormatError) as ei:
        analyze_files([path])
    assert ei.value.line == 3 and ei.value.path == str(path)
    assert str(ei.value).startswith(f"{path}:3: invalid JSON")


def test_skip_bad_counts_and_goes_on(tmp_path):
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps(sglang_doc(1)), "not json", json.dumps(sglang_doc(2)),
             '{"resourceSpans": 5}', '[1, 2]', json.dumps(sglang_doc(3)),
             b"\xff\xfe".decode("latin-1")]
    path.write_bytes("\n".join(lines).encode("utf-8").replace("ÿþ".encode("utf-8"), b"\xff\xfe"))
    res = analyze_files([path], skip_bad=True)
    check_sglang_summary(res)
    f = res.files[0]
    assert f["bad_lines"] == 4 and [b["line"] for b in f["bad"]] == [2, 4, 5, 7]
    assert "skipped" in res.render_text()


def test_structural_errors_are_reported_at_their_line(tmp_path):
    for body, reason in [('{"resourceSpans": 5}', "not a list"),
                         ('{"spans": []}', "missing field 'resourceSpans'"),
                         ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": 3}]}]}]}',
                          "span name"),
                         ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "a", '
                          '"startTimeUnixNano": "soon"}]}]}]}', "invalid literal")]:
        path = write_jsonl(tmp_path / "s.jsonl", [sglang_doc(1)])
        with open(path, "a") as fh:
            fh.write(body + "\n")
        with pytest.raises(TraceFormatError, match=f":2: .*{reason}"):
            analyze_files([path])


def test_a_bad_line_is_not_half_counted(tmp_path):
    good = sglang_doc(1)
    bad = copy.deepcopy(good)
    bad["resourceSpans"][0]["scopeSpans"][0]["spans"][-1]["endTimeUnixNano"] = "later"
    res = analyze_files([write_jsonl(tmp_path / "t.jsonl", [good, bad])], skip_bad=True)
    assert res.foreign["spans"] == 4 and res.bad_lines == 1


def test_pretty_document_error_line(tmp_path):
    text = json.dumps(sglang_doc(1), indent=2).splitlines()
    text[10] = text[10] + " oops"
    path = tmp_path / "p.json"
    path.write_text("\n".join(text))
    with pytest.raises(TraceFormatError, match=r"p\.json:11: invalid JSON document"):
        analyze_files([path])


def test_json_lines_with_broken_first_line(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_text('{"resourceSpans": [\n' + "".join(json.dumps(sglang_doc(r)) + "\n"
                                                      for r in (1, 2, 3)))
    with pytest.raises(TraceFormatError, match=":1: invalid JSON"):
        analyze_files([path])
    res = analyze_files([path], skip_bad=True)
    check_sglang_summary(res)
    assert res.bad_lines == 1


def test_a_run_directory_means_its_trace_file(tmp_path):
    path, exp = traced_run(tmp_path, "step", steps=5)
    assert analyze_files([path.parent]).run()["boundaries"] == exp.boundaries


def test_missing_file(tmp_path):
    with pytest.raises(TraceFormatError, match="cannot read"):
        analyze_files([tmp_path / "nope.jsonl"])


# -- bounded memory pieces --------------------------------------------------------------------------------
def test_durations_p50_exact_then_approximate():
    d = Durations()
    for v in (5, 1, 3):
        d.add(v)
    assert d.p50() == 3.0 and d.exact is not None
    d = Durations()
    for v in range(1, 100_001):
        d.add(v * 1000)
    assert d.exact is None and len(d.hist) < 1500
    assert abs(d.p50() - 50_000_000) / 50_000_000 < 0.01
    assert d.max == 100_000_000 and d.count == 100_000


def test_span_names_are_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(analyze_mod, "MAX_NAMES", 2)
    res = analyze_files([write_jsonl(tmp_path / "t.jsonl", [sglang_doc(r) for r in (1, 2, 3)])])
    names = {n["name"]: n["count"] for n in res.foreign["names"]}
    assert names["(other)"] == 6 and res.foreign["names_folded"] == 6 and len(names) == 3


# -- CLI ------------------------------------------------------------------------------------------------------
def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="slotscope")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_analyze_text_and_json(tmp_path, capsys):
    path, exp = traced_run(tmp_path, "anomaly", steps=10)
    assert cli(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert "shape divergence by backend" in out and "flashinfer" in out
    assert cli(["analyze", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["slotscope_runs"][0]["boundaries"] == exp.boundaries


def test_cli_analyze_bad_input_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(sglang_doc(1)) + "\n{oops\n")
    assert cli(["analyze", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2:" in err
    assert cli(["analyze", "--skip-bad", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["bad_lines"] == 1


def test_cli_export_chrome(tmp_path, capsys):
    path, _ = traced_run(tmp_path, "boundary", steps=4)
    assert cli(["export", str(path.parent), "--chrome"]) == 0
    assert (path.parent / "trace.chrome.json").is_file()
    out = tmp_path / "x" / "c.json"
    assert cli(["export", str(path), "--chrome", "-o", str(out)]) == 0 and out.is_file()
    assert cli(["export", str(path.parent)]) == 2
    assert cli(["export", str(tmp_path / "nothing"), "--chrome"]) == 2
    assert "nothing: no such run directory or trace file" in capsys.readouterr().err


# -- Chrome / Perfetto -----------------------------------------------------------------------------------
def test_chrome_export_structure(tmp_path):
    path, exp = traced_run(tmp_path, "boundary", steps=20, n_layers=8)
    assert exp.errors
    fig = export_chrome(path, tmp_path / "c.json")
    data = json.loads((tmp_path / "c.json").read_text())
    events = data["traceEvents"]
    assert fig["events"] == len(events)
    xs = [e for e in events if e["ph"] == "X"]
    meta = [e for e in events if e["ph"] == "M"]
    assert fig["spans"] == len(xs) == 1 + exp.steps + exp.backend_steps + exp.boundaries
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert list(procs.values())[:5] == ["slotscope run", "backend flashinfer", "backend triton",
                                        "backend fa3", "backend trtllm_mha"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    bnd = [e for e in xs if e["cat"] == A.SPAN_BOUNDARY]
    assert len(bnd) == exp.boundaries
    for e in bnd:
        assert e["tid"] == e["args"]["layer"]
        assert procs[e["pid"]] == "backend " + e["args"]["backend"]
        assert threads[(e["pid"], e["tid"])] == f"layer {e['tid']} ({e['args']['layer_kind']})"
        assert isinstance(e["ts"], float) and e["dur"] == 1.0     # 1000 ns = 1 us
    assert min(e["ts"] for e in xs) == 0.0
    assert any(e.get("cname") == "terrible" for e in bnd)       # the length-mismatch errors
    steps_lane = [e for e in xs if e["cat"] == A.SPAN_BACKEND]
    assert {e["tid"] for e in steps_lane} == {STEPS_TID}


def test_chrome_export_rejects_bad_input(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(sglang_doc(1)) + "\nnope\n")
    with pytest.raises(TraceFormatError, match=":2:"):
        export_chrome(path, tmp_path / "c.json")
    assert not (tmp_path / "c.json").exists()


# -- hostile input: deep, huge, long names, spans without the attributes we need -------------------------
DEEP = "[" * 100_000 + "]" * 100_000


def our_doc(spans_attrs: list[dict[str, Any]], name: str = A.SPAN_BACKEND) -> dict[str, Any]:
    """A slotscope document whose spans carry exactly the given attributes (ints and strings, arrays)."""
    def value(v: Any) -> dict[str, Any]:
        if isinstance(v, list):
            return {"arrayValue": {"values": [value(x) for x in v]}}
        return {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}

    spans = [{"traceId": "ab" * 16, "spanId": f"{i:016x}", "name": name, "startTimeUnixNano": str(BASE + i),
              "endTimeUnixNano": str(BASE + i + 10), "attributes": [kv(k, value(v)) for k, v in a.items()]}
             for i, a in enumerate(spans_attrs)]
    return {"resourceSpans": [{"resource": {"attributes": [kv("service.name", {"stringValue": "slotscope"}),
                                                           kv(A.SCENARIO, {"stringValue": "hand"})]},
                               "scopeSpans": [{"spans": spans}]}]}


def backend_attrs(**drop: bool) -> dict[str, Any]:
    a = {A.STEP: 3, A.BACKEND: "triton", A.MODE: "decode", A.GRAPH: "decode_graph", A.LAYER_IDS: [0, 1],
         A.LAYER_KINDS: ["swa", "full"], A.LOC_LENS: [4, 4], A.SWA_LOC_LENS: [5, -1]}
    for key in drop:
        del a[getattr(A, key)]
    return a


@pytest.mark.parametrize("where", ["first", "later"])
def test_deeply_nested_line_is_a_bad_line_not_a_recursion_error(tmp_path, capsys, where):
    path = tmp_path / "deep.jsonl"
    good = json.dumps(sglang_doc(1))
    path.write_text(f"{DEEP}\n{good}\n" if where == "first" else f"{good}\n{DEEP}\n")
    line = 1 if where == "first" else 2
    with pytest.raises(TraceFormatError, match=f"deep.jsonl:{line}: invalid JSON: nested too deeply"):
        analyze_files([path])
    assert cli(["analyze", str(path)]) == 2
    assert f"deep.jsonl:{line}: invalid JSON: nested too deeply" in capsys.readouterr().err
    res = analyze_files([path], skip_bad=True)
    assert res.bad_lines == 1 and res.foreign["spans"] == 4
    assert cli(["export", str(path), "--chrome"]) == 2
    err = capsys.readouterr().err
    assert f"deep.jsonl:{line}: invalid JSON: nested too deeply" in err and "Traceback" not in err
    assert not list(tmp_path.glob("*.part"))
    assert cli(["export", str(path), "--chrome", "--skip-bad"]) == 0
    captured = capsys.readouterr()
    assert "4 spans" in captured.out and "1 bad line(s)" in captured.err


def test_deeply_nested_pretty_document(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("{\n  \"resourceSpans\":\n" + DEEP + "\n}\n")
    with pytest.raises(TraceFormatError, match=r"deep\.json:\d+: invalid JSON document: nested too deeply"):
        analyze_files([path])


def test_deep_otlp_values_inside_a_parsable_line(tmp_path):
    # 400 levels of arrayValue parse as JSON (1,200 levels of nesting would not); decoding them must not crash
    v: dict[str, Any] = {"intValue": "1"}
    for _ in range(300):
        v = {"arrayValue": {"values": [v]}}
    doc = sglang_doc(1)
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"].append(kv("deep", v))
    path = tmp_path / "v.jsonl"
    try:
        path.write_text(json.dumps(doc) + "\n")
    except RecursionError:
        pytest.skip("json.dumps cannot write it here")
    res = analyze_files([path], skip_bad=True)
    assert res.bad_lines + res.foreign["spans"] >= 1


def test_a_line_longer_than_the_limit_is_reported_by_number(tmp_path, capsys):
    path = tmp_path / "long.jsonl"
    big = '{"x": "' + "y" * (3 * 2**20) + '"}'
    path.write_text(json.dumps(sglang_doc(1)) + "\n" + big + "\n" + json.dumps(sglang_doc(2)) + "\n")
    with pytest.raises(TraceFormatError, match=r"long\.jsonl:2: line longer than the 1 MiB limit \(3 MiB\)"):
        analyze_files([path], max_line_bytes=2**20)
    assert cli(["analyze", str(path), "--max-line-mb", "1"]) == 2
    assert "long.jsonl:2: line longer than the 1 MiB limit" in capsys.readouterr().err
    res = analyze_files([path], skip_bad=True, max_line_bytes=2**20)
    assert res.bad_lines == 1 and res.files[0]["bad"][0]["line"] == 2
    assert res.foreign["spans"] == 8        # the lines after it are read
    # under the default limit it is read like any other line (and is no OTLP document)
    assert "missing field 'resourceSpans'" in analyze_files([path], skip_bad=True).files[0]["bad"][0]["reason"]
    assert cli(["export", str(path), "--chrome", "--max-line-mb", "1"]) == 2
    assert "long.jsonl:2: line longer than the 1 MiB limit" in capsys.readouterr().err


def test_first_line_too_long(tmp_path):
    path = tmp_path / "first.jsonl"
    path.write_text('{"x": "' + "y" * (2 * 2**20) + '"}\n' + json.dumps(sglang_doc(1)) + "\n")
    with pytest.raises(TraceFormatError, match=r"first\.jsonl:1: line longer than the 1 MiB limit"):
        analyze_files([path], max_line_bytes=2**20)
    res = analyze_files([path], skip_bad=True, max_line_bytes=2**20)
    assert res.bad_lines == 1 and res.foreign["spans"] == 4


def test_over_long_line_is_never_held_in_memory(tmp_path):
    import tracemalloc

    path = tmp_path / "huge.jsonl"
    with open(path, "w") as fh:
        fh.write('{"x": "')
        chunk = "z" * 2**20
        for _ in range(40):          # a 40 MiB line
            fh.write(chunk)
        fh.write('"}\n')
    tracemalloc.start()
    try:
        res = analyze_files([path], skip_bad=True, max_line_bytes=2**20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert res.bad_lines == 1 and "(40 MiB)" in res.files[0]["bad"][0]["reason"]
    assert peak < 8 * 2**20


def test_line_past_the_default_limit(tmp_path):
    from tracing.otlp_read import MAX_LINE_BYTES

    path = tmp_path / "past.jsonl"
    with open(path, "w") as fh:
        fh.write(json.dumps(sglang_doc(1)) + "\n" + '{"x": "')
        fh.write("q" * (MAX_LINE_BYTES + 10))
        fh.write('"}\n')
    with pytest.raises(TraceFormatError, match=r"past\.jsonl:2: line longer than the 64 MiB limit"):
        analyze_files([path])


def test_pretty_document_larger_than_the_limit(tmp_path):
    path = tmp_path / "big.json"
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "s" * 100, "startTimeUnixNano": "1"}] * 20000}]}]}
    path.write_text(json.dumps(doc, indent=2))
    assert path.stat().st_size > 2**20
    with pytest.raises(TraceFormatError, match=r"big\.json:1: a pretty-printed JSON document larger than the "
                                               r"1 MiB limit"):
        analyze_files([path], max_line_bytes=2**20)
    assert analyze_files([path]).foreign["spans"] == 20000


def test_long_names_are_shortened_in_the_tables_with_a_warning(tmp_path):
    doc = sglang_doc(1)
    long_span = "stage_" + "x" * 300
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1]["name"] = long_span
    attrs = backend_attrs()
    attrs[A.BACKEND] = "backend_" + "b" * 200
    path = write_jsonl(tmp_path / "n.jsonl", [doc, our_doc([attrs])])
    res = analyze_files([path])
    text = res.render_text()
    assert long_span not in text and attrs[A.BACKEND] not in text
    assert ("stage_" + "x" * 41 + "\u2026") in text and ("backend_" + "b" * 39 + "\u2026") in text
    assert "warning: 2 names longer than 48 characters shortened with \u2026" in text
    assert res.foreign["names"][1]["name"] == long_span or any(n["name"] == long_span for n in res.foreign["names"])


def test_names_are_cut_when_read_so_memory_stays_bounded(tmp_path):
    doc = sglang_doc(1)
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1]["name"] = "n" * 100_000
    res = analyze_files([write_jsonl(tmp_path / "n.jsonl", [doc])])
    lens = sorted(len(n["name"]) for n in res.foreign["names"])
    assert lens[-1] == analyze_mod.MAX_STORED_CHARS


def test_spans_lacking_attributes_are_counted_and_warned(tmp_path, capsys):
    spans = ([backend_attrs(BACKEND=True)] * 5 + [backend_attrs(BACKEND=True, STEP=True)] * 2
             + [backend_attrs(LOC_LENS=True)] * 3 + [backend_attrs()] * 4)
    path = write_jsonl(tmp_path / "lack.jsonl", [our_doc(spans)])
    r = analyze_files([path]).run()
    assert r["lacking_attributes"] == {A.BACKEND: 7, A.LOC_LENS: 3, A.STEP: 2}
    assert r["spans_unused"] == 3 and r["spans"] == 14
    assert r["boundaries"] == 2 * 11                      # the 3 spans without loc lengths are left out
    assert r["warnings"][0].startswith(f"7 spans lack {A.BACKEND}; 3 lack {A.LOC_LENS}; 2 lack {A.STEP}")
    assert "3 spans without per-layer shapes" in r["warnings"][1]
    assert cli(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"warning: 7 spans lack {A.BACKEND}; 3 lack {A.LOC_LENS}; 2 lack {A.STEP}" in out
    assert cli(["analyze", "--json", str(path)]) == 0
    captured = capsys.readouterr()
    assert f"7 spans lack {A.BACKEND}" in captured.err and json.loads(captured.out)
    # boundary spans (read when a run has no backend spans) are checked for theirs
    b = {A.STEP: 1, A.BACKEND: "aiter", A.MODE: "extend", A.GRAPH: "eager", A.LAYER: 0, A.LAYER_KIND: "swa",
         A.LOC_SHAPE: [4], A.SWA_LOC_SHAPE: [4]}
    nob = {k: v for k, v in b.items() if k not in (A.MODE, A.GRAPH)}
    r = analyze_files([write_jsonl(tmp_path / "b.jsonl", [our_doc([b, nob, nob], A.SPAN_BOUNDARY)])]).run()
    assert r["lacking_attributes"] == {A.GRAPH: 2, A.MODE: 2} and r["boundaries"] == 3


def test_our_own_traces_raise_no_lacking_warnings(tmp_path):
    for level in ("step", "boundary", "anomaly"):
        path, _ = traced_run(tmp_path, level, steps=6)
        r = analyze_files([path]).run()
        assert r["warnings"] == [] and r["lacking_attributes"] == {}


def test_run_directory_without_a_trace_says_what_is_missing(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "steps.jsonl").write_text("")
    (run / "scenario.toml").write_text("")
    assert cli(["export", str(run), "--chrome"]) == 2
    err = capsys.readouterr().err
    assert (f"{run}: no trace.otlp.jsonl to read (the run did not finish: the trace is written at its end); "
            f"missing: trace.otlp.jsonl, summary.json, run.json; present: steps.jsonl, scenario.toml") in err
    (run / "summary.json").write_text(json.dumps({"incomplete": {"reason": "signal"}}))
    assert cli(["export", str(run), "--chrome"]) == 2
    assert "(summary.json says the run is incomplete)" in capsys.readouterr().err
    (run / "run.json").write_text(json.dumps({"trace_level": "off"}))
    assert cli(["analyze", str(run)]) == 2
    assert "(the run was made with --trace-level off)" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli(["export", str(empty), "--chrome"]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_export_output_that_is_a_directory(tmp_path, capsys):
    path, _ = traced_run(tmp_path, "step", steps=3)
    assert cli(["export", str(path), "--chrome", "-o", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.part"))


def test_export_span_with_bad_values_names_the_line(tmp_path, capsys):
    bad = our_doc([{A.LAYER: "not-a-number", A.BACKEND: "x"}], A.SPAN_BOUNDARY)
    path = write_jsonl(tmp_path / "e.jsonl", [sglang_doc(1), bad])
    assert cli(["export", str(path), "--chrome"]) == 2
    err = capsys.readouterr().err
    assert "e.jsonl:2: cannot convert a span: ValueError" in err
    assert cli(["export", str(path), "--chrome", "--skip-bad"]) == 0
    assert "4 spans" in capsys.readouterr().out


def test_reading_traces_needs_no_otel_sdk():
    import subprocess
    import sys

    from tracing import otlp_json, otlp_read

    assert otlp_read.TRACE_FILE == otlp_json.TRACE_FILE
    code = ("import sys; sys.modules['opentelemetry'] = None; import tracing.commands, tracing.analyze, "
            "tracing.chrome; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert out.stdout.strip() == "ok", out.stderr


def test_truncated_or_corrupt_gzip_is_a_bad_line(tmp_path, capsys):
    body = "".join(json.dumps(sglang_doc(r)) + "\n" for r in range(1, 200)).encode()
    data = gzip.compress(body)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match=r"cut\.jsonl\.gz:\d+: the compressed file is cut short or corrupt"):
        analyze_files([cut])
    res = analyze_files([cut], skip_bad=True)
    assert res.bad_lines == 1 and 0 < res.files[0]["documents"] < 199
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"\x1f\x8b" + b"garbage" * 10)
    assert cli(["analyze", str(bad)]) == 2
    assert "bad.jsonl.gz:1: the compressed file is cut short or corrupt" in capsys.readouterr().err
    assert cli(["export", str(cut), "--chrome"]) == 2
    err = capsys.readouterr().err
    assert "cut.jsonl.gz:" in err and "cut short" in err and "Traceback" not in err
