"""Simulated rates of the block-outlier warning (suite.quality.series.check_block_outlier).

    .venv/bin/python benchmarks/simulation/block_outlier.py [--trials 2000]

One trial = one interleaved run's mean TPOT values: ``arms`` arms x ``points`` points x ``sets`` restart sets x
``blocks`` blocks, the H200 interleaved design (2 x 3 x 4 x 3). Each set has its own level per arm and point
(a restart shift, N(0, 1.5 %): the H200 A/A's sets moved 1.4-2.3 %), and a steady block's log value is N(0,
sigma) around its set's level, Gaussian or Student t with 4 degrees of freedom (heavier tails, scaled to the
same sd). A block that is off its server's level (the H200 A/A's stock-again, set 2's first block at c1:
+6.4 %) adds log(1 + shift) at the arm's first point only. Per trial the SAME function as the report
(check_block_outlier on RepeatResult values). Printed: the share of trials with any warning when no block is
off (a false alarm somewhere in the run), the share of steady values warned, and the share of off blocks
warned. Seeds are fixed: the printed numbers repeat.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from suite.quality.finding import RepeatResult
from suite.quality.series import check_block_outlier
from suite.stages.serve.read import ServeResult

RESTART_SD = 0.015
T_DF = 4


def noise(rng: np.random.Generator, sigma: float, tails: str) -> float:
    if tails == "normal":
        return float(rng.normal(0.0, sigma))
    return float(rng.standard_t(T_DF) * sigma / math.sqrt(T_DF / (T_DF - 2)))


def trial(rng: np.random.Generator, arms: int, points: int, sets: int, blocks: int, sigma: float, tails: str,
          shift: float | None) -> tuple[int, int]:
    """(steady values warned, off values warned) in one simulated run; the off block is arm 0's first block of
    its last set but one, at its first point."""
    off = (0, 0, (sets - 2) * blocks)
    reps = []
    for a in range(arms):
        for p in range(points):
            for s in range(sets):
                level = rng.normal(0.0, RESTART_SD)
                for b in range(s * blocks, (s + 1) * blocks):
                    d = level + noise(rng, sigma, tails) + (math.log1p(shift) if shift and (a, p, b) == off else 0)
                    reps.append(RepeatResult(f"arm{a}", f"c{p}", b,
                                             ServeResult(mean_tpot_ms=4.0 * (1 + p) * math.exp(d)), session=s))
    found = {(f.arm, f.point, f.round) for f in check_block_outlier(reps, blocks)}
    hit = shift is not None and (f"arm{off[0]}", f"c{off[1]}", off[2]) in found
    return len(found) - hit, int(hit)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--arms", type=int, default=2)
    ap.add_argument("--points", type=int, default=3)
    ap.add_argument("--sets", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(20261204)
    values = args.arms * args.points * args.sets * args.blocks
    print(f"{args.trials} trials of {args.arms} arms x {args.points} points x {args.sets} sets x {args.blocks} "
          "blocks; sigma = sd of a steady block's log mean TPOT around its set's level")
    print("| tails | sigma | runs with a false warning | steady values warned | one block +6.4 % off: warned |")
    print("|---|--:|--:|--:|--:|")
    for tails in ("normal", f"t{T_DF}"):
        for sigma in (0.001, 0.002, 0.005, 0.01, 0.02, 0.04):
            false_runs = steady = 0
            for _ in range(args.trials):
                fw, _ = trial(rng, args.arms, args.points, args.sets, args.blocks, sigma, tails, None)
                false_runs += fw > 0
                steady += fw
            hits = 0
            for _ in range(args.trials):
                _, hit = trial(rng, args.arms, args.points, args.sets, args.blocks, sigma, tails, 0.064)
                hits += hit
            print(f"| {tails} | {sigma * 100:.1f} % | {false_runs / args.trials * 100:.1f} % | "
                  f"{steady / (args.trials * values) * 100:.2f} % | {hits / args.trials * 100:.1f} % |")


if __name__ == "__main__":
    main()
