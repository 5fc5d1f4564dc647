"""Stored gate-path probe results of a run, one per arm."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from suite.records import JobRecord
from suite.store import RunStore, Unreadable, load_results


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)  # keys a later probe adds ride along


class ProbeCount(_Record):
    """One counter: how many times (``count``) a ``kind`` of event (steps, gate, outside) happened in a
    batch-size ``bucket`` on a ``path`` (the instrumented implementations of one call, outermost first)."""

    kind: str
    bucket: str
    path: str
    count: int


class ProbeBucket(_Record):
    steps: int = 0  # model forward passes in this bucket
    forward_calls: int = 0  # GateLinear.forward calls
    paths: dict[str, int] = {}  # GateLinear.forward calls by path
    outside: dict[str, int] = {}  # gate custom-op calls with no GateLinear.forward running (a compiled graph)
    verdict: str


class ProbeRequest(_Record):
    """One burst the probe sent: this many requests at once, each of this prompt length and token budget."""

    concurrency: int
    prompt_len: int
    max_tokens: int | None = None
    completion_tokens: int | None = None


class ProbeGate(_Record):
    """One GateLinear as a process saw it once its weights were processed: where it is, its weight, and its
    ``allow_*`` tier flags (as the strings "True" / "False"; which flags exist depends on the vLLM version)."""

    class_: str | None = Field(None, alias="class")
    prefix: str | None = None
    weight_dtype: str | None = None
    out_dtype: str | None = None
    weight_shape: list[int] | None = None

    def flags(self) -> dict[str, str]:
        return {k: str(v) for k, v in (self.model_extra or {}).items() if k.startswith("allow_")}


class ProbeProcess(_Record):
    """What one vLLM process of the server reported: its gates (their attributes, as strings), the gate custom
    ops registered, what the plugin instrumented, its errors."""

    pid: int | None = None
    argv: list[str] | None = None
    platform: str | None = None
    gates: list[ProbeGate] = []
    present_ops: list[str] = []
    instrumented: list[str] = []
    errors: list[str] = []


class ProbeResult(_Record):
    """One arm's probe job, as stored: the requests' counters merged over processes, bucket by bucket; the
    counters of the server's start (graph capture, warm-up); what each process reported."""

    arm: str
    max_num_seqs: int | None = None
    requests: list[ProbeRequest] = []
    probe_dir: str | None = None
    buckets: dict[str, ProbeBucket]
    counts: list[ProbeCount] = []
    startup_counts: list[ProbeCount] = []
    processes: list[ProbeProcess] = []
    present_ops: list[str] = []


def load_probe_results(store: RunStore, records: Sequence[JobRecord],
                       arms: list[str]) -> tuple[dict[str, ProbeResult], list[Unreadable]]:
    """arm -> its stored probe result (the ok probe job of that arm), in the order of ``arms``, and the stored
    files that are not one."""
    stored = load_results(store, records, "probe", ProbeResult)
    found = {job.arm: result for job, result in stored.found if job.arm in arms}
    return {arm: found[arm] for arm in arms if arm in found}, stored.unreadable


FROZEN = "compiled graph (frozen: torch.mm/F.linear inside the graph)"
# a bucket whose steps made no Python gate call at run time, but whose gate did run in Python while the server
# started (CUDA-graph capture, warm-up): a replayed CUDA graph runs the kernels its capture recorded
REPLAYED = "replayed graph, captured at startup with"


NOT_EXERCISED = "not exercised"
