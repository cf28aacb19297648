"""slotscope sweep: grid validation names the field, --local and a local Ray run the same points, results are
cached by scenario hash, a dying worker is retried once and reported, ^C keeps finished points and the report."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simulator.scenario import ScenarioError
from slotscope.cli import main
from slotscope.sweep import load_grid, plan, point_scenario, points, sweep

from helpers import ROOT

GAP = ROOT / "scenarios" / "gap-swa-shorter.toml"

#: a design whose worker dies at its first forward (os._exit), counting its attempts beside the file
DYING = '''
import os
import re
from pathlib import Path
from simulator.designs import Design

class Dying(Design):
    name = "dying"

    def translate(self, out_cache_loc, full_to_swa, ctx):
        with open(Path(__file__).with_suffix(".attempts"), "a") as f:
            f.write(f"{os.getpid()}\\n")
        os._exit(1)
'''


def links(html: str) -> set[str]:
    return set(re.findall(r'href="(points/[0-9a-f]{16}/run/report.html)"', html))


def grid_file(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "grid.toml"
    p.write_text(body)
    return p


def small_grid(tmp_path: Path, designs: str = '"sglang-post-29460", "kvwriteloc-strict"', extra: str = "") -> Path:
    return grid_file(tmp_path, f'name = "t"\nscenarios = ["{GAP}"]\ndesigns = [{designs}]\nbackends = ["flashinfer"]\n'
                               f'max_steps = 50\n{extra}')


@pytest.mark.parametrize("body, field", [
    ('scenarios = ["{gap}"]\ndesigns = ["kvwriteloc-strict"]\nbogus = 1\n', "bogus: unknown key"),
    ('scenarios = ["{gap}"]\ndesigns = ["kvwriteloc-strict"]\nbackends = ["cuda"]\n', "backends[0]"),
    ('scenarios = ["{gap}"]\ndesigns = ["no-such"]\n', "designs[0]"),
    ('scenarios = ["{gap}"]\n', "designs: the grid needs at least one design"),
    ('designs = ["kvwriteloc-strict"]\n', "scenarios: the grid needs at least one scenario"),
    ('scenarios = ["missing.toml"]\ndesigns = ["kvwriteloc-strict"]\n', "scenarios[0]"),
    ('scenarios = ["{gap}"]\ndesigns = ["kvwriteloc-strict"]\ndp_sizes = [0]\n', "dp_sizes[0]: must be >= 1"),
    ('scenarios = ["{gap}"]\ndesigns = ["kvwriteloc-strict"]\nseeds = "1"\n', "seeds: must be a list"),
    ('scenarios = ["{gap}"]\ndesigns = ["kvwriteloc-strict"]\ndevice = "tpu"\n', "device: 'tpu' is not allowed"),
    ('presets = ["gpt-5"]\ndesigns = ["kvwriteloc-strict"]\n', "presets[0]"),
    ('scenarios = ["{gap}"]\ndesigns = ["kvwriteloc-strict"]\npage_sizes = [16, 16]\n', "page_sizes: names a value twice"),
])
def test_grid_errors_name_the_field(tmp_path, body, field):
    p = grid_file(tmp_path, body.format(gap=GAP))
    with pytest.raises(ScenarioError) as e:
        load_grid(p)
    assert str(e.value).startswith(f"{p}: ")
    assert field in str(e.value)


def test_the_grid_is_the_product_and_overrides_are_validated(tmp_path):
    g = load_grid(small_grid(tmp_path, extra="dp_sizes = [1, 2]\npage_sizes = [1, 16]\nseeds = [5]\n"))
    ps = points(g)
    assert len(ps) == 2 * 1 * 2 * 2 * 1
    sc = point_scenario(g, next(p for p in ps if p.page_size == 16 and p.dp_size == 2))
    assert (sc.pool.page_size, sc.pool.full_size % 16, sc.engine.dp_size, sc.seed) == (16, 0, 2, 5)
    assert sc.backends == ("flashinfer",) and sc.max_steps == 50
    hashes = {point_scenario(g, p).hash for p in ps}
    assert len(hashes) == len(ps)
    presets = load_grid(grid_file(tmp_path, 'presets = ["llama4", "gemma4-31b"]\ndesigns = ["kvwriteloc-strict"]\n'))
    scs = [point_scenario(presets, p) for p in points(presets)]
    assert [s.model.preset for s in scs] == ["llama4", "gemma4-31b"]
    assert all(s.model.num_layers == 16 for s in scs)        # smoke.toml's 16 layers


def test_engine_option_runs_every_point_with_that_engine(tmp_path):
    """--engine SPEC (slotscope/options.py): one row, the engine's, in place of the grid's designs and engines;
    those are still checked, and a grid may then name none. The grid's own engines entries name the field."""
    from engine_path.releases import EngineSpec

    g = load_grid(small_grid(tmp_path, extra="seeds = [1, 2]\n"), engine=EngineSpec("sglang", "0.5.23"))
    assert g.runners == (("engine", "sglang==0.5.23"),)
    scs = [point_scenario(g, p) for p in points(g)]
    assert len(scs) == 2 and {s.engine_release for s in scs} == {"sglang==0.5.23"}
    bare = grid_file(tmp_path, f'scenarios = ["{GAP}"]\n')
    assert load_grid(bare, engine=EngineSpec("sglang")).runners == (("engine", "sglang"),)
    with pytest.raises(ScenarioError, match="designs\\[0\\]"):
        load_grid(grid_file(tmp_path, f'scenarios = ["{GAP}"]\ndesigns = ["no-such"]\n'), engine=EngineSpec())
    bad = grid_file(tmp_path, f'scenarios = ["{GAP}"]\nengines = ["trtllm"]\n')
    with pytest.raises(ScenarioError) as e:
        load_grid(bad)
    assert str(e.value).startswith(f"{bad}: engines[0]: 'trtllm': unknown engine 'trtllm'")
    assert str(e.value).count("engines[0]") == 1


