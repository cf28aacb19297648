"""Hostile input (issue 29 points 1-5, 9's set-up): what a user who means harm, or makes every mistake, gets.

Names never build a path outside out/; a refused run (exit 2) leaves the previous run's files byte for byte as
they were; a failed write (a full disk, a file size limit) ends in exit 3 and one line, with whole JSON lines and
summary.json / run.json saying incomplete; a signal at any moment never leaves a report that says Clean; inputs
are typed and named the same everywhere; a scenario or grid file runs no Python file unasked; ``./dev sh`` execs
its command.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slotscope.cli import main

from helpers import ROOT

TINY = """name = "tiny"
seed = 1
design = "sglang-post-29460"
backends = ["triton"]
[model]
preset = "gpt-oss-20b"
num_layers = 2
[pool]
full_size = 512
[workload]
requests = 2
prompt_len = 40
output_len = 4
"""
B2 = str(ROOT / "scenarios/b2-decode-stale-tail.toml")
SCALE = ROOT / "scenarios/scale.toml"
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def tiny(path: Path, name_line: str | None = None, extra: str = "", design: str | None = None) -> Path:
    text = TINY if name_line is None else TINY.replace('name = "tiny"', name_line)
    if design is not None:
        text = text.replace('design = "sglang-post-29460"', f'design = "{design}"')
    path.write_text(text + extra)
    return path


def files(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` and its bytes (what a refused run must leave exactly as it was)."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file() and not p.is_symlink()}


def err_lines(capsys) -> list[str]:
    return [l for l in capsys.readouterr().err.splitlines() if l.strip()]


@pytest.fixture
def previous(tmp_path) -> Path:
    """A finished run directory (with a report and a trace) that a refused rerun must not touch."""
    out = tmp_path / "prev"
    assert main(["run", str(tiny(tmp_path / "tiny.toml")), "--out", str(out), "-q"]) == 0
    return out


# ------------------------------------------------------------------------- 1. names build paths only inside out/

@pytest.mark.parametrize("name_line, problem", [
    ('name = "/tmp/slotscope-hostile-x"', "must not contain a path separator"),
    ('name = "../../escaped"', "must not contain a path separator"),
    ('name = "a\\\\b"', "must not contain a path separator"),
    ('name = ".."', "must not be '..'"),
    ('name = "."', "must not be '.'"),
    ('name = ""', "must not be empty"),
    ('name = "a\\u0000b"', "must not contain a NUL character"),
    ('name = "line\\nbreak"', "must not contain a control character"),
    ('name = "' + "n" * 256 + '"', "must be at most 255 bytes"),
    ("name = 3", "must be a string"),
])
def test_a_name_that_is_not_one_directory_name_is_refused(tmp_path, monkeypatch, capsys, name_line, problem):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    sc = tiny(work / "s.toml", name_line)
    assert main(["run", str(sc), "-q"]) == 2
    lines = err_lines(capsys)
    assert len(lines) == 1 and f"{sc}: name: " in lines[0] and problem in lines[0], lines
    assert sorted(p.name for p in work.iterdir()) == ["s.toml"]            # no out/ made
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]             # nothing beside it either
    assert not Path("/tmp/slotscope-hostile-x").exists()


def test_a_name_from_the_file_name_that_is_not_one_is_refused_naming_the_field(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    sc = tmp_path / "..toml"                                            # stem "."
    sc.write_text(TINY.replace('name = "tiny"\n', ""))
    assert main(["run", str(sc), "-q"]) == 2
    assert "name: not given, and the file's name gives '.'" in capsys.readouterr().err


def test_a_name_whose_out_directory_links_outside_out_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    victim = tmp_path / "victim"
    assert main(["run", str(tiny(tmp_path / "v.toml")), "--out", str(victim), "-q"]) == 0
    before = files(victim)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "tiny").symlink_to("../victim")
    assert main(["run", str(tmp_path / "v.toml"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "out/tiny: is a link to ../victim, outside out/" in err and "give --out" in err
    assert files(victim) == before


def test_a_library_scenario_object_with_a_path_name_is_confined_too(tmp_path, monkeypatch):
    from dataclasses import replace

    from simulator.scenario import parse_scenario
    from slotscope.rundir import UsageError, confined

    sc = replace(parse_scenario(TINY), name="../../x")       # past the parser: the path check still holds
    with pytest.raises(UsageError, match="must not contain a path separator"):
        confined(tmp_path / "out", sc.name, "name")


@pytest.mark.parametrize("name", ["../x", "", "a/b"])
def test_a_sweep_grid_name_is_one_directory_name(tmp_path, capsys, name):
    grid = tmp_path / "g.toml"
    grid.write_text(f'name = "{name}"\nscenarios = ["{tiny(tmp_path / "t.toml")}"]\ndesigns = ["sglang-post-29460"]\n')
    assert main(["sweep", str(grid), "--local"]) == 2
    assert f"{grid}: name: " in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "out").exists()


def test_links_inside_a_run_directory_are_replaced_never_followed(previous, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    for name in ("summary.json", "steps.jsonl", "report.html.tmp", "faults.jsonl"):
        p = previous / name
        if p.exists():
            p.unlink()
        p.symlink_to(outside)
    assert main(["run", str(tmp_path / "tiny.toml"), "--out", str(previous), "-q", "--inject", "drop_write:1"]) == 1
    assert outside.read_text() == "precious"
    assert not any(p.is_symlink() for p in previous.iterdir())


# ------------------------------------------------------------------------- 2. a refused run destroys nothing

def _refusals(tmp_path: Path) -> dict[str, list[str]]:
    t = str(tmp_path / "tiny.toml")
    (tmp_path / "import_error.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "bad_spec.py").write_text(
        "from simulator.designs import Design\nclass C(Design):\n    name = 'bad-spec'\n"
        "    def backend_spec(self, spec):\n        raise KeyError(spec.name)\n")
    (tmp_path / "int_name.py").write_text("from simulator.designs import Design\nclass C(Design):\n    name = 3\n")
    overlap = tiny(tmp_path / "overlap.toml", extra="[engine]\noverlap = true\n")
    huge = tiny(tmp_path / "huge.toml")
    huge.write_text(huge.read_text().replace("prompt_len = 40", "prompt_len = 2000000000"))
    return {
        "inject-unknown": ["run", t, "--inject", "bogus"],
        "inject-prob-nan": ["run", t, "--inject", "drop_write:nan"],
        "inject-on-overlap": ["run", str(overlap), "--inject", "drop_write"],
        "design-import-error": ["run", t, "--design", f"{tmp_path}/import_error.py:C"],
        "design-backend-spec-raises": ["run", t, "--design", f"{tmp_path}/bad_spec.py:C"],
        "design-name-not-a-string": ["run", t, "--design", f"{tmp_path}/int_name.py:C"],
        "design-unknown": ["run", t, "--design", "no-such-design"],
        "request-no-pool-holds": ["run", str(huge)],
        "engine-option": ["run", t, "--engine", "sglang==0.5.23", "--geometry", "real"],
        "otlp-endpoint": ["run", t, "--otlp-endpoint", "collector:4318x"],
    }


REFUSALS = ("inject-unknown", "inject-prob-nan", "inject-on-overlap", "design-import-error",
            "design-backend-spec-raises", "design-name-not-a-string", "design-unknown", "request-no-pool-holds",
            "engine-option", "otlp-endpoint")


@pytest.mark.parametrize("case", REFUSALS)
def test_a_refused_rerun_leaves_the_previous_run_byte_for_byte(previous, tmp_path, capsys, case):
    argv = _refusals(tmp_path)[case]
    before = files(previous)
    assert main([*argv, "--out", str(previous), "-q"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "slotscope: error:" in err
    assert files(previous) == before
    assert sorted(p.name for p in previous.iterdir()) == sorted(before)    # the lock is gone, nothing added


def test_a_memory_refusal_leaves_the_previous_run(previous, tmp_path, capsys, monkeypatch):
    import slotscope.resources as res

    monkeypatch.delenv(res.SKIP_ENV, raising=False)
    monkeypatch.setattr(res, "host_available", lambda: 1024)
    before = files(previous)
    assert main(["run", str(tmp_path / "tiny.toml"), "--out", str(previous), "-q"]) == 2
    assert "would not fit in memory" in capsys.readouterr().err
    assert files(previous) == before


def test_a_refused_run_into_a_new_directory_leaves_no_directory(tmp_path, capsys):
    new = tmp_path / "new" / "deep" / "dir"
    assert main(["run", str(tiny(tmp_path / "t.toml")), "--design", "no-such", "--out", str(new), "-q"]) == 2
    assert not (tmp_path / "new").exists()
    huge = tiny(tmp_path / "h.toml")
    huge.write_text(huge.read_text().replace("prompt_len = 40", "prompt_len = 2000000000"))
    assert main(["run", str(huge), "--out", str(new), "-q"]) == 2       # refused after the lock was taken
    assert not (tmp_path / "new").exists()


def test_a_crash_in_the_set_up_is_no_refusal_it_clears_and_records_the_failure(previous, monkeypatch, capsys):
    """Not bad input but a failure (exit 3): the previous run's files go, so none of them reads as this run's."""
    import simulator.run as run_mod

    def no_room(*a, **kw):
        raise MemoryError("no room for the pools")

    monkeypatch.setattr(run_mod, "make_run", no_room)
    assert main(["run", str(previous.parent / "tiny.toml"), "--out", str(previous), "-q"]) == 3
    assert "MemoryError: no room for the pools after 0 steps" in capsys.readouterr().err
    assert sorted(p.name for p in previous.iterdir()) == ["run.json", "scenario.toml"]
    run = json.loads((previous / "run.json").read_text())
    assert run["status"] == "incomplete" and run["incomplete"]["steps_done"] == 0


@pytest.mark.parametrize("what", ["directory", "fifo"])
def test_a_run_directory_holding_a_non_file_under_an_output_name_is_refused_untouched(previous, capsys, what):
    p = previous / "findings.jsonl"
    p.unlink()
    if what == "directory":
        p.mkdir()
    else:
        os.mkfifo(p)
    before = files(previous)
    assert main(["run", str(previous.parent / "tiny.toml"), "--out", str(previous), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"findings.jsonl is a {'directory' if what == 'directory' else 'FIFO'}" in err
    assert files(previous) == before


# ------------------------------------------------------------------------- 3. faults while writing

def _full_disk_after(monkeypatch, calls: int, name: str = "steps.jsonl"):
    """The streamed writer hits ENOSPC at its ``calls``-th write to ``name``, having written half of it."""
    from slotscope import outputs

    real = outputs._write_all
    n = {"k": 0}

    def write_all(fd, data):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) == name:
            n["k"] += 1
            if n["k"] >= calls:
                real(fd, data[: len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(outputs, "_write_all", write_all)


def _assert_whole_and_incomplete(out: Path) -> dict:
    for p in out.glob("*.jsonl"):
        text = p.read_text()
        assert text == "" or text.endswith("\n"), f"{p.name} ends mid-line"
        [json.loads(line) for line in text.splitlines()]
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "incomplete"
    if (out / "summary.json").exists():
        assert json.loads((out / "summary.json").read_text())["incomplete"]["reason"] == "error"
    assert not list(out.glob("*.tmp")) and not (out / ".slotscope.lock").exists()
    return run


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names a file descriptor's file through /proc")
def test_a_full_disk_mid_run_is_exit_3_one_line_whole_lines_and_incomplete(tmp_path, monkeypatch, capsys):
    _full_disk_after(monkeypatch, 6)
    out = tmp_path / "o"
    assert main(["run", B2, "--backends", "triton", "--out", str(out), "-q"]) == 3
    lines = err_lines(capsys)
    assert len(lines) == 1, lines
    assert lines[0].startswith("slotscope: error: writing the outputs failed: cannot write ")
    assert "steps.jsonl: No space left on device after 6 steps" in lines[0] and "summary.json says incomplete" in lines[0]
    _assert_whole_and_incomplete(out)
    # the sixth step ran (its findings are counted and streamed); its line is what the full disk lost
    assert len((out / "steps.jsonl").read_text().splitlines()) == 5
    assert json.loads((out / "summary.json").read_text())["incomplete"]["steps_done"] == 6
    monkeypatch.undo()
    assert main(["report", str(out), "-o", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "Clean:" not in page and "Incomplete run" in page and "No space left on device" in page


@pytest.mark.parametrize("name", ["summary.json", "shapes.jsonl", "report.html", "run.json"])
def test_a_full_disk_while_the_last_outputs_are_written_never_leaves_a_clean_claim(tmp_path, monkeypatch, capsys,
                                                                                    name):
    """The run finished; then writing one of its last files fails (and stays failing): nothing says complete."""
    import reports.html as html
    from slotscope import rundir

    real = rundir.write_atomic
    state = {"full": False, "runs": 0}

    def write_atomic(path, text):
        if Path(path).name == name and (name != "run.json" or json.loads(text)["status"] == "complete"):
            state["full"] = True
        if state["full"] and Path(path).name in (name, "summary.json", "run.json"):
            raise rundir.OutputError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, text)

    real_report = html.write_report

    def write_report(run_dir, out=None):
        if name == "report.html":
            state["full"] = True
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_report(run_dir, out)

    for mod in ("slotscope.pipeline", "slotscope.rundir"):
        monkeypatch.setattr(f"{mod}.write_atomic", write_atomic)
    monkeypatch.setattr("slotscope.pipeline.write_json_atomic",
                        lambda p, d: write_atomic(p, json.dumps(d, indent=2) + "\n"))
    monkeypatch.setattr(html, "write_report", write_report)
    out = tmp_path / "o"
    assert main(["run", str(tiny(tmp_path / "t.toml")), "--out", str(out), "-q"]) == 3
    lines = err_lines(capsys)
    assert len(lines) == 1 and "No space left on device" in lines[0] and "Traceback" not in lines[0], lines
    monkeypatch.undo()
    for f in ("summary.json", "run.json"):       # each says incomplete, or is gone: never "complete"
        if (out / f).exists():
            d = json.loads((out / f).read_text())
            assert d.get("status") != "complete" and "incomplete" in d or f == "run.json" and d["status"] == "running"
    assert not (out / "report.html").exists() or "Clean:" not in (out / "report.html").read_text()
    assert main(["report", str(out), "-o", str(tmp_path / "r.html")]) == 0
    assert "Clean:" not in (tmp_path / "r.html").read_text()


def _fsize_limit(kib: int):
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (kib * 1024, kib * 1024))
    return limit


@pytest.mark.parametrize("kib", [4, 64, 1024])
def test_a_file_size_limit_is_exit_3_with_whole_lines(tmp_path, kib):
    """RLIMIT_FSIZE (``ulimit -f``): Python ignores SIGXFSZ, so a write past it fails with EFBIG: the streamed
    files (4, 64 KiB) or the trace (1 MiB, after summary.json was written complete) hit it."""
    out = tmp_path / "o"
    p = subprocess.run([sys.executable, "-m", "slotscope", "run", B2, "--backends", "triton,xpu", "--out", str(out),
                        "-q"], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=600,
                       preexec_fn=_fsize_limit(kib))
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert p.returncode == 3, p.stderr
    assert len(lines) == 1 and "File too large" in lines[0] and "(exit 3)" in lines[0], p.stderr
    run = _assert_whole_and_incomplete(out)
    assert "File too large" in run["incomplete"]["message"]
    rep = subprocess.run([sys.executable, "-m", "slotscope", "report", str(out), "-o", str(tmp_path / "r.html")],
                         capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=600)
    assert rep.returncode == 0 and "Clean:" not in (tmp_path / "r.html").read_text()


# ------------------------------------------------------------------------- 3. signals at every moment

@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_while_the_last_outputs_are_written_marks_the_run_incomplete(tmp_path, monkeypatch, capsys, sig,
                                                                              code):
    """After the last step, with a green report already on disk: summary.json, run.json and the report end red."""
    import reports.html as html

    real = html.write_report
    fired = []

    def write_report(run_dir, out=None):
        path = real(run_dir, out)
        if not fired:
            fired.append(1)
            os.kill(os.getpid(), sig)
            time.sleep(1)                # the handler runs here
        return path

    monkeypatch.setattr(html, "write_report", write_report)
    out = tmp_path / "o"
    assert main(["run", str(tiny(tmp_path / "t.toml")), "--out", str(out), "-q"]) == code
    lines = err_lines(capsys)
    assert len(lines) == 1 and "while the outputs were written" in lines[0], lines
    s = json.loads((out / "summary.json").read_text())
    assert s["incomplete"]["reason"] == signal.Signals(sig).name and s["incomplete"]["steps_done"] == s["steps"]
    assert json.loads((out / "run.json").read_text())["status"] == "incomplete"
    page = (out / "report.html").read_text()
    assert "Clean:" not in page and "Incomplete run" in page
    assert not (out / ".slotscope.lock").exists() and not (out / ".slotscope.reserve").exists()


@pytest.mark.parametrize("sig, code, said", [(signal.SIGTERM, 143, "stopped by SIGTERM"),
                                              (signal.SIGINT, 130, "interrupted")])
def test_a_signal_before_the_run_begins_touches_nothing(previous, tmp_path, sig, code, said):
    slow = tmp_path / "slow.py"
    marker = tmp_path / "importing"
    slow.write_text(f"import pathlib, time\npathlib.Path({str(marker)!r}).touch()\ntime.sleep(60)\n"
                    "from simulator.designs import Design\nclass C(Design):\n    pass\n")
    before = files(previous)
    proc = subprocess.Popen([sys.executable, "-m", "slotscope", "run", str(tmp_path / "tiny.toml"), "--design",
                             f"{slow}:C", "--out", str(previous), "-q"], cwd=ROOT, env=ENV, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert f"{said} before the run began; nothing in {previous}/ was touched" in err
    assert files(previous) == before


# ------------------------------------------------------------------------- 4. typed and named the same everywhere

@pytest.mark.parametrize("body, message", [
    ("class C(Design):\n    name = 3\n", "C.name: must be a string, got int 3"),
    ("class C(Design):\n    name = ''\n", "C.name: must not be empty"),
    ("class C(Design):\n    name = 'two\\nlines'\n", "C.name: must not contain a control character"),
    ("import sys\nsys.exit(4)\n", "failed to import: SystemExit: 4"),
    ("raise RuntimeError('boom at import')\n", "failed to import: RuntimeError: boom at import"),
    ("class C(Design):\n    def __init__(self):\n        raise SystemExit(0)\n", "C() raised SystemExit"),
])
def test_a_bad_user_design_is_exit_2_naming_the_file_and_class(tmp_path, capsys, body, message):
    d = tmp_path / "mine.py"
    d.write_text("from simulator.designs import Design\n" + body)
    assert main(["run", str(tiny(tmp_path / "t.toml")), "--design", f"{d}:C", "--out", str(tmp_path / "o"),
                 "-q"]) == 2
    err = capsys.readouterr().err
    assert str(d) in err and message in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_a_design_file_that_is_a_directory_says_so(tmp_path, capsys):
    (tmp_path / "d.py").mkdir()
    assert main(["run", str(tiny(tmp_path / "t.toml")), "--design", f"{tmp_path / 'd.py'}:C", "-q"]) == 2
    assert "is a directory, not a Python file" in capsys.readouterr().err


def test_a_design_without_a_name_is_named_by_its_file_and_class(tmp_path):
    from simulator.designs.loading import load_design

    d = tmp_path / "mine.py"
    d.write_text("from simulator.designs import Design\nclass C(Design):\n    pass\n")
    assert load_design(f"{d}:C").name == "mine.py:C"


@pytest.mark.parametrize("argv, message", [
    (["run", "{t}", "--out", ""], "--out: must not be empty"),
    (["minimize", "{prev}", "-o", ""], "-o/--output: must not be empty"),
    (["report", "{prev}", "-o", ""], "-o/--output: must not be empty"),
    (["compare", "{prev}", "{prev}", "-o", ""], "-o/--output: must not be empty"),
    (["bugs", "--out", ""], "--out: must not be empty"),
    (["report", "{file}"], "{file}: is a file, not a directory"),
    (["compare", "{prev}", "{file}"], "{file}: is a file, not a directory"),
    (["minimize", "{file}"], "{file}: is a file, not a directory"),
    (["report", "{missing}"], "{missing}: no such run directory"),
    (["run", "{t}", "--out", "{file}"], "--out {file}: is a file, not a directory"),
    (["run", "{t}", "--out", "/dev/null"], "--out /dev/null: is a character device, not a directory"),
    (["run", "{t}", "--out", "{dangling}"], "is a link to nowhere, which does not exist"),
    (["run", "{prev}"], "{prev}: is a directory, not a scenario file"),
    (["sweep", "{prev}", "--local"], "{prev}: is a directory, not a grid file"),
    (["sweep", "{t}", "--num-cpus", "-1"], "--num-cpus: must be >= 1"),
    (["run", "{t}", "--backends", "all,triton"], "'all' stands alone"),
    (["run", "{t}", "--backends", ","], "name at least one backend"),
    (["scenario", "from-log", "{prev}", "--preset", "gpt-oss-20b", "--full-size", "1024"],
     "{prev}: is a directory, not a record file"),
    (["scenario", "from-log", "{file}", "--preset", "gpt-oss-20b", "--full-size", "1024", "-o", "{missing}/x.toml"],
     "its directory {missing} does not exist"),
])
def test_paths_are_checked_and_named_for_what_they_are(previous, tmp_path, capsys, argv, message):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "dangling").symlink_to("nowhere")
    subs = {"t": str(tmp_path / "tiny.toml"), "prev": str(previous), "file": str(tmp_path / "afile"),
            "missing": str(tmp_path / "missing"), "dangling": str(tmp_path / "dangling")}
    argv = [a.format(**subs) for a in argv]
    try:
        rc = main(argv)
    except SystemExit as e:          # argparse's own refusals
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert message.format(**subs) in err and "Traceback" not in err


def test_a_relative_design_in_a_scenario_is_the_one_beside_the_scenario(tmp_path, monkeypatch):
    from simulator.scenario import load_scenario

    (tmp_path / "sc").mkdir()
    (tmp_path / "sc" / "mine.py").write_text("from simulator.designs import Design\nclass C(Design):\n"
                                             "    name = 'beside'\n")
    sc_path = tiny(tmp_path / "sc" / "s.toml", design="mine.py:C")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "mine.py").write_text("raise RuntimeError('the wrong file')\n")
    monkeypatch.chdir(elsewhere)
    assert load_scenario(Path("../sc/s.toml")).design == f"{(tmp_path / 'sc' / 'mine.py')}:C"
    out = tmp_path / "o"
    assert main(["run", "../sc/s.toml", "--allow-design-files", "--out", str(out), "-q"]) == 0
    assert json.loads((out / "summary.json").read_text())["design"] == "beside"


# ------------------------------------------------------------------------- 5. a shared scenario runs no code unasked

PROOF = "import pathlib\npathlib.Path(__file__).with_suffix('.ran').touch()\n" \
        "from simulator.designs import Design\nclass C(Design):\n    name = 'ran'\n"


def test_a_scenario_naming_a_design_file_runs_it_only_when_asked(tmp_path, capsys):
    d = tmp_path / "theirs.py"
    d.write_text(PROOF)
    sc = tiny(tmp_path / "shared.toml", design="theirs.py:C")
    out = tmp_path / "o"
    assert main(["run", str(sc), "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"{sc}: design: names the Python file {d}" in err and "--allow-design-files" in err
    assert not d.with_suffix(".ran").exists() and not out.exists()
    assert main(["run", str(sc), "--out", str(out), "-q", "--allow-design-files"]) == 0
    assert d.with_suffix(".ran").exists()
    d.with_suffix(".ran").unlink()
    # given on the command line, the user asked for it: no flag needed
    assert main(["run", str(tiny(tmp_path / "plain.toml")), "--design", f"{d}:C", "--out", str(out), "-q"]) == 0
    assert d.with_suffix(".ran").exists()


def test_the_library_refuses_a_scenario_files_design_file_unless_allowed(tmp_path):
    from slotscope.pipeline import RunOptions, UsageError, run_scenario

    d = tmp_path / "theirs.py"
    d.write_text(PROOF)
    sc = tiny(tmp_path / "shared.toml", design="theirs.py:C")
    with pytest.raises(UsageError, match="--allow-design-files"):
        run_scenario(sc, None, RunOptions())
    assert not d.with_suffix(".ran").exists()
    assert run_scenario(sc, None, RunOptions(allow_design_files=True)).summary["design"] == "ran"


def test_a_sweep_grid_naming_a_design_file_runs_it_only_when_asked(tmp_path, capsys):
    d = tmp_path / "theirs.py"
    d.write_text(PROOF)
    grid = tmp_path / "g.toml"
    grid.write_text(f'scenarios = ["{tiny(tmp_path / "t.toml")}"]\ndesigns = ["theirs.py:C"]\n')
    assert main(["sweep", str(grid), "--local", "--out", str(tmp_path / "sw")]) == 2
    err = capsys.readouterr().err
    assert f"{grid}: designs[0]: names the Python file {d}" in err and "--allow-design-files" in err
    assert not d.with_suffix(".ran").exists() and not (tmp_path / "sw").exists()
    assert main(["sweep", str(grid), "--local", "--out", str(tmp_path / "sw"), "--allow-design-files", "-q"]) == 0
    assert d.with_suffix(".ran").exists()


# ------------------------------------------------------------------------- ./dev sh

def _fake_venv(tmp_path: Path) -> Path:
    """A venv that ./dev takes as set up: the stamps it computes, and this Python as its python."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + (ROOT / "dev").read_bytes()).hexdigest()[:16]
    for stamp in (".slotscope-setup", ".slotscope-setup-sglang"):
        (venv / stamp).write_text(want + "\n")
    return venv


