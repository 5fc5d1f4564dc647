"""Sessions run on this machine: the executor under the runner (`suite.runner` decides which batches run).

A session is one server lifetime of one arm: its server started on its round's GPUs (the stages shape
its flags and environment), awaited on /health, restarted (bounded) when it dies, its jobs run one by one and
recorded as each ends (`LiveSession`, `run_session`). A time window's sessions run side by side: their servers
started and awaited together, their jobs taking turns (`run_window`: mirrored, or under together: all in a fresh
seeded order per turn); the windows of a wave (GPU groups: runtime.gpus) at once, a thread per GPU group
(`run_wave`). Before the first session of a stretch, the precompile (`precompile`). `HereScheduler` runs a
batch of sessions this way; the Slurm worker runs one session with the same `run_session`. `RunContext` is
what all of it shares: the matrix, the plan, the store, the arms' environments, the run's locks and scopes.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from itertools import groupby
from pathlib import Path
from typing import Any

from rich.console import Console

from suite.design import round_order
from suite.errors import ServerError, SuiteError
from suite.matrix import Matrix
from suite.plan import AA_SUFFIX, Job, Plan, Session, session_round
from suite.records import DeviceStates, utc_now
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
from suite.runtime.identity import host_identity, this_machine
from suite.runtime.scheduler import Batch, RunProgress
from suite.server_address import PORT, without_address
from suite.stages.base import JobEnv, SessionEnv, SessionScope
from suite.stages.registry import STAGES
from suite.stages.serve.read import PrecompileStart
from suite.store import RunStore, atomic_write_json, redact_text


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
    # GPU groups (runtime.gpus, a list): rounds run at once, each in a thread of its own (a lane, one per GPU group)
    lane_scopes: dict[int, SessionScope] = field(default_factory=dict)  # a later lane's run-long resources
    lock: threading.RLock = field(default_factory=threading.RLock)  # ports handed out, progress, scopes
    ports: set[int] = field(default_factory=set)  # every port handed to a server of this run
    cancel: threading.Event = field(default_factory=threading.Event)  # a lane failed or Ctrl-C: the others stop

    def scope_of(self, lane: int | None) -> SessionScope:
        """What lives as long as the run for one lane's rounds (the bench client: one per GPU group when
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
        if all(Path(m.id).is_dir() for m in self.matrix.models_by_arm().values()):
            env.setdefault("HF_HUB_OFFLINE", "1")
        tmp = self.store.root / ".tmp"
        tmp.mkdir(exist_ok=True)
        env["TMPDIR"] = str(tmp)
        return env


