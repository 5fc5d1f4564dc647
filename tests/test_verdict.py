"""Tests of suite.verdict: round scores, the sequential primary test, its verdict words, planning.

Constructed data pins each verdict word; seeded simulations check the error rates the docs quote (with
tolerances of about 3 binomial standard errors).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from pydantic import ValidationError

from suite.scores import round_score, round_scores, score_round
from suite.stats import Strata
from suite.verdict import (
    HEADLINE,
    Outcome,
    PrimaryResult,
    VerdictSpec,
    default_looks,
    fmt_pct,
    inflation_factor,
    look_alphas,
    nominal_alphas,
    plan_looks,
    primary_test,
    rounds_needed,
    spent_alpha,
    z_boundaries,
)
from suite.verdict_family import COMPOSITE_WEIGHT, Hypothesis, PointWord, evaluate, family_word

SPEC = VerdictSpec()  # O'Brien-Fleming, looks 2/4/6/8, target 5 %, A/A not pooled


def noisy(mean: float, sd: float, n: int, seed: int) -> dict[int, float]:
    """Scores with exactly this sample mean and sample sd (so a test does not hinge on a seed's luck)."""
    x = np.random.default_rng(seed).normal(size=n)
    x = (x - x.mean()) / x.std(ddof=1)
    return {i: float(mean + sd * v) for i, v in enumerate(x)}


def results(speed: float, ttft: float = 1.0, points=("c1", "c4")) -> dict[str, dict[str, float]]:
    """One arm's round: throughput x speed, latencies / speed (TTFT also x ttft)."""
    return {p: {"output_throughput": 700.0 * speed, "mean_ttft_ms": 100.0 * ttft / speed,
                "mean_tpot_ms": 20.0 / speed, "mean_e2el_ms": 800.0 / speed} for p in points}


# --------------------------------------------------------------------------- round scores and pairing


def test_round_score_is_signed_log_geomean_ratio():
    base = results(1.0)
    assert round_score(base, results(1.10)) == pytest.approx(math.log(1.10))  # faster: every term + log 1.1
    assert round_score(base, results(1 / 1.10)) == pytest.approx(-math.log(1.10))
    # only TTFT 30 % worse: one of 4 metrics at each point
    assert round_score(base, results(1.0, ttft=1.3)) == pytest.approx(-math.log(1.3) / 4)
    assert round_score(base, results(1.2), ("output_throughput",)) == pytest.approx(math.log(1.2))


def test_round_score_skips_and_reports_zero_and_missing():
    base, cand = results(1.0), results(1.1)
    cand["c1"]["mean_ttft_ms"] = 0.0
    del cand["c4"]["mean_tpot_ms"]
    base["c8"] = results(1.0, points=("c8",))["c8"]  # a point the candidate lacks
    s = score_round(base, cand, HEADLINE)
    assert s.n_terms == 6 and s.value == pytest.approx(math.log(1.1))
    assert set(s.skipped) == {"c1/mean_ttft_ms: zero in candidate", "c4/mean_tpot_ms: missing in candidate",
                              "c8: missing in candidate"}


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "12", True])
def test_round_score_malformed_values_raise(bad):
    cand = results(1.0)
    cand["c1"]["output_throughput"] = bad
    with pytest.raises(ValueError):
        round_score(results(1.0), cand)


def test_round_score_malformed_input_raises():
    with pytest.raises(ValueError):
        round_score(results(1.0), results(1.0), ("no_such_metric",))
    with pytest.raises(ValueError):
        round_score(results(1.0), results(1.0), "output_throughput")  # a string, not a list of metrics
    with pytest.raises(ValueError):
        round_score(results(1.0), {"c1": 5.0, "c4": 5.0})
    zeros = {p: dict.fromkeys(HEADLINE, 0.0) for p in ("c1", "c4")}
    with pytest.raises(ValueError, match="no comparable values"):
        round_score(results(1.0), zeros)


def test_a_round_missing_a_point_is_dropped_not_scored_on_the_rest():
    # the change acts at c1 only (-5 %); a run cut short after the candidate's c1 of round 2 must not score
    # round 2 on c1 alone (-5 %) beside full rounds (-2.5 %): the composite would weigh the points differently
    base = {r: results(1.0) for r in range(3)}
    cand = {r: {"c1": {"output_throughput": 700.0 * 0.95}, "c4": {"output_throughput": 700.0}} for r in range(3)}
    cand[2] = {"c1": cand[2]["c1"]}
    rs = round_scores(base, cand, ("output_throughput",))
    assert sorted(rs.scores) == [0, 1]
    assert rs.scores[0] == pytest.approx(math.log(0.95) / 2)
    assert rs.dropped == ("round 2: incomplete (no c4 in both arms)",)
    # a point no round compares (an arm that never ran it) drops nothing
    rs = round_scores({r: results(1.0) for r in range(3)}, {r: {"c1": {"output_throughput": 665.0}} for r in range(3)},
                      ("output_throughput",))
    assert sorted(rs.scores) == [0, 1, 2] and rs.dropped == ()


