from __future__ import annotations

import argparse

from rich.console import Console

from suite.errors import MatrixError
from suite.matrix import describe_sources, load_matrix, missing_model_paths, nothing_to_compare

NAME = "validate"
HELP = "Validate matrix files; errors are reported as file:line: field: message."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("matrices", nargs="+", metavar="MATRIX")


def run(args: argparse.Namespace) -> int:
    console = Console()
    errors = []
    for path in args.matrices:
        try:
            m = load_matrix(path)
        except MatrixError as exc:
            errors.append(str(exc))
            continue
        if (alone := nothing_to_compare(m, path)) is not None:
            errors.append(alone)
            continue
        console.print(f"[green]ok[/green] {path}: {m.name} ({len(m.arms)} arms, {len(m.serve)} serve blocks)")
        for line in describe_sources(m):
            console.print(f"  {line}", markup=False, highlight=False)
        for line in missing_model_paths(m):
            console.print(f"  [yellow]warning[/yellow]: {line}", highlight=False)
    if errors:
        raise MatrixError("\n".join(errors))
    return 0
