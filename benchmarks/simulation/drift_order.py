"""False alarms of a neutral candidate under host drift, in the run order the real plan gives.

    .venv/bin/python benchmarks/simulation/drift_order.py [--trials 2000] [--jobs N]

The order of every round comes from ``suite.plan.build_plan`` for a matrix like the demo's (baseline, its
A/A arm, one candidate; ``order: abba``, ``repeats: auto``, the default design: 8 rounds, looks 2/4/6/8,
O'Brien–Fleming); the plan's order for round r is the order of its serving sessions, each one session slot.
One trial per seed of that order (``order_seed`` = trial index), so a randomised order is drawn afresh
per run as a user's run would. Per trial the same code as the runner: round scores paired by round index,
the primary test at each look, the per-metric tests where it stops (``primary_test.one_run``), with the
session and point noise of ``primary_test.simulate_rounds`` (σ_session 3 %, σ_within 3 %) and one of the
host drift models below added to every session by its slot (log speed):

- none;
- linear: +1 % per slot;
- AR(1): φ 0.5, stationary sd 3 %;
- random walk: steps of sd 1 %;
- periodic: sd 3 % sine (amplitude 3 %·√2) of period P slots, random phase per run; P = 6 is two rounds
  of three arms (what a mirrored pair of rounds lines up with), 8 a period no round length divides.

A false alarm is the candidate called REGRESSION, IMPROVEMENT or MIXED. Seeds are fixed: the printed
numbers repeat.

``--control``: ``aa: true`` against ``aa: alternate``. ``--own-control``: the A/A control tested where the
candidates stopped the run (before) against its own sequential stop (``SequentialRun.take_look``: the first look
that decides its own test stops it, and the runner's ``needed_session`` leaves its later sessions out), run
round by round through the real plan's sessions, so the sessions after a left-out one move up a slot. Run it against an older checkout (``PYTHONPATH=<that checkout>``) to compare its order.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from primary_test import ARMS, FALSE_POSITIVE, Noise, one_run, pct, simulate_round  # noqa: E402

from suite.matrix_load import parse_matrix  # noqa: E402
from suite.plan import Session, build_plan  # noqa: E402
from suite.records import LookRecord  # noqa: E402
from suite.sequential import SequentialRun, session_round  # noqa: E402
from suite.verdict import Outcome, VerdictSpec, every_other_look, every_other_round  # noqa: E402
from suite.verdict_family import Evaluation, evaluate  # noqa: E402

POWER = (("none", 5.0), ("linear", 5.0))  # a 5 % slowdown: what randomising costs where mirrored pairs cancel
NOISIER = (1.0, 2.0, 3.0)  # a candidate whose servers vary this many times more: pooling with the A/A arm

MATRIX = """\
name: drift-order
model: {{id: sim/model}}
arms:
  baseline: {{vllm: "0.32.0"}}
  candidate: {{vllm: "0.32.0"}}
serve:
  - {{isl: 64, osl: 16, concurrency: 1}}
