"""Drive a matrix: plan -> prepare arms -> sessions of jobs on servers -> stored raw results -> report.

Nothing measured is ever lost: each job's raw output and record are written atomically as soon as it ends;
a failed job is recorded with its error and the server log tail; a dead server is restarted (bounded) and
the session goes on; Ctrl-C / SIGTERM stop the servers, mark the manifest interrupted and keep every file;
`suite run --resume RUN_DIR` re-runs only the jobs whose record is missing, failed or planned differently.
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from itertools import groupby
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from suite import REPO_ROOT
from suite.calibrate import estimate_here
from suite.errors import ServerError, SuiteError
from suite.fixtures.gemma4 import ensure_model
from suite.matrix import Matrix
from suite.matrix_load import load_matrix, missing_model_paths, nothing_to_compare
from suite.plan import (
    KINDS,
    Job,
    Plan,
    Session,
    build_plan,
    each_round,
    format_plan,
    round_order,
)
from suite.proc import signals_as_interrupt
from suite.quality.software import beyond_patch, compare_software, named
from suite.records import (
    ArmRecord,
    ArmSoftware,
    DeviceStates,
    JobCounts,
    LookRecord,
    PlanRecord,
    Stretch,
    WeightsRecord,
    new_manifest,
    utc_now,
)
from suite.runtime.base import (
    ArmEnv,
    ArmPreparer,
    Runtime,
    Server,
    free_port,
    port_in_use,
    stop_together,
    wait_healthy,
)
from suite.runtime.docker.runtime import DockerRuntime
from suite.runtime.identity import host_identity, this_machine
from suite.runtime.local import LocalRuntime
from suite.runtime.preflight import enforce, matrix_checks
from suite.runtime.scheduler import Batch, RunProgress, Scheduler
from suite.runtime.slurm.driver import SlurmScheduler
from suite.runtime.slurm.runtime import SlurmRuntime
from suite.runtime.software import collect_software
from suite.sequential import SequentialRun, aa_arm, session_round
from suite.stages.base import JobEnv, SessionEnv, SessionScope, trusts_remote_code
from suite.stages.registry import STAGES
from suite.stages.serve.read import PrecompileStart
from suite.stages.serve.run import serve_command
from suite.store import RunStore, atomic_write_json, redact_env, redact_text, secret_values

RUNTIMES: dict[str, type] = {"local": LocalRuntime, "docker": DockerRuntime, "slurm": SlurmRuntime}


@dataclass
class RunContext:
    matrix: Matrix
    plan: Plan
    store: RunStore
    runtime: ArmPreparer  # every runtime prepares the arms; `here` starts their processes on this machine
    arm_envs: dict[str, ArmEnv]
    console: Console
    secrets: list[str] = field(default_factory=list)
    run_scope: SessionScope = field(default_factory=SessionScope)  # lives as long as the run (bench client)
    # runtime.gpu_groups: restart sets run at once, each in a thread of its own (a lane, one per GPU group)
    lane_scopes: dict[int, SessionScope] = field(default_factory=dict)  # a later lane's run-long resources
    lock: threading.RLock = field(default_factory=threading.RLock)  # ports handed out, progress, scopes
    ports: set[int] = field(default_factory=set)  # every port handed to a server of this run
    cancel: threading.Event = field(default_factory=threading.Event)  # a lane failed or Ctrl-C: the others stop

    def scope_of(self, lane: int | None) -> SessionScope:
        """What lives as long as the run for one lane's restart sets (the bench client: one per GPU group when
        sets run at once); the run's own for the first lane or none."""
        if not lane:
            return self.run_scope
        with self.lock:
            return self.lane_scopes.setdefault(lane, SessionScope())

    def close_scopes(self) -> None:
        for scope in (self.run_scope, *self.lane_scopes.values()):
            scope.close()

    @property
    def here(self) -> Runtime:
        """The arm backend that starts this run's servers, tools and clients on this machine."""
        if not isinstance(self.runtime, Runtime):
            raise SuiteError(f"runtime {self.runtime.kind} starts no processes on this machine")
        return self.runtime

    def image_id(self, arm: str) -> str | None:
        """The arm's container image by id (docker runtime), for its servers' records; None elsewhere."""
        info = self.runtime.arm_info(arm).image_info
        return info.id if info is not None else None

    def client_env(self) -> dict[str, str]:
        """Environment of client tools (bench, lm-eval): the installed vLLM, never an arm's overlay. The suite's
        own PYTHONPATH stays (a `pip install --target` vLLM lives there, as on the GPU bundle), less any
        overlay on it (a directory with the overlay's applied.json beside its vllm/)."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        keep = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                if p and not (Path(p) / "applied.json").is_file()]
        if keep:
            env["PYTHONPATH"] = os.pathsep.join(keep)
        if all(Path(m.id).is_dir() for m in self.matrix.models_by_field().values()):
            env.setdefault("HF_HUB_OFFLINE", "1")
        tmp = self.store.root / ".tmp"
        tmp.mkdir(exist_ok=True)
        env["TMPDIR"] = str(tmp)
        return env


def make_runtime(matrix: Matrix, cache_root: Path) -> ArmPreparer:
    try:
        return RUNTIMES[matrix.runtime.kind](matrix, cache_root)
    except KeyError:
        raise SuiteError(f"unknown runtime {matrix.runtime.kind!r}") from None


def server_argv_tail(matrix: Matrix, arm: str, plan: Plan, port: int, extra: list[str] | None = None) -> list[str]:
    m = matrix.model_of(plan.arms[arm])
    return [m.id, "--served-model-name", m.name, "--host", matrix.runtime.host, "--port", str(port),
            "--max-model-len", str(m.max_model_len), *m.vllm_args(), *matrix.serve_args, *plan.arms[arm].serve_args,
            *(extra or [])]


# ---------------------------------------------------------------------------------------- jobs


@dataclass(frozen=True)
class ServerView:
    """The session's server as a stage sees it (suite.stages.base.ServerHandle)."""

    server: Server

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def argv(self) -> list[str]:
        return self.server.spec.argv

    @property
    def env(self) -> dict[str, str]:
        return self.server.spec.env

    def reset_prefix_cache(self) -> bool:
        return self.server.reset_prefix_cache()


