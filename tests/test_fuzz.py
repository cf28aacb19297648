"""slotscope fuzz: valid draws over the whole space, the same seed gives the same scenarios, it finds the first
half of the corpus's buggy designs within short budgets, and a design fixed everywhere runs clean."""
from __future__ import annotations

import argparse
import json
import pytest

from simulator.scenario import parse_scenario
from slotscope.cli import main
from slotscope.corpus import load_corpus
from slotscope.fuzz import parse_budget
from slotscope.fuzz_search import Fuzzer, fuzz
from slotscope.fuzz_space import Generator, draw_scenario, fix_up, for_engine

from helpers import ROOT

#: kvwriteloc-strict with the WAR barrier on ROCm too: the design the fuzzer must not fail (no false positives)
FIXED = f"{ROOT / 'examples' / 'sweeps' / 'fixed_everywhere.py'}:FixedEverywhere"


def corpus_buggy_designs() -> list[str]:
    """The corpus's buggy designs, each once, in corpus order."""
    return list(dict.fromkeys(c.buggy for c in load_corpus()))


def test_budget_parsing():
    assert parse_budget("10m") == 600.0
    assert parse_budget("90s") == 90.0
    assert parse_budget("1.5h") == 5400.0
    assert parse_budget("42") == 42.0
    for bad in ("0", "-3m", "ten", "5x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_budget(bad)


def test_draws_are_valid_and_cover_the_space():
    """Every accepted draw is a scenario the validator reads back equal; the draws reach every knob group."""
    gen = Generator(7)
    seen: dict[str, int] = {}
    accepted = 0
    for i in range(400):
        level = 1 + i % 6
        data = fix_up(gen.fresh(level, i), level)
        sc = draw_scenario(data, "kvwriteloc-strict")
        if sc is None:
            continue
        accepted += 1
        assert parse_scenario(sc.to_toml(defaults=False), "back.toml") == sc
        e = sc.engine
        if data.get("_fill"):            # a fill load: every request ends at a page boundary, the pools fit it
            page, x = sc.pool.page_size, e.speculative.num_draft_tokens * e.speculative.enabled + e.overlap
            totals = [q.prompt_len + q.output_len + x for q in sc.workload.explicit]
            assert all(t % page == 0 and t <= sc.pool.full_size for t in totals), (totals, sc.pool)
            if data["_fill"] == "full":
                assert sc.pool.full_size == totals[0]
            if data["_fill"] == "swa":
                assert sc.pool.swa_size == sum(t for q, t in zip(sc.workload.explicit, totals) if q.arrival_step == 0)
        seen["fill_" + data.get("_fill", "none")] = seen.get("fill_" + data.get("_fill", "none"), 0) + 1
        seen["fill_spec"] = seen.get("fill_spec", 0) + bool(data.get("_fill") and e.speculative.enabled)
        seen["mixed_pcg_dp"] = seen.get("mixed_pcg_dp", 0) + (e.mixed_chunk and e.piecewise_cuda_graph and e.dp_size > 1)
        for key, hit in (("spec", e.speculative.enabled), ("draft_pool", e.speculative.draft_full_size is not None),
                         ("overlap", e.overlap), ("rocm", e.platform == "rocm"), ("radix", e.radix_cache),
                         ("retract", e.reserve == "none"), ("paged", sc.pool.page_size > 1), ("dp", e.dp_size > 1),
                         ("mixed", e.mixed_chunk), ("pcg", e.piecewise_cuda_graph), ("noshrink", not e.piecewise_shrink),
                         ("no_decode_graph", not e.cuda_graph), ("preset", sc.model.preset is not None),
                         ("pattern", sc.model.preset is None), ("big_pool", sc.pool.full_size > 65535),
                         ("explicit", bool(sc.workload.explicit)), ("turns", sc.workload.turns.dist != "fixed"),
                         ("unified", sc.pool.unified), ("cache_linker", e.cache_linker), ("pd_decode", e.pd_decode)):
            seen[key] = seen.get(key, 0) + bool(hit)
    assert accepted >= 340
    assert all(seen[k] >= 3 for k in seen), seen
    assert {"fill_full", "fill_swa", "fill_both", "fill_spec", "mixed_pcg_dp"} <= set(seen), seen


def test_fill_loads_take_the_pools_last_page():
    """A fill load on a paged pool takes the last page of the pool it fills, speculative decoding included
    (the page absorbs the 1..3 slots a speculative request reserves past its peak): "full" the full pool,
    "swa" the SWA pool (a wave within the window)."""
    from slotscope.fuzz_search import run_one
    from slotscope.fuzz_space import window_of

    gen, checked = Generator(5), {"full": 0, "swa": 0}
    for i in range(3000):
        data = fix_up(gen.fresh(2, i), 2)
        kind, e = data.get("_fill"), data.get("engine", {})
        page, x = data["pool"].get("page_size", 1), e.get("speculative", {}).get("num_draft_tokens", 0)
        if kind not in checked or checked[kind] >= 2 or "speculative" not in e or page < 4 or page <= x + 1:
            continue
        if kind == "swa" and window_of(data["model"]) < 2 * page:
            continue
        sc = draw_scenario(data, FIXED)
        out = run_one(sc, None)
        assert out.status == "clean", (out.status, sc.to_toml(defaults=False))
        assert any((s.full_used == s.full_size) if kind == "full" else (s.swa_used == s.swa_size) for s in out.steps), \
            sc.to_toml(defaults=False)
        checked[kind] += 1
        if min(checked.values()) >= 2:
            break
    assert checked == {"full": 2, "swa": 2}


def test_same_seed_same_scenarios():
    a = Fuzzer(FIXED, seed=11).run(budget_s=600, max_scenarios=6)
    b = Fuzzer(FIXED, seed=11).run(budget_s=600, max_scenarios=6)
    c = Fuzzer(FIXED, seed=12).run(budget_s=600, max_scenarios=6)
    assert a.status == b.status == "clean"
    assert len(a.hashes) == 6 and a.hashes == b.hashes
    assert a.hashes != c.hashes
    assert a.coverage == b.coverage > 0


def test_fixed_design_runs_clean():
    """No false positives: the design with every fix shows no finding in 40 draws (a count, not a time budget:
    the same 40 scenarios on any machine, about 15 s here)."""
    res = fuzz(FIXED, seed=1, budget_s=600, max_scenarios=40)
    assert res.status == "clean", (res.finding, res.scenario and res.scenario.to_toml(defaults=False))
    assert res.tried == 40


@pytest.mark.parametrize("design", corpus_buggy_designs()[: (len(corpus_buggy_designs()) + 1) // 2])
def test_finds_the_first_half_of_the_corpus(design):
    # against=None: any failure of the design (the search against its release is tests/test_fuzz_search.py's)
    res = fuzz(design, seed=0, budget_s=60, against=None)
    assert res.status == "found", f"{design}: nothing in {res.tried} scenarios"
    assert res.finding.cls in ("length_mismatch", "clobbered", "evicted_slot", "missed", "padding_slot",
                               "out_of_range", "stale_read", "torn_write")


def test_cli_writes_the_minimal_scenario_its_run_and_report(tmp_path, capsys):
    out = tmp_path / "fz"
    rc = main(["fuzz", "--design", "sglang-pre-24743", "--seed", "1", "--budget", "60s", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 1, cap.err[-2000:]
    info = json.loads((out / "fuzz.json").read_text())
    assert info["status"] == "found" and info["design"] == "sglang-pre-24743"
    minimal = parse_scenario((out / "minimal.toml").read_text(), "minimal.toml")
    found = parse_scenario((out / "found.toml").read_text(), "found.toml")
    assert minimal.backends == (info["finding"]["backend"],)
    assert len(minimal.workload.explicit) <= max(found.workload.requests, len(found.workload.explicit))
    summary = json.loads((out / "run" / "summary.json").read_text())
    assert summary["findings_total"] == info["minimal_findings_total"] >= 1
    assert summary["backends"][info["finding"]["backend"]]["findings"][info["finding"]["class"]] >= 1
    assert (out / "run" / "report.html").stat().st_size > 1000
    assert "FOUND after" in cap.err
    assert cap.out == (out / "minimal.toml").read_text()


def test_a_design_that_sizes_draft_pools_below_zero_is_minimized(tmp_path, capsys):
    """DraftFullPoolPageShort takes a 16-slot page off the draft's pool: the minimizer's smaller pools make that
    negative, a candidate the design cannot set up (DesignError: does not reproduce), not an internal error."""
    out = tmp_path / "fz"
    rc = main(["fuzz", "--design", f"{ROOT / 'tests' / 'mutant_designs.py'}:DraftFullPoolPageShort", "--against",
               "kvwriteloc-strict", "--seed", "0", "--budget", "60s", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 1, cap.err[-2000:]
    assert json.loads((out / "fuzz.json").read_text())["finding"]["class"] == "out_of_range"
    assert not (out / "minimize-error.toml").exists()
    minimal = parse_scenario((out / "minimal.toml").read_text(), "minimal.toml")
    assert minimal.engine.speculative.enabled and "full" in minimal.engine.speculative.draft_layers


def test_clean_budget_exits_0(tmp_path, capsys):
    rc = main(["fuzz", "--design", FIXED, "--seed", "3", "--budget", "20s", "--max-scenarios", "2",
               "--out", str(tmp_path / "fz")])
    cap = capsys.readouterr()
    assert rc == 0, cap.err[-2000:]
    assert "clean: 2 scenarios run" in cap.err
    assert not (tmp_path / "fz").exists()


def test_bad_design_is_bad_input(capsys):
    assert main(["fuzz", "--design", "no-such-design", "--budget", "5s"]) == 2
    assert "no-such-design" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["fuzz", "--design", "kvwriteloc-strict", "--budget", "ten"])
    assert "--budget 'ten'" in capsys.readouterr().err


def test_an_engine_patch_needs_an_engine_and_a_readable_file(capsys, tmp_path):
    patch = ROOT / "examples" / "engine-patches" / "revert-29352-locked-full-recovery.yaml"
    assert main(["fuzz", "--design", "sglang-0.5.23", "--budget", "5s", "--engine-patch", str(patch)]) == 2
    assert "--engine-patch needs --engine" in capsys.readouterr().err
    missing = tmp_path / "no-such.yaml"
    assert main(["fuzz", "--design", "sglang-0.5.23", "--budget", "5s", "--engine", "sglang==0.5.23",
                 "--engine-patch", str(missing)]) == 2
    assert "no-such.yaml" in capsys.readouterr().err


def test_a_draw_for_vllm_clears_what_vllm_is_not_driven_for():
    """fuzz --engine vllm==V: the knobs vLLM's adapter refuses are cleared from each draw (not drawn and rejected),
    the model is one vLLM groups into one full and one sliding-window group, the pool whole blocks; every draw of a
    seeded stream then passes the adapter's refusals (engine_path/vllm/scheduler.py's NOT_YET)."""
    from engine_path.vllm.scheduler import unsupported

    data = {"name": "d", "seed": 1, "model": {"preset": "llama4", "num_layers": 5},
            "pool": {"full_size": 100, "page_size": 16, "unified": True},
            "engine": {"dp_size": 2, "overlap": True, "speculative": {"num_draft_tokens": 2},
                       "piecewise_cuda_graph": True, "radix_cache": True}}
    got = for_engine(data, "vllm")
    # EAGLE is driven (synchronously): enough layers of each kind that its drafter layer joins the target's group
    assert got["model"] == {"layers": "SFSFSF", "window": 8192} and got["pool"] == {"full_size": 112, "page_size": 16}
    # vLLM's own DP agreement pads DP batches, its own graph manager picks piecewise graphs
    assert got["engine"] == {"dp_size": 2, "speculative": {"num_draft_tokens": 2}, "piecewise_cuda_graph": True,
                             "radix_cache": True}
    two = for_engine({"model": {"layers": "SF", "window": 8}, "pool": {"full_size": 64, "page_size": 16},
                      "engine": {"overlap": True, "kv_offload": True,
                                 "speculative": {"draft_layers": "FF", "draft_full_size": 32, "draft_swa_ratio": 0.5}}},
                     "vllm")
    assert two["engine"] == {"speculative": {"draft_layers": "FF"}} and two["model"]["layers"] == "SF" * 5
    assert for_engine({"model": {"preset": "llama4"}, "engine": {"dp_size": 2}}, "sglang")["engine"] == {"dp_size": 2}
    # async scheduling (engine.overlap) is driven on one rank: kept there, cleared with DP above
    one = for_engine({"model": {"layers": "SF"}, "pool": {"full_size": 64, "page_size": 16},
                      "engine": {"overlap": True}}, "vllm")
    assert one["engine"] == {"overlap": True}
    gen, refused, drawn, spec = Generator(3), [], 0, 0
    for i in range(150):
        sc = draw_scenario(for_engine(fix_up(gen.fresh(3, i), 3), "vllm"), "sglang-0.5.23")
        if sc is not None:
            drawn += 1
            spec += sc.engine.speculative.enabled
            kinds = sc.model.layer_kinds
            if unsupported(sc) or kinds.count("S") != kinds.count("F") or sc.pool.full_size % sc.pool.page_size:
                refused.append(sc.name)
    assert drawn > 100 and spec > 10 and refused == []
