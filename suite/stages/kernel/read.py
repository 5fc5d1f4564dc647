"""Stored router-gate kernel results of a run: the JSON `suite.stages.kernel.bench` wrote (one per arm and
round), read back as typed records. The bench runs alone on accelerator hosts (torch only), so it writes
plain JSON; this side gives it its shape. Keys a later bench adds ride along as extras."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from suite.records import JobRecord
from suite.store import RunStore, Unreadable, load_results


class _Read(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class KernelRow(_Read):
    """One M: µs per call (median and p10–p90 of the samples) and the path that ran."""

    m: int
    median_us: float
    p10_us: float
    p90_us: float
    n: int | None = None
    path: str = "?"
    eager_path: str | None = None
    frozen_branch: bool = False
    recompiled: bool = False
    sm_clock_mhz: int | None = None  # GPU: the SM clock right after this M's timed replays


class KernelShape(_Read):
    hidden: int | None = None
    experts: int | None = None
    dtype: str | None = None
    out_dtype: str | None = None
    bias: bool | None = None


class KernelCompile(_Read):
    backend: str | None = None
    trace_m: int | None = None
    trace_path: str | None = None


class KernelTiming(_Read):
    method: str = "?"
    calls_per_sample: int | None = None
    samples: int | None = None
    warm_s: float | None = None  # GPU: seconds of graph replays before the timed ones (older results: none)


class KernelDevice(_Read):
    name: str | None = None


class KernelGate(_Read):
    class_: str | None = Field(None, alias="class")
    source: str | None = None
    forced: str | None = None


class KernelRun(_Read):
    """One process's result."""

    arm: str | None = None
    shape: KernelShape = KernelShape()
    compile: KernelCompile = KernelCompile()
    timing: KernelTiming = KernelTiming()
    device: KernelDevice = KernelDevice()
    gate: KernelGate = KernelGate()
    torch_version: str | None = None
    vllm_version: str | None = None
    frozen_branch_ms: list[int] = []
    results: list[KernelRow] = []

    def by_m(self) -> dict[int, KernelRow]:
        return {r.m: r for r in self.results}


R = TypeVar("R", bound=KernelRun)


ByArm = dict[str, dict[int, R]]


def load_runs(store: RunStore, records: Sequence[JobRecord], kind: str,
              shape: type[R]) -> tuple[ByArm[R], list[Unreadable]]:
    """arm -> round -> the result of that round's process for a bench kind (one per round with
    ``repeats``), and the stored files that are not the bench's output (the section names them)."""
    stored = load_results(store, records, kind, shape)
    out: dict[str, dict[int, R]] = {}
    for job, result in stored.found:
        out.setdefault(job.arm, {})[job.repeat] = result
    return {arm: dict(sorted(rounds.items())) for arm, rounds in out.items()}, stored.unreadable


def load_kernel_runs(store: RunStore, records: Sequence[JobRecord]) -> tuple[ByArm[KernelRun], list[Unreadable]]:
    return load_runs(store, records, "kernel", KernelRun)
