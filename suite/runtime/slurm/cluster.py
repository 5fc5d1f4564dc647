"""Slurm runtime: arms prepared on the login node, sessions as `sbatch` jobs, the Slurm command line wrapped.

Each session (one arm's server lifetime: its block of jobs; under ABBA one repeat block) becomes one batch
job. Its script runs ``python -m suite.runtime.slurm.worker`` on the allocated node, which serves the arm with the
local runtime and writes raw results and job records into the shared run directory. This module builds the
scripts (container modes ``none``, ``pyxis``, ``apptainer``), checks a request against the cluster before
anything is submitted, and talks to Slurm only through its commands (``sbatch --parsable``, ``squeue``,
``sacct`` / ``sacct -c`` for the job-completion log, ``scancel``). The driver loop is ``suite.runtime.slurm.driver``.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from suite.errors import SuiteError
from suite.matrix import Matrix
from suite.matrix_blocks import SlurmSpec
from suite.proc import ask
from suite.sbatch import gpu_request, job_time, option_value

# Job states (squeue %T / sacct State). Anything not active is final.
ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                 "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"}


# apptainer's flag that hands a job's GPUs to the container, by runtime.vendor (a job without GPUs gets none)
APPTAINER_GPU_FLAGS: dict[str, list[str]] = {"cuda": ["--nv"], "rocm": ["--rocm"], "cpu": []}


class SlurmError(SuiteError):
    """Slurm refused a request, or a Slurm command failed."""


def spec_of(matrix: Matrix) -> SlurmSpec:
    return matrix.runtime.slurm or SlurmSpec()


def session_id(arm: str, index: int) -> str:
    return f"{arm}#{index}"


def session_slug(arm: str, index: int) -> str:
    """File-name form of a session id (arm names hold [A-Za-z0-9_.-] only)."""
    return f"{arm}-s{index}"


def parse_session_id(text: str) -> tuple[str, int]:
    arm, sep, index = text.rpartition("#")
    if not sep or not arm or not index.isdigit():
        raise SuiteError(f"session {text!r} is not ARM#N")
    return arm, int(index)


# ---------------------------------------------------------------------------------------- arms




# ---------------------------------------------------------------------------------------- job scripts


@dataclass(frozen=True)
class JobScript:
    session: str  # ARM#N
    name: str
    text: str
    path: Path
    output: str  # --output pattern (%j = job id)


def container_mounts(matrix: Matrix, run_dir: Path, repo_root: Path, workdir: Path) -> list[str]:
    """Directories a containerised worker needs at the same path: the run directory, the suite's source, the
    working directory, a local model and tokenizer, and the matrix's extra mounts."""
    paths = [run_dir, repo_root, workdir]
    for model in matrix.models_by_arm().values():
        for p in (model.id, model.tokenizer):
            if Path(p).is_absolute():
                paths.append(Path(p))
    out: list[str] = []
    for p in paths:
        m = f"{p}:{p}"
        if m not in out:
            out.append(m)
    for m in spec_of(matrix).container_mounts:
        m = m if ":" in m else f"{m}:{m}"
        if m not in out:
            out.append(m)
    return out


def worker_command(matrix: Matrix, *, image: str | None, run_dir: Path, matrix_path: Path, session: str,
                   repo_root: Path, workdir: Path, python: str | None = None) -> list[str]:
    """The command the batch script runs (after `exec`), per container mode."""
    spec = spec_of(matrix)
    worker = ["-m", "suite.runtime.slurm.worker", str(run_dir), "--matrix", str(matrix_path), "--session", session]
    if spec.container == "none":
        return [python or sys.executable, *worker]
    # In a container the image's Python runs the suite from the mounted source; overlays of the image's vLLM
    # are built on node-local disk (hard links cannot cross into the shared file system).
    worker += ["--overlays", "node-local"]
    mounts = container_mounts(matrix, run_dir, repo_root, workdir)
    if spec.container == "pyxis":
        return ["srun", "--ntasks=1", f"--container-image={image}", "--container-mounts=" + ",".join(mounts),
                f"--container-workdir={workdir}", "python3", *worker]
    gpu_flag = [] if gpu_request(spec.sbatch) is None else APPTAINER_GPU_FLAGS[matrix.runtime.hosts_vendor or "cpu"]
    return ["apptainer", "exec", *gpu_flag, "--bind", ",".join(mounts), "--pwd", str(workdir), str(image),
            "python3", *worker]


