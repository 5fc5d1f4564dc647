"""Checks across rounds and sessions: a trend of an arm's level against round (exact Mann–Kendall), a
session that changed between its first and its last measurement, one round far off its arm's other rounds,
and per-session levels that split in two."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.stats import norm

from suite.quality.finding import Finding, RepeatResult, fmt_value, repeat_name
from suite.stats import METRICS, set_value

SESSION_DRIFT_MIN_PCT = 2.0  # a session's point measured again at its end: differences below this are noise
SESSION_DRIFT_FACTOR = 5.0  # ... or below this many times the run's median difference (its own noise)
SESSION_DRIFT_MIN_PAIRS = 4  # pairs the median needs
ROUND_OUTLIER_MIN_PCT = 3.0  # a round's value against the same arm and point's other rounds: below this, noise
ROUND_OUTLIER_FACTOR = 5.0  # ... or below this many times the run's median deviation (its own noise)
ROUND_OUTLIER_MIN_OTHERS = 3  # other rounds the median of a cell needs
ROUND_OUTLIER_ISOLATION = 3.0  # ... and the round stands alone: this many times farther than any of the others
ROUND_OUTLIER_MIN_DEVIATIONS = 8  # deviations the run's median needs
BLOCK_OUTLIER_FACTOR = 10.0  # a block against its round's other two: their median is a weaker reference
DRIFT_ALPHA = 0.05
DRIFT_MIN_ROUNDS = 5  # one series of 4 values never reaches p < 0.05 (its smallest p is 1/12)
BIMODAL_ALPHA = 0.05
BIMODAL_MIN_R2 = 0.80
BIMODAL_MIN_GAP = 0.05
BIMODAL_MIN_CLUSTER = 2
BIMODAL_NULL_DRAWS = 20_000


@lru_cache(maxsize=64)
def _inversions_pmf(n: int) -> tuple[float, ...]:
    """P(a random permutation of n items has k inversions), k = 0 .. n(n-1)/2 (Mahonian numbers)."""
    counts = [1]
    for m in range(2, n + 1):  # insert item m: it adds 0 .. m-1 inversions
        new = [0] * (len(counts) + m - 1)
        for k, c in enumerate(counts):
            for j in range(m):
                new[k + j] += c
        counts = new
    total = math.factorial(n)
    return tuple(c / total for c in counts)


def _kendall_s(y: Sequence[float]) -> int:
    return sum((y[j] > y[i]) - (y[j] < y[i]) for i in range(len(y)) for j in range(i + 1, len(y)))


def mann_kendall(series: Sequence[Sequence[float]]) -> tuple[int, float]:
    """Mann–Kendall trend test, stratified over several series (the seasonal Kendall test of Hirsch et al.:
    S is summed over the series, each ordered in time). Returns (S, two-sided p).

    Without ties the p-value is exact (the null distribution of each series' S is that of the inversions of
    a random permutation; the series' distributions are convolved). With ties it is the normal
    approximation with the tie-corrected variance and a continuity correction. One series of 4 values can
    never reach p < 0.05 (its smallest p is 1/12); 5 can (1/60); three series of 3 can (1/108).
    """
    series = [[float(v) for v in s] for s in series if len(s) >= 2]
    if not series:
        return 0, 1.0
    s_obs = sum(_kendall_s(s) for s in series)
    if any(len(set(s)) < len(s) for s in series):
        var = 0.0
        for s in series:
            n = len(s)
            ties = [s.count(v) for v in set(s)]
            var += (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties)) / 18
        if var <= 0 or s_obs == 0:
            return s_obs, 1.0
        z = (abs(s_obs) - 1) / math.sqrt(var)
        return s_obs, float(min(1.0, 2 * norm.sf(z)))
    pmf = np.array([1.0])
    pairs = 0
    for s in series:
        pmf = np.convolve(pmf, _inversions_pmf(len(s)))
        pairs += len(s) * (len(s) - 1) // 2
    s_values = pairs - 2 * np.arange(len(pmf))  # S = concordant − discordant = pairs − 2 · inversions
    p = float(pmf[np.abs(s_values) >= abs(s_obs) - 1e-9].sum())
    return s_obs, min(1.0, p)


def sen_slope_pct(series: Sequence[Sequence[tuple[int, float]]]) -> float:
    """Median of the pairwise slopes of log value against round (pooled over the series), as % per round."""
    slopes = [(math.log(y2) - math.log(y1)) / (x2 - x1)
              for s in series for i, (x1, y1) in enumerate(s) for x2, y2 in s[i + 1:] if x2 != x1]
    return math.expm1(statistics.median(slopes)) * 100 if slopes else 0.0


def _round_series(repeats: Sequence[RepeatResult], metric: str) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(arm, point) -> [(round, value)] in round order; repeats of one round (a round's blocks) are
    merged as the verdict merges them (``set_value``)."""
    acc: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in repeats:
        value = r.raw.metric(metric)
        if value is not None and value > 0:
            acc[(r.arm, r.point)][r.round].append(value)
    return {cell: [(rnd, set_value(vals)) for rnd, vals in sorted(rounds.items())]
            for cell, rounds in acc.items()}


def _level_series(series: Mapping[tuple[str, str], list[tuple[int, float]]]) -> dict[str, list[tuple[int, float]]]:
    """arm -> [(round, level)]: a round's level is the geometric mean of the arm's points in it, over the points
    the arm has in every one of its rounds (a round missing a point would move the mean by the point's size)."""
    by_arm: dict[str, dict[str, dict[int, float]]] = defaultdict(dict)
    for (arm, point), s in series.items():
        by_arm[arm][point] = dict(s)
    out = {}
    for arm, points in sorted(by_arm.items()):
        rounds = sorted(set().union(*(set(v) for v in points.values())))
        full = [pt for pt, v in sorted(points.items()) if set(v) == set(rounds)]
        if full:
            out[arm] = [(r, math.exp(statistics.fmean(math.log(points[pt][r]) for pt in full))) for r in rounds]
    return out


def check_drift(repeats: Sequence[RepeatResult], metric: str = "output_throughput") -> list[Finding]:
    """Drift across rounds: a monotone trend of an arm's level of ``metric`` (output throughput) against round.

    Per arm: its level in each round (the geometric mean over its points: the points of one session share its
    server's and the window's state, so they are one observation of the round, not several), the exact
    Mann–Kendall test (rank-based: one wild round cannot make a trend) on that one series, at ``DRIFT_ALPHA``
    = 0.05 shared by the arms tested (Bonferroni: each arm at 0.05 / arms). Five rounds are the fewest one
    series can reach 0.05 with (``DRIFT_MIN_ROUNDS``); six with three arms or more. The size is Sen's slope of the log
    levels, in % per round. A warning: pairing by round cancels a drift shared by the arms, but a trend says the
    machine (or one arm's server) was not steady while it was measured.

    Until 2026-12-05 the test was also run per point and stratified over an arm's points as if they were
    independent series: under no drift at all it warned in 31-63 % of simulated runs
    (benchmarks/simulation/drift_check.py, docs/statistics.md).
    """
    levels = {arm: s for arm, s in _level_series(_round_series(repeats, metric)).items()
              if len(s) >= DRIFT_MIN_ROUNDS}
    findings = []
    for arm, s in levels.items():
        _, p = mann_kendall([[v for _, v in s]])
        if p < DRIFT_ALPHA / len(levels):
            slope = sen_slope_pct([s])
            findings.append(Finding(
                "drift", arm, None, None, "warning",
                f"{metric.replace('_', ' ')} {'rises' if slope > 0 else 'falls'} by {abs(slope):.1f} % per round "
                f"over {len(s)} rounds ({fmt_value(s[0][1])} → {fmt_value(s[-1][1])}, the geometric mean of its "
                f"points; Mann–Kendall p = {p:.3f}"
                + (f", below {DRIFT_ALPHA:g} / {len(levels)} arms)" if len(levels) > 1 else ")")))
    return findings


def check_session_drift(repeats: Sequence[RepeatResult], metric: str = "mean_tpot_ms") -> list[Finding]:
    """Within one server session: a repeat against the same point measured again at the session's end
    (``drift_check``). A change under test is the same all through a server's life, so a difference here is
    the server or the machine changing state while it was measured (on the H200: a server whose first
    request came within a second of /health decoded ~7 % slower for 20-60 s). A warning when the two differ
    by more than ``SESSION_DRIFT_MIN_PCT`` and ``SESSION_DRIFT_FACTOR`` times the run's median difference."""
    pairs = []
    for r in repeats:
        start, end = r.raw.metric(metric), r.end.metric(metric) if r.end is not None else None
        if start and end and start > 0 and end > 0:
            pairs.append((r, start, end, math.log(end / start)))
    if not pairs:
        return []
    floor = math.log1p(SESSION_DRIFT_MIN_PCT / 100)
    if len(pairs) >= SESSION_DRIFT_MIN_PAIRS:
        floor = max(floor, SESSION_DRIFT_FACTOR * statistics.median(abs(d) for *_, d in pairs))
    m = METRICS[metric]
    return [Finding("session-drift", r.arm, r.point, r.round, "warning",
                    f"{m.label} {fmt_value(start)} {m.unit} at the point's first measurement, {fmt_value(end)} "
                    f"{m.unit} when it was measured again at the session's end ({math.expm1(d) * 100:+.1f}%; this "
                    f"run's threshold {math.expm1(floor) * 100:.1f}%): the server was not steady", session=r.session)
            for r, start, end, d in pairs if abs(d) > floor]


@dataclass(frozen=True)
class _Isolated:
    """One value of a group (a cell's rounds, or a round's blocks) far from the group's others."""

    key: tuple[str, str]  # (arm, point)
    index: int  # the round, or the block
    value: float
    mid: float  # the median of the group's other values
    widest: float  # |log| of the farthest of those others from their median
    others: int
    floor: float  # the run's threshold (log)


def _isolated(groups: Mapping[tuple[str, str, int], list[tuple[int, float]]], min_others: int,
              factor: float = ROUND_OUTLIER_FACTOR) -> list[_Isolated]:
    """The values of ``groups`` ((arm, point, group) -> [(index, value)]) that stand alone: more than
    ``ROUND_OUTLIER_MIN_PCT`` and ``factor`` times the run's median deviation (over every value
    with ≥ ``min_others`` others, at least ``ROUND_OUTLIER_MIN_DEVIATIONS`` of them) from the median of their
    group's others, and ``ROUND_OUTLIER_ISOLATION`` times farther than any of those others."""
    devs = []
    for (arm, point, _), s in sorted(groups.items()):
        for idx, value in s:
            others = [v for r, v in s if r != idx]
            if len(others) >= min_others:
                mid = statistics.median(others)
                devs.append(((arm, point), idx, value, mid, max(abs(math.log(v / mid)) for v in others),
                             len(others)))
    if len(devs) < ROUND_OUTLIER_MIN_DEVIATIONS:
        return []
    floor = max(math.log1p(ROUND_OUTLIER_MIN_PCT / 100),
                factor * statistics.median(abs(math.log(d[2] / d[3])) for d in devs))
    return [_Isolated(key, idx, value, mid, widest, n, floor) for key, idx, value, mid, widest, n in devs
            if abs(math.log(value / mid)) > max(floor, ROUND_OUTLIER_ISOLATION * widest)]


def check_round_outlier(repeats: Sequence[RepeatResult], metric: str = "mean_tpot_ms") -> list[Finding]:
    """One round far from the same arm's other rounds at a point: each round's value (``set_value`` of its
    repeats) against the median of the others (≥ ``ROUND_OUTLIER_MIN_OTHERS``). A warning when the two differ
    by more than ``ROUND_OUTLIER_MIN_PCT``, more than ``ROUND_OUTLIER_FACTOR`` times the run's median deviation
    over every cell (≥ ``ROUND_OUTLIER_MIN_DEVIATIONS``: the run's own round-to-round noise), and more than
    ``ROUND_OUTLIER_ISOLATION`` times the farthest of the other rounds from that median: one round alone, not
    a cell whose rounds spread in two levels (the bimodal-sessions check's subject).

    It catches what the session-drift check cannot see: a server slow from its first request to its last, or
    one whose end-of-session repeat was never measured. On the H200 (quiet8 run) ll-bf16's round-3 session
    decoded 8.6 % slower at concurrency 1 than its other rounds, whose median deviation over the run was
    0.36 %; it widened that cell's interval and no other check named it. The verdict's interval already
    carries such a round (it is between-round noise); the warning says which round it was."""
    groups = {(arm, point, 0): s for (arm, point), s in _round_series(repeats, metric).items()}
    m = METRICS[metric]
    return [Finding("round-outlier", o.key[0], o.key[1], o.index, "warning",
                    f"round {o.index}: {m.label} {fmt_value(o.value)} {m.unit}, "
                    f"{math.expm1(math.log(o.value / o.mid)) * 100:+.1f}% from the median {fmt_value(o.mid)} {m.unit} "
                    f"of this arm's other {o.others} rounds at this point, which lie within "
                    f"{math.expm1(o.widest) * 100:.1f}% of it (this run's threshold {math.expm1(o.floor) * 100:.1f}%): "
                    "that round's server was off its arm's level")
            for o in _isolated(groups, ROUND_OUTLIER_MIN_OTHERS)]


def check_block_outlier(repeats: Sequence[RepeatResult], blocks: int, metric: str = "mean_tpot_ms") -> list[Finding]:
    """Together: all: one block far from the other blocks of its round, for the same arm and point
    (the same server, minutes apart), by the round-outlier rule with two others enough (a set of three blocks
    or more) and ``BLOCK_OUTLIER_FACTOR`` = 10 times the run's median deviation instead of 5: two others make a
    weak reference, and with 5 a run of heavy-tailed noise (Student t, 4 df) warned in 40-50 % of simulated
    runs at sigma 1-4 %; with 10 in 4-5 %, and in none under normal noise
    (`benchmarks/simulation/block_outlier.py`, docs/statistics.md). The round's value is the median of its
    blocks, which one such block hardly moves, and the round-outlier check sees rounds, not blocks; this one names
    the block.

    On the H200 interleaved A/A, stock-again's first c1 block after round 2's cold start decoded 6.4 % slower
    than the round's other two blocks, which agreed within 0.03 % (the slow state after a start: the
    session-drift repeat at the round's end had passed it); it moved that round's score from about 0 to −0.5 %."""
    if blocks < 3:
        return []
    groups: dict[tuple[str, str, int], list[tuple[int, float]]] = defaultdict(list)
    for r in repeats:
        if (v := r.raw.metric(metric)) is not None and v > 0:
            groups[(r.arm, r.point, r.round // blocks)].append((r.round, v))
    m = METRICS[metric]
    return [Finding("block-outlier", o.key[0], o.key[1], o.index, "warning",
                    f"{repeat_name(o.index, blocks)}: {m.label} {fmt_value(o.value)} {m.unit}, "
                    f"{math.expm1(math.log(o.value / o.mid)) * 100:+.1f}% from the {fmt_value(o.mid)} {m.unit} of the "
                    f"round's other {o.others} blocks, which lie within {math.expm1(o.widest) * 100:.1f}% of it (this "
                    f"run's threshold {math.expm1(o.floor) * 100:.1f}%): the server was off its level for that block")
            for o in _isolated(groups, 2, BLOCK_OUTLIER_FACTOR)]


@lru_cache(maxsize=64)
def _best_split_null_r2(n: int) -> float:
    """95th percentile (1 − ``BIMODAL_ALPHA``) of the best-split R² of n draws from one normal distribution
    (a fixed seed: the same answer every call)."""
    draws = np.random.default_rng(20261130).standard_normal((BIMODAL_NULL_DRAWS, n))
    return float(np.quantile(_best_split_r2(draws)[0], 1 - BIMODAL_ALPHA))


def _best_split_r2(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the largest share of variance explained by cutting the sorted row in two groups of at least
    ``BIMODAL_MIN_CLUSTER`` (the optimal 2-means split of one dimension is such a cut), and the cut index."""
    x = np.sort(x, axis=1)
    n = x.shape[1]
    total = ((x - x.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
    cs, cs2 = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
    best = np.full(x.shape[0], -np.inf)
    cut = np.zeros(x.shape[0], dtype=int)
    for k in range(BIMODAL_MIN_CLUSTER, n - BIMODAL_MIN_CLUSTER + 1):
        sa, sa2 = cs[:, k - 1], cs2[:, k - 1]
        sb, sb2 = cs[:, -1] - sa, cs2[:, -1] - sa2
        within = (sa2 - sa * sa / k) + (sb2 - sb * sb / (n - k))
        with np.errstate(divide="ignore", invalid="ignore"):
            r2 = np.where(total > 0, 1 - within / total, 0.0)
        better = r2 > best
        best = np.where(better, r2, best)
        cut = np.where(better, k, cut)
    return best, cut


def session_levels(repeats: Sequence[RepeatResult], metric: str = "output_throughput") -> dict[str, dict[int, float]]:
    """arm -> session -> the session's level of ``metric``: the geometric mean over its points (and repeats)
    of the value relative to that point's median over the arm's sessions, scaled back by the geometric mean
    of those medians (so a session with every point measured reads as its geometric mean over points)."""
    values: dict[str, dict[str, dict[int, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in repeats:
        value = r.raw.metric(metric)
        if r.session is not None and value is not None and value > 0:
            values[r.arm][r.point][r.session].append(math.log(value))
    levels: dict[str, dict[int, float]] = {}
    for arm, points in values.items():
        rel: dict[int, list[float]] = defaultdict(list)
        centres = []
        for sessions in points.values():
            per_session = {s: statistics.fmean(v) for s, v in sessions.items()}
            centre = statistics.median(per_session.values())
            centres.append(centre)
            for s, v in per_session.items():
                rel[s].append(v - centre)
        scale = statistics.fmean(centres)
        levels[arm] = {s: math.exp(scale + statistics.fmean(v)) for s, v in sorted(rel.items())}
    return levels


def _cluster(group: list[int], levels: Mapping[int, float]) -> str:
    """"5 at 426–478 (sessions 0, 2, 3, 5, 7)" for sessions sorted by level."""
    return (f"{len(group)} at {fmt_value(levels[group[0]])}–{fmt_value(levels[group[-1]])} "
            f"(sessions {', '.join(map(str, sorted(group)))})")


def check_bimodal_sessions(repeats: Sequence[RepeatResult], metric: str = "output_throughput") -> list[Finding]:
    """Bimodal sessions: an arm's server sessions fall into two clusters of throughput.

    Per arm, each session's level (`session_levels`, geometric mean over points) on a log scale; the best
    cut of the sorted levels into two clusters of ≥ ``BIMODAL_MIN_CLUSTER`` = 2 sessions (the 1-D 2-means
    optimum) explains a share R² of their variance. Two clusters when R² ≥ ``BIMODAL_MIN_R2`` = 0.8 and R²
    exceeds its 95th percentile for that many sessions drawn from one normal distribution (0.97 for 4
    sessions, 0.89 for 8: a fixed rule such as "R² ≥ 0.8 and 3 SD apart" fires in ~30 % of unimodal 4–6
    session arms), and the clusters' levels are ≥ ``BIMODAL_MIN_GAP`` = 5 % apart (a smaller offset cannot
    drive a verdict). Needs ≥ 4 sessions. A warning at arm level: per-round pairing cannot remove a
    session-level effect, so a verdict may reflect which cluster each round's session fell in, not the
    change; the A/A floor misses it when both A arms share it.
    """
    findings = []
    for arm, levels in sorted(session_levels(repeats, metric).items()):
        if len(levels) < 2 * BIMODAL_MIN_CLUSTER:
            continue
        sessions = sorted(levels, key=levels.__getitem__)
        logs = np.array([[math.log(levels[s]) for s in sessions]])
        r2, cut = _best_split_r2(logs)
        r2_v, k = float(r2[0]), int(cut[0])
        low, high = sessions[:k], sessions[k:]
        gap = math.exp(float(logs[0, k:].mean() - logs[0, :k].mean())) - 1
        if r2_v < max(BIMODAL_MIN_R2, _best_split_null_r2(len(sessions))) or gap < BIMODAL_MIN_GAP:
            continue

        findings.append(Finding(
            "bimodal-sessions", arm, None, None, "warning",
            f"{arm}'s sessions fall into two clusters of {metric.replace('_', ' ')}: {_cluster(low, levels)} and "
            f"{_cluster(high, levels)}, {gap:.0%} apart (R² {r2_v:.2f}); a verdict may be driven by this session-level "
            "effect rather than by the change"))
    return findings
