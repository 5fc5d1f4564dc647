"""Before any pull, build or download: what a first GPU host stops on, checked for one matrix.

- **The driver against the image's CUDA** (docker, NVIDIA): the base the host's driver runs
  (`suite.runtime.docker.bases`); a base the driver cannot run, or a driver older than R535, stops the run with
  the exact fix.
- **The container toolkit**: the engine hands NVIDIA GPUs to containers (the nvidia runtime, the toolkit's
  hook, or a CDI spec); ROCm: /dev/kfd and a render node under /dev/dri.
- **Disk for the images**: the engine's data root holds each base image not here yet (tens of GB) and the
  arms' images.
- **Model access** (every runtime): each model the matrix names on the hub, through the hub's API before any
  download: a gated repository, a missing or wrong token, a repository that does not exist; and the free disk
  of the hub cache against the files a run will download.

`suite doctor MATRIX` shows every check; `suite run` and `suite build` run them first and stop on a failed one
(`PreflightError`), naming each with its fix.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from suite.errors import SuiteError
from suite.matrix import Matrix
from suite.matrix_blocks import DockerSpec
from suite.runtime.docker import image_vendor
from suite.runtime.docker.bases import CUDA13_DRIVER, cuda_base, engine_is_here, host_driver

Status = Literal["ok", "warn", "fail"]
GIB = 1024**3
# what a base image not pulled yet takes on the engine's disk (compressed download and its unpacked layers:
# vLLM's CUDA image is about 10 GB to pull and 25 GB unpacked; the ROCm one about twice that), and an arm's
# image over it (the suite's layers: lm-eval, the patch layer, an arm's own vLLM wheel)
BASE_DISK_GIB = {"cuda": 35.0, "rocm": 70.0, "cpu": 2.0}
ARM_IMAGE_DISK_GIB = 3.0
@dataclass(frozen=True)
class Preflight:
    """One check of a matrix against this host: what it found and, when it failed or warns, what to do."""

    name: str
    status: Status
    detail: str
    fix: str = ""


class PreflightError(SuiteError):
    """A check failed: nothing was pulled, built or downloaded."""


# ------------------------------------------------------------------------------------------------ the engine


def container_gpus(vendor: str, runtimes: Sequence[str], driver: int | None, which: Callable[[str], str | None]
                   = shutil.which, dev: Path = Path("/dev"), cdi_dirs: Sequence[Path] = (
                       Path("/etc/cdi"), Path("/var/run/cdi"))) -> Preflight:
    """Whether the engine can hand the vendor's GPUs to a container (before any image exists to try it with:
    `suite doctor --docker --gpu` runs `docker run --gpus all` once an image is here)."""
    name = "container GPUs"
    if vendor == "cuda":
        if driver is None:
            return Preflight(name, "fail", "no NVIDIA driver on this host (/proc/driver/nvidia/version)",
                             f"install the NVIDIA driver (R{CUDA13_DRIVER} or newer)")
        cdi = [p.name for d in cdi_dirs if d.is_dir() for p in d.glob("nvidia*.y*ml")]
        ways = (["the engine's nvidia runtime"] if "nvidia" in runtimes else []) + (
            ["the toolkit's hook"] if which("nvidia-container-runtime-hook") else []) + (
            [f"a CDI spec ({', '.join(cdi)})"] if cdi else [])
        if ways:
            return Preflight(name, "ok", "NVIDIA GPUs reach containers through " + ", ".join(ways))
        return Preflight(name, "fail", "the engine cannot give a container the GPUs (no nvidia runtime "
                         f"among {', '.join(runtimes) or 'none'}, no nvidia-container-runtime-hook, no CDI spec)",
                         "install the NVIDIA Container Toolkit, then `sudo nvidia-ctk runtime configure "
                         "--runtime=docker && sudo systemctl restart docker`")
    if vendor == "rocm":
        kfd, dri = dev / "kfd", dev / "dri"
        renders = sorted(p.name for p in dri.glob("renderD*")) if dri.is_dir() else []
        if kfd.exists() and renders:
            return Preflight(name, "ok", f"{kfd} and {dri} ({', '.join(renders)}) go to the containers")
        return Preflight(name, "fail", f"{kfd} {'exists' if kfd.exists() else 'is missing'}, "
                         f"{len(renders)} render node(s) under {dri}", "load ROCm's amdgpu driver (`rocm-smi` lists "
                         "the GPUs when it is)")
    return Preflight(name, "ok", "the CPU image needs no device")


def image_disk(vendor: str, data_root: Path | None, missing_bases: Sequence[str], images_to_build: int) -> Preflight:
    """Free space on the engine's data root against the bases still to pull and the arms' images to build."""
    name = "disk for images"
    need = len(missing_bases) * BASE_DISK_GIB.get(vendor, 35.0) + images_to_build * ARM_IMAGE_DISK_GIB
    if not need:
        return Preflight(name, "ok", "every image is here")
    if data_root is None or not data_root.exists():
        return Preflight(name, "warn", f"about {need:.0f} GiB to pull and build; the engine's data root "
                         f"({data_root or 'unknown'}) cannot be read from here", "check `docker system df`")
    free = shutil.disk_usage(data_root).free / GIB
    what = (f"about {need:.0f} GiB needed: " + ", ".join(
        [*(f"{b} to pull" for b in missing_bases), *([f"{images_to_build} image(s) to build"] if images_to_build
                                                      else [])]) + f"; {free:.0f} GiB free on {data_root}")
    if free < need:
        return Preflight(name, "fail", what, "free space (`docker system prune`, `docker image prune -a`) or move "
                         "the engine's data-root")
    return Preflight(name, "ok", what)


# ------------------------------------------------------------------------------------------------ the models


@dataclass(frozen=True)
class Download:
    """One repository a run reads from the hub, and which of its files."""

    what: str  # model | tokenizer
    repo_id: str
    allow_patterns: tuple[str, ...]
    weights: bool = True  # False: a dummy-weight model (--load-format dummy) needs its config and tokenizer only


# What vLLM reads from a model repository: configs, safetensors weights, tokenizer files, chat templates and
# remote code. Original/consolidated checkpoints, GGUF, ONNX, TF/Flax weights are left out.
MODEL_PATTERNS = ("*.json", "*.safetensors", "*.py", "*.model", "*.tiktoken", "*.txt", "*.jinja")
# Only for a repository without safetensors (vLLM then loads PyTorch .bin / .pt weights).
FALLBACK_WEIGHT_PATTERNS = ("*.bin", "*.pt")
TOKENIZER_PATTERNS = ("*.json", "*.model", "*.tiktoken", "*.txt", "*.jinja", "*.py")


def is_local(ref: str) -> bool:
    """load_matrix makes a model or tokenizer written as a local path (./, ../, /, ~) absolute."""
    return Path(ref).is_absolute()


def plan_fetch(matrix: Matrix) -> tuple[list[Download], list[str]]:
    """(downloads, notes): what to download for every model the matrix names (the matrix's and an arm's own),
    and what needs nothing (local directories). A repository named twice is downloaded once."""
    downloads: list[Download] = []
    notes: list[str] = []
    for m in matrix.models_by_arm().values():
        for what, ref in (("model", m.id), ("tokenizer", m.tokenizer)):
            if what == "tokenizer" and ref == m.id:
                continue
            if is_local(ref):
                generated = what == "model" and m.generate is not None
                if generated and not Path(ref).exists():
                    notes.append(f"{what} {ref}: generated here by model.generate: {m.generate} (config + "
                                 "tokenizer; weights: dummy)")
                    continue
                if not Path(ref).is_dir():
                    raise SuiteError(f"{what} {ref} is a local path but no such directory exists")
                notes.append(f"{what} {ref} is a local directory: nothing to fetch"
                             + (" (weights: dummy, --load-format dummy)" if m.dummy else ""))
                continue
            weights = what == "model" and not m.dummy
            download = Download(what, ref, MODEL_PATTERNS if weights else TOKENIZER_PATTERNS, weights=weights)
            if download not in downloads:
                downloads.append(download)
    return downloads, list(dict.fromkeys(notes))


def hub_cache_dir(matrix: Matrix) -> Path:
    """The hub cache the matrix's servers will read: the containers' (docker runtime: $HF_HUB_CACHE unless
    docker.hf_cache is given, else the directory mounted as their HF_HOME, plus hub/), otherwise the hub's own
    default ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    if matrix.runtime.kind == "docker":
        from suite.runtime.docker.containers import hub_cache_dir as container_hub_cache

        return container_hub_cache(matrix.runtime.docker or DockerSpec())
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def hub_hint(exc: Exception) -> str:
    """What to do about an error of the hub's client, in one line."""
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    if isinstance(exc, GatedRepoError):
        return ("the repository is gated: accept its terms on its hub page with the account whose token you pass "
                "(HF_TOKEN)")
    if isinstance(exc, RepositoryNotFoundError):
        return ("no such repository, or no access to it: check the id and HF_TOKEN; for a checkpoint of your "
                "own give model.id as a local directory (or set the matrix's ${...} variable)")
    if isinstance(exc, LocalEntryNotFoundError):
        return "the hub is not reachable (or HF_HUB_OFFLINE=1) and the files are not in the cache"
    return "see the message above"


