"""bench/vs_kv_canary.py: SGLang 0.5.23's own kv_canary references driven from our run on one corpus bug (B2)
and one injected fault (repoint_req_to_token), with exact outcomes; a release without the references is one
line in the table, no traceback (engine_path/canary.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "vs_kv_canary.py"


#: B2 (decode graph's stale SWA tail) on flashinfer, 12 steps: slotscope's first finding and count; the canary's
#: real-data first violation (the TAIL verify after the forward that clobbered a slot the batch reads)
B2_SLOTSCOPE = {"class": "clobbered", "findings": 60, "step": 7, "steps_after": 0}
B2_REAL_DATA = {"reason": "verify_real_kv_hash_mismatch", "kind": "swa", "stage": "tail", "steps_after": 0,
                "violations": 9}
#: repoint_req_to_token at PROB 1 on smoke, 4 steps: 3 faults; the canary matches one (both modes)
REPOINT_CANARY = {"detected": 1, "reason": "verify_chain_hash_mismatch+verify_position_mismatch", "steps_after": 0,
                  "violations": 8}


def _bench(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=900,
                          cwd=ROOT, env=dict(os.environ, **(env or {})))


@pytest.fixture(scope="module")
def rows(warm):
    """The bench's child for 0.5.23, forked from the session's one import of the release (tests/warm_engine.py)."""
    proc = warm("sglang==0.5.23").script(BENCH, "--child", "0.5.23", "--only", "B2,repoint_req_to_token", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["references"] == "sglang.kernels.ops.kv_canary (the launchers' CPU fallback)"
    return {r["item"]: r for r in got["rows"]}


@pytest.mark.engine
def test_b2_real_data_canary_sees_the_clobber_a_step_late(rows):
    """B2's stale SWA tail overwrites live slots: slotscope's write check names it at once; the canary's
    metadata chain is intact (the stamps went to out_cache_loc), only its real-data fingerprint of layer 0
    sees the clobbered row, at the verify after the same forward."""
    r = rows["B2"]
    assert (r["backend"], r["design"]) == ("flashinfer", "sglang-pre-24743")
    assert r["slotscope"] == B2_SLOTSCOPE
    assert r["none"] is None
    assert {k: r["partial"][k] for k in ("reason", "kind", "stage", "steps_after", "violations")} == B2_REAL_DATA


@pytest.mark.engine
def test_repointed_req_to_token(rows):
    """The canary's own P1: slotscope's read check finds every repointed entry; the canary only those inside
    the prefix it verifies (the entries this forward writes are stamped, not verified)."""
    r = rows["repoint_req_to_token"]
    assert r["injected"] == 3
    assert r["slotscope"] == {"detected": 3, "class": "stale_read", "steps_after": 0}
    for mode in ("none", "partial"):
        assert r[mode] == REPOINT_CANARY


def test_a_release_without_the_references_is_one_line(tmp_path):
    """A stand-in release (a package named sglang with no kv_canary): the table says so, exit 0, no traceback."""
    rel = tmp_path / "engines" / "sglang-0.0.1"
    (rel / "sglang").mkdir(parents=True)
    (rel / "sglang" / "__init__.py").write_text("__version__ = '0.0.1'\n")
    (rel / "sglang-0.0.1.dist-info").mkdir()
    proc = _bench("--releases", "0.0.1", env={"SLOTSCOPE_CACHE": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    line = ("sglang 0.0.1: sglang 0.0.1: the canary's torch references are absent (tried sglang.kernels.ops.kv_canary "
            "(sglang.kernels missing); sglang.jit_kernel.kv_canary (sglang.jit_kernel missing)); the canary cannot "
            "be driven in this release")
    assert line in proc.stdout.splitlines()
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["releases"] == [{"release": "0.0.1", "absent": line[len("sglang 0.0.1: "):]}]
