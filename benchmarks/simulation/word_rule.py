"""How often the verdict's WORD names a change that is not there, or the wrong direction: the composite's test
together with each metric's own test (``suite.verdict.evaluate_scores``, Holm across metrics), under the set-
level spread this box measured.

    .venv/bin/python benchmarks/simulation/word_rule.py [--trials 10000] [--from RUN_DIR_OR_FOLDER ...]

Why: the word may be moved by a metric's own test as well as by the composite's. Each test alone calls a
no-change candidate changed at most alpha of the time, but "either of them" can do so more often. A stored CPU
run (docs/evidence/cpu-sensitivity-150us-improvement-20261206) read IMPROVEMENT for a 150 us gate slowdown: the
composite's interval held 0, and Mean TTFT's own test on three restart sets (2 degrees of freedom) confirmed it
6.9 % lower.

Model (one trial = one run of a design, stopped at the first look whose composite test decides, as the runner
does). A restart set's (or round's) score per metric is the effect plus a draw from a 4-variate normal (or a
multivariate t with 3 df scaled to the same covariance: heavier tails) with the covariance of the four headline
metrics' set scores this box measured: residuals about each comparison's mean in 36 stored comparisons with 3+
sets (88 df, 2026-12-06): SD 4.95 / 4.75 / 5.42 / 4.94 % (output throughput, Mean TTFT, Mean TPOT, Mean E2EL),
TTFT correlated 0.60-0.74 with the others, the other three 0.98-1.00 (throughput and E2EL 0.9999). ``--from`` re-estimates it from stored
runs. The composite score is the mean of the four (``score_round``: the mean over points and metrics).

Per trial the SAME function as the report: ``evaluate_scores`` (composite test, per-metric tests, Holm, the
word). Printed per design and case: the share of runs whose word is each outcome, under the rule in
``suite.verdict.overall_outcome`` and under the rule before 2026-12-06 (a metric confirmed with none the other
way made an EQUIVALENT or INCONCLUSIVE composite a REGRESSION or IMPROVEMENT), and the composite's own share.
"A change" = REGRESSION, IMPROVEMENT or MIXED; "wrong way" = IMPROVEMENT or MIXED for a slowdown. Seeds fixed.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from suite.verdict import HEADLINE, Evaluation, Outcome, VerdictSpec, evaluate_scores  # noqa: E402

SD = np.array([4.951, 4.746, 5.423, 4.940]) / 100  # log-scale SD of one set's score per metric (HEADLINE order)
CORR = np.array([[1.0000, 0.7365, 0.9786, 0.9999],
                 [0.7365, 1.0000, 0.6001, 0.7396],
                 [0.9786, 0.6001, 1.0000, 0.9775],
                 [0.9999, 0.7396, 0.9775, 1.0000]])
DESIGNS = {
    "demo: one look after 3 sets": VerdictSpec(metrics=HEADLINE, target_pct=10, max_rounds=3, looks=(3,)),
    "looks [3, 5], O'Brien-Fleming": VerdictSpec(metrics=HEADLINE, target_pct=10, max_rounds=5, looks=(3, 5)),
    "looks 2/4/6/8 (ABBA rounds)": VerdictSpec(metrics=HEADLINE, target_pct=10, max_rounds=8, looks=(2, 4, 6, 8)),
}
SLOW = math.log(0.93)  # better-positive log score of a 7 % slowdown
CASES = {  # effect per metric, better positive, HEADLINE order
    "no change (A/A)": (0.0, 0.0, 0.0, 0.0),
    "7 % slower, TTFT unchanged": (SLOW, 0.0, SLOW, SLOW),
    "7 % slower, every metric": (SLOW, SLOW, SLOW, SLOW),
    "TTFT alone 6 % worse": (0.0, -math.log(1.06), 0.0, 0.0),
}
CHANGE = {Outcome.REGRESSION, Outcome.IMPROVEMENT, Outcome.MIXED}


def old_word(ev: Evaluation) -> Outcome:
    """The rule before 2026-12-06: a metric confirmed with none the other way decided the word."""
    confirmed = set(ev.confirmed.values())
    if {Outcome.IMPROVEMENT, Outcome.REGRESSION} <= confirmed:
        return Outcome.MIXED
    for found, opposite in ((Outcome.REGRESSION, Outcome.IMPROVEMENT), (Outcome.IMPROVEMENT, Outcome.REGRESSION)):
        if found in confirmed:
            return Outcome.MIXED if ev.composite.outcome == opposite else found
    return ev.composite.outcome


def measured_covariance(dirs: list[Path]) -> np.ndarray:
    """The set scores' covariance across metrics: residuals about each comparison's mean, pooled."""
    from suite.analysis import load_run  # the report's own reader

    runs = sorted({m.parent for d in dirs for m in ([d / "manifest.json"] if (d / "manifest.json").exists()
                                                     else d.rglob("manifest.json"))})
    resid, df = [], 0
    for run_dir in runs:
        for s in load_run(run_dir).summaries:
            ev = s.evaluation
            if ev is None or ev.composite.n_rounds < 3 or tuple(ev.per_metric) != HEADLINE:
                continue
            x = np.array([[math.log1p(v / 100) for v in ev.per_metric[m].scores_pct] for m in HEADLINE])
            if np.all(np.isfinite(x)):
                resid.append(x - x.mean(axis=1, keepdims=True))
                df += x.shape[1] - 1
    if df < 4:
        raise SystemExit(f"too few sets with all four metrics in {', '.join(map(str, dirs))}: df {df}")
    r = np.concatenate(resid, axis=1)
    cov = r @ r.T / df
    sd = np.sqrt(np.diag(cov))
    print(f"measured from {len(resid)} comparisons ({df} df): SD % {np.round(100 * sd, 2).tolist()}, "
          f"correlations {np.round(cov / np.outer(sd, sd), 2).tolist()}")
    return cov


def covariance_root(cov: np.ndarray) -> np.ndarray:
    """R with R @ R.T == cov, by eigenvalues: it tolerates the near-singular throughput/E2EL pair."""
    w, v = np.linalg.eigh(cov)
    return v @ np.diag(np.sqrt(np.clip(w, 0.0, None)))


def one_run(rng: np.random.Generator, spec: VerdictSpec, chol: np.ndarray, effect: np.ndarray,
            tails: int | None) -> Evaluation:
    z = rng.standard_normal((len(HEADLINE), spec.max_rounds))
    if tails:  # multivariate t: one chi-square scale per set, variance kept
        z = z / np.sqrt(rng.chisquare(tails, spec.max_rounds) / tails) * math.sqrt((tails - 2) / tails)
    x = chol @ z + effect[:, None]
    for look, n in enumerate(spec.looks, 1):
        per = {m: {r: float(x[i, r]) for r in range(n)} for i, m in enumerate(HEADLINE)}
        comp = {r: float(x[:, r].mean()) for r in range(n)}
        ev = evaluate_scores(comp, per, spec, look=look)
        if ev.composite.decided:
            return ev
    return ev


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10_000)
    ap.add_argument("--from", dest="runs", nargs="*", type=Path, default=[],
                    help="stored run directories (or folders holding them) to measure the covariance from")
    args = ap.parse_args()
    cov = measured_covariance(args.runs) if args.runs else CORR * np.outer(SD, SD)
    chol = covariance_root(cov)
    print(f"{args.trials} runs a cell; shares in % of runs. 'change' = REGRESSION, IMPROVEMENT or MIXED.\n")
    print("| design | case | noise | word now: change | REGRESSION | IMPROVEMENT | MIXED | EQUIVALENT "
          "| rule before: change | REGRESSION | IMPROVEMENT | EQUIVALENT | composite alone: change |")
    print("|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for dname, spec in DESIGNS.items():
        for cname, eff in CASES.items():
            for tails in (None, 3):
                rng = np.random.default_rng(2026_12_06)
                now, before, comp = Counter(), Counter(), Counter()
                for _ in range(args.trials):
                    ev = one_run(rng, spec, chol, np.array(eff), tails)
                    now[ev.outcome] += 1
                    before[old_word(ev)] += 1
                    comp[ev.composite.outcome] += 1

                def pct(c: Counter, *words: Outcome) -> str:
                    return f"{100 * sum(c[w] for w in words) / args.trials:.1f}"
                print(f"| {dname} | {cname} | {'t, 3 df' if tails else 'normal'} | {pct(now, *CHANGE)} "
                      f"| {pct(now, Outcome.REGRESSION)} | {pct(now, Outcome.IMPROVEMENT)} | {pct(now, Outcome.MIXED)} "
                      f"| {pct(now, Outcome.EQUIVALENT)} | {pct(before, *CHANGE)} | {pct(before, Outcome.REGRESSION)} "
                      f"| {pct(before, Outcome.IMPROVEMENT)} | {pct(before, Outcome.EQUIVALENT)} "
                      f"| {pct(comp, *CHANGE)} |", flush=True)


if __name__ == "__main__":
    main()
