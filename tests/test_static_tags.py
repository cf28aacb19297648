"""cuda_path.graphs._StaticTags: a static tags buffer filled in one copy where it can be holds, after every
fill, exactly what ``pad_tags`` of that step's tags would (the step's tags, then PAD_TAG), whatever the fills
before it left: longer, shorter, empty, longer than the buffer."""
from __future__ import annotations

import torch

from cuda_path.graphs import _StaticTags
from simulator.oracle.kvrows import pad_tags


def test_static_tags_hold_pad_tags_after_every_fill():
    n = 16
    static = _StaticTags(torch.full((n,), -1, dtype=torch.int64))     # (a piece's buffer starts at -1)
    lengths = [5, 9, 9, 3, 0, 16, 20, 7, 1, 12, 2]
    for step, m in enumerate(lengths):
        tags = torch.arange(m, dtype=torch.int64) + 1000 * (step + 1)
        static.fill(tags)
        assert torch.equal(static.buf, pad_tags(tags, n)), (step, m)
        assert static.real == min(m, n)


def test_the_step_runners_tag_copy_leaves_what_a_fill_would_and_marks_the_step_filled():
    import numpy as np

    from cuda_path.graphs import CudaGraphExecutor
    from simulator.records import PAD_TAG

    n, dev = 16, torch.device("cpu")
    ex, ref = CudaGraphExecutor(), _StaticTags(torch.full((n,), PAD_TAG, dtype=torch.int64))
    lengths = [9, 3, 16, 5, 5, 1]
    for step, m in enumerate(lengths):
        tags = np.arange(m, dtype=np.int64) + 1000 * (step + 1)
        if step % 2:                        # the executor's own fill between the runner's copies
            ex._tags_of(n, dev).fill(torch.from_numpy(tags))
        else:
            padded = np.full(n, PAD_TAG, dtype=np.int64)
            padded[:m] = tags               # (as cuda_path/step.py stages it)
            rows_cache: dict = {}
            copies = ex.decode_tags_copy(n, m, torch.from_numpy(padded), rows_cache)
            for dst, src in copies:
                dst.copy_(src)
            assert rows_cache == {("decode-tags", n): True}     # the step's replays fill nothing more
        ref.fill(torch.from_numpy(tags))
        static = ex._tags_of(n, dev)
        assert torch.equal(static.buf, ref.buf) and static.real == ref.real == m, (step, m)
