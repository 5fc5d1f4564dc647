"""Where an arm image's vLLM and (ROCm) AITER come from: the base image's own, a wheel installed over it, or a
git ref built over it (docker/<vendor>/Dockerfile, the steps before the patch layer). ``VllmBuild`` and
``AiterBuild`` give their part of the image's identity, build arguments, labels and build-context files;
``vllm_build_for`` and ``aiter_build_for`` work them out from an arm's `vllm:` and `aiter:` (a wheel checked
against its sha256, a git ref resolved to the commit it is now, a URL the build cannot fetch refused).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from suite.errors import SuiteError
from suite.matrix import LOCAL_PREFIXES, VllmSource, file_sha256
from suite.matrix_blocks import AITER_BUILD_DEFAULTS, AiterFrom
from suite.proc import query
from suite.runtime.docker import DOCKER_DIR

# In the build context: an arm's vLLM wheel at VLLM_WHEEL_DIR/<sha256>/<wheel file name> (pip reads the version
# from the file name).
VLLM_WHEEL_DIR = "vllm-wheel"  # the Dockerfiles: COPY vllm-wheel/ /tmp/suite-vllm-wheel/ (a README when empty)
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
    prebuild_kernels: str = AITER_BUILD_DEFAULTS["PREBUILD_KERNELS"]  # AITER's PREBUILD_KERNELS (git)
    gpu_archs: str = AITER_BUILD_DEFAULTS["GPU_ARCHS"]  # AITER's GPU_ARCHS (git)
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
            parts += (self.git_url, self.git_ref, self.git_commit or "unresolved", self.prebuild_kernels,
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
            "AITER_PREBUILD_KERNELS": self.prebuild_kernels if self.kind == "git" else "",
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


_remote_refs: dict[tuple[str, str], str | None] = {}


def git_ls_remote(url: str, ref: str) -> str | None:
    """The commit a branch or tag of a remote repository points at now (``git ls-remote``; an annotated tag
    peeled to its commit); None when git, the repository or the ref cannot be reached (offline: a provisional
    identity, like an unresolved base digest). Remembered for the life of the process."""
    key = (url, ref)
    if key not in _remote_refs:
        # the second pattern lists an annotated tag's peeled commit (the first matches the tag object only)
        out = query(["git", "ls-remote", url, ref, f"{ref}^{{}}"], timeout_s=60,
                    env={**os.environ, "GIT_TERMINAL_PROMPT": "0"}) or ""
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
                          prebuild_kernels=aiter.build_var("PREBUILD_KERNELS"), gpu_archs=aiter.build_var("GPU_ARCHS"),
                          **common)
    return AiterBuild(**common)
