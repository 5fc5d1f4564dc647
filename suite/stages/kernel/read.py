"""Stored router-gate kernel results of a run: the JSON `suite.stages.kernel.bench` wrote, one per arm."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from suite.store import JobRecord, RunStore, ok_jobs, read_json


def load_kernel_runs(store: RunStore, records: Sequence[JobRecord]) -> dict[str, dict[int, dict[str, Any]]]:
    """arm -> round -> the kernel result of that round's process (one per round with ``offline_repeats``)."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for job in ok_jobs(records, "kernel"):
        try:
            result = read_json(store.result_path(job))
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(result, dict):
            out.setdefault(job.arm, {})[job.repeat] = result
    return {arm: dict(sorted(rounds.items())) for arm, rounds in out.items()}