def test_pairing_is_by_round_index_not_position():
    # each round has its own machine speed, shared by both arms of that round: the true score is +log 1.05
    # in every round. Shifting the candidate's rounds after a lost one would mix speeds 1.0 / 1.3 / 0.8.
    speeds = {0: 1.0, 1: 1.3, 2: 0.8, 3: 1.1, 4: 0.9}
    base = {r: results(s) for r, s in speeds.items()}
    cand = {r: results(s * 1.05) for r, s in speeds.items() if r != 2}  # the candidate lost round 2
    rs = round_scores(base, cand)
    assert sorted(rs.scores) == [0, 1, 3, 4]
    assert all(v == pytest.approx(math.log(1.05)) for v in rs.scores.values())
    assert rs.dropped == ("round 2: no candidate result",)
    # a round where nothing is comparable is dropped with its reason, not scored
    cand[2] = {p: dict.fromkeys(HEADLINE, 0.0) for p in ("c1", "c4")}
    rs = round_scores(base, cand)
    assert 2 not in rs.scores and rs.dropped[0].startswith("round 2: nothing comparable")
    with pytest.raises(ValueError):
        round_scores({"0": results(1.0)}, {"0": results(1.0)})  # round keys are indices, not labels
    # primary_test keys scores by round too
    with pytest.raises(ValueError):
        primary_test({"a": 0.1, "b": 0.2}, SPEC)


# --------------------------------------------------------------------------- the verdict words


def test_regression():
    r = primary_test(noisy(math.log(0.75), 0.03, 4, seed=1), SPEC, look=2)
    assert r.outcome == Outcome.REGRESSION and r.decided and r.significant
    assert r.estimate_pct == pytest.approx(-25.0) and r.rci_high_pct < 0 and r.p_value < r.nominal_alpha
    assert re.fullmatch(r"-25\.0% \[-\d+\.\d, -\d+\.\d\], p=\S+ < \S+ \(look 2 of 4, O'Brien–Fleming\)",
                        r.reason), r.reason


def test_improvement_and_delta_in_the_metric_direction():
    r = primary_test(noisy(math.log(1.10), 0.01, 6, seed=2), SPEC, look=3, metric="mean_tpot_ms")
    assert r.outcome == Outcome.IMPROVEMENT and r.decided
    assert r.estimate_pct == pytest.approx(10.0)  # better-positive
    assert r.delta_pct == pytest.approx(100 * (1 / 1.10 - 1))  # TPOT itself fell 9.1 %


def test_equivalent():
    r = primary_test(noisy(0.002, 0.01, 8, seed=3), SPEC, look=4)
    assert r.outcome == Outcome.EQUIVALENT and r.decided
    assert -5 < r.rci_low_pct < 0 < r.rci_high_pct < 5 and r.tost < r.nominal_alpha / 2
    assert "inside ±5 %" in r.reason and "TOST" in r.reason
    # a tighter margin than the interval: not equivalent
    tight = primary_test(noisy(0.002, 0.01, 8, seed=3), SPEC.model_copy(update={"target_pct": 1.0}), look=4)
    assert tight.outcome == Outcome.INCONCLUSIVE


def test_inconclusive_states_what_it_could_detect():
    scores = noisy(0.05, 0.20, 4, seed=4)
    r = primary_test(scores, SPEC, look=2)
    assert r.outcome == Outcome.INCONCLUSIVE and not r.decided and not r.significant
    assert r.mde_pct > 40 and r.rounds_for_target > 8
    assert f"could detect ±{r.mde_pct:.0f} % at 80 % power" in r.reason
    assert f"needs ≈ {r.rounds_for_target} rounds for ±5 %" in r.reason
    # 4 rounds at O'Brien-Fleming's second look: the repeated interval is wider than x/÷ 2, not printed
    assert r.rci_too_wide and "[interval wider than ×/÷ 2]" in r.reason
    last = primary_test(noisy(0.05, 0.20, 8, seed=4), SPEC, look=4)
    assert last.outcome == Outcome.INCONCLUSIVE and last.decided and "final: no more rounds" in last.reason
    assert not last.rci_too_wide and re.search(r"\[-\d+\.\d, \+\d+\.\d\]", last.reason), last.reason
    spent = primary_test(scores, SPEC, look=2, final=True)
    assert spent.decided and "final: no more rounds" in spent.reason


