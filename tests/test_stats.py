"""Tests of suite.stats against known distributions (coverage, false positives, power) and known values.

Simulations use fixed seeds, so each measured rate is a fixed number; the tolerances are about 3 binomial
standard errors of the trial count, so a method that is off by a few points fails.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from suite.accuracy_stats import (
    GateOutcome,
    accuracy_gate,
    accuracy_gate_reason,
    mcnemar,
    paired_accuracy,
    paired_difference_interval,
    paired_difference_p,
)
from suite.stats import (
    METRICS,
    Strata,
    Verdict,
    compare,
    compare_metric,
    geometric_mean_ratio,
    noise_floor_pct,
    set_value,
    summarize,
)

TRIALS = 4000  # binomial SE of a 95% rate: 0.34 points


def simulate(
    n,
    *,
    ratio=1.0,
    sigma_b=0.10,
    sigma_c=None,
    n_c=None,
    paired=False,
    drift=0.0,
    trials=TRIALS,
    seed=0,
    noise_floor=None,
):
    """Lognormal repeats (median 1000 baseline, 1000*ratio candidate); returns (coverage, significant rate).

    ``drift``: sigma of a per-round factor shared by both arms of a round (what ABBA pairing cancels).
    """
    rng = np.random.default_rng(seed)
    sigma_c = sigma_b if sigma_c is None else sigma_c
    n_c = n if n_c is None else n_c
    true_pct = 100 * (ratio - 1)
    covered = significant = 0
    for _ in range(trials):
        rounds = rng.normal(0, drift, max(n, n_c)) if drift else np.zeros(max(n, n_c))
        b = 1000 * np.exp(rng.normal(0, sigma_b, n) + rounds[:n])
        c = 1000 * ratio * np.exp(rng.normal(0, sigma_c, n_c) + rounds[:n_c])
        r = compare(b, c, higher_is_better=True, paired=paired, noise_floor_pct=noise_floor, max_cv=10,
                    max_half_width_log=math.inf)  # a study of the interval itself, however wide
        assert r.verdict != Verdict.UNRELIABLE, r.reason
        covered += r.ci_low_pct <= true_pct <= r.ci_high_pct
        significant += r.significant
    return covered / trials, significant / trials


def contaminated_fp_rate(n, *, bad_share=0.10, slowdown=0.7, sigma=0.03, trials=2000, seed=0):
    """False-positive rate when some repeats of either arm land on a bad server start (a 30% slowdown)."""
    rng = np.random.default_rng(seed)
    fp = 0
    for _ in range(trials):
        b, c = (
            1000 * np.exp(rng.normal(0, sigma, n)) * np.where(rng.random(n) < bad_share, slowdown, 1)
            for _ in range(2)
        )
        fp += compare(b, c, higher_is_better=True, max_cv=10, max_half_width_log=math.inf).significant
    return fp / trials


def percentile_bootstrap_coverage(n, *, sigma=0.10, trials=1000, resamples=1000, seed=0):
    """Coverage of the percentile bootstrap on the geometric-mean ratio: the alternative we did not pick."""
    rng = np.random.default_rng(seed)
    covered = 0
    for _ in range(trials):
        lb, lc = rng.normal(0, sigma, n), rng.normal(0, sigma, n)
        ib, ic = rng.integers(0, n, (resamples, n)), rng.integers(0, n, (resamples, n))
        boot = lc[ic].mean(axis=1) - lb[ib].mean(axis=1)
        lo, hi = np.quantile(boot, [0.025, 0.975])
        covered += lo <= 0 <= hi
    return covered / trials


# --------------------------------------------------------------------------- coverage and error rates


@pytest.mark.parametrize("n", [3, 5, 10])
def test_welch_interval_coverage_lognormal(n):
    coverage, _ = simulate(n, ratio=1.05, seed=n)
    assert abs(coverage - 0.95) <= 0.012, coverage


def test_welch_interval_coverage_unequal_spread_and_n():
    # the hard case for Welch: the arm with fewer repeats has the larger spread (df near 2). Measured 93.4%;
    # a pooled-variance t interval gives 86.6% here, so this fails if the Welch df is dropped
    coverage, _ = simulate(6, n_c=3, ratio=0.9, sigma_b=0.03, sigma_c=0.15, seed=11)
    assert 0.925 <= coverage <= 0.965, coverage


@pytest.mark.parametrize("n", [3, 5, 10])
def test_paired_interval_coverage_with_drift(n):
    coverage, _ = simulate(n, ratio=1.05, sigma_b=0.03, drift=0.15, paired=True, seed=100 + n)
    assert abs(coverage - 0.95) <= 0.012, coverage


@pytest.mark.parametrize("n,paired", [(2, False), (3, False), (5, False), (10, False), (2, True), (5, True)])
def test_false_positive_rate_equal_distributions(n, paired):
    _, fp = simulate(n, paired=paired, seed=200 + n + paired)
    assert fp <= 0.06, fp


def test_false_positive_rate_with_bad_server_starts():
    assert contaminated_fp_rate(5, seed=5) <= 0.05


def test_percentile_bootstrap_undercovers_at_small_n():
    # why docs/statistics.md rejects the bootstrap for 2-10 repeats: it cannot see beyond the n observed values
    assert percentile_bootstrap_coverage(3) < 0.85
    assert simulate(3, trials=1000)[0] > 0.93


def test_detects_large_shift():
    _, detected = simulate(5, ratio=1.20, sigma_b=0.05, seed=7, trials=1000)
    assert detected >= 0.99, detected


def test_pairing_pays_off_under_drift():
    _, unpaired = simulate(5, ratio=1.05, sigma_b=0.02, drift=0.10, seed=8, trials=1000)
    _, paired = simulate(5, ratio=1.05, sigma_b=0.02, drift=0.10, paired=True, seed=8, trials=1000)
    assert paired > 0.75 > 0.2 > unpaired, (paired, unpaired)


def test_min_detectable_effect_has_about_the_stated_power():
    rng = np.random.default_rng(9)
    mdes = [
        compare(
            1000 * np.exp(rng.normal(0, 0.05, 5)),
            1000 * np.exp(rng.normal(0, 0.05, 5)),
            higher_is_better=True,
        ).min_detectable_effect_pct
        for _ in range(500)
    ]
    mde = float(np.median(mdes))
    _, power = simulate(5, ratio=1 + mde / 100, sigma_b=0.05, seed=10, trials=1000)
    assert 0.65 <= power <= 0.90, (mde, power)


# --------------------------------------------------------------------------- verdicts


def test_one_repeat_is_unreliable_but_reports_delta():
    r = compare([100.0], [110.0], higher_is_better=True)
    assert r.verdict == Verdict.UNRELIABLE and r.reason.startswith("1 repeat: no interval")
    assert r.delta_pct == pytest.approx(10.0)
    assert r.ci_low_pct is None and r.p_value is None and not r.significant
    assert compare([100.0, 101.0], [110.0], higher_is_better=True).verdict == Verdict.UNRELIABLE


def test_direction():
    lat_b, lat_c = [10.0, 10.2, 9.9, 10.1], [8.0, 8.1, 7.9, 8.05]
    assert compare(lat_b, lat_c, higher_is_better=False).verdict == Verdict.BETTER
    assert compare(lat_b, lat_c, higher_is_better=True).verdict == Verdict.WORSE
    assert compare_metric("median_tpot_ms", lat_b, lat_c).verdict == Verdict.BETTER
    assert compare_metric("output_throughput", lat_b, lat_c).verdict == Verdict.WORSE
    r = compare(lat_b, lat_c, higher_is_better=False)
    assert r.delta_pct < 0 and r.ci_high_pct < 0


def test_noise_floor_blocks_small_significant_delta():
    b, c = [100.0, 100.1, 99.9, 100.05], [101.0, 101.1, 100.9, 101.05]
    assert compare(b, c, higher_is_better=True).verdict == Verdict.BETTER
    r = compare(b, c, higher_is_better=True, noise_floor_pct=2.0)
    assert r.verdict == Verdict.NOT_SIGNIFICANT and "noise floor" in r.reason
    assert compare(b, c, higher_is_better=True, noise_floor_pct=0.5).verdict == Verdict.BETTER


def test_not_significant_when_interval_includes_zero():
    r = compare([100.0, 110.0, 95.0], [104.0, 98.0, 107.0], higher_is_better=True)
    assert r.verdict == Verdict.NOT_SIGNIFICANT and r.ci_low_pct < 0 < r.ci_high_pct
    assert r.p_value > 0.05


def test_matches_scipy_welch_and_paired_t_on_logs():
    b, c = [100.0, 104.0, 97.0, 101.0], [108.0, 111.0, 104.0, 109.0]
    welch = sps.ttest_ind(np.log(c), np.log(b), equal_var=False)
    assert compare(b, c, higher_is_better=True).p_value == pytest.approx(welch.pvalue, rel=1e-9)
    rel = sps.ttest_rel(np.log(c), np.log(b))
    assert compare(b, c, higher_is_better=True, paired=True).p_value == pytest.approx(rel.pvalue, rel=1e-9)


def test_unreliable_cases():
    assert compare([0.0, 1.0], [1.0, 2.0], higher_is_better=False).verdict == Verdict.UNRELIABLE
    same = compare([5.0, 5.0, 5.0], [6.0, 6.0, 6.0], higher_is_better=True)
    assert (
        same.verdict == Verdict.UNRELIABLE
        and "no spread" in same.reason
        and same.delta_pct == pytest.approx(20)
    )
    # CV above max_cv with a usable interval: unreliable, numbers kept for the reader
    noisy = compare([100.0, 300.0, 100.0, 300.0, 100.0, 300.0], [110.0, 310.0, 110.0, 310.0, 110.0, 310.0],
                    higher_is_better=True, paired=True)
    assert noisy.verdict == Verdict.UNRELIABLE and "CV" in noisy.reason and noisy.ci_low_pct is not None
    # an interval wider than x/÷ 2 is not returned as numbers (a median ITL of 0.007 ms once gave an
    # interval reaching +13,885,244 %); Δ and p stay, the reason says how wide
    wild = compare([10.0, 100.0, 30.0], [200.0, 300.0, 250.0], higher_is_better=True)
    assert wild.verdict == Verdict.UNRELIABLE and "too wide" in wild.reason and "CV" in wild.reason
    assert wild.ci_low_pct is None and wild.ci_high_pct is None and wild.min_detectable_effect_pct is None
    assert wild.delta_pct is not None and wild.p_value is not None


def test_interval_width_rule():
    # paired, 3 rounds: half-width = t(2) * sd / sqrt(3) on the log scale; sd 0.1 -> 0.25 (shown),
    # sd 0.4 -> 0.99 > log 2 (withheld)
    def rounds(sd):
        logs = np.array([-1.0, 0.0, 1.0]) * sd
        return [100.0] * 3, list(100 * np.exp(0.05 + logs))

    ok = compare(*rounds(0.1), higher_is_better=True, paired=True)
    assert ok.verdict != Verdict.UNRELIABLE and ok.ci_low_pct is not None
    wide = compare(*rounds(0.4), higher_is_better=True, paired=True)
    assert wide.verdict == Verdict.UNRELIABLE and wide.ci_high_pct is None and "×/÷" in wide.reason
    assert compare(*rounds(0.4), higher_is_better=True, paired=True,
                   max_half_width_log=math.inf).ci_high_pct is not None
    # two paired rounds, df 1: the half-width is t(1) = 12.7 standard errors; rounds 15 % apart are too many
    assert compare([100.0, 105.0], [112.0, 101.0], higher_is_better=True, paired=True).verdict == (
        Verdict.UNRELIABLE
    )
    with pytest.raises(ValueError):
        compare([1.0, 2.0], [1.0, 2.0], higher_is_better=True, max_half_width_log=0)


def test_errors_stay_errors():
    for bad in ([], [1.0, float("nan")], [1.0, float("inf")], [-1.0, 2.0]):
        with pytest.raises(ValueError):
            compare(bad, [1.0, 2.0], higher_is_better=True)
    with pytest.raises(ValueError):
        compare([1.0, 2.0], [1.0, 2.0, 3.0], higher_is_better=True, paired=True)
    with pytest.raises(ValueError):
        compare([1.0, 2.0], [1.0, 2.0], higher_is_better=True, confidence=95)
    with pytest.raises(ValueError):
        compare([1.0, 2.0], [1.0, 2.0], higher_is_better=True, noise_floor_pct=-1)
    with pytest.raises(ValueError):
        compare_metric("no_such_metric", [1.0, 2.0], [1.0, 2.0])


# --------------------------------------------------------------------------- summaries, registry, floor


def test_summarize():
    s = summarize([3.0, 1.0, 2.0, 10.0])
    assert (s.n, s.mean, s.median, s.min, s.max) == (4, 4.0, 2.5, 1.0, 10.0)
    assert s.stdev == pytest.approx(np.std([3, 1, 2, 10], ddof=1)) and s.cv == pytest.approx(s.stdev / 4)
    one = summarize([7.0])
    assert (one.n, one.mean, one.median, one.stdev, one.cv) == (1, 7.0, 7.0, None, None)
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        summarize([1.0, float("nan")])


def test_metric_registry():
    assert METRICS["output_throughput"].higher_is_better and METRICS["request_throughput"].unit == "req/s"
    for lat in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "p50", "p90", "p99"):
            info = METRICS[f"{stat}_{lat}_ms"]
            assert info.unit == "ms" and not info.higher_is_better and info.key == f"{stat}_{lat}_ms"
            assert info.family == lat and info.stat == stat
    peak = METRICS["max_output_tokens_per_s"]  # vLLM's busiest second of output tokens
    assert peak.higher_is_better and peak.family == "throughput" and peak.stat == "peak" and peak.unit == "tok/s"
    assert len(METRICS) == 4 + 4 * 5


def test_noise_floor_from_aa_pairs():
    assert noise_floor_pct([([100.0, 100.0], [103.0, 103.0])]) == pytest.approx(3.0)
    rng = np.random.default_rng(12)
    sigma, n = 0.05, 3
    pairs = [
        (1000 * np.exp(rng.normal(0, sigma, n)), 1000 * np.exp(rng.normal(0, sigma, n))) for _ in range(2000)
    ]
    expected = 100 * math.expm1(1.96 * sigma * math.sqrt(2 / n))  # |N(0, sigma*sqrt(2/n))| 95th pct, as Δ%
    assert noise_floor_pct(pairs) == pytest.approx(expected, rel=0.06)
    with pytest.raises(ValueError):
        noise_floor_pct([])
    with pytest.raises(ValueError):
        noise_floor_pct([([0.0, 1.0], [1.0, 1.0])])


def test_noise_floor_lowers_false_positives():
    rng = np.random.default_rng(13)
    pairs = [(1000 * np.exp(rng.normal(0, 0.1, 3)), 1000 * np.exp(rng.normal(0, 0.1, 3))) for _ in range(200)]
    floor = noise_floor_pct(pairs)
    _, fp_plain = simulate(3, seed=14, trials=2000)
    _, fp_floor = simulate(3, seed=14, trials=2000, noise_floor=floor)
    assert fp_floor < fp_plain and fp_floor <= 0.03, (fp_floor, fp_plain)


# --------------------------------------------------------------------------- accuracy, geomean


def test_mcnemar_known_values():
    assert mcnemar(0, 10) == pytest.approx(2 / 1024)
    assert mcnemar(2, 8) == pytest.approx(112 / 1024)
    assert mcnemar(8, 2) == pytest.approx(112 / 1024)
    assert mcnemar(5, 5) == 1.0 and mcnemar(0, 0) == 1.0
    assert mcnemar(30, 60) == pytest.approx(0.00210, abs=5e-5)  # chi2 approx with continuity: 0.0022
    with pytest.raises(ValueError):
        mcnemar(-1, 3)


def test_mcnemar_p_agrees_with_the_interval_beside_it():
    # the audit's case: 0 gained, 5 lost of 1000. The exact binomial says p = 0.0625 while Tango's interval
    # excludes 0; the score form is the statistic the interval inverts, so the two always agree
    lo, hi = paired_difference_interval(0, 5, 1000)
    assert hi < 0 and mcnemar(0, 5) == pytest.approx(0.0625)
    assert paired_difference_p(0, 5, 1000) == pytest.approx(0.0253, abs=1e-4)
    assert paired_difference_p(0, 5, 1000) < 0.05
    for up, down, n in [(0, 5, 1000), (3, 9, 200), (7, 7, 50), (1, 0, 20), (12, 30, 400), (0, 0, 10), (40, 20, 60)]:
        lo, hi = paired_difference_interval(up, down, n)
        assert (paired_difference_p(up, down, n) < 0.05) == (not lo <= 0 <= hi), (up, down, n)
    assert paired_accuracy({i: i < 5 for i in range(1000)}, dict.fromkeys(range(1000), False)).p_value == (
        pytest.approx(paired_difference_p(0, 5, 1000)))


def test_paired_accuracy():
    base = {i: i < 80 for i in range(100)}  # 80 correct
    cand = {i: (i < 75 or 80 <= i < 90) for i in range(100)}  # loses 75-79, gains 80-89 -> 85 correct
    r = paired_accuracy(base, cand)
    assert (r.n, r.acc_base, r.acc_cand, r.flipped_to_correct, r.flipped_to_wrong) == (100, 0.8, 0.85, 10, 5)
    assert r.delta == pytest.approx(0.05) and r.p_value == pytest.approx(paired_difference_p(10, 5, 100))
    assert r.p_exact == pytest.approx(mcnemar(10, 5))
    assert r.stderr_base == pytest.approx(np.std([1] * 80 + [0] * 20, ddof=1) / 10)
    assert r.delta_stderr == pytest.approx(np.std([1] * 10 + [-1] * 5 + [0] * 85, ddof=1) / 10)
    assert r.delta_ci_low < r.delta < r.delta_ci_high and r.confidence == 0.95
    assert (r.delta_ci_low, r.delta_ci_high) == paired_difference_interval(10, 5, 100)
    with pytest.raises(ValueError):
        paired_accuracy(base, {**cand, 1000: True})
    with pytest.raises(ValueError):
        paired_accuracy({}, {})


def test_paired_difference_interval_known_values():
    # R PropCIs::scoreci.mp(b=25, c=28, n=618, conf.level=0.90) = [-0.0148, 0.0247] (Tango 1998)
    lo, hi = paired_difference_interval(28, 25, 618, confidence=0.90)
    assert (round(lo, 4), round(hi, 4)) == (-0.0148, 0.0247)
    # no question flips: ±z²/(n + z²), not the zero-width interval of a paired-SE (Wald) interval
    z2 = 1.959963984540054**2
    assert paired_difference_interval(0, 0, 250) == pytest.approx((-z2 / (250 + z2), z2 / (250 + z2)))
    # swapping the arms mirrors it; it stays in [-1, 1] and contains the estimate
    assert paired_difference_interval(5, 12, 80) == pytest.approx(tuple(-x for x in
                                                                        paired_difference_interval(12, 5, 80)[::-1]))
    for up, down, n in ((0, 10, 10), (10, 0, 10), (3, 0, 125), (50, 50, 100), (0, 0, 1)):
        lo, hi = paired_difference_interval(up, down, n)
        assert -1 <= lo <= (up - down) / n <= hi <= 1
    assert paired_difference_interval(0, 10, 10)[0] == -1.0
    for bad in ((-1, 0, 10), (6, 6, 10), (0, 0, 0), (1.5, 0, 10)):
        with pytest.raises(ValueError):
            paired_difference_interval(*bad)


def test_paired_difference_interval_coverage():
    rng = np.random.default_rng(21)
    for p_up, p_down, n in ((0.02, 0.04, 250), (0.10, 0.05, 100)):
        covered = 0
        for _ in range(2000):
            up, down, _ = rng.multinomial(n, [p_up, p_down, 1 - p_up - p_down])
            lo, hi = paired_difference_interval(int(up), int(down), n)
            covered += lo <= p_up - p_down <= hi
        assert 0.93 <= covered / 2000 <= 0.97, (p_up, p_down, covered / 2000)


def _arms(n, acc, p_flip_down, p_flip_up, rng):
    base = rng.random(n) < acc
    flip = rng.random(n)
    cand = np.where(base, flip >= p_flip_down, flip < p_flip_up)
    return dict(enumerate(map(bool, base))), dict(enumerate(map(bool, cand)))


def test_accuracy_gate_outcomes():
    n = 1000
    same = {i: i < 600 for i in range(n)}
    assert accuracy_gate(paired_accuracy(same, same), 1.0) == GateOutcome.PASS  # 0 flips of 1000: ±0.4 pp
    assert accuracy_gate(paired_accuracy(same, same), 0.2) == GateOutcome.INCONCLUSIVE
    lost = {i: i < 500 for i in range(n)}  # 100 questions lost, none gained: -10 pp [-12.0, -8.3]
    r = paired_accuracy(same, lost)
    assert accuracy_gate(r, 5.0) == GateOutcome.FAIL and "exceeds" in accuracy_gate_reason(r, 5.0)
    assert accuracy_gate(r, 10.0) == GateOutcome.INCONCLUSIVE
    assert accuracy_gate(r, 15.0) == GateOutcome.PASS
    # nobody answers anything: no drop can be observed, whatever the candidate does
    zero = {i: False for i in range(250)}
    r0 = paired_accuracy(zero, zero)
    assert (r0.delta, r0.p_value) == (0.0, 1.0)  # what used to read "+0.0 pp, p = 1"
    assert accuracy_gate(r0, 1.0) == GateOutcome.UNINFORMATIVE
    assert "no result could fail" in accuracy_gate_reason(r0, 1.0)
    # baseline right on 1 of 250 (0.4 %): losing it cannot exceed a 1 pp allowance either
    one = {i: i == 0 for i in range(250)}
    assert accuracy_gate(paired_accuracy(one, zero), 1.0) == GateOutcome.UNINFORMATIVE
    assert accuracy_gate(paired_accuracy(one, zero), 0.2) != GateOutcome.UNINFORMATIVE
    with pytest.raises(ValueError):
        accuracy_gate(r0, -1.0)


def test_accuracy_gate_error_rates():
    # a no-change arm (3 % of questions flip each way) on 250 questions with a 1 pp allowance: a point-estimate
    # gate fails it about a quarter of the time; the interval gate fails it at most alpha/2 of the time
    rng = np.random.default_rng(22)
    outcomes, point_fail = [], 0
    for _ in range(1000):
        r = paired_accuracy(*_arms(250, 0.6, 0.05, 0.075, rng))  # 0.6*0.05 = 0.4*0.075: no change
        outcomes.append(accuracy_gate(r, 1.0))
        point_fail += r.delta < -0.01
    assert outcomes.count(GateOutcome.FAIL) / 1000 <= 0.03 < 0.2 < point_fail / 1000
    # a real 6 pp drop on 1000 questions against a 1 pp allowance: FAIL almost always
    fails = sum(accuracy_gate(paired_accuracy(*_arms(1000, 0.6, 0.10, 0.0, rng)), 1.0) == GateOutcome.FAIL
                for _ in range(200))
    assert fails / 200 >= 0.95


def test_geometric_mean_ratio():
    assert geometric_mean_ratio([2.0, 0.5]) == pytest.approx(1.0)
    assert geometric_mean_ratio([1.1, 1.1, 1.1]) == pytest.approx(1.1)
    for bad in ([], [1.0, 0.0], [1.0, -2.0]):
        with pytest.raises(ValueError):
            geometric_mean_ratio(bad)


# --------------------------------------------------------------------------- properties

arm = st.lists(st.floats(1.0, 1e4, allow_nan=False), min_size=1, max_size=8)
SWAP = {Verdict.BETTER: Verdict.WORSE, Verdict.WORSE: Verdict.BETTER}


@settings(max_examples=300, deadline=None)
@given(arm, arm, st.booleans(), st.one_of(st.none(), st.floats(0, 30)))
def test_invariants(b, c, hib, floor):
    r = compare(b, c, higher_is_better=hib, noise_floor_pct=floor)
    if min(len(b), len(c)) < 2:
        assert r.verdict == Verdict.UNRELIABLE and r.ci_low_pct is None
    if r.ci_low_pct is not None:
        assert (
            r.ci_low_pct <= r.delta_pct * (1 + 1e-12) + 1e-12
            and r.delta_pct <= r.ci_high_pct * (1 + 1e-12) + 1e-12
        )
        # an interval that is returned is never wider than x/÷ 2 around the estimate
        assert math.log1p(r.ci_high_pct / 100) - math.log1p(r.ci_low_pct / 100) <= 2 * math.log(2) + 1e-9
    if r.significant:
        assert (r.ci_low_pct > 0 or r.ci_high_pct < 0) and r.p_value < 0.05
        assert floor is None or abs(r.delta_pct) > floor
        assert (r.verdict == Verdict.BETTER) == ((r.delta_pct > 0) == hib)


@settings(max_examples=300, deadline=None)
@given(arm, arm, st.booleans(), st.booleans())
def test_swapping_arms_negates_log_ratio_and_swaps_verdict(b, c, hib, paired):
    if paired:
        c = (c * 8)[: len(b)] if len(c) < len(b) else c[: len(b)]
    r, s = (
        compare(b, c, higher_is_better=hib, paired=paired),
        compare(c, b, higher_is_better=hib, paired=paired),
    )
    assert math.log(s.ratio) == pytest.approx(-math.log(r.ratio), abs=1e-9)
    assert s.verdict == SWAP.get(r.verdict, r.verdict)
    assert (r.ci_low_pct is None) == (s.ci_low_pct is None)
    if r.p_value is not None:
        assert s.p_value == pytest.approx(r.p_value, rel=1e-6, abs=1e-12)
    if r.ci_low_pct is not None:
        if min(r.ci_low_pct, s.ci_low_pct) > -99:  # beyond that, log1p(pct / 100) loses the digits
            assert math.log1p(s.ci_low_pct / 100) == pytest.approx(-math.log1p(r.ci_high_pct / 100), abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(arm, arm, st.floats(1e-3, 1e3))
def test_scale_invariance(b, c, k):
    r = compare(b, c, higher_is_better=True)
    s = compare([k * x for x in b], [k * x for x in c], higher_is_better=True)
    assume(r.p_value is None or abs(r.p_value - 0.05) > 1e-6)
    assume(r.baseline.cv is None or abs(r.baseline.cv - 0.5) > 1e-6)
    assume(r.candidate.cv is None or abs(r.candidate.cv - 0.5) > 1e-6)
    assert s.verdict == r.verdict
    assert s.delta_pct == pytest.approx(r.delta_pct, rel=1e-6, abs=1e-9)


if __name__ == "__main__":  # prints the numbers quoted in docs/statistics.md
    print(
        "coverage, Welch, lognormal CV 10%, +5%:",
        {n: simulate(n, ratio=1.05, seed=n)[0] for n in (2, 3, 5, 10)},
    )
    print(
        "coverage, Welch, n 6 vs 3, CV 3% vs 15%:",
        simulate(6, n_c=3, ratio=0.9, sigma_b=0.03, sigma_c=0.15, seed=11)[0],
    )
    print(
        "coverage, paired, drift 15%, CV 3%:",
        {
            n: simulate(n, ratio=1.05, sigma_b=0.03, drift=0.15, paired=True, seed=100 + n)[0]
            for n in (3, 5, 10)
        },
    )
    print(
        "coverage, percentile bootstrap, CV 10%:", {n: percentile_bootstrap_coverage(n) for n in (3, 5, 10)}
    )
    print(
        "false positives (n, paired):",
        {
            (n, p): simulate(n, paired=p, seed=200 + n + p)[1]
            for n, p in [(2, False), (3, False), (5, False), (10, False), (2, True), (5, True)]
        },
    )
    print("false positives, 10% bad starts:", {n: contaminated_fp_rate(n, seed=n) for n in (3, 5, 10)})
    for cv in (0.01, 0.02, 0.05):
        print(
            f"detection of +2% at CV {cv:.0%} (Welch):",
            {n: simulate(n, ratio=1.02, sigma_b=cv, seed=300 + n, trials=2000)[1] for n in (3, 5, 10)},
        )


def test_the_metric_registry_is_what_vllm_bench_serve_reports():
    """Every registered metric is a key of a real `vllm bench serve` result (the suite's own flags: latencies
    at the percentiles of the registry), and every per-request latency statistic there is registered."""
    import json
    from pathlib import Path

    from suite.stages.serve.run import METRIC_PERCENTILES, PERCENTILE_METRICS
    from suite.stats import FAMILIES, LATENCIES, METRICS, PERCENTILES

    raw = json.loads((Path(__file__).parent / "data" / "report_run" / "patched" / "isl128-osl32-c4-n16" /
                      "rep-0.json").read_text())
    assert set(METRICS) <= set(raw)
    assert {k for k in raw if k.endswith("_ms") and not k.startswith("std_")} <= set(METRICS)
    assert PERCENTILE_METRICS.split(",") == list(LATENCIES) and METRIC_PERCENTILES == ",".join(map(str, PERCENTILES))
    assert METRICS["p90_tpot_ms"].label == "P90 TPOT" and METRICS["p90_tpot_ms"].family == "tpot"
    assert FAMILIES == ("throughput", "ttft", "tpot", "itl", "e2el")


def test_a_restart_set_is_its_blocks_median_so_one_slow_block_does_not_move_it():
    """Three blocks, one 5 % slow (the H200's first minute after a start): the set keeps its server's level;
    two blocks: their geometric mean; one: itself. A start's offset, in every block, is kept whole."""
    assert set_value([4.0, 4.2, 4.0]) == pytest.approx(4.0)
    assert set_value([4.2, 4.0, 4.01]) == pytest.approx(4.01)
    assert set_value([4.0, 9.0]) == pytest.approx(6.0)
    assert set_value([3.9]) == pytest.approx(3.9)
    assert set_value([4.08, 4.08 * 1.05, 4.08]) == pytest.approx(4.08)


def test_a_cells_gpu_layouts_are_taken_out_as_in_the_primary_test():
    """runtime.cross_groups: pair i of a cell measured in set rounds[i], in GPU layout rounds[i] mod 2; the slower
    group is on the baseline's side in one layout and on the candidate's in the other. A cell's +2 % reads BETTER
    with its interval near +2 % once the layouts are taken out; the plain paired test carries the zig-zag in its
    spread. Over 4,000 simulated cells with a 3 % group difference the interval keeps its 95 % coverage."""
    noise = (0.001, -0.002, 0.0015, 0.0005, -0.001, 0.0)
    base = [100.0 * math.exp(e) for e in noise]
    layout = [1.03 if r % 2 == 0 else 1 / 1.03 for r in range(6)]  # the slower group on the other side
    cand = [b * 1.02 * g * math.exp(e) for b, g, e in zip(base, layout, noise[::-1], strict=True)]
    crossed = compare(base, cand, higher_is_better=True, paired=True, strata=Strata.layouts(2), rounds=range(6))
    plain = compare(base, cand, higher_is_better=True, paired=True)
    assert crossed.verdict == Verdict.BETTER and crossed.df == 4 and "within 2 GPU layouts" in crossed.method
    assert crossed.delta_pct == pytest.approx(2.0, abs=0.01) and 1.5 < crossed.ci_low_pct < crossed.ci_high_pct < 2.5
    assert plain.verdict == Verdict.NOT_SIGNIFICANT
    # a layout with no set yet: no estimate, no interval; one set per layout: the estimate, no interval
    missing = compare(base[::2], cand[::2], higher_is_better=True, paired=True, strata=Strata.layouts(2), rounds=[0, 2, 4])
    assert missing.verdict == Verdict.UNRELIABLE and missing.delta_pct is None
    assert "3 rounds in 1 of the 2 GPU layouts: no interval once the GPU layouts' difference is taken out" in missing.reason
    short = compare(base[:2], cand[:2], higher_is_better=True, paired=True, strata=Strata.layouts(2), rounds=[0, 1])
    assert short.verdict == Verdict.UNRELIABLE and short.delta_pct == pytest.approx(2.0, abs=0.2)
    with pytest.raises(ValueError, match="round of each pair"):
        compare(base, cand, higher_is_better=True, paired=True, strata=Strata.layouts(2))
    rng = np.random.default_rng(23)
    covered = 0
    for _ in range(TRIALS):
        b = 100 * np.exp(rng.normal(0, 0.01, 6))
        c = b * 1.01 * np.exp(np.where(np.arange(6) % 2 == 0, 0.03, -0.03) + rng.normal(0, 0.01, 6))
        res = compare(list(b), list(c), higher_is_better=True, paired=True, strata=Strata.layouts(2), rounds=range(6))
        covered += res.ci_low_pct <= 1.0 <= res.ci_high_pct
    assert abs(covered / TRIALS - 0.95) <= 0.012, covered / TRIALS


def test_one_way_splits_a_sets_spread_into_its_blocks_noise_and_its_own_part():
    """stats.one_way against scipy's f_oneway on the same groups; runs add (each keeps its own mean); the set's
    own part is the variance component, 0 where the sets spread less than their blocks predict."""
    import random

    from scipy.stats import f_oneway

    from suite.stats import one_way

    rng = random.Random(7)
    offsets = [rng.gauss(0, 0.05) for _ in range(40)]
    groups = [[o + rng.gauss(0, 0.02) for _ in range(3)] for o in offsets]
    ow = one_way(groups)
    ref = f_oneway(*groups)
    assert (ow.f, ow.p) == (pytest.approx(ref.statistic), pytest.approx(ref.pvalue))
    assert ow.within_sd == pytest.approx(0.02, rel=0.2) and ow.group_sd == pytest.approx(0.05, rel=0.3)
    # two runs with different effects: their analyses add, the effect does not count as a set's own part
    a, b = one_way(groups[:20]), one_way([[x + 0.5 for x in g] for g in groups[20:]])
    pooled = a + b
    assert (pooled.df_between, pooled.df_within, pooled.groups) == (38, 80, 40)
    assert pooled.ss_within == pytest.approx(ow.ss_within) and pooled.ss_between < 10 * ow.ss_between
    quiet = one_way([[0.0, 0.1], [0.05, 0.05]])  # the sets agree better than their blocks: no own part
    assert quiet.f < 1 and quiet.group_sd == 0.0
    assert one_way([[1.0, 2.0]]) is None and one_way([[1.0], [2.0]]) is None
