"""Simulated error rates of the primary test (suite.verdict) under session-correlated serving noise.

    .venv/bin/python benchmarks/simulation/primary_test.py [--trials 600] [--quick]

Model (one trial = one run of the sequential design, up to max_rounds ABBA rounds, stopped at the first
look that decides). Three arms like the demo: baseline, baseline.aa (the A/A arm) and one candidate. Every
round starts one server session per arm, in ABBA order (baseline, aa, candidate; then reversed), and serves
3 points (concurrency 1, 4, 8) with the 4 headline metrics. Log-speed of a session:
    g = N(0, sigma_session)                      shared by every point and metric of the session
      + log(slow) with probability p_slow        optional bimodal sessions (slow = 0.65: 450 vs 700 tok/s)
      + drift * slot                              optional linear drift over the session's position in time
      - log(1 + effect)                           the candidate only: a slowdown of `effect`
At each point: e_p = N(0, sigma_within) shared by the point's metrics, plus N(0, sigma_within / 2) per
metric. Throughput = base * exp(g + e_p + e_pm), latency = base * exp(-(g + e_p) + e_pm).

Per trial the SAME functions as the runner: suite.scores.round_scores (composite and per metric, paired
by round index, candidate and A/A against the baseline) -> primary_test on the composite at each planned
look (spending boundaries, A/A pooling, the whole alpha) -> the outcome at the first look that decides. These
are the composite test's own rates; the report's word comes from the family of the composite and every point ×
metric test, which gives the composite 0.7 of alpha (benchmarks/simulation/point_family.py).
A false positive is an A/A-like candidate (effect 0) called REGRESSION, IMPROVEMENT or MIXED; power is
the share of runs that call a true slowdown REGRESSION. Seeds are fixed: the printed numbers repeat.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
from scipy.special import fdtrc, stdtr

from suite.scores import round_scores
from suite.stats import METRICS
from suite.verdict import (
    AA_CORRELATION,
    HEADLINE,
    POOL_F_ALPHA,
    Outcome,
    VerdictSpec,
    default_looks,
    look_alphas,
    nominal_alphas,
    primary_test,
    rounds_needed,
)

POINTS = ("c1", "c4", "c8")
ARMS = ("baseline", "baseline.aa", "candidate")
BASE_VALUE = {"output_throughput": 700.0, "mean_ttft_ms": 120.0, "mean_tpot_ms": 20.0, "mean_e2el_ms": 800.0}
EFFECTS = (2.0, 5.0, 10.0, 35.0)
SESSIONS = (0.15, 0.05, 0.03, 0.01)
FALSE_POSITIVE = {Outcome.REGRESSION, Outcome.IMPROVEMENT, Outcome.MIXED}


@dataclass(frozen=True)
class Noise:
    session: float
    within: float = 0.03
    p_slow: float = 0.0
    slow: float = 0.65
    drift: float = 0.0  # log-speed change per session slot
    candidate_factor: float = 1.0  # the candidate's session sd is this many times everyone else's


def mirror_order(r: int) -> tuple[str, ...]:
    """The plain ABBA order of round r: baseline, A/A, candidate; then reversed."""
    return ARMS if r % 2 == 0 else ARMS[::-1]


def simulate_rounds(rng: np.random.Generator, noise: Noise, effect_pct: float, n_rounds: int,
                    order: Callable[[int], Sequence[str]] = mirror_order,
                    drift: np.ndarray | None = None) -> dict:
    """arm -> round index -> point -> metric -> value. ``order(r)``: round r's arms in run order (each one
    session slot; an arm left out of a round has no value there); ``drift``: log-speed added at each slot
    (default: the linear ``noise.drift`` per slot)."""
    data: dict[str, dict] = {arm: {} for arm in ARMS}
    slot = -1
    for r in range(n_rounds):
        slot = simulate_round(rng, noise, effect_pct, r, order(r), data, slot, drift)
    return data


SIGN = np.array([1.0 if METRICS[m].higher_is_better else -1.0 for m in HEADLINE])
BASE = np.array([BASE_VALUE[m] for m in HEADLINE])


def simulate_round(rng: np.random.Generator, noise: Noise, effect_pct: float, r: int, arms: Sequence[str],
                   data: dict, slot: int, drift: np.ndarray | None = None) -> int:
    """Round r of ``simulate_rounds``: its ``arms`` in run order, each the next session slot after ``slot``,
    written into ``data``; returns the last slot taken (a round run round by round, as a run that leaves
    sessions out as it goes: the slots after a left-out session move up)."""
    for arm in arms:  # a round without the A/A arm (aa: alternate) is one slot shorter
        slot += 1
        sd = noise.session * (noise.candidate_factor if arm == "candidate" else 1.0)
        g = rng.normal(0, sd) + (noise.drift * slot if drift is None else drift[slot])
        if noise.p_slow and rng.random() < noise.p_slow:
            g += math.log(noise.slow)
        if arm == "candidate":
            g -= math.log1p(effect_pct / 100)
        e_p = rng.normal(0, noise.within, len(POINTS))
        e_pm = rng.normal(0, noise.within / 2, (len(POINTS), len(HEADLINE)))
        values = BASE * np.exp(SIGN * (g + e_p[:, None]) + e_pm)
        data[arm][r] = {p: dict(zip(HEADLINE, map(float, values[i]), strict=True)) for i, p in enumerate(POINTS)}
    return slot


@dataclass(frozen=True)
class RunOutcome:
    outcome: Outcome  # the candidate's word where the composite stopped the run
    rounds: int
    control: Outcome | None  # the A/A arm judged by the same test at that look (the report's control card)


def one_run(rng: np.random.Generator, noise: Noise, effect_pct: float, spec: VerdictSpec,
            use_aa: bool = True, order: Callable[[int], Sequence[str]] = mirror_order,
            drift: np.ndarray | None = None) -> RunOutcome:
    data = simulate_rounds(rng, noise, effect_pct, spec.max_rounds, order, drift)
    base, aa, cand = (data[a] for a in ARMS)
    comp = round_scores(base, cand, spec.metrics).scores
    aa_comp = round_scores(base, aa, spec.metrics).scores if use_aa else None

    def upto(scores: dict[int, float] | None, n: int) -> dict[int, float] | None:
        return None if scores is None else {r: v for r, v in scores.items() if r < n}

    for k, n in enumerate(spec.looks, 1):
        # the composite's own test at the whole alpha, stopped where it decides (the point × metric family that
        # makes the report's word shares alpha with it: benchmarks/simulation/point_family.py)
        res = primary_test(upto(comp, n), spec, look=k, aa_scores=upto(aa_comp, n))
        if not res.decided:
            continue
        control = (primary_test(upto(aa_comp, n), spec.model_copy(update={"pool_aa": False}), look=k).outcome
                   if aa_comp is not None else None)
        return RunOutcome(res.outcome, n, control)
    raise AssertionError("the last look always decides")


@dataclass(frozen=True)
class Task:
    noise: Noise
    effect_pct: float
    spec: VerdictSpec
    trials: int
    seed: int
    use_aa: bool = True


@dataclass(frozen=True)
class Cell:
    rate: float  # false positives (effect 0: REGRESSION, IMPROVEMENT or MIXED) or detections (REGRESSION)
    equivalent: float
    mean_rounds: float


def run_cell(task: Task) -> Cell:
    rng = np.random.default_rng(task.seed)
    hits = equiv = rounds = 0
    for _ in range(task.trials):
        run = one_run(rng, task.noise, task.effect_pct, task.spec, task.use_aa)
        outcome, n = run.outcome, run.rounds
        hits += outcome in FALSE_POSITIVE if task.effect_pct == 0 else outcome == Outcome.REGRESSION
        equiv += outcome == Outcome.EQUIVALENT
        rounds += n
    return Cell(hits / task.trials, equiv / task.trials, rounds / task.trials)


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def spec_with(spec: VerdictSpec, **changes) -> VerdictSpec:
    data = spec.model_dump()
    if "max_rounds" in changes:  # the default looks of a design of that many rounds, unless given
        changes.setdefault("looks", default_looks(changes.pop("max_rounds")))
    return VerdictSpec(**{**data, **changes})


def main_tables(trials: int, aa_trials: int) -> tuple[dict[tuple, Task], list]:
    tasks = {}
    for max_rounds in (8, 16):
        spec = VerdictSpec(looks=default_looks(max_rounds), pool_aa=True)  # the tables below: A/A pooled
        for i, s in enumerate(SESSIONS):
            base_seed = 1000 * max_rounds + 10 * i
            tasks[("main", max_rounds, s, 0.0)] = Task(Noise(s), 0.0, spec, aa_trials, base_seed)
            for j, e in enumerate(EFFECTS):
                tasks[("main", max_rounds, s, e)] = Task(Noise(s), e, spec, trials, base_seed + j + 1)

    def render(cells: dict[tuple, Cell]) -> None:
        for max_rounds in (8, 16):
            spec = VerdictSpec(looks=default_looks(max_rounds), pool_aa=True)
            head = ["σ_session", "A/A false pos.", "A/A equivalent", "A/A rounds"]
            head += [f"power {e:g} % (rounds)" for e in EFFECTS]
            print(f"\n### max_rounds {max_rounds}, looks {spec.looks}, {spec.spending}, A/A pooled; "
                  f"σ_within 3 %; {aa_trials} A/A runs, {trials} runs per effect\n")
            print("| " + " | ".join(head) + " |")
            print("|" + "---|" * len(head))
            for s in SESSIONS:
                aa = cells[("main", max_rounds, s, 0.0)]
                row = [f"{s:.0%}", pct(aa.rate), pct(aa.equivalent), f"{aa.mean_rounds:.1f}"]
                for e in EFFECTS:
                    c = cells[("main", max_rounds, s, e)]
                    row.append(f"{pct(c.rate)} ({c.mean_rounds:.1f})")
                print("| " + " | ".join(row) + " |")

    return tasks, [render]


def variants(trials: int, aa_trials: int) -> tuple[dict[tuple, Task], list]:
    spec = VerdictSpec(looks=default_looks(8), pool_aa=True)
    rows = [
        ("O'Brien–Fleming, looks 2/4/6/8, A/A pooled (the default before 2026-12-02)", Noise(0.05), spec, True),
        ("A/A arm run but not pooled (the default now)", Noise(0.05), spec_with(spec, pool_aa=False), True),
        ("no A/A arm", Noise(0.05), spec, False),
        ("Pocock", Noise(0.05), spec_with(spec, spending="pocock"), True),
        ("fixed design (one look at 8 rounds)", Noise(0.05), spec_with(spec, looks=(8,)), True),
        ("bimodal: 30 % of sessions at 0.65×", Noise(0.05, p_slow=0.3), spec, True),
        ("linear drift +1 % per session", Noise(0.05, drift=0.01), spec, True),
        ("σ_within 10 %", Noise(0.05, within=0.10), spec, True),
        ("σ_session 15 %, bimodal 30 % at 0.65×", Noise(0.15, p_slow=0.3), spec, True),
    ]
    tasks = {}
    for i, (name, noise, sp, use_aa) in enumerate(rows):
        tasks[("var", name, 0.0)] = Task(noise, 0.0, sp, aa_trials, 50_000 + 10 * i, use_aa)
        for j, e in enumerate((5.0, 10.0)):
            tasks[("var", name, e)] = Task(noise, e, sp, trials, 50_001 + 10 * i + j, use_aa)

    def render(cells: dict[tuple, Cell]) -> None:
        print(f"\n### Variants at σ_session 5 % (unless named), σ_within 3 %, max_rounds 8; {aa_trials} A/A runs, "
              f"{trials} runs per effect\n")
        print("| variant | A/A false pos. | A/A equivalent | power 5 % (rounds) | power 10 % (rounds) |")
        print("|---|---|---|---|---|")
        for name, *_ in rows:
            aa, p5, p10 = (cells[("var", name, e)] for e in (0.0, 5.0, 10.0))
            print(f"| {name} | {pct(aa.rate)} | {pct(aa.equivalent)} | {pct(p5.rate)} ({p5.mean_rounds:.1f}) | "
                  f"{pct(p10.rate)} ({p10.mean_rounds:.1f}) |")

    return tasks, [render]


def planning(trials: int) -> tuple[dict[tuple, Task], list]:
    """rounds_needed against the simulated power of a design of that many rounds."""
    rows = []
    tasks = {}
    for i, s in enumerate((0.03, 0.02)):
        noise = Noise(session=s)
        rng = np.random.default_rng(90_000 + i)
        sds = []
        for _ in range(200):  # the score's sd, as a pilot run would measure it
            d = simulate_rounds(rng, noise, 0.0, 2)
            sds.extend(round_scores(d["baseline"], d["candidate"], HEADLINE).scores.values())
        sd = float(np.std(sds, ddof=1))
        n = rounds_needed(sd, 5.0, VerdictSpec(pool_aa=True))
        spec = VerdictSpec(looks=default_looks(n), pool_aa=True)
        rows.append((s, sd, n, spec))
        tasks[("plan", s)] = Task(noise, 5.0, spec, trials, 91_000 + i)

    def render(cells: dict[tuple, Cell]) -> None:
        print(f"\n### rounds_needed(sd, 5 %) against the simulated power of that design at −5 %; {trials} runs\n")
        print("| σ_session | sd of a round's score | rounds_needed (looks) | power at −5 % | mean rounds |")
        print("|---|---|---|---|---|")
        for s, sd, n, spec in rows:
            c = cells[("plan", s)]
            looks = "/".join(map(str, spec.looks))
            print(f"| {s:.0%} | {sd:.4f} | {n} ({looks}) | {pct(c.rate)} | {c.mean_rounds:.1f} |")

    return tasks, [render]


def t_check(spec: VerdictSpec, trials: int, seed: int) -> tuple[float, float]:
    """A/A false-positive rate of primary_test alone on normal scores (paired; pooled with A/A)."""
    rng = np.random.default_rng(seed)
    fp = {False: 0, True: 0}
    for _ in range(trials):
        x = rng.normal(0, 1, (3, spec.max_rounds))  # baseline, A/A, candidate sessions
        cand, aa = x[2] - x[0], x[1] - x[0]
        for pooled in (False, True):
            for k, n in enumerate(spec.looks, 1):
                r = primary_test({j: float(cand[j]) for j in range(n)}, spec, look=k,
                                 aa_scores={j: float(aa[j]) for j in range(n)} if pooled else None)
                if r.decided:
                    fp[pooled] += r.significant
                    break
    return fp[False] / trials, fp[True] / trials


def vectorized_fp(spec: VerdictSpec, trials: int, seed: int, *, alphas: str, pooled: bool = False) -> float:
    """A vectorized replica of primary_test's rejection rule on normal A/A scores, for precision (100,000
    runs) where the runs through primary_test (the other columns) are few. ``alphas``: "plain" converts the
    normal design's nominal alphas (``nominal_alphas``) to t quantiles; "calibrated" uses ``look_alphas``."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (3, trials, spec.max_rounds))  # baseline, A/A, candidate sessions
    cand, aa = x[2] - x[0], x[1] - x[0]
    levels = nominal_alphas(spec) if alphas == "plain" else look_alphas(spec, pooled=pooled)
    alive, hit = np.ones(trials, bool), np.zeros(trials, bool)
    for n, a in zip(spec.looks, levels, strict=True):
        c = cand[:, :n]
        var, df = c.var(1, ddof=1), np.full(trials, n - 1.0)
        if pooled:
            var_aa = aa[:, :n].var(1, ddof=1)
            pool = fdtrc(n - 1, n - 1, var / var_aa) >= POOL_F_ALPHA / 2
            var = np.where(pool, (var + var_aa) / 2, var)
            df = np.where(pool, (2 * n - 2) / (1 + AA_CORRELATION**2), df)
        now = alive & (2 * stdtr(df, -np.abs(c.mean(1)) / np.sqrt(var / n)) < a)
        hit |= now
        alive &= ~now
    return float(hit.mean())


