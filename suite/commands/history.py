from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from suite.history import RunRow, VerdictRow

from rich.console import Console
from rich.table import Table
from rich.text import Text

NAME = "history"
HELP = "List indexed runs with their verdicts (SQLite index beside the runs; --scan/--index fill it)."

STYLE = {"REGRESSION": "bold red", "IMPROVEMENT": "bold green", "EQUIVALENT": "bold blue", "MIXED": "bold dark_orange",
         "INCONCLUSIVE": "yellow", "NO DATA": "dim"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--matrix", metavar="NAME", help="only runs of this matrix")
    p.add_argument("--runs", type=Path, default=Path("runs"), help="runs directory (default: runs/)")
    p.add_argument("--db", type=Path, help="index file (default: RUNS/history.sqlite or $SUITE_HISTORY_DB)")
    p.add_argument("--scan", action="store_true", help="(re)index every run directory under --runs first")
    p.add_argument("--index", type=Path, action="append", default=[], metavar="RUN_DIR",
                   help="(re)index this run directory first (repeatable)")
    p.add_argument("--limit", type=int, default=50, help="show at most this many runs (default 50)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--markdown", action="store_true",
                     help="print a Markdown table instead (one row per run, newest first, one verdict column per "
                          "candidate: a CI job summary's tonight beside the previous nights)")
    out.add_argument("--json", action="store_true", help="print the runs as JSON instead (newest first)")


def run(args: argparse.Namespace) -> int:
    from suite.history import default_db, index_run, list_runs, scan

    db = args.db or default_db(args.runs)
    console = Console(stderr=args.markdown or args.json)  # the notes; stdout carries the table or JSON alone
    if args.scan:
        rows = scan(args.runs, db)
        console.print(f"indexed {len(rows)} run(s) from {args.runs} into {db}")
    for run_dir in args.index:
        row = index_run(run_dir, db)
        console.print(f"indexed {row.run_id} into {db}")
    rows = list_runs(db, args.matrix, args.limit)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2, default=lambda o: o.model_dump(mode="json")))
        return 0
    if args.markdown:
        print(markdown(rows))
        return 0
    if not rows:
        console.print(f"no runs indexed in {db}" + (f" for matrix {args.matrix!r}" if args.matrix else "")
                      + " (index with --scan or --index RUN_DIR)")
        return 0
    table = Table(title=f"runs in {db}", show_lines=False)
    for col in ("run", "matrix", "created", "status", "jobs ok/failed/missing", "vLLM", "patches", "verdicts"):
        table.add_column(col, overflow="fold")
    for r in rows:
        versions = sorted({str(v) for v in r.vllm_versions.values()})
        patches = "; ".join(f"{arm}: " + ", ".join(("-" if p.reverse else "") + str(p.name) for p in ps)
                            for arm, ps in r.patches.items() if ps) or "none"
        verdicts = Text("—" if not r.verdicts else "")
        for i, v in enumerate(r.verdicts):
            if i:
                verdicts.append("\n")
            verdicts.append(f"{v.candidate} vs {v.baseline}: {v.overall}", style=STYLE.get(v.overall) or None)
            if v.geomean_tput_pct is not None:
                verdicts.append(f" (tput {v.geomean_tput_pct:+.1f}%)")
            verdicts.append(f" {v.better}▲ {v.worse}▼ {v.not_significant}· {v.unreliable}?")
        table.add_row(r.run_id, r.matrix, (r.created or "?")[:16].replace("T", " "), r.status or "?", f"{r.jobs_ok}/{r.jobs_failed}/{r.jobs_missing}",
                      ", ".join(versions), patches, verdicts)
    console.print(table)
    return 0


def _verdict_md(v: VerdictRow | None) -> str:
    if v is None:
        return "—"
    tput = f", tput {v.geomean_tput_pct:+.1f} %" if v.geomean_tput_pct is not None else ""
    return f"**{v.overall}**{tput} ({v.better}▲ {v.worse}▼ {v.not_significant}· {v.unreliable}?)"


def markdown(rows: list[RunRow]) -> str:
    """Runs as a Markdown table, newest first: when, the run, its vLLM, its status, and per candidate its verdict
    (word, geometric-mean throughput change, cells better / worse / not significant / unreliable), so that the
    newest run's verdicts sit right above the earlier ones, each with the vLLM it ran on."""
    if not rows:
        return "No runs indexed."
    pairs = list(dict.fromkeys((v.candidate, v.baseline) for r in rows for v in r.verdicts))
    head = ["run", "created", "vLLM", "status", *(f"{c} vs {b}" for c, b in pairs)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        by = {(v.candidate, v.baseline): v for v in r.verdicts}
        versions = ", ".join(sorted({str(v) for v in r.vllm_versions.values()})) or "?"
        cells = [f"`{r.run_id}`", (r.created or "?")[:16].replace("T", " "), versions, r.status or "?",
                 *(_verdict_md(by.get(pair)) for pair in pairs)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