@pytest.mark.parametrize(
    "scores,why",
    [({}, "0 rounds"), ({3: -0.5}, "1 round"), ({0: -0.3, 1: -0.3, 2: -0.3}, "no spread"),
     ({0: -0.3, 1: float("nan")}, "non-finite"), ({0: -0.3, 1: float("-inf"), 2: -0.2}, "non-finite")],
)
def test_degenerate_input_is_inconclusive_never_significant(scores, why):
    r = primary_test(scores, SPEC)
    assert r.outcome == Outcome.INCONCLUSIVE and not r.significant and why in r.reason
    assert r.p_value is None and r.rci_low_pct is None


POINTS4 = ("isl128-osl64-c1-n16", "isl128-osl64-c4-n32", "isl128-osl64-c8-n64", "isl128-osl64-c16-n128")
TPOT1 = VerdictSpec(metrics=("mean_tpot_ms",), looks=(3,), target_pct=1.0)  # the H200 design


def tpot_rounds(change: dict[str, float], n: int = 3, sd: float = 0.0003, seed: int = 3,
                spec_points=POINTS4) -> tuple[dict, dict]:
    """Baseline and candidate rounds of mean TPOT at each point: ``change`` is the candidate's TPOT change per
    point (+0.024: 2.4 % slower), a server start's offset shared by the points of one arm's session."""
    rng = np.random.default_rng(seed)
    base, cand = {}, {}
    for r in range(n):
        gb, gc = rng.normal(0, sd, 2)
        base[r] = {p: {"mean_tpot_ms": 5.0 * math.exp(gb + rng.normal(0, sd))} for p in spec_points}
        cand[r] = {p: {"mean_tpot_ms": 5.0 * (1 + change.get(p, 0.0)) * math.exp(gc + rng.normal(0, sd))}
                   for p in spec_points}
    return base, cand


def test_a_trade_off_reads_mixed_and_names_both_sides():
    """The H200 case: 3.0 % faster at c1, 2.4 % and 2.2 % slower at c8 and c16; the composite nets out to about
    -0.5 %. Before, the composite alone decided the word: REGRESSION -0.5 %."""
    change = {POINTS4[0]: -0.030, POINTS4[2]: 0.024, POINTS4[3]: 0.022}
    ev = evaluate(*tpot_rounds(change), TPOT1)
    words = ev.point_words()
    assert ev.outcome == Outcome.MIXED, ev.reason
    assert words == {POINTS4[0]: PointWord.BETTER, POINTS4[1]: PointWord.EQUAL, POINTS4[2]: PointWord.WORSE,
                     POINTS4[3]: PointWord.WORSE}
    c1 = ev.points[POINTS4[0]][0]
    assert c1.result.delta_pct == pytest.approx(-3.0, abs=0.2) and c1.confirmed == Outcome.IMPROVEMENT
    lo, hi = c1.result.own_interval_pct  # the metric's own direction: a TPOT fall is -
    assert lo < c1.result.delta_pct < hi < 0
    assert "isl128-osl64-c1-n16 Mean TPOT better (-3.0%)" in ev.reason and "Mean TPOT worse (+2.4%)" in ev.reason
    assert ev.decided  # every point decided (or the last look)


def test_a_change_at_one_point_is_never_equivalent():
    """Seed-PR shaped: c4 3.5 % faster, the other points flat by construction. The composite over all four moves
    less than the 1 % margin; the word must not be EQUIVALENT: IMPROVEMENT at c4, equal elsewhere."""
    ev = evaluate(*tpot_rounds({POINTS4[1]: -0.035}), TPOT1)
    assert ev.outcome == Outcome.IMPROVEMENT, ev.reason
    assert ev.point_words() == {POINTS4[0]: PointWord.EQUAL, POINTS4[1]: PointWord.BETTER,
                                POINTS4[2]: PointWord.EQUAL, POINTS4[3]: PointWord.EQUAL}
    # the others are equal by their own TOST at the whole alpha, shown with that interval
    flat = ev.points[POINTS4[0]][0]
    assert flat.equal and flat.equivalence is not None and flat.shown is flat.equivalence
    assert flat.equivalence.nominal_alpha > flat.result.nominal_alpha


def test_a_uniform_slowdown_reads_regression_at_every_point():
    ev = evaluate(*tpot_rounds(dict.fromkeys(POINTS4, 0.012)), TPOT1)
    assert ev.outcome == Outcome.REGRESSION and ev.composite_test.confirmed == Outcome.REGRESSION
    assert set(ev.point_words().values()) == {PointWord.WORSE}
    assert ev.composite.estimate_pct == pytest.approx(-1.2, abs=0.1)
    # the composite, confirmed, passed its share on: the cells were tested at more than their first share
    assert all(h.level > (1 - COMPOSITE_WEIGHT) / len(POINTS4) for h in ev.cells)


