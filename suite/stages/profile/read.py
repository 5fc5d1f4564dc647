"""Reading torch-profiler traces: decode steps, kernel families, ms per 100 decode steps; stored profiles."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from suite.errors import SuiteError
from suite.records import JobRecord
from suite.store import RunStore, Unreadable, load_results

STEP = re.compile(r"^execute_(?:\d+_)?context_(\d+)\((?:sq)?(\d+)[^)]*\)_generation_(\d+)\((?:sq)?(\d+)")


TRACE_GLOB = "*.pt.trace.json*"


OTHER = "other"


CPU_BASIS = "CPU self time of torch ops (cpu_op events) inside decode steps; no device kernels on CPU"


GPU_BASIS = "device kernel time (kernel events) launched inside decode steps"


class _Record(BaseModel):
    """What the profile stage stores; written by ``model_dump`` and read back by ``model_validate`` (keys a later
    version adds ride along)."""

    model_config = ConfigDict(extra="allow")


class StepCounts(_Record):
    decode: int = 0
    prefill: int = 0
    idle: int = 0


class TopEntry(_Record):
    """One kernel (GPU) or op (CPU) among a rank's most expensive inside decode steps."""

    name: str
    family: str
    ms: float
    calls_per_decode_step: float | None = None


class ProfileRank(_Record):
    """One worker trace: decode-only time per family."""

    trace: str
    mode: str  # gpu | cpu
    basis: str
    steps: StepCounts
    decode_steps: int
    decode_tokens: int
    families_ms: dict[str, float]
    total_ms: float
    per_100_decode_steps_ms: dict[str, float | None]
    total_per_100_decode_steps_ms: float | None
    decode_step_wall_per_100_ms: float | None
    # launches (GPU) or op calls (CPU) per decode step: e.g. a gate kernel firing once per MoE layer
    calls_per_decode_step: dict[str, float | None]
    unattributed_kernel_ms: float | None = None  # GPU: kernel time whose launch lies in no step
    kernel_ms: float | None = None  # GPU: all kernel time of the trace
    top: list[TopEntry] = []
    vllm_version: str | None = None


class ProfileSummary(_Record):
    """One profiled window of an arm: every worker trace, each family the mean over ranks; as stored, with the
    window's bench figures and the stage's parameters."""

    mode: str
    basis: str
    ranks: int
    decode_steps: int
    steps: StepCounts
    families: list[str]
    patterns: dict[str, str]
    per_100_decode_steps_ms: dict[str, float | None]
    total_per_100_decode_steps_ms: float | None
    decode_step_wall_per_100_ms: float | None
    calls_per_decode_step: dict[str, float | None]
    per_rank: list[ProfileRank]
    trace_files: list[str] = []
    window: dict[str, float | int | None] = {}
    params: dict[str, Any] = {}


def load_trace(path: Path) -> dict[str, Any]:
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt") as fh:
            data = json.load(fh)
    except (OSError, EOFError, json.JSONDecodeError) as exc:
        raise SuiteError(f"cannot read trace {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise SuiteError(f"{path}: not a Chrome/Kineto trace (no traceEvents list)")
    return data


def step_kind(name: str) -> str | None:
    """'decode' | 'prefill' (any context request: prefill or mixed) | 'idle' | None (not a step marker)."""
    m = STEP.match(name)
    if m is None:
        return None
    ctx_reqs, gen_reqs = int(m.group(1)), int(m.group(3))
    if ctx_reqs:
        return "prefill"
    return "decode" if gen_reqs else "idle"


def family_of(name: str, families: list[tuple[str, re.Pattern[str]]]) -> str:
    for label, pattern in families:
        if pattern.search(name):
            return label
    return OTHER


def compile_families(families: dict[str, str]) -> list[tuple[str, re.Pattern[str]]]:
    out = []
    for label, pattern in families.items():
        if label == OTHER:
            raise SuiteError(f"family label {OTHER!r} is reserved for what no pattern matches")
        try:
            out.append((label, re.compile(pattern)))
        except re.error as exc:
            raise SuiteError(f"family {label!r}: bad regex {pattern!r}: {exc}") from None
    return out


def _complete(events: list[Any]) -> list[dict[str, Any]]:
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e and "dur" in e]


