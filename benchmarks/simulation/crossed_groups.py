"""Arms on GPU groups of their own (runtime.cross_groups) against arms fixed on their groups, and against both arms
on one group, when one GPU is faster than the other.

    .venv/bin/python benchmarks/simulation/crossed_groups.py [--trials 4000]

One trial = one run of matrices/gemma4-h200x2-crossed.yaml: 2 arms, up to 6 restart sets, the declared test
(mean TPOT, target 1 %, O'Brien-Fleming) at its looks after 4 and 6 sets, stopping at the first look that decides,
as the runner does. Which GPU each arm's server sits on in each set comes from the real plan
(``suite.plan.build_plan`` of that matrix: ``Session.gpus``). A set's score is

    the candidate's effect
    + (log TPOT the baseline's GPU adds - the candidate's GPU's): 0 on GPU 0, ``d`` on GPU 1 (the slower)
    + N(0, ``--set-sd``): what one start of the two servers adds (the H200's warm sets: 0.1-0.4 %)

and ``suite.verdict.primary_test`` decides at each look. Three layouts, the same noise:

- crossed: the plan's (set s: baseline on GPU s mod 2, the candidate on the other);
- fixed: each arm always on its own GPU (what crossing replaces: the GPU difference is then the arms');
- together: both arms of a set on one GPU (GPU groups in runtime.gpus without crossing; needs both to fit on a GPU):
  the GPU's speed falls on both sides of the score.

The crossed layout is tested two ways: as the report tests it (``strata``: the mean of the layouts' means, the
variance within layouts, n - N degrees of freedom) and by the plain paired test over sets (the GPU difference
left in the variance).

Printed per GPU difference d: the false-alarm rate of a neutral candidate (REGRESSION or IMPROVEMENT), the
power to call a 1 % and a 2 % change, and the mean estimate of a 2 % change. Seeds are fixed: the numbers repeat.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from suite.matrix_load import load_matrix  # noqa: E402
from suite.plan import build_plan  # noqa: E402
from suite.stats import Strata  # noqa: E402
from suite.verdict import Outcome, primary_test  # noqa: E402

MATRIX = ROOT / "matrices" / "gemma4-h200x2-crossed.yaml"


def crossed_layout() -> tuple[list[tuple[int, int]], object]:
    """Per set: (baseline's GPU group, candidate's GPU group), from the real plan; and the matrix's verdict spec."""
    matrix = load_matrix(MATRIX)
    plan = build_plan(matrix)
    base, cand = plan.baseline, next(a for a in plan.arms if a != plan.baseline)
    gpus = {(s.arm, s.round): plan.group_of_session(s) for s in plan.sessions if s.round is not None}
    sets = sorted({r for _, r in gpus})
    return [(gpus[(base, r)], gpus[(cand, r)]) for r in sets], matrix.verdict


def one_run(rng: np.random.Generator, layout: list[tuple[int, int]], spec, effect: float, d: float,
            set_sd: float, phases: int) -> tuple[Outcome, float | None]:
    """(outcome, estimate %) of one run, stopping at the first look that decides."""
    slow = (0.0, d)  # log TPOT added by each GPU: a server on GPU 1 runs d slower
    scores = {r: effect + slow[gb] - slow[gc] + rng.normal(0.0, set_sd) for r, (gb, gc) in enumerate(layout)}
    res = None
    for k, n in enumerate(spec.looks, start=1):
        res = primary_test({r: v for r, v in scores.items() if r < n}, spec, look=k, strata=Strata.layouts(phases))
        if res.decided:
            break
    assert res is not None
    return res.outcome, res.estimate_pct


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=4000)
    ap.add_argument("--set-sd", type=float, default=0.003, help="sd of one set's score (log)")
    args = ap.parse_args()
    crossed, spec = crossed_layout()
    n = len({g for pair in crossed for g in pair})
    # (layout per set, phases the test takes out): the report's test on a crossed run takes out its n layouts
    layouts = {"crossed, layouts taken out (the suite)": (crossed, n), "crossed, plain paired test": (crossed, 1),
               "fixed": ([(0, 1)] * len(crossed), 1), "together": ([(r % 2, r % 2) for r in range(len(crossed))], 1)}
    print(f"crossed layout from the plan (baseline GPU, candidate GPU) per set: {crossed}")
    print(f"looks {list(spec.looks)}, target ±{spec.target_pct:g} %, set sd {args.set_sd * 100:.2f} %, "
          f"{args.trials} trials a cell\n")
    print("| GPU 1 slower by | layout | false alarms (neutral) | power at 1 % | power at 2 % | mean estimate at 2 % |")
    print("|--:|---|--:|--:|--:|--:|")
    for d_pct in (0.0, 0.5, 1.0, 2.0):
        d = float(np.log1p(d_pct / 100))
        for i, (name, (layout, phases)) in enumerate(layouts.items()):
            rng = np.random.default_rng(int(d_pct * 10) * 7 + i)
            cells = {}
            for eff_pct in (0.0, 1.0, 2.0):
                eff = np.log1p(eff_pct / 100)
                out = [one_run(rng, layout, spec, eff, d, args.set_sd, phases) for _ in range(args.trials)]
                if eff_pct == 0:
                    cells[0] = sum(o in (Outcome.IMPROVEMENT, Outcome.REGRESSION) for o, _ in out) / len(out)
                else:
                    cells[eff_pct] = sum(o == Outcome.IMPROVEMENT for o, _ in out) / len(out)
                    if eff_pct == 2:
                        cells["est"] = float(np.mean([e for _, e in out if e is not None]))
            print(f"| {d_pct:g} % | {name} | {cells[0] * 100:.1f} % | {cells[1.0] * 100:.1f} % | "
                  f"{cells[2.0] * 100:.1f} % | {cells['est']:+.2f} % |")


if __name__ == "__main__":
    main()
