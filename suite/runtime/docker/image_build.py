"""Building an arm's image on the Docker engine, and what is read back from a built one.

The engine: its client (``docker_client``), a base image's digest, whether the plan's image exists (the tag
carrying the plan's identity label). A build (:func:`build_image`): the base made present (local/bookworm built
by debootstrap, or pulled), the build context written out (:func:`assemble_context`), one build of a tag at a
time on a host (``build_lock``), the plan's own command (:meth:`ImagePlan.build_command`: BuildKit through the
docker CLI) run with its plain output logged and turned into progress events. From a built image: the vLLM
source files host-side stages read (``copy_vllm_sources``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suite.errors import SuiteError
from suite.proc import ask
from suite.runtime.docker import DOCKER_DIR
from suite.runtime.docker.images import LOCAL_BOOKWORM, ImagePlan, with_digest

BOOKWORM_BUILD_TIMEOUT_S = 1800  # debootstrap of Debian bookworm from the mirror, then `docker import`


# ---------------------------------------------------------------- the engine


def docker_client(required: bool = True) -> Any:
    """A Docker SDK client talking to the engine ($DOCKER_HOST or the default socket); None when none is
    reachable and not required."""
    try:
        from docker.errors import DockerException

        import docker
    except ImportError:
        if required:
            raise SuiteError("the Docker SDK for Python is missing: pip install 'router-gate-suite[docker]'") from None
        return None
    try:
        client = docker.from_env(timeout=600)
        client.ping()
        return client
    except DockerException as exc:
        if required:
            raise SuiteError(f"no Docker engine reachable ({exc}); start dockerd or set DOCKER_HOST") from None
        return None


def resolve_digest(client: Any, ref: str) -> str | None:
    """Digest of a base image: its repo digest when pulled, its image id when built here, else the
    registry's digest (no pull); None when none of these is available."""
    if client is None:
        return None
    from docker.errors import DockerException

    try:
        image = client.images.get(ref)
    except DockerException:
        image = None
    if image is not None:
        for repo_digest in image.attrs.get("RepoDigests") or []:
            if "@" in repo_digest:
                return repo_digest.split("@", 1)[1]
        return image.id
    try:
        return client.images.get_registry_data(ref).id
    except DockerException:
        return None


def existing_image(client: Any, plan: ImagePlan) -> Any | None:
    """The image with the plan's tag, if it exists and really is that plan (its identity label)."""
    from docker.errors import DockerException

    try:
        image = client.images.get(plan.tag)
    except DockerException:
        return None
    labels = image.labels or {}
    return image if labels.get("suite.identity") == plan.identity else None


# ---------------------------------------------------------------- building


def assemble_context(plan: ImagePlan, dest: Path) -> Path:
    """Write the build context (hard links where possible: the torch wheel costs no space)."""
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for rel, src in plan.context_files:
        out = tmp / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, out)
        except OSError:
            shutil.copy2(src, out)
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.rename(tmp, dest)
    return dest


@dataclass
class BuildEvent:
    kind: str  # step | log | done | cached | pull | base | wait (another build of the tag runs: build_lock)
    text: str
    step: int | None = None
    total: int | None = None


@dataclass
class BuildResult:
    tag: str
    image_id: str
    built: bool  # False: the image existed already
    seconds: float
    size: int
    log_path: Path | None = None
    labels: dict[str, str] = field(default_factory=dict)


# BuildKit's plain progress output: `#5 [stage-0 2/4] RUN ...` (the docker CLI's own client, Engine 20.10) or
# `#5 [2/4] RUN ...` (buildx) opens a step; `#5 0.242 <text>` is its output, `#5 DONE 0.3s` / `#5 CACHED` /
# `#5 ERROR: ...` its end; `[internal] ...` and `[auth] ...` vertices are BuildKit's own.
_VERTEX = re.compile(r"^#(\d+) \[(?:[^\]]*?\s)?(\d+)/(\d+)\] (.*)$")
# what a failed build ends with: `#6 ERROR: executor failed running [...]: exit code: 3` (20.10), `ERROR: failed
# to build: failed to solve: ...` / `error: failed to solve: ...` (buildx); a step's own output (`#6 0.58 ...`) is not
_FAILED = re.compile(r"^(?:#\d+ )?(?:ERROR|error):\s*(\S.*)")


