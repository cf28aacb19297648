"""A run's outputs never claim more than the run proved (issue 9, part A).

Incomplete runs (an exception, ^C, SIGTERM, SIGKILL, a --max-steps cut) say so in summary.json,
run.json, the report and compare; signals end with 130 / 143; one run per directory (a PID lock) and
no file of an earlier run beside new ones; scenario.toml is the scenario as run and is written, with
run.json, before the first step; a live export that fails leaves the run's own outputs whole; bad
flags and hostile run directories end in exit 2 naming what is wrong, never in a traceback.

The signal tests run the real console script on scenarios/scale.toml (one backend) and signal it
once steps.jsonl has lines.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simulator.scenario import load_scenario, parse_scenario
from slotscope.cli import main

from helpers import ROOT

B1 = str(ROOT / "scenarios/b1-pcg-dp-padding.toml")
B4 = str(ROOT / "scenarios/b4-draft-extend-window.toml")
B2 = str(ROOT / "scenarios/b2-decode-stale-tail.toml")
SCALE = str(ROOT / "scenarios/scale.toml")
EXE = str(Path(sys.executable).with_name("slotscope"))
RUN_FILES = ("summary.json", "findings.jsonl", "steps.jsonl", "shapes.jsonl", "scenario.toml", "run.json",
             "trace.otlp.jsonl", "report.html")


def run(*args: str) -> int:
    return main(["run", *args, "-q"])


def summary(d: Path) -> dict:
    return json.loads((d / "summary.json").read_text())


def verdict_class(page: str) -> str:
    """The class of the report's verdict banner ("verdict ok" is green)."""
    i = page.index('id="verdict"')
    return page[page.rindex("<div", 0, i):i]


def assert_red(page: str, needle: str = "") -> None:
    assert "Clean:" not in page
    assert "verdict ok" not in verdict_class(page)
    first = page.index("<main>")
    banner = page.index('id="incomplete"')
    assert page.index("<header", first) > banner, "the incomplete banner comes first"
    assert needle in page[banner:page.index("</div>", banner)]


def no_tmp_left(d: Path) -> None:
    assert not [p.name for p in d.rglob("*.tmp")]


def whole_json_lines(path: Path) -> list[dict]:
    text = path.read_text()
    assert text == "" or text.endswith("\n"), f"{path.name} ends mid-line"
    return [json.loads(line) for line in text.splitlines()]


# ------------------------------------------------------------------------------------------ --max-steps

def test_max_steps_cut_is_incomplete_and_red(tmp_path, capsys):
    out = tmp_path / "b4"
    assert run(B4, "--out", str(out), "--backends", "triton,flashinfer", "--max-steps", "60") == 1
    err = capsys.readouterr().err
    assert "INCOMPLETE" in err and "max_steps = 60" in err
    s = summary(out)
    assert s["max_steps"] == 60 and s["steps"] == 60
    assert s["incomplete"] == {"reason": "max_steps", "message": s["incomplete"]["message"], "steps_done": 60,
                               "max_steps": 60}
    assert s["backends"]["triton"]["first_finding"]["step"] == 58 and s["backends"]["flashinfer"]["first_finding"] is None
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["status"] == "incomplete" and run_json["max_steps"] == 60
    page = (out / "report.html").read_text()
    assert_red(page, "max_steps = 60")
    assert "no findings so far (incomplete)" in page        # flashinfer: no green "clean" cell
    assert 'class="tag clean"' not in page
    no_tmp_left(out)


def test_max_steps_cut_without_findings_is_not_clean(tmp_path, capsys):
    out = tmp_path / "fixed"
    rc = run(B2, "--design", "sglang-post-29460", "--backends", "triton", "--out", str(out), "--max-steps", "5",
             "--trace-level", "off")
    assert rc == 5                                          # no findings, but no clean verdict either
    assert "not a clean verdict" in capsys.readouterr().err
    page = (out / "report.html").read_text()
    assert_red(page)
    assert "No verdict: no findings" in page