def test_no_change_reads_equivalent_only_when_every_point_is_inside_the_margin():
    ev = evaluate(*tpot_rounds({}), TPOT1)
    assert ev.outcome == Outcome.EQUIVALENT and set(ev.point_words().values()) == {PointWord.EQUAL}
    # one point measured too loosely to be called equal: not EQUIVALENT, the point undecided
    base, cand = tpot_rounds({})
    for r, f in ((0, 1.02), (1, 0.985), (2, 1.0)):
        cand[r][POINTS4[3]]["mean_tpot_ms"] *= f
    ev = evaluate(base, cand, TPOT1)
    assert ev.outcome == Outcome.INCONCLUSIVE and ev.point_words()[POINTS4[3]] == PointWord.UNDECIDED
    assert not ev.decided or ev.composite.look == ev.composite.n_looks


def test_two_metrics_opposite_at_one_point_is_mixed_there():
    """At one point throughput 20 % better and TTFT 30 % worse; the point reads "better and worse"."""
    rng = np.random.default_rng(5)
    base, cand = {}, {}
    for r in range(8):
        speed = float(np.exp(rng.normal(0, 0.05)))  # shared by both arms of the round
        base[r] = results(speed)
        c = results(speed)
        for p in c:
            c[p]["output_throughput"] *= 1.20 * float(np.exp(rng.normal(0, 0.01)))
            c[p]["mean_ttft_ms"] *= 1.30 * float(np.exp(rng.normal(0, 0.01)))
        cand[r] = c
    ev = evaluate(base, cand, SPEC, look=4)
    assert ev.outcome == Outcome.MIXED
    assert ev.point_words() == {"c1": PointWord.BOTH, "c4": PointWord.BOTH}
    # the reason prints each cell's own Δ: a TTFT rise is +, never "worse (-23 %)"
    assert re.search(r"c1 Mean TTFT worse \(\+(29|30)\.\d%", ev.reason), ev.reason


def _result(outcome: Outcome, mean_log: float, p: float) -> PrimaryResult:
    """A test result with only what the word rule reads: outcome, direction, p and the look's alpha."""
    return PrimaryResult(
        metric=None, n_rounds=3, rounds=(0, 1, 2), scores_pct=(), look=1, n_looks=1, spending="obrien-fleming",
        estimate_pct=None, delta_pct=None, ci_low_pct=None, ci_high_pct=None, rci_low_pct=None, rci_high_pct=None,
        p_value=p, nominal_alpha=0.05, boundary_t=None, df=2.0, mean_log=mean_log, se_log=None, sd_score=None,
        mde_pct=None, tost=None, rounds_for_target=None, pooled=False, variance="", outcome=outcome, decided=True,
        reason="")


@pytest.mark.parametrize(
    ("composite", "cells", "word"),
    [
        (None, [(None, True), (None, True)], Outcome.EQUIVALENT),
        (None, [(None, True), (None, False)], Outcome.INCONCLUSIVE),
        (None, [(Outcome.REGRESSION, False), (None, True)], Outcome.REGRESSION),
        (Outcome.IMPROVEMENT, [(None, False), (None, False)], Outcome.IMPROVEMENT),
        (Outcome.IMPROVEMENT, [(Outcome.IMPROVEMENT, False), (Outcome.REGRESSION, False)], Outcome.MIXED),
        (Outcome.REGRESSION, [(Outcome.IMPROVEMENT, False), (None, True)], Outcome.MIXED),
        (None, [(Outcome.IMPROVEMENT, False), (Outcome.REGRESSION, False)], Outcome.MIXED),
        # the composite confirmed, every point equal: a change the points cannot see alone
        (Outcome.REGRESSION, [(None, True), (None, True)], Outcome.REGRESSION),
    ],
)
def test_the_word_rule(composite, cells, word):
    def hyp(point, confirmed, equal):
        return Hypothesis(point=point, metric=None if point is None else "mean_tpot_ms",
                          result=_result(Outcome.INCONCLUSIVE, 0.0, 0.5), level=0.5, confirmed=confirmed, equal=equal)

    family = [hyp(f"p{i}", c, e) for i, (c, e) in enumerate(cells)]
    assert family_word(hyp(None, composite, False), family) == word


