"""Simulated rates of the round-outlier warning (suite.quality.series.check_round_outlier).

    .venv/bin/python benchmarks/simulation/round_outlier.py [--trials 2000]

One trial = one run's mean TPOT cells: ``arms`` arms x ``points`` points x ``rounds`` rounds, the H200 design
(4 x 3 x 4). A steady round's log value at a point is N(0, sigma) around its cell's level; a session that
is off its level (the third H200 run's ll-bf16 round 3: +8.6 % at c1, its other points near their level)
adds log(1 + shift) at the arm's first point only. Per trial the SAME function as the report
(check_round_outlier on RepeatResult values). Printed: the share of trials with any warning when no round is
off (a false alarm somewhere in the run), the share of steady (arm, point, round) values warned, and the
share of off rounds warned. Seeds are fixed: the printed numbers repeat.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from suite.quality.finding import RepeatResult
from suite.quality.series import check_round_outlier
from suite.stages.serve.read import ServeResult


def trial(rng: np.random.Generator, arms: int, points: int, rounds: int, sigma: float, off: bool,
          shift: float) -> tuple[int, int]:
    """(steady values warned, off values warned) in one simulated run; the off round is arm 0's last."""
    reps = []
    for a in range(arms):
        for p in range(points):
            for r in range(rounds):
                d = rng.normal(0.0, sigma) + (math.log1p(shift) if off and a == 0 and p == 0 and r == rounds - 1
                                              else 0.0)
                reps.append(RepeatResult(f"arm{a}", f"c{p}", r, ServeResult(mean_tpot_ms=4.0 * (1 + p) * math.exp(d)),
                                         session=r))
    found = {(f.arm, f.point, f.round) for f in check_round_outlier(reps)}
    hit = ("arm0", "c0", rounds - 1) in found and off
    return len(found) - hit, int(hit)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--arms", type=int, default=4)
    ap.add_argument("--points", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    rng = np.random.default_rng(20261202)
    values = args.arms * args.points * args.rounds
    print(f"{args.trials} trials of {args.arms} arms x {args.points} points x {args.rounds} rounds; sigma = sd of "
          "a steady round's log mean TPOT around its cell's level")
    print("| sigma | runs with a false warning | steady values warned | one round +8.6 % off: warned |")
    print("|--:|--:|--:|--:|")
    for sigma in (0.002, 0.005, 0.01, 0.02, 0.04, 0.08):
        false_runs = steady = 0
        for _ in range(args.trials):
            fw, _ = trial(rng, args.arms, args.points, args.rounds, sigma, False, 0.0)
            false_runs += fw > 0
            steady += fw
        hits = 0
        for _ in range(args.trials):
            _, hit = trial(rng, args.arms, args.points, args.rounds, sigma, True, 0.086)
            hits += hit
        print(f"| {sigma * 100:.1f} % | {false_runs / args.trials * 100:.1f} % | "
              f"{steady / (args.trials * values) * 100:.2f} % | {hits / args.trials * 100:.1f} % |")


if __name__ == "__main__":
    main()
