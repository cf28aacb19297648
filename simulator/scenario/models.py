"""Model geometry: which layers are full and which sliding-window, and their KV shapes.

Presets follow the models' hybrid layer patterns as SGLang serves them (docs/SCENARIOS.md lists
them). Values not checked against the models' published configs are flagged in ``Model.unverified``
so reports can say so; every value can be overridden in the scenario's ``[model]`` table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from simulator.records import LayerInfo

KV_DTYPES = ("bf16", "fp16", "fp8_e4m3")


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """Shape of one K and one V row for a layer kind: ``[heads, head_dim]`` and ``[heads, v_head_dim]``."""

    heads: int
    head_dim: int
    v_head_dim: int


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    layer_kinds: tuple[str, ...]        # per global layer: "full" | "swa"
    window: int
    full: KVGeometry
    swa: KVGeometry
    kv_dtype: str = "bf16"
    unverified: tuple[str, ...] = ()
    preset: Optional[str] = None        # the preset it was built from (its unverified values come with it)

    @property
    def num_layers(self) -> int:
        return len(self.layer_kinds)

    def layers(self) -> tuple[LayerInfo, ...]:
        """Global layer id -> (kind, index inside its sub-pool), numbering each kind in order."""
        counts = {"full": 0, "swa": 0}
        out = []
        for i, kind in enumerate(self.layer_kinds):
            out.append(LayerInfo(layer=i, kind=kind, index=counts[kind]))
            counts[kind] += 1
        return tuple(out)

    def count(self, kind: str) -> int:
        return sum(1 for k in self.layer_kinds if k == kind)

    def geometry(self, kind: str) -> KVGeometry:
        return self.full if kind == "full" else self.swa


def pattern_alternating(n: int, swa_first: bool = True) -> tuple[str, ...]:
    """gpt-oss: 1:1 alternating, even layers SWA."""
    return tuple(("swa" if (i % 2 == 0) == swa_first else "full") for i in range(n))


def pattern_every(n: int, period: int) -> tuple[str, ...]:
    """Layer i is full iff (i + 1) % period == 0; the rest SWA (Llama 4: 4, MiMo/Gemma: 6)."""
    return tuple("full" if (i + 1) % period == 0 else "swa" for i in range(n))


def format_pattern(kinds) -> str:
    """The pattern string for layer kinds: 'S' per SWA layer, 'F' per full layer (the inverse of parse_pattern)."""
    return "".join("S" if k == "swa" else "F" for k in kinds)


def parse_pattern(text: str) -> tuple[str, ...]:
    """An explicit layer pattern: 'S' for SWA, 'F' for full, e.g. "SFSF" or "S,F,S,F"."""
    kinds = []
    for ch in text.replace(",", "").replace(" ", ""):
        if ch in "sS":
            kinds.append("swa")
        elif ch in "fF":
            kinds.append("full")
        else:
            raise ValueError(f"layer pattern may hold only 'S' (swa) and 'F' (full), found {ch!r}")
    return tuple(kinds)


PRESETS: dict[str, Model] = {
    "gpt-oss-120b": Model(
        name="gpt-oss-120b", preset="gpt-oss-120b", layer_kinds=pattern_alternating(36), window=128,
        full=KVGeometry(8, 64, 64), swa=KVGeometry(8, 64, 64),
    ),
    "gpt-oss-20b": Model(
        name="gpt-oss-20b", preset="gpt-oss-20b", layer_kinds=pattern_alternating(24), window=128,
        full=KVGeometry(8, 64, 64), swa=KVGeometry(8, 64, 64),
    ),
    "llama4": Model(
        name="llama4", preset="llama4", layer_kinds=pattern_every(48, 4), window=8192,
        full=KVGeometry(8, 128, 128), swa=KVGeometry(8, 128, 128),
        unverified=("heads", "head_dim"),
    ),
    "mimo-v2-flash": Model(
        name="mimo-v2-flash", preset="mimo-v2-flash", layer_kinds=pattern_every(48, 6), window=128,
        full=KVGeometry(4, 128, 128), swa=KVGeometry(8, 128, 128),
        unverified=("head_dim", "layer pattern phase"),
    ),
    "gemma4-31b": Model(
        name="gemma4-31b", preset="gemma4-31b", layer_kinds=pattern_every(60, 6), window=1024,
        full=KVGeometry(4, 512, 512), swa=KVGeometry(8, 256, 256),
        unverified=("heads", "layer pattern phase"),
    ),
}