def test_a_point_confirmed_at_an_early_look_stays_confirmed():
    """Maurer & Bretz: a hypothesis rejected at a look stays rejected; its share passes on at the later looks."""
    spec = VerdictSpec(metrics=("mean_tpot_ms",), looks=(4, 8), target_pct=1.0)
    base, cand = tpot_rounds({POINTS4[0]: 0.10}, n=8, sd=0.0005)
    for r in range(4, 8):  # after the first look c1's change vanishes and its rounds scatter
        cand[r][POINTS4[0]]["mean_tpot_ms"] = base[r][POINTS4[0]]["mean_tpot_ms"] * (1.05 if r % 2 else 0.95)
    first = evaluate({r: v for r, v in base.items() if r < 4}, {r: v for r, v in cand.items() if r < 4}, spec)
    ev = evaluate(base, cand, spec)
    assert first.points[POINTS4[0]][0].confirmed == Outcome.REGRESSION
    c1 = ev.points[POINTS4[0]][0]
    assert c1.confirmed == Outcome.REGRESSION and c1.result.look == 1
    assert ev.points[POINTS4[1]][0].result.look == 2  # the undecided ones are tested at the look evaluated


def test_family_wise_error_of_the_family_under_no_change():
    """No change at four points, three rounds of noisy sessions: any test of the family confirmed (the word a
    change or MIXED) in about alpha of runs, not 5 tests' worth (benchmarks/simulation/point_family.py prints
    the full table under drift)."""
    hits, n = 0, 600
    for seed in range(n):
        ev = evaluate(*tpot_rounds({}, sd=0.01, seed=1000 + seed), TPOT1)
        hits += ev.outcome in (Outcome.REGRESSION, Outcome.IMPROVEMENT, Outcome.MIXED)
    assert hits / n <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / n), hits / n


def test_evaluate_reports_dropped_rounds_and_a_regression():
    base = {r: results(1.0 + 0.01 * r) for r in range(4)}
    cand = {r: results((1.0 + 0.01 * r) * (0.70 if r % 2 else 0.72)) for r in (0, 1, 3)}
    ev = evaluate(base, cand, SPEC)
    assert ev.dropped == ("round 2: no candidate result",) and ev.composite.rounds == (0, 1, 3)
    assert ev.composite.look == 1  # 3 usable rounds reach the first planned look (2 rounds) only
    assert ev.composite.estimate_pct == pytest.approx(-29.3, abs=0.3)


# --------------------------------------------------------------------------- pooling with the A/A arm


def test_pooling_with_aa_scores_only_when_asked():
    cand, aa = noisy(-0.10, 0.05, 4, seed=6), noisy(0.0, 0.05, 4, seed=7)
    assert not primary_test(cand, SPEC, look=2, aa_scores=aa).pooled  # off by default: it needs exchangeable arms
    SPEC_POOLED = SPEC.model_copy(update={"pool_aa": True})
    pooled = primary_test(cand, SPEC_POOLED, look=2, aa_scores=aa)
    assert pooled.pooled and pooled.df == pytest.approx((3 + 3) / 1.25) and "pooled with 4 A/A" in pooled.variance
    alone = primary_test(cand, SPEC.model_copy(update={"pool_aa": False}), look=2, aa_scores=aa)
    assert not alone.pooled and alone.df == 3
    assert pooled.rci_high_pct - pooled.rci_low_pct < alone.rci_high_pct - alone.rci_low_pct
    # the candidate varies much more than the A/A arm: pooling would understate its variance, so refused
    wild = primary_test(noisy(-0.10, 0.50, 8, seed=8), SPEC_POOLED, look=4, aa_scores=noisy(0.0, 0.02, 8, seed=9))
    assert not wild.pooled and "varies more than A/A" in wild.variance and wild.df == 7
    # the candidate varies much less: pooling is the conservative choice and is kept
    calm = primary_test(noisy(-0.10, 0.02, 8, seed=8), SPEC_POOLED, look=4, aa_scores=noisy(0.0, 0.50, 8, seed=9))
    assert calm.pooled


# --------------------------------------------------------------------------- the sequential design


def test_spending_boundaries():
    obf = z_boundaries(SPEC)
    assert obf[0] > 3.5 and obf[0] > obf[1] > obf[2] > obf[3]  # first look strict
    assert 1.96 < obf[-1] < 2.10  # last look close to the fixed-sample 1.96
    assert spent_alpha(0.25, 0.05, "obrien-fleming") == pytest.approx(2 * (1 - 0.99995571), rel=1e-3)
    poc = z_boundaries(SPEC.model_copy(update={"spending": "pocock"}))
    assert max(poc) - min(poc) < 0.05 and 2.3 < poc[0] < 2.4  # nearly constant
    fixed = VerdictSpec(looks=(6,))
    assert z_boundaries(fixed)[0] == pytest.approx(1.959964, abs=1e-5) and inflation_factor(fixed) == (
        pytest.approx(1.0, abs=1e-4))
    assert all(0 < a < 0.05 for a in nominal_alphas(SPEC))


