"""The blocks that say what a matrix measures, one per kind of job, each a strict pydantic model that checks its
own fields: the serving points (`ServePoint`: one ISL/OSL block, a point per concurrency; `serve_point_id`, the
id plans, stores and reports name a point by; `PointLabel`, the short name a report gives it, ``128/64 c4``), the
latency rows (`LatencyPoint`), and the specs of the accuracy, kernel, layer and profile jobs (`AccuracySpec`,
`KernelSpec`, `LayerSpec`, `ProfileSpec`). Held to the size limits of :mod:`suite.matrix_blocks`; read by each
stage's ``spec.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from suite.bench_flags import (
    KERNEL,
    LATENCY,
    LAYER,
    SERVE,
    KernelArgs,
    KernelFlags,
    LatencyArgs,
    LatencyFlags,
    LayerArgs,
    LayerFlags,
    ServeArgs,
    ServeFlags,
    kernel_flags,
    latency_flags,
    layer_flags,
    serve_flags,
)
from suite.lm_eval_flags import LM_EVAL, LmEvalArgs, LmEvalFlags, lm_eval_flags
from suite.matrix_blocks import (
    MAX_BATCH,
    MAX_CONCURRENCY,
    MAX_KERNEL_M,
    MAX_PROMPTS,
    MAX_TOKENS,
    Strict,
)

NUM_PROMPTS = re.compile(r"^(\d+(?:\.\d+)?)x$")
SECONDS = re.compile(r"^(\d+(?:\.\d+)?)s$")
DEFAULT_NUM_PROMPTS = "3x"  # a point's size when none is given; a point sized by time runs it without a rate
MAX_POINT_S = 3600  # a point sized by time lasts at most an hour
POINT_LABEL = re.compile(r"^(\d+)/(\d+) c(\d+)$")


class ServePoint(Strict):
    """One ISL/OSL block; expands to one point per concurrency."""

    isl: int = Field(gt=0, le=MAX_TOKENS, description="input length in tokens (random prompts)")
    osl: int = Field(gt=0, le=MAX_TOKENS, description="output length in tokens (--ignore-eos: every request decodes all of them)")
    concurrency: list[int] = Field(min_length=1, description="requests in flight: one number or a list (a point each)")
    num_prompts: int | str = Field(DEFAULT_NUM_PROMPTS, description=(
        "how big each point is: a count (24), a multiple of its concurrency ('3x'), or seconds ('60s': sized by "
        "time, one count per round for every arm: the seconds at a measured request rate, the arms' median in the "
        "previous round, in the first the first arm's warm-up at the point's shape; with no rate measured yet, "
        f"{DEFAULT_NUM_PROMPTS})"))
    bench_args: ServeArgs = Field([], description=(
        "`vllm bench serve` flags of this point, as on its command line, e.g. [--request-rate, \"8\", --num-warmups, "
        "\"2\"] (the last copy wins, as in vLLM): " + SERVE.describe() + ". No other: the flags the suite sets "
        "from the point (--max-concurrency from concurrency, --num-prompts, ...) are refused, with where they come "
        "from"))
    warmup: bool = Field(True, description="warm the server at this shape before the session's first point")
    client: Literal["persistent", "cli"] = Field("persistent", description="one long-lived `vllm bench serve` "
                                                 "process per session, or a fresh CLI process per point")

    @field_validator("concurrency", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return one_or_many(value, "concurrency")

    @property
    def flags(self) -> ServeFlags:
        """What bench_args say, or the defaults (a request rate of None: inf)."""
        return serve_flags(self.bench_args)

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
        text = value.strip()
        if m := SECONDS.match(text):
            seconds = float(m.group(1))
            if not 0 < seconds <= MAX_POINT_S:
                raise ValueError(f"num_prompts {text}: a point sized by time lasts more than 0 s and at most "
                                 f"{MAX_POINT_S:,} s")
            return text
        m = NUM_PROMPTS.match(text)
        if not m:
            raise ValueError("num_prompts must be a positive integer, a multiple of the concurrency like '3x', or "
                             "seconds like '60s' (the point sized by time)")
        if float(m.group(1)) > MAX_PROMPTS:
            raise ValueError(f"num_prompts {text} is beyond the limit {MAX_PROMPTS:,} prompts")
        return text

    @model_validator(mode="after")
    def _prompt_total(self) -> ServePoint:
        worst = max(self.prompts_for(c) for c in self.concurrency)
        if worst > MAX_PROMPTS:
            raise ValueError(f"num_prompts {self.num_prompts} at concurrency {max(self.concurrency):,} is "
                             f"{worst:,} prompts, beyond the limit {MAX_PROMPTS:,}")
        return self

    @property
    def duration_s(self) -> float | None:
        """The seconds each point lasts when sized by time (num_prompts '60s'); None: sized by its count."""
        m = SECONDS.match(self.num_prompts) if isinstance(self.num_prompts, str) else None
        return float(m.group(1)) if m else None

    def prompts_for(self, concurrency: int) -> int:
        """The point's prompt count at ``concurrency``; sized by time, the count a round runs when no request rate
        was measured (the default multiple)."""
        size = DEFAULT_NUM_PROMPTS if self.duration_s is not None else self.num_prompts
        if isinstance(size, int):
            return size
        factor = float(NUM_PROMPTS.match(size).group(1))  # type: ignore[union-attr]
        return max(1, round(factor * concurrency))


def serve_point_id(isl: int, osl: int, concurrency: int, num_prompts: int, duration_s: float | None = None) -> str:
    """A serving point's id, as plans, stores and reports name it."""
    size = f"t{duration_s:g}s" if duration_s else f"n{num_prompts}"
    return f"isl{isl}-osl{osl}-c{concurrency}-{size}"


