"""Stored router-gate kernel results of a run: the JSON `suite.stages.kernel.bench` wrote, one per arm."""

from __future__ import annotations

import json
from typing import Any

from suite.plan import Job
from suite.store import RunStore, read_json


def load_kernel_results(store: RunStore, jobs: list[tuple[Job, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """arm -> its kernel result (the ok kernel job of that arm)."""
    out: dict[str, dict[str, Any]] = {}
    for job, rec in jobs:
        if job.kind != "kernel" or rec.get("status") != "ok":
            continue
        try:
            result = read_json(store.result_path(job))
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(result, dict):
            out[job.arm] = result
    return out
