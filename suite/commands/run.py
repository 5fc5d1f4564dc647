from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from suite.errors import SuiteError

NAME = "run"
HELP = "Run a matrix: every arm's server, every point, stored raw results and one report."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("matrix", metavar="MATRIX", type=Path)
    p.add_argument("--out", type=Path, default=Path("runs"), help="base directory for run directories (runs/)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--resume", type=Path, metavar="RUN_DIR", help="run only the jobs missing from RUN_DIR")
    p.add_argument("--allow-other-host", action="store_true",
                   help="--resume on another machine than the run began on (refused without it)")
    p.add_argument("--no-compare", action="store_true",
                   help="run a matrix of one arm (its numbers alone, no verdict); refused without it")
    p.add_argument("--no-report", action="store_true", help="do not write the report at the end")


def say_report(run_dir: Path, console: Console) -> None:
    """Write the run's report and end on the terminal with each candidate's word, where it acted, and the paths
    (the report, and summary.md for a pull request), not the report itself."""
    from suite.report import write_report

    try:
        path, verdicts = write_report(run_dir)
    except SuiteError as exc:
        console.print(f"[red]report not written: {exc}[/red]")
        return
    for line in verdicts:  # each candidate's word and where it acted, the report's first lines
        console.print(line, markup=False, highlight=False)
    console.print(f"report: {path} · for a pull request: {path.with_name('summary.md')}")


def run(args: argparse.Namespace) -> int:
    from suite.runner import dry_run, execute, prepare

    console = Console(stderr=False)
    if args.dry_run:
        print(dry_run(args.matrix, args.out))
        return 0
    ctx = prepare(args.matrix, args.out, args.resume, console, allow_other_host=args.allow_other_host,
                  no_compare=args.no_compare)
    console.print(f"run directory: {ctx.store.root}")
    try:
        counts = execute(ctx)
    finally:
        if not args.no_report:
            say_report(ctx.store.root, console)
        from suite.history import index_run

        try:
            index_run(ctx.store.root)
        except SuiteError as exc:
            console.print(f"[yellow]run not added to the history index: {exc}[/yellow]")
    console.print(counts.line())
    return 0 if counts.all_ok else 1