def build_event(line: str) -> BuildEvent | None:
    """One line of BuildKit's plain output as a progress event: a step (`#N [stage a/b] INSTRUCTION`), else a
    log line (None for an empty one)."""
    m = _VERTEX.match(line)
    if m:
        return BuildEvent("step", m.group(4), int(m.group(2)), int(m.group(3)))
    return BuildEvent("log", line) if line.strip() else None


def run_build(cmd: list[str], log_path: Path, on_event: Callable[[BuildEvent], None] = lambda e: None
              ) -> tuple[int, list[str], str | None]:
    """Run a build command (leading ``NAME=value`` words go to its environment), its whole output appended to
    ``log_path`` and turned into events (a step once, not each time BuildKit names it again); returns its exit
    status, the last lines of its output and the error it ended with (None when it succeeded)."""
    env = dict(os.environ)
    argv = list(cmd)
    while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
        name, _, value = argv.pop(0).partition("=")
        env[name] = value
    tail: list[str] = []
    last_step: tuple[int | None, int | None, str] | None = None
    error = None
    with open(log_path, "a") as log:
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, text=True, errors="replace", bufsize=1)
        except OSError as exc:
            log.write(f"ERROR: {exc}\n")
            return 127, [str(exc)], f"cannot run {argv[0]}: {exc}"
        assert proc.stdout is not None
        try:
            for raw in proc.stdout:
                log.write(raw)
                log.flush()
                line = raw.rstrip("\n")
                tail = [*tail[-40:], line]
                failed = _FAILED.match(line)
                if failed:
                    error = failed.group(1).strip()
                event = build_event(line)
                if event is None:
                    continue
                if event.kind == "step":
                    key = (event.step, event.total, event.text)
                    if key == last_step:
                        continue
                    last_step = key
                on_event(event)
        except BaseException:
            proc.kill()
            raise
        finally:
            rc = proc.wait()
    if rc == 0:
        return 0, tail, None
    if any("buildx component is missing" in line for line in tail):
        error = ("this docker CLI builds only through its buildx plugin, which is missing or broken: install "
                 "docker-buildx-plugin (Docker CE) so that `docker buildx version` works")
    elif error is None:
        error = next((line.strip() for line in reversed(tail) if line.strip()), f"exit status {rc}")
    return rc, tail, error


def ensure_base(client: Any, plan: ImagePlan, on_event: Callable[[BuildEvent], None]) -> ImagePlan:
    """Make the base image present (build local/bookworm, or pull) and return the plan with its digest."""
    from docker.errors import DockerException

    try:
        client.images.get(plan.base_image)
    except DockerException:
        if plan.base_image == LOCAL_BOOKWORM:
            on_event(BuildEvent("base", f"building {LOCAL_BOOKWORM} (debootstrap + docker import)"))
            script = DOCKER_DIR / "base" / "build-bookworm.sh"
            proc = ask(["bash", str(script), LOCAL_BOOKWORM], timeout_s=BOOKWORM_BUILD_TIMEOUT_S,
                       what=f"the {LOCAL_BOOKWORM} base (debootstrap from the Debian mirror)")
            if proc.returncode != 0:
                raise SuiteError(f"{script} failed:\n{(proc.stdout + proc.stderr)[-3000:]}") from None
        else:
            on_event(BuildEvent("pull", f"pulling {plan.base_image}"))
            repo, _, tag = plan.base_image.rpartition(":")
            if not repo or "/" in tag:
                repo, tag = plan.base_image, "latest"
            try:
                for line in client.api.pull(repo, tag=tag, stream=True, decode=True):
                    if line.get("status") and not line.get("progressDetail"):
                        on_event(BuildEvent("pull", f"{line.get('id', '')} {line['status']}".strip()))
            except DockerException as exc:
                raise SuiteError(f"cannot pull base image {plan.base_image}: {exc}") from None
    digest = resolve_digest(client, plan.base_image)
    if digest is None:
        raise SuiteError(f"base image {plan.base_image} is not present after pulling it")
    return plan if digest == plan.base_digest else with_digest(plan, digest)


