"""A restart set's value from its blocks: the median (``suite.stats.set_value``, what the verdict uses) against
the geometric mean (the rule before 2026-12-04), under the H200's interleaved noise.

    .venv/bin/python benchmarks/simulation/set_score.py [--trials 4000]

One trial = one run of the H200 interleaved design (gemma4-h200-interleaved.yaml): 2 arms x 3 points x up to 4
restart sets x 3 blocks, the declared test at its looks after 3 and 4 sets (target 1 %, 95 %, O'Brien-Fleming),
stopping at the first look that decides, as the runner does. The log mean TPOT of a block is

    effect (candidate only, every point)
    + the set's start offset of that arm, N(0, ``--start-sd``), the same at every point and block: a server
      start's offset lasts the server's life (the H200 A/A's set 0: 2.1-2.3 % at every point)
    + N(0, ``--block-sd``) per block (blocks of one server agree within 0.1-0.3 % on the H200)
    + with probability ``p`` per set, +5 % on ONE block: the first block of the arm measured first, at its first
      point (the slow first minute after a start: 4 of 5 later sets in the 2026-12-04 runs, the settle run's
      set 2, docs/gpu-h200.md).

Per trial the SAME code as the report: each point's set values from ``suite.analysis.by_round`` (the median),
against the geometric mean of the blocks computed here; the set score the mean over points of the log ratio;
``suite.verdict.primary_test`` at each look. Printed per slow-block rate p: the SD of a set score, the
false-alarm rate of an A/A (REGRESSION or IMPROVEMENT), and the power to call a 1 % and a 2 % change. Seeds
are fixed: the numbers repeat.
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
BLOCKS = 3
SLOW = math.log(1.05)
SPEC = VerdictSpec(metrics=("mean_tpot_ms",), target_pct=1, looks=(3, 4))


def run_values(rng: np.random.Generator, effect: float, start_sd: float, block_sd: float, p_slow: float
               ) -> dict[str, dict[int, list[float]]]:
    """arm -> block index -> [log value per point], for 4 sets."""
    out: dict[str, dict[int, list[float]]] = {a: {} for a in ARMS}
    for s in range(SPEC.max_rounds):
        first = ARMS[int(rng.integers(2))]  # the arm measured first in the set
        slow = rng.random() < p_slow
        for arm in ARMS:
            offset = rng.normal(0.0, start_sd) + (effect if arm == "candidate" else 0.0)
            for b in range(s * BLOCKS, (s + 1) * BLOCKS):
                out[arm][b] = [offset + rng.normal(0.0, block_sd)
                               + (SLOW if slow and arm == first and b == s * BLOCKS and p == 0 else 0.0)
                               for p in range(POINTS)]
    return out


def set_scores(values: dict[str, dict[int, list[float]]], rule: str) -> dict[int, float]:
    """set -> mean over points of log(baseline / candidate) (latency: better is positive)."""
    per_point = []
    for p in range(POINTS):
        side = {}
        for arm in ARMS:
            blocks = {b: math.exp(v[p]) for b, v in values[arm].items()}
            if rule == "median":
                side[arm] = by_round(blocks, BLOCKS)
            else:
                side[arm] = {s: math.exp(sum(math.log(blocks[b]) for b in range(s * BLOCKS, (s + 1) * BLOCKS))
                                         / BLOCKS) for s in range(len(blocks) // BLOCKS)}
        per_point.append({s: math.log(side["baseline"][s] / side["candidate"][s]) for s in side["baseline"]})
    return {s: sum(pp[s] for pp in per_point) / POINTS for s in per_point[0]}


def verdict(scores: dict[int, float]) -> Outcome:
    first = primary_test({s: v for s, v in scores.items() if s < 3}, SPEC, look=1)
    if first.decided:
        return first.outcome
    return primary_test(scores, SPEC, look=2, final=True).outcome


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=4000)
    ap.add_argument("--start-sd", type=float, default=0.8, help="sd (%%) of a server start's own offset")
    ap.add_argument("--block-sd", type=float, default=0.2, help="sd (%%) of a block around its server's level")
    args = ap.parse_args()
    start_sd, block_sd = args.start_sd / 100, args.block_sd / 100
    print(f"{args.trials} runs per cell; start offset sd {args.start_sd} %, block sd {args.block_sd} %, "
          "slow block +5 %")
    print("| p (slow block per set) | set value | set-score SD | A/A false alarms | power at 1 % | power at 2 % |")
    print("|--:|---|--:|--:|--:|--:|")
    for p_slow in (0.0, 0.5, 0.8):
        for rule in ("mean", "median"):
            sds, rates = [], {}
            for effect in (0.0, math.log(1.01), math.log(1.02)):
                hits = 0
                for trial in range(args.trials):
                    # the same draws for both rules: the comparison is paired
                    rng = np.random.default_rng([trial, round(p_slow * 10), round(effect * 1e6)])
                    sc = set_scores(run_values(rng, effect, start_sd, block_sd, p_slow), rule)
                    hits += verdict(sc) in (Outcome.REGRESSION, Outcome.IMPROVEMENT)
                    if effect == 0.0:
                        sds.append(float(np.std(list(sc.values()), ddof=1)))
                rates[effect] = hits / args.trials
            name = "median (now)" if rule == "median" else "geometric mean (before)"
            print(f"| {p_slow:g} | {name} | {100 * math.sqrt(float(np.mean(np.square(sds)))):.2f} % | "
                  f"{100 * rates[0.0]:.1f} % | {100 * rates[math.log(1.01)]:.1f} % | "
                  f"{100 * rates[math.log(1.02)]:.1f} % |")


if __name__ == "__main__":
    main()
