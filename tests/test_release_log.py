"""The release's log records during an engine run are kept off the terminal and summarised
(engine_path/release_log.py, slotscope.engine_run.release_log_kept). No release is imported here: the records
come from loggers under the release's name, as its modules make them."""
import logging
import types

import pytest

from engine_path.release_log import KEPT, ReleaseLog
from slotscope.engine_run import pieces_table, release_log_kept

LOGGER = "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context"


def test_records_are_counted_kept_and_not_passed_on_then_the_loggers_are_as_before(caplog):
    root = logging.getLogger("sglang")
    before = (root.propagate, list(root.handlers))
    log = ReleaseLog().attach()
    try:
        for i in range(KEPT + 3):
            logging.getLogger(LOGGER).error("IndexError: index %d is out of bounds\nFail when using backend", i)
        logging.getLogger("sglang.srt.other").warning("a warning")
        logging.getLogger("sglang.srt.other").info("below the level: not counted")
        logging.getLogger("elsewhere").warning("not the release's")
    finally:
        log.detach()
    # pytest's handler on the root logger stands for whatever the process has there (the last resort: stderr)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == ["not the release's"]
    assert (root.propagate, list(root.handlers)) == before
    d = log.describe()
    assert d["records"] == KEPT + 4 and d["by_level"] == {"ERROR": KEPT + 3, "WARNING": 1}
    assert d["by_logger"] == {LOGGER: KEPT + 3, "sglang.srt.other": 1}
    assert [f["message"].split("\n")[0] for f in d["first"]] == [f"IndexError: index {i} is out of bounds"
                                                                 for i in range(KEPT)]
    logging.getLogger(LOGGER).error("after detach")
    assert caplog.records[-1].getMessage() == "after detach"


def test_the_run_prints_one_line_with_the_count_and_the_first_record(capsys):
    runtime = types.SimpleNamespace()
    with pytest.raises(RuntimeError):
        with release_log_kept(runtime):
            logging.getLogger("sglang.kernels.jit.utils.arch").warning("Cannot detect CUDA architecture.")
            logging.getLogger(LOGGER).error("IndexError: index 52429 is out of bounds for dimension 0\nhint")
            logging.getLogger(LOGGER).error("IndexError: index 60000 is out of bounds for dimension 0\nhint")
            raise RuntimeError("the run crashed")          # the line comes all the same
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"slotscope: the release logged 3 record(s) during the run (2 error, 1 warning; run.json "
                   f"engine_pieces.release_log keeps the first 3), the first error from {LOGGER}: IndexError: "
                   f"index 52429 is out of bounds for dimension 0"]
    assert runtime.release_log.records == 3


def test_quiet_runs_print_nothing_and_a_silent_release_prints_nothing(capsys):
    runtime = types.SimpleNamespace()
    with release_log_kept(runtime, quiet=True):
        logging.getLogger(LOGGER).error("kept")
    with release_log_kept(types.SimpleNamespace()):
        pass
    assert capsys.readouterr().err == ""
    kept = {"level": "ERROR", "logger": LOGGER, "message": "kept"}
    assert runtime.release_log.describe()["first"] == [kept] and runtime.release_log.worst == kept


def test_run_json_carries_the_log(monkeypatch):
    runtime = types.SimpleNamespace(api=types.SimpleNamespace(info=types.SimpleNamespace(
        to_json=lambda: {"name": "sglang", "version": "0.5.23"})))
    runtime.describe = lambda: {"engine_pieces": ["KVWriteLoc"], "model_pieces": []}
    assert "release_log" not in pieces_table(runtime)
    with release_log_kept(runtime, quiet=True):
        logging.getLogger(LOGGER).warning("w")
    assert pieces_table(runtime)["release_log"]["by_level"] == {"WARNING": 1}


def test_what_the_release_prints_while_a_backend_is_built_becomes_a_kept_record(capsys):
    from engine_path.release_log import PRINTED_LOGGER, printed_as_log

    runtime = types.SimpleNamespace()
    with release_log_kept(runtime, quiet=True):
        with printed_as_log("aiter's module or constructor"):
            print("aiter is AMD specific kernel library.\n")
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""
    assert runtime.release_log.describe()["first"] == [
        {"level": "WARNING", "logger": PRINTED_LOGGER,
         "message": "aiter's module or constructor printed: aiter is AMD specific kernel library."}]
