"""Drive a matrix: plan -> prepare arms -> sessions of jobs on servers -> stored raw results -> report.

Nothing measured is ever lost: each job's raw output and record are written atomically as soon as it ends;
a failed job is recorded with its error and the server log tail; a dead server is restarted (bounded) and
the session goes on; Ctrl-C / SIGTERM stop the servers, mark the manifest interrupted and keep every file;
`suite run --resume RUN_DIR` re-runs only the jobs whose record is missing, failed or planned differently.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from suite import REPO_ROOT
from suite.errors import ServerError, SuiteError
from suite.matrix import Matrix, load_matrix
from suite.plan import Job, Plan, Session, build_plan, format_plan
from suite.runtime.base import ArmEnv, free_port, port_in_use
from suite.store import (
    RunStore,
    atomic_write_json,
    new_manifest,
    redact_env,
    redact_text,
    secret_values,
    utc_now,
)


@dataclass
class RunContext:
    matrix: Matrix
    plan: Plan
    store: RunStore
    runtime: Any
    arm_envs: dict[str, ArmEnv]
    console: Console
    secrets: list[str] = field(default_factory=list)

    @property
    def tokenizer(self) -> str:
        return self.matrix.model.tokenizer or self.matrix.model.id

    def client_env(self) -> dict[str, str]:
        """Environment of client tools (bench, lm-eval): the installed vLLM, never an arm's overlay."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if Path(self.matrix.model.id).is_dir():
            env.setdefault("HF_HUB_OFFLINE", "1")
        tmp = self.store.root / ".tmp"
        tmp.mkdir(exist_ok=True)
        env["TMPDIR"] = str(tmp)
        return env


def make_runtime(matrix: Matrix, cache_root: Path) -> Any:
    kind = matrix.runtime.kind
    if kind == "local":
        from suite.runtime.local import LocalRuntime

        return LocalRuntime(matrix, cache_root)
    if kind == "docker":
        from suite.runtime.docker.runtime import DockerRuntime

        return DockerRuntime(matrix, cache_root)
    if kind == "slurm":
        from suite.runtime.slurm.runtime import SlurmRuntime

        return SlurmRuntime(matrix, cache_root)
    raise SuiteError(f"unknown runtime {kind!r}")


def server_argv_tail(matrix: Matrix, arm: str, plan: Plan, port: int, extra: list[str] | None = None) -> list[str]:
    m = matrix.model
    return [m.id, "--served-model-name", m.name, "--host", matrix.runtime.host, "--port", str(port),
            "--max-model-len", str(m.max_model_len), *matrix.serve_args, *plan.arms[arm].serve_args, *(extra or [])]


# ---------------------------------------------------------------------------------------- job executors


def _serve(ctx: RunContext, job: Job, server: Any) -> dict[str, Any]:
    from suite.runtime.local import vllm_executable
    from suite.stages.serve.run import run_serve, serve_command

    reset = server.reset_prefix_cache()
    result = ctx.store.result_path(job)
    cmd = serve_command(vllm=vllm_executable(), base_url=server.base_url, served_name=ctx.matrix.model.name,
                        tokenizer=ctx.tokenizer, params=job.params, result_dir=result.parent,
                        result_filename=f".{result.name}.partial",
                        metadata={"arm": job.arm, "point": job.point, "repeat": str(job.repeat)})
    run_serve(cmd, result_path=result, log_path=ctx.store.log_path(job), env=ctx.client_env(),
              timeout_s=max(600.0, 10.0 * job.params["num_prompts"] * job.params["osl"] / 8))
    raw = json.loads(result.read_text())
    if not raw.get("completed"):  # the tool exits 0 even when every request failed (e.g. the server died)
        raise SuiteError(f"`vllm bench serve` completed no request ({raw.get('failed')} failed); raw output "
                         f"kept in {result.name}\n  command: {' '.join(cmd)}")
    return {"command": cmd, "prefix_cache_reset": reset}


def _accuracy_spec(ctx: RunContext, job: Job) -> Any:
    from suite.matrix import AccuracySpec

    spec = AccuracySpec.model_validate(job.params)
    if spec.dataset == "synthetic":
        from suite.fixtures.gsm8k import write_synthetic_gsm8k

        data = ctx.store.root / "data" / "gsm8k-synthetic"
        if not (data / "test.jsonl").is_file():
            write_synthetic_gsm8k(data, n_test=spec.limit or 50, seed=spec.seed)
        spec = spec.model_copy(update={"dataset": str(data)})
    return spec