def test_max_steps_not_reached_is_complete(tmp_path):
    out = tmp_path / "full"
    assert run(B2, "--design", "sglang-post-29460", "--backends", "triton", "--out", str(out),
               "--max-steps", "100000", "--trace-level", "off") == 0
    s = summary(out)
    assert s["max_steps"] == 100000 and "incomplete" not in s
    assert "Clean: on all 1 backend(s)" in (out / "report.html").read_text()


@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_max_steps_below_one_is_bad_input(tmp_path, capsys, value):
    with pytest.raises(SystemExit) as e:
        run(B1, "--out", str(tmp_path / "o"), "--max-steps", value)
    assert e.value.code == 2
    assert "--max-steps" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_max_steps_below_one_in_the_library_is_a_usage_error(tmp_path):
    from slotscope.pipeline import RunOptions, UsageError, run_scenario

    with pytest.raises(UsageError, match="--max-steps"):
        run_scenario(B1, tmp_path / "o", RunOptions(max_steps=0))


@pytest.mark.parametrize("value", ["-1", str(2**63), "1e3", "seven"])
def test_seed_outside_range_is_bad_input(tmp_path, capsys, value):
    with pytest.raises(SystemExit) as e:
        run(B1, "--out", str(tmp_path / "o"), "--seed", value)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--seed" in err and "Traceback" not in err


def test_largest_seed_is_accepted(tmp_path):
    out = tmp_path / "o"
    assert run(B1, "--out", str(out), "--seed", str(2**63 - 1), "--max-steps", "1", "--backends", "triton",
               "--no-report", "--trace-level", "off") in (1, 5)
    assert summary(out)["seed"] == 2**63 - 1


# ------------------------------------------------------------------------------------------ exceptions

RAISING_DESIGN = '''
from simulator.designs import Design

class RaiseAtStep(Design):
    name = "raise-at-step"
    calls = 0

    def make_write_loc(self, loc, swa_loc, ctx):
        RaiseAtStep.calls += 1
        if RaiseAtStep.calls > 600:          # a few steps in (36 layers x 2 backends a step)
            raise IndexError("my fix indexes past the batch")
        return super().make_write_loc(loc, swa_loc, ctx)


class ExitZero(Design):
    name = "exit-zero"
    calls = 0

    def make_write_loc(self, loc, swa_loc, ctx):
        ExitZero.calls += 1
        if ExitZero.calls > 300:
            raise SystemExit(0)
        return super().make_write_loc(loc, swa_loc, ctx)
'''


@pytest.mark.parametrize("cls", ["RaiseAtStep", "ExitZero"])
def test_a_design_that_raises_never_gets_a_green_report(tmp_path, capsys, cls):
    design = tmp_path / "raising.py"
    design.write_text(RAISING_DESIGN)
    out = tmp_path / "o"
    rc = run(B2, "--design", f"{design}:{cls}", "--backends", "triton,aiter", "--out", str(out))
    err = capsys.readouterr().err
    assert rc in (1, 3), err                 # 3: the run stopped; 1: the error became design_error findings
    page = (out / "report.html").read_text()
    assert "Clean:" not in page and "verdict ok" not in verdict_class(page)
    s = summary(out)
    if rc == 3:
        assert s["incomplete"]["reason"] == "error" and s["incomplete"]["steps_done"] >= 2
        assert "partial outputs" in err
        assert_red(page, "the run failed")
        assert json.loads((out / "run.json").read_text())["status"] == "incomplete"
    else:
        assert s["findings_total"] > 0


class _FailingObserver:
    """slotscope itself failing mid-run (an observer is slotscope code)."""

    def on_run_start(self, run):
        pass

    def on_boundary(self, *args):
        pass

    def on_findings(self, findings):
        pass

    def on_step(self, step):
        if step.step >= 3:
            raise RuntimeError("a bug in slotscope")

    def on_run_end(self):
        pass


