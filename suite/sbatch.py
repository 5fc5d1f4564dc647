"""sbatch's own long options as a matrix writes them (``runtime.slurm.sbatch``): their check, and what the suite
reads back from them (the --time, the partition, the GPUs a job asks for).

An entry is ``--name`` or ``--name=value``, as on an sbatch command line or an ``#SBATCH`` line; a value given
as the next entry (``[--time, "01:00:00"]``) is joined to its option. Options the driver writes itself are
refused, and so are abbreviations of the options the suite sets or reads (sbatch would take ``--part=gpu`` for
``--partition=gpu``, the suite would not).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# a session asks for this much time when its options name no --time
DEFAULT_TIME = "01:00:00"
SLURM_TIME = re.compile(r"^(UNLIMITED|INFINITE|\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2})$")
NAME = re.compile(r"^[a-z][a-z0-9-]*$")

# options the driver sets itself (or that would break how it follows a job), and why
SET_BY_SUITE = {
    "job-name": "the driver names each job suite:<matrix>:<arm>#<n> and finds its jobs by it",
    "output": "the driver writes each job's log to <run>/slurm/<arm>-s<N>.<jobid>.out and records that path",
    "error": "the job's stderr goes into its log (--output), the one file the driver records",
    "nodes": "a session is one vLLM server on one node (--nodes=1)",
    "ntasks": "a session is one task (--ntasks=1)",
    "chdir": "a job starts in the directory `suite run` was started in",
    "export": "the worker needs the submitting shell's environment (--export=ALL)",
    "parsable": "the driver submits with sbatch --parsable and reads the job id",
    "test-only": "the driver checks the request with sbatch --test-only before anything is submitted",
    "wrap": "the driver writes a batch script per session",
    "array": "each session is one job of its own",
    "wait": "the driver follows its jobs with squeue (sbatch must return at once)",
}
# options the suite reads from the list: each needs a value
READ = ("time", "partition", "gres", "gpus", "gpus-per-node", "gpus-per-task")


def split_option(entry: str) -> tuple[str, str | None]:
    """``--name=value`` -> ("name", "value"); ``--flag`` -> ("flag", None)."""
    name, eq, value = entry.removeprefix("--").partition("=")
    return name, value if eq else None


def option_value(options: Sequence[str], name: str) -> str | None:
    """The value of the last ``--name=VALUE`` among the options (sbatch keeps the last)."""
    values = [v for n, v in map(split_option, options) if n == name and v is not None]
    return values[-1] if values else None


def _entries(value: list[Any]) -> list[str]:
    """The list's entries as options, a separate value joined to the option before it."""
    out: list[str] = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, str | int):
            raise ValueError(f"{item!r} is not an sbatch option: write each as text, e.g. --time=01:00:00")
        text = str(item).strip()
        if "\n" in text:
            raise ValueError(f"{text!r}: one sbatch option per entry")
        if text.startswith("--") and len(text) > 2:
            out.append(text)
        elif text.startswith("-"):
            raise ValueError(f"{text!r}: write sbatch's long option, e.g. --partition=gpu for -p gpu")
        elif out and "=" not in out[-1]:
            if out[-1] == "--time" and isinstance(item, int):  # YAML reads 1:00:00 as 3600
                raise ValueError(f"--time: write the time in quotes or as --time=VALUE (YAML read it as {item})")
            out[-1] = f"{out[-1]}={text}"  # [--time, "01:00:00"] is --time=01:00:00
        else:
            raise ValueError(f"{text!r} is not an sbatch option: each entry is --name or --name=value")
    return out


def check_options(value: Any) -> Any:
    """The matrix's ``sbatch`` list, checked and normalised (a pydantic before-validator's body)."""
    if not isinstance(value, list):
        return value
    out = _entries(value)
    for entry in out:
        name, arg = split_option(entry)
        if not NAME.match(name):
            said = entry.replace(" ", "=", 1) if " " in entry and "=" not in entry else "--name=value"
            raise ValueError(f"{entry!r} is not one sbatch option: write {said}")
        full = [o for o in (*SET_BY_SUITE, *READ) if o.startswith(name)]
        if name not in full and full:
            meant = f"--{full[0]}" if len(full) == 1 else " or ".join(f"--{o}" for o in full)
            raise ValueError(f"--{name}: write the option's full name ({meant})")
        if name in SET_BY_SUITE:
            raise ValueError(f"--{name} is refused: {SET_BY_SUITE[name]}")
        if name in READ and not arg:
            raise ValueError(f"--{name} needs a value: --{name}=VALUE")
        if name == "time" and not SLURM_TIME.match(arg or ""):
            raise ValueError(f"--time={arg}: a Slurm time is MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]] or UNLIMITED")
    return out


def job_time(options: Sequence[str]) -> list[str]:
    """``--time=01:00:00`` when the options name no --time, else nothing (theirs stands)."""
    return [] if option_value(options, "time") else [f"--time={DEFAULT_TIME}"]


@dataclass(frozen=True)
class GpuRequest:
    count: int  # GPUs per job
    type: str | None  # the GPU type asked for, None for any
    option: str  # the option that asked, as written (for messages)


def gpu_request(options: Sequence[str]) -> GpuRequest | None:
    """The GPUs a job (one node, one task) asks for: the last of ``--gres=gpu[:TYPE][:N]`` (N = 1 when left out;
    other gres of the list ignored), ``--gpus``, ``--gpus-per-node`` or ``--gpus-per-task=[TYPE:]N``. None when
    no option asks for a GPU (or asks for 0)."""
    found: GpuRequest | None = None
    for entry in options:
        name, value = split_option(entry)
        if name not in ("gres", "gpus", "gpus-per-node", "gpus-per-task") or not value:
            continue
        asked: list[tuple[str | None, int]] = []
        for item in value.split(","):
            parts = item.split(":")
            if name == "gres":
                if parts[0].removeprefix("gres/") != "gpu":
                    continue
                parts = parts[1:]
            count = int(parts.pop()) if parts and parts[-1].isdigit() else 1
            asked.append((parts[0] if parts else None, count))
        if name == "gres" and not asked:
            continue
        types = {t for t, _ in asked}
        total = sum(n for _, n in asked)
        found = GpuRequest(total, types.pop() if len(types) == 1 else None, entry) if total else None
    return found
