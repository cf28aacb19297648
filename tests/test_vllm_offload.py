"""An offload tier behind vLLM's prefix cache (``engine.kv_offload``, engine_path/vllm/connector.py).

The tier is slotscope's KV connector on vLLM's scheduler side: it saves a finished request's computed blocks by the
release's block hashes and answers ``get_num_new_matched_tokens`` from them; the release's scheduler and KV-cache
manager take its hits (``allocate_new_computed_blocks``), and the step source turns each schedule's loads into the
forward's transfer. scenarios/vllm-offload-turns.toml is V5's scenario: clean on 0.34.0, its reads of the system
prompt overwritten with #44409's two-phase allocation reverted; scenarios/vllm-async-offload.toml is V6's (async
scheduling and async loads: a block freed on the optimistic count while read, #47728 reverted). No model has a tier:
other runs refuse the field.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import slotscope_cli
from simulator.scenario import ScenarioError, load_scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = "scenarios/vllm-offload-turns.toml"
REVERT = ROOT / "examples/engine-patches/vllm/revert-44409-two-phase-external-alloc.yaml"


def _run(warm_vllm, out: Path, *extra: str):
    proc = warm_vllm.cli("run", SCENARIO, "--engine", "vllm==0.34.0", "--out", str(out), "--no-report", "-q", *extra)
    summary = json.loads((out / "summary.json").read_text())
    return proc, summary, json.loads((out / "run.json").read_text())


def _found(summary) -> dict:
    return {k: v for k, v in summary["backends"]["vllm"]["findings"].items() if v}


@pytest.mark.vllm
def test_the_tiers_loads_run_clean_through_the_releases_allocation(warm_vllm, tmp_path):
    proc, summary, run = _run(warm_vllm, tmp_path / "fixed")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _found(summary) == {}
    did = run["engine_pieces"]["scheduler"]["did"]
    # 18 blocks saved by the 7 requests' finishes; 288 tokens loaded, each into one full slot
    assert (did["offload_saved_blocks"], did["offload_loaded_tokens"], did["offload_loaded_slots"]) == (18, 288, 288)
    assert did["prefix_hit_tokens"] == 608 and did["forwards"] == 31
    assert "the KV connector" in run["engine_pieces"]["scheduler"]["stand_ins"]
    assert any(r["piece"].startswith("an offload tier") and r["whose"] == "slotscope"
               for r in run["engine_pieces"]["rows"])


@pytest.mark.vllm
def test_two_owners_of_one_block_show_as_stale_reads_of_the_hit(warm_vllm, tmp_path):
    """#44409 reverted: the window group's blocks for the tier's tokens are popped where the full group's hit waits
    untouched; the load into the shared block overwrites the system prompt's KV the full layer reads."""
    proc, summary, _ = _run(warm_vllm, tmp_path / "buggy", "--engine-patch", str(REVERT))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert _found(summary) == {"stale_read": 32}
    first = json.loads((tmp_path / "buggy" / "findings.jsonl").read_text().splitlines()[0])
    assert (first["step"], first["kind"], first["observed"]["label"]) == (30, "full", "req 2 pos 112")
    assert first["expected"]["label"] == "req 0 pos 16"


NO_TRANSFER_PROBE = """
import json
from pathlib import Path
from engine_path.releases import EngineSpec
from engine_path.vllm.release import activate
from engine_path.vllm import source
from slotscope.pipeline import RunOptions, run_scenario
spec = EngineSpec("vllm", "0.34.0")
activate(spec)
def dropped(self, loads):                 # the loads taken, none of them made a transfer
    return None
source.VllmStepSource._loaded = dropped
out = run_scenario(Path("scenarios/vllm-offload-turns.toml"), None, RunOptions(engine=spec, device="cpu",
                   report=False, trace_level="off", quiet_engine=True, scheduler="auto"))
print(json.dumps(out.result.total_findings))
"""


