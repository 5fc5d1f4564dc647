from __future__ import annotations

import argparse

from rich.console import Console

from suite.calibrate import estimate_here
from suite.errors import MatrixError
from suite.matrix_load import (
    describe_sources,
    gate_shape_problems,
    line_of,
    load_matrix,
    missing_model_paths,
    nothing_to_compare,
)
from suite.plan import build_plan

NAME = "validate"
HELP = "Validate matrix files; errors are reported as file:line: field: message."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("matrices", nargs="+", metavar="MATRIX")
    p.add_argument("--no-patch-check", action="store_true",
                   help="do not apply each arm's patch sets (dry) to its vLLM's files (fetched once when not installed)")


def patch_problems(m, path: str, console: Console) -> list[str]:
    """Each arm's patch sets and diffs applied (dry, strictly) to its vLLM release's own files: the installed vLLM
    when it is that release, else its wheel's Python files (``suite.patches.vllm_source_tree``: pip-downloaded once
    into .cache/vllm-src), so a diff that would fail after a long image pull fails here, naming its hunk. An arm
    whose vLLM comes from a wheel or git ref is checked when its image is built; a release that cannot be had here
    (no index) is a warning."""
    from suite.errors import PatchError
    from suite.patches import check_patch_sets, vllm_source_tree

    problems, trees = [], {}
    for name, arm in m.arms.items():
        if not arm.patches or arm.vllm_from is not None:
            continue
        try:
            if arm.vllm not in trees:
                trees[arm.vllm] = vllm_source_tree(arm.vllm, log=lambda msg: console.print(f"  {msg}", highlight=False))
            check_patch_sets(arm.patches, trees[arm.vllm], arm.vllm)
        except PatchError as exc:
            if arm.vllm in trees:
                problems.append(f"{path}:{line_of(path, ('arms', name, 'patches'))}: arms.{name}.patches: {exc}")
            else:
                console.print(f"  [yellow]warning[/yellow]: arms.{name}.patches not checked against vLLM {arm.vllm}: "
                              f"{exc}", highlight=False)
    return problems


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
        if not args.no_patch_check and (problems := patch_problems(m, path, console)):
            errors.extend(problems)
            continue
        console.print(f"[green]ok[/green] {path}: {m.name} ({len(m.arms)} arms, {len(m.serve)} serve blocks)")
        for line in estimate_here(m, build_plan(m)).brief():
            console.print("  " + line, markup=False, highlight=False)
        for line in describe_sources(m):
            console.print(f"  {line}", markup=False, highlight=False)
        for line in missing_model_paths(m) + gate_shape_problems(m):
            console.print(f"  [yellow]warning[/yellow]: {line}", highlight=False)
    if errors:
        raise MatrixError("\n".join(errors))
    return 0