def test_an_exception_in_slotscope_leaves_a_red_report_and_provenance(tmp_path):
    from slotscope.pipeline import RunOptions, run_scenario

    out = tmp_path / "o"
    with pytest.raises(RuntimeError, match="a bug in slotscope") as e:
        run_scenario(B2, out, RunOptions(design="sglang-post-29460", backends=("triton",), device="cpu",
                                         extra_observers=(_FailingObserver(),)))
    assert e.value.partial_outputs["reason"] == "error"
    s = summary(out)
    assert s["incomplete"]["error"] == "RuntimeError: a bug in slotscope"
    assert_red((out / "report.html").read_text(), "a bug in slotscope")
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["status"] == "incomplete" and run_json["layers"]
    # export works on the partial trace; the lock is gone
    assert main(["export", str(out), "--chrome"]) == 0
    assert not (out / ".slotscope.lock").exists()
    no_tmp_left(out)


# ------------------------------------------------------------------------------------------ provenance

class _SeesProvenance:
    """Checks, at the first step, that scenario.toml and run.json are already on disk."""

    def __init__(self, out: Path):
        self.out, self.seen = out, None

    def on_run_start(self, run):
        pass

    def on_boundary(self, *args):
        pass

    def on_findings(self, findings):
        pass

    def on_step(self, step):
        if self.seen is None:
            self.seen = {n: (self.out / n).read_text() for n in ("scenario.toml", "run.json")}

    def on_run_end(self):
        pass


def test_scenario_toml_is_the_scenario_as_run_and_comes_first(tmp_path):
    from slotscope.pipeline import RunOptions, run_scenario

    out = tmp_path / "o"
    seen = _SeesProvenance(out)
    run_scenario(B1, out, RunOptions(design="sglang-post-29460", backends=("triton", "musa"), seed=12345,
                                     max_steps=4, device="cpu", trace_level="off", report=False,
                                     extra_observers=(seen,)))
    assert seen.seen is not None
    early = json.loads(seen.seen["run.json"])
    assert early["status"] == "running" and early["design"] == "sglang-post-29460" and early["layers"]
    sc = parse_scenario((out / "scenario.toml").read_text(), "scenario.toml")
    assert (sc.design, sc.seed, sc.backends, sc.max_steps) == ("sglang-post-29460", 12345, ("triton", "musa"), 4)
    original = load_scenario(B1)
    assert sc.model == original.model and sc.workload == original.workload and sc.engine == original.engine
    assert seen.seen["scenario.toml"] == (out / "scenario.toml").read_text()
    assert json.loads((out / "run.json").read_text())["status"] == "incomplete"


def test_overrides_from_the_command_line_reach_scenario_toml(tmp_path):
    out = tmp_path / "o"
    assert run(B1, "--design", "kvwriteloc-strict", "--seed", "77", "--backends", "aiter", "--max-steps", "2",
               "--out", str(out), "--no-report", "--trace-level", "off") == 5
    sc = parse_scenario((out / "scenario.toml").read_text(), "scenario.toml")
    assert (sc.design, sc.seed, sc.backends, sc.max_steps) == ("kvwriteloc-strict", 77, ("aiter",), 2)


# ------------------------------------------------------------------------------------------ the directory

def test_rerun_removes_every_file_of_the_previous_run(tmp_path):
    out = tmp_path / "o"
    assert run(B1, "--out", str(out), "--backends", "flashinfer", "--max-steps", "2") == 1
    assert main(["export", str(out), "--chrome"]) == 0
    for name in RUN_FILES + ("trace.chrome.json",):
        assert (out / name).is_file(), name
    (out / "minimal.toml").write_text("stale")
    (out / "report.html.tmp").write_text("stale")
    (out / "notes.txt").write_text("mine")
    assert run(B1, "--out", str(out), "--backends", "triton", "--design", "sglang-post-29460", "--max-steps", "2",
               "--no-report", "--trace-level", "off") == 5
    left = sorted(p.name for p in out.iterdir())
    assert left == sorted(["findings.jsonl", "notes.txt", "run.json", "scenario.toml", "shapes.jsonl",
                           "steps.jsonl", "summary.json"])
    assert (out / "notes.txt").read_text() == "mine"
    assert summary(out)["backends"].keys() == {"triton"}


