"""Paired accuracy: per-question pairing of two arms' answers, McNemar's test in score form (the statistic
Tango's interval inverts, so the p-value and the interval agree; the exact binomial test beside it), Tango's
score interval on the paired difference, and the accuracy gate (PASS / FAIL / INCONCLUSIVE / UNINFORMATIVE)
that judges that interval against ``max_drop``.

Pure functions over plain values; no I/O. See docs/statistics.md for the method and its measured coverage.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from scipy.optimize import brentq
from scipy.special import ndtr, ndtri
from scipy.stats import binomtest

from suite.stats import mean_var


def mcnemar(b01: int, b10: int) -> float:
    """Exact two-sided McNemar p-value from the discordant counts (binomial test at 1/2)."""
    if b01 < 0 or b10 < 0:
        raise ValueError(f"discordant counts must be >= 0, got {b01}, {b10}")
    if b01 + b10 == 0:
        return 1.0
    return float(binomtest(b01, b01 + b10, 0.5, alternative="two-sided").pvalue)


@dataclass(frozen=True)
class PairedAccuracy:
    n: int
    acc_base: float
    acc_cand: float
    stderr_base: float  # sample stdev / sqrt(n), as lm-eval reports it
    stderr_cand: float
    delta: float  # acc_cand - acc_base
    delta_stderr: float  # stderr of the paired per-question difference
    flipped_to_correct: int  # wrong in baseline, right in candidate
    flipped_to_wrong: int  # right in baseline, wrong in candidate
    p_value: float  # McNemar's score test: the statistic the interval inverts (agrees with it)
    delta_ci_low: float  # Tango's score interval on delta (fractions, like delta)
    delta_ci_high: float
    confidence: float
    p_exact: float | None = None  # McNemar's exact binomial test on the flipped questions


def _stderr(xs: Sequence[float]) -> float:
    return math.sqrt(mean_var(xs)[1] / len(xs)) if len(xs) > 1 else 0.0


def _tango_score(up: int, down: int, n: int, d: float) -> float:
    """Tango's score statistic T(D) for the paired difference D (see ``paired_difference_interval``)."""
    w = -up - down + (2 * n - up + down) * d
    q = (math.sqrt(max(w * w + 8 * n * down * d * (1 - d), 0.0)) - w) / (4 * n)
    var, num = n * (2 * q + d * (1 - d)), up - down - n * d
    if var > 0:
        return num / math.sqrt(var)
    return 0.0 if num == 0 else math.copysign(math.inf, num)


def paired_difference_p(up: int, down: int, n: int) -> float:
    """Two-sided p of "no difference" from the statistic Tango's interval inverts, T(0) = (up - down) /
    sqrt(up + down): McNemar's test in its score form. p < 1 - confidence exactly when the interval excludes 0
    (the exact binomial McNemar, ``mcnemar``, can disagree: 0 up / 5 down gives 0.0625 there, 0.025 here)."""
    if up + down == 0:
        return 1.0
    return float(2 * ndtr(-abs(_tango_score(up, down, n, 0.0))))


