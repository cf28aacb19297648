"""cuda_path/step.py's host side of a step's one staged copy: the expected tag words made on the host equal
the device's ``tag_lanes`` words bit for bit, and the byte staging gives every array back in its own dtype,
shape and values (views of one buffer, no cast)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from cuda_path import tag_words as step
from cuda_path.staging import Staging, stage_layout, stage_pack, stage_views
from cuda_path.tag_words import host_tag_words
from simulator.oracle.kvrows import tag_lanes
from simulator.records import PAD_TAG


def _tags() -> np.ndarray:
    rng = np.random.default_rng(7)
    return np.concatenate([np.array([0, PAD_TAG, -2, 1, 2, 15, 16, 2**31 - 1, 2**32 - 3, 2**33 + 11, 0]),
                           rng.integers(0, 2**32 - 2, 5000), rng.integers(1, 300, 500)]).astype(np.int64)


@pytest.mark.parametrize("storage", [torch.bfloat16, torch.float16, torch.uint8])
def test_host_tag_words_are_tag_lanes_bits(storage):
    tags = _tags()
    want = tag_lanes(torch.from_numpy(tags), storage).contiguous().view(torch.int64).numpy()
    got = host_tag_words(tags, storage)
    words = 1 if storage == torch.uint8 else 2          # 8 lanes of 1 or 2 bytes
    assert got.dtype == np.int64 and got.shape == want.shape == (tags.shape[0], words)
    assert np.array_equal(got, want)
    assert not got[tags == 0].any() and got[tags != 0].all(axis=1).all()
    assert host_tag_words(tags[:0], storage).shape == (0, want.shape[1])


@pytest.mark.parametrize("storage", [torch.bfloat16, torch.uint8])
def test_host_tag_words_per_lane_path_is_the_same(storage, monkeypatch):
    tags = _tags()
    bits, pairs = step._nibble_bits(storage)
    assert pairs is not None                 # the byte table: the path every run takes on a little-endian host
    fast = host_tag_words(tags, storage)
    monkeypatch.setitem(step._NIBBLE_BITS, storage, (bits, None))
    assert np.array_equal(host_tag_words(tags, storage), fast)
    monkeypatch.setitem(step._NIBBLE_BITS, storage, None)       # (no table: tag_lanes on the host)
    assert np.array_equal(host_tag_words(tags, storage), fast)


def _arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.integers(-2**40, 2**40, 7), rng.integers(-2**31, 2**31 - 1, 5).astype(np.int32),
            np.array([True, False, True]), np.arange(3, dtype=np.uint8) + 250, np.zeros(0, dtype=np.int64),
            rng.integers(-9, 9, (4, 2)), np.arange(6, dtype=np.int64)[::2], np.zeros(0, dtype=np.int32),
            rng.integers(0, 2**20, 3).astype(np.int32)]


def _check(got: list[torch.Tensor], arrays: list[np.ndarray]) -> None:
    assert len(got) == len(arrays)
    for t, a in zip(got, arrays):
        assert t.dtype == torch.from_numpy(np.ascontiguousarray(a)).dtype and tuple(t.shape) == a.shape
        assert np.array_equal(t.cpu().numpy(), a)


def test_staged_bytes_give_each_array_back_in_its_dtype():
    arrays = _arrays()
    flat, offsets, total = stage_layout(arrays)
    assert all(o % 8 == 0 for o in offsets) and total % 8 == 0
    assert offsets == [0, 56, 80, 88, 96, 96, 160, 184, 184] and total == 200
    buf = torch.full((total + 16,), 0xAB, dtype=torch.uint8)
    stage_pack(buf.numpy(), flat, offsets)
    got = stage_views(buf[:total], flat, offsets)
    _check(got, arrays)
    assert all(t.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr() for t in got)   # views: no copy


def test_staging_off_cuda_is_the_host_arrays():
    _check(Staging().put(_arrays(), torch.device("cpu")), _arrays())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_staging_on_cuda_is_one_copy_per_put_in_each_dtype():
    staging, dev = Staging(), torch.device("cuda")
    for rep in range(2 * Staging.RING + 1):         # the ring wraps: each buffer filled again after its copy
        arrays = [a + rep if a.dtype != np.bool_ else a for a in _arrays()]
        got = staging.put(arrays, dev)
        assert all(t.device.type == "cuda" for t in got)
        _check(got, arrays)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_staging_records_an_event_only_for_a_copy_no_read_waited_for():
    staging, dev = Staging(), torch.device("cuda")
    for rep in range(2 * Staging.RING + 1):         # a read after each copy (the runner's verdict read): no event
        arrays = [a + rep if a.dtype != np.bool_ else a for a in _arrays()]
        got = staging.put(arrays, dev)
        _check(got, arrays)                          # (reads the device: waits for the copy)
        staging.synced()
    assert staging._events == [None] * Staging.RING
    first = staging.put(_arrays(), dev)              # no read after it: the next put marks it with an event
    second = staging.put([a + 1 if a.dtype != np.bool_ else a for a in _arrays()], dev)
    assert sum(e is not None for e in staging._events) == 1
    _check(first, _arrays())
    _check(second, [a + 1 if a.dtype != np.bool_ else a for a in _arrays()])