def job_env(ctx: RunContext, job: Job, server: Server | None, scope: SessionScope,
            pending: tuple[Job, ...] = ()) -> JobEnv:
    arm_env, arm_spec = ctx.arm_envs[job.arm], ctx.plan.arms[job.arm]
    offline = server is None
    dirs = ctx.store.arm_dirs(job.arm, ctx.plan.group_of(job))  # the compile cache of its server's GPU group
    lane = ctx.plan.lane_of(job)  # the bench client of its restart set's lane (sets at once)
    return JobEnv(
        job=job, model=ctx.matrix.model_of(arm_spec), serve_args=[*ctx.matrix.serve_args, *arm_spec.serve_args],
        result=ctx.store.result_path(job), log=ctx.store.log_path(job), run_root=ctx.store.root,
        tool=lambda argv: ctx.here.tool(arm_env, argv, dirs), vllm_root=arm_env.vllm_root,
        client_env=ctx.client_env(), vllm="vllm",
        client_argv=lambda argv: ctx.here.client_argv(arm_env, argv, dirs, server=server),
        client_cpus=ctx.here.client_cpus(),
        server=None if offline else ServerView(server), scope=scope,
        session_dir=ctx.store.session_dir(job.arm, job.kind, job.session), pending=pending,
        run_scope=ctx.scope_of(lane), client_in_server=ctx.here.client_in_server,
        round=ctx.plan.round_of(job), lane=lane)


def _run_job(ctx: RunContext, job: Job, server: Server | None, scope: SessionScope,
             pending: tuple[Job, ...] = ()) -> bool:
    started = utc_now()
    t0 = time.monotonic()
    device = ctx.here.device_state()  # GPU clocks, P-state, power at the job's start (None on a CPU host)
    stage = STAGES.get(job.kind)
    if stage is None:
        ctx.store.write_record(job, "failed", started=started, error=f"no stage for job kind {job.kind!r}",
                               where=this_machine())
        return False
    try:
        notes = stage.execute(job_env(ctx, job, server, scope, pending))
        if server is not None and not server.alive():
            raise ServerError("the server died during the job; its output is kept but not used")
    except SuiteError as exc:
        fields: dict[str, Any] = {"error": str(exc)}
        if server is not None and not server.alive():
            fields["server_died"] = True
            fields["server_log_tail"] = server.log_tail(60)
        ctx.store.write_record(job, "failed", started=started, seconds=round(time.monotonic() - t0, 3),
                               where=this_machine(), **fields)
        ctx.console.print(f"[red]failed[/red] {job.arm} {job.key}: {str(exc).splitlines()[0]}")
        return False
    gpu = {"device": DeviceStates(before=device, after=ctx.here.device_state())} if device is not None else {}
    ctx.store.write_record(job, "ok", notes, started=started, seconds=round(time.monotonic() - t0, 3),
                           where=this_machine(), **gpu)
    return True


# ---------------------------------------------------------------------------------------- sessions


def _pick_port(ctx: RunContext) -> int:
    port = ctx.matrix.runtime.port
    if port == 0:
        with ctx.lock:  # servers started together bind theirs later: never hand one port out twice in a run
            while (port := free_port(ctx.matrix.runtime.host)) in ctx.ports:
                pass
            ctx.ports.add(port)
        return port
    if port_in_use(ctx.matrix.runtime.host, port):
        raise ServerError(f"port {port} on {ctx.matrix.runtime.host} is already in use (set runtime.port: 0 "
                          "to pick a free one)")
    return port


@dataclass
class Launch:
    """A server started and not yet known healthy: what its record needs once /health answers."""

    server: Any
    session: Session
    attempt: int
    started: str
    t0: float

    def record(self, ctx: RunContext) -> None:
        spec = self.server.spec
        atomic_write_json(ctx.store.server_record_path(self.session.arm, self.session.index, self.attempt), {
            "arm": self.session.arm, "session": self.session.index, "attempt": self.attempt,
            "window": self.session.window, "gpus": self.session.gpus, "started": self.started,
            "healthy_after_s": round(time.monotonic() - self.t0, 3), "port": spec.port,
            "cpus": sorted(spec.cpus) if spec.cpus else None,
            "client_cpus": sorted(ctx.here.client_cpus() or []),
            "argv": [redact_text(a, ctx.secrets) for a in spec.argv],
            # the machine, its GPUs' clocks at this start, the arm's image (docker)
            "where": host_identity(image_id=ctx.image_id(self.session.arm)).model_dump(mode="json", exclude_unset=True)})


def _launch_server(ctx: RunContext, session: Session, attempt: int, log_path: Path | None = None) -> Launch:
    """Start the session's server process (the stages shape its flags and env) on its restart set's GPUs
    (runtime.gpu_groups); /health is not awaited. ``log_path``: another log than the session's (precompile)."""
    port = _pick_port(ctx)
    arm_spec = ctx.plan.arms[session.arm]
    extra_env = {**ctx.matrix.env, **arm_spec.env}
    dirs = ctx.store.arm_dirs(session.arm, ctx.plan.group_of_session(session))
    pending = [j for j in session.jobs if not ctx.store.is_done(j)]
    extra_args: list[str] = []
    for kind in dict.fromkeys(j.kind for j in pending):  # stages shape the server of their session
        hooks = STAGES[kind] if kind in STAGES else None
        if hooks is None or not (hooks.server_args or hooks.server_env):
            continue
        senv = SessionEnv(arm=session.arm, index=session.index, runtime=ctx.runtime.kind,
                          arm_dir=ctx.store.arm_dir(session.arm),
                          session_dir=ctx.store.session_dir(session.arm, kind, session.index),
                          base_env=ctx.here.arm_vars(ctx.arm_envs[session.arm], dirs) | extra_env,
                          pending=[j for j in pending if j.kind == kind])
        if hooks.server_args:
            extra_args += hooks.server_args(senv)
        if hooks.server_env:
            extra_env.update(hooks.server_env(senv))
    spec = ctx.here.server_spec(
        ctx.arm_envs[session.arm],
        argv_tail=server_argv_tail(ctx.matrix, session.arm, ctx.plan, port, extra_args),
        extra_env=extra_env, dirs=dirs,
        log_path=log_path or ctx.store.server_log(session.arm, session.index, attempt), port=port,
        redact=ctx.secrets, gpus=session.gpus)
    server = ctx.here.server(spec)
    launch = Launch(server=server, session=session, attempt=attempt, started=utc_now(), t0=time.monotonic())
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    return launch


def await_healthy(ctx: RunContext, launches: list[Launch]) -> dict[int, ServerError]:
    """Wait for every launched server together (``suite.runtime.base.wait_healthy``); each healthy one's record
    is written the moment it answers. Returns the failures by position (their servers stopped)."""
    return wait_healthy([launch.server for launch in launches], on_healthy=lambda i: launches[i].record(ctx),
                        cancel=ctx.cancel)


def _start_server(ctx: RunContext, session: Session, attempt: int) -> Any:
    launch = _launch_server(ctx, session, attempt)
    failure = await_healthy(ctx, [launch]).get(0)
    if failure is not None:
        raise failure
    return launch.server