def test_local_sweep_caches_by_scenario_hash(tmp_path):
    g = load_grid(small_grid(tmp_path))
    out = tmp_path / "out"
    records, invalid, interrupted = sweep(g, out, local=True)
    assert not invalid and not interrupted
    by = {p.row: r for p, r in records.items()}
    assert by["sglang-post-29460"]["status"] == "findings"
    assert by["sglang-post-29460"]["classes"] == ["length_mismatch"]
    assert by["kvwriteloc-strict"]["status"] == "clean"
    for r in records.values():
        d = out / "points" / r["hash"]
        assert json.loads((d / "point.json").read_text())["status"] == r["status"]
        assert (d / "run" / "summary.json").exists() and (d / "run" / "report.html").exists()
    todo, done, _ = plan(g, out / "points")
    assert todo == [] and len(done) == 2                       # a rerun runs nothing
    grown = load_grid(small_grid(tmp_path, extra="seeds = [1, 2]\n"))
    todo, done, _ = plan(grown, out / "points")
    assert len(todo) + len(done) == 4 and len(todo) >= 2


def test_cli_local_writes_the_comparison_report(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["sweep", str(small_grid(tmp_path)), "--local", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    html = (out / "report.html").read_text()
    assert "sglang-post-29460" in html and "kvwriteloc-strict" in html
    assert "length_mismatch" in html and "First divergence" in html
    assert len(links(html)) == 2                                 # each point's own report
    capsys.readouterr()
    assert main(argv) == 0
    assert "2 cached, 0 to run" in capsys.readouterr().err


def test_ray_missing_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)                # `import ray` fails as if not installed
    assert main(["sweep", str(small_grid(tmp_path)), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "slotscope[sweep]" in err and "--local" in err
    assert not (tmp_path / "o").exists()


def test_interrupt_keeps_finished_points_and_writes_the_report(tmp_path):
    g = small_grid(tmp_path, extra="seeds = [1, 2, 3, 4, 5, 6]\n")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "slotscope", "sweep", str(g), "--local", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    deadline = time.time() + 240
    while time.time() < deadline and len(list(out.glob("points/*/point.json"))) < 1:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    finished = [json.loads(f.read_text()) for f in out.glob("points/*/point.json")]
    assert 1 <= len(finished) < 12
    html = (out / "report.html").read_text()
    assert "Interrupted sweep" in html
    assert len(links(html)) == len(finished)


ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    from slotscope.sweep import init_ray

    init_ray(num_cpus=2)
    yield
    ray.shutdown()


def test_ray_runs_points_and_reports_a_dying_worker_after_one_retry(tmp_path, local_ray):
    design = tmp_path / "dying.py"
    design.write_text(DYING)
    g = load_grid(small_grid(tmp_path, designs=f'"sglang-post-29460", "kvwriteloc-strict", "{design}:Dying"'),
                  allow_design_files=True)
    out = tmp_path / "out"
    records, invalid, interrupted = sweep(g, out)
    by = {p.row.split("/")[-1]: r for p, r in records.items()}
    assert by["sglang-post-29460"]["status"] == "findings"
    assert by["kvwriteloc-strict"]["status"] == "clean"
    dying = by[f"dying.py:Dying"]
    assert dying["status"] == "worker_died"
    attempts = design.with_suffix(".attempts").read_text().split()
    assert len(attempts) == 2 and attempts[0] != attempts[1]     # the first try and one retry, in two workers
    pids = {by["sglang-post-29460"]["pid"], by["kvwriteloc-strict"]["pid"]}
    assert os.getpid() not in pids
    for r in records.values():                                     # every point written, the dead one too
        assert json.loads((out / "points" / r["hash"] / "point.json").read_text())["status"] == r["status"]
    todo, done, _ = plan(g, out / "points")
    assert [t.scenario.design.endswith("dying.py:Dying") for t in todo] == [True]   # only the dead one runs again


@pytest.mark.engine
@pytest.mark.vllm
def test_a_grid_of_both_engines_and_two_releases_runs_each_point_under_its_own(tmp_path, engine_releases,
                                                                                   vllm_release):
    """One process imports one release of one engine: a --local sweep over sglang 0.5.14, 0.5.23 and vLLM 0.34.0
    runs the first in-process and each other in a process of its own (engine_path.isolate), every point as if
    alone; --engine takes a vLLM spec."""
    ser = ROOT / "scenarios" / "sched-evict-retract.toml"
    g = grid_file(tmp_path, f'scenarios = ["{ser}"]\nengines = ["sglang==0.5.14", "sglang==0.5.23", "vllm==0.34.0"]\n'
                            f'max_steps = 12\n')
    code = subprocess.run([sys.executable, "-m", "slotscope", "sweep", str(g), "--local", "--out",
                           str(tmp_path / "out"), "-q"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert code.returncode == 0, code.stdout + code.stderr
    recs = {r["engine"]: r for r in (json.loads(p.read_text())
                                     for p in (tmp_path / "out" / "points").glob("*/point.json"))}
    assert {e: (r["status"], r["steps"]) for e, r in recs.items()} == {
        "sglang==0.5.14": ("incomplete", 12), "sglang==0.5.23": ("incomplete", 12), "vllm==0.34.0": ("incomplete", 12)}
    # the first point's process is the sweep's own; the others' are their own
    assert recs["sglang==0.5.14"]["pid"] != recs["sglang==0.5.23"]["pid"] != recs["vllm==0.34.0"]["pid"]
    from engine_path.releases import EngineSpec

    assert load_grid(g, engine=EngineSpec("vllm", "0.34.0")).runners == (("engine", "vllm==0.34.0"),)
