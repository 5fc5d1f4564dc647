"""The Slurm scheduler: the sessions of a `runtime: slurm` run, as batch jobs, from the login node.

The runner (``suite.runner.execute``) hands it one batch of sessions at a time (every session, or one round
when the run stops at looks). For a batch it writes one batch script per session with work left, submits
them (together, or one at a time with ``parallel: false``), follows them with ``squeue`` (final states from
``sacct``, else the job-completion log through ``sacct -c``), resubmits a session whose job ended without
completing (bounded by ``runtime.max_restarts``; the worker skips what is done), cancels every job of the run on
Ctrl-C / SIGTERM and waits until they are gone. The request is checked against the cluster (partition, GPUs,
``sbatch --test-only``) before the run directory exists (``suite.runtime.slurm.cluster.preflight``). Every
submission is kept in ``<run>/slurm/jobs.json``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite import REPO_ROOT
from suite.errors import SuiteError
from suite.plan import Job, Session
from suite.proc import signals_as_interrupt
from suite.records import SlurmLedger, SlurmSubmission, utc_now
from suite.runtime.scheduler import Batch, RunProgress
from suite.runtime.slurm.cluster import (
    JobScript,
    JobState,
    SlurmError,
    cancel,
    final_states,
    job_script,
    queue_states,
    require_commands,
    spec_of,
    submit,
)
from suite.store import atomic_write_text

CANCEL_WAIT_S = 180.0
UNKNOWN_POLLS = 5  # polls a job may be missing from squeue and accounting before it counts as lost
POLL_INTERVAL_S = 3.0  # seconds between two squeue polls of the driver
MAX_POLL_FAILURES = 20  # consecutive failed squeue/sacct polls before the driver gives up (and cancels)


@dataclass
class Tracked:
    session: Session
    script: JobScript
    attempt: int = 0
    job_id: str = ""
    state: str = ""
    unknown_polls: int = 0
    entry: SlurmSubmission | None = None  # its latest submission, once submitted

    @property
    def sid(self) -> str:
        return self.script.session

    @property
    def submission(self) -> SlurmSubmission:
        """The ledger entry of its latest submission (a session is followed only once it is submitted)."""
        if self.entry is None:
            raise AssertionError(f"{self.sid}: followed before it was submitted")
        return self.entry


class SlurmDriver:
    """One batch of sessions on the cluster, from submission until every job of it has ended."""

    poll_interval_s = POLL_INTERVAL_S  # a test may set it smaller (on the class or a driver)

    def __init__(self, ctx: Any, sessions: list[Session], progress: RunProgress):  # the runner's RunContext
        self.ctx = ctx
        self.sessions = sessions
        self.progress = progress
        self.spec = spec_of(ctx.matrix)
        self.resubmits = ctx.matrix.runtime.max_restarts  # a session's batch job submitted again at most this often
        self.console = ctx.console
        self.run_dir = ctx.store.root.resolve()
        self.ledger = SlurmLedger()
        self.active: dict[str, Tracked] = {}
        self.waiting: list[Tracked] = []
        # each job's record as the batch began (a failed one may be there from before a resume): a job has
        # ended when its record differs
        self.before = {j.hash: ctx.store.record(j) for s in sessions for j in s.jobs}
        self.ended: set[str] = set()

    # ------------------------------------------------------------------ setup
    def matrix_path(self) -> Path:
        path = Path(self.ctx.store.manifest().matrix_path or "").resolve()
        if not path.is_file():
            raise SuiteError(f"the run's matrix file {path} is gone; the jobs load it on the nodes")
        return path

    def scripts(self, sessions: list[Session]) -> list[Tracked]:
        runtime = self.ctx.runtime
        matrix_path = self.matrix_path()
        out = []
        for s in sessions:
            image = runtime.image_for(self.ctx.plan.arms[s.arm])
            js = job_script(self.ctx.matrix, arm=s.arm, index=s.index, image=image, run_dir=self.run_dir,
                            matrix_path=matrix_path, repo_root=REPO_ROOT, workdir=Path.cwd())
            atomic_write_text(js.path, js.text)
            js.path.chmod(0o755)
            out.append(Tracked(session=s, script=js))
        return out

    def save_ledger(self) -> None:
        self.ctx.store.write_slurm_ledger(self.ledger)

    # ------------------------------------------------------------------ submission
    def submit(self, t: Tracked) -> None:
        t.job_id = submit(t.script.path)
        t.state, t.unknown_polls = "SUBMITTED", 0
        t.entry = SlurmSubmission(session=t.sid, attempt=t.attempt, job_id=t.job_id, submitted=utc_now(),
                                  state="PENDING", output=t.script.output.replace("%j", t.job_id))
        self.ledger.submissions.append(t.entry)
        self.save_ledger()
        self.active[t.job_id] = t
        again = f" (resubmission {t.attempt} of at most {self.resubmits})" if t.attempt else ""
        self.console.print(f"submitted {t.sid} ({len(t.session.jobs)} jobs) as Slurm job {t.job_id}{again}")

    def missing(self, t: Tracked) -> list[Job]:
        return [j for j in t.session.jobs if not self.ctx.store.is_done(j)]

    def finish(self, t: Tracked, st: JobState) -> None:
        del self.active[t.job_id]
        acct = final_states([t.job_id]).get(t.job_id) if not st.exit_code else None
        if acct is not None and acct.state != "UNKNOWN":
            st = JobState(t.job_id, acct.state, st.reason, acct.node or st.node, acct.exit_code,
                          acct.start or st.start, acct.end or st.end)
        missing = self.missing(t)
        entry = t.submission
        entry.state, entry.exit_code, entry.node, entry.start, entry.end = (st.state, st.exit_code, st.node,
                                                                            st.start, st.end)
        entry.missing_after = len(missing)
        self.save_ledger()
        total = len(t.session.jobs)
        if st.state == "COMPLETED":
            self.console.print(f"{t.sid}: Slurm job {t.job_id} completed on {st.node}; "
                               f"{total - len(missing)}/{total} jobs ok")
            self.give_up(t, missing, st, "completed without finishing it")
            return
        self.console.print(f"[red]{t.sid}: Slurm job {t.job_id} ended {st.state}"
                           f"{' (exit ' + st.exit_code + ')' if st.exit_code else ''}"
                           f"{' on ' + st.node if st.node else ''}; {len(missing)} of {total} jobs not done; "
                           f"log {entry.output}[/red]", highlight=False)
        if missing and t.attempt < self.resubmits:
            t.attempt += 1
            try:
                self.submit(t)
                return
            except SlurmError as exc:
                self.console.print(f"[red]{t.sid}: resubmission refused: {exc}[/red]", highlight=False)
        self.give_up(t, missing, st, "ended before it ran")

    def give_up(self, t: Tracked, missing: list[Job], st: JobState, how: str) -> None:
        """Jobs the session leaves without any record get a failed one naming the Slurm job, for the report."""
        for job in missing:
            if self.ctx.store.record(job) is None:
                self.ctx.store.write_record(job, "failed", slurm_job=t.job_id, slurm_state=st.state,
                                            error=f"Slurm job {t.job_id} ({t.sid}) {how} "
                                                  f"({st.state}; {t.attempt} resubmissions)")
        if not self.spec.parallel and self.waiting and not self.active:
            self.submit(self.waiting.pop(0))

    # ------------------------------------------------------------------ tracking
    def poll(self) -> None:
        ids = list(self.active)
        states = queue_states(ids)
        gone = [i for i in ids if i not in states]
        if gone:
            states |= final_states(gone)
        for job_id in ids:
            t = self.active[job_id]
            st = states.get(job_id)
            if st is None:
                t.unknown_polls += 1
                if t.unknown_polls >= UNKNOWN_POLLS:
                    self.finish(t, JobState(job_id, "UNKNOWN"))
                continue
            if st.active:
                if st.state != t.state:
                    where = f" on {st.node}" if st.state == "RUNNING" and st.node else ""
                    why = f" ({st.reason})" if st.state == "PENDING" and st.reason not in ("", "None") else ""
                    self.console.print(f"{t.sid}: Slurm job {job_id} {st.state}{where}{why}", highlight=False)
                    t.state = st.state
                    entry = t.submission
                    entry.state, entry.node = st.state, st.node
                    if st.state == "RUNNING":
                        entry.start = st.start
                    self.save_ledger()
                continue
            self.finish(t, st)
        self.report_ended()

    def report_ended(self) -> None:
        """Jobs of the batch whose record appeared since the last poll (written by the worker on the node, or
        a failed one by give_up) go to the runner's progress."""
        for s in self.sessions:
            for job in s.jobs:
                if job.hash in self.ended:
                    continue
                rec = self.ctx.store.record(job)
                if rec is not None and rec != self.before[job.hash]:
                    self.ended.add(job.hash)
                    self.progress.job_done(job)

    def cancel_all(self) -> None:
        ids = list(self.active)
        if not ids:
            return
        self.console.print(f"[yellow]cancelling Slurm jobs {', '.join(ids)} ...[/yellow]")
        cancel(ids)
        deadline = time.monotonic() + CANCEL_WAIT_S
        left = ids
        while time.monotonic() < deadline:
            left = [i for i, st in queue_states(ids).items() if st.active]
            if not left:
                break
            time.sleep(1.0)
        for job_id in ids:
            t = self.active.pop(job_id)
            entry = t.submission
            entry.state, entry.cancelled_by, entry.end = "CANCELLED", "suite", utc_now()
        self.save_ledger()
        if left:
            self.console.print(f"[red]jobs {', '.join(left)} still shown by squeue after "
                               f"{CANCEL_WAIT_S:.0f} s[/red]")
        else:
            self.console.print("all Slurm jobs of this run are gone")

    # ------------------------------------------------------------------ the run
    def run(self) -> None:
        sessions = [s for s in self.sessions if any(not self.ctx.store.is_done(j) for j in s.jobs)]
        if not sessions:
            return
        require_commands()
        tracked = self.scripts(sessions)
        if not tracked:
            return
        earlier = self.ctx.store.slurm_ledger()
        if earlier is not None:  # resume: keep the earlier submissions
            self.ledger = earlier
        try:
            with signals_as_interrupt():
                if self.spec.parallel:
                    for t in tracked:
                        self.submit(t)
                else:
                    self.waiting = tracked[1:]
                    self.submit(tracked[0])
                failures = 0
                while self.active:
                    time.sleep(self.poll_interval_s)
                    try:
                        self.poll()
                        failures = 0
                    except SlurmError as exc:  # slurmctld busy or restarting: keep following, within bounds
                        failures += 1
                        if failures >= MAX_POLL_FAILURES:
                            raise
                        self.console.print(f"[yellow]{exc} (retrying)[/yellow]", highlight=False)
        except BaseException:
            with signals_as_interrupt():
                self.cancel_all()
                for t in self.waiting:
                    self.console.print(f"{t.sid}: not submitted")
            raise


class SlurmScheduler:
    """`runtime: slurm`: each batch's sessions become Slurm jobs (suite.runtime.scheduler)."""

    kind = "slurm"

    def __init__(self, matrix: Any):
        self.spec = spec_of(matrix)

    def run(self, ctx: Any, batch: Batch, progress: RunProgress) -> None:
        ctx.store.update_manifest(slurm=self.spec.model_dump())
        driver = SlurmDriver(ctx, [s for s, _ in batch], progress)
        try:
            driver.run()
        finally:
            driver.report_ended()