def sbatch_options(matrix: Matrix, *, name: str, output: str, workdir: Path) -> list[str]:
    """The options of a session's job: the driver's own, --time=01:00:00 unless the matrix's list has a --time,
    then the matrix's runtime.slurm.sbatch as written."""
    spec = spec_of(matrix)
    return [f"--job-name={name}", f"--output={output}", *job_time(spec.sbatch), "--nodes=1", "--ntasks=1",
            f"--chdir={workdir}", "--export=ALL", *spec.sbatch]


def job_script(matrix: Matrix, *, arm: str, index: int, image: str | None, run_dir: Path, matrix_path: Path,
               repo_root: Path, workdir: Path, python: str | None = None) -> JobScript:
    sid = session_id(arm, index)
    slug = session_slug(arm, index)
    name = f"suite:{matrix.name}:{sid}"
    output = str(run_dir / "slurm" / f"{slug}.%j.out")
    opts = sbatch_options(matrix, name=name, output=output, workdir=workdir)
    cmd = worker_command(matrix, image=image, run_dir=run_dir, matrix_path=matrix_path, session=sid,
                         repo_root=repo_root, workdir=workdir, python=python)
    spec = spec_of(matrix)
    lines = ["#!/bin/bash", *(f"#SBATCH {o}" for o in opts),
             f"# suite: session {sid} of matrix {matrix.name}; container mode {spec.container}",
             "# The worker serves the arm on this node and writes into the shared run directory; jobs already",
             "# done there are skipped, so a resubmission runs only what is missing.",
             "set -eu",
             'echo "suite: slurm job ${SLURM_JOB_ID} on $(hostname), session ' + sid
             + ', gpus ${SLURM_JOB_GPUS:-none}"']
    if spec.container != "none":
        lines.append(f"export PYTHONPATH={shlex.quote(str(repo_root))}${{PYTHONPATH:+:$PYTHONPATH}}")
    lines.append("exec " + shlex.join(cmd))
    return JobScript(session=sid, name=name, text="\n".join(lines) + "\n",
                     path=run_dir / "slurm" / f"{slug}.sbatch", output=output)


# ---------------------------------------------------------------------------------------- Slurm commands


