"""slotscope fuzz validates ``--seed`` and ``--budget`` as ``run`` validates ``--seed``: no negative seed, a seed
below 2^63, a finite budget above zero; bad input exits 2 naming the option (issue 29 point 4's fuzz part)."""
from __future__ import annotations

import pytest

from slotscope.cli import main
from slotscope.fuzz_search import fuzz


@pytest.mark.parametrize("args, option", [
    (["--seed", "-1"], "--seed"), (["--seed", str(2 ** 63)], "--seed"), (["--seed", "1.5"], "--seed"),
    (["--seed", "ten"], "--seed"),
    (["--budget", "inf"], "--budget"), (["--budget", "nan"], "--budget"), (["--budget", "-inf"], "--budget"),
    (["--budget", "1e400"], "--budget"), (["--budget", "0"], "--budget"), (["--budget", "-5m"], "--budget"),
    (["--budget", "infs"], "--budget"), (["--max-scenarios", "0"], "--max-scenarios")])
def test_bad_seed_and_budget_are_bad_input(args, option, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["fuzz", "--design", "kvwriteloc-strict", *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err and "Traceback" not in err, err


def test_seed_and_budget_checked_by_the_api():
    for kw, option in (({"seed": -1}, "--seed"), ({"seed": 2 ** 63}, "--seed"), ({"budget_s": float("inf")}, "--budget"),
                       ({"budget_s": float("nan")}, "--budget"), ({"budget_s": 0}, "--budget")):
        with pytest.raises(ValueError, match=option):
            fuzz("kvwriteloc-strict", **kw)
    assert fuzz("kvwriteloc-strict", seed=2 ** 63 - 1, budget_s=600, max_scenarios=1).tried == 1