T_DESIGNS = [
    ("O'Brien–Fleming, looks 2/4/6/8", dict(looks=(2, 4, 6, 8))),
    ("Pocock, looks 2/4/6/8", dict(looks=(2, 4, 6, 8), spending="pocock")),
    ("O'Brien–Fleming, looks 4/8/12/16", dict(looks=(4, 8, 12, 16))),
    ("Pocock, looks 4/8/12/16", dict(looks=(4, 8, 12, 16), spending="pocock")),
    ("Pocock, looks 2/4/…/16", dict(looks=tuple(range(2, 17, 2)), spending="pocock")),
    ("fixed, 4 rounds", dict(looks=(4,))),
]


def _t_row(args: tuple[int, int]) -> tuple[float, ...]:
    i, trials = args
    spec = VerdictSpec(**T_DESIGNS[i][1])
    return (vectorized_fp(spec, 100_000, 80_000 + i, alphas="plain"),
            vectorized_fp(spec, 100_000, 81_000 + i, alphas="calibrated"),
            vectorized_fp(spec, 100_000, 82_000 + i, alphas="calibrated", pooled=True),
            *t_check(spec, trials, 70_000 + i))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=250, help="runs per power cell (default 250)")
    ap.add_argument("--aa-trials", type=int, default=800, help="runs per A/A cell (default 800)")
    ap.add_argument("--t-trials", type=int, default=2000, help="runs per design, t-boundary check")
    ap.add_argument("--quick", action="store_true", help="a tenth of the runs")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    div = 10 if args.quick else 1
    trials, aa_trials, t_trials = args.trials // div, args.aa_trials // div, args.t_trials // div
    start = time.monotonic()
    parts = [main_tables(trials, aa_trials), variants(trials, aa_trials), planning(trials)]
    tasks = {k: v for t, _ in parts for k, v in t.items()}
    order = sorted(tasks, key=lambda k: -tasks[k].trials * tasks[k].spec.max_rounds)  # long ones first
    with ProcessPoolExecutor(args.jobs) as pool:
        t_rows = pool.map(_t_row, [(i, t_trials) for i in range(len(T_DESIGNS))])
        cells = dict(zip(order, pool.map(run_cell, [tasks[k] for k in order]), strict=True))
        t_rows = list(t_rows)
    for _, renders in parts:
        for render in renders:
            render(cells)
    print(f"\n### Type I error of the sequential t test alone (normal A/A scores): vectorized replica on "
          f"100,000 runs, and {t_trials} runs through primary_test\n")
    print("| design | df at the looks | plain conversion, paired | look_alphas, paired | look_alphas, pooled "
          "| primary_test, paired | primary_test, pooled |")
    print("|---|---|---|---|---|---|---|")
    for (name, kw), row in zip(T_DESIGNS, t_rows, strict=True):
        dfs = "/".join(str(n - 1) for n in VerdictSpec(**kw).looks)
        print(f"| {name} | {dfs} | " + " | ".join(map(pct, row)) + " |")
    print(f"\n({time.monotonic() - start:.0f} s, {args.jobs} processes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