def _accuracy(ctx: RunContext, job: Job, server: Any) -> dict[str, Any]:
    from suite.stages.accuracy.run import run_accuracy

    out = ctx.store.result_path(job)
    run_accuracy(base_url=server.base_url, served_name=ctx.matrix.model.name, tokenizer=ctx.tokenizer,
                 spec=_accuracy_spec(ctx, job), out_dir=out, log_path=ctx.store.log_path(job),
                 env=ctx.client_env())
    return {}


def _equivalence(ctx: RunContext, job: Job, server: Any) -> dict[str, Any]:
    from suite.stages.accuracy.equivalence import run_equivalence

    spec = _accuracy_spec(ctx, job)
    run_equivalence(base_url=server.base_url, served_name=ctx.matrix.model.name,
                    n_prompts=spec.equivalence_prompts, max_tokens=spec.equivalence_max_tokens,
                    out_path=ctx.store.result_path(job), seed=spec.seed)
    return {}


EXECUTORS: dict[str, Callable[[RunContext, Job, Any], dict[str, Any]] | str] = {
    "serve": _serve,
    "accuracy": _accuracy,
    "equivalence": _equivalence,
    # stage modules, imported when a plan has such jobs: "module:function(ctx, job, server) -> record fields"
    "latency": "suite.stages.latency.run:execute",
    "kernel": "suite.stages.kernel.run:execute",
    "profile": "suite.stages.profile.run:execute",
    "probe": "suite.stages.probe.run:execute",
}


def executor_for(kind: str) -> Callable[[RunContext, Job, Any], dict[str, Any]] | None:
    fn = EXECUTORS.get(kind)
    if isinstance(fn, str):
        import importlib

        module, name = fn.split(":")
        fn = getattr(importlib.import_module(module), name)
        EXECUTORS[kind] = fn
    return fn


def register_executor(kind: str, fn: Callable[[RunContext, Job, Any], dict[str, Any]]) -> None:
    EXECUTORS[kind] = fn


# ---------------------------------------------------------------------------------------- sessions


class _Interrupted(Exception):
    pass


