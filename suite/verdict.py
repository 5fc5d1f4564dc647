"""The primary test of a candidate: one declared composite, paired by round, looked at in a sequential design.

Pure functions over plain values; no I/O. docs/statistics.md gives the method and its simulated error rates
(benchmarks/simulation/primary_test.py prints them).

A round is one server session per arm (ABBA order). Its *score* (`suite.scores`) is the mean over points and
metrics of ``sign * log(candidate / baseline)`` (sign +1 when higher is better), i.e. the log of the round's
geometric mean of candidate/baseline ratios, signed so that "better" is positive. The primary test is a one-sample t
on the scores (df = rounds - 1), optionally with the variance pooled with the A/A arm's scores. It is looked
at after a fixed number of rounds each (``VerdictSpec.looks``); the overall two-sided alpha is spent over the
looks by a Lan-DeMets spending function (O'Brien-Fleming-type or Pocock-type) evaluated at the information
fraction ``rounds / max_rounds``. Each look gets a nominal two-sided alpha, converted to a t critical value
at that look's df. Approximation: the nominal alphas are placed so that the spending increments hold for the
sequence of t statistics of normal scores at the planned rounds (``look_alphas``, a seeded Monte Carlo);
the plain conversion of the normal design's nominal alphas (``nominal_alphas``) lets 5.2-5.9 % through at
these df. Non-normal scores, lost rounds (df below plan) and the pooling rule are approximations checked by
simulation (docs/statistics.md).

Verdict of one test at a look (interval = repeated confidence interval at the look's nominal level):
- IMPROVEMENT / REGRESSION: the interval excludes 0 (|t| above the look's boundary);
- EQUIVALENT: the interval lies inside +-target (TOST, each one-sided test at half the look's alpha);
- INCONCLUSIVE otherwise, or with fewer than 2 rounds, no spread, non-finite scores (the reason says which,
  and states the effect size the rounds could have detected).

The word is the family's (`suite.verdict_family`: ``evaluate_scores``, ``family_word``): the composite and each declared metric at each
tested point, weighted Holm over group-sequential tests at family-wise alpha (Maurer & Bretz 2013). MIXED when
tests are confirmed both ways, IMPROVEMENT / REGRESSION when confirmed one way, EQUIVALENT only when every point
lies within +-target (intersection-union), INCONCLUSIVE otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from numbers import Real
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from scipy.optimize import brentq
from scipy.special import fdtrc, ndtr, ndtri, stdtr, stdtrit

from suite.scores import _check_metrics, _round_index
from suite.stats import (
    HEADLINE,
    MAX_HALF_WIDTH_LOG,
    METRICS,
    ZERO_SE,
    Strata,
    WithinLayouts,
    fmt_interval,
    fmt_pct,
    mean_var,
    within_layouts,
)

Spending = Literal["obrien-fleming", "pocock"]
Expectation = Literal["better", "worse", "changed", "flat"]
EXPECT_OTHERS = "others"  # verdict.expect's key for every point not named
SPENDING_LABEL = {"obrien-fleming": "O'Brien–Fleming", "pocock": "Pocock"}
POOL_F_ALPHA = 0.05  # two-sided F test of equal variances before pooling with the A/A scores
# candidate and A/A scores of one round share the baseline's session: with equal variances their
# correlation is 1/2, which leaves (1 + 1/4) times fewer effective degrees of freedom in the pooled variance
AA_CORRELATION = 0.5
MAX_PLANNED_ROUNDS = 1_000_000
CALIBRATION_TRIALS = 400_000  # Monte Carlo runs that place the t boundaries (MC error of alpha ~0.0003)
CALIBRATION_SEED = 14


class Outcome(StrEnum):
    REGRESSION = "REGRESSION"
    IMPROVEMENT = "IMPROVEMENT"
    EQUIVALENT = "EQUIVALENT"
    MIXED = "MIXED"
    INCONCLUSIVE = "INCONCLUSIVE"


# --------------------------------------------------------------------------- the declared test


def plan_looks(max_rounds: int, n_looks: int) -> tuple[int, ...]:
    """Round counts at which to look, spread evenly, each even (ABBA cancels linear drift over 2 rounds)."""
    if max_rounds < 2 or max_rounds % 2:
        raise ValueError(f"max_rounds must be an even number >= 2, got {max_rounds}")
    if not 1 <= n_looks <= max_rounds // 2:
        raise ValueError(f"n_looks must be in 1..{max_rounds // 2} for {max_rounds} rounds, got {n_looks}")
    pairs = max_rounds // 2
    return tuple(2 * max(1, math.floor(pairs * k / n_looks + 0.5)) for k in range(1, n_looks + 1))


DEFAULT_MAX_ROUNDS = 8  # the default looks' last: after 2, 4, 6 and 8 rounds


def default_looks(max_rounds: int) -> tuple[int, ...]:
    """The looks of a design that takes at most ``max_rounds`` rounds: every 2 rounds, at most 4 looks (one look
    at the end for an odd count)."""
    return plan_looks(max_rounds, min(4, max_rounds // 2)) if max_rounds % 2 == 0 else (max_rounds,)


class VerdictSpec(BaseModel):
    """What the primary test is, declared before the run (the matrix's ``verdict:`` block)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metrics: tuple[str, ...] = Field(HEADLINE, description="metrics of the composite (direction from METRICS)")
    target_pct: float = Field(5.0, gt=0, lt=100, description="equivalence margin and target effect, in %")
    alpha: float = Field(0.05, gt=0, lt=0.5, description="two-sided, over all looks")
    power: float = Field(0.80, gt=0.5, lt=1, description="the power the smallest detectable change is stated at")
    spending: Spending = Field("obrien-fleming", description="how alpha is spent over the looks: obrien-fleming (strict early) or pocock")
    looks: tuple[int, ...] | None = Field(
        None, description="round counts at which the test is looked at (repeats: auto), the last the most rounds "
        "the run takes; default: [2, 4, 6, 8]")
    pool_aa: bool = Field(False, description=(
        "pool the variance with the A/A arm's scores when an F test allows: more power at few rounds, but only "
        "for arms whose servers vary alike; a candidate whose servers vary 2-3x more reads changed in 9.5-11.7 % "
        "of runs when pooled (4.6-4.8 % not pooled; docs/statistics.md), and at 2-4 rounds the F test cannot "
        "tell"))
    points: tuple[str, ...] | None = Field(
        None, description="the serving points (ids as the report names them, e.g. isl128-osl64-c1-n16) where the "
        "change can act: only they feed the composite; the others are measured and shown; default: every point")

    expect: dict[str, Expectation] | None = Field(
        None, description="what the change should do, per serving point (ids as in points): better, worse, "
        "changed (either way) or flat; the key `others` stands for every other point; the report says per point "
        "whether it happened, and names any point that moved where nothing should")

    @field_validator("expect")
    @classmethod
    def _expect(cls, value: dict[str, Expectation] | None) -> dict[str, Expectation] | None:
        if value is not None and not value:
            raise ValueError("expect: give at least one point, or leave it out")
        return value

    def expected(self, point: str) -> Expectation | None:
        """What the change should do at ``point`` (None: nothing declared)."""
        if self.expect is None:
            return None
        return self.expect.get(point, self.expect.get(EXPECT_OTHERS))

    @field_validator("points")
    @classmethod
    def _points(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None:
            if not value:
                raise ValueError("points: give at least one point, or leave it out for every point")
            if len(set(value)) != len(value):
                raise ValueError(f"duplicate point(s) in {list(value)}")
        return value

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _check_metrics(value)

    @model_validator(mode="after")
    def _looks(self) -> VerdictSpec:
        if self.looks is None:
            object.__setattr__(self, "looks", default_looks(DEFAULT_MAX_ROUNDS))
        looks = self.looks
        if not looks or looks[0] < 2 or any(b <= a for a, b in zip(looks, looks[1:], strict=False)):
            raise ValueError(f"looks must be increasing round counts >= 2, got {looks}")
        return self

    @property
    def max_rounds(self) -> int:
        """The most rounds a sequential run takes: its last look."""
        assert self.looks
        return self.looks[-1]

    @property
    def fractions(self) -> tuple[float, ...]:
        """Information fraction of each look: rounds / max_rounds."""
        return tuple(k / self.max_rounds for k in self.looks)


def looks_of_max_rounds(data: Any) -> Any:
    """A verdict block recorded before verdict.max_rounds became the last look: its looks (the default looks of
    that many rounds where the record has none)."""
    if isinstance(data, dict) and "max_rounds" in data:
        data = dict(data)
        most = data.pop("max_rounds")
        if data.get("looks") is None and isinstance(most, int):
            data["looks"] = default_looks(most)
    return data


RecordedVerdict = Annotated[VerdictSpec, BeforeValidator(looks_of_max_rounds)]


def every_other_round(spec: VerdictSpec) -> VerdictSpec | None:
    """The design of a test whose arm is measured in every other round only (rounds 0, 2, 4, ...: the A/A arm
    of ``aa: alternate``): at a look after n rounds it has ceil(n / 2) of them, so its looks are those counts
    (each at least 2, each once) out of ceil(max_rounds / 2), with the same alpha, spending and margin. Its
    boundaries are then calibrated on the t statistics of the rounds it has (``look_alphas``): the run's own
    design, calibrated at twice the rounds, let an A/A control that stops at its own first decisive look
    through in 5.8 % of sound runs (docs/statistics.md). None: fewer than 2 rounds even at the last look."""
    half = sorted({-(-n // 2) for n in spec.looks} - {0, 1})
    if not half:
        return None
    return spec.model_copy(update={"looks": tuple(half)})


def every_other_look(spec: VerdictSpec, own: VerdictSpec, rounds: int) -> int:
    """The look of ``own`` (``every_other_round(spec)``) that a look of the run after ``rounds`` rounds is: the
    number of its looks reached by the ceil(rounds / 2) rounds its arm has by then (at least 1)."""
    return max(1, sum(1 for x in own.looks if x <= -(-rounds // 2)))


# --------------------------------------------------------------------------- alpha spending


def spent_alpha(t: float, alpha: float, spending: Spending) -> float:
    """Lan-DeMets spending function: two-sided alpha spent by information fraction t (0 at 0, alpha at 1)."""
    if t <= 0:
        return 0.0
    t = min(t, 1.0)
    if spending == "obrien-fleming":
        return float(2 * ndtr(-ndtri(1 - alpha / 2) / math.sqrt(t)))
    if spending == "pocock":
        return alpha * math.log1p((math.e - 1) * t)
    raise ValueError(f"unknown spending function {spending!r}")


def _simpson(lo: float, hi: float, step: float) -> tuple[np.ndarray, np.ndarray]:
    n = max(101, int(math.ceil((hi - lo) / step)) | 1)  # odd number of points
    x = np.linspace(lo, hi, n)
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return x, w * (x[1] - x[0]) / 3


class _Walk:
    """Sub-density of the score process S(t) ~ B(t) + drift*t on the continuation region, look by look."""

    def __init__(self, drift: float) -> None:
        self.drift, self.t = drift, 0.0
        self.x: np.ndarray | None = None  # grid on the continuation region; None before the first look
        self.fw: np.ndarray | None = None  # density times quadrature weights on that grid

    def exit_prob(self, t: float, b: float) -> float:
        """P(not stopped before, |S(t)| >= b)."""
        dt, mu = t - self.t, self.drift * (t - self.t)
        sd = math.sqrt(dt)
        if self.x is None:
            return float(ndtr((mu - b) / sd) + ndtr((-b - mu) / sd))
        up = ndtr((self.x + mu - b) / sd)
        down = ndtr((-b - self.x - mu) / sd)
        return float(self.fw @ (up + down))

    def advance(self, t: float, b: float) -> None:
        """Restrict to |S(t)| < b and move the density to t."""
        dt, mu = t - self.t, self.drift * (t - self.t)
        sd = math.sqrt(dt)
        centre = self.drift * t
        reach = 9 * math.sqrt(t)
        lo, hi = max(-b, centre - reach), min(b, centre + reach)
        x, w = _simpson(lo, hi, sd / 12)
        if self.x is None:
            dens = np.exp(-0.5 * ((x - mu) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))
        else:
            z = (x[:, None] - self.x[None, :] - mu) / sd
            dens = (np.exp(-0.5 * z * z) / (sd * math.sqrt(2 * math.pi))) @ self.fw
        self.x, self.fw, self.t = x, dens * w, t


@lru_cache(maxsize=256)
def _z_boundaries(fractions: tuple[float, ...], alpha: float, spending: Spending) -> tuple[float, ...]:
    walk = _Walk(0.0)
    bounds, spent = [], 0.0
    for t in fractions:
        increment = spent_alpha(t, alpha, spending) - spent
        if increment <= 1e-15:
            b = math.inf
        else:
            b = brentq(lambda b, t=t, inc=increment: walk.exit_prob(t, b) - inc, 1e-6, 50 * math.sqrt(t),
                       xtol=1e-10)
        if math.isfinite(b):
            spent += increment
        bounds.append(b / math.sqrt(t))
        walk.advance(t, b)
    return tuple(bounds)


def z_boundaries(spec: VerdictSpec) -> tuple[float, ...]:
    """Two-sided critical values of the normal statistic Z at each look (known-variance design)."""
    return _z_boundaries(spec.fractions, spec.alpha, spec.spending)


def nominal_alphas(spec: VerdictSpec) -> tuple[float, ...]:
    """Each look's nominal two-sided alpha of the normal design: P(|Z| >= boundary) for one look alone."""
    return tuple(float(2 * ndtr(-c)) for c in z_boundaries(spec))


def t_boundary(nominal_alpha: float, df: float) -> float:
    """The t critical value at ``df`` with the same nominal two-sided alpha as the normal boundary."""
    return float(stdtrit(df, 1 - nominal_alpha / 2))


def _pool_allowed(var_c: np.ndarray | float, var_aa: np.ndarray | float, df_c: float, df_aa: float):
    """Two-sided F test of equal variances at POOL_F_ALPHA, acted on in one direction only: pooling is refused
    when the candidate's scores vary significantly MORE than the A/A scores (pooling would understate its
    variance); when they vary less, pooling is the conservative choice and is kept."""
    return fdtrc(df_c, df_aa, np.asarray(var_c) / np.asarray(var_aa)) >= POOL_F_ALPHA / 2


@lru_cache(maxsize=8)
def _t_process_p(looks: tuple[int, ...], pooled: bool) -> tuple[np.ndarray, ...]:
    """Two-sided p-values of the t statistic at each look, for CALIBRATION_TRIALS simulated runs of normal scores
    (seeded): one draw per design, shared by every alpha a look's boundary is placed for."""
    rng = np.random.default_rng(CALIBRATION_SEED)
    n_trials = CALIBRATION_TRIALS
    sums = np.zeros((4, n_trials))  # candidate: sum, sum of squares; A/A: sum, sum of squares
    p = np.empty((len(looks), n_trials))
    for r in range(1, looks[-1] + 1):
        if pooled:  # both scores of a round share the baseline's session
            z = rng.standard_normal((3, n_trials))
            c, a = z[2] - z[0], z[1] - z[0]
            sums[2] += a
            sums[3] += a * a
        else:
            c = rng.standard_normal(n_trials)
        sums[0] += c
        sums[1] += c * c
        if r not in looks:
            continue
        var = (sums[1] - sums[0] ** 2 / r) / (r - 1)
        df = np.full(n_trials, r - 1.0)
        if pooled:
            var_aa = (sums[3] - sums[2] ** 2 / r) / (r - 1)
            pool = _pool_allowed(var, var_aa, r - 1, r - 1)
            var = np.where(pool, (var + var_aa) / 2, var)
            df = np.where(pool, (2 * r - 2) / (1 + AA_CORRELATION**2), df)
        p[looks.index(r)] = 2 * stdtr(df, -np.abs(sums[0] / r) / np.sqrt(var / r))
    return tuple(p)


@lru_cache(maxsize=256)
def _t_process_alphas(looks: tuple[int, ...], max_rounds: int, alpha: float, spending: Spending,
                      pooled: bool) -> tuple[float, ...]:
    p = _t_process_p(looks, pooled)
    n_trials = CALIBRATION_TRIALS
    alive = np.ones(n_trials, bool)
    out, spent = [], 0.0
    for k, rounds in enumerate(looks):
        target = spent_alpha(rounds / max_rounds, alpha, spending)
        m = int(round((target - spent) * n_trials))
        if m <= 0:
            a_k = 0.0
        else:
            pk = np.sort(p[k][alive])
            a_k = float((pk[m - 1] + pk[m]) / 2) if m < len(pk) else 1.0
        alive &= ~(p[k] < a_k)
        spent = target
        out.append(a_k)
    return tuple(out)


def look_alphas(spec: VerdictSpec, *, pooled: bool = False) -> tuple[float, ...]:
    """Each look's nominal two-sided alpha for the t statistics the primary test actually computes.

    The spending function's increments are matched on the sequence of t statistics itself (normal scores,
    the planned rounds at each look; with ``pooled`` the A/A scores and the pooling rule too), by a seeded
    Monte Carlo of CALIBRATION_TRIALS runs: converting the normal design's nominal alphas (``nominal_alphas``)
    to t quantiles alone lets 5.2-5.9 % through instead of 5 % at these small df (docs/statistics.md).
    Deterministic (fixed seed) and cached per design.
    """
    return _t_process_alphas(spec.looks, spec.max_rounds, spec.alpha, spec.spending, pooled)


def _rejection_prob(fractions: tuple[float, ...], bounds: tuple[float, ...], drift: float) -> float:
    walk, total = _Walk(drift), 0.0
    for t, c in zip(fractions, bounds, strict=True):
        b = c * math.sqrt(t)
        if math.isfinite(b):
            total += walk.exit_prob(t, b)
        walk.advance(t, b)
    return total


@lru_cache(maxsize=256)
def _inflation(fractions: tuple[float, ...], alpha: float, spending: Spending, power: float) -> float:
    bounds = _z_boundaries(fractions, alpha, spending)
    fixed = float(ndtri(1 - alpha / 2) + ndtri(power))
    drift = brentq(lambda d: _rejection_prob(fractions, bounds, d) - power, 0.5 * fixed, 3 * fixed, xtol=1e-8)
    return (drift / fixed) ** 2


def inflation_factor(spec: VerdictSpec) -> float:
    """Maximum sample size of the sequential design over that of a fixed design with the same power."""
    return _inflation(spec.fractions, spec.alpha, spec.spending, spec.power)


@lru_cache(maxsize=4096)
def _t_sum(df: int, alpha: float, power: float) -> float:
    return float(stdtrit(df, 1 - alpha / 2) + stdtrit(df, power))


def rounds_needed(sd_score: float, target_pct: float, spec: VerdictSpec) -> int:
    """Even number of rounds (max_rounds of a design shaped like ``spec``) that detects ±target_pct with
    ``spec.power``, given the standard deviation of a round's score (log scale).

    n = R * ((t_{n-1, 1-alpha/2} + t_{n-1, power}) * sd / log(1 + target))^2, R the sequential design's
    inflation factor (``inflation_factor``), solved for the smallest even n (at least 2).
    """
    if not (math.isfinite(sd_score) and sd_score >= 0):
        raise ValueError(f"sd_score must be finite and >= 0, got {sd_score}")
    if not (math.isfinite(target_pct) and target_pct > 0):
        raise ValueError(f"target_pct must be finite and > 0, got {target_pct}")
    r = inflation_factor(spec)
    delta = math.log1p(target_pct / 100)

    def enough(n: int) -> bool:
        return n >= r * (_t_sum(n - 1, spec.alpha, spec.power) * sd_score / delta) ** 2

    hi = 2
    while not enough(hi):
        if hi >= MAX_PLANNED_ROUNDS:
            return MAX_PLANNED_ROUNDS
        hi *= 2
    lo = hi // 2  # not enough (or 1)
    while hi - lo > 2:
        mid = (lo + hi) // 4 * 2
        if mid <= lo:
            break
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi


# --------------------------------------------------------------------------- the primary test


@dataclass(frozen=True)
class PrimaryResult:
    metric: str | None  # None: the composite of spec.metrics
    n_rounds: int
    rounds: tuple[int, ...]  # round indices used
    scores_pct: tuple[float, ...]  # each used round's score, 100 * (exp(score) - 1), better positive (nan: not finite)
    look: int  # 1-based
    n_looks: int
    spending: str
    # all *_pct below are signed so that better is positive: 100 * (exp(log-scale value) - 1)
    estimate_pct: float | None
    delta_pct: float | None  # the raw Δ% in the metric's own direction (a latency rise is +); composite: = estimate
    ci_low_pct: float | None  # fixed-sample 95 % two-sided interval (for reference)
    ci_high_pct: float | None
    rci_low_pct: float | None  # repeated confidence interval at the look's nominal level: the one that decides
    rci_high_pct: float | None
    p_value: float | None  # two-sided, of the t statistic at this look
    nominal_alpha: float  # this look's two-sided nominal alpha (from the spending function)
    boundary_t: float | None  # |t| must exceed this (t critical value at df)
    df: float | None
    mean_log: float | None  # mean score (log scale, better positive)
    se_log: float | None
    sd_score: float | None  # standard deviation of one round's score used for the test (pooled or not)
    mde_pct: float | None  # smallest |effect| detected with spec.power at this look's boundary, SE and df
    tost: float | None  # TOST p-value of equivalence within ±target (max of the two one-sided p-values)
    rounds_for_target: int | None  # rounds a design like spec needs to detect ±target at this spread
    pooled: bool
    variance: str  # how the variance was estimated
    outcome: Outcome
    decided: bool  # stop now: a decision, the last look, or the budget spent
    reason: str

    @property
    def significant(self) -> bool:
        return self.outcome in (Outcome.IMPROVEMENT, Outcome.REGRESSION)

    @property
    def own_interval_pct(self) -> tuple[float, float] | None:
        """The repeated interval in the metric's own direction (a latency rise is +), as ``delta_pct`` is."""
        lo, hi = self.rci_low_pct, self.rci_high_pct
        if lo is None or hi is None:
            return None
        if self.metric is None or METRICS[self.metric].higher_is_better:
            return lo, hi
        return (100.0 / (1 + hi / 100) - 100 if math.isfinite(hi) else -100.0,
                100.0 / (1 + lo / 100) - 100 if lo > -100 else math.inf)

    @property
    def rci_too_wide(self) -> bool:
        """The repeated interval spans more than a factor of 2 either way (e.g. at an early look): show it as
        "too wide" rather than as numbers unless it decided something (then it excludes 0 and is shown)."""
        if self.se_log is None or self.boundary_t is None:
            return True
        return self.boundary_t * self.se_log > MAX_HALF_WIDTH_LOG


def _pct(x: float) -> float:
    """100 * (exp(x) - 1); +inf where exp overflows (the repeated interval of an early look can be that wide)."""
    return 100.0 * math.expm1(x) if x < 700 else math.inf


def _resolve_look(spec: VerdictSpec, look: int | None, n: int) -> int:
    k = len(spec.looks)
    if look is None:
        return max(1, sum(1 for r in spec.looks if r <= n))
    if isinstance(look, bool) or not isinstance(look, int) or not 1 <= look <= k:
        raise ValueError(f"look must be in 1..{k}, got {look!r}")
    return look


def _check_scores(scores: Mapping[int, float], what: str) -> dict[int, float]:
    if not isinstance(scores, Mapping):
        raise ValueError(f"{what}: a mapping round index -> score")
    out = {}
    for r, v in scores.items():
        if type(v) is not float and (isinstance(v, bool) or not isinstance(v, Real)):
            raise ValueError(f"{what}: round {r!r} score is not a number: {v!r}")
        out[_round_index(r)] = float(v)
    return dict(sorted(out.items()))


def primary_test(
    scores: Mapping[int, float],
    spec: VerdictSpec,
    *,
    look: int | None = None,
    aa_scores: Mapping[int, float] | None = None,
    final: bool = False,
    metric: str | None = None,
    strata: Strata | None = None,
) -> PrimaryResult:
    """The declared test at one look of the sequential design.

    ``scores``: round index -> that round's score (``round_score``/``round_scores``). ``look``: 1-based
    look number; default: the number of planned looks reached by ``len(scores)`` (at least 1). Pass it when
    rounds were lost, so the boundary of the look actually taken is used. ``aa_scores``: the A/A arm's
    scores (baseline.aa against baseline, same rounds), pooled into the variance when ``spec.pool_aa`` and
    the variance check allows (below); df = (n-1 + m-1) / (1 + 1/4), because a
    round's candidate and A/A scores share the baseline session (correlation 1/2 at equal variances).
    ``final``: no more rounds will come (budget spent): an undecided test is decided INCONCLUSIVE.
    ``metric``: the single metric these scores are of (None: the composite); only labels and ``delta_pct``.
    ``strata``: what each round's score carries besides the change (runtime.cross_groups: round r in GPU layout
    r mod N, whose groups' speed difference it carries; a run resumed on another machine: the machine): the
    estimate is the mean of the strata's means (each weighted alike, so a group's or a machine's speed cancels)
    and the variance is the one within strata, on n - N degrees of freedom; None: one stratum.

    Boundaries: Lan-DeMets spending of ``spec.alpha`` at information fraction look_rounds / max_rounds; each
    look's nominal two-sided alpha (``look_alphas``: matched on the t statistics of the planned design) is
    converted to a t critical value at this look's df, an approximation validated by simulation
    (docs/statistics.md). The pooling check is a two-sided F test at 0.05 acted on in one direction: pooling
    is refused only when the candidate's scores vary significantly more than the A/A scores.
    """
    s = _check_scores(scores, "scores")
    if metric is not None and metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}")
    k = _resolve_look(spec, look, len(s))
    n_looks = len(spec.looks)
    aa = ([v for v in _check_scores(aa_scores, "aa_scores").values() if math.isfinite(v)]
          if spec.pool_aa and aa_scores is not None and strata is None else [])
    alpha_k = look_alphas(spec, pooled=len(aa) >= 2)[k - 1]
    last = final or k == n_looks
    where = (f"look {k} of {n_looks}, {SPENDING_LABEL[spec.spending]}" if n_looks > 1
             else "fixed design")
    own_sign = -1.0 if metric is not None and not METRICS[metric].higher_is_better else 1.0
    empty = dict(estimate_pct=None, delta_pct=None, ci_low_pct=None, ci_high_pct=None, rci_low_pct=None,
                 rci_high_pct=None, p_value=None, boundary_t=None, df=None, mean_log=None, se_log=None,
                 sd_score=None, mde_pct=None, tost=None, rounds_for_target=None)
    base = dict(metric=metric, n_rounds=len(s), rounds=tuple(s),
                scores_pct=tuple(_pct(v) if math.isfinite(v) else math.nan for v in s.values()), look=k, n_looks=n_looks,
                spending=spec.spending, nominal_alpha=alpha_k)

    def inconclusive(why: str, **known) -> PrimaryResult:
        return PrimaryResult(**base, **{**empty, **known}, pooled=False, variance="none",
                             outcome=Outcome.INCONCLUSIVE, decided=last,
                             reason=f"{why} ({where}{', final: no more rounds' if last else ''})")

    xs = list(s.values())
    bad = [r for r, v in s.items() if not math.isfinite(v)]
    if bad:
        return inconclusive(f"non-finite score in round(s) {bad}: no test")
    if len(xs) < 2:
        known = dict(estimate_pct=_pct(xs[0]), delta_pct=_pct(own_sign * xs[0]), mean_log=xs[0]) if xs else {}
        return inconclusive(f"{len(xs)} round{'s' if len(xs) != 1 else ''}: no interval", **known)
    n = len(xs)
    if strata is not None:
        w = within_layouts(xs, [strata.of(r) for r in s], strata.n)
        if not isinstance(w, WithinLayouts):  # the estimate only once every stratum is in it
            known = dict(estimate_pct=_pct(w), delta_pct=_pct(own_sign * w), mean_log=w) if w is not None else {}
            return inconclusive(f"{n} {strata.unit} in {len({strata.of(r) for r in s})} of the {strata.n} "
                                f"{strata.kind}: no interval once the {strata.kind}' difference is taken out", **known)
        mean, var, n_eff, df = w.mean, w.var, w.n_eff, w.df
        variance = f"paired, {n} rounds, within {strata.n} {strata.kind}"
    else:
        mean, var = mean_var(xs)
        n_eff, df, variance = float(n), n - 1.0, f"paired, {n} rounds"
    point = dict(estimate_pct=_pct(mean), delta_pct=_pct(own_sign * mean), mean_log=mean)
    if math.sqrt(var / n_eff) <= ZERO_SE:
        return inconclusive("no spread across rounds (identical scores): no interval", **point)

    pooled = False
    if spec.pool_aa and strata is None:  # never across strata (aa is empty there)
        if len(aa) < 2:
            variance += "; not pooled: fewer than 2 A/A rounds"
        else:
            _, var_aa = mean_var(aa)
            if var_aa <= ZERO_SE**2:
                variance += "; not pooled: no spread in the A/A scores"
            else:
                f = var / var_aa
                p_f = float(2 * min(fdtrc(n - 1, len(aa) - 1, f), fdtrc(len(aa) - 1, n - 1, 1 / f)))
                if not _pool_allowed(var, var_aa, n - 1, len(aa) - 1):
                    variance += f"; not pooled: candidate varies more than A/A (F={f:.2f}, p={p_f:.2g})"
                else:
                    m = len(aa)
                    var = ((n - 1) * var + (m - 1) * var_aa) / (n - 1 + m - 1)
                    df = (n - 1 + m - 1) / (1 + AA_CORRELATION**2)
                    pooled = True
                    variance = f"pooled with {m} A/A rounds (F={f:.2f}, p={p_f:.2f}), df {df:.1f}"

    se = math.sqrt(var / n_eff)
    t = mean / se
    crit = t_boundary(alpha_k, df)
    t95 = float(stdtrit(df, 0.975))
    p_value = float(2 * stdtr(df, -abs(t)))
    delta = math.log1p(spec.target_pct / 100)
    tost = float(max(stdtr(df, -(mean + delta) / se), stdtr(df, (mean - delta) / se)))
    mde_log = (crit + float(stdtrit(df, spec.power))) * se
    sd = math.sqrt(var)
    try:
        needed = rounds_needed(sd, spec.target_pct, spec)
    except ValueError:
        needed = None
    stats = dict(ci_low_pct=_pct(mean - t95 * se), ci_high_pct=_pct(mean + t95 * se),
                 rci_low_pct=_pct(mean - crit * se), rci_high_pct=_pct(mean + crit * se),
                 p_value=p_value, boundary_t=crit, df=df, se_log=se, sd_score=sd,
                 mde_pct=_pct(mde_log), tost=tost, rounds_for_target=needed, **point)
    if not all(math.isfinite(v) for v in (mean, se, t, p_value, tost, df)):  # crit may be inf: no alpha here
        return inconclusive("non-finite statistics: no test", **point)

    est = fmt_pct(stats["estimate_pct"])
    interval = fmt_interval(stats["rci_low_pct"], stats["rci_high_pct"])
    decided = True
    if abs(t) > crit:
        outcome = Outcome.IMPROVEMENT if mean > 0 else Outcome.REGRESSION
        reason = f"{est} {interval}, p={p_value:.2g} < {alpha_k:.2g} ({where})"
    elif mean - crit * se > -delta and mean + crit * se < delta:
        outcome = Outcome.EQUIVALENT
        reason = (f"{est} {interval} inside ±{spec.target_pct:g} %, TOST p={tost:.2g} < {alpha_k / 2:.2g} "
                  f"({where})")
    else:
        outcome, decided = Outcome.INCONCLUSIVE, last
        # rounds for the target only where it has fewer: with as many, the estimate sits between no change and
        # the target's bound (more rounds narrow it, no plan says how many)
        plan = f"; needs ≈ {needed} rounds for ±{spec.target_pct:g} %" if needed is not None and needed > n else ""
        mde = stats["mde_pct"]
        could = f"could detect ±{mde:.0f} %" if mde < 1000 else "could detect only changes beyond 10×"
        if crit * se > MAX_HALF_WIDTH_LOG:
            interval = "[interval wider than ×/÷ 2]"
        reason = (f"{est} {interval}, p={p_value:.2g}: {could} at {spec.power * 100:g} % power{plan} "
                  f"({where}{', final: no more rounds' if last else ''})")
    return PrimaryResult(**base, **stats, pooled=pooled, variance=variance, outcome=outcome, decided=decided,
                         reason=reason)
