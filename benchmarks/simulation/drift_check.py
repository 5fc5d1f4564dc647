"""Simulated rates of the drift warning (suite.quality.series.check_drift): how often it warns with no drift at
all, and how often it finds a real one.

    .venv/bin/python benchmarks/simulation/drift_check.py [--trials 2000]

One trial = one run's output-throughput cells: ``arms`` x ``points`` x ``rounds`` (a round: a session, or under
order interleaved a restart set, as the check sees it). A round's log value at a point is

    N(0, session sd)      per arm and round, shared by the arm's points (a server start's or a window's level)
  + N(0, within sd)       per point
  + drift x round         the trend, the same for every arm (0: no drift)

Per trial the SAME function as the report (check_drift on RepeatResult values). Printed per design and noise:
the share of runs with any drift warning when nothing drifts (a false alarm somewhere in the run), and the share
that warn under a drift of 1 % and 3 % a round. Seeds are fixed: the printed numbers repeat.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from suite.quality.finding import RepeatResult
from suite.quality.series import check_drift
from suite.stages.serve.read import ServeResult

DESIGNS = {  # name: (arms, points, rounds)
    "the demo (4 arms, 3 points, 3 sets)": (4, 3, 3),
    "H200 interleaved (2 arms, 3 points, 4 sets)": (2, 3, 4),
    "ABBA, 6 rounds (2 arms, 3 points)": (2, 3, 6),
    "ABBA, 8 rounds (4 arms, 3 points)": (4, 3, 8),
}
NOISE = {  # name: (session sd, within sd), log scale
    "sessions 1 %, points 0.3 % (H200)": (0.01, 0.003),
    "sessions 5 %, points 3 % (CPU box)": (0.05, 0.03),
}


def warns(rng: np.random.Generator, arms: int, points: int, rounds: int, session_sd: float, within_sd: float,
          drift: float) -> bool:
    reps = []
    for a in range(arms):
        for r in range(rounds):
            level = rng.normal(0.0, session_sd) + drift * r
            for p in range(points):
                value = 1000.0 * (1 + p) * math.exp(level + rng.normal(0.0, within_sd))
                reps.append(RepeatResult(f"arm{a}", f"c{p}", r, ServeResult(output_throughput=value), session=r))
    return bool(check_drift(reps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=2000)
    args = ap.parse_args()
    print(f"{args.trials} runs a cell; a run warns when check_drift returns any finding")
    print("| design | noise | no drift: runs warned | 1 % a round: warned | 3 % a round: warned |")
    print("|---|---|--:|--:|--:|")
    for name, (arms, points, rounds) in DESIGNS.items():
        for noise, (s_sd, w_sd) in NOISE.items():
            rates = []
            for drift in (0.0, math.log(1.01), math.log(1.03)):
                rng = np.random.default_rng([arms, points, rounds, round(s_sd * 1e4), round(drift * 1e4)])
                rates.append(sum(warns(rng, arms, points, rounds, s_sd, w_sd, drift) for _ in range(args.trials))
                             / args.trials)
            print(f"| {name} | {noise} | " + " | ".join(f"{100 * x:.1f} %" for x in rates) + " |")


if __name__ == "__main__":
    main()
