"""Image identity for the docker runtime: the plan of one arm's image (``ImagePlan``: what it is built from),
its tag, labels and build command, and what an image's labels say it was built from.

An arm's image = a vendor Dockerfile (docker/<vendor>/Dockerfile) over a base image, optionally the arm's own
vLLM installed over the base image's (a wheel file, or a git ref: `vllm: {wheel|git: ...}`) and, on ROCm, its
own AITER and tuned GEMM CSVs (suite.runtime.docker.image_sources), plus the arm's patches (patch sets and diff
files of the matrix's own) applied by `suite patches apply` inside the build. Its tag is derived from everything
that goes into it (the base image's digest, every file of the build context: suite.runtime.docker.build_context,
the build arguments, the suite version), so an unchanged arm is never rebuilt and a changed one never reuses a
stale image.

:meth:`ImagePlan.build_command` is the command that builds the image with BuildKit through the docker CLI
(``docker buildx build --load`` where the buildx plugin is installed, else ``DOCKER_BUILDKIT=1 docker build``):
the line ``suite build --dry-run`` prints, the build log's first line, and the one
suite.runtime.docker.image_build runs.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from suite import __version__
from suite.errors import SuiteError
from suite.matrix import ArmSpec, Matrix, file_sha256
from suite.patches import AppliedPatch
from suite.proc import query
from suite.records import AiterSource, TunedCsv
from suite.runtime.docker import DOCKER_DIR, image_vendor
from suite.runtime.docker.bases import cuda_base
from suite.runtime.docker.build_context import context_files
from suite.runtime.docker.image_sources import (
    AiterBuild,
    VllmBuild,
    aiter_build_for,
    git_ls_remote,
    vllm_build_for,
)

IMAGE_REPO = "suite-vllm"
IDENTITY_SCHEMA = "suite-image-v1"
LOCAL_BOOKWORM = "local/bookworm"
DEFAULT_BASES = {
    "cuda": "vllm/vllm-openai:v{vllm}",  # CUDA 13: NVIDIA driver R580 or newer
    "rocm": "vllm/vllm-openai-rocm:v{vllm}",
    "cpu": LOCAL_BOOKWORM,
}
# A name that travels in a space-separated build argument and label (SUITE_PATCHES, "NAME=SHA256" lists)
SAFE_NAME = re.compile(r"^[A-Za-z0-9_.+][A-Za-z0-9_.+-]*$")


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


BUILDX_PROBE_TIMEOUT_S = 30
_buildx: dict[str, bool] = {}


def buildx_available() -> bool:
    """Whether the docker CLI on PATH has the buildx plugin (`docker buildx version` works: Docker CE with
    docker-buildx-plugin, as GPU hosts have; Debian's docker.io 20.10 client has none and builds with its own
    BuildKit client). Asked once per process and PATH."""
    key = os.environ.get("PATH", "")
    if key not in _buildx:
        _buildx[key] = query(["docker", "buildx", "version"], timeout_s=BUILDX_PROBE_TIMEOUT_S) is not None
    return _buildx[key]


def base_image_for(vendor: str, vllm: str, override: str | None, driver: int | None = None) -> str:
    """The arm's base image: the matrix's ``override`` or the vendor's default; NVIDIA: the build the host's
    ``driver`` runs (`suite.runtime.docker.bases`)."""
    if vendor == "cuda":
        return cuda_base(vllm, override, driver).image
    template = override or DEFAULT_BASES[vendor]
    return template.replace("{vllm}", vllm)


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


def plan_image(matrix: Matrix, arm: str, spec: ArmSpec, base_digest: Callable[[str], str | None],
               resolve_ref: Callable[[str, str], str | None] = git_ls_remote, driver: int | None = None) -> ImagePlan:
    """The image an arm needs (PatchError / SuiteError for unknown sets, a version a set lacks, a diff file
    that does not parse, a wheel that changed, a git URL the build cannot fetch); ``driver``: the NVIDIA driver
    its containers run on, which picks the CUDA build of the base."""
    from suite.patches import patch_fingerprint, resolve_patches

    docker = matrix.runtime.docker or _default_docker_spec()
    vendor = image_vendor(matrix)
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
        raise SuiteError(f"arm {arm!r}: aiter: is built into a ROCm image only (runtime.vendor: rocm)")
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