@dataclass(frozen=True)
class PointLabel:
    """A serving point as the report names it: ``ISL/OSL cC`` (``128/64 c4``: 128 prompt tokens, 64 generated,
    4 requests in flight)."""

    isl: int
    osl: int
    concurrency: int

    def __str__(self) -> str:
        return f"{self.isl}/{self.osl} c{self.concurrency}"

    @classmethod
    def parse(cls, value: Any) -> PointLabel:
        """The point a label names; ValueError saying what to write for anything else."""
        text = value.strip() if isinstance(value, str) else None
        m = POINT_LABEL.match(text) if text is not None else None
        if m is None:
            given = f'"{text}"' if text is not None else f"{value!r} (not text)"
            raise ValueError(f"{given} is not a point: write it as the report names one, \"ISL/OSL cC\" (e.g. "
                             "\"128/64 c4\": the input length / the output length, then c and the concurrency)")
        isl, osl, concurrency = (int(g) for g in m.groups())
        for name, n, limit in (("ISL", isl, MAX_TOKENS), ("OSL", osl, MAX_TOKENS),
                               ("the concurrency", concurrency, MAX_CONCURRENCY)):
            if not 0 < n <= limit:
                raise ValueError(f'"{text}": {name} must be > 0' if n <= 0 else
                                 f'"{text}": {name} {n:,} is beyond the limit {limit:,}')
        return cls(isl, osl, concurrency)


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
    bench_args: LatencyArgs = Field([], description=(
        "`vllm bench latency` flags of this row, as on its command line, e.g. [--num-iters, \"20\"] (the last copy "
        "wins): " + LATENCY.describe() + ". No other: vLLM's engine flags go in serve_args"))

    @field_validator("batch_size", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return one_or_many(value, "batch_size")

    @property
    def flags(self) -> LatencyFlags:
        """What bench_args say, or the defaults."""
        return latency_flags(self.bench_args)


class AccuracySpec(Strict):
    """lm-eval's task against each arm's live server (lm-eval's own flags in lm_eval_args), and greedy equivalence.

    The suite's own part: the data set lm-eval reads, the gates and the greedy-equivalence prompts. The job's
    resolved params are `suite.stages.accuracy.spec.AccuracyParams`."""

    lm_eval_args: LmEvalArgs = Field([], description=(
        "`lm-eval run` flags, as on its command line and spelt as lm-eval spells them, e.g. [--num_fewshot, \"8\", "
        "--model_args, \"num_concurrent=16\"] (short names too: -t, -f, -L, -M, -a; the last copy wins, --model_args "
        "and --gen_kwargs merge their keys, as in lm-eval): " + LM_EVAL.describe() + ". No other: the flags and "
        "model_args keys the suite sets (--output_path, --log_samples, base_url, tokenizer, ...) are refused, with "
        "where they come from"))
    dataset: str = Field(
        "openai/gsm8k",
        description="hub id, a directory with train.jsonl and test.jsonl, or 'synthetic' (GSM8K-format problems "
        "generated into the run directory, labelled synthetic; for the CPU demo and tests)",
    )
    min_accuracy: float | None = Field(None, ge=0, le=1, description="gate: absolute floor (flexible-extract)")
    max_drop: float | None = Field(None, ge=0, le=1, description="gate: largest allowed drop vs baseline")
    equivalence_prompts: int = Field(16, ge=0, le=MAX_PROMPTS, description="greedy-equivalence prompts (0 = off)")
    equivalence_max_tokens: int = Field(64, gt=0, le=MAX_TOKENS, description="tokens each greedy-equivalence prompt generates")

    @property
    def flags(self) -> LmEvalFlags:
        """What lm_eval_args say, or the defaults."""
        return lm_eval_flags(self.lm_eval_args)


class KernelSpec(Strict):
    """The router-gate microbenchmark: each arm's model's gate, at its config's hidden_size x routed experts.

    The shape is read where the job runs, as the server reads the model (suite.model_config.gate_shape). The job's
    resolved params are `suite.stages.kernel.spec.KernelParams`."""

    m: list[Annotated[int, Field(gt=0, le=MAX_KERNEL_M)]] = Field([1, 2, 4, 8, 16, 32], description="tokens per call to time (a row each)")
    bench_args: KernelArgs = Field([], description=(
        "the kernel bench's own flags (`python -m suite.stages.kernel.bench`), as on its command line, e.g. "
        "[--trials, \"51\"] (the last copy wins): " + KERNEL.describe() + ". No other: the flags the stage sets "
        "(--model, --m, ...) are refused, with where they come from"))

    @property
    def flags(self) -> KernelFlags:
        """What bench_args say, or the defaults."""
        return kernel_flags(self.bench_args)


class LayerSpec(Strict):
    """The decoder-layer subgraph benchmark (suite.stages.layer): µs per layer of the model's own decoder layer,
    attention taken out, compiled guard-free and traced at a large T, timed per T (CUDA-graph replay on GPU). The
    job's resolved params are `suite.stages.layer.spec.LayerParams`."""

    tokens: list[Annotated[int, Field(gt=0, le=MAX_KERNEL_M)]] = Field(
        [1, 2, 4, 8], description="T: tokens per call (the decode batch sizes of the ll-bf16 change's PR table)")
    bench_args: LayerArgs = Field([], description=(
        "the layer bench's own flags (`python -m suite.stages.layer.bench`), as on its command line, e.g. "
        "[--compile, inductor] (the last copy wins): " + LAYER.describe() + ". No other: the flags the stage "
        "sets (--model, --tokens, the model's --load-format, ...) are refused, with where they come from"))

    @property
    def flags(self) -> LayerFlags:
        """What bench_args say, or the defaults."""
        return layer_flags(self.bench_args)


DEFAULT_PROFILE_POINT = "128/64 c4"  # the point a profile block without one profiles
PROFILE_SEED = 0  # the profiled prompts' seed: every arm gets the same requests


class ProfileSpec(Strict):
    """A short decode-heavy window under vLLM's torch profiler (suite.stages.profile), at one point.

    In a server session of its own per arm: a warm-up of one request per concurrency slot at the point's shape,
    then ``num_prompts`` requests at its concurrency, all started together (the same seeded prompts for every
    arm). The job's resolved params are `suite.stages.profile.spec.ProfileParams`."""

    point: str = Field(DEFAULT_PROFILE_POINT, description=(
        "the profiled point as the report names one, \"ISL/OSL cC\" (e.g. \"1024/64 c4\"); it may be one of the "
        "serve points or any other (the window runs in a server session of its own)"))
    num_prompts: int | None = Field(None, gt=0, le=MAX_PROMPTS, description="requests in the profiled window; default: "
                                    "the point's concurrency (all start together: one prefill round, then decode steps)")
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

    @field_validator("point", mode="before")
    @classmethod
    def _point(cls, value: Any) -> str:
        return str(PointLabel.parse(value))

    @property
    def shape(self) -> PointLabel:
        return PointLabel.parse(self.point)
