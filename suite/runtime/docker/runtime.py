"""Docker runtime: each arm's vLLM runs in its own image (planned by suite.runtime.docker.images, built on demand
by suite.runtime.docker.image_build), and so does every vLLM-side tool of the arm: the host needs Python, the
suite and the Docker SDK, nothing of vLLM.

Where each tool runs (each container as suite.runtime.docker.containers describes it):

- the server: a container of the arm's image (`vllm serve`), its port published on the arm's ``--host``;
- client tools (the `vllm bench serve` client, lm-eval, the profile stage's bursts): ``docker exec -i`` into
  that running server container, so they use the arm's own vLLM and lm-eval, reach the server on the
  container's own 127.0.0.1 (the same URL the host uses: the port is published 1:1) and share its mounts and
  user. Without a running server (no stage does this today) a sibling container of the same image on the host
  network;
- below-serving tools (`vllm bench latency`, the kernel benchmark, run without a server): a fresh container of
  the arm's image, ``docker run --rm --init``, with the same mounts, environment, vendor device flags and user
  as the server.

Server containers are stopped (SIGTERM, then SIGKILL) and removed when the server context exits, also on Ctrl-C /
SIGTERM (the runner turns both into KeyboardInterrupt); tool containers remove themselves (--rm).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import secrets
import shlex
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite.errors import ServerError, SuiteError
from suite.matrix import ArmSpec, Matrix
from suite.proc import ToolCommand, on_stop, read_tail, run_tool
from suite.runtime.base import ArmEnv, ArmPlacement, RuntimeBase, Server, ServerBase, ServerSpec, arm_address
from suite.runtime.docker import image_vendor
from suite.runtime.docker.bases import engine_is_here
from suite.runtime.docker.containers import (
    AITER_SEED,
    AITER_SEED_TIMEOUT_S,
    IMAGE_LM_EVAL_PYTHON,
    WORKER_PATH,
    ContainerConfig,
    aiter_home_jit,
    container_config,
    end_exec,
    exec_argv,
    safe_container_name,
    tool_config,
)
from suite.runtime.gpu import gpu_state
from suite.store import SECRET_NAME, ArmDirs, ArmRuntimeInfo, GpuState, ImageInfo

STOP_GRACE_S = 30


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
    from suite.runtime.docker.image_build import docker_client

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
        return gpu_state() if image_vendor(self.matrix) == "cuda" and engine_is_here() else None

    @property
    def client(self) -> Any:
        if self._client is None:
            from suite.runtime.docker.image_build import docker_client

            self._client = docker_client(required=True)
        return self._client

    def prepare_arm(self, arm: str, spec: ArmSpec) -> ArmEnv:
        """The arm's image: `image:` as given, else the content-tagged image (built here when missing)."""
        from suite.runtime.docker.image_build import build_image, resolve_digest
        from suite.runtime.docker.images import (
            image_aiter_source,
            image_patches,
            image_vllm_source,
            plan_image,
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
        from suite.runtime.docker.image_build import copy_vllm_sources

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
        """``gpus``: the GPUs of the server's round (GPU groups: runtime.gpus) in place of every container's:
        CUDA `--gpus "device=..."`, ROCm HIP_VISIBLE_DEVICES (every device node stays mounted)."""
        cfg = self.container_config(env, argv_tail=argv_tail, extra_env=extra_env, dirs=dirs, port=port)
        vendor = image_vendor(self.matrix)
        if gpus is not None and vendor == "cuda":
            cfg = dataclasses.replace(cfg, gpus=gpus)
        elif gpus is not None and vendor == "rocm":
            cfg = dataclasses.replace(cfg, environment={**cfg.environment, "HIP_VISIBLE_DEVICES": gpus})
        seed = (tool_config(self.matrix, env, AITER_SEED, extra_env={**self.arm_env_vars(env.arm), **extra_env},
                            dirs=dirs, name_suffix=f"-aiter-seed-{secrets.token_hex(3)}")
                if vendor == "rocm" and aiter_home_jit(cfg) is not None else None)
        return DockerServerSpec(arm=env.arm, argv=cfg.cli_argv(), env=dict(cfg.environment), log_path=log_path,
                                host=arm_address(self.matrix, env.arm).host, port=port,
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
        cmd = exec_argv(safe_container_name(f"suite-{run_dir.name}-{arm}-XXXXXX")[:120], ["python", str(WORKER_PATH)])
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
