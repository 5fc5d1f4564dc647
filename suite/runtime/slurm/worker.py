"""The inside of a Slurm job: serve one session of a run on the allocated node, with the local runtime.

    python -m suite.runtime.slurm.worker RUN_DIR --matrix MATRIX --session ARM#N [--overlays DIR|node-local]

Reuses the runner's own session loop (``suite.sessions.run_session``): the same server lifecycle, restarts,
job records and atomic raw files as a local run, written into the shared run directory. Jobs already done
there are skipped, so a resubmitted job runs only what is missing. The manifest is the driver's alone.
SIGTERM (scancel, time limit) stops the server's process group before the worker exits.

Exit status: 0 when the session ran to its end, including when its jobs failed or the arm could not be
prepared (then every pending job is recorded as failed with the reason, and a resubmission would not help);
2 when even that was impossible (no such run directory or session); 130 when interrupted (SIGTERM).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from suite import REPO_ROOT
from suite.errors import SuiteError
from suite.matrix_load import load_matrix
from suite.plan import Session, build_plan
from suite.proc import signals_as_interrupt
from suite.runtime.identity import this_machine
from suite.runtime.local import LocalRuntime
from suite.runtime.slurm.cluster import parse_session_id
from suite.sessions import RunContext, run_session
from suite.store import RunStore, secret_values


def find_session(plan, arm: str, index: int) -> Session:
    for s in plan.sessions:
        if s.arm == arm and s.index == index:
            return s
    raise SuiteError(f"the plan has no session {arm}#{index}")


def check_planned(store: RunStore, session: Session) -> None:
    """The matrix must still plan the jobs the driver planned (same keys and hashes)."""
    planned = {(j.arm, j.session, j.key): j.hash for j in store.manifest().plan.jobs}
    for job in session.jobs:
        want = planned.get((job.arm, job.session, job.key))
        if want != job.hash:
            raise SuiteError(f"{job.arm} {job.key}: the matrix no longer plans this job as the run did "
                             f"(hash {job.hash} vs {want}); was the matrix file edited after submission?")


def overlays_dir(value: str | None) -> Path:
    if value is None:
        return REPO_ROOT / ".cache"
    if value == "node-local":
        return Path(os.environ.get("TMPDIR") or tempfile.gettempdir()) / "suite-cache"
    return Path(value)


def serve_session(run_dir: Path, matrix_path: Path, session_text: str, cache: str | None,
                  console: Console) -> int:
    arm, index = parse_session_id(session_text)
    store = RunStore.open(run_dir)
    matrix = load_matrix(matrix_path)
    plan = build_plan(matrix)
    session = find_session(plan, arm, index)
    check_planned(store, session)
    pending = [j for j in session.jobs if not store.is_done(j)]
    runtime = LocalRuntime(matrix, overlays_dir(cache))
    try:
        arm_env = runtime.prepare_arm(arm, plan.arms[arm])
    except SuiteError as exc:
        for job in pending:
            store.write_record(job, "failed", error=f"arm {arm} could not be prepared on the node: {exc}",
                               where=this_machine())
        console.print(f"session {session_text}: arm not prepared: {exc}", markup=False, highlight=False)
        return 0
    ctx = RunContext(matrix=matrix, plan=plan, store=store, runtime=runtime, arm_envs={arm: arm_env},
                     console=console, secrets=secret_values())
    console.print(f"session {session_text}: {len(pending)} of {len(session.jobs)} jobs to run "
                  f"(vLLM {arm_env.vllm_version}{', overlay ' + str(arm_env.vllm_root) if arm_env.vllm_root else ''})")
    done = 0

    def advance(job=None) -> None:  # noqa: ARG001
        nonlocal done
        done += 1
        console.print(f"session {session_text}: {done}/{len(pending)} jobs finished")

    with signals_as_interrupt():
        run_session(ctx, session, pending, advance)
    ok = sum(store.is_done(j) for j in session.jobs)
    console.print(f"session {session_text}: {ok}/{len(session.jobs)} jobs ok")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m suite.runtime.slurm.worker", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--matrix", type=Path, required=True)
    p.add_argument("--session", required=True, metavar="ARM#N")
    p.add_argument("--overlays", metavar="DIR", help="cache root for patched overlays ('node-local' = $TMPDIR)")
    args = p.parse_args(argv)
    console = Console(force_terminal=False, width=160)
    try:
        return serve_session(args.run_dir, args.matrix, args.session, args.overlays, console)
    except SuiteError as exc:
        console.print(f"suite slurm worker: error: {exc}", markup=False, highlight=False)
        return 2
    except KeyboardInterrupt as exc:
        console.print(f"suite slurm worker: interrupted ({exc}); the server was stopped", markup=False)
        return 130


if __name__ == "__main__":
    sys.exit(main())
