"""Progress on stderr for long runs: a line that rewrites itself on a terminal, sparse lines elsewhere."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, stream=None, interval_s: float | None = None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.interval = interval_s if interval_s is not None else (0.2 if self.tty else 5.0)
        self.label = label
        self.t0 = time.monotonic()
        self._last = 0.0
        self._shown = False

    def __call__(self, step: int, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self._last < self.interval:
            return
        self._last = now
        self._show(step, done, total, now)

    def _show(self, step: int, done: int, total: int, now: float) -> None:
        pct = 100.0 * done / total if total else 100.0
        msg = f"[{self.label}] step {step}  requests {done}/{total} ({pct:.0f}%)  {now - self.t0:.1f}s"
        if self.tty:
            self.stream.write("\r" + msg.ljust(78))
        else:
            self.stream.write(msg + "\n")
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown and self.tty:
            self.stream.write("\n")
            self.stream.flush()
