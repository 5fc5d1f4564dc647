"""Serving results of a run, read through the store: per point, per arm, per round (the job's ``repeat``).

Keyed by round index, never by list position: a lost repeat leaves a gap, so pairing by round (ABBA) can
drop it from both sides instead of pairing neighbours. The end-of-session drift repeat (tag ``drift``) is
kept apart. Also the server records (one JSON beside each server log) and the server logs of each session,
which the data-quality checks read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from suite.plan import ServeParams
from suite.store import JobRecord, RunStore, read_json

DRIFT_TAG = "drift"
MAX_RESTARTS_READ = 32  # server attempts of one session looked for (a matrix allows far fewer restarts)


@dataclass
class PointResults:
    point: str
    params: ServeParams
    reps: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)  # arm -> round -> raw result
    records: dict[str, dict[int, JobRecord]] = field(default_factory=dict)  # arm -> round -> job record
    drift: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)  # arm -> round -> the drift repeat

    def values(self, arm: str, key: str) -> dict[int, float]:
        """round -> value of one metric (rounds whose result lacks it are left out)."""
        return {r: float(raw[key]) for r, raw in sorted(self.reps.get(arm, {}).items())
                if isinstance(raw.get(key), int | float) and not isinstance(raw.get(key), bool)}


def load_points(store: RunStore, records: Sequence[JobRecord]) -> dict[str, PointResults]:
    """Every ok serve job with its raw result, by point (ordered by ISL, OSL, concurrency)."""
    points: dict[str, PointResults] = {}
    for rec in records:
        job = rec.job
        if job.kind != "serve" or not rec.ok:
            continue
        path = store.result_path(job)
        try:
            raw = read_json(path)
        except (OSError, json.JSONDecodeError):
            continue  # an ok record without its result: the point shows the gap
        if not isinstance(raw, dict):
            continue
        assert isinstance(job.params, ServeParams), job.kind
        pr = points.setdefault(job.point, PointResults(job.point, job.params))
        if job.tag == DRIFT_TAG:
            pr.drift.setdefault(job.arm, {})[job.repeat] = raw
        elif not job.tag:
            pr.reps.setdefault(job.arm, {})[job.repeat] = raw
            pr.records.setdefault(job.arm, {})[job.repeat] = rec
    for pr in points.values():
        pr.reps = {a: dict(sorted(r.items())) for a, r in pr.reps.items()}

    def order(p: PointResults) -> tuple[Any, ...]:
        return (p.params.isl, p.params.osl, p.params.concurrency, p.point)

    return {p.point: p for p in sorted(points.values(), key=order)}


def server_records(store: RunStore, sessions: set[tuple[str, int]]) -> list[dict[str, Any]]:
    """The record of every server start (attempt) of the given (arm, session)s, as the runner wrote it beside
    the server log (arm, session, attempt, healthy_after_s, ...)."""
    out = []
    for arm, session in sorted(sessions):
        for attempt in range(MAX_RESTARTS_READ):
            path = store.server_record_path(arm, session, attempt)
            if not path.is_file():
                break
            try:
                rec = read_json(path)
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(rec, dict):
                out.append(rec)
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
