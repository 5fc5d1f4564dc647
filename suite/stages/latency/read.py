"""Latency results of a run: the raw `vllm bench latency` JSON of every latency job, per arm and shape."""

from __future__ import annotations

import json
from collections.abc import Sequence

from suite.plan import LatencyParams
from suite.store import JobRecord, RunStore, ok_jobs, read_json


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default), q in [0, 1]."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


Shape = tuple[int, int, int]  # (input_len, output_len, batch_size)


def load_latency(store: RunStore, records: Sequence[JobRecord]) -> dict[Shape, dict[str, dict[int, list[float]]]]:
    """(input_len, output_len, batch_size) -> arm -> round (one process, one engine start each) -> its
    per-iteration latencies in ms, from the raw files."""
    out: dict[Shape, dict[str, dict[int, list[float]]]] = {}
    for job in ok_jobs(records, "latency"):
        try:
            lat = read_json(store.result_path(job)).get("latencies")
        except (OSError, json.JSONDecodeError, AttributeError):
            continue
        if not isinstance(lat, list) or not lat or not all(isinstance(x, int | float) and x > 0 for x in lat):
            continue  # not the tool's output: the row shows "missing"
        p = job.params
        assert isinstance(p, LatencyParams), job.kind
        key = (p.input_len, p.output_len, p.batch_size)
        out.setdefault(key, {}).setdefault(job.arm, {})[job.repeat] = [float(x) * 1000.0 for x in lat]
    return {k: {arm: dict(sorted(rounds.items())) for arm, rounds in arms.items()} for k, arms in sorted(out.items())}
