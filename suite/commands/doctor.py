from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

NAME = "doctor"
HELP = "Check this machine: vLLM, Docker engine, GPUs, disk, ports, memory (exit 1 if a required check fails)."

STYLE = {"ok": "[green]ok[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[red]FAIL[/red]"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("matrix", nargs="?", type=Path, metavar="MATRIX",
                   help="also check this matrix against the machine, as `suite run` and `suite build` do before any "
                        "pull: the driver against the image's CUDA, GPUs in containers, disk for the images and the "
                        "model, access to the model on the hub (a docker matrix implies --docker, a GPU one --gpu)")
    p.add_argument("--out", type=Path, default=Path("runs"), help="runs directory whose free disk to check")
    p.add_argument("--cache", type=Path, action="append", default=None, metavar="DIR",
                   help="cache directory to check (repeatable; default: .cache and the Hugging Face cache)")
    p.add_argument("--port", type=int, default=0,
                   help="a fixed port to check, the --port of serve_args (default: any free port)")
    p.add_argument("--host", default="127.0.0.1", help="the host to bind, the --host of serve_args (default: "
                   "127.0.0.1)")
    p.add_argument("--docker", action="store_true", help="the Docker engine is required (runtime: docker)")
    p.add_argument("--gpu", action="store_true", help="a GPU is required")
    p.add_argument("--only", default="", metavar="GROUPS",
                   help="comma list of checks to run: vllm, docker, gpu, disk, port, memory (default: all)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")


def run(args: argparse.Namespace) -> int:
    from suite import REPO_ROOT
    from suite.doctor import GROUPS, Check, Options, as_json, default_cache_dirs, run_checks
    from suite.errors import SuiteError
    from suite.matrix_load import load_matrix
    from suite.runtime.docker import image_vendor
    from suite.runtime.docker.image_build import docker_client
    from suite.runtime.preflight import matrix_checks

    only = frozenset(g.strip() for g in args.only.split(",") if g.strip())
    if only - set(GROUPS):
        raise SuiteError(f"--only: unknown check(s) {', '.join(sorted(only - set(GROUPS)))}; "
                         f"choose from {', '.join(GROUPS)}")
    matrix = load_matrix(args.matrix) if args.matrix is not None else None
    docker = matrix is not None and matrix.runtime.kind == "docker"
    gpu = docker and matrix is not None and image_vendor(matrix) != "cpu"
    if docker and not gpu and not args.gpu and not only:  # the CPU image's containers need no GPU to check
        only = frozenset(GROUPS) - {"gpu"}
    opts = Options(runs_dir=args.out, cache_dirs=tuple(args.cache or default_cache_dirs(REPO_ROOT)),
                   port=args.port, host=args.host, need_docker=args.docker or docker, need_gpu=args.gpu or gpu,
                   only=only)
    checks = run_checks(opts)
    if matrix is not None:
        client = docker_client(required=False) if docker else None
        checks += [Check(f"{matrix.name}: {c.name}", c.status, c.detail, c.fix)
                   for c in matrix_checks(matrix, client)]
    failed = [c for c in checks if c.failed]
    if args.json:
        print(as_json(checks))
        return 1 if failed else 0
    table = Table(title="suite doctor", show_lines=False)
    for col in ("Check", "Status", "Found", "What to do"):
        table.add_column(col, overflow="fold")
    for c in checks:
        name = c.name if c.required else f"{c.name} [dim](optional)[/dim]"
        table.add_row(name, STYLE[c.status], c.detail, c.hint)
    console = Console()
    console.print(table)
    if failed:
        console.print(f"[red]{len(failed)} required check(s) failed:[/red] {', '.join(c.name for c in failed)}")
        return 1
    warns = [c.name for c in checks if c.status != "ok"]
    console.print("[green]ready[/green]" + (f" (warnings: {', '.join(warns)})" if warns else ""))
    return 0
