"""Per-round scores: the values the primary test (`suite.verdict`) is taken on.

Pure functions over plain values; no I/O. A round is one server session per arm (ABBA order). Its *score* is
the mean over points and metrics of ``sign * log(candidate / baseline)`` (sign +1 when higher is better), i.e.
the log of the round's geometric mean of candidate/baseline ratios, signed so that "better" is positive
(``score_round``, ``round_score``). ``round_scores`` pairs the rounds both arms have by round index: a round one
arm lost, or one that lacks a point the others compare, is dropped with the reason, never paired with a
neighbour.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Real

from suite.stats import HEADLINE, METRICS


@dataclass(frozen=True)
class RoundScore:
    value: float | None  # mean of sign*log(cand/base); None when no point/metric could be compared
    n_terms: int
    skipped: tuple[str, ...]  # "point/metric: why", for zero or missing values


def _value(x: object, where: str) -> float | None:
    if x is None:
        return None
    if type(x) is not float and (isinstance(x, bool) or not isinstance(x, Real)):
        raise ValueError(f"{where}: not a number: {x!r}")
    v = float(x)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{where}: must be finite and >= 0, got {v}")
    return v


def _check_metrics(metrics: Sequence[str]) -> tuple[str, ...]:
    if isinstance(metrics, str):
        raise ValueError(f"metrics must be a sequence of metric names, got the string {metrics!r}")
    ms = tuple(metrics)
    if not ms:
        raise ValueError("at least one metric")
    unknown = [m for m in ms if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; known: {', '.join(METRICS)}")
    if len(set(ms)) != len(ms):
        raise ValueError(f"duplicate metric(s) in {list(ms)}")
    return ms


def score_round(
    base: Mapping[str, Mapping[str, float]], cand: Mapping[str, Mapping[str, float]], metrics: Sequence[str]
) -> RoundScore:
    """``round_score`` with what it skipped; ``value`` is None when nothing could be compared."""
    ms = _check_metrics(metrics)
    if not isinstance(base, Mapping) or not isinstance(cand, Mapping):
        raise ValueError("round results must be mappings point -> {metric: value}")
    signs = [(m, 1.0 if METRICS[m].higher_is_better else -1.0) for m in ms]
    terms: list[float] = []
    skipped: list[str] = []
    for point in sorted(base.keys() | cand.keys(), key=str):
        row_b, row_c = base.get(point), cand.get(point)
        for arm, row in (("baseline", row_b), ("candidate", row_c)):
            if row is not None and type(row) is not dict and not isinstance(row, Mapping):
                raise ValueError(f"{arm} point {point!r}: not a mapping of metrics")
        if row_b is None or row_c is None:
            skipped.append(f"{point}: missing in {'baseline' if row_b is None else 'candidate'}")
            continue
        for m, sign in signs:
            b, c = row_b.get(m), row_c.get(m)
            if type(b) is float and type(c) is float and 0 < b < math.inf and 0 < c < math.inf:
                terms.append(sign * (math.log(c) - math.log(b)))  # the common case, checked
                continue
            b = _value(b, f"baseline {point}/{m}")
            c = _value(c, f"candidate {point}/{m}")
            if b is None or c is None:
                skipped.append(f"{point}/{m}: missing in {'baseline' if b is None else 'candidate'}")
            elif b == 0 or c == 0:
                skipped.append(f"{point}/{m}: zero in {'baseline' if b == 0 else 'candidate'}")
            else:
                terms.append(sign * (math.log(c) - math.log(b)))
    value = math.fsum(terms) / len(terms) if terms else None
    return RoundScore(value=value, n_terms=len(terms), skipped=tuple(skipped))


def round_score(
    base: Mapping[str, Mapping[str, float]],
    cand: Mapping[str, Mapping[str, float]],
    metrics: Sequence[str] = HEADLINE,
) -> float:
    """One round's composite: mean over points and metrics of sign*log(cand/base), better positive.

    Zero or missing values are skipped (``score_round`` lists them); malformed input (unknown metric,
    negative or non-finite value, not a number, nothing comparable at all) raises ``ValueError``.
    """
    s = score_round(base, cand, metrics)
    if s.value is None:
        raise ValueError(f"no comparable values in this round ({'; '.join(s.skipped) or 'no points'})")
    return s.value


@dataclass(frozen=True)
class RoundScores:
    scores: dict[int, float]  # round index -> score
    dropped: tuple[str, ...]  # rounds that could not be paired or compared, with why
    skipped: tuple[str, ...]  # "round r point/metric: why" inside rounds that were kept


def _round_index(r: object) -> int:
    if type(r) is not int and (isinstance(r, bool) or not isinstance(r, int)):
        raise ValueError(f"round keys must be int round indices, got {r!r}")
    return r


def round_scores(
    base_rounds: Mapping[int, Mapping[str, Mapping[str, float]]],
    cand_rounds: Mapping[int, Mapping[str, Mapping[str, float]]],
    metrics: Sequence[str] = HEADLINE,
    unit: str = "round",
) -> RoundScores:
    """Scores of the rounds both arms have, paired by round index (a round one arm lost is dropped from
    both, never paired with a neighbour). A round that lacks a point other rounds compare (a run cut short
    in the middle of a round, a failed job) is dropped too: its composite would weigh the points it has
    more, and the effect differs by point. ``unit``: what the dropped and skipped notes call a round (under
    together: all, "set": the round)."""
    b_keys = {_round_index(r) for r in base_rounds}
    c_keys = {_round_index(r) for r in cand_rounds}
    dropped = [f"{unit} {r}: no {'candidate' if r in b_keys else 'baseline'} result"
               for r in sorted(b_keys ^ c_keys)]
    scores: dict[int, float] = {}
    skipped: list[str] = []
    both = sorted(b_keys & c_keys)
    compared = {r: set(base_rounds[r]) & set(cand_rounds[r]) for r in both}
    every = set().union(*compared.values()) if compared else set()
    for r in both:
        if missing := every - compared[r]:
            dropped.append(f"{unit} {r}: incomplete (no {', '.join(sorted(map(str, missing)))} in both arms)")
            continue
        s = score_round(base_rounds[r], cand_rounds[r], metrics)
        if s.value is None:
            dropped.append(f"{unit} {r}: nothing comparable ({'; '.join(s.skipped) or 'no points'})")
            continue
        scores[r] = s.value
        skipped.extend(f"{unit} {r} {x}" for x in s.skipped)
    return RoundScores(scores=scores, dropped=tuple(dropped), skipped=tuple(skipped))
