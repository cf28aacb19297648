"""cuda_path.graphs._StaticTags: a static tags buffer filled in one copy where it can be holds, after every
fill, exactly what ``pad_tags`` of that step's tags would (the step's tags, then PAD_TAG), whatever the fills
before it left: longer, shorter, empty, longer than the buffer."""
from __future__ import annotations

import torch

from cuda_path.graphs import _StaticTags
from simulator.kvrows import pad_tags


def test_static_tags_hold_pad_tags_after_every_fill():
    n = 16
    static = _StaticTags(torch.full((n,), -1, dtype=torch.int64))     # (a piece's buffer starts at -1)
    lengths = [5, 9, 9, 3, 0, 16, 20, 7, 1, 12, 2]
    for step, m in enumerate(lengths):
        tags = torch.arange(m, dtype=torch.int64) + 1000 * (step + 1)
        static.fill(tags)
        assert torch.equal(static.buf, pad_tags(tags, n)), (step, m)
        assert static.real == min(m, n)