def test_a_directory_that_is_not_a_run_is_refused_untouched(tmp_path, capsys):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "thesis.tex").write_text("precious")
    assert run(B1, "--out", str(d), "--max-steps", "1") == 2
    err = capsys.readouterr().err
    assert str(d) in err and "not a slotscope run directory" in err
    assert [p.name for p in d.iterdir()] == ["thesis.tex"]


def test_out_that_is_a_file_or_unusable_is_bad_input(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert run(B1, "--out", str(f), "--max-steps", "1") == 2
    err = capsys.readouterr().err
    assert f"--out {f}: is a file" in err and "Traceback" not in err
    assert run(B1, "--out", str(f / "sub"), "--max-steps", "1") == 2
    assert f"--out {f / 'sub'}" in capsys.readouterr().err


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory this process cannot write: chmod 555 for a normal user; for root (which ignores
    modes) a read-only tmpfs, where mounting is allowed."""
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() != 0:
        d.chmod(0o555)
        yield d
        d.chmod(0o755)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(d)],
                      capture_output=True).returncode != 0:
        pytest.skip("running as root and cannot mount a read-only tmpfs")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], capture_output=True)


def test_out_and_o_that_are_not_writable_are_bad_input(read_only_dir, small_run, capsys):
    assert run(B1, "--out", str(read_only_dir), "--max-steps", "1") == 2
    err = capsys.readouterr().err
    assert f"--out {read_only_dir}: not writable" in err and "Traceback" not in err
    assert run(B1, "--out", str(read_only_dir / "sub"), "--max-steps", "1") == 2
    assert f"--out {read_only_dir / 'sub'}: cannot create the directory" in capsys.readouterr().err
    target = read_only_dir / "r.html"
    assert main(["report", str(small_run), "-o", str(target)]) == 2
    assert f"{target}: cannot write" in capsys.readouterr().err
    assert list(read_only_dir.iterdir()) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_out_that_cannot_be_created_is_bad_input(capsys):
    target = "/proc/self/slotscope-out"           # not writable even for root
    assert run(B1, "--out", target, "--max-steps", "1") == 2
    err = capsys.readouterr().err
    assert f"--out {target}" in err and "Traceback" not in err


def test_a_second_run_into_a_locked_directory_is_refused_naming_the_holder(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    holder = subprocess.Popen(["sleep", "30"])
    try:
        (out / ".slotscope.lock").write_text(f"{holder.pid}\n")
        (out / "summary.json").write_text("{}")
        assert run(B1, "--out", str(out), "--max-steps", "1") == 2
        err = capsys.readouterr().err
        assert f"PID {holder.pid}" in err and str(out) in err
        assert (out / "summary.json").read_text() == "{}"     # nothing of the holder's run was touched
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: its lock is stale and is taken over
    assert run(B1, "--out", str(out), "--max-steps", "1", "--backends", "triton", "--no-report",
               "--trace-level", "off") in (1, 5)
    assert not (out / ".slotscope.lock").exists()


def test_a_lock_with_this_process_pid_is_a_dead_runs_and_is_taken_over(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / ".slotscope.lock").write_text(f"{os.getpid()}\n")     # e.g. a killed run in a container
    assert run(B1, "--out", str(out), "--max-steps", "1", "--backends", "triton", "--no-report",
               "--trace-level", "off") in (1, 5)


# ------------------------------------------------------------------------------------------ signals

def _start(out: Path, *extra: str) -> subprocess.Popen:
    # a run far longer than what the test does while it runs (the scale scenario alone now ends in seconds,
    # before a second run and a live report have started): twenty times the scale scenario's requests
    long_run = out.parent / "long-scale.toml"
    text = Path(SCALE).read_text()
    assert "requests = 1000\n" in text
    long_run.write_text(text.replace("requests = 1000\n", "requests = 20000\n", 1))
    return subprocess.Popen([EXE, "run", str(long_run), "--backends", "flashinfer", "--out", str(out), "-q", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_steps(proc: subprocess.Popen, out: Path, n: int = 2, timeout: float = 240) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        p = out / "steps.jsonl"
        if p.is_file() and p.read_text().count("\n") >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early ({proc.returncode}): {proc.stderr.read()}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("no steps in time")


def _communicate_or_explain(proc: subprocess.Popen, timeout: float = 240) -> str:
    """The run's stderr once it has stopped; if it does not stop in time, a failure that shows where it is:
    its signal state (/proc) and every thread's Python stack (slotscope's SIGUSR1 dump)."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        status = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
        state = [l for l in status if l.startswith(("State", "Threads", "Sig", "ShdPnd"))]
        proc.send_signal(signal.SIGUSR1)
        time.sleep(3)
        proc.kill()
        _, err = proc.communicate(timeout=60)
        raise AssertionError(f"the run did not stop {timeout} s after the signal; {state}; stderr:\n{err}")


