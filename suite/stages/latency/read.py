"""Latency results of a run: the raw `vllm bench latency` JSON of every latency job, read as a typed shape, per
arm and shape."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from suite.records import JobRecord
from suite.stages.latency.spec import LatencyParams
from suite.store import RunStore, Unreadable, load_results


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default), q in [0, 1]."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


Shape = tuple[int, int, int]  # (input_len, output_len, batch_size)


class LatencyResult(BaseModel):
    """What `vllm bench latency --output-json` writes, as far as the suite reads it: one latency in seconds per
    timed iteration (every one a positive number). Other keys (its percentiles) ride along."""

    model_config = ConfigDict(extra="allow")

    latencies: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(min_length=1)


@dataclass(frozen=True)
class LatencyData:
    """(input_len, output_len, batch_size) -> arm -> round (one process, one engine start each) -> its
    per-iteration latencies in ms; and the stored results that could not be read (file and why)."""

    shapes: dict[Shape, dict[str, dict[int, list[float]]]]
    unreadable: list[Unreadable]


def load_latency(store: RunStore, records: Sequence[JobRecord]) -> LatencyData:
    """Every ok latency job's raw result, by shape, arm and round; a file that is missing, not JSON or not the
    tool's output is named in ``unreadable``, never dropped without a word."""
    stored = load_results(store, records, "latency", LatencyResult)
    out: dict[Shape, dict[str, dict[int, list[float]]]] = {}
    for job, result in stored.found:
        p = job.params
        assert isinstance(p, LatencyParams), job.kind
        key = (p.input_len, p.output_len, p.batch_size)
        out.setdefault(key, {}).setdefault(job.arm, {})[job.repeat] = [x * 1000.0 for x in result.latencies]
    shapes = {k: {arm: dict(sorted(rounds.items())) for arm, rounds in arms.items()} for k, arms in sorted(out.items())}
    return LatencyData(shapes, stored.unreadable)