@contextlib.contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    """SIGTERM/SIGHUP behave like Ctrl-C, so context managers stop servers on the way out."""

    def handler(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _run_job(ctx: RunContext, job: Job, server: Any) -> bool:
    execute = executor_for(job.kind)
    started = utc_now()
    t0 = time.monotonic()
    if execute is None:
        ctx.store.write_record(job, "failed", started=started, error=f"no executor for job kind {job.kind!r}")
        return False
    try:
        extra = execute(ctx, job, server)
        if server is not None and not server.alive():
            raise ServerError("the server died during the job; its output is kept but not used")
    except SuiteError as exc:
        fields: dict[str, Any] = {"error": str(exc)}
        if server is not None and not server.alive():
            fields["server_died"] = True
            fields["server_log_tail"] = server.log_tail(60)
        ctx.store.write_record(job, "failed", started=started, seconds=round(time.monotonic() - t0, 3), **fields)
        ctx.console.print(f"[red]failed[/red] {job.arm} {job.key}: {str(exc).splitlines()[0]}")
        return False
    ctx.store.write_record(job, "ok", started=started, seconds=round(time.monotonic() - t0, 3), **extra)
    return True


def _pick_port(ctx: RunContext) -> int:
    port = ctx.matrix.runtime.port
    if port == 0:
        return free_port(ctx.matrix.runtime.host)
    if port_in_use(ctx.matrix.runtime.host, port):
        raise ServerError(f"port {port} on {ctx.matrix.runtime.host} is already in use (set runtime.port: 0 "
                          "to pick a free one)")
    return port


def _start_server(ctx: RunContext, session: Session, attempt: int) -> Any:
    port = _pick_port(ctx)
    extra_args: list[str] = []
    if any(j.kind == "profile" for j in session.jobs):
        from suite.stages.profile.run import profiler_args

        extra_args = profiler_args(ctx.store.arm_dir(session.arm) / "profile" / f"session-{session.index}")
    arm_spec = ctx.plan.arms[session.arm]
    extra_env = {**ctx.matrix.env, **arm_spec.env}
    if any(j.kind == "probe" for j in session.jobs):  # the in-server gate probe (suite.stages.probe.run)
        from suite.stages.probe.run import probe_server_env

        extra_env.update(probe_server_env(ctx, session.arm, extra_env))
    spec = ctx.runtime.server_spec(
        ctx.arm_envs[session.arm],
        argv_tail=server_argv_tail(ctx.matrix, session.arm, ctx.plan, port, extra_args),
        extra_env=extra_env, cache_dir=ctx.store.cache_dir(session.arm),
        log_path=ctx.store.server_log(session.arm, session.index, attempt), port=port, redact=ctx.secrets)
    server = ctx.runtime.server(spec)
    started, t0 = utc_now(), time.monotonic()
    server.__enter__()
    atomic_write_json(spec.log_path.with_suffix(".json"), {
        "arm": session.arm, "session": session.index, "attempt": attempt, "started": started,
        "healthy_after_s": round(time.monotonic() - t0, 3), "port": port,
        "argv": [redact_text(a, ctx.secrets) for a in spec.argv]})
    return server


def _error_brief(message: str, tail_lines: int = 5) -> str:
    """The command and the last lines of the log tail of a server error (the full text is in the records)."""
    lines = message.splitlines()
    cmd = [line for line in lines if line.strip().startswith(("command:", "log:"))]
    tail = lines[lines.index("--- log tail ---") + 1:][-tail_lines:] if "--- log tail ---" in lines else []
    return "\n".join(cmd + [f"  | {line}" for line in tail])


def _fail_all(ctx: RunContext, jobs: list[Job], error: str) -> None:
    for job in jobs:
        ctx.store.write_record(job, "failed", error=error)


def run_session(ctx: RunContext, session: Session, pending: list[Job], advance: Callable[[], None]) -> None:
    if not session.needs_server:
        for job in pending:
            _run_job(ctx, job, None)
            advance()
        return
    restarts_left = ctx.matrix.runtime.max_restarts
    attempt = 0
    server = None
    try:
        for i, job in enumerate(pending):
            if server is None or not server.alive():
                if server is not None:
                    server.__exit__(None, None, None)
                    server = None
                    if restarts_left == 0:
                        _fail_all(ctx, pending[i:], "server died and no restarts are left")
                        ctx.console.print(f"[red]arm {session.arm}: server died; no restarts left[/red]")
                        return
                    restarts_left -= 1
                    attempt += 1
                    ctx.console.print(f"[yellow]arm {session.arm}: restarting the server[/yellow]")
                try:
                    server = _start_server(ctx, session, attempt)
                except ServerError as exc:
                    _fail_all(ctx, pending[i:], str(exc))
                    ctx.console.print(f"[red]{str(exc).splitlines()[0]}[/red]")
                    ctx.console.print(_error_brief(str(exc)), markup=False, highlight=False)
                    return
            _run_job(ctx, job, server)
            advance()
    finally:
        if server is not None:
            server.__exit__(None, None, None)


# ---------------------------------------------------------------------------------------- the run


def prepare(matrix_path: Path, out_base: Path, resume: Path | None, console: Console) -> RunContext:
    matrix = load_matrix(matrix_path)
    plan = build_plan(matrix)
    runtime = make_runtime(matrix, REPO_ROOT / ".cache")
    # every arm is prepared (patches applied strictly) before any server starts
    arm_envs = {arm: runtime.prepare_arm(arm, spec) for arm, spec in plan.arms.items()}
    if resume is not None:
        store = RunStore.open(resume)
        old = store.manifest().get("matrix", {})
        if old.get("name") != matrix.name:
            raise SuiteError(f"{resume} holds matrix {old.get('name')!r}, not {matrix.name!r}")
    else:
        store = RunStore.create(out_base, matrix.name)
        dump = matrix.model_dump(mode="json")
        dump["env"] = redact_env(dump["env"])
        for arm in dump["arms"].values():
            arm["env"] = redact_env(arm["env"])
        store.write_manifest(new_manifest(str(matrix_path), dump, {
            "order": plan.order, "baseline": plan.baseline, "arms": list(plan.arms),
            "jobs": [{"key": j.key, "arm": j.arm, "session": j.session, "hash": j.hash} for j in plan.jobs]}))
    store.update_manifest(
        runtime=matrix.runtime.kind,
        arms={a: {"vllm_version": e.vllm_version, "image": e.image, "patches": e.patches,
                  "env": redact_env({**matrix.env, **plan.arms[a].env}),
                  **(runtime.arm_info(a) if hasattr(runtime, "arm_info") else {})} for a, e in arm_envs.items()},
    )
    return RunContext(matrix=matrix, plan=plan, store=store, runtime=runtime, arm_envs=arm_envs,
                      console=console, secrets=secret_values())


def job_counts(ctx: RunContext) -> dict[str, int]:
    counts = {"ok": 0, "failed": 0, "missing": 0}
    for job in ctx.plan.jobs:
        rec = ctx.store.record(job)
        if rec is None or rec.get("hash") != job.hash:
            counts["missing"] += 1
        else:
            counts["ok" if rec.get("status") == "ok" else "failed"] += 1
    return counts


def execute(ctx: RunContext) -> dict[str, int]:
    if ctx.matrix.runtime.kind == "slurm":  # sessions become sbatch jobs; see suite.runtime.slurm.driver
        from suite.runtime.slurm.driver import execute_slurm

        return execute_slurm(ctx)
    todo = [(s, [j for j in s.jobs if not ctx.store.is_done(j)]) for s in ctx.plan.sessions]
    total = sum(len(p) for _, p in todo)
    skipped = len(ctx.plan.jobs) - total
    if skipped:
        ctx.console.print(f"resume: {skipped} jobs already done, {total} to run")
    # the manifest tells what is incomplete at any moment, even after a kill -9: counts kept per job
    ctx.store.update_manifest(status="running", started=utc_now(), job_counts=job_counts(ctx))

    def advance() -> None:
        progress.advance(task)
        ctx.store.update_manifest(job_counts=job_counts(ctx))

    status = "complete"
    try:
        with _signals_as_interrupt(), Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=ctx.console, transient=False,
        ) as progress:
            task = progress.add_task(ctx.matrix.name, total=total)
            for session, pending in todo:
                if not pending:
                    continue
                progress.update(task, description=f"{ctx.matrix.name}: {session.arm}#{session.index}")
                run_session(ctx, session, pending, advance)
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        counts = job_counts(ctx)
        if status == "complete" and (counts["failed"] or counts["missing"]):
            status = "incomplete"
        ctx.store.update_manifest(status=status, finished=utc_now(), job_counts=counts)
    return counts


