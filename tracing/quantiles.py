"""Duration statistics in bounded memory: the analyser's span summary and the engine's stage table.

A trace of millions of spans must not keep a million durations per name, yet a table of a few hundred
spans should show exact figures. So the first :data:`EXACT` samples are kept as they are; past that they
fold into a histogram of buckets 1% wide (log scale), and a quantile is the middle of its bucket: within
about 0.5% of the true value, in memory that grows with the spread of the durations, not their number.
Count, total and max stay exact throughout.
"""
from __future__ import annotations

import math
from typing import Optional

#: samples kept exactly; past this many the quantiles come from the histogram
EXACT = 4096
_BUCKET = math.log(1.01)        # histogram buckets 1% wide


class Quantiles:
    """count / total / max exactly; nearest-rank quantiles exact up to EXACT samples, then ~0.5%."""

    __slots__ = ("count", "total", "max", "exact", "hist")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0
        self.max = 0
        self.exact: Optional[list[int]] = []
        self.hist: Optional[dict[int, int]] = None

    def add(self, d: int) -> None:
        self.count += 1
        self.total += d
        if d > self.max:
            self.max = d
        if self.exact is not None:
            self.exact.append(d)
            if len(self.exact) <= EXACT:
                return
            self.hist = {}
            pending, self.exact = self.exact, None
        else:
            pending = [d]
        hist = self.hist
        for x in pending:
            b = -1 if x <= 0 else int(math.log(x) / _BUCKET)
            hist[b] = hist.get(b, 0) + 1  # type: ignore[index]

    def quantile(self, q: float, *, capped: bool = True) -> float:
        """The nearest-rank ``q`` quantile (0.5: the lower median). From the histogram it is the middle
        of the bucket, which for the top bucket can lie above ``max``: ``capped`` returns ``max`` then.
        The analyser's span summary passes ``capped=False``, as its p50 has always been the bare middle."""
        if not self.count:
            return 0.0
        rank = min(self.count - 1, max(0, math.ceil(q * self.count) - 1))
        if self.exact is not None:
            return float(sorted(self.exact)[rank])
        seen = 0
        for b in sorted(self.hist):  # type: ignore[arg-type]
            seen += self.hist[b]  # type: ignore[index]
            if seen > rank:
                if b < 0:
                    return 0.0
                middle = math.exp((b + 0.5) * _BUCKET)
                return min(float(self.max), middle) if capped else middle
        return float(self.max)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0
