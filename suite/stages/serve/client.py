"""The `vllm bench serve` client of a session: one long-lived worker process for all its points.

``PersistentClient`` starts ``client_worker.py`` once (locally: ``python client_worker.py``; in an arm's
container: a command prefix such as ``["docker", "exec", "-i", name, "python3", "/suite/client_worker.py"]``)
and sends it each point's ``vllm bench serve`` arguments, so a point costs its measurement instead of a
Python start-up and vLLM's imports (~10 s on a 2-core box). The worker runs vLLM's own benchmark code with
vLLM's own parser, and vLLM's code writes the result JSON: same flags, defaults and keys as the CLI.

The CLI stays available: ``mode="cli"`` runs every point as ``vllm bench serve ...`` (today's path), and a
persistent client falls back to it by itself when the worker's handshake says this vLLM's benchmark module is
not what the CLI runs, or the worker dies before its handshake. The returned ``ClientRecord.mode`` says which ran.

Paths in the arguments (``--result-dir``, a point's log) are used by the worker as they are: a worker in a
container needs the run directory mounted at the same path.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from suite.errors import SuiteError
from suite.proc import failure, start, stop_group
from suite.records import ClientMode, ClientRecord

WORKER_PATH = Path(__file__).with_name("client_worker.py")
START_TIMEOUT_S = 180.0  # vLLM's imports: ~10 s on 2 idle cores, much more on a loaded box
KILL_GRACE_S = 15.0  # past the worker's own timeout (it cancels the point itself), the parent ends it


# ------------------------------------------------------------------------------------------ argv helpers


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``--flag value`` or ``--flag=value`` in argv (the last one wins, as in argparse)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
    return value


def without_flag(argv: Sequence[str], flag: str, *, takes_value: bool = True) -> list[str]:
    """argv without ``flag`` (and its one value, unless takes_value is False), in either spelling."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == flag:
            skip = takes_value
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return out


def with_flag(argv: Sequence[str], flag: str, value: str) -> list[str]:
    """argv with ``flag`` set to value (any earlier occurrence removed, the new one at the end)."""
    return [*without_flag(argv, flag), flag, value]


def result_argv(argv: Sequence[str], result_path: Path) -> tuple[list[str], Path]:
    """argv that makes vLLM save its result under a temporary name next to result_path, and that name.

    A caller's own ``--result-dir``/``--result-filename`` are kept; otherwise ``.<name>.partial`` in the
    result's directory is added (with ``--save-result``)."""
    argv = list(argv)
    if "--save-result" not in argv:
        argv.append("--save-result")
    if flag_value(argv, "--result-filename") is None:
        argv = with_flag(with_flag(argv, "--result-dir", str(result_path.parent)), "--result-filename",
                         f".{result_path.name}.partial")
    name = flag_value(argv, "--result-filename")
    assert name is not None
    return argv, Path(flag_value(argv, "--result-dir") or ".") / name


# ------------------------------------------------------------------------------------------ the client


class _WorkerGone(Exception):
    """The worker process ended (EOF on its stdout, or a broken pipe)."""


