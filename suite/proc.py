"""One way to run a tool: its own process group, a log file, a timeout that ends the whole group, and the
log tail in the error when it fails.

Every long-running tool the suite starts (`vllm serve`, `vllm bench serve|latency`, lm-eval, the kernel
timer, `docker build`) goes through here, so a timeout, Ctrl-C or a dead `suite` never leaves an engine
process behind. A short question to a tool (`nvidia-smi`, `git ls-remote`, `squeue`, `pip index`) goes through
`ask` (its answer; an error naming the command when the tool is missing or silent) or `query` (its stdout, or
None: a fact the suite records where it can), each with its timeout.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from suite.errors import SuiteError

STOP_GRACE_S = 10.0
# The program name a stage gives a runtime's client_argv for a Python that has lm-eval: this host's interpreter
# under the local runtime, the venv lm-eval has to itself (/opt/lm-eval) in an arm's image under docker.
LM_EVAL_PYTHON = "lm-eval-python"


def read_tail(path: Path, n: int = 40, redact: list[str] | None = None) -> str:
    """The last n lines of a log (read from its last 64 KiB), secrets replaced."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            lines = fh.read().decode(errors="replace").splitlines()[-n:]
    except OSError:
        return "(no log)"
    text = "\n".join(lines)
    for s in redact or []:
        if s:
            text = text.replace(s, "<redacted>")
    return text


def parent_death_hook(cpus: frozenset[int] | None = None):
    """Linux: a preexec hook so the child gets SIGTERM when `suite` itself dies (kill -9, OOM killer);
    otherwise a tool in its own session would outlive it and hold the GPU. prctl is resolved here, in the
    parent, so the hook in the child only makes one libc call. ``cpus``: also pin the child (and everything
    it starts) to these CPUs."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (fires when the parent *thread* ends: start from main)
        if os.getppid() != parent:  # the parent died before prctl: do not start orphaned
            os._exit(1)
        if cpus:
            os.sched_setaffinity(0, cpus)

    return hook


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, read from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def narrow_group(pgid: int, cpus: frozenset[int]) -> int:
    """Every thread of every live process in the group onto ``cpus``: a thread already held to some of them (an
    OpenMP thread vLLM bound to one core) keeps just those; the others get all of ``cpus``. Two passes, so a
    thread started while the first ran is narrowed too. Returns how many threads changed."""
    changed = 0
    for _ in range(2):
        for pid in group_members(pgid):
            for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
                tid = int(task.name)
                try:
                    now = os.sched_getaffinity(tid)
                    new = (now & cpus) or cpus
                    if new != now:
                        os.sched_setaffinity(tid, new)
                        changed += 1
                except OSError:  # the thread ended meanwhile
                    continue
    return changed


def wait_group_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if not group_members(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


_RELAYED: dict[str, Callable[[], None]] = {}


def on_stop(marker: str, end: Callable[[], None]) -> None:
    """``end`` runs when a still-running process whose command line holds the word ``marker`` is stopped
    (``stop_group``): a tool started through a relay (`docker exec`) keeps running where it is when the relay
    process here is killed, so whoever built the relay's command says how to end the tool there."""
    _RELAYED[marker] = end


def stop_group(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> bool:
    """SIGTERM to the whole process group of ``proc`` (a session leader), SIGKILL after ``grace_s``; True
    when every member is gone. A relayed tool (``on_stop``) still running is ended where it runs first."""
    if proc.poll() is None and isinstance(proc.args, list):
        for marker, end in list(_RELAYED.items()):
            if marker in proc.args:
                end()
    for sig, grace in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return True
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(grace, 0.1))
        if wait_group_gone(proc.pid, max(grace, 2.0)):
            return True
    return False