def test_dev_sh_execs_its_command(tmp_path):
    env = dict(ENV, SLOTSCOPE_VENV=str(_fake_venv(tmp_path)))
    proc = subprocess.Popen([str(ROOT / "dev"), "sh", sys.executable, "-c", "import os; print(os.getpid())"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert int(out.strip()) == proc.pid          # the same process: ./dev became the command
    p = subprocess.run([str(ROOT / "dev"), "sh"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2 and "usage: ./dev sh CMD" in p.stderr


def test_sigterm_to_dev_sh_stops_the_run_and_frees_its_lock(tmp_path):
    env = dict(ENV, SLOTSCOPE_VENV=str(_fake_venv(tmp_path)))
    long_run = tmp_path / "long.toml"
    long_run.write_text(SCALE.read_text().replace("requests = 1000\n", "requests = 20000\n", 1))
    out = tmp_path / "o"
    proc = subprocess.Popen([str(ROOT / "dev"), "sh", sys.executable, "-m", "slotscope", "run", str(long_run),
                             "--backends", "flashinfer", "--out", str(out), "-q"], stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if (out / "steps.jsonl").is_file() and (out / "steps.jsonl").read_text().count("\n") >= 2:
                break
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert json.loads((out / "summary.json").read_text())["incomplete"]["reason"] == "SIGTERM"
    assert not (out / ".slotscope.lock").exists()