def dry_run(matrix_path: Path) -> str:
    """The plan, then the exact server and client command lines (port and paths shown as placeholders)."""
    from suite.stages.serve.run import serve_command

    matrix = load_matrix(matrix_path)
    plan = build_plan(matrix)
    lines = [format_plan(plan), "", f"commands (runtime {matrix.runtime.kind}; PORT is picked at start):"]
    for arm, spec in plan.arms.items():
        env = " ".join(f"{k}={v}" for k, v in redact_env({**matrix.env, **spec.env}).items())
        where = ("PYTHONPATH=<overlay with patches>" if spec.patches and matrix.runtime.kind != "docker"
                 else "(in the arm's image: see `suite build --dry-run`)" if matrix.runtime.kind == "docker" else "")
        tail = server_argv_tail(matrix, arm, plan, 0)
        tail[tail.index("--port") + 1] = "PORT"
        words = [w for w in (env, where, "vllm serve", " ".join(tail)) if w]
        lines.append(f"  [{arm}] server: {' '.join(words)}")
    seen = set()
    for job in plan.jobs:
        if job.kind != "serve" or job.point in seen:
            continue
        seen.add(job.point)
        cmd = serve_command(vllm="vllm", base_url=f"http://{matrix.runtime.host}:PORT", served_name=matrix.model.name,
                            tokenizer=matrix.model.tokenizer or matrix.model.id, params=job.params,
                            result_dir=Path("<run>/<arm>/serve") / job.point, result_filename="rep-<r>.json")
        lines.append(f"  [{job.point}] client: {' '.join(cmd)}")
    return "\n".join(lines)
