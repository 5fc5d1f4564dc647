"""Docker runtime: each arm's vLLM runs in its own image (built on demand by suite.runtime.docker.images), and so
does every vLLM-side tool of the arm: the host needs Python, the suite and the Docker SDK, nothing of vLLM.

Where each tool runs:

- the server: a container of the arm's image (`vllm serve`), its port published on ``runtime.host``;
- client tools (the `vllm bench serve` client, lm-eval, the profile stage's bursts): ``docker exec -i`` into
  that running server container, so they use the arm's own vLLM and lm-eval, reach the server on the
  container's own 127.0.0.1 (the same URL the host uses: the port is published 1:1) and share its mounts and
  user. Without a running server (no stage does this today) a sibling container of the same image on the host
  network;
- below-serving tools (`vllm bench latency`, the kernel benchmark, run without a server): a fresh container of
  the arm's image, ``docker run --rm --init``, with the same mounts, environment, vendor device flags and user
  as the server.

Commands map onto the image: ``vllm`` is the image's vllm, ``python`` its python3, lm-eval the one in its own
venv (/opt/lm-eval/bin/python), and the suite's own in-image tools (the persistent bench client
``client_worker.py``, the kernel benchmark ``suite.stages.kernel.bench``) are the copies every image built by
`suite build` carries under /opt/suite/tools (part of the image's content identity).

Every container gets: the vendor's run flags (CUDA: --gpus, --ipc=host; ROCm: /dev/kfd, /dev/dri, the numeric
group ids of those device nodes on this host, --ipc=host, SYS_PTRACE, seccomp=unconfined; CPU: a larger
/dev/shm), the invoking user (``--user uid:gid``; $SUITE_DOCKER_USER overrides) so that everything written to
the mounts belongs to the user, the run directory and the HF cache bound read-write at the same absolute
paths (result and log paths work unchanged), a local model directory read-only at its path, HOME and the
compile caches per arm under ``<run>/<arm>/cache`` (``home/``, ``vllm/``, ``inductor/``, ``triton/``: they
survive server restarts within a run; AITER's JIT directory is ``$HOME/.aiter/jit`` for a non-root user, so it
is per arm too). Secrets such as HF_TOKEN are passed by name from the host environment only: never stored in a
spec, a file, a log, a printed command or the manifest. Containers carry the run id as a label; server
containers are stopped (SIGTERM, then SIGKILL) and removed when the server context exits, also on Ctrl-C /
SIGTERM (the runner turns both into KeyboardInterrupt); tool containers remove themselves (--rm).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import pwd
import re
import secrets
import shlex
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suite import REPO_ROOT
from suite.errors import ServerError, SuiteError
from suite.matrix import GPU_LIST, ArmSpec, DockerSpec, Matrix
from suite.proc import LM_EVAL_PYTHON, ToolCommand, on_stop, read_tail, run_tool
from suite.runtime.base import ArmEnv, ArmPlacement, RuntimeBase, Server, ServerBase, ServerSpec, arm_model
from suite.runtime.docker.bases import engine_is_here
from suite.runtime.gpu import gpu_state
from suite.store import SECRET_NAME, ArmDirs, ArmRuntimeInfo, GpuState, ImageInfo

STOP_GRACE_S = 30
PASS_THROUGH = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")  # by name only, from the host environment
# What a stage may add to a client tool's environment (offline datasets, lm-eval's private datasets cache,
# tokenizer threads): forwarded by name into `docker exec`, so the value comes from the stage's environment.
CLIENT_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_DATASETS_CACHE", "TOKENIZERS_PARALLELISM")
MANAGED_LABEL = "suite.managed"
CPU_SHM_SIZE = "1g"
DEV = Path("/dev")  # where the ROCm device nodes are looked up (their group ids go to --group-add)
DOCKER_USER_ENV = "SUITE_DOCKER_USER"

# the suite's tools inside every image `suite build` makes (docker/<vendor>/Dockerfile copies suite-src/ to
# /opt/suite; suite.runtime.docker.images puts them in the build context)
IMAGE_TOOLS = "/opt/suite/tools"
IMAGE_WORKER = f"{IMAGE_TOOLS}/client_worker.py"
IMAGE_KERNEL_BENCH = f"{IMAGE_TOOLS}/kernel_bench.py"
IMAGE_LAYER_BENCH = f"{IMAGE_TOOLS}/layer_bench.py"  # imports kernel_bench, the file beside it
IMAGE_PYTHON = "python3"
# lm-eval's own virtual environment in every image `suite build` makes (docker/lm_eval_venv.py): it sees the
# image's packages but never changes them
IMAGE_LM_EVAL_PYTHON = "/opt/lm-eval/bin/python"
IMAGE_MODULES = {"suite.stages.kernel.bench": IMAGE_KERNEL_BENCH,  # `python -m` of the suite -> its image file
                 "suite.stages.layer.bench": IMAGE_LAYER_BENCH}
# the persistent bench client as the serve stage starts it (`python <this file>`; suite.stages.serve.client)
WORKER_PATH = REPO_ROOT / "suite" / "stages" / "serve" / "client_worker.py"


@dataclass(frozen=True)
class ContainerConfig:
    """One container, described once and rendered both as Docker SDK arguments and as the equivalent
    `docker run` command line (the command line is what runs tool containers)."""

    name: str
    image: str
    command: list[str]
    entrypoint: list[str] = field(default_factory=lambda: ["vllm", "serve"])
    environment: dict[str, str] = field(default_factory=dict)  # never holds a secret
    pass_env: list[str] = field(default_factory=list)  # names whose values come from the host env
    mounts: list[tuple[str, str, str]] = field(default_factory=list)  # (host path, container path, ro|rw)
    publish: tuple[str, int, int] | None = None  # (host ip, host port, container port)
    labels: dict[str, str] = field(default_factory=dict)
    gpus: str | None = None  # cuda: "all" or "0,1"
    devices: list[str] = field(default_factory=list)
    group_add: list[str] = field(default_factory=list)
    cap_add: list[str] = field(default_factory=list)
    security_opt: list[str] = field(default_factory=list)
    ipc_mode: str | None = None
    shm_size: str | None = None
    user: str | None = None  # "uid:gid"
    init: bool = False  # --init: signals reach the tool (a plain PID 1 ignores SIGTERM)
    network: str | None = None  # e.g. "host" for a client container without a server to exec into
    interactive: bool = False  # -i: keep stdin open (the persistent bench client's protocol)

    def cli_argv(self) -> list[str]:
        argv = ["docker", "run", "--rm", "--name", self.name]
        if self.interactive:
            argv.append("-i")
        if self.init:
            argv.append("--init")
        for k, v in sorted(self.labels.items()):
            argv += ["--label", f"{k}={v}"]
        if self.user:
            argv += ["--user", self.user]
        if self.gpus is not None:
            argv += ["--gpus", "all" if self.gpus == "all" else f'"device={self.gpus}"']
        for d in self.devices:
            argv += ["--device", d]
        for g in self.group_add:
            argv += ["--group-add", g]
        if self.ipc_mode:
            argv.append(f"--ipc={self.ipc_mode}")
        if self.shm_size:
            argv += ["--shm-size", self.shm_size]
        for c in self.cap_add:
            argv += ["--cap-add", c]
        for s in self.security_opt:
            argv += ["--security-opt", s]
        if self.network:
            argv.append(f"--network={self.network}")
        if self.publish:
            ip, host_port, port = self.publish
            argv += ["-p", f"{ip}:{host_port}:{port}"]
        for host, cont, mode in self.mounts:
            argv += ["-v", f"{host}:{cont}" + (":ro" if mode == "ro" else "")]
        for k, v in sorted(self.environment.items()):
            argv += ["-e", k if SECRET_NAME.search(k) else f"{k}={v}"]  # a secret: by name, never its value
        for name in self.pass_env:
            argv += ["-e", name]  # the docker CLI, like the SDK call, takes the value from the environment
        argv += ["--entrypoint", self.entrypoint[0], self.image, *self.entrypoint[1:], *self.command]
        return argv

    def cli(self) -> str:
        return shlex.join(self.cli_argv())

    def sdk_kwargs(self, host_env: dict[str, str] | None = None) -> dict[str, Any]:
        """Arguments of `client.containers.create`; secrets are looked up in host_env only here."""
        from docker.types import Mount

        host_env = os.environ if host_env is None else host_env
        env = dict(self.environment)
        env.update({n: host_env[n] for n in self.pass_env if host_env.get(n)})
        kwargs: dict[str, Any] = {
            "image": self.image, "name": self.name, "command": self.command, "entrypoint": self.entrypoint,
            "environment": env, "labels": dict(self.labels), "detach": True,
            "mounts": [Mount(target=c, source=h, type="bind", read_only=m == "ro") for h, c, m in self.mounts],
        }
        if self.publish:
            ip, host_port, port = self.publish
            kwargs["ports"] = {f"{port}/tcp": (ip, host_port)}
        if self.gpus is not None:
            kwargs["device_requests"] = gpu_requests(self.gpus)
        for key, value in (("devices", self.devices), ("group_add", self.group_add), ("cap_add", self.cap_add),
                           ("security_opt", self.security_opt)):
            if value:
                kwargs[key] = list(value)
        for key, value in (("ipc_mode", self.ipc_mode), ("shm_size", self.shm_size), ("user", self.user),
                           ("network_mode", self.network)):
            if value:
                kwargs[key] = value
        if self.init:
            kwargs["init"] = True
        if self.interactive:
            kwargs["stdin_open"] = True
        return kwargs

    def host_dirs(self) -> list[Path]:
        """Directories that must exist on the host before the container starts: the read-write mounts and the
        per-arm HOME and caches inside them (created as the invoking user, so the container can write)."""
        dirs = [Path(h) for h, _, mode in self.mounts if mode == "rw"]
        dirs += [Path(self.environment[k]) for k in CACHE_VARS if k in self.environment]
        return dirs


CACHE_VARS = ("HOME", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "HF_HOME")


def gpu_requests(gpus: str) -> list[Any]:
    """`--gpus all` / `--gpus "device=0,1"` as the SDK's device requests (the NVIDIA Container Toolkit serves them)."""
    from docker.types import DeviceRequest

    if gpus == "all":
        return [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return [DeviceRequest(device_ids=gpus.split(","), capabilities=[["gpu"]])]


def rocm_group_ids(dev: Path | None = None) -> list[str]:
    """The numeric group ids of the host's ROCm device nodes (/dev/kfd, /dev/dri/renderD*, /dev/dri/card*):
    what --group-add needs for a non-root user to open them. By id, not by name: recent ROCm images have no
    `render` group, and `--group-add render` then stops the container. No such node (a dry run on a host
    without AMD GPUs): `video`, which every Debian/Ubuntu image has."""
    dev = DEV if dev is None else dev
    nodes = [dev / "kfd", *sorted((dev / "dri").glob("renderD*")), *sorted((dev / "dri").glob("card*"))]
    gids: list[int] = []
    for node in nodes:
        try:
            gid = node.stat().st_gid
        except OSError:
            continue
        if gid not in gids:
            gids.append(gid)
    return [str(g) for g in sorted(gids)] or ["video"]


def vendor_flags(docker: DockerSpec) -> dict[str, Any]:
    """The vendor's run flags (docker/README.md) as ContainerConfig fields (+ environment for ROCm GPU selection)."""
    gpus = docker.gpus.strip().replace(" ", "")
    if gpus != "all" and not GPU_LIST.match(gpus):
        raise SuiteError(f"runtime.docker.gpus must be 'all' or a comma list of device indices, not {gpus!r}")
    flags: dict[str, Any] = {"shm_size": docker.shm_size}
    if docker.vendor == "cpu":
        # no --ipc=host on a laptop/CI: a private /dev/shm, larger than Docker's 64 MiB (vLLM's shm
        # broadcast ring alone wants 160 MiB)
        flags["shm_size"] = docker.shm_size or CPU_SHM_SIZE
    elif docker.vendor == "cuda":
        flags.update(gpus=gpus, ipc_mode="host")
    elif docker.vendor == "rocm":
        flags.update(devices=["/dev/kfd", "/dev/dri"], group_add=rocm_group_ids(), ipc_mode="host",
                     cap_add=["SYS_PTRACE"], security_opt=["seccomp=unconfined"])
        if gpus != "all":
            flags["environment"] = {"HIP_VISIBLE_DEVICES": gpus}
    return flags


def container_user() -> str:
    """The invoking user as `uid:gid` (files the container writes into the mounts are then the user's);
    $SUITE_DOCKER_USER overrides (e.g. `0:0` for an image that must run as root)."""
    return os.environ.get(DOCKER_USER_ENV) or f"{os.getuid()}:{os.getgid()}"


def user_name() -> str:
    """USER / LOGNAME for the container: the host user's name (getpass.getuser() inside then works for a uid
    the image's /etc/passwd does not know)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return "suite"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text).strip("-.") or "x"


def hf_cache_dir(docker: DockerSpec) -> Path:
    if docker.hf_cache:
        return Path(docker.hf_cache).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"])
    return Path.home() / ".cache" / "huggingface"


def hub_cache_dir(docker: DockerSpec) -> Path:
    """Where the containers' hub cache is: this host's $HF_HUB_CACHE (the hub's own override, where a user's
    models already are) unless the matrix names docker.hf_cache, else <HF_HOME>/hub."""
    if not docker.hf_cache and os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    return hf_cache_dir(docker) / "hub"


def image_argv(argv: list[str]) -> list[str]:
    """A tool's command line as the arm's image runs it: `vllm` is the image's vllm, `python` its python3, the
    persistent bench client and `python -m suite.stages.kernel.bench` the copies under /opt/suite/tools;
    lm-eval (`lm-eval-python ...`, LM_EVAL_PYTHON, or `python -m lm_eval ...`) runs in its own venv,
    /opt/lm-eval."""
    if not argv:
        raise SuiteError("no command to run in the arm's image")
    if argv[0] == LM_EVAL_PYTHON:
        return [IMAGE_LM_EVAL_PYTHON, *argv[1:]]
    if argv[0] not in ("python", "python3", sys.executable):
        return list(argv)
    rest = list(argv[1:])
    if len(rest) >= 2 and rest[0] == "-m" and rest[1].split(".")[0] == "lm_eval":
        return [IMAGE_LM_EVAL_PYTHON, *rest]
    if rest and Path(rest[0]) == WORKER_PATH:
        return [IMAGE_PYTHON, IMAGE_WORKER, *rest[1:]]
    if len(rest) >= 2 and rest[0] == "-m" and rest[1].split(".")[0] == "suite":
        if rest[1] not in IMAGE_MODULES:
            raise SuiteError(f"`python -m {rest[1]}` cannot run in an arm's image: the images carry only "
                             f"{', '.join(sorted(IMAGE_MODULES))} of the suite")
        return [IMAGE_PYTHON, IMAGE_MODULES[rest[1]], *rest[2:]]
    return [IMAGE_PYTHON, *rest]


def exec_argv(container: str, argv: list[str], forward: Iterable[str] = CLIENT_ENV,
              marker: str | None = None) -> list[str]:
    """`docker exec -i` of a client tool in a running container (the arm's server): its environment is the
    container's, plus the names in ``forward`` taken from the calling environment (unset there: not set), plus
    ``marker`` (``NAME=value``), by which ``end_exec`` finds the tool's processes in the container."""
    cmd = ["docker", "exec", "-i"]
    for name in forward:
        cmd += ["-e", name]
    if marker is not None:
        cmd += ["-e", marker]
    return [*cmd, container, *image_argv(argv)]


# every process of the exec (children inherit the environment) by its marker; TERM, then KILL what is left
END_EXEC = ('for sig in TERM KILL; do for p in /proc/[0-9]*; do grep -qsxzF "$0" "$p/environ" && '
            'kill -s "$sig" "${p#/proc/}" 2>/dev/null; done; [ "$sig" = TERM ] && sleep 2; done; true')


def end_exec(client: Any, container: str, marker: str) -> None:
    """End the processes of one `docker exec` in ``container``: killing the local `docker exec` leaves them
    running there (docker/cli#5309), still sending requests while the next point is measured."""
    from docker.errors import DockerException

    with contextlib.suppress(DockerException):  # the container is gone: so are its processes
        client.containers.get(container).exec_run(["sh", "-c", END_EXEC, marker])


def _arm_settings(matrix: Matrix, env: ArmEnv, *, dirs: ArmDirs, extra_env: dict[str, str], role: str
                  ) -> dict[str, Any]:
    """What every container of an arm shares (server, tools, clients): vendor flags, user, mounts, HOME and the
    per-arm caches, labels; as ContainerConfig keyword arguments."""
    docker = matrix.runtime.docker or DockerSpec()
    flags = vendor_flags(docker)
    root = dirs.run.resolve()
    cache_dir = dirs.cache.resolve()
    hf = hf_cache_dir(docker).resolve()
    hub = hub_cache_dir(docker).resolve()
    name = user_name()
    environment = {
        "HOME": str(cache_dir / "home"),  # writable for any uid; flashinfer, AITER (~/.aiter/jit), ... cache here
        "USER": name,
        "LOGNAME": name,
        "HF_HOME": str(hf),
        "VLLM_CACHE_ROOT": str(cache_dir / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor"),
        "TRITON_CACHE_DIR": str(cache_dir / "triton"),
        # no TMPDIR: the container's /tmp is its own (and vLLM's zmq socket paths must stay < 108 bytes)
        **({"HF_HUB_CACHE": str(hub)} if hub != hf / "hub" else {}),
        **flags.pop("environment", {}),
    }
    mounts = [(str(hf), str(hf), "rw"), (str(root), str(root), "rw")]
    if not hub.is_relative_to(hf):
        mounts.append((str(hub), str(hub), "rw"))
    if not cache_dir.is_relative_to(root):
        mounts.append((str(cache_dir), str(cache_dir), "rw"))
    model_spec = arm_model(matrix, env.arm)
    model = Path(model_spec.id)
    if model.is_absolute() and model.is_dir():
        mounts.append((str(model), str(model), "ro"))
        environment["HF_HUB_OFFLINE"] = "1"
    tok = model_spec.tokenizer
    if Path(tok).is_absolute() and Path(tok).is_dir() and Path(tok) != model:
        mounts.append((tok, tok, "ro"))
    data = Path(matrix.accuracy.dataset) if matrix.accuracy is not None else None
    if data is not None and data.is_dir() and not data.resolve().is_relative_to(root):  # lm-eval reads it inside
        mounts.append((str(data.resolve()), str(data.resolve()), "ro"))
    environment.update(extra_env)
    run_id = root.name
    return dict(
        image=env.image or "", environment=environment, mounts=mounts, user=container_user(),
        pass_env=[n for n in PASS_THROUGH if os.environ.get(n) and n not in extra_env],
        labels={MANAGED_LABEL: "1", "suite.run-id": run_id, "suite.arm": env.arm, "suite.matrix": matrix.name,
                "suite.role": role},
        **flags)


def container_config(matrix: Matrix, env: ArmEnv, *, argv_tail: list[str], extra_env: dict[str, str],
                     dirs: ArmDirs, port: int, name_suffix: str = "") -> ContainerConfig:
    """The server container of one arm: `vllm serve ARGV_TAIL` with the port published on runtime.host."""
    command = list(argv_tail)
    for i, arg in enumerate(command[:-1]):
        if arg == "--host":
            command[i + 1] = "0.0.0.0"  # inside the container; the port is published on runtime.host only
    settings = _arm_settings(matrix, env, dirs=dirs,
                             extra_env={"VLLM_SERVER_DEV_MODE": "1", **extra_env},  # mounts /reset_prefix_cache
                             role="server")
    name = _safe(f"suite-{dirs.run.name}-{env.arm}{name_suffix}")[:120]
    return ContainerConfig(name=name, command=command, publish=(matrix.runtime.host, port, port), **settings)


def tool_config(matrix: Matrix, env: ArmEnv, argv: list[str], *, extra_env: dict[str, str], dirs: ArmDirs,
                name_suffix: str = "", client: bool = False) -> ContainerConfig:
    """A fresh container of the arm's image running one tool to completion (`docker run --rm --init`): the
    server's mounts, environment, device flags and user. ``client``: a client tool without a server to exec
    into (host network, stdin open, the forwarded client environment)."""
    settings = _arm_settings(matrix, env, dirs=dirs, extra_env=extra_env, role="client" if client else "tool")
    settings["pass_env"] = [n for n in dict.fromkeys([*settings["pass_env"], *CLIENT_ENV])
                            if n not in settings["environment"]]
    cmd = image_argv(argv)
    name = _safe(f"suite-{dirs.run.name}-{env.arm}{name_suffix}")[:120]
    return ContainerConfig(name=name, entrypoint=[cmd[0]], command=cmd[1:], init=True,
                           network="host" if client else None, interactive=client, **settings)


# AITER picks its JIT directory at import: the package's own aiter/jit when writable, else $HOME/.aiter/jit, which
# it fills by copying the package's whole tree (prebuilt modules included) when that directory does not exist
# yet, with no lock (ROCm/aiter aiter/jit/core.py, get_user_jit_dir). A non-root server's API process, engine
# core and tensor-parallel workers import it at once and race on that copy. One tool container of the arm's
# image imports it first, alone; the server's processes then find the copy made.
AITER_SEED = ["python3", "-c", "import aiter.jit.core"]
AITER_SEED_TIMEOUT_S = 1800.0


def aiter_home_jit(container: ContainerConfig) -> Path | None:
    """Where a ROCm container's AITER would copy its JIT tree, or None when it copies none there (AITER_JIT_DIR
    given, or running as root: the package directory is writable)."""
    env = container.environment
    if "AITER_JIT_DIR" in env or "AITER_JIT_DIR" in container.pass_env or container.user in (None, "0", "0:0"):
        return None
    return Path(env["HOME"]) / ".aiter" / "jit" if "HOME" in env else None


@dataclass(frozen=True)
class DockerServerSpec(ServerSpec):
    container: ContainerConfig | None = None
    prestart: ContainerConfig | None = None  # a tool container run to completion before the server (AITER_SEED)


class DockerServer(ServerBase):
    """A vLLM server container: created, started, logs streamed into the run dir, stopped and removed."""

    def __init__(self, spec: DockerServerSpec, client: Any):
        self.spec = spec
        self.client = client
        self.container: Any = None
        self._log_thread: threading.Thread | None = None

    @property
    def config(self) -> ContainerConfig:
        assert self.spec.container is not None
        return self.spec.container

    def describe(self, what: str) -> str:
        status = ""
        if self.container is not None:
            with contextlib.suppress(Exception):
                self.container.reload()
                state = self.container.attrs.get("State", {})
                status = f" (container {state.get('Status')}, exit code {state.get('ExitCode')})"
        return (f"arm {self.spec.arm}: vLLM server container {self.config.name} {what}{status}\n"
                f"  command: {self.config.cli()}\n  log: {self.spec.log_path}\n--- log tail ---\n"
                f"{self.log_tail()}")

    def start(self) -> None:
        from docker.errors import DockerException

        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        for d in self.config.host_dirs():
            d.mkdir(parents=True, exist_ok=True)
        seed = self.spec.prestart
        if seed is not None and (target := aiter_home_jit(self.config)) is not None and not target.exists():
            _LIVE.add(seed.name)
            try:
                run_tool(seed.cli_argv(), env=None, log_path=self.spec.log_path.with_suffix(".aiter-seed.log"),
                         timeout_s=AITER_SEED_TIMEOUT_S, what=f"arm {self.spec.arm}: AITER's JIT tree copy")
            except SuiteError as exc:
                raise ServerError(str(exc)) from None
            finally:
                _LIVE.discard(seed.name)
        _LIVE.add(self.config.name)
        try:
            self.container = self.client.containers.create(**self.config.sdk_kwargs())
            self.container.start()
        except DockerException as exc:
            raise ServerError(f"arm {self.spec.arm}: cannot start container from {self.config.image}: {exc}"
                              ) from None
        self._log_thread = threading.Thread(target=self._stream_logs, name=f"logs-{self.config.name}",
                                            daemon=True)
        self._log_thread.start()

    def _stream_logs(self) -> None:
        redact = [s for s in self.spec.redact if s]
        buf = b""
        with open(self.spec.log_path, "ab") as log:
            try:
                for chunk in self.container.logs(stream=True, follow=True, stdout=True, stderr=True):
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        log.write(_redact(line, redact) + b"\n")
                    log.flush()
            except Exception:  # noqa: BLE001  (the container went away: the log ends here)
                pass
            if buf:
                log.write(_redact(buf, redact) + b"\n")


    def running(self) -> bool:
        if self.container is None:
            return False
        try:
            self.container.reload()
        except Exception:  # noqa: BLE001
            return False
        return self.container.status in ("created", "running")

    def log_tail(self, n: int = 40) -> str:
        return read_tail(self.spec.log_path, n, self.spec.redact)

    def stop(self) -> None:
        """SIGTERM (docker stop, then SIGKILL after the grace period), wait, remove. A second Ctrl-C while
        stopping still removes the container."""
        try:
            if self.container is not None:
                with contextlib.suppress(Exception):
                    self.container.stop(timeout=STOP_GRACE_S)
        finally:
            remove_container(self.client, self.config.name)
            if self._log_thread is not None:
                self._log_thread.join(timeout=10)
            self.container = None


def _redact(line: bytes, secrets_: list[str]) -> bytes:
    for s in secrets_:
        line = line.replace(s.encode(), b"<redacted>")
    return line


def remove_container(client: Any, name: str) -> None:
    from docker.errors import DockerException, NotFound

    for _ in range(3):
        try:
            client.containers.get(name).remove(force=True)
        except NotFound:
            break
        except DockerException:
            continue
        except KeyboardInterrupt:
            continue
    _LIVE.discard(name)


_LIVE: set[str] = set()


@atexit.register
def _remove_leftovers() -> None:
    """Last resort (an exception path that skipped __exit__): remove the containers this process started."""
    if not _LIVE:
        return
    from suite.runtime.docker.images import docker_client

    client = docker_client(required=False)
    if client is not None:
        for name in list(_LIVE):
            remove_container(client, name)


class DockerRuntime(RuntimeBase):
    """Arms as images (built when missing, content-tagged); servers, clients and offline tools as containers of
    the arm's image."""

    kind = "docker"
    client_in_server = True  # clients are `docker exec`s in the server container: they end with it

    def __init__(self, matrix: Matrix, cache_root: Path, client: Any = None, console: Any = None):
        self.matrix = matrix
        self.cache_root = Path(cache_root)
        self._client = client
        self.console = console
        self.images: dict[str, ImageInfo] = {}

    def device_state(self) -> list[GpuState] | None:
        """A CUDA image's containers run on this host's GPUs (``--gpus``): their clocks, P-state, power and names
        around every job, from nvidia-smi here, as for a local run (2026-12-05: Docker runs recorded none). None
        for an engine on another host (``DOCKER_HOST`` not a local socket): nvidia-smi here would name the wrong
        GPUs."""
        docker = self.matrix.runtime.docker
        return gpu_state() if docker is not None and docker.vendor == "cuda" and engine_is_here() else None

    @property
    def client(self) -> Any:
        if self._client is None:
            from suite.runtime.docker.images import docker_client

            self._client = docker_client(required=True)
        return self._client

    def prepare_arm(self, arm: str, spec: ArmSpec) -> ArmEnv:
        """The arm's image: `image:` as given, else the content-tagged image (built here when missing)."""
        from suite.runtime.docker.images import (
            build_image,
            image_aiter_source,
            image_patches,
            image_vllm_source,
            plan_image,
            resolve_digest,
        )

        if spec.image:
            return self._given_image(arm, spec)
        from suite.runtime.docker.bases import host_driver

        plan = plan_image(self.matrix, arm, spec, lambda ref: resolve_digest(self.client, ref),
                          driver=host_driver(self.matrix))
        say = self._say
        say(f"arm {arm}: image {plan.tag} ({plan.vendor}, base {plan.base_image})")
        result = build_image(self.client, plan, self.cache_root,
                             on_event=lambda e: say(f"  {e.text}") if e.kind in ("step", "pull", "base", "wait") else None)
        say(f"arm {arm}: {'built' if result.built else 'cached'} {result.tag} in {result.seconds:.0f} s")
        labels = result.labels
        self.images[arm] = ImageInfo(tag=result.tag, id=result.image_id, identity=labels.get("suite.identity"),
                                     base_image=labels.get("org.opencontainers.image.base.name"),
                                     base_digest=labels.get("org.opencontainers.image.base.digest"),
                                     vendor=labels.get("suite.vendor"), vllm_source=image_vllm_source(labels),
                                     aiter_source=image_aiter_source(labels))
        return ArmEnv(arm=arm, vllm_version=labels.get("suite.vllm.version", spec.vllm), image=result.tag,
                      patches=image_patches(labels), vllm_root=self._host_sources(result.tag, result.image_id))

    def _given_image(self, arm: str, spec: ArmSpec) -> ArmEnv:
        from docker.errors import DockerException

        from suite.patches import patch_fingerprint
        from suite.runtime.docker.images import image_aiter_source, image_patches, image_vllm_source

        try:
            image = self.client.images.get(spec.image)
        except DockerException as exc:
            raise SuiteError(f"arm {arm}: image {spec.image} is not available here: {exc}") from None
        labels = dict(image.labels or {})
        if spec.patches and labels.get("suite.patch.fingerprint") != patch_fingerprint(spec.patches, spec.vllm):
            raise SuiteError(f"arm {arm}: image {spec.image} is used as it is, but it does not carry the arm's "
                             "patch sets (suite.patch.fingerprint label); drop `image:` to have it built")
        if self.matrix.accuracy is not None and not self._has_file(spec.image, IMAGE_LM_EVAL_PYTHON):
            raise SuiteError(f"arm {arm}: image {spec.image} has no {IMAGE_LM_EVAL_PYTHON} (lm-eval in its own venv, "
                             "as `suite build` makes every image): the accuracy jobs run there. Drop `image:` to have "
                             "the arm's image built, or build yours FROM it with docker/lm_eval_venv.py")
        self.images[arm] = ImageInfo(tag=spec.image, id=image.id, given=True, vllm_source=image_vllm_source(labels),
                                     aiter_source=image_aiter_source(labels))
        return ArmEnv(arm=arm, vllm_version=labels.get("suite.vllm.version", spec.vllm), image=spec.image,
                      patches=image_patches(labels), vllm_root=self._host_sources(spec.image, image.id))

    def _has_file(self, image: str, path: str) -> bool:
        """Whether ``path`` is an executable file in ``image`` (a throwaway container of it, `test -x`)."""
        from docker.errors import DockerException

        try:
            self.client.containers.run(image, ["-x", path], entrypoint="test", remove=True,
                                       labels={"suite.managed": "1"})
        except DockerException:
            return False
        return True

    def _host_sources(self, image: str, image_id: str) -> Path | None:
        """Host-side stages read a few vLLM source files without importing vLLM (the latency stage: the engine
        flags in vllm/engine/arg_utils.py). The host has no vLLM here: those files are copied out of the
        image once (cached by image id) into a directory that holds them at vllm/..., which the runner hands
        to stages as the arm's vllm_root. Only when the matrix has latency points."""
        if not self.matrix.latency:
            return None
        from suite.runtime.docker.images import copy_vllm_sources

        return copy_vllm_sources(self.client, image, image_id, self.cache_root / "docker" / "vllm-src")

    def _say(self, text: str) -> None:
        if self.console is None:
            from rich.console import Console

            self.console = Console(stderr=True)
        self.console.print(text, markup=False, highlight=False)

    def arm_info(self, arm: str) -> ArmRuntimeInfo:
        """Provenance for the run manifest: the image tag, id, identity and base digest."""
        return ArmRuntimeInfo(image_info=self.images.get(arm, ImageInfo()))

    def container_config(self, env: ArmEnv, *, argv_tail: list[str], extra_env: dict[str, str], dirs: ArmDirs,
                         port: int) -> ContainerConfig:
        return container_config(self.matrix, env, argv_tail=argv_tail, extra_env=extra_env, dirs=dirs, port=port,
                                name_suffix=f"-{secrets.token_hex(3)}")

    def server_spec(self, env: ArmEnv, *, argv_tail: list[str], extra_env: dict[str, str], dirs: ArmDirs,
                    log_path: Path, port: int, redact: list[str], gpus: str | None = None) -> DockerServerSpec:
        """``gpus``: the GPUs of the server's restart set (runtime.gpu_groups) in place of runtime.docker.gpus:
        CUDA `--gpus "device=..."`, ROCm HIP_VISIBLE_DEVICES (every device node stays mounted)."""
        cfg = self.container_config(env, argv_tail=argv_tail, extra_env=extra_env, dirs=dirs, port=port)
        docker = self.matrix.runtime.docker or DockerSpec()
        if gpus is not None and docker.vendor == "cuda":
            cfg = dataclasses.replace(cfg, gpus=gpus)
        elif gpus is not None and docker.vendor == "rocm":
            cfg = dataclasses.replace(cfg, environment={**cfg.environment, "HIP_VISIBLE_DEVICES": gpus})
        seed = (tool_config(self.matrix, env, AITER_SEED, extra_env={**self.arm_env_vars(env.arm), **extra_env},
                            dirs=dirs, name_suffix=f"-aiter-seed-{secrets.token_hex(3)}")
                if docker.vendor == "rocm" and aiter_home_jit(cfg) is not None else None)
        return DockerServerSpec(arm=env.arm, argv=cfg.cli_argv(), env=dict(cfg.environment), log_path=log_path,
                                host=self.matrix.runtime.host, port=port,
                                startup_timeout_s=self.matrix.runtime.startup_timeout_s, redact=redact,
                                container=cfg, prestart=seed)

    def arm_vars(self, env: ArmEnv, dirs: ArmDirs) -> dict[str, str]:  # noqa: ARG002
        return {}  # the container's environment is built by container_config; nothing from this host's

    def client_argv(self, env: ArmEnv, argv: list[str], dirs: ArmDirs, server: Server | None = None
                    ) -> list[str]:
        """A client tool (`vllm bench serve`, the persistent bench client, lm-eval) in the arm's image, against
        the arm's own vLLM: `docker exec -i` into the running server container (same network namespace, so
        the server's URL works unchanged; same mounts and user). Without a server: a sibling container of the
        image on the host network."""
        container = server.spec.container if server is not None and isinstance(server.spec, DockerServerSpec) else None
        if container is not None:
            marker = f"SUITE_EXEC={secrets.token_hex(6)}"
            on_stop(marker, lambda: end_exec(self.client, container.name, marker))
            return exec_argv(container.name, argv, marker=marker)
        cfg = tool_config(self.matrix, env, argv, extra_env=self.arm_env_vars(env.arm), dirs=dirs,
                          name_suffix=f"-client-{secrets.token_hex(3)}", client=True)
        return self._launch(cfg)

    def tool(self, env: ArmEnv, argv: list[str], dirs: ArmDirs) -> ToolCommand:
        """An offline tool (`vllm bench latency`, `python -m suite.stages.kernel.bench`, ...) in a fresh
        container of the arm's image: `docker run --rm --init`, the server's mounts, environment, device flags
        and user (tool_config). The command's environment is the docker CLI's (this host's: DOCKER_HOST, its
        config under HOME) plus the matrix's variables whose names look secret (HF_TOKEN, but also vLLM's
        VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD): the container is given those by name, so their values are
        never on the printed command line."""
        cfg = tool_config(self.matrix, env, argv, extra_env=self.arm_env_vars(env.arm), dirs=dirs,
                          name_suffix=f"-tool-{secrets.token_hex(3)}")
        secrets_by_name = {k: v for k, v in self.arm_env_vars(env.arm).items() if SECRET_NAME.search(k)}
        return ToolCommand(self._launch(cfg), {**os.environ, **secrets_by_name})

    def _launch(self, cfg: ContainerConfig) -> list[str]:
        for d in cfg.host_dirs():
            d.mkdir(parents=True, exist_ok=True)
        _LIVE.add(cfg.name)  # --rm removes it when the tool ends; this process removes it at exit otherwise
        return cfg.cli_argv()

    def server(self, spec: DockerServerSpec) -> DockerServer:
        return DockerServer(spec, self.client)

    # -- for dry-run printers: the exact commands, with placeholders for what exists only at run time

    def placement(self, arm: str, spec: ArmSpec, offline: bool) -> ArmPlacement:  # noqa: ARG002
        """Every process of the arm in a container of its image: the server, its clients (`docker exec` in the
        server's container) and, when it has offline jobs, their `docker run`."""
        lines = [("clients", self.describe_client(arm))]
        if offline:
            lines.append(("offline tools", self.describe_tool(arm, "ARM-IMAGE")))
        return ArmPlacement("(in the arm's image: see `suite build --dry-run`)", tuple(lines))

    def describe_client(self, arm: str, image: str | None = None, run_dir: Path | None = None) -> str:
        """Where this arm's client tools run, as one line: the persistent bench client started by
        `docker exec` in the arm's server container (lm-eval and a CLI fallback run the same way). The server
        container's name as container_config makes it, XXXXXX standing for its random suffix."""
        del image  # the client runs in the server's container, whatever its image
        run_dir = run_dir or Path("runs").resolve() / f"RUN-ID-{self.matrix.name}"
        cmd = exec_argv(_safe(f"suite-{run_dir.name}-{arm}-XXXXXX")[:120], ["python", str(WORKER_PATH)])
        return (f"{shlex.join(cmd)}   (in the arm's server container, its vLLM and lm-eval; "
                f"`vllm bench serve` and `{IMAGE_LM_EVAL_PYTHON} -m lm_eval run` run the same way)")

    def describe_tool(self, arm: str, image: str, argv: list[str] | None = None,
                      run_dir: Path | None = None) -> str:
        """The `docker run` line of an offline tool of this arm (default: `vllm bench latency ...`)."""
        from suite.plan import effective_arms

        spec = effective_arms(self.matrix)[arm]
        run_dir = run_dir or Path("runs").resolve() / f"RUN-ID-{self.matrix.name}"
        env = ArmEnv(arm=arm, vllm_version=spec.vllm, image=image)
        cfg = tool_config(self.matrix, env, argv or ["vllm", "bench", "latency", "..."],
                          extra_env=self.arm_env_vars(arm), dirs=ArmDirs.in_run(run_dir, arm),
                          name_suffix="-tool-XXXXXX")
        return cfg.cli()

