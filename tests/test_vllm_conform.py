"""`slotscope conform SCENARIO --engine vllm==0.34.0`: slotscope's model of vLLM's worker tables (slot mappings, their
padding, the forward's block tables; engine_path/vllm/conformance.py) against the release's BlockTables, step by step
under vLLM's own scheduler. Clean on a shipped scenario; the #36580 revert (a graph's padding from the padded count)
diverges at the padding of the first padded forward."""
from __future__ import annotations

import json

import pytest

from helpers import slotscope_cli

GRAPH_PAD = "scenarios/vllm-graph-pad.toml"


@pytest.mark.vllm
def test_the_worker_model_conforms_on_every_step(warm_vllm):
    r = warm_vllm.cli("conform", GRAPH_PAD, "--engine", "vllm==0.34.0", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every step conforms (37 steps)" in r.stdout
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["fields"] == {f"{f} [{g}]": [37, 0] for f in ("slot_mapping", "padding", "block_table")
                             for g in ("swa", "full")}


@pytest.mark.vllm
def test_a_release_that_pads_from_the_padded_count_diverges(warm_vllm):
    r = warm_vllm.cli("conform", GRAPH_PAD, "--engine", "vllm==0.34.0", "--engine-patch",
                      "examples/engine-patches/vllm/revert-36580-pad-from-padded-count.yaml")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "first divergence: step 1, padding [swa]: token 7: model -1, engine 23 (57 tokens differ)" in r.stdout


@pytest.mark.parametrize("args,says", [
    (("--engine", "vllm==0.33.0"), "no model of vllm 0.33.0"),
    (("--engine", "vllm==0.34.0", "--design", "sglang-0.5.23"), "--design with --engine vllm==0.34.0"),
    (("--engine", "vllm==0.34.0", "--scheduler"), "--scheduler with --engine vllm==0.34.0"),
    (("--engine", "vllm"), "conform needs a release version"),
])
def test_what_a_vllm_comparison_cannot_take_is_refused(args, says):
    r = slotscope_cli("conform", GRAPH_PAD, *args)
    assert r.returncode == 2 and says in r.stderr, r.stderr
