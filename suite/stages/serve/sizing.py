"""One prompt count per round for a point sized by time (``num_prompts: "60s"``; its params' ``duration_s``).

A point sized by time gets its prompt count from a request rate. Each arm used to take it from its own session's
warm-up, so the arms of one round measured different work: in one demo round the arms served 15 and 28
prompts at concurrency 1, and a fixed slow start of a point (its server, idle while the other arms measured,
served its first ~0.6 s at half speed on the 2-core box) weighed twice as much in the short one (an A/A pair
10 % apart). Now the count is decided once per round and
point, by the round's first arm to measure the point, and every other arm of the round reads it back from that
arm's record: the same count and seed, so the same requests.

Where the rate comes from:
- a round after the first: every arm's run of the point in the latest earlier round, the median of their
  request rates (completed requests over the measured seconds), so the point lasts about ``duration_s`` on a
  typical arm; the warm-up's few requests read the rate low (a concurrency-1 point meant for 3 s lasted 1.3 s);
- the first round: the session's warm-up at the point's shape (``suite.stages.serve.warmup``).

Counts are read from the run's stored records, so a resumed run keeps the counts of the rounds it had begun.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from suite.errors import SuiteError
from suite.plan import Job
from suite.records import JobRecord
from suite.stages.serve.read import ServeResult
from suite.store import RunStore, load_results


class PointSize(BaseModel):
    """How a point sized by time got its prompt count, as its record keeps it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    round: int  # the round the count holds for
    prompts: int
    basis: str  # where the count came from, in words


def prompts_for(duration_s: float, requests_per_s: float, concurrency: int) -> int:
    """Prompts for a point sized by time: ceil(duration_s x the request rate), rounded up to a multiple of the
    concurrency, at least 2 x concurrency."""
    if duration_s <= 0:
        raise SuiteError(f"duration_s must be positive (got {duration_s})")
    if concurrency < 1:
        raise SuiteError(f"concurrency must be at least 1 (got {concurrency})")
    if not requests_per_s or requests_per_s <= 0:
        raise SuiteError("cannot size a point by time: no request rate was measured at its shape")
    n = math.ceil(round(duration_s * requests_per_s, 9))
    n = math.ceil(n / concurrency) * concurrency
    return max(n, 2 * concurrency)


def sized_of(rec: JobRecord) -> PointSize | None:
    """How a stored run of the point was sized (None: not by time, or by a suite before counts were shared)."""
    raw = (rec.model_extra or {}).get("sized")
    try:
        return PointSize.model_validate(raw) if raw is not None else None
    except ValueError:
        return None


def stored_size(records: Iterable[JobRecord], rnd: int) -> PointSize | None:
    """The count an arm of round ``rnd`` already measured the point with (the earliest such run)."""
    sized = [(rec.started or "", size) for rec in records if rec.ok
             and (size := sized_of(rec)) is not None and size.round == rnd]
    return min(sized, key=lambda x: x[0])[1] if sized else None


def measured_rate(store: RunStore, records: Iterable[JobRecord], rnd: int) -> tuple[float, str] | None:
    """The median over arms of the point's request rate (an arm's completed requests over its measured seconds,
    all its runs of the round together) in the latest round before ``rnd`` that has any, and words that say so."""
    earlier = {(rec.job.arm, rec.job.key): size.round for rec in records if not rec.job.tag
               and (size := sized_of(rec)) is not None and size.round < rnd}
    stored = load_results(store, (rec for rec in records if (rec.job.arm, rec.job.key) in earlier), "serve",
                          ServeResult)  # ok jobs only; an unreadable result is left out of the rate
    done: dict[int, dict[str, list[float]]] = {}
    for job, raw in stored.found:
        if raw.completed and raw.duration and raw.duration > 0:
            sums = done.setdefault(earlier[(job.arm, job.key)], {}).setdefault(job.arm, [0.0, 0.0])
            sums[0] += raw.completed
            sums[1] += raw.duration
    if not done:
        return None
    last = max(done)
    rate = statistics.median(n / s for n, s in done[last].values())
    arms = len(done[last])
    return rate, f"round {last}'s runs of the point: median request rate of {arms} arm{'s' * (arms > 1)} {rate:.3g}/s"


def point_size(store: RunStore, job: Job, rnd: int, duration_s: float, concurrency: int,
               warm_rate: float | None) -> PointSize | None:
    """The count of ``job``'s point in round ``rnd``: the one an arm of this round already used, else one from the
    latest earlier round's measured rate, else from ``warm_rate`` (the session's warm-up at the point's shape).
    None: no usable rate; the point keeps its params' num_prompts."""
    records = store.point_records(job)
    if (kept := stored_size(records, rnd)) is not None:
        return kept
    measured = measured_rate(store, records, rnd)
    if measured is not None:
        rate, basis = measured
    elif warm_rate:
        rate, basis = warm_rate, f"the {job.arm} session's warm-up at this shape: {warm_rate:.3g} requests/s"
    else:
        return None
    return PointSize(round=rnd, prompts=prompts_for(duration_s, rate, concurrency), basis=basis)