@pytest.mark.parametrize("sig, code, name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "SIGINT")])
def test_a_signal_stops_the_run_with_partial_outputs_and_a_red_report(tmp_path, sig, code, name):
    out = tmp_path / "o"
    proc = _start(out)
    try:
        _wait_for_steps(proc, out)
        if sig == signal.SIGTERM:          # while it runs, a second run into the directory is refused
            second = subprocess.run([EXE, "run", B1, "--out", str(out), "-q"], capture_output=True, text=True,
                                    timeout=120)
            assert second.returncode == 2
            assert f"PID {proc.pid}" in second.stderr and "Traceback" not in second.stderr
            # and a report of the run in progress says that it is in progress
            live = subprocess.run([EXE, "report", str(out), "-o", str(tmp_path / "live.html")],
                                  capture_output=True, text=True, timeout=240)
            assert live.returncode == 0, live.stderr
            assert f"the run is still in progress (PID {proc.pid})" in (tmp_path / "live.html").read_text()
        proc.send_signal(sig)
        err = _communicate_or_explain(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and name.replace("SIGINT", "interrupted") in lines[0] and "partial outputs" in lines[0], err
    s = summary(out)
    assert s["incomplete"]["reason"] == name
    steps = whole_json_lines(out / "steps.jsonl")
    assert len(steps) == s["incomplete"]["steps_done"] == s["steps"] >= 2
    assert [x["step"] for x in steps] == list(range(len(steps)))      # each step once, in order
    whole_json_lines(out / "findings.jsonl")
    assert_red((out / "report.html").read_text(), name if sig == signal.SIGTERM else "interrupted")
    assert json.loads((out / "run.json").read_text())["status"] == "incomplete"
    assert not (out / ".slotscope.lock").exists()
    no_tmp_left(out)


def test_sigusr1_prints_where_the_run_is_and_it_goes_on(tmp_path):
    out = tmp_path / "o"
    proc = _start(out)
    try:
        _wait_for_steps(proc, out)
        proc.send_signal(signal.SIGUSR1)
        n = len(whole_json_lines(out / "steps.jsonl"))
        _wait_for_steps(proc, out, n=n + 2)             # still running
        proc.send_signal(signal.SIGTERM)
        err = _communicate_or_explain(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "most recent call first" in err and "simulator/run.py" in err, err
    assert "terminated" in err.splitlines()[-1] or "SIGTERM" in err.splitlines()[-1], err


def test_after_sigkill_the_streamed_files_are_whole_and_report_still_works(tmp_path):
    out = tmp_path / "o"
    proc = _start(out)
    try:
        _wait_for_steps(proc, out, n=3)
        proc.kill()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (out / "summary.json").exists()
    n = len(whole_json_lines(out / "steps.jsonl"))
    whole_json_lines(out / "findings.jsonl")
    assert (out / "run.json").is_file() and (out / "scenario.toml").is_file()
    rep = subprocess.run([EXE, "report", str(out)], capture_output=True, text=True, timeout=240)
    assert rep.returncode == 0, rep.stderr
    assert "the run did not finish" in rep.stderr and "not a clean verdict" in rep.stderr
    page = (out / "report.html").read_text()
    assert_red(page, "the run did not finish")
    assert "built from the streamed files" in page and f"{n} step(s) done" in page
    assert (out / ".slotscope.lock").read_text().split()[0] == str(proc.pid)   # the dead run's lock stays
    mini = subprocess.run([EXE, "minimize", str(out)], capture_output=True, text=True, timeout=240)
    assert mini.returncode == 2 and "summary.json" in mini.stderr and "Traceback" not in mini.stderr
    # ... and is taken over by the next run, which clears the killed run's files
    assert run(B1, "--out", str(out), "--max-steps", "1", "--backends", "triton", "--no-report",
               "--trace-level", "off") in (1, 5)
    assert summary(out)["scenario"] == "b1-pcg-dp-padding"
    assert not (out / "report.html").exists()


# ------------------------------------------------------------------------------------------ live export

def test_unreachable_live_endpoint_keeps_every_output_and_says_so_once(tmp_path):
    out = tmp_path / "o"
    env = dict(os.environ, OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="1")
    p = subprocess.run([EXE, "run", B1, "--design", "sglang-post-29460", "--backends", "triton", "--out", str(out),
                        "-q", "--otlp-endpoint", "http://127.0.0.1:9/"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 4, p.stderr
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, p.stderr
    assert "live export to http://127.0.0.1:9/ failed" in lines[0] and "(exit 4)" in lines[0]
    for name in RUN_FILES:
        assert (out / name).is_file(), name
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["status"] == "complete" and "127.0.0.1:9" in run_json["live_export_error"]
    assert (out / "trace.otlp.jsonl").read_text().count("\n") > 0
    no_tmp_left(out)


def test_a_malformed_endpoint_is_bad_input(tmp_path, capsys):
    assert run(B1, "--out", str(tmp_path / "o"), "--otlp-endpoint", "collector:4318x", "--max-steps", "1") == 2
    assert "--otlp-endpoint" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ report / compare

@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "b1"
    assert main(["run", B1, "--out", str(out), "--backends", "flashinfer,trtllm_mha", "--max-steps", "2", "-q",
                 "--no-report", "--trace-level", "off"]) == 1
    return out


def test_report_and_compare_refuse_a_directory_as_output(small_run, tmp_path, capsys):
    d = tmp_path / "adir"
    d.mkdir()
    assert main(["report", str(small_run), "-o", str(d)]) == 2
    assert f"-o {d}: is a directory" in capsys.readouterr().err
    assert main(["compare", str(small_run), str(small_run), "-o", str(d)]) == 2
    assert f"-o {d}: is a directory" in capsys.readouterr().err
    assert list(d.iterdir()) == []
    no_tmp_left(tmp_path)
    no_tmp_left(small_run)


def test_report_to_an_unwritable_place_is_bad_input_and_leaves_no_tmp(small_run, tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["report", str(small_run), "-o", str(f / "r.html")]) == 2
    assert str(f / "r.html") in capsys.readouterr().err
    no_tmp_left(tmp_path)


def test_compare_says_which_run_is_incomplete(small_run, tmp_path, capsys):
    full = tmp_path / "full"
    assert run(B1, "--design", "sglang-post-29460", "--backends", "flashinfer,trtllm_mha", "--out", str(full),
               "--no-report", "--trace-level", "off") == 0
    capsys.readouterr()
    assert main(["compare", str(full), str(small_run), "-o", str(tmp_path / "c.html")]) == 0
    notes = [l for l in capsys.readouterr().err.splitlines() if "not a clean verdict" in l]
    assert len(notes) == 1 and str(small_run) in notes[0] and "max_steps = 2" in notes[0]
    page = (tmp_path / "c.html").read_text()
    assert 'id="incomplete-B"' in page and 'id="incomplete-A"' not in page
    assert page.index('id="incomplete-B"') < page.index("<header")
    assert 'tag incomplete">incomplete' in page


def _copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        if p.is_file():
            (dst / p.name).write_bytes(p.read_bytes())
    return dst


@pytest.mark.parametrize("name, make, needle", [
    ("summary.json", lambda: "[" * 100_000 + "]" * 100_000, "summary.json:1: JSON nested too deeply"),
    ("findings.jsonl", lambda: '{"step": 1, "layer": 0}\n{"a": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
     "findings.jsonl:2: JSON nested too deeply"),
    ("steps.jsonl", lambda: '{"step": 1e999}\n', "steps.jsonl:1: field 'step': expected a finite number"),
    ("steps.jsonl", lambda: '{"step": 99999999999999999999999}\n', "steps.jsonl:1: field 'step': number out of range"),
    ("summary.json", lambda: '{"backends": {"x": {"writes": ' + "9" * 5000 + "}}}", "summary.json: not readable JSON"),
])
def test_hostile_json_in_a_run_dir_is_bad_input_naming_file_and_line(small_run, tmp_path, capsys, name, make, needle):
    d = _copy_run(small_run, tmp_path / "bad")
    (d / name).write_text(make())
    assert main(["report", str(d)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    no_tmp_left(d)


@pytest.mark.parametrize("name, needle", [
    ("findings.jsonl", "findings.jsonl:1: line longer than 16 MiB"),
    ("summary.json", "summary.json: 3,072 MiB, larger than 64 MiB"),
])
def test_a_multi_gigabyte_line_is_bad_input(small_run, tmp_path, capsys, name, needle):
    d = _copy_run(small_run, tmp_path / "huge")
    with open(d / name, "wb") as f:            # a 3 GiB file of one line, sparse: no disk, no memory
        f.truncate(3 * 2**30)
    t0 = time.monotonic()
    assert main(["report", str(d)]) == 2
    assert needle in capsys.readouterr().err
    assert time.monotonic() - t0 < 60


def test_a_line_cut_off_by_a_kill_is_left_out_with_a_note(small_run, tmp_path):
    d = _copy_run(small_run, tmp_path / "cut")
    text = (d / "findings.jsonl").read_text()
    (d / "findings.jsonl").write_text(text + '{"step": 2, "backend": "flashinfer", "lay')
    assert main(["report", str(d)]) == 0
    page = (d / "report.html").read_text()
    assert "its last line was cut off" in page


def test_not_a_run_directory_is_still_refused(tmp_path, capsys):
    d = tmp_path / "empty"
    d.mkdir()
    (d / "notes.txt").write_text("x")
    assert main(["report", str(d)]) == 2
    assert "not a slotscope run directory" in capsys.readouterr().err


def test_either_file_saying_incomplete_is_enough(small_run, tmp_path):
    """A summary.json edited (or written by an older tool) without its "incomplete" entry still gets the red
    banner when run.json says the run did not finish."""
    d = _copy_run(small_run, tmp_path / "edited")
    s = summary(d)
    del s["incomplete"]
    (d / "summary.json").write_text(json.dumps(s))
    assert main(["report", str(d)]) == 0
    assert_red((d / "report.html").read_text(), "max_steps = 2")


def test_a_users_own_run_json_does_not_make_a_run_directory(tmp_path, capsys):
    d = tmp_path / "theirs"
    d.mkdir()
    (d / "run.json").write_text('{"experiment": 4}')
    (d / "summary.json").write_text("my notes")
    assert run(B1, "--out", str(d), "--max-steps", "1") == 2
    assert "not a slotscope run directory" in capsys.readouterr().err
    assert (d / "run.json").read_text() == '{"experiment": 4}' and (d / "summary.json").read_text() == "my notes"