def _error_brief(message: str, tail_lines: int = 5) -> str:
    """The command and the last lines of the log tail of a server error (the full text is in the records)."""
    lines = message.splitlines()
    cmd = [line for line in lines if line.strip().startswith(("command:", "log:"))]
    tail = lines[lines.index("--- log tail ---") + 1:][-tail_lines:] if "--- log tail ---" in lines else []
    return "\n".join(cmd + [f"  | {line}" for line in tail])


def _fail_all(ctx: RunContext, jobs: list[Job], error: str) -> None:
    where = this_machine()
    for job in jobs:
        ctx.store.write_record(job, "failed", error=error, where=where)


class LiveSession:
    """One server session while it runs: its server (restarted, bounded, when it dies), its scope, and which
    of its pending jobs are left. ``ended`` once its jobs are done or its server cannot be had."""

    def __init__(self, ctx: RunContext, session: Session, pending: list[Job]):
        self.ctx, self.session, self.pending = ctx, session, pending
        self.scope = SessionScope()
        self.server: Any = None
        self.ready_at: float | None = None  # time.monotonic() when its server (its window's last) answered
        self.quiet_until: float | None = None  # no request before this (matrix quiet_s), then None
        self.attempt = 0
        self.restarts_left = ctx.matrix.runtime.max_restarts
        self.next = 0  # index of the next pending job
        self.ended = not pending

    def server_lost(self, exc: ServerError) -> None:
        """The server could not be started: every job left is recorded failed with the command and log tail."""
        _fail_all(self.ctx, self.pending[self.next:], str(exc))
        self.ctx.console.print(f"[red]{str(exc).splitlines()[0]}[/red]")
        self.ctx.console.print(_error_brief(str(exc)), markup=False, highlight=False)
        self.ended = True

    def _ensure_server(self) -> bool:
        if self.server is not None and self.server.alive():
            return True
        if self.server is not None:  # it died: stop what is left of it, then restart (bounded)
            self.scope.close()
            self.server.__exit__(None, None, None)
            self.server = None
            if self.restarts_left == 0:
                _fail_all(self.ctx, self.pending[self.next:], "server died and no restarts are left")
                self.ctx.console.print(f"[red]arm {self.session.arm}: server died; no restarts left[/red]")
                self.ended = True
                return False
            self.restarts_left -= 1
            self.attempt += 1
            self.ctx.console.print(f"[yellow]arm {self.session.arm}: restarting the server[/yellow]")
        try:
            self.server = _start_server(self.ctx, self.session, self.attempt)
        except ServerError as exc:
            self.server_lost(exc)
            return False
        self.became_ready(time.monotonic())
        return True

    def became_ready(self, at: float) -> None:
        """Its server (in a window: the window's last) answered /health at ``at``: the quiet counts from here."""
        self.ready_at = at
        quiet_s = self.ctx.plan.design.quiet_s
        self.quiet_until = at + quiet_s if quiet_s else None

    def step(self, advance: Callable[..., None]) -> None:
        """Run the next pending job (starting or restarting the server first when it is not alive)."""
        if self.ended or not self._ensure_server():
            return
        job = self.pending[self.next]
        if self.quiet_until is not None:  # the window's servers left idle before their first request
            time.sleep(max(0.0, self.quiet_until - time.monotonic()))
            self.quiet_until = None
        _run_job(self.ctx, job, self.server, self.scope, tuple(self.pending[self.next:]))
        self.next += 1
        self.ended = self.next >= len(self.pending)
        advance(job)

    def close(self) -> None:
        self.scope.close()
        if self.server is not None:
            self.server.__exit__(None, None, None)
            self.server = None


def run_session(ctx: RunContext, session: Session, pending: list[Job], advance: Callable[..., None]) -> None:
    if not session.needs_server:
        scope = SessionScope()
        with scope.open():
            for job in pending:
                _run_job(ctx, job, None, scope)
                advance(job)
        return
    live = LiveSession(ctx, session, pending)
    try:
        while not live.ended:
            live.step(advance)
    finally:
        live.close()


def _turn_order(ctx: RunContext, lives: list[LiveSession], turn: int) -> list[LiveSession]:
    """The order a window's sessions take their turn-th job in: mirrored (A B, B A, ...) side by side; under
    order interleaved a fresh seeded random order per turn (recorded by the jobs' start times), so no fixed
    pattern lines up with a periodic drift of the host within the window."""
    if not ctx.plan.design.unit_starts_together:
        return lives if turn % 2 == 0 else lives[::-1]
    by_arm = {live.session.arm: live for live in lives}
    window = lives[0].session.window
    return [by_arm[a] for a in round_order(list(by_arm), turn, ctx.matrix.order_seed, f"turns:{window}")]


