"""One server at a time, side by side, or interleaved: what each design resolves per unit of wall time under a
model of this 2-core box, through the real plan and the real test.

    .venv/bin/python benchmarks/simulation/windows.py [--trials 1000] [--budget-min 12] [--start-sd 0,3,10]

Two arms (baseline and a candidate; effect 0 is an A/A run). Each design's sessions, windows, blocks and run
order come from ``suite.plan.build_plan`` for a matrix like the server-start benchmark's (three points),
the turns inside a window from ``suite.plan.round_order`` as ``suite.runner`` draws them; a restart set's
blocks are combined by ``suite.analysis.by_round`` and the rounds tested by ``suite.verdict.primary_test``
(a fixed design at the rounds that fit the budget, 95 %). The host, as the audit of issue 23 modelled it:
log speed = a mean-reverting (Ornstein-Uhlenbeck) process of sd 22 % and correlation time 6 s, plus a slow
one of sd 10 % and 5 min; every server start adds its own log offset of sd ``start-sd`` (unknown on this
box: the sweep shows what it does); each point's value is the host's mean log speed over its 4 s (3 s
measured + 1 s between points), plus 2 % of its own noise. Servers alive at once share the host (same two
cores); one server at a time meets it at other moments. Times from the box (docs/benchmarks.md): one start
40 s, two at once 80 s.

Designs: ``abba`` one server per arm and round (2 × (40 + 12) s a round); ``side-by-side`` both servers of a
round at once, jobs mirrored (80 + 24 s); ``interleaved`` b blocks per restart set (80 + 24·b s). Printed per
design: rounds that fit the budget, the A/A false-alarm rate, the power at a −5 % and −10 % candidate, and
the sd of the round (set) score. Seeds fixed: the numbers repeat.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from suite.analysis import by_round  # noqa: E402
from suite.design import round_order  # noqa: E402
from suite.matrix_load import parse_matrix  # noqa: E402
from suite.plan import Plan, build_plan  # noqa: E402
from suite.verdict import Outcome, VerdictSpec, primary_test  # noqa: E402

POINT_S = 4.0  # one point: 3 s measured + ~1 s between points
POINTS = 3
START_S = {1: 40.0, 2: 80.0}  # servers started at once -> seconds to healthy on this box
WITHIN = 0.02
FAST = (0.22, 6.0)  # host log-speed OU: sd, correlation time (s)
SLOW = (0.10, 300.0)

MATRIX = """\
name: windows
model: {{id: sim/model}}
arms:
  baseline: {{vllm: "0.32.0"}}
  candidate: {{vllm: "0.32.0"}}
serve:
  - {{isl: 64, osl: 16, concurrency: [1, 2, 4]}}