def _wanted(files: Sequence[Any], patterns: Sequence[str]) -> list[Any]:
    return [f for f in files if any(fnmatch.fnmatch(f.rfilename, p) for p in patterns)]


def model_access(d: Download, cache_dir: Path, api: Any = None) -> tuple[Preflight, int]:
    """(the check, bytes still to download): the repository's metadata through the hub's API, as the download
    will ask with the same token; a repository without safetensors counts its .bin / .pt weights."""
    from huggingface_hub import HfApi, constants, get_token
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    name = f"{d.what} access"
    if constants.HF_HUB_OFFLINE:
        return Preflight(name, "warn", f"{d.repo_id}: HF_HUB_OFFLINE is set: not asked; the run reads the cache"), 0
    api = api or HfApi()
    try:
        info = api.model_info(d.repo_id, files_metadata=True)
    except (GatedRepoError, RepositoryNotFoundError) as exc:
        token = "with a token" if get_token() else "without a token (HF_TOKEN is not set)"
        return Preflight(name, "fail", f"{d.repo_id}: {type(exc).__name__} {token}", hub_hint(exc)), 0
    except HfHubHTTPError as exc:
        return Preflight(name, "warn", f"{d.repo_id}: the hub answered {str(exc).splitlines()[0][:120]}",
                         "the download will tell; `suite fetch MATRIX` downloads before the run"), 0
    except Exception as exc:  # noqa: BLE001  (no route to the hub: the HTTP client's own connection errors)
        return Preflight(name, "warn", f"{d.repo_id}: the hub is not reachable from here "
                         f"({type(exc).__name__}); access not checked", "`suite fetch MATRIX` where the hub is "
                         "reachable, or set HF_HUB_OFFLINE=1 once the cache holds the model"), 0
    siblings = list(info.siblings or [])
    files = _wanted(siblings, d.allow_patterns)
    if d.what == "model" and d.weights and not any(f.rfilename.endswith(".safetensors") for f in files):
        files += _wanted(siblings, FALLBACK_WEIGHT_PATTERNS)
    total = sum(f.size or 0 for f in files)
    gated = f", gated ({info.gated}): access granted" if getattr(info, "gated", False) else ""
    return Preflight(name, "ok", f"{d.repo_id}: {len(files)} files, {total / 1e9:.1f} GB{gated}"), total