def test_boundaries_spend_alpha_as_declared():
    # Brownian motion at the looks: the chance of first crossing by each look equals the spending function
    rng = np.random.default_rng(10)
    for spending in ("obrien-fleming", "pocock"):
        spec = SPEC.model_copy(update={"spending": spending})
        t = np.array(spec.fractions)
        s = np.cumsum(rng.normal(size=(400_000, 4)) * np.sqrt(np.diff(np.r_[0, t])), axis=1)
        crossed = np.abs(s / np.sqrt(t)) >= np.array(z_boundaries(spec))
        first = np.where(crossed.any(1), crossed.argmax(1), 99)
        for k, frac in enumerate(t):
            assert (first <= k).mean() == pytest.approx(spent_alpha(frac, 0.05, spending), abs=0.0012)


def test_look_alphas_are_calibrated_on_the_t_statistics():
    paired, pooled = look_alphas(SPEC), look_alphas(SPEC, pooled=True)
    assert look_alphas(SPEC) is paired  # cached, deterministic
    # first look (df 1): exact for one look alone, so equal to the normal design's nominal alpha
    assert paired[0] == pytest.approx(nominal_alphas(SPEC)[0], rel=0.3)
    # later looks: below the normal design's, which lets 5.2-5.9 % through at these df
    assert all(a < b for a, b in zip(paired[1:], nominal_alphas(SPEC)[1:], strict=True))
    assert all(0 < a < 0.05 for a in pooled)


def test_aa_false_positive_rate_of_the_sequential_test():
    # 2,000 A/A runs of the full design (looks 2/4/6/8) through primary_test; scores share the baseline session
    rng = np.random.default_rng(11)
    fp = {False: 0, True: 0}
    rounds = 0
    for _ in range(2000):
        x = rng.normal(0, 0.05, (3, 8))
        cand, aa = x[2] - x[0], x[1] - x[0]
        for pooled in (False, True):
            for k, n in enumerate(SPEC.looks, 1):
                r = primary_test(dict(enumerate(map(float, cand[:n]))), SPEC, look=k,
                                 aa_scores=dict(enumerate(map(float, aa[:n]))) if pooled else None)
                if r.decided:
                    fp[pooled] += r.significant
                    rounds += n
                    break
    assert fp[False] / 2000 <= 0.07 and fp[True] / 2000 <= 0.07, fp
    assert rounds / 4000 > 7  # an A/A run rarely stops early (only on EQUIVALENT, needing a small spread)


def test_detects_a_large_effect_early():
    rng = np.random.default_rng(12)
    stops = []
    for _ in range(200):
        x = rng.normal(0, 0.05, (2, 8))
        cand = x[1] - x[0] + math.log(1 / 1.35)  # 35 % slower, session noise 5 %
        for k, n in enumerate(SPEC.looks, 1):
            r = primary_test(dict(enumerate(map(float, cand[:n]))), SPEC, look=k)
            if r.decided:
                stops.append((r.outcome, n))
                break
    assert all(o == Outcome.REGRESSION for o, _ in stops)
    assert np.mean([n for _, n in stops]) <= 4.5


def test_a_look_without_alpha_to_spend_cannot_reject():
    # O'Brien-Fleming spends 3e-8 by 2 of 16 rounds: no t statistic of 2 rounds can cross; the look says so
    spec = VerdictSpec(looks=tuple(range(2, 17, 2)))
    assert look_alphas(spec)[0] == 0.0
    r = primary_test({0: -0.5, 1: -0.52}, spec, look=1)
    assert r.outcome == Outcome.INCONCLUSIVE and not r.decided and r.boundary_t == math.inf
    assert "could detect only changes beyond 10×" in r.reason and "wider than" in r.reason


def test_look_resolution_and_validation():
    assert primary_test(noisy(0, 0.1, 5, 1), SPEC).look == 2  # 5 rounds reach looks 2 and 4
    assert primary_test(noisy(0, 0.1, 8, 1), SPEC).look == 4
    with pytest.raises(ValueError):
        primary_test(noisy(0, 0.1, 4, 1), SPEC, look=5)
    with pytest.raises(ValueError):
        primary_test(noisy(0, 0.1, 4, 1), SPEC, metric="nope")


# --------------------------------------------------------------------------- spec and planning


