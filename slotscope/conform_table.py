"""The table every ``slotscope conform`` comparison ends with (SGLang's, slotscope/conform.py; vLLM's,
slotscope/conform_vllm.py): per field, the steps equal and differing."""
from __future__ import annotations

import sys


def print_fields(fields: dict, out=sys.stdout) -> None:
    print(f"\n{'field':<28} {'equal':>7} {'differs':>8}", file=out)
    for field, (eq, df) in fields.items():
        print(f"{field:<28} {eq:>7} {df:>8}", file=out)
