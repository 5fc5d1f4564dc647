"""Where to look on a noisy 2-core box: one look after 3 restart sets, or looks after 3 and 5 with O'Brien-Fleming
or Pocock spending, under the AMD EPYC box's measured interleaved noise.

    .venv/bin/python benchmarks/simulation/looks.py [--trials 4000] [--block-sd SD]

One trial = one run of the sensitivity benchmark's design (benchmarks/sensitivity/run.py: two arms, three points,
two blocks a restart set, `target_pct: 10`), stopped at the first look that decides, as the runner does. A block's
score (candidate against baseline, mean over points of the log ratio) is

    effect + N(0, sd)      per block, no part of the set's own (pooled one-way ANOVA on the box: F = 0.47 on
                           36 and 46 df; docs/statistics.md "Blocks or sets")

where sd is drawn per run from the 20 per-run spreads the box measured at 150 µs (the blocks' root-mean-square
SD inside a set, 2.6 to 13.6 %: the box has quiet and noisy stretches, and a run lives in one), or is one fixed
``--block-sd``. The noise is drawn per arm and block and shared by the points, so the block score carries it
whole.

Only the composite's test is simulated here: since 2026-12-06 it alone makes the word a change (a metric's own
test, Holm across the four headline metrics, can keep the word from EQUIVALENT or make it MIXED, never a
REGRESSION by itself: benchmarks/simulation/word_rule.py), so the power printed is the verdict's. The real
runs' words, re-read under each design, are
``benchmarks/sensitivity/run.py --redecide``'s (docs/benchmarks.md).

Per trial the SAME code as the report: each point's set values from ``suite.analysis.by_round`` (the median of
a set's blocks), the set score the mean over points of the log ratio, ``suite.verdict.primary_test`` at each look
(its boundaries from the design's spending). Printed per design and effect: the share of runs flagged (REGRESSION
for a slowdown, REGRESSION or IMPROVEMENT for none), the share decided at the first look, the mean number of sets
a run measures and its wall time at the box's measured cost (1.45 min a set plus 0.3 min a run: 4.6 min for three
sets, 7.5 for five, docs/benchmarks.md). Seeds are fixed: the numbers repeat.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from suite.analysis import by_round  # noqa: E402
from suite.verdict import Outcome, VerdictSpec, primary_test  # noqa: E402

ARMS = ("baseline", "candidate")
POINTS = 3
BLOCKS = 2
SET_MIN, RUN_MIN = 1.45, 0.3  # the AMD box's measured wall time: a set, and a run's fixed part
# the blocks' within-set SD (%) of each 150 µs run on the AMD box: ten with one look, ten with looks [3, 5]
MEASURED_SDS = (10.3, 2.8, 2.6, 7.0, 3.8, 8.5, 9.7, 10.6, 11.5, 3.7,
                4.1, 6.7, 3.2, 3.0, 9.9, 10.9, 5.7, 5.7, 13.6, 6.2)
DESIGNS = {
    "one look after 3 (the demo)": VerdictSpec(metrics=("mean_tpot_ms",), target_pct=10, looks=(3,)),
    "looks [3, 5], O'Brien-Fleming": VerdictSpec(metrics=("mean_tpot_ms",), target_pct=10, looks=(3, 5)),
    "looks [3, 5], Pocock": VerdictSpec(metrics=("mean_tpot_ms",), target_pct=10, looks=(3, 5),
                                        spending="pocock"),
}


def run_values(rng: np.random.Generator, effect: float, block_sd: float, sets: int
               ) -> dict[str, dict[int, list[float]]]:
    """arm -> block index -> [log mean TPOT per point]: the candidate slower by ``effect`` (log), each arm's block
    off by N(0, block_sd / sqrt 2), so that a block's score spreads by block_sd."""
    out: dict[str, dict[int, list[float]]] = {a: {} for a in ARMS}
    for b in range(sets * BLOCKS):
        for arm in ARMS:
            level = rng.normal(0.0, block_sd / math.sqrt(2)) + (effect if arm == "candidate" else 0.0)
            out[arm][b] = [level] * POINTS
    return out


def set_scores(values: dict[str, dict[int, list[float]]]) -> dict[int, float]:
    """set -> mean over points of log(baseline / candidate): a slower candidate scores negative (better is +)."""
    per_point = []
    for p in range(POINTS):
        side = {arm: by_round({b: math.exp(v[p]) for b, v in values[arm].items()}, BLOCKS) for arm in ARMS}
        per_point.append({s: math.log(side["baseline"][s] / side["candidate"][s]) for s in side["baseline"]})
    return {s: sum(pp[s] for pp in per_point) / POINTS for s in per_point[0]}


def one_run(scores: dict[int, float], spec: VerdictSpec) -> tuple[Outcome, int]:
    """(outcome, sets measured): the looks in order, stopping at the first that decides."""
    assert spec.looks is not None
    for k, n in enumerate(spec.looks, 1):
        final = k == len(spec.looks)
        res = primary_test({s: v for s, v in scores.items() if s < n}, spec, look=k, final=final)
        if res.decided or final:
            return res.outcome, n
    raise AssertionError("the last look is final")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=4000)
    ap.add_argument("--block-sd", type=float, default=None,
                    help="one sd (%%) of a block's score inside a set for every run (default: per run, drawn from "
                         "the box's 20 measured spreads)")
    ap.add_argument("--effects", type=float, nargs="+", default=[0.0, 6.4, 10.0],
                    help="slowdowns of the candidate, %% of mean TPOT (0: an A/A)")
    args = ap.parse_args()
    sds = (args.block_sd,) if args.block_sd is not None else MEASURED_SDS
    spread = f"{args.block_sd} %" if args.block_sd is not None else "per run as measured (2.6-13.6 %)"
    print(f"{args.trials} runs per cell; a block's score spreads {spread} inside a set, no set part; "
          f"{BLOCKS} blocks a set, {POINTS} points, target 10 %; the composite's test only")
    print("| design | slowdown | flagged | decided at the first look | sets (mean) | wall (mean) |")
    print("|---|--:|--:|--:|--:|--:|")
    for name, spec in DESIGNS.items():
        for effect_pct in args.effects:
            effect = math.log1p(effect_pct / 100)
            flagged = first = 0
            sets: list[int] = []
            for trial in range(args.trials):
                # the same draws for every design: the comparison is paired
                rng = np.random.default_rng([trial, round(effect_pct * 100)])
                block_sd = sds[int(rng.integers(len(sds)))] / 100
                outcome, n = one_run(set_scores(run_values(rng, effect, block_sd, spec.max_rounds)), spec)
                wanted = {Outcome.REGRESSION} if effect_pct else {Outcome.REGRESSION, Outcome.IMPROVEMENT}
                flagged += outcome in wanted
                first += n == spec.looks[0] and outcome is not Outcome.INCONCLUSIVE
                sets.append(n)
            mean_sets = float(np.mean(sets))
            print(f"| {name} | {effect_pct:g} % | {100 * flagged / args.trials:.1f} % | "
                  f"{100 * first / args.trials:.1f} % | {mean_sets:.2f} | {RUN_MIN + SET_MIN * mean_sets:.1f} min |")


if __name__ == "__main__":
    main()