def run_window(ctx: RunContext, items: list[tuple[Session, list[Job]]], advance: Callable[..., None]) -> None:
    """Sessions of one time window side by side: every server is started at once and awaited together, then
    the sessions take turns, one job each (``_turn_order``: mirrored, A B, B A, ...; interleaved: a fresh random
    order per turn), so that a drift within the window falls on every arm alike. A server that dies is restarted alone."""
    lives = [LiveSession(ctx, s, p) for s, p in items if p]
    if len(lives) <= 1:
        for live in lives:
            run_session(ctx, live.session, live.pending, advance)
        return
    try:
        launched: list[tuple[LiveSession, Launch]] = []
        for live in lives:
            try:
                launched.append((live, _launch_server(ctx, live.session, live.attempt)))
            except ServerError as exc:
                live.server_lost(exc)
        failures = await_healthy(ctx, [la for _, la in launched])
        ready = time.monotonic()  # the window's last server answered: its quiet counts from here
        for i, (live, launch) in enumerate(launched):
            if i in failures:
                live.server_lost(failures[i])
            else:
                live.server = launch.server
                live.became_ready(ready)
        turn = 0
        while any(not live.ended for live in lives):
            for live in _turn_order(ctx, lives, turn):
                if ctx.cancel.is_set():  # another restart set of the wave failed, or Ctrl-C: stop here
                    raise KeyboardInterrupt("another restart set of the wave stopped")
                live.step(advance)
            turn += 1
    finally:
        stop_together([live.close for live in lives])


def run_wave(ctx: RunContext, windows: list[list[tuple[Session, list[Job]]]], advance: Callable[..., None]) -> None:
    """Restart sets that run at the same time (runtime.gpu_groups: one per GPU group), each ``run_window`` in a
    thread of its own; finished jobs are reported one at a time. A set that fails (or Ctrl-C) stops the others
    between two jobs, their servers stopped; the first error goes on once every set has ended."""
    if len(windows) == 1:
        run_window(ctx, windows[0], advance)
        return

    def one_at_a_time(*args: Any) -> None:
        with ctx.lock:
            advance(*args)

    errors: list[BaseException] = []

    def lane(items: list[tuple[Session, list[Job]]]) -> None:
        try:
            run_window(ctx, items, one_at_a_time)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread below
            errors.append(exc)
            ctx.cancel.set()

    threads = [threading.Thread(target=lane, args=(items,), name=f"restart-set-{items[0][0].round}", daemon=True)
               for items in windows]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.5)  # short joins: Ctrl-C reaches this thread
    except BaseException:
        ctx.cancel.set()
        for t in threads:
            t.join()
        raise
    if errors:
        raise errors[0]


def precompile(ctx: RunContext, todo: Batch) -> None:
    """Matrix ``precompile``: before the stretch's first server session, every serving arm's server (once per
    GPU group, on the group's GPUs and compile cache) started from its first pending session's command, awaited
    and stopped, nothing measured: torch.compile's and the kernels' caches are then warm for every measured
    start. Under interleaved an arm's servers start together (they are alive at once anyway; under
    runtime.cross_groups one set's layout at a time), else one after another (``precompile_windows``). Each
    log is ``<arm>/precompile[-group-N].log``, its start record the ``.json`` beside it; a server that does not
    start is reported and the run goes on (its sessions meet the same error, recorded)."""
    for servers in precompile_windows(ctx.plan, todo):
        _precompile_together(ctx, servers)


def precompile_windows(plan: Plan, todo: Batch) -> list[list[tuple[tuple[str, int | None], Session]]]:
    """The precompile's servers, ((arm, GPU group), the session whose command it starts), in the windows that
    start together: every serving arm's first pending session per group; under interleaved all at once, except
    under runtime.cross_groups, where a group holds one server at a time: one window per restart set that
    brings an (arm, group) pair first (the first N sets' layouts); otherwise one server at a time."""
    firsts: dict[tuple[str, int | None], Session] = {}
    for session, pending in todo:
        if pending and session.needs_server and plan.arms[session.arm].serving:
            firsts.setdefault((session.arm, plan.group_of_session(session)), session)
    if not plan.design.unit_starts_together:
        return [[item] for item in firsts.items()]
    if not plan.design.cross_groups:
        return [list(firsts.items())] if firsts else []
    # the plan holds a set's sessions together, so the pairs each set brings first come one set after another
    return [list(items) for _, items in groupby(firsts.items(), key=lambda item: item[1].round)]