def server_argv_tail(matrix: Matrix, arm: str, plan: Plan, port: int, extra: list[str] | None = None) -> list[str]:
    """`vllm serve`'s arguments after the command: the model, the suite's defaults of the model flags serve_args
    do not give (ServedModel.server_defaults), where the server listens (the host of serve_args, ``port``: theirs or
    the one picked; their own copies taken out), then the matrix's and the arm's serve_args."""
    spec = plan.arms[arm]
    m = matrix.model_of(spec)
    name, defaults = m.server_defaults()
    return [m.id, *name, *matrix.address_of(spec).server_args(port), *defaults, *without_address(matrix.serve_args),
            *without_address(spec.serve_args), *(extra or [])]


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
    lane = ctx.plan.lane_of(job)  # the bench client of its round's lane (sets at once)
    return JobEnv(
        job=job, model=ctx.matrix.model_of(arm_spec),
        serve_args=without_address([*ctx.matrix.serve_args, *arm_spec.serve_args]),  # the server's address: its own
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


def _pick_port(ctx: RunContext, arm: str) -> int:
    """The port of an arm's server: the --port of its serve_args, else a free one of its host's."""
    address = ctx.matrix.address_of(ctx.plan.arms[arm])
    host, port = address.host, address.port
    if not address.fixed:
        with ctx.lock:  # servers started together bind theirs later: never hand one port out twice in a run
            while (port := free_port(host)) in ctx.ports:
                pass
            ctx.ports.add(port)
        return port
    if port_in_use(host, port):
        raise ServerError(f"port {port} on {host} is already in use ({PORT} {port} in "
                          f"{ctx.matrix.flag_place(arm.removesuffix(AA_SUFFIX), PORT)}: leave it out to pick a free "
                          "one)")
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
    """Start the session's server process (the stages shape its flags and env) on its round's GPUs
    (GPU groups: runtime.gpus); /health is not awaited. ``log_path``: another log than the session's (precompile)."""
    port = _pick_port(ctx, session.arm)
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
    together: all a fresh seeded random order per turn (recorded by the jobs' start times), so no fixed
    pattern lines up with a periodic drift of the host within the window."""
    if not ctx.plan.design.all_together:
        return lives if turn % 2 == 0 else lives[::-1]
    by_arm = {live.session.arm: live for live in lives}
    window = lives[0].session.window
    return [by_arm[a] for a in round_order(list(by_arm), turn, ctx.plan.design.order_seed, f"turns:{window}")]


def run_window(ctx: RunContext, items: list[tuple[Session, list[Job]]], advance: Callable[..., None]) -> None:
    """Sessions of one time window side by side: every server is started at once and awaited together, then
    the sessions take turns, one job each (``_turn_order``: mirrored, A B, B A, ...; together: all: a fresh random
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
                if ctx.cancel.is_set():  # another round of the wave failed, or Ctrl-C: stop here
                    raise KeyboardInterrupt("another round of the wave stopped")
                live.step(advance)
            turn += 1
    finally:
        stop_together([live.close for live in lives])


def run_wave(ctx: RunContext, windows: list[list[tuple[Session, list[Job]]]], advance: Callable[..., None]) -> None:
    """Rounds that run at the same time (GPU groups in runtime.gpus: one per group), each ``run_window`` in a
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

    threads = [threading.Thread(target=lane, args=(items,), name=f"round-{items[0][0].round}", daemon=True)
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
    start. Under together: all an arm's servers start together (they are alive at once anyway; under
    runtime.cross_groups one round's layout at a time), else one after another (``precompile_windows``). Each
    log is ``<arm>/precompile[-group-N].log``, its start record the ``.json`` beside it; a server that does not
    start is reported and the run goes on (its sessions meet the same error, recorded)."""
    for servers in precompile_windows(ctx.plan, todo):
        _precompile_together(ctx, servers)


def precompile_windows(plan: Plan, todo: Batch) -> list[list[tuple[tuple[str, int | None], Session]]]:
    """The precompile's servers, ((arm, GPU group), the session whose command it starts), in the windows that
    start together: every serving arm's first pending session per group; under together: all every server at once, except
    under runtime.cross_groups, where a group holds one server at a time: one window per round that
    brings an (arm, group) pair first (the first N sets' layouts); otherwise one server at a time."""
    firsts: dict[tuple[str, int | None], Session] = {}
    for session, pending in todo:
        if pending and session.needs_server and plan.arms[session.arm].serving:
            firsts.setdefault((session.arm, plan.group_of_session(session)), session)
    if not plan.design.all_together:
        return [[item] for item in firsts.items()]
    if not plan.design.cross_groups:
        return [list(firsts.items())] if firsts else []
    # the plan holds a round's sessions together, so the pairs each round brings first come one round after another
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


class HereScheduler:
    """Sessions run in this process (runtimes local and docker): one after another, a side-by-side window's
    sessions together."""

    kind = "here"

    def __init__(self) -> None:
        self.last_wave: int | None = None  # the wave (a round, or rounds at once) that ran last: cooldown_s after it

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
            self.cool_down(ctx, items)
            if session.window is None:
                if pending:
                    progress.now(f"{session.arm}#{session.index}")
                    run_session(ctx, session, pending, progress.job_done)
                continue
            windows = [list(w) for _, w in groupby(items, key=lambda it: it[0].window)]
            progress.now(" | ".join(" + ".join(f"{s.arm}#{s.index}" for s, _ in w) for w in windows))
            run_wave(ctx, windows, progress.job_done)

    def cool_down(self, ctx: RunContext, items: list[tuple[Session, list[Job]]]) -> None:
        """Design ``cooldown_s``: before the first server of a round (a wave of rounds under GPU groups)
        that follows another in this process, that long with no server alive (the last one was stopped at its
        session's end). Ctrl-C ends the wait."""
        session = items[0][0]
        rnd = session_round(session) if session.needs_server else None
        if rnd is None or not any(pending for _, pending in items):
            return
        wave = ctx.plan.wave_of(rnd)
        rest = ctx.plan.design.cooldown_s
        if rest and self.last_wave is not None and wave != self.last_wave:
            ctx.console.print(f"cooldown: {rest:g} s with no server alive before round {rnd}", markup=False,
                              highlight=False)
            if ctx.cancel.wait(rest):
                raise KeyboardInterrupt("stopped during the cooldown")
        self.last_wave = wave