def paired_difference_interval(
    up: int, down: int, n: int, *, confidence: float = 0.95
) -> tuple[float, float]:
    """Tango's (1998) asymptotic score interval for a difference of paired proportions, (up - down) / n.

    ``up``: questions only the candidate answers right; ``down``: only the baseline; ``n``: all questions.
    The score statistic T(D) = (up - down - nD) / sqrt(n (2 q(D) + D (1 - D))), q(D) the restricted maximum
    likelihood estimate of P(down) given the difference D, is inverted: {D : |T(D)| <= z}. Unlike the Wald
    interval (paired SE) it stays inside [-1, 1] and keeps a width when no question flips
    (0 flips of n: ±z²/(n + z²)).
    """
    for name, v in (("up", up), ("down", down), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be a count >= 0, got {v!r}")
    if n == 0 or up + down > n:
        raise ValueError(f"need n >= up + down and n > 0, got up={up}, down={down}, n={n}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    z = float(ndtri(0.5 + confidence / 2))
    est = (up - down) / n

    def score(d: float) -> float:
        return _tango_score(up, down, n, d)

    edge = 1e-12
    lo = -1.0 if est <= -1 + edge or score(-1 + edge) <= z else brentq(
        lambda d: score(d) - z, -1 + edge, est, xtol=1e-13)
    hi = 1.0 if est >= 1 - edge or score(1 - edge) >= -z else brentq(
        lambda d: score(d) + z, est, 1 - edge, xtol=1e-13)
    return lo, hi


def paired_accuracy(
    base: Mapping[Hashable, bool], cand: Mapping[Hashable, bool], *, confidence: float = 0.95
) -> PairedAccuracy:
    """Per-question paired accuracy; both arms must cover exactly the same questions."""
    if not base:
        raise ValueError("paired accuracy: no questions")
    if base.keys() != cand.keys():
        only_b, only_c = len(base.keys() - cand.keys()), len(cand.keys() - base.keys())
        raise ValueError(
            f"paired accuracy: question sets differ ({only_b} only in baseline, {only_c} only in candidate)"
        )
    keys = list(base)
    xb = [float(bool(base[k])) for k in keys]
    xc = [float(bool(cand[k])) for k in keys]
    up = sum(1 for x, y in zip(xb, xc, strict=True) if y > x)
    down = sum(1 for x, y in zip(xb, xc, strict=True) if y < x)
    n = len(keys)
    lo, hi = paired_difference_interval(up, down, n, confidence=confidence)
    return PairedAccuracy(
        n=n,
        acc_base=sum(xb) / n,
        acc_cand=sum(xc) / n,
        stderr_base=_stderr(xb),
        stderr_cand=_stderr(xc),
        delta=(sum(xc) - sum(xb)) / n,
        delta_stderr=_stderr([y - x for x, y in zip(xb, xc, strict=True)]),
        flipped_to_correct=up,
        flipped_to_wrong=down,
        p_value=paired_difference_p(up, down, n),
        delta_ci_low=lo,
        delta_ci_high=hi,
        confidence=confidence,
        p_exact=mcnemar(up, down),
    )


class GateOutcome(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    UNINFORMATIVE = "UNINFORMATIVE"


def accuracy_gate(paired: PairedAccuracy, max_drop_pp: float) -> GateOutcome:
    """Gate "the candidate loses at most ``max_drop_pp`` percentage points of accuracy", on the interval.

    - UNINFORMATIVE: the baseline's accuracy is at most ``max_drop_pp`` (e.g. no arm answers anything
      right): even losing every question the baseline gets right would not exceed the allowed drop, so no
      result could FAIL and a PASS would say nothing;
    - PASS: the interval's lower bound lies above -max_drop (a drop that large is excluded);
    - FAIL: the interval's upper bound lies below -max_drop (the drop is larger, confidently);
    - INCONCLUSIVE otherwise (the interval straddles -max_drop: more questions are needed).
    """
    if not (math.isfinite(max_drop_pp) and max_drop_pp >= 0):
        raise ValueError(f"max_drop_pp must be finite and >= 0, got {max_drop_pp}")
    drop = max_drop_pp / 100
    if paired.acc_base <= drop:
        return GateOutcome.UNINFORMATIVE
    if paired.delta_ci_low > -drop:
        return GateOutcome.PASS
    if paired.delta_ci_high < -drop:
        return GateOutcome.FAIL
    return GateOutcome.INCONCLUSIVE


def accuracy_gate_reason(paired: PairedAccuracy, max_drop_pp: float) -> str:
    """One sentence on ``accuracy_gate``'s outcome, with the interval it used."""
    outcome = accuracy_gate(paired, max_drop_pp)
    pp = 100 * paired.delta
    ci = f"[{100 * paired.delta_ci_low:+.1f}, {100 * paired.delta_ci_high:+.1f}] pp"
    level = f"{paired.confidence:.0%}"
    head = (f"{pp:+.1f} pp ({level} {ci}, {paired.flipped_to_wrong} lost, {paired.flipped_to_correct} gained "
            f"of {paired.n})")
    if outcome == GateOutcome.UNINFORMATIVE:
        return (f"baseline accuracy {100 * paired.acc_base:.1f} % ≤ allowed drop {max_drop_pp:g} pp: "
                f"no result could fail this gate")
    if outcome == GateOutcome.PASS:
        return f"{head}: a drop of {max_drop_pp:g} pp or more is excluded"
    if outcome == GateOutcome.FAIL:
        return f"{head}: the drop exceeds {max_drop_pp:g} pp"
    return f"{head}: interval reaches past -{max_drop_pp:g} pp; more questions needed"
