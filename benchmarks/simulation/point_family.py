"""Per-point verdicts: the family of the composite and every point × metric test, through the real code path.

    .venv/bin/python benchmarks/simulation/point_family.py [--trials 2000] [--jobs N] [--weight W]

Each trial is one run: the order of every round's sessions comes from ``suite.plan.build_plan`` (the same matrix
as drift_order.py: baseline, its A/A arm, one candidate; ``order: abba``; a fresh ``order_seed`` per trial), the
values of every session from the noise model below plus one of drift_order.py's host drift models, and the run
stops as the runner stops it: ``suite.verdict_family.evaluate`` at each look of the design (the family, weighted
Holm over group-sequential tests) and ``SequentialRun.take_look`` on its ``decided``. Beside it, in the same trial
on the same values, the rule before (``composite``): the composite's own test at the whole alpha, the run stopped
where it decides (``primary_test(...).decided``), the word its outcome.

Noise (log scale): every session a shared offset N(0, σ_session) (all its points and metrics move together, as
a server start does), each point N(0, σ_point), each point × metric N(0, σ_point / 2); the candidate's effect
per point, the same on every metric (signed: slower lowers throughput and raises latencies).

Designs:
- default: the matrix default (8 rounds, looks 2/4/6/8, O'Brien–Fleming), the four headline metrics, points
  c1/c4/c8/c16 (16 cells);
- gpu: three restart sets, one look (the H200 runs' design), mean TPOT only, the same four points (4 cells).

Rows: the global null under each drift model (σ_session 3 %, σ_point 3 %: drift_order.py's) — the share of runs
with any test confirmed (the word a change or MIXED, family-wise error); and at σ_session = σ_point = NOISE (a
level where the composite has ~80 % power for a uniform 1 %): uniform 1 % slower (REGRESSION, both rules, and the
mean rounds), one point of four 2 % slower (REGRESSION naming it; another point confirmed), two points opposite
±2 % (MIXED naming both), and a seed-PR-shaped change (one point 3.5 % faster, the others flat, margin 1 %:
never EQUIVALENT). Seeds are fixed: the printed numbers repeat.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from drift_order import LABELS, MODELS, SLOTS, drift_of, plan_orders  # noqa: E402

import suite.verdict_family as verdict_family  # noqa: E402
from suite.records import LookRecord  # noqa: E402
from suite.scores import round_scores  # noqa: E402
from suite.sequential import SequentialRun  # noqa: E402
from suite.stats import METRICS  # noqa: E402
from suite.verdict import Outcome, VerdictSpec, primary_test  # noqa: E402
from suite.verdict_family import PointWord, evaluate  # noqa: E402

POINTS = ("isl128-osl64-c1-n16", "isl128-osl64-c4-n32", "isl128-osl64-c8-n64", "isl128-osl64-c16-n128")
BASE = {"output_throughput": 700.0, "mean_ttft_ms": 120.0, "mean_tpot_ms": 20.0, "mean_e2el_ms": 800.0}
CHANGED = {Outcome.REGRESSION, Outcome.IMPROVEMENT, Outcome.MIXED}
DESIGNS = {
    "default": VerdictSpec(looks=(2, 4, 6, 8), target_pct=1.0),
    "gpu": VerdictSpec(metrics=("mean_tpot_ms",), looks=(3,), target_pct=1.0),
}
NOISE = {"default": 0.004, "gpu": 0.0015}  # σ_session = σ_point where the composite detects a uniform 1 % ~80 %


@dataclass(frozen=True)
class Task:
    design: str
    scenario: str
    effects: tuple[float, ...]  # % per point, + faster
    sigma: float
    model: str
    trials: int
    seed: int
    weight: float


@dataclass(frozen=True)
class Trial:
    word: Outcome
    words: dict[str, PointWord]
    rounds: int
    old_word: Outcome
    old_rounds: int


def simulate(rng: np.random.Generator, spec: VerdictSpec, effects: tuple[float, ...], sigma: float,
             orders: dict[int, tuple[str, ...]], drift: np.ndarray) -> dict[str, dict]:
    data: dict[str, dict] = {"baseline": {}, "baseline.aa": {}, "candidate": {}}
    slot = -1
    for r in range(spec.max_rounds):
        for arm in orders[r]:
            slot += 1
            g = rng.normal(0, sigma) + drift[slot % SLOTS]
            row = {}
            for i, p in enumerate(POINTS):
                e = g + rng.normal(0, sigma) + (math.log1p(effects[i] / 100) if arm == "candidate" else 0.0)
                row[p] = {m: BASE[m] * math.exp((1 if METRICS[m].higher_is_better else -1) * e
                                                 + rng.normal(0, sigma / 2)) for m in spec.metrics}
            data[arm][r] = row
    return data


def one_trial(rng: np.random.Generator, task: Task, t: int) -> Trial:
    spec = DESIGNS[task.design]
    orders = plan_orders(t)
    data = simulate(rng, spec, task.effects, task.sigma, orders, drift_of(task.model, rng))
    base, cand = data["baseline"], data["candidate"]
    seq = SequentialRun(spec=spec, budget_s=None)
    new = None
    for k, n in enumerate(spec.looks, 1):
        last = k == len(spec.looks)
        ev = evaluate({r: v for r, v in base.items() if r < n}, {r: v for r, v in cand.items() if r < n}, spec,
                      look=k, final=last)
        seq.take_look(LookRecord(rounds=n, outcomes={"candidate": str(ev.outcome)},
                                 decided={"candidate": ev.decided}, final=last))
        if seq.stop_after is not None:
            new = (ev, n)
            break
    assert new is not None
    comp = round_scores(base, cand, spec.metrics).scores
    for k, n in enumerate(spec.looks, 1):
        old = primary_test({r: v for r, v in comp.items() if r < n}, spec, look=k, final=k == len(spec.looks))
        if old.decided:
            break
    ev, n = new
    return Trial(ev.outcome, {p: w for p, w in ev.point_words().items()}, n, old.outcome, old.n_rounds)


def run_task(task: Task) -> list[Trial]:
    verdict_family.COMPOSITE_WEIGHT = task.weight
    rng = np.random.default_rng(task.seed)
    return [one_trial(rng, task, t) for t in range(task.trials)]


SCENARIOS = {  # name: effects per point (% faster), what a run should say
    "uniform": (-1.0, -1.0, -1.0, -1.0),
    "local": (0.0, 0.0, -2.0, 0.0),
    "tradeoff": (2.0, 0.0, 0.0, -2.0),
    "seed-pr": (0.0, 3.5, 0.0, 0.0),
}


def share(xs: list[bool]) -> str:
    return f"{100 * sum(xs) / len(xs):.1f} %"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--weight", type=float, default=verdict_family.COMPOSITE_WEIGHT)
    ap.add_argument("--designs", default="default,gpu")
    args = ap.parse_args(argv)
    started = time.time()
    print(f"load average before: {os.getloadavg()[0]:.2f}; composite weight {args.weight:g}; {args.trials} trials each")
    tasks = []
    for d in args.designs.split(","):
        for i, model in enumerate(MODELS):
            tasks.append(Task(d, "null", (0.0,) * 4, 0.03, model, args.trials, 100 + i, args.weight))
        for i, (name, eff) in enumerate(SCENARIOS.items()):
            tasks.append(Task(d, name, eff, NOISE[d], "none", args.trials, 200 + i, args.weight))
    with ProcessPoolExecutor(args.jobs) as pool:
        results = dict(zip(tasks, pool.map(run_task, tasks), strict=True))
    for d in args.designs.split(","):
        spec = DESIGNS[d]
        print(f"\n## design {d}: {spec.max_rounds} rounds, looks {list(spec.looks)}, metrics "
              f"{', '.join(spec.metrics)}, {len(POINTS)} points ({len(POINTS) * len(spec.metrics)} cells)\n")
        print("| global null, drift | family: any test confirmed | composite alone (before): a change |")
        print("|---|--:|--:|")
        for model in MODELS:
            rs = results[next(t for t in tasks if t.design == d and t.scenario == "null" and t.model == model)]
            print(f"| {LABELS[model]} | {share([r.word in CHANGED for r in rs])} | "
                  f"{share([r.old_word in CHANGED for r in rs])} |")
        print(f"\nσ_session = σ_point = {100 * NOISE[d]:g} %, no drift:\n")
        print("| scenario | what is counted | family (now) | composite alone (before) |")
        print("|---|---|--:|--:|")
        get = {s: results[next(t for t in tasks if t.design == d and t.scenario == s)] for s in SCENARIOS}
        u = get["uniform"]
        print(f"| uniform 1 % slower | REGRESSION | {share([r.word == Outcome.REGRESSION for r in u])} | "
              f"{share([r.old_word == Outcome.REGRESSION for r in u])} |")
        print(f"| uniform 1 % slower | mean rounds | {np.mean([r.rounds for r in u]):.2f} | "
              f"{np.mean([r.old_rounds for r in u]):.2f} |")
        print(f"| uniform 1 % slower | every point worse | {share([set(r.words.values()) == {PointWord.WORSE} for r in u])} | — |")
        lo = get["local"]
        moved = POINTS[2]
        print(f"| c8 2 % slower, others flat | REGRESSION | {share([r.word == Outcome.REGRESSION for r in lo])} | "
              f"{share([r.old_word == Outcome.REGRESSION for r in lo])} |")
        print(f"| c8 2 % slower, others flat | c8 worse | {share([r.words[moved] == PointWord.WORSE for r in lo])} | — |")
        print(f"| c8 2 % slower, others flat | another point confirmed | "
              f"{share([any(w in (PointWord.BETTER, PointWord.WORSE, PointWord.BOTH) for p, w in r.words.items() if p != moved) for r in lo])} | — |")
        tr = get["tradeoff"]
        print(f"| c1 2 % faster, c16 2 % slower | MIXED | {share([r.word == Outcome.MIXED for r in tr])} | "
              f"{share([r.old_word == Outcome.MIXED for r in tr])} |")
        print(f"| c1 2 % faster, c16 2 % slower | c1 better and c16 worse | "
              f"{share([r.words[POINTS[0]] == PointWord.BETTER and r.words[POINTS[3]] == PointWord.WORSE for r in tr])} | — |")
        print(f"| c1 2 % faster, c16 2 % slower | REGRESSION or IMPROVEMENT | "
              f"{share([r.word in (Outcome.REGRESSION, Outcome.IMPROVEMENT) for r in tr])} | "
              f"{share([r.old_word in (Outcome.REGRESSION, Outcome.IMPROVEMENT) for r in tr])} |")
        sp = get["seed-pr"]
        print(f"| c4 3.5 % faster, others flat | EQUIVALENT | {share([r.word == Outcome.EQUIVALENT for r in sp])} | "
              f"{share([r.old_word == Outcome.EQUIVALENT for r in sp])} |")
        print(f"| c4 3.5 % faster, others flat | IMPROVEMENT naming c4 | "
              f"{share([r.word == Outcome.IMPROVEMENT and r.words[POINTS[1]] == PointWord.BETTER for r in sp])} | "
              f"{share([r.old_word == Outcome.IMPROVEMENT for r in sp])} |")
    print(f"\n{time.time() - started:.0f} s; load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
