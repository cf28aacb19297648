"""Tagged K/V rows: how a token's identity travels through the pool bit-exactly.

Each real token gets a unique integer tag (>= 1); padding rows carry ``PAD_TAG``; a zeroed row reads
as tag 0 ("empty"). A row's first ``TAG_LANES`` lanes hold the tag as 4-bit nibbles, each stored as
the value ``nibble + 1`` (1..16). Every integer 1..16 is exact in bf16, fp16 and fp8_e4m3, so the tag
survives a bf16/fp16 store bit for bit and an fp8 store's divide-by-scale-and-cast exactly whenever
``value * scale / scale`` rounds back to the integer (any scale that is a power of two, and any
ordinary scale since e4m3 rounds to the nearest of these integers). Lane ``TAG_LANES`` holds
``layer + 1`` (so a row written by the wrong layer is visible); the rest is a payload derived from
the tag (and the layer the rows were first made for), so rows are not mostly constant.

Rows of at least ``TAIL_TAG_MIN_WIDTH`` lanes (every real geometry; compact 16-lane rows are narrower) also
carry the tag at their end: the last ``TAG_LANES`` lanes hold the same nibble encoding as the first, in
place of payload lanes. A pool that lays each slot's V row right after its K row (cuda_path/pool.py's
``paired`` layout) then has K's tail tag and V's head tag side by side in one 32-byte sector, which the
GPU checker reads in one load. :func:`decode_tags` and :func:`set_layer_lane` still use the head only.
"""
from __future__ import annotations

import torch

from simulator.records import PAD_TAG

TAG_LANES = 8            # 8 nibbles: tags up to 2**32 - 3
MIN_ROW_WIDTH = TAG_LANES + 1
TAIL_TAG_MIN_WIDTH = 2 * TAG_LANES + 1   # rows this wide repeat the tag in their last TAG_LANES lanes
_SHIFTS: dict[torch.device, torch.Tensor] = {}
INVALID_TAG = -2         # a row whose tag lanes are not a valid encoding (corrupted)


def _shifts(device: torch.device) -> torch.Tensor:
    """Nibble shifts on ``device``, made once: no host-to-device copy later (CUDA-graph capture safe)."""
    t = _SHIFTS.get(device)
    if t is None:
        t = _SHIFTS[device] = torch.arange(TAG_LANES, dtype=torch.int64, device=device) * 4
    return t


def row_dtype(kv_dtype: str) -> torch.dtype:
    """The dtype of the K/V rows the model produces (fp8 pools store them after scaling and casting)."""
    return torch.float16 if kv_dtype == "fp16" else torch.bfloat16


def encode_rows(tags: torch.Tensor, layer: int, heads: int, head_dim: int, dtype: torch.dtype,
                scale: float = 1.0) -> torch.Tensor:
    """Rows ``[n, heads, head_dim]`` carrying ``tags`` (int64 [n]); values pre-multiplied by ``scale``."""
    n = tags.shape[0]
    width = heads * head_dim
    if width < MIN_ROW_WIDTH:
        raise ValueError(f"a K/V row needs at least {MIN_ROW_WIDTH} lanes, got heads*head_dim={width}")
    code = (tags.to(torch.int64) + 2)
    nibbles = (code[:, None] >> _shifts(tags.device)) & 0xF
    rows = torch.empty((n, width), dtype=torch.float32, device=tags.device)
    rows[:, :TAG_LANES] = (nibbles + 1).to(torch.float32)
    rows[:, TAG_LANES] = float(layer + 1)
    if width > MIN_ROW_WIDTH:
        # payload: a small deterministic function of (tag, layer, lane), exact in every dtype
        lanes = torch.arange(width - MIN_ROW_WIDTH, device=tags.device, dtype=torch.int64)
        rows[:, MIN_ROW_WIDTH:] = ((code[:, None] * 7 + layer * 3 + lanes) % 15 + 1).to(torch.float32)
    if width >= TAIL_TAG_MIN_WIDTH:     # the tag again at the row's end (the paired layout's checker reads it)
        rows[:, width - TAG_LANES:] = rows[:, :TAG_LANES]
    if scale != 1.0:
        rows *= scale
    return rows.to(dtype).view(n, heads, head_dim)


def set_layer_lane(rows: torch.Tensor, layer: int, scale: float = 1.0) -> None:
    """Re-stamp rows made by :func:`encode_rows` for another layer (cheap: one lane)."""
    rows.view(rows.shape[0], -1)[:, TAG_LANES] = float(layer + 1) * scale


def decode_tags(rows: torch.Tensor, fp8: bool = False) -> torch.Tensor:
    """Tags (int64) from stored rows ``[..., width]``: 0 for zeroed rows, INVALID_TAG for garbage."""
    lanes = rows[..., :TAG_LANES]
    if fp8:
        lanes = lanes.view(torch.float8_e4m3fn)
    vals = lanes.to(torch.float32)
    nib = vals.to(torch.int64) - 1        # exact for valid lanes (integers 1..16)
    ok = ((nib >= 0) & (nib <= 15) & (vals == (nib + 1))).all(dim=-1)
    tags = (nib.clamp_(0, 15) << _shifts(rows.device)).sum(dim=-1) - 2
    tags = torch.where(ok, tags, torch.full_like(tags, INVALID_TAG))
    return torch.where((vals == 0).all(dim=-1), torch.zeros_like(tags), tags)


def tag_lanes(tags: torch.Tensor, storage: torch.dtype) -> torch.Tensor:
    """The exact stored bits of the tag lanes for ``tags`` (0 -> a zeroed row), ``[n, TAG_LANES]`` in the
    pool's storage dtype: comparing these bits is how the checker avoids decoding every row it reads."""
    code = tags.to(torch.int64) + 2
    vals = (((code[:, None] >> _shifts(tags.device)) & 0xF) + 1).to(torch.float32)
    vals[tags == 0] = 0.0
    if storage == torch.uint8:
        return vals.to(torch.float8_e4m3fn).view(torch.uint8)
    return vals.to(storage)


def pad_tags(real: torch.Tensor, total: int) -> torch.Tensor:
    """Tags of a layer's rows: the real tokens' tags, then ``PAD_TAG`` for padded rows."""
    out = torch.full((total,), PAD_TAG, dtype=torch.int64, device=real.device)
    n = min(total, real.shape[0])
    out[:n] = real[:n]
    return out
