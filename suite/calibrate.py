"""The estimate priced by this machine's own runs: the newest run in the runs directory that ran here (a stretch on
this machine), served the same model with the same runtime and finished jobs gives the costs of `suite.estimate`
their values: its servers' starts (each arm's first: cold, the others warm), its serving jobs' seconds against
what the seeds say for the same points (the decode step, first token and a job's overhead scale together), its
offline and correctness jobs' seconds. Without such a run, the seeds; an estimate says which it used."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from suite.errors import SuiteError
from suite.estimate import COSTS, GSM8K_QUESTIONS, Estimate, HostCosts, estimate, host_of, point_seconds
from suite.matrix import Matrix
from suite.plan import Plan
from suite.records import Manifest
from suite.runtime.gpu import host_kind
from suite.runtime.identity import this_machine
from suite.stages.serve.read import precompile_records, server_records
from suite.stages.serve.spec import ServeParams
from suite.store import RunStore

USABLE = ("complete", "incomplete", "interrupted")  # a run that measured something (a failed one may not have)


@dataclass(frozen=True)
class Calibration:
    """Costs measured by one run, and what they rest on."""

    run_id: str
    date: str  # the run's start, a UTC day
    costs: HostCosts
    serve_scale: float  # the run's serving jobs' seconds / what the seeds say for them
    starts: int  # server starts it measured

    def source(self) -> str:
        return (f"priced by your run {self.run_id} on this machine ({self.date}): a first server start "
                f"{self.costs.start_cold_s:.0f} s, later ones {self.costs.start_warm_s:.0f} s, serving "
                f"{self.serve_scale:.2f}x the seeded time")


def calibrate(run_dir: Path, seeds: HostCosts) -> Calibration | None:
    """``seeds`` with the values ``run_dir`` measured (those it has no job or start for stay); None when it has
    no ok serving job."""
    store = RunStore.open(run_dir)
    manifest = store.manifest()
    records = [r for r in store.records() if r.ok and r.seconds]
    serving = [r for r in records if isinstance(r.job.params, ServeParams)]
    if not serving:
        return None
    scale = (sum(r.seconds or 0.0 for r in serving)
             / sum(point_seconds(r.job.params, seeds) for r in serving if isinstance(r.job.params, ServeParams)))
    costs = replace(seeds, label="this machine", step_s=seeds.step_s * scale,
                    first_token_s=seeds.first_token_s * scale, job_overhead_s=seeds.job_overhead_s * scale,
                    prefill_tok_s=seeds.prefill_tok_s / scale)
    starts = _starts(store, manifest)
    cold = [s for first, s in starts if first]
    warm = [s for first, s in starts if not first]
    if cold:
        costs = replace(costs, start_cold_s=statistics.median(cold))
    if warm:
        costs = replace(costs, start_warm_s=statistics.median(warm))
    elif cold:  # every arm started once: later starts as much faster as the seeds say
        costs = replace(costs, start_warm_s=costs.start_cold_s * seeds.start_warm_s / seeds.start_cold_s)
    accuracy = [r.seconds * GSM8K_QUESTIONS / min(limit, GSM8K_QUESTIONS) if (limit := getattr(r.job.params, "limit", None))
                else r.seconds for r in records if r.job.kind == "accuracy" and r.seconds]
    if accuracy:
        costs = replace(costs, accuracy_job_s=statistics.median(accuracy))
    offline = [r.seconds for r in records if r.job.kind not in ("accuracy", "equivalence")
               and not isinstance(r.job.params, ServeParams) and r.seconds]
    if offline:
        costs = replace(costs, offline_job_s=statistics.median(offline))
    return Calibration(run_dir.name, (manifest.started or manifest.created or "")[:10], costs, scale, len(starts))


def _starts(store: RunStore, manifest: Manifest) -> list[tuple[bool, float]]:
    """(each arm's first start?, seconds to healthy) of every server start the run recorded, precompile included."""
    arms = manifest.arm_names
    sessions = {(j.arm, j.session) for j in manifest.plan.jobs}
    timed = [(r.started or "", r.arm, r.healthy_after_s) for r in precompile_records(store, arms)]
    timed += [(r.started or "", r.arm, r.healthy_after_s) for r in server_records(store, sessions)]
    seen: set[str] = set()
    out = []
    for _, arm, seconds in sorted(timed, key=lambda t: t[0]):
        if seconds is not None:
            out.append((arm not in seen, seconds))
        seen.add(arm)
    return out


def own_run(runs_dir: Path, matrix: Matrix) -> Path | None:
    """The newest run under ``runs_dir`` that ran on this machine (a stretch's machine), with the same runtime and
    model as ``matrix``, and got far enough to measure."""
    here = this_machine().key
    found: list[tuple[str, Path]] = []
    if not runs_dir.is_dir():
        return None
    for d in runs_dir.iterdir():
        if not (d / "manifest.json").is_file():
            continue
        try:
            m = RunStore.open(d).manifest()
        except SuiteError:  # a damaged run, or one of another schema, prices nothing
            continue
        if (m.status in USABLE and m.runtime == matrix.runtime.kind and m.matrix.model.id == matrix.model.id
                and any(st.where is not None and st.where.key == here for st in m.stretches)):
            found.append((m.started or m.created or "", d))
    return max(found)[1] if found else None


def estimate_here(matrix: Matrix, plan: Plan, runs_dir: Path = Path("runs")) -> Estimate:
    """What ``plan`` costs here: priced by this machine's newest run of the same model (`own_run`), else by the
    seeds of the host kind its servers run on."""
    host = host_of(matrix, host_kind())
    seeds = COSTS.get(host, COSTS["cpu"])
    run = own_run(runs_dir, matrix)
    cal = calibrate(run, seeds) if run is not None else None
    if cal is None:
        return estimate(matrix, plan, host)
    return estimate(matrix, plan, host, cal.costs, cal.source())
