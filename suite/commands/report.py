"""`suite report RUN_DIR`: recompute the run's report (report.md and report.html; summary.md, results.json and
results.csv) from its raw files."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

NAME = "report"
HELP = "Regenerate a run directory's report (report.md, report.html, summary.md, results.json, results.csv) from its raw files."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", type=Path)
    p.add_argument("--print", action="store_true", dest="show", help="print the report")


def run(args: argparse.Namespace) -> int:
    from suite.report import write_report

    path, verdicts = write_report(args.run_dir)
    console = Console()
    if args.show:
        print(path.read_text())
    for line in verdicts:  # each candidate's word and where it acted
        console.print(line, markup=False, highlight=False)
    console.print(f"report: {path} · {path.with_name('report.html')} · for a pull request: {path.with_name('summary.md')}")
    return 0
