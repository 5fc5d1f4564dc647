"""The containers of an arm: one container described once (``ContainerConfig``) and rendered both as Docker SDK
arguments and as the equivalent `docker run` command line; what every container of an arm shares, the server's
(``container_config``) and a tool's (``tool_config``); a client tool's `docker exec` into the server container
(``exec_argv``) and its end (``end_exec``); a tool's command line as the arm's image runs it (``image_argv``).

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
spec, a file, a log, a printed command or the manifest. Containers carry the run id as a label.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shlex
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suite import REPO_ROOT
from suite.errors import SuiteError
from suite.matrix import GPU_LIST, DockerSpec, Matrix
from suite.proc import LM_EVAL_PYTHON
from suite.runtime.base import ArmEnv, arm_address, arm_model
from suite.runtime.docker import image_vendor
from suite.server_address import HOST
from suite.store import SECRET_NAME, ArmDirs

PASS_THROUGH = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")  # by name only, from the host environment
# What a stage may add to a client tool's environment (offline datasets, lm-eval's private datasets cache,
# tokenizer threads): forwarded by name into `docker exec`, so the value comes from the stage's environment.
CLIENT_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_DATASETS_CACHE", "TOKENIZERS_PARALLELISM")
MANAGED_LABEL = "suite.managed"
CPU_SHM_SIZE = "1g"
DEV = Path("/dev")  # where the ROCm device nodes are looked up (their group ids go to --group-add)
DOCKER_USER_ENV = "SUITE_DOCKER_USER"

# the suite's tools inside every image `suite build` makes (docker/<vendor>/Dockerfile copies suite-src/ to
# /opt/suite; suite.runtime.docker.build_context puts them in the build context)
IMAGE_TOOLS = "/opt/suite/tools"
IMAGE_WORKER = f"{IMAGE_TOOLS}/client_worker.py"
IMAGE_KERNEL_BENCH = f"{IMAGE_TOOLS}/kernel_bench.py"
IMAGE_LAYER_BENCH = f"{IMAGE_TOOLS}/layer_bench.py"  # imports kernel_bench (and its kernel_*.py), beside it
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


def vendor_flags(vendor: str, docker: DockerSpec, gpus: str = "all") -> dict[str, Any]:
    """The vendor's run flags (docker/README.md) as ContainerConfig fields (+ environment for ROCm GPU selection);
    ``vendor``: runtime.vendor; ``gpus``: every container's GPUs (runtime.gpus as a string; 'all' when it is left
    out or holds groups)."""
    gpus = gpus.strip().replace(" ", "")
    if gpus != "all" and not GPU_LIST.match(gpus):
        raise SuiteError(f"runtime.gpus must be 'all' or a comma list of device indices, not {gpus!r}")
    flags: dict[str, Any] = {"shm_size": docker.shm_size}
    if vendor == "cpu":
        # no --ipc=host on a laptop/CI: a private /dev/shm, larger than Docker's 64 MiB (vLLM's shm
        # broadcast ring alone wants 160 MiB)
        flags["shm_size"] = docker.shm_size or CPU_SHM_SIZE
    elif vendor == "cuda":
        flags.update(gpus=gpus, ipc_mode="host")
    elif vendor == "rocm":
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


def safe_container_name(text: str) -> str:
    """``text`` with only the characters a container name may hold (any other one becomes '-')."""
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
    flags = vendor_flags(image_vendor(matrix), docker, matrix.runtime.shared_gpus or "all")
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
    """The server container of one arm: `vllm serve ARGV_TAIL` with the port published on the arm's host (the
    --host of its serve_args)."""
    command = list(argv_tail)
    for i, arg in enumerate(command[:-1]):
        if arg == HOST:
            command[i + 1] = "0.0.0.0"  # inside the container; the port is published on the arm's host only
    settings = _arm_settings(matrix, env, dirs=dirs,
                             extra_env={"VLLM_SERVER_DEV_MODE": "1", **extra_env},  # mounts /reset_prefix_cache
                             role="server")
    name = safe_container_name(f"suite-{dirs.run.name}-{env.arm}{name_suffix}")[:120]
    return ContainerConfig(name=name, command=command, publish=(arm_address(matrix, env.arm).host, port, port),
                           **settings)


def tool_config(matrix: Matrix, env: ArmEnv, argv: list[str], *, extra_env: dict[str, str], dirs: ArmDirs,
                name_suffix: str = "", client: bool = False) -> ContainerConfig:
    """A fresh container of the arm's image running one tool to completion (`docker run --rm --init`): the
    server's mounts, environment, device flags and user. ``client``: a client tool without a server to exec
    into (host network, stdin open, the forwarded client environment)."""
    settings = _arm_settings(matrix, env, dirs=dirs, extra_env=extra_env, role="client" if client else "tool")
    settings["pass_env"] = [n for n in dict.fromkeys([*settings["pass_env"], *CLIENT_ENV])
                            if n not in settings["environment"]]
    cmd = image_argv(argv)
    name = safe_container_name(f"suite-{dirs.run.name}-{env.arm}{name_suffix}")[:120]
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