@pytest.mark.vllm
def test_the_oracle_takes_the_loads_as_writes(warm_vllm, tmp_path):
    """Without the transfer the tokens the tier loaded were never written: every read of them is stale, so the
    clean run above is the oracle checking the loads, not ignoring them."""
    probe = tmp_path / "probe.py"
    probe.write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n" + NO_TRANSFER_PROBE)
    proc = warm_vllm.script(str(probe), cwd=str(ROOT), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == 3038


@pytest.mark.vllm
def test_async_loads_under_async_scheduling_run_clean(warm_vllm, tmp_path):
    """kv_offload_load = "async" with engine.overlap: each load waits in WAITING_FOR_REMOTE_KVS until the output of
    the schedule that issued it reports it, and lands beside the forward in flight then; clean as released."""
    path = tmp_path / "async.toml"
    path.write_text((ROOT / SCENARIO).read_text().replace("kv_offload = true",
                                                          'kv_offload = true\nkv_offload_load = "async"\noverlap = true'))
    out = tmp_path / "async"
    proc = warm_vllm.cli("run", str(path), "--engine", "vllm==0.34.0", "--out", str(out), "--no-report", "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _found(json.loads((out / "summary.json").read_text())) == {}
    did = json.loads((out / "run.json").read_text())["engine_pieces"]["scheduler"]["did"]
    assert (did["offload_saved_blocks"], did["offload_loaded_tokens"], did["forwards"]) == (18, 288, 38)


RACE = "scenarios/vllm-async-offload.toml"
REVERT_47728 = ROOT / "examples/engine-patches/vllm/revert-47728-processed-basis-frees.yaml"


@pytest.mark.vllm
@pytest.mark.parametrize("variant, found", [
    ("as shipped", {"stale_read": 10}),              # async scheduling and async loads: the race
    ("sync loads", {}),                              # a load on the forwards' stream waits for the one in flight
    ("no async scheduling", {}),                     # no schedule is made while a forward runs
])
def test_frees_on_the_optimistic_count_race_only_an_async_load(warm_vllm, tmp_path, variant, found):
    """#47728 reverted (V6): the schedule made while a forward runs frees a block that forward still reads; only a
    load that runs beside that forward (async scheduling and an async load both) can land in it while it is read."""
    text = (ROOT / RACE).read_text()
    text = {"sync loads": text.replace('kv_offload_load = "async"', ""),
            "no async scheduling": text.replace("overlap = true", "")}.get(variant, text)
    path = tmp_path / "race.toml"
    path.write_text(text)
    out = tmp_path / "race"
    proc = warm_vllm.cli("run", str(path), "--engine", "vllm==0.34.0", "--engine-patch", str(REVERT_47728),
                         "--out", str(out), "--no-report", "-q")
    assert proc.returncode == (1 if found else 0), proc.stderr[-2000:]
    assert _found(json.loads((out / "summary.json").read_text())) == found
    if found:
        first = json.loads((out / "findings.jsonl").read_text().splitlines()[0])
        assert (first["step"], first["kind"], first["slot"]) == (5, "swa", 150)
        assert "reassigned to another token" in first["message"]


def test_no_model_runs_an_offload_tier(tmp_path):
    """The scenario names vLLM as its engine_release; without it, the model's run is refused naming the field."""
    path = tmp_path / "model.toml"
    path.write_text((ROOT / SCENARIO).read_text().replace('engine_release = "vllm==0.34.0"', ""))
    proc = slotscope_cli("run", str(path), "--out", str(tmp_path / "m"), "--no-report", "-q")
    assert proc.returncode == 2 and "engine.kv_offload" in proc.stderr and "--engine vllm" in proc.stderr


@pytest.mark.parametrize("change, field", [
    ('kv_offload_load = "async"', r"engine\.kv_offload_load: needs engine\.kv_offload = true"),   # loads, no tier
    ("kv_offload = true\npd_decode = true", r"engine\.kv_offload"),                              # a PD decode node
])
def test_what_an_offload_tier_cannot_run_with_is_refused_naming_the_field(tmp_path, change, field):
    path = tmp_path / "bad.toml"
    path.write_text((ROOT / SCENARIO).read_text().replace("kv_offload = true", change))
    with pytest.raises(ScenarioError, match=field):
        load_scenario(path)
