"""Stored gate-path probe results of a run, one per arm."""

from __future__ import annotations

import json
from typing import Any

from suite.store import read_json


def load_probe_results(run: Any) -> dict[str, dict[str, Any]]:
    ok = {(r["job"]["arm"], r["job"]["point"]) for r in run.records
          if r.get("job", {}).get("kind") == "probe" and r.get("status") == "ok"}
    out = {}
    for arm in run.arms:
        path = run.root / arm / "probe" / "gate-paths" / "rep-0.json"
        if (arm, "gate-paths") in ok and path.is_file():
            try:
                out[arm] = read_json(path)
            except (OSError, json.JSONDecodeError):
                continue
    return out


FROZEN = "compiled graph (frozen: torch.mm/F.linear inside the graph)"


NOT_EXERCISED = "not exercised"
