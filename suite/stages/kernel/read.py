"""Stored router-gate kernel results of a run: the JSON `suite.stages.kernel.bench` wrote, one per arm."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from suite.store import JobRecord, RunStore, ok_jobs, read_json


def load_kernel_results(store: RunStore, records: Sequence[JobRecord]) -> dict[str, dict[str, Any]]:
    """arm -> its kernel result (the ok kernel job of that arm)."""
    out: dict[str, dict[str, Any]] = {}
    for job in ok_jobs(records, "kernel"):
        try:
            result = read_json(store.result_path(job))
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(result, dict):
            out[job.arm] = result
    return out
