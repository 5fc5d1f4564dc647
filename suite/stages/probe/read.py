"""Stored gate-path probe results of a run, one per arm."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from suite.store import JobRecord, RunStore, ok_jobs, read_json


def load_probe_results(store: RunStore, records: Sequence[JobRecord],
                       arms: list[str]) -> dict[str, dict[str, Any]]:
    """arm -> its stored probe result (the ok probe job of that arm), in the order of ``arms``."""
    found: dict[str, dict[str, Any]] = {}
    for job in ok_jobs(records, "probe"):
        if job.arm not in arms:
            continue
        try:
            found[job.arm] = read_json(store.result_path(job))
        except (OSError, json.JSONDecodeError):
            continue
    return {arm: found[arm] for arm in arms if arm in found}


FROZEN = "compiled graph (frozen: torch.mm/F.linear inside the graph)"
# a bucket whose steps made no Python gate call at run time, but whose gate did run in Python while the server
# started (CUDA-graph capture, warm-up): a replayed CUDA graph runs the kernels its capture recorded
REPLAYED = "replayed graph, captured at startup with"


NOT_EXERCISED = "not exercised"
