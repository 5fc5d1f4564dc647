"""The flags a matrix gives the bench tools themselves, as on the tool's command line, read into typed values that
the plan puts into each job's params: a serving point's ``bench_args`` (vLLM's own flags of `vllm bench serve`:
`ServeFlags`), a latency row's (`vllm bench latency`: `LatencyFlags`), and the kernel and layer blocks' (the
suite's own benches, `python -m suite.stages.kernel.bench` and `python -m suite.stages.layer.bench`:
`KernelFlags`, `LayerFlags`).

They are read the way the tool's parser reads them (:mod:`suite.served_model`'s reading, the tool not imported):
``--flag value`` and ``--flag=value`` alike, the last copy wins; vLLM's parser reads ``--num_warmups`` as
``--num-warmups``, the suite's benches (plain argparse) take the dashes only. Each value is converted as the
tool's parser converts it (``int``, ``float``: ``inf`` is a request rate; a choice among the tool's choices) and
held to the suite's ranges.

A tool takes only the flags below. The ones the suite sets itself from the point, the block or the arm
(``--max-concurrency`` from concurrency, ``--num-prompts`` from num_prompts, the benches' ``--model`` and ``--m`` /
``--tokens``, ...) are refused with where they come from; any other flag is refused with the list of the accepted
ones. Not every flag of `vllm bench serve` is passed through: the session's persistent client keeps one process
for every point (one event loop, a cached tokenizer, a frozen heap), the suite's warm-ups replay each point's flags
and its sizing and checks read the point's count and rate, so a flag is taken only where both clients (``client:
persistent`` and ``client: cli``) and those readers honour it as the CLI alone would. The benches' flags taken are
their timing's (the trace size, calls, trials; the layer and its compile); the rest of theirs are the stage's or
aids for running them by hand.

The reader (`BenchTool`) is the suite's one reader of a tool's own flags: another tool's spelling (``spell``),
flags of many values and how its parser gathers their copies (`BenchFlag`'s ``many`` and ``gather``) are its
parameters; :mod:`suite.lm_eval_flags` reads lm-eval's with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator

from suite.matrix_blocks import MAX_ITERS, MAX_KERNEL_M, MAX_PROMPTS
from suite.served_model import flag_name, is_option, occurrences


@dataclass(frozen=True)
class BenchFlag:
    """One flag a matrix may give a bench tool: the tool's name for it, how the tool's parser converts its value
    (``kind``: what the text must be), why the suite refuses a converted value (None: it takes it), the suite's
    default and what the flag does (the matrix reference's words); ``param``: the job params' field where it is
    not the flag's own destination (the benches' ``--calls``: ``iters``, the name their records keep). ``many``: the flag takes every value up to the
    next option (argparse's nargs='+'; ``convert`` is given the list); ``gather``: how the parser's action makes
    one value of every copy's (a list that grows, a mapping merged in order); without it the last copy wins."""

    flag: str
    convert: Callable[[Any], Any]
    kind: str
    check: Callable[[Any], str | None]
    default: Any
    says: str
    many: bool = False
    gather: Callable[[list[Any]], Any] | None = None
    write: Callable[[Any], str] = lambda value: "inf" if value is None else str(value)
    param: str = ""

    @property
    def field(self) -> str:
        """The params' field it fills: its destination, as the tool's parser names it (``--num-warmups`` ->
        ``num_warmups``), unless ``param`` names another."""
        return self.param or self.flag[2:].replace("-", "_")

    def written(self, value: Any) -> str:
        """A value as the tool's command line writes it (by default: a request rate of None is ``inf``)."""
        return self.write(value)

    def convert_text(self, given: list[str]) -> Any:
        """One copy's values converted (its one value; a flag of many values: the list)."""
        try:
            return self.convert(given if self.many else given[0])
        except ValueError:
            raise ValueError(f"{self.flag} {' '.join(given)!r}: not {self.kind}") from None

    def read(self, copies: list[list[str]]) -> Any:
        """The value the tool's parser keeps of every copy's values (each converted), held to the suite's range."""
        values = [self.convert_text(given) for given in copies]
        value = self.gather(values) if self.gather else values[-1]
        if why := self.check(value):
            text = " ".join(t for given in (copies if self.gather else copies[-1:]) for t in given)
            raise ValueError(f"{self.flag} {text}: {why}")
        return value


@dataclass(frozen=True)
class BenchTool:
    """A bench tool's flags as a matrix gives them: those it takes, and those the suite sets itself (flag -> where
    the value comes from). ``spell``: the option a token names, as the tool's parser spells it (vLLM's by
    default); ``field`` and ``owner``: the matrix field that holds them and whose flags they are, for messages."""

    command: str
    flags: tuple[BenchFlag, ...]
    own: Mapping[str, str]
    elsewhere: str = ""  # where other kinds of flags go, for the message of an unknown one
    spell: Callable[[str], str | None] = flag_name
    field: str = "bench_args"
    owner: str = "vLLM"

    @property
    def names(self) -> str:
        return ", ".join(f.flag for f in self.flags)

    def read(self, args: Sequence[str]) -> dict[str, Any]:
        """Every flag's value (its field -> the last copy's value, or what the flag gathers of every copy; else its
        default). Every copy is converted, as the tool's parser converts it; the value kept is held to the suite's
        range. Raises ValueError on a flag the tool does not take here, a flag without its value, a value no flag
        owns, a value the tool or the suite refuses."""
        used: set[int] = set()
        values: dict[str, Any] = {}
        for flag in self.flags:
            found = occurrences(args, flag.flag, many=flag.many, spell=self.spell)
            for start, end, given in found:
                used.update(range(start, end))
                if not given:
                    raise ValueError(f"{flag.flag} needs a value after it")
            values[flag.field] = flag.read([given for _, _, given in found]) if found else flag.default
        for k, token in enumerate(args):
            if k in used:
                continue
            if not is_option(token):
                raise ValueError(f"{token!r} follows no flag ({self.field} are [--flag, value, ...] of "
                                 f"{self.names})")
            name = self.spell(token) or token
            if name in self.own:
                raise ValueError(f"{name} is set by the suite: {self.own[name]}")
            raise ValueError(f"{name}: {self.field} take {self.names} here ({self.owner}'s own flags of "
                             f"`{self.command}`)" + (f"; {self.elsewhere}" if self.elsewhere else ""))
        return values

    def describe(self) -> str:
        """The flags it takes, for the matrix reference."""
        return "; ".join(f"{f.flag} ({f.says}; default {f.written(f.default)})" for f in self.flags)


def in_range(low: int, high: int | None = None) -> Callable[[int], str | None]:
    """An int from low to high (None: no upper limit)."""
    def check(value: int) -> str | None:
        if value < low:
            return "must be > 0" if low == 1 else f"must be >= {low}"
        return f"{value:,} is beyond the limit {high:,}" if high is not None and value > high else None
    return check


def _choice(*choices: str) -> Callable[[str], str]:
    """A value among the parser's choices (argparse's ``choices=``: every copy is checked)."""
    def convert(text: str) -> str:
        if text not in choices:
            raise ValueError(text)
        return text
    return convert


def _ratio(value: float) -> str | None:
    return None if 0.0 <= value < 1.0 else "must be >= 0 and < 1"


def _rate(text: str) -> float | None:
    """A request rate as vLLM reads it (a float; inf: every request at once, which the params hold as None)."""
    value = float(text)
    return None if value == math.inf else value


def _positive_rate(value: float | None) -> str | None:
    return "must be > 0 (or inf: every request at once)" if value is not None and not value > 0 else None


def _any(_value: Any) -> None:
    return None


SERVE = BenchTool(
    "vllm bench serve",
    (
        BenchFlag("--random-range-ratio", float, "a number (one ratio for input and output)", _ratio, 0.0,
                  "spread of the random lengths around isl / osl, below 1; 0: exact"),
        BenchFlag("--request-rate", _rate, "a number (or inf)", _positive_rate, None,
                  "requests per second; inf: every request at once"),
        BenchFlag("--num-warmups", int, "an integer", in_range(0, MAX_PROMPTS), 1,
                  "vLLM's own warm-up requests before each point, where vLLM's default is 0"),
        BenchFlag("--seed", int, "an integer", _any, 0,
                  "the prompts' seed: every arm and round gets the same requests"),
    ),
    {
        "--backend": "vllm, vLLM's own server",
        "--base-url": "the URL of the arm's server",
        "--model": "the arm's served name (model.id, or --served-model-name in serve_args)",
        "--tokenizer": "the arm's tokenizer (model.id, or --tokenizer in serve_args)",
        "--trust-remote-code": "from serve_args, as the server gets it",
        "--dataset-name": "random, prompts of the point's isl and osl",
        "--random-input-len": "from the point's isl",
        "--random-output-len": "from the point's osl",
        "--ignore-eos": "every request decodes the point's osl",
        "--temperature": "0, greedy",
        "--num-prompts": "from the point's num_prompts (a count, a multiple of concurrency, or seconds)",
        "--max-concurrency": "from the point's concurrency (a point per value)",
        "--percentile-metrics": "every latency of the suite's metrics",
        "--metric-percentiles": "the percentiles of the suite's metrics",
        "--save-result": "the result goes into the run directory",
        "--save-detailed": "the result goes into the run directory",
        "--result-dir": "the result goes into the run directory",
        "--result-filename": "the result goes into the run directory",
        "--metadata": "the job's arm, point and round",
    },
)

LATENCY = BenchTool(
    "vllm bench latency",
    (
        BenchFlag("--num-iters-warmup", int, "an integer", in_range(0, MAX_ITERS), 3,
                  "unmeasured iterations first, where vLLM's default is 10"),
        BenchFlag("--num-iters", int, "an integer", in_range(1, MAX_ITERS), 10,
                  "measured iterations, where vLLM's default is 30"),
    ),
    {
        "--model": "the arm's model (model.id)",
        "--tokenizer": "the arm's tokenizer (model.id, or --tokenizer in serve_args)",
        "--max-model-len": "from serve_args (--max-model-len)",
        "--load-format": "from serve_args (--load-format)",
        "--served-model-name": "from serve_args (--served-model-name)",
        "--input-len": "from the row's input_len",
        "--output-len": "from the row's output_len",
        "--batch-size": "from the row's batch_size (a row per value)",
        "--output-json": "the result goes into the run directory",
    },
    elsewhere="vLLM's engine flags (--dtype, ...) go in serve_args, which the tool takes too",
)


def dashes_only(command: str) -> Callable[[str], str | None]:
    """The spelling of a plain argparse tool: ``--trace-m`` only; ``--trace_m`` is refused with the dashed name
    (vLLM's parser would take it, so a matrix might say it)."""
    def spell(token: str) -> str | None:
        key = token.split("=", 1)[0]
        if is_option(token) and "_" in key:
            raise ValueError(f"{key}: `{command}` spells its flags with dashes ({flag_name(token)})")
        return flag_name(token)
    return spell


# the suite's own benches: the stage sets the result's place, the arm, the model and the rows; the timing's flags are
# the matrix's
_BENCH_SETS = {
    "--json": "the result goes into the run directory",
    "--arm": "the job's arm",
    "--device": "auto: the GPU where the arm's job runs (else the CPU)",
}

KERNEL = BenchTool(
    "python -m suite.stages.kernel.bench",
    (
        BenchFlag("--trace-m", int, "an integer", in_range(1, MAX_KERNEL_M), 2048,
                  "M of the first, frozen torch.compile trace"),
        BenchFlag("--calls", int, "an integer", in_range(1, MAX_ITERS), 50,
                  "gate calls per timed sample, one CUDA graph", param="iters"),
        BenchFlag("--trials", int, "an integer", in_range(1, MAX_ITERS), 31,
                  "timed samples per M, their median the row's value, where the bench's own default is 101"),
    ),
    {
        **_BENCH_SETS,
        "--model": "the arm's model (model.id), whose config gives the gate's shape",
        "--hidden": "the gate's shape comes from the arm's model's config",
        "--experts": "the gate's shape comes from the arm's model's config",
        "--m": "from kernel.m (a row per value)",
    },
    spell=dashes_only("python -m suite.stages.kernel.bench"),
    owner="the kernel bench",
)

LAYER = BenchTool(
    "python -m suite.stages.layer.bench",
    (
        BenchFlag("--trace-m", int, "an integer", in_range(1, MAX_KERNEL_M), 2048,
                  "T of the first, frozen torch.compile trace"),
        BenchFlag("--layer-index", int, "an integer", in_range(0), 0,
                  "which decoder layer of the model is built, from its config"),
        BenchFlag("--calls", int, "an integer", in_range(1, MAX_ITERS), 20,
                  "layer calls per timed sample, one CUDA graph", param="iters"),
        BenchFlag("--trials", int, "an integer", in_range(1, MAX_ITERS), 51,
                  "timed samples per T, their median the row's value"),
        BenchFlag("--compile", _choice("vllm", "inductor"), "vllm or inductor", _any, "vllm",
                  "vllm: the layer compiled by vLLM's own support_torch_compile in the engine's config, as the "
                  "server compiles it; inductor: plain guard-free torch.compile, the token dimension dynamic"),
    ),
    {
        **_BENCH_SETS,
        "--model": "the arm's model (model.id)",
        "--tokens": "from layer.tokens (a row per value)",
        "--load-format": "from serve_args (--load-format), as the server loads the model",
        "--hf-overrides": "the arm's model's, from serve_args or its generator, as the server gets them",
    },
    spell=dashes_only("python -m suite.stages.layer.bench"),
    owner="the layer bench",
)


@dataclass(frozen=True)
class ServeFlags:
    """A serving point's `vllm bench serve` flags, read (None: a request rate of inf)."""

    random_range_ratio: float
    request_rate: float | None
    num_warmups: int
    seed: int


@dataclass(frozen=True)
class LatencyFlags:
    """A latency row's `vllm bench latency` flags, read."""

    num_iters_warmup: int
    num_iters: int


@dataclass(frozen=True)
class KernelFlags:
    """The kernel block's bench flags, read (``iters``: ``--calls``)."""

    trace_m: int
    iters: int
    trials: int


@dataclass(frozen=True)
class LayerFlags:
    """The layer block's bench flags, read (``iters``: ``--calls``)."""

    trace_m: int
    layer_index: int
    iters: int
    trials: int
    compile: str


def serve_flags(args: Sequence[str]) -> ServeFlags:
    """A point's bench_args read (raises ValueError, the message starting with the flag)."""
    return ServeFlags(**SERVE.read(args))


def latency_flags(args: Sequence[str]) -> LatencyFlags:
    """A latency row's bench_args read (raises ValueError, the message starting with the flag)."""
    return LatencyFlags(**LATENCY.read(args))


def kernel_flags(args: Sequence[str]) -> KernelFlags:
    """The kernel block's bench_args read (raises ValueError, the message starting with the flag)."""
    return KernelFlags(**KERNEL.read(args))


def layer_flags(args: Sequence[str]) -> LayerFlags:
    """The layer block's bench_args read (raises ValueError, the message starting with the flag)."""
    return LayerFlags(**LAYER.read(args))


def tool_args(read: Callable[[Sequence[str]], Any]) -> Any:
    """A matrix field of a tool's own flags: a list of strings that ``read`` takes, checked as the matrix is (its
    error at the field's line)."""
    def check(value: list[str]) -> list[str]:
        read(value)
        return value
    return Annotated[list[str], AfterValidator(check)]


ServeArgs = tool_args(serve_flags)
LatencyArgs = tool_args(latency_flags)
KernelArgs = tool_args(kernel_flags)
LayerArgs = tool_args(layer_flags)