@contextmanager
def build_lock(tag: str, on_event: Callable[[BuildEvent], None] = lambda e: None) -> Iterator[None]:
    """One build of an image tag at a time on this host: a second `suite build` (or a run building its images,
    or the test suite's own build beside its server tests) waits for the first and then finds its image instead
    of building the same layers again beside it. A lock file in the system's temporary folder, held while the
    file is open (closing it, or the process ending however it ends, lets go)."""
    import fcntl
    import tempfile

    path = Path(tempfile.gettempdir()) / f"suite-image-{re.sub(r'[^A-Za-z0-9_.-]', '_', tag)}.lock"
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_event(BuildEvent("wait", f"{tag}: another build of it is running on this host; waiting for it"))
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_image(client: Any, plan: ImagePlan, cache_root: Path,
                on_event: Callable[[BuildEvent], None] = lambda e: None, keep_context: bool = False) -> BuildResult:
    """Build the plan's image unless an image with its tag and identity exists (after any build of the same tag
    running on this host has ended: ``build_lock``). SuiteError on failure."""
    with build_lock(plan.tag, on_event):
        return _build_image(client, plan, cache_root, on_event, keep_context)


def _build_image(client: Any, plan: ImagePlan, cache_root: Path, on_event: Callable[[BuildEvent], None],
                 keep_context: bool) -> BuildResult:
    import time

    t0 = time.monotonic()
    plan = ensure_base(client, plan, on_event)
    found = existing_image(client, plan)
    if found is not None:
        on_event(BuildEvent("cached", f"{plan.tag} exists"))
        return BuildResult(plan.tag, found.id, False, time.monotonic() - t0, found.attrs.get("Size", 0),
                           labels=dict(found.labels or {}))
    context = assemble_context(plan, plan.context_dir(cache_root))
    log_path = cache_root / "docker" / "build-logs" / f"{plan.tag.split(':', 1)[1]}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = plan.build_command(context)
    log_path.write_text("$ " + shlex.join(cmd) + "\n")
    try:
        _, tail, error = run_build(cmd, log_path, on_event)
    finally:
        if not keep_context:
            shutil.rmtree(context, ignore_errors=True)  # the build log keeps what went wrong
    if error is not None:
        raise SuiteError(f"building {plan.tag} failed: {error}\n  log: {log_path}\n--- log tail ---\n"
                         + "\n".join(tail[-25:]))
    image = existing_image(client, plan)
    if image is None:
        raise SuiteError(f"built {plan.tag} but it does not carry the identity label {plan.identity}")
    on_event(BuildEvent("done", f"built {plan.tag}"))
    return BuildResult(plan.tag, image.id, True, time.monotonic() - t0, image.attrs.get("Size", 0), log_path,
                       dict(image.labels or {}))


# vLLM source files host-side stages read (without importing vLLM): suite.stages.latency.run.engine_flags
HOST_SOURCE_FILES = ("vllm/engine/arg_utils.py",)
_READ_SOURCES = (
    "import importlib.util, json, pathlib, sys; spec = importlib.util.find_spec('vllm'); "
    "site = pathlib.Path(next(iter(spec.submodule_search_locations))).parent; "
    "print(json.dumps({f: (site / f).read_text() for f in sys.argv[1:]}))")


def copy_vllm_sources(client: Any, image: str, image_id: str, dest_root: Path) -> Path:
    """A host directory holding the image's copies of HOST_SOURCE_FILES at their package paths (vllm/...),
    read once per image (cached by image id) by a short container of the image."""
    from docker.errors import DockerException

    dest = dest_root / image_id.split(":", 1)[-1][:16]
    if all((dest / f).is_file() for f in HOST_SOURCE_FILES):
        return dest
    try:
        out = client.containers.run(image, entrypoint=["python3", "-c", _READ_SOURCES], command=list(HOST_SOURCE_FILES),
                                    remove=True, stdout=True, stderr=False, network_mode="none")
        files = json.loads(out)
    except (DockerException, ValueError) as exc:
        raise SuiteError(f"cannot read {', '.join(HOST_SOURCE_FILES)} from image {image}: {exc}") from None
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for rel, text in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest
