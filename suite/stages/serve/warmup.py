"""Warm a server at each point's shape before the first measured point of a session.

A fresh server's first requests are slow (lazy initialisation, allocator growth, first-touch pages): the
first repeat after a cold start measured a mean TTFT of 122 ms against 19.7 ms in the others. So after
/health and before the first measured point, ``warm_session`` runs each distinct shape of the session's points
once with a few prompts (2 x concurrency, no `--num-warmups`), through the session's own client, into a
scratch file that is discarded; it records what each warm-up measured (for the job record and for sizing
points by time) and then resets the prefix cache, so warm-up prompts do not make TTFT look better.

Warm-ups use a different ``--seed`` than the point (other prompts), so even a server that cannot reset its
prefix cache (``/reset_prefix_cache`` needs ``VLLM_SERVER_DEV_MODE=1``) has not cached the measured prompts.

Runs of 2026-12-01 and 2026-12-04 also recorded a settle (load at the first point's shape until a deadline after
/health, each chunk's mean TPOT kept): it did not end the slow state some servers start in, and matrices no
longer take it; `SettleRecord` reads those records.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from suite.errors import SuiteError
from suite.stages.serve.client import PersistentClient, flag_value, with_flag, without_flag

# the flags that make two points the same load for the server (prompt count, seed, output files aside)
SHAPE_FLAGS = ("--backend", "--base-url", "--endpoint", "--model", "--dataset-name", "--random-input-len",
               "--random-output-len", "--random-range-ratio", "--random-prefix-len", "--input-len",
               "--output-len", "--max-concurrency", "--request-rate", "--burstiness", "--temperature",
               "--ignore-eos")
WARM_FACTOR = 2  # warm-up prompts per unit of concurrency
UNBOUNDED_WARM_PROMPTS = 16  # a point without --max-concurrency
SEED_SHIFT = 104729  # warm-up seed = point seed + this: other prompts than the measured ones


@dataclass(frozen=True)
class WarmPoint:
    """A measured point the session warms: its `vllm bench serve` argv (after `vllm bench serve`) and its
    concurrency (how many requests the warm-up keeps in flight; None: unbounded)."""

    argv: Sequence[str]
    concurrency: int | None


@dataclass(frozen=True)
class WarmShape:
    """One warm-up run: the shape it warmed and what it measured."""

    shape: dict[str, str]
    prompts: int
    concurrency: int | None
    wall_s: float
    mode: str | None = None
    duration_s: float | None = None
    completed: int | None = None
    failed: int | None = None
    request_throughput: float | None = None
    output_throughput: float | None = None
    mean_tpot_ms: float | None = None
    error: str | None = None
    at_s: float | None = None  # a settle chunk: seconds from the settle's start to the chunk's start

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.completed)


class SettleRecord(BaseModel):
    """The settle of a run recorded with one (matrices no longer take it): how long it had to run when it began,
    and its chunks in order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    left_s: float
    chunks: list[WarmShape]


class WarmupRecord(BaseModel):
    """A session's warm-ups as the record of its first serving job keeps them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shapes: list[WarmShape]
    prefix_cache_reset: bool
    wall_s: float
    settle: SettleRecord | None = None


@dataclass
class SessionWarmup:
    """All warm-ups of one session and whether the prefix cache was reset after them."""

    shapes: list[WarmShape] = field(default_factory=list)
    prefix_cache_reset: bool = False
    wall_s: float = 0.0

    def record(self) -> WarmupRecord:
        return WarmupRecord(shapes=list(self.shapes), prefix_cache_reset=self.prefix_cache_reset,
                            wall_s=round(self.wall_s, 3))

    def for_argv(self, argv: Sequence[str]) -> WarmShape | None:
        """The warm-up of argv's shape (None when it was not warmed)."""
        key = shape_of(argv)
        return next((s for s in self.shapes if s.shape == key), None)


def shape_of(argv: Sequence[str]) -> dict[str, str]:
    """What makes a point's load on the server: its shape flags (as given; ``--ignore-eos`` as "true")."""
    shape: dict[str, str] = {}
    for flag in SHAPE_FLAGS:
        if flag == "--ignore-eos":
            if flag in argv:
                shape["ignore-eos"] = "true"
            continue
        value = flag_value(argv, flag)
        if value is not None:
            shape[flag[2:]] = value
    return shape


def warm_prompts(concurrency: int | None, factor: int = WARM_FACTOR) -> int:
    """Prompts of a warm-up: factor x concurrency (at least the concurrency, so every slot is used)."""
    if concurrency is None:
        return UNBOUNDED_WARM_PROMPTS
    return max(concurrency, factor * concurrency)


def warm_argv(argv: Sequence[str], prompts: int) -> list[str]:
    """argv of the warm-up of a point: few prompts, no vLLM warm-ups, another seed; the caller's result
    flags are dropped (the client adds a scratch file)."""
    out = with_flag(with_flag(argv, "--num-prompts", str(prompts)), "--num-warmups", "0")
    seed = flag_value(argv, "--seed")
    out = with_flag(out, "--seed", str(int(seed or 0) + SEED_SHIFT))
    return without_flag(without_flag(out, "--result-dir"), "--result-filename")


def warm_session(client: PersistentClient, points: Sequence[WarmPoint], *,
                 reset_prefix_cache: Callable[[], bool] | None, scratch_dir: Path | None = None,
                 timeout_s: float = 600.0, factor: int = WARM_FACTOR) -> SessionWarmup:
    """Warm the server once per distinct shape of ``points`` (the session's measured points), in order of
    first appearance, then POST /reset_prefix_cache.

    A failed warm-up is recorded (``error``) and the others still run: the measured points report their own
    failures. ``scratch_dir`` must be visible to the client's worker (default: a temporary directory)."""
    t0 = time.monotonic()
    own_scratch = scratch_dir is None
    scratch = Path(tempfile.mkdtemp(prefix="suite-warm-")) if own_scratch else Path(scratch_dir)
    scratch.mkdir(parents=True, exist_ok=True)
    out = SessionWarmup()
    try:
        seen: list[dict[str, str]] = []
        for point in points:
            key = shape_of(point.argv)
            if key in seen:
                continue
            seen.append(key)
            result = scratch / f"warm-{len(seen)}.json"
            out.shapes.append(_warm_one(client, point, key, result, timeout_s, factor))
    finally:
        if own_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    if reset_prefix_cache is not None:  # the server's own reset (POST /reset_prefix_cache)
        out.prefix_cache_reset = reset_prefix_cache()
    out.wall_s = time.monotonic() - t0
    return out


def _warm_one(client: PersistentClient, point: WarmPoint, key: dict[str, str], result: Path,
              timeout_s: float, factor: int) -> WarmShape:
    conc = point.concurrency
    prompts = warm_prompts(conc, factor)
    t0 = time.monotonic()
    try:
        run = client.run(warm_argv(point.argv, prompts), result, timeout_s)
        raw = json.loads(result.read_text())
    except (SuiteError, OSError, ValueError) as exc:
        return WarmShape(shape=key, prompts=prompts, concurrency=conc, wall_s=round(time.monotonic() - t0, 3),
                         mode=client.mode, error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    finally:
        result.unlink(missing_ok=True)
    return WarmShape(shape=key, prompts=prompts, concurrency=conc, wall_s=round(run.wall_s, 3), mode=run.mode,
                     duration_s=raw.get("duration"), completed=raw.get("completed"), failed=raw.get("failed"),
                     request_throughput=raw.get("request_throughput"),
                     output_throughput=raw.get("output_throughput"), mean_tpot_ms=raw.get("mean_tpot_ms"))
