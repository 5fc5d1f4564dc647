"""Docker runtime: each arm's vLLM server runs in its own image (built on demand by suite.runtime.docker.images).

The container gets the vendor's run flags (CUDA: --gpus, --ipc=host; ROCm: /dev/kfd, /dev/dri, video and
render groups, --ipc=host, SYS_PTRACE, seccomp=unconfined; CPU: none), the HF cache as a volume, the arm's
run directory (its vLLM/inductor caches, profiler output) bound at the same path, the model directory
read-only at the same path, and the server port published on the host. Secrets such as HF_TOKEN are
passed by name from the host environment at container creation only: never stored in a spec, a file, a
log or the manifest. Containers carry the run id as a label; they are stopped (SIGTERM, then SIGKILL) and
removed when the server context exits, also on Ctrl-C / SIGTERM (the runner turns both into
KeyboardInterrupt).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import secrets
import shlex
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suite.errors import ServerError, SuiteError
from suite.matrix import ArmSpec, DockerSpec, Matrix
from suite.proc import read_tail
from suite.runtime.base import ArmEnv, RuntimeBase, ServerBase, ServerSpec
from suite.runtime.local import host_vllm

STOP_GRACE_S = 30
CONTAINER_HF_HOME = "/root/.cache/huggingface"
PASS_THROUGH = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")  # by name only, from the host environment
MANAGED_LABEL = "suite.managed"
CPU_SHM_SIZE = "1g"
GPUS = re.compile(r"^\d+(,\d+)*$")
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|CREDENTIAL|PRIVATE)", re.I)


@dataclass(frozen=True)
class ContainerConfig:
    """One server container, described once and rendered both as Docker SDK arguments and as the
    equivalent `docker run` command line."""

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

    def cli_argv(self) -> list[str]:
        argv = ["docker", "run", "--rm", "--name", self.name]
        for k, v in sorted(self.labels.items()):
            argv += ["--label", f"{k}={v}"]
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
        from docker.types import DeviceRequest, Mount

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
            kwargs["device_requests"] = [
                DeviceRequest(count=-1, capabilities=[["gpu"]]) if self.gpus == "all"
                else DeviceRequest(device_ids=self.gpus.split(","), capabilities=[["gpu"]])]
        for key, value in (("devices", self.devices), ("group_add", self.group_add), ("cap_add", self.cap_add),
                           ("security_opt", self.security_opt)):
            if value:
                kwargs[key] = list(value)
        if self.ipc_mode:
            kwargs["ipc_mode"] = self.ipc_mode
        if self.shm_size:
            kwargs["shm_size"] = self.shm_size
        return kwargs


def vendor_flags(docker: DockerSpec) -> dict[str, Any]:
    """The vendor's run flags (FACTS §7) as ContainerConfig fields (+ environment for ROCm GPU selection)."""
    gpus = docker.gpus.strip().replace(" ", "")
    if gpus != "all" and not GPUS.match(gpus):
        raise SuiteError(f"runtime.docker.gpus must be 'all' or a comma list of device indices, not {gpus!r}")
    flags: dict[str, Any] = {"shm_size": docker.shm_size}
    if docker.vendor == "cpu":
        # no --ipc=host on a laptop/CI: a private /dev/shm, larger than Docker's 64 MiB (vLLM's shm
        # broadcast ring alone wants 160 MiB)
        flags["shm_size"] = docker.shm_size or CPU_SHM_SIZE
    elif docker.vendor == "cuda":
        flags.update(gpus=gpus, ipc_mode="host")
    elif docker.vendor == "rocm":
        flags.update(devices=["/dev/kfd", "/dev/dri"], group_add=["video", "render"], ipc_mode="host",
                     cap_add=["SYS_PTRACE"], security_opt=["seccomp=unconfined"])
        if gpus != "all":
            flags["environment"] = {"HIP_VISIBLE_DEVICES": gpus}
    return flags


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text).strip("-.") or "x"


def run_id_of(log_path: Path) -> str:
    """The run directory's name (the run id), found above the server log."""
    for parent in Path(log_path).parents:
        if (parent / "manifest.json").is_file():
            return parent.name
    return Path(log_path).parent.parent.name


