"""The release's own log records during a run: kept, counted and summarised, not printed as they come.

The release logs through ``logging.getLogger("sglang...")`` and configures no handler of its own when it is
imported as a library, so every warning or error record it emits reaches Python's last-resort handler: one
block on stderr each. Some of its code logs an exception it then re-raises (0.5.23's
``enable_breakable_cuda_graph`` logs a six-line hint for every exception inside a prefill-graph layer), so a
backend that fails on every layer (torch_native's SWA gathers at full-pool ids) printed some 280 blocks in a
run of the scale scenario, while the run already records each failure as a finding. :class:`ReleaseLog`
holds the records of one run instead: their count per level and logger, and the first few messages whole;
run.json's ``engine_pieces.release_log`` carries them and the command prints one line naming the count and
the first message.

Some release modules ``print`` instead (0.5.23's aiter_backend.py, where aiter is not installed: "aiter is AMD
specific kernel library ..." on stdout, amid a command's table or JSON). :func:`printed_as_log` turns what the
release prints while a backend is built into records of the logger ``sglang.printed`` (WARNING), kept like the rest.
"""
from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from typing import Any, Iterator, Optional

#: the release's loggers all live under this name
ROOT_LOGGER = "sglang"
#: records below this level are left alone (the last-resort handler prints none of them either)
LEVEL = logging.WARNING
#: the logger what the release prints is logged as
PRINTED_LOGGER = f"{ROOT_LOGGER}.printed"
#: messages kept whole, in order (the rest are only counted)
KEPT = 5
MESSAGE_CHARS = 2000


class ReleaseLog(logging.Handler):
    """Collects the release's WARNING-and-above records while attached (:meth:`attach` / :meth:`detach`);
    the release's own logger configuration (handlers, propagation) is put back as it was on detach."""

    def __init__(self) -> None:
        super().__init__(level=LEVEL)
        self.by_level: Counter = Counter()
        self.by_logger: Counter = Counter()
        self.first: list[dict[str, str]] = []
        #: the first record of the most severe level seen (what the terminal line shows)
        self.worst: Optional[dict[str, str]] = None
        self._worst_level = 0
        self._logger: Optional[logging.Logger] = None
        self._propagate = True

    # logging.Handler
    def emit(self, record: logging.LogRecord) -> None:
        self.by_level[record.levelname] += 1
        self.by_logger[record.name] += 1
        keep, worse = len(self.first) < KEPT, record.levelno > self._worst_level
        if keep or worse:
            try:
                message = record.getMessage()
            except Exception as e:  # noqa: BLE001 - a record whose arguments do not format is still counted
                message = f"(unformattable record: {type(e).__name__}: {e})"
            entry = {"level": record.levelname, "logger": record.name, "message": message[:MESSAGE_CHARS]}
            if keep:
                self.first.append(entry)
            if worse:
                self.worst, self._worst_level = entry, record.levelno

    def attach(self) -> "ReleaseLog":
        logger = logging.getLogger(ROOT_LOGGER)
        self._logger, self._propagate = logger, logger.propagate
        logger.addHandler(self)
        logger.propagate = False        # not on to the root logger's handlers, nor to the last resort
        return self

    def detach(self) -> None:
        if self._logger is not None:
            self._logger.removeHandler(self)
            self._logger.propagate = self._propagate
            self._logger = None

    @property
    def records(self) -> int:
        return sum(self.by_level.values())

    def describe(self) -> dict[str, Any]:
        """run.json's ``engine_pieces.release_log``."""
        return {"records": self.records, "by_level": dict(self.by_level), "by_logger": dict(self.by_logger),
                "first": list(self.first), "worst": self.worst}

    def summary_line(self) -> Optional[str]:
        """One line for the terminal (the count by level, the first record of the most severe level), or None
        when the release logged nothing."""
        if self.worst is None:
            return None
        levels = ", ".join(f"{n} {lvl.lower()}" for lvl, n in self.by_level.most_common())
        head = self.worst
        text = head["message"].strip()
        first = text.splitlines()[0] if text else "(empty message)"
        return (f"the release logged {self.records} record(s) during the run ({levels}; run.json "
                f"engine_pieces.release_log keeps the first {len(self.first)}), the first {head['level'].lower()} "
                f"from {head['logger']}: {first[:300]}")


@contextlib.contextmanager
def printed_as_log(where: str) -> Iterator[None]:
    """What the release prints to stdout inside the block, as WARNING records of :data:`PRINTED_LOGGER` (one per
    non-empty line, ``where`` named), after it: kept by an attached :class:`ReleaseLog`, else on stderr."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            yield
    finally:
        log = logging.getLogger(PRINTED_LOGGER)
        for line in buf.getvalue().splitlines():
            if line.strip():
                log.warning("%s printed: %s", where, line.strip())
