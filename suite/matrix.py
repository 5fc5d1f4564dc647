"""Load and validate matrix YAML files.

A matrix says *what* to measure: one model, a runtime, the arms (baseline, patched, ...) and the points.
Every validation error is reported as ``file:line: field: message``; nothing here starts a process.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from suite.errors import MatrixError

ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(Strict):
    id: str = Field(description="Hugging Face hub id or a local directory (relative to the matrix file)")
    served_name: str | None = Field(None, description="--served-model-name; defaults to the id")
    tokenizer: str | None = Field(None, description="tokenizer id or directory; defaults to the model")
    max_model_len: int = Field(2048, gt=0, description="--max-model-len, also the point feasibility limit")

    @property
    def name(self) -> str:
        return self.served_name or self.id


class DockerSpec(Strict):
    vendor: Literal["cuda", "rocm", "cpu"] = "cpu"
    base_image: str | None = Field(None, description="vendor base image; default per vendor and vLLM version")
    gpus: str = Field("all", description="GPU selection: 'all' or a comma list of device indices")
    shm_size: str | None = None
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
    container: Literal["none", "pyxis", "apptainer"] = "none"
    image: str | None = Field(None, description="pyxis/apptainer image (an arm's `image` overrides it)")
    container_mounts: list[str] = Field([], description="extra SRC[:DST] mounts into the container")
    gpu_vendor: Literal["cuda", "rocm"] = Field("cuda", description="apptainer: --nv (cuda) or --rocm")
    max_resubmits: int = Field(1, ge=0, description="resubmissions of a session whose job did not complete")
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


class RuntimeSpec(Strict):
    kind: Literal["local", "docker", "slurm"] = "local"
    startup_timeout_s: float = Field(600, gt=0)
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535, description="0 = pick a free port")
    max_restarts: int = Field(1, ge=0, description="server restarts after a crash, per arm session")
    docker: DockerSpec | None = None
    slurm: SlurmSpec | None = None


class PatchRef(Strict):
    name: str
    reverse: bool = False


def _patch_ref(value: Any) -> Any:
    if isinstance(value, str):
        if value.startswith("-"):
            return {"name": value[1:], "reverse": True}
        return {"name": value}
    return value


class ArmSpec(Strict):
    vllm: str = Field(description="vLLM version the arm runs (the installed one for the local runtime)")
    image: str | None = Field(None, description="docker runtime: use this image instead of building one")
    patches: list[Annotated[PatchRef, Field()]] = []
    env: dict[str, str] = {}
    serve_args: list[str] = []
    description: str | None = None

    @field_validator("patches", mode="before")
    @classmethod
    def _coerce_patches(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [_patch_ref(v) for v in value]
        return value

    @field_validator("vllm", mode="before")
    @classmethod
    def _vllm_str(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) else value


NUM_PROMPTS = re.compile(r"^(\d+(?:\.\d+)?)x$")


class ServePoint(Strict):
    """One ISL/OSL block; expands to one point per concurrency."""

    isl: int = Field(gt=0)
    osl: int = Field(gt=0)
    concurrency: list[int] = Field(min_length=1)
    num_prompts: int | str = Field("3x", description="absolute count or a multiple of concurrency ('3x')")
    random_range_ratio: float = Field(0.0, ge=0.0, lt=1.0)
    request_rate: float | None = Field(None, gt=0, description="None = all at once (inf)")
    num_warmups: int = Field(0, ge=0)
    seed: int = 0

    @field_validator("concurrency", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, int) else value

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(c <= 0 for c in value):
            raise ValueError("every concurrency must be > 0")
        if len(set(value)) != len(value):
            raise ValueError("concurrency values must be distinct")
        return value

    @field_validator("num_prompts")
    @classmethod
    def _num_prompts(cls, value: int | str) -> int | str:
        if isinstance(value, int):
            if value <= 0:
                raise ValueError("num_prompts must be > 0")
            return value
        if not NUM_PROMPTS.match(value.strip()):
            raise ValueError("num_prompts must be a positive integer or a multiple like '3x'")
        return value.strip()

    def prompts_for(self, concurrency: int) -> int:
        if isinstance(self.num_prompts, int):
            return self.num_prompts
        factor = float(NUM_PROMPTS.match(self.num_prompts).group(1))  # type: ignore[union-attr]
        return max(1, round(factor * concurrency))


class LatencyPoint(Strict):
    input_len: int = Field(gt=0)
    output_len: int = Field(gt=0)
    batch_size: list[int] = Field(min_length=1)
    num_iters_warmup: int = Field(3, ge=0)
    num_iters: int = Field(10, gt=0)

    @field_validator("batch_size", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, int) else value


class AccuracySpec(Strict):
    task: str = "gsm8k"
    num_fewshot: int = Field(5, ge=0)
    limit: int | None = Field(None, gt=0, description="None = the whole test set (1,319 for GSM8K)")
    endpoint: Literal["completions", "chat"] = "completions"
    max_gen_toks: int = Field(256, gt=0)
    concurrency: int = Field(8, gt=0)
    seed: int = 1234
    dataset: str = Field(
        "openai/gsm8k",
        description="hub id, a directory with train.jsonl and test.jsonl, or 'synthetic' (GSM8K-format problems "
        "generated into the run directory, labelled synthetic; for the CPU demo and tests)",
    )
    min_accuracy: float | None = Field(None, ge=0, le=1, description="gate: absolute floor (flexible-extract)")
    max_drop: float | None = Field(None, ge=0, le=1, description="gate: largest allowed drop vs baseline")
    equivalence_prompts: int = Field(16, ge=0, description="greedy-equivalence prompts (0 = off)")
    equivalence_max_tokens: int = Field(64, gt=0)


class KernelSpec(Strict):
    hidden: int = Field(gt=0)
    experts: int = Field(gt=0)
    m: list[int] = [1, 2, 4, 8, 16, 32]
    trace_m: int = Field(2048, gt=0, description="M of the first (frozen) torch.compile trace")
    iters: int = Field(50, gt=0)
    trials: int = Field(31, gt=0)


class ProfileSpec(Strict):
    """A short decode-heavy window under vLLM's torch profiler (suite.measure.profile)."""

    isl: int = Field(128, gt=0)
    osl: int = Field(64, gt=0)
    concurrency: int = Field(4, gt=0)
    num_prompts: int | None = Field(None, gt=0, description="requests in the profiled window; default: "
                                    "concurrency (all start together: one prefill round, then decode steps)")
    warmup_prompts: int | None = Field(None, ge=0, description="requests sent before /start_profile; "
                                       "default: concurrency; 0 = no warm-up")
    seed: int = 0
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
    name: str
    description: str | None = None
    model: ModelSpec
    runtime: RuntimeSpec = RuntimeSpec()
    serve_args: list[str] = []
    env: dict[str, str] = {}
    arms: dict[str, ArmSpec] = Field(min_length=1)
    baseline: str | None = Field(None, description="the reference arm; default: the first arm")
    serve: list[ServePoint] = []
    latency: list[LatencyPoint] = []
    repeats: int = Field(1, ge=1)
    order: Literal["blocked", "abba"] = "blocked"
    aa: bool = Field(False, description="also run the baseline arm twice to measure the A/A noise floor")
    drift_check: bool = Field(False, description="repeat the first point at the end of each session")
    accuracy: AccuracySpec | None = None
    kernel: KernelSpec | None = None
    profile: ProfileSpec | None = None
    probe: bool = Field(False, description="record which router-gate path ran per batch-size bucket")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not ARM_NAME.match(value):
            raise ValueError("name may hold letters, digits, '.', '_' and '-' only")
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
        for i, point in enumerate(self.serve):
            if point.isl + point.osl > self.model.max_model_len:
                raise ValueError(
                    f"serve[{i}]: isl + osl = {point.isl + point.osl} exceeds model.max_model_len "
                    f"{self.model.max_model_len}"
                )
        for i, point in enumerate(self.latency):
            if point.input_len + point.output_len > self.model.max_model_len:
                raise ValueError(f"latency[{i}]: input_len + output_len exceeds model.max_model_len")
        if not (self.serve or self.latency or self.accuracy or self.kernel or self.profile):
            raise ValueError("nothing to measure: give serve, latency, accuracy, kernel or profile")
        return self

    @property
    def baseline_arm(self) -> str:
        return self.baseline or next(iter(self.arms))


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
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in {"int", "str"})))