def cached_bytes(repo_id: str, cache_dir: Path) -> int:
    """Bytes of the repository's files already in the hub cache (its blobs)."""
    blobs = cache_dir / f"models--{repo_id.replace('/', '--')}" / "blobs"
    return sum(p.stat().st_size for p in blobs.iterdir() if p.is_file()) if blobs.is_dir() else 0


def models(matrix: Matrix, api: Any = None) -> list[Preflight]:
    """Every hub model and tokenizer of the matrix: access, and room in the hub cache for what is not there."""
    try:
        downloads, _ = plan_fetch(matrix)
    except SuiteError as exc:
        return [Preflight("model", "fail", str(exc), "give model.id as an existing directory or a hub id")]
    if not downloads:
        return []
    cache = hub_cache_dir(matrix)
    out, need = [], 0
    for d in downloads:
        check, size = model_access(d, cache, api)
        out.append(check)
        need += max(0, size - cached_bytes(d.repo_id, cache))
    if need:
        root = _existing(cache)
        free = shutil.disk_usage(root).free
        status: Status = "ok" if free > need else "fail"
        out.append(Preflight("disk for the model", status, f"{need / 1e9:.1f} GB to download into {cache}; "
                             f"{free / 1e9:.0f} GB free", "" if status == "ok" else
                             "free space there, or point HF_HUB_CACHE (docker: runtime.docker.hf_cache) elsewhere"))
    return out


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


