"""Where a run's sessions execute, apart from how an arm's processes start (the runtimes).

The runner owns the rounds: it cuts the plan's pending sessions into batches (one round at a time when the
run stops at looks, else all of them), hands each batch to the scheduler and takes the sequential look after
it. A scheduler runs the sessions of one batch to their end and says when each job finished:

- here (``suite.sessions.HereScheduler``): in this process, one session (or one side-by-side window) after the
  other, with the local or docker runtime;
- slurm (``suite.runtime.slurm.driver.SlurmScheduler``): one batch job per session, submitted, followed,
  resubmitted and cancelled from the login node.

So `repeats: auto` stops at its looks, and at its time budget, under every scheduler.
"""

from __future__ import annotations

from typing import Any, Protocol

from suite.plan import Job, Session

Batch = list[tuple[Session, list[Job]]]  # sessions of the plan in its order, each with its jobs not yet done


class RunProgress(Protocol):
    """What a scheduler reports to the runner while a batch runs."""

    def job_done(self, job: Job) -> None:
        """``job`` ended (ok or failed: its record is written)."""

    def now(self, what: str) -> None:
        """What runs at present (the progress line's text)."""


class Scheduler(Protocol):
    kind: str

    def run(self, ctx: Any, batch: Batch, progress: RunProgress) -> None:
        """Run every pending job of the batch's sessions (the runner's RunContext ``ctx``); return when they
        have all ended. Interrupted (Ctrl-C, SIGTERM), stop what runs and raise."""