def hf_cache_dir(docker: DockerSpec) -> Path:
    if docker.hf_cache:
        return Path(docker.hf_cache).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"])
    return Path.home() / ".cache" / "huggingface"


def container_config(matrix: Matrix, env: ArmEnv, *, argv_tail: list[str], extra_env: dict[str, str],
                     cache_dir: Path, log_path: Path, port: int, name_suffix: str = "") -> ContainerConfig:
    docker = matrix.runtime.docker or DockerSpec()
    flags = vendor_flags(docker)
    command = list(argv_tail)
    for i, arg in enumerate(command[:-1]):
        if arg == "--host":
            command[i + 1] = "0.0.0.0"  # inside the container; the port is published on runtime.host only
    arm_dir = Path(log_path).parent.resolve()
    cache_dir = Path(cache_dir).resolve()
    environment = {
        "VLLM_SERVER_DEV_MODE": "1",  # mounts /reset_prefix_cache
        "VLLM_CACHE_ROOT": str(cache_dir / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor"),
        # no TMPDIR: the container's /tmp is its own (and vLLM's zmq socket paths must stay < 108 bytes)
        "HF_HOME": CONTAINER_HF_HOME,
        **flags.pop("environment", {}),
    }
    mounts = [(str(hf_cache_dir(docker)), CONTAINER_HF_HOME, "rw"), (str(arm_dir), str(arm_dir), "rw")]
    if not cache_dir.is_relative_to(arm_dir):
        mounts.append((str(cache_dir), str(cache_dir), "rw"))
    model = Path(matrix.model.id)
    if model.is_absolute() and model.is_dir():
        mounts.append((str(model), str(model), "ro"))
        environment["HF_HUB_OFFLINE"] = "1"
    tok = matrix.model.tokenizer
    if tok and Path(tok).is_absolute() and Path(tok).is_dir() and Path(tok) != model:
        mounts.append((tok, tok, "ro"))
    environment.update(extra_env)
    run_id = run_id_of(log_path)
    name = _safe(f"suite-{run_id}-{env.arm}{name_suffix}")[:120]
    return ContainerConfig(
        name=name, image=env.image or "", command=command, environment=environment,
        pass_env=[n for n in PASS_THROUGH if os.environ.get(n) and n not in extra_env],
        mounts=mounts, publish=(matrix.runtime.host, port, port),
        labels={MANAGED_LABEL: "1", "suite.run-id": run_id, "suite.arm": env.arm, "suite.matrix": matrix.name},
        **flags)


@dataclass(frozen=True)
class DockerServerSpec(ServerSpec):
    container: ContainerConfig | None = None


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
        for sub in ("vllm", "inductor"):
            Path(self.config.environment["VLLM_CACHE_ROOT"]).parent.joinpath(sub).mkdir(parents=True, exist_ok=True)
        Path(self.config.mounts[0][0]).mkdir(parents=True, exist_ok=True)  # the HF cache
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
    """Arms as images (built when missing, content-tagged); servers as containers."""

    kind = "docker"

    def __init__(self, matrix: Matrix, cache_root: Path, client: Any = None, console: Any = None):
        self.matrix = matrix
        self.cache_root = Path(cache_root)
        self._client = client
        self.console = console
        self.images: dict[str, dict[str, Any]] = {}

    @property
    def client(self) -> Any:
        if self._client is None:
            from suite.runtime.docker.images import docker_client

            self._client = docker_client(required=True)
        return self._client

    def prepare_arm(self, arm: str, spec: ArmSpec) -> ArmEnv:
        """The arm's image: `image:` as given, else the content-tagged image (built here when missing)."""
        from suite.runtime.docker.images import build_image, image_patches, plan_image, resolve_digest

        if spec.image:
            return self._given_image(arm, spec)
        plan = plan_image(self.matrix, arm, spec, lambda ref: resolve_digest(self.client, ref))
        say = self._say
        say(f"arm {arm}: image {plan.tag} ({plan.vendor}, base {plan.base_image})")
        result = build_image(self.client, plan, self.cache_root,
                             on_event=lambda e: say(f"  {e.text}") if e.kind in ("step", "pull", "base") else None)
        say(f"arm {arm}: {'built' if result.built else 'cached'} {result.tag} in {result.seconds:.0f} s")
        labels = result.labels
        self.images[arm] = {"tag": result.tag, "id": result.image_id, "identity": labels.get("suite.identity"),
                            "base_image": labels.get("org.opencontainers.image.base.name"),
                            "base_digest": labels.get("org.opencontainers.image.base.digest"),
                            "vendor": labels.get("suite.vendor")}
        return ArmEnv(arm=arm, vllm_version=labels.get("suite.vllm.version", spec.vllm), image=result.tag,
                      patches=image_patches(labels))

    def _given_image(self, arm: str, spec: ArmSpec) -> ArmEnv:
        from docker.errors import DockerException

        from suite.patches import patch_fingerprint
        from suite.runtime.docker.images import image_patches

        try:
            image = self.client.images.get(spec.image)
        except DockerException as exc:
            raise SuiteError(f"arm {arm}: image {spec.image} is not available here: {exc}") from None
        labels = dict(image.labels or {})
        if spec.patches and labels.get("suite.patch.fingerprint") != patch_fingerprint(spec.patches, spec.vllm):
            raise SuiteError(f"arm {arm}: image {spec.image} is used as it is, but it does not carry the arm's "
                             "patch sets (suite.patch.fingerprint label); drop `image:` to have it built")
        self.images[arm] = {"tag": spec.image, "id": image.id, "given": True}
        return ArmEnv(arm=arm, vllm_version=labels.get("suite.vllm.version", spec.vllm), image=spec.image,
                      patches=image_patches(labels))

    def _say(self, text: str) -> None:
        if self.console is None:
            from rich.console import Console

            self.console = Console(stderr=True)
        self.console.print(text, markup=False, highlight=False)

    def arm_info(self, arm: str) -> dict[str, Any]:
        """Provenance for the run manifest: the image tag, id, identity and base digest."""
        return {"image_info": self.images.get(arm, {})}

    def container_config(self, env: ArmEnv, *, argv_tail: list[str], extra_env: dict[str, str], cache_dir: Path,
                         log_path: Path, port: int) -> ContainerConfig:
        return container_config(self.matrix, env, argv_tail=argv_tail, extra_env=extra_env, cache_dir=cache_dir,
                                log_path=log_path, port=port, name_suffix=f"-{secrets.token_hex(3)}")

    def server_spec(self, env: ArmEnv, *, argv_tail: list[str], extra_env: dict[str, str], cache_dir: Path,
                    log_path: Path, port: int, redact: list[str]) -> DockerServerSpec:
        cfg = self.container_config(env, argv_tail=argv_tail, extra_env=extra_env, cache_dir=cache_dir,
                                    log_path=log_path, port=port)
        return DockerServerSpec(arm=env.arm, argv=cfg.cli_argv(), env=dict(cfg.environment), log_path=log_path,
                                host=self.matrix.runtime.host, port=port,
                                startup_timeout_s=self.matrix.runtime.startup_timeout_s, redact=redact,
                                container=cfg)

    def arm_vars(self, env: ArmEnv, cache_dir: Path) -> dict[str, str]:  # noqa: ARG002
        return {}

    def client_argv(self, env: ArmEnv, argv: list[str]) -> list[str]:  # noqa: ARG002
        """Clients (`vllm bench serve`, lm-eval) run on the host against the container's published port."""
        return host_vllm(argv)

    def tool_argv(self, env: ArmEnv, argv: list[str]) -> list[str]:
        return self.tool_env(env, Path())  # raises: see tool_env

    def tool_env(self, env: ArmEnv, cache_dir: Path) -> dict[str, str]:  # noqa: ARG002
        raise SuiteError(
            f"arm {env.arm}: latency and kernel jobs run in the arm's own Python environment, which the docker "
            "runtime does not provide yet; run them with `runtime: local` on a host with that vLLM installed "
            "(see matrices/gemma4-below-serving.yaml) or with `suite kernel`")

    def server(self, spec: DockerServerSpec) -> DockerServer:
        return DockerServer(spec, self.client)
