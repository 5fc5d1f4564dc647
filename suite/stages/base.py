"""What a stage sees: one job and a narrow, typed environment (paths, environments, a command wrapper, the
server) — never the runner's context, the store or the runtime object.

A stage's ``run.execute(env) -> JobNotes`` runs one job, writes its raw result to ``env.result`` (atomically,
through suite.store) and returns its notes (a ``suite.records.JobNotes`` of its own), which the runner writes into
the job's record. Server hooks (``server_args``,
``server_env``) let a stage shape the server of a session that holds its jobs (profiler, probe plugin).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from suite.plan import Job
from suite.proc import ToolCommand
from suite.records import JobNotes
from suite.served_model import ServedModel


class ServerHandle(Protocol):
    """The running server of the session, as a stage may use it."""

    @property
    def base_url(self) -> str: ...
    @property
    def argv(self) -> list[str]: ...
    @property
    def env(self) -> dict[str, str]: ...
    def reset_prefix_cache(self) -> bool: ...


class SessionScope:
    """Resources that live as long as one server (a persistent bench client, a warmed shape): created on
    first use by a stage, closed by the runner when the server stops or restarts."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._items: dict[str, Any] = {}

    def get(self, key: str, factory: Callable[[], contextlib.AbstractContextManager[Any]]) -> Any:
        if key not in self._items:
            self._items[key] = self._stack.enter_context(factory())
        return self._items[key]

    def has(self, key: str) -> bool:
        return key in self._items

    def close(self) -> None:
        self._items.clear()
        self._stack.close()

    @contextlib.contextmanager
    def open(self) -> Iterator[SessionScope]:
        try:
            yield self
        finally:
            self.close()


def trusts_remote_code(serve_args: list[str]) -> bool:
    """The server trusts the model's remote code: the client tools load its tokenizer the same way."""
    return "--trust-remote-code" in serve_args


@dataclass(frozen=True)
class JobEnv:
    job: Job
    model: ServedModel  # the model the arm serves, its flags resolved (Matrix.model_of)
    serve_args: list[str]  # the matrix's and the arm's `vllm serve` arguments
    result: Path  # where the raw tool output goes (a file, or a directory for lm-eval)
    log: Path  # the job's own log
    run_root: Path  # the run directory (shared inputs such as generated datasets live under it)
    tool: Callable[[list[str]], ToolCommand]  # the whole command that runs argv in the arm's vLLM (offline stages)
    vllm_root: Path | None  # a directory holding the arm's vllm/ package (local overlay), if any
    client_env: dict[str, str]  # full environment of client tools (bench, lm-eval)
    vllm: str  # the `vllm` executable of client tools
    client_argv: Callable[[list[str]], list[str]]  # the command line that runs a client tool (`vllm ...`)
    client_cpus: frozenset[int] | None = None  # client tools pinned here (apart from the server's CPUs)
    server: ServerHandle | None = None
    scope: SessionScope = field(default_factory=SessionScope)
    session_dir: Path | None = None  # per-session scratch of the arm (profiler traces, client log)
    pending: tuple[Job, ...] = ()  # the session's jobs still to run, this one included (warm-ups)
    run_scope: SessionScope | None = None  # resources that outlive a server (a client that needs no server)
    client_in_server: bool = False  # client tools run inside the server's container: one client per server
    round: int = 0  # the round the job belongs to (together: all: its repeat // blocks; else its repeat)
    lane: int | None = None  # GPU groups (runtime.gpus), rounds at once: its round's lane (a GPU group's), by index

    @property
    def tokenizer(self) -> str:
        return self.model.tokenizer

    @property
    def trust_remote_code(self) -> bool:
        return trusts_remote_code(self.serve_args)


@dataclass(frozen=True)
class SessionEnv:
    """What a server hook sees: the session about to start a server."""

    arm: str
    index: int
    runtime: str  # runtime kind
    arm_dir: Path
    session_dir: Path
    base_env: dict[str, str]  # the server's environment so far (arm vars and the matrix's env)
    pending: list[Job]  # jobs of the session still to run


@dataclass(frozen=True)
class Stage:
    """What the runner and the report know of one job kind, declared by its stage in its own ``stage.py`` (as
    ``STAGES``, a tuple of these) and gathered by ``suite.stages.registry``: how a job of the kind runs, how
    the stage shapes the server of a session holding its jobs, and its section of the report."""

    kind: str
    execute: Callable[[JobEnv], JobNotes]
    section: Callable[[Any], Any] | None = None  # the report's section of this stage (None: part of the core)
    server_args: Callable[[SessionEnv], list[str]] | None = None
    server_env: Callable[[SessionEnv], dict[str, str]] | None = None
