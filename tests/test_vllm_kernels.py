"""vLLM's worker kernels computed by torch on a CPU (engine_path/vllm/kernels.py): equal to the interpreted kernels on
random steps of the release's own BlockTables, used only for the checked source, a launch the models cannot be sure
of handed to the kernel, and a whole run the same with the kernels interpreted."""
from __future__ import annotations

import json

import pytest
import torch

GRAPH_PAD = "scenarios/vllm-graph-pad.toml"


@pytest.mark.vllm
def test_the_stand_ins_equal_the_interpreted_kernels_of_the_checked_source(vllm_release):
    from engine_path import isolate
    from engine_path.vllm import kernels

    got = isolate.call("vllm==0.34.0", "engine_path.vllm.kernels:self_check", 0, 60)
    assert got["differ"] == [] and got["steps"] == 60
    # the gathers and slot mappings of every step; the row writes of the steps that staged any (57 of 60)
    assert got["launches"] == {"_apply_write_kernel": 57, "_gather_block_tables_kernel": 60,
                               "_compute_slot_mappings_kernel": 60}
    assert got["handed_back"] == {m.name: 0 for m in kernels.MODELS}
    assert {n: f in m.checked for m in kernels.MODELS for n, f in got["fingerprints"].items() if n == m.name} == \
        {m.name: True for m in kernels.MODELS}


def test_a_pointer_the_models_were_not_told_of_hands_the_launch_to_the_kernel():
    """A block table the stand-in cannot resolve (not registered), or a launch whose programs would overlap, goes
    to the kernel with nothing stored."""
    from engine_path.stand_in_kernels import KernelModel, StandIn
    from engine_path.vllm import kernels

    ran = []

    class Kernel:
        @staticmethod
        def fn(output_ptr, output_stride, write_indices_ptr, write_starts_ptr, write_contents_ptr, write_cu_lens_ptr,
               write_group_ids_ptr, BLOCK_SIZE, MULTI_GROUP):       # the signature the stand-in binds
            pass

        def __getitem__(self, grid):
            return lambda *a, **k: ran.append(grid)

    s = StandIn(Kernel(), KernelModel("m", "_apply_write_kernel", (), frozenset(), kernels.apply_write, "x"))
    known, unknown = torch.zeros((2, 4), dtype=torch.int32), torch.zeros((2, 4), dtype=torch.int32)
    kernels.register(known)
    i32 = dict(dtype=torch.int32)
    write = dict(output_stride=torch.tensor([4, 4]), write_indices_ptr=torch.tensor([1], **i32),
                 write_starts_ptr=torch.tensor([1], **i32), write_contents_ptr=torch.tensor([7, 8], **i32),
                 write_cu_lens_ptr=torch.tensor([2], **i32), write_group_ids_ptr=torch.tensor([0], **i32),
                 BLOCK_SIZE=1024, MULTI_GROUP=True)
    s[(1, 1)](output_ptr=torch.tensor([known.data_ptr()], dtype=torch.uint64), **write)
    assert known.tolist() == [[0, 0, 0, 0], [0, 7, 8, 0]] and (s.launches, s.handed_back, ran) == (1, 0, [])
    s[(1, 1)](output_ptr=torch.tensor([unknown.data_ptr()], dtype=torch.uint64), **write)
    assert unknown.sum() == 0 and (s.launches, s.handed_back, ran) == (1, 1, [(1, 1)])
    # two writes onto one entry: the programs' order would decide which stays
    twice = dict(write, write_indices_ptr=torch.tensor([0, 0], **i32), write_starts_ptr=torch.tensor([0, 1], **i32),
                 write_cu_lens_ptr=torch.tensor([2, 4], **i32), write_contents_ptr=torch.tensor([1, 2, 3, 4], **i32),
                 write_group_ids_ptr=torch.tensor([0, 0], **i32))
    s[(2, 1)](output_ptr=torch.tensor([known.data_ptr()], dtype=torch.uint64), **twice)
    assert known[0].tolist() == [0, 0, 0, 0] and (s.launches, s.handed_back, ran[-1]) == (1, 2, (2, 1))


@pytest.mark.vllm
def test_a_run_is_the_same_with_the_kernels_interpreted(warm_vllm, tmp_path):
    """vllm-graph-pad's first 12 forwards (padded graphs, both groups) with the stand-ins and with
    SLOTSCOPE_INTERPRET_KERNELS=1 (each run forked from the warm import: its worker installs the stand-ins, or not,
    when it starts): the same findings and counts; run.json says which kernels were stood in."""
    outs = {}
    for mode, env in (("stood in", {}), ("interpreted", {"SLOTSCOPE_INTERPRET_KERNELS": "1"})):
        out = tmp_path / mode.replace(" ", "-")
        r = warm_vllm.cli("run", GRAPH_PAD, "--engine", "vllm==0.34.0", "--max-steps", "12", "--out", str(out),
                          "-q", "--no-report", "--trace-level", "off", env=env)
        assert r.returncode == 5, r.stdout + r.stderr          # incomplete: cut at --max-steps
        run = json.loads((out / "run.json").read_text())
        summary = json.loads((out / "summary.json").read_text())
        outs[mode] = (summary["steps"], summary["findings_total"], (out / "findings.jsonl").read_text(),
                      json.dumps(run["sources"], sort_keys=True))
        text = json.dumps(run)
        said = "computed by torch" in text and "the worker kernel _compute_slot_mappings_kernel" in text
        assert said == (mode == "stood in"), mode
    assert outs["stood in"] == outs["interpreted"] and outs["stood in"][0] == 12