# ------------------------------------------------------------------------------------------------ all of it


def docker_checks(matrix: Matrix, client: Any, serving: bool, plans: dict[str, Any] | None = None) -> list[Preflight]:
    """The docker runtime's checks (``serving``: servers will start here, so the GPUs must reach containers;
    `suite build` alone needs the base and the disk); ``plans``: the arms' image plans when the caller has them
    (planning resolves git refs over the network: once)."""
    from suite.runtime.docker.image_build import resolve_digest
    from suite.runtime.docker.images import plans_for

    docker = matrix.runtime.docker or DockerSpec()
    vendor = image_vendor(matrix)
    driver = host_driver(matrix)
    out: list[Preflight] = []
    if vendor == "cuda":
        seen = set()
        for spec in matrix.arms.values():
            if spec.image or spec.vllm in seen:
                continue
            seen.add(spec.vllm)
            choice = cuda_base(spec.vllm, docker.base_image, driver)
            out.append(Preflight("driver and image CUDA", "ok" if choice.runs else "fail", choice.why, choice.fix))
    info = client.info() if client is not None else {}
    if serving and engine_is_here():
        out.append(container_gpus(vendor, sorted((info.get("Runtimes") or {}).keys()), driver))
    if client is not None and engine_is_here():
        from docker.errors import DockerException

        plans = plans or plans_for(matrix, lambda ref: resolve_digest(client, ref), driver=driver)
        missing, to_build = [], 0
        for plan in {p.identity: p for p in plans.values()}.values():
            try:
                client.images.get(plan.tag)
                continue
            except DockerException:
                to_build += 1
            try:
                client.images.get(plan.base_image)
            except DockerException:
                missing.append(plan.base_image)
        root = info.get("DockerRootDir")
        out.append(image_disk(vendor, Path(root) if root else None, sorted(set(missing)), to_build))
    return out


def matrix_checks(matrix: Matrix, client: Any = None, serving: bool = True, plans: dict[str, Any] | None = None
                  ) -> list[Preflight]:
    """Every check that applies to the matrix on this host: the docker runtime's, then its models'."""
    out = docker_checks(matrix, client, serving, plans) if matrix.runtime.kind == "docker" else []
    return out + models(matrix)


def enforce(checks: Sequence[Preflight], say: Callable[[str], None]) -> None:
    """Say each warning; raise `PreflightError` naming every failed check with its fix."""
    for c in checks:
        if c.status == "warn":
            say(f"warning: {c.name}: {c.detail}" + (f" ({c.fix})" if c.fix else ""))
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        raise PreflightError("preflight: nothing pulled, built or downloaded:\n" + "\n".join(
            f"  {c.name}: {c.detail}\n    fix: {c.fix}" for c in failed))