class PersistentClient:
    """One client process per server session (a context manager).

    ``worker``: the Python executable that runs ``client_worker.py`` (a str), or the full command that
    starts it (a list, e.g. through ``docker exec -i``). ``cli``: the `vllm` command for the CLI path
    (default: ``vllm`` next to the given Python, else on PATH). ``log_path``: the worker's log (its stderr,
    vLLM's prints); a point may log elsewhere (``run(log_path=...)``)."""

    def __init__(self, worker: str | Sequence[str] = sys.executable, *, env: dict[str, str] | None = None,
                 log_path: Path, cli: Sequence[str] | None = None, mode: ClientMode = "persistent",
                 start_timeout_s: float = START_TIMEOUT_S, kill_grace_s: float = KILL_GRACE_S,
                 cwd: Path | None = None, cpus: frozenset[int] | None = None):
        if mode not in ("persistent", "cli"):
            raise SuiteError(f"unknown client mode {mode!r} (persistent or cli)")
        self.worker_cmd = [worker, str(WORKER_PATH)] if isinstance(worker, str) else list(worker)
        self.cli = list(cli) if cli is not None else _default_vllm(self.worker_cmd[0])
        self.env, self.log_path, self.cwd, self.cpus = env, Path(log_path), cwd, cpus
        self.mode: ClientMode = mode
        self.start_timeout_s, self.kill_grace_s = start_timeout_s, kill_grace_s
        self.fallback_reason: str | None = None
        self.handshake: dict[str, Any] | None = None
        self.starts = 0  # worker processes started
        self.restarts = 0  # of them, after a worker died
        self._proc: subprocess.Popen | None = None
        self._buf = b""
        self._next_id = 0

    # -- lifetime

    def __enter__(self) -> PersistentClient:
        if self.mode == "persistent":
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """The local worker process (for ``docker exec`` the docker client, not the process inside)."""
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the worker and read its handshake; on a refusal or an early death, use the CLI from now."""
        self._stop_worker()
        self.starts += 1
        header = f"--- suite: client worker start {self.starts}: {shlex.join(self.worker_cmd)}\n"
        try:
            self._proc = start(self.worker_cmd, env=self.env, log_path=self.log_path, cwd=self.cwd,
                               header=header, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cpus=self.cpus)
        except SuiteError as exc:
            self._fall_back(f"the worker could not be started: {str(exc).splitlines()[0]}")
            return
        self._buf = b""
        try:
            hello = self._read_message(time.monotonic() + self.start_timeout_s)
        except _WorkerGone:
            self._fall_back(f"the worker exited before its handshake (exit status {self._exit_status()})")
            return
        except TimeoutError:
            self._fall_back(f"no handshake from the worker within {self.start_timeout_s:.0f} s")
            return
        except BaseException:  # Ctrl-C while vLLM imports: leave no worker behind
            self._stop_worker()
            raise
        if not hello.get("ready"):
            self._fall_back(f"the worker cannot run vLLM's benchmark module: {hello.get('error')}")
            return
        self.handshake = hello

    def close(self) -> None:
        """End the worker: EOF on its stdin (it exits between points), then the process group."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10.0)
        stop_group(proc, grace_s=5.0)
        if proc.stdout is not None:
            proc.stdout.close()

    def _stop_worker(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_group(proc, grace_s=2.0)
            for stream in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    if stream is not None:
                        stream.close()

    def _fall_back(self, reason: str) -> None:
        self._stop_worker()
        self.mode = "cli"
        self.fallback_reason = reason
        with contextlib.suppress(OSError), open(self.log_path, "a") as log:
            log.write(f"--- suite: falling back to `vllm bench serve` (the CLI): {reason}\n")

    def _exit_status(self) -> int | None:
        """The worker's exit status (waiting a little: its stdout closes just before it exits)."""
        if self._proc is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self._proc.wait(timeout=5.0)
        return None

    # -- one point

    def command(self, argv: Sequence[str]) -> list[str]:
        """The `vllm bench serve` command line the CLI path runs for argv."""
        return [*self.cli, "bench", "serve", *argv]

    def run(self, argv: Sequence[str], result_path: Path, timeout_s: float, *,
            log_path: Path | None = None) -> ClientRecord:
        """Run one point (argv: the arguments after `vllm bench serve`); vLLM's result JSON lands at
        result_path atomically (written by vLLM under a temporary name, then renamed). Raises SuiteError
        with the command and the log tail when the point fails or times out."""
        if isinstance(argv, str) or not all(isinstance(a, str) for a in argv):
            raise SuiteError("the client's argv must be a list of strings (the arguments after "
                             "`vllm bench serve`)")
        argv, tmp = result_argv(argv, Path(result_path))
        result_path = Path(result_path)
        result_path.parent.mkdir(parents=True, exist_ok=True)
        tmp.unlink(missing_ok=True)
        log = Path(log_path) if log_path is not None else self.log_path
        cmd = self.command(argv)
        if self.mode == "persistent":
            run = self._run_persistent(argv, cmd, timeout_s, log_path)
        else:
            run = self._run_cli(cmd, timeout_s, log)
        if not tmp.is_file():
            raise failure("`vllm bench serve`", f"wrote no result file ({tmp})", cmd, log)
        os.replace(tmp, result_path)
        return run

    def _run_persistent(self, argv: list[str], cmd: list[str], timeout_s: float,
                        log_path: Path | None) -> ClientRecord:
        log = log_path or self.log_path
        restarted = False
        while True:
            if not self.alive():
                if self._proc is not None:  # found dead between points
                    self._note_death()
                    restarted = True
                self.start()
                if self.mode == "cli":
                    return self._run_cli(cmd, timeout_s, log)
            try:
                return self._ask(argv, cmd, timeout_s, log_path)
            except _WorkerGone:
                status = self._note_death()
                if restarted:
                    raise failure("`vllm bench serve` (persistent client)",
                                  f"died again after a restart (exit status {status})", cmd, log) from None
                restarted = True

    def _note_death(self) -> int | None:
        """Log a dead worker, count the restart that follows, clear it; its exit status."""
        status = self._exit_status()
        self._stop_worker()
        self.restarts += 1
        with contextlib.suppress(OSError), open(self.log_path, "a") as fh:
            fh.write(f"--- suite: the client worker died (exit status {status}); restarting it\n")
        return status

    def _ask(self, argv: list[str], cmd: list[str], timeout_s: float, log_path: Path | None) -> ClientRecord:
        assert self._proc is not None and self._proc.stdin is not None
        self._next_id += 1
        rid = self._next_id
        request = {"id": rid, "argv": argv, "timeout_s": timeout_s}
        if log_path is not None:
            request["log"] = str(log_path)
        log = log_path or self.log_path
        t0 = time.monotonic()
        try:
            self._proc.stdin.write((json.dumps(request) + "\n").encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise _WorkerGone() from None
        try:
            reply = self._read_message(t0 + timeout_s + self.kill_grace_s)
        except TimeoutError:
            self._stop_worker()
            raise failure("`vllm bench serve` (persistent client)",
                          f"timed out after {timeout_s:.0f} s; the worker was ended", cmd, log) from None
        wall = time.monotonic() - t0
        if reply.get("id") != rid:
            self._stop_worker()
            raise failure("`vllm bench serve` (persistent client)",
                          f"broke the protocol: answer {reply!r} to request {rid}", cmd, log)
        if reply.get("timed_out"):
            self._stop_worker()  # a cancelled point may leave state behind: the next point gets a new worker
            raise failure("`vllm bench serve` (persistent client)", f"timed out after {timeout_s:.0f} s",
                          cmd, log)
        if not reply.get("ok"):
            error = str(reply.get("error") or "no error given").strip().splitlines() or ["?"]
            raise failure("`vllm bench serve` (persistent client)", f"failed: {error[-1]}", cmd, log)
        return ClientRecord(mode="persistent", wall_s=round(wall, 6), client_cpu_s=reply.get("client_cpu_s"),
                         client_cpu_util=reply.get("client_cpu_util"), command=cmd,
                         bench_wall_s=reply.get("bench_wall_s"), bench_cpu_s=reply.get("bench_cpu_s"))

    def _read_message(self, deadline: float) -> dict[str, Any]:
        """The next JSON object line from the worker's stdout; other lines are copied to the log."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                if not line.strip():
                    continue
                try:
                    message = json.loads(line)
                except ValueError:
                    message = None
                if isinstance(message, dict):
                    return message
                with contextlib.suppress(OSError), open(self.log_path, "ab") as fh:
                    fh.write(b"--- suite: not a protocol line on the worker's stdout: " + line[:2000] + b"\n")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError()
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise _WorkerGone()
            self._buf += chunk

    def _run_cli(self, cmd: list[str], timeout_s: float, log: Path) -> ClientRecord:
        t0 = time.monotonic()
        proc = start(cmd, env=self.env, log_path=log, cwd=self.cwd, cpus=self.cpus,
                     header=f"--- suite: vllm bench serve (CLI): {shlex.join(cmd)}\n")
        try:
            done = _wait_child(proc, timeout_s)
        except BaseException:
            stop_group(proc)
            raise
        finally:
            stop_group(proc, grace_s=0.0)
        wall = time.monotonic() - t0
        if done is None:
            raise failure("`vllm bench serve`", f"timed out after {timeout_s:.0f} s", cmd, log)
        code, cpu = done
        if code != 0:
            raise failure("`vllm bench serve`", f"failed (exit status {code})", cmd, log)
        return ClientRecord(mode="cli", wall_s=round(wall, 6), client_cpu_s=round(cpu, 6),
                         client_cpu_util=round(cpu / wall, 4) if wall > 0 else None, command=cmd,
                         fallback_reason=self.fallback_reason)


def _wait_child(proc: subprocess.Popen, timeout_s: float) -> tuple[int, float] | None:
    """Wait for the child and return (exit code, its user+sys CPU seconds, descendants it waited for
    included), or None after timeout_s. wait4 gives this child's own rusage, whatever else runs."""
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_utime + usage.ru_stime
        if time.monotonic() >= deadline:
            return None
        time.sleep(delay)
        delay = min(2 * delay, 0.05)


def _default_vllm(python: str) -> list[str]:
    """`vllm` beside the given Python, else on PATH, else that Python running vLLM's CLI module (a
    `pip install --target` installs no console script)."""
    exe = Path(python).parent / "vllm"
    if exe.is_file():
        return [str(exe)]
    return ["vllm"] if shutil.which("vllm") else [python, "-m", "vllm.entrypoints.cli.main"]
