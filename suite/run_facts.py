"""What a run was, beside what it says: where it ran (each machine, its GPUs, drivers and CUDA / ROCm, and each
arm's software: `environment`), the jobs that failed, and its time: the seconds it ran (`running_seconds`, a
stretch without its end counted to its last job) and those more rounds would not repeat (`one_time_seconds`:
what `suite plan` keeps out of a round's price). Read from a run's data (`suite.analysis.RunData`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from suite.analysis import RunData
from suite.plan import each_round
from suite.quality.hosts import machine_names
from suite.records import JobRecord, elapsed_s
from suite.stages.serve.read import precompile_records, server_records


def gpu_models(run: RunData) -> dict[str, int]:
    """The GPUs nvidia-smi listed before each job, as "1 × NVIDIA H100 80GB HBM3" -> how many jobs saw that; empty
    where no job recorded a GPU's name (a CPU host, a run recorded before the names were). More than one entry:
    the jobs ran on different GPUs (a run resumed on another machine kind)."""
    seen: Counter[str] = Counter()
    for rec in run.records:
        names = Counter(g.name for g in (rec.device.before or [] if rec.device else []) if g.name)
        if names:
            seen[", ".join(f"{n} × {name}" for name, n in sorted(names.items()))] += 1
    return dict(seen.most_common())


@dataclass(frozen=True)
class Machine:
    """One machine a run's jobs ran on (`HostIdentity.key`), named so a reader tells it from the others, with the
    rounds (together: all: rounds) of the serving jobs it ran and how many jobs in all."""

    key: str
    name: str
    rounds: tuple[int, ...]
    jobs: int


def machines(run: RunData, arms: Sequence[str] | None = None) -> list[Machine]:
    """The machines the jobs of ``arms`` (None: every arm) ran on, in the order of their first job; empty when
    no job recorded where it ran (runs before 2026-12-07)."""
    recs = sorted((r for r in run.records if r.where is not None and (arms is None or r.job.arm in arms)),
                  key=lambda r: r.started or r.written or "")
    names = machine_names([r.where for r in recs if r.where is not None])
    rounds: dict[str, set[int]] = {k: set() for k in names}
    jobs: Counter[str] = Counter()
    for r in recs:
        key = r.where.key  # type: ignore[union-attr]
        jobs[key] += 1
        if r.job.kind == "serve":
            rounds[key].add(r.job.repeat // run.blocks)
    return [Machine(k, names[k], tuple(sorted(rounds[k])), jobs[k]) for k in names]


class PatchName(BaseModel):
    """A patch an arm got, as the environment names it."""

    name: str | None
    sha256: str | None
    reverse: bool = False


class ArmEnvironment(BaseModel):
    """One arm's software as the environment names it: its vLLM, image and patches, and the versions of torch
    (with its CUDA / HIP), Triton, FlashInfer and AITER the arm's environment has (where the run recorded its
    software; absent packages are not named)."""

    vllm: str | None
    image: str | None
    patches: list[PatchName]
    packages: dict[str, str] = {}  # "torch" -> "2.9.0+cu129 (CUDA 12.9)", "Triton" -> "3.5.0", ...


class Environment(BaseModel):
    """Where and with what a run ran, as a report's header and summary.md name it."""

    suite: str | None
    machines: list[str]  # each machine the run's jobs ran on, with its GPUs
    gpus: dict[str, int]  # "1 × NVIDIA H100 80GB HBM3" -> jobs that saw it
    cpus: list[str] = []  # the machines' CPU models
    drivers: list[str]
    cuda: list[str]
    arms: dict[str, ArmEnvironment]
    running_s: float | None


def environment(run: RunData) -> Environment:
    m = run.manifest
    found = machines(run)
    hosts = [r.where for r in run.records if r.where is not None]
    drivers = sorted({g.driver for h in hosts for g in h.gpus if g.driver})
    cuda = sorted({h.cuda for h in hosts if h.cuda} | {h.rocm for h in hosts if h.rocm})
    arms = {a: ArmEnvironment(vllm=info.vllm_version, image=info.image,
                              patches=[PatchName(name=p.name, sha256=p.sha256, reverse=p.reverse) for p in info.patches],
                              packages={k: v for k, v in sw.versions().items() if k != "vLLM"}
                              if (sw := info.software) is not None and sw.error is None else {})
            for a, info in m.arms.items()}
    return Environment(suite=m.suite_version, machines=[x.name for x in found],
                       gpus=gpu_models(run), cpus=sorted({h.cpu for h in hosts if h.cpu}), drivers=drivers, cuda=cuda, arms=arms, running_s=running_seconds(run)[0])


def failed_jobs(run: RunData) -> list[JobRecord]:
    """Every job record whose status is not ok (shown, never hidden)."""
    return [r for r in run.records if not r.ok]


def stretch_last_jobs(run: RunData) -> list[str | None]:
    """Per stretch of the run, the time its last job record was written (before the next stretch began): where a
    stretch that never recorded its end (its machine lost, the run killed) can be said to have stopped."""
    stretches = run.manifest.stretches
    out = []
    for i, st in enumerate(stretches):
        until = stretches[i + 1].started if i + 1 < len(stretches) else None
        written = [r.written for r in run.records if r.written and r.written >= st.started
                   and (until is None or r.written < until)]
        out.append(max(written) if written else None)
    return out


def running_seconds(run: RunData) -> tuple[float | None, int]:
    """(seconds the run executed, stretches counted to their last job): each stretch from its start to its end,
    or, for one that never recorded an end, to its last job record (`stretch_last_jobs`); None when such a
    stretch wrote no record."""
    stretches = run.manifest.stretches
    if not stretches:
        return run.manifest.running_seconds(), 0
    total, estimated = 0.0, 0
    for st, last in zip(stretches, stretch_last_jobs(run), strict=True):
        if (seconds := st.seconds()) is not None:
            total += seconds
            continue
        if (seconds := elapsed_s(st.started, last)) is None:
            return None, estimated
        total, estimated = total + seconds, estimated + 1
    return total, estimated


def one_time_seconds(run: RunData) -> float:
    """Seconds of the run that more rounds would not repeat: its precompile (the servers of one window start
    together: the window's slowest; the last stretch's, as recorded), the jobs placed once a run (correctness,
    the probe) or in offline rounds, from their records, and the server starts of correctness-only arms
    (`serving: false`: one session a run, whatever the rounds)."""
    windows: dict[str | None, float] = {}
    for rec in precompile_records(run.store, run.arms):
        if rec.healthy_after_s is not None:
            windows[rec.started] = max(windows.get(rec.started, 0.0), rec.healthy_after_s)
    lone = {(r.job.arm, r.job.session) for r in run.records if not run.serves(r.job.arm)}
    return (sum(windows.values()) + sum(r.seconds or 0.0 for r in run.records if not each_round(r.job.kind))
            + sum(s.healthy_after_s or 0.0 for s in server_records(run.store, lone)))
