"""How long a plan will take before it runs: server starts, measuring, the rest, and where `repeats: auto` may
stop. A cost model per kind of host, seeded by the stored runs of this project (`docs/evidence/`):

- an NVIDIA GPU (H100 / H200, Gemma 4 26B-A4B with 30 layers, vLLM 0.26.0; `h100-tradeoff-20261207`): a server's
  first start per arm 100-250 s (compiling cold), later starts 52-90 s; a decode step 4.9-6.8 ms at concurrency
  1-16; a serving job's client, warm-up and result about 4 s beyond its requests;
- this project's CPU (the tiny MoE on 2 cores; `cpu-sensitivity-150us-improvement-20261206` and a `suite init`
  starter run on 2026-12-07): a server healthy after 18-21 s alone (34-40 s two at once), about 23 s a session
  with its stop (its quiet period apart), a decode step 3-5 ms, 1-1.5 s a job beyond its requests;
- AMD (MI355X): not measured yet; the NVIDIA figures, said so.

A point's requests take ceil(prompts / concurrency) waves of (first token + output length × a decode step); a point
sized by time takes its time. Another model or GPU is slower or faster than these seeds: once this machine has
finished a run of the same model, `suite.calibrate` prices the plan at that run's own server starts and jobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from suite.matrix import Matrix
from suite.plan import Plan, Session, session_round
from suite.sbatch import gpu_request
from suite.stages.serve.spec import ServeParams


@dataclass(frozen=True)
class HostCosts:
    """Seconds a plan's parts take on one kind of host (the module's docstring says where each figure is from)."""

    label: str
    start_cold_s: float  # an arm's first server start (compiles)
    start_warm_s: float  # its later starts (compile cache warm)
    step_s: float  # one decode step at low concurrency
    prefill_tok_s: float  # prompt tokens a second
    first_token_s: float  # a first token's fixed part
    job_overhead_s: float  # a serving job beyond its requests (client, warm-up, result)
    offline_job_s: float  # a latency / kernel / layer / profile / probe job (a process of its own)
    accuracy_job_s: float  # a GSM8K job over the whole set (limit scales it)


NVIDIA = HostCosts("an H100 / H200 with Gemma 4 26B-A4B", 150, 70, 0.0055, 20_000, 0.06, 4, 45, 240)
COSTS: dict[str, HostCosts] = {
    "cuda": NVIDIA,
    "rocm": replace(NVIDIA, label="an AMD GPU (not measured yet: the H100 / H200 figures)"),
    "cpu": HostCosts("this project's 2-core CPU with the tiny MoE", 25, 22, 0.004, 20_000, 0.01, 1.5, 20, 60),
}
GSM8K_QUESTIONS = 1319
SEEDED = ("seeded by stored runs; another model or GPU differs: once this machine has finished a run of the same "
          "model, the estimate is priced by it")


def host_of(matrix: Matrix, here: str) -> str:
    """The kind of host the matrix's servers run on: runtime.vendor for the docker runtime (cpu when not given)
    and for a Slurm job with GPUs (cuda when not given), a local runtime given GPUs (cuda), else ``here`` (this
    machine's kind)."""
    rt = matrix.runtime
    vendor = rt.hosts_vendor
    if rt.kind == "docker" and vendor is not None:
        return vendor
    if rt.kind == "slurm" and rt.slurm is not None and gpu_request(rt.slurm.sbatch) and vendor is not None:
        return vendor
    if rt.kind == "local" and rt.gpus:
        return "cuda"
    return here


def point_seconds(p: ServeParams, c: HostCosts) -> float:
    """A serving job: its requests' waves (or its time), and the job's own overhead."""
    if p.duration_s is not None:
        return p.duration_s + c.job_overhead_s
    waves = math.ceil(p.num_prompts / p.concurrency)
    first = c.first_token_s + p.isl * p.concurrency / c.prefill_tok_s
    return waves * (first + p.osl * c.step_s) + c.job_overhead_s


@dataclass(frozen=True)
class Estimate:
    host: HostCosts
    starts: int  # server starts, those at once counted once
    start_s: float
    measure_s: float  # serving jobs
    other_s: float  # offline and correctness jobs
    by_round: dict[int, float]  # round -> seconds of its sessions (starts included)
    looks: tuple[int, ...]  # repeats: auto: the rounds after which the run may stop
    source: str = ""  # where the costs come from, said under the estimate (the seeds, or a run on this machine)
    budget_s: float | None = None  # repeats: auto with budget_min: the run stops at the last look that fits

    @property
    def total_s(self) -> float:
        return self.start_s + self.measure_s + self.other_s

    def until(self, rounds: int) -> float:
        """Seconds if the run stops after ``rounds`` rounds."""
        later = sum(s for r, s in self.by_round.items() if r >= rounds)
        return self.total_s - later

    def brief(self) -> list[str]:
        """The total and where its costs come from (`suite validate`, `suite init`)."""
        return [self.lines()[0], self.lines()[-1]]

    def lines(self) -> list[str]:
        out = [f"estimate: ~{_min(self.total_s)} on {self.host.label}: {self.starts} server starts "
               f"~{_min(self.start_s)}, measuring ~{_min(self.measure_s)}, the rest ~{_min(self.other_s)}"]
        if self.looks:
            out.append("  repeats: auto stops at the first look that decides: " + ", ".join(
                f"after {n} rounds ~{_min(self.until(n))}" for n in self.looks))
        if self.budget_s is not None:
            fits = [n for n in self.looks if self.until(n) <= self.budget_s]
            out.append(f"  budget_min {self.budget_s / 60:g}: " + (
                "every look fits by this estimate" if fits == list(self.looks) else
                f"by this estimate it stops after {fits[-1]} rounds at the latest" if fits else
                "by this estimate not even the first look fits") + " (the run measures its own rounds and stops "
                "at the last look that fits)")
        out.append(f"  ({self.source or SEEDED})")
        return out


def _min(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def estimate(matrix: Matrix, plan: Plan, host: str, costs: HostCosts | None = None, source: str = "") -> Estimate:
    """What ``plan`` costs on ``host`` (cpu | cuda | rocm; ``costs``: a run's own, else the host's seeds): the
    server starts (an arm's first cold, the others warm; a window's or a round's servers start together,
    as do the rounds of one wave), the serving jobs, the offline and correctness jobs, and each round's share."""
    c = costs or COSTS.get(host, COSTS["cpu"])
    started: set[str] = set()
    groups: dict[object, list[Session]] = {}
    for s in plan.sessions:
        if not s.needs_server:
            continue
        rnd = session_round(s)
        key: object = (("wave", plan.wave_of(rnd)) if plan.design.sets_at_once > 1 and rnd is not None else
                       ("window", s.window) if s.window is not None else
                       ("set", rnd) if plan.design.all_together and rnd is not None else ("session", s.arm, s.index))
        groups.setdefault(key, []).append(s)
    start_s, by_round, starts = 0.0, {}, len(groups)
    if plan.design.precompile:  # every serving arm once, cold, before the first session (together: all: all at once)
        arms = {s.arm for g in groups.values() for s in g}
        together = 1 if plan.design.all_together else len(arms)
        start_s += c.start_cold_s * together
        starts += together
        started |= arms
    for sessions in groups.values():
        cold = any(s.arm not in started for s in sessions)
        started |= {s.arm for s in sessions}
        seconds = (c.start_cold_s if cold else c.start_warm_s) + plan.design.quiet_s
        start_s += seconds
        rnd = session_round(sessions[0])
        if rnd is not None:
            by_round[rnd] = by_round.get(rnd, 0.0) + seconds
    measure_s = other_s = 0.0
    for s in plan.sessions:
        rnd = session_round(s)
        for j in s.jobs:
            if isinstance(j.params, ServeParams):
                sec = point_seconds(j.params, c)
                measure_s += sec
            elif j.kind == "accuracy":
                limit = getattr(j.params, "limit", None)
                sec = c.accuracy_job_s * (min(limit, GSM8K_QUESTIONS) / GSM8K_QUESTIONS if limit else 1)
                other_s += sec
            else:
                sec = c.offline_job_s if not s.needs_server else c.job_overhead_s
                other_s += sec
            if rnd is not None and isinstance(j.params, ServeParams):
                by_round[rnd] = by_round.get(rnd, 0.0) + sec
    waves = sorted({plan.wave_of(r) for r in by_round})
    for wave in waves[1:]:  # cooldown_s before each wave (round) after the first, no server alive
        first = min(r for r in by_round if plan.wave_of(r) == wave)
        by_round[first] += plan.design.cooldown_s
        other_s += plan.design.cooldown_s
    looks = plan.design.looks
    budget = matrix.budget_min * 60 if matrix.budget_min is not None and looks else None
    return Estimate(c, starts, start_s, measure_s, other_s, dict(sorted(by_round.items())), looks, source, budget)
