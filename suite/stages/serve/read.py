"""Serving results of a run, read through the store: per point, per arm, per round (the job's ``repeat``).

Each result is the JSON `vllm bench serve --save-result --save-detailed` wrote, read as a `ServeResult` through
`suite.store.load_results`: a file that is missing, not JSON or not the tool's shape is named (`Unreadable`),
not skipped without a word. Keyed by round index, never by list position: a lost repeat leaves a gap, so
pairing by round (ABBA) can drop it from both sides instead of pairing neighbours. The end-of-session drift
repeat (tag ``drift``) is kept apart. Also the server start records (`ServerStart`, one JSON beside each server
log) and the server logs of each session, which the data-quality checks read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from suite.records import HostIdentity, JobRecord
from suite.stages.serve.spec import ServeParams
from suite.store import RunStore, Unreadable, load_results, read_json

DRIFT_TAG = "drift"
MAX_RESTARTS_READ = 32  # server attempts of one session looked for (a matrix allows far fewer restarts)


def finite_number(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (not a bool); else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


class ServeResult(BaseModel):
    """One `vllm bench serve` result (``--save-result --save-detailed``), as far as the suite reads it. Every
    field is optional: the tool's versions differ in what they write (older ones lack ``itls``, newer ones
    ``latencies``). The metrics (``mean_tpot_ms``, ``p90_ttft_ms``, ...) are keys of their own, read by name
    with `metric`; every other key rides along as an extra."""

    model_config = ConfigDict(extra="allow", frozen=True)

    completed: int | None = None
    failed: int | None = None
    num_prompts: int | None = None
    duration: float | None = None  # seconds of the measurement
    request_rate: float | None = None  # the tool writes "inf" (or Infinity) for a closed loop
    max_concurrency: int | None = None
    total_output_tokens: int | None = None
    output_throughput: float | None = None
    latencies: list[float] | None = None  # per request, seconds
    ttfts: list[float] | None = None  # per request, seconds
    itls: list[list[float]] | None = None  # per request: the gaps between its chunks after the first, seconds
    output_lens: list[int] | None = None  # per request
    errors: list[str] | None = None  # per request: "" when it succeeded

    def number(self, key: str) -> float | None:
        """The value of a declared field or an extra named ``key`` when it is a number (not a bool), inf and
        NaN included (the statistics refuse those aloud); None when absent or not a number."""
        value = getattr(self, key) if key in type(self).model_fields else (self.model_extra or {}).get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value)

    def metric(self, key: str) -> float | None:
        """The finite value of a declared field or an extra named ``key`` (e.g. "mean_tpot_ms",
        "output_throughput"); None when absent, not a number, a bool, or not finite."""
        return finite_number(self.number(key))


class ServerStart(BaseModel):
    """The record of one server start (an attempt of a session), as the runner writes it beside the server log
    once /health answered; keys the suite does not read ride along."""

    model_config = ConfigDict(extra="allow", frozen=True)

    arm: str
    session: int
    attempt: int = 0  # 0: the session's first start; n: its n-th restart
    healthy_after_s: float | None = None  # from the start to the first healthy /health
    window: int | None = None
    started: str | None = None
    port: int | None = None
    cpus: list[int] | None = None
    client_cpus: list[int] | None = None
    argv: list[str] = []
    where: HostIdentity | None = None  # the machine and its GPUs' clocks at the start (records before 2026-12-07: None)


@dataclass
class PointResults:
    point: str
    params: ServeParams
    reps: dict[str, dict[int, ServeResult]] = field(default_factory=dict)  # arm -> round -> result
    records: dict[str, dict[int, JobRecord]] = field(default_factory=dict)  # arm -> round -> job record
    drift: dict[str, dict[int, ServeResult]] = field(default_factory=dict)  # arm -> round -> the drift repeat

    def values(self, arm: str, key: str) -> dict[int, float]:
        """round -> value of one metric (rounds whose result lacks it are left out)."""
        return {r: v for r, raw in sorted(self.reps.get(arm, {}).items()) if (v := raw.number(key)) is not None}


@dataclass(frozen=True)
class ServePoints:
    """Every point's results (ordered by ISL, OSL, concurrency), and the stored results of ok serve jobs that
    could not be read (file and why)."""

    points: dict[str, PointResults]
    unreadable: list[Unreadable]


def load_points(store: RunStore, records: Sequence[JobRecord]) -> ServePoints:
    """Every ok serve job with its result, by point (ordered by ISL, OSL, concurrency); a result that is
    missing, not JSON or not the tool's shape is listed in ``unreadable``."""
    stored = load_results(store, records, "serve", ServeResult)
    by_job = {(rec.job.arm, rec.job.key): rec for rec in records if rec.job.kind == "serve" and rec.ok}
    points: dict[str, PointResults] = {}
    for job, raw in stored.found:
        assert isinstance(job.params, ServeParams), job.kind
        pr = points.setdefault(job.point, PointResults(job.point, job.params))
        if job.tag == DRIFT_TAG:
            pr.drift.setdefault(job.arm, {})[job.repeat] = raw
        elif not job.tag:
            pr.reps.setdefault(job.arm, {})[job.repeat] = raw
            pr.records.setdefault(job.arm, {})[job.repeat] = by_job[(job.arm, job.key)]
    for pr in points.values():
        pr.reps = {a: dict(sorted(r.items())) for a, r in pr.reps.items()}

    def order(p: PointResults) -> tuple[Any, ...]:
        return (p.params.isl, p.params.osl, p.params.concurrency, p.point)

    return ServePoints({p.point: p for p in sorted(points.values(), key=order)}, stored.unreadable)


class PrecompileStart(BaseModel):
    """The record of one precompile server (matrix ``precompile``), as the runner writes it beside its log once
    /health answered; a stretch's precompile writes it again, so it holds the last stretch's."""

    model_config = ConfigDict(extra="allow", frozen=True)

    arm: str
    gpus: str | None = None
    started: str | None = None  # servers of one window share it: they start together
    healthy_after_s: float | None = None


def precompile_records(store: RunStore, arms: Sequence[str]) -> list[PrecompileStart]:
    """Every precompile server's record of the given arms (one a GPU group); one that cannot be read as a
    `PrecompileStart` is passed over."""
    out = []
    for arm in arms:
        for path in sorted(store.arm_dir(arm).glob("precompile*.json")):
            try:
                out.append(PrecompileStart.model_validate(read_json(path)))
            except (OSError, json.JSONDecodeError, ValidationError):
                continue
    return out


def server_records(store: RunStore, sessions: set[tuple[str, int]]) -> list[ServerStart]:
    """The record of every server start (attempt) of the given (arm, session)s, as the runner wrote it beside
    the server log; one that cannot be read as a `ServerStart` is passed over (the log still counts)."""
    out = []
    for arm, session in sorted(sessions):
        for attempt in range(MAX_RESTARTS_READ):
            path = store.server_record_path(arm, session, attempt)
            if not path.is_file():
                break
            try:
                out.append(ServerStart.model_validate(read_json(path)))
            except (OSError, json.JSONDecodeError, ValidationError):
                continue
    return out


def server_logs(store: RunStore, sessions: set[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """(arm, session) -> the text of every server log of that session (all attempts, in order)."""
    out = {}
    for arm, session in sorted(sessions):
        texts = []
        for attempt in range(MAX_RESTARTS_READ):
            path = store.server_log(arm, session, attempt)
            if not path.is_file():
                break
            try:
                texts.append(path.read_text(errors="replace"))
            except OSError:
                continue
        if texts:
            out[(arm, session)] = "\n".join(texts)
    return out
