"""vLLM's extract_hidden_states speculator (``engine.speculative.algorithm = "extract_hidden_states"``).

The scenario field and its refusals, the probe that learns where the release's store (``basic_cache``) puts each row
(engine_path/vllm/hidden_states.py), and the oracle's rule that what the store leaves in the target groups' views
reaches the target's reference alone. The release's own runs (0.34.0 as released: padded rows into the null block;
#43869 reverted: into the pool's last slot) are V8 of the vLLM corpus (tests/test_vllm_corpus.py).
"""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from helpers import ROOT, slotscope_cli
from simulator.oracle.reference import ReferencePool
from simulator.records import PAD_TAG
from simulator.scenario import ScenarioError, load_scenario, parse_scenario
from simulator.scheduling.batch import BatchTruth, Transfer

SCENARIO = ROOT / "scenarios" / "vllm-hidden-states-pad.toml"


def test_the_scenario_asks_for_vllms_speculator_with_one_token_and_one_layer():
    spec = load_scenario(SCENARIO).engine.speculative
    assert (spec.enabled, spec.algorithm, spec.num_steps, spec.draft_layers) == (
        True, "extract_hidden_states", 1, ("full",))


@pytest.mark.parametrize("change, field", [
    ("num_draft_tokens = 2", "num_draft_tokens = 4"),
    ('algorithm = "extract_hidden_states"', 'algorithm = "extract_hidden_states"\ndraft_layers = "S"'),
])
def test_extract_hidden_states_refuses_what_vllm_refuses(change, field):
    text = SCENARIO.read_text().replace(change, field)
    key = field.rsplit("\n", 1)[-1].split(" = ")[0]
    with pytest.raises(ScenarioError, match=rf"h\.toml: engine\.speculative\.{key}: must be "):
        parse_scenario(text, "h.toml")


def test_without_vllm_the_speculator_is_refused_naming_the_field(tmp_path):
    path = tmp_path / "model.toml"          # the scenario on its design, the model (no engine_release)
    path.write_text(SCENARIO.read_text().replace('engine_release = "vllm==0.34.0"', ""))
    r = slotscope_cli("run", str(path), "--out", str(tmp_path / "o"), "-q")
    assert r.returncode == 2, r.stderr
    assert "engine.speculative.algorithm: extract_hidden_states is vLLM's speculator" in r.stderr
    assert "--engine vllm" in r.stderr


def _store(monkeypatch, rule):
    """engine_path.vllm.hidden_states' store module stood in by ``basic_cache`` indexing as ``rule`` maps slots."""
    from engine_path.vllm import hidden_states

    def basic_cache(to_cache, kv_cache, slot_mapping):
        slots = rule(slot_mapping)
        bs = kv_cache.shape[2]
        kv_cache[slots // bs, :, slots % bs] = to_cache

    monkeypatch.setitem(sys.modules, hidden_states.MODULE, types.SimpleNamespace(basic_cache=basic_cache))
    return hidden_states.stored_at


@pytest.mark.parametrize("rule, padded_at", [
    (lambda s: s.clamp_min(0), 0),                 # 0.34.0: -1 clamped, the null block's slot 0
    (lambda s: s, 4 * 8 - 1),                      # before #43869: -1 a Python index, the last slot
])
def test_each_row_is_placed_where_the_store_puts_it(monkeypatch, rule, padded_at):
    """Rows with one slot-mapping value go to one place; a padded row (-1) and a real row that land on one slot
    (the last slot before #43869) are both placed, the padded one where the release's store put it."""
    stored_at = _store(monkeypatch, rule)
    mapping = np.array([9, 31, 10, -1, -1, -1], dtype=np.int64)
    assert stored_at(mapping, 4, 8).tolist() == [9, 31, 10, padded_at, padded_at, padded_at]


def test_a_row_the_store_skips_is_stored_nowhere(monkeypatch):
    def skipping(to_cache, kv_cache, slot_mapping):                 # a store that skips -1, as the flash store does
        keep = slot_mapping >= 0
        s, bs = slot_mapping[keep], kv_cache.shape[2]
        kv_cache[s // bs, :, s % bs] = to_cache[keep]

    from engine_path.vllm import hidden_states
    monkeypatch.setitem(sys.modules, hidden_states.MODULE, types.SimpleNamespace(basic_cache=skipping))
    assert hidden_states.stored_at(np.array([3, -1, 6], dtype=np.int64), 2, 4).tolist() == [3, -1, 6]


@pytest.mark.parametrize("reference_only, draft_expects", [(True, 3), (False, PAD_TAG)])
def test_a_transfer_the_target_reference_alone_takes_leaves_the_draft_reference_alone(reference_only, draft_expects):
    """What extract_hidden_states' store leaves in the target groups' views reaches the target's reference alone (the
    draft side's own write there is what its reference expects); a verify's rejected drafts (into the target's pools
    only as well) reach every reference: speculative K/V in the drafter's layers too until recomputed."""
    from simulator.core.pipeline import apply_truth

    E = np.zeros(0, np.int64)
    slots, tags = np.array([7]), np.array([PAD_TAG])
    tr = Transfer(E, E, E, E, written=(slots, tags, slots, tags), target_only=True,
                  target_reference_only=reference_only)
    target, draft = ReferencePool(16, 16), ReferencePool(16, 16)
    for ref in (target, draft):
        ref.expected["full"][7] = 3
    sides = [types.SimpleNamespace(reference=target), types.SimpleNamespace(reference=draft)]
    run = types.SimpleNamespace(sides=sides, target=sides[0], write_transfer=lambda tr: None)
    ctx = types.SimpleNamespace(run=run, truth=BatchTruth(E, E, E, E, E, E, E, transferred=tr), side=sides[0])
    apply_truth(ctx)
    assert target.expected["full"][7] == PAD_TAG and draft.expected["full"][7] == draft_expects
