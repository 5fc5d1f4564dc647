"""Statistics core: the metric registry, summaries, Δ% with a confidence interval, A/A noise floor, Holm.

Pure functions over plain values; no I/O. See docs/statistics.md for the method and its measured coverage.

Δ% is the ratio of geometric means, candidate over baseline, minus one. The interval is a t interval on the
difference of mean log values: Welch (unequal variances, Welch-Satterthwaite df) for independent repeats,
or a one-sample t on per-repeat log ratios when ``paired=True`` (ABBA pairs run back to back). The point
estimate, interval and p-value all come from the same log-scale t statistic, so "interval excludes 0" and
"p < 1 - confidence" always agree.

Errors stay errors: malformed input (empty, NaN/inf, negative, unequal paired lengths, bad confidence)
raises ``ValueError``. A comparison that is well formed but cannot support a verdict (one repeat, zero
values, no spread, huge spread, an interval wider than a factor of 2 either way) returns verdict
``unreliable`` with the reason, never "better"/"worse"; an interval that wide is not returned as numbers.

Accuracy (per-question pairing, McNemar's test in score form and exact, Tango's score interval on the paired
difference, the accuracy gate) lives in ``suite.accuracy_stats``; the primary test of a candidate (composite,
sequential) in ``suite.verdict``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from scipy.special import fdtrc, stdtr, stdtrit

POWER = 0.80  # power used for the minimum detectable effect
MAX_CV = 0.50  # default: above this coefficient of variation an arm's repeats are "unreliable"
ZERO_SE = 1e-12  # a log-scale standard error below this is rounding noise: no spread
# an interval whose half-width on the log scale exceeds this (a factor of 2 either way: below -50 % or above
# +100 %) says nothing a reader can use: the comparison is "unreliable" and the interval is not returned
MAX_HALF_WIDTH_LOG = math.log(2)


def set_value(values: Sequence[float]) -> float:
    """A round's value (together: all) from its blocks' positive values: their median, taken in log
    (with two blocks, their geometric mean). The median, not the mean, because a server's first minute can run ~5 % slow and then
    return to its level (the H200, docs/gpu-h200.md): one such block of three moves the mean by a third of
    its offset and the median hardly at all, and a start's own offset, which lasts the server's life, is
    in every block alike and kept."""
    return math.exp(statistics.median(math.log(v) for v in values))


# --------------------------------------------------------------------------- metric registry


@dataclass(frozen=True)
class MetricInfo:
    key: str  # key in the `vllm bench serve` result JSON
    label: str
    unit: str
    higher_is_better: bool
    family: str  # what it measures: "throughput", or a latency of LATENCIES (a data-quality finding names these)
    stat: str  # a throughput's "rate" (over the measurement) or "peak" (its busiest second); a latency's "mean",
    # "median" or "p<N>" over the requests


# the latencies `vllm bench serve` reports per request (--percentile-metrics) and the percentiles the suite asks
# it for (--metric-percentiles): every latency metric below exists in its result JSON
LATENCIES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}
PERCENTILES = (50, 90, 99)


def _build_metrics() -> dict[str, MetricInfo]:
    metrics = {key: MetricInfo(key, label, unit, True, "throughput", stat) for key, label, unit, stat in (
        ("output_throughput", "Output throughput", "tok/s", "rate"),
        ("request_throughput", "Request throughput", "req/s", "rate"),
        ("total_token_throughput", "Total token throughput", "tok/s", "rate"),
        # the busiest second of the measurement: vLLM's bench counts output tokens per whole second of it
        ("max_output_tokens_per_s", "Peak output throughput", "tok/s", "peak"))}
    stats = {"mean": "Mean", "median": "Median", **{f"p{q}": f"P{q}" for q in PERCENTILES}}
    for lat, lat_label in LATENCIES.items():
        for stat, stat_label in stats.items():
            key = f"{stat}_{lat}_ms"
            metrics[key] = MetricInfo(key, f"{stat_label} {lat_label}", "ms", False, lat, stat)
    return metrics


METRICS: dict[str, MetricInfo] = _build_metrics()
FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(m.family for m in METRICS.values()))
# the default composite of the primary test, and the serving tables' headline columns
HEADLINE: tuple[str, ...] = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms")
# the per-cell statistics tables and heat map
DETAIL: tuple[str, ...] = ("output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                           "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms",
                           "median_e2el_ms", "p99_e2el_ms")
DUPLICATES = {"mean_itl_ms": "mean_tpot_ms"}  # left out of the tables: equal by construction in vLLM's bench


# --------------------------------------------------------------------------- summaries


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    median: float
    stdev: float | None  # sample stdev (n-1); None when n == 1
    cv: float | None  # stdev / |mean|; None when n == 1 or mean == 0
    min: float
    max: float


def _check_values(values: Sequence[float], what: str = "values") -> list[float]:
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError(f"{what}: empty input")
    bad = [x for x in xs if not math.isfinite(x)]
    if bad:
        raise ValueError(f"{what}: non-finite value(s) {bad}")
    return xs


def summarize(values: Sequence[float]) -> Summary:
    xs = sorted(_check_values(values))
    n = len(xs)
    mean = math.fsum(xs) / n
    mid = n // 2
    median = xs[mid] if n % 2 else (xs[mid - 1] + xs[mid]) / 2
    stdev = cv = None
    if n >= 2:
        stdev = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
        cv = stdev / abs(mean) if mean != 0 else None
    return Summary(n=n, mean=mean, median=median, stdev=stdev, cv=cv, min=xs[0], max=xs[-1])


# --------------------------------------------------------------------------- comparison


class Verdict(StrEnum):
    BETTER = "better"
    WORSE = "worse"
    NOT_SIGNIFICANT = "not significant"
    UNRELIABLE = "unreliable"


@dataclass(frozen=True)
class Comparison:
    baseline: Summary
    candidate: Summary
    higher_is_better: bool
    ratio: float | None  # geometric mean of candidate / geometric mean of baseline
    delta_pct: float | None  # 100 * (ratio - 1)
    ci_low_pct: float | None
    ci_high_pct: float | None
    p_value: float | None
    df: float | None
    noise_floor_pct: float | None
    min_detectable_effect_pct: float | None  # |Δ%| detectable with POWER at this spread and n
    confidence: float
    paired: bool
    method: str
    verdict: Verdict
    reason: str

    @property
    def significant(self) -> bool:
        return self.verdict in (Verdict.BETTER, Verdict.WORSE)


def fmt_pct(value: float | None, digits: int = 1) -> str:
    """A signed change in percent, as every table, card and verdict reason writes it: ``+20.0%``, ``-3.1%``,
    ``+∞%`` (the repeated interval of an early look can be unbounded); ``n/a`` when unknown. The sign is the
    value's own: an interval's ``-0.0`` says its end lies (just) below zero."""
    if value is None or math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return f"{'+' if value > 0 else '-'}∞%"
    return f"{value:+.{digits}f}%"


def fmt_interval(low: float | None, high: float | None) -> str:
    """A percent interval without the unit: ``[-1.2, +3.4]``; ``—`` when unknown. An end within 0.05 of zero
    gets the digits that show its first figure (``[-14.5, -0.02]``, up to three decimals): an interval that
    excludes 0 by a hair must not read as touching it."""
    if low is None or high is None:
        return "—"
    return f"[{fmt_pct(low, _end_digits(low))[:-1]}, {fmt_pct(high, _end_digits(high))[:-1]}]"


def _end_digits(value: float) -> int:
    if not math.isfinite(value) or value == 0 or abs(value) >= 0.05:
        return 1
    return min(3, -math.floor(math.log10(abs(value))))


def _pct(log_ratio: float) -> float:
    return 100.0 * math.expm1(log_ratio) if log_ratio < 700 else math.inf


def mean_var(xs: Sequence[float]) -> tuple[float, float]:
    """(mean, sample variance) of two values or more."""
    m = math.fsum(xs) / len(xs)
    return m, math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1)


@dataclass(frozen=True)
class Strata:
    """What a paired test takes out besides the pairing: the stratum each round was measured in, whose own offset
    the estimate cancels (``within_layouts``: the mean of the strata's means, the spread within strata on n - N
    degrees of freedom). The GPU layout under runtime.cross_groups (round r in layout r mod N), or the machine a
    round ran on (a run resumed on another machine), or both."""

    n: int
    kind: str = "GPU layouts"  # what the strata are, plural, as the reasons name them
    by_round: Mapping[int, int] | None = None  # round -> stratum 0 .. n-1; None: round r in stratum r mod n
    unit: str = "rounds"  # what a score is of, plural (together: all: "rounds")

    def of(self, r: int) -> int:
        return self.by_round[r] if self.by_round is not None else r % self.n

    @classmethod
    def layouts(cls, n: int) -> Strata | None:
        """runtime.cross_groups' N layouts, one per round (None for one: nothing to take out)."""
        return cls(n, unit="rounds") if n > 1 else None