def start(cmd: list[str], *, env: dict[str, str] | None, log_path: Path, cwd: Path | None = None,
          header: str | None = None, stdin: int | None = subprocess.DEVNULL,
          stdout: int | None = None, cpus: frozenset[int] | None = None) -> subprocess.Popen:
    """Start ``cmd`` in a new session with its output appended to ``log_path`` (``header`` written first).
    ``stdout=subprocess.PIPE`` keeps stdout for a protocol and sends only stderr to the log; ``cpus`` pins
    the tool and its children."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        if header:
            log.write(header.encode())
            log.flush()
        try:
            return subprocess.Popen(cmd, env=env, cwd=cwd, stdin=stdin,
                                    stdout=log if stdout is None else stdout, stderr=log,
                                    start_new_session=True, preexec_fn=parent_death_hook(cpus))
        except OSError as exc:
            raise SuiteError(f"cannot start {cmd[0]}: {exc}\n  command: {shlex.join(cmd)}") from None


def failure(what: str, why: str, cmd: list[str], log_path: Path, tail: int = 20) -> SuiteError:
    """The error every failed tool raises: what failed and why, the command, the log tail."""
    return SuiteError(f"{what} {why}\n  command: {shlex.join(cmd)}\n  log: {log_path}\n--- log tail ---\n"
                      f"{read_tail(log_path, tail)}")


def ask(cmd: list[str], *, timeout_s: float, what: str, env: dict[str, str] | None = None,
        cwd: Path | None = None, error: type[SuiteError] = SuiteError) -> subprocess.CompletedProcess[str]:
    """A short question to a tool (no log, no process group of its own): the finished process, whatever its exit
    status, its output as text. ``error`` says ``what`` could not be done and the command when the tool is
    missing, cannot start or does not answer in ``timeout_s``."""
    try:
        return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, check=False)
    except FileNotFoundError:
        why = f"`{cmd[0]}` is not on PATH"
    except OSError as exc:
        why = f"`{cmd[0]}` cannot start: {exc}"
    except subprocess.TimeoutExpired:
        why = f"no answer in {timeout_s:g} s"
    raise error(f"{what}: {why}\n  command: {shlex.join(cmd)}")


def query(cmd: list[str], *, timeout_s: float, env: dict[str, str] | None = None) -> str | None:
    """A short question whose answer is optional (a GPU's clock, the host's CPU, a remote ref): the tool's stdout,
    or None when it is missing, fails or does not answer in ``timeout_s``."""
    try:
        proc = ask(cmd, timeout_s=timeout_s, what=cmd[0], env=env)
    except SuiteError:
        return None
    return proc.stdout if proc.returncode == 0 else None


@dataclass(frozen=True)
class ToolCommand:
    """A whole command that runs a tool in an arm's environment, as a runtime gives it: the command line and the
    environment of the process this host starts (for a container, the docker CLI's own; what the tool sees
    inside is on the command line)."""

    argv: list[str]
    env: dict[str, str]


def run_tool(cmd: list[str], *, env: dict[str, str] | None, log_path: Path, timeout_s: float | None, what: str,
             cwd: Path | None = None, header: str | None = None, cpus: frozenset[int] | None = None) -> float:
    """Run a tool to completion in its own process group; return its wall time in seconds.

    On a timeout or an interrupt (Ctrl-C, SIGTERM turned into KeyboardInterrupt) the whole group is ended;
    engine processes that outlive a finished tool are ended too. A non-zero exit raises `failure`."""
    t0 = time.monotonic()
    proc = start(cmd, env=env, log_path=log_path, cwd=cwd, header=header, cpus=cpus)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_group(proc)
        raise failure(what, f"timed out after {timeout_s:.0f} s", cmd, log_path) from None
    except BaseException:
        stop_group(proc)
        raise
    finally:
        stop_group(proc, grace_s=0.0)
    if code != 0:
        raise failure(what, f"failed (exit status {code})", cmd, log_path)
    return time.monotonic() - t0


@contextlib.contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """SIGTERM/SIGHUP behave like Ctrl-C, so context managers stop servers on the way out."""

    def handler(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def cpu_split(reserve_for_client: int = 1) -> tuple[frozenset[int], frozenset[int]] | None:
    """(server CPUs, client CPUs) out of the CPUs this process may use: the client gets the last
    ``reserve_for_client``, the server the rest. None when there are too few CPUs to split."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    if len(allowed) <= reserve_for_client:
        return None
    return frozenset(allowed[:-reserve_for_client]), frozenset(allowed[-reserve_for_client:])


def cpu_list(cpus: frozenset[int]) -> str:
    """The CPU list syntax of taskset and VLLM_CPU_OMP_THREADS_BIND: 0,2-3."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
        else:
            if run:
                out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def load_average() -> tuple[float, float, float] | None:
    """The host's 1-, 5- and 15-minute load averages (None where the OS does not report them)."""
    try:
        return os.getloadavg()
    except OSError:
        return None


def cpu_timings(seconds: float, cpus: list[int] | None = None, pause_s: float = 0.05,
                work: int = 500_000) -> dict[int, list[float]]:
    """Time one fixed pure-Python task (summing ``work`` integers) again and again on each CPU for about
    ``seconds``: the same work should take the same time, so the spread of these timings is the machine's own
    (a shared host, frequency changes), which no benchmark on it can average away cheaply."""
    allowed = sorted(os.sched_getaffinity(0))
    cpus = cpus or allowed
    out: dict[int, list[float]] = {c: [] for c in cpus}
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            for c in cpus:
                os.sched_setaffinity(0, {c})
                t0 = time.perf_counter()
                sum(range(work))
                out[c].append(time.perf_counter() - t0)
            time.sleep(pause_s)
    finally:
        os.sched_setaffinity(0, set(allowed))
    return out


WATCHDOG = """
import os, signal, sys, time
pgid, grace = int(sys.argv[1]), float(sys.argv[2])
def alive():
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
def end(*_):
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        sys.exit(0)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and alive():
        time.sleep(0.2)
    if alive():
        os.killpg(pgid, signal.SIGKILL)
    sys.exit(0)
signal.signal(signal.SIGTERM, end)
signal.signal(signal.SIGHUP, end)
while alive():
    time.sleep(1.0)
"""


def group_watchdog(pgid: int, grace_s: float = 10.0) -> subprocess.Popen | None:
    """A small process that ends the process group ``pgid`` (SIGTERM, then SIGKILL after ``grace_s``) when
    `suite` dies without stopping it (kill -9, OOM killer), and exits by itself once the group is gone.

    The parent-death signal alone reaches only the group's leader: a vLLM API server that gets it while its
    engine is still starting can wait for that engine forever, and its engine and worker processes do not
    watch their parent. Linux only (None elsewhere)."""
    hook = parent_death_hook()
    if hook is None:
        return None
    return subprocess.Popen([sys.executable, "-I", "-c", WATCHDOG, str(pgid), str(grace_s)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=hook)
