"""Simulated rates of the session-drift warning (suite.quality.series.check_session_drift).

    .venv/bin/python benchmarks/simulation/session_drift.py [--trials 4000]

One trial = one run's drift-check pairs: ``sessions`` server sessions, each measuring the drift point first
and again at its end (``drift_check: true``). The log ratio end/first of a steady session is N(0, sigma); a
slow session (the H200's: the first measurement ~7 % slow, the end one normal) adds -log(1.07). Per trial the
SAME function as the report (check_session_drift on RepeatResult pairs, mean TPOT). Printed: the share of
trials with any warning when no session is slow (a false alarm somewhere in the run), the share of steady
sessions warned, and the share of slow sessions warned. Seeds are fixed: the printed numbers repeat.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from suite.quality.finding import RepeatResult
from suite.quality.series import check_session_drift
from suite.stages.serve.read import ServeResult


def trial(rng: np.random.Generator, sessions: int, sigma: float, slow: int, shift: float) -> tuple[int, int]:
    """(steady sessions warned, slow sessions warned) in one simulated run."""
    reps = []
    for i in range(sessions):
        d = rng.normal(0.0, sigma) - (math.log1p(shift) if i < slow else 0.0)
        start = 4.0
        reps.append(RepeatResult(f"arm{i % 4}", "c1", i, ServeResult(mean_tpot_ms=start),
                                 session=i, end=ServeResult(mean_tpot_ms=start * math.exp(d))))
    warned = {f.round for f in check_session_drift(reps)}
    return sum(1 for i in warned if i >= slow), sum(1 for i in warned if i < slow)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=4000)
    ap.add_argument("--sessions", type=int, default=16)
    args = ap.parse_args()
    rng = np.random.default_rng(20261201)
    print(f"{args.trials} trials of {args.sessions} sessions; sigma = sd of a steady session's log(end/first)")
    print("| sigma | runs with a false warning | steady sessions warned | 3 slow sessions (+7 %): warned |")
    print("|--:|--:|--:|--:|")
    for sigma in (0.002, 0.005, 0.01, 0.02, 0.04):
        false_runs = steady_warned = 0
        for _ in range(args.trials):
            fw, _ = trial(rng, args.sessions, sigma, 0, 0.0)
            false_runs += fw > 0
            steady_warned += fw
        slow_warned = steady_slow = 0
        for _ in range(args.trials):
            fw, sw = trial(rng, args.sessions, sigma, 3, 0.07)
            slow_warned += sw
            steady_slow += fw
        print(f"| {sigma * 100:.1f} % | {false_runs / args.trials * 100:.1f} % | "
              f"{steady_warned / (args.trials * args.sessions) * 100:.2f} % | "
              f"{slow_warned / (args.trials * 3) * 100:.1f} % |")


if __name__ == "__main__":
    main()