def _precompile_together(ctx: RunContext, servers: list[tuple[tuple[str, int | None], Session]]) -> None:
    if not servers:
        return
    ctx.console.print("precompile: " + " + ".join(arm + (f" (GPUs {s.gpus})" if s.gpus else "") for (arm, _), s in servers)
                      + ": started to fill the compile caches, not measured", markup=False, highlight=False)
    launches: list[Launch] = []

    def healthy(i: int) -> None:  # no session's record: what the precompile server was, and when it answered
        la = launches[i]
        took = time.monotonic() - la.t0
        atomic_write_json(la.server.spec.log_path.with_suffix(".json"), PrecompileStart(
            arm=la.session.arm, gpus=la.session.gpus, started=la.started, healthy_after_s=round(took, 3)).model_dump())
        ctx.console.print(f"precompile: {la.session.arm} answered after {took:.0f} s", markup=False, highlight=False)

    try:
        for (arm, group), session in servers:
            try:
                launches.append(_launch_server(ctx, session, 0, log_path=ctx.store.precompile_log(arm, group)))
            except ServerError as exc:
                ctx.console.print(f"[yellow]precompile: {str(exc).splitlines()[0]}[/yellow]")
        failures = wait_healthy([la.server for la in launches], on_healthy=healthy, cancel=ctx.cancel)
        for i, exc in failures.items():
            ctx.console.print(f"[yellow]precompile: {launches[i].session.arm}: {str(exc).splitlines()[0]}[/yellow]")
    finally:
        stop_together([partial(la.server.__exit__, None, None, None) for la in launches])


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
    for model in matrix.models_by_field().values():
        ensure_model(model, log=lambda msg: console.print(msg, markup=False, highlight=False))
    if missing := missing_model_paths(matrix):  # before any arm's image is built or server started
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
    store.update_manifest(
        runtime=matrix.runtime.kind,
        weights=WeightsRecord(load_format=matrix.model.load_format, generate=matrix.model.generate,
                              model_args=matrix.model.vllm_args(), note=matrix.model.weights_note()),
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


class HereScheduler:
    """Sessions run in this process (runtimes local and docker): one after another, a side-by-side window's
    sessions together."""

    kind = "here"

    def run(self, ctx: RunContext, batch: Batch, progress: RunProgress) -> None:
        def together(item: tuple[Session, list[Job]]) -> tuple[str, int] | int:
            """What runs at once: a wave of windows (GPU groups), a window, or one session alone (its index)."""
            s = item[0]
            if (wave := ctx.plan.wave_of_session(s)) is not None:
                return ("wave", wave)
            return ("window", s.window) if s.window is not None else id(item)

        for _, unit in groupby(batch, key=together):
            items = list(unit)
            session, pending = items[0]
            if session.window is None:
                if pending:
                    progress.now(f"{session.arm}#{session.index}")
                    run_session(ctx, session, pending, progress.job_done)
                continue
            windows = [list(w) for _, w in groupby(items, key=lambda it: it[0].window)]
            progress.now(" | ".join(" + ".join(f"{s.arm}#{s.index}" for s, _ in w) for w in windows))
            run_wave(ctx, windows, progress.job_done)


def make_scheduler(matrix: Matrix) -> Scheduler:
    if matrix.runtime.kind == "slurm":
        return SlurmScheduler(matrix)
    return HereScheduler()


def batches(todo: Batch, by_round: bool, plan: Plan | None = None) -> list[Batch]:
    """The runner's units of work for the scheduler: every session at once, or (a run that stops at looks)
    one round at a time, cut where the plan's round changes (offline sessions form batches of their own); with
    GPU groups one wave at a time (the restart sets that run at once)."""
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
        tail[tail.index("--port") + 1] = "PORT"
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
        cmd = serve_command(vllm="vllm", base_url=f"http://{matrix.runtime.host}:PORT", served_name=model.name,
                            tokenizer=model.tokenizer or model.id, params=job.params,
                            result_dir=Path("<run>/<arm>/serve") / job.point, result_filename="rep-<r>.json",
                            trust_remote_code=trusts_remote_code([*matrix.serve_args, *spec.serve_args]))
        whose = f", {job.arm}'s model" if spec.model is not None else ""
        lines.append(f"  [{job.point}{whose}] client: {shlex.join(cmd)}")
    return "\n".join(lines)