def _steps_by_thread(events: list[dict[str, Any]]) -> dict[tuple[Any, Any], list[dict[str, Any]]]:
    steps: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in events:
        if e.get("cat") == "user_annotation" and step_kind(str(e.get("name", ""))) is not None:
            steps.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for lst in steps.values():
        lst.sort(key=lambda e: float(e["ts"]))
    return steps


def _enclosing_step(steps: list[dict[str, Any]], ts: float) -> dict[str, Any] | None:
    """The step annotation whose [ts, ts + dur) holds ts (steps on one thread do not overlap)."""
    lo, hi = 0, len(steps)
    while lo < hi:  # last step starting at or before ts
        mid = (lo + hi) // 2
        if float(steps[mid]["ts"]) <= ts:
            lo = mid + 1
        else:
            hi = mid
    if lo == 0:
        return None
    s = steps[lo - 1]
    return s if ts < float(s["ts"]) + float(s["dur"]) else None


def _cpu_op_self_times(events: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float]]:
    """(cpu_op event, self time in µs): duration minus the durations of its direct child ops (same thread,
    nested in time), never below 0."""
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in events:
        if e.get("cat") == "cpu_op":
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    out: list[tuple[dict[str, Any], float]] = []
    for ops in by_thread.values():
        ops.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        selfs = [float(e["dur"]) for e in ops]
        stack: list[int] = []
        for i, e in enumerate(ops):
            ts = float(e["ts"])
            while stack and ts >= float(ops[stack[-1]]["ts"]) + float(ops[stack[-1]]["dur"]):
                stack.pop()
            if stack:
                selfs[stack[-1]] -= float(e["dur"])
            stack.append(i)
        out += [(e, max(s, 0.0)) for e, s in zip(ops, selfs, strict=True)]
    return out