@dataclass(frozen=True)
class WithinLayouts:
    """Paired differences measured over GPU layouts that repeat (runtime.cross_groups: round r in layout r mod N),
    each layout's own offset taken out: ``mean`` is the mean of the layouts' means (each layout weighted alike,
    so a group's speed cancels even when a layout has fewer rounds), ``var`` the variance within layouts on ``df``
    = n - N degrees of freedom, and ``n_eff`` the count that scales it to the mean's (n when balanced)."""

    mean: float
    var: float
    n_eff: float
    df: float


def within_layouts(values: Sequence[float], layouts: Sequence[int], n_layouts: int) -> WithinLayouts | float | None:
    """``values[i]`` measured in layout ``layouts[i]`` (0 .. n_layouts - 1). The layouts' difference can be taken
    out only once every layout has a value and one layout has two: otherwise the mean of the layouts' means
    (float) when every layout is in, else None."""
    by_layout: dict[int, list[float]] = {}
    for v, k in zip(values, layouts, strict=True):
        by_layout.setdefault(k, []).append(v)
    if len(by_layout) < n_layouts:
        return None
    means = {k: math.fsum(v) / len(v) for k, v in by_layout.items()}
    mean = math.fsum(means.values()) / n_layouts
    n = len(values)
    if n <= n_layouts:
        return mean
    var = math.fsum((x - means[k]) ** 2 for k, v in by_layout.items() for x in v) / (n - n_layouts)
    return WithinLayouts(mean, var, n_layouts**2 / math.fsum(1 / len(v) for v in by_layout.values()),
                         float(n - n_layouts))


