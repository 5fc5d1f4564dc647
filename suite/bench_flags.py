"""The flags a matrix gives the bench tools themselves: a serving point's ``bench_args`` (`vllm bench serve`) and a
latency row's (`vllm bench latency`), vLLM's own flags as on the tool's command line, read into typed values
(`ServeFlags`, `LatencyFlags`) that the plan puts into each job's params.

They are read the way vLLM reads them (:mod:`suite.served_model`'s reading, vLLM itself not imported):
``--flag value`` and ``--flag=value`` alike, ``--num_warmups`` is ``--num-warmups``, and the last copy wins; each
value is converted as vLLM's parser converts it (``int``, ``float``: ``inf`` is a request rate) and held to the
suite's ranges.

A tool takes only the flags below. The ones the suite sets itself from the point (``--max-concurrency`` from
concurrency, ``--num-prompts`` from num_prompts, ...) are refused with where they come from; any other flag is
refused with the list of the accepted ones. Not every flag of `vllm bench serve` is passed through: the session's
persistent client keeps one process for every point (one event loop, a cached tokenizer, a frozen heap), the
suite's warm-ups replay each point's flags and its sizing and checks read the point's count and rate, so a flag
is taken only where both clients (``client: persistent`` and ``client: cli``) and those readers honour it as the
CLI alone would.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from suite.matrix_blocks import MAX_ITERS, MAX_PROMPTS
from suite.served_model import flag_name, is_option, occurrences


@dataclass(frozen=True)
class BenchFlag:
    """One flag a matrix may give a bench tool: vLLM's name, how vLLM's parser converts its value (``kind``: what
    the text must be), why the suite refuses a converted value (None: it takes it), the suite's default and what
    the flag does (the matrix reference's words)."""

    flag: str
    convert: Callable[[str], Any]
    kind: str
    check: Callable[[Any], str | None]
    default: Any
    says: str

    @property
    def field(self) -> str:
        """Its destination, as vLLM's parser names it (``--num-warmups`` -> ``num_warmups``)."""
        return self.flag[2:].replace("-", "_")

    def written(self, value: Any) -> str:
        """A value as the tool's command line writes it (a request rate of None: ``inf``)."""
        return "inf" if value is None else str(value)

    def convert_text(self, text: str) -> Any:
        try:
            return self.convert(text)
        except ValueError:
            raise ValueError(f"{self.flag} {text!r}: not {self.kind}") from None

    def read(self, text: str) -> Any:
        value = self.convert_text(text)
        if why := self.check(value):
            raise ValueError(f"{self.flag} {text}: {why}")
        return value


@dataclass(frozen=True)
class BenchTool:
    """A bench tool's flags as a matrix gives them: those it takes, and those the suite sets itself (flag -> where
    the value comes from)."""

    command: str
    flags: tuple[BenchFlag, ...]
    own: Mapping[str, str]
    elsewhere: str = ""  # where other kinds of flags go, for the message of an unknown one

    @property
    def names(self) -> str:
        return ", ".join(f.flag for f in self.flags)

    def read(self, args: Sequence[str]) -> dict[str, Any]:
        """Every flag's value (its field -> the last copy's value, else its default). Every copy is converted, as
        vLLM's parser converts it; the last is held to the suite's range. Raises ValueError on a flag the tool does
        not take here, a flag without its value, a value no flag owns, a value vLLM or the suite refuses."""
        used: set[int] = set()
        values: dict[str, Any] = {}
        for flag in self.flags:
            found = occurrences(args, flag.flag)
            for start, end, given in found:
                used.update(range(start, end))
                if len(given) != 1:
                    raise ValueError(f"{flag.flag} needs a value after it")
                flag.convert_text(given[0])
            values[flag.field] = flag.read(found[-1][2][0]) if found else flag.default
        for k, token in enumerate(args):
            if k in used:
                continue
            if not is_option(token):
                raise ValueError(f"{token!r} follows no flag (bench_args are [--flag, value, ...] of "
                                 f"{self.names})")
            name = flag_name(token) or token
            if name in self.own:
                raise ValueError(f"{name} is set by the suite: {self.own[name]}")
            raise ValueError(f"{name}: bench_args take {self.names} here (vLLM's own flags of `{self.command}`)"
                             + (f"; {self.elsewhere}" if self.elsewhere else ""))
        return values

    def describe(self) -> str:
        """The flags it takes, for the matrix reference."""
        return "; ".join(f"{f.flag} ({f.says}; default {f.written(f.default)})" for f in self.flags)


def _count(low: int, high: int) -> Callable[[int], str | None]:
    """An int from low to high."""
    def check(value: int) -> str | None:
        if value < low:
            return "must be > 0" if low == 1 else f"must be >= {low}"
        return f"{value:,} is beyond the limit {high:,}" if value > high else None
    return check


def _ratio(value: float) -> str | None:
    return None if 0.0 <= value < 1.0 else "must be >= 0 and < 1"


def _rate(text: str) -> float | None:
    """A request rate as vLLM reads it (a float; inf: every request at once, which the params hold as None)."""
    value = float(text)
    return None if value == math.inf else value


def _positive_rate(value: float | None) -> str | None:
    return "must be > 0 (or inf: every request at once)" if value is not None and not value > 0 else None


def _any(_value: int) -> None:
    return None


SERVE = BenchTool(
    "vllm bench serve",
    (
        BenchFlag("--random-range-ratio", float, "a number (one ratio for input and output)", _ratio, 0.0,
                  "spread of the random lengths around isl / osl, below 1; 0: exact"),
        BenchFlag("--request-rate", _rate, "a number (or inf)", _positive_rate, None,
                  "requests per second; inf: every request at once"),
        BenchFlag("--num-warmups", int, "an integer", _count(0, MAX_PROMPTS), 1,
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
        BenchFlag("--num-iters-warmup", int, "an integer", _count(0, MAX_ITERS), 3,
                  "unmeasured iterations first, where vLLM's default is 10"),
        BenchFlag("--num-iters", int, "an integer", _count(1, MAX_ITERS), 10,
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


def serve_flags(args: Sequence[str]) -> ServeFlags:
    """A point's bench_args read (raises ValueError, the message starting with the flag)."""
    return ServeFlags(**SERVE.read(args))


def latency_flags(args: Sequence[str]) -> LatencyFlags:
    """A latency row's bench_args read (raises ValueError, the message starting with the flag)."""
    return LatencyFlags(**LATENCY.read(args))