def parse_trace(path: Path, families: dict[str, str]) -> ProfileRank:
    """Decode-only time per family from one worker trace; see the module docstring for what is timed."""
    data = load_trace(path)
    fams = compile_families(families)
    events = _complete(data["traceEvents"])
    steps = _steps_by_thread(events)
    counts = {"decode": 0, "prefill": 0, "idle": 0}
    decode_wall_us = 0.0
    decode_tokens = 0
    for lst in steps.values():
        for s in lst:
            kind = step_kind(str(s["name"]))
            counts[kind] += 1  # type: ignore[index]
            if kind == "decode":
                decode_wall_us += float(s["dur"])
                decode_tokens += int(STEP.match(str(s["name"])).group(4))  # type: ignore[union-attr]

    kernels = [e for e in events if str(e.get("cat", "")).lower() == "kernel"]
    timed: list[tuple[str, float, dict[str, Any] | None]] = []  # (name, µs, enclosing step)
    unattributed_us = 0.0
    if kernels:
        basis, mode = GPU_BASIS, "gpu"
        launches: dict[Any, dict[str, Any]] = {}
        for e in events:
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None and str(e.get("cat", "")).lower() in ("cuda_runtime", "cuda_driver", "hip_runtime"):
                launches[corr] = e
        for k in kernels:
            launch = launches.get((k.get("args") or {}).get("correlation"))
            step = None
            if launch is not None:
                step = _enclosing_step(steps.get((launch.get("pid"), launch.get("tid")), []), float(launch["ts"]))
            if step is None:
                unattributed_us += float(k["dur"])
            timed.append((str(k.get("name", "")), float(k["dur"]), step))
    else:
        basis, mode = CPU_BASIS, "cpu"
        for op, self_us in _cpu_op_self_times(events):
            step = _enclosing_step(steps.get((op.get("pid"), op.get("tid")), []), float(op["ts"]))
            timed.append((str(op.get("name", "")), self_us, step))

    fam_us = {label: 0.0 for label, _ in fams} | {OTHER: 0.0}
    fam_calls = dict.fromkeys(fam_us, 0)
    by_name: dict[str, float] = {}
    name_calls: dict[str, int] = {}
    for name, us, step in timed:
        if step is None or step_kind(str(step["name"])) != "decode":
            continue
        fam = family_of(name, fams)
        fam_us[fam] += us
        fam_calls[fam] += 1
        by_name[name] = by_name.get(name, 0.0) + us
        name_calls[name] = name_calls.get(name, 0) + 1
    n = counts["decode"]
    total_us = sum(fam_us.values())

    def per100(us: float) -> float | None:
        return round(us / 1000.0 / n * 100.0, 4) if n else None

    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:15]
    return ProfileRank(
        trace=path.name,
        mode=mode,
        basis=basis,
        steps=StepCounts(**counts),
        decode_steps=n,
        decode_tokens=decode_tokens,
        families_ms={k: round(v / 1000.0, 4) for k, v in fam_us.items()},
        total_ms=round(total_us / 1000.0, 4),
        per_100_decode_steps_ms={k: per100(v) for k, v in fam_us.items()},
        total_per_100_decode_steps_ms=per100(total_us),
        decode_step_wall_per_100_ms=per100(decode_wall_us),
        calls_per_decode_step={k: round(v / n, 3) if n else None for k, v in fam_calls.items()},
        unattributed_kernel_ms=round(unattributed_us / 1000.0, 4) if mode == "gpu" else None,
        kernel_ms=round(sum(float(k["dur"]) for k in kernels) / 1000.0, 4) if mode == "gpu" else None,
        top=[TopEntry(name=k, family=family_of(k, fams), ms=round(v / 1000.0, 4),
                      calls_per_decode_step=round(name_calls[k] / n, 3) if n else None) for k, v in top],
        vllm_version=data.get("vllm_version"),
    )


def worker_traces(trace_dir: Path) -> list[Path]:
    """Worker trace files (rank-qualified); the API-server (`async_llm`) traces are left out."""
    return sorted(p for p in trace_dir.glob(TRACE_GLOB) if "async_llm" not in p.name and p.is_file())


def summarize(traces: list[Path], families: dict[str, str]) -> ProfileSummary:
    """Parse every worker trace of one window. With several ranks each family is the mean over ranks (one
    GPU's share) and the decode steps are rank 0's."""
    if not traces:
        raise SuiteError("no worker trace to parse")
    ranks = [parse_trace(p, families) for p in traces]
    labels = list(ranks[0].families_ms)

    def mean(values: list[float | None]) -> float | None:
        vals = [v for v in values if v is not None]
        return round(sum(vals) / len(vals), 4) if vals else None

    return ProfileSummary(
        mode=ranks[0].mode,
        basis=ranks[0].basis,
        ranks=len(ranks),
        decode_steps=ranks[0].decode_steps,
        steps=ranks[0].steps,
        families=labels,
        patterns=families,
        per_100_decode_steps_ms={k: mean([r.per_100_decode_steps_ms[k] for r in ranks]) for k in labels},
        total_per_100_decode_steps_ms=mean([r.total_per_100_decode_steps_ms for r in ranks]),
        decode_step_wall_per_100_ms=mean([r.decode_step_wall_per_100_ms for r in ranks]),
        calls_per_decode_step=ranks[0].calls_per_decode_step,
        per_rank=ranks,
    )


def load_profiles(store: RunStore, records: Sequence[JobRecord]) -> tuple[dict[str, ProfileSummary], list[Unreadable]]:
    """arm -> the stored summary of its (latest ok) profile job, and the stored files that are not one."""
    stored = load_results(store, records, "profile", ProfileSummary)
    return {job.arm: summary for job, summary in stored.found}, stored.unreadable