@dataclass(frozen=True)
class OneWay:
    """A one-way analysis of variance of values in groups (together: all: each round's block scores):
    sums of squares and degrees of freedom between and within the groups. Runs are independent, so their
    analyses add (``+``): each run keeps its own mean (its own effect), the spreads pool."""

    ss_between: float
    df_between: int
    ss_within: float
    df_within: int
    groups: int
    values: int

    def __add__(self, other: OneWay) -> OneWay:
        return OneWay(self.ss_between + other.ss_between, self.df_between + other.df_between,
                      self.ss_within + other.ss_within, self.df_within + other.df_within,
                      self.groups + other.groups, self.values + other.values)

    @property
    def f(self) -> float:
        """Mean square between groups over mean square within: about 1 when the groups differ only by the
        noise of their values; large when each group has an offset of its own."""
        within = self.ss_within / self.df_within
        return math.inf if within <= 0 else (self.ss_between / self.df_between) / within

    @property
    def p(self) -> float:
        """The F test's p: how often an F this large comes when the groups differ only by their values' noise."""
        return 0.0 if math.isinf(self.f) else float(fdtrc(self.df_between, self.df_within, self.f))

    @property
    def within_sd(self) -> float:
        """The values' SD inside a group."""
        return math.sqrt(self.ss_within / self.df_within)

    @property
    def group_sd(self) -> float:
        """The SD of a group's own offset (the variance component, 0 where the groups spread less than their
        values' noise predicts): var(group mean) = group_sd² + within_sd² / values per group."""
        per_group = self.values / self.groups
        return math.sqrt(max(0.0, (self.ss_between / self.df_between - self.within_sd**2) / per_group))


