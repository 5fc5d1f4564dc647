"""`suite build MATRIX [--dry-run]`: build (or find) each arm's content-tagged vLLM image for the docker runtime."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

NAME = "build"
HELP = "Build each arm's vLLM image (vendor Dockerfile + patch sets) for the docker runtime; --dry-run prints it."

DRY_RUN_PORT = 8000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("matrix", metavar="MATRIX", type=Path)
    p.add_argument("--dry-run", action="store_true",
                   help="print per arm: image tag, base, patches, the docker build and docker run commands")
    p.add_argument("--keep-context", action="store_true",
                   help="keep the assembled build context under .cache/docker/context (the printed "
                        "`docker build` command can then be re-run by hand)")
    p.add_argument("--cache-root", type=Path, default=None, help="where contexts and build logs go (.cache)")


def run(args: argparse.Namespace) -> int:
    from suite import REPO_ROOT
    from suite.errors import SuiteError
    from suite.matrix_load import load_matrix
    from suite.runtime.docker.bases import host_driver
    from suite.runtime.docker.image_build import build_image, docker_client, resolve_digest
    from suite.runtime.docker.images import plans_for
    from suite.runtime.preflight import enforce, matrix_checks

    console = Console()
    matrix = load_matrix(args.matrix)
    if matrix.runtime.kind != "docker" and not args.dry_run:
        console.print(f"[yellow]note: {args.matrix} has runtime {matrix.runtime.kind!r}; building its arms' "
                      "images for the docker runtime anyway[/yellow]")
    cache_root = args.cache_root or REPO_ROOT / ".cache"
    client = docker_client(required=not args.dry_run)
    plans = plans_for(matrix, lambda ref: resolve_digest(client, ref), driver=host_driver(matrix))
    checks = matrix_checks(matrix, client, serving=False, plans=plans)  # before any pull: base, disk, model access
    if args.dry_run:
        console.print(dry_run_text(matrix, plans, client, cache_root), markup=False, highlight=False, soft_wrap=True)
        for c in checks:
            console.print(f"preflight: {c.name}: {c.status}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else ""),
                          markup=False, highlight=False, soft_wrap=True)
        return 0
    enforce(checks, say=lambda text: console.print(f"[yellow]{text}[/yellow]", highlight=False))
    unique = {}
    for plan in plans.values():
        unique.setdefault(plan.identity, plan)
    results = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[detail]}", style="dim"), console=console) as progress:
        for identity, plan in unique.items():
            arms = ", ".join(a for a, p in plans.items() if p.identity == identity)
            task = progress.add_task(f"{plan.tag} ({arms})", total=None, detail="")

            def on_event(event, task=task):
                if event.kind == "step":
                    progress.update(task, total=event.total, completed=event.step - 1,
                                    detail=event.text[:70])
                elif event.kind in ("pull", "base", "log", "wait"):
                    progress.update(task, detail=event.text.strip()[:70])
                elif event.kind in ("done", "cached"):
                    progress.update(task, total=1, completed=1, detail=event.text)

            try:
                results[identity] = build_image(client, plan, cache_root, on_event, keep_context=args.keep_context)
            except SuiteError:
                progress.update(task, detail="failed")
                raise
    for arm, plan in plans.items():
        r = results[plan.identity]
        state = f"built in {r.seconds:.0f} s" if r.built else "exists (not rebuilt)"
        console.print(f"arm {arm}: {r.tag}  {r.image_id[:19]}  {r.size / 2**30:.2f} GiB  {state}",
                      highlight=False)
    for arm, spec in matrix.arms.items():
        if spec.image:
            console.print(f"arm {arm}: uses image {spec.image} as given (not built)", highlight=False)
    return 0


def dry_run_text(matrix, plans, client, cache_root: Path) -> str:
    from suite.plan import build_plan
    from suite.runtime.base import ArmEnv
    from suite.runtime.docker import image_vendor
    from suite.runtime.docker.containers import container_config
    from suite.runtime.docker.image_build import existing_image
    from suite.runtime.docker.runtime import DockerRuntime
    from suite.sessions import server_argv_tail
    from suite.store import ArmDirs

    plan_all = build_plan(matrix)
    run_dir = Path("runs").resolve() / f"RUN-ID-{matrix.name}"
    runtime = DockerRuntime(matrix, cache_root)
    lines = [f"build plan for {matrix.name}: vendor {image_vendor(matrix)}, {len(matrix.arms)} arms, "
             f"{len({p.identity for p in plans.values()})} images"]
    if client is None:
        lines.append("(no Docker engine reachable: base digests unresolved, tags provisional)")
    for arm, spec in matrix.arms.items():
        lines.append("")
        lines.append(f"arm {arm}: vLLM {spec.vllm}")
        plan = plans.get(arm)
        if plan is None:
            image = spec.image
            lines.append(f"  image:   {image} (given; not built)")
        else:
            image = plan.tag
            status = "exists, not rebuilt" if client is not None and plan.resolved and existing_image(
                client, plan) is not None else "would be built"
            note = "" if plan.resolved else "  (provisional: the base digest is resolved when it is pulled)"
            lines.append(f"  image:   {plan.tag}  [{status}]{note}")
            lines.append(f"  base:    {plan.base_image} @ {plan.base_digest or 'unresolved'}")
            lines.append("  patches: " + (", ".join(f"{'-' if r else ''}{n} (sha256 {s[:16]})"
                                                    for n, r, s in plan.patches) or "none"))
            context = plan.context_dir(cache_root)
            lines.append(f"  build:   {shlex.join(plan.build_command(context))}")
            lines.append("           (context: assembled by `suite build`; --keep-context keeps it)")
        env = ArmEnv(arm=arm, vllm_version=spec.vllm, image=image)
        port = matrix.address_of(spec).port or DRY_RUN_PORT
        cfg = container_config(matrix, env, argv_tail=server_argv_tail(matrix, arm, plan_all, port),
                               extra_env={**matrix.env, **spec.env}, dirs=ArmDirs.in_run(run_dir, arm), port=port)
        lines.append(f"  run:     {cfg.cli()}")
        lines.append(f"  clients: {runtime.describe_client(arm, run_dir=run_dir)}")
        lines.append(f"  tools:   {runtime.describe_tool(arm, image or '', run_dir=run_dir)}")
    if not all(matrix.address_of(spec).fixed for spec in matrix.arms.values()):
        lines.append("")
        lines.append(f"(port {DRY_RUN_PORT} shown: `suite run` picks a free one; RUN-ID is the run directory)")
    return "\n".join(lines)
