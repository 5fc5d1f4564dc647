"""Drive a matrix: plan -> prepare arms -> sessions of jobs on servers -> stored raw results -> report.

Nothing measured is ever lost: each job's raw output and record are written atomically as soon as it ends;
a failed job is recorded with its error and the server log tail; a dead server is restarted (bounded) and
the session goes on; Ctrl-C / SIGTERM stop the servers, mark the manifest interrupted and keep every file;
`suite run --resume RUN_DIR` re-runs only the jobs whose record is missing, failed or planned differently.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from suite import REPO_ROOT
from suite.calibrate import estimate_here
from suite.errors import SuiteError
from suite.fixtures.gemma4 import ensure_model
from suite.matrix import Matrix
from suite.matrix_load import gate_shape_problems, load_matrix, missing_model_paths, nothing_to_compare
from suite.plan import KINDS, Job, Plan, Session, build_plan, each_round, format_plan
from suite.proc import signals_as_interrupt
from suite.quality.software import beyond_patch, compare_software, named
from suite.records import (
    ArmRecord,
    ArmSoftware,
    JobCounts,
    LookRecord,
    PlanRecord,
    Stretch,
    WeightsRecord,
    new_manifest,
)
from suite.runtime.base import ArmEnv, ArmPreparer
from suite.runtime.docker.runtime import DockerRuntime
from suite.runtime.identity import this_machine
from suite.runtime.local import LocalRuntime
from suite.runtime.preflight import enforce, matrix_checks
from suite.runtime.scheduler import Batch, Scheduler
from suite.runtime.slurm.driver import SlurmScheduler
from suite.runtime.slurm.runtime import SlurmRuntime
from suite.runtime.software import collect_software
from suite.sequential import SequentialRun, aa_arm, session_round
from suite.server_address import PORT
from suite.sessions import HereScheduler, RunContext, precompile, server_argv_tail
from suite.stages.base import trusts_remote_code
from suite.stages.serve.run import serve_command
from suite.store import RunStore, redact_env, secret_values

RUNTIMES: dict[str, type] = {"local": LocalRuntime, "docker": DockerRuntime, "slurm": SlurmRuntime}


def make_runtime(matrix: Matrix, cache_root: Path) -> ArmPreparer:
    try:
        return RUNTIMES[matrix.runtime.kind](matrix, cache_root)
    except KeyError:
        raise SuiteError(f"unknown runtime {matrix.runtime.kind!r}") from None


# ---------------------------------------------------------------------------------------- the run


def check_resume_host(store: RunStore, matrix: Matrix, allow: bool, console: Console) -> None:
    """A resume on another machine than the run's first stretch is refused unless ``allow``
    (`--allow-other-host`): its rounds would carry the two machines' difference. The Slurm runtime's sessions run
    on the nodes Slurm gives them (each record names its node): not checked here. A run whose first stretch
    recorded no identity (older runs) cannot be checked."""
    if matrix.runtime.kind == "slurm":
        return
    first = next((st.where for st in store.manifest().stretches if st.where is not None), None)
    if first is None:
        return
    here = this_machine()
    if here.key == first.key:
        return
    differs = "; ".join(f"{what} {a!r} there, {b!r} here" for what, a, b in (
        ("host name", first.hostname, here.hostname), ("machine id", first.machine_id, here.machine_id),
        ("accelerators", first.accelerators(), here.accelerators())) if a != b)
    said = f"{store.root} began on another machine ({differs})"
    if not allow:
        raise SuiteError(f"{said}: resuming here would put two machines' speeds into one run. Resume on the machine "
                         "it began on, or pass --allow-other-host: then a round whose arms ran on different "
                         "machines is not paired, the test takes the machine out, and every card names both.")
    console.print(f"[yellow]{said}; --allow-other-host: rounds whose arms ran on different machines will not be "
                  "paired, and the report names both machines[/yellow]", highlight=False)


def prepare(matrix_path: Path, out_base: Path, resume: Path | None, console: Console,
            allow_other_host: bool = False, no_compare: bool = False) -> RunContext:
    matrix = load_matrix(matrix_path)
    plan = build_plan(matrix)
    if resume is not None:  # before anything is built, prepared or started
        check_resume_host(RunStore.open(resume), matrix, allow_other_host, console)
    elif not no_compare and (alone := nothing_to_compare(matrix, matrix_path)) is not None:
        raise SuiteError(alone)
    # a generated dummy-weight model (model.generate) is written before anything reads or mounts its directory
    for model in matrix.models_by_arm().values():
        ensure_model(model, log=lambda msg: console.print(msg, markup=False, highlight=False))
    if missing := missing_model_paths(matrix) or gate_shape_problems(matrix):  # before any image or server
        raise SuiteError(f"{matrix_path}: " + "; ".join(missing))
    runtime = make_runtime(matrix, REPO_ROOT / ".cache")
    runtime.preflight()  # before any arm is prepared or any run directory is made
    # before any pull, build or download: the driver against the image, the GPUs in containers, disk, model access
    enforce(matrix_checks(matrix, runtime.client if isinstance(runtime, DockerRuntime) else None),
            say=lambda text: console.print(f"[yellow]{text}[/yellow]", highlight=False))
    # every arm is prepared (patches applied strictly) before any server starts
    arm_envs = {arm: runtime.prepare_arm(arm, spec) for arm, spec in plan.arms.items()}
    if resume is not None:
        store = RunStore.open(resume)
        old = store.manifest().matrix.name
        if old != matrix.name:
            raise SuiteError(f"{resume} holds matrix {old!r}, not {matrix.name!r}")
    else:
        store = RunStore.create(out_base, matrix.name)
        dump = matrix.model_dump(mode="json")
        dump["env"] = redact_env(dump["env"])
        for arm in dump["arms"].values():
            arm["env"] = redact_env(arm["env"])
        guess = estimate_here(matrix, plan, out_base)
        store.write_manifest(new_manifest(str(matrix_path), dump, PlanRecord.of(plan))
                             .model_copy(update={"estimate_s": round(guess.total_s)}))
        console.print(guess.lines()[0], markup=False, highlight=False)
    software = arm_software(runtime, arm_envs, plan, store, console)
    served = matrix.model_of(matrix.arms[matrix.baseline_arm])  # the weights line: the baseline's model
    store.update_manifest(
        runtime=matrix.runtime.kind,
        weights=WeightsRecord(load_format=served.load_format, generate=served.generate,
                              model_args=served.model_args(), note=served.weights_note()),
        arms={a: ArmRecord(vllm_version=e.vllm_version, image=e.image, patches=e.patches,
                           **({"model": m.id} if (m := plan.arms[a].model) is not None else {}),
                           env=redact_env({**matrix.env, **plan.arms[a].env}), software=software[a],
                           **runtime.arm_info(a).fields())
              for a, e in arm_envs.items()},
    )
    return RunContext(matrix=matrix, plan=plan, store=store, runtime=runtime, arm_envs=arm_envs,
                      console=console, secrets=secret_values())


def arm_software(runtime: ArmPreparer, arm_envs: dict[str, ArmEnv], plan: Plan, store: RunStore,
                 console: Console) -> dict[str, ArmSoftware]:
    """Each arm's software, read in its own environment once per run (a resumed run keeps what its start
    recorded), and a line per arm saying whether it differs from the baseline only by its patch."""
    recorded = {a: r.software for a, r in store.manifest().arms.items() if r.software is not None}
    out = {a: recorded.get(a) or collect_software(runtime, env, plan.arms[a], store) for a, env in arm_envs.items()}
    base = out.get(plan.baseline)
    for arm, sw in out.items():
        if arm == plan.baseline:
            continue
        d = compare_software(arm, plan.baseline, sw, base, store.vllm_files(arm), store.vllm_files(plan.baseline))
        if d.missing is not None:
            said = f"not compared with the baseline's: {d.missing}"
        elif d.beyond_patch:
            said = "differs from the baseline's beyond the patch: " + "; ".join(beyond_patch(d))
        else:
            said = f"differs from the baseline's only in {named(d.patched)}" if d.patched else "identical to the baseline's"
        console.print(f"arm {arm}: software {said}", style="yellow" if d.missing or d.beyond_patch else None,
                      markup=False, highlight=False)
    return out


def job_counts(ctx: RunContext) -> JobCounts:
    return ctx.store.job_counts(ctx.plan)


def make_scheduler(matrix: Matrix) -> Scheduler:
    if matrix.runtime.kind == "slurm":
        return SlurmScheduler(matrix)
    return HereScheduler()


def batches(todo: Batch, by_round: bool, plan: Plan | None = None) -> list[Batch]:
    """The runner's units of work for the scheduler: every session at once, or (a run that stops at looks)
    one round at a time, cut where the plan's round changes (offline sessions form batches of their own); with
    GPU groups one wave at a time (the rounds that run at once)."""
    if not by_round:
        return [todo] if todo else []

    def unit(session: Session) -> int | None:
        rnd = session_round(session)
        return plan.wave_of(rnd) if plan is not None and rnd is not None else rnd

    out: list[Batch] = []
    for item in todo:
        if out and unit(out[-1][-1][0]) == unit(item[0]):
            out[-1].append(item)
        else:
            out.append([item])
    return out


def _job_line(ctx: RunContext, job: Job, done: int, total: int) -> str:
    rec = ctx.store.record(job)
    if rec is None:
        return f"[{done}/{total}] {job.arm} {job.key} ?"
    secs = f" {rec.seconds:.1f} s" if rec.seconds is not None else ""
    error = f": {rec.first_error_line()}" if not rec.ok and rec.error else ""
    return f"[{done}/{total}] {job.arm} {job.key} {rec.status}{secs}{error}"


class _Progress:
    """The run's progress: a bar on a terminal, one line per finished job elsewhere (CI logs, `make demo >
    log`); every finished job also updates the manifest's counts, so a kill -9 leaves them current."""

    def __init__(self, ctx: RunContext, seq: SequentialRun | None, total: int):
        self.ctx, self.seq, self.total, self.done = ctx, seq, total, 0
        self.lines = not ctx.console.is_terminal
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=ctx.console, transient=False, disable=self.lines)
        self.task = self.bar.add_task(ctx.matrix.name, total=total)

    def job_done(self, job: Job | None = None) -> None:
        self.done += 1
        self.bar.advance(self.task)
        if self.lines and job is not None:
            self.ctx.console.print(_job_line(self.ctx, job, self.done, self.total), markup=False, highlight=False)
        self.ctx.store.update_manifest(job_counts=counts_of(self.ctx, self.seq))

    def now(self, what: str) -> None:
        self.bar.update(self.task, description=f"{self.ctx.matrix.name}: {what}")

    def skip(self, n: int) -> None:
        self.bar.advance(self.task, n)


def look_line(look: LookRecord, seq: SequentialRun) -> str:
    """What the runner prints at a look: each candidate's word so far, the A/A control's (a false alarm is two
    identical arms called different; anything else is none), and why the run stops there, if it does."""
    alarm = look.control in ("REGRESSION", "IMPROVEMENT", "MIXED")
    stopped = ("" if seq.control_after is None or seq.control_after >= look.rounds
               else f", decided after {seq.control_after} {seq.unit}")
    own = (f"; its own test decided: its sessions of later {seq.unit} are not run"
           if seq.control_after == look.rounds and (seq.stop_after is None or seq.stop_after > look.rounds) else "")
    words = ", ".join(f"{c} {o}" for c, o in look.outcomes.items()) + (
        f"; A/A control: {'FALSE ALARM' if alarm else 'no false alarm'} ({look.control}{stopped}){own}"
        if look.control else "")
    return f"look after {look.rounds} {seq.unit}: {words}" + (f"; stopping: {seq.why}" if seq.stop_after is not None else "")


def one_time_seconds(ctx: RunContext, batch: Batch) -> float:
    """Seconds the batch's jobs that no later round repeats took (correctness and probe jobs: every placement
    but each-round), from their records."""
    return sum(rec.seconds or 0.0 for _, jobs in batch for job in jobs
               if not each_round(job.kind) and (rec := ctx.store.record(job)) is not None)


def _take_look(ctx: RunContext, seq: SequentialRun, rnd: int, rounds_started: int, one_time_s: float) -> None:
    look = seq.after_round(ctx.store.root, rnd + 1, rounds_started, one_time_s, per_batch=ctx.plan.design.sets_at_once)
    if look is not None:
        ctx.console.print(look_line(look, seq), markup=False, highlight=False, soft_wrap=True)
        ctx.store.update_manifest(sequential=seq.record())
    elif seq.stop_after == rnd + 1:  # stopped between looks (the budget)
        ctx.console.print(f"stopping after {rnd + 1} {seq.unit}: {seq.why}", markup=False,
                          highlight=False, soft_wrap=True)
        ctx.store.update_manifest(sequential=seq.record())


def execute(ctx: RunContext, scheduler: Scheduler | None = None) -> JobCounts:
    """Run every pending job, batch by batch on the scheduler (here, or Slurm batch jobs); a `repeats: auto`
    run takes its look after each round and leaves the rounds it no longer needs unrun."""
    scheduler = scheduler or make_scheduler(ctx.matrix)
    todo = [(s, [j for j in s.jobs if not ctx.store.is_done(j)]) for s in ctx.plan.sessions]
    seq = None
    if ctx.matrix.sequential:
        assert ctx.matrix.verdict is not None
        budget = ctx.matrix.budget_min * 60 if ctx.matrix.budget_min else None
        seq = SequentialRun.resume(ctx.matrix.verdict, budget, ctx.store.manifest().sequential,
                                   control_arm=aa_arm(ctx.plan),
                                   unit=ctx.plan.design.units)
        todo = [(s, p) for s, p in todo if seq.needed_session(s)]
    total = sum(len(p) for _, p in todo)
    skipped = len(ctx.plan.jobs) - total
    if skipped:
        ctx.console.print(f"resume: {skipped} jobs already done, {total} to run")
    # the manifest tells what is incomplete at any moment, even after a kill -9: counts kept per job
    ctx.store.begin_stretch(Stretch.begin(total, where=this_machine()), status="running", job_counts=counts_of(ctx, seq),
                            scheduler=scheduler.kind)
    status = "complete"
    try:
        progress = _Progress(ctx, seq, total)
        with signals_as_interrupt(), progress.bar:
            if ctx.plan.design.precompile:
                precompile(ctx, todo)
            rounds_started, once_s = 0, 0.0
            for batch in batches(todo, by_round=seq is not None, plan=ctx.plan):
                rnd = session_round(batch[-1][0])
                if seq is not None and not seq.needed(rnd):
                    progress.skip(sum(len(p) for _, p in batch))
                    continue
                if seq is not None:  # the A/A control decided at an earlier look: its sessions here are not run
                    kept = [(s, p) for s, p in batch if seq.needed_session(s)]
                    progress.skip(sum(len(p) for s, p in batch if not seq.needed_session(s)))
                    batch = kept
                began = time.monotonic()
                scheduler.run(ctx, batch, progress)
                if seq is not None and rnd is None:  # sessions of no round (a correctness-only arm's): run once
                    once_s += time.monotonic() - began
                elif seq is not None:
                    rounds_started += len({r for s, _ in batch if (r := session_round(s)) is not None})
                    _take_look(ctx, seq, rnd, rounds_started, once_s + one_time_seconds(ctx, batch))
                    once_s = 0.0
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    except BaseException:
        status = "failed"
        raise
    finally:
        ctx.close_scopes()
        counts = counts_of(ctx, seq)
        if status == "complete" and not counts.all_ok:
            status = "incomplete"
        extra = {"sequential": seq.record()} if seq is not None else {}
        ctx.store.end_stretch(status=status, job_counts=counts, **extra)
    return counts


def counts_of(ctx: RunContext, seq: SequentialRun | None) -> JobCounts:
    """Job counts over the jobs the run needs: a sequential run that stopped early does not miss the rest."""
    if seq is None or (seq.stop_after is None and seq.control_after is None):
        return job_counts(ctx)
    needed = [s for s in ctx.plan.sessions if seq.needed_session(s)]
    return ctx.store.job_counts(ctx.plan.model_copy(update={"sessions": needed}))


def dry_run(matrix_path: Path, runs_dir: Path = Path("runs")) -> str:
    """The plan, its estimate (priced by this machine's runs under ``runs_dir`` when there is one), then the exact
    server and client command lines (port and paths shown as placeholders)."""
    matrix = load_matrix(matrix_path)
    plan = build_plan(matrix)
    lines = [*(f"warning: {m}" for m in missing_model_paths(matrix)), format_plan(plan), "",
             *estimate_here(matrix, plan, runs_dir).lines(), "",
             f"commands (runtime {matrix.runtime.kind}; PORT is picked at start):"]
    runtime = make_runtime(matrix, REPO_ROOT / ".cache")  # no preflight and no arm prepared: nothing starts
    for arm, spec in plan.arms.items():
        # shell-quoted (a user copies these lines): only the runtime's placeholders are not shell words
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in redact_env({**matrix.env, **spec.env}).items())
        offline = any(j.arm == arm and KINDS[j.kind].placement == "offline" for j in plan.jobs)
        place = runtime.placement(arm, spec, offline)
        tail = server_argv_tail(matrix, arm, plan, 0)
        tail[tail.index(PORT) + 1] = "PORT"
        words = [w for w in (env, place.server, "vllm serve", shlex.join(tail)) if w]
        lines.append(f"  [{arm}] server: {' '.join(words)}")
        lines.extend(f"  [{arm}] {label}: {text}" for label, text in place.lines)
    seen = set()
    for job in plan.jobs:
        spec = plan.arms[job.arm]
        model = matrix.model_of(spec)
        if job.kind != "serve" or (job.point, model.id) in seen:
            continue
        seen.add((job.point, model.id))
        cmd = serve_command(vllm="vllm", base_url=f"http://{matrix.address_of(spec).host}:PORT",
                            served_name=model.served_name,
                            tokenizer=model.tokenizer, params=job.params,
                            result_dir=Path("<run>/<arm>/serve") / job.point, result_filename="rep-<r>.json",
                            trust_remote_code=trusts_remote_code([*matrix.serve_args, *spec.serve_args]))
        whose = f", {job.arm}'s model" if spec.model is not None else ""
        lines.append(f"  [{job.point}{whose}] client: {shlex.join(cmd)}")
    return "\n".join(lines)