def fmt_set_spread(spread: OneWay) -> str:
    """A together: all run's (or runs') round spread in words: the blocks' SD inside a round, the round's own
    part, the F test and the design it came from."""
    return (f"its blocks spread {100 * spread.within_sd:.2f} % inside a round, a round's own part "
            f"{100 * spread.group_sd:.2f} % (F = {spread.f:.2f} on {spread.df_between} and {spread.df_within} "
            f"degrees of freedom, p = {spread.p:.2g}; {spread.groups} rounds of {spread.values / spread.groups:g} blocks)")


def one_way(groups: Sequence[Sequence[float]]) -> OneWay | None:
    """The analysis of ``groups`` (each a list of values); None without two groups or a group of two values."""
    groups = [list(g) for g in groups if g]
    values = sum(map(len, groups))
    if len(groups) < 2 or values <= len(groups):
        return None
    grand = math.fsum(math.fsum(g) for g in groups) / values
    means = [math.fsum(g) / len(g) for g in groups]
    return OneWay(math.fsum(len(g) * (m - grand) ** 2 for g, m in zip(groups, means, strict=True)), len(groups) - 1,
                  math.fsum((x - m) ** 2 for g, m in zip(groups, means, strict=True) for x in g),
                  values - len(groups), len(groups), values)


def _log_t(lb: list[float], lc: list[float], paired: bool) -> tuple[float, float, float]:
    """(difference of mean logs, its standard error, degrees of freedom); needs n >= 2 per arm."""
    if paired:
        diffs = [c - b for b, c in zip(lb, lc, strict=True)]
        d, var = mean_var(diffs)
        return d, math.sqrt(var / len(diffs)), len(diffs) - 1.0
    mb, varb = mean_var(lb)
    mc, varc = mean_var(lc)
    vb, vc = varb / len(lb), varc / len(lc)
    se2 = vb + vc
    denom = vb * vb / (len(lb) - 1) + vc * vc / (len(lc) - 1)
    df = se2 * se2 / denom if denom > 0 else float(len(lb) + len(lc) - 2)
    return mc - mb, math.sqrt(se2), df


