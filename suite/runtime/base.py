"""What every runtime shares: the `ArmPreparer` and `Runtime` protocols, the server spec, health polling, the arm
environment, an arm's placement as a dry run shows it.

A runtime provides one arm's vLLM: it prepares the arm (overlay, image), starts its server, and says how a
tool runs in the arm's environment (offline stages) and how a client tool runs against the server. The
runner talks to runtimes only through `Runtime`.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from suite.errors import ServerError
from suite.matrix import Matrix
from suite.patches import AppliedPatch
from suite.plan import effective_arms
from suite.proc import ToolCommand
from suite.records import ArmRuntimeInfo, GpuState
from suite.served_model import ServedModel
from suite.server_address import ServerAddress
from suite.store import ArmDirs


@dataclass(frozen=True)
class ServerSpec:
    """One `vllm serve` lifetime of one arm: the exact command, its environment and where it logs."""

    arm: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    host: str
    port: int
    startup_timeout_s: float
    cwd: Path | None = None
    redact: list[str] = field(default_factory=list)
    # the server (and its engine processes) on these CPUs once it answers /health; it starts on all of them
    cpus: frozenset[int] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class ArmEnv:
    """An arm made ready to serve: where its (patched) vLLM is and what was applied."""

    arm: str
    vllm_version: str
    # a directory on this host holding the arm's vllm/ package: the local overlay (first on the arm's PYTHONPATH),
    # or under docker a copy of the image's sources (read for the engine's flags, never imported)
    vllm_root: Path | None = None
    image: str | None = None  # docker runtime: the image to run
    patches: list[AppliedPatch] = field(default_factory=list)


class Server(Protocol):
    spec: ServerSpec

    @property
    def base_url(self) -> str: ...
    def alive(self) -> bool: ...
    def reset_prefix_cache(self) -> bool: ...
    def log_tail(self, n: int = 40) -> str: ...
    def __enter__(self) -> Server: ...
    def __exit__(self, *exc: object) -> None: ...


class ServerBase:
    """The lifecycle every server shares: start, wait for /health (failing fast when it exits), stop on exit.
    Subclasses give start(), stop(), running(), describe(what) and log_tail(n)."""

    spec: ServerSpec

    @property
    def base_url(self) -> str:
        return self.spec.base_url

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def running(self) -> bool:
        raise NotImplementedError

    def describe(self, what: str) -> str:
        raise NotImplementedError

    def serving(self) -> None:
        """The moment it first answers /health (before anything is measured on it)."""

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        failure = wait_healthy([self]).get(0)  # a failed one is stopped already
        if failure is not None:
            raise failure
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def alive(self) -> bool:
        return self.running() and http_ok(f"{self.base_url}/health", timeout=5.0)

    def reset_prefix_cache(self) -> bool:
        """POST /reset_prefix_cache (mounted with VLLM_SERVER_DEV_MODE=1); False when it is not there."""
        return http_ok(f"{self.base_url}/reset_prefix_cache", method="POST", timeout=30.0)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def http_ok(url: str, method: str = "GET", timeout: float = 5.0) -> bool:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def wait_healthy(servers: Sequence[ServerBase], on_healthy: Callable[[int], None] | None = None,
                 cancel: threading.Event | None = None) -> dict[int, ServerError]:
    """Poll the /health of every started server together until each answers (``on_healthy(i)`` at that
    moment), exits or passes its own startup timeout; a server that fails is stopped. Returns the failures by
    position. Interrupted (Ctrl-C, or ``cancel`` set by another thread), it stops every server still waited for
    before the interrupt goes on."""
    t0 = time.monotonic()
    waiting = dict(enumerate(servers))
    failures: dict[int, ServerError] = {}
    try:
        while waiting:
            if cancel is not None and cancel.is_set():
                raise KeyboardInterrupt("cancelled while the servers started")
            for i, server in list(waiting.items()):
                error = None
                if not server.running():
                    error = ServerError(server.describe("exited before it became healthy"))
                elif http_ok(f"{server.base_url}/health", timeout=2.0):
                    del waiting[i]
                    server.serving()
                    if on_healthy is not None:
                        on_healthy(i)
                    continue
                elif time.monotonic() - t0 > server.spec.startup_timeout_s:
                    error = ServerError(server.describe(f"not healthy after {server.spec.startup_timeout_s:.0f} s"))
                if error is not None:
                    server.stop()
                    failures[i] = error
                    del waiting[i]
            if waiting:
                time.sleep(1.0)
    except BaseException:
        stop_together([server.stop for server in waiting.values()])
        raise
    return failures


def stop_together(stops: Sequence[Callable[[], None]]) -> None:
    """Run every stop at once, each in a thread of its own, and wait for them all: a stop is mostly a wait
    (vLLM's shutdown, a GPU's memory let go, a container removed), so a round's servers stopped one
    after another cost the sum (four tiny-MoE CPU servers ~8 s, 1.8-2 s each, 2026-12-06) and together about
    the longest. Every stop is made even when one fails; the first error is raised once all have ended."""
    if len(stops) <= 1:
        for stop in stops:
            stop()
        return
    errors: list[BaseException] = []

    def one(stop: Callable[[], None]) -> None:
        try:
            stop()
        except BaseException as exc:  # noqa: BLE001 - raised in the calling thread below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(stop,), name="stop-server", daemon=True) for stop in stops]
    for t in threads:
        t.start()
    interrupted: BaseException | None = None
    for t in threads:
        while t.is_alive():
            try:
                t.join(0.5)
            except KeyboardInterrupt as exc:  # a Ctrl-C while stopping: every stop (bounded by its grace) ends first
                interrupted = exc
    if interrupted is not None:
        raise interrupted
    if errors:
        raise errors[0]


@dataclass(frozen=True)
class ArmPlacement:
    """Where a runtime starts an arm's processes, as `suite run --dry-run` prints it: the words in front of the
    server's `vllm serve`, then lines of the runtime's own, each (label, text): its clients, its offline tools,
    where its sessions run."""

    server: str
    lines: tuple[tuple[str, str], ...] = ()


class ArmPreparer(Protocol):
    """Makes each arm ready where its sessions will run and says what it made (every runtime: local, docker,
    and slurm, whose sessions start their processes on the nodes with the local runtime)."""

    kind: str

    def preflight(self) -> None: ...
    def prepare_arm(self, arm: str, spec: Any) -> ArmEnv: ...
    def arm_info(self, arm: str) -> ArmRuntimeInfo: ...
    def placement(self, arm: str, spec: Any, offline: bool) -> ArmPlacement: ...


@runtime_checkable
class Runtime(ArmPreparer, Protocol):
    """An arm backend: starts an arm's processes on this machine (local, docker). Each method returns a whole
    command line, environment or server spec; none depends on another having been called first."""

    client_in_server: bool

    def arm_vars(self, env: ArmEnv, dirs: ArmDirs) -> dict[str, str]: ...
    def server_spec(self, env: ArmEnv, *, argv_tail: list[str], extra_env: dict[str, str], dirs: ArmDirs,
                    log_path: Path, port: int, redact: list[str], gpus: str | None = None) -> ServerSpec: ...
    def server(self, spec: ServerSpec) -> Server: ...
    def tool(self, env: ArmEnv, argv: list[str], dirs: ArmDirs) -> ToolCommand: ...
    def client_argv(self, env: ArmEnv, argv: list[str], dirs: ArmDirs, server: Server | None = None
                    ) -> list[str]: ...
    def client_cpus(self) -> frozenset[int] | None: ...
    def device_state(self) -> list[GpuState] | None: ...


def arm_model(matrix: Matrix, arm: str) -> ServedModel:
    """The model an arm serves (its own `model:`, else the matrix's), its flags resolved."""
    return matrix.model_of(effective_arms(matrix).get(arm))


def arm_address(matrix: Matrix, arm: str) -> ServerAddress:
    """Where an arm's server listens and its clients call it (--host and --port of its serve_args)."""
    return matrix.address_of(effective_arms(matrix).get(arm))


class RuntimeBase:
    """Defaults shared by the runtimes: no extra provenance, no device state, no client CPUs."""

    kind = "base"
    matrix: Matrix
    client_in_server = False  # True: client tools run inside the server (its container), so they end with it

    def preflight(self) -> None:
        """Checks of the matrix against where it will run, before any arm is prepared: none here."""

    def arm_info(self, arm: str) -> ArmRuntimeInfo:  # noqa: ARG002
        return ArmRuntimeInfo()

    def device_state(self) -> list[GpuState] | None:
        """The accelerators' state (clocks, P-state, power) around a job; None where the runtime records none."""
        return None

    def client_cpus(self) -> frozenset[int] | None:
        return None

    def arm_env_vars(self, arm: str) -> dict[str, str]:
        """The matrix's and the arm's `env:` (what the arm's processes get besides the runtime's own)."""
        spec = effective_arms(self.matrix).get(arm)
        return {**self.matrix.env, **(spec.env if spec else {})}

    def arm_model(self, arm: str) -> ServedModel:
        """The checkpoint the arm serves (its own `model:`, else the matrix's)."""
        return arm_model(self.matrix, arm)