def _run(argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
    return ask(argv, timeout_s=timeout, what=f"Slurm's `{argv[0]}` (its client commands must be on PATH)",
               error=SlurmError)


def _err(proc: subprocess.CompletedProcess) -> str:
    return (proc.stderr.strip() or proc.stdout.strip() or f"exit status {proc.returncode}").replace("\n", "; ")


def require_commands() -> None:
    missing = [c for c in ("sbatch", "squeue", "scancel", "sinfo") if shutil.which(c) is None]
    if missing:
        raise SlurmError(f"Slurm client commands not found on PATH: {', '.join(missing)} (run `suite run` on a "
                         "login node of the cluster)")


def submit(script: Path, test_only: bool = False) -> str:
    """`sbatch --parsable SCRIPT` -> job id (``--test-only``: check it without submitting, returns '')."""
    argv = ["sbatch", "--test-only", str(script)] if test_only else ["sbatch", "--parsable", str(script)]
    proc = _run(argv)
    if proc.returncode != 0:
        raise SlurmError(f"sbatch refused {script.name}: {_err(proc)}")
    if test_only:
        return ""
    return proc.stdout.strip().split(";")[0]  # "id" or "id;cluster"


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str
    reason: str = ""
    node: str = ""
    exit_code: str = ""
    start: str = ""
    end: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


def _norm_state(raw: str) -> str:
    # sacct writes "CANCELLED by 0"; squeue/sacct may append "+"
    return raw.split()[0].rstrip("+").upper() if raw.strip() else "UNKNOWN"


def queue_states(job_ids: list[str]) -> dict[str, JobState]:
    """States squeue still knows (active jobs, and finished ones for MinJobAge seconds)."""
    if not job_ids:
        return {}
    proc = _run(["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%i|%T|%r|%N|%S|%e"])
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:  # every id has left slurmctld's memory
            return {}
        raise SlurmError(f"squeue failed: {_err(proc)}")
    out = {}
    for line in proc.stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 6:
            out[parts[0]] = JobState(parts[0], _norm_state(parts[1]), parts[2], parts[3], "", parts[4], parts[5])
    return out


def final_states(job_ids: list[str]) -> dict[str, JobState]:
    """Final state and exit code from accounting: `sacct`, else the job-completion log (`sacct -c`)."""
    if not job_ids:
        return {}
    fields = "JobID,State,ExitCode,NodeList,Start,End"
    for extra in ([], ["-c"]):
        try:
            proc = _run(["sacct", *extra, "-n", "-P", "-j", ",".join(job_ids), "-o", fields])
        except SlurmError:
            return {}
        if proc.returncode != 0 or "disabled" in proc.stderr + proc.stdout:
            continue
        out = {}
        for line in proc.stdout.splitlines():
            parts = line.split("|")
            if len(parts) >= 6 and parts[0] in job_ids:  # skip steps (12.batch)
                out[parts[0]] = JobState(parts[0], _norm_state(parts[1]), "", parts[3], parts[2], parts[4],
                                         parts[5])
        if out:
            return out
    return {}


def cancel(job_ids: list[str]) -> None:
    if job_ids:
        proc = _run(["scancel", *job_ids])
        if proc.returncode != 0 and "Invalid job id" not in proc.stderr:
            raise SlurmError(f"scancel failed: {_err(proc)}")


# ---------------------------------------------------------------------------------------- checks


GRES_ITEM = re.compile(r"gpu(?::([^:(),]+))?:(\d+)")
BAD_NODE_STATES = ("down", "drain", "drng", "fail", "maint", "unk", "futr", "npc", "inval", "boot")


def node_gpus(gres: str, gres_type: str | None) -> int:
    """GPUs of one type (or of any type) in a sinfo %G string such as ``gpu:h200:8(S:0-1),gpu:a100:2``."""
    total = 0
    for typ, count in GRES_ITEM.findall(gres):
        if gres_type is None or typ == gres_type:
            total += int(count)
    return total


def check_request(spec: SlurmSpec) -> None:
    """Refuse, before anything is submitted, a partition that does not exist or cannot give the GPUs asked for."""
    partition = option_value(spec.sbatch, "partition")
    for part in (partition or "").split(","):
        if part and _run(["scontrol", "show", "partition", part]).returncode != 0:
            have = _run(["sinfo", "-h", "-o", "%P"]).stdout.split()
            raise SlurmError(f"partition {part!r} does not exist on this cluster (partitions: "
                             f"{', '.join(p.rstrip('*') for p in have) or 'none'})")
    ask = gpu_request(spec.sbatch)
    if ask is None:
        return
    argv = ["sinfo", "-h", "-N", "-o", "%N|%G|%t"] + (["-p", partition] if partition else [])
    proc = _run(argv)
    if proc.returncode != 0:
        raise SlurmError(f"sinfo failed: {_err(proc)}")
    nodes = [line.split("|") for line in proc.stdout.splitlines() if line.count("|") == 2]
    where = f"partition {partition!r}" if partition else "the default partition"
    fit = [(n, s) for n, g, s in nodes if node_gpus(g, ask.type) >= ask.count]
    if not fit:
        offered = sorted({g for _, g, _ in nodes}) or ["no nodes"]
        raise SlurmError(f"{where} cannot satisfy {ask.option}: no node has {ask.count} "
                         f"{ask.type or 'GPU'}{'s' if ask.count > 1 else ''} "
                         f"(its nodes offer: {', '.join(offered)})")
    if all(s.rstrip("*~#!%$@^-").startswith(BAD_NODE_STATES) for _, s in fit):
        raise SlurmError(f"{where}: every node that could satisfy {ask.option} is unavailable "
                         f"({', '.join(f'{n} {s}' for n, s in fit)})")


def preflight(matrix: Matrix) -> None:
    """Everything Slurm can tell before a submission: commands present, the partition and GPU request
    satisfiable (clear messages), then `sbatch --test-only` with the exact options the jobs will carry."""
    spec = spec_of(matrix)
    require_commands()
    check_request(spec)
    opts = sbatch_options(matrix, name=f"suite:{matrix.name}:check", output="/dev/null", workdir=Path.cwd())
    proc = _run(["sbatch", "--test-only", *opts, "--wrap", "true"])
    if proc.returncode != 0:
        raise SlurmError(f"Slurm refuses the job request ({shlex.join(opts[2:])}): {_err(proc)}")


# ---------------------------------------------------------------------------------------- ledger + report