order: abba
repeats: auto
aa: {aa}
order_seed: {seed}
verdict: {{looks: [2, 4, 6, 8]}}
"""
NAMES = {"baseline": "baseline", "baseline.aa": "baseline.aa", "candidate": "candidate"}
SLOTS = 8 * len(ARMS)


def plan_orders(seed: int, aa: str = "true") -> dict[int, tuple[str, ...]]:
    """Round -> its serving arms in the order the real plan runs them (``aa: alternate``: the A/A arm in even
    rounds only)."""
    plan = build_plan(parse_matrix(MATRIX.format(seed=seed, aa=aa)))
    rounds: dict[int, list[str]] = {}
    for s in plan.sessions:
        r = session_round(s)
        if r is not None:
            rounds.setdefault(r, []).append(NAMES[s.arm])
    return {r: tuple(arms) for r, arms in rounds.items()}


def drift_of(model: str, rng: np.random.Generator) -> np.ndarray:
    slot = np.arange(SLOTS, dtype=float)
    if model == "none":
        return np.zeros(SLOTS)
    if model == "linear":
        return 0.01 * slot
    if model == "ar1":
        phi, sd = 0.5, 0.03
        out = np.empty(SLOTS)
        out[0] = rng.normal(0, sd)
        for i in range(1, SLOTS):
            out[i] = phi * out[i - 1] + rng.normal(0, sd * math.sqrt(1 - phi**2))
        return out
    if model == "walk":
        return np.cumsum(rng.normal(0, 0.01, SLOTS))
    if model.startswith("periodic"):
        period = float(model.removeprefix("periodic"))
        return 0.03 * math.sqrt(2) * np.sin(2 * math.pi * slot / period + rng.uniform(0, 2 * math.pi))
    raise ValueError(model)


MODELS = ("none", "linear", "ar1", "walk", "periodic6", "periodic8")
LABELS = {"none": "no drift", "linear": "linear, +1 % per slot", "ar1": "AR(1), φ 0.5, sd 3 %",
          "walk": "random walk, steps 1 %", "periodic6": "periodic, 6 slots (two rounds)",
          "periodic8": "periodic, 8 slots"}


@dataclass(frozen=True)
class Task:
    model: str
    trials: int
    seed: int
    effect_pct: float = 0.0
    candidate_factor: float = 1.0  # the candidate's session noise, times the others'
    pool_aa: bool = False  # the default design
    aa: str = "true"  # the matrix's aa: true (every round) or alternate (even rounds)
    session: float = 0.03  # σ_session (own_cell only)
    own: bool = False  # own_cell: the control's own sequential stop (else tested where the run stopped)


def run_cell(task: Task) -> tuple[float, float, float, float]:
    """(false alarms of a neutral candidate, or REGRESSION calls of a slower one; mean rounds; false alarms of
    the A/A control, judged by the same test where the candidate's test stopped; mean server sessions) over
    the trials."""
    rng = np.random.default_rng(task.seed)
    spec = VerdictSpec(looks=(2, 4, 6, 8), pool_aa=task.pool_aa)
    hits = rounds = alarms = sessions = 0
    for t in range(task.trials):
        orders = plan_orders(t, task.aa)
        run = one_run(rng, Noise(0.03, candidate_factor=task.candidate_factor), task.effect_pct, spec,
                      order=orders.__getitem__, drift=drift_of(task.model, rng))
        hits += run.outcome in FALSE_POSITIVE if task.effect_pct == 0 else run.outcome == Outcome.REGRESSION
        rounds += run.rounds
        alarms += run.control in FALSE_POSITIVE
        sessions += sum(len(orders[r]) for r in range(run.rounds))
    return hits / task.trials, rounds / task.trials, alarms / task.trials, sessions / task.trials


CONTROL_MODELS = ("none", "linear", "ar1", "periodic6")


def control_table(trials: int, jobs: int) -> None:
    """`aa: true` against `aa: alternate` through the real plan: false alarms of a neutral candidate and of the
    A/A control, REGRESSION calls of a 5 % slowdown, and the server sessions a run took."""
    tasks = [Task(m, trials, 7_400 + 10 * i + j, aa=aa) for i, m in enumerate(CONTROL_MODELS)
             for j, aa in enumerate(("true", "alternate"))]
    tasks += [Task(m, trials // 4, 7_500 + 10 * i + j, 5.0, aa=aa) for i, m in enumerate(CONTROL_MODELS)
              for j, aa in enumerate(("true", "alternate"))]
    with ProcessPoolExecutor(jobs) as pool:
        cells = list(pool.map(run_cell, tasks))
    n = len(tasks) // 2
    print(f"\n| host drift | aa | false alarms, neutral candidate ({trials} runs) | false alarms, A/A control | "
          f"REGRESSION calls of −5 % ({trials // 4} runs) | server sessions per run (neutral / −5 %) |")
    print("|---|---|--:|--:|--:|--:|")
    for task, (fp, _, control, sessions), (power, _, _, sessions5) in zip(tasks[:n], cells[:n], cells[n:],
                                                                          strict=True):
        print(f"| {LABELS[task.model]} | {task.aa} | {pct(fp)} | {pct(control)} | {pct(power)} | "
              f"{sessions:.1f} / {sessions5:.1f} |")


@lru_cache(maxsize=8192)
def plan_sessions(seed: int, aa: str) -> tuple[Session, ...]:
    """The real plan's server sessions of one run (``order_seed`` = ``seed``), in run order."""
    return tuple(s for s in build_plan(parse_matrix(MATRIX.format(seed=seed, aa=aa))).sessions
                 if session_round(s) is not None)


@dataclass(frozen=True)
class OwnRun:
    candidate: Outcome  # the candidate's word where the run stopped
    control: str  # the A/A control's word: at its own decisive look, else where the run stopped
    sessions: int  # server sessions run
    control_after: int | None  # rounds after which the control's own test decided (None: at the run's stop)
    rounds: int  # rounds after which the run stopped


def sequential_run(rng: np.random.Generator, noise: Noise, effect_pct: float, spec: VerdictSpec, seed: int,
                   aa: str, drift: np.ndarray, own: bool) -> OwnRun:
    """One run round by round through the runner's own pieces: the real plan's sessions of each round, those
    ``SequentialRun.needed_session`` keeps (``own``: the control stops at the first look that decides its own
    test and its later sessions are left out, so the later sessions' slots move up under drift; else the
    control runs to the run's stop, as before), the primary test at each look as ``evaluate_look`` computes it
    (``suite.verdict_family.evaluate`` on the stored rounds: candidate and A/A arm against the baseline, paired by
    round), and ``SequentialRun.take_look`` to decide the control's stop and the run's."""
    seq = SequentialRun(spec=spec, budget_s=None, control_arm="baseline.aa" if own else None)
    sessions = plan_sessions(seed, aa)
    data: dict[str, dict] = {arm: {} for arm in ARMS}
    slot, ran = -1, 0
    ctrl_spec = spec.model_copy(update={"pool_aa": False})
    halved = every_other_round(ctrl_spec) if own and aa == "alternate" else None  # as analysis.primary (own)

    def judge(arm: str, n: int, k: int, final: bool, test: VerdictSpec) -> Evaluation | None:
        base = {r: v for r, v in data["baseline"].items() if r < n}
        new = {r: v for r, v in data[arm].items() if r < n}
        if arm == "baseline.aa" and halved is not None:
            test, k = halved, every_other_look(ctrl_spec, halved, n)
        return evaluate(base, new, test, look=k, final=final) if base and new else None

    for r in range(spec.max_rounds):
        arms = [NAMES[s.arm] for s in sessions if session_round(s) == r and seq.needed_session(s)]
        ran += len(arms)
        slot = simulate_round(rng, noise, effect_pct, r, arms, data, slot, drift)
        n = r + 1
        if n not in spec.looks:
            continue
        k, last = spec.looks.index(n) + 1, n == spec.looks[-1]
        cand = judge("candidate", n, k, last, spec)
        assert cand is not None
        word = decided = None
        if own and seq.control_after is None:
            ctrl = judge("baseline.aa", n, k, last, ctrl_spec)
            word = str(ctrl.outcome) if ctrl is not None else "INCONCLUSIVE"
            decided = bool(ctrl.decided) if ctrl is not None else last
        look = seq.take_look(LookRecord(rounds=n, outcomes={"candidate": str(cand.outcome)},
                                        decided={"candidate": cand.decided}, final=last,
                                        control=word, control_decided=decided))
        if seq.stop_after is not None:
            if look.control is None:  # judged where the run stopped (the report's test, final)
                ctrl = judge("baseline.aa", n, k, True, ctrl_spec)
                look = look.model_copy(update={"control": str(ctrl.outcome) if ctrl is not None else "INCONCLUSIVE"})
            return OwnRun(cand.outcome, look.control or "INCONCLUSIVE", ran, seq.control_after if own else None, n)
    raise AssertionError("the last look always stops the run")


def own_cell(task: Task) -> tuple[float, float, float, float]:
    """``run_cell`` for ``sequential_run``, today's control and its own stop on the same draws (one rng per
    mode, one seed): (false alarms of a neutral candidate or REGRESSION calls of a slower one, false alarms of
    the control, server sessions per run, share of runs whose control decided before the run stopped)."""
    own = task.own
    rng = np.random.default_rng(task.seed)
    spec = VerdictSpec(looks=(2, 4, 6, 8))
    hits = alarms = sessions = early = 0
    alarm_words = {str(o) for o in FALSE_POSITIVE}
    for t in range(task.trials):
        run = sequential_run(rng, Noise(task.session), task.effect_pct, spec, t, task.aa, drift_of(task.model, rng),
                             own)
        hits += run.candidate in FALSE_POSITIVE if task.effect_pct == 0 else run.candidate == Outcome.REGRESSION
        alarms += run.control in alarm_words
        sessions += run.sessions
        early += run.control_after is not None and run.control_after < run.rounds
    n = task.trials
    return hits / n, alarms / n, sessions / n, early / n


def own_control_table(trials: int, jobs: int) -> None:
    """Today's control (tested where the candidates stopped the run) against its own sequential stop, through
    the runner's stopping rule and the real plan's sessions, aa: true and alternate; σ_session 3 % under the
    drift models, and a quiet host (σ_session 1 %, no drift) where an equivalent control can stop early."""
    rows = [(m, 0.03) for m in CONTROL_MODELS] + [("none", 0.01)]
    cells = [(m, sd, aa, own) for m, sd in rows for aa in ("true", "alternate") for own in (False, True)]
    tasks = [Task(m, trials, 7_600 + 10 * i + j, aa=aa, own=own, session=sd)
             for i, (m, sd) in enumerate(rows) for j, aa in enumerate(("true", "alternate")) for own in (False, True)]
    tasks += [Task(m, trials // 4, 7_700 + 10 * i + j, 5.0, aa=aa, own=own, session=sd)
              for i, (m, sd) in enumerate(rows) for j, aa in enumerate(("true", "alternate")) for own in (False, True)]
    with ProcessPoolExecutor(jobs) as pool:
        out = list(pool.map(own_cell, tasks))
    n = len(cells)
    print(f"\n| host drift | aa | control | false alarms, neutral candidate ({trials} runs) | false alarms, A/A "
          f"control | control decided before the run's stop | REGRESSION calls of −5 % ({trials // 4} runs) | "
          "server sessions per run (neutral / −5 %) |")
    print("|---|---|---|--:|--:|--:|--:|--:|")
    for (m, sd, aa, own), neutral, slower in zip(cells, out[:n], out[n:], strict=True):
        label = LABELS[m] + ("" if sd == 0.03 else f", σ_session {100 * sd:g} %")
        print(f"| {label} | {aa} | {'own stop' if own else 'at the run stop'} | {pct(neutral[0])} | "
              f"{pct(neutral[1])} | {pct(neutral[3]) if own else '—'} | {pct(slower[0])} | "
              f"{neutral[2]:.1f} / {slower[2]:.1f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--control", action="store_true", help="only the table of aa: true against aa: alternate")
    ap.add_argument("--own-control", action="store_true",
                    help="only the table of the control tested at the run's stop against its own sequential stop")
    ap.add_argument("--own-control-check", type=int, metavar="TRIALS",
                    help="only the control's own stop without drift, aa: true and alternate, over TRIALS runs")
    args = ap.parse_args(argv)
    start = time.monotonic()
    if args.own_control_check:
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for i, aa in enumerate(("true", "alternate")):
            fp, ctrl, sessions, early = own_cell(Task("none", args.own_control_check, 9_100 + i, aa=aa,
                                                         own=True))
            print(f"aa: {aa}, own stop, no drift, {args.own_control_check} runs: false alarms of a neutral "
                  f"candidate {pct(fp)}, of the A/A control {100 * ctrl:.2f} %, server sessions per run "
                  f"{sessions:.2f}, control decided before the run's stop {pct(early)}")
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"\n{time.monotonic() - start:.0f} s")
        return 0
    if args.own_control:
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        own_control_table(args.trials, args.jobs)
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"\n{time.monotonic() - start:.0f} s")
        return 0
    if args.control:
        control_table(args.trials, args.jobs)
        print(f"\n{time.monotonic() - start:.0f} s")
        return 0
    orders = [" ".join(a[0] if a != "baseline.aa" else "A" for a in plan_orders(0)[r]) for r in range(4)]
    tasks = [Task(m, args.trials, 7_000 + i) for i, m in enumerate(MODELS)]
    tasks += [Task(m, args.trials // 4, 7_100 + i, e) for i, (m, e) in enumerate(POWER)]
    tasks += [Task("none", args.trials, 7_200 + 10 * i + pool, 0.0, f, bool(pool))
              for i, f in enumerate(NOISIER) for pool in (1, 0)]
    tasks += [Task("none", args.trials // 4, 7_300 + 10 * i + pool, 5.0, f, bool(pool))
              for i, f in enumerate(NOISIER) for pool in (1, 0)]
    with ProcessPoolExecutor(args.jobs) as pool:
        cells = list(pool.map(run_cell, tasks))
    power = cells[len(MODELS):len(MODELS) + len(POWER)]
    noisy = cells[len(MODELS) + len(POWER):]
    k = len(NOISIER) * 2
    print(f"plan order (order_seed 0, b = baseline, A = A/A, c = candidate), rounds 0-3: {' | '.join(orders)}")
    print(f"\n| host drift | false alarms of a neutral candidate ({args.trials} runs) | mean rounds | "
          "false alarms of the A/A control |")
    print("|---|--:|--:|--:|")
    for m, (rate, rounds, control, _) in zip(MODELS, cells[:len(MODELS)], strict=True):
        print(f"| {LABELS[m]} | {pct(rate)} | {rounds:.1f} | {pct(control)} |")
    print(f"\n| host drift | REGRESSION calls of a 5 % slowdown ({args.trials // 4} runs) | mean rounds |")
    print("|---|--:|--:|")
    for (m, _), (rate, rounds, _, _) in zip(POWER, power, strict=True):
        print(f"| {LABELS[m]} | {pct(rate)} | {rounds:.1f} |")
    print(f"\n| candidate's session noise | false alarms, A/A pooled | not pooled ({args.trials} runs) | "
          f"power at −5 %, pooled | not pooled ({args.trials // 4} runs) |")
    print("|---|--:|--:|--:|--:|")
    for i, f in enumerate(NOISIER):
        fp_p, fp_n, pw_p, pw_n = noisy[2 * i][0], noisy[2 * i + 1][0], noisy[k + 2 * i][0], noisy[k + 2 * i + 1][0]
        print(f"| {f:g}× the others' (3 %) | {pct(fp_p)} | {pct(fp_n)} | {pct(pw_p)} | {pct(pw_n)} |")
    control_table(args.trials, args.jobs)
    print(f"\n{time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