def compare(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    higher_is_better: bool,
    noise_floor_pct: float | None = None,
    confidence: float = 0.95,
    paired: bool = False,
    max_cv: float = MAX_CV,
    max_half_width_log: float = MAX_HALF_WIDTH_LOG,
    strata: Strata | None = None,
    rounds: Sequence[int] | None = None,
) -> Comparison:
    """Compare repeats of one metric at one point: Δ% of candidate vs baseline with an interval and a verdict.

    ``paired=True``: ``baseline[i]`` and ``candidate[i]`` were measured together (one ABBA round); the test
    uses per-pair log ratios, which cancels drift between rounds. An interval whose log-scale half-width
    exceeds ``max_half_width_log`` (default log 2) makes the comparison ``unreliable``; its interval and
    minimum detectable effect are then None (the reason gives the width), Δ and p stay.
    ``strata`` (paired only): pair i was measured in round ``rounds[i]``, in stratum ``strata.of(rounds[i])`` (a
    GPU layout of runtime.cross_groups, a machine); the strata's difference is taken out as in the primary test
    (``within_layouts``: the mean of the strata's means, the spread within strata, n - N df).
    """
    b = _check_values(baseline, "baseline")
    c = _check_values(candidate, "candidate")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if noise_floor_pct is not None and not (math.isfinite(noise_floor_pct) and noise_floor_pct >= 0):
        raise ValueError(f"noise_floor_pct must be finite and >= 0, got {noise_floor_pct}")
    if not max_half_width_log > 0:
        raise ValueError(f"max_half_width_log must be > 0, got {max_half_width_log}")
    if min(b + c) < 0:
        raise ValueError("negative values: throughputs and latencies cannot be negative")
    if paired and len(b) != len(c):
        raise ValueError(f"paired comparison needs equal repeats, got {len(b)} baseline, {len(c)} candidate")
    if strata is not None and (not paired or rounds is None or len(rounds) != len(b)):
        raise ValueError(f"{strata.kind} (strata) need paired values and the round of each pair")

    method = "paired t on log ratios" if paired else "Welch t on log values"
    if strata is not None:
        method += f", within {strata.n} {strata.kind}"
    base = dict(
        baseline=summarize(b),
        candidate=summarize(c),
        higher_is_better=higher_is_better,
        noise_floor_pct=noise_floor_pct,
        confidence=confidence,
        paired=paired,
        method=method,
    )
    empty = dict(
        ratio=None,
        delta_pct=None,
        ci_low_pct=None,
        ci_high_pct=None,
        p_value=None,
        df=None,
        min_detectable_effect_pct=None,
    )

    def unreliable(reason: str, **known: float | None) -> Comparison:
        return Comparison(**base, **{**empty, **known}, verdict=Verdict.UNRELIABLE, reason=reason)

    if min(b + c) == 0:
        return unreliable("zero value(s) in repeats: ratio undefined")
    lb, lc = [math.log(x) for x in b], [math.log(x) for x in c]
    log_ratio = math.fsum(lc) / len(lc) - math.fsum(lb) / len(lb)
    within = None
    if strata is not None:
        within = within_layouts([y - x for x, y in zip(lb, lc, strict=True)], [strata.of(r) for r in rounds], strata.n)
        if within is not None:  # every layout in: the mean of the layouts' means
            log_ratio = within.mean if isinstance(within, WithinLayouts) else within
    point = dict(ratio=math.exp(log_ratio), delta_pct=_pct(log_ratio))
    if min(len(b), len(c)) < 2:
        return unreliable(f"1 repeat: no interval (baseline n={len(b)}, candidate n={len(c)})", **point)
    if strata is not None and not isinstance(within, WithinLayouts):
        seen = len({strata.of(r) for r in rounds})
        return unreliable(f"{len(b)} rounds in {seen} of the {strata.n} {strata.kind}: no interval once the "
                          f"{strata.kind}' difference is taken out", **(point if within is not None else {}))

    if isinstance(within, WithinLayouts):
        d, se, df = within.mean, math.sqrt(within.var / within.n_eff), within.df
    else:
        d, se, df = _log_t(lb, lc, paired)
    if se <= ZERO_SE:  # identical values up to rounding of the logs
        return unreliable("no spread across repeats (identical values): interval undefined", **point)
    tcrit = float(stdtrit(df, 0.5 + confidence / 2))
    p_value = float(2 * stdtr(df, -abs(d) / se))
    if not all(math.isfinite(v) for v in (d, se, tcrit, p_value)):
        return unreliable(f"non-finite statistics (Δlog {d}, SE {se}, t {tcrit}, p {p_value})", **point)

    summaries = (("baseline", base["baseline"]), ("candidate", base["candidate"]))
    noisy = [f"{name} CV {s.cv:.0%}" for name, s in summaries if s.cv is not None and s.cv > max_cv]
    half_width = tcrit * se
    if half_width > max_half_width_log:
        spread = f" ({', '.join(noisy)})" if noisy else ""
        return unreliable(
            f"{confidence:.0%} interval spans ×/÷ {math.exp(half_width):.3g}, wider than "
            f"×/÷ {math.exp(max_half_width_log):.3g}{spread}: too wide to show",
            p_value=p_value,
            df=df,
            **point,
        )
    mde_log = (tcrit + float(stdtrit(df, POWER))) * se
    stats = dict(
        ci_low_pct=_pct(d - half_width),
        ci_high_pct=_pct(d + half_width),
        p_value=p_value,
        df=df,
        min_detectable_effect_pct=_pct(mde_log),
        **point,
    )
    if not all(math.isfinite(v) for v in stats.values()):
        return unreliable("non-finite interval", p_value=p_value, df=df, **point)
    if noisy:
        return unreliable(f"{', '.join(noisy)} > {max_cv:.0%}: spread too large for an interval", **stats)

    lo, hi, delta = stats["ci_low_pct"], stats["ci_high_pct"], stats["delta_pct"]
    level = f"{confidence:.0%}"
    if lo <= 0 <= hi:
        verdict, reason = Verdict.NOT_SIGNIFICANT, f"{level} interval includes 0 (p={p_value:.3g})"
    elif noise_floor_pct is not None and abs(delta) <= noise_floor_pct:
        verdict = Verdict.NOT_SIGNIFICANT
        reason = f"|Δ| {abs(delta):.2f}% within the A/A noise floor {noise_floor_pct:.2f}%"
    else:
        verdict = Verdict.BETTER if (delta > 0) == higher_is_better else Verdict.WORSE
        floor = f", |Δ| above noise floor {noise_floor_pct:.2f}%" if noise_floor_pct is not None else ""
        reason = f"{level} interval excludes 0 (p={p_value:.3g}){floor}"
    return Comparison(**base, **stats, verdict=verdict, reason=reason)


