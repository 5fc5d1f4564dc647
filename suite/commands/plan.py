"""`suite plan MATRIX --from RUN_DIR --target-mde 2%`: how many rounds (and how much wall time) the matrix's
primary test needs to see a change of that size, from the round-to-round spread of an earlier run of the
same matrix (an A/A run, or any run: each candidate's per-round scores against the baseline). From an
together: all run, also how much of its rounds' spread is their blocks' noise and how much each round's own,
which says whether more blocks a round or only more rounds would narrow the test."""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

from suite.analysis import load_run, round_data, set_spread
from suite.errors import SuiteError
from suite.matrix_load import load_matrix
from suite.run_facts import one_time_seconds, running_seconds
from suite.scores import round_scores
from suite.stats import OneWay, fmt_set_spread
from suite.verdict import VerdictSpec, rounds_needed

NAME = "plan"
HELP = "Rounds and wall time the primary test needs for a target effect, from an earlier run's spread."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("matrix", metavar="MATRIX", type=Path)
    p.add_argument("--from", dest="run_dir", type=Path, required=True, metavar="RUN_DIR",
                   help="an earlier run of the same matrix (an A/A run is best)")
    p.add_argument("--target-mde", default=None, metavar="PCT",
                   help="smallest change to detect, in %% (default: the matrix's verdict.target_pct)")


def _pct(text: str) -> float:
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        raise SuiteError(f"--target-mde {text!r}: give a percentage such as 2 or 2%") from None
    if not 0 < value < 100:
        raise SuiteError(f"--target-mde {text!r}: must be between 0 and 100 %")
    return value


def run(args: argparse.Namespace) -> int:
    matrix = load_matrix(args.matrix)
    spec = matrix.verdict or VerdictSpec()
    target = _pct(args.target_mde) if args.target_mde else spec.target_pct
    run_ = load_run(args.run_dir)
    if run_.matrix.name != matrix.name:
        raise SuiteError(f"{args.run_dir} is a run of {run_.matrix.name!r}, not {matrix.name!r}")
    base, _ = round_data(run_, run_.baseline, spec.metrics, spec.points)
    others = [a for a in run_.arms if a != run_.baseline]
    if not base or not others:
        raise SuiteError(f"{args.run_dir}: needs serving rounds of the baseline and of one more arm")
    table = Table(title=f"{matrix.name}: rounds for a ±{target:g} % change at {spec.power:.0%} power "
                        f"(alpha {spec.alpha:g}, {spec.spending}, looks after {', '.join(map(str, spec.looks))} rounds)")
    for col in ("from arm", "rounds seen", "SD of round scores", "rounds needed", "wall time"):
        table.add_column(col, justify="right" if col != "from arm" else "left")
    # the run's seconds split into what a run pays once (precompile, correctness jobs) and what a round costs
    (running, estimated), once = running_seconds(run_), one_time_seconds(run_)
    per_round = (running - once) / len(base) if running is not None and running > once else None
    for arm in others:
        scores = round_scores(base, round_data(run_, arm, spec.metrics, spec.points)[0], spec.metrics).scores
        if len(scores) < 2:
            table.add_row(arm, str(len(scores)), "n/a (needs 2 rounds)", "", "")
            continue
        sd = statistics.stdev(scores.values())
        n = max(rounds_needed(sd, target, spec), spec.looks[0])  # no run of this matrix decides before its first look
        wall = f"{(once + n * per_round) / 60:.0f} min" if per_round and math.isfinite(n) else "n/a"
        sd_pct = 100 * math.expm1(sd)
        table.add_row(arm, str(len(scores)), f"{sd_pct:.2f} %" if sd_pct < 1 else f"{sd_pct:.1f} %", str(n), wall)
    console = Console()
    console.print(table)
    if per_round:
        console.print("wall time: " + (f"{once / 60:.1f} min once (precompile, correctness and probe jobs, "
                                       "correctness-only servers) + "
                                       if once else "") + f"{per_round / 60:.1f} min a round, as this run spent them"
                      + (f" ({estimated} stretch(es) with no recorded end counted to their last job)" if estimated else ""))
    elif running is None:
        console.print("wall time: n/a: a stretch of this run has no recorded end (a machine lost or a run killed) "
                      "and no job record, so its running time is unknown")
    for arm in others if run_.blocks > 1 else []:
        if (spread := set_spread(run_, arm, spec)) is not None:
            console.print(set_spread_line(arm, spread, run_.blocks))
    return 0


def set_spread_line(arm: str, spread: OneWay, blocks: int) -> str:
    """What a together: all run's rounds say about where its noise is (``analysis.set_spread``)."""
    head = f"{arm}: {fmt_set_spread(spread)}. "
    if spread.p < 0.05:
        return head + ("The rounds carry offsets of their own (a server start's): only more rounds narrow the "
                       "test; more blocks a round do not.")
    return head + (f"No sign of a round's own part: the rounds spread as their {blocks} blocks predict, so more blocks a "
                   "round narrow a round's score too; more rounds do that and add degrees of freedom (the round stays the "
                   "test's unit).")
