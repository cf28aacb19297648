"""The report's fault table (--inject, simulator/plugins/faults.py): which faults were detected, in which finding
class, how many steps later. Read from the run directory's faults.jsonl; None when the run injected none."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

MAX_ROWS = 200


def fault_view(run_dir: Path) -> Optional[dict[str, Any]]:
    """Per kind: injected, detected, classes, steps after (min..max); and the first MAX_ROWS faults."""
    path = Path(run_dir) / "faults.jsonl"
    if not path.is_file():
        return None
    faults = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            faults.append(json.loads(line))
        except ValueError:
            continue
    kinds: dict[str, dict[str, Any]] = {}
    for f in faults:
        k = kinds.setdefault(f.get("kind", "?"), {"injected": 0, "detected": 0, "classes": {}, "after": []})
        k["injected"] += 1
        d = f.get("detected")
        if d:
            k["detected"] += 1
            k["classes"][d["class"]] = k["classes"].get(d["class"], 0) + 1
            k["after"].append(int(d["steps_after"]))
    rows = []
    for name, k in kinds.items():
        after = k["after"]
        span = "-" if not after else (str(min(after)) if min(after) == max(after) else f"{min(after)}..{max(after)}")
        rows.append({"kind": name, "injected": k["injected"], "detected": k["detected"],
                     "classes": ", ".join(f"{c} {n}" for c, n in sorted(k["classes"].items())) or "-",
                     "steps_after": span, "missed": k["injected"] - k["detected"]})
    detail = [{"step": f.get("step"), "backend": f.get("backend"), "layer": f.get("layer"), "slot": f.get("slot"),
               "kind": f.get("kind"), "detail": f.get("detail", ""),
               "found": "-" if not f.get("detected") else
               f"{f['detected']['class']} at step {f['detected']['step']} (+{f['detected']['steps_after']})"}
              for f in faults[:MAX_ROWS]]
    return {"rows": rows, "faults": detail, "total": len(faults),
            "detected": sum(r["detected"] for r in rows), "truncated": len(faults) > MAX_ROWS}