repeats: {rounds}
order_seed: {seed}
{design}
"""
DESIGNS = {"abba": "order: abba", "side-by-side": "order: abba\ntogether: 2",
           "interleaved-2": "order: abba\ntogether: all\nblocks: 2", "interleaved-4": "order: abba\ntogether: all\nblocks: 4"}


def plan_of(design: str, rounds: int, seed: int) -> Plan:
    return build_plan(parse_matrix(MATRIX.format(rounds=rounds, seed=seed, design=DESIGNS[design])))


def round_seconds(plan: Plan) -> float:
    """Wall time of one round of the plan (every round alike): starts plus points."""
    r0 = [s for s in plan.sessions if s.jobs[0].repeat == 0 or s.round == 0]
    windows = {s.window for s in r0}
    if windows == {None}:  # one server at a time
        return sum(START_S[1] + len(s.jobs) * POINT_S for s in r0)
    return sum(START_S[2] for _ in windows) + sum(len(s.jobs) * POINT_S for s in r0)


class Host:
    """Log speed of the host on a 1 s grid: the sum of two OU processes."""

    def __init__(self, rng: np.random.Generator, seconds: float):
        n = int(seconds) + 2
        self.x = np.zeros(n)
        for sd, tau in (FAST, SLOW):
            a = math.exp(-1.0 / tau)
            e = rng.normal(0.0, sd * math.sqrt(1 - a * a), n)
            y = np.empty(n)
            y[0] = rng.normal(0.0, sd)
            for i in range(1, n):
                y[i] = a * y[i - 1] + e[i]
            self.x += y

    def mean(self, t0: float, dur: float) -> float:
        return float(self.x[int(t0):int(t0 + dur) + 1].mean())


def measure(plan: Plan, rng: np.random.Generator, effect: float, start_sd: float, order_seed: int
            ) -> dict[str, dict[int, dict[str, float]]]:
    """arm -> block (job repeat) -> point -> log value, the plan run on the model host."""
    host = Host(rng, round_seconds(plan) * (max(j.repeat for j in plan.jobs) + 1) + 60)
    out: dict[str, dict[int, dict[str, float]]] = {a: {} for a in plan.arms}
    t = 0.0
    windows: dict[int | None, list] = {}
    for s in plan.sessions:
        windows.setdefault(s.window if s.window is not None else ("solo", s.arm, s.index), []).append(s)
    for key, sessions in windows.items():
        t += START_S[len(sessions)]
        offset = {s.arm: rng.normal(0.0, start_sd) for s in sessions}
        queues = {s.arm: list(s.jobs) for s in sessions}
        turn = 0
        while any(queues.values()):
            arms = [s.arm for s in sessions]
            if len(arms) > 1 and plan.order == "interleaved":
                arms = round_order(arms, turn, order_seed, f"turns:{key}")
            elif turn % 2:
                arms = arms[::-1]
            for arm in arms:
                if queues[arm]:
                    job = queues[arm].pop(0)
                    value = host.mean(t, POINT_S) + offset[arm] + rng.normal(0.0, WITHIN)
                    value += effect if arm == "candidate" else 0.0
                    out[arm].setdefault(job.repeat, {})[job.point] = value
                    t += POINT_S
            turn += 1
    return out


def scores(plan: Plan, data: dict[str, dict[int, dict[str, float]]]) -> dict[int, float]:
    """Per round: mean over points of log(cand) - log(base) (higher is better: a throughput-like value), each
    point's value first combined over the round's blocks by the analysis' own by_round."""
    per_point = {}
    for p in data["baseline"][0]:
        b = by_round({r: math.exp(v[p]) for r, v in data["baseline"].items()}, plan.blocks)
        c = by_round({r: math.exp(v[p]) for r, v in data["candidate"].items()}, plan.blocks)
        per_point[p] = {r: math.log(c[r] / b[r]) for r in b}
    rounds = sorted(next(iter(per_point.values())))
    return {r: sum(per_point[p][r] for p in per_point) / len(per_point) for r in rounds}


@dataclass
class Cell:
    design: str
    rounds: int
    round_s: float
    false_alarm: float
    power5: float
    power10: float
    score_sd: float


def run_design(design: str, budget_s: float, trials: int, start_sd: float) -> Cell:
    probe = plan_of(design, 2, 0)
    per_round = round_seconds(probe)
    n = max(2, int(budget_s // per_round))
    spec = VerdictSpec(looks=(n,))
    rates = {}
    sds = []
    for effect in (0.0, math.log(0.95), math.log(0.90)):
        hits = 0
        for trial in range(trials):
            rng = np.random.default_rng([trial, int(start_sd * 1000), round(effect * 1e6) % 2**31])
            plan = plan_of(design, n, trial)
            sc = scores(plan, measure(plan, rng, effect, start_sd, trial))
            res = primary_test(sc, spec, final=True)
            hits += res.outcome in (Outcome.REGRESSION, Outcome.IMPROVEMENT)
            if effect == 0.0:
                sds.append(float(np.std(list(sc.values()), ddof=1)))
        rates[effect] = hits / trials
    return Cell(design, n, per_round, rates[0.0], rates[math.log(0.95)], rates[math.log(0.90)],
                float(np.sqrt(np.mean(np.square(sds)))))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--budget-min", type=float, default=12.0, help="wall time of the rounds (starts included)")
    ap.add_argument("--start-sd", default="0,3,10", help="comma list: sd (%%) of a server start's own offset")
    args = ap.parse_args(argv)
    for sd in (float(x) / 100 for x in args.start_sd.split(",")):
        print(f"\n#### start offset sd {100 * sd:g} %, {args.budget_min:g} min of rounds, {args.trials} runs a cell")
        print("| design | s a round | rounds | SD round score | A/A false alarms | power −5 % | power −10 % |")
        print("|---|--:|--:|--:|--:|--:|--:|")
        for design in DESIGNS:
            c = run_design(design, args.budget_min * 60, args.trials, sd)
            print(f"| {c.design} | {c.round_s:.0f} | {c.rounds} | {100 * math.expm1(c.score_sd):.1f} % | "
                  f"{100 * c.false_alarm:.1f} % | {100 * c.power5:.0f} % | {100 * c.power10:.0f} % |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