def test_spec_defaults_and_validation():
    assert SPEC.looks == (2, 4, 6, 8) and SPEC.metrics == HEADLINE and SPEC.spending == "obrien-fleming"
    assert default_looks(16) == (4, 8, 12, 16) and default_looks(4) == (2, 4) and default_looks(5) == (5,)
    assert VerdictSpec.model_validate({"looks": [4, 8]}).max_rounds == 8  # the last look: the most rounds
    for bad in ({"looks": (2, 4), "max_rounds": 8}, {"looks": (4, 2, 8)}, {"looks": (1, 8)},
                {"metrics": ("nope",)}, {"metrics": ()}, {"metrics": ("mean_ttft_ms", "mean_ttft_ms")},
                {"spending": "haybittle"}, {"alpha": 0.7}, {"extra": 1}):
        with pytest.raises(ValidationError):
            VerdictSpec(**bad)


def test_plan_looks():
    assert plan_looks(8, 4) == (2, 4, 6, 8) and plan_looks(16, 4) == (4, 8, 12, 16) and plan_looks(6, 1) == (6,)
    for max_rounds in range(2, 31, 2):
        for n in range(1, max_rounds // 2 + 1):
            looks = plan_looks(max_rounds, n)
            assert len(looks) == n and looks[-1] == max_rounds and all(x % 2 == 0 for x in looks)
            assert all(b > a for a, b in zip(looks, looks[1:], strict=False))
    for bad in ((7, 2), (8, 5), (8, 0), (0, 1)):
        with pytest.raises(ValueError):
            plan_looks(*bad)


def test_rounds_needed():
    sds = [0.01, 0.03, 0.05, 0.1, 0.2]
    by_sd = [rounds_needed(sd, 5.0, SPEC) for sd in sds]
    assert by_sd == sorted(by_sd) and by_sd[-1] > by_sd[0] and all(n % 2 == 0 and n >= 2 for n in by_sd)
    targets = [20.0, 10.0, 5.0, 2.0, 1.0]
    by_target = [rounds_needed(0.05, t, SPEC) for t in targets]
    assert by_target == sorted(by_target) and by_target[-1] > by_target[0]
    assert rounds_needed(0.0, 5.0, SPEC) == 2
    # large n: ≈ R (z + z_power)^2 sd^2 / log(1.05)^2, R the sequential design's inflation
    big = rounds_needed(0.2, 5.0, SPEC)
    approx = inflation_factor(SPEC) * ((1.959964 + 0.841621) * 0.2 / math.log(1.05)) ** 2
    assert approx <= big <= approx * 1.03 + 2
    pocock = SPEC.model_copy(update={"spending": "pocock"})
    assert rounds_needed(0.2, 5.0, pocock) > big  # Pocock's flat boundaries cost more at the last look
    for bad in ((-1, 5), (float("nan"), 5), (0.1, 0), (0.1, float("inf"))):
        with pytest.raises(ValueError):
            rounds_needed(*bad, SPEC)


def test_fmt_pct_is_one_format_for_tables_cards_and_reasons():
    """One way to write a change: the verdict's reasons and the report's cells read alike; an interval's end
    near zero keeps its sign and shows its first figure: [-14.5, -0.0] beside "p=0.0497: the interval excludes 0"
    (a stored sensitivity run, 2026-12-05) read as if it touched 0."""
    from suite.stats import fmt_interval

    assert fmt_pct(-24.84) == "-24.8%" and fmt_pct(3.0) == "+3.0%" and fmt_pct(-0.01) == "-0.0%"
    assert fmt_pct(math.inf) == "+∞%" and fmt_pct(-math.inf) == "-∞%" and fmt_pct(None) == "n/a"
    assert fmt_interval(-0.04, 0.7) == "[-0.04, +0.7]" and fmt_interval(None, 1.0) == "—"
    assert fmt_interval(-14.52, -0.0234) == "[-14.5, -0.02]" and fmt_interval(0.004, 2.0) == "[+0.004, +2.0]"
    assert fmt_interval(-3.0, -0.00001) == "[-3.0, -0.000]" and fmt_interval(-0.05, 0.0) == "[-0.1, +0.0]"
    assert fmt_interval(-math.inf, 0.01) == "[-∞, +0.01]"


def test_an_arm_of_every_other_round_has_its_own_looks():
    """The A/A arm of `aa: alternate` (rounds 0, 2, 4, ...): at the run's looks after 2/4/6/8 rounds it has
    1/2/3/4 rounds; a look of one round tests nothing, so its design looks at 2, 3 and 4 of its rounds."""
    from suite.verdict import every_other_look, every_other_round

    spec = VerdictSpec(looks=(2, 4, 6, 8))
    own = every_other_round(spec)
    assert own is not None and own.looks == (2, 3, 4) and own.max_rounds == 4
    assert (own.alpha, own.spending, own.target_pct) == (spec.alpha, spec.spending, spec.target_pct)
    assert [every_other_look(spec, own, n) for n in (2, 4, 6, 8)] == [1, 1, 2, 3]
    assert every_other_round(VerdictSpec(looks=(4, 8, 12, 16))).looks == (2, 4, 6, 8)
    assert every_other_round(VerdictSpec(looks=(3, 4))).looks == (2,)  # ceil: 2 and 2 rounds
    assert every_other_round(VerdictSpec(looks=(2,))) is None  # one round at most: no test


def test_a_crossed_layout_is_taken_out_of_the_test_not_left_in_its_spread():
    """runtime.cross_groups: set r in GPU layout r mod 2, the slower group on the baseline's side in one layout and
    on the candidate's in the other, so a 3 % group difference zig-zags the set scores around the effect. With
    ``strata=Strata.layouts(2)`` the estimate is the mean of the two layouts' means and the spread the one within layouts (n - 2
    degrees of freedom): a +2 % change is IMPROVEMENT with an interval near +2 %; the plain paired test over the
    same six sets carries the zig-zag in its spread and cannot tell it from 0."""
    spec = VerdictSpec(target_pct=1, looks=(6,))
    eff, d = math.log(1.02), math.log(1.03)
    noise = (0.001, -0.002, 0.0015, 0.0005, -0.001, 0.0)
    scores = {r: eff + (d if r % 2 == 0 else -d) + e for r, e in enumerate(noise)}
    crossed = primary_test(scores, spec, strata=Strata.layouts(2))
    plain = primary_test(scores, spec)
    assert crossed.outcome == Outcome.IMPROVEMENT and crossed.df == 4
    assert crossed.estimate_pct == pytest.approx(2.0, abs=0.05)
    assert 1.5 < crossed.rci_low_pct < crossed.rci_high_pct < 2.5
    assert plain.outcome == Outcome.INCONCLUSIVE and plain.rci_low_pct < 0
    # the scores' order within a layout does not matter; the layouts' own means do, each weighted alike
    lopsided = {0: 0.03, 1: 0.01, 2: 0.031, 3: 0.011, 4: 0.029}  # 3 sets of layout 0, 2 of layout 1
    res = primary_test(lopsided, spec, strata=Strata.layouts(2))
    assert res.mean_log == pytest.approx(((0.03 + 0.031 + 0.029) / 3 + (0.01 + 0.011) / 2) / 2)
    assert res.df == 3 and res.mean_log < sum(lopsided.values()) / 5  # the plain mean would lean to layout 0
    # one set per layout: an estimate, no interval
    short = primary_test({0: 0.03, 1: 0.01}, spec, strata=Strata.layouts(2))
    assert short.outcome == Outcome.INCONCLUSIVE and short.rci_low_pct is None
    assert short.estimate_pct == pytest.approx(math.expm1(0.02) * 100)
    assert "2 rounds in 2 of the 2 GPU layouts: no interval once the GPU layouts' difference is taken out" in short.reason
    assert primary_test({0: 0.03, 2: 0.01, 4: 0.02}, spec, strata=Strata.layouts(2)).estimate_pct is None  # layout 1 missing


def test_an_inconclusive_run_with_rounds_enough_for_its_target_is_not_told_to_need_fewer():
    """2026-12-05, an AMD-box run re-decided under Pocock: "-5.3 % [-10.9, +0.7]: could detect ±8 % at 80 % power;
    needs ≈ 4 rounds for ±10 %" after five rounds. It had the rounds; its estimate sits between no change and
    the bound. The plan is said only where it asks for more rounds than the run has."""
    spec = VerdictSpec(metrics=("mean_tpot_ms",), target_pct=10, looks=(3, 5), spending="pocock")
    scores = dict(enumerate(math.log(1 - x / 100) for x in (2.0, 9.5, 4.0, 8.5, 2.5)))
    r = primary_test(scores, spec, look=2, final=True)
    assert r.outcome == Outcome.INCONCLUSIVE and r.rounds_for_target is not None and r.rounds_for_target <= 5
    assert "could detect ±" in r.reason and "needs ≈" not in r.reason
    more = primary_test(dict(enumerate(math.log(1 - x / 100) for x in (2.0, 19.5, 4.0, 14.5, -6.5))), spec,
                        look=2, final=True)
    assert more.outcome == Outcome.INCONCLUSIVE and more.rounds_for_target > 5
    assert f"needs ≈ {more.rounds_for_target} rounds for ±10 %" in more.reason