POINT_PREFIX = re.compile(r"^(serve|latency)\[(\d+)\]: ")


def parse_matrix(text: str, source: str = "<matrix>", base_dir: Path | None = None) -> Matrix:
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
    try:
        matrix = Matrix.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = _clean_loc(tuple(err["loc"]))
            line = _node_line(root, loc) or 1
            msg = err["msg"].removeprefix("Value error, ")
            where = POINT_PREFIX.match(msg) if not loc else None
            if where:  # a whole-matrix check about one point: point at that point's line
                loc, msg = (where.group(1), int(where.group(2))), msg[where.end():]
                line = _node_line(root, loc) or 1
            if err["type"] == "extra_forbidden":
                msg = "unknown field"
            lines.append(f"{source}:{line}: {_format_loc(loc)}: {msg}")
        raise MatrixError("\n".join(lines)) from None
    if base_dir is not None:
        matrix = resolve_local_paths(matrix, base_dir)
    return matrix


def resolve_local_paths(matrix: Matrix, base_dir: Path) -> Matrix:
    """Make a model id that names an existing local directory absolute (relative to the matrix)."""

    def local(value: str | None) -> str | None:
        if value is None:
            return None
        if value.startswith(("./", "../", "/")):
            return str((base_dir / value).resolve())
        return value

    model = matrix.model.model_copy(update={"id": local(matrix.model.id), "tokenizer": local(matrix.model.tokenizer)})
    return matrix.model_copy(update={"model": model})


def load_matrix(path: str | Path) -> Matrix:
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