def compare_metric(key: str, baseline: Sequence[float], candidate: Sequence[float], **kwargs) -> Comparison:
    """`compare` with the direction taken from ``METRICS[key]``."""
    if key not in METRICS:
        raise ValueError(f"unknown metric {key!r}; known: {', '.join(METRICS)}")
    return compare(baseline, candidate, higher_is_better=METRICS[key].higher_is_better, **kwargs)


# --------------------------------------------------------------------------- A/A noise floor


def noise_floor_pct(
    aa_pairs: Sequence[tuple[Sequence[float], Sequence[float]]], *, quantile: float = 0.95
) -> float:
    """Noise floor of one metric from A/A comparisons (the baseline against itself).

    Each pair is (repeats of arm A, repeats of arm A'); its |Δ%| is the same geometric-mean-ratio estimate
    that `compare` reports. The floor is the ``quantile`` of |Δ%| over the pairs (linear interpolation;
    with one pair it is that pair's |Δ%|). Pool pairs across points of the same metric for a stable floor.
    """
    if not aa_pairs:
        raise ValueError("noise floor needs at least one A/A pair")
    if not 0 <= quantile <= 1:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    deltas = []
    for i, (a, a2) in enumerate(aa_pairs):
        xa, xa2 = _check_values(a, f"A/A pair {i} arm A"), _check_values(a2, f"A/A pair {i} arm A'")
        if min(xa + xa2) <= 0:
            raise ValueError(f"A/A pair {i}: non-positive value(s), ratio undefined")
        log_ratio = math.fsum(map(math.log, xa2)) / len(xa2) - math.fsum(map(math.log, xa)) / len(xa)
        deltas.append(abs(_pct(log_ratio)))
    deltas.sort()
    pos = quantile * (len(deltas) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(deltas) - 1)
    return deltas[lo] + (deltas[hi] - deltas[lo]) * (pos - lo)


# --------------------------------------------------------------------------- across points


def geometric_mean_ratio(ratios: Sequence[float]) -> float:
    """Geometric mean of positive ratios (e.g. per-point candidate/baseline), for an across-points summary."""
    xs = _check_values(ratios, "ratios")
    if min(xs) <= 0:
        raise ValueError("geometric mean needs positive ratios")
    return math.exp(math.fsum(map(math.log, xs)) / len(xs))


def holm(pvalues: Mapping[Hashable, float], alpha: float, m: int | None = None) -> dict[Hashable, float]:
    """Holm's step-down at family-wise ``alpha`` over ``m`` tests (default: those given): the tests it
    rejects, each with the threshold it met (alpha / (m - rank), rank 0 for the smallest p). Ties in p keep
    the order given."""
    ranked = sorted(pvalues.items(), key=lambda kv: kv[1])
    m = len(ranked) if m is None else m
    out: dict[Hashable, float] = {}
    for rank, (key, p) in enumerate(ranked):
        threshold = alpha / (m - rank)
        if p > threshold:
            break
        out[key] = threshold
    return out


def holm_threshold(pvalues: Mapping[Hashable, float], key: Hashable, alpha: float) -> float:
    """The threshold Holm's step-down sets for ``key``'s rank among ``pvalues``."""
    rank = [k for k, _ in sorted(pvalues.items(), key=lambda kv: kv[1])].index(key)
    return alpha / (len(pvalues) - rank)

